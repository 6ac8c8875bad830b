/* ge_cpu's Winograd F(2x2, 3x3) input and output transforms: see plugins/ge_cpu/kernels/winograd.py */
#include "prelude.h"
#define MAX_TW 1024
#define WINO(SUF, T, NPY)                                                                             \
typedef struct { const T *x; T *v; int64_t n, c, h, w, pt, pl, th, tw; } in_##SUF##_ctx;              \
static void in_##SUF##_task(void *vc, int64_t plane, int slot) {                                      \
    in_##SUF##_ctx *q = (in_##SUF##_ctx *)vc;                                                         \
    int64_t ni = plane / q->c, ci = plane % q->c, th = q->th, tw = q->tw, p = q->n * th * tw;        \
    int64_t wp = 2 * tw + 2;                                                                          \
    const T *xs = q->x + (ni * q->c + ci) * q->h * q->w;                                              \
    T row[4][2 * 1024 + 2];                                                                           \
    T hz[4][4][1024];                                                                                 \
    (void)slot;                                                                                       \
    for (int64_t ty = 0; ty < th; ty++) {                                                             \
        for (int r = 0; r < 4; r++) {                                                                 \
            int64_t yy = 2 * ty + r - q->pt;                                                          \
            T *dst = row[r];                                                                          \
            int64_t lo = yy >= 0 && yy < q->h ? (q->pl < wp ? q->pl : wp) : wp;                       \
            int64_t hi = lo < wp ? (q->pl + q->w < wp ? q->pl + q->w : wp) : wp;                      \
            for (int64_t k = 0; k < lo; k++) dst[k] = (T)0;                                           \
            if (hi > lo) {                                                                            \
                const T *src = xs + yy * q->w - q->pl;                                                \
                _Pragma("omp simd")                                                                   \
                for (int64_t k = lo; k < hi; k++) dst[k] = src[k];                                    \
            }                                                                                         \
            for (int64_t k = hi > lo ? hi : lo; k < wp; k++) dst[k] = (T)0;                           \
            const T *d = row[r];                                                                      \
            for (int64_t t = 0; t < tw; t++) {                                                        \
                T d0 = d[2 * t], d1 = d[2 * t + 1], d2 = d[2 * t + 2], d3 = d[2 * t + 3];              \
                hz[r][0][t] = d0 - d2; hz[r][1][t] = d1 + d2; hz[r][2][t] = d2 - d1; hz[r][3][t] = d1 - d3; \
            }                                                                                         \
        }                                                                                             \
        int64_t base = ni * th * tw + ty * tw;                                                        \
        for (int j = 0; j < 4; j++) {                                                                 \
            T *v0 = q->v + ((0 * 4 + j) * q->c + ci) * p + base;                                      \
            T *v1 = q->v + ((1 * 4 + j) * q->c + ci) * p + base;                                      \
            T *v2 = q->v + ((2 * 4 + j) * q->c + ci) * p + base;                                      \
            T *v3 = q->v + ((3 * 4 + j) * q->c + ci) * p + base;                                      \
            _Pragma("omp simd")                                                                       \
            for (int64_t t = 0; t < tw; t++) {                                                        \
                T a = hz[0][j][t], b = hz[1][j][t], e = hz[2][j][t], f = hz[3][j][t];                  \
                v0[t] = a - e; v1[t] = b + e; v2[t] = e - b; v3[t] = b - f;                           \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
}                                                                                                     \
typedef struct { const T *mm, *bias; T *y; int64_t n, m, oh, ow, th, tw; } out_##SUF##_ctx;          \
static void out_##SUF##_task(void *vc, int64_t plane, int slot) {                                     \
    out_##SUF##_ctx *q = (out_##SUF##_ctx *)vc;                                                       \
    int64_t ni = plane / q->m, mi = plane % q->m, th = q->th, tw = q->tw, p = q->n * th * tw;        \
    T *ys = q->y + (ni * q->m + mi) * q->oh * q->ow;                                                  \
    T bias = q->bias ? q->bias[mi] : (T)0;                                                            \
    T s[2][4][1024];                                                                                  \
    (void)slot;                                                                                       \
    for (int64_t ty = 0; ty < th; ty++) {                                                             \
        int64_t base = ni * th * tw + ty * tw;                                                        \
        for (int j = 0; j < 4; j++) {                                                                 \
            const T *m0 = q->mm + ((0 * 4 + j) * q->m + mi) * p + base;                               \
            const T *m1 = q->mm + ((1 * 4 + j) * q->m + mi) * p + base;                               \
            const T *m2 = q->mm + ((2 * 4 + j) * q->m + mi) * p + base;                               \
            const T *m3 = q->mm + ((3 * 4 + j) * q->m + mi) * p + base;                               \
            _Pragma("omp simd")                                                                       \
            for (int64_t t = 0; t < tw; t++) {                                                        \
                s[0][j][t] = m0[t] + m1[t] + m2[t];                                                   \
                s[1][j][t] = m1[t] - m2[t] - m3[t];                                                   \
            }                                                                                         \
        }                                                                                             \
        for (int a = 0; a < 2; a++) {                                                                 \
            int64_t yy = 2 * ty + a;                                                                  \
            if (yy >= q->oh) break;                                                                   \
            T *o = ys + yy * q->ow;                                                                   \
            int64_t pairs = q->ow / 2;                                                                \
            _Pragma("omp simd")                                                                       \
            for (int64_t t = 0; t < pairs; t++) {                                                     \
                o[2 * t] = s[a][0][t] + s[a][1][t] + s[a][2][t] + bias;                               \
                o[2 * t + 1] = s[a][1][t] - s[a][2][t] - s[a][3][t] + bias;                           \
            }                                                                                         \
            if (q->ow % 2) o[2 * pairs] = s[a][0][pairs] + s[a][1][pairs] + s[a][2][pairs] + bias;    \
        }                                                                                             \
    }                                                                                                 \
}                                                                                                     \
static PyObject *in_##SUF(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {                  \
    int64_t n, c, h, w, pt, pl, th, tw, threads;                                                      \
    if (ge_nargs(nargs, 11)) return NULL;                                                             \
    if (ge_int(args, 2, 0, 1LL << 20, &n) || ge_int(args, 3, 0, 1LL << 20, &c)                        \
        || ge_int(args, 4, 0, 1LL << 20, &h) || ge_int(args, 5, 0, 1LL << 20, &w)                     \
        || ge_int(args, 6, 0, 1LL << 20, &pt) || ge_int(args, 7, 0, 1LL << 20, &pl)                   \
        || ge_int(args, 8, 0, 1LL << 20, &th) || ge_int(args, 9, 0, MAX_TW, &tw)                        \
        || ge_int(args, 10, 1, 4096, &threads)) return NULL;                                          \
    /* (sizes as checked products: four factors up to 2^20 overflow int64) */                        \
    const T *x = (const T *)ge_arr(args, 0, NPY, 0, ge_prod(n, c, h, w));                             \
    T *v = x ? (T *)ge_arr(args, 1, NPY, 1, ge_prod(16 * c, n, th, tw)) : NULL;                       \
    if (!v) return NULL;                                                                              \
    if (n == 0 || c == 0 || th == 0 || tw == 0) Py_RETURN_NONE;  /* an empty extent: no tile */       \
    in_##SUF##_ctx q = {x, v, n, c, h, w, pt, pl, th, tw};                                            \
    Py_BEGIN_ALLOW_THREADS                                                                            \
    ge_parallel(in_##SUF##_task, &q, n * c, threads);                                                 \
    Py_END_ALLOW_THREADS                                                                              \
    Py_RETURN_NONE;                                                                                   \
}                                                                                                     \
static PyObject *out_##SUF(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {                 \
    int64_t n, m, oh, ow, threads, th, tw;                                                            \
    if (ge_nargs(nargs, 8)) return NULL;                                                              \
    if (ge_int(args, 3, 0, 1LL << 20, &n) || ge_int(args, 4, 0, 1LL << 20, &m)                        \
        || ge_int(args, 5, 0, 1LL << 20, &oh) || ge_int(args, 6, 0, 2 * MAX_TW, &ow)                        \
        || ge_int(args, 7, 1, 4096, &threads)) return NULL;                                           \
    th = (oh + 1) / 2; tw = (ow + 1) / 2;                                                             \
    if (tw > MAX_TW) return ge_fail();                                                                  \
    const T *mm = (const T *)ge_arr(args, 0, NPY, 0, ge_prod(16 * m, n, th, tw));                     \
    T *y = mm ? (T *)ge_arr(args, 1, NPY, 1, ge_prod(n, m, oh, ow)) : NULL;                           \
    if (!y) return NULL;                                                                              \
    if (n == 0 || m == 0 || oh == 0 || ow == 0) Py_RETURN_NONE;  /* an empty extent: no output */     \
    const T *bias = NULL;                                                                             \
    if (args[2] != Py_None) { bias = (const T *)ge_arr(args, 2, NPY, 0, m); if (!bias) return NULL; } \
    out_##SUF##_ctx q = {mm, bias, y, n, m, oh, ow, th, tw};                                          \
    Py_BEGIN_ALLOW_THREADS                                                                            \
    ge_parallel(out_##SUF##_task, &q, n * m, threads);                                                \
    Py_END_ALLOW_THREADS                                                                              \
    Py_RETURN_NONE;                                                                                   \
}
WINO(f32, float, NPY_FLOAT)
WINO(f64, double, NPY_DOUBLE)

/* wino_isa(): the instruction set this module was compiled for (ge_native.isa's variant names) */
static PyObject *wino_isa(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (ge_nargs(nargs, 0)) return NULL;
#if defined(__AVX512F__)
    return PyUnicode_FromString("avx512f");
#elif defined(__AVX2__) && defined(__FMA__)
    return PyUnicode_FromString("avx2");
#else
    return PyUnicode_FromString("scalar");
#endif
}
