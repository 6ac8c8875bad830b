"""The fused Attention kernel's parallel form: one task per (batch, head) on the native pool.

``softmax(scale * Q @ K^T + mask) @ V`` for every head is one task of the process's native pool
(:mod:`ge_native.native`): a BLAS ``gemm`` (single-threaded, :mod:`ge_native.gemm`)
writes the head's scores into its own scratch block (``scale`` rides on ``alpha``), the rows
get the mask, their max, ``exp`` (the prelude's vectorised ``expneg32``) and their sum in one
pass each while the block is in cache, and a second ``gemm`` writes ``P @ V`` into the head's
rows of the output. The scores of only one head per thread exist at a time (never the whole
``(heads, m, n)``). The heads are claimed one at a time by the run's threads.

Operands may be strided views (the Attention op's ``perm_*`` attributes: the exporter's
Transposes around the heads, folded): each matrix is passed as a pointer per head and a leading
dimension, transposed for BLAS when its rows are the contiguous axis; the output likewise, when
its head matrices have contiguous rows (a ``(b, s, heads, d)`` buffer seen as
``(b, heads, s, d)``: written in place, no Transpose after). :func:`run` checks every array first and returns None when it cannot take
them (dtype, strides, shapes, mask layout); the caller then runs its NumPy form.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ge_native import gemm, native, sgemm

_lock = threading.Lock()
_kernels: dict[str, Any] = {}

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


#: one task per head; the arguments are (gemm address, count, m, n, d, dv, then for q, k and v:
#: address, per-head element offsets, leading dimension, BLAS transpose flag; the output's
#: address, offsets and leading dimension; alpha, the flat mask, its per-head offsets, its row
#: stride, has_mask, the scratch blocks (width x m x n), width); the caller checked every array
#: the addresses come from
_HEADS_SRC = r"""
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
"""


def _build(dtype: np.dtype):
    blas = gemm.cblas_native(dtype)
    if blas is None:
        return None
    addr, integer = blas
    mod = native.build(gemm.blas_decls(integer) + sgemm.ACTIVATION_C16 + _HEADS_SRC, ["heads_f32", "heads_f64"])
    if mod is None:
        return None
    kern = mod.heads_f32 if dtype == np.float32 else mod.heads_f64
    return lambda *args: kern(addr, *args)


def _kernel(dtype: np.dtype):
    with _lock:
        if dtype.name not in _kernels:
            _kernels[dtype.name] = _build(dtype) if gemm.available() else None
        return _kernels[dtype.name]


def prepare(dtype: Any) -> None:
    """Build the kernel for ``dtype`` now (at model build), when this path can run it."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return
    if dt.name in ("float32", "float64"):
        _kernel(dt)


def _matrix(x: np.ndarray, lead: tuple[int, ...], item: int):
    """(per-head element offsets, leading dimension, BLAS transpose flag) of the last two axes
    of ``x`` broadcast over ``lead``, or None when BLAS cannot read it in place."""
    st = [s // item for s in x.strides]
    if any(s % item for s in x.strides) or any(s < 0 for s in st):
        return None
    rs, cs = st[-2], st[-1]
    rows, cols = x.shape[-2], x.shape[-1]
    if cs == 1 or cols == 1:
        ld, tr = max(rs, cols, 1), _NO_TRANS
        if rows > 1 and rs < cols:
            return None
    elif rs == 1 or rows == 1:
        ld, tr = max(cs, rows, 1), _TRANS
        if cols > 1 and cs < rows:
            return None
    else:
        return None
    lead_st = st[:-2]
    pad = len(lead) - len(lead_st)
    offs = np.zeros(int(np.prod(lead)) if lead else 1, np.int64)
    idx = np.indices(lead).reshape(len(lead), -1) if lead else np.zeros((0, 1), np.int64)
    for ax in range(len(lead)):
        j = ax - pad
        if j < 0:
            continue
        if x.shape[j] == 1:
            continue
        if x.shape[j] != lead[ax]:
            return None
        offs += idx[ax] * lead_st[j]
    return offs, ld, tr


#: geometry plans by (dtype, shapes and strides of q, kt, v and the mask): a run of a model
#: pays one dict lookup, not the planning (most models have a handful of attention shapes)
_plans: dict[tuple, Any] = {}
_PLANS_MAX = 256


def _plan(q: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: np.ndarray | None, out: np.ndarray | None):
    """(count, m, n, d, dv, per-matrix (offsets, ld, trans), the output's (offsets, ld, in place:
    False when ``out`` cannot be written through and a new C-order array's are given), mask parts)
    for these arrays (``out``: the output array, None for a new C-order one), or None when this
    path cannot take them."""
    dt = q.dtype
    lead = q.shape[:-2]
    m, d = q.shape[-2:]
    n, dv = kt.shape[-1], v.shape[-1]
    if kt.ndim != q.ndim or v.ndim != q.ndim or kt.shape[-2] != d or v.shape[-2] != n or m < 1 or n < 1:
        return None
    try:
        if np.broadcast_shapes(lead, kt.shape[:-2], v.shape[:-2]) != lead:
            return None
    except ValueError:
        return None
    item = dt.itemsize
    mats = [_matrix(x, lead, item) for x in (q, kt, v)]
    if any(x is None for x in mats):
        return None
    count = int(np.prod(lead))
    o_part = (np.arange(count, dtype=np.int64) * (m * dv), dv, out is None)
    if out is not None:
        o = _matrix(out, lead, item)
        if o is not None and o[2] == _NO_TRANS:
            o_part = (o[0], o[1], True)
        # else rows not contiguous: a C-order result, then a copy
    mask_part: tuple[int, np.ndarray, tuple[int, ...] | None] = (0, np.zeros(count, np.int64), None)
    if mask is not None:
        if mask.ndim == 0 or mask.dtype != dt or mask.ndim > q.ndim or mask.shape[-1] != n or \
                (mask.ndim >= 2 and mask.shape[-2] not in (1, m)):
            return None
        shape = (1,) * (q.ndim - mask.ndim) + mask.shape
        try:
            if np.broadcast_shapes(shape[:-2], lead) != lead:
                return None
        except ValueError:
            return None
        m_rs = n if shape[-2] == m else 0
        moffs = np.zeros(count, np.int64)
        idx = np.indices(lead).reshape(len(lead), -1)
        mst = np.cumprod((1,) + shape[::-1])[::-1][1:]  # C-order element strides of the contiguous mask
        for ax in range(len(lead)):
            if shape[ax] != 1:
                moffs += idx[ax] * int(mst[ax])
        mask_part = (m_rs, moffs, shape)
    return count, m, n, d, dv, mats, o_part, mask_part


#: multiply-adds (heads x queries x keys x (head size + value size)) under which the attention
#: kernel runs NumPy's batched products on the calling thread instead of this path: wav2vec2's 4
#: heads of 49 tokens took 125 us here (on one thread or two) and 52 us there
SERIAL_WORK = 1 << 22


def run(q: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float, out: np.ndarray | None,
        width: int) -> np.ndarray | None:
    """The attention of every head on ``width`` threads, or None when this path cannot take
    these arrays (the caller runs the NumPy form)."""
    dt = q.dtype
    if dt.name not in ("float32", "float64") or kt.dtype != dt or v.dtype != dt or q.ndim < 3:
        return None
    if mask is not None and not isinstance(mask, np.ndarray):
        return None
    if 0 in q.shape or 0 in kt.shape or 0 in v.shape:
        return None  # an empty extent first: the NumPy form gives the empty (or all-zero) result
    shape = q.shape[:-1] + v.shape[-1:]
    # the output in place: C order, or a strided view whose head matrices have contiguous rows (a
    # transpose of the output buffer, the Attention op's perm_out)
    res = out if out is not None and out.shape == shape and out.dtype == dt \
        and not any(np.may_share_memory(out, x) for x in (q, kt, v)) else None
    key = (dt.name, q.shape, q.strides, kt.shape, kt.strides, v.shape, v.strides,
           None if mask is None else (mask.dtype.name, mask.shape), None if res is None else res.strides)
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(q, kt, v, mask, res)
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        _plans[key] = plan if plan is not None else False
    if not plan:
        return None
    fn = _kernel(dt)
    if fn is None:
        return None
    count, m, n, d, dv, mats, o_part, (m_rs, moffs, mshape) = plan
    o_off, o_ld, in_place = o_part
    if res is None or not in_place:
        res = np.empty(shape, dt)
    if mask is not None:
        mflat = np.ascontiguousarray(mask).reshape(-1)  # its plan's offsets are C order over `mshape`
    else:
        mflat = _no_mask(dt)
    width = gemm.set_width(width)
    rb = row_blocks(count, m)
    scratch = np.empty((width, -(-m // rb), n), dt)
    (qo, qld, qtr), (ko, kld, ktr), (vo, vld, vtr) = mats
    fn(count, m, n, d, dv, q.ctypes.data, qo, qld, qtr, kt.ctypes.data, ko, kld, ktr, v.ctypes.data, vo, vld, vtr,
       res.ctypes.data, o_off, o_ld, float(scale), mflat, moffs, m_rs, int(mask is not None), scratch, width, rb)
    if out is not None and res is not out:
        np.copyto(out, res)
        return out
    return res


def row_blocks(heads: int, rows: int) -> int:
    """Blocks of query rows a head's task is cut into: 2 for an odd count of heads under 8 with 64
    rows or more (DeiT-tiny's 3 heads on 2 threads: the third head ran alone, 1.25x from 1 to 2
    threads), else 1. Sizes only, never the thread count: the same products at every width, so
    the same bits (a BLAS call's rows split differently can round differently)."""
    return 2 if heads % 2 and heads < 8 and rows >= 64 else 1


_NO_MASK: dict[str, np.ndarray] = {}


def _no_mask(dt: np.dtype) -> np.ndarray:
    a = _NO_MASK.get(dt.name)
    if a is None:
        a = _NO_MASK[dt.name] = np.zeros(1, dt)
    return a
