#include "prelude.h"
#include "blas.h"
/* the bias row b (w values) added to each of `rows` rows of o (row pitch ldc) */
#define ADD_BIAS(T, o, ldc, rows, w, b)                                                               \
    for (int64_t r_ = 0; r_ < (rows); r_++) {                                                         \
        T *row_ = (o) + r_ * (ldc);                                                                   \
        for (int64_t j_ = 0; j_ < (w); j_++) row_[j_] += (b)[j_];                                     \
    }

#define BLOCKS(NAME, T, GEMM_T, NPY)                                                                  \
typedef struct {                                                                                      \
    GEMM_T f; int64_t m, k, ldc, has_bias; const T *a; T *out; const T *bias;                        \
    const int64_t *ptrs, *ldbs, *widths, *cols;                                                       \
} NAME##_ctx;                                                                                         \
static void NAME##_task(void *vc, int64_t i, int slot) {                                              \
    NAME##_ctx *q = (NAME##_ctx *)vc;                                                                 \
    int64_t c = q->cols[i], w = q->widths[i];                                                         \
    T *o = q->out + c;                                                                                \
    (void)slot;                                                                                       \
    if (q->m == 0 || w == 0) return;  /* an empty extent: nothing (BLAS refuses a leading dim of 0) */ \
    if (q->k == 0) {  /* no products: zeros */                                                        \
        for (int64_t r_ = 0; r_ < q->m; r_++) memset(o + r_ * q->ldc, 0, (size_t)w * sizeof(T));     \
    } else {                                                                                          \
        q->f(101, 111, 111, q->m, w, q->k, 1, q->a, q->k, (const T *)(intptr_t)q->ptrs[i], q->ldbs[i], 0, o, q->ldc); \
    }                                                                                                 \
    if (q->has_bias) ADD_BIAS(T, o, q->ldc, q->m, w, q->bias + c);                                    \
}                                                                                                     \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \
    int64_t fn, m, k, ka, mc, ldc, has_bias, width, count, c1, c2, c3;                               \
    if (ge_nargs(n, 11)) return NULL;                                                                 \
    if (ge_int(args, 0, 1, INT64_MAX, &fn) || ge_int(args, 2, 0, 1LL << 40, &k)                      \
        || ge_int(args, 9, 0, 1, &has_bias) || ge_int(args, 10, 1, 4096, &width)) return NULL;        \
    const T *a = (const T *)ge_mat(args, 1, NPY, 0, &m, &ka);                                         \
    T *out = a ? (T *)ge_mat(args, 7, NPY, 1, &mc, &ldc) : NULL;                                      \
    if (!out) return NULL;                                                                            \
    if (ka != k || mc != m) return ge_fail();                                                         \
    const int64_t *ptrs = (const int64_t *)ge_vec(args, 3, NPY_INT64, 0, &count);                    \
    const int64_t *ldbs = (const int64_t *)ge_vec(args, 4, NPY_INT64, 0, &c1);                       \
    const int64_t *widths = (const int64_t *)ge_vec(args, 5, NPY_INT64, 0, &c2);                     \
    const int64_t *cols = (const int64_t *)ge_vec(args, 6, NPY_INT64, 0, &c3);                       \
    if (!ptrs || !ldbs || !widths || !cols) return NULL;                                              \
    if (c1 < count || c2 < count || c3 < count) return ge_fail();                                     \
    for (int64_t i = 0; i < count; i++)                                                               \
        if (cols[i] < 0 || widths[i] < 0 || cols[i] + widths[i] > ldc                                 \
            || (widths[i] > 0 && ldbs[i] < widths[i])) return ge_fail();                               \
    const T *bias = (const T *)ge_arr(args, 8, NPY, 0, has_bias ? ldc : 0);                           \
    if (!bias) return NULL;                                                                           \
    NAME##_ctx q = {(GEMM_T)(intptr_t)fn, m, k, ldc, has_bias, a, out, bias, ptrs, ldbs, widths, cols};  \
    Py_BEGIN_ALLOW_THREADS                                                                            \
    ge_parallel(NAME##_task, &q, count, width);                                                       \
    Py_END_ALLOW_THREADS                                                                              \
    Py_RETURN_NONE;                                                                                   \
}

BLOCKS(blocks_f32, float, gemm_f32_t, NPY_FLOAT)
BLOCKS(blocks_f64, double, gemm_f64_t, NPY_DOUBLE)

/* one task per row range: C[r:r+c, :] = A[r:r+c, :] @ B (+ bias); the arguments are (gemm
   address, A, B, C, bias, has_bias, starts, counts, threads) with A (m, k), B (k, n) and C (m, n)
   C-contiguous 2-D arrays, checked here */
#define ROWS(NAME, T, GEMM_T, NPY)                                                                    \
typedef struct {                                                                                      \
    GEMM_T f; int64_t k, nn, has_bias; const T *a, *b; T *out; const T *bias;                         \
    const int64_t *starts, *counts;                                                                   \
} NAME##_ctx;                                                                                         \
static void NAME##_task(void *vc, int64_t i, int slot) {                                              \
    NAME##_ctx *q = (NAME##_ctx *)vc;                                                                 \
    int64_t r = q->starts[i], c = q->counts[i];                                                       \
    T *o = q->out + r * q->nn;                                                                        \
    (void)slot;                                                                                       \
    if (c == 0 || q->nn == 0) return;  /* an empty extent: nothing (BLAS refuses a leading dim of 0) */ \
    if (q->k == 0) memset(o, 0, (size_t)(c * q->nn) * sizeof(T));  /* no products: zeros */          \
    else q->f(101, 111, 111, c, q->nn, q->k, 1, q->a + r * q->k, q->k, q->b, q->nn, 0, o, q->nn);      \
    if (q->has_bias) ADD_BIAS(T, o, q->nn, c, q->nn, q->bias);                                        \
}                                                                                                     \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \
    int64_t fn, m, k, kb, nn, mc, nc, has_bias, width, count, c1;                                     \
    if (ge_nargs(n, 9)) return NULL;                                                                  \
    if (ge_int(args, 0, 1, INT64_MAX, &fn) || ge_int(args, 5, 0, 1, &has_bias)                       \
        || ge_int(args, 8, 1, 4096, &width)) return NULL;                                             \
    const T *a = (const T *)ge_mat(args, 1, NPY, 0, &m, &k);                                          \
    const T *b = a ? (const T *)ge_mat(args, 2, NPY, 0, &kb, &nn) : NULL;                             \
    T *out = b ? (T *)ge_mat(args, 3, NPY, 1, &mc, &nc) : NULL;                                       \
    if (!out) return NULL;                                                                            \
    if (kb != k || mc != m || nc != nn) return ge_fail();                                             \
    const int64_t *starts = (const int64_t *)ge_vec(args, 6, NPY_INT64, 0, &count);                  \
    const int64_t *counts = (const int64_t *)ge_vec(args, 7, NPY_INT64, 0, &c1);                     \
    if (!starts || !counts) return NULL;                                                              \
    if (c1 < count) return ge_fail();                                                                 \
    for (int64_t i = 0; i < count; i++)                                                               \
        if (starts[i] < 0 || counts[i] < 0 || starts[i] + counts[i] > m) return ge_fail();            \
    const T *bias = (const T *)ge_arr(args, 4, NPY, 0, has_bias ? nn : 0);                            \
    if (!bias) return NULL;                                                                           \
    NAME##_ctx q = {(GEMM_T)(intptr_t)fn, k, nn, has_bias, a, b, out, bias, starts, counts};          \
    Py_BEGIN_ALLOW_THREADS                                                                            \
    ge_parallel(NAME##_task, &q, count, width);                                                       \
    Py_END_ALLOW_THREADS                                                                              \
    Py_RETURN_NONE;                                                                                   \
}

ROWS(rows_f32, float, gemm_f32_t, NPY_FLOAT)
ROWS(rows_f64, double, gemm_f64_t, NPY_DOUBLE)

/* one task per batch entry: C[i] = A[i] @ B[i]; the arguments are (gemm address, A, B, C,
   threads) with A (batch, m, k), B (batch, k, n) and C (batch, m, n) C-contiguous 3-D arrays,
   checked here */
#define BATCH(NAME, T, GEMM_T, NPY)                                                                   \
typedef struct { GEMM_T f; int64_t m, k, n; const T *a, *b; T *c; } NAME##_ctx;                       \
static void NAME##_task(void *vc, int64_t i, int slot) {                                              \
    NAME##_ctx *q = (NAME##_ctx *)vc;                                                                 \
    (void)slot;                                                                                       \
    if (q->m == 0 || q->n == 0) return;  /* an empty extent: nothing (BLAS refuses a leading dim of 0) */ \
    if (q->k == 0) { memset(q->c + i * q->m * q->n, 0, (size_t)(q->m * q->n) * sizeof(T)); return; }  \
    q->f(101, 111, 111, q->m, q->n, q->k, 1, q->a + i * q->m * q->k, q->k, q->b + i * q->k * q->n, q->n, \
         0, q->c + i * q->m * q->n, q->n);                                                            \
}                                                                                                     \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \
    int64_t fn, width, da[3], db[3], dc[3];                                                           \
    if (ge_nargs(n, 5)) return NULL;                                                                  \
    if (ge_int(args, 0, 1, INT64_MAX, &fn) || ge_int(args, 4, 1, 4096, &width)) return NULL;          \
    const T *a = (const T *)ge_nd(args, 1, NPY, 0, 3, da);                                            \
    const T *b = a ? (const T *)ge_nd(args, 2, NPY, 0, 3, db) : NULL;                                 \
    T *c = b ? (T *)ge_nd(args, 3, NPY, 1, 3, dc) : NULL;                                             \
    if (!c) return NULL;                                                                              \
    if (db[0] != da[0] || dc[0] != da[0] || db[1] != da[2] || dc[1] != da[1] || dc[2] != db[2])      \
        return ge_fail();                                                                             \
    NAME##_ctx q = {(GEMM_T)(intptr_t)fn, da[1], da[2], db[2], a, b, c};                              \
    Py_BEGIN_ALLOW_THREADS                                                                            \
    ge_parallel(NAME##_task, &q, da[0], width);                                                       \
    Py_END_ALLOW_THREADS                                                                              \
    Py_RETURN_NONE;                                                                                   \
}

BATCH(batch_f32, float, gemm_f32_t, NPY_FLOAT)
BATCH(batch_f64, double, gemm_f64_t, NPY_DOUBLE)
