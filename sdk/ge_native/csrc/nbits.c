#include "prelude.h"
#include "bf16common.h"
#include <stdlib.h>

/* MatMulNBits (onnxruntime's com.microsoft op): C (m, n) = A (m, k) @ W + bias, W (k, n) held as
   4- or 8-bit integers q in blocks of `bs` rows of k per column, w = (q - z) * s with a scale s and
   a zero point z (a float: packed integer zero points arrive widened) per (column, block).
   W's layout, read by every variant (ge_native.nbits.PackedNBits makes it once, at build time):
   ceil(n / 64) * 4 panels of 16 columns; a panel is kp / per groups of 16 uint32 lanes, lane j
   holding `per` values of column j (kp: k rounded up to bs; per = 8 for 4 bits, 4 for 8 bits).
   4 bits: the nibble at bits 4t..4t+3 holds row (t >> 1) + 4 (t & 1) of the group, so the low
   nibbles of the lane's bytes are rows 0..3 and the high ones rows 4..7 (the VPDPBUSD quads);
   8 bits: byte t holds row t. Scales: (panels, kb, 16) float32 (0 past n); zero points the same
   grid in float32, or uint8 (integer zero points: a quarter of the bytes), or one value for all
   (the default 2^(bits - 1)): the decode reads every byte of them once a token.
   Three paths, chosen by m and accuracy_level alone (never by the thread count):
   - accuracy_level < 4, m <= NB_GEMV_M (decode): the weights dequantised in registers, per block
     acc += s * (sum_k a_k q_k - z * sum_k a_k) (the sums of a per block computed once a call);
   - accuracy_level < 4, m > NB_GEMV_M (prefill): a quad of panels dequantised to float32
     ((q - z) * s, two roundings) into the thread's scratch, then register tiles over all rows;
   - accuracy_level 4: A quantised to int8 per block (sa = max|a| / 127, qa = rint(a / sa),
     onnxruntime's CompInt8), exact int32 sums d = sum_k qa_k q_k (VPDPBUSD; AVX2: VPMADDUBSW on
     nibbles, exact), then acc = acc + (float(d) - z * float(sum qa)) * (s * sa) as separate
     multiplies and adds: every variant gives the same bits.
   Threads split over quads of panels (64 columns), each column summed by one thread in one
   order: the same bits at every thread count. Variants: 0 scalar, 1 avx2, 2 avx512_vnni. */
#define NB_GEMV_M 4
#define NB_KMAX (1 << 24)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NB_X86 1
#define NB_T2 __attribute__((target("avx2,fma")))
#define NB_T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#endif
#define NB_INLINE static inline __attribute__((always_inline))

typedef struct {
    int64_t m, k, kp, n, kb, bs, bits, per, groups, panels, acc4, has_bias, variant;
    const float *a;          /* A (m, k) */
    const uint32_t *w;       /* the packed weights (panels, groups, 16) */
    const float *sc;         /* scales (panels, kb, 16) */
    const float *zp;         /* zero points (panels, kb, 16) float32 (zmode 0), or */
    const uint8_t *zp8;      /* uint8 (zmode 1), or one value zc for all (zmode 2) */
    int64_t zmode; float zc;
    const float *bias;       /* (n,) where has_bias */
    float *c;                /* C (m, n) */
    float *fa, *asum;        /* float paths: A zero-padded (m, kp); its sums per block (m, kb) */
    int8_t *qa;              /* accuracy_level 4: A's int8 (m, kp) */
    float *sa, *qsum;        /* its scales and sums per block (m, kb) */
    int failed;
} nb_ctx;

static pthread_once_t nb_once = PTHREAD_ONCE_INIT;
static int nb_mask = 1;

/* which variants run here: 1 scalar, 2 avx2 (+fma), 4 avx512_vnni (f, bw, vl, vnni) */
static void nb_detect(void) {
    int mask = 1;
#if defined(NB_X86)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) { nb_mask = mask; return; }
    int fma = c >> 12 & 1;
    uint64_t xcr0 = bc_xcr0();
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) { nb_mask = mask; return; }
    if ((b >> 5 & 1) && fma && (xcr0 & 6) == 6) mask |= 2;
    if ((b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1) && (c >> 11 & 1) && (xcr0 & 0xe6) == 0xe6) mask |= 4;
#endif
    nb_mask = mask;
}

static inline int nb_caps_mask(void) {
    pthread_once(&nb_once, nb_detect);
    return nb_mask;
}

static const char *const nb_names[3] = {"scalar", "avx2", "avx512_vnni"};

/* the variant a call runs unless told otherwise: GE_NATIVE_NBITS's where this CPU runs it, else the best */
static const char *nb_isa_name(void) {
    int mask = nb_caps_mask(), best = 0;
    const char *forced = getenv("GE_NATIVE_NBITS");
    for (int v = 0; v < 3; v++) {
        if (!(mask >> v & 1)) continue;
        best = v;
        if (forced && strcmp(forced, nb_names[v]) == 0) return nb_names[v];
    }
    return nb_names[best];
}

/* the calling thread's scratch of at least `bytes` bytes, 64-byte aligned (kept for its next task) */
static __thread void *nb_buf = NULL;
static __thread size_t nb_cap = 0;
static void *nb_scratch(size_t bytes) {
    if (bytes > nb_cap) {
        free(nb_buf);
        nb_buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        nb_cap = nb_buf ? bytes : 0;
    }
    return nb_buf;
}

/* row r of group g's lane value of a packed lane word v, and the row it stands for */
static inline int nb_row(int64_t bits, int t) { return bits == 4 ? (t >> 1) + 4 * (t & 1) : t; }

/* the zero point of lane-element o of the (panels, kb, 16) grid */
static inline float nb_zval(const nb_ctx *q, int64_t o) {
    return q->zmode == 0 ? q->zp[o] : q->zmode == 1 ? (float)q->zp8[o] : q->zc;
}

/* the quad of panels i dequantised into dq (kp, 64): w = (q - z) * s */
static void nb_dequant(const nb_ctx *q, int64_t i, float *dq) {
    int64_t mask = q->bits == 4 ? 15 : 255;
    for (int64_t p = 0; p < 4; p++) {
        const uint32_t *wp = q->w + (4 * i + p) * q->groups * 16;
        const float *s = q->sc + (4 * i + p) * q->kb * 16;
        int64_t zo = (4 * i + p) * q->kb * 16;
        for (int64_t g = 0; g < q->groups; g++) {
            int64_t k0 = g * q->per, b = k0 / q->bs;
            for (int t = 0; t < q->per; t++) {
                float *row = dq + (k0 + nb_row(q->bits, t)) * 64 + p * 16;
                for (int j = 0; j < 16; j++) {
                    float v = (float)((wp[g * 16 + j] >> (q->bits * t)) & (uint32_t)mask);
                    row[j] = (v - nb_zval(q, zo + b * 16 + j)) * s[b * 16 + j];
                }
            }
        }
    }
}

/* the store of one row's 16 columns of panel p (those below n), plus the bias */
static inline void nb_store1(const nb_ctx *q, int64_t r, int64_t p, const float *v) {
    for (int64_t j = 0; j < 16 && p * 16 + j < q->n; j++)
        q->c[r * q->n + p * 16 + j] = v[j] + (q->has_bias ? q->bias[p * 16 + j] : 0.0f);
}

/* ---- scalar ---- */
static void nb_float_scalar(const nb_ctx *q, int64_t i) {
    float acc[64];
    if (q->m > NB_GEMV_M) {
        float *dq = (float *)nb_scratch((size_t)q->kp * 64 * sizeof(float));
        if (!dq) { __atomic_store_n(&((nb_ctx *)q)->failed, 1, __ATOMIC_RELAXED); return; }
        nb_dequant(q, i, dq);
        for (int64_t r = 0; r < q->m; r++) {
            for (int j = 0; j < 64; j++) acc[j] = 0.0f;
            for (int64_t k = 0; k < q->k; k++) {
                float av = q->a[r * q->k + k];
                for (int j = 0; j < 64; j++) acc[j] += av * dq[k * 64 + j];
            }
            for (int p = 0; p < 4; p++) nb_store1(q, r, 4 * i + p, acc + 16 * p);
        }
        return;
    }
    int64_t mask = q->bits == 4 ? 15 : 255;
    for (int64_t r = 0; r < q->m; r++) {
        for (int64_t p = 4 * i; p < 4 * i + 4; p++) {
            const uint32_t *wp = q->w + p * q->groups * 16;
            float out[16] = {0}, bacc[16];
            for (int64_t b = 0; b < q->kb; b++) {
                for (int j = 0; j < 16; j++) bacc[j] = 0.0f;
                for (int64_t g = b * q->bs / q->per; g < (b + 1) * q->bs / q->per; g++)
                    for (int t = 0; t < q->per; t++) {
                        float av = q->fa[r * q->kp + g * q->per + nb_row(q->bits, t)];
                        for (int j = 0; j < 16; j++)
                            bacc[j] += av * (float)((wp[g * 16 + j] >> (q->bits * t)) & (uint32_t)mask);
                    }
                float as = q->asum[r * q->kb + b];
                for (int j = 0; j < 16; j++)
                    out[j] += q->sc[(p * q->kb + b) * 16 + j] * (bacc[j] - nb_zval(q, (p * q->kb + b) * 16 + j) * as);
            }
            nb_store1(q, r, p, out);
        }
    }
}

/* the exact int32 sum of a group's 16 lanes against row r's int8 quads (every variant's integers) */
static void nb_int_scalar(const nb_ctx *q, int64_t i) {
    for (int64_t r = 0; r < q->m; r++)
        for (int64_t p = 4 * i; p < 4 * i + 4; p++) {
            const uint32_t *wp = q->w + p * q->groups * 16;
            float out[16] = {0};
            for (int64_t b = 0; b < q->kb; b++) {
                int32_t d[16] = {0};
                for (int64_t g = b * q->bs / q->per; g < (b + 1) * q->bs / q->per; g++)
                    for (int t = 0; t < q->per; t++) {
                        int32_t av = q->qa[r * q->kp + g * q->per + nb_row(q->bits, t)];
                        for (int j = 0; j < 16; j++)
                            d[j] += av * (int32_t)((wp[g * 16 + j] >> (q->bits * t)) & (q->bits == 4 ? 15u : 255u));
                    }
                float qs = q->qsum[r * q->kb + b], sa = q->sa[r * q->kb + b];
                for (int j = 0; j < 16; j++) {
                    float tz = (float)d[j] - nb_zval(q, (p * q->kb + b) * 16 + j) * qs;
                    out[j] = out[j] + tz * (q->sc[(p * q->kb + b) * 16 + j] * sa);
                }
            }
            nb_store1(q, r, p, out);
        }
}

#if defined(NB_X86)
/* ---- AVX-512 (the float paths need only AVX512F; accuracy_level 4 runs VPDPBUSD) ---- */
/* the zero points of lanes o..o+15 */
NB_INLINE NB_T512 __m512 nb_z512(const nb_ctx *q, int64_t o) {
    if (q->zmode == 2) return _mm512_set1_ps(q->zc);
    if (q->zmode == 1) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q->zp8 + o))));
    return _mm512_loadu_ps(q->zp + o);
}

/* one row's 16 columns of panel p plus the bias, the lanes below n stored */
NB_INLINE NB_T512 void nb_store512(const nb_ctx *q, int64_t r, int64_t p, __m512 v) {
    int64_t cols = q->n - p * 16;
    if (cols <= 0) return;
    __mmask16 mk = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1);
    if (q->has_bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, q->bias + p * 16));
    _mm512_mask_storeu_ps(q->c + r * q->n + p * 16, mk, v);
}

/* decode: R rows from r0 over the quad i, the weights dequantised in registers (a 4-bit value
   is VPERMPS's index into 0..15, an 8-bit one converted), per block s * (sum a q - z sum a) */
NB_INLINE NB_T512 void nb_gemv512(const nb_ctx *q, int64_t i, int64_t r0, const int R) {
    __m512 acc[4][4], bacc[4][4];
    const __m512 lut = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f);
    const __m512i m8 = _mm512_set1_epi32(255);
    const int64_t gpb = q->bs / q->per;
    for (int r = 0; r < R; r++)
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t b = 0; b < q->kb; b++) {
        for (int r = 0; r < R; r++)
            for (int p = 0; p < 4; p++) bacc[r][p] = _mm512_setzero_ps();
        for (int64_t g = b * gpb; g < (b + 1) * gpb; g++) {
            const float *ar = q->fa + r0 * q->kp + g * q->per;
            for (int p = 0; p < 4; p++) {
                __m512i v = _mm512_loadu_si512((const void *)(q->w + ((4 * i + p) * q->groups + g) * 16));
                if (q->bits == 4) {
                    for (int t = 0; t < 8; t++) {
                        __m512 wq = _mm512_permutexvar_ps(v, lut);
                        v = _mm512_srli_epi32(v, 4);
                        for (int r = 0; r < R; r++)
                            bacc[r][p] = _mm512_fmadd_ps(_mm512_set1_ps(ar[r * q->kp + (t >> 1) + 4 * (t & 1)]), wq, bacc[r][p]);
                    }
                } else {
                    for (int t = 0; t < 4; t++) {
                        __m512 wq = _mm512_cvtepi32_ps(_mm512_and_si512(v, m8));
                        v = _mm512_srli_epi32(v, 8);
                        for (int r = 0; r < R; r++)
                            bacc[r][p] = _mm512_fmadd_ps(_mm512_set1_ps(ar[r * q->kp + t]), wq, bacc[r][p]);
                    }
                }
            }
        }
        for (int p = 0; p < 4; p++) {
            int64_t o = ((4 * i + p) * q->kb + b) * 16;
            __m512 s = _mm512_loadu_ps(q->sc + o), z = nb_z512(q, o);
            for (int r = 0; r < R; r++)
                acc[r][p] = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(z, _mm512_set1_ps(q->asum[(r0 + r) * q->kb + b]), bacc[r][p]),
                                            acc[r][p]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int p = 0; p < 4; p++) nb_store512(q, r0 + r, 4 * i + p, acc[r][p]);
}

/* prefill: R rows from r0 against the dequantised quad dq (kp, 64), a 6 x 64 register tile */
NB_INLINE NB_T512 void nb_tile512(const nb_ctx *q, const float *dq, int64_t i, int64_t r0, const int R) {
    __m512 acc[6][4];
    for (int r = 0; r < R; r++)
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    const float *a = q->a + r0 * q->k;
    for (int64_t k = 0; k < q->k; k++) {
        __m512 w[4];
        for (int p = 0; p < 4; p++) w[p] = _mm512_load_ps(dq + k * 64 + p * 16);
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_set1_ps(a[r * q->k + k]);
            for (int p = 0; p < 4; p++) acc[r][p] = _mm512_fmadd_ps(av, w[p], acc[r][p]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int p = 0; p < 4; p++) nb_store512(q, r0 + r, 4 * i + p, acc[r][p]);
}

static NB_T512 void nb_float512(const nb_ctx *q, int64_t i) {
    if (q->m <= NB_GEMV_M) {
        switch (q->m) {
        case 1: nb_gemv512(q, i, 0, 1); break;
        case 2: nb_gemv512(q, i, 0, 2); break;
        case 3: nb_gemv512(q, i, 0, 3); break;
        default: nb_gemv512(q, i, 0, 4); break;
        }
        return;
    }
    float *dq = (float *)nb_scratch((size_t)q->kp * 64 * sizeof(float));
    if (!dq) { __atomic_store_n(&((nb_ctx *)q)->failed, 1, __ATOMIC_RELAXED); return; }
    nb_dequant(q, i, dq);
    for (int64_t r0 = 0; r0 < q->m; r0 += 6) {
        switch (q->m - r0 < 6 ? q->m - r0 : 6) {
        case 1: nb_tile512(q, dq, i, r0, 1); break;
        case 2: nb_tile512(q, dq, i, r0, 2); break;
        case 3: nb_tile512(q, dq, i, r0, 3); break;
        case 4: nb_tile512(q, dq, i, r0, 4); break;
        case 5: nb_tile512(q, dq, i, r0, 5); break;
        default: nb_tile512(q, dq, i, r0, 6); break;
        }
    }
}

/* accuracy_level 4: R rows from r0, exact int32 block sums by VPDPBUSD (u8 weights, s8 quads) */
NB_INLINE NB_T512 void nb_int512r(const nb_ctx *q, int64_t i, int64_t r0, const int R) {
    __m512 acc[4][4];
    __m512i d[4][4];
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    const int64_t gpb = q->bs / q->per;
    for (int r = 0; r < R; r++)
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t b = 0; b < q->kb; b++) {
        for (int r = 0; r < R; r++)
            for (int p = 0; p < 4; p++) d[r][p] = _mm512_setzero_si512();
        for (int64_t g = b * gpb; g < (b + 1) * gpb; g++) {
            int32_t qlo[4], qhi[4];
            for (int r = 0; r < R; r++) {
                const int8_t *ar = q->qa + (r0 + r) * q->kp + g * q->per;
                memcpy(&qlo[r], ar, 4);
                if (q->bits == 4) memcpy(&qhi[r], ar + 4, 4);
            }
            for (int p = 0; p < 4; p++) {
                __m512i v = _mm512_loadu_si512((const void *)(q->w + ((4 * i + p) * q->groups + g) * 16));
                if (q->bits == 4) {
                    __m512i lo = _mm512_and_si512(v, lo4), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), lo4);
                    for (int r = 0; r < R; r++) {
                        d[r][p] = _mm512_dpbusd_epi32(d[r][p], lo, _mm512_set1_epi32(qlo[r]));
                        d[r][p] = _mm512_dpbusd_epi32(d[r][p], hi, _mm512_set1_epi32(qhi[r]));
                    }
                } else {
                    for (int r = 0; r < R; r++) d[r][p] = _mm512_dpbusd_epi32(d[r][p], v, _mm512_set1_epi32(qlo[r]));
                }
            }
        }
        for (int p = 0; p < 4; p++) {
            int64_t o = ((4 * i + p) * q->kb + b) * 16;
            __m512 s = _mm512_loadu_ps(q->sc + o), z = nb_z512(q, o);
            for (int r = 0; r < R; r++) {
                __m512 qs = _mm512_set1_ps(q->qsum[(r0 + r) * q->kb + b]), sa = _mm512_set1_ps(q->sa[(r0 + r) * q->kb + b]);
                __m512 tz = _mm512_sub_ps(_mm512_cvtepi32_ps(d[r][p]), _mm512_mul_ps(z, qs));
                acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(tz, _mm512_mul_ps(s, sa)));
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int p = 0; p < 4; p++) nb_store512(q, r0 + r, 4 * i + p, acc[r][p]);
}

static NB_T512 void nb_int512(const nb_ctx *q, int64_t i) {
    for (int64_t r0 = 0; r0 < q->m; r0 += 4) {
        switch (q->m - r0 < 4 ? q->m - r0 : 4) {
        case 1: nb_int512r(q, i, r0, 1); break;
        case 2: nb_int512r(q, i, r0, 2); break;
        case 3: nb_int512r(q, i, r0, 3); break;
        default: nb_int512r(q, i, r0, 4); break;
        }
    }
}

/* ---- AVX2: a panel's 16 lanes as two halves of 8 ---- */
NB_INLINE NB_T2 __m256 nb_z2(const nb_ctx *q, int64_t o) {
    if (q->zmode == 2) return _mm256_set1_ps(q->zc);
    if (q->zmode == 1) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q->zp8 + o))));
    return _mm256_loadu_ps(q->zp + o);
}

NB_INLINE NB_T2 void nb_store2(const nb_ctx *q, int64_t r, int64_t p, __m256 lo, __m256 hi) {
    float v[16];
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + 8, hi);
    nb_store1(q, r, p, v);
}

NB_INLINE NB_T2 void nb_gemv2(const nb_ctx *q, int64_t i, int64_t r0, const int R) {
    const __m256i m4 = _mm256_set1_epi32(15), m8 = _mm256_set1_epi32(255);
    const int64_t gpb = q->bs / q->per;
    for (int64_t p = 4 * i; p < 4 * i + 4; p++) {
        __m256 acc[4][2], bacc[4][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t b = 0; b < q->kb; b++) {
            for (int r = 0; r < R; r++) bacc[r][0] = bacc[r][1] = _mm256_setzero_ps();
            for (int64_t g = b * gpb; g < (b + 1) * gpb; g++) {
                const float *ar = q->fa + r0 * q->kp + g * q->per;
                const uint32_t *wp = q->w + (p * q->groups + g) * 16;
                __m256i v[2] = {_mm256_loadu_si256((const __m256i *)wp), _mm256_loadu_si256((const __m256i *)(wp + 8))};
                for (int t = 0; t < q->per; t++) {
                    for (int h = 0; h < 2; h++) {
                        __m256 wq = _mm256_cvtepi32_ps(_mm256_and_si256(v[h], q->bits == 4 ? m4 : m8));
                        v[h] = q->bits == 4 ? _mm256_srli_epi32(v[h], 4) : _mm256_srli_epi32(v[h], 8);
                        for (int r = 0; r < R; r++)
                            bacc[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(ar[r * q->kp + nb_row(q->bits, t)]), wq, bacc[r][h]);
                    }
                }
            }
            int64_t o = (p * q->kb + b) * 16;
            for (int h = 0; h < 2; h++) {
                __m256 s = _mm256_loadu_ps(q->sc + o + 8 * h), z = nb_z2(q, o + 8 * h);
                for (int r = 0; r < R; r++)
                    acc[r][h] = _mm256_fmadd_ps(s, _mm256_fnmadd_ps(z, _mm256_set1_ps(q->asum[(r0 + r) * q->kb + b]), bacc[r][h]),
                                                acc[r][h]);
            }
        }
        for (int r = 0; r < R; r++) nb_store2(q, r0 + r, p, acc[r][0], acc[r][1]);
    }
}

NB_INLINE NB_T2 void nb_tile2(const nb_ctx *q, const float *dq, int64_t i, int64_t r0, const int R) {
    const float *a = q->a + r0 * q->k;
    for (int p = 0; p < 4; p++) {
        __m256 acc[4][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t k = 0; k < q->k; k++) {
            __m256 w0 = _mm256_load_ps(dq + k * 64 + p * 16), w1 = _mm256_load_ps(dq + k * 64 + p * 16 + 8);
            for (int r = 0; r < R; r++) {
                __m256 av = _mm256_set1_ps(a[r * q->k + k]);
                acc[r][0] = _mm256_fmadd_ps(av, w0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(av, w1, acc[r][1]);
            }
        }
        for (int r = 0; r < R; r++) nb_store2(q, r0 + r, 4 * i + p, acc[r][0], acc[r][1]);
    }
}

static NB_T2 void nb_float2(const nb_ctx *q, int64_t i) {
    if (q->m <= NB_GEMV_M) {
        switch (q->m) {
        case 1: nb_gemv2(q, i, 0, 1); break;
        case 2: nb_gemv2(q, i, 0, 2); break;
        case 3: nb_gemv2(q, i, 0, 3); break;
        default: nb_gemv2(q, i, 0, 4); break;
        }
        return;
    }
    float *dq = (float *)nb_scratch((size_t)q->kp * 64 * sizeof(float));
    if (!dq) { __atomic_store_n(&((nb_ctx *)q)->failed, 1, __ATOMIC_RELAXED); return; }
    nb_dequant(q, i, dq);
    for (int64_t r0 = 0; r0 < q->m; r0 += 4) {
        switch (q->m - r0 < 4 ? q->m - r0 : 4) {
        case 1: nb_tile2(q, dq, i, r0, 1); break;
        case 2: nb_tile2(q, dq, i, r0, 2); break;
        case 3: nb_tile2(q, dq, i, r0, 3); break;
        default: nb_tile2(q, dq, i, r0, 4); break;
        }
    }
}

/* the int32 sums of the 8 lanes v (4 u8 each, values <= 15) against the s8 quad qa: VPMADDUBSW's
   pairs stay under 2 * 15 * 127 (no saturation), VPMADDWD adds them exactly */
NB_INLINE NB_T2 __m256i nb_dot2(__m256i v, int32_t qa) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(v, _mm256_set1_epi32(qa)), _mm256_set1_epi16(1));
}

static NB_T2 void nb_int2(const nb_ctx *q, int64_t i) {
    const __m256i lo4 = _mm256_set1_epi32(0x0F0F0F0F);
    const int64_t gpb = q->bs / q->per;
    for (int64_t r = 0; r < q->m; r++)
        for (int64_t p = 4 * i; p < 4 * i + 4; p++) {
            __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t b = 0; b < q->kb; b++) {
                __m256i d[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int64_t g = b * gpb; g < (b + 1) * gpb; g++) {
                    int32_t qlo, qhi;
                    const int8_t *ar = q->qa + r * q->kp + g * q->per;
                    memcpy(&qlo, ar, 4);
                    const uint32_t *wp = q->w + (p * q->groups + g) * 16;
                    for (int h = 0; h < 2; h++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(wp + 8 * h));
                        __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi32(v, 4), lo4);
                        if (q->bits == 4) {
                            memcpy(&qhi, ar + 4, 4);
                            d[h] = _mm256_add_epi32(d[h], _mm256_add_epi32(nb_dot2(lo, qlo), nb_dot2(hi, qhi)));
                        } else {
                            d[h] = _mm256_add_epi32(d[h], _mm256_add_epi32(nb_dot2(lo, qlo), _mm256_slli_epi32(nb_dot2(hi, qlo), 4)));
                        }
                    }
                }
                int64_t o = (p * q->kb + b) * 16;
                __m256 qs = _mm256_set1_ps(q->qsum[r * q->kb + b]), sa = _mm256_set1_ps(q->sa[r * q->kb + b]);
                for (int h = 0; h < 2; h++) {
                    __m256 s = _mm256_loadu_ps(q->sc + o + 8 * h), z = nb_z2(q, o + 8 * h);
                    __m256 tz = _mm256_sub_ps(_mm256_cvtepi32_ps(d[h]), _mm256_mul_ps(z, qs));
                    acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(tz, _mm256_mul_ps(s, sa)));
                }
            }
            nb_store2(q, r, p, acc[0], acc[1]);
        }
}
#endif

static void nb_task(void *ctx, int64_t i, int slot) {
    const nb_ctx *q = (const nb_ctx *)ctx;
    (void)slot;
#if defined(NB_X86)
    if (q->variant == 2) { if (q->acc4) nb_int512(q, i); else nb_float512(q, i); return; }
    if (q->variant == 1) { if (q->acc4) nb_int2(q, i); else nb_float2(q, i); return; }
#endif
    if (q->acc4) nb_int_scalar(q, i); else nb_float_scalar(q, i);
}

/* the per-call pass over A (before the threads): the float paths' zero-padded rows and block
   sums, or accuracy_level 4's int8 rows, scales and sums */
static void nb_prepare(nb_ctx *q) {
    for (int64_t r = 0; r < q->m; r++)
        for (int64_t b = 0; b < q->kb; b++) {
            const float *src = q->a + r * q->k;
            int64_t lo = b * q->bs, hi = lo + q->bs < q->k ? lo + q->bs : q->k;
            if (!q->acc4) {
                float s = 0.0f;
                for (int64_t k = lo; k < lo + q->bs; k++) {
                    float v = k < hi ? src[k] : 0.0f;
                    q->fa[r * q->kp + k] = v;
                    s += v;
                }
                q->asum[r * q->kb + b] = s;
                continue;
            }
            float amax = 0.0f;
            for (int64_t k = lo; k < hi; k++) amax = ge_max32(amax, fabsf(src[k]));
            float sa = amax / 127.0f, inv = amax != 0.0f ? 1.0f / sa : 0.0f;
            int32_t qs = 0;
            for (int64_t k = lo; k < lo + q->bs; k++) {
                float v = k < hi ? rintf(src[k] * inv) : 0.0f;
                v = v > 127.0f ? 127.0f : (v < -127.0f || v != v ? -127.0f : v);
                q->qa[r * q->kp + k] = (int8_t)(int)v;
                qs += (int)v;
            }
            q->sa[r * q->kb + b] = sa;
            q->qsum[r * q->kb + b] = (float)qs;
        }
}

static PyObject *nb_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(1);
}

/* the variants this CPU runs, a mask: 1 scalar, 2 avx2, 4 avx512_vnni */
static PyObject *nb_caps(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(nb_caps_mask());
}

static PyObject *nb_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyUnicode_FromString(nb_isa_name());
}

/* C = A @ W + bias: (A float32 (m, k), W uint32 (panels, groups, 16), scales float32 (panels, kb,
   16), zero points float32 or uint8 (as scales) or float32 (1,) (one for all), bias float32 (n or 1), C float32 (m, n), int64 params (k,
   bits 4|8, block size 16..4096 a power of two, accuracy_level 4 or not (1|0), has_bias, threads,
   variant)) */
static PyObject *nb_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t m, k, wd[3], sd[3], zd[3], nb, mc, nc, ni;
    if (ge_nargs(nargs, 7)) return NULL;
    const float *a = (const float *)ge_mat(args, 0, NPY_FLOAT, 0, &m, &k);
    const uint32_t *w = a ? (const uint32_t *)ge_nd(args, 1, NPY_UINT32, 0, 3, wd) : NULL;
    const float *sc = w ? (const float *)ge_nd(args, 2, NPY_FLOAT, 0, 3, sd) : NULL;
    PyObject *zo = args[3];
    int zt = ge_ndarray && PyObject_TypeCheck(zo, ge_ndarray) ? PyArray_TYPE((PyArrayObject *)zo) : NPY_FLOAT;
    int zconst = zt == NPY_FLOAT && PyObject_TypeCheck(zo, ge_ndarray) && PyArray_NDIM((PyArrayObject *)zo) == 1;
    const void *zp = !sc ? NULL : zconst ? ge_vec(args, 3, NPY_FLOAT, 0, zd)
                                         : ge_nd(args, 3, zt == NPY_UINT8 ? NPY_UINT8 : NPY_FLOAT, 0, 3, zd);
    const float *bias = zp ? (const float *)ge_vec(args, 4, NPY_FLOAT, 0, &nb) : NULL;
    float *c = bias ? (float *)ge_mat(args, 5, NPY_FLOAT, 1, &mc, &nc) : NULL;
    const int64_t *ip = c ? (const int64_t *)ge_vec(args, 6, NPY_INT64, 0, &ni) : NULL;
    if (!ip) return NULL;
    if (ni != 7) return ge_fail();
    int64_t bits = ip[1], bs = ip[2];
    if (ip[0] != k || k < 1 || k > NB_KMAX || (bits != 4 && bits != 8) || bs < 16 || bs > 4096 || (bs & (bs - 1))
        || ip[3] < 0 || ip[3] > 1 || ip[4] < 0 || ip[4] > 1 || ip[5] < 1 || ip[5] > 4096 || ip[6] < 0 || ip[6] > 2)
        return ge_fail();
    if (!(nb_caps_mask() >> ip[6] & 1)) {
        PyErr_SetString(PyExc_ValueError, "nbits: this CPU does not run the variant asked for");
        return NULL;
    }
    int64_t kb = (k + bs - 1) / bs, kp = kb * bs, per = 32 / bits, panels = (nc + 63) / 64 * 4;
    if (mc != m || wd[0] != panels || wd[1] != kp / per || wd[2] != 16 || sd[0] != panels || sd[1] != kb
        || sd[2] != 16 || (zconst ? zd[0] != 1 : (zd[0] != panels || zd[1] != kb || zd[2] != 16)) || (ip[4] && nb != nc)
        || ge_prod(m, kp, 4, 1) < 0 || ge_prod(kp, 64, 4, 1) < 0) return ge_fail();
    if (m == 0 || nc == 0) Py_RETURN_NONE;
    nb_ctx q;
    memset(&q, 0, sizeof(q));
    q.m = m; q.k = k; q.kp = kp; q.n = nc; q.kb = kb; q.bs = bs; q.bits = bits; q.per = per; q.groups = kp / per;
    q.panels = panels; q.acc4 = ip[3]; q.has_bias = ip[4]; q.variant = ip[6];
    q.a = a; q.w = w; q.sc = sc; q.bias = bias; q.c = c;
    q.zmode = zconst ? 2 : zt == NPY_UINT8 ? 1 : 0;
    if (q.zmode == 2) q.zc = *(const float *)zp;
    else if (q.zmode == 1) q.zp8 = (const uint8_t *)zp;
    else q.zp = (const float *)zp;
    int gemv = !q.acc4 && m <= NB_GEMV_M;
    size_t rows = (size_t)(q.acc4 || gemv ? m : 0);
    char *buf = (char *)aligned_alloc(64, (rows * (size_t)kp * 4 + rows * (size_t)kb * 8 + 64 + 63) / 64 * 64);
    if (!buf) return PyErr_NoMemory();
    if (q.acc4) { q.qa = (int8_t *)buf; q.sa = (float *)(buf + rows * kp * 4); q.qsum = q.sa + rows * kb; }
    else if (gemv) { q.fa = (float *)buf; q.asum = q.fa + rows * kp; }
    Py_BEGIN_ALLOW_THREADS
    if (q.acc4 || gemv) nb_prepare(&q);
    ge_parallel(nb_task, &q, panels / 4, ip[5]);
    Py_END_ALLOW_THREADS
    free(buf);
    if (q.failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
