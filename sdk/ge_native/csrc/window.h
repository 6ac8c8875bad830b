/* The fixed part of ge_cpu's sliding-window loops (plugins/ge_cpu/kernels/_window.py: depthwise
   convolution, max and average pooling over NCHW planes). Included by window_f32.h or
   window_f64.h, after the scalar type S, NPY_S, FMA, EPI and EPI_PLANE.

   A module is this header plus a short generated part: `win_compute`, the compute step of one
   output plane for one kind and tap count (the taps unrolled; or a call of the tap-by-tap loops
   below above MAX_UNROLL taps), and `kernel`, which calls win_entry with the kind and the tap
   count. Each plane (image, channel) is
     1. copied into the thread's bordered buffer (rows[i]: where input row i starts in it),
     2. computed as one flat run tmp[j] = f(buf[offs[0] + j], ..., buf[offs[T-1] + j]), j < L,
     3. copied out: out[oh, ow] = tmp[oh * Wp + ow * sw] (divided by the window count dv for an
        average pool; a convolution's epilogue then clips and applies its activation).
   win_entry checks every offset against the arrays it is given before a loop reads or writes. */
#include "prelude.h"

enum { WIN_CONV = 0, WIN_MAX = 1, WIN_AVG = 2 };  /* the kinds, in _window.KINDS order */
#define WIN_GROUP 8                                /* taps per pass of the tap-by-tap convolution */
#define WIN_AI static inline __attribute__((always_inline))

typedef struct {
    const S *x; const S *wt; const S *b; const S *dv; S *out; const int64_t *rows; const int64_t *offs;
    S *buf; S *tmp; int64_t N, C, H, W, OH, OW, Wp, sw, mult, M, T, nbuf, L, per, act, kind; S lo, hi;
} win_ctx;

/* the compute step, generated per kind and tap count (defined after this header): tmp[0 .. L) of
   output channel m from the thread's buffer; `nan`: the plane holds a NaN (max pools only) */
WIN_AI void win_compute(const win_ctx *q, const S *buf, S *tmp, int64_t m, int nan);

/* the tap-by-tap forms, for any tap count T. The convolution takes the taps in groups of
   WIN_GROUP per pass over tmp: eight rows and weights stay in registers, and a small plane makes
   T / WIN_GROUP passes instead of T; each output is one chain of multiply-adds in tap order from
   the bias, as in the unrolled loops */
WIN_AI void win_conv_taps(const win_ctx *q, const S *buf, S *tmp, int64_t m) {
    const S *wt = q->wt;
    const int64_t *offs = q->offs;
    int64_t T = q->T, L = q->L;
    for (int64_t j = 0; j < L; j++) tmp[j] = q->b[m];
    int64_t t = 0;
    for (; t + WIN_GROUP <= T; t += WIN_GROUP) {
        const S *s0 = buf + offs[t + 0], *s1 = buf + offs[t + 1], *s2 = buf + offs[t + 2], *s3 = buf + offs[t + 3];
        const S *s4 = buf + offs[t + 4], *s5 = buf + offs[t + 5], *s6 = buf + offs[t + 6], *s7 = buf + offs[t + 7];
        const S w0 = wt[m * T + t + 0], w1 = wt[m * T + t + 1], w2 = wt[m * T + t + 2], w3 = wt[m * T + t + 3];
        const S w4 = wt[m * T + t + 4], w5 = wt[m * T + t + 5], w6 = wt[m * T + t + 6], w7 = wt[m * T + t + 7];
        for (int64_t j = 0; j < L; j++)
            tmp[j] = FMA(w7, s7[j], FMA(w6, s6[j], FMA(w5, s5[j], FMA(w4, s4[j], FMA(w3, s3[j],
                     FMA(w2, s2[j], FMA(w1, s1[j], FMA(w0, s0[j], tmp[j]))))))));
    }
    for (; t < T; t++) {  /* the taps left over */
        const S *st = buf + offs[t];
        const S wv = wt[m * T + t];
        for (int64_t j = 0; j < L; j++) tmp[j] = FMA(wv, st[j], tmp[j]);
    }
}

WIN_AI void win_avg_taps(const win_ctx *q, const S *buf, S *tmp) {
    const int64_t *offs = q->offs;
    int64_t T = q->T, L = q->L;
    for (int64_t j = 0; j < L; j++) tmp[j] = 0;
    for (int64_t t = 0; t < T; t++) {
        const S *st = buf + offs[t];
        for (int64_t j = 0; j < L; j++) tmp[j] += st[j];
    }
}

/* NumPy's maximum: a NaN in the window is the result */
WIN_AI void win_max_taps(const win_ctx *q, const S *buf, S *tmp) {
    const int64_t *offs = q->offs;
    int64_t T = q->T, L = q->L;
    for (int64_t j = 0; j < L; j++) tmp[j] = buf[offs[0] + j];
    for (int64_t t = 1; t < T; t++) {
        const S *st = buf + offs[t];
        for (int64_t j = 0; j < L; j++) {
            S v = tmp[j];
            S e = st[j];
            tmp[j] = (v >= e || v != v) ? v : e;
        }
    }
}

/* step 1: the plane's rows into the buffer (its borders stay as made: zero, or -inf for max) */
WIN_AI void win_copy_in(const S *xp, S *buf, const int64_t *rows, int64_t H, int64_t W) {
    for (int64_t i = 0; i < H; i++) {
        S *d = buf + rows[i];
        const S *xr = xp + i * W;
        for (int64_t k = 0; k < W; k++) d[k] = xr[k];
    }
}

/* the same for a max pool, which also says whether the plane holds a NaN (that test costs more
   than the max itself, so NumPy's NaN rule only runs on planes that hold one) */
WIN_AI int win_copy_in_nan(const S *xp, S *buf, const int64_t *rows, int64_t H, int64_t W) {
    int nan = 0;
    for (int64_t i = 0; i < H; i++) {
        S *d = buf + rows[i];
        const S *xr = xp + i * W;
        for (int64_t k = 0; k < W; k++) {
            S e = xr[k];
            d[k] = e;
            nan |= e != e;
        }
    }
    return nan;
}

/* step 3: the output plane of (image n, channel m) from tmp, and a convolution's epilogue on it
   while it is in cache (its pixels only) */
WIN_AI void win_copy_out(const win_ctx *q, const S *tmp, int64_t n, int64_t m) {
    int64_t OH = q->OH, OW = q->OW, Wp = q->Wp, sw = q->sw;
    S *o = q->out + (n * q->M + m) * OH * OW;
    if (q->kind == WIN_AVG) {
        const S *dv = q->dv;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) o[oh * OW + ow] = tmp[oh * Wp + ow * sw] / dv[oh * OW + ow];
    } else {
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) o[oh * OW + ow] = tmp[oh * Wp + ow * sw];
    }
    if (q->kind == WIN_CONV && (q->act != 0 || q->lo > -INFINITY || q->hi < INFINITY))
        EPI_PLANE(o, OH * OW, q->act, q->lo, q->hi);
}

/* the planes p0 .. p1 of task i on pool thread `slot`, each with its own rows of buf and tmp */
static void win_task(void *vc, int64_t i, int slot) {
    const win_ctx *q = (const win_ctx *)vc;
    int64_t C = q->C, H = q->H, W = q->W, mult = q->mult;
    S *buf = q->buf + slot * q->nbuf;
    S *tmp = q->tmp + slot * q->L;
    int64_t p0 = i * q->per, p1 = p0 + q->per < q->N * C ? p0 + q->per : q->N * C;
    for (int64_t pc = p0; pc < p1; pc++) {
        int64_t n = pc / C, c = pc % C;
        const S *xp = q->x + (n * C + c) * H * W;
        int nan = 0;
        if (q->kind == WIN_MAX) nan = win_copy_in_nan(xp, buf, q->rows, H, W);
        else win_copy_in(xp, buf, q->rows, H, W);
        for (int64_t k = 0; k < mult; k++) {
            int64_t m = c * mult + k;
            win_compute(q, buf, tmp, m, nan);
            win_copy_out(q, tmp, n, m);
        }
    }
}

/* kernel(N, C, H, W, OH, OW, Wp, sw, mult, x, wt, b, dv, out, rows, offs, buf, tmp, threads, act,
   lo, hi) of a loop of `kind` over `taps` taps (0: any count, the tap-by-tap form). wt: (M, T)
   weights, b: (M,) bias of a convolution (M = C * mult); dv: (OH * OW,) window counts of an
   average pool; buf and tmp: one plane's buffer rows and flat run per thread */
static PyObject *win_entry(PyObject *const *args, Py_ssize_t n, int64_t kind, int64_t taps) {
    int64_t N, C, H, W, OH, OW, Wp, sw, mult, nr, no, nbuf, L, threads, act;
    if (ge_nargs(n, 22)) return NULL;
    if (ge_int(args, 0, 0, 1LL << 40, &N) || ge_int(args, 1, 0, 1LL << 40, &C) ||
        ge_int(args, 2, 0, 1LL << 40, &H) || ge_int(args, 3, 0, 1LL << 40, &W)) return NULL;
    if (ge_int(args, 4, 0, 1LL << 40, &OH) || ge_int(args, 5, 0, 1LL << 40, &OW) ||
        ge_int(args, 6, 0, 1LL << 40, &Wp) || ge_int(args, 7, 1, 1LL << 40, &sw) ||
        ge_int(args, 8, 1, 1LL << 20, &mult)) return NULL;
    if (ge_int(args, 18, 1, 4096, &threads) || ge_int(args, 19, 0, 5, &act)) return NULL;
    double lov = PyFloat_AsDouble(args[20]), hiv = PyFloat_AsDouble(args[21]);
    if (PyErr_Occurred()) return NULL;
    int64_t M = C * mult;
    const S *x = (const S *)ge_arr(args, 9, NPY_S, 0, ge_prod(N, C, H, W));
    const int64_t *rows = (const int64_t *)ge_vec(args, 14, NPY_INT64, 0, &nr);
    const int64_t *offs = (const int64_t *)ge_vec(args, 15, NPY_INT64, 0, &no);
    S *buf = (S *)ge_vec(args, 16, NPY_S, 1, &nbuf);
    S *tmp = (S *)ge_vec(args, 17, NPY_S, 1, &L);
    if (!x || !rows || !offs || !buf || !tmp) return NULL;
    int64_t T = no;
    const S *wt = (const S *)ge_arr(args, 10, NPY_S, 0, kind == WIN_CONV ? ge_prod(M, T, 1, 1) : 0);
    const S *b = (const S *)ge_arr(args, 11, NPY_S, 0, kind == WIN_CONV ? M : 0);
    const S *dv = (const S *)ge_arr(args, 12, NPY_S, 0, kind == WIN_AVG ? ge_prod(OH, OW, 1, 1) : 0);
    S *out = (S *)ge_arr(args, 13, NPY_S, 1, ge_prod(N, M, OH, OW));
    if (!wt || !b || !dv || !out) return NULL;
    /* buf and tmp hold one plane's rows per thread */
    int bad = nbuf % threads || L % threads;
    nbuf = nbuf / threads;
    L = L / threads;
    /* every read and write of the loops stays inside its array (checked, not assumed) */
    bad = bad || nr < H || T < 1 || (OH > 0 && OW > 0 && L < ge_span(OH, OW, 1, Wp, sw, 0));
    bad = bad || (taps > 0 && T != taps);
    for (int64_t t = 0; t < T && !bad; t++) bad = offs[t] < 0 || offs[t] > nbuf - L;
    for (int64_t i = 0; i < H && !bad; i++) bad = rows[i] < 0 || rows[i] > nbuf - W;
    if (bad) return ge_fail();
    int64_t nt = N * C < 4 * threads ? N * C : 4 * threads;
    int64_t per = nt > 0 ? (N * C + nt - 1) / nt : 1;
    nt = per > 0 ? (N * C + per - 1) / per : 0;
    win_ctx q = {x, wt, b, dv, out, rows, offs, buf, tmp, N, C, H, W, OH, OW, Wp, sw, mult, M, T, nbuf, L, per, act,
                 kind, (S)lov, (S)hiv};
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(win_task, &q, nt, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* win_isa(): the instruction set this module was compiled for (ge_native.isa's variant names) */
static PyObject *win_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    (void)self;
    if (ge_nargs(n, 0)) return NULL;
#if defined(__AVX512F__)
    return PyUnicode_FromString("avx512f");
#elif defined(__AVX2__) && defined(__FMA__)
    return PyUnicode_FromString("avx2");
#else
    return PyUnicode_FromString("scalar");
#endif
}
