"""The fused Attention kernel's parallel form: one task per (batch, head) on numba's threads.

``softmax(scale * Q @ K^T + mask) @ V`` for every head is one ``prange`` iteration: a BLAS
``gemm`` (single-threaded, called without the GIL, :mod:`ge_sdk.gemm`) writes the head's
scores into its own scratch block (``scale`` rides on ``alpha``), the rows get the mask, their
max, ``exp`` (:func:`ge_sdk.vmath.expneg32`, vectorised) and their sum in one pass each while
the block is in cache, and a second ``gemm`` writes ``P @ V`` into the head's rows of the output.
The scores of only one head per thread exist at a time (never the whole ``(heads, m, n)``).
The heads are claimed one at a time by the run's threads (:func:`ge_sdk.gemm.set_width`).

Operands may be strided views (the Transpose that makes K^T is a view): each matrix is passed
as a pointer per head and a leading dimension, transposed for BLAS when its rows are the
contiguous axis. :func:`run` checks every array first and returns None when it cannot take
them (dtype, strides, shapes, mask layout); the caller then runs its NumPy form.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ge_sdk import gemm

_lock = threading.Lock()
_kernels: dict[str, Any] = {}

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _build(dtype: np.dtype):
    fn = gemm.cblas(dtype)
    if fn is None:
        return None
    import numba
    from numba import njit, prange

    if dtype == np.float32:
        from ge_sdk.vmath import expneg32 as exp_neg
    else:
        exp_neg = njit(inline="always")(lambda v: math.exp(v))
    scalar = dtype.type
    one, zero = scalar(1.0), scalar(0.0)
    item = dtype.itemsize
    row_major, no_trans = _ROW_MAJOR, _NO_TRANS

    @njit(fastmath={"nnan", "nsz", "reassoc"})
    def row_max(r):
        # a NaN anywhere still makes the row NaN: exp(NaN - m) is NaN and so is the sum
        m = r[0]
        for j in range(1, r.shape[0]):
            v = r[j]
            m = v if v > m else m
        return m

    @njit(fastmath={"reassoc", "nsz"})
    def row_sum(r):
        s = zero
        for j in range(r.shape[0]):
            s += r[j]
        return s

    def heads(count, m, n, d, dv, q, q_off, q_ld, q_tr, k, k_off, k_ld, k_tr, v, v_off, v_ld, v_tr,
              o, o_off, o_ld, alpha, mask, m_off, m_rs, has_mask, scratch):
        for i in prange(count):
            s = scratch[numba.get_thread_id()]  # one scores block per thread, reused head after head
            fn(row_major, q_tr, k_tr, m, n, d, alpha, q + q_off[i] * item, q_ld, k + k_off[i] * item, k_ld,
               zero, s.ctypes.data, n)
            for r in range(m):
                row = s[r]
                if has_mask:
                    base = m_off[i] + r * m_rs
                    for j in range(n):
                        row[j] += mask[base + j]
                mx = row_max(row)
                for j in range(n):
                    row[j] = exp_neg(row[j] - mx)
                inv = one / row_sum(row)
                for j in range(n):
                    row[j] *= inv
            fn(row_major, no_trans, v_tr, m, dv, n, one, s.ctypes.data, n, v + v_off[i] * item, v_ld,
               zero, o + o_off[i] * item, o_ld)

    nt = numba.types
    sc = getattr(nt, dtype.name)
    i64, i64a = nt.int64, nt.Array(nt.int64, 1, "C", readonly=True)
    sig = nt.void(i64, i64, i64, i64, i64, i64, i64a, i64, i64, i64, i64a, i64, i64, i64, i64a, i64, i64,
                  i64, i64a, i64, sc, nt.Array(sc, 1, "C", readonly=True), i64a, i64, nt.boolean,
                  nt.Array(sc, 3, "C"))
    try:
        return njit(sig, parallel=True, nogil=True, error_model="numpy")(heads)
    except Exception:  # noqa: BLE001 - numba refuses (no thread-safe layer): the NumPy form runs
        return None


def _kernel(dtype: np.dtype):
    with _lock:
        if dtype.name not in _kernels:
            _kernels[dtype.name] = _build(dtype) if gemm.available() else None
        return _kernels[dtype.name]


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


def _plan(q: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: np.ndarray | None):
    """(count, m, n, d, dv, per-matrix (offsets, ld, trans), output offsets, mask parts) for
    these arrays, or None when this path cannot take them."""
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
    o_off = np.arange(count, dtype=np.int64) * (m * dv)
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
    return count, m, n, d, dv, mats, o_off, mask_part


def run(q: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float, out: np.ndarray | None,
        width: int) -> np.ndarray | None:
    """The attention of every head on ``width`` threads, or None when this path cannot take
    these arrays (the caller runs the NumPy form)."""
    dt = q.dtype
    if dt.name not in ("float32", "float64") or kt.dtype != dt or v.dtype != dt or q.ndim < 3:
        return None
    if mask is not None and not isinstance(mask, np.ndarray):
        return None
    key = (dt.name, q.shape, q.strides, kt.shape, kt.strides, v.shape, v.strides,
           None if mask is None else (mask.dtype.name, mask.shape))
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(q, kt, v, mask)
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        _plans[key] = plan if plan is not None else False
    if not plan:
        return None
    fn = _kernel(dt)
    if fn is None:
        return None
    count, m, n, d, dv, mats, o_off, (m_rs, moffs, mshape) = plan
    shape = q.shape[:-2] + (m, dv)
    res = out if out is not None and out.shape == shape and out.flags.c_contiguous and out.dtype == dt \
        and not any(np.may_share_memory(out, x) for x in (q, kt, v)) else np.empty(shape, dt)
    if mask is not None:
        mflat = np.ascontiguousarray(mask).reshape(-1)  # its plan's offsets are C order over `mshape`
    else:
        mflat = _no_mask(dt)
    width = gemm.set_width(width)
    scratch = np.empty((width, m, n), dt)
    (qo, qld, qtr), (ko, kld, ktr), (vo, vld, vtr) = mats
    fn(count, m, n, d, dv, q.ctypes.data, qo, qld, qtr, kt.ctypes.data, ko, kld, ktr, v.ctypes.data, vo, vld, vtr,
       res.ctypes.data, o_off, dv, dt.type(scale), mflat, moffs, m_rs, mask is not None, scratch)
    if out is not None and res is not out:
        np.copyto(out, res)
        return out
    return res


_NO_MASK: dict[str, np.ndarray] = {}


def _no_mask(dt: np.dtype) -> np.ndarray:
    a = _NO_MASK.get(dt.name)
    if a is None:
        a = _NO_MASK[dt.name] = np.zeros(1, dt)
    return a
