"""CPU kernels of FusedConv and FusedMatMul: the convolution or GEMM, then its epilogue (at the
GEMM's store where the kernel can apply it there, else one generated pass over the output)."""

from __future__ import annotations

import math

import numpy as np

from ge_core.kernel import KernelSpec, caps, with_caps
from ge_native import isa, parallel, sgemm
from ge_sdk.fused import CONV_ATTRS

from . import codegen
from .elementwise import compiled_epilogue, mark_out, out_type, refuse

#: epilogue ops GE's GEMM applies at its store, by their sgemm activation names
_STORE_ACTS = {"Sigmoid": "sigmoid", "Silu": "silu", "HardSwish": "hardswish"}


def store_epilogue(spec: KernelSpec, can: tuple[str, ...]):
    """``(clip, uses_addend, act)`` when the epilogue program is one a GEMM kernel applies at its
    store (``can``: its KernelCaps.epilogue): an optional ``Add(y, a0)`` (a residual), then at
    most one of ``Relu``, ``Clip``, ``Sigmoid``, ``Silu``, ``HardSwish``, ``Gelu``; else None."""
    program = spec.attr("epilogue", "") or ""
    if not program or not can:
        return None
    try:
        steps = codegen.loads(program, n_inputs=max(0, len(spec.inputs) - 3), anchor=True)
    except ValueError:
        return None
    uses_addend, last = False, "y"
    if steps and steps[0][0] == "Add" and list(steps[0][1]) == ["y", "a0"]:
        if "addend" not in can or len(spec.inputs) != 4:
            return None  # (the kernel checks the addend's dtype and shape at each call)
        uses_addend, steps, last = True, steps[1:], "t0"
    if not steps:
        return (None, True, None) if uses_addend else None
    if len(steps) != 1 or list(steps[0][1]) != [last]:
        return None
    op, _, attrs = steps[0]
    if op in ("Relu", "Clip") and "clip" in can:
        if op == "Relu":
            return (0.0, float("inf")), uses_addend, None
        if set(attrs) <= {"min", "max"}:
            lo, hi = float(attrs.get("min", -float("inf"))), float(attrs.get("max", float("inf")))
            return ((lo, hi), uses_addend, None) if lo <= hi else None
        return None
    if "act" not in can:
        return None
    if op == "Gelu":
        return None, uses_addend, "gelu_tanh" if attrs.get("approximate", "none") == "tanh" else "gelu"
    return (None, uses_addend, _STORE_ACTS[op]) if op in _STORE_ACTS else None


def conv_factory(spec: KernelSpec):
    from ge_core.plugins import get_host

    inner_factory = get_host().registries.kernels_for("cpu").get(("", "Conv"))
    if inner_factory is None:
        raise refuse(spec, "the cpu backend has no Conv kernel to run the convolution")
    n_conv = min(3, len(spec.inputs))
    inner_spec = KernelSpec(name=spec.name, op_type="Conv", domain="",
                            attrs={k: v for k, v in spec.attrs.items() if k in CONV_ATTRS},
                            inputs=list(spec.inputs[:n_conv]), outputs=list(spec.outputs),
                            const_inputs=list(spec.const_inputs[:n_conv]), opset=11, options=dict(spec.options))
    conv = inner_factory(inner_spec)
    conv_out = caps(conv).accepts_out
    epi = compiled_epilogue(spec, 3)
    at_store = store_epilogue(spec, caps(conv).epilogue)

    def kernel(x, w, b=None, *extra, out=None):
        # The convolution writes the planned output where it can (else its own contiguous
        # result), and the epilogue runs over it once: no extra pass over memory. A clip and a
        # residual the convolution can apply at its store (KernelCaps.epilogue) go with it.
        o = out if out is not None and conv_out else None
        if at_store is not None:
            clip, uses_addend, act = at_store
            res, applied = conv(x, w, b, out=o, clip=clip, addend=extra[0] if uses_addend else None, act=act)
            y = res[0]
            if applied:
                return placed(y, None if out is None else out[0])
        else:
            y = conv(x, w, b, out=o)[0]
        target = out[0] if out is not None else (y if y.flags.writeable else None)
        if epi is not None:
            return (epi(y, *extra, out=target),)
        if target is not None and target is not y:
            np.copyto(target, y)
            return (target,)
        return (y,)

    inner = caps(conv)  # the cpu backend's Conv: its algorithm and instruction-set variant
    with_caps(kernel, mode=inner.mode, algorithm=inner.algorithm, variant=inner.variant)
    return mark_out(kernel)


def placed(y: np.ndarray, o: np.ndarray | None) -> tuple[np.ndarray]:
    """``(o,)`` with ``y`` copied into it, when ``o`` is the planned output and ``y`` is not it."""
    if o is not None and y is not o:
        np.copyto(o, y)
        return (o,)
    return (y,)


def matmul_factory(spec: KernelSpec):
    trans_a = int(spec.attr("transA", 0))
    trans_b = int(spec.attr("transB", 0))
    alpha = float(spec.attr("alpha", 1.0))
    beta = float(spec.attr("beta", 1.0))
    dt, _ = out_type(spec)
    b_const = spec.const_inputs[1] if len(spec.const_inputs) > 1 else None
    if b_const is not None:
        b_const = np.swapaxes(b_const, -1, -2) if trans_b else b_const
        b_const = np.ascontiguousarray(b_const * b_const.dtype.type(alpha) if alpha != 1.0 else b_const)
    c_const = spec.const_inputs[2] if len(spec.const_inputs) > 2 else None
    if c_const is not None and beta != 1.0:
        c_const = (c_const * c_const.dtype.type(beta)).astype(c_const.dtype)
    epi = compiled_epilogue(spec, 3)
    # a constant 2-D float32 weight: packed once into GE's own GEMM's panels (ge_native.sgemm),
    # the bias added at the store; else contiguous column blocks, one pool task each, the bias
    # added per block while its columns are in cache (ge_native.parallel.PackedWeight)
    panels, panel_bias = None, None
    if (not trans_a and b_const is not None and b_const.ndim == 2 and b_const.dtype == np.float32
            and dt == np.float32 and sgemm.available()):
        panels = sgemm.Panels(b_const)
        if c_const is not None and c_const.dtype == np.float32 and c_const.size == panels.n \
                and c_const.shape[-1] == panels.n:
            panel_bias = np.ascontiguousarray(c_const.reshape(panels.n))
        b_const = None  # the panels replace it
    packed, bias = parallel.pack_for(spec, b_const, c_const) if not trans_a and panels is None else (None, None)
    if packed is not None:
        b_const = None  # the blocks replace it (a call that does not fit reads the input)

    at_store = store_epilogue(spec, ("clip", "addend", "act")) if panels is not None else None

    def panel_kernel(a, c, extra, out):
        shape = a.shape[:-1] + (panels.n,)
        o = out[0] if out is not None else None
        y = o if o is not None and o.shape == shape and o.dtype == np.float32 and o.flags.c_contiguous \
            and o.flags.writeable and not np.may_share_memory(o, a) else np.empty(shape, np.float32)
        rows = math.prod(a.shape[:-1])  # (not -1: a k or n of 0 leaves it undefined)
        a2 = np.ascontiguousarray(a.reshape(rows, panels.k))
        y2 = y.reshape(rows, panels.n)
        width = parallel.native_width()
        # the epilogue at the store when it can go there (the bias is in the panels' call then)
        if at_store is not None and (c is None or panel_bias is not None):
            clip, uses_addend, act = at_store
            z = extra[0] if uses_addend else None
            if z is None or (z.shape == shape and z.dtype == np.float32 and z.flags.c_contiguous):
                if sgemm.matmul_packed(a2, panels, y2, panel_bias, clip, width,
                                       None if z is None else z.reshape(y2.shape), act):
                    return placed(y, o)
        if not sgemm.matmul_packed(a2, panels, y2, panel_bias, None, width):
            raise ValueError(f"MatMul: operand {a.shape} {a.dtype} does not fit the packed weight {panels.shape}")
        if c is not None and panel_bias is None:
            y += c_const if c_const is not None else (c * y.dtype.type(beta) if beta != 1.0 else c)
        if epi is not None:
            epi(y, *extra, out=y)
        return placed(y, o)

    def kernel(a, b, c=None, *extra, out=None):
        if panels is not None:
            if a.dtype != np.float32 or a.ndim < 1 or a.shape[-1] != panels.k:
                raise ValueError(f"MatMul: operand {a.shape} {a.dtype} does not fit the weight {panels.shape}")
            return panel_kernel(a, c, extra, out)
        if packed is not None and a.dtype == packed.dtype and a.ndim >= 1 and a.shape[-1] == packed.k \
                and (c is None or bias is not None):
            y = packed.matmul(a, out=None if out is None else out[0], bias=bias)
            if epi is not None:
                epi(y, *extra, out=y)
            return (y if y.dtype == dt else y.astype(dt),)
        if trans_a:
            a = np.swapaxes(a, -1, -2)
        scaled = False
        if b_const is not None:
            b = b_const
            scaled = True
        elif trans_b:
            b = np.swapaxes(b, -1, -2)
        y = parallel.matmul(a, b, out=None if out is None else out[0])
        if alpha != 1.0 and not scaled:
            y *= y.dtype.type(alpha)
        if c is not None:
            if c_const is not None:
                y += c_const
            elif beta != 1.0:
                y += c * y.dtype.type(beta)
            else:
                y += c
        if epi is not None:
            epi(y, *extra, out=y)
        return (y if y.dtype == dt else y.astype(dt),)

    if panels is not None:  # GE's own GEMM on the packed panels
        with_caps(kernel, algorithm="sgemm_panels", variant=isa.variant_of("sgemm"))
    elif packed is not None:  # BLAS on column blocks over the pool
        with_caps(kernel, algorithm="packed_blocks", variant=isa.variant_of("gemm"))
    else:
        with_caps(kernel, algorithm="matmul", variant="numpy")
    return mark_out(kernel)

