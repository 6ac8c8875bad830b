/* The fake-quant of float32 values (ge.quant::FakeQuant, ge_native.fakequant): y = clip(rint(x /
   s), lo, hi) * s, lo and hi the integer range less the zero point: exactly QuantizeLinear then
   DequantizeLinear with a per-tensor scale. IEEE division (not a multiplication by 1 / s: the
   integers must be QuantizeLinear's), rint in the default rounding mode (half to even). The
   elements are split into tasks of the native pool (64K elements at least); y may be x. */
#include "prelude.h"
#include <math.h>

typedef struct { const float *x; float *y; int64_t size, per; float s, lo, hi; } fq_ctx;

static void fq_task(void *vc, int64_t t, int slot) {
    const fq_ctx *q = (const fq_ctx *)vc;
    int64_t i0 = t * q->per, i1 = i0 + q->per < q->size ? i0 + q->per : q->size;
    const float *x = q->x; float *y = q->y; float s = q->s, lo = q->lo, hi = q->hi;
    (void)slot;
    #pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float r = rintf(x[i] / s);
        r = r < lo ? lo : r;   /* (a NaN stays NaN: as the NumPy form's clip) */
        r = r > hi ? hi : r;
        y[i] = r * s;
    }
}

/* fq(x, y, scale, lo, hi, threads): x, y float32 C-contiguous of one size */
static PyObject *fq(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t threads;
    if (ge_nargs(n, 6) || ge_int(args, 5, 1, 4096, &threads)) return NULL;
    const float *x = (const float *)ge_arr(args, 0, NPY_FLOAT, 0, 0);
    if (!x) return NULL;
    int64_t size = 1, ysize = 1;
    for (int d = 0; d < PyArray_NDIM((PyArrayObject *)args[0]); d++) size *= PyArray_DIMS((PyArrayObject *)args[0])[d];
    float *y = (float *)ge_arr(args, 1, NPY_FLOAT, 1, size);
    if (!y) return NULL;
    for (int d = 0; d < PyArray_NDIM((PyArrayObject *)args[1]); d++) ysize *= PyArray_DIMS((PyArrayObject *)args[1])[d];
    if (ysize != size) return ge_fail();
    double s = PyFloat_AsDouble(args[2]), lo = PyFloat_AsDouble(args[3]), hi = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (!(s > 0) || !isfinite(s) || !(lo <= hi) || !isfinite(lo) || !isfinite(hi)) return ge_fail();
    fq_ctx q = {x, y, size, 65536, (float)s, (float)lo, (float)hi};
    if (size == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(fq_task, &q, (size + q.per - 1) / q.per, size < 2 * q.per ? 1 : threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *fq_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) { return PyLong_FromLong(1); }
