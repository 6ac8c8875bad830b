/* ge_cpu's direct depthwise convolution (float32, AVX-512F): see plugins/ge_cpu/kernels/_window.py */
#include "prelude.h"
#include "activations.h"
#include "activations16.h"
#include <immintrin.h>
#include <stdlib.h>
#define DW_AI static inline __attribute__((always_inline))

typedef struct {
    const float *x; const float *wt; const float *b; float *out; float *buf;
    int64_t N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, M, per, act, Hb, Wb;
    float lo, hi;
} dw_ctx;

#if defined(__AVX512F__)
DW_AI __m512 dw_shift(__m512 a, __m512 b, const int k) {  /* lanes k .. k + 15 of the pair (a, b) */
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(b), _mm512_castps_si512(a), k));
}

/* R output rows from oh, 16 columns from ow0, of a 3x3 kernel at stride S both ways (dilation 1),
   from the bordered plane `buf` (row pitch Wb, a multiple of 16: every load is aligned). Each
   input row is loaded once and feeds the R sums it belongs to: R independent chains keep the
   multiply-adds in flight (one chain waits on their latency). Rows from OH on are computed into
   the border and not stored */
DW_AI void dw_block3(const float *buf, int64_t Wb, int64_t oh, int64_t OH, int64_t OW, int64_t ow0, const __m512 *w9,
                     __m512 bias, __mmask16 om, float *o, const int R, const int S) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = bias;
#pragma GCC unroll 17
    for (int j = 0; j < (R - 1) * S + 3; j++) {
        const float *row = buf + (oh * S + j) * Wb + ow0 * S;
        __m512 v[3];
        __m512 a0 = _mm512_load_ps(row), a1 = _mm512_load_ps(row + 16);
        if (S == 1) {
            v[0] = a0;
            v[1] = dw_shift(a0, a1, 1);
            v[2] = dw_shift(a0, a1, 2);
        } else {
            __m512 a2 = _mm512_load_ps(row + 32);
            v[0] = _mm512_permutex2var_ps(a0, even, a1);
            v[1] = _mm512_permutex2var_ps(a0, odd, a1);
            v[2] = _mm512_permutex2var_ps(dw_shift(a0, a1, 2), even, dw_shift(a1, a2, 2));
        }
#pragma GCC unroll 3
        for (int qq = 0; qq < 3; qq++)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                int r = j - i * S;
                if (r >= 0 && r <= 2) acc[i] = _mm512_fmadd_ps(v[qq], w9[r * 3 + qq], acc[i]);
            }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        if (oh + i < OH) _mm512_mask_storeu_ps(o + (oh + i) * OW + ow0, om, acc[i]);
}

/* one output plane of a 3x3 kernel at stride S (1 or 2) both ways, dilation 1 */
DW_AI void dw_plane3(const dw_ctx *q, const float *buf, const float *wm, float bv, float *o, const int S) {
    const int64_t OH = q->OH, OW = q->OW, Wb = q->Wb;
    const __m512 bias = _mm512_set1_ps(bv);
    __m512 w9[9];
    for (int t = 0; t < 9; t++) w9[t] = _mm512_set1_ps(wm[t]);
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
        int64_t nout = OW - ow0 < 16 ? OW - ow0 : 16;
        __mmask16 om = (__mmask16)((1u << nout) - 1u);
        int64_t oh = 0;
        for (; oh + 8 <= OH; oh += 8) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 8, S);
        int64_t rest = OH - oh;
        if (rest >= 5) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 8, S);
        else if (rest >= 3) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 4, S);
        else if (rest == 2) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 2, S);
        else if (rest == 1) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 1, S);
    }
}

/* one output plane of any kernel at stride 1 or 2 across, one output row at a time */
static void dw_plane(const dw_ctx *q, const float *buf, const float *wm, float bv, float *o) {
    const int64_t OH = q->OH, OW = q->OW, SH = q->SH, SW = q->SW, KH = q->KH, KW = q->KW, DH = q->DH, DW = q->DW;
    const int64_t Wb = q->Wb;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
        int64_t nout = OW - ow0 < 16 ? OW - ow0 : 16;
        __mmask16 om = (__mmask16)((1u << nout) - 1u);
        for (int64_t oh = 0; oh < OH; oh++) {
            __m512 acc = _mm512_set1_ps(bv);
            for (int64_t r = 0; r < KH; r++) {
                const float *row = buf + (oh * SH + r * DH) * Wb + ow0 * SW;
                for (int64_t qq = 0; qq < KW; qq++) {
                    const float *p = row + qq * DW;
                    __m512 v = SW == 1 ? _mm512_loadu_ps(p)
                                       : _mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_loadu_ps(p + 16));
                    acc = _mm512_fmadd_ps(v, _mm512_set1_ps(wm[r * KW + qq]), acc);
                }
            }
            _mm512_mask_storeu_ps(o + oh * OW + ow0, om, acc);
        }
    }
}

/* the clip and activation over an output plane just written (in L1), out of the multiply-add
   loops so that they keep their registers */
static void dw_epi_plane(float *o, int64_t count, float lo, float hi, int64_t act) {
    const __m512 lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
    for (int64_t j = 0; j < count; j += 16) {
        __mmask16 m = (__mmask16)(count - j >= 16 ? 0xFFFFu : (1u << (count - j)) - 1u);
        __m512 v = _mm512_min_ps(hiv, _mm512_max_ps(lov, _mm512_maskz_loadu_ps(m, o + j)));
        _mm512_mask_storeu_ps(o + j, m, act ? sg_act16(v, act) : v);
    }
}

/* planes p0 .. p1 - 1 of the task: each copied into the thread's bordered plane (zeroed once per
   call: the copies write its interior only), then computed from there */
static void dw_task(void *vc, int64_t i, int slot) {
    const dw_ctx *q = (const dw_ctx *)vc;
    (void)slot;
    int64_t P = q->N * q->M, p0 = i * q->per, p1 = p0 + q->per < P ? p0 + q->per : P;
    int64_t H = q->H, W = q->W, Wb = q->Wb;
    float *buf = q->buf + slot * q->Hb * Wb;
    int k3 = q->KH == 3 && q->KW == 3 && q->DH == 1 && q->DW == 1 && q->SH == q->SW;
    int64_t last = -1;
    for (int64_t pc = p0; pc < p1; pc++) {
        int64_t n = pc / q->M, m = pc % q->M, c = m / q->mult;
        if (n * q->C + c != last) {
            const float *xp = q->x + (n * q->C + c) * H * W;
            for (int64_t r = 0; r < H; r++) {
                const float *src = xp + r * W;
                float *dst = buf + (r + q->PT) * Wb + q->PL;
                for (int64_t j = 0; j < W; j += 16) {
                    __mmask16 mk = (__mmask16)(W - j >= 16 ? 0xFFFFu : (1u << (W - j)) - 1u);
                    _mm512_mask_storeu_ps(dst + j, mk, _mm512_maskz_loadu_ps(mk, src + j));
                }
            }
            last = n * q->C + c;
        }
        const float *wm = q->wt + m * q->KH * q->KW;
        float *o = q->out + pc * q->OH * q->OW;
        if (k3 && q->SH == 1) dw_plane3(q, buf, wm, q->b[m], o, 1);
        else if (k3 && q->SH == 2) dw_plane3(q, buf, wm, q->b[m], o, 2);
        else dw_plane(q, buf, wm, q->b[m], o);
        if (q->act || q->lo > -INFINITY || q->hi < INFINITY) dw_epi_plane(o, q->OH * q->OW, q->lo, q->hi, q->act);
    }
}

/* ---- small planes: 16 channels to a vector ----
   A plane narrower than a vector (a 7x7 or 14x14 one) leaves most lanes of a row idle, and a
   stride-2 row needs permutes. Here a task takes 16 channels of one image: their planes are
   transposed (16 x 16 tiles in registers) into a bordered buffer of pixels of 16 channels, each
   output pixel is one vector (a chain of multiply-adds in tap order from the bias, the padding's
   taps included as zeros: the bits of the plane path), and the result is transposed back. */

/* r[0..15] (16 rows of 16) transposed in place */
DW_AI void dw_tr16(__m512 *r) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    /* u[4i + j], 128-bit lane L: rows 4i .. 4i + 3 of column 4L + j */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512 vlo = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), vhi = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
        __m512 wlo = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88), whi = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_f32x4(vlo, wlo, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(vlo, wlo, 0xdd);
        r[4 + j] = _mm512_shuffle_f32x4(vhi, whi, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(vhi, whi, 0xdd);
    }
}

typedef struct {
    const dw_ctx *q;
    float *scratch;                  /* per thread: the bordered pixel buffer (Hp x Wp x 16), then OH*OW x 16 */
    int64_t Hp, Wp, groups, per_thread;
} dwc_ctx;

static void dwc_task(void *vc, int64_t i, int slot) {
    const dwc_ctx *g = (const dwc_ctx *)vc;
    const dw_ctx *q = g->q;
    const int64_t H = q->H, W = q->W, OH = q->OH, OW = q->OW, KH = q->KH, KW = q->KW, taps = KH * KW;
    const int64_t SH = q->SH, SW = q->SW, DH = q->DH, DW = q->DW, Wp = g->Wp;
    const int64_t n = i / g->groups, c0 = (i % g->groups) * 16, nc = q->C - c0 < 16 ? q->C - c0 : 16;
    const int64_t HW = H * W, OHW = OH * OW;
    float *bb = g->scratch + (int64_t)slot * g->per_thread, *ob = bb + g->Hp * Wp * 16;
    /* the planes in: 16 pixels of the 16 channels at a time, transposed, each pixel's vector to
       its place in the buffer (the border was zeroed once and is never written) */
    const float *xs = q->x + (n * q->C + c0) * HW;
    int64_t h = 0, w = 0;  /* the pixel p0 + k's row and column, counted (not divided) */
    for (int64_t p0 = 0; p0 < HW; p0 += 16) {
        int64_t np_ = HW - p0 < 16 ? HW - p0 : 16;
        __mmask16 pm = (__mmask16)(np_ == 16 ? 0xFFFFu : (1u << np_) - 1u);
        __m512 r[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) r[c] = c < nc ? _mm512_maskz_loadu_ps(pm, xs + c * HW + p0) : _mm512_setzero_ps();
        dw_tr16(r);
        float *dst = bb + ((h + q->PT) * Wp + w + q->PL) * 16;
        for (int64_t k = 0; k < np_; k++) {
            _mm512_store_ps(dst, r[k]);
            dst += 16;
            if (++w == W) { w = 0; h++; dst += (Wp - W) * 16; }
        }
    }
    /* the taps' weights and the bias as vectors of the 16 channels (0 past the last one) */
    float wv[64 * 16] __attribute__((aligned(64)));
    float bv[16] __attribute__((aligned(64)));
    for (int64_t c = 0; c < 16; c++) {
        bv[c] = c < nc ? q->b[c0 + c] : 0.0f;
        for (int64_t t = 0; t < taps; t++) wv[t * 16 + c] = c < nc ? q->wt[(c0 + c) * taps + t] : 0.0f;
    }
    const __m512 bias = _mm512_load_ps(bv), lo = _mm512_set1_ps(q->lo), hi = _mm512_set1_ps(q->hi);
    const int epi = q->act || q->lo > -INFINITY || q->hi < INFINITY;
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *row = bb + oh * SH * Wp * 16;
        int64_t ow = 0;
        for (; ow + 4 <= OW; ow += 4) {  /* four pixels: four independent chains */
            __m512 a0 = bias, a1 = bias, a2 = bias, a3 = bias;
            for (int64_t r = 0; r < KH; r++)
                for (int64_t s = 0; s < KW; s++) {
                    const float *p = row + (r * DH * Wp + ow * SW + s * DW) * 16;
                    __m512 w = _mm512_load_ps(wv + (r * KW + s) * 16);
                    a0 = _mm512_fmadd_ps(_mm512_load_ps(p), w, a0);
                    a1 = _mm512_fmadd_ps(_mm512_load_ps(p + SW * 16), w, a1);
                    a2 = _mm512_fmadd_ps(_mm512_load_ps(p + 2 * SW * 16), w, a2);
                    a3 = _mm512_fmadd_ps(_mm512_load_ps(p + 3 * SW * 16), w, a3);
                }
            if (epi) {
                a0 = _mm512_min_ps(hi, _mm512_max_ps(lo, a0)); a1 = _mm512_min_ps(hi, _mm512_max_ps(lo, a1));
                a2 = _mm512_min_ps(hi, _mm512_max_ps(lo, a2)); a3 = _mm512_min_ps(hi, _mm512_max_ps(lo, a3));
                if (q->act) { a0 = sg_act16(a0, q->act); a1 = sg_act16(a1, q->act); a2 = sg_act16(a2, q->act); a3 = sg_act16(a3, q->act); }
            }
            float *o = ob + (oh * OW + ow) * 16;
            _mm512_store_ps(o, a0); _mm512_store_ps(o + 16, a1); _mm512_store_ps(o + 32, a2); _mm512_store_ps(o + 48, a3);
        }
        for (; ow < OW; ow++) {
            __m512 a0 = bias;
            for (int64_t r = 0; r < KH; r++)
                for (int64_t s = 0; s < KW; s++)
                    a0 = _mm512_fmadd_ps(_mm512_load_ps(row + (r * DH * Wp + ow * SW + s * DW) * 16),
                                         _mm512_load_ps(wv + (r * KW + s) * 16), a0);
            if (epi) {
                a0 = _mm512_min_ps(hi, _mm512_max_ps(lo, a0));
                if (q->act) a0 = sg_act16(a0, q->act);
            }
            _mm512_store_ps(ob + (oh * OW + ow) * 16, a0);
        }
    }
    /* the planes out: 16 pixels of the 16 channels at a time, transposed back */
    float *os = q->out + (n * q->C + c0) * OHW;
    for (int64_t p0 = 0; p0 < OHW; p0 += 16) {
        int64_t np_ = OHW - p0 < 16 ? OHW - p0 : 16;
        __mmask16 pm = (__mmask16)(np_ == 16 ? 0xFFFFu : (1u << np_) - 1u);
        __m512 r[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) r[k] = k < np_ ? _mm512_load_ps(ob + (p0 + k) * 16) : _mm512_setzero_ps();
        dw_tr16(r);
        for (int64_t c = 0; c < nc; c++) _mm512_mask_storeu_ps(os + c * OHW + p0, pm, r[c]);
    }
}

/* the small-plane form of dw_conv when it takes the geometry (1: ran; 0: not taken; -1: no memory) */
static int dwc_run(const dw_ctx *q, int64_t threads) {
    const int64_t taps = q->KH * q->KW;
    if (q->mult != 1 || taps > 64) return 0;
    int64_t Hp = q->PT + q->H, Wp = q->PL + q->W;
    int64_t eh = (q->OH - 1) * q->SH + (q->KH - 1) * q->DH + 1, ew = (q->OW - 1) * q->SW + (q->KW - 1) * q->DW + 1;
    if (eh > Hp) Hp = eh;
    if (ew > Wp) Wp = ew;
    /* where it pays (against the plane path, one thread / two): kernels over 3x3 (7x7 on 7x7 to
       28x28 planes: 233 -> 95, 447 -> 230 us), stride 2 (56x56 -> 28x28: 100 -> 75 us), planes up to
       8 wide (544 channels of 7x7: 27 -> 21 us); a 3x3 stride-1 kernel on a wider plane keeps the
       plane path (its row vectors are full; the transposes here would cost more than the taps:
       136 x 28x28, 47 against 59 us); planes up to 32 wide, a thread's buffers in L2 */
    int64_t per = (Hp * Wp + q->OH * q->OW) * 16;
    if (q->OW > 32 || per > (1 << 16)) return 0;
    if (taps <= 9 && q->SH == 1 && q->SW == 1 && q->OW > 8) return 0;
    int64_t groups = (q->C + 15) / 16, nt = q->N * groups;
    if (threads > nt) threads = nt;
    if (threads < 1) threads = 1;
    size_t bytes = (size_t)(threads * per) * sizeof(float);
    float *scratch = (float *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!scratch) return -1;
    /* each thread's border of zeros (the tasks write the interior only) */
    for (int64_t t = 0; t < threads; t++) {
        float *bb = scratch + t * per;
        for (int64_t r = 0; r < Hp; r++) {
            float *row = bb + r * Wp * 16;
            if (r < q->PT || r >= q->PT + q->H) memset(row, 0, (size_t)Wp * 16 * sizeof(float));
            else {
                memset(row, 0, (size_t)q->PL * 16 * sizeof(float));
                memset(row + (q->PL + q->W) * 16, 0, (size_t)(Wp - q->PL - q->W) * 16 * sizeof(float));
            }
        }
    }
    dwc_ctx g = {q, scratch, Hp, Wp, groups, per};
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(dwc_task, &g, nt, threads);
    Py_END_ALLOW_THREADS
    free(scratch);
    return 1;
}
#endif

static PyObject *dw_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
#if defined(__AVX512F__)
    return PyLong_FromLongLong(1);
#else
    return PyLong_FromLongLong(0);
#endif
}

/* dw_conv(N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, x, wt, b, out, threads, act, lo, hi):
   every read is of a row 0 <= ih < H and a column 0 <= col < W of its plane (the rest masked off),
   every write of a column < OW of an output row < OH: any geometry stays inside the arrays */
static PyObject *dw_conv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t v[15], threads, act;
    if (ge_nargs(n, 23)) return NULL;
    for (int i = 0; i < 15; i++)
        if (ge_int(args, i, 0, 1LL << 40, &v[i])) return NULL;
    if (ge_int(args, 19, 1, 4096, &threads) || ge_int(args, 20, 0, 5, &act)) return NULL;
    double lov = PyFloat_AsDouble(args[21]), hiv = PyFloat_AsDouble(args[22]);
    if (PyErr_Occurred()) return NULL;
    int64_t N = v[0], C = v[1], H = v[2], W = v[3], OH = v[4], OW = v[5], KH = v[6], KW = v[7];
    int64_t SH = v[8], SW = v[9], PT = v[10], PL = v[11], DH = v[12], DW = v[13], mult = v[14];
    if (KH < 1 || KW < 1 || SH < 1 || SH > 2 || SW < 1 || SW > 2 || DH < 1 || DW < 1 || mult < 1 ||
        KH > 64 || KW > 64 || DH > 64 || DW > 64 || PT > 64 || PL > 64)
        return ge_fail();
    /* the bordered plane: every row and column the compute reads, the input at (PT, PL), zeros
       around it (a block of 8 rows reads up to (OH rounded up to 8) * SH + (KH - 1) * DH rows;
       16 columns at ow0 read up to 48 past ow0 * SW) */
    int64_t OHr = (OH + 7) / 8 * 8, OWr = (OW + 15) / 16 * 16;
    int64_t Hb = PT + H, Wb = PL + W;
    if (OHr * SH + (KH - 1) * DH + 1 > Hb) Hb = OHr * SH + (KH - 1) * DH + 1;
    if (OWr * SW + (KW - 1) * DW + 48 > Wb) Wb = OWr * SW + (KW - 1) * DW + 48;
    Wb = (Wb + 15) / 16 * 16;
    if (Hb > (1LL << 20) || Wb > (1LL << 20) || Hb * Wb > (1LL << 28)) return ge_fail();
    int64_t M = ge_prod(C, mult, 1, 1);  /* (checked: C and mult up to 2^40 each) */
    if (M < 0) return ge_fail();
    const float *x = (const float *)ge_arr(args, 15, NPY_FLOAT, 0, ge_prod(N, C, H, W));
    const float *wt = (const float *)ge_arr(args, 16, NPY_FLOAT, 0, ge_prod(M, KH, KW, 1));
    const float *b = (const float *)ge_arr(args, 17, NPY_FLOAT, 0, M);
    float *out = (float *)ge_arr(args, 18, NPY_FLOAT, 1, ge_prod(N, M, OH, OW));
    if (!x || !wt || !b || !out) return NULL;
    if (N == 0 || M == 0 || OH == 0 || OW == 0) Py_RETURN_NONE;  /* an empty extent first: no output */
#if defined(__AVX512F__)
    {
        dw_ctx q1 = {x, wt, b, out, NULL, N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, M, 0, act, 0, 0,
                     (float)lov, (float)hiv};
        int rc = dwc_run(&q1, threads);  /* small planes, large kernels, stride 2: 16 channels a vector */
        if (rc < 0) return PyErr_NoMemory();
        if (rc > 0) Py_RETURN_NONE;
    }
    int64_t P = N * M;
    int64_t nt = P < 4 * threads ? P : 4 * threads;
    int64_t per = nt > 0 ? (P + nt - 1) / nt : 1;
    nt = per > 0 ? (P + per - 1) / per : 0;
    if (nt < threads) threads = nt > 0 ? nt : 1;
    size_t bytes = (size_t)(threads * Hb * Wb) * sizeof(float);
    float *buf = (float *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!buf) return PyErr_NoMemory();
    memset(buf, 0, bytes);
    dw_ctx q = {x, wt, b, out, buf, N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, M, per, act, Hb, Wb,
                (float)lov, (float)hiv};
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(dw_task, &q, nt, threads);
    Py_END_ALLOW_THREADS
    free(buf);
    Py_RETURN_NONE;
#else
    (void)lov; (void)hiv;
    return ge_fail();
#endif
}
