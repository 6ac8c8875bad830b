#include "prelude.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
/* Attention over a KV cache (ge_native.gqa): onnxruntime's GroupQueryAttention, and the core of
   its MultiHeadAttention and Attention. Two passes on the native pool:
   1. per (batch, kv head): the past rows copied into the present buffer (skipped when they are
      the same memory: past_present_share_buffer), the new K rows rotated and written at the
      row's past length, the new V rows written, the rows after them zeroed (copy mode);
   2. per (batch, kv head, block of query rows): the block's rows of every query head of the
      group (rotated, scaled) against the group's cache rows: K and V are read once for the
      group, never repeated; a decode step is one pass over the cache per group.
   A task's result never depends on another task's, so the bits are the same at every width. */

enum { GQ_B, GQ_S, GQ_N, GQ_KV, GQ_D, GQ_LP, GQ_L, GQ_RH, GQ_MAXPOS, GQ_INTER, GQ_ROTARY, GQ_SHARE,
       GQ_WINDOW, GQ_SMOOTH, GQ_WIDTH, GQ_HASBIAS, GQ_QB, GQ_QS, GQ_QH, GQ_KB, GQ_KS, GQ_KH, GQ_VB, GQ_VS,
       GQ_VH, GQ_OB, GQ_OS, GQ_OH, GQ_BB, GQ_BH, GQ_BS, GQ_HASPAST, GQ_CAUSAL, GQ_ROWS, GQ_SK, GQ_NDIMS };

typedef struct {
    int64_t p[GQ_NDIMS];
    const float *q, *k, *v, *pk, *pv, *cs, *sn, *bias;
    float *ck, *cv, *o, *scratch;
    const int64_t *past, *total;
    float scale, cap;
    int64_t slot_len;
} gq_ctx;

/* y = x rotated at position pos (the first 2 * rh lanes; the others copied), times mul */
static void gq_rotate(const gq_ctx *c, const float *x, float *y, int64_t pos, float mul) {
    int64_t d = c->p[GQ_D], rh = c->p[GQ_ROTARY] ? c->p[GQ_RH] : 0;
    const float *cs = c->cs + pos * rh, *sn = c->sn + pos * rh;
    for (int64_t i = 2 * rh; i < d; i++) y[i] = x[i] * mul;
    for (int64_t i = 0; i < rh; i++) {
        int64_t a = c->p[GQ_INTER] ? 2 * i : i, b = c->p[GQ_INTER] ? 2 * i + 1 : i + rh;
        float xa = x[a], xb = x[b];
        y[a] = (xa * cs[i] - xb * sn[i]) * mul;
        y[b] = (xb * cs[i] + xa * sn[i]) * mul;
    }
}

/* the position of new row s of batch row b: past + s, or 1 for a padding row (onnxruntime's) */
static int64_t gq_pos(const gq_ctx *c, int64_t b, int64_t s) {
    return c->past[b] + s < c->total[b] ? c->past[b] + s : 1;
}

/* pass 1, task (b, kv head) */
static void gq_store(void *vc, int64_t t, int slot) {
    const gq_ctx *c = (const gq_ctx *)vc;
    const int64_t *p = c->p;
    int64_t b = t / p[GQ_KV], g = t % p[GQ_KV], d = p[GQ_D], L = p[GQ_L], S = p[GQ_SK], past = c->past[b];
    float *ck = c->ck + (b * p[GQ_KV] + g) * L * d, *cv = c->cv + (b * p[GQ_KV] + g) * L * d;
    if (!p[GQ_SHARE]) {
        if (p[GQ_HASPAST] && past > 0) {
            int64_t off = (b * p[GQ_KV] + g) * p[GQ_LP] * d;
            memcpy(ck, c->pk + off, (size_t)(past * d) * sizeof(float));
            memcpy(cv, c->pv + off, (size_t)(past * d) * sizeof(float));
        }
        memset(ck + (past + S) * d, 0, (size_t)((L - past - S) * d) * sizeof(float));
        memset(cv + (past + S) * d, 0, (size_t)((L - past - S) * d) * sizeof(float));
    }
    for (int64_t s = 0; s < S; s++) {
        const float *kr = c->k + b * p[GQ_KB] + g * p[GQ_KH] + s * p[GQ_KS];
        const float *vr = c->v + b * p[GQ_VB] + g * p[GQ_VH] + s * p[GQ_VS];
        gq_rotate(c, kr, ck + (past + s) * d, gq_pos(c, b, s), 1.0f);
        memcpy(cv + (past + s) * d, vr, (size_t)d * sizeof(float));
    }
}

#if defined(__AVX512F__)
/* gq_scores for many rows (a prefill): 16 cache rows at a time gathered transposed (d x 16),
   then 8 query rows at a time as broadcast products over d: no horizontal sums */
static void gq_scores_blocked(const float *qb, int64_t M, int64_t d, const float *k, int64_t t0, int64_t t1,
                              float *sc, int64_t ld) {
    float kt[256 * 16];
    __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32((int)d));
    for (int64_t j0 = t0; j0 < t1; j0 += 16) {
        int64_t nj = t1 - j0 < 16 ? t1 - j0 : 16;
        __mmask16 mk = (__mmask16)(nj == 16 ? 0xFFFF : (1u << nj) - 1u);
        for (int64_t e = 0; e < d; e++)
            _mm512_storeu_ps(kt + e * 16, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mk, idx, k + j0 * d + e, 4));
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            int64_t mc = M - m0 < 8 ? M - m0 : 8;
            __m512 acc[8];
            const float *qr[8];
            for (int i = 0; i < 8; i++) {
                acc[i] = _mm512_setzero_ps();
                qr[i] = qb + (m0 + (i < mc ? i : 0)) * d;
            }
            for (int64_t e = 0; e < d; e++) {
                __m512 kv = _mm512_loadu_ps(kt + e * 16);
                for (int i = 0; i < 8; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(qr[i][e]), kv, acc[i]);
            }
            for (int i = 0; i < mc; i++) _mm512_mask_storeu_ps(sc + (m0 + i) * ld + j0, mk, acc[i]);
        }
    }
}
#endif

/* sc[m * ld + j] = q_m . k_j for rows m < M of qb (d floats each) and cache rows j in [t0, t1) */
static void gq_scores(const float *qb, int64_t M, int64_t d, const float *k, int64_t t0, int64_t t1,
                      float *sc, int64_t ld) {
#if defined(__AVX512F__)
    if (M > 8 && d <= 256) {
        gq_scores_blocked(qb, M, d, k, t0, t1, sc, ld);
        return;
    }
    __mmask16 tail = (__mmask16)((1u << (d % 16)) - 1u);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
        int64_t mc = M - m0 < 4 ? M - m0 : 4;
        const float *q0 = qb + m0 * d, *q1 = q0 + (mc > 1) * d, *q2 = q0 + (mc > 2) * 2 * d,
                    *q3 = q0 + (mc > 3) * 3 * d;
        for (int64_t j = t0; j < t1; j++) {
            const float *kr = k + j * d;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t e = 0; e < d; e += 16) {
                __mmask16 mk = e + 16 <= d ? (__mmask16)0xFFFF : tail;
                __m512 kv = _mm512_maskz_loadu_ps(mk, kr + e);
                a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q0 + e), kv, a0);
                a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q1 + e), kv, a1);
                a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q2 + e), kv, a2);
                a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q3 + e), kv, a3);
            }
            float r[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                          _mm512_reduce_add_ps(a3)};
            for (int64_t i = 0; i < mc; i++) sc[(m0 + i) * ld + j] = r[i];
        }
    }
#else
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = t0; j < t1; j++) {
            const float *qr = qb + m * d, *kr = k + j * d;
            float a = 0;
            _Pragma("omp simd reduction(+:a)")
            for (int64_t e = 0; e < d; e++) a += qr[e] * kr[e];
            sc[m * ld + j] = a;
        }
#endif
}

/* softmax of r[lo, hi) in place (softcap, then the bias row, then exp), zeros in [t0, lo) and
   [hi, t1); smooth: a zero logit joins the denominator */
static void gq_softmax(float *r, int64_t t0, int64_t lo, int64_t hi, int64_t t1, const float *bias, float cap,
                       int64_t smooth) {
    for (int64_t j = t0; j < lo; j++) r[j] = 0;
    for (int64_t j = hi; j < t1; j++) r[j] = 0;
    if (cap > 0) {
        float inv = 1.0f / cap;
        _Pragma("omp simd")
        for (int64_t j = lo; j < hi; j++) r[j] = cap * tanh32(r[j] * inv);
    }
    if (bias) {
        _Pragma("omp simd")
        for (int64_t j = lo; j < hi; j++) r[j] += bias[j];
    }
    float mx = smooth ? 0.0f : -INFINITY;
    for (int64_t j = lo; j < hi; j++) mx = ge_max32(mx, r[j]);
    float sum = smooth ? expneg32(-mx) : 0.0f;
    _Pragma("omp simd reduction(+:sum)")
    for (int64_t j = lo; j < hi; j++) {
        float e = expneg32(r[j] - mx);
        r[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    _Pragma("omp simd")
    for (int64_t j = lo; j < hi; j++) r[j] *= inv;
}

/* o_m = sum_j p[m, j] v_j over j in [t0, t1) for rows m < M (outputs at op[m]) */
static void gq_pv(const float *pr, int64_t M, int64_t ld, const float *v, int64_t d, int64_t t0, int64_t t1,
                  float *const *op) {
#if defined(__AVX512F__)
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
        int64_t mc = M - m0 < 4 ? M - m0 : 4;
        const float *p0 = pr + m0 * ld, *p1 = p0 + (mc > 1) * ld, *p2 = p0 + (mc > 2) * 2 * ld,
                    *p3 = p0 + (mc > 3) * 3 * ld;
        for (int64_t e0 = 0; e0 < d; e0 += 64) {
            __m512 acc[4][4];
            __mmask16 mk[4];
            for (int u = 0; u < 4; u++) {
                int64_t left = d - e0 - 16 * u;
                mk[u] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
                for (int i = 0; i < 4; i++) acc[i][u] = _mm512_setzero_ps();
            }
            for (int64_t j = t0; j < t1; j++) {
                const float *vr = v + j * d + e0;
                __m512 w0 = _mm512_set1_ps(p0[j]), w1 = _mm512_set1_ps(p1[j]), w2 = _mm512_set1_ps(p2[j]),
                       w3 = _mm512_set1_ps(p3[j]);
                for (int u = 0; u < 4; u++) {
                    __m512 x = _mm512_maskz_loadu_ps(mk[u], vr + 16 * u);
                    acc[0][u] = _mm512_fmadd_ps(w0, x, acc[0][u]);
                    acc[1][u] = _mm512_fmadd_ps(w1, x, acc[1][u]);
                    acc[2][u] = _mm512_fmadd_ps(w2, x, acc[2][u]);
                    acc[3][u] = _mm512_fmadd_ps(w3, x, acc[3][u]);
                }
            }
            for (int i = 0; i < mc; i++)
                for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(op[m0 + i] + e0 + 16 * u, mk[u], acc[i][u]);
        }
    }
#else
    for (int64_t m = 0; m < M; m++) {
        float *o = op[m];
        for (int64_t e = 0; e < d; e++) o[e] = 0;
        for (int64_t j = t0; j < t1; j++) {
            float w = pr[m * ld + j];
            const float *vr = v + j * d;
            _Pragma("omp simd")
            for (int64_t e = 0; e < d; e++) o[e] += w * vr[e];
        }
    }
#endif
}

/* pass 2, task (b, kv head, block of query rows) */
static void gq_attend(void *vc, int64_t t, int slot) {
    const gq_ctx *c = (const gq_ctx *)vc;
    const int64_t *p = c->p;
    int64_t nb = (p[GQ_S] + p[GQ_ROWS] - 1) / p[GQ_ROWS], blk = t % nb, bg = t / nb, b = bg / p[GQ_KV],
            g = bg % p[GQ_KV];
    int64_t r = p[GQ_N] / p[GQ_KV], d = p[GQ_D], L = p[GQ_L], s0 = blk * p[GQ_ROWS];
    int64_t ns = p[GQ_S] - s0 < p[GQ_ROWS] ? p[GQ_S] - s0 : p[GQ_ROWS], M = r * ns;
    int64_t past = c->past[b], total = c->total[b];
    float *qb = c->scratch + (int64_t)slot * c->slot_len, *sc = qb + p[GQ_ROWS] * r * d;
    float **op = (float **)(void *)(qb + (p[GQ_ROWS] * r * (d + L) + 1) / 2 * 2);
    const float *ck = c->ck + (b * p[GQ_KV] + g) * L * d, *cv = c->cv + (b * p[GQ_KV] + g) * L * d;
    int64_t tmin = L, tmax = 0;
    for (int64_t m = 0; m < M; m++) {  /* row m: head g * r + m / ns, new row s0 + m % ns */
        int64_t h = g * r + m / ns, s = s0 + m % ns;
        gq_rotate(c, c->q + b * p[GQ_QB] + h * p[GQ_QH] + s * p[GQ_QS], qb + m * d, gq_pos(c, b, s), c->scale);
        op[m] = c->o + b * p[GQ_OB] + h * p[GQ_OH] + s * p[GQ_OS];
        int64_t hi = p[GQ_CAUSAL] ? past + p[GQ_SK] - p[GQ_S] + s + 1 : total;
        hi = hi < total ? hi : total;
        int64_t lo = p[GQ_WINDOW] > 0 && hi > p[GQ_WINDOW] ? hi - p[GQ_WINDOW] : 0;
        tmin = lo < tmin ? lo : tmin;
        tmax = hi > tmax ? hi : tmax;
    }
    if (tmax > tmin) gq_scores(qb, M, d, ck, tmin, tmax, sc, L);
    for (int64_t m = 0; m < M; m++) {
        int64_t h = g * r + m / ns, s = s0 + m % ns;
        int64_t hi = p[GQ_CAUSAL] ? past + p[GQ_SK] - p[GQ_S] + s + 1 : total;
        hi = hi < total ? hi : total;
        int64_t lo = p[GQ_WINDOW] > 0 && hi > p[GQ_WINDOW] ? hi - p[GQ_WINDOW] : 0;
        if (hi <= lo) {  /* a padding row: no key to attend, zeros */
            for (int64_t j = tmin; j < tmax; j++) sc[m * L + j] = 0;
            continue;
        }
        const float *br = p[GQ_HASBIAS] ? c->bias + b * p[GQ_BB] + h * p[GQ_BH] + s * p[GQ_BS] : NULL;
        gq_softmax(sc + m * L, tmin, lo, hi, tmax, br, c->cap, p[GQ_SMOOTH]);
    }
    if (tmax > tmin)
        gq_pv(sc, M, L, cv, d, tmin, tmax, op);
    else
        for (int64_t m = 0; m < M; m++) memset(op[m], 0, (size_t)d * sizeof(float));
}

/* a 4-D float32 view of argument i with dims (d0, d1, d2, d3), strides >= 0 (the last 1 unless
   d3 is 1) lying inside the C-contiguous ndarray that holds its memory (the last ndarray along
   its base chain): its data, its strides in elements (st[0..2]) and its byte range [lo, hi) */
static const float *gq_view(PyObject *const *args, int i, int writable, int64_t d0, int64_t d1, int64_t d2,
                            int64_t d3, int64_t *st, uintptr_t *lo, uintptr_t *hi) {
    PyObject *o = args[i];
    if (!ge_ndarray || !PyObject_TypeCheck(o, ge_ndarray)) {
        PyErr_Format(PyExc_TypeError, "gqa argument %d: an ndarray is needed", i); return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)o;
    int fl = PyArray_FLAGS(a);
    const npy_intp *dims = PyArray_DIMS(a), *bs = PyArray_STRIDES(a);
    int64_t want[4] = {d0, d1, d2, d3}, span = 4;
    if (PyArray_TYPE(a) != NPY_FLOAT || PyArray_NDIM(a) != 4 || !(fl & NPY_ARRAY_ALIGNED)
        || (writable && !(fl & NPY_ARRAY_WRITEABLE))) {
        PyErr_Format(PyExc_TypeError, "gqa argument %d: a 4-D float32 array is needed", i); return NULL;
    }
    for (int k = 0; k < 4; k++) {
        int64_t x;
        if (dims[k] != want[k] || bs[k] < 0 || bs[k] % 4 || (k == 3 && want[3] > 1 && bs[3] != 4)
            || __builtin_mul_overflow((int64_t)(dims[k] - 1), (int64_t)bs[k], &x) || __builtin_add_overflow(span, x, &span)) {
            PyErr_Format(PyExc_ValueError, "gqa argument %d: wrong shape or strides", i); return NULL;
        }
        if (k < 3) st[k] = bs[k] / 4;
    }
    PyArrayObject *own = a;
    for (PyObject *b = PyArray_BASE(a); b && PyObject_TypeCheck(b, ge_ndarray); b = PyArray_BASE((PyArrayObject *)b))
        own = (PyArrayObject *)b;
    uintptr_t olo = (uintptr_t)PyArray_DATA(own), ohi = olo;
    if (!(PyArray_FLAGS(own) & NPY_ARRAY_C_CONTIGUOUS) || PyArray_NDIM(own) < 1) {
        PyErr_Format(PyExc_ValueError, "gqa argument %d: its memory is not a C-contiguous array", i); return NULL;
    }
    ohi += (uintptr_t)(PyArray_DIMS(own)[0] * PyArray_STRIDES(own)[0]);
    *lo = (uintptr_t)PyArray_DATA(a);
    *hi = *lo + (uintptr_t)span;
    if (*lo < olo || *hi > ohi || PyArray_STRIDES(own)[0] <= 0) {
        PyErr_Format(PyExc_ValueError, "gqa argument %d: the view lies outside its array", i); return NULL;
    }
    return (const float *)PyArray_DATA(a);
}

/* the checks of the sizes and per-row lengths the views do not cover (0, or -1) */
static int gq_check(const int64_t *p, int64_t lpk, int64_t lpv, int64_t lck, int64_t lcv, int64_t lcs,
                    const int64_t *past, const int64_t *total) {
    int64_t B = p[GQ_B], SK = p[GQ_SK], KV = p[GQ_KV], D = p[GQ_D], L = p[GQ_L], cache, pcache;
    if (p[GQ_N] % KV || (p[GQ_ROTARY] && (2 * p[GQ_RH] > D || ge_prod(p[GQ_MAXPOS], p[GQ_RH], 1, 1) > lcs))
        || (p[GQ_SHARE] && p[GQ_LP] != L) || p[GQ_ROWS] < 1) return -1;
    cache = ge_prod(B, KV, L, D);
    pcache = p[GQ_HASPAST] ? ge_prod(B, KV, p[GQ_LP], D) : 0;
    if (cache < 0 || pcache < 0 || lck < cache || lcv < cache || lpk < pcache || lpv < pcache) return -1;
    for (int64_t b = 0; b < B; b++) {
        int64_t pl = past[b], tl = total[b];
        if (pl < 0 || tl < 1 || tl > pl + SK || pl + SK > L || (pl > (p[GQ_HASPAST] ? p[GQ_LP] : 0) && !p[GQ_SHARE]))
            return -1;
        if (p[GQ_ROTARY] && (tl - 1 >= p[GQ_MAXPOS] || p[GQ_MAXPOS] < 2)) return -1;
    }
    return 0;
}

static int gq_apart(uintptr_t alo, uintptr_t ahi, uintptr_t blo, uintptr_t bhi) { return ahi <= blo || bhi <= alo; }

static PyObject *gqa_run(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t lpk, lpv, lck, lcv, lcs, lsn, np_, nt, ndims, nf, nscr;
    if (ge_nargs(n, 16)) return NULL;
    int64_t *p0 = (int64_t *)ge_vec(args, 13, NPY_INT64, 0, &ndims);
    const double *fl = (const double *)ge_vec(args, 14, NPY_DOUBLE, 0, &nf);
    if (!p0 || !fl) return NULL;
    if (ndims != GQ_NDIMS || nf != 2) { PyErr_SetString(PyExc_ValueError, "gqa: wrong parameter vectors"); return NULL; }
    gq_ctx c;
    memset(&c, 0, sizeof(c));
    int64_t *p = c.p;
    memcpy(p, p0, sizeof(c.p));
    for (int i = 0; i < GQ_NDIMS; i++)
        if (p[i] < 0 || p[i] > (1LL << 40) || ((i <= GQ_D || i == GQ_WIDTH || i == GQ_ROWS || i == GQ_SK) && p[i] < 1)) {
            PyErr_Format(PyExc_ValueError, "gqa: parameter %d is out of range", i); return NULL;
        }
    uintptr_t lo[5], hi[5];  /* q, k, v, out, bias */
    int64_t bst[3] = {0, 0, 0};
    c.q = gq_view(args, 0, 0, p[GQ_B], p[GQ_N], p[GQ_S], p[GQ_D], p + GQ_QB, lo, hi);
    c.k = c.q ? gq_view(args, 1, 0, p[GQ_B], p[GQ_KV], p[GQ_SK], p[GQ_D], p + GQ_KB, lo + 1, hi + 1) : NULL;
    c.v = c.k ? gq_view(args, 2, 0, p[GQ_B], p[GQ_KV], p[GQ_SK], p[GQ_D], p + GQ_VB, lo + 2, hi + 2) : NULL;
    c.o = c.v ? (float *)gq_view(args, 7, 1, p[GQ_B], p[GQ_N], p[GQ_S], p[GQ_D], p + GQ_OB, lo + 3, hi + 3) : NULL;
    if (!c.o) return NULL;
    lo[4] = hi[4] = 0;
    if (p[GQ_HASBIAS] && !(c.bias = gq_view(args, 10, 0, p[GQ_B], p[GQ_N], p[GQ_S], p[GQ_L], bst, lo + 4, hi + 4)))
        return NULL;
    /* (the views' strides are (b, h, s); the entries are (b, s, h)) */
    for (int w = 0; w < 4; w++) {
        int64_t *e = p + GQ_QB + 3 * w, h = e[1];
        e[1] = e[2];
        e[2] = h;
    }
    p[GQ_BB] = bst[0], p[GQ_BH] = bst[1], p[GQ_BS] = bst[2];
    c.pk = ge_vec(args, 3, NPY_FLOAT, 0, &lpk), c.pv = ge_vec(args, 4, NPY_FLOAT, 0, &lpv);
    c.ck = ge_vec(args, 5, NPY_FLOAT, 1, &lck), c.cv = ge_vec(args, 6, NPY_FLOAT, 1, &lcv);
    c.cs = ge_vec(args, 8, NPY_FLOAT, 0, &lcs), c.sn = ge_vec(args, 9, NPY_FLOAT, 0, &lsn);
    c.past = ge_vec(args, 11, NPY_INT64, 0, &np_), c.total = ge_vec(args, 12, NPY_INT64, 0, &nt);
    c.scratch = ge_vec(args, 15, NPY_FLOAT, 1, &nscr);
    if (!c.pk || !c.pv || !c.ck || !c.cv || !c.cs || !c.sn || !c.past || !c.total || !c.scratch) return NULL;
    if (np_ != p[GQ_B] || nt != p[GQ_B] || lcs != lsn) {
        PyErr_SetString(PyExc_ValueError, "gqa: per-row lengths or rotary caches disagree"); return NULL;
    }
    if (gq_check(p, lpk, lpv, lck, lcv, lcs, c.past, c.total)) return ge_fail();
    /* nothing written may overlap what is read (the share-buffer past is the present itself) */
    uintptr_t wk = (uintptr_t)c.ck, wv = (uintptr_t)c.cv, nk = (uintptr_t)(lck * 4), nv = (uintptr_t)(lcv * 4);
    for (int r = 0; r < 5; r++)
        if ((r != 3 && !gq_apart(lo[r], hi[r], lo[3], hi[3])) || !gq_apart(lo[r], hi[r], wk, wk + nk)
            || !gq_apart(lo[r], hi[r], wv, wv + nv)) {
            PyErr_SetString(PyExc_ValueError, "gqa: an output overlaps an input"); return NULL;
        }
    uintptr_t rk = (uintptr_t)c.pk, rv = (uintptr_t)c.pv, mk = (uintptr_t)(lpk * 4), mv = (uintptr_t)(lpv * 4);
    int bad = !gq_apart(wk, wk + nk, wv, wv + nv);
    if (p[GQ_SHARE])
        bad |= rk != wk || rv != wv;
    else if (p[GQ_HASPAST])
        bad |= !gq_apart(rk, rk + mk, wk, wk + nk) || !gq_apart(rk, rk + mk, wv, wv + nv)
               || !gq_apart(rv, rv + mv, wk, wk + nk) || !gq_apart(rv, rv + mv, wv, wv + nv);
    if (bad) { PyErr_SetString(PyExc_ValueError, "gqa: the caches overlap (or a shared one is not the past)"); return NULL; }
    c.scale = (float)fl[0], c.cap = (float)fl[1];
    c.p[GQ_ROWS] = p[GQ_ROWS] < p[GQ_S] ? p[GQ_ROWS] : p[GQ_S];
    /* a thread's slot: the block's query rows, its scores, its output row pointers (8-byte aligned) */
    int64_t m = ge_prod(c.p[GQ_ROWS], p[GQ_N] / p[GQ_KV], 1, 1), head = ge_prod(m, p[GQ_D] + p[GQ_L], 1, 1);
    c.slot_len = head < 0 ? -1 : (head + 1) / 2 * 2 + 2 * m;
    if (c.slot_len < 0 || ge_prod(c.slot_len, p[GQ_WIDTH], 1, 1) < 0 || nscr < c.slot_len * p[GQ_WIDTH]) return ge_fail();
    if (((uintptr_t)c.scratch) % 8) { PyErr_SetString(PyExc_ValueError, "gqa: scratch is not 8-byte aligned"); return NULL; }
    int64_t blocks = (p[GQ_S] + c.p[GQ_ROWS] - 1) / c.p[GQ_ROWS];
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(gq_store, &c, p[GQ_B] * p[GQ_KV], p[GQ_WIDTH]);
    ge_parallel(gq_attend, &c, p[GQ_B] * p[GQ_KV] * blocks, p[GQ_WIDTH]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *gqa_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return PyLong_FromLong(1);
}

/* the variant this module was compiled for (ge_native.gqa.isa) */
static PyObject *gqa_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
#if defined(__AVX512F__)
    return PyUnicode_FromString("avx512f");
#else
    return PyUnicode_FromString("portable");
#endif
}
