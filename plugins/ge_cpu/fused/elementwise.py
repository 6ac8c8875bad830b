"""CPU kernels of the elementwise fused ops (FusedElemwise, Gelu, Silu: generated kernels,
:mod:`ge_cpu.fused.codegen`) and the spec helpers every fused kernel module shares (the operand
types, the compiled epilogue of a FusedConv/FusedMatMul, the refusal error)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import UnsupportedOpError
from ge_core.kernel import KernelSpec, caps, with_caps

from . import codegen


def refuse(spec: KernelSpec, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.describe()}: {why}")


def type_of(spec: KernelSpec, i: int):
    t = spec.inputs[i] if i < len(spec.inputs) else None
    return (t.dtype if t is not None and t.dtype is not None else np.dtype("float32"),
            t.shape if t is not None else None)


def out_type(spec: KernelSpec):
    t = spec.outputs[0]
    shape = t.shape if t.shape is not None and all(isinstance(d, int) for d in t.shape) else None
    return (t.dtype if t.dtype is not None else np.dtype("float32")), shape


def _static(shape):
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def compiled_epilogue(spec: KernelSpec, first_extra: int):
    """The compiled epilogue of a FusedConv/FusedMatMul (None when it has none)."""
    program = spec.attr("epilogue", "") or ""
    if isinstance(program, bytes):
        program = program.decode()
    if not program:
        return None
    dt, shape = out_type(spec)
    dtypes = [dt] + [type_of(spec, i)[0] for i in range(first_extra, len(spec.inputs))]
    shapes = [shape] + [_static(type_of(spec, i)[1]) for i in range(first_extra, len(spec.inputs))]
    sym_out = spec.outputs[0].shape
    sym = ([sym_out] + [type_of(spec, i)[1] for i in range(first_extra, len(spec.inputs))], sym_out)
    try:
        return codegen.compile_program(program, dtypes, shapes, dt, shape, anchor=True, symbolic=sym)
    except ValueError as e:
        raise refuse(spec, f"bad epilogue program: {e}") from None


def mark_out(kernel, inplace: bool = False):
    with_caps(kernel, accepts_out=True, inplace_ok=inplace)
    return kernel


# ------------------------------------------------------------------------------------------------
def elemwise_factory(spec: KernelSpec):
    program = spec.attr("program", "")
    if isinstance(program, bytes):
        program = program.decode()
    dt, shape = out_type(spec)
    dtypes = [type_of(spec, i)[0] for i in range(len(spec.inputs))]
    shapes = [_static(type_of(spec, i)[1]) for i in range(len(spec.inputs))]
    sym = ([type_of(spec, i)[1] for i in range(len(spec.inputs))], spec.outputs[0].shape)
    try:
        fn = codegen.compile_program(program, dtypes, shapes, dt, shape, symbolic=sym)
    except ValueError as e:
        raise refuse(spec, f"bad program: {e}") from None

    # NumPy turns 0-d results into scalars, which cannot take out=: give 0-d operands shape (1,)
    # (which broadcasts the same against any output of rank >= 1) and a 0-d output a 1-element view.
    scalar_in = [i for i, sh in enumerate(shapes) if sh == ()]
    if shape == ():
        def kernel(*args, out=None):
            flat = [a.reshape(1) if isinstance(a, np.ndarray) and a.ndim == 0 else a for a in args]
            dst = None if out is None else out[0].reshape(1)
            r = fn(*flat, out=dst)
            return (out[0] if out is not None else np.asarray(r).reshape(()),)
    elif scalar_in:
        def kernel(*args, out=None):
            flat = [a.reshape(1) if isinstance(a, np.ndarray) and a.ndim == 0 else a for a in args]
            return (fn(*flat, out=None if out is None else out[0]),)
    else:
        def kernel(*args, out=None):
            return (fn(*args, out=None if out is None else out[0]),)

    with_caps(kernel, mode=caps(fn).mode, variant=caps(fn).mode)  # loop, numexpr, numpy, numpy-blocked
    return mark_out(kernel, inplace=True)


def _single(op: str, **attrs: Any):
    def factory(spec: KernelSpec):
        a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in spec.attrs.items() if k in attrs}
        dt, shape = out_type(spec)
        try:
            prog = codegen.dumps([(op, ["a0"], {**attrs, **a})])
            fn = codegen.compile_program(prog, [type_of(spec, 0)[0]], [_static(type_of(spec, 0)[1])], dt, shape)
        except (ValueError, TypeError) as e:
            raise refuse(spec, f"bad attributes: {e}") from None

        def kernel(x, out=None):
            return (fn(x, out=None if out is None else out[0]),)

        with_caps(kernel, variant=caps(fn).mode)
        return mark_out(kernel, inplace=True)

    return factory


gelu_factory = _single("Gelu", approximate="none")
silu_factory = _single("Silu")
