#include "prelude.h"
#include "bf16common.h"
#include "activations.h"
#include <stdatomic.h>
#include <stdlib.h>

/* GE's int8 depthwise convolution over the NCHWc blocked layout (ge_native.int8dw): x (N, CB, H,
   W, 16) float32 quantised on read (q = clamp(rint(x / s) + z, 0, 255), IEEE division; int8
   activations come shifted by 128) or u8 holding q already; w int8 (zero point 0) packed once as
   (CB, KH, G, 64), G = ceil(KW / 4): byte 4c + j of (cb, ky, t) is channel 16cb + c's tap
   (ky, 4t + j), zero past KW and past C. Exact int32 sums sum_taps (q - z) w, computed as u8 x s8
   sums less z * wsum[c] (the pads hold z: the float 0.0), then the epilogue in float32, one
   rounding a step, no contraction (the build's -ffp-contract=off; the vector forms multiply then
   add): y = float(acc) * mult[c] (mult = float32(s * w_scale[c])), + bias[c], + addend, clip,
   activation (act32 in every variant, so they agree bit for bit), then the output: float32 y,
   or fake-quantised (clamp(rint(y / ys) + yz, qlo, qhi) - yz) * ys, or the u8 clamp(rint(y / ys)
   + yz, qlo, qhi). The clamps are max-then-min with VMAXPS's rule (a NaN gives the bound).
   Each task (image, channel block, output rows) quantises the padded input rows it reads into a
   thread scratch of "quads": column u of a row holds, for each of the 16 channels, the 4 bytes at
   pixels u * g + j * dw (j = 0..3, g = sw when 4 dw is a multiple of sw, else 1), so one
   VPDPBUSD multiplies 16 channels by 4 taps of a kernel row: a 3x3 output pixel is 3 of them.
   Variants: 0 scalar, 1 avx2 (the quads widened to int16, VPMADDWD: exact), 2 avx512_vnni
   (VPDPBUSD over 8 output pixels at a time). Integer sums: the same bits in every variant and at
   every thread count. */
#define DW8_KMAX 65536  /* taps a sum may have: 255 * 128 * taps fits int32 */
#define DW8_LIM (1 << 20)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DW8_X86 1
#define DW8_T2 __attribute__((target("avx2,fma")))
#define DW8_T512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

typedef struct {
    const float *xf; const uint8_t *xu;   /* the input, float32 or u8 (N, CB, H, W, 16) */
    const int8_t *wq;                     /* the packed weight (CB, KH, G, 64) */
    float *of; uint8_t *ou;               /* the output (N, CB, OH, OW, 16), float32 or u8 */
    const float *add;                     /* the addend laid out as the output, or NULL */
    float *mult; int32_t *corr;           /* CB * 16 each: s * w_scale[c], z * wsum[c] (wrapping) */
    const float *bias;
    int64_t has_bias, clip, act, oq, variant;
    float lo, hi, ys, yr, yz, qlo, qhi, xs, xr, zu;
    int64_t fastx, fasty;                 /* whether 1 / xs (1 / ys) is normal: the fast division */
    int64_t n, cb, h, w, oh, ow, kh, kw, g4, sh, sw, dh, dw, pt, pl;
    int64_t gstep, uc, wr, rows, chunks;  /* column step, columns, row pixels, output rows a task */
    atomic_int failed;
} dw8_ctx;

static pthread_once_t dw8_once = PTHREAD_ONCE_INIT;
static int dw8_mask = 1;

/* which variants run here: 1 scalar, 2 avx2 (with FMA), 4 avx512_vnni (f, bw, vl, vnni) */
static void dw8_detect(void) {
    int mask = 1;
#if defined(DW8_X86)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) { dw8_mask = mask; return; }
    int fma = c >> 12 & 1;
    uint64_t xcr0 = bc_xcr0();
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) { dw8_mask = mask; return; }
    if ((b >> 5 & 1) && fma && (xcr0 & 6) == 6) mask |= 2;
    if ((mask & 2) && (b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1) && (c >> 11 & 1) && (xcr0 & 0xe6) == 0xe6)
        mask |= 4;
#endif
    dw8_mask = mask;
}

static inline int dw8_caps_mask(void) {
    pthread_once(&dw8_once, dw8_detect);
    return dw8_mask;
}

static const char *const dw8_names[3] = {"scalar", "avx2", "avx512_vnni"};

/* the variant a call runs unless told otherwise: GE_NATIVE_INT8DW's where this CPU runs it, else the best */
static const char *dw8_isa_name(void) {
    int mask = dw8_caps_mask(), best = 0;
    const char *forced = getenv("GE_NATIVE_INT8DW");
    for (int v = 0; v < 3; v++) {
        if (!(mask >> v & 1)) continue;
        best = v;
        if (forced && strcmp(forced, dw8_names[v]) == 0) return dw8_names[v];
    }
    return dw8_names[best];
}

/* the calling thread's scratch of at least `bytes` bytes, 64-byte aligned (kept for its next task) */
static __thread void *dw8_buf = NULL;
static __thread size_t dw8_cap = 0;
static void *dw8_scratch(size_t bytes) {
    if (bytes > dw8_cap) {
        free(dw8_buf);
        dw8_buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        dw8_cap = dw8_buf ? bytes : 0;
    }
    return dw8_buf;
}

/* ---- quantisation of an input row ---- */
static inline uint8_t dw8_q1(float a, float s, float z) {
    float t = rintf(a / s);
    t = t + z;
    t = t > 0.0f ? t : 0.0f;
    t = t < 255.0f ? t : 255.0f;
    return (uint8_t)(int)t;
}

static void dw8_quant1(const dw8_ctx *q, const float *src, int64_t len, uint8_t *dst) {
    for (int64_t i = 0; i < len; i++) dst[i] = dw8_q1(src[i], q->xs, q->zu);
}

#if defined(DW8_X86)
/* the same loop for AVX2 machines (GCC vectorises it: the same IEEE operations) */
static DW8_T2 void dw8_quant2(const dw8_ctx *q, const float *src, int64_t len, uint8_t *dst) {
    for (int64_t i = 0; i < len; i++) dst[i] = dw8_q1(src[i], q->xs, q->zu);
}

/* RN(a / s) for 16 values without VDIVPS when r = 1 / s is normal (int8gemm.c's i8_q16: q0 = a r
   is within 2 ulps, a Newton step on the exact FMA residual makes it faithful, Markstein's second
   gives the correctly rounded quotient), else the division. Every use clamps the quotient to
   [-512, 512]: where a / s overflows (q0 infinite, the steps NaN) q0 saturates the same way */
static inline __attribute__((always_inline)) DW8_T512 __m512 dw8_div16(__m512 a, __m512 s, __m512 r, int fast) {
    if (!fast) return _mm512_div_ps(a, s);
    __m512 q0 = _mm512_mul_ps(a, r);
    __m512 q1 = _mm512_fmadd_ps(_mm512_fnmadd_ps(s, q0, a), r, q0);
    __m512 q2 = _mm512_fmadd_ps(_mm512_fnmadd_ps(s, q1, a), r, q1);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(q2, q2, _CMP_UNORD_Q), q2, q0);
}

/* clamp(rint(a / s) + z, 0, 255) as rint(clamp(a / s, -z, 255 - z)) + z: the same integers (the
   bounds are integers and rint is monotone; a NaN gives 0 both ways), one operation fewer */
static DW8_T512 void dw8_quant512(const dw8_ctx *q, const float *src, int64_t len, uint8_t *dst) {
    __m512 vs = _mm512_set1_ps(q->xs), vr = _mm512_set1_ps(q->xr);
    __m512 lo = _mm512_set1_ps(-q->zu), hi = _mm512_set1_ps(255.0f - q->zu);
    __m512i vz = _mm512_set1_epi32((int)q->zu);
    for (int64_t i = 0; i < len; i += 16) {
        __m512 t = dw8_div16(_mm512_loadu_ps(src + i), vs, vr, (int)q->fastx);
        t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);
        __m512i v = _mm512_add_epi32(_mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtepi32_epi8(v));
    }
}
#endif

/* padded input row ph (ph - pt of the image) of plane (img, cb) as wr pixels of 16 u8: z outside.
   Pixel-sized copies the compiler inlines (a 7x7 plane's rows are a few hundred bytes: the calls
   of memset and memcpy cost more than their work) */
static void dw8_row(const dw8_ctx *q, int64_t img, int64_t cb, int64_t ph, uint8_t *row) {
    int64_t ih = ph - q->pt;
    int64_t left = q->pl < q->wr ? q->pl : q->wr, real = q->wr - left < q->w ? q->wr - left : q->w;
    uint8_t zs[16];
    memset(zs, (int)q->zu, 16);
    if (ih < 0 || ih >= q->h || real <= 0) left = q->wr, real = 0;
    for (int64_t p = 0; p < left; p++) memcpy(row + p * 16, zs, 16);
    for (int64_t p = left + real; p < q->wr; p++) memcpy(row + p * 16, zs, 16);
    if (real <= 0) return;
    int64_t off = ((img * q->cb + cb) * q->h + ih) * q->w * 16;
    uint8_t *d = row + left * 16;
    if (q->xu) {
        for (int64_t p = 0; p < real; p++) memcpy(d + p * 16, q->xu + off + p * 16, 16);
        return;
    }
#if defined(DW8_X86)
    if (q->variant == 2) { dw8_quant512(q, q->xf + off, real * 16, d); return; }
    if (q->variant == 1) { dw8_quant2(q, q->xf + off, real * 16, d); return; }
#endif
    dw8_quant1(q, q->xf + off, real * 16, d);
}

/* ---- the quads of a row: column u, byte 4c + j = channel c of pixel u * g + j * dw ---- */
static void dw8_quads1(const dw8_ctx *q, const uint8_t *row, uint8_t *dst) {
    for (int64_t u = 0; u < q->uc; u++)
        for (int j = 0; j < 4; j++) {
            const uint8_t *p = row + (u * q->gstep + j * q->dw) * 16;
            for (int c = 0; c < 16; c++) dst[u * 64 + 4 * c + j] = p[c];
        }
}

#if defined(DW8_X86)
/* four pixels' 16 bytes interleaved: bytes, then byte pairs (a 4 x 16 transpose in six unpacks) */
static DW8_T2 void dw8_quads2(const dw8_ctx *q, const uint8_t *row, uint8_t *dst) {
    const int64_t s = q->dw * 16;
    for (int64_t u = 0; u < q->uc; u++) {
        const uint8_t *p = row + u * q->gstep * 16;
        __m128i a = _mm_loadu_si128((const __m128i *)p), b = _mm_loadu_si128((const __m128i *)(p + s));
        __m128i c = _mm_loadu_si128((const __m128i *)(p + 2 * s)), d = _mm_loadu_si128((const __m128i *)(p + 3 * s));
        __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
        __m128i *o = (__m128i *)(dst + u * 64);
        _mm_store_si128(o, _mm_unpacklo_epi16(ab0, cd0));
        _mm_store_si128(o + 1, _mm_unpackhi_epi16(ab0, cd0));
        _mm_store_si128(o + 2, _mm_unpacklo_epi16(ab1, cd1));
        _mm_store_si128(o + 3, _mm_unpackhi_epi16(ab1, cd1));
    }
}

/* the four pixels in one register (one load where dw is 1), dwords moved across lanes by VPERMD
   (lane L gets dword L of each pixel: channels 4L..4L+3) and each lane's 4 x 4 bytes transposed */
static DW8_T512 void dw8_quads512(const dw8_ctx *q, const uint8_t *row, uint8_t *dst) {
    const __m512i perm = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512i bytes = _mm512_broadcast_i32x4(_mm_set_epi8(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0));
    const int64_t s = q->dw * 16;
    for (int64_t u = 0; u < q->uc; u++) {
        const uint8_t *p = row + u * q->gstep * 16;
        __m512i v;
        if (q->dw == 1) {
            v = _mm512_loadu_si512(p);
        } else {
            v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + s)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * s)), 2);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * s)), 3);
        }
        v = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(perm, v), bytes);
        _mm512_store_si512(dst + u * 64, v);
    }
}
#endif

/* ---- the epilogue ---- */
static inline int64_t dw8_at(const dw8_ctx *q, int64_t img, int64_t cb, int64_t oh, int64_t ow) {
    return (((img * q->cb + cb) * q->oh + oh) * q->ow + ow) * 16;
}

/* the 16 raw sums of output pixel o (an element offset) of block cb through the epilogue, stored */
static inline __attribute__((always_inline)) void dw8_store1(const dw8_ctx *q, int64_t cb, int64_t o, const int32_t *raw) {
    for (int c = 0; c < 16; c++) {
        int64_t ch = cb * 16 + c;
        float y = (float)(int32_t)((uint32_t)raw[c] - (uint32_t)q->corr[ch]);
        y = y * q->mult[ch];
        if (q->has_bias) y = y + q->bias[ch];
        if (q->add) y = y + q->add[o + c];
        if (q->clip) {
            y = y > q->lo ? y : q->lo;
            y = y < q->hi ? y : q->hi;
        }
        y = act32(y, q->act);
        if (q->oq) {
            float t = rintf(y / q->ys) + q->yz;
            t = t > q->qlo ? t : q->qlo;
            t = t < q->qhi ? t : q->qhi;
            if (q->ou) { q->ou[o + c] = (uint8_t)(int)t; continue; }
            y = (t - q->yz) * q->ys;
        }
        q->of[o + c] = y;
    }
}

#if defined(DW8_X86)
/* the epilogue's constants of a channel block, in registers for a task's loop. The out-quant
   runs as k = rint(clamp(y / ys, qa, qb)), qa = qlo - yz, qb = qhi - yz (the same integers as
   clamp(rint(y / ys) + yz, qlo, qhi) - yz: integer bounds, rint monotone, a NaN gives qa both
   ways); without an activation the clip folds into qa, qb: y -> rint(y / ys) is monotone, so the
   clip of y is the clamp of k to k(lo), k(hi), and two clamps are one */
typedef struct {
    __m512 mult, bias, lo, hi, ys, yr, qa, qb;
    __m512i yz;
    int clip;
} dw8_k512;

static inline __attribute__((always_inline)) DW8_T512 void dw8_k512_init(const dw8_ctx *q, int64_t cb, dw8_k512 *k) {
    float qa = q->qlo - q->yz, qb = q->qhi - q->yz;
    k->clip = (int)q->clip;
    if (q->clip && q->oq && !q->act) {
        float kl = rintf(q->lo / q->ys), kh = rintf(q->hi / q->ys);
        kl = q->lo <= q->hi ? kl : kh;
        kl = ge_min32(ge_max32(kl, qa), qb);
        kh = ge_min32(ge_max32(kh, qa), qb);
        qa = kl;
        qb = kh;
        k->clip = 0;
    }
    k->mult = _mm512_loadu_ps(q->mult + cb * 16);
    k->bias = _mm512_loadu_ps(q->bias + cb * 16);
    k->lo = _mm512_set1_ps(q->lo); k->hi = _mm512_set1_ps(q->hi);
    k->ys = _mm512_set1_ps(q->ys); k->yr = _mm512_set1_ps(q->yr);
    k->qa = _mm512_set1_ps(qa); k->qb = _mm512_set1_ps(qb);
    k->yz = _mm512_set1_epi32((int32_t)q->yz);
}

/* the 16 sums of output pixel o (less z * wsum: the accumulators start there) through the
   epilogue, stored */
static inline __attribute__((always_inline)) DW8_T512 void dw8_store512(const dw8_ctx *q, const dw8_k512 *k, int64_t o,
                                                                         __m512i acc, int bias, int add, int clip,
                                                                         int act, int oq, int u8, int fast) {
    __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), k->mult);
    if (bias) y = _mm512_add_ps(y, k->bias);
    if (add) y = _mm512_add_ps(y, _mm512_loadu_ps(q->add + o));
    if (clip) y = _mm512_min_ps(_mm512_max_ps(y, k->lo), k->hi);
    if (act) {
        float t[16];
        _mm512_storeu_ps(t, y);
        for (int i = 0; i < 16; i++) t[i] = act32(t[i], q->act);
        y = _mm512_loadu_ps(t);
    }
    if (oq) {
        __m512 t = dw8_div16(y, k->ys, k->yr, fast);
        t = _mm512_min_ps(_mm512_max_ps(t, k->qa), k->qb);
        if (u8) {
            __m512i v = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(q->ou + o), _mm512_cvtepi32_epi8(_mm512_add_epi32(v, k->yz)));
            return;
        }
        /* (+ 0: a k of -0 is the +0 that (t + yz) - yz gives) */
        t = _mm512_add_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm512_setzero_ps());
        y = _mm512_mul_ps(t, k->ys);
    }
    _mm512_storeu_ps(q->of + o, y);
}
#endif

/* ---- a task's scratch: a ring of `span` rows of quads, each padded input row quantised and laid
   out once and read KH times: span = (KH - 1) dh + 1, the rows one output row reads (L1-sized), or
   where they fit in 64 KB all the task's rows (then the AVX-512 form runs the task's pixels as one
   sequence: a 7x7 plane is 49 pixels, not 7 rows of 7); then the row being built, the AVX2 form's
   widened weights, the sums of a row (or the task), and offs[ky * G + t], the offset in the ring of
   the quads of tap group (ky, t) for the current output row (from its pixels' columns) ---- */
typedef struct {
    uint8_t *sc, *row;
    int16_t *wide;
    int32_t *accs;
    int64_t *offs;
    int64_t span, rowb, base, next;  /* base: padded row r0 * sh; next: the first row not yet built */
} dw8_scr;

/* the ring made ready for output row oh of plane (img, cb): the rows up to its last built (row
   `base + i` in slot i mod span), offs set */
static void dw8_ring(const dw8_ctx *q, dw8_scr *r, int64_t img, int64_t cb, int64_t oh) {
    int64_t first = oh * q->sh, need = (q->kh - 1) * q->dh + 1, span = r->span;
    for (r->next = r->next > first ? r->next : first; r->next < first + need; r->next++) {
        uint8_t *dst = r->sc + (r->next - r->base) % span * r->rowb;
        dw8_row(q, img, cb, r->next, r->row);
#if defined(DW8_X86)
        if (q->variant == 2) { dw8_quads512(q, r->row, dst); continue; }
        if (q->variant == 1) { dw8_quads2(q, r->row, dst); continue; }
#endif
        dw8_quads1(q, r->row, dst);
    }
    int64_t ts = 4 * q->dw / q->gstep * 64;
    for (int64_t ky = 0, j = (first - r->base) % span; ky < q->kh; ky++, j = j + q->dh < span ? j + q->dh : j + q->dh - span)
        for (int64_t t = 0; t < q->g4; t++) r->offs[ky * q->g4 + t] = j * r->rowb + t * ts;
}

/* ---- the sums: output rows r0..r1 of plane (img, cb) from the ring (dw8_ring), tap group
   (ky, t) of the pixel in column ow at sc + offs[ky * G + t] + ow * sw / g * 64 ---- */
static void dw8_rows1(const dw8_ctx *q, dw8_scr *r, int64_t img, int64_t cb, int64_t r0, int64_t r1) {
    const int8_t *wc = q->wq + cb * q->kh * q->g4 * 64;
    const uint8_t *sc = r->sc;
    const int64_t *offs = r->offs;
    int64_t us = q->sw / q->gstep * 64;
    for (int64_t oh = r0; oh < r1; oh++) {
        dw8_ring(q, r, img, cb, oh);
        for (int64_t ow = 0; ow < q->ow; ow++) {
            int32_t acc[16] = {0};
            for (int64_t ky = 0; ky < q->kh; ky++)
                for (int64_t t = 0; t < q->g4; t++) {
                    const uint8_t *p = sc + offs[ky * q->g4 + t] + ow * us;
                    const int8_t *wt = wc + (ky * q->g4 + t) * 64;
                    for (int i = 0; i < 64; i++) acc[i >> 2] += (int32_t)p[i] * (int32_t)wt[i];
                }
            dw8_store1(q, cb, dw8_at(q, img, cb, oh, ow), acc);
        }
    }
}

#if defined(DW8_X86)
/* two pixels at a time: each quad vector's 4-channel quarters widened to 16 int16, VPMADDWD by the
   widened weights (`wide`, the block's KH * G * 64 int16) gives each channel two tap-pair sums;
   the pairs are added once at the end (VPHADDD) */
static DW8_T2 void dw8_rows2(const dw8_ctx *q, dw8_scr *r, int64_t img, int64_t cb, int64_t r0, int64_t r1) {
    const uint8_t *sc = r->sc;
    const int64_t *offs = r->offs;
    const int16_t *wide = r->wide;
    int64_t us = q->sw / q->gstep * 64;
    const int8_t *wc = q->wq + cb * q->kh * q->g4 * 64;
    for (int64_t k = 0; k < q->kh * q->g4 * 64; k++) r->wide[k] = wc[k];
    for (int64_t oh = r0; oh < r1; oh++) {
        dw8_ring(q, r, img, cb, oh);
        for (int64_t ow0 = 0; ow0 < q->ow; ow0 += 2) {
            __m256i acc[2][4];
            int64_t col[2] = {ow0 * us, (ow0 + 1 < q->ow ? ow0 + 1 : ow0) * us};
            for (int p = 0; p < 2; p++)
                for (int l = 0; l < 4; l++) acc[p][l] = _mm256_setzero_si256();
            for (int64_t ky = 0; ky < q->kh; ky++)
                for (int64_t t = 0; t < q->g4; t++) {
                    const uint8_t *rt = sc + offs[ky * q->g4 + t];
                    const int16_t *wt = wide + (ky * q->g4 + t) * 64;
                    for (int l = 0; l < 4; l++) {
                        __m256i wv = _mm256_load_si256((const __m256i *)(wt + 16 * l));
                        for (int p = 0; p < 2; p++) {
                            __m256i v = _mm256_cvtepu8_epi16(_mm_load_si128((const __m128i *)(rt + col[p] + 16 * l)));
                            acc[p][l] = _mm256_add_epi32(acc[p][l], _mm256_madd_epi16(v, wv));
                        }
                    }
                }
            for (int p = 0; p < 2 && ow0 + p < q->ow; p++) {
                int32_t raw[16] __attribute__((aligned(32)));
                _mm256_store_si256((__m256i *)raw, _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[p][0], acc[p][1]), 0xD8));
                _mm256_store_si256((__m256i *)(raw + 8), _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[p][2], acc[p][3]), 0xD8));
                dw8_store1(q, cb, dw8_at(q, img, cb, oh, ow0 + p), raw);
            }
        }
    }
}

/* the sums of npix output pixels into accs (x 16 int32, from -z * wsum), eight at a time, one
   VPDPBUSD a pixel and tap group (the pixels past npix repeat the last): pixel i of the sequence is
   (i / ow, i % ow) from the first, its quads at sc + (i / ow) * rstep + (i % ow) * us + offs[j] */
static inline __attribute__((always_inline)) DW8_T512 void dw8_dot512(const int8_t *wc, const int64_t *offs, int64_t taps,
                                                                       const uint8_t *sc, int64_t npix, int64_t ow,
                                                                       int64_t us, int64_t rstep, __m512i corr,
                                                                       int32_t *accs) {
    const uint8_t *rowp = sc;
    int64_t cc = 0;
    for (int64_t p0 = 0; p0 < npix; p0 += 8) {
        __m512i acc[8];
        const uint8_t *col[8];
        for (int p = 0; p < 8; p++) {
            acc[p] = corr;
            col[p] = rowp + cc * us;
            if (p0 + p + 1 < npix && ++cc == ow) { cc = 0; rowp += rstep; }
        }
        for (int64_t j = 0; j < taps; j++) {
            int64_t off = offs[j];
            __m512i wv = _mm512_loadu_si512(wc + j * 64);
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) acc[p] = _mm512_dpbusd_epi32(acc[p], _mm512_load_si512(col[p] + off), wv);
        }
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) _mm512_store_si512(accs + (p0 + p) * 16, acc[p]);
    }
}

/* output rows r0..r1 in two passes: the sums (dw8_dot512: a row at a time from the ring, or the
   task's pixels as one sequence where all its rows are in the scratch), then the epilogue over
   them, its switches read once (the loop splits on them): the sums' loop keeps its registers and
   the epilogue streams */
static DW8_T512 void dw8_rows512(const dw8_ctx *q, dw8_scr *r, int64_t img, int64_t cb, int64_t r0, int64_t r1) {
    const int8_t *wc = q->wq + cb * q->kh * q->g4 * 64;
    const int64_t us = q->sw / q->gstep * 64, ow = q->ow, taps = q->kh * q->g4;
    const __m512i corr = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(q->corr + cb * 16));
    int32_t *accs = r->accs;
    dw8_k512 k;
    dw8_k512_init(q, cb, &k);
    const int bias = (int)q->has_bias, add = q->add != NULL, clip = k.clip, act = q->act != 0, oq = (int)q->oq;
    const int u8 = q->ou != NULL, fast = (int)q->fasty;
    int whole = r->span > (q->kh - 1) * q->dh + 1 || r1 - r0 == 1;
    for (int64_t oh = r0; oh < r1; oh = whole ? r1 : oh + 1) {
        int64_t npix = whole ? (r1 - r0) * ow : ow;
        for (int64_t h = oh; h < (whole ? r1 : oh + 1); h++) dw8_ring(q, r, img, cb, h);
        if (whole)  /* offs as the first output row's (the ring starts at its rows: no wrap) */
            for (int64_t ky = 0; ky < q->kh; ky++)
                for (int64_t t = 0; t < q->g4; t++)
                    r->offs[ky * q->g4 + t] = ky * q->dh * r->rowb + t * (4 * q->dw / q->gstep * 64);
        dw8_dot512(wc, r->offs, taps, r->sc, npix, ow, us, q->sh * r->rowb, corr, accs);
        int64_t o = dw8_at(q, img, cb, oh, 0);
        for (int64_t p = 0; p < npix; p++)
            dw8_store512(q, &k, o + 16 * p, _mm512_load_si512(accs + p * 16), bias, add, clip, act, oq, u8, fast);
    }
}
#endif

/* task i: image, channel block, rows of output (q->rows a task) */
static void dw8_task(void *vc, int64_t i, int slot) {
    (void)slot;
    dw8_ctx *q = (dw8_ctx *)vc;
    int64_t plane = i / q->chunks, img = plane / q->cb, cb = plane % q->cb;
    int64_t r0 = i % q->chunks * q->rows, r1 = r0 + q->rows < q->oh ? r0 + q->rows : q->oh;
    if (r0 >= r1) return;
    dw8_scr r;
    int64_t need = (q->kh - 1) * q->dh + 1, all = (r1 - r0 - 1) * q->sh + need;
    r.rowb = q->uc * 64;
    r.base = r.next = r0 * q->sh;
    r.span = q->variant == 2 && all * r.rowb + (r1 - r0) * q->ow * 64 <= 65536 ? all : need;
    int64_t pix = r.span > need ? (r1 - r0) * q->ow : q->ow;
    int64_t rowpad = (q->wr * 16 + 64 + 63) / 64 * 64, wpad = (q->kh * q->g4 * 128 + 63) / 64 * 64;
    int64_t accb = (pix + 8) * 64;
    r.sc = (uint8_t *)dw8_scratch((size_t)(r.span * r.rowb + rowpad + wpad + accb + q->kh * q->g4 * 8));
    if (!r.sc) { atomic_store(&q->failed, 1); return; }
    r.row = r.sc + r.span * r.rowb;
    r.wide = (int16_t *)(r.row + rowpad);
    r.accs = (int32_t *)((uint8_t *)r.wide + wpad);
    r.offs = (int64_t *)((uint8_t *)r.accs + accb);
#if defined(DW8_X86)
    if (q->variant == 2) { dw8_rows512(q, &r, img, cb, r0, r1); return; }
    if (q->variant == 1) { dw8_rows2(q, &r, img, cb, r0, r1); return; }
#endif
    dw8_rows1(q, &r, img, cb, r0, r1);
}

static PyObject *dw8_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(1);
}

/* the variants this CPU runs, a mask: 1 scalar, 2 avx2, 4 avx512_vnni */
static PyObject *dw8_caps(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(dw8_caps_mask());
}

static PyObject *dw8_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyUnicode_FromString(dw8_isa_name());
}

/* the dtype number of ndarray argument i (-1 when it is not one) */
static int dw8_type(PyObject *const *args, int i) {
    if (!ge_ndarray || !PyObject_TypeCheck(args[i], ge_ndarray)) return -1;
    return PyArray_TYPE((PyArrayObject *)args[i]);
}

/* the parameters after the arrays: w_scale (1 or C), bias (C when used), the addend (as out) or
   None, float32 (x_scale, u8 zero point, clip lo, hi, out scale, zero point, qlo, qhi), int64
   (has_bias, clip, act, out-quant, threads, variant, C); *width out, and mult, corr and the bias
   padded to the blocks' lanes (one allocation at q->mult) */
static int dw8_params(PyObject *const *args, dw8_ctx *q, const int64_t *od, const int32_t *wsum, int64_t *width) {
    int64_t nws, nb, nf, ni, got[5], n16 = od[1] * 16;
    const float *ws = (const float *)ge_vec(args, 4, NPY_FLOAT, 0, &nws);
    const float *bias = ws ? (const float *)ge_vec(args, 5, NPY_FLOAT, 0, &nb) : NULL;
    const float *fp = bias ? (const float *)ge_vec(args, 7, NPY_FLOAT, 0, &nf) : NULL;
    const int64_t *ip = fp ? (const int64_t *)ge_vec(args, 8, NPY_INT64, 0, &ni) : NULL;
    if (!ip) return -1;
    q->add = NULL;
    if (args[6] != Py_None) {
        q->add = (const float *)ge_nd(args, 6, NPY_FLOAT, 0, 5, got);
        if (!q->add) return -1;
        for (int d = 0; d < 5; d++)
            if (got[d] != od[d]) { ge_fail(); return -1; }
    }
    if (nf != 8 || ni != 7 || ip[6] <= n16 - 16 || ip[6] > n16 || !(nws == 1 || nws == ip[6]) || ip[0] < 0 || ip[0] > 1 || ip[1] < 0 || ip[1] > 1
        || ip[2] < 0 || ip[2] > 5 || ip[3] < 0 || ip[3] > 1 || ip[4] < 1 || ip[4] > 4096 || ip[5] < 0 || ip[5] > 2
        || (ip[0] && nb != ip[6])) { ge_fail(); return -1; }
    if (!(dw8_caps_mask() >> ip[5] & 1)) {
        PyErr_SetString(PyExc_ValueError, "int8dw: this CPU does not run the variant asked for");
        return -1;
    }
    float xs = fp[0], zu = fp[1];
    int qok = fp[4] > 0.0f && fp[4] <= 3.4e38f && fp[5] >= -256.0f && fp[5] <= 255.0f && fp[6] >= -256.0f
              && fp[6] <= fp[7] && fp[7] <= 255.0f && (!q->ou || fp[6] >= 0.0f);
    if (!(xs > 0.0f && xs <= 3.4e38f) || !(zu >= 0.0f && zu <= 255.0f) || zu != rintf(zu)
        || (ip[1] && (fp[2] != fp[2] || fp[3] != fp[3])) || ((ip[3] || q->ou) && !(ip[3] && qok))) { ge_fail(); return -1; }
    q->has_bias = ip[0]; q->clip = ip[1]; q->lo = fp[2]; q->hi = fp[3]; q->act = ip[2];
    q->oq = ip[3]; q->ys = fp[4]; q->yz = fp[5]; q->qlo = fp[6]; q->qhi = fp[7]; q->xs = xs; q->zu = zu;
    q->variant = ip[5];
    q->xr = 1.0f / xs;
    q->fastx = q->xr >= 0x1p-100f && q->xr <= 0x1p100f;
    q->yr = ip[3] ? 1.0f / q->ys : 1.0f;
    q->fasty = q->yr >= 0x1p-100f && q->yr <= 0x1p100f;
    *width = ip[4];
    q->mult = (float *)malloc((size_t)n16 * 12 + 64);
    if (!q->mult) { PyErr_NoMemory(); return -1; }
    q->corr = (int32_t *)(q->mult + n16);
    float *bp = q->mult + 2 * n16;
    q->bias = bp;
    for (int64_t c = 0; c < n16; c++) {
        q->mult[c] = xs * (nws == 1 ? ws[0] : c < nws ? ws[c] : 0.0f);
        bp[c] = ip[0] && c < nb ? bias[c] : 0.0f;
        q->corr[c] = (int32_t)((uint32_t)(int32_t)zu * (uint32_t)wsum[c]);
    }
    return 0;
}

/* the convolution: (x (N, CB, H, W, 16) float32 or u8, packed weight int8 (CB, KH, ceil(KW / 4),
   64), out (N, CB, OH, OW, 16) float32 or u8, wsum int32 (CB * 16), w_scale, bias, addend, float
   params, int params (dw8_params), geometry int64 (kh, kw, sh, sw, dh, dw, top, left, bottom,
   right)); a u8 output needs the out-quant with 0 <= qlo */
static PyObject *dw8_conv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t xd[5], wd[4], od[5], gn = 0, nws, width;
    if (ge_nargs(n, 10)) return NULL;
    int xt = dw8_type(args, 0) == NPY_UINT8 ? NPY_UINT8 : NPY_FLOAT, ot = dw8_type(args, 2) == NPY_UINT8 ? NPY_UINT8 : NPY_FLOAT;
    void *x = ge_nd(args, 0, xt, 0, 5, xd);
    const int8_t *wq = x ? (const int8_t *)ge_nd(args, 1, NPY_INT8, 0, 4, wd) : NULL;
    void *out = wq ? ge_nd(args, 2, ot, 1, 5, od) : NULL;
    const int32_t *wsum = out ? (const int32_t *)ge_vec(args, 3, NPY_INT32, 0, &nws) : NULL;
    const int64_t *g = wsum ? (const int64_t *)ge_vec(args, 9, NPY_INT64, 0, &gn) : NULL;
    if (!g) return NULL;
    if (gn != 10) return ge_fail();
    for (int i = 0; i < 10; i++)
        if (g[i] < (i < 6 ? 1 : 0) || g[i] > DW8_LIM) return ge_fail();
    int64_t span_h = g[4] * (g[0] - 1) + 1, span_w = g[5] * (g[1] - 1) + 1;
    int64_t eh = xd[2] + g[6] + g[8] - span_h, ew = xd[3] + g[7] + g[9] - span_w;
    if (xd[4] != 16 || od[4] != 16 || od[0] != xd[0] || od[1] != xd[1] || eh < 0 || ew < 0 || od[2] != eh / g[2] + 1
        || od[3] != ew / g[3] + 1 || g[0] * g[1] > DW8_KMAX || wd[0] != xd[1] || wd[1] != g[0]
        || wd[2] != (g[1] + 3) / 4 || wd[3] != 64 || nws != xd[1] * 16 || xd[1] > DW8_LIM || xd[2] > DW8_LIM
        || xd[3] > DW8_LIM)
        return ge_fail();
    dw8_ctx q;
    memset(&q, 0, sizeof(q));
    q.ou = ot == NPY_UINT8 ? (uint8_t *)out : NULL;
    q.of = ot == NPY_UINT8 ? NULL : (float *)out;
    q.xu = xt == NPY_UINT8 ? (const uint8_t *)x : NULL;
    q.xf = xt == NPY_UINT8 ? NULL : (const float *)x;
    q.wq = wq; q.n = xd[0]; q.cb = xd[1]; q.h = xd[2]; q.w = xd[3]; q.oh = od[2]; q.ow = od[3];
    q.kh = g[0]; q.kw = g[1]; q.g4 = wd[2]; q.sh = g[2]; q.sw = g[3]; q.dh = g[4]; q.dw = g[5]; q.pt = g[6]; q.pl = g[7];
    q.gstep = 4 * q.dw % q.sw == 0 ? q.sw : 1;
    q.uc = (q.ow - 1) * (q.sw / q.gstep) + (q.g4 - 1) * (4 * q.dw / q.gstep) + 1;
    q.wr = (q.uc - 1) * q.gstep + 3 * q.dw + 1;
    int64_t nr = (q.oh - 1) * q.sh + (q.kh - 1) * q.dh + 1;
    if (ge_prod(nr > 0 ? nr : 1, q.uc > 0 ? q.uc : 1, 64, 1) < 0 || ge_prod(q.wr > 0 ? q.wr : 1, 16, 2, 1) < 0
        || ge_prod(q.kh, q.g4, 128, 1) < 0 || ge_prod(od[0], od[1], od[2], od[3]) < 0 || ge_prod(xd[0], xd[1], xd[2], xd[3]) < 0)
        return ge_fail();
    if (dw8_params(args, &q, od, wsum, &width)) return NULL;
    if (od[0] == 0 || od[1] == 0 || od[2] == 0 || od[3] == 0) { free(q.mult); Py_RETURN_NONE; }
    /* about 1024 output pixels a task, the rows split evenly; more tasks where threads would idle */
    int64_t rows = 1024 / q.ow < 1 ? 1 : 1024 / q.ow;
    q.chunks = (q.oh + rows - 1) / rows;
    while (width > 1 && q.chunks < q.oh && q.n * q.cb * q.chunks < 4 * width) q.chunks++;
    q.rows = (q.oh + q.chunks - 1) / q.chunks;
    q.chunks = (q.oh + q.rows - 1) / q.rows;
    atomic_init(&q.failed, 0);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(dw8_task, &q, q.n * q.cb * q.chunks, width);
    Py_END_ALLOW_THREADS
    free(q.mult);
    if (atomic_load(&q.failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
