"""CPU kernels of LayerNorm, Softmax and Rotary (row kernels of :mod:`ge_cpu.fused.loopgen` where
they compile, else NumPy), and the softmax helpers the Attention kernel shares."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.kernel import KernelSpec, with_caps

from . import loopgen
from .elementwise import mark_out, out_type


def row_kernel_for(kind: str, dtype: Any):
    return loopgen.row_kernel(kind, dtype)


def rows_variant(rows: Any) -> str:
    """The form a kernel with row kernel ``rows`` runs: ``"loop"`` (compiled, loopgen) or ``"numpy"``."""
    return "loop" if rows is not None else "numpy"


def softmax_inplace(s: np.ndarray, axis: int, rows=None) -> np.ndarray:
    if s.size == 0:  # an empty extent first: nothing to normalise (max would have no identity)
        return s
    if rows is not None and s.dtype == rows.ge_dtype and s.flags.c_contiguous and s.ndim and s.size \
            and axis in (-1, s.ndim - 1):
        v = s.reshape(-1, s.shape[-1])
        rows(v, v)  # one pass per row: max, exp, sum, scale (ge_cpu.fused.loopgen)
        return s
    s -= s.max(axis=axis, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=axis, keepdims=True)
    return s


def row_softmax(dtype: Any):
    fn = row_kernel_for("softmax", dtype)
    if fn is not None:
        fn.ge_dtype = np.dtype(dtype)
    return fn



def layernorm_factory(spec: KernelSpec):
    eps = float(spec.attr("epsilon", 1e-5))
    dt, _ = out_type(spec)
    rows = row_kernel_for("layernorm", dt)
    ones: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def as_row(p, d: int, fill: float):
        if p is None:
            if d not in ones:
                ones[d] = (np.ones(d, dt), np.zeros(d, dt))
            return ones[d][0 if fill else 1]
        if p.dtype != dt or p.size != d or (p.ndim > 1 and p.shape[-1] != d):
            return None
        return np.ascontiguousarray(p.reshape(d))

    def kernel(x, gamma=None, beta=None, out=None):
        if rows is not None and x.dtype == dt and x.ndim and x.size and x.flags.c_contiguous:
            d = x.shape[-1]
            g, b = as_row(gamma, d, 1.0), as_row(beta, d, 0.0)
            o = None if out is None else out[0]
            if g is not None and b is not None:
                y = o if o is not None and o.flags.c_contiguous and o.shape == x.shape else np.empty_like(x)
                loopgen.by_rows(rows, x.reshape(-1, d), y.reshape(-1, d), g, b, dt.type(eps))
                if o is not None and y is not o:
                    np.copyto(o, y)
                    y = o
                return (y,)
        d = x - x.mean(axis=-1, keepdims=True)
        var = np.einsum("...i,...i->...", d, d)[..., None]
        var *= var.dtype.type(1.0 / x.shape[-1])
        var += var.dtype.type(eps)
        np.sqrt(var, out=var)
        d /= var
        o = None if out is None else out[0]
        if gamma is not None:
            y = np.multiply(d, gamma, out=o)
        elif o is not None:
            np.copyto(o, d)
            y = o
        else:
            y = d
        if beta is not None:
            y += beta
        return (y,)

    with_caps(kernel, variant=rows_variant(rows))
    return mark_out(kernel)


def softmax_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", -1))
    rank = len(spec.inputs[0].shape) if spec.inputs and spec.inputs[0] is not None and spec.inputs[0].shape is not None \
        else None
    if rank is not None and axis < 0:
        axis += rank
    rows = row_softmax(out_type(spec)[0]) if rank is not None and axis == rank - 1 else None

    def kernel(x, out=None):
        o = None if out is None else out[0]
        if rows is not None and x.dtype == rows.ge_dtype and x.size and x.flags.c_contiguous and \
                (o is None or (o.flags.c_contiguous and o.shape == x.shape)):
            y = np.empty_like(x) if o is None else o
            loopgen.by_rows(rows, x.reshape(-1, x.shape[-1]), y.reshape(-1, x.shape[-1]))  # y may be x
            return (y,)
        if o is None:
            y = x.astype(x.dtype, copy=True)
        else:
            y = o
            np.copyto(y, x)
        return (softmax_inplace(y, axis),)

    with_caps(kernel, variant=rows_variant(rows))
    return mark_out(kernel, inplace=True)


def rotary_factory(spec: KernelSpec):
    """Rotary(x, cos, sin) = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (x1, x2 the
    halves of the last axis): two multiplies and two multiply-adds on halves, into the output
    (the exporters' Slice, Slice, Neg, Concat and the elementwise tail made five kernels and four
    temporaries of it)."""

    rdt = np.dtype(out_type(spec)[0])
    rows = loopgen.row_kernel("rotary", rdt) if rdt.name in ("float32", "float64") else None

    def kernel(x, cos, sin, out=None):
        d = x.shape[-1] if x.ndim else 0
        if d % 2 or cos.shape[-1:] != (d,) or sin.shape[-1:] != (d,):
            raise ExecutionError(f"{spec.describe()}: input {x.shape}, cos {cos.shape}, sin {sin.shape}: the last axes "
                                 "must agree and be even", hint="check the rotary caches")
        h = d // 2
        o = out[0] if out is not None and out[0].shape == x.shape and not np.may_share_memory(out[0], x) \
            else np.empty(np.broadcast_shapes(x.shape, cos.shape, sin.shape), x.dtype)
        # one pass per row on the run's threads: cos and sin the same (positions, d) rows for
        # every leading index (LLaMA's (1, 1, positions, d) caches); else NumPy's passes below
        if (rows is not None and d and x.dtype == rdt == cos.dtype == sin.dtype and o.shape == x.shape
                and cos.shape == sin.shape and cos.ndim >= 2 and cos.ndim <= x.ndim
                and all(e == 1 for e in cos.shape[:-2]) and cos.shape[-2] in (1, x.shape[-2])
                and x.flags.c_contiguous and o.flags.c_contiguous):
            p = cos.shape[-2]
            rows(x.reshape(-1, d), np.ascontiguousarray(cos).reshape(p, d), np.ascontiguousarray(sin).reshape(p, d),
                 p, o.reshape(-1, d))
            if out is not None and o is not out[0]:
                np.copyto(out[0], o)
                return out
            return (o,)
        np.multiply(x, cos, out=o)
        lo, hi = o[..., :h], o[..., h:]
        lo -= x[..., h:] * sin[..., :h]
        hi += x[..., :h] * sin[..., h:]
        if out is not None and o is not out[0]:
            np.copyto(out[0], o)
            return out
        return (o,)

    with_caps(kernel, variant=rows_variant(rows))
    return mark_out(kernel)

