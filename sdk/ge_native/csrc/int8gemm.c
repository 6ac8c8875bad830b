#include "prelude.h"
#include "bf16common.h"
#include "activations.h"
#include "activations16.h"
#include <stdatomic.h>
#include <stdlib.h>

/* GE's int8 GEMM: C (m, n) = dequant(quant(A) @ B) with A float32 (m, k) quantised to u8 as it is
   packed (q = clamp(rint(a / s) + z, 0, 255), IEEE division: QuantizeLinear's bits; int8
   activations come shifted by 128, so one u8 form serves both), B int8 (k, n, zero point 0)
   packed once, exact int32 sums sum_k (q - z) * w computed as u8 x s8 sums less z * colsum(w),
   and the epilogue in float32 at the store, in this order and no contraction (the build's
   -std=c11 keeps a * b + c two roundings; the vector forms call mul then add):
   y = float(acc) * mult[j] (mult = float32(s * w_scale[j])), + bias[j], the optional mid fake-quant
   y = (clamp(rint(y / ms) + mz, mlo, mhi) - mz) * ms (a quantised residual block's output
   fake-quantised before its shortcut is added; NaN gives mlo), + addend, clip, activation, then the
   optional output fake-quant y = (clamp(rint(y / ys) + yz, qlo, qhi) - yz) * ys.
   B's one layout, read by every variant: ceil(n / 32) panels of (kp / 4, 32, 4) int8, kp = k
   rounded up to 64 (one AMX tile's depth), zero-padded: row t of a panel holds (B[4t..4t+3][j])
   of its 32 columns (VPDPBUSD's and TDPBUSD's quads; 16 quad-rows of a panel's half are one AMX
   tile, 128 bytes apart). Variants: 0 scalar, 1 avx2 (u8/s8 widened to int16, VPMADDWD: exact,
   no saturation), 2 avx512_vnni (VPDPBUSD, 12 x 32 register tiles), 3 amx_int8 (TDPBUSD, 32 x 32
   tiles). The sums are integers, so every variant and thread count gives the same acc; the
   epilogue's exact operations give the same bits (the activations are act32 in scalar/avx2,
   sg_act16 in the AVX-512 variants). A is quantised once into a u8 buffer before the product:
   a GEMM's as 16 x 64 tiles; a conv's input into padded NHWC u8 rows (pads hold z: the float
   0.0), its rows of A gathered from there by each task (a 1x1 stride-1 conv reads them in place).
   x_scale 0 asks for dynamic quantisation: the scale and zero point of ONNX DynamicQuantizeLinear
   from the min and max of the whole input. A u8 A or input (a8, x8) is already quantised: a GEMM's
   copied into the tiles, a conv's into xp (a 1x1 stride-1 unpadded one's rows gathered from it by
   each task); a u8 C (c8) receives clamp(rint(y / ys) + yz, qlo, qhi) of the float epilogue's y. */
#define I8_NR 32
#define I8_KB 64
#define I8_MR 12
#define I8_KMAX 65536  /* 255 * 128 * k fits int32 */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define I8_X86 1
#define I8_T2 __attribute__((target("avx2,fma")))
#define I8_T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define I8_TAMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

typedef struct {
    int64_t m, k, kp, n;                  /* n: the columns stored (a conv's: its blocks' 16 lanes) */
    const int8_t *b;                      /* packed B: panel p at b + p * kp * 32 */
    const int32_t *colsum;                /* panels * 32 column sums of B */
    float *mult;                          /* panels * 32 dequantisation factors s * w_scale[j] */
    int32_t *corr;                        /* panels * 32 corrections z * colsum[j] (wrapping) */
    float *c; int64_t rs, bs, is;         /* C, its strides: a row, 16 columns, an image */
    const float *bias; int64_t has_bias;
    const float *add;                     /* the addend laid out as C, or NULL */
    int64_t clip; float lo, hi;
    int64_t act, oq; float ys, yz, qlo, qhi;
    float xs, zu; int32_t zi;             /* A's scale and u8 zero point */
    float xr; int64_t fast;               /* 1 / xs, and whether i8_q16 may divide by it */
    int64_t variant, images, mb, row_blocks, panels, per_group, groups;
    const float *a;                       /* a GEMM's A (m, k) */
    uint8_t *ab; int64_t ablk, achunk, alda;  /* a GEMM's quantised A: addr(r, kk) */
    const float *x; int64_t plain;        /* a conv's input: blocked (N, ib, h, w, 16) or plain NCHW */
    int64_t ib, cin, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, hp, wp, direct;
    uint8_t *xp;                          /* the conv's quantised padded input (N, hp, wp, cin) */
    const uint8_t *a8, *x8;               /* A or the conv's input already u8 (x_zero_point's), or NULL */
    int64_t direct8;                      /* a 1x1 stride-1 unpadded conv of a blocked x8: rows gathered from it */
    uint8_t *c8;                          /* C as u8 (clamp(rint(y / ys) + yz, qlo, qhi)), or NULL: float c */
    float yr; int64_t yfast;              /* 1 / ys, and whether i8_out16 may divide by it */
    float ylo, yhi; int64_t merge;        /* i8_out16's range of y (clip's too where merge) */
    int32_t ybias, ylo8, yhi8;            /* the bits of 1.5 * 2^23 less yz; qlo, qhi as integers */
    int64_t mq; float ms, mz, mlo, mhi;   /* the mid fake-quant (before the addend), where mq */
    float mr, mylo, myhi; int64_t mfast;  /* 1 / ms, y's range +-2^18 ms, whether i8_mq16 may divide by mr */
    int32_t mlo8, mhi8;                   /* mlo - mz, mhi - mz as integers */
    atomic_int failed;
} i8_ctx;

static pthread_once_t i8_once = PTHREAD_ONCE_INIT;
static int i8_mask = 1;

/* which variants run here: 1 scalar, 2 avx2, 4 avx512_vnni (f, bw, vl, vnni), 8 amx_int8 (after
   Linux grants the tile state) */
static void i8_detect(void) {
    int mask = 1;
#if defined(I8_X86)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) { i8_mask = mask; return; }
    uint64_t xcr0 = bc_xcr0();
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) { i8_mask = mask; return; }
    if ((b >> 5 & 1) && (xcr0 & 6) == 6) mask |= 2;
    int avx512 = (b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1) && (c >> 11 & 1) && (xcr0 & 0xe6) == 0xe6;
    if (avx512) mask |= 4;
    if (avx512 && (d >> 24 & 1) && (d >> 25 & 1) && (xcr0 & 0x60000) == 0x60000
        && syscall(SYS_arch_prctl, 0x1023, 18) == 0) mask |= 8;
#endif
    i8_mask = mask;
}

static inline int i8_caps_mask(void) {
    pthread_once(&i8_once, i8_detect);
    return i8_mask;
}

static const char *const i8_names[4] = {"scalar", "avx2", "avx512_vnni", "amx_int8"};

/* the variant a call runs unless told otherwise: GE_NATIVE_INT8's where this CPU runs it, else the best */
static const char *i8_isa_name(void) {
    int mask = i8_caps_mask(), best = 0;
    const char *forced = getenv("GE_NATIVE_INT8");
    for (int v = 0; v < 4; v++) {
        if (!(mask >> v & 1)) continue;
        best = v;
        if (forced && strcmp(forced, i8_names[v]) == 0) return i8_names[v];
    }
    return i8_names[best];
}

/* the calling thread's scratch of at least `bytes` bytes, 64-byte aligned (kept for its next task) */
static __thread void *i8_buf = NULL;
static __thread size_t i8_cap = 0;
static void *i8_scratch(size_t bytes) {
    if (bytes > i8_cap) {
        free(i8_buf);
        i8_buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        i8_cap = i8_buf ? bytes : 0;
    }
    return i8_buf;
}

/* ---- quantisation ---- */
static inline uint8_t i8_q1(float a, float s, float z) {
    float t = rintf(a / s);
    t = t + z;
    t = t > 0.0f ? t : 0.0f;
    t = t < 255.0f ? t : 255.0f;
    return (uint8_t)(int)t;
}

#if defined(I8_X86)
/* 16 values quantised: a / s correctly rounded without VDIVPS (a tenth of its throughput: the
   conv's input pass cost more than its 1x1 product) when r = 1 / s (correctly rounded) is normal:
   q0 = a r is within 2 ulps, one Newton step on the exact FMA residual makes it faithful, and a
   second one, Markstein's, gives RN(a / s) itself; |q0| >= 2^22 saturates whatever its last bits */
static inline __attribute__((always_inline)) I8_T512 __m128i i8_q16(__m512 a, __m512 s, __m512 r, __m512 z, int fast) {
    __m512 t;
    if (fast) {
        __m512 q0 = _mm512_mul_ps(a, r);
        __m512 q1 = _mm512_fmadd_ps(_mm512_fnmadd_ps(s, q0, a), r, q0);
        __m512 q2 = _mm512_fmadd_ps(_mm512_fnmadd_ps(s, q1, a), r, q1);
        __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(q0), _mm512_set1_ps(4194304.0f), _CMP_GE_OQ);
        t = _mm512_mask_blend_ps(big, q2, q0);
    } else {
        t = _mm512_div_ps(a, s);
    }
    t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    t = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(t, z), _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
    return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(t));
}

/* len values of src (stride apart) quantised into dst; `every` 16 values of src (src_step apart)
   to 16 bytes of dst (dst_step apart) when len is 16 (a blocked input's row: one call) */
static I8_T512 void i8_quant512(const i8_ctx *q, const float *src, int64_t len, int64_t stride, uint8_t *dst,
                                int64_t every, int64_t src_step, int64_t dst_step) {
    __m512 vs = _mm512_set1_ps(q->xs), vr = _mm512_set1_ps(q->xr), vz = _mm512_set1_ps(q->zu);
    int64_t i = 0;
    if (len == 16 && stride == 1) {
        for (int64_t e = 0; e < every; e++)
            _mm_storeu_si128((__m128i *)(dst + e * dst_step), i8_q16(_mm512_loadu_ps(src + e * src_step), vs, vr, vz, (int)q->fast));
        return;
    }
    if (stride == 1)
        for (; i + 16 <= len; i += 16) _mm_storeu_si128((__m128i *)(dst + i), i8_q16(_mm512_loadu_ps(src + i), vs, vr, vz, (int)q->fast));
    for (; i < len; i++) dst[i] = i8_q1(src[i * stride], q->xs, q->zu);
}
#endif

/* len values of src (stride apart) quantised into dst (the vector form where the variant has AVX-512) */
static void i8_quant(const i8_ctx *q, const float *src, int64_t len, int64_t stride, uint8_t *dst) {
#if defined(I8_X86)
    if (q->variant >= 2) { i8_quant512(q, src, len, stride, dst, 1, 0, 0); return; }
#endif
    for (int64_t i = 0; i < len; i++) dst[i] = i8_q1(src[i * stride], q->xs, q->zu);
}

/* where the quantised A's (r, kk) of a GEMM lies (r counted from the buffer's first row) */
static inline uint8_t *i8_addr(const uint8_t *base, int64_t blk, int64_t chunk, int64_t lda, int64_t r, int64_t kk) {
    return (uint8_t *)base + (r >> 4) * blk + (kk >> 6) * chunk + (r & 15) * lda + (kk & 63);
}

/* 16 rows of a GEMM's A (task t) quantised into the shared tiles, zu past k and past m */
static void i8_atask(void *vc, int64_t t, int slot) {
    (void)slot;
    const i8_ctx *q = (const i8_ctx *)vc;
    uint8_t row[I8_KB];
    for (int64_t r = t * 16; r < t * 16 + 16; r++)
        for (int64_t kk = 0; kk < q->kp; kk += I8_KB) {
            int64_t len = r < q->m ? (q->k - kk < I8_KB ? q->k - kk : I8_KB) : 0;
            uint8_t *d = i8_addr(q->ab, q->ablk, q->achunk, q->alda, r, kk);
            if (len == I8_KB && q->a8) { memcpy(d, q->a8 + r * q->k + kk, I8_KB); continue; }
            if (len == I8_KB) { i8_quant(q, q->a + r * q->k + kk, I8_KB, 1, d); continue; }
            memset(row, (int)q->zi, I8_KB);
            if (len > 0 && q->a8) memcpy(row, q->a8 + r * q->k + kk, (size_t)len);
            else if (len > 0) i8_quant(q, q->a + r * q->k + kk, len, 1, row);
            memcpy(d, row, I8_KB);
        }
}

/* padded row t (image t / hp) of a conv's input quantised (or a u8 input copied) into xp: z in
   the pads, else the row's pixels' cin channels, channel-minor */
static void i8_xtask(void *vc, int64_t t, int slot) {
    (void)slot;
    const i8_ctx *q = (const i8_ctx *)vc;
    int64_t c = q->cin, img = t / q->hp, ih = t % q->hp - q->pt;
    uint8_t *row = q->xp + t * q->wp * c;
    if (ih < 0 || ih >= q->h) { memset(row, (int)q->zi, (size_t)(q->wp * c)); return; }
    memset(row, (int)q->zi, (size_t)(q->pl * c));
    memset(row + (q->pl + q->w) * c, (int)q->zi, (size_t)((q->wp - q->pl - q->w) * c));
    uint8_t *d = row + q->pl * c;
    if (q->x8 && q->plain) {
        const uint8_t *src = q->x8 + (img * c * q->h + ih) * q->w;
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t iw = 0; iw < q->w; iw++) d[iw * c + ch] = src[ch * q->h * q->w + iw];
        return;
    }
    if (q->x8) {
        for (int64_t cb = 0; cb < q->ib; cb++) {
            const uint8_t *src = q->x8 + ((img * q->ib + cb) * q->h + ih) * q->w * 16;
            for (int64_t iw = 0; iw < q->w; iw++) memcpy(d + iw * c + cb * 16, src + iw * 16, 16);
        }
        return;
    }
    if (q->plain) {
        const float *src = q->x + (img * c * q->h + ih) * q->w;
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t iw = 0; iw < q->w; iw++) d[iw * c + ch] = i8_q1(src[ch * q->h * q->w + iw], q->xs, q->zu);
        return;
    }
    for (int64_t cb = 0; cb < q->ib; cb++) {
        const float *src = q->x + ((img * q->ib + cb) * q->h + ih) * q->w * 16;
#if defined(I8_X86)
        if (q->variant >= 2) { i8_quant512(q, src, 16, 1, d + cb * 16, q->w, 16, c); continue; }
#endif
        for (int64_t iw = 0; iw < q->w; iw++) i8_quant(q, src + iw * 16, 16, 1, d + iw * c + cb * 16);
    }
}

/* a conv's A row (output pixel (oh, ow) of image img) from xp: per tap row ky the kw * cin bytes
   (kx, c) (one run when dw is 1), zeros from k to kp */
static void i8_gather(const i8_ctx *q, int64_t img, int64_t oh, int64_t ow, uint8_t *dst) {
    int64_t run = q->dw == 1 ? q->kw * q->cin : q->cin, step = run / q->cin, j = 0;
    const uint8_t *xi = q->xp + img * q->hp * q->wp * q->cin;
    for (int64_t ky = 0; ky < q->kh; ky++)
        for (int64_t kx = 0; kx < q->kw; kx += step, j += run)
            memcpy(dst + j, xi + ((oh * q->sh + ky * q->dh) * q->wp + ow * q->sw + kx * q->dw) * q->cin, (size_t)run);
    memset(dst + j, 0, (size_t)(q->kp - j));
}

#if defined(I8_X86)
/* i8_gather with whole 64-byte copies in ascending order, each run's tail overwritten by the next
   and the last by the zeros (a memcpy a run cost a third of a 3x3 conv): dst has 64 bytes past kp,
   xp 64 past its end */
static I8_T512 void i8_gather512(const i8_ctx *q, int64_t img, int64_t oh, int64_t ow, uint8_t *dst) {
    int64_t run = q->dw == 1 ? q->kw * q->cin : q->cin, step = run / q->cin, j = 0;
    const uint8_t *xi = q->xp + img * q->hp * q->wp * q->cin;
    for (int64_t ky = 0; ky < q->kh; ky++)
        for (int64_t kx = 0; kx < q->kw; kx += step, j += run) {
            const uint8_t *s = xi + ((oh * q->sh + ky * q->dh) * q->wp + ow * q->sw + kx * q->dw) * q->cin;
            for (int64_t l = 0; l < run; l += 64) _mm512_storeu_si512(dst + j + l, _mm512_loadu_si512(s + l));
        }
    for (; j < q->kp; j += 64) _mm512_storeu_si512(dst + j, _mm512_setzero_si512());
}
#endif

/* ---- the epilogue ---- */
/* the element of C (and of the addend) that row r, column j of image img is stored at */
static inline int64_t i8_coff(const i8_ctx *q, int64_t img, int64_t r, int64_t j) {
    return img * q->is + r * q->rs + (j >> 4) * q->bs + (j & 15);
}

/* the output fake-quant of one value (QuantizeLinear then DequantizeLinear) */
static inline float i8_oq1(const i8_ctx *q, float y) {
    float t = rintf(y / q->ys);
    t = t + q->yz;
    t = ge_min32(ge_max32(t, q->qlo), q->qhi);
    t = t - q->yz;
    return t * q->ys;
}

/* the u8 output of one value (QuantizeLinear to [qlo, qhi]; NaN gives qlo, as the vector form) */
static inline uint8_t i8_oq8(const i8_ctx *q, float y) {
    float t = rintf(y / q->ys);
    t = t + q->yz;
    t = t > q->qlo ? t : q->qlo;
    t = t < q->qhi ? t : q->qhi;
    return (uint8_t)(int)t;
}

/* the mid fake-quant of one value (NaN gives mlo, as the vector form) */
static inline float i8_mq1(const i8_ctx *q, float y) {
    float t = rintf(y / q->ms);
    t = t + q->mz;
    t = t > q->mlo ? t : q->mlo;
    t = t < q->mhi ? t : q->mhi;
    t = t - q->mz;
    return t * q->ms;
}

/* the float epilogue of one raw sum (u8 x s8) of column j stored at C's element off, before the
   output's quantisation */
static inline float i8_epi1(const i8_ctx *q, int32_t raw, int64_t j, int64_t off) {
    int32_t acc = (int32_t)((uint32_t)raw - (uint32_t)q->corr[j]);
    float y = (float)acc;
    y = y * q->mult[j];
    if (q->has_bias) y = y + q->bias[j];
    if (q->mq) y = i8_mq1(q, y);
    if (q->add) y = y + q->add[off];
    if (q->clip) y = ge_min32(ge_max32(y, q->lo), q->hi);
    return act32(y, q->act);
}

static inline void i8_store1(const i8_ctx *q, int64_t img, int64_t r, int64_t j, int32_t raw) {
    int64_t off = i8_coff(q, img, r, j);
    float y = i8_epi1(q, raw, j, off);
    if (q->c8) q->c8[off] = i8_oq8(q, y);
    else q->c[off] = q->oq ? i8_oq1(q, y) : y;
}

#if defined(I8_X86)
static inline I8_T512 __mmask16 i8_cols(int64_t left) {
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/* the epilogue's settings as vectors and flags, loaded once for a block's rows (a store through C
   may alias q, so the compiler would reload q's fields at every row) */
typedef struct {
    __m512 lo, hi, ys, yr, yz, qlo, qhi, ylo, yhi, ms, mr, mylo, myhi;
    __m512i ybias, ylo8, yhi8, mlo8, mhi8;
    int64_t has_bias, clip, act, oq, yfast, narrow, mq, mfast;  /* narrow: (qlo, qhi) not (0, 255) */
    const float *add; float *c; uint8_t *c8;
} i8_epv;

static inline __attribute__((always_inline)) I8_T512 void i8_epv_init(const i8_ctx *q, i8_epv *v) {
    v->lo = _mm512_set1_ps(q->lo); v->hi = _mm512_set1_ps(q->hi);
    v->ys = _mm512_set1_ps(q->ys); v->yr = _mm512_set1_ps(q->yr); v->yz = _mm512_set1_ps(q->yz);
    v->qlo = _mm512_set1_ps(q->qlo); v->qhi = _mm512_set1_ps(q->qhi);
    v->ylo = _mm512_set1_ps(q->ylo); v->yhi = _mm512_set1_ps(q->yhi);
    v->ybias = _mm512_set1_epi32(q->ybias); v->ylo8 = _mm512_set1_epi32(q->ylo8); v->yhi8 = _mm512_set1_epi32(q->yhi8);
    v->has_bias = q->has_bias; v->clip = q->clip && !q->merge; v->act = q->act; v->oq = q->oq; v->yfast = q->yfast;
    v->narrow = q->ylo8 != 0 || q->yhi8 != 255;
    v->mq = q->mq; v->mfast = q->mfast;
    if (q->mq) {
        v->ms = _mm512_set1_ps(q->ms); v->mr = _mm512_set1_ps(q->mr);
        v->mylo = _mm512_set1_ps(q->mylo); v->myhi = _mm512_set1_ps(q->myhi);
        v->mlo8 = _mm512_set1_epi32(q->mlo8); v->mhi8 = _mm512_set1_epi32(q->mhi8);
    }
    v->add = q->add; v->c = q->c; v->c8 = q->c8;
}

/* rint(y / ys) + yz of 16 values as int32, the u8 output before its clamp to [qlo, qhi]: i8_q16's
   division without its saturation test, y held to +-2048 ys first (clip's range merged in where
   no activation follows it; NaN to the low end), past which every result saturates alike; the
   rounding by adding 1.5 * 2^23 (|quotient| <= 2048: the sum's last bit is the integer, ties to
   even), the zero point on the integers (it, qlo and qhi are integral). Else (ys too large or
   small for 1 / ys) the division, the quotient held to +-2048. */
static inline __attribute__((always_inline)) I8_T512 __m512i i8_n16(const i8_epv *v, __m512 y) {
    __m512 t;
    if (v->yfast) {
        y = _mm512_min_ps(_mm512_max_ps(y, v->ylo), v->yhi);
        __m512 q0 = _mm512_mul_ps(y, v->yr);
        __m512 q1 = _mm512_fmadd_ps(_mm512_fnmadd_ps(v->ys, q0, y), v->yr, q0);
        t = _mm512_fmadd_ps(_mm512_fnmadd_ps(v->ys, q1, y), v->yr, q1);
    } else {
        t = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(y, v->ys), _mm512_set1_ps(-2048.0f)), _mm512_set1_ps(2048.0f));
    }
    __m512i n = _mm512_castps_si512(_mm512_add_ps(t, _mm512_set1_ps(12582912.0f)));
    return _mm512_sub_epi32(n, v->ybias);  /* in -2304 .. 2303: rint(t) + yz */
}

/* the mid fake-quant of 16 values, (clamp(rint(y / ms) + mz, mlo, mhi) - mz) * ms: i8_n16's
   division with y held to +-2^18 ms (past which every result saturates alike: |mz|, |mlo|, |mhi|
   <= 2^16; NaN to the low end), the rounding by adding 1.5 * 2^23, the clamp on the integers
   rint(t) to [mlo - mz, mhi - mz] (rint(t) + mz is exact in float32 there), their product by ms
   one rounding as the scalar form's */
static inline __attribute__((always_inline)) I8_T512 __m512 i8_mq16(const i8_epv *v, __m512 y) {
    __m512 t;
    if (v->mfast) {
        y = _mm512_min_ps(_mm512_max_ps(y, v->mylo), v->myhi);
        __m512 q0 = _mm512_mul_ps(y, v->mr);
        __m512 q1 = _mm512_fmadd_ps(_mm512_fnmadd_ps(v->ms, q0, y), v->mr, q0);
        t = _mm512_fmadd_ps(_mm512_fnmadd_ps(v->ms, q1, y), v->mr, q1);
    } else {
        t = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(y, v->ms), _mm512_set1_ps(-262144.0f)), _mm512_set1_ps(262144.0f));
    }
    __m512i n = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(t, _mm512_set1_ps(12582912.0f))),
                                 _mm512_set1_epi32(0x4b400000));
    n = _mm512_min_epi32(_mm512_max_epi32(n, v->mlo8), v->mhi8);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(n), v->ms);
}

/* the u8 output of 16 values: clamp(rint(y / ys) + yz, qlo, qhi) */
static inline __attribute__((always_inline)) I8_T512 __m128i i8_out16(const i8_epv *v, __m512 y) {
    return _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(i8_n16(v, y), v->ylo8), v->yhi8));
}

/* the float epilogue of 16 raw sums (corr, mult, bias: their columns'; the addend's at C's
   element off; mask: columns below n) */
static inline __attribute__((always_inline)) I8_T512 __m512 i8_y16(const i8_epv *v, __m512i raw, __m512i corr,
                                                                    __m512 mult, __m512 bias, int64_t off, __mmask16 m) {
    __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(raw, corr)), mult);
    if (v->has_bias) y = _mm512_add_ps(y, bias);
    if (v->mq) y = i8_mq16(v, y);
    if (v->add) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, v->add + off));
    if (v->clip) y = _mm512_min_ps(_mm512_max_ps(y, v->lo), v->hi);
    if (v->act) {
#if defined(__AVX512F__)
        y = sg_act16(y, v->act);
#else
        float t[16];
        _mm512_storeu_ps(t, y);
        for (int i = 0; i < 16; i++) t[i] = act32(t[i], v->act);
        y = _mm512_loadu_ps(t);
#endif
    }
    return y;
}

/* i8_y16 and the store at C's element off */
static inline __attribute__((always_inline)) I8_T512 void i8_epi16(const i8_epv *v, __m512i raw, __m512i corr,
                                                                    __m512 mult, __m512 bias, int64_t off, __mmask16 m) {
    __m512 y = i8_y16(v, raw, corr, mult, bias, off, m);
    if (v->c8) {
        _mm_mask_storeu_epi8(v->c8 + off, m, i8_out16(v, y));
        return;
    }
    if (v->oq) {
        __m512 t = _mm512_roundscale_ps(_mm512_div_ps(y, v->ys), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(t, v->yz), v->qlo), v->qhi);
        y = _mm512_mul_ps(_mm512_sub_ps(t, v->yz), v->ys);
    }
    _mm512_mask_storeu_ps(v->c + off, m, y);
}

/* the corrections, factors and bias of the 32 columns j0.. (masks m0, m1: those below n) */
typedef struct {
    __m512i k0, k1;
    __m512 u0, u1, b0, b1;
} i8_cols32;

static inline __attribute__((always_inline)) I8_T512 void i8_cols_init(const i8_ctx *q, int64_t j0, __mmask16 m0,
                                                                        __mmask16 m1, i8_cols32 *c) {
    c->k0 = _mm512_loadu_si512(q->corr + j0);
    c->k1 = _mm512_loadu_si512(q->corr + j0 + 16);
    c->u0 = _mm512_loadu_ps(q->mult + j0);
    c->u1 = _mm512_loadu_ps(q->mult + j0 + 16);
    c->b0 = q->has_bias ? _mm512_maskz_loadu_ps(m0, q->bias + j0) : _mm512_setzero_ps();
    c->b1 = q->has_bias ? _mm512_maskz_loadu_ps(m1, q->bias + j0 + 16) : _mm512_setzero_ps();
}
#endif

/* ---- the task's rows of A: a GEMM's shared tiles, a 1x1 conv's xp rows, else gathered rows ---- */
typedef struct {
    const uint8_t *base;
    int64_t blk, chunk, lda;
} i8_arows;

/* rows [r0, r0 + rows) of image img as i8_arows (rows past them readable, their values unused) */
static int i8_rows(i8_ctx *q, int64_t img, int64_t r0, int64_t rows, i8_arows *A) {
    if (q->ab) {
        *A = (i8_arows){q->ab + (r0 >> 4) * q->ablk, q->ablk, q->achunk, q->alda};
        return 0;
    }
    if (q->direct) {
        *A = (i8_arows){q->xp + (img * q->hp * q->wp + r0) * q->cin, 16 * q->cin, 64, q->cin};
        return 0;
    }
    int64_t lda = q->kp + 64, padded = (rows + 31) / 32 * 32;
    uint8_t *buf = (uint8_t *)i8_scratch((size_t)padded * (size_t)lda);
    if (!buf) { atomic_store(&q->failed, 1); return -1; }
    if (q->direct8) {
        /* a pixel's 16 channels of a block are 16 bytes of x8: the rows' blocks side by side (a
           tile row needs 64 bytes of k; rows past `rows` and lanes past cin: zeros) */
        const uint8_t *xi = q->x8 + (img * q->ib * q->m + r0) * 16;
        for (int64_t cb = 0; cb < q->ib; cb++)
            for (int64_t r = 0; r < rows; r++) memcpy(buf + r * lda + cb * 16, xi + (cb * q->m + r) * 16, 16);
        for (int64_t r = 0; r < padded; r++)
            memset(buf + r * lda + (r < rows ? q->cin : 0), 0, (size_t)(r < rows ? q->kp - q->cin : q->kp));
        *A = (i8_arows){buf, 16 * lda, 64, lda};
        return 0;
    }
    int64_t oh = r0 / q->ow, ow = r0 % q->ow;
    for (int64_t r = 0; r < padded; r++) {
        if (r >= rows) { memset(buf + r * lda, 0, (size_t)q->kp); continue; }
#if defined(I8_X86)
        if (q->variant >= 2) i8_gather512(q, img, oh, ow, buf + r * lda);
        else
#endif
            i8_gather(q, img, oh, ow, buf + r * lda);
        if (++ow == q->ow) { ow = 0; ++oh; }
    }
    *A = (i8_arows){buf, 16 * lda, 64, lda};
    return 0;
}

/* ---- scalar ---- */
static void i8_scalar_rows(i8_ctx *q, int64_t img, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    i8_arows A;
    if (i8_rows(q, img, r0, r1 - r0, &A)) return;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t p = p0; p < p1; p++) {
            const int8_t *bp = q->b + p * q->kp * I8_NR;
            int32_t acc[I8_NR] = {0};
            for (int64_t kk = 0; kk < q->kp; kk++) {
                int32_t av = *i8_addr(A.base, A.blk, A.chunk, A.lda, r - r0, kk);
                const int8_t *br = bp + (kk >> 2) * 128 + (kk & 3);
                for (int j = 0; j < I8_NR; j++) acc[j] += av * br[4 * j];
            }
            for (int64_t j = 0; j < I8_NR && p * I8_NR + j < q->n; j++) i8_store1(q, img, r, p * I8_NR + j, acc[j]);
        }
}

#if defined(I8_X86)
/* ---- avx2: quads widened to int16 (A zero-extended, B sign-extended), VPMADDWD pairs summed in
   int32 (exact: no saturating step), 2 rows x 16 columns a tile ---- */
static I8_T2 void i8_avx2_rows(i8_ctx *q, int64_t img, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    i8_arows A;
    if (i8_rows(q, img, r0, r1 - r0, &A)) return;
    for (int64_t p = p0; p < p1; p++)
        for (int h = 0; h < 2; h++) {
            const int8_t *bp = q->b + p * q->kp * I8_NR + h * 64;
            int64_t j0 = p * I8_NR + h * 16;
            if (j0 >= q->n) continue;
            for (int64_t r = r0; r < r1; r += 2) {
                int two = r + 1 < r1;
                __m256i c[2][4];
                for (int i = 0; i < 2; i++)
                    for (int u = 0; u < 4; u++) c[i][u] = _mm256_setzero_si256();
                const uint8_t *a0 = i8_addr(A.base, A.blk, A.chunk, A.lda, r - r0, 0);
                const uint8_t *a1 = i8_addr(A.base, A.blk, A.chunk, A.lda, r - r0 + two, 0);
                for (int64_t t = 0; t < q->kp / 4; t++) {
                    int64_t off = (t >> 4) * A.chunk + ((t & 15) << 2);
                    __m256i bw[4];
                    for (int u = 0; u < 4; u++)
                        bw[u] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(bp + t * 128 + u * 16)));
                    int32_t q0, q1;
                    memcpy(&q0, a0 + off, 4);
                    memcpy(&q1, a1 + off, 4);
                    __m256i v0 = _mm256_cvtepu8_epi16(_mm_set1_epi32(q0)), v1 = _mm256_cvtepu8_epi16(_mm_set1_epi32(q1));
                    for (int u = 0; u < 4; u++) {
                        c[0][u] = _mm256_add_epi32(c[0][u], _mm256_madd_epi16(v0, bw[u]));
                        c[1][u] = _mm256_add_epi32(c[1][u], _mm256_madd_epi16(v1, bw[u]));
                    }
                }
                for (int i = 0; i <= two; i++) {
                    int32_t out[16];
                    for (int u = 0; u < 2; u++) {
                        __m256i s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(c[i][2 * u], c[i][2 * u + 1]), 0xd8);
                        _mm256_storeu_si256((__m256i *)(out + 8 * u), s);
                    }
                    for (int64_t j = 0; j < 16 && j0 + j < q->n; j++) i8_store1(q, img, r + i, j0 + j, out[j]);
                }
            }
        }
}

/* ---- avx512_vnni: a 12 x 32 tile of C in 24 registers over all of k ---- */
static inline __attribute__((always_inline)) I8_T512 void i8_tile512(const i8_ctx *q, const i8_arows *A, int64_t img,
                                                                      int64_t r0, int64_t rr, int64_t p, const int mr) {
    __m512i c0[I8_MR], c1[I8_MR];
    const uint8_t *ap[I8_MR];
#pragma GCC unroll 12
    for (int i = 0; i < I8_MR; i++) {
        c0[i] = _mm512_setzero_si512(); c1[i] = _mm512_setzero_si512();
        ap[i] = i8_addr(A->base, A->blk, A->chunk, A->lda, rr + (i < mr ? i : 0), 0);
    }
    const int8_t *bp = q->b + p * q->kp * I8_NR;
    for (int64_t kc = 0; kc < q->kp / I8_KB; kc++) {
        int64_t off = kc * A->chunk;
        for (int64_t t = 0; t < 16; t++) {
            const int8_t *br = bp + (kc * 16 + t) * 128;
            __m512i b0 = _mm512_loadu_si512(br), b1 = _mm512_loadu_si512(br + 64);
#pragma GCC unroll 12
            for (int i = 0; i < I8_MR; i++) {
                if (i >= mr) break;
                int32_t v;
                memcpy(&v, ap[i] + off + 4 * t, 4);
                __m512i av = _mm512_set1_epi32(v);
                c0[i] = _mm512_dpbusd_epi32(c0[i], av, b0);
                c1[i] = _mm512_dpbusd_epi32(c1[i], av, b1);
            }
        }
    }
    int64_t j0 = p * I8_NR, o0 = i8_coff(q, img, r0, j0), o1 = i8_coff(q, img, r0, j0 + 16);
    __mmask16 m0 = i8_cols(q->n - j0), m1 = i8_cols(q->n - j0 - 16);
    i8_epv v;
    i8_cols32 k;
    i8_epv_init(q, &v);
    i8_cols_init(q, j0, m0, m1, &k);
    for (int i = 0; i < mr; i++) {
        i8_epi16(&v, c0[i], k.k0, k.u0, k.b0, o0 + i * q->rs, m0);
        if (m1) i8_epi16(&v, c1[i], k.k1, k.u1, k.b1, o1 + i * q->rs, m1);
    }
}

static __attribute__((noinline)) I8_T512 void i8_tile512_full(const i8_ctx *q, const i8_arows *A, int64_t img,
                                                              int64_t r0, int64_t rr, int64_t p) {
    i8_tile512(q, A, img, r0, rr, p, I8_MR);
}

static __attribute__((noinline)) I8_T512 void i8_tile512_tail(const i8_ctx *q, const i8_arows *A, int64_t img,
                                                              int64_t r0, int64_t rr, int64_t p, int mr) {
    switch (mr) {
    case 1: i8_tile512(q, A, img, r0, rr, p, 1); break;
    case 2: i8_tile512(q, A, img, r0, rr, p, 2); break;
    case 3: i8_tile512(q, A, img, r0, rr, p, 3); break;
    case 4: i8_tile512(q, A, img, r0, rr, p, 4); break;
    case 5: i8_tile512(q, A, img, r0, rr, p, 5); break;
    case 6: i8_tile512(q, A, img, r0, rr, p, 6); break;
    case 7: i8_tile512(q, A, img, r0, rr, p, 7); break;
    case 8: i8_tile512(q, A, img, r0, rr, p, 8); break;
    case 9: i8_tile512(q, A, img, r0, rr, p, 9); break;
    case 10: i8_tile512(q, A, img, r0, rr, p, 10); break;
    default: i8_tile512(q, A, img, r0, rr, p, 11); break;
    }
}

static I8_T512 void i8_vnni_rows(i8_ctx *q, int64_t img, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    i8_arows A;
    if (i8_rows(q, img, r0, r1 - r0, &A)) return;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t r = r0; r < r1; r += I8_MR) {
            if (r1 - r >= I8_MR) i8_tile512_full(q, &A, img, r, r - r0, p);
            else i8_tile512_tail(q, &A, img, r, r - r0, p, (int)(r1 - r));
        }
}

/* ---- amx_int8: 32 x 32 of C in four int32 tiles over all of k (A tiles 16 rows x 64 u8, B's
   halves tiles of 16 quad-rows, 128 bytes apart), stored to a scratch and the epilogue from there.
   A block's epilogue runs in slices between the next block's k-steps (two scratches in turn):
   at int8's rate the store of a 32 x 32 block costs about what its tiles do, and the vector units
   work while the tiles multiply ---- */

/* a block whose epilogue is pending: its scratch, C's row and column of its corner, its rows
   (`done` of them stored), its column masks */
typedef struct {
    const int32_t *cs;
    int64_t r, j0, live, done;
    __mmask16 m0, m1;
} i8_pend;

/* 4 rows' u8 outputs of 16 columns (raw sums 32 apart) where they are 64 bytes of C (a conv's
   block: 16 bytes a pixel): VPACKUS's saturation the clamp where (qlo, qhi) is (0, 255) (the
   integers lie in -2304..2303), one permutation and one store for 4 VPMOVDB */
static inline __attribute__((always_inline)) I8_TAMX void i8_pack4(const i8_epv *v, const int32_t *cs, __m512i corr,
                                                                    __m512 mult, __m512 bias, int64_t off) {
    __m512i n[4];
    for (int i = 0; i < 4; i++) {
        n[i] = i8_n16(v, i8_y16(v, _mm512_load_si512(cs + i * 32), corr, mult, bias, off + i * 16, 0xffff));
        if (v->narrow) n[i] = _mm512_min_epi32(_mm512_max_epi32(n[i], v->ylo8), v->yhi8);
    }
    /* per 128-bit lane L: 4 bytes of each row (its columns 4L..4L+3), rows in order */
    __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(n[0], n[1]), _mm512_packus_epi32(n[2], n[3]));
    __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(v->c8 + off, _mm512_permutexvar_epi32(idx, b));
}

/* the pending block's next rows up to `upto` through the epilogue */
static I8_TAMX void i8_amx_epi(const i8_ctx *q, i8_pend *e, int64_t img, int64_t upto) {
    int64_t i1 = upto < e->live ? upto : e->live, j0 = e->j0, rs = q->rs;
    if (i1 <= e->done) return;
    i8_epv v;
    i8_cols32 k;
    i8_epv_init(q, &v);
    i8_cols_init(q, j0, e->m0, e->m1, &k);
    int64_t o0 = i8_coff(q, img, e->r + e->done, j0), o1 = i8_coff(q, img, e->r + e->done, j0 + 16), i = e->done;
    if (v.c8 && rs == 16 && e->m0 == 0xffff && (e->m1 == 0 || e->m1 == 0xffff))
        for (; i + 4 <= i1; i += 4, o0 += 64, o1 += 64) {
            i8_pack4(&v, e->cs + i * 32, k.k0, k.u0, k.b0, o0);
            if (e->m1) i8_pack4(&v, e->cs + i * 32 + 16, k.k1, k.u1, k.b1, o1);
        }
    for (; i < i1; i++, o0 += rs, o1 += rs) {
        i8_epi16(&v, _mm512_load_si512(e->cs + i * 32), k.k0, k.u0, k.b0, o0, e->m0);
        if (e->m1) i8_epi16(&v, _mm512_load_si512(e->cs + i * 32 + 16), k.k1, k.u1, k.b1, o1, e->m1);
    }
    e->done = i1;
}

static I8_TAMX void i8_amx_rows(i8_ctx *q, int64_t img, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    i8_arows A;
    if (i8_rows(q, img, r0, r1 - r0, &A)) return;
    int32_t cs[2 * 32 * 32] __attribute__((aligned(64)));
    int64_t rows = r1 - r0, kb = q->kp / I8_KB, slice = (32 + kb - 1) / (kb ? kb : 1);
    i8_pend pend = {cs, 0, 0, 0, 0, 0, 0};
    bc_tilecfg cfg;
    bc_tiles16(&cfg);
    _tile_loadconfig(&cfg);
    for (int64_t p = p0; p < p1; p++) {
        const int8_t *bp = q->b + p * q->kp * I8_NR;
        int64_t j0 = p * I8_NR;
        __mmask16 m0 = i8_cols(q->n - j0), m1 = i8_cols(q->n - j0 - 16);
        for (int64_t rb = 0; rb < rows; rb += 32) {
            int64_t live = rows - rb < 32 ? rows - rb : 32;
            const uint8_t *ar = A.base + (rb >> 4) * A.blk;
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int64_t b = 0; b < kb; b++) {
                const uint8_t *a0 = ar + b * A.chunk;
                const int8_t *bb = bp + b * 16 * 128;
                _tile_loadd(4, a0, A.lda);
                _tile_loadd(6, bb, 128);
                _tile_dpbusd(0, 4, 6);
                _tile_loadd(7, bb + 64, 128);
                _tile_dpbusd(1, 4, 7);
                if (live > 16) {
                    _tile_loadd(5, a0 + A.blk, A.lda);
                    _tile_dpbusd(2, 5, 6);
                    _tile_dpbusd(3, 5, 7);
                }
                if (pend.done < pend.live) i8_amx_epi(q, &pend, img, (b + 1) * slice);
            }
            i8_amx_epi(q, &pend, img, 32);
            int32_t *cb = pend.cs == cs ? cs + 32 * 32 : cs;
            _tile_stored(0, cb, 128);
            _tile_stored(1, cb + 16, 128);
            if (live > 16) {
                _tile_stored(2, cb + 16 * 32, 128);
                _tile_stored(3, cb + 16 * 32 + 16, 128);
            }
            pend = (i8_pend){cb, r0 + rb, j0, live, 0, m0, m1};
        }
    }
    i8_amx_epi(q, &pend, img, 32);
    _tile_release();
}
#endif

/* task t: image, row block, panel group */
static void i8_task(void *vc, int64_t t, int slot) {
    (void)slot;
    i8_ctx *q = (i8_ctx *)vc;
    int64_t per_img = q->row_blocks * q->groups, img = t / per_img;
    int64_t rb = t % per_img / q->groups, g = t % q->groups;
    int64_t r0 = rb * q->mb, r1 = r0 + q->mb < q->m ? r0 + q->mb : q->m;
    int64_t p0 = g * q->per_group, p1 = p0 + q->per_group < q->panels ? p0 + q->per_group : q->panels;
    if (r0 >= r1 || p0 >= p1) return;
#if defined(I8_X86)
    if (q->variant == 3) { i8_amx_rows(q, img, r0, r1, p0, p1); return; }
    if (q->variant == 2) { i8_vnni_rows(q, img, r0, r1, p0, p1); return; }
    if (q->variant == 1) { i8_avx2_rows(q, img, r0, r1, p0, p1); return; }
#endif
    i8_scalar_rows(q, img, r0, r1, p0, p1);
}

/* ---- dynamic quantisation: ONNX DynamicQuantizeLinear's scale and zero point of len values ---- */
#if defined(I8_X86)
static I8_T512 void i8_minmax512(const float *src, int64_t len, float *mn, float *mx) {
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m512 v = _mm512_loadu_ps(src + i);
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    float a = _mm512_reduce_min_ps(lo), b = _mm512_reduce_max_ps(hi);
    for (; i < len; i++) { a = src[i] < a ? src[i] : a; b = src[i] > b ? src[i] : b; }
    *mn = a;
    *mx = b;
}
#endif

static void i8_dynamic(i8_ctx *q, const float *src, int64_t len) {
    float mn = 0.0f, mx = 0.0f;
#if defined(I8_X86)
    if (q->variant >= 2) i8_minmax512(src, len, &mn, &mx);
    else
#endif
        for (int64_t i = 0; i < len; i++) { mn = src[i] < mn ? src[i] : mn; mx = src[i] > mx ? src[i] : mx; }
    float d = mx - mn, s = mx == mn ? 1.0f : d / 255.0f, z = 0.0f - mn / s;
    z = z > 0.0f ? z : 0.0f;
    z = z < 255.0f ? z : 255.0f;
    q->xs = s;
    q->zu = rintf(z);
}

/* split q's rows (images x blocks of mb) and panels into tasks and run them on `width` threads,
   after the pass that quantises A (a GEMM's into shared tiles, a conv's input into xp) */
static PyObject *i8_run(i8_ctx *q, int64_t width, const float *ws, int64_t nws) {
    atomic_init(&q->failed, 0);
    q->panels = (q->n + I8_NR - 1) / I8_NR;
    q->yr = 1.0f / q->ys;
    q->yfast = q->yr >= 0x1p-100f && q->yr <= 0x1p100f;
    if (q->c8) {
        float l = 2048.0f * q->ys;  /* exact: a power of two times ys <= 2^100 (when yfast) */
        q->merge = q->yfast && q->clip && !q->act && q->lo == q->lo && q->hi == q->hi;
        q->ylo = q->merge ? ge_min32(ge_max32(q->lo, -l), l) : -l;
        q->yhi = q->merge ? ge_min32(ge_max32(q->hi, -l), l) : l;
        q->ybias = 0x4b400000 - (int32_t)q->yz;
        q->ylo8 = (int32_t)q->qlo;
        q->yhi8 = (int32_t)q->qhi;
    }
    if (q->mq) {
        float l = 262144.0f * q->ms;  /* exact: a power of two times ms <= 2^100 (when mfast) */
        q->mr = 1.0f / q->ms;
        q->mfast = q->mr >= 0x1p-100f && q->mr <= 0x1p100f;
        q->mylo = -l;
        q->myhi = l;
        q->mlo8 = (int32_t)(q->mlo - q->mz);
        q->mhi8 = (int32_t)(q->mhi - q->mz);
    }
    if (q->xs == 0.0f) i8_dynamic(q, q->x ? q->x : q->a, q->x ? q->images * (q->plain ? q->cin : q->ib * 16) * q->h * q->w : q->m * q->k);
    q->zi = (int32_t)q->zu;
    q->xr = 1.0f / q->xs;
    q->fast = q->xr >= 0x1p-100f && q->xr <= 0x1p100f;
    q->mb = q->variant == 3 ? 64 : q->variant == 2 ? 4 * I8_MR : q->variant == 1 ? 32 : 16;
    int gemm = q->x == NULL && q->x8 == NULL;
    if (gemm && q->variant == 3) {
        if (q->m * q->kp * q->n < (1 << 25)) width = 1;
        int64_t rows32 = (q->m + 31) / 32 * 32, cap = (512 * 1024) / (q->kp + 64) / 32 * 32;
        cap = cap < 32 ? 32 : cap > 512 ? 512 : cap;
        int64_t blocks = (rows32 + cap - 1) / cap;
        if (width > 1 && blocks > 1) blocks = (blocks + width - 1) / width * width;
        q->mb = ((q->m + blocks - 1) / blocks + 31) / 32 * 32;
    }
    size_t abytes = gemm ? (size_t)((q->m + 31) / 32 * 32) * (size_t)q->kp
                         : q->direct8 ? 64 : (size_t)ge_prod(q->images * q->hp, q->wp, q->cin, 1) + (size_t)(32 * q->cin + 64);
    uint8_t *buf = (uint8_t *)aligned_alloc(64, (abytes + 63) / 64 * 64);
    q->mult = buf ? (float *)aligned_alloc(64, (size_t)q->panels * I8_NR * 8) : NULL;
    if (!q->mult) { free(buf); return PyErr_NoMemory(); }
    q->corr = (int32_t *)(q->mult + q->panels * I8_NR);
    for (int64_t j = 0; j < q->panels * I8_NR; j++) {
        float wsj = nws == 1 ? ws[0] : j < nws ? ws[j] : 0.0f;
        q->mult[j] = q->xs * wsj;
        q->corr[j] = (int32_t)((uint32_t)q->zi * (uint32_t)q->colsum[j]);
    }
    if (gemm) { q->ab = buf; q->ablk = q->kp / I8_KB * 1024; q->achunk = 1024; q->alda = 64; }
    else q->xp = buf;
    q->row_blocks = (q->m + q->mb - 1) / q->mb;
    int64_t want = width > 1 ? (gemm ? 4 : 1) * width : 1, groups = want / (q->row_blocks * q->images);
    if (groups < 1) groups = 1;
    if (groups > q->panels) groups = q->panels;
    q->per_group = (q->panels + groups - 1) / groups;
    q->groups = (q->panels + q->per_group - 1) / q->per_group;
    Py_BEGIN_ALLOW_THREADS
    if (gemm) ge_parallel(i8_atask, q, (q->m + 31) / 32 * 2, width);
    else if (!q->direct8) ge_parallel(i8_xtask, q, q->images * q->hp, width);
    ge_parallel(i8_task, q, q->images * q->row_blocks * q->groups, width);
    Py_END_ALLOW_THREADS
    free(buf);
    free(q->mult);
    if (atomic_load(&q->failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *i8_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(1);
}

/* the variants this CPU runs, a mask: 1 scalar, 2 avx2, 4 avx512_vnni, 8 amx_int8 */
static PyObject *i8_caps(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(i8_caps_mask());
}

static PyObject *i8_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyUnicode_FromString(i8_isa_name());
}

/* the arguments both entries share, from args[3]: colsum int32 (P * 32), w_scale float32 (1 or
   n_ws), bias float32, the addend (as C, dims) or None, float32 params (x_scale (0: dynamic), u8
   zero point, clip lo, hi, out-quant scale, zero point, lo, hi, and where there are 12 the mid
   fake-quant's scale, zero point, lo, hi: integers, -2^16 <= lo <= zero point <= hi <= 2^16),
   int64 params (has_bias, clip, act, out-quant, threads, variant); *width, *ws, *nws out */
static int i8_common(PyObject *const *args, i8_ctx *q, int64_t panels, int64_t nbias, int nd, const int64_t *cdims,
                     int64_t n_ws, int64_t *width, const float **ws, int64_t *nws) {
    int64_t ncs, nb, nf, ni, got[5];
    const int32_t *cs = (const int32_t *)ge_vec(args, 3, NPY_INT32, 0, &ncs);
    *ws = cs ? (const float *)ge_vec(args, 4, NPY_FLOAT, 0, nws) : NULL;
    const float *bias = *ws ? (const float *)ge_vec(args, 5, NPY_FLOAT, 0, &nb) : NULL;
    const float *fp = bias ? (const float *)ge_vec(args, 7, NPY_FLOAT, 0, &nf) : NULL;
    const int64_t *ip = fp ? (const int64_t *)ge_vec(args, 8, NPY_INT64, 0, &ni) : NULL;
    if (!ip) return -1;
    q->add = NULL;
    if (args[6] != Py_None) {
        q->add = (const float *)ge_nd(args, 6, NPY_FLOAT, 0, nd, got);
        if (!q->add) return -1;
        for (int d = 0; d < nd; d++)
            if (got[d] != cdims[d]) { ge_fail(); return -1; }
    }
    if ((nf != 8 && nf != 12) || ni != 6 || ncs != panels * I8_NR || !(*nws == 1 || *nws == n_ws)) { ge_fail(); return -1; }
    if (ip[0] < 0 || ip[0] > 1 || ip[1] < 0 || ip[1] > 1 || ip[2] < 0 || ip[2] > 5 || ip[3] < 0 || ip[3] > 1
        || ip[4] < 1 || ip[4] > 4096 || ip[5] < 0 || ip[5] > 3 || (ip[0] && nb != nbias)) { ge_fail(); return -1; }
    if (!(i8_caps_mask() >> ip[5] & 1)) {
        PyErr_SetString(PyExc_ValueError, "int8gemm: this CPU does not run the variant asked for");
        return -1;
    }
    float xs = fp[0], zu = fp[1];
    if (!(xs == 0.0f || (xs > 0.0f && xs <= 3.4e38f)) || !(zu >= 0.0f && zu <= 255.0f) || zu != rintf(zu)
        || (ip[3] && !(fp[4] > 0.0f && fp[4] <= 3.4e38f))) { ge_fail(); return -1; }
    q->mq = nf == 12;
    if (q->mq) {
        float ms = fp[8], mz = fp[9], mlo = fp[10], mhi = fp[11];
        if (!(ms > 0.0f && ms <= 3.4e38f) || !(-65536.0f <= mlo && mlo <= mz && mz <= mhi && mhi <= 65536.0f)
            || mz != rintf(mz) || mlo != rintf(mlo) || mhi != rintf(mhi)) { ge_fail(); return -1; }
        q->ms = ms; q->mz = mz; q->mlo = mlo; q->mhi = mhi;
    }
    q->colsum = cs; q->bias = bias; q->has_bias = ip[0]; q->clip = ip[1]; q->lo = fp[2]; q->hi = fp[3];
    q->act = ip[2]; q->oq = ip[3]; q->ys = fp[4]; q->yz = fp[5]; q->qlo = fp[6]; q->qhi = fp[7];
    q->xs = xs; q->zu = zu; q->variant = ip[5];
    *width = ip[4];
    return 0;
}

/* the dtype of argument i as the entries take it: NPY_UINT8 for a uint8 ndarray, else NPY_FLOAT
   (ge_nd checks the rest) */
static int i8_type(PyObject *const *args, int i) {
    PyObject *o = args[i];
    int u8 = ge_ndarray && PyObject_TypeCheck(o, ge_ndarray) && PyArray_TYPE((PyArrayObject *)o) == NPY_UINT8;
    return u8 ? NPY_UINT8 : NPY_FLOAT;
}

/* A (or x) and C by their dtypes into q; -1 where they do not fit: a u8 input needs a static
   scale, a u8 output the output quantisation with integers 0 <= qlo <= qhi <= 255 and yz */
static int i8_dtypes(i8_ctx *q, int ta, const void *a, int tc, void *c, int conv) {
    if ((ta == NPY_UINT8 && q->xs == 0.0f)
        || (tc == NPY_UINT8 && !(q->oq && q->qlo >= 0.0f && q->qlo <= q->qhi && q->qhi <= 255.0f && q->qlo == rintf(q->qlo)
                                 && q->qhi == rintf(q->qhi) && q->yz == rintf(q->yz)))) return -1;
    if (conv) { q->x = ta == NPY_FLOAT ? a : NULL; q->x8 = ta == NPY_UINT8 ? a : NULL; }
    else { q->a = ta == NPY_FLOAT ? a : NULL; q->a8 = ta == NPY_UINT8 ? a : NULL; }
    q->c = tc == NPY_FLOAT ? c : NULL;
    q->c8 = tc == NPY_UINT8 ? c : NULL;
    return 0;
}

/* C (m, n) = dequant(quant(A (m, k)) @ packed B): (A, B (P, kp / 4, 128) int8, C, colsum, w_scale,
   bias, addend (m, n) or None, float params, int params (i8_common), the k B was packed for); A
   float32 or u8 (already quantised), C float32 or u8 (quantised by out-quant) */
static PyObject *i8_matmul(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t m, k, mc, nc, kb, width, nws, dims[3];
    const float *ws;
    if (ge_nargs(n, 10) || ge_int(args, 9, 0, I8_KMAX, &kb)) return NULL;
    int ta = i8_type(args, 0), tc = i8_type(args, 2);
    const void *a = ge_mat(args, 0, ta, 0, &m, &k);
    const int8_t *b = a ? (const int8_t *)ge_nd(args, 1, NPY_INT8, 0, 3, dims) : NULL;
    void *c = b ? ge_mat(args, 2, tc, 1, &mc, &nc) : NULL;
    if (!c) return NULL;
    i8_ctx q;
    memset(&q, 0, sizeof(q));
    int64_t kp = (k + I8_KB - 1) / I8_KB * I8_KB, cdims[2] = {mc, nc};
    if (i8_common(args, &q, dims[0], nc, 2, cdims, nc, &width, &ws, &nws)) return NULL;
    if (mc != m || kb != k || dims[2] != 4 * I8_NR || dims[1] * 4 != kp || dims[0] != (nc + I8_NR - 1) / I8_NR
        || ge_prod(m + 32, kp, 4, 1) < 0 || ge_prod(dims[0], dims[1], dims[2], 1) < 0
        || i8_dtypes(&q, ta, a, tc, c, 0)) return ge_fail();
    if (m == 0 || nc == 0) Py_RETURN_NONE;
    q.m = m; q.k = k; q.kp = kp; q.b = b; q.n = nc; q.rs = nc; q.bs = 16; q.images = 1;
    return i8_run(&q, width, ws, nws);
}

/* the convolution: (x, packed weight (P, kp / 4, 128) int8, out (N, MB, OH, OW, 16), colsum,
   w_scale (1 or M <= MB * 16), bias (MB * 16), addend (as out) or None, float params, int params
   (i8_common), geometry int64 (kh, kw, sh, sw, dh, dw, top, left, bottom, right), plain 0|1): x
   blocked (N, ib, H, W, 16) with k = kh * kw * ib * 16 rows (kh, kw, block, channel), or plain
   (N, C, H, W) of 1 <= C <= 16 with k = kh * kw * C; x float32 or u8 (already quantised), out
   float32 or u8 (quantised by out-quant) */
static PyObject *i8_conv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t xd[5], wd[3], od[5], gn = 0, plain, width, nws;
    const float *ws;
    if (ge_nargs(n, 11) || ge_int(args, 10, 0, 1, &plain)) return NULL;
    int tx = i8_type(args, 0), tc = i8_type(args, 2);
    const void *x = ge_nd(args, 0, tx, 0, plain ? 4 : 5, xd);
    if (x && plain) {
        xd[4] = xd[1]; xd[1] = 0;
        if (xd[4] < 1 || xd[4] > 16) return ge_fail();
    }
    const int8_t *b = x ? (const int8_t *)ge_nd(args, 1, NPY_INT8, 0, 3, wd) : NULL;
    void *c = b ? ge_nd(args, 2, tc, 1, 5, od) : NULL;
    const int64_t *g = c ? (const int64_t *)ge_vec(args, 9, NPY_INT64, 0, &gn) : NULL;
    if (!g) return NULL;
    i8_ctx q;
    memset(&q, 0, sizeof(q));
    if (i8_common(args, &q, wd[0], od[1] * 16, 5, od, od[1] * 16, &width, &ws, &nws)) return NULL;
    if (gn != 10) return ge_fail();
    for (int i = 0; i < 10; i++)
        if (g[i] < (i < 6 ? 1 : 0) || g[i] > (1 << 20)) return ge_fail();
    int64_t span_h = g[4] * (g[0] - 1) + 1, span_w = g[5] * (g[1] - 1) + 1;
    int64_t eh = xd[2] + g[6] + g[8] - span_h, ew = xd[3] + g[7] + g[9] - span_w;
    int64_t k = plain ? ge_prod(g[0], g[1], xd[4], 1) : ge_prod(g[0], g[1], xd[1], 16), kp = (k + I8_KB - 1) / I8_KB * I8_KB;
    if ((!plain && xd[4] != 16) || od[4] != 16 || od[0] != xd[0] || eh < 0 || ew < 0 || od[2] != eh / g[2] + 1
        || od[3] != ew / g[3] + 1 || k < 0 || k > I8_KMAX || wd[2] != 4 * I8_NR || wd[1] * 4 != kp
        || wd[0] != (od[1] + 1) / 2 || ge_prod(od[2], od[3], 1, 1) < 0 || ge_prod(64, kp + 64, 1, 1) < 0
        || ge_prod(ge_prod(xd[0], xd[2] + g[6] + g[8], xd[3] + g[7] + g[9], 1), plain ? xd[4] : xd[1], 64, 1) < 0
        || i8_dtypes(&q, tx, x, tc, c, 1))
        return ge_fail();
    if (od[0] == 0 || od[1] == 0 || od[2] == 0 || od[3] == 0) Py_RETURN_NONE;
    q.m = od[2] * od[3]; q.k = k; q.kp = kp; q.b = b; q.n = od[1] * 16;
    q.rs = 16; q.bs = q.m * 16; q.is = od[1] * q.m * 16; q.images = od[0];
    q.plain = plain; q.ib = xd[1]; q.h = xd[2]; q.w = xd[3]; q.kh = g[0]; q.kw = g[1]; q.sh = g[2];
    q.sw = g[3]; q.dh = g[4]; q.dw = g[5]; q.pt = g[6]; q.pl = g[7]; q.ow = od[3];
    q.cin = plain ? xd[4] : xd[1] * 16; q.hp = xd[2] + g[6] + g[8]; q.wp = xd[3] + g[7] + g[9];
    int one = !plain && g[0] == 1 && g[1] == 1 && g[2] == 1 && g[3] == 1 && g[6] + g[7] + g[8] + g[9] == 0;
    q.direct = one && q.x && kp == q.cin;
    q.direct8 = one && q.x8;
    return i8_run(&q, width, ws, nws);
}
