/* Large-plane data movement of ge_cpu's kernels: the linear Resize of the last two axes and the
   batched 2-D transpose (segmentation decoders and the NCHW <-> token-major reorders around
   their attention stages move whole 128x128 planes of hundreds of channels).

   Linear Resize of the last two axes (ge_cpu's Resize kernel, kernels/resize.py): each output
   row blends two input rows, each output column two columns of that blend, with the per-axis tap
   tables the Python side computed ((2, n): first taps, then second; int32 indices, float32
   weights). An axis marked as kept
   is copied, not blended. The arithmetic is that of the separable numpy path, in its order (rows
   first: v = a * wy0 + b * wy1; then columns: v[j0] * wx0 + v[j1] * wx1; no contraction), so the
   bits are the same whatever the split. Tasks: blocks of output rows of one plane (at least 16K
   outputs each) on the native pool. Fixed source. */
#include "prelude.h"

/* the widest input row blended into a stack buffer first (16 KiB) */
#define RS_ROW 4096
typedef struct {
    const float *x; float *y;
    const int32_t *iy, *ix; const float *wy, *wx;
    int64_t h, w, ho, wo, rows, per_plane; int keep_h, keep_w;
} rs_ctx;

static void rs_task(void *vc, int64_t t, int slot) {
    const rs_ctx *q = (const rs_ctx *)vc;
    int64_t p = t / q->per_plane, r0 = (t % q->per_plane) * q->rows;
    int64_t r1 = r0 + q->rows < q->ho ? r0 + q->rows : q->ho, wo = q->wo;
    const float *plane = q->x + p * q->h * q->w;
    const int32_t *ix = q->ix;
    const float *wx = q->wx;
    (void)slot;
    for (int64_t oy = r0; oy < r1; oy++) {
        float *o = q->y + (p * q->ho + oy) * wo;
        if (q->keep_h) {
            const float *a = plane + oy * q->w;
            if (q->keep_w) { memcpy(o, a, (size_t)wo * sizeof(float)); continue; }
#pragma omp simd
            for (int64_t ox = 0; ox < wo; ox++) o[ox] = a[ix[ox]] * wx[ox] + a[ix[wo + ox]] * wx[wo + ox];
            continue;
        }
        const float *a = plane + (int64_t)q->iy[oy] * q->w, *b = plane + (int64_t)q->iy[q->ho + oy] * q->w;
        float u = q->wy[oy], v = q->wy[q->ho + oy];
        if (q->keep_w) {
#pragma omp simd
            for (int64_t ox = 0; ox < wo; ox++) o[ox] = a[ox] * u + b[ox] * v;
            continue;
        }
        if (q->w <= RS_ROW) {  /* the row blend once (contiguous), then two gathers from L1 per column */
            float row[RS_ROW];
#pragma omp simd
            for (int64_t k = 0; k < q->w; k++) row[k] = a[k] * u + b[k] * v;
#pragma omp simd
            for (int64_t ox = 0; ox < wo; ox++) o[ox] = row[ix[ox]] * wx[ox] + row[ix[wo + ox]] * wx[wo + ox];
            continue;
        }
#pragma omp simd
        for (int64_t ox = 0; ox < wo; ox++) {
            int32_t j0 = ix[ox], j1 = ix[wo + ox];
            float s0 = a[j0] * u + b[j0] * v, s1 = a[j1] * u + b[j1] * v;
            o[ox] = s0 * wx[ox] + s1 * wx[wo + ox];
        }
    }
}

/* every index of a (2, n) tap table lies in [0, len) */
static int rs_taps_ok(const int32_t *t, int64_t n, int64_t len) {
    for (int64_t i = 0; i < 2 * n; i++)
        if (t[i] < 0 || t[i] >= len) return 0;
    return 1;
}

/* (x (P, H, W) f32, y (P, Ho, Wo) f32, iy (2, Ho) i32, wy (2, Ho) f32, ix (2, Wo) i32, wx (2, Wo) f32,
   keep_h, keep_w, threads): y = x resized linearly along H and W (a kept axis has Ho == H or Wo == W) */
static PyObject *resize_linear2d(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t xd[3], yd[3], iyd[2], wyd[2], ixd[2], wxd[2], keep_h, keep_w, threads;
    if (ge_nargs(n, 9)) return NULL;
    if (ge_int(args, 6, 0, 1, &keep_h) || ge_int(args, 7, 0, 1, &keep_w) || ge_int(args, 8, 1, 4096, &threads))
        return NULL;
    const float *x = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, 3, xd);
    float *y = x ? (float *)ge_nd(args, 1, NPY_FLOAT, 1, 3, yd) : NULL;
    const int32_t *iy = y ? (const int32_t *)ge_nd(args, 2, NPY_INT32, 0, 2, iyd) : NULL;
    const float *wy = iy ? (const float *)ge_nd(args, 3, NPY_FLOAT, 0, 2, wyd) : NULL;
    const int32_t *ix = wy ? (const int32_t *)ge_nd(args, 4, NPY_INT32, 0, 2, ixd) : NULL;
    const float *wx = ix ? (const float *)ge_nd(args, 5, NPY_FLOAT, 0, 2, wxd) : NULL;
    if (!wx) return NULL;
    if (xd[0] != yd[0] || iyd[1] != yd[1] || wyd[1] != yd[1] || ixd[1] != yd[2] || wxd[1] != yd[2] || iyd[0] != 2
        || wyd[0] != 2 || ixd[0] != 2 || wxd[0] != 2 || (keep_h && yd[1] != xd[1]) || (keep_w && yd[2] != xd[2])
        || ge_prod(xd[0], xd[1], xd[2], 1) < 0 || ge_prod(yd[0], yd[1], yd[2], 1) < 0)
        return ge_fail();
    if (yd[0] == 0 || yd[1] == 0 || yd[2] == 0) Py_RETURN_NONE;
    if ((!keep_h && !rs_taps_ok(iy, yd[1], xd[1])) || (!keep_w && !rs_taps_ok(ix, yd[2], xd[2]))) return ge_fail();
    int64_t rows = yd[2] >= 16384 ? 1 : 16384 / yd[2];
    if (rows > yd[1]) rows = yd[1];
    rs_ctx q = {x, y, iy, ix, wy, wx, xd[1], xd[2], yd[1], yd[2], rows, (yd[1] + rows - 1) / rows,
                (int)keep_h, (int)keep_w};
    if (yd[0] * yd[1] * yd[2] < 65536) threads = 1;
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(rs_task, &q, yd[0] * q.per_plane, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* Batched transpose of 4-byte elements (ge_cpu's Transpose kernel, kernels/tensor.py, for a
   permutation that swaps two groups of trailing axes): x (P, R, C) -> y (P, C, R), moved in
   RS_TILE x RS_TILE tiles so that both the rows read and the rows written stay in L1 (numpy's
   strided copy of the transposed view walks one side a cache line per element: 16 MiB took
   40 ms). Tasks: bands of RS_TILE output rows of one matrix, on the native pool. Only bits move. */
#define RS_TILE 32
typedef struct { const uint32_t *x; uint32_t *y; int64_t r, c, bands; } tr_ctx;

static void tr_task(void *vc, int64_t t, int slot) {
    const tr_ctx *q = (const tr_ctx *)vc;
    int64_t p = t / q->bands, c0 = (t % q->bands) * RS_TILE, c1 = c0 + RS_TILE < q->c ? c0 + RS_TILE : q->c;
    const uint32_t *x = q->x + p * q->r * q->c;
    uint32_t *y = q->y + p * q->r * q->c;
    (void)slot;
    for (int64_t r0 = 0; r0 < q->r; r0 += RS_TILE) {
        int64_t r1 = r0 + RS_TILE < q->r ? r0 + RS_TILE : q->r;
        for (int64_t j = c0; j < c1; j++) {
            uint32_t *o = y + j * q->r;
            for (int64_t i = r0; i < r1; i++) o[i] = x[i * q->c + j];
        }
    }
}

/* (x (P, R, C), y (P, C, R), threads): y[p] = x[p].T, both float32 or both int32 (bits moved) */
static PyObject *transpose2d(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t xd[3], yd[3], threads;
    if (ge_nargs(n, 3) || ge_int(args, 2, 1, 4096, &threads)) return NULL;
    int ty = PyObject_TypeCheck(args[0], ge_ndarray) && PyArray_TYPE((PyArrayObject *)args[0]) == NPY_INT32
             ? NPY_INT32 : NPY_FLOAT;
    const uint32_t *x = (const uint32_t *)ge_nd(args, 0, ty, 0, 3, xd);
    uint32_t *y = x ? (uint32_t *)ge_nd(args, 1, ty, 1, 3, yd) : NULL;
    if (!y) return NULL;
    if (xd[0] != yd[0] || xd[1] != yd[2] || xd[2] != yd[1] || ge_prod(xd[0], xd[1], xd[2], 1) < 0
        || (const void *)x == (const void *)y) return ge_fail();
    if (xd[0] == 0 || xd[1] == 0 || xd[2] == 0) Py_RETURN_NONE;
    tr_ctx q = {x, y, xd[1], xd[2], (xd[2] + RS_TILE - 1) / RS_TILE};
    if (xd[0] * xd[1] * xd[2] < 65536) threads = 1;
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(tr_task, &q, xd[0] * q.bands, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* 1: the module built and runs here (no instruction set beyond the build's own) */
static PyObject *planes_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLong(1);
}
