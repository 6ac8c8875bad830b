#include "prelude.h"
#include "activations16.h"
/* The row kernels of the fused ops (ge_cpu.fused.loopgen.row_kernel): LayerNorm, RMSNorm and
   Softmax over the last axis, Softmax scaled and masked (Attention's scores), Rotary; one pass per
   row in registers. The module is built per dtype with fused_rows_f32.h or fused_rows_f64.h first
   (T, NPY_T, ONE, SQRT, EXP); compiled alone (the suite's syntax check) it is the float32 one. */
#ifndef NPY_T
#include "fused_rows_f32.h"
#endif

static inline void ln_row(const T *r, T *o, const T *gamma, const T *beta, T eps, T inv, int64_t d) {
    T s = 0;
#pragma omp simd reduction(+:s)
    for (int64_t k = 0; k < d; k++) s += r[k];
    T m = s * inv;
    T v = 0;
#pragma omp simd reduction(+:v)
    for (int64_t k = 0; k < d; k++) { T t = r[k] - m; v += t * t; }
    T rs = ONE / SQRT(v * inv + eps);
    for (int64_t k = 0; k < d; k++) o[k] = (r[k] - m) * rs * gamma[k] + beta[k];
}

static inline void rms_row(const T *r, T *o, const T *gamma, T eps, T inv, int64_t d) {
    /* the order of the exported graph: x * (1 / sqrt(mean(x^2) + eps)), then * gamma */
    T s = 0;
#pragma omp simd reduction(+:s)
    for (int64_t k = 0; k < d; k++) s += r[k] * r[k];
    T rs = ONE / SQRT(s * inv + eps);
    for (int64_t k = 0; k < d; k++) o[k] = r[k] * rs * gamma[k];
}

#if defined(__AVX512F__)
/* a float32 row's softmax 16 lanes at a time in registers (ge_native.sgemm.ACTIVATION_C16's
   sg_softmax_row16, as the Attention kernel's rows): the loops below reach 1.5 G elements/s,
   this 4+. A NaN (or an inf, whose difference from the max is NaN) enters the sum, so the whole
   row is NaN, as in NumPy. */
static inline void sm_row32(const float *r, float *o, int64_t d) {
    sg_softmax_row16(r, NULL, o, d, 1.0f);
}
#define SM_SCALED_VEC 1
#define SM_VEC 1
#elif defined(__AVX2__) && defined(__FMA__)
/* the same on AVX2, 8 lanes (sg_exp8): the max and the sum reduced 8 lanes wide, the tail a
   masked load whose lanes past d are zeroed after the exp */
static inline float sm_hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
static inline float sm_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
static inline void sm_row32(const float *r, float *o, int64_t d) {
    int64_t k = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; k + 8 <= d; k += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(r + k));
    float mi = sm_hmax8(mv);
    for (; k < d; k++) mi = r[k] > mi ? r[k] : mi;
    __m256 mm = _mm256_set1_ps(mi), sv = _mm256_setzero_ps();
    __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(d % 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (k = 0; k + 8 <= d; k += 8) {
        __m256 e = sg_exp8(_mm256_sub_ps(_mm256_loadu_ps(r + k), mm));
        _mm256_storeu_ps(o + k, e);
        sv = _mm256_add_ps(sv, e);
    }
    __m256 et = _mm256_setzero_ps();
    if (d % 8) {
        et = _mm256_and_ps(_mm256_castsi256_ps(tail), sg_exp8(_mm256_sub_ps(_mm256_maskload_ps(r + k, tail), mm)));
        sv = _mm256_add_ps(sv, et);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sm_hsum8(sv));
    for (k = 0; k + 8 <= d; k += 8) _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_loadu_ps(o + k), inv));
    if (d % 8) _mm256_maskstore_ps(o + k, tail, _mm256_mul_ps(et, inv));
}
#define SM_VEC 1
#endif

static inline void sm_row(const T *r, T *o, int64_t d) {
#if defined(SM_VEC)
    if (sizeof(T) == 4) {
        sm_row32((const float *)r, (float *)o, d);
        return;
    }
#endif
    /* a NaN in the row makes every element NaN (its exp enters the sum), as in NumPy */
    T mi = r[0];
#pragma omp simd reduction(max:mi)
    for (int64_t k = 0; k < d; k++) mi = r[k] > mi ? r[k] : mi;
    /* (simd: o is r itself or another row, element k depends on element k alone) */
#pragma omp simd
    for (int64_t k = 0; k < d; k++) o[k] = EXP(r[k] - mi);
    T s = 0;
#pragma omp simd reduction(+:s)
    for (int64_t k = 0; k < d; k++) s += o[k];
    T inv = ONE / s;
#pragma omp simd
    for (int64_t k = 0; k < d; k++) o[k] *= inv;
}

/* rows, cols and the arrays of one call: x (rows x cols), the vectors, out (x itself in place) */
/* (the sizes below are checked products: rows and cols up to 2^40 each overflow int64) */
static int rows_args(PyObject *const *args, Py_ssize_t n, int nvec, int64_t *rows, int64_t *cols,
                     int64_t *threads, const T **x, T **out, const T **vec, T *eps) {
    int base = 1 + nvec + (eps ? 1 : 0);
    if (ge_nargs(n, base + 4)) return -1;
    if (ge_int(args, base + 1, 0, 1LL << 40, rows) || ge_int(args, base + 2, 0, 1LL << 40, cols)
        || ge_int(args, base + 3, 1, 4096, threads)) return -1;
    *out = (T *)ge_arr(args, base, NPY_T, 1, ge_prod(*rows, *cols, 1, 1));
    *x = (const T *)ge_arr(args, 0, NPY_T, 0, ge_prod(*rows, *cols, 1, 1));
    if (!*out || !*x) return -1;
    for (int i = 0; i < nvec; i++) {
        vec[i] = (const T *)ge_arr(args, 1 + i, NPY_T, 0, *cols);
        if (!vec[i]) return -1;
    }
    if (eps) {
        double e = PyFloat_AsDouble(args[1 + nvec]);
        if (e == -1.0 && PyErr_Occurred()) return -1;
        *eps = (T)e;
    }
    return 0;
}

typedef struct { const T *x; T *out; const T *v[2]; T eps, inv; int64_t rows, cols, parts; } R;

/* the even parts of `rows` rows of `cols` a row kernel runs as tasks: about 16K elements each,
   a multiple of *threads of them (participant s then starts on rows [s * rows / threads, ...),
   those GE's GEMM gives it too), one thread under 32K elements (a 128 x 384 one took 28 us alone) */
static int64_t row_parts(int64_t rows, int64_t cols, int64_t *threads) {
    if (rows * cols < 32768) *threads = 1;
    int64_t blocks = (rows * cols + 16383) / 16384;
    if (*threads > 1) blocks = (blocks + *threads - 1) / *threads * *threads;
    if (blocks > rows) blocks = rows;
    return blocks < 1 ? 1 : blocks;
}

/* the rows in row_parts' even parts (their count into *parts, the task context's field) on the
   native pool */
static PyObject *run_parts(ge_task_t task, void *q, int64_t *parts, int64_t rows, int64_t cols, int64_t threads) {
    if (rows == 0 || cols == 0) Py_RETURN_NONE;  /* an empty extent first: no row to run */
    *parts = row_parts(rows, cols, &threads);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(task, q, *parts, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* the rows of one task: each row's `CALL` with r the input row and o the output row (the same
   pointer in place, so the compiler sees they alias exactly and vectorises) */
#define TASK(NAME, INPLACE, CALL)                                                                      \
static void task_##NAME(void *vc, int64_t b, int slot) {                                              \
    R *q = (R *)vc;                                                                                   \
    const T *x = q->x; T *out = q->out; const T *const *v = q->v; T eps = q->eps, inv = q->inv;       \
    int64_t cols = q->cols, end = (b + 1) * q->rows / q->parts;                                        \
    (void)slot; (void)x; (void)v; (void)eps; (void)inv;                                               \
    for (int64_t i = b * q->rows / q->parts; i < end; i++) {                                          \
        T *o = out + i * cols;                                                                        \
        const T *r = INPLACE ? o : x + i * cols;                                                      \
        (void)r;                                                                                      \
        CALL;                                                                                         \
    }                                                                                                 \
}

/* one entry (x, vectors, eps, out, rows, cols, threads): the in-place task when out is x; the rows
   in row_parts' even parts on the native pool, so the next layer reads them on the core that
   wrote them */
#define ENTRY(NAME, NVEC, HAS_EPS)                                                                     \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \
    int64_t rows, cols, threads; R q = {0};                                                           \
    if (rows_args(args, n, NVEC, &rows, &cols, &threads, &q.x, &q.out, q.v, HAS_EPS ? &q.eps : NULL)) \
        return NULL;                                                                                  \
    q.inv = ONE / (T)cols; q.rows = rows; q.cols = cols;                                              \
    ge_task_t task = (const void *)q.x == (const void *)q.out ? task_##NAME##_ip : task_##NAME;       \
    return run_parts(task, &q, &q.parts, rows, cols, threads);                                        \
}

TASK(layernorm, 0, ln_row(r, o, v[0], v[1], eps, inv, cols))
TASK(layernorm_ip, 1, ln_row(o, o, v[0], v[1], eps, inv, cols))
TASK(rmsnorm, 0, rms_row(r, o, v[0], eps, inv, cols))
TASK(rmsnorm_ip, 1, rms_row(o, o, v[0], eps, inv, cols))
TASK(softmax, 0, sm_row(r, o, cols))
TASK(softmax_ip, 1, sm_row(o, o, cols))
ENTRY(layernorm, 2, 1)
ENTRY(rmsnorm, 1, 1)
ENTRY(softmax, 0, 0)

/* softmax(x * alpha + mask row i % P) of row i (P = 0: no mask): attention's scores scaled and
   masked as they are read, no pass of their own */
static inline void sm_row_scaled(const T *r, const T *mk, T *o, T alpha, int64_t d) {
#if defined(SM_SCALED_VEC)
    if (sizeof(T) == 4) {
        sg_softmax_row16((const float *)r, (const float *)mk, (float *)o, d, (float)alpha);
        return;
    }
#endif
    for (int64_t k = 0; k < d; k++) o[k] = mk ? r[k] * alpha + mk[k] : r[k] * alpha;
    sm_row(o, o, d);
}
typedef struct { const T *x, *mk; T *out; T alpha; int64_t rows, cols, parts, P; } RS;
static void task_softmax_scaled(void *vc, int64_t b, int slot) {
    const RS *q = (const RS *)vc;
    int64_t d = q->cols, end = (b + 1) * q->rows / q->parts;
    (void)slot;
    for (int64_t i = b * q->rows / q->parts; i < end; i++)
        sm_row_scaled(q->x + i * d, q->P ? q->mk + (i % q->P) * d : NULL, q->out + i * d, q->alpha, d);
}

/* softmax_scaled(x, alpha, mask, P, out, rows, cols, threads): out may be x; mask (P x cols) apart
   from out; rows a multiple of P (P = 0: no mask, the mask argument unread) */
static PyObject *softmax_scaled(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t P, rows, cols, threads;
    if (ge_nargs(n, 8)) return NULL;
    if (ge_int(args, 3, 0, 1LL << 40, &P) || ge_int(args, 5, 0, 1LL << 40, &rows)
        || ge_int(args, 6, 0, 1LL << 40, &cols) || ge_int(args, 7, 1, 4096, &threads)) return NULL;
    if (P && rows % P) return ge_fail();
    double alpha = PyFloat_AsDouble(args[1]);
    if (alpha == -1.0 && PyErr_Occurred()) return NULL;
    RS q = {0};
    q.x = (const T *)ge_arr(args, 0, NPY_T, 0, ge_prod(rows, cols, 1, 1));
    q.mk = q.x ? (const T *)ge_arr(args, 2, NPY_T, 0, ge_prod(P, cols, 1, 1)) : NULL;
    q.out = q.mk ? (T *)ge_arr(args, 4, NPY_T, 1, ge_prod(rows, cols, 1, 1)) : NULL;
    if (!q.out) return NULL;
    if (P && q.out < q.mk + P * cols && q.mk < q.out + rows * cols) return ge_fail();
    q.alpha = (T)alpha; q.rows = rows; q.cols = cols; q.P = P;
    return run_parts(task_softmax_scaled, &q, &q.parts, rows, cols, threads);
}

/* rotary embedding: row i of x (cols = d, even) against row i % P of cos and sin,
   o = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] for the halves x1, x2 */
typedef struct { const T *x, *c, *s; T *out; int64_t rows, cols, parts, P; } RQ;
static void task_rotary(void *vc, int64_t b, int slot) {
    const RQ *q = (const RQ *)vc;
    int64_t d = q->cols, h = d / 2, end = (b + 1) * q->rows / q->parts;
    (void)slot;
    for (int64_t i = b * q->rows / q->parts; i < end; i++) {
        const T *xr = q->x + i * d, *cr = q->c + (i % q->P) * d, *sr = q->s + (i % q->P) * d;
        T *o = q->out + i * d;
#pragma omp simd
        for (int64_t j = 0; j < h; j++) o[j] = xr[j] * cr[j] - xr[j + h] * sr[j];
#pragma omp simd
        for (int64_t j = 0; j < h; j++) o[j + h] = xr[j + h] * cr[j + h] + xr[j] * sr[j + h];
    }
}

/* rotary(x, cos, sin, P, out, rows, cols, threads): x and out (rows x cols) apart (out is not x),
   cos and sin (P x cols), rows a multiple of P; the rows in even parts as the row kernels' */
static PyObject *rotary(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t P, rows, cols, threads;
    if (ge_nargs(n, 8)) return NULL;
    if (ge_int(args, 3, 1, 1LL << 40, &P) || ge_int(args, 5, 0, 1LL << 40, &rows)
        || ge_int(args, 6, 0, 1LL << 40, &cols) || ge_int(args, 7, 1, 4096, &threads)) return NULL;
    if (cols % 2 || rows % P) return ge_fail();
    RQ q = {0};
    q.x = (const T *)ge_arr(args, 0, NPY_T, 0, ge_prod(rows, cols, 1, 1));
    q.c = q.x ? (const T *)ge_arr(args, 1, NPY_T, 0, ge_prod(P, cols, 1, 1)) : NULL;
    q.s = q.c ? (const T *)ge_arr(args, 2, NPY_T, 0, ge_prod(P, cols, 1, 1)) : NULL;
    q.out = q.s ? (T *)ge_arr(args, 4, NPY_T, 1, ge_prod(rows, cols, 1, 1)) : NULL;
    if (!q.out) return NULL;
    if (q.out < q.x + rows * cols && q.x < q.out + rows * cols) return ge_fail();  /* (a row reads its first half after writing it) */
    q.rows = rows; q.cols = cols; q.P = P;
    return run_parts(task_rotary, &q, &q.parts, rows, cols, threads);
}
