#include "prelude.h"
#include "bf16common.h"
#include <immintrin.h>
#include "activations.h"
#include "activations16.h"
#include <stdatomic.h>
#include <stdlib.h>

/* GE's bf16 GEMM: C (m, n) = A (m, k, float32, rounded to bf16 as it is packed) @ B (k, n, bf16,
   packed once) with float32 sums, the epilogue (bias per column, clip, activation) in float32 at
   the store. B's one layout, read by every variant: ceil(n / 32) panels of (kp / 2, 32, 2) bf16,
   kp = k rounded up to 32, zero-padded: row kk / 2 of a panel holds the pairs (B[kk][j], B[kk+1][j])
   of its 32 columns (the VNNI pairs VDPBF16PS and TDPBF16PS read; 16 pair-rows of a panel's half
   are one AMX tile, 128 bytes apart). Variants (chosen by the caller, checked against the CPU):
   0 scalar (plain C), 1 avx512_bf16 (VDPBF16PS, 12 x 32 register tiles), 2 amx_bf16 (TDPBF16PS,
   32 x 32 tiles). Each element of C is one task's sum over k in a fixed order, so a product has
   the same bits at every thread count. An addend laid out as C (a residual) is added after the
   bias. The convolution (bf_conv) is the same GEMM on rows gathered from an NCHWc input: the
   rows of A are an image's output pixels, k runs over (kh, kw, input block, 16 channels), the
   columns are output channels, and C is stored straight into the blocked output (the vector
   variants copy a conv of more than one tap's input once into padded NHWC bf16 rows, as a plain
   stem's, and its rows of A from there). */
#define BF_NR 32
#define BF_KB 32
#define BF_MR 12
#define BF_MB_AVX 48   /* rows of a task: avx512_bf16 (4 register tiles) */
#define BF_MB_AMX 64   /* rows of a task: amx_bf16 (2 tiles of 32) */
#define BF_MB_SCALAR 16
#define BF_SLACK 64    /* bytes a row copy may write past a scratch's end (bf_gather_plain512) */

#if defined(BC_X86)
#define BF_X86 1
#define BF_T512 BC_T512
#define BF_TAMX BC_TAMX
#define BF_TAMX_OR_PLAIN BF_T512
#else
#define BF_TAMX_OR_PLAIN
#endif

typedef struct {
    const float *a; int64_t m, k, kp;     /* A (m, k) row-major; kp: k rounded up to 32 (a conv: m = OH * OW) */
    const uint16_t *b;                    /* packed B: panel p at b + p * kp * 32 */
    float *c; int64_t n;                  /* C; columns past n are not stored */
    int64_t rs, bs, is;                   /* C's strides: a row, 16 columns, an image (bf_crow) */
    const float *bias; int64_t has_bias;  /* n values, or none */
    const float *add;                     /* the addend, laid out as C, or NULL */
    int64_t clip; float lo, hi;
    int64_t act;                          /* act32's codes: 0 none .. 5 hardswish */
    int64_t variant;                      /* 0 scalar, 1 avx512_bf16, 2 amx_bf16 */
    int64_t images, mb, row_blocks, panels, per_group, groups;
    const float *x;                       /* a conv's input (images, ib, h, w, 16), else NULL */
    int64_t ib, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow;
    const uint16_t *xp;                   /* a plain conv's input (ib 0): (images, hp, wp, cin) bf16 */
    int64_t cin, hp, wp;
    uint16_t *ab;                         /* A rounded once for every task, as AMX tiles (AMX GEMM), else NULL */
    atomic_int failed;                    /* a task's scratch could not be allocated */
} bf_ctx;

/* where column j of row r of image img lies in C */
static inline float *bf_crow(const bf_ctx *q, int64_t img, int64_t r, int64_t j) {
    return q->c + img * q->is + r * q->rs + (j >> 4) * q->bs + (j & 15);
}

/* whether the store adds, clips or activates (else AMX tiles store straight into C) */
static inline int bf_has_epi(const bf_ctx *q) {
    return q->has_bias || q->add || q->clip || q->act;
}


/* the calling thread's scratch of at least `bytes` bytes, 64-byte aligned (kept for its next task) */
static __thread void *bf_buf = NULL;
static __thread size_t bf_cap = 0;
static void *bf_scratch(size_t bytes) {
    if (bytes == 0) bytes = 64;  /* k of 0: a buffer all the same, not NULL */
    if (bytes > bf_cap) {
        free(bf_buf);
        bf_buf = aligned_alloc(64, ((bytes + 63) / 64) * 64);
        bf_cap = bf_buf ? bytes : 0;
    }
    return bf_buf;
}

/* the epilogue of one value (the scalar variant's, and the vector ones' activation where the
   module was not compiled for AVX-512F) */
static inline float bf_epi1(const bf_ctx *q, float v, int64_t j, const float *cr) {
    if (q->has_bias) v += q->bias[j];
    if (q->add) v += q->add[cr - q->c];
    if (q->clip) v = ge_min32(ge_max32(v, q->lo), q->hi);
    return act32(v, q->act);
}

/* a conv's A row (output pixel (oh, ow) of image img) rounded to bf16: 16-chunk j (tap j / ib,
   input block j % ib) at dst + (j / 2) * cstride + (j % 2) * 16, zeros for taps outside the image
   and for k's padding to an even count of chunks (the scalar form; bf_gather512 the vector one) */
static void bf_gather1(const bf_ctx *q, int64_t img, int64_t oh, int64_t ow, uint16_t *dst, int64_t cstride) {
    int64_t plane = q->h * q->w * 16, j = 0;
    const float *xi = q->x + img * q->ib * plane;
    for (int64_t ky = 0; ky < q->kh; ky++)
        for (int64_t kx = 0; kx < q->kw; kx++) {
            int64_t ih = oh * q->sh - q->pt + ky * q->dh, iw = ow * q->sw - q->pl + kx * q->dw;
            int in = ih >= 0 && ih < q->h && iw >= 0 && iw < q->w;
            for (int64_t cb = 0; cb < q->ib; cb++, j++) {
                uint16_t *d = dst + (j >> 1) * cstride + (j & 1) * 16;
                const float *s = in ? xi + cb * plane + (ih * q->w + iw) * 16 : NULL;
                for (int l = 0; l < 16; l++) d[l] = s ? bc_round(s[l]) : 0;
            }
        }
    if (j & 1) memset(dst + (j >> 1) * cstride + 16, 0, 32);
}

/* a plain conv's A row (ib 0) from its padded NHWC bf16 input xp: per tap row ky the kw * cin
   values (kx, c) (one run when dw is 1: (kx, c) are adjacent in NHWC), zeros from k to kp */
static void bf_gather_plain1(const bf_ctx *q, int64_t img, int64_t oh, int64_t ow, uint16_t *dst) {
    int64_t run = q->dw == 1 ? q->kw * q->cin : q->cin, step = run / q->cin, j = 0;
    const uint16_t *xi = q->xp + img * q->hp * q->wp * q->cin;
    for (int64_t ky = 0; ky < q->kh; ky++)
        for (int64_t kx = 0; kx < q->kw; kx += step) {
            const uint16_t *s = xi + ((oh * q->sh + ky * q->dh) * q->wp + ow * q->sw + kx * q->dw) * q->cin;
            for (int64_t l = 0; l < run; l++) dst[j++] = s[l];
        }
    for (; j < q->kp; j++) dst[j] = 0;
}

/* padded row t (image t / hp) of a plain conv's input: zeros in the pads, else the row's pixels'
   cin channels rounded to bf16, channel-minor (a task of the entry's pass before the GEMM) */
/* padded row t's start: its pads zeroed (all of it outside the image: NULL, nothing left to do),
   else where its pixels go; *img, *ih: its image and input row */
static inline uint16_t *bf_padded_row(const bf_ctx *q, int64_t t, int64_t *img, int64_t *ih) {
    int64_t c = q->cin;
    uint16_t *row = (uint16_t *)q->xp + t * q->wp * c;
    *img = t / q->hp;
    *ih = t % q->hp - q->pt;
    if (*ih < 0 || *ih >= q->h) { memset(row, 0, (size_t)(q->wp * c) * 2); return NULL; }
    memset(row, 0, (size_t)(q->pl * c) * 2);
    memset(row + (q->pl + q->w) * c, 0, (size_t)((q->wp - q->pl - q->w) * c) * 2);
    return row + q->pl * c;
}

static void bf_plain_task(void *vc, int64_t t, int slot) {
    (void)slot;
    const bf_ctx *q = (const bf_ctx *)vc;
    int64_t img, ih, c = q->cin;
    uint16_t *d = bf_padded_row(q, t, &img, &ih);
    if (!d) return;
    const float *src = q->x + (img * c * q->h + ih) * q->w;
    for (int64_t ch = 0; ch < c; ch++)
        for (int64_t iw = 0; iw < q->w; iw++) d[iw * c + ch] = bc_round(src[ch * q->h * q->w + iw]);
}

/* the output pixel (oh, ow) of a conv's row r, and the next row's (rows run along OW, then OH) */
static inline void bf_pixel(const bf_ctx *q, int64_t r, int64_t *oh, int64_t *ow) {
    *oh = q->x ? r / q->ow : 0;
    *ow = q->x ? r % q->ow : 0;
}

static inline void bf_next(const bf_ctx *q, int64_t *oh, int64_t *ow) {
    if (++*ow == q->ow) { *ow = 0; ++*oh; }
}

/* ---- scalar: A's row rounded to bf16, each column one chain over the pairs (odd then even,
   VDPBF16PS's order; a product of two bf16 is exact in float32) ---- */
static void bf_scalar_rows(bf_ctx *q, int64_t img, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    uint16_t *ar = (uint16_t *)bf_scratch((size_t)q->kp * 2);
    if (!ar) { atomic_store(&q->failed, 1); return; }
    int64_t half = q->kp / 2, oh, ow;
    bf_pixel(q, r0, &oh, &ow);
    for (int64_t r = r0; r < r1; r++) {
        if (q->xp) { bf_gather_plain1(q, img, oh, ow, ar); bf_next(q, &oh, &ow); }
        else if (q->x) { bf_gather1(q, img, oh, ow, ar, 32); bf_next(q, &oh, &ow); }
        else
            for (int64_t kk = 0; kk < q->kp; kk++) ar[kk] = kk < q->k ? bc_round(q->a[r * q->k + kk]) : 0;
        for (int64_t p = p0; p < p1; p++) {
            const uint16_t *bp = q->b + p * q->kp * BF_NR;
            float acc[BF_NR];
            for (int j = 0; j < BF_NR; j++) acc[j] = 0.0f;
            for (int64_t t = 0; t < half; t++) {
                float a0 = bc_f32(ar[2 * t]), a1 = bc_f32(ar[2 * t + 1]);
                const uint16_t *br = bp + t * 2 * BF_NR;
                for (int j = 0; j < BF_NR; j++) {
                    acc[j] += a1 * bc_f32(br[2 * j + 1]);
                    acc[j] += a0 * bc_f32(br[2 * j]);
                }
            }
            int64_t j0 = p * BF_NR, w = q->n - j0 < BF_NR ? q->n - j0 : BF_NR;
            for (int64_t j = 0; j < w; j++) {
                float *cr = bf_crow(q, img, r, j0 + j);
                *cr = bf_epi1(q, acc[j], j0 + j, cr);
            }
        }
    }
}

#if defined(BF_X86)
/* ---- the vector variants' shared pieces ---- */

/* 32 values of A's row (masked past k) rounded to bf16, as 16 pairs */
static inline __attribute__((always_inline)) BF_T512 __m512i bf_cvt32(const float *a, int64_t kk, int64_t k) {
    int64_t left = k - kk;
    __mmask16 m0 = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
    __mmask16 m1 = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1u);
    __m512 lo = _mm512_maskz_loadu_ps(m0, a + kk), hi = _mm512_maskz_loadu_ps(m1, a + kk + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

#if defined(__AVX512F__)
/* a / b for b >= 1: rcp14 and one Newton step (relative error ~1e-8 against VDIVPS's 16-cycle
   throughput: GELU's erf ratio at the store cost as much as the AMX product of k = 256) */
static inline __attribute__((always_inline)) __m512 bf_div16(__m512 a, __m512 b) {
    __m512 r = _mm512_rcp14_ps(b);
    r = _mm512_fmadd_ps(_mm512_fnmadd_ps(b, r, SG_C(1.0f)), r, r);
    return _mm512_mul_ps(a, r);
}

/* act on 16 lanes at an AMX store: GELU's erf ratio with bf_div16 (its denominator is >= 1),
   the others sg_act16's */
static inline __attribute__((always_inline)) __m512 bf_act16(__m512 v, int64_t act) {
    if (act != 3) return sg_act16(v, act);
    /* min/max return their second operand for a NaN: with the constant first a NaN lane stays
       NaN through the clamps (no compare and blend); 0.5 v (1 + e) as one multiply-add */
    __m512 x = _mm512_mul_ps(v, SG_C(0.70710678118654752f)), hv = _mm512_mul_ps(v, SG_C(0.5f));
    __m512 c = _mm512_max_ps(SG_C(-3.92f), _mm512_min_ps(SG_C(3.92f), x)), t = _mm512_mul_ps(c, c);
    __m512 e = GE_ERF_RATIO(_mm512_fmadd_ps, _mm512_mul_ps, bf_div16, SG_C, c, t);
    e = _mm512_max_ps(SG_C(-1.0f), _mm512_min_ps(SG_C(1.0f), e));
    return _mm512_fmadd_ps(hv, e, hv);
}
#endif

/* the epilogue of 16 columns of a row and their store (mask: the columns below n) */
static inline __attribute__((always_inline)) BF_T512 void bf_store16(const bf_ctx *q, float *cr, int64_t j0,
                                                                      __m512 y, __mmask16 m) {
    if (q->has_bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, q->bias + j0));
    if (q->add) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, q->add + (cr - q->c)));
    if (q->clip) y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(q->lo)), _mm512_set1_ps(q->hi));
#if defined(__AVX512F__)
    if (q->act) y = bf_act16(y, q->act);
    _mm512_mask_storeu_ps(cr, m, y);
#else
    _mm512_mask_storeu_ps(cr, m, y);
    if (q->act)
        for (int i = 0; i < 16; i++)
            if (m >> i & 1) cr[i] = act32(cr[i], q->act);
#endif
}

static inline BF_T512 __mmask16 bf_cols(int64_t left) {
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/* bf_gather1 with 16 channels a load: two blocks that share a 32 of k one conversion and one
   64-byte store (every tap's blocks when ib is even: the conversion costs half) */
static BF_T512 void bf_gather512(const bf_ctx *q, int64_t img, int64_t oh, int64_t ow, uint16_t *dst,
                                  int64_t cstride) {
    int64_t plane = q->h * q->w * 16, j = 0;
    const float *xi = q->x + img * q->ib * plane;
    for (int64_t ky = 0; ky < q->kh; ky++)
        for (int64_t kx = 0; kx < q->kw; kx++) {
            int64_t ih = oh * q->sh - q->pt + ky * q->dh, iw = ow * q->sw - q->pl + kx * q->dw;
            if (ih >= 0 && ih < q->h && iw >= 0 && iw < q->w) {
                const float *s = xi + (ih * q->w + iw) * 16;
                int64_t cb = 0;
                if (!(j & 1))
                    for (; cb + 1 < q->ib; cb += 2, j += 2)
                        _mm512_storeu_si512(dst + (j >> 1) * cstride,
                                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + (cb + 1) * plane),
                                                                         _mm512_loadu_ps(s + cb * plane)));
                for (; cb < q->ib; cb++, j++)
                    _mm256_storeu_si256((__m256i *)(dst + (j >> 1) * cstride + (j & 1) * 16),
                                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + cb * plane)));
            } else {
                for (int64_t cb = 0; cb < q->ib; cb++, j++)
                    _mm256_storeu_si256((__m256i *)(dst + (j >> 1) * cstride + (j & 1) * 16), _mm256_setzero_si256());
            }
        }
    if (j & 1) _mm256_storeu_si256((__m256i *)(dst + (j >> 1) * cstride + 16), _mm256_setzero_si256());
}

/* bf_gather_plain1 with whole 32-value copies in ascending order, each run's tail overwritten by
   the next and the last by the zeros (masked copies of 21 values cost 3x): dst has room for 32
   values past kp (BF_SLACK), xp for 32 past its end */
static BF_T512 void bf_gather_plain512(const bf_ctx *q, int64_t img, int64_t oh, int64_t ow, uint16_t *dst) {
    int64_t run = q->dw == 1 ? q->kw * q->cin : q->cin, step = run / q->cin, j = 0;
    const uint16_t *xi = q->xp + img * q->hp * q->wp * q->cin;
    for (int64_t ky = 0; ky < q->kh; ky++)
        for (int64_t kx = 0; kx < q->kw; kx += step, j += run) {
            const uint16_t *s = xi + ((oh * q->sh + ky * q->dh) * q->wp + ow * q->sw + kx * q->dw) * q->cin;
            for (int64_t l = 0; l < run; l += 32) _mm512_storeu_si512(dst + j + l, _mm512_loadu_si512(s + l));
        }
    for (; j < q->kp; j += 32) _mm512_storeu_si512(dst + j, _mm512_setzero_si512());
}

/* padded row t of a blocked conv's input as bf_plain_task's NHWC bf16 rows (cin = ib * 16: a
   pixel's blocks adjacent, k's order (kh, kw, block, channel) runs along them): a vector
   variant's conv of more than one tap rounds each input value once here, where bf_gather512
   rounded it again at every tap (half a 3x3 conv's time), and its rows are then copies */
static BF_T512 void bf_blocked_task(void *vc, int64_t t, int slot) {
    (void)slot;
    const bf_ctx *q = (const bf_ctx *)vc;
    int64_t img, ih, c = q->cin;
    uint16_t *d = bf_padded_row(q, t, &img, &ih);
    if (!d) return;
    for (int64_t cb = 0; cb < q->ib; cb++) {
        const float *src = q->x + ((img * q->ib + cb) * q->h + ih) * q->w * 16;
        for (int64_t iw = 0; iw < q->w; iw++)
            _mm256_storeu_si256((__m256i *)(d + iw * c + cb * 16), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + iw * 16)));
    }
}

/* a conv's A row, rounded, either layout (contiguous: kp values) */
static inline BF_T512 void bf_gather_row(const bf_ctx *q, int64_t img, int64_t oh, int64_t ow, uint16_t *dst) {
    if (q->xp) bf_gather_plain512(q, img, oh, ow, dst);
    else bf_gather512(q, img, oh, ow, dst, BF_KB);
}

/* ---- avx512_bf16: a 12 x 32 tile of C in 24 registers over all of k ---- */
static inline __attribute__((always_inline)) BF_T512 void bf_tile512(const bf_ctx *q, const uint32_t *ap, int64_t img,
                                                                      int64_t r0, int64_t p, const int mr) {
    __m512 c0[BF_MR], c1[BF_MR];
#pragma GCC unroll 12
    for (int i = 0; i < BF_MR; i++) { c0[i] = _mm512_setzero_ps(); c1[i] = _mm512_setzero_ps(); }
    int64_t half = q->kp / 2;
    const uint16_t *bp = q->b + p * q->kp * BF_NR;
    for (int64_t t = 0; t < half; t++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + t * 64), b1 = (__m512bh)_mm512_loadu_si512(bp + t * 64 + 32);
#pragma GCC unroll 12
        for (int i = 0; i < BF_MR; i++) {
            if (i >= mr) break;
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[i * half + t]);
            c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
            c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
        }
    }
    int64_t j0 = p * BF_NR;
    __mmask16 m0 = bf_cols(q->n - j0), m1 = bf_cols(q->n - j0 - 16);
    for (int i = 0; i < mr; i++) {
        bf_store16(q, bf_crow(q, img, r0 + i, j0), j0, c0[i], m0);
        if (m1) bf_store16(q, bf_crow(q, img, r0 + i, j0 + 16), j0 + 16, c1[i], m1);
    }
}

static __attribute__((noinline)) BF_T512 void bf_tile512_full(const bf_ctx *q, const uint32_t *ap, int64_t img,
                                                              int64_t r0, int64_t p) {
    bf_tile512(q, ap, img, r0, p, BF_MR);
}

static __attribute__((noinline)) BF_T512 void bf_tile512_tail(const bf_ctx *q, const uint32_t *ap, int64_t img,
                                                              int64_t r0, int64_t p, int mr) {
    switch (mr) {
    case 1: bf_tile512(q, ap, img, r0, p, 1); break;
    case 2: bf_tile512(q, ap, img, r0, p, 2); break;
    case 3: bf_tile512(q, ap, img, r0, p, 3); break;
    case 4: bf_tile512(q, ap, img, r0, p, 4); break;
    case 5: bf_tile512(q, ap, img, r0, p, 5); break;
    case 6: bf_tile512(q, ap, img, r0, p, 6); break;
    case 7: bf_tile512(q, ap, img, r0, p, 7); break;
    case 8: bf_tile512(q, ap, img, r0, p, 8); break;
    case 9: bf_tile512(q, ap, img, r0, p, 9); break;
    case 10: bf_tile512(q, ap, img, r0, p, 10); break;
    default: bf_tile512(q, ap, img, r0, p, 11); break;
    }
}

/* rows [r0, r1) times panels [p0, p1): A's rows rounded into (rows, kp) bf16, then the tiles */
static BF_T512 void bf_avx_rows(bf_ctx *q, int64_t img, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    int64_t rows = r1 - r0, oh, ow;
    uint16_t *ab = (uint16_t *)bf_scratch((size_t)rows * (size_t)q->kp * 2 + BF_SLACK);
    if (!ab) { atomic_store(&q->failed, 1); return; }
    bf_pixel(q, r0, &oh, &ow);
    for (int64_t r = 0; r < rows; r++) {
        if (q->x) { bf_gather_row(q, img, oh, ow, ab + r * q->kp); bf_next(q, &oh, &ow); continue; }
        for (int64_t kk = 0; kk < q->kp; kk += BF_KB)
            _mm512_storeu_si512(ab + r * q->kp + kk, bf_cvt32(q->a + (r0 + r) * q->k, kk, q->k));
    }
    for (int64_t p = p0; p < p1; p++)
        for (int64_t r = 0; r < rows; r += BF_MR) {
            const uint32_t *ap = (const uint32_t *)(ab + r * q->kp);
            if (rows - r >= BF_MR) bf_tile512_full(q, ap, img, r0 + r, p);
            else bf_tile512_tail(q, ap, img, r0 + r, p, (int)(rows - r));
        }
}

/* ---- amx_bf16: 32 x 32 of C in four tiles; A rounded into tiles, each 16 rows x 32 of k one
   contiguous 1 KiB (bf_atile: rows strided over pages made every tile load touch 16 pages, and
   the L2 streamer followed none: (128, 4096, 128) ran at 0.55 TFLOP/s); B's halves are tiles of
   16 pair-rows, 128 bytes apart; C's tiles stored straight into C without an epilogue, else to a
   32 x 32 scratch and the epilogue from there. The k-loop is bound by its tile loads from L2
   (~1.35 TFLOP/s here, ~2.1 with B in L1); k chunks keeping B in L1 (C tiles reloaded), software
   prefetch and double-buffered operand tiles each measured no faster ---- */

/* where A's (r, kk) lies in tiled A of kb 32-chunks (kk a multiple of 32: 32 values from there) */
static inline uint16_t *bf_atile(uint16_t *ab, int64_t kb, int64_t r, int64_t kk) {
    return ab + ((r >> 4) * kb + (kk >> 5)) * 512 + (r & 15) * 32;
}

/* row r of tiled A: A's row r0 + r rounded (or zeros past m) */
static inline BF_TAMX_OR_PLAIN void bf_atile_row(const bf_ctx *q, uint16_t *ab, int64_t r, int64_t ar) {
#if defined(BF_X86)
    for (int64_t kk = 0; kk < q->kp; kk += BF_KB)
        _mm512_store_si512(bf_atile(ab, q->kp / BF_KB, r, kk),
                           ar < q->m ? bf_cvt32(q->a + ar * q->k, kk, q->k) : _mm512_setzero_si512());
#else
    (void)q; (void)ab; (void)r; (void)ar;
#endif
}

/* the epilogue of rows [i0, i1) of a 32 x 32 block (row 0 is C's row r) from its scratch cs
   (rows 128 bytes apart) into C, columns masked by m0, m1; the flags read once, the activation
   inlined per code */
static inline __attribute__((always_inline)) BF_TAMX void bf_amx_epi_act(const bf_ctx *q, const float *cs, int64_t img,
                                                                          int64_t r, int64_t j0, int64_t i0, int64_t i1,
                                                                          __mmask16 m0, __mmask16 m1, int64_t act) {
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (q->has_bias) { b0 = _mm512_maskz_loadu_ps(m0, q->bias + j0); b1 = _mm512_maskz_loadu_ps(m1, q->bias + j0 + 16); }
    __m512 lo = _mm512_set1_ps(q->lo), hi = _mm512_set1_ps(q->hi);
    for (int64_t i = i0; i < i1; i++)
        for (int h = 0; h < 2; h++) {
            __mmask16 m = h ? m1 : m0;
            if (!m) continue;
            float *cr = bf_crow(q, img, r + i, j0 + 16 * h);
            __m512 y = _mm512_add_ps(_mm512_load_ps(cs + i * 32 + 16 * h), h ? b1 : b0);
            if (q->add) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, q->add + (cr - q->c)));
            if (q->clip) y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
#if defined(__AVX512F__)
            y = bf_act16(y, act);
            _mm512_mask_storeu_ps(cr, m, y);
#else
            _mm512_mask_storeu_ps(cr, m, y);
            for (int l = 0; l < 16; l++)
                if (m >> l & 1) cr[l] = act32(cr[l], act);
#endif
        }
}

/* a block whose epilogue is pending: its scratch, C's row and column of its corner, its rows
   (`done` of them stored), its column masks */
typedef struct {
    const float *cs;
    int64_t r, j0, live, done;
    __mmask16 m0, m1;
} bf_pend;

/* the pending block's next rows up to `upto` through the epilogue */
static __attribute__((noinline)) BF_TAMX void bf_amx_epi(const bf_ctx *q, bf_pend *e, int64_t img, int64_t upto) {
    int64_t i0 = e->done, i1 = upto < e->live ? upto : e->live;
    if (i0 >= i1) return;
    e->done = i1;
    switch (q->act) {
    case 0: bf_amx_epi_act(q, e->cs, img, e->r, e->j0, i0, i1, e->m0, e->m1, 0); break;
    case 3: bf_amx_epi_act(q, e->cs, img, e->r, e->j0, i0, i1, e->m0, e->m1, 3); break;
    default: bf_amx_epi_act(q, e->cs, img, e->r, e->j0, i0, i1, e->m0, e->m1, q->act); break;
    }
}

/* rows [r0, r1) times panels [p0, p1) on AMX: A's rows rounded into a row-major scratch (one
   A tile: 16 rows of 64 bytes, lda apart), or read from q->ab where the entry rounded them for
   every task; for each panel, its blocks of 32 rows (the panel stays in L2 while the rows pass).
   A block's epilogue runs in slices between the next block's k-steps (two scratches in turn):
   the vector units work while the tiles multiply, where after the block they left AMX idle */
static BF_TAMX void bf_amx_rows(bf_ctx *q, int64_t img, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    /* A: a GEMM's tiled (bf_atile); a conv's rows gathered row-major, lda apart (kp and a cache
       line: the 16 rows of a tile never share a cache set when kp is a power of two; a copy into
       tiles cost more than it saved), zeros past the last row */
    int64_t rows = r1 - r0, rblocks = (rows + 31) / 32, kb = q->kp / BF_KB, oh, ow;
    int64_t lda = q->x ? q->kp + BF_KB : BF_KB, astep = q->x ? BF_KB : 512, ahalf = q->x ? 16 * lda : kb * 512;
    size_t abytes = q->ab ? 0 : (size_t)rblocks * 32 * (size_t)(q->x ? lda : q->kp) * 2;
    uint8_t *buf = (uint8_t *)bf_scratch(abytes + 2 * 32 * 32 * 4 + BF_SLACK);
    if (!buf) { atomic_store(&q->failed, 1); return; }
    const uint16_t *ab = q->ab ? q->ab + r0 * q->kp : (const uint16_t *)buf;
    float *cs = (float *)(buf + abytes);
    if (!q->ab) {
        uint16_t *tl = (uint16_t *)buf;
        bf_pixel(q, r0, &oh, &ow);
        for (int64_t r = 0; r < rblocks * 32; r++) {
            if (!q->x) bf_atile_row(q, tl, r, r < rows ? r0 + r : q->m);
            else if (r >= rows) memset(tl + r * lda, 0, (size_t)q->kp * 2);
            else { bf_gather_row(q, img, oh, ow, tl + r * lda); bf_next(q, &oh, &ow); }
        }
    }
    bc_tilecfg cfg;
    bc_tiles16(&cfg);
    _tile_loadconfig(&cfg);
    int direct = !bf_has_epi(q);
    int64_t slice = (32 + kb - 1) / (kb ? kb : 1);  /* the pending block's rows a k-step */
    bf_pend pend = {cs, 0, 0, 0, 0, 0, 0};
    for (int64_t p = p0; p < p1; p++) {
        const uint16_t *bp = q->b + p * q->kp * BF_NR;
        int64_t j0 = p * BF_NR;
        __mmask16 m0 = bf_cols(q->n - j0), m1 = bf_cols(q->n - j0 - 16);
        for (int64_t rb = 0; rb < rblocks; rb++) {
            const uint16_t *ar = ab + rb * 32 * (q->x ? lda : q->kp);
            int64_t live = rows - rb * 32 < 32 ? rows - rb * 32 : 32, r = r0 + rb * 32;
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int64_t b = 0; b < kb; b++) {
                const uint16_t *a0 = ar + b * astep, *bb = bp + b * 16 * 2 * BF_NR;
                _tile_loadd(4, a0, lda * 2);
                _tile_loadd(6, bb, 128);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, bb + 32, 128);
                _tile_dpbf16ps(1, 4, 7);
                if (live > 16) {  /* a last block of up to 16 rows: its lower tiles are not stored */
                    _tile_loadd(5, a0 + ahalf, lda * 2);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                if (pend.done < pend.live) bf_amx_epi(q, &pend, img, (b + 1) * slice);
            }
            bf_amx_epi(q, &pend, img, 32);
            if (direct && live == 32 && m0 == 0xffff && (m1 == 0xffff || m1 == 0)) {
                /* no epilogue, whole tiles: straight into C (a conv's: 16 pixels' 64 bytes apart) */
                long st = (long)q->rs * 4;
                _tile_stored(0, bf_crow(q, img, r, j0), st);
                _tile_stored(2, bf_crow(q, img, r + 16, j0), st);
                if (m1) {
                    _tile_stored(1, bf_crow(q, img, r, j0 + 16), st);
                    _tile_stored(3, bf_crow(q, img, r + 16, j0 + 16), st);
                }
                continue;
            }
            float *cb = pend.cs == cs ? cs + 32 * 32 : cs;
            _tile_stored(0, cb, 128);
            _tile_stored(1, cb + 16, 128);
            if (live > 16) {
                _tile_stored(2, cb + 16 * 32, 128);
                _tile_stored(3, cb + 16 * 32 + 16, 128);
            }
            pend = (bf_pend){cb, r, j0, live, 0, m0, m1};
        }
    }
    bf_amx_epi(q, &pend, img, 32);
    _tile_release();
}
#endif

/* 32 rows of an AMX GEMM's A (task t) rounded into the shared q->ab, zeros past m */
static BF_TAMX_OR_PLAIN void bf_cvt_task(void *vc, int64_t t, int slot) {
    (void)slot;
    const bf_ctx *q = (const bf_ctx *)vc;
    for (int64_t r = t * 32; r < t * 32 + 32; r++) bf_atile_row(q, q->ab, r, r);
}

/* task t: image, row block, panel group */
static void bf_task(void *vc, int64_t t, int slot) {
    (void)slot;
    bf_ctx *q = (bf_ctx *)vc;
    int64_t per_img = q->row_blocks * q->groups, img = t / per_img;
    int64_t rb = t % per_img / q->groups, g = t % q->groups;
    int64_t r0 = rb * q->mb, r1 = r0 + q->mb < q->m ? r0 + q->mb : q->m;
    int64_t p0 = g * q->per_group, p1 = p0 + q->per_group < q->panels ? p0 + q->per_group : q->panels;
    if (r0 >= r1 || p0 >= p1) return;
#if defined(BF_X86)
    if (q->variant == 2) { bf_amx_rows(q, img, r0, r1, p0, p1); return; }
    if (q->variant == 1) { bf_avx_rows(q, img, r0, r1, p0, p1); return; }
#endif
    bf_scalar_rows(q, img, r0, r1, p0, p1);
}

/* split q's rows (images x blocks of mb) and panels into tasks and run them on `width` threads;
   which task computes an element never changes its sum. An AMX GEMM rounds A once into a shared
   buffer (a pass of 32-row tasks), then its tasks are row blocks of up to 512 KiB of A (all of
   M = 128 or 197 in one: B streams from memory once) times panel groups, about 4 tasks a thread;
   elsewhere the panels go to groups only when the row blocks are too few (each group packs its
   rows again) */
static PyObject *bf_run(bf_ctx *q, int64_t width) {
    atomic_init(&q->failed, 0);
    q->mb = q->variant == 2 ? BF_MB_AMX : q->variant == 1 ? BF_MB_AVX : BF_MB_SCALAR;
    q->panels = (q->n + BF_NR - 1) / BF_NR;
    int shared = q->variant == 2 && !q->x;
    /* under ~16 us of tiles a second thread (its wake-up, the shared A pass) costs more than it wins:
       (128, 256, 256) ran 24 us on one thread, 41 on two */
    if (shared && q->m * q->kp * q->n < (1 << 24)) width = 1;
    if (shared) {
        int64_t rows32 = (q->m + 31) / 32 * 32, cap = (512 * 1024) / (q->kp * 2 + 64) / 32 * 32;
        cap = cap < 32 ? 32 : cap > 512 ? 512 : cap;
        int64_t blocks = (rows32 + cap - 1) / cap;
        if (width > 1 && blocks > 1) blocks = (blocks + width - 1) / width * width;
        q->mb = ((q->m + blocks - 1) / blocks + 31) / 32 * 32;
        q->ab = (uint16_t *)aligned_alloc(64, (size_t)rows32 * (size_t)q->kp * 2 + 64);
        if (!q->ab) return PyErr_NoMemory();
    }
    q->row_blocks = (q->m + q->mb - 1) / q->mb;
    int64_t want = width > 1 ? (shared ? 4 : q->x ? 1 : 4) * width : 1, groups = want / (q->row_blocks * q->images);
    if (groups < 1) groups = 1;
    if (groups > q->panels) groups = q->panels;
    q->per_group = (q->panels + groups - 1) / groups;
    q->groups = (q->panels + q->per_group - 1) / q->per_group;
    Py_BEGIN_ALLOW_THREADS
    if (shared) ge_parallel(bf_cvt_task, q, (q->m + 31) / 32, width);
    ge_parallel(bf_task, q, q->images * q->row_blocks * q->groups, width);
    Py_END_ALLOW_THREADS
    free(q->ab);
    q->ab = NULL;
    if (atomic_load(&q->failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *bf_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(1);
}

/* the variants this CPU runs, a mask: 1 scalar, 2 avx512_bf16, 4 amx_bf16 */
static PyObject *bf_caps(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(bc_caps_mask());
}

/* the variant a call runs unless told otherwise: the one GE_NATIVE_BF16 names where this CPU runs
   it, else the best this CPU runs */
static PyObject *bf_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyUnicode_FromString(bc_isa_name());
}

/* the variant code in args[i] when this CPU runs it, else -1 and an exception */
static int64_t bf_variant(PyObject *const *args, int i) {
    int64_t v;
    if (ge_int(args, i, 0, 2, &v)) return -1;
    if (!(bc_caps_mask() >> v & 1)) {
        PyErr_SetString(PyExc_ValueError, "bf16gemm: this CPU does not run the variant asked for");
        return -1;
    }
    return v;
}

/* args[i]: None, or a float32 C-contiguous array of `nd` dims `dims` (an addend laid out as C) */
static int bf_addend(PyObject *const *args, int i, int nd, const int64_t *dims, const float **add) {
    int64_t got[5];
    *add = NULL;
    if (args[i] == Py_None) return 0;
    *add = (const float *)ge_nd(args, i, NPY_FLOAT, 0, nd, got);
    if (!*add) return -1;
    for (int d = 0; d < nd; d++)
        if (got[d] != dims[d]) { ge_fail(); return -1; }
    return 0;
}

/* C (m, n) = A (m, k) @ packed B (+ addend): (A, B (P, kp / 2, 64) uint16, C, bias, has_bias 0|1,
   clip 0|1, lo, hi, threads, act 0..5, variant 0..2, the k B was packed for, the addend (m, n)
   or None) */
static PyObject *bf_matmul(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t m, k, mc, nc, has_bias, clip, width, act, variant, kb, dims[3], nb = 0;
    if (ge_nargs(n, 13)) return NULL;
    if (ge_int(args, 4, 0, 1, &has_bias) || ge_int(args, 5, 0, 1, &clip) || ge_int(args, 8, 1, 4096, &width)
        || ge_int(args, 9, 0, 5, &act) || (variant = bf_variant(args, 10)) < 0
        || ge_int(args, 11, 0, INT64_MAX, &kb)) return NULL;
    const float *a = (const float *)ge_mat(args, 0, NPY_FLOAT, 0, &m, &k);
    const uint16_t *b = a ? (const uint16_t *)ge_nd(args, 1, NPY_UINT16, 0, 3, dims) : NULL;
    float *c = b ? (float *)ge_mat(args, 2, NPY_FLOAT, 1, &mc, &nc) : NULL;
    const float *bias = c ? (const float *)ge_vec(args, 3, NPY_FLOAT, 0, &nb) : NULL;
    const float *add = NULL;
    int64_t cdims[2] = {mc, nc};
    if (!bias || bf_addend(args, 12, 2, cdims, &add)) return NULL;
    int64_t kp = (k + BF_KB - 1) / BF_KB * BF_KB;
    if (mc != m || kb != k || dims[2] != 2 * BF_NR || dims[1] * 2 != kp || dims[0] != (nc + BF_NR - 1) / BF_NR
        || (has_bias && nb != nc) || ge_prod(dims[0], dims[1], dims[2], 1) < 0 || ge_prod(m, kp, 4, 64) < 0)
        return ge_fail();
    double lo = PyFloat_AsDouble(args[6]), hi = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (m == 0 || nc == 0) Py_RETURN_NONE;
    bf_ctx q;
    memset(&q, 0, sizeof(q));
    q.a = a; q.m = m; q.k = k; q.kp = kp; q.b = b; q.c = c; q.n = nc; q.bias = bias; q.has_bias = has_bias;
    q.rs = nc; q.bs = 16; q.images = 1; q.add = add;
    q.clip = clip; q.lo = (float)lo; q.hi = (float)hi; q.act = act; q.variant = variant;
    return bf_run(&q, width);
}

/* the plain input's padded NHWC bf16 copy (N, hp, wp, cin) made by a pass of row tasks, the
   GEMM, the copy freed */
static PyObject *bf_run_plain(bf_ctx *q, int64_t width, void (*task)(void *, int64_t, int)) {
    size_t bytes = (size_t)ge_prod(q->images * q->hp, q->wp, q->cin, 2);
    uint16_t *xp = (uint16_t *)aligned_alloc(64, (bytes + BF_SLACK + 63) / 64 * 64);
    if (!xp) return PyErr_NoMemory();
    q->xp = xp;
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(task, q, q->images * q->hp, width);
    Py_END_ALLOW_THREADS
    PyObject *r = bf_run(q, width);
    free(xp);
    return r;
}

/* the convolution: (x, packed weight (P, kp / 2, 64) uint16 of k rows and ceil(MB / 2) panels,
   out (N, MB, OH, OW, 16), bias (MB * 16), has_bias 0|1, clip 0|1, lo, hi, threads, act 0..5,
   variant 0..2, geometry int64 (kh, kw, sh, sw, dh, dw, top, left, bottom, right), the addend
   (as out) or None). bf_conv: x blocked (N, ib, H, W, 16), k = kh * kw * ib * 16 rows (kh, kw,
   input block, channel); bf_conv_plain: x plain NCHW (N, C, H, W) of 1 <= C <= 16 channels,
   k = kh * kw * C rows (kh, kw, channel) */
static PyObject *bf_conv_any(PyObject *const *args, Py_ssize_t n, int plain) {
    int64_t xd[5], wd[3], od[5], gn = 0, nb = 0, has_bias, clip, width, act, variant;
    if (ge_nargs(n, 13)) return NULL;
    if (ge_int(args, 4, 0, 1, &has_bias) || ge_int(args, 5, 0, 1, &clip) || ge_int(args, 8, 1, 4096, &width)
        || ge_int(args, 9, 0, 5, &act) || (variant = bf_variant(args, 10)) < 0) return NULL;
    const float *x = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, plain ? 4 : 5, xd);
    if (x && plain) {  /* (N, C, H, W) as (N, 0 blocks, H, W, C) */
        xd[4] = xd[1]; xd[1] = 0;
        if (xd[4] < 1 || xd[4] > 16) return ge_fail();
    }
    const uint16_t *b = x ? (const uint16_t *)ge_nd(args, 1, NPY_UINT16, 0, 3, wd) : NULL;
    float *c = b ? (float *)ge_nd(args, 2, NPY_FLOAT, 1, 5, od) : NULL;
    const float *bias = c ? (const float *)ge_vec(args, 3, NPY_FLOAT, 0, &nb) : NULL;
    const int64_t *g = bias ? (const int64_t *)ge_vec(args, 11, NPY_INT64, 0, &gn) : NULL;
    const float *add = NULL;
    if (!g || bf_addend(args, 12, 5, od, &add)) return NULL;
    if (gn != 10) return ge_fail();
    for (int i = 0; i < 10; i++)
        if (g[i] < (i < 6 ? 1 : 0) || g[i] > (1 << 20)) return ge_fail();
    int64_t span_h = g[4] * (g[0] - 1) + 1, span_w = g[5] * (g[1] - 1) + 1;
    int64_t eh = xd[2] + g[6] + g[8] - span_h, ew = xd[3] + g[7] + g[9] - span_w;
    int64_t k = plain ? ge_prod(g[0], g[1], xd[4], 1) : ge_prod(g[0], g[1], xd[1], 16), kp = (k + BF_KB - 1) / BF_KB * BF_KB;
    if ((!plain && xd[4] != 16) || od[4] != 16 || od[0] != xd[0] || eh < 0 || ew < 0 || od[2] != eh / g[2] + 1
        || od[3] != ew / g[3] + 1 || k < 0 || wd[2] != 2 * BF_NR || wd[1] * 2 != kp || wd[0] != (od[1] + 1) / 2
        || (has_bias && nb != od[1] * 16) || ge_prod(od[2], od[3], 1, 1) < 0 || ge_prod(BF_MB_AMX, kp, 4, 64) < 0
        || ge_prod(ge_prod(xd[0], xd[2] + g[6] + g[8], xd[3] + g[7] + g[9], 1), plain ? 1 : xd[1], 32, 1) < 0)
        return ge_fail();
    double lo = PyFloat_AsDouble(args[6]), hi = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (od[0] == 0 || od[1] == 0 || od[2] == 0 || od[3] == 0) Py_RETURN_NONE;
    bf_ctx q;
    memset(&q, 0, sizeof(q));
    q.m = od[2] * od[3]; q.k = k; q.kp = kp; q.b = b; q.c = c; q.n = od[1] * 16;
    q.rs = 16; q.bs = q.m * 16; q.is = od[1] * q.m * 16; q.images = od[0];
    q.bias = bias; q.has_bias = has_bias; q.add = add;
    q.clip = clip; q.lo = (float)lo; q.hi = (float)hi; q.act = act; q.variant = variant;
    q.x = x; q.ib = xd[1]; q.h = xd[2]; q.w = xd[3]; q.kh = g[0]; q.kw = g[1]; q.sh = g[2]; q.sw = g[3];
    q.dh = g[4]; q.dw = g[5]; q.pt = g[6]; q.pl = g[7]; q.ow = od[3];
    q.cin = plain ? xd[4] : xd[1] * 16; q.hp = xd[2] + g[6] + g[8]; q.wp = xd[3] + g[7] + g[9];
    if (plain) return bf_run_plain(&q, width, bf_plain_task);
#if defined(BF_X86)
    if (variant && g[0] * g[1] > 1 && xd[1] > 0) return bf_run_plain(&q, width, bf_blocked_task);
#endif
    return bf_run(&q, width);
}

static PyObject *bf_conv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return bf_conv_any(args, n, 0);
}

static PyObject *bf_conv_plain(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return bf_conv_any(args, n, 1);
}
