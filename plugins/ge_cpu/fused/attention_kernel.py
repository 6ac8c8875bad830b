"""CPU kernel of the fused Attention op: ``softmax(Q Kᵀ * scale + mask) V``, one task per
(batch, head) on native threads for large work (:mod:`ge_cpu.fused.attention`), else batched
NumPy matmuls around a one-pass scaled-softmax row kernel. A quantised model's fake-quants of the
scores or probabilities (the ``*_quant`` attributes) run on the batched form, each where the
unfused graph has it (:mod:`ge_native.fakequant`, the same bits)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.kernel import KernelSpec, with_caps
from ge_native import fakequant, parallel
from ge_sdk.fused import ATTENTION_QUANTS, attention_perm, attention_quant

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


def _bf16_attention(q, kt, v, mask, scale: float, o, unit: str | None) -> np.ndarray | None:
    """``softmax(Q Kᵀ scale + mask) V`` with both products in bf16 (:mod:`ge_native.bf16attn`),
    the heads of every leading index (broadcast, as the views give them); None (nothing written)
    where the operands do not fit it (the float32 path runs then)."""
    from ge_native import bf16attn

    m, d = q.shape[-2:]
    n, dv = kt.shape[-1], v.shape[-1]
    if kt.shape[-2] != d or v.shape[-2] != n or (mask is not None and (mask.dtype != np.float32 or mask.ndim < 2)):
        return None
    try:
        lead = np.broadcast_shapes(q.shape[:-2], kt.shape[:-2], v.shape[:-2],
                                   () if mask is None else mask.shape[:-2])
        mb = None if mask is None else np.broadcast_to(mask, lead + (m, n))
    except ValueError:
        return None
    out = o if o is not None and o.shape == lead + (m, dv) and o.dtype == np.float32 else \
        np.empty(lead + (m, dv), np.float32)
    qb, kb, vb = (np.broadcast_to(a, lead + a.shape[-2:]) for a in (q, kt, v))
    if not lead:  # one head
        qb, kb, vb, out3 = qb[None], kb[None], vb[None], out[None]
        mb = None if mb is None else mb[None]
        heads = [()]
    else:
        out3 = out
        heads = list(np.ndindex(*lead[:-1]))  # the last leading axis is the kernel's head axis
    width = parallel.native_width()
    for i in heads:
        if not bf16attn.attention(qb[i], kb[i], vb[i], out3[i], scale, None if mb is None else mb[i], width, unit):
            return None
    return out


#: a fake-quant attribute read: (scale, lo, hi)
Quant = tuple[float, float, float]


def _attention_quants(spec: KernelSpec, dt: np.dtype) -> tuple[Quant | None, ...]:
    """The fake-quants of a quantised model (ATTENTION_QUANTS, checked when the node was; float32
    only, the dtype of the fake-quant)."""
    try:
        quants = tuple(attention_quant(spec.attrs, name) for name in ATTENTION_QUANTS)
    except ValueError as e:
        raise refuse(spec, str(e)) from None
    if any(quants) and np.dtype(dt) != np.float32:
        raise refuse(spec, f"fake-quant attributes need float32, not {np.dtype(dt).name}")
    return quants


def _fake_quant(x: np.ndarray, q: Quant, width: int) -> None:
    """``x = clip(rint(x / scale), lo, hi) * scale`` in place, float32 (``q``: scale, lo, hi)."""
    fakequant.fake_quant(x, q[0], q[1], q[2], out=x, width=width)


def _quantised_scores(s: np.ndarray, scale: float, mask: np.ndarray | None, quants: tuple[Quant | None, ...], rows: Any,
                      width: int) -> None:
    """``s = softmax(fq3(fq2(fq1(s) · scale) + mask))`` in place, each fake-quant (of ``quants``:
    scores, scaled, masked; None: none) in float32 where the unfused graph has it, the same bits."""
    fq1, fq2, fq3 = quants
    if fq1 is not None:
        _fake_quant(s, fq1, width)
    if scale != 1.0:
        s *= s.dtype.type(scale)
    if fq2 is not None:
        _fake_quant(s, fq2, width)
    if mask is not None:
        s += mask
    if fq3 is not None:
        _fake_quant(s, fq3, width)
    softmax_inplace(s, -1, rows)


def attention_factory(spec: KernelSpec):
    from .attention import SERIAL_WORK as serial_work
    scale = float(spec.attr("scale", 1.0))
    dt = out_type(spec)[0]
    quants = _attention_quants(spec, dt)
    fq_scores, fq_probs, fq_out = quants[:3], quants[3], quants[4]
    in_scores = any(fq_scores) or fq_probs is not None  # fake-quants the heads kernels have no form of
    compute = spec.attr("compute_dtype", "") or ""
    in_bf16 = (compute.decode() if isinstance(compute, bytes) else str(compute)) == "bfloat16" and dt == np.float32 \
        and not any(quants)  # a quantised model's fake-quants: the float32 path
    unit = None
    if in_bf16:  # (a model moved to a CPU with no bf16 unit faster than float32: the float32 path)
        from ge_native import bf16attn

        from ..reduced import bf16_unit

        unit = bf16_unit() if bf16attn.isa() is not None else None
        in_bf16 = unit is not None
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
        r = _bf16_attention(q, kt, v, mask, scale, o, unit) if in_bf16 else None
        if r is None and width > 1 and work >= serial_work and not in_scores:
            # one task per (batch, head) on native threads (ge_cpu.fused.attention)
            from . import attention

            r = attention.run(q, kt, v, mask, scale, o, parallel.threads())
        if r is None:
            s = np.matmul(q, kt)
            if any(fq_scores):
                _quantised_scores(s, scale, mask, fq_scores, rows, width)
            elif not _scaled_softmax(scaled, s, scale, mask):
                if scale != 1.0:
                    s *= s.dtype.type(scale)
                if mask is not None:
                    s += mask
                softmax_inplace(s, -1, rows)
            if fq_probs is not None:
                _fake_quant(s, fq_probs, width)
            r = np.matmul(s, v, out=o)
        if fq_out is not None:  # elementwise: on the whole output buffer (C order) where r is a view of it
            y = dest if dest is not None and r is o else r
            _fake_quant(y, fq_out, width)
        if dest is not None and r is o:
            return (dest,)
        return (r if po is None else r.transpose(po),)

    if in_bf16:
        return mark_out(with_caps(kernel, algorithm="bf16_heads", variant=str(unit)))
    with_caps(kernel, algorithm="heads" if width > 1 and not in_scores else "batched", variant=rows_variant(scaled))
    return mark_out(kernel)

