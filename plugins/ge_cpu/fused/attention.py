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
``(b, heads, s, d)``: written in place, no Transpose after). :func:`run` checks every array
first and returns None when it cannot take them (dtype, strides, shapes, mask layout); the caller then runs its NumPy form.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ge_native import gemm, native

_lock = threading.Lock()
_kernels: dict[str, Any] = {}

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


#: the C of the heads kernel (ge_native's csrc/attention_heads.c, after the BLAS types of
#: :func:`ge_native.gemm.blas_decls`): one task per head; the arguments are (gemm address, count, m, n, d, dv, then for q, k and v:
#: address, per-head element offsets, leading dimension, BLAS transpose flag; the output's
#: address, offsets and leading dimension; alpha, the flat mask, its per-head offsets, its row
#: stride, has_mask, the scratch blocks (width x m x n), width); the caller checked every array
#: the addresses come from
_HEADS_SRC = "attention_heads.c"


def _build(dtype: np.dtype):
    blas = gemm.cblas_native(dtype)
    if blas is None:
        return None
    addr, integer = blas
    mod = native.build(gemm.blas_decls(integer) + native.c_source(_HEADS_SRC), ["heads_f32", "heads_f64"])
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
