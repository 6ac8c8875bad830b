"""CPU kernels of the fused ops (domain ``ge.fused``, declared by ge_fusion; backend ``cpu``).

FusedConv runs the cpu backend's own Conv kernel (found through the kernel registry) into the
output buffer and applies its epilogue there, in place. FusedMatMul,
Attention, LayerNorm and Softmax are NumPy/BLAS code writing into preallocated outputs; the
elementwise ops run generated kernels (:mod:`ge_cpu.fused.codegen`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ge_core.errors import ExecutionError, UnsupportedOpError
from ge_core.kernel import KernelSpec, caps, with_caps
from ge_native import isa, parallel, sgemm
from ge_sdk import fused
from ge_sdk.fused import CONV_ATTRS, attention_perm

from . import codegen, loopgen
from .rmsnorm import rmsnorm_factory


def _refuse(spec: KernelSpec, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.describe()}: {why}")


def _type_of(spec: KernelSpec, i: int):
    t = spec.inputs[i] if i < len(spec.inputs) else None
    return (t.dtype if t is not None and t.dtype is not None else np.dtype("float32"),
            t.shape if t is not None else None)


def _out_type(spec: KernelSpec):
    t = spec.outputs[0]
    shape = t.shape if t.shape is not None and all(isinstance(d, int) for d in t.shape) else None
    return (t.dtype if t.dtype is not None else np.dtype("float32")), shape


def _static(shape):
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def _epilogue(spec: KernelSpec, first_extra: int):
    """The compiled epilogue of a FusedConv/FusedMatMul (None when it has none)."""
    program = spec.attr("epilogue", "") or ""
    if isinstance(program, bytes):
        program = program.decode()
    if not program:
        return None
    dt, shape = _out_type(spec)
    dtypes = [dt] + [_type_of(spec, i)[0] for i in range(first_extra, len(spec.inputs))]
    shapes = [shape] + [_static(_type_of(spec, i)[1]) for i in range(first_extra, len(spec.inputs))]
    sym_out = spec.outputs[0].shape
    sym = ([sym_out] + [_type_of(spec, i)[1] for i in range(first_extra, len(spec.inputs))], sym_out)
    try:
        return codegen.compile_program(program, dtypes, shapes, dt, shape, anchor=True, symbolic=sym)
    except ValueError as e:
        raise _refuse(spec, f"bad epilogue program: {e}") from None


def _mark_out(kernel, inplace: bool = False):
    with_caps(kernel, accepts_out=True, inplace_ok=inplace)
    return kernel


# ------------------------------------------------------------------------------------------------
def elemwise_factory(spec: KernelSpec):
    program = spec.attr("program", "")
    if isinstance(program, bytes):
        program = program.decode()
    dt, shape = _out_type(spec)
    dtypes = [_type_of(spec, i)[0] for i in range(len(spec.inputs))]
    shapes = [_static(_type_of(spec, i)[1]) for i in range(len(spec.inputs))]
    sym = ([_type_of(spec, i)[1] for i in range(len(spec.inputs))], spec.outputs[0].shape)
    try:
        fn = codegen.compile_program(program, dtypes, shapes, dt, shape, symbolic=sym)
    except ValueError as e:
        raise _refuse(spec, f"bad program: {e}") from None

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
    return _mark_out(kernel, inplace=True)


def _single(op: str, **attrs: Any):
    def factory(spec: KernelSpec):
        a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in spec.attrs.items() if k in attrs}
        dt, shape = _out_type(spec)
        try:
            prog = codegen.dumps([(op, ["a0"], {**attrs, **a})])
            fn = codegen.compile_program(prog, [_type_of(spec, 0)[0]], [_static(_type_of(spec, 0)[1])], dt, shape)
        except (ValueError, TypeError) as e:
            raise _refuse(spec, f"bad attributes: {e}") from None

        def kernel(x, out=None):
            return (fn(x, out=None if out is None else out[0]),)

        with_caps(kernel, variant=caps(fn).mode)
        return _mark_out(kernel, inplace=True)

    return factory


gelu_factory = _single("Gelu", approximate="none")
silu_factory = _single("Silu")


# ------------------------------------------------------------------------------------------------
#: epilogue ops GE's GEMM applies at its store, by their sgemm activation names
_STORE_ACTS = {"Sigmoid": "sigmoid", "Silu": "silu", "HardSwish": "hardswish"}


def _store_epilogue(spec: KernelSpec, can: tuple[str, ...]):
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
        raise _refuse(spec, "the cpu backend has no Conv kernel to run the convolution")
    n_conv = min(3, len(spec.inputs))
    inner_spec = KernelSpec(name=spec.name, op_type="Conv", domain="",
                            attrs={k: v for k, v in spec.attrs.items() if k in CONV_ATTRS},
                            inputs=list(spec.inputs[:n_conv]), outputs=list(spec.outputs),
                            const_inputs=list(spec.const_inputs[:n_conv]), opset=11, options=dict(spec.options))
    conv = inner_factory(inner_spec)
    conv_out = caps(conv).accepts_out
    epi = _epilogue(spec, 3)
    at_store = _store_epilogue(spec, caps(conv).epilogue)

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
                return _placed(y, None if out is None else out[0])
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
    return _mark_out(kernel)


def _placed(y: np.ndarray, o: np.ndarray | None) -> tuple[np.ndarray]:
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
    dt, _ = _out_type(spec)
    b_const = spec.const_inputs[1] if len(spec.const_inputs) > 1 else None
    if b_const is not None:
        b_const = np.swapaxes(b_const, -1, -2) if trans_b else b_const
        b_const = np.ascontiguousarray(b_const * b_const.dtype.type(alpha) if alpha != 1.0 else b_const)
    c_const = spec.const_inputs[2] if len(spec.const_inputs) > 2 else None
    if c_const is not None and beta != 1.0:
        c_const = (c_const * c_const.dtype.type(beta)).astype(c_const.dtype)
    epi = _epilogue(spec, 3)
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

    at_store = _store_epilogue(spec, ("clip", "addend", "act")) if panels is not None else None

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
                    return _placed(y, o)
        if not sgemm.matmul_packed(a2, panels, y2, panel_bias, None, width):
            raise ValueError(f"MatMul: operand {a.shape} {a.dtype} does not fit the packed weight {panels.shape}")
        if c is not None and panel_bias is None:
            y += c_const if c_const is not None else (c * y.dtype.type(beta) if beta != 1.0 else c)
        if epi is not None:
            epi(y, *extra, out=y)
        return _placed(y, o)

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
    return _mark_out(kernel)


def _rows(kind: str, dtype: Any):
    return loopgen.row_kernel(kind, dtype)


def _rows_variant(rows: Any) -> str:
    """The form a kernel with row kernel ``rows`` runs: ``"loop"`` (compiled, loopgen) or ``"numpy"``."""
    return "loop" if rows is not None else "numpy"


def _softmax_inplace(s: np.ndarray, axis: int, rows=None) -> np.ndarray:
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


def _row_softmax(dtype: Any):
    fn = _rows("softmax", dtype)
    if fn is not None:
        fn.ge_dtype = np.dtype(dtype)
    return fn


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
        raise _refuse(spec, str(e)) from None


def attention_factory(spec: KernelSpec):
    from .attention import SERIAL_WORK as serial_work
    scale = float(spec.attr("scale", 1.0))
    dt = _out_type(spec)[0]
    rows = _row_softmax(dt)
    scaled = _rows("softmax_scaled", dt)
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
                _softmax_inplace(s, -1, rows)
            r = np.matmul(s, v, out=o)
        if dest is not None and r is o:
            return (dest,)
        return (r if po is None else r.transpose(po),)

    with_caps(kernel, algorithm="heads" if width > 1 else "batched", variant=_rows_variant(scaled))
    return _mark_out(kernel)


def layernorm_factory(spec: KernelSpec):
    eps = float(spec.attr("epsilon", 1e-5))
    dt, _ = _out_type(spec)
    rows = _rows("layernorm", dt)
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

    with_caps(kernel, variant=_rows_variant(rows))
    return _mark_out(kernel)


def softmax_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", -1))
    rank = len(spec.inputs[0].shape) if spec.inputs and spec.inputs[0] is not None and spec.inputs[0].shape is not None \
        else None
    if rank is not None and axis < 0:
        axis += rank
    rows = _row_softmax(_out_type(spec)[0]) if rank is not None and axis == rank - 1 else None

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
        return (_softmax_inplace(y, axis),)

    with_caps(kernel, variant=_rows_variant(rows))
    return _mark_out(kernel, inplace=True)


def rotary_factory(spec: KernelSpec):
    """Rotary(x, cos, sin) = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] (x1, x2 the
    halves of the last axis): two multiplies and two multiply-adds on halves, into the output
    (the exporters' Slice, Slice, Neg, Concat and the elementwise tail made five kernels and four
    temporaries of it)."""

    rdt = np.dtype(_out_type(spec)[0])
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

    with_caps(kernel, variant=_rows_variant(rows))
    return _mark_out(kernel)


#: The cpu kernel factory of every fused op (ge_cpu's ge_register_kernels registers them for domain ge.fused).
KERNELS = {
    fused.ROTARY: rotary_factory,
    fused.FUSED_CONV: conv_factory,
    fused.FUSED_MATMUL: matmul_factory,
    fused.FUSED_ELEMWISE: elemwise_factory,
    fused.ATTENTION: attention_factory,
    fused.LAYER_NORM: layernorm_factory,
    fused.RMS_NORM: rmsnorm_factory,
    fused.SOFTMAX: softmax_factory,
    fused.GELU: gelu_factory,
    fused.SILU: silu_factory,
}
