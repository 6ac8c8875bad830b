#include "prelude.h"
#include "bf16common.h"
#include <stdatomic.h>
#include <stdlib.h>

/* GE's bf16 attention: for each head g, S = scale * bf16(q[g]) @ bf16(kt[g]) (float32 sums)
   + mask[g]; each row of S softmaxed in float32 (its max, expneg32 of the differences: 0 below
   -87.3, their sum, times 1 / sum) into P, rounded to bf16; out[g] = P @ bf16(v[g]) (float32
   sums). q (G, m, d), kt (G, d, n), v (G, n, dv), mask (G, m, n) and out (G, m, dv) are float32
   arrays of any strides (transposed views, 0 for broadcast heads): each task rounds what it
   reads to bf16 as it packs it. A task is a head's block of 32 query rows: it packs the head's K
   and V into the pair layout of bf16gemm.c's B (panels of (kp / 2, 32, 2); a thread keeps them
   for its next block of the same head, or of a head at the same offsets), its rows of Q, then
   S = Q K, the softmax of its rows into P, O = P V, and stores O. A row's sums and softmax never
   depend on the other rows of its block, so the bits are the same at every thread count.
   Variants (checked against the CPU): 0 scalar (plain C), 1 avx512_bf16 (VDPBF16PS, 12 x 32
   register tiles), 2 amx_bf16 (TDPBF16PS, 32 x 32 of C in four tiles). The scalar form sums in
   VDPBF16PS's order and softmaxes as the vector form does (its fused multiply-adds where the
   build targets FMA, its 16 lane sums added as a tree), so the two give the same bits on normal
   inputs (AMX sums differently: within float32's bound). A row whose scores are all -inf is NaN
   (its max is -inf, and -inf - -inf is NaN), as in the float32 kernel (attention_heads.c). */
#define BA_T 32   /* rows of a task; columns of a panel; k of an AMX tile (sizes pad to it) */
#define BA_MR 12  /* rows of an avx512_bf16 register tile */

typedef struct {
    const float *q, *k, *v, *mask;
    float *o;
    int64_t heads, m, n, d, dv;
    int64_t qs[3], ks[3], vs[3], ms[3], os[3];  /* element strides: head, row, column */
    int64_t dp, np, dvp;                         /* d, n, dv rounded up to BA_T */
    int64_t lq, ls, lp, lo;                      /* leading dims of the Q, S, P and O blocks */
    size_t kb, vb, qb, sb, pb, ob, bytes;        /* a thread's scratch: where each part starts, its size */
    float scale;
    int64_t variant, blocks;                     /* blocks: row blocks of a head */
    uint64_t call;                               /* this call's serial */
    atomic_int failed;                           /* a thread's scratch could not be allocated */
} ba_ctx;

/* a thread's scratch, and which heads' K and V it holds packed: (call, offset of the head) */
typedef struct {
    void *buf;
    size_t cap;
    uint64_t kcall, vcall;
    int64_t koff, voff;
} ba_tls_t;
static __thread ba_tls_t ba_tls = {NULL, 0, 0, 0, 0, 0};
static atomic_uint_fast64_t ba_calls = 1;

static uint8_t *ba_buf(const ba_ctx *c) {
    ba_tls_t *s = &ba_tls;
    if (c->bytes > s->cap) {
        free(s->buf);
        s->buf = aligned_alloc(64, c->bytes);
        s->cap = s->buf ? c->bytes : 0;
        s->kcall = s->vcall = 0;
    }
    return (uint8_t *)s->buf;
}

/* ---- scalar ---- */

/* the (k, nc) matrix x (element strides rs, cs) rounded to bf16 into panels of (kp / 2, 32, 2):
   row t of panel p holds the pairs (x[2t][32p + j], x[2t + 1][32p + j]); zeros past k and nc */
static void ba_packb1(const float *x, int64_t k, int64_t nc, int64_t rs, int64_t cs, uint16_t *dst, int64_t kp,
                      int64_t ncp) {
    for (int64_t p = 0; p < ncp / BA_T; p++)
        for (int64_t t = 0; t < kp / 2; t++) {
            uint16_t *row = dst + (p * (kp / 2) + t) * 2 * BA_T;
            for (int64_t j = 0; j < BA_T; j++)
                for (int64_t e = 0; e < 2; e++) {
                    int64_t kk = 2 * t + e, col = p * BA_T + j;
                    row[2 * j + e] = kk < k && col < nc ? bc_round(x[kk * rs + col * cs]) : 0;
                }
        }
}

/* rows [r0, r0 + live) of the head's q rounded to bf16 into the (32, lq) block qb; zeros past d
   and past the live rows */
static void ba_packq1(const ba_ctx *c, const float *qh, int64_t r0, int64_t live, uint16_t *qb) {
    for (int64_t i = 0; i < BA_T; i++)
        for (int64_t kk = 0; kk < c->dp; kk++)
            qb[i * c->lq + kk] = i < live && kk < c->d ? bc_round(qh[(r0 + i) * c->qs[1] + kk * c->qs[2]]) : 0;
}

/* c (rows, 32 * panels; leading dim ldc) = a (rows, kp bf16; leading dim lda) @ b (panels of
   (kp / 2, 32, 2)): each column one chain over the pairs, odd member then even (VDPBF16PS's
   order; a product of two bf16 is exact in float32) */
static void ba_gemm1(const uint16_t *a, int64_t lda, int64_t rows, const uint16_t *b, int64_t kp, int64_t panels,
                     float *c, int64_t ldc) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t p = 0; p < panels; p++) {
            const uint16_t *bp = b + p * kp * BA_T, *ar = a + i * lda;
            float acc[BA_T];
            for (int j = 0; j < BA_T; j++) acc[j] = 0.0f;
            for (int64_t t = 0; t < kp / 2; t++) {
                float a0 = bc_f32(ar[2 * t]), a1 = bc_f32(ar[2 * t + 1]);
                const uint16_t *br = bp + t * 2 * BA_T;
                for (int j = 0; j < BA_T; j++) {
                    acc[j] += a1 * bc_f32(br[2 * j + 1]);
                    acc[j] += a0 * bc_f32(br[2 * j]);
                }
            }
            for (int j = 0; j < BA_T; j++) c[i * ldc + p * BA_T + j] = acc[j];
        }
}

/* a * b + c rounded once where the build targets FMA (every AVX-512 CPU's -march=native: then
   the scalar softmax has the vector one's bits), else rounded twice */
#if defined(__FMA__)
#define BA_FMA(a, b, c) fmaf(a, b, c)
#else
#define BA_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* the prelude's expneg32 (exactly 0 below -87.3, NaN passed through) with fused multiply-adds,
   as ba_expneg16 (the same rounded operations: the same bits on numbers) */
static inline float ba_expneg1(float x) {
    float xc = x > -87.3f ? x : -87.3f;
    float t = BA_FMA(xc, 1.44269504088896341f, 12582912.0f), fx = t - 12582912.0f;
    float r = BA_FMA(-fx, -2.12194440e-4f, BA_FMA(-fx, 0.693359375f, xc));
    float p = BA_FMA(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = BA_FMA(p, r, 8.3334519073e-3f);
    p = BA_FMA(p, r, 4.1665795894e-2f);
    p = BA_FMA(p, r, 1.6666665459e-1f);
    p = BA_FMA(p, r, 5.0000001201e-1f);
    float y = BA_FMA(p, r * r, r) + 1.0f;
    y = y * ge_bits_f32((ge_f32_bits(t) - 0x4B400000 + 127) << 23);
    y = x >= -87.3f ? y : 0.0f;
    return x == x ? y : x;
}

/* the sum of 16 lane sums as ba_sum16 adds them: lanes i and i + 8, then i and i + 4, ... */
static inline float ba_sum1(const float *l) {
    float h[8];
    for (int i = 0; i < 8; i++) h[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) h[i] = h[i] + h[i + 4];
    return (h[0] + h[2]) + (h[1] + h[3]);
}

/* a row of sums s (n values) -> P's bf16 row p (np values): the scores s * scale + the mask row
   mk (column stride mcs; or NULL) in one rounding, their max, ba_expneg1 of the differences
   summed in 16 lane sums (lane j % 16, then ba_sum1), each times 1 / sum rounded to bf16 (below
   the smallest normal: 0, as VCVTNEPS2BF16 reads it); zeros past n. Without a mask and with
   scale > 0, exp's argument is s * scale - max * scale in one rounding (the max of s * scale is
   max * scale: rounding is monotonic), as the float32 kernel's softmax (sg_softmax_row16) */
static void ba_softmax1(const ba_ctx *c, float *s, const float *mk, uint16_t *p) {
    int64_t n = c->n, mcs = c->ms[2];
    int raw = !mk && c->scale > 0.0f;
    float mx = -INFINITY, part[16];
    for (int64_t j = 0; j < n; j++) {
        float x = raw ? s[j] : mk ? BA_FMA(s[j], c->scale, mk[j * mcs]) : s[j] * c->scale;
        s[j] = x;
        mx = x > mx ? x : mx;
    }
    float mm = raw ? mx * c->scale : mx;
    for (int l = 0; l < 16; l++) part[l] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float e = ba_expneg1(raw ? BA_FMA(s[j], c->scale, -mm) : s[j] - mm);
        s[j] = e;
        part[j & 15] += e;
    }
    float inv = 1.0f / ba_sum1(part);
    for (int64_t j = 0; j < c->np; j++) {
        float y = j < n ? s[j] * inv : 0.0f;
        p[j] = fabsf(y) < 1.17549435e-38f ? 0 : bc_round(y);
    }
}

/* rows [r0, r0 + live) of O (the (32, lo) block ob) into out */
static void ba_store1(const ba_ctx *c, float *oh, int64_t r0, int64_t live, const float *ob) {
    for (int64_t i = 0; i < live; i++)
        for (int64_t j = 0; j < c->dv; j++) oh[(r0 + i) * c->os[1] + j * c->os[2]] = ob[i * c->lo + j];
}

/* the mask's row r of head g, or NULL */
static inline const float *ba_mrow(const ba_ctx *c, int64_t g, int64_t r) {
    return c->mask ? c->mask + g * c->ms[0] + r * c->ms[1] : NULL;
}

static void ba_block1(const ba_ctx *c, int64_t g, int64_t r0, int64_t live, uint8_t *buf, int pk, int pv) {
    uint16_t *kb = (uint16_t *)(buf + c->kb), *vb = (uint16_t *)(buf + c->vb), *qb = (uint16_t *)(buf + c->qb);
    uint16_t *pb = (uint16_t *)(buf + c->pb);
    float *sb = (float *)(buf + c->sb), *ob = (float *)(buf + c->ob);
    if (pk) ba_packb1(c->k + g * c->ks[0], c->d, c->n, c->ks[1], c->ks[2], kb, c->dp, c->np);
    if (pv) ba_packb1(c->v + g * c->vs[0], c->n, c->dv, c->vs[1], c->vs[2], vb, c->np, c->dvp);
    ba_packq1(c, c->q + g * c->qs[0], r0, live, qb);
    ba_gemm1(qb, c->lq, live, kb, c->dp, c->np / BA_T, sb, c->ls);
    for (int64_t i = 0; i < live; i++) ba_softmax1(c, sb + i * c->ls, ba_mrow(c, g, r0 + i), pb + i * c->lp);
    ba_gemm1(pb, c->lp, live, vb, c->np, c->dvp / BA_T, ob, c->lo);
    ba_store1(c, c->o + g * c->os[0], r0, live, ob);
}

#if defined(BC_X86)
/* ---- the vector variants' pieces ---- */

static inline BC_T512 __mmask16 ba_m16(int64_t left) {
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/* 32 contiguous values of a row from kk (masked past k) rounded to bf16, in order */
static inline __attribute__((always_inline)) BC_T512 __m512i ba_cvt32(const float *a, int64_t kk, int64_t k) {
    __m512 lo = _mm512_maskz_loadu_ps(ba_m16(k - kk), a + kk);
    __m512 hi = _mm512_maskz_loadu_ps(ba_m16(k - kk - 16), a + kk + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* ba_packb1 with 32 values a conversion: rows of contiguous columns are converted and their
   16-bit halves interleaved into pairs; columns of contiguous rows give a pair per 32 bits,
   scattered to their pair-rows; other strides take the scalar form */
static BC_T512 void ba_packb512(const float *x, int64_t k, int64_t nc, int64_t rs, int64_t cs, uint16_t *dst,
                                int64_t kp, int64_t ncp) {
    if (cs == 1 || nc == 1) {
        __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
        __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
        for (int64_t p = 0; p < ncp / BA_T; p++)
            for (int64_t t = 0; t < kp / 2; t++) {
                int64_t col = p * BA_T;
                __m512i r0 = 2 * t < k ? ba_cvt32(x + 2 * t * rs, col, nc) : _mm512_setzero_si512();
                __m512i r1 = 2 * t + 1 < k ? ba_cvt32(x + (2 * t + 1) * rs, col, nc) : _mm512_setzero_si512();
                uint16_t *row = dst + (p * (kp / 2) + t) * 2 * BA_T;
                _mm512_storeu_si512(row, _mm512_permutex2var_epi16(r0, lo, r1));
                _mm512_storeu_si512(row + BA_T, _mm512_permutex2var_epi16(r0, hi, r1));
            }
        return;
    }
    if (rs == 1 || k == 1) {
        memset(dst, 0, (size_t)ncp * (size_t)kp * 2);
        __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(BA_T));
        for (int64_t col = 0; col < nc; col++) {
            int *d32 = (int *)(dst + (col / BA_T) * kp * BA_T) + col % BA_T;
            for (int64_t kk = 0; kk < k; kk += 32)
                _mm512_i32scatter_epi32(d32 + kk / 2 * BA_T, idx, ba_cvt32(x + col * cs, kk, k), 4);
        }
        return;
    }
    ba_packb1(x, k, nc, rs, cs, dst, kp, ncp);
}

static BC_T512 void ba_packq512(const ba_ctx *c, const float *qh, int64_t r0, int64_t live, uint16_t *qb) {
    if (c->qs[2] != 1 && c->d > 1) { ba_packq1(c, qh, r0, live, qb); return; }
    for (int64_t i = 0; i < BA_T; i++)
        for (int64_t kk = 0; kk < c->dp; kk += 32)
            _mm512_storeu_si512(qb + i * c->lq + kk, i < live ? ba_cvt32(qh + (r0 + i) * c->qs[1], kk, c->d)
                                                              : _mm512_setzero_si512());
}

/* ---- avx512_bf16: a 12 x 32 tile of C in 24 registers over all of k ---- */
static inline __attribute__((always_inline)) BC_T512 void ba_tile512(const uint16_t *a, int64_t lda,
                                                                      const uint16_t *bp, int64_t half, float *c,
                                                                      int64_t ldc, const int mr) {
    __m512 c0[BA_MR], c1[BA_MR];
#pragma GCC unroll 12
    for (int i = 0; i < BA_MR; i++) { c0[i] = _mm512_setzero_ps(); c1[i] = _mm512_setzero_ps(); }
    for (int64_t t = 0; t < half; t++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + t * 64), b1 = (__m512bh)_mm512_loadu_si512(bp + t * 64 + 32);
#pragma GCC unroll 12
        for (int i = 0; i < BA_MR; i++) {
            if (i >= mr) break;
            uint32_t w;
            memcpy(&w, a + i * lda + 2 * t, 4);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)w);
            c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
            c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(c + i * ldc, c0[i]);
        _mm512_storeu_ps(c + i * ldc + 16, c1[i]);
    }
}

static __attribute__((noinline)) BC_T512 void ba_tile512_full(const uint16_t *a, int64_t lda, const uint16_t *bp,
                                                              int64_t half, float *c, int64_t ldc) {
    ba_tile512(a, lda, bp, half, c, ldc, BA_MR);
}

static __attribute__((noinline)) BC_T512 void ba_tile512_tail(const uint16_t *a, int64_t lda, const uint16_t *bp,
                                                              int64_t half, float *c, int64_t ldc, int mr) {
    switch (mr) {
    case 1: ba_tile512(a, lda, bp, half, c, ldc, 1); break;
    case 2: ba_tile512(a, lda, bp, half, c, ldc, 2); break;
    case 3: ba_tile512(a, lda, bp, half, c, ldc, 3); break;
    case 4: ba_tile512(a, lda, bp, half, c, ldc, 4); break;
    case 5: ba_tile512(a, lda, bp, half, c, ldc, 5); break;
    case 6: ba_tile512(a, lda, bp, half, c, ldc, 6); break;
    case 7: ba_tile512(a, lda, bp, half, c, ldc, 7); break;
    case 8: ba_tile512(a, lda, bp, half, c, ldc, 8); break;
    case 9: ba_tile512(a, lda, bp, half, c, ldc, 9); break;
    case 10: ba_tile512(a, lda, bp, half, c, ldc, 10); break;
    default: ba_tile512(a, lda, bp, half, c, ldc, 11); break;
    }
}

/* ba_gemm1 in register tiles */
static BC_T512 void ba_gemm512(const uint16_t *a, int64_t lda, int64_t rows, const uint16_t *b, int64_t kp,
                               int64_t panels, float *c, int64_t ldc) {
    for (int64_t p = 0; p < panels; p++)
        for (int64_t r = 0; r < rows; r += BA_MR) {
            const uint16_t *ar = a + r * lda, *bp = b + p * kp * BA_T;
            float *cr = c + r * ldc + p * BA_T;
            if (rows - r >= BA_MR) ba_tile512_full(ar, lda, bp, kp / 2, cr, ldc);
            else ba_tile512_tail(ar, lda, bp, kp / 2, cr, ldc, (int)(rows - r));
        }
}

#define BA_C(v) _mm512_set1_ps(v)
/* ba_expneg1 on 16 lanes (the float32 kernel's sg_softexp16) in fewer operations, the same bits
   on numbers: 2^n by VSCALEFPS of fx (exact, as the multiply by 2^n's bits is: n >= -126 above
   the clamp), and a NaN carried through the arithmetic (the clamp's max passes it) rather than
   blended back (a NaN still, its payload perhaps not x's) */
static inline __attribute__((always_inline)) BC_T512 __m512 ba_expneg16(__m512 x) {
    __m512 xc = _mm512_max_ps(BA_C(-87.3f), x);  /* the second operand where one is NaN: x */
    __m512 t = _mm512_fmadd_ps(xc, BA_C(1.44269504088896341f), BA_C(12582912.0f));
    __m512 fx = _mm512_sub_ps(t, BA_C(12582912.0f));
    __m512 r = _mm512_fnmadd_ps(fx, BA_C(-2.12194440e-4f), _mm512_fnmadd_ps(fx, BA_C(0.693359375f), xc));
    __m512 p = _mm512_fmadd_ps(BA_C(1.9875691500e-4f), r, BA_C(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, BA_C(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, BA_C(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, BA_C(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, BA_C(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), BA_C(1.0f));
    /* 0 below -87.3 (not less: kept, so a NaN too) */
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, BA_C(-87.3f), _CMP_NLT_UQ), y, fx);
}

/* the sum of 16 lanes: lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1 (ba_sum1) */
static inline __attribute__((always_inline)) BC_T512 float ba_sum16(__m512 a) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

/* 16 values of a mask row from column k (column stride mcs), zeros past the mask m */
static inline BC_T512 __m512 ba_mask16(const float *mk, int64_t k, int64_t mcs, __mmask16 m) {
    if (mcs == 1) return _mm512_maskz_loadu_ps(m, mk + k);
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = m >> i & 1 ? mk[(k + i) * mcs] : 0.0f;
    return _mm512_loadu_ps(t);
}

/* ba_softmax1 on 16 lanes for the block's rows [0, live) (the same operations in the same order:
   the same bits), a pass at a time over every row while the block's scores are in L1: scale,
   mask and max; exp and sum; times 1 / sum rounded into P. A row's reductions (its max, its sum
   and reciprocal) are then never on the critical path: the other rows' work overlaps them.
   Without a mask the scores are not stored, but made again as their exps are taken */
static BC_T512 void ba_softmax512(const ba_ctx *c, int64_t g, int64_t r0, int64_t live, float *sb, uint16_t *pb) {
    int64_t n = c->n, np = c->np, k;
    int raw = !c->mask && c->scale > 0.0f;
    __m512 sc = BA_C(c->scale);
    float mx[BA_T], inv[BA_T];
    for (int64_t i = 0; i < live; i++) {
        float *s = sb + i * c->ls;
        const float *mk = ba_mrow(c, g, r0 + i);
        __m512 mxv = BA_C(-INFINITY);
        if (raw)
            for (k = 0; k + 16 <= n; k += 16) mxv = _mm512_max_ps(mxv, _mm512_loadu_ps(s + k));
        else if (mk && c->ms[2] == 1)
            for (k = 0; k + 16 <= n; k += 16) {
                __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(s + k), sc, _mm512_loadu_ps(mk + k));
                _mm512_storeu_ps(s + k, x);
                mxv = _mm512_max_ps(mxv, x);
            }
        else
            k = 0;
        for (; k < n; k += 16) {
            __mmask16 m = ba_m16(n - k);
            __m512 x = _mm512_maskz_loadu_ps(m, s + k);
            if (!raw) {
                x = mk ? _mm512_fmadd_ps(x, sc, ba_mask16(mk, k, c->ms[2], m)) : _mm512_mul_ps(x, sc);
                _mm512_storeu_ps(s + k, x);
            }
            mxv = _mm512_mask_max_ps(mxv, m, mxv, x);
        }
        float mxi = _mm512_reduce_max_ps(mxv);
        mx[i] = raw ? mxi * c->scale : mxi;
    }
    for (int64_t i = 0; i < live; i++) {
        float *s = sb + i * c->ls;
        __m512 mm = BA_C(mx[i]), acc = _mm512_setzero_ps();
        for (k = 0; k + 16 <= n; k += 16) {
            __m512 x = _mm512_loadu_ps(s + k);
            __m512 e = ba_expneg16(raw ? _mm512_fmsub_ps(x, sc, mm) : _mm512_sub_ps(x, mm));
            _mm512_storeu_ps(s + k, e);
            acc = _mm512_add_ps(acc, e);
        }
        if (k < n) {
            __m512 x = _mm512_loadu_ps(s + k);
            __m512 e = _mm512_maskz_mov_ps(ba_m16(n - k), ba_expneg16(raw ? _mm512_fmsub_ps(x, sc, mm)
                                                                         : _mm512_sub_ps(x, mm)));
            _mm512_storeu_ps(s + k, e);
            acc = _mm512_add_ps(acc, e);
        }
        inv[i] = 1.0f / ba_sum16(acc);
    }
    for (int64_t i = 0; i < live; i++) {
        const float *s = sb + i * c->ls;
        uint16_t *p = pb + i * c->lp;
        __m512 iv = BA_C(inv[i]);
        for (k = 0; k + 32 <= n; k += 32) {
            __m512 y0 = _mm512_mul_ps(_mm512_loadu_ps(s + k), iv), y1 = _mm512_mul_ps(_mm512_loadu_ps(s + k + 16), iv);
            _mm512_storeu_si512(p + k, (__m512i)_mm512_cvtne2ps_pbh(y1, y0));
        }
        for (; k < np; k += 32) {
            __mmask16 m0 = ba_m16(n - k), m1 = ba_m16(n - k - 16);
            __m512 y0 = _mm512_maskz_mul_ps(m0, _mm512_maskz_loadu_ps(m0, s + k), iv);
            __m512 y1 = _mm512_maskz_mul_ps(m1, _mm512_maskz_loadu_ps(m1, s + k + 16), iv);
            _mm512_storeu_si512(p + k, (__m512i)_mm512_cvtne2ps_pbh(y1, y0));
        }
    }
}
#undef BA_C

static BC_T512 void ba_store512(const ba_ctx *c, float *oh, int64_t r0, int64_t live, const float *ob) {
    if (c->os[2] != 1 && c->dv > 1) { ba_store1(c, oh, r0, live, ob); return; }
    for (int64_t i = 0; i < live; i++)
        for (int64_t j = 0; j < c->dv; j += 16)
            _mm512_mask_storeu_ps(oh + (r0 + i) * c->os[1] + j, ba_m16(c->dv - j), _mm512_loadu_ps(ob + i * c->lo + j));
}

/* the packing, softmax and store of a block (the vector forms'), around `gemm` */
#define BA_BLOCK_PARTS                                                                                  \
    uint16_t *kb = (uint16_t *)(buf + c->kb), *vb = (uint16_t *)(buf + c->vb), *qb = (uint16_t *)(buf + c->qb); \
    uint16_t *pb = (uint16_t *)(buf + c->pb);                                                           \
    float *sb = (float *)(buf + c->sb), *ob = (float *)(buf + c->ob);                                   \
    if (pk) ba_packb512(c->k + g * c->ks[0], c->d, c->n, c->ks[1], c->ks[2], kb, c->dp, c->np);         \
    if (pv) ba_packb512(c->v + g * c->vs[0], c->n, c->dv, c->vs[1], c->vs[2], vb, c->np, c->dvp);       \
    ba_packq512(c, c->q + g * c->qs[0], r0, live, qb)

static BC_T512 void ba_block512(const ba_ctx *c, int64_t g, int64_t r0, int64_t live, uint8_t *buf, int pk, int pv) {
    BA_BLOCK_PARTS;
    ba_gemm512(qb, c->lq, live, kb, c->dp, c->np / BA_T, sb, c->ls);
    ba_softmax512(c, g, r0, live, sb, pb);
    ba_gemm512(pb, c->lp, live, vb, c->np, c->dvp / BA_T, ob, c->lo);
    ba_store512(c, c->o + g * c->os[0], r0, live, ob);
}

/* ---- amx_bf16: C (rows, cols) = A (rows <= 32, kp; lda) @ B (panels of (kp / 2, 32, 2)), 32 x 32
   of C a time in tiles 0-3 (C: 16 x 16 float32; rows 16-31 in 2-3, columns 16-31 in 1 and 3), A
   in 4-5 (16 rows of 32 bf16), B in 6-7 (16 pair-rows of a panel's half, 128 bytes apart). Only
   the 16-row halves holding live rows and the 16-column halves holding real columns are computed
   (n = 197: S's columns to 208, not 224; a last block of 5 rows: one half) ---- */
static BC_TAMX void ba_gemm_amx(const uint16_t *a, int64_t lda, int64_t rows, const uint16_t *b, int64_t kp,
                                int64_t cols, float *c, int64_t ldc) {
    int lower = rows > 16;
    for (int64_t p = 0; p * BA_T < cols; p++) {
        const uint16_t *bp = b + p * kp * BA_T;
        int right = cols - p * BA_T > 16;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t kb = 0; kb < kp / BA_T; kb++) {
            const uint16_t *a0 = a + kb * BA_T, *bb = bp + kb * 16 * 2 * BA_T;
            _tile_loadd(4, a0, lda * 2);
            _tile_loadd(6, bb, 128);
            if (lower) _tile_loadd(5, a0 + 16 * lda, lda * 2);
            if (right) _tile_loadd(7, bb + 32, 128);
            _tile_dpbf16ps(0, 4, 6);
            if (right) _tile_dpbf16ps(1, 4, 7);
            if (lower) _tile_dpbf16ps(2, 5, 6);
            if (lower && right) _tile_dpbf16ps(3, 5, 7);
        }
        float *cp = c + p * BA_T;
        _tile_stored(0, cp, ldc * 4);
        if (right) _tile_stored(1, cp + 16, ldc * 4);
        if (lower) _tile_stored(2, cp + 16 * ldc, ldc * 4);
        if (lower && right) _tile_stored(3, cp + 16 * ldc + 16, ldc * 4);
    }
}

static BC_TAMX void ba_block_amx(const ba_ctx *c, int64_t g, int64_t r0, int64_t live, uint8_t *buf, int pk, int pv) {
    BA_BLOCK_PARTS;
    bc_tilecfg cfg;
    bc_tiles16(&cfg);
    _tile_loadconfig(&cfg);
    ba_gemm_amx(qb, c->lq, live, kb, c->dp, c->n, sb, c->ls);
    ba_softmax512(c, g, r0, live, sb, pb);
    for (int64_t i = live; i < (live > 16 ? BA_T : 16); i++) memset(pb + i * c->lp, 0, (size_t)c->np * 2);
    ba_gemm_amx(pb, c->lp, live, vb, c->np, c->dv, ob, c->lo);
    _tile_release();
    ba_store512(c, c->o + g * c->os[0], r0, live, ob);
}
#endif

/* task t: head t / blocks, its rows from 32 * (t % blocks); K and V packed again only when the
   thread's copies are of another call or head offset (head-major: a thread that runs tasks in a
   row, as one left alone by a busy machine's other threads does, packs each head once) */
static void ba_task(void *vc, int64_t t, int slot) {
    (void)slot;
    ba_ctx *c = (ba_ctx *)vc;
    int64_t g = t / c->blocks, r0 = t % c->blocks * BA_T, live = c->m - r0 < BA_T ? c->m - r0 : BA_T;
    uint8_t *buf = ba_buf(c);
    if (!buf) { atomic_store(&c->failed, 1); return; }
    ba_tls_t *s = &ba_tls;
    int64_t koff = g * c->ks[0], voff = g * c->vs[0];
    int pk = s->kcall != c->call || s->koff != koff, pv = s->vcall != c->call || s->voff != voff;
    s->kcall = s->vcall = c->call;
    s->koff = koff;
    s->voff = voff;
#if defined(BC_X86)
    if (c->variant == 2) { ba_block_amx(c, g, r0, live, buf, pk, pv); return; }
    if (c->variant == 1) { ba_block512(c, g, r0, live, buf, pk, pv); return; }
#endif
    ba_block1(c, g, r0, live, buf, pk, pv);
}

/* ---- the entries ---- */

static PyObject *ba_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(1);
}

/* the variants this CPU runs, a mask: 1 scalar, 2 avx512_bf16, 4 amx_bf16 */
static PyObject *ba_caps(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(bc_caps_mask());
}

static PyObject *ba_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyUnicode_FromString(bc_isa_name());
}

/* args[i]: a float32 ndarray of 3 dims, aligned, any strides that are whole elements (writable
   when asked): its data, dims and element strides; else an exception and NULL */
static float *ba_view(PyObject *const *args, int i, int writable, int64_t *dims, int64_t *st) {
    PyObject *o = args[i];
    if (!ge_ndarray || !PyObject_TypeCheck(o, ge_ndarray)) {
        PyErr_Format(PyExc_TypeError, "bf16attn: argument %d is not an ndarray", i);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)o;
    int fl = PyArray_FLAGS(a);
    if (PyArray_TYPE(a) != NPY_FLOAT || PyArray_NDIM(a) != 3 || !(fl & NPY_ARRAY_ALIGNED)
        || (writable && !(fl & NPY_ARRAY_WRITEABLE))) {
        PyErr_Format(PyExc_TypeError, "bf16attn: argument %d is not an aligned 3-D float32 array%s", i,
                     writable ? " we may write" : "");
        return NULL;
    }
    for (int d = 0; d < 3; d++) {
        dims[d] = PyArray_DIMS(a)[d];
        if (PyArray_STRIDES(a)[d] % 4 || dims[d] > (1LL << 30)) {
            PyErr_Format(PyExc_ValueError, "bf16attn: argument %d: a stride of part of an element, or a huge extent",
                         i);
            return NULL;
        }
        st[d] = PyArray_STRIDES(a)[d] / 4;
    }
    return (float *)PyArray_DATA(a);
}

/* the bytes [lo, hi) an array of 3 dims (each > 0) spans from p; -1 on an overflow */
static int ba_span(const void *p, const int64_t *dims, const int64_t *st, int64_t *lo, int64_t *hi) {
    int64_t a = 0, b = 0, t;
    for (int d = 0; d < 3; d++) {
        if (__builtin_mul_overflow(dims[d] - 1, st[d], &t)) return -1;
        if (t < 0 ? __builtin_add_overflow(a, t, &a) : __builtin_add_overflow(b, t, &b)) return -1;
    }
    int64_t base = (int64_t)(intptr_t)p;
    if (__builtin_mul_overflow(a, 4, &a) || __builtin_mul_overflow(b, 4, &b) || __builtin_add_overflow(base, a, lo)
        || __builtin_add_overflow(base, b, hi) || __builtin_add_overflow(*hi, 4, hi)) return -1;
    return 0;
}

/* whether no two elements of an array of 3 dims share an address: with its axes by |stride|,
   each stride passes the span of the smaller ones (sufficient, and true of every plain layout) */
static int ba_distinct(const int64_t *dims, const int64_t *st) {
    int64_t s[3], e[3], k = 0, span = 0, t;
    for (int d = 0; d < 3; d++)
        if (dims[d] > 1) { s[k] = st[d] < 0 ? -st[d] : st[d]; e[k++] = dims[d]; }
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            t = s[j]; s[j] = s[j - 1]; s[j - 1] = t;
            t = e[j]; e[j] = e[j - 1]; e[j - 1] = t;
        }
    for (int i = 0; i < k; i++) {
        if (s[i] <= span) return 0;
        if (__builtin_mul_overflow(e[i] - 1, s[i], &t) || __builtin_add_overflow(span, t, &span)) return 0;
    }
    return 1;
}

/* the variant code in args[i] when this CPU runs it, else -1 and an exception */
static int64_t ba_variant(PyObject *const *args, int i) {
    int64_t v;
    if (ge_int(args, i, 0, 2, &v)) return -1;
    if (!(bc_caps_mask() >> v & 1)) {
        PyErr_SetString(PyExc_ValueError, "bf16attn: this CPU does not run the variant asked for");
        return -1;
    }
    return v;
}

/* the bytes of a thread's scratch (its parts' offsets into c), or -1 when they overflow */
static int64_t ba_layout(ba_ctx *c) {
    c->dp = (c->d + BA_T - 1) / BA_T * BA_T;
    c->np = (c->n + BA_T - 1) / BA_T * BA_T;
    c->dvp = (c->dv + BA_T - 1) / BA_T * BA_T;
    /* leading dims a cache line past the padded rows: a tile's 16 rows never share a cache set */
    c->lq = c->dp + BA_T; c->ls = c->np + 16; c->lp = c->np + BA_T; c->lo = c->dvp + 16;
    int64_t part[6] = {ge_prod(c->np, c->dp, 2, 1), ge_prod(c->dvp, c->np, 2, 1), ge_prod(BA_T, c->lq, 2, 1),
                       ge_prod(BA_T, c->ls, 4, 1), ge_prod(BA_T, c->lp, 2, 1), ge_prod(BA_T, c->lo, 4, 1)};
    size_t *at[6] = {&c->kb, &c->vb, &c->qb, &c->sb, &c->pb, &c->ob};
    int64_t off = 0;
    for (int i = 0; i < 6; i++) {
        if (part[i] < 0 || part[i] > (1LL << 40)) return -1;
        *at[i] = (size_t)off;
        off += (part[i] + 63) / 64 * 64;
    }
    c->bytes = (size_t)off;
    return off;
}

/* out = the attention of every head: (q (G, m, d), kt (G, d, n), v (G, n, dv), out (G, m, dv)
   writable, mask (G, m, n) or None: float32 arrays of any strides, out apart from the others and
   no element of it twice; scale, threads, variant 0..2) */
static PyObject *ba_attention(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t qd[3], kd[3], vd[3], od[3], md[3], width, variant, lo[5], hi[5];
    ba_ctx c;
    memset(&c, 0, sizeof(c));
    if (ge_nargs(n, 8) || ge_int(args, 6, 1, 4096, &width) || (variant = ba_variant(args, 7)) < 0) return NULL;
    double scale = PyFloat_AsDouble(args[5]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    if (!(c.q = ba_view(args, 0, 0, qd, c.qs)) || !(c.k = ba_view(args, 1, 0, kd, c.ks))
        || !(c.v = ba_view(args, 2, 0, vd, c.vs)) || !(c.o = ba_view(args, 3, 1, od, c.os))) return NULL;
    if (args[4] != Py_None && !(c.mask = ba_view(args, 4, 0, md, c.ms))) return NULL;
    c.heads = qd[0]; c.m = qd[1]; c.d = qd[2]; c.n = kd[2]; c.dv = vd[2];
    if (kd[0] != c.heads || vd[0] != c.heads || od[0] != c.heads || kd[1] != c.d || vd[1] != c.n || od[1] != c.m
        || od[2] != c.dv || (c.mask && (md[0] != c.heads || md[1] != c.m || md[2] != c.n)))
        return ge_fail();
    if (c.heads == 0 || c.m == 0 || c.dv == 0) Py_RETURN_NONE;
    const int64_t *dims[5] = {od, qd, kd, vd, md}, *sts[5] = {c.os, c.qs, c.ks, c.vs, c.ms};
    const void *ptrs[5] = {c.o, c.q, c.k, c.v, c.mask};
    for (int i = 0; i < 5; i++) {
        if (!ptrs[i] || dims[i][0] == 0 || dims[i][1] == 0 || dims[i][2] == 0) continue;
        if (ba_span(ptrs[i], dims[i], sts[i], &lo[i], &hi[i])) return ge_fail();
        if (i > 0 && lo[i] < hi[0] && lo[0] < hi[i]) return ge_fail();  /* out overlaps an input */
    }
    if (!ba_distinct(od, c.os) || ba_layout(&c) < 0) return ge_fail();
    if (c.n == 0) {  /* no keys: P is (m, 0), and P @ V is zeros */
        for (int64_t g = 0; g < c.heads; g++)
            for (int64_t i = 0; i < c.m; i++)
                for (int64_t j = 0; j < c.dv; j++) c.o[g * c.os[0] + i * c.os[1] + j * c.os[2]] = 0.0f;
        Py_RETURN_NONE;
    }
    c.scale = (float)scale;
    c.variant = variant;
    c.blocks = (c.m + BA_T - 1) / BA_T;
    c.call = atomic_fetch_add(&ba_calls, 1);
    atomic_init(&c.failed, 0);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(ba_task, &c, c.heads * c.blocks, width);
    Py_END_ALLOW_THREADS
    if (atomic_load(&c.failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
