/* Instance normalization rows (ge_cpu's InstanceNormalization kernel): each (image, channel)
   row of x normalised over its elements, then scaled by the channel's gamma and shifted by its
   beta; rows are tasks of the native pool (blocks of at least 16K elements), the sums
   reassociated (vectorised). Fixed source. */
#include "prelude.h"
#define INSTNORM(NAME, T, NPY, SQRT)                                                                 \
typedef struct { const T *x, *g, *b; T *y; int64_t rows, cols, c, per; T eps; } NAME##_ctx;           \
static void NAME##_task(void *vc, int64_t blk, int slot) {                                            \
    NAME##_ctx *q = (NAME##_ctx *)vc;                                                                 \
    int64_t d = q->cols, end = (blk + 1) * q->per < q->rows ? (blk + 1) * q->per : q->rows;          \
    (void)slot;                                                                                       \
    for (int64_t i = blk * q->per; i < end; i++) {                                                    \
        const T *r = q->x + i * d; T *o = q->y + i * d;                                               \
        T s = 0, v = 0;                                                                               \
        _Pragma("omp simd reduction(+:s)")                                                            \
        for (int64_t k = 0; k < d; k++) s += r[k];                                                    \
        T m = s / (T)d;                                                                               \
        _Pragma("omp simd reduction(+:v)")                                                            \
        for (int64_t k = 0; k < d; k++) { T t = r[k] - m; v += t * t; }                               \
        T a = q->g[i % q->c] / SQRT(v / (T)d + q->eps), sh = q->b[i % q->c];                          \
        for (int64_t k = 0; k < d; k++) o[k] = (r[k] - m) * a + sh;                                   \
    }                                                                                                 \
}                                                                                                     \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \
    int64_t rows, cols, c, threads, nr, nc;                                                           \
    if (ge_nargs(n, 6)) return NULL;                                                                  \
    if (ge_int(args, 4, 0, 1LL << 40, &c) || ge_int(args, 5, 1, 4096, &threads)) return NULL;        \
    const T *x = (const T *)ge_mat(args, 0, NPY, 0, &rows, &cols);                                    \
    T *y = x ? (T *)ge_mat(args, 1, NPY, 1, &nr, &nc) : NULL;                                         \
    if (!y) return NULL;                                                                              \
    if (nr != rows || nc != cols || c < 1 || rows % c) return ge_fail();                              \
    double e = PyFloat_AsDouble(args[3]);                                                             \
    if (e == -1.0 && PyErr_Occurred()) return NULL;                                                   \
    const T *g = (const T *)ge_arr(args, 2, NPY, 0, 2 * c);                                           \
    if (!g) return NULL;                                                                              \
    if (rows == 0 || cols == 0) Py_RETURN_NONE;  /* an empty extent first (a row of 0: no mean) */    \
    NAME##_ctx q = {x, g, g + c, y, rows, cols, c, cols >= 16384 ? 1 : 16384 / cols, (T)e};           \
    if (rows * cols < 65536) threads = 1;                                                             \
    Py_BEGIN_ALLOW_THREADS                                                                            \
    ge_parallel(NAME##_task, &q, (rows + q.per - 1) / q.per, threads);                                \
    Py_END_ALLOW_THREADS                                                                              \
    Py_RETURN_NONE;                                                                                   \
}
INSTNORM(instnorm_f32, float, NPY_FLOAT, sqrtf)
INSTNORM(instnorm_f64, double, NPY_DOUBLE, sqrt)
