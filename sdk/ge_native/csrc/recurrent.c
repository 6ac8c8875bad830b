#include "prelude.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <pthread.h>

/* GE's LSTM / GRU / RNN recurrence (ge_native.recurrent), float32: every step of every direction
   in one call, after the caller's input projection. xw (nd, steps, batch, W) holds each step's
   x W^T + biases, per direction in the order that direction reads X (the caller reverses X for
   a reverse direction); its columns are the gates in blocks padded to 32: LSTM (i, o, f, c) at
   k * H, RNN at 0, GRU z at 0, r at H, h at zp. rp (nd, W / 16, H, 16) is R^T in panels of 16
   columns (zero columns where xw's are padding). A step: G = h_{t-1} R^T + xw_t (a small GEMM
   streaming R once: register tiles of up to 8 rows x 32 columns for AVX-512, 6 x 16 for AVX2,
   the rows cut into tiles of even height; 4 x 16 in plain C for scalar; every sum runs over k
   in order), then the gates row by row: clip, the ONNX activations with alpha / beta,
   peepholes, input_forget, GRU's reset before or after the second product
   (linear_before_reset: h R_h^T + Rb_h, then times r). hs (steps, nd, batch, H) gets h_t; c
   (nd, batch, H) holds LSTM's cell state, updated in place. A batch entry whose sequence has
   ended (t >= lens[b]) keeps its state. Threads: a task is one direction (all its steps); with
   more threads than directions and steps of batch * W * H >= RN_SPLIT_MIN, each step is split
   instead (its products into column chunks, its gates into batch rows). Either way each element
   is computed alike: the same bits at every thread count. The gates are plain C the build's
   -march vectorises (rn_exp / rn_sigmoid / rn_tanh below, the prelude's log1p32 / expm1_32 /
   exp32); the variants differ in the GEMM: 0 scalar, 1 avx2 (FMA), 2 avx512f (FMA). */
#define RN_LIM (1 << 24)
#define RN_NACT 11
#define RN_SPLIT_MIN 16384  /* batch * W * H of a step below which it runs on one thread */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define RN_X86 1
#define RN_T2 __attribute__((target("avx2,fma")))
#define RN_T512 __attribute__((target("avx2,fma,avx512f")))
#endif

enum { RN_RNN = 0, RN_GRU = 1, RN_LSTM = 2 };
/* activation codes: ge_native.recurrent.ACTIVATIONS */
enum { RA_RELU, RA_TANH, RA_SIGMOID, RA_AFFINE, RA_LEAKY, RA_THRESH, RA_STANH, RA_HSIG, RA_ELU, RA_SSIGN, RA_SPLUS };

typedef struct {
    int64_t code;
    float alpha, beta;
} rn_act;

typedef struct {
    const float *xw, *rp, *hinit, *peep, *rbh;
    float *hs, *c;
    const int64_t *lens;
    int64_t op, nd, steps, run, batch, hidden, width, zp, variant;
    int64_t clip_on, input_forget, lbr, has_peep;
    float clip;
    rn_act act[2][3];
    atomic_int failed;
} rn_ctx;

/* ---- CPU detection ---- */
static int rn_mask = 1;
static pthread_once_t rn_once = PTHREAD_ONCE_INIT;

#if defined(RN_X86)
static uint64_t rn_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static void rn_detect(void) {
    int mask = 1;
#if defined(RN_X86)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) { rn_mask = mask; return; }
    int fma = c >> 12 & 1;
    uint64_t xcr0 = rn_xcr0();
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) { rn_mask = mask; return; }
    if ((b >> 5 & 1) && fma && (xcr0 & 6) == 6) mask |= 2;
    if ((mask & 2) && (b >> 16 & 1) && (xcr0 & 0xe6) == 0xe6) mask |= 4;
#endif
    rn_mask = mask;
}

static int rn_caps_mask(void) {
    pthread_once(&rn_once, rn_detect);
    return rn_mask;
}

static const char *const rn_names[3] = {"scalar", "avx2", "avx512f"};

/* the variant a call runs unless told otherwise: GE_NATIVE_RECURRENT's where this CPU runs it, else the best */
static int rn_default(void) {
    int mask = rn_caps_mask(), best = 0;
    const char *forced = getenv("GE_NATIVE_RECURRENT");
    for (int v = 0; v < 3; v++) {
        if (!(mask >> v & 1)) continue;
        best = v;
        if (forced && strcmp(forced, rn_names[v]) == 0) return v;
    }
    return best;
}

/* ---- the step GEMM: o[r][16p + l] = sum_k a[r][k] bp[p][k][l] (+ x[r][16p + l]), p < np ---- */
/* plain C: tiles of 4 rows by a panel, the 16 lanes the vector loop (vectorising over k instead,
   as GCC does unasked, ran 20x slower) */
static void rn_gemm1(const float *a, int64_t lda, int64_t rows, const float *bp, int64_t k, int64_t np,
                     const float *x, int64_t ldx, float *o, int64_t ldo) {
    for (int64_t r = 0; r < rows; r += 4) {
        int64_t nr = rows - r < 4 ? rows - r : 4;
        for (int64_t p = 0; p < np; p++) {
            const float *b = bp + p * k * 16, *ar = a + r * lda;
            float acc[4][16];
            for (int i = 0; i < 4; i++)
                for (int l = 0; l < 16; l++) acc[i][l] = 0.0f;
            for (int64_t kk = 0; kk < k; kk++)
                for (int64_t i = 0; i < nr; i++) {
                    float av = ar[i * lda + kk];
#pragma omp simd
                    for (int l = 0; l < 16; l++) acc[i][l] += av * b[kk * 16 + l];
                }
            for (int64_t i = 0; i < nr; i++)
                for (int l = 0; l < 16; l++) {
                    float v = acc[i][l];
                    o[(r + i) * ldo + p * 16 + l] = x ? v + x[(r + i) * ldx + p * 16 + l] : v;
                }
        }
    }
}

#if defined(RN_X86)
/* nr (<= 6) rows by one panel: 2 x nr accumulators */
static inline __attribute__((always_inline)) RN_T2 void rn_tile2(const float *a, int64_t lda, int nr, const float *b,
                                                                 int64_t k, const float *x, int64_t ldx, float *o,
                                                                 int64_t ldo) {
    __m256 acc[6][2];
    for (int r = 0; r < 6; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        __m256 w0 = _mm256_loadu_ps(b + kk * 16), w1 = _mm256_loadu_ps(b + kk * 16 + 8);
        for (int r = 0; r < 6; r++)
            if (r < nr) {
                __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
                acc[r][0] = _mm256_fmadd_ps(av, w0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(av, w1, acc[r][1]);
            }
    }
    for (int r = 0; r < nr; r++) {
        if (x) {
            acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(x + r * ldx));
            acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(x + r * ldx + 8));
        }
        _mm256_storeu_ps(o + r * ldo, acc[r][0]);
        _mm256_storeu_ps(o + r * ldo + 8, acc[r][1]);
    }
}

static RN_T2 void rn_gemm2(const float *a, int64_t lda, int64_t rows, const float *bp, int64_t k, int64_t np,
                           const float *x, int64_t ldx, float *o, int64_t ldo) {
    int64_t tiles = (rows + 5) / 6, step = (rows + tiles - 1) / tiles; /* tiles of even height: 8 rows as 4 + 4 */
    for (int64_t p = 0; p < np; p++)
        for (int64_t r = 0; r < rows; r += step) {
            const float *ar = a + r * lda, *b = bp + p * k * 16, *xr = x ? x + r * ldx + p * 16 : NULL;
            float *orow = o + r * ldo + p * 16;
            switch (rows - r < step ? rows - r : step) {
            case 1: rn_tile2(ar, lda, 1, b, k, xr, ldx, orow, ldo); break;
            case 2: rn_tile2(ar, lda, 2, b, k, xr, ldx, orow, ldo); break;
            case 3: rn_tile2(ar, lda, 3, b, k, xr, ldx, orow, ldo); break;
            case 4: rn_tile2(ar, lda, 4, b, k, xr, ldx, orow, ldo); break;
            case 5: rn_tile2(ar, lda, 5, b, k, xr, ldx, orow, ldo); break;
            default: rn_tile2(ar, lda, 6, b, k, xr, ldx, orow, ldo); break;
            }
        }
}

/* nr (<= 8) rows by two panels (32 columns): 2 x nr accumulators */
static inline __attribute__((always_inline)) RN_T512 void rn_tile16(const float *a, int64_t lda, int nr,
                                                                    const float *b0, int64_t k, const float *x,
                                                                    int64_t ldx, float *o, int64_t ldo) {
    __m512 acc[8][2];
    const float *b1 = b0 + k * 16;
    for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        __m512 w0 = _mm512_loadu_ps(b0 + kk * 16), w1 = _mm512_loadu_ps(b1 + kk * 16);
        for (int r = 0; r < 8; r++)
            if (r < nr) {
                __m512 av = _mm512_set1_ps(a[r * lda + kk]);
                acc[r][0] = _mm512_fmadd_ps(av, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(av, w1, acc[r][1]);
            }
    }
    for (int r = 0; r < nr; r++) {
        if (x) {
            acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_loadu_ps(x + r * ldx));
            acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_loadu_ps(x + r * ldx + 16));
        }
        _mm512_storeu_ps(o + r * ldo, acc[r][0]);
        _mm512_storeu_ps(o + r * ldo + 16, acc[r][1]);
    }
}

/* np even (the callers' blocks are padded to 32 columns) */
static RN_T512 void rn_gemm16(const float *a, int64_t lda, int64_t rows, const float *bp, int64_t k, int64_t np,
                              const float *x, int64_t ldx, float *o, int64_t ldo) {
    int64_t tiles = (rows + 7) / 8, step = (rows + tiles - 1) / tiles; /* tiles of even height: 9 rows as 5 + 4 */
    for (int64_t p = 0; p < np; p += 2)
        for (int64_t r = 0; r < rows; r += step) {
            const float *ar = a + r * lda, *b = bp + p * k * 16, *xr = x ? x + r * ldx + p * 16 : NULL;
            float *orow = o + r * ldo + p * 16;
            switch (rows - r < step ? rows - r : step) {
            case 1: rn_tile16(ar, lda, 1, b, k, xr, ldx, orow, ldo); break;
            case 2: rn_tile16(ar, lda, 2, b, k, xr, ldx, orow, ldo); break;
            case 3: rn_tile16(ar, lda, 3, b, k, xr, ldx, orow, ldo); break;
            case 4: rn_tile16(ar, lda, 4, b, k, xr, ldx, orow, ldo); break;
            case 5: rn_tile16(ar, lda, 5, b, k, xr, ldx, orow, ldo); break;
            case 6: rn_tile16(ar, lda, 6, b, k, xr, ldx, orow, ldo); break;
            case 7: rn_tile16(ar, lda, 7, b, k, xr, ldx, orow, ldo); break;
            default: rn_tile16(ar, lda, 8, b, k, xr, ldx, orow, ldo); break;
            }
        }
}
#endif

static void rn_gemm(const rn_ctx *q, const float *a, const float *bp, int64_t np, const float *x, float *o) {
#if defined(RN_X86)
    if (q->variant == 2) { rn_gemm16(a, q->hidden, q->batch, bp, q->hidden, np, x, q->width, o, q->width); return; }
    if (q->variant == 1) { rn_gemm2(a, q->hidden, q->batch, bp, q->hidden, np, x, q->width, o, q->width); return; }
#endif
    rn_gemm1(a, q->hidden, q->batch, bp, q->hidden, np, x, q->width, o, q->width);
}

/* ---- the gates ---- */

/* e^x for the gates, x held in [-80, 80] (one scale factor, where exp32 takes two; the gates'
   results past it are the same floats or within 2e-35 of them, and no sigmoid is a denormal,
   whose every use costs a microcode assist); NaN passes */
static inline float rn_exp(float x) {
    float xc = ge_min32(ge_max32(x, -80.0f), 80.0f);
    float t;
    float y = ge_exp_core(xc, &t);
    return y * ge_bits_f32((ge_f32_bits(t) - 0x4B400000 + 127) << 23);
}

static inline float rn_sigmoid(float x) { return 1.0f / (1.0f + rn_exp(-x)); }

/* tanh32's forms: its odd polynomial below 0.625, 1 - 2 / (e^2|x| + 1) above (e^2|x| held at
   e^40: tanh is 1.0f from 9.1 on) */
static inline float rn_tanh(float x) {
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z + -5.37397155531e-2f) * z + 1.33314422036e-1f) * z
                   + -3.33332819422e-1f) * z * x + x;
    float ax = fabsf(x);
    float big = 1.0f - 2.0f / (rn_exp(ax + ax) + 1.0f);
    big = x < 0.0f ? -big : big;
    return ax < 0.625f ? small : big;
}

/* an ONNX activation in place over x[0, n) (NaN passes through each, as in NumPy) */
static void rn_apply(const rn_act *f, float *x, int64_t n) {
    float al = f->alpha, be = f->beta;
    switch (f->code) {
    case RA_RELU: for (int64_t i = 0; i < n; i++) x[i] = ge_max32(x[i], 0.0f); break;
    case RA_TANH: for (int64_t i = 0; i < n; i++) x[i] = rn_tanh(x[i]); break;
    case RA_SIGMOID: for (int64_t i = 0; i < n; i++) x[i] = rn_sigmoid(x[i]); break;
    case RA_AFFINE: for (int64_t i = 0; i < n; i++) x[i] = al * x[i] + be; break;
    case RA_LEAKY: for (int64_t i = 0; i < n; i++) x[i] = x[i] >= 0.0f ? x[i] : al * x[i]; break;
    case RA_THRESH: for (int64_t i = 0; i < n; i++) x[i] = x[i] > al ? x[i] : (x[i] != x[i] ? x[i] : 0.0f); break;
    case RA_STANH: for (int64_t i = 0; i < n; i++) x[i] = al * rn_tanh(be * x[i]); break;
    case RA_HSIG: for (int64_t i = 0; i < n; i++) x[i] = ge_min32(ge_max32(al * x[i] + be, 0.0f), 1.0f); break;
    case RA_ELU: for (int64_t i = 0; i < n; i++) x[i] = x[i] < 0.0f ? al * expm1_32(x[i]) : x[i]; break;
    case RA_SSIGN: for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + fabsf(x[i])); break;
    default:
        for (int64_t i = 0; i < n; i++) x[i] = ge_max32(x[i], 0.0f) + log1p32(exp32(-fabsf(x[i])));
        break;
    }
}

static void rn_clip(const rn_ctx *q, float *x, int64_t n) {
    if (!q->clip_on) return;
    float c = q->clip;
    for (int64_t i = 0; i < n; i++) x[i] = ge_min32(ge_max32(x[i], -c), c);
}

/* LSTM's gates of batch row b from g (i, o, f, c pre-activations): the cell state c, h into hn */
static void rn_lstm_row(const rn_ctx *q, int64_t d, float *g, float *c, float *hn, float *t) {
    int64_t hid = q->hidden;
    float *gi = g, *go = g + hid, *gf = g + 2 * hid, *gc = g + 3 * hid;
    const float *pi = q->peep + d * 3 * hid, *po = pi + hid, *pf = pi + 2 * hid;
    const rn_act *a = q->act[d];
    if (q->has_peep) {
        for (int64_t j = 0; j < hid; j++) gi[j] += pi[j] * c[j];
        if (!q->input_forget)
            for (int64_t j = 0; j < hid; j++) gf[j] += pf[j] * c[j];
    }
    rn_clip(q, gi, hid);
    rn_clip(q, gc, hid);
    rn_apply(&a[0], gi, hid);
    if (q->input_forget) {
        for (int64_t j = 0; j < hid; j++) gf[j] = 1.0f - gi[j];
    } else {
        rn_clip(q, gf, hid);
        rn_apply(&a[0], gf, hid);
    }
    rn_apply(&a[1], gc, hid);
    for (int64_t j = 0; j < hid; j++) c[j] = gf[j] * c[j] + gi[j] * gc[j];
    if (q->has_peep)
        for (int64_t j = 0; j < hid; j++) go[j] += po[j] * c[j];
    rn_clip(q, go, hid);
    rn_apply(&a[0], go, hid);
    memcpy(t, c, (size_t)hid * sizeof(float));
    rn_apply(&a[2], t, hid);
    for (int64_t j = 0; j < hid; j++) hn[j] = go[j] * t[j];
}

/* the state before step s of direction d (batch, H), and where step s puts its own */
static const float *rn_hprev(const rn_ctx *q, int64_t d, int64_t s) {
    return s == 0 ? q->hinit + d * q->batch * q->hidden : q->hs + ((s - 1) * q->nd + d) * q->batch * q->hidden;
}

static float *rn_hnext(const rn_ctx *q, int64_t d, int64_t s) {
    return q->hs + (s * q->nd + d) * q->batch * q->hidden;
}

static const float *rn_xs(const rn_ctx *q, int64_t d, int64_t s) {
    return q->xw + (d * q->steps + s) * q->batch * q->width;
}

/* the first product of a step, panels [p0, p1) of direction d: G = h R^T + xw_t (GRU: its z/r
   panels); then GRU's second, panels [p0, p1) of its h block: (r * H) R_h^T + xw_t, or
   H R_h^T alone (linear_before_reset) */
static void rn_product(const rn_ctx *q, int second, int64_t d, int64_t s, int64_t p0, int64_t p1, float *g,
                       const float *rh) {
    int64_t hid = q->hidden, off = second ? q->zp : 0;
    const float *a = second && !q->lbr ? rh : rn_hprev(q, d, s), *xs = rn_xs(q, d, s);
    const float *rp = q->rp + d * q->width * hid + (off + p0 * 16) * hid;
    rn_gemm(q, a, rp, p1 - p0, second && q->lbr ? NULL : xs + off + p0 * 16, g + off + p0 * 16);
}

/* the gates of row b after the first product: LSTM's and RNN's new state into hn; GRU's z and r
   activated, and r * H into rh (without linear_before_reset) */
static void rn_gates1(const rn_ctx *q, int64_t d, int64_t s, int64_t b, float *g, float *rh, float *t) {
    int64_t hid = q->hidden, w = q->width;
    const float *hp = rn_hprev(q, d, s) + b * hid;
    float *gb = g + b * w;
    const rn_act *a = q->act[d];
    if (q->op == RN_GRU) {
        rn_clip(q, gb, 2 * hid);
        rn_apply(&a[0], gb, 2 * hid);
        if (!q->lbr)
            for (int64_t j = 0; j < hid; j++) rh[b * hid + j] = gb[hid + j] * hp[j];
        return;
    }
    float *o = rn_hnext(q, d, s) + b * hid;
    if (s >= q->lens[b]) {
        memcpy(o, hp, (size_t)hid * sizeof(float));
    } else if (q->op == RN_LSTM) {
        rn_lstm_row(q, d, gb, q->c + (d * q->batch + b) * hid, o, t);
    } else {
        rn_clip(q, gb, hid);
        rn_apply(&a[0], gb, hid);
        memcpy(o, gb, (size_t)hid * sizeof(float));
    }
}

/* GRU's gates of row b after the second product: h~ and H_t = h~ + z (H_{t-1} - h~) */
static void rn_gates2(const rn_ctx *q, int64_t d, int64_t s, int64_t b, float *g) {
    int64_t hid = q->hidden, w = q->width, zp = q->zp;
    const float *hp = rn_hprev(q, d, s) + b * hid;
    float *gz = g + b * w, *gh = g + b * w + zp, *o = rn_hnext(q, d, s) + b * hid;
    if (s >= q->lens[b]) { memcpy(o, hp, (size_t)hid * sizeof(float)); return; }
    if (q->lbr) {
        /* h~ = g(x W_h + Wb_h + r * (H R_h^T + Rb_h)) */
        const float *rb = q->rbh + d * hid, *xh = rn_xs(q, d, s) + b * w + zp;
        for (int64_t j = 0; j < hid; j++) gh[j] = gz[hid + j] * (gh[j] + rb[j]) + xh[j];
    }
    rn_clip(q, gh, hid);
    rn_apply(&q->act[d][1], gh, hid);
    for (int64_t j = 0; j < hid; j++) o[j] = gh[j] + gz[j] * (hp[j] - gh[j]);
}

/* the panels of the first product (GRU: its z/r block) and of GRU's second */
static int64_t rn_panels(const rn_ctx *q, int second) {
    if (second) return (q->width - q->zp) / 16;
    return (q->op == RN_GRU ? q->zp : q->width) / 16;
}

/* one step of direction d on one thread, g and rh its scratch */
static void rn_step(const rn_ctx *q, int64_t d, int64_t s, float *g, float *rh, float *t) {
    rn_product(q, 0, d, s, 0, rn_panels(q, 0), g, rh);
    for (int64_t b = 0; b < q->batch; b++) rn_gates1(q, d, s, b, g, rh, t);
    if (q->op != RN_GRU) return;
    rn_product(q, 1, d, s, 0, rn_panels(q, 1), g, rh);
    for (int64_t b = 0; b < q->batch; b++) rn_gates2(q, d, s, b, g);
}

/* a task: every step of direction d */
static void rn_task(void *ctx, int64_t d, int slot) {
    (void)slot;
    rn_ctx *q = (rn_ctx *)ctx;
    int64_t hid = q->hidden, bt = q->batch;
    size_t n = (size_t)(bt * q->width + bt * hid + hid + 16);
    float *buf = (float *)malloc(n * sizeof(float));
    if (!buf) { atomic_store(&q->failed, 1); return; }
    for (int64_t s = 0; s < q->run; s++) rn_step(q, d, s, buf, buf + bt * q->width, buf + bt * (q->width + hid));
    free(buf);
}

/* ---- a step split over threads (more threads than directions): a phase's tasks are the
   directions' column chunks of a product, or their batch rows; each element is computed as on
   one thread, so the bits are the same ---- */
typedef struct {
    const rn_ctx *q;
    float *g, *rh, *t;   /* (nd, batch, W), (nd, batch, H), (threads, H) */
    int64_t s, phase, chunk, nchunk;
} rn_phase_ctx;

static void rn_phase_task(void *ctx, int64_t i, int slot) {
    rn_phase_ctx *c = (rn_phase_ctx *)ctx;
    const rn_ctx *q = c->q;
    int64_t bt = q->batch, hid = q->hidden;
    if (c->phase == 0 || c->phase == 2) {
        int second = c->phase == 2;
        int64_t d = i / c->nchunk, p0 = i % c->nchunk * c->chunk, p1 = p0 + c->chunk, np = rn_panels(q, second);
        rn_product(q, second, d, c->s, p0, p1 < np ? p1 : np, c->g + d * bt * q->width, c->rh + d * bt * hid);
        return;
    }
    int64_t d = i / bt, b = i % bt;
    if (c->phase == 1)
        rn_gates1(q, d, c->s, b, c->g + d * bt * q->width, c->rh + d * bt * hid, c->t + slot * hid);
    else
        rn_gates2(q, d, c->s, b, c->g + d * bt * q->width);
}

/* every step, each split over `width` threads; -1 when the scratch cannot be had */
static int rn_split(rn_ctx *q, int64_t width) {
    int64_t nd = q->nd, bt = q->batch, hid = q->hidden, pairs = (rn_panels(q, 0) + 1) / 2;
    rn_phase_ctx c;
    c.q = q;
    float *buf = (float *)malloc((size_t)(nd * bt * (q->width + hid) + width * hid + 16) * sizeof(float));
    if (!buf) return -1;
    c.g = buf, c.rh = buf + nd * bt * q->width, c.t = c.rh + nd * bt * hid;
    /* chunks of whole panel pairs (the AVX-512 tiles' width), about two a thread */
    c.chunk = 2 * ((pairs + 2 * width - 1) / (2 * width));
    for (c.s = 0; c.s < q->run; c.s++)
        for (c.phase = 0; c.phase < (q->op == RN_GRU ? 4 : 2); c.phase++) {
            int64_t np = rn_panels(q, c.phase == 2);
            c.nchunk = (np + c.chunk - 1) / c.chunk;
            ge_parallel(rn_phase_task, &c, c.phase % 2 ? nd * bt : nd * c.nchunk, width);
        }
    free(buf);
    return 0;
}

/* ---- entries ---- */
static PyObject *rn_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(1);
}

/* the variants this CPU runs, a mask: 1 scalar, 2 avx2, 4 avx512f */
static PyObject *rn_caps(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(rn_caps_mask());
}

static PyObject *rn_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyUnicode_FromString(rn_names[rn_default()]);
}

static int rn_dims(const int64_t *got, int nd, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t want[4] = {a, b, c, d};
    for (int i = 0; i < nd; i++)
        if (got[i] != want[i]) return -1;
    return 0;
}

/* the scalars: fp float32 (clip, then alpha, beta of each direction's 3 activations), ip int64
   (op, steps to run, clip on, input_forget, linear_before_reset, peepholes on, zp, 6 activation
   codes, threads, variant); *width out */
static int rn_scalars(PyObject *const *args, rn_ctx *q, int64_t *width) {
    int64_t nf, ni;
    const float *fp = (const float *)ge_vec(args, 8, NPY_FLOAT, 0, &nf);
    const int64_t *ip = fp ? (const int64_t *)ge_vec(args, 9, NPY_INT64, 0, &ni) : NULL;
    if (!ip) return -1;
    if (nf != 13 || ni != 15) { ge_fail(); return -1; }
    q->op = ip[0], q->run = ip[1], q->clip_on = ip[2] != 0, q->input_forget = ip[3] != 0, q->lbr = ip[4] != 0;
    q->has_peep = ip[5] != 0, q->zp = ip[6], *width = ip[13], q->variant = ip[14];
    q->clip = fp[0];
    if (q->op < 0 || q->op > 2 || *width < 1 || *width > 4096 || q->variant < 0 || q->variant > 2
        || !(rn_caps_mask() >> q->variant & 1) || (q->clip_on && !(q->clip > 0.0f))) {
        ge_fail();
        return -1;
    }
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            int64_t code = ip[7 + d * 3 + k];
            if (code < 0 || code >= RN_NACT) { ge_fail(); return -1; }
            q->act[d][k].code = code;
            q->act[d][k].alpha = fp[1 + (d * 3 + k) * 2];
            q->act[d][k].beta = fp[2 + (d * 3 + k) * 2];
        }
    return 0;
}

/* whether the gate layout fits W: LSTM 4H, RNN H, GRU z/r in [0, zp), h in [zp, W); blocks of 32 */
static int rn_layout(const rn_ctx *q) {
    int64_t h = q->hidden, w = q->width;
    if (w % 32 != 0) return -1;
    if (q->op == RN_GRU) return (q->zp % 32 == 0 && q->zp >= 2 * h && q->zp < w && q->zp + h <= w) ? 0 : -1;
    return (q->op == RN_LSTM ? 4 * h : h) <= w ? 0 : -1;
}

/* rn_run(xw, rp, hs, hinit, c, lens, peep, rbh, fp, ip): the recurrence (see the top) */
static PyObject *rn_run(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 10)) return NULL;
    rn_ctx q;
    int64_t xd[4], rd[4], hd[4], id[3], cd[3], pd[3], bd[2], nl, width;
    memset(&q, 0, sizeof(q));
    q.xw = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, 4, xd);
    q.rp = q.xw ? (const float *)ge_nd(args, 1, NPY_FLOAT, 0, 4, rd) : NULL;
    q.hs = q.rp ? (float *)ge_nd(args, 2, NPY_FLOAT, 1, 4, hd) : NULL;
    q.hinit = q.hs ? (const float *)ge_nd(args, 3, NPY_FLOAT, 0, 3, id) : NULL;
    q.c = q.hinit ? (float *)ge_nd(args, 4, NPY_FLOAT, 1, 3, cd) : NULL;
    q.lens = q.c ? (const int64_t *)ge_vec(args, 5, NPY_INT64, 0, &nl) : NULL;
    q.peep = q.lens ? (const float *)ge_nd(args, 6, NPY_FLOAT, 0, 3, pd) : NULL;
    q.rbh = q.peep ? (const float *)ge_nd(args, 7, NPY_FLOAT, 0, 2, bd) : NULL;
    if (!q.rbh || rn_scalars(args, &q, &width)) return NULL;
    q.nd = xd[0], q.steps = xd[1], q.batch = xd[2], q.width = xd[3], q.hidden = id[2];
    if (q.nd < 1 || q.nd > 2 || q.batch < 1 || q.hidden < 1 || q.width < 1 || q.steps < 0 || q.run < 0
        || q.run > q.steps || q.hidden > RN_LIM || q.width > RN_LIM || q.batch > RN_LIM || rn_layout(&q)
        || rn_dims(rd, 4, q.nd, q.width / 16, q.hidden, 16) || rn_dims(hd, 4, q.run > 1 ? q.run : 1, q.nd, q.batch, q.hidden)
        || rn_dims(id, 3, q.nd, q.batch, q.hidden, 0) || rn_dims(cd, 3, q.nd, q.batch, q.hidden, 0)
        || nl != q.batch || rn_dims(pd, 3, q.nd, 3, q.hidden, 0) || rn_dims(bd, 2, q.nd, q.hidden, 0, 0))
        return ge_fail();
    for (int64_t b = 0; b < q.batch; b++)
        if (q.lens[b] < 0 || q.lens[b] > q.steps) return ge_fail();
    atomic_init(&q.failed, 0);
    /* more threads than directions and steps worth splitting: each step split (same bits) */
    int split = width > q.nd && q.batch * q.width * q.hidden >= RN_SPLIT_MIN;
    Py_BEGIN_ALLOW_THREADS
    if (split) {
        if (rn_split(&q, width)) atomic_store(&q.failed, 1);
    } else {
        ge_parallel(rn_task, &q, q.nd, width);
    }
    Py_END_ALLOW_THREADS
    if (atomic_load(&q.failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
