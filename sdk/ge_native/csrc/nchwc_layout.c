#include "prelude.h"
#include "nchwc.h"

/* group normalization of blocked values: y = (x - mean) / sqrt(var + eps) * scale + bias, the
   mean and variance over each group's gs channels and the plane (gs dividing 16: groups inside a
   block; a multiple of 16: whole blocks a group), scale and bias per channel */
typedef struct { const float *x, *scale, *bias; float *y; int64_t cb, hw, gs, bpt, relu; double eps; } nc_gn;

#if defined(NC_VEC)
/* task t: image t / tasks, blocks [b0, b0 + bpt): their lanes' sums (float32 over runs of 64
   pixels, then double), the groups' mean and 1/std, then the plane normalized in one pass */
static void nc_gn_task(void *ctx, int64_t t, int slot) {
    const nc_gn *g = (const nc_gn *)ctx;
    (void)slot;
    int64_t per = g->cb / g->bpt, img = t / per, b0 = (t % per) * g->bpt;
    double s1[16 * 64], s2[16 * 64];  /* (bpt <= 64 blocks) */
    float t1[16], t2[16];
    for (int64_t b = 0; b < g->bpt; b++) {
        const float *xb = g->x + ((img * g->cb) + b0 + b) * g->hw * 16;
        for (int l = 0; l < 16; l++) s1[b * 16 + l] = s2[b * 16 + l] = 0.0;
        for (int64_t i = 0; i < g->hw; i += 64) {
            int64_t e = i + 64 < g->hw ? i + 64 : g->hw;
            nv a1 = nv_zero(), a2 = nv_zero();
            for (int64_t p = i; p < e; p++) {
                nv v = nv_load(xb + p * 16);
                a1 = nv_add(a1, v);
                a2 = nv_fma(v, v, a2);
            }
            nv_store(t1, a1);
            nv_store(t2, a2);
            for (int l = 0; l < 16; l++) { s1[b * 16 + l] += t1[l]; s2[b * 16 + l] += t2[l]; }
        }
    }
    /* per lane of every block: a = rstd * scale, c = bias - mean * a (the group's mean and rstd) */
    float ca[16 * 64], cc[16 * 64];
    int64_t lanes = g->bpt * 16, gs = g->gs;
    for (int64_t l0 = 0; l0 < lanes; l0 += gs) {
        double m1 = 0.0, m2 = 0.0;
        for (int64_t l = l0; l < l0 + gs; l++) { m1 += s1[l]; m2 += s2[l]; }
        double cnt = (double)gs * (double)g->hw, mean = m1 / cnt, var = m2 / cnt - mean * mean;
        double rstd = 1.0 / sqrt((var > 0.0 ? var : 0.0) + g->eps);
        for (int64_t l = l0; l < l0 + gs; l++) {
            int64_t ch = b0 * 16 + l;
            double a = rstd * (double)g->scale[ch];
            ca[l] = (float)a;
            cc[l] = (float)((double)g->bias[ch] - mean * a);
        }
    }
    for (int64_t b = 0; b < g->bpt; b++) {
        const float *xb = g->x + ((img * g->cb) + b0 + b) * g->hw * 16;
        float *yb = g->y + ((img * g->cb) + b0 + b) * g->hw * 16;
        nv a = nv_load(ca + b * 16), c = nv_load(cc + b * 16), zero = nv_zero();
        if (g->relu)  /* (max(v, 0): a NaN lane stays NaN, vmaxps returning its second operand) */
            for (int64_t p = 0; p < g->hw; p++) nv_store(yb + p * 16, nv_max(zero, nv_fma(nv_load(xb + p * 16), a, c)));
        else
            for (int64_t p = 0; p < g->hw; p++) nv_store(yb + p * 16, nv_fma(nv_load(xb + p * 16), a, c));
    }
}
#endif

/* (x5, y5, scale (cb * 16), bias (cb * 16), channels a group, eps, threads, relu 0|1) */
static PyObject *nc_groupnorm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t xd[5], yd[5], sn, bn, gs, width, relu;
    if (ge_nargs(n, 8) || ge_int(args, 4, 1, 1024, &gs) || ge_int(args, 6, 1, 4096, &width) || ge_int(args, 7, 0, 1, &relu)) return NULL;
    double eps = PyFloat_AsDouble(args[5]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    nc_gn g;
    g.x = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, 5, xd);
    g.y = g.x ? (float *)ge_nd(args, 1, NPY_FLOAT, 1, 5, yd) : NULL;
    g.scale = g.y ? (const float *)ge_vec(args, 2, NPY_FLOAT, 0, &sn) : NULL;
    g.bias = g.scale ? (const float *)ge_vec(args, 3, NPY_FLOAT, 0, &bn) : NULL;
    if (!g.bias) return NULL;
    for (int d = 0; d < 5; d++) if (xd[d] != yd[d]) return ge_fail();
    if (xd[4] != 16 || sn != xd[1] * 16 || bn != sn || (const void *)g.x == (const void *)g.y || !(eps >= 0.0)) return ge_fail();
    if (!(16 % gs == 0 || (gs % 16 == 0 && xd[1] % (gs / 16) == 0)) || gs / 16 > 64) return ge_fail();
    g.cb = xd[1]; g.hw = xd[2] * xd[3]; g.gs = gs; g.eps = eps; g.bpt = gs > 16 ? gs / 16 : 1; g.relu = relu;
    if (xd[0] <= 0 || g.cb <= 0 || g.hw <= 0) Py_RETURN_NONE;
#if defined(NC_VEC)
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(nc_gn_task, &g, xd[0] * (g.cb / g.bpt), width);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return ge_fail();
#endif
}

typedef struct { const float *s; float *d; int64_t c, cb, hw; } nc_reo;

#if defined(__AVX512F__)
/* the 16 x 16 floats of r transposed in registers (r[i] lane j -> r[j] lane i) */
static inline __attribute__((always_inline)) void nc_tr16(__m512 *r) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {  /* r[4i + k], lane L: column 4L + k of rows 4i .. 4i + 3 */
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512 a = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88), b = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88), e = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
        t[k] = _mm512_shuffle_f32x4(a, c, 0x88);        /* column k */
        t[8 + k] = _mm512_shuffle_f32x4(a, c, 0xDD);    /* column 8 + k */
        t[4 + k] = _mm512_shuffle_f32x4(b, e, 0x88);    /* column 4 + k */
        t[12 + k] = _mm512_shuffle_f32x4(b, e, 0xDD);   /* column 12 + k */
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}
#endif

static void nc_in_task(void *ctx, int64_t t, int slot) {
    const nc_reo *r = (const nc_reo *)ctx;
    (void)slot;
    int64_t img = t / r->cb, cb = t % r->cb;
    float *d = r->d + t * r->hw * 16;
#if defined(__AVX512F__)
    {   /* 16 pixels of the block's 16 channels a transpose (the channels past C zeros) */
        const float *s0 = r->s + (img * r->c + cb * 16) * r->hw;
        int64_t valid = r->c - cb * 16 < 16 ? r->c - cb * 16 : 16, i = 0;
        for (; i + 16 <= r->hw; i += 16) {
            __m512 v[16];
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) v[c] = c < valid ? _mm512_loadu_ps(s0 + c * r->hw + i) : _mm512_setzero_ps();
            nc_tr16(v);
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++) _mm512_storeu_ps(d + (i + p) * 16, v[p]);
        }
        for (; i < r->hw; i++)
            for (int c = 0; c < 16; c++) d[i * 16 + c] = c < valid ? s0[c * r->hw + i] : 0.0f;
        return;
    }
#endif
    for (int64_t c = 0; c < 16; c++) {
        int64_t ch = cb * 16 + c;
        if (ch < r->c) {
            const float *s = r->s + (img * r->c + ch) * r->hw;
            for (int64_t i = 0; i < r->hw; i++) d[i * 16 + c] = s[i];
        } else {
            for (int64_t i = 0; i < r->hw; i++) d[i * 16 + c] = 0.0f;
        }
    }
}

static void nc_out_task(void *ctx, int64_t t, int slot) {
    const nc_reo *r = (const nc_reo *)ctx;
    (void)slot;
    int64_t img = t / r->cb, cb = t % r->cb;
    const float *s = r->s + t * r->hw * 16;
#if defined(__AVX512F__)
    {   /* (the block's channels past C are not stored) */
        float *d0 = r->d + (img * r->c + cb * 16) * r->hw;
        int64_t valid = r->c - cb * 16 < 16 ? r->c - cb * 16 : 16, i = 0;
        for (; i + 16 <= r->hw; i += 16) {
            __m512 v[16];
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++) v[p] = _mm512_loadu_ps(s + (i + p) * 16);
            nc_tr16(v);
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) if (c < valid) _mm512_storeu_ps(d0 + c * r->hw + i, v[c]);
        }
        for (; i < r->hw; i++)
            for (int c = 0; c < valid; c++) d0[c * r->hw + i] = s[i * 16 + c];
        return;
    }
#endif
    for (int64_t c = 0; c < 16 && cb * 16 + c < r->c; c++) {
        float *d = r->d + (img * r->c + cb * 16 + c) * r->hw;
        for (int64_t i = 0; i < r->hw; i++) d[i] = s[i * 16 + c];
    }
}

/* (src, dst, threads, direction 0: NCHW (n, c, h, w) -> blocked (n, cb, h, w, 16); 1: back) */
static PyObject *nc_reorder(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t width, back, pd[4], bd[5];
    if (ge_nargs(n, 4) || ge_int(args, 2, 1, 4096, &width) || ge_int(args, 3, 0, 1, &back)) return NULL;
    nc_reo r;
    const float *plain = (const float *)ge_nd(args, back ? 1 : 0, NPY_FLOAT, back, 4, pd);
    const float *blk = plain ? (const float *)ge_nd(args, back ? 0 : 1, NPY_FLOAT, !back, 5, bd) : NULL;
    if (!blk) return NULL;
    if (bd[0] != pd[0] || bd[1] != (pd[1] + 15) / 16 || bd[2] != pd[2] || bd[3] != pd[3] || bd[4] != 16) return ge_fail();
    if ((const void *)plain == (const void *)blk) return ge_fail();
    r.c = pd[1]; r.cb = bd[1]; r.hw = pd[2] * pd[3];
    r.s = back ? blk : plain;
    r.d = (float *)(back ? plain : blk);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(back ? nc_out_task : nc_in_task, &r, pd[0] * bd[1], width);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
