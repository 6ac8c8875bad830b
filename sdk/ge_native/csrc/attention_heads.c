#include "prelude.h"
#include "blas.h"
#include "activations16.h"
/* The fused Attention kernel's parallel form (ge_cpu.fused.attention): one task per (batch, head)
   on the native pool. Built after ge_native.gemm.blas_decls() (NumPy's BLAS integer type). */

/* one row of scores: + the mask's row (mk, or NULL), then softmax in place: the max, exp of the
   differences (0 below -87.3: a masked score weighs exactly zero, never a denormal), their sum,
   the scaling; a NaN anywhere makes the row NaN (NaN - max, or max NaN, is NaN), as in NumPy */
static inline void hd_row64(double *row, const double *mk, int64_t nn) {
    if (mk)
        for (int64_t j = 0; j < nn; j++) row[j] += mk[j];
    double mx = row[0];
    for (int64_t j = 0; j < nn; j++) mx = row[j] > mx ? row[j] : mx;
    for (int64_t j = 0; j < nn; j++) row[j] = exp(row[j] - mx);
    double sum = 0;
    for (int64_t j = 0; j < nn; j++) sum += row[j];
    double inv = 1.0 / sum;
    for (int64_t j = 0; j < nn; j++) row[j] *= inv;
}

#if defined(__AVX512F__)
/* hd_row64's steps on 16 lanes (ge_native.sgemm.ACTIVATION_C16's softmax row: the mask added as the
   row is read, expneg32's exact zero below -87.3) */
static inline void hd_row32(float *row, const float *mk, int64_t nn) {
    sg_softmax_row16(row, mk, row, nn, 1.0f);
}
#else
static inline void hd_row32(float *row, const float *mk, int64_t nn) {
    if (mk)
        for (int64_t j = 0; j < nn; j++) row[j] += mk[j];
    float mx = row[0];
    _Pragma("omp simd reduction(max:mx)")
    for (int64_t j = 0; j < nn; j++) mx = row[j] > mx ? row[j] : mx;
    for (int64_t j = 0; j < nn; j++) row[j] = expneg32(row[j] - mx);
    float sum = 0;
    _Pragma("omp simd reduction(+:sum)")
    for (int64_t j = 0; j < nn; j++) sum += row[j];
    float inv = 1.0f / sum;
    for (int64_t j = 0; j < nn; j++) row[j] *= inv;
}
#endif

#define HEADS(NAME, T, GEMM_T, NPY, ROW)                                                               \
typedef struct {                                                                                      \
    GEMM_T f; int64_t m, nn, d, dv, qld, qtr, kld, ktr, vld, vtr, old, mrs, has_mask; T alpha;        \
    const T *q, *k, *v; T *o; const int64_t *qo, *ko, *vo, *oo, *mo; const T *mask; T *scratch;       \
    int64_t rb;                                                                                       \
} NAME##_ctx;                                                                                         \
/* task t: head t / rb, its query rows' block t % rb */                                             \
static void NAME##_task(void *vc, int64_t t, int slot) {                                              \
    NAME##_ctx *c = (NAME##_ctx *)vc;                                                                 \
    int64_t i = t / c->rb, b = t % c->rb, step = (c->m + c->rb - 1) / c->rb, r0 = b * step;           \
    int64_t m = c->m - r0 < step ? c->m - r0 : step, nn = c->nn;                                      \
    if (m <= 0) return;                                                                               \
    T *s = c->scratch + (int64_t)slot * step * nn;  /* one scores block per thread, task after task */ \
    const T *qr = c->q + c->qo[i] + (c->qtr == 111 ? r0 * c->qld : r0);                               \
    c->f(101, c->qtr, c->ktr, m, nn, c->d, c->alpha, qr, c->qld, c->k + c->ko[i], c->kld,             \
         0, s, nn);                                                                                   \
    for (int64_t r = 0; r < m; r++)                                                                   \
        ROW(s + r * nn, c->has_mask ? c->mask + c->mo[i] + (r0 + r) * c->mrs : NULL, nn);             \
    c->f(101, 111, c->vtr, m, c->dv, nn, 1, s, nn, c->v + c->vo[i], c->vld, 0, c->o + c->oo[i] + r0 * c->old, \
         c->old);                                                                                     \
}                                                                                                     \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \
    int64_t fn, count, m, nn, d, dv, qa, qld, qtr, ka, kld, ktr, va, vld, vtr, oa, old, mrs, has_mask, width, rb; \
    int64_t cq, ck, cv, co, cm, mlen;                                                                 \
    if (ge_nargs(n, 29) || ge_int(args, 28, 1, 1 << 20, &rb)) return NULL;                             \
    if (ge_int(args, 0, 1, INT64_MAX, &fn) || ge_int(args, 1, 0, 1LL << 40, &count)                  \
        || ge_int(args, 2, 1, 1LL << 30, &m) || ge_int(args, 3, 1, 1LL << 30, &nn)                    \
        || ge_int(args, 4, 0, 1LL << 30, &d) || ge_int(args, 5, 0, 1LL << 30, &dv)                    \
        || ge_int(args, 6, 0, INT64_MAX, &qa) || ge_int(args, 8, 1, 1LL << 40, &qld)                  \
        || ge_int(args, 9, 111, 112, &qtr) || ge_int(args, 10, 0, INT64_MAX, &ka)                     \
        || ge_int(args, 12, 1, 1LL << 40, &kld) || ge_int(args, 13, 111, 112, &ktr)                   \
        || ge_int(args, 14, 0, INT64_MAX, &va) || ge_int(args, 16, 1, 1LL << 40, &vld)                \
        || ge_int(args, 17, 111, 112, &vtr) || ge_int(args, 18, 0, INT64_MAX, &oa)                    \
        || ge_int(args, 20, 1, 1LL << 40, &old) || ge_int(args, 24, 0, 1LL << 40, &mrs)               \
        || ge_int(args, 25, 0, 1, &has_mask) || ge_int(args, 27, 1, 4096, &width)) return NULL;       \
    double alpha = PyFloat_AsDouble(args[21]);                                                        \
    if (alpha == -1.0 && PyErr_Occurred()) return NULL;                                               \
    const int64_t *qo = (const int64_t *)ge_vec(args, 7, NPY_INT64, 0, &cq);                            \
    const int64_t *ko = (const int64_t *)ge_vec(args, 11, NPY_INT64, 0, &ck);                           \
    const int64_t *vo = (const int64_t *)ge_vec(args, 15, NPY_INT64, 0, &cv);                           \
    const int64_t *oo = (const int64_t *)ge_vec(args, 19, NPY_INT64, 0, &co);                           \
    const T *mask = (const T *)ge_vec(args, 22, NPY, 0, &mlen);                                          \
    const int64_t *mo = (const int64_t *)ge_vec(args, 23, NPY_INT64, 0, &cm);                           \
    T *scratch = (T *)ge_arr(args, 26, NPY, 1, ge_prod(width, (m + rb - 1) / rb, nn, 1));             \
    if (!qo || !ko || !vo || !oo || !mask || !mo || !scratch) return NULL;                            \
    if (cq < count || ck < count || cv < count || co < count || cm < count) {                         \
        PyErr_SetString(PyExc_ValueError, "attention: the offset tables disagree in length"); return NULL; \
    }                                                                                                 \
    if (has_mask)                                                                                     \
        for (int64_t i = 0; i < count; i++)                                                           \
            if (mo[i] < 0 || mo[i] + (m - 1) * mrs + nn > mlen) {                                     \
                PyErr_SetString(PyExc_ValueError, "attention: a head's mask lies outside the mask"); return NULL; \
            }                                                                                         \
    NAME##_ctx c = {(GEMM_T)(intptr_t)fn, m, nn, d, dv, qld, qtr, kld, ktr, vld, vtr, old, mrs, has_mask,  \
                    (T)alpha, (const T *)(intptr_t)qa, (const T *)(intptr_t)ka, (const T *)(intptr_t)va,  \
                    (T *)(intptr_t)oa, qo, ko, vo, oo, mo, mask, scratch, rb};                        \
    Py_BEGIN_ALLOW_THREADS                                                                            \
    ge_parallel(NAME##_task, &c, count * rb, width);                                                  \
    Py_END_ALLOW_THREADS                                                                              \
    Py_RETURN_NONE;                                                                                   \
}

HEADS(heads_f32, float, gemm_f32_t, NPY_FLOAT, hd_row32)
HEADS(heads_f64, double, gemm_f64_t, NPY_DOUBLE, hd_row64)
