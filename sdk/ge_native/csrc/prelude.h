
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static PyTypeObject *ge_ndarray = 0;

/* a task of a parallel loop: fn(ctx, index, slot), slot < threads (a thread's scratch index) */
typedef void (*ge_task_t)(void *ctx, int64_t i, int slot);
typedef void (*ge_parallel_t)(ge_task_t fn, void *ctx, int64_t n, int64_t threads);
static ge_parallel_t ge_pool = 0;

/* run fn over [0, n) on up to `threads` threads of the process's one native pool (the caller
   takes part; tasks are claimed one at a time, so a descheduled worker costs at most the task
   it holds); inline without the pool */
static void ge_parallel(ge_task_t fn, void *ctx, int64_t n, int64_t threads) {
    if (ge_pool && threads > 1 && n > 1) {
        ge_pool(fn, ctx, n, threads);
        return;
    }
    for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
}

static PyObject *ge_setup(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2 || !PyType_Check(args[0])) { PyErr_SetString(PyExc_TypeError, "setup takes numpy.ndarray and the pool"); return 0; }
    Py_INCREF(args[0]);
    ge_ndarray = (PyTypeObject *)args[0];
    if (args[1] != Py_None) {
        ge_parallel_t *p = (ge_parallel_t *)PyCapsule_GetPointer(args[1], "ge_native_pool");
        if (!p) return 0;
        ge_pool = *p;
    }
    Py_RETURN_NONE;
}

/* The data of argument i: an aligned C-contiguous ndarray of dtype number `type` (writable when
   asked) holding at least `need` elements; else a Python exception and NULL. */
static void *ge_arr(PyObject *const *args, int i, int type, int writable, int64_t need) {
    PyObject *o = args[i];
    if (!ge_ndarray || !PyObject_TypeCheck(o, ge_ndarray)) {
        PyErr_Format(PyExc_TypeError, "native kernel argument %d: an ndarray is needed", i);
        return 0;
    }
    PyArrayObject *a = (PyArrayObject *)o;
    int fl = PyArray_FLAGS(a);
    if (PyArray_TYPE(a) != type || !(fl & NPY_ARRAY_C_CONTIGUOUS) || !(fl & NPY_ARRAY_ALIGNED)
        || (writable && !(fl & NPY_ARRAY_WRITEABLE))) {
        PyErr_Format(PyExc_TypeError, "native kernel argument %d: wrong dtype, layout or a read-only array", i);
        return 0;
    }
    int64_t size = 1;
    for (int d = 0; d < PyArray_NDIM(a); d++) size *= PyArray_DIMS(a)[d];
    if (need < 0 || size < need) {
        PyErr_Format(PyExc_ValueError, "native kernel argument %d: %lld elements, the loop reads %lld", i,
                     (long long)size, (long long)need);
        return 0;
    }
    return PyArray_DATA(a);
}

/* the data and the `nd` dims of argument i: an aligned C-contiguous ndarray of `nd` dimensions
   and dtype number `type` (writable when asked) */
static void *ge_nd(PyObject *const *args, int i, int type, int writable, int nd, int64_t *dims) {
    void *p = ge_arr(args, i, type, writable, 0);
    if (!p) return 0;
    PyArrayObject *a = (PyArrayObject *)args[i];
    if (PyArray_NDIM(a) != nd) {
        PyErr_Format(PyExc_TypeError, "native kernel argument %d: a %d-D array is needed", i, nd);
        return 0;
    }
    for (int d = 0; d < nd; d++) dims[d] = PyArray_DIMS(a)[d];
    return p;
}

/* a 1-D array and its length */
static void *ge_vec(PyObject *const *args, int i, int type, int writable, int64_t *count) {
    return ge_nd(args, i, type, writable, 1, count);
}

/* a 2-D array, its rows and columns */
static void *ge_mat(PyObject *const *args, int i, int type, int writable, int64_t *rows, int64_t *cols) {
    int64_t dims[2];
    void *p = ge_nd(args, i, type, writable, 2, dims);
    *rows = dims[0];
    *cols = dims[1];
    return p;
}

/* argument i as a C integer in [lo, hi] */
static int ge_int(PyObject *const *args, int i, int64_t lo, int64_t hi, int64_t *v) {
    long long x = PyLong_AsLongLong(args[i]);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "native kernel argument %d: %lld is out of range", i, x);
        return -1;
    }
    *v = (int64_t)x;
    return 0;
}

/* raise: the sizes or offsets a kernel was given do not fit its arrays */
static PyObject *ge_fail(void) {
    PyErr_SetString(PyExc_ValueError, "native kernel: the offsets it was given lie outside its arrays");
    return NULL;
}

static int ge_nargs(Py_ssize_t n, Py_ssize_t want) {
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "native kernel takes %zd arguments, got %zd", want, n);
        return -1;
    }
    return 0;
}

/* a * b * c * d, or -1 when that overflows (or a factor is negative) */
static int64_t ge_prod(int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t r;
    if (a < 0 || b < 0 || c < 0 || d < 0 || __builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r)
        || __builtin_mul_overflow(r, d, &r)) return -1;
    return r;
}

/* the last element index + 1 a loop nest touches (sum of (extent - 1) * stride, plus one); -1 on overflow */
static int64_t ge_span(int64_t d0, int64_t d1, int64_t d2, int64_t s0, int64_t s1, int64_t s2) {
    if (d0 <= 0 || d1 <= 0 || d2 <= 0) return 0;
    int64_t a, b, c, t;
    if (__builtin_mul_overflow(d0 - 1, s0, &a) || __builtin_mul_overflow(d1 - 1, s1, &b)
        || __builtin_mul_overflow(d2 - 1, s2, &c) || __builtin_add_overflow(a, b, &t)
        || __builtin_add_overflow(t, c, &t) || __builtin_add_overflow(t, 1, &t)) return -1;
    return t;
}

static inline float ge_bits_f32(int32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline int32_t ge_f32_bits(float f) { int32_t b; memcpy(&b, &f, 4); return b; }
static inline float ge_max32(float a, float b) { return (a >= b || a != a) ? a : b; }
static inline float ge_min32(float a, float b) { return (a <= b || a != a) ? a : b; }
static inline double ge_max64(double a, double b) { return (a >= b || a != a) ? a : b; }
static inline double ge_min64(double a, double b) { return (a <= b || a != a) ? a : b; }

/* Cephes single-precision math with arithmetic, selects and bit-casts only (ge_native.vmath's
   algorithms, constant for constant), so loops that inline them vectorise. */
/* the shared core of exp32 and expneg32: the polynomial of exp on the reduced argument of xc,
   and in *t the rounding sum whose low mantissa bits hold the power of two */
static inline float ge_exp_core(float xc, float *t) {
    *t = xc * 1.44269504088896341f + 12582912.0f;
    float fx = *t - 12582912.0f;
    float r = xc - fx * 0.693359375f - fx * -2.12194440e-4f;
    float z = r * r;
    return (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
             + 1.6666665459e-1f) * r + 5.0000001201e-1f) * z + r + 1.0f;
}

static inline float exp32(float x) {
    float xc = x < 88.8f ? x : 88.8f;
    xc = xc > -104.0f ? xc : -104.0f;
    float t;
    float y = ge_exp_core(xc, &t);
    int32_t n = ge_f32_bits(t) - 0x4B400000;
    int32_t n1 = n >> 1;
    int32_t n2 = n - n1;
    y = y * ge_bits_f32((n1 + 127) << 23) * ge_bits_f32((n2 + 127) << 23);
    return x == x ? y : x;
}

/* exp for x <= 0 (softmax's shifted logits): one scaling factor; below -87.3 the result is 0,
   never a denormal nor the smallest normal (a masked score's weight: every product a later
   GEMM makes from a value near 1e-38 is denormal, and each costs the CPU a microcode assist:
   GPT-2's causal attention ran 20x slower on them) */
static inline float expneg32(float x) {
    float xc = x > -87.3f ? x : -87.3f;
    float t;
    float y = ge_exp_core(xc, &t);
    y = y * ge_bits_f32((ge_f32_bits(t) - 0x4B400000 + 127) << 23);
    y = x >= -87.3f ? y : 0.0f;
    return x == x ? y : x;
}

static inline float log32(float x) {
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    int32_t bits = ge_f32_bits(xs);
    int32_t e = ((bits >> 23) & 0xFF) - 126;
    e = sub ? e - 23 : e;
    float m = ge_bits_f32((bits & 0x007FFFFF) | 0x3F000000);
    int low = m < 0.707106781186547524f;
    e = low ? e - 1 : e;
    m = low ? (m + m - 1.0f) : (m - 1.0f);
    float fe = (float)e;
    float z = m * m;
    float y = ((((((((7.0376836292e-2f * m + -1.1514610310e-1f) * m + 1.1676998740e-1f) * m + -1.2420140846e-1f) * m
                   + 1.4249322787e-1f) * m + -1.6668057665e-1f) * m + 2.0000714765e-1f) * m + -2.4999993993e-1f) * m
               + 3.3333331174e-1f) * m * z;
    y = y + -2.12194440e-4f * fe - 0.5f * z;
    float r = m + y + 0.693359375f * fe;
    r = x == 0.0f ? -INFINITY : r;
    r = x < 0.0f ? NAN : r;
    return (x == INFINITY || x != x) ? x : r;
}

static inline float log1p32(float u) {
    float w = u + 1.0f;
    float d = w - 1.0f;
    float r = d == 0.0f ? u : log32(w) * (u / d);
    return u == INFINITY ? u : r;
}

static inline float expm1_32(float x) {
    float small = x * (1.0f + x * (0.5f + x * ((float)(1.0 / 6.0) + x * ((float)(1.0 / 24.0) + x * (float)(1.0 / 120.0)))));
    return fabsf(x) < 0.0625f ? small : exp32(x) - 1.0f;
}

static inline float tanh32(float x) {
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z + -5.37397155531e-2f) * z + 1.33314422036e-1f) * z
                   + -3.33332819422e-1f) * z * x + x;
    float ax = fabsf(x);
    /* exp's argument stops at 40 (tanh is 1.0f from 9.1 on): 2 / (exp + 1) never goes below the
       normal range, whose denormals cost a microcode assist per use (NaN passes) */
    float big = 1.0f - 2.0f / (exp32(ax > 20.0f ? 40.0f : ax + ax) + 1.0f);
    big = x < 0.0f ? -big : big;
    return ax < 0.625f ? small : big;
}

/* erf32's rational c * P(t) / Q(t), t = c^2, in any lane width (the scalar erf32 below, GE's
   GEMM's 16- and 8-lane stores: one set of coefficients): FMA(a, b, c), MUL, DIV and C(v), a
   constant, of that width. A fit of erf(c) / c on [-3.92, 3.92] whose relative error is 5e-8 in
   exact arithmetic (its float32 evaluation: within 7 ulp, 4e-7 absolute; relative near 0). */
#define GE_ERF_RATIO(FMA, MUL, DIV, C, c, t)                                                        \
    DIV(MUL(c, FMA(FMA(FMA(FMA(FMA(FMA(C(1.992528e-08f), t, C(-1.9577806e-06f)), t, C(1.4182818e-04f)), \
                                   t, C(3.7006338e-03f)), t, C(5.0570205e-02f)), t, C(1.999013e-01f)),   \
                       t, C(1.1283791e+00f))),                                                        \
        FMA(FMA(FMA(FMA(C(9.558066e-04f), t, C(1.4351207e-02f)), t, C(1.1498877e-01f)), t, C(5.104896e-01f)), \
            t, C(1.0f)))
#define GE_S_FMA(a, b, c) ((a) * (b) + (c))
#define GE_S_MUL(a, b) ((a) * (b))
#define GE_S_DIV(a, b) ((a) / (b))
#define GE_S_C(v) (v)

static inline float erf32(float x) {
    /* GE_ERF_RATIO on c, x held in [-3.92, 3.92] (beyond, erf is 1.0f in float32), held in
       [-1, 1]; no exp and no branch: the Abramowitz-Stegun form it replaced computed two
       branches and an exp, and GELU at a GEMM's store ran at 2.5x its cost */
    float c = x > 3.92f ? 3.92f : (x < -3.92f ? -3.92f : x);
    float t = c * c;
    float r = GE_ERF_RATIO(GE_S_FMA, GE_S_MUL, GE_S_DIV, GE_S_C, c, t);
    r = r > 1.0f ? 1.0f : (r < -1.0f ? -1.0f : r);
    return x == x ? r : x;
}
