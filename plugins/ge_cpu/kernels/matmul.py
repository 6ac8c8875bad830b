"""Matrix kernels: MatMul, Gemm, Einsum (BLAS does the work; GEMMs split over GE's thread pool,
:func:`ge_native.parallel.matmul`)."""

from __future__ import annotations

import math

import numpy as np

from ge_core.kernel import KernelSpec, with_caps
from ge_native import isa, parallel, sgemm

from ._util import as_str, cast_like, const_input, has_input

KERNELS: dict = {}


def _fits(o: np.ndarray | None, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``o`` when ``np.matmul(a, b, out=o)`` can write it (its shape and dtype are the product's
    and it overlaps neither operand), else None (the executor copies the result into place)."""
    if o is None or a.ndim < 2 or b.ndim < 2 or o.dtype != a.dtype or a.dtype != b.dtype:
        return None
    try:
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    if o.shape != lead + (a.shape[-2], b.shape[-1]) or np.may_share_memory(o, a) or np.may_share_memory(o, b):
        return None
    return o


def matmul_factory(spec: KernelSpec):
    w = const_input(spec, 1)
    # a constant 2-D float32 weight: packed once for GE's own GEMM (ge_native.sgemm)
    panels = sgemm.Panels(w) if w is not None and w.ndim == 2 and w.dtype == np.float32 and sgemm.available() else None
    packed, _ = parallel.pack_for(spec, w) if panels is None else (None, None)

    def kernel(a, b, out=None):
        # the product goes straight into the planned output (no result array, no copy)
        o = None if out is None else out[0]
        if panels is not None and a.ndim >= 1 and a.dtype == np.float32 and a.shape[-1] == panels.k:
            shape = a.shape[:-1] + (panels.n,)
            y = o if o is not None and o.shape == shape and o.dtype == a.dtype and o.flags.c_contiguous \
                and o.flags.writeable and not np.may_share_memory(o, a) else np.empty(shape, np.float32)
            rows = math.prod(a.shape[:-1])  # (not -1: a k or n of 0 leaves it undefined)
            if sgemm.matmul_packed(np.ascontiguousarray(a.reshape(rows, panels.k)), panels, y.reshape(rows, panels.n),
                                   None, None, parallel.native_width()):
                return (y,)
        if packed is not None and a.ndim >= 1 and a.dtype == packed.dtype and a.shape[-1] == packed.k:
            o = o if o is not None and o.shape == a.shape[:-1] + (packed.n,) and o.dtype == a.dtype \
                and o.flags.c_contiguous and not np.may_share_memory(o, a) else None
            return (packed.matmul(a, out=o),)
        o = _fits(o, a, b)
        return (cast_like(parallel.matmul(a, b, out=o), a.dtype),)

    with_caps(kernel, accepts_out=True)
    if panels is not None:  # GE's own GEMM runs: the report names its instruction set
        with_caps(kernel, variant=isa.variant_of("sgemm"))
    return kernel


def gemm_factory(spec: KernelSpec):
    alpha = float(spec.attr("alpha", 1.0))
    beta = float(spec.attr("beta", 1.0))
    trans_a = int(spec.attr("transA", 0))
    trans_b = int(spec.attr("transB", 0))
    with_c = has_input(spec, 2)

    # Pre-scale constant operands at build time so the call is one GEMM plus one add.
    b_const = const_input(spec, 1)
    if b_const is not None:
        b_const = b_const.T if trans_b else b_const
        if alpha != 1.0:
            b_const = np.ascontiguousarray(b_const * b_const.dtype.type(alpha))
        alpha_run = 1.0
    else:
        alpha_run = alpha
    c_const = const_input(spec, 2) if with_c else None
    if c_const is not None and beta != 1.0:
        c_const = c_const * c_const.dtype.type(beta)
    beta_run = 1.0 if c_const is not None else beta
    # a constant float32 weight: packed once for GE's own GEMM (ge_native.sgemm), a bias row added
    # at its store
    panels, panel_bias = None, None
    if not trans_a and b_const is not None and b_const.ndim == 2 and b_const.dtype == np.float32 and sgemm.available():
        panels = sgemm.Panels(np.ascontiguousarray(b_const))
        if c_const is None or (c_const.dtype == np.float32 and c_const.size == panels.n
                               and c_const.shape[-1] == panels.n):
            panel_bias = None if c_const is None else np.ascontiguousarray(c_const.reshape(panels.n))
        else:
            panels = None
    packed, bias = parallel.pack_for(spec, b_const, c_const) if not trans_a and panels is None else (None, None)

    def kernel(a, b, c=None, out=None):
        o = None if out is None else out[0]
        if panels is not None and a.dtype == np.float32 and a.ndim == 2 and a.shape[1] == panels.k \
                and (c is None or c_const is not None):
            shape = (a.shape[0], panels.n)
            y = o if o is not None and o.shape == shape and o.dtype == a.dtype and o.flags.c_contiguous \
                and o.flags.writeable and not np.may_share_memory(o, a) else np.empty(shape, np.float32)
            if sgemm.matmul_packed(np.ascontiguousarray(a), panels, y, panel_bias, None, parallel.native_width()):
                return (y,)
        if packed is not None and a.dtype == packed.dtype and a.ndim == 2 and a.shape[1] == packed.k and \
                (c_const is None or bias is not None) and (c is None or c_const is not None):
            o = o if o is not None and o.shape == (a.shape[0], packed.n) and o.dtype == a.dtype \
                and o.flags.c_contiguous and not np.may_share_memory(o, a) else None
            return (packed.matmul(a, out=o, bias=bias),)
        if trans_a:
            a = a.T
        if b_const is not None:
            b = b_const
        elif trans_b:
            b = b.T
        o = _fits(o, a, b)
        if o is not None and c is not None and np.may_share_memory(o, c):
            o = None
        y = parallel.matmul(a, b, out=o)
        if alpha_run != 1.0:
            y *= y.dtype.type(alpha_run)
        if c_const is not None:
            c = c_const
        if c is not None and beta_run != 0.0:
            if beta_run != 1.0:
                c = c * c.dtype.type(beta_run)
            if np.broadcast_shapes(y.shape, c.shape) == y.shape:
                y += c
            else:
                y = y + c
        return (cast_like(y, a.dtype),)

    with_caps(kernel, accepts_out=True)
    if panels is not None:  # GE's own GEMM runs: the report names its instruction set
        with_caps(kernel, variant=isa.variant_of("sgemm"))
    return kernel


def einsum_factory(spec: KernelSpec):
    eq = as_str(spec.attr("equation"), "").replace(" ", "")

    def kernel(*xs):
        dt = xs[0].dtype
        if dt.kind == "V" or dt.name == "bfloat16" or dt.name.startswith("float8"):
            xs = tuple(x.astype(np.float32) for x in xs)  # ml_dtypes types: compute in float32
        r = np.einsum(eq, *xs, optimize=len(xs) > 1)
        return (cast_like(np.asarray(r), dt),)

    return kernel


KERNELS[("", "MatMul")] = matmul_factory
KERNELS[("", "Gemm")] = gemm_factory
KERNELS[("", "Einsum")] = einsum_factory
