"""RMSNorm's CPU kernel: ``x / sqrt(mean(x²) + eps) * gamma`` over the last axis (T5, LLaMA).

One compiled pass per row (numba): the sum of squares is reassociated so LLVM vectorises it,
then the row is scaled by its reciprocal root and by ``gamma`` while it is in cache. The same
order of operations as the exported graph (``x * (1 / sqrt(ms + eps))``, then ``* gamma``).

An output that is the input (in place) runs a variant that reads and writes one array: with
two arguments that alias exactly, LLVM's run-time overlap check fails and the loop runs scalar.
Without numba (or with ``GE_FUSION_JIT=0``) the kernel is NumPy code. The source is fixed text,
checked like generated code all the same (:func:`ge_sdk.gensrc.compile_checked`).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ge_sdk import gensrc, parallel
from ge_sdk.jit import numba_if_enabled

#: dtypes the row kernel is compiled for
DTYPES = ("float32", "float64")

_SRC = '''
def rmsnorm(x, gamma, eps, out):
    n, d = x.shape
    inv = ONE / d
    for i in range(n):
        r = x[i]
        o = out[i]
        s = ZERO
        for k in range(d):
            s += r[k] * r[k]
        rs = ONE / math.sqrt(s * inv + eps)
        for k in range(d):
            o[k] = r[k] * rs * gamma[k]


# in place (out is x): one array, so LLVM needs no run-time overlap check, which an exact alias
# fails (the loop then runs scalar)
def rmsnorm_ip(x, gamma, eps):
    n, d = x.shape
    inv = ONE / d
    for i in range(n):
        r = x[i]
        s = ZERO
        for k in range(d):
            s += r[k] * r[k]
        rs = ONE / math.sqrt(s * inv + eps)
        for k in range(d):
            r[k] = r[k] * rs * gamma[k]
'''

_VOCAB = gensrc.Vocabulary(
    names=frozenset({"rmsnorm", "rmsnorm_ip", "x", "gamma", "eps", "out", "n", "d", "inv", "ONE", "ZERO", "math",
                     "range", "i", "k", "r", "o", "s", "rs"}),
    attributes=frozenset({"shape", "sqrt"}))

_lock = threading.Lock()
_rows: dict[str, Any] = {}


def row_kernel(dtype: Any) -> Any:
    """The compiled ``fn(x2d, gamma1d, eps, out2d)`` (``out`` may be ``x``) for ``dtype``
    (float32/float64), or None without numba."""
    dt = np.dtype(dtype)
    if dt.name not in DTYPES:
        return None
    numba = numba_if_enabled("GE_FUSION_JIT")
    if numba is None:
        return None
    with _lock:
        if dt.name in _rows:
            return _rows[dt.name]
    nt = numba.types
    scalar = getattr(nt, dt.name)
    rw2, ro2 = nt.Array(scalar, 2, "C"), nt.Array(scalar, 2, "C", readonly=True)
    ro1 = nt.Array(scalar, 1, "C", readonly=True)
    ns: dict[str, Any] = {"math": math, "ONE": dt.type(1), "ZERO": dt.type(0)}
    exec(gensrc.compile_checked(_SRC, "<ge_fusion rmsnorm>", _VOCAB), ns)  # noqa: S102 - our own code, checked
    flags = {"reassoc", "nsz"}
    apart = numba.njit(nt.void(ro2, ro1, scalar, rw2), nogil=True, error_model="numpy", fastmath=flags)(ns["rmsnorm"])
    inplace = numba.njit(nt.void(rw2, ro1, scalar), nogil=True, error_model="numpy", fastmath=flags)(ns["rmsnorm_ip"])

    def fn(x, gamma, eps, out, _a=apart, _i=inplace):
        if out.ctypes.data == x.ctypes.data:
            _i(out, gamma, eps)
        else:
            _a(x, gamma, eps, out)

    with _lock:
        _rows[dt.name] = fn
    return fn


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


def _by_rows(fn, x2: np.ndarray, g: np.ndarray, eps, y2: np.ndarray) -> None:
    """``fn`` over row blocks, on GE's pool when the run is wider than one thread (the rows'
    results do not depend on the split)."""
    parts = parallel.chunks(x2.shape[0], x2.shape[1], min_cost=1 << 18, most=8) if parallel.threads() > 1 else []
    if len(parts) < 2:
        fn(x2, g, eps, y2)
        return
    parallel.parallel_for(len(parts), lambda i: fn(x2[parts[i][0]:parts[i][1]], g, eps, y2[parts[i][0]:parts[i][1]]))


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
                _by_rows(rows, x.reshape(-1, d), g, dt.type(eps), y.reshape(-1, d))  # reads x, writes y (may be x)
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

    kernel.accepts_out = True
    kernel.inplace_ok = True
    return kernel
