"""RMSNorm's CPU kernel: ``x / sqrt(mean(x²) + eps) * gamma`` over the last axis (T5, LLaMA).

One compiled pass per row (native C): the sum of squares is reassociated so it vectorises,
then the row is scaled by its reciprocal root and by ``gamma`` while it is in cache. The same
order of operations as the exported graph (``x * (1 / sqrt(ms + eps))``, then ``* gamma``).

The row loop is one of :mod:`ge_cpu.fused.loopgen`'s row kernels (with its in-place form, which an
output that is the input runs). Without a C compiler (or with ``GE_FUSION_JIT=0``) the kernel is
NumPy code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.kernel import with_caps

from . import loopgen


def row_kernel(dtype: Any) -> Any:
    """The compiled ``fn(x2d, gamma1d, eps, out2d)`` (``out`` may be ``x``) for ``dtype``
    (float32/float64), or None without native kernels: :func:`ge_cpu.fused.loopgen.row_kernel`'s rmsnorm."""
    return loopgen.row_kernel("rmsnorm", dtype)


def rmsnorm_numpy(x: np.ndarray, gamma: np.ndarray | None, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """The NumPy form (any dtype, any layout); ``out`` may be ``x``."""
    ms = np.einsum("...i,...i->...", x, x)[..., None]
    ms *= ms.dtype.type(1.0 / x.shape[-1])
    ms += ms.dtype.type(eps)
    np.sqrt(ms, out=ms)
    np.divide(ms.dtype.type(1), ms, out=ms)
    y = np.multiply(x, ms, out=out)
    if gamma is not None:
        y *= gamma
    return y


def rmsnorm_factory(spec):
    """The CPU kernel of ge.fused::RMSNorm (inputs x, optional gamma; attribute epsilon)."""
    eps = float(spec.attr("epsilon", 1e-6))
    t = spec.outputs[0]
    dt = t.dtype if t.dtype is not None else np.dtype("float32")
    rows = row_kernel(dt)
    ones: dict[int, np.ndarray] = {}

    def as_row(p, d: int):
        if p is None:
            if d not in ones:
                ones[d] = np.ones(d, dt)
            return ones[d]
        if p.dtype != dt or p.size != d or (p.ndim > 1 and p.shape[-1] != d):
            return None
        return np.ascontiguousarray(p.reshape(d))

    def kernel(x, gamma=None, out=None):
        o = None if out is None else out[0]
        if rows is not None and x.dtype == dt and x.ndim and x.size and x.flags.c_contiguous:
            d = x.shape[-1]
            g = as_row(gamma, d)
            if g is not None:
                y = o if o is not None and o.flags.c_contiguous and o.shape == x.shape else np.empty_like(x)
                loopgen.by_rows(rows, x.reshape(-1, d), y.reshape(-1, d), g, dt.type(eps))  # y may be x
                if o is not None and y is not o:
                    np.copyto(o, y)
                    y = o
                return (y,)
        if o is not None and o.shape != np.broadcast_shapes(x.shape, () if gamma is None else gamma.shape):
            o = None
        y = rmsnorm_numpy(x, gamma, eps, o)
        if out is not None and y is not out[0]:
            np.copyto(out[0], y)
            y = out[0]
        return (y if y.dtype == dt else y.astype(dt),)

    with_caps(kernel, accepts_out=True, inplace_ok=True, variant="loop" if rows is not None else "numpy")
    return kernel
