"""CPU kernel of the fused Attention op: ``softmax(Q Kᵀ * scale + mask) V``, one task per
(batch, head) on native threads for large work (:mod:`ge_cpu.fused.attention`), else batched
NumPy matmuls around a one-pass scaled-softmax row kernel."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.kernel import KernelSpec, with_caps
from ge_native import parallel
from ge_sdk.fused import attention_perm

from .elementwise import mark_out, out_type, refuse
from .norms import row_kernel_for, row_softmax, rows_variant, softmax_inplace

_NO_ROWS: dict[str, np.ndarray] = {}


def _scaled_softmax(fn: Any, s: np.ndarray, scale: float, mask: np.ndarray | None) -> bool:
    """``s = softmax(s * scale + mask)`` over the last axis in one pass of the row kernel
    (``softmax_scaled``) when ``s`` is a C-order score array and ``mask`` is None or one row, or
    one ``(queries, keys)`` block, for every head and batch; False (nothing done) otherwise."""
    if fn is None or s.dtype != fn.ge_dtype or not s.flags.c_contiguous or s.ndim < 2 or not s.size:
        return False
    n = s.shape[-1]
    if mask is None:
        m2, period = _NO_ROWS.get(s.dtype.name), 0
        if m2 is None:
            m2 = _NO_ROWS[s.dtype.name] = np.zeros(1, s.dtype)
    else:
        if not isinstance(mask, np.ndarray) or mask.dtype != s.dtype or mask.ndim > s.ndim:
            return False
        ms = (1,) * (s.ndim - mask.ndim) + mask.shape
        if ms[-1] != n or any(d != 1 for d in ms[:-2]) or ms[-2] not in (1, s.shape[-2]):
            return False
        period = ms[-2]
        m2 = np.ascontiguousarray(mask).reshape(period, n)
        if np.may_share_memory(m2, s):
            return False
    v = s.reshape(-1, n)
    fn(v, float(scale), m2, period, v)
    return True


def _attention_perm(spec: KernelSpec, name: str, i: int) -> list[int] | None:
    """An Attention kernel's permutation attribute (checked when the node was; None: identity)."""
    t = spec.inputs[i] if i < len(spec.inputs) else None
    try:
        return attention_perm(spec.attrs, name, getattr(t, "rank", None))
    except ValueError as e:
        raise refuse(spec, str(e)) from None


def attention_factory(spec: KernelSpec):
    from .attention import SERIAL_WORK as serial_work
    scale = float(spec.attr("scale", 1.0))
    dt = out_type(spec)[0]
    rows = row_softmax(dt)
    scaled = row_kernel_for("softmax_scaled", dt)
    if scaled is not None:
        scaled.ge_dtype = np.dtype(dt)
    width = parallel.planned_width(spec)
    if width > 1:
        from . import attention

        attention.prepare(dt)  # built now, not on the first run

    # the operands as transposes of the inputs, the output as one of the result (perm_* attributes:
    # the exporter's Transposes around the heads, folded; the views cost nothing)
    pq, pkt, pv, po = (_attention_perm(spec, name, i) for name, i in
                       (("perm_q", 0), ("perm_kt", 1), ("perm_v", 2), ("perm_out", 0)))  # out: Q's rank
    po_inv = None if po is None else [int(i) for i in np.argsort(po)]

    def kernel(q, kt, v, mask=None, out=None):
        if pq is not None:
            q = q.transpose(pq)
        if pkt is not None:
            kt = kt.transpose(pkt)
        if pv is not None:
            v = v.transpose(pv)
        dest = None if out is None else out[0]
        o = dest if dest is None or po_inv is None else dest.transpose(po_inv)
        work = q.size // max(1, q.shape[-1]) * kt.shape[-1] * (q.shape[-1] + v.shape[-1])  # multiply-adds
        r = None
        if width > 1 and work >= serial_work:
            # one task per (batch, head) on native threads (ge_cpu.fused.attention)
            from . import attention

            r = attention.run(q, kt, v, mask, scale, o, parallel.threads())
        if r is None:
            s = np.matmul(q, kt)
            if not _scaled_softmax(scaled, s, scale, mask):
                if scale != 1.0:
                    s *= s.dtype.type(scale)
                if mask is not None:
                    s += mask
                softmax_inplace(s, -1, rows)
            r = np.matmul(s, v, out=o)
        if dest is not None and r is o:
            return (dest,)
        return (r if po is None else r.transpose(po),)

    with_caps(kernel, algorithm="heads" if width > 1 else "batched", variant=rows_variant(scaled))
    return mark_out(kernel)

