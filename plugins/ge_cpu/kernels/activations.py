"""Gated activations: Swish (opset 24) and SwiGLU (opset 28).

``Swish(x) = x * sigmoid(alpha * x)``, with the sigmoid evaluated through ``e = exp(-|z|)`` as
``1 / (1 + e)`` or ``e / (1 + e)`` (no overflow, full relative accuracy in both tails);
``SwiGLU(A, B) = Swish(A) * B`` for same-shape ``A`` and ``B``. float16/bfloat16 compute in
float32.
"""

from __future__ import annotations

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.kernel import KernelSpec, with_caps

from ._util import in_dtype, kernel_table, unsupported

KERNELS, _reg = kernel_table()

_FLOATS = ("float16", "float32", "float64", "bfloat16")


def _swish(x: np.ndarray, alpha: float, out: np.ndarray | None = None) -> np.ndarray:
    """x * sigmoid(alpha * x) in x's dtype (float32/float64), into ``out`` when given."""
    t = x.dtype.type
    z = np.multiply(x, t(alpha))
    neg = z < 0
    e = np.abs(z)
    np.negative(e, out=e)
    np.exp(e, out=e)  # exp(-|z|) in (0, 1]
    r = np.add(e, t(1))
    np.reciprocal(r, out=r)  # sigmoid(|z|)
    e *= r  # sigmoid(-|z|)
    np.copyto(r, e, where=neg)
    return np.multiply(x, r, out=out)


def _check(spec: KernelSpec, n: int) -> np.dtype | None:
    dt = None
    for i in range(n):
        dt = in_dtype(spec, i)
        if dt is not None and dt.name not in _FLOATS:
            raise unsupported(spec, f"input dtype {dt.name}")
    return dt


def _native(dt: np.dtype | None) -> bool:
    return dt is not None and dt.name in ("float32", "float64")


@_reg("Swish")
def swish_factory(spec: KernelSpec):
    dt = _check(spec, 1)
    alpha = float(spec.attr("alpha", 1.0))

    def kernel(x, out=None):
        if x.dtype.name in ("float32", "float64"):
            return (_swish(x, alpha, None if out is None else out[0]),)
        return (_swish(x.astype(np.float32), alpha).astype(x.dtype),)

    if _native(dt):
        with_caps(kernel, accepts_out=True)
    return kernel


@_reg("SwiGLU")
def swiglu_factory(spec: KernelSpec):
    dt = _check(spec, 2)
    alpha = float(spec.attr("alpha", 1.0))

    def kernel(a, b, out=None):
        if a.shape != b.shape:
            raise ExecutionError(f"{spec.describe()}: A {list(a.shape)} and B {list(b.shape)} must have the same "
                                 "shape (SwiGLU does not broadcast)", hint="split the projection evenly")
        if a.dtype.name in ("float32", "float64"):
            y = _swish(a, alpha, None if out is None else out[0])
            y *= b
            return (y,)
        y = _swish(a.astype(np.float32), alpha)
        y *= b.astype(np.float32)
        return (y.astype(a.dtype),)

    if _native(dt):
        with_caps(kernel, accepts_out=True)
    return kernel
