"""The cpu backend's int8: the ``int8_kernels`` pass, the FakeQuant kernel, and the int8 forms of
``PackedMatMul`` and ``NchwcConv``.

``ge_quant``'s ``qdq_regions`` pass leaves a quantised model as float32 arithmetic on grid values
(``ge.quant::FakeQuant``) with an entry per quantised matrix op in the graph's int8 table
(:mod:`ge_sdk.quant`). After fusion and the blocked layout, this pass finds what each such op
became and, where this CPU has an integer unit (AMX-INT8, AVX512-VNNI, AVX2), runs it in int8:

- ``MatMul``/``Gemm``/``FusedMatMul`` -> ``PackedMatMul`` with ``weight_dtype`` ``int8``
  (:class:`ge_native.int8.PackedB8`), ungrouped ``NchwcConv`` -> ``weight_packing`` ``int8``
  (:class:`ge_native.int8.PackedConv8`): the int8 weight recovered exactly from the float one and
  its scales (refused, float32 kept, when a pass changed it), packed at compile time;
- the op quantises its float32 input while packing it (its FakeQuant producer is skipped: the
  same integers), sums in int32, and dequantises, adds the bias and the residual, clips and
  activates at the store; a FakeQuant that is the op's only reader is applied there too
  (``out_*`` attributes), so a chain of int8 convolutions reads and writes grid values without
  a pass of its own between them.

What stays float32 (a grouped or depthwise convolution, no integer unit, a weight that is not
the dequantised int8) is recorded with the reason (``report["int8"]``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec, with_caps
from ge_core.passes import Pass, PassContext, PassResult
from ge_native import fakequant, int8, int8dw, parallel
from ge_sdk import fused, quant
from ge_sdk.rewrite.driver import FUSED_FROM_META, record_replaced

from .fused.elementwise import mark_out, refuse
from .fused.epilogues import placed
from .packed import matmul_operands, packed_kernel, packed_node

#: the integer variants worth running a model on (the scalar form is the tests' reference)
UNITS = ("amx_int8", "avx512_vnni", "avx2")
#: the packing name of an int8 NchwcConv weight, and of an int8 depthwise one
INT8, INT8DW = "int8", "int8dw"
PACKINGS = (INT8, INT8DW)


def packed_shape(k: int, n: int) -> tuple[int, int, int]:
    """The shape of :class:`ge_native.int8.PackedB8`'s bits for a ``(k, n)`` weight."""
    return (-(-int(n) // int8.NR), -(-int(k) // int8.KB) * int8.KB // 4, 4 * int8.NR)


def conv_packed_shape(w_shape, in_blocks: int) -> tuple[int, int, int]:
    """The shape of :class:`ge_native.int8.PackedConv8`'s bits for a weight of ``w_shape`` and
    ``in_blocks`` input blocks (0: a plain input)."""
    m, c, kh, kw = (int(v) for v in w_shape)
    return packed_shape(kh * kw * (int(in_blocks) * int8.BLOCK or c), m)


def int8_unit() -> str | None:
    """The int8 variant this machine computes with, or None (int8 entries stay float32); a variant
    ``GE_NATIVE_INT8`` forces (the tests' way to run each one) counts."""
    import os

    v = int8.isa()
    if v is not None and (v in UNITS or os.environ.get("GE_NATIVE_INT8") == v):
        return v
    return None


# ---------------------------------------------------------------------------------------------
# FakeQuant


def fake_quant_factory(spec: KernelSpec):
    a = spec.attrs
    s, z, lo, hi = float(np.float32(a["scale"])), int(a["zero_point"]), int(a["qmin"]), int(a["qmax"])
    if not (math.isfinite(s) and s > 0 and lo <= z <= hi):
        raise refuse(spec, "needs a finite scale > 0 and qmin <= zero_point <= qmax")

    def kernel(x, out=None):
        if x.dtype != np.float32:
            raise ValueError(f"{spec.describe()}: a float32 input is needed, not {x.dtype}")
        o = out[0] if out is not None else None
        y = o if o is not None and o.shape == x.shape and o.dtype == np.float32 and o.flags.c_contiguous else None
        xc = x if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(x.shape)  # (a 0-d one stays 0-d)
        r = fakequant.fake_quant(xc, s, lo - z, hi - z, out=y, width=parallel.native_width())
        return placed(r, o)

    return with_caps(mark_out(kernel), algorithm="fake_quant",
                     variant="native" if fakequant.available() else "numpy")


# ---------------------------------------------------------------------------------------------
# the pass


class Int8Kernels(Pass):
    """Run the quantised matrix ops of the int8 table on this CPU's integer unit."""

    name = "int8_kernels"
    stage = "schedule"
    opt_level = 0
    required = True
    before = ("atc_precision", "sink_constant_computations")
    description = "quantised models: each int8 matrix op packed in int8 and computed on AMX-INT8/VNNI with int32 " \
                  "sums, its input quantised as it is packed, its output's fake-quant at the store"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if ctx.options.soc_version != "cpu" or not quant.table(graph):
            return PassResult(False)
        unit = int8_unit()
        stats = {"matmuls": 0, "convs": 0, "float32": 0}
        stack = [graph]
        while stack:
            g = stack.pop()
            for n in g.node_list():
                if n.erased:
                    continue
                stack.extend(n.subgraphs())
                e = quant.lookup(g, n)
                if e is None:
                    continue
                why = _place(g, n, e, unit)
                kind = "convs" if n.op_type == "NchwcConv" else "matmuls"
                stats[kind if not why else "float32"] += 1
            if unit is not None and int8.MID_QUANT:
                stats["residuals"] = stats.get("residuals", 0) + sum(_absorb_residual(g, n) for n in g.node_list()
                                                                      if _int8_conv(n) and not n.erased)
            if unit is not None and int8.UINT8_IO and int8dw.available():
                stats["uint8_values"] = stats.get("uint8_values", 0) + _uint8_storage(g)
        return PassResult(bool(stats["matmuls"] or stats["convs"]), {k: v for k, v in stats.items() if v})


def _place(g: Graph, n: Node, e: dict[str, Any], unit: str | None) -> str:
    """Run ``n`` in int8 where it can; the reason it stays float32, or ''."""
    blocked = n.op_type == "NchwcConv" and n.domain == "ge.cpu"
    matmul = (n.op_type in ("MatMul", "Gemm") and n.domain in ("", "ai.onnx")) or (
        n.op_type == fused.FUSED_MATMUL and n.domain == fused.DOMAIN)
    macs = _macs(n, blocked)
    if unit is None:
        why = "this CPU has no integer matrix unit (AMX-INT8, AVX512-VNNI or AVX2): float32 on the grid values"
    elif blocked:
        why = _conv(g, n, e, unit)
    elif matmul:
        why = _matmul(g, n, e, unit)
    elif n.op_type in ("Conv", fused.FUSED_CONV):
        why = "a convolution outside the blocked layout (a lone one) has no int8 kernel yet"
    else:
        why = f"the cpu backend has no int8 kernel for {n.op_type}"
    if blocked and not why and _text(n.attrs.get("weight_packing", "")) == INT8DW:
        quant.done(n, f"nchwc_int8dw_{dw_unit()}", "", macs)
        return ""
    quant.done(n, "" if why else f"{'nchwc' if blocked else 'packed_matmul'}_int8_{unit}", why, macs)
    return why


def _macs(n: Node, blocked: bool) -> int:
    """Multiply-adds of one run of matrix op ``n`` (0 where a shape is not static)."""
    y = n.outputs[0].type.shape if n.outputs and n.outputs[0].type is not None else None
    w = n.inputs[1] if len(n.inputs) > 1 else None
    if y is None or not all(isinstance(d, int) for d in y):
        return 0
    if blocked:
        ws = n.attrs.get("weight_shape")
        if not ws:
            ws = w.type.shape if w is not None and w.type is not None else None
        if not ws or len(ws) != 4:
            return 0
        m, c, kh, kw = (int(v) for v in ws)
        return int(y[0] * y[2] * y[3] * m * c * kh * kw)
    ws = w.type.shape if w is not None and w.type is not None else None
    if n.op_type in ("Conv", fused.FUSED_CONV) and ws and len(ws) >= 3:
        return int(math.prod(y) * math.prod(int(d) for d in ws[1:]))
    x = n.inputs[0].type.shape if n.inputs and n.inputs[0] is not None and n.inputs[0].type is not None else None
    k = x[-1] if x else None
    return int(math.prod(y) * k) if isinstance(k, int) else 0


def _int8_weight(e: dict[str, Any], w: np.ndarray, channels: int, axis: int,
                 tol: float = 0.0) -> tuple[np.ndarray, np.ndarray] | str:
    """``(scales, int8 weight)`` of the float32 weight ``w`` of an int8 entry (its output channels
    along ``axis``), or the reason it is not the dequantised int8 weight."""
    try:
        ws = quant.w_scales(e, channels)
    except ValueError as err:
        return str(err)
    wq = quant.recover(np.ascontiguousarray(w, np.float32), ws, axis, tol)
    if wq is None:
        return "its float32 weight is not the dequantised int8 weight (a pass changed it)"
    return ws, wq


def _x_attrs(e: dict[str, Any]) -> dict[str, Any]:
    x = e["x"]
    if x.get("dynamic"):
        return {"x_dynamic": 1}
    return {"x_scale": float(x["scale"]), "x_zero_point": int(x["zero_point"]), "x_dtype": str(x["dtype"])}


def _skip_input_fake_quant(g: Graph, n: Node, e: dict[str, Any]) -> None:
    """Read the FakeQuant producer of ``n``'s input through (the op quantises with the same
    parameters while packing: the same integers); drop it when nothing else reads it."""
    x = e["x"]
    v = n.inputs[0]
    p = v.producer if v is not None else None
    got = quant.fake_quant_params(p)
    if got is None or x.get("dynamic") or p is None or v is None:
        return
    s, z, lo, hi = got
    if (s, z, (lo, hi)) != (float(np.float32(x["scale"])), int(x["zero_point"]), quant.RANGES[x["dtype"]]):
        return
    n.set_input(0, p.inputs[0])
    if not (v.has_uses() or v.is_graph_output):
        g.remove_node(p)


def _absorb_output_fake_quant(g: Graph, n: Node) -> None:
    """Apply the FakeQuant that is ``n``'s only reader at ``n``'s store (its ``out_*``
    attributes); ``n``'s output takes its place and name."""
    y = n.outputs[0]
    users = y.users
    if len(users) != 1 or y.is_graph_output:
        return
    f = users[0]
    got = quant.fake_quant_params(f)
    if got is None:
        return
    s, z, lo, hi = got
    n.attrs.update(out_scale=s, out_zero_point=z, out_qmin=lo, out_qmax=hi)
    out = f.outputs[0]
    name = out.name
    out.replace_all_uses_with(y)
    g.remove_node(f)
    if name not in g.names:
        g.rename_value(y, name)


def _fq_step(step, src: str) -> tuple[float, int, int, int] | None:
    """A program step ``FakeQuant(src)`` as ``(scale, 0, lo, hi)`` (the range less the zero
    point: zero point 0 with that range is the same rounding), or None."""
    op, refs, at = step
    if op != fused.FAKE_QUANT_STEP or list(refs) != [src]:
        return None
    lo, hi = float(at.get("lo", 0.0)), float(at.get("hi", 255.0))
    if lo != int(lo) or hi != int(hi) or not lo <= 0 <= hi:
        return None
    return float(np.float32(at["scale"])), 0, int(lo), int(hi)


def _residual_program(f: Node, y, mid_done: bool):
    """``(the other operand's input index, mid fake-quant or None, relu, the final fake-quant)``
    of a fused elementwise ``f`` that is ``[FakeQuant(y)] -> Add(., z) -> [Relu] -> FakeQuant``
    (the leading fake-quant exactly when ``y`` is not fake-quantised already); else None."""
    try:
        steps = fused.loads(_text(f.attrs.get("program", "")), n_inputs=len(f.inputs))
    except ValueError:
        return None
    if len(f.inputs) != 2 or f.inputs[0] is f.inputs[1] or y not in f.inputs:
        return None
    yi = 0 if f.inputs[0] is y else 1
    ya, za = f"a{yi}", f"a{1 - yi}"
    mid = None
    if not mid_done:
        mid = _fq_step(steps[0], ya) if steps else None
        if mid is None:
            return None
        steps, ya = steps[1:], "t0"
    base = 0 if mid_done else 1  # (the index of the Add step in the whole program)
    if len(steps) not in (2, 3) or steps[0][0] != "Add" or steps[0][2] or sorted(steps[0][1]) != sorted([ya, za]):
        return None
    relu = len(steps) == 3
    if relu and (steps[1][0] != "Relu" or list(steps[1][1]) != [f"t{base}"] or steps[1][2]):
        return None
    out = _fq_step(steps[-1], f"t{base + len(steps) - 2}")
    return None if out is None else (1 - yi, mid, relu, out)


def _absorb_residual(g: Graph, n: Node) -> bool:
    """An int8 convolution whose output only a fused ``[FakeQuant] -> Add(y, z) -> [Relu] ->
    FakeQuant`` reads (a quantised ResNet block's end): the fake-quant of its output, the
    residual, the Relu and the block's fake-quant all at its store (``mid_*``, ``z`` its addend,
    ``clip_min``, ``out_*``); True when it did."""
    a = n.attrs
    y = n.outputs[0]
    if _text(a.get("out_dtype", "")) == "uint8" or len(n.inputs) > 3 or any(k in a for k in ("clip_min", "clip_max")) \
            or _text(a.get("activation", "")) or y.is_graph_output or len(y.users) != 1:
        return False
    f = y.users[0]
    if f.op_type != fused.FUSED_ELEMWISE or f.domain != fused.DOMAIN:
        return False
    got = _residual_program(f, y, a.get("out_scale") is not None)
    if got is None:
        return False
    zi, mid, relu, out = got
    z, fy = f.inputs[zi], f.outputs[0]
    if z is None or z.type is None or y.type is None or z.type.dtype != np.float32 or z.type.shape != y.type.shape:
        return False
    if mid is None:
        mid = (a.pop("out_scale"), a.pop("out_zero_point"), a.pop("out_qmin"), a.pop("out_qmax"))
    a.update(mid_scale=mid[0], mid_zero_point=mid[1], mid_qmin=mid[2], mid_qmax=mid[3])
    a.update(out_scale=out[0], out_zero_point=out[1], out_qmin=out[2], out_qmax=out[3])
    if relu:
        a["clip_min"] = 0.0
    n.set_inputs([*n.inputs[:2], n.inputs[2] if len(n.inputs) > 2 else None, z])
    # (the conv's output now stands for the block's: what ge compare --per-node matches it to)
    record_replaced(fy, y)
    n.meta[FUSED_FROM_META] = sorted({*(n.meta.get(FUSED_FROM_META) or [n.name]), *(f.meta.get(FUSED_FROM_META) or [])})
    name = fy.name
    fy.replace_all_uses_with(y)
    g.remove_node(f)
    if name not in g.names:
        g.rename_value(y, name)
    return True


def _matmul(g: Graph, n: Node, e: dict[str, Any], unit: str) -> str:
    ops = matmul_operands(n)
    if isinstance(ops, str):
        return ops
    got = _int8_weight(e, ops.w, ops.n, 1)
    if isinstance(got, str):
        return got
    ws, wq = got
    _skip_input_fake_quant(g, n, e)
    ops.x = n.inputs[0] or ops.x
    stored = int8.PackedB8(wq).data
    attrs = {"weight_dtype": "int8", "w_scale": [float(v) for v in ws], **_x_attrs(e)}
    packed_node(g, n, ops, stored, attrs)
    _absorb_output_fake_quant(g, n)
    return ""


def _conv(g: Graph, n: Node, e: dict[str, Any], unit: str) -> str:
    from .kernels.nchwc import unpack

    a = n.attrs
    packing = _text(a.get("weight_packing", ""))
    w_in = n.inputs[1] if len(n.inputs) > 1 else None
    wpk = None if w_in is None or w_in.const_value is None else np.asarray(w_in.const_value)
    if not packing or wpk is None or w_in is None or wpk.dtype != np.float32:
        return "its weight is not a constant the layout pass packed"
    group = int(a.get("group", 1) or 1)
    if group != 1:
        return _depthwise(g, n, e, packing, wpk, w_in, group)
    if len(n.inputs) > 4 and n.inputs[4] is not None:
        return "a convolution with an input scale (an SE block's) has no int8 kernel"
    w_shape = tuple(int(v) for v in a["weight_shape"])
    plain = bool(int(a.get("plain_input", 0) or 0))
    if plain and (packing != "plain" or w_shape[1] > int8.BLOCK):
        return "a plain-input convolution of more channels than the int8 stem takes"
    x_shape = n.inputs[0].type.shape if n.inputs[0] is not None and n.inputs[0].type is not None else None
    if not plain and (x_shape is None or len(x_shape) != 5 or not isinstance(x_shape[1], int)):
        return "its input is not a blocked value of static channels"
    cb = 0 if plain or x_shape is None else int(x_shape[1])
    w = unpack(packing, wpk, w_shape, cb, 1)
    # (a Winograd packing comes back through its transform's pseudo-inverse: exact up to rounding)
    got = _int8_weight(e, w, w_shape[0], 0, 1e-2 if packing.startswith("winograd") else 0.0)
    if isinstance(got, str):
        return got
    ws, wq = got
    stored = np.ascontiguousarray(int8.PackedConv8(wq, cb).data).reshape(-1)
    a.update(weight_packing=INT8, w_scale=[float(v) for v in ws], **_x_attrs(e))
    n.set_input(1, g.add_constant(stored, g.names.fresh(f"{n.name}_w_int8")))
    if not w_in.has_uses() and not w_in.is_graph_output:
        g.remove_constant(w_in)
    _skip_input_fake_quant(g, n, e)
    _absorb_output_fake_quant(g, n)
    return ""


def dw_unit() -> str | None:
    """The int8 depthwise variant this machine computes with (:mod:`ge_native.int8dw`), or None."""
    import os

    v = int8dw.isa()
    if v is not None and (v != "scalar" or os.environ.get("GE_NATIVE_INT8DW") == v):
        return v
    return None


def dw_packed_shape(w_shape) -> tuple[int, int, int, int]:
    """The shape of :class:`ge_native.int8dw.PackedDW8`'s bits for a (C, 1, KH, KW) weight."""
    c, _, kh, kw = (int(v) for v in w_shape)
    return (-(-c // int8dw.BLOCK), kh, -(-kw // 4), 4 * int8dw.BLOCK)


def _depthwise(g: Graph, n: Node, e: dict[str, Any], packing: str, wpk: np.ndarray, w_in, group: int) -> str:
    """A blocked depthwise convolution in int8 (weight_packing int8dw); the reason not, or ''."""
    from .kernels.nchwc import unpack

    w_shape = tuple(int(v) for v in n.attrs["weight_shape"])
    if packing != "depthwise" or group != w_shape[0] or w_shape[1] != 1:
        return "a grouped convolution (not depthwise) has no int8 kernel: float32 on the grid values"
    if dw_unit() is None:
        return "this CPU has no vector unit for the int8 depthwise kernel: float32 on the grid values"
    w = unpack(packing, wpk, w_shape, -(-w_shape[0] // int8dw.BLOCK), group)
    got = _int8_weight(e, w, w_shape[0], 0)
    if isinstance(got, str):
        return got
    ws, wq = got
    stored = np.ascontiguousarray(int8dw.PackedDW8(wq).data).reshape(-1)
    n.attrs.update(weight_packing=INT8DW, w_scale=[float(v) for v in ws], **_x_attrs(e))
    n.set_input(1, g.add_constant(stored, g.names.fresh(f"{n.name}_w_int8dw")))
    if not w_in.has_uses() and not w_in.is_graph_output:
        g.remove_constant(w_in)
    _skip_input_fake_quant(g, n, e)
    _absorb_output_fake_quant(g, n)
    return ""


def _int8_conv(n: Node) -> bool:
    return n.op_type == "NchwcConv" and n.domain == "ge.cpu" and _text(n.attrs.get("weight_packing", "")) in PACKINGS


def _uint8_storage(g: Graph) -> int:
    """Values an int8 convolution writes fake-quantised into uint8 range and only int8
    convolutions read, with that same quantisation, as their first input: stored as the uint8
    integers themselves (``out_dtype`` uint8; a quarter of the bytes, and the readers skip their
    quantisation); how many."""
    made = 0
    for n in g.node_list():
        a = n.attrs
        if not _int8_conv(n) or a.get("out_scale") is None or _text(a.get("out_dtype", "")) == "uint8":
            continue
        lo, hi = int(a.get("out_qmin", 0)), int(a.get("out_qmax", 255))
        v = n.outputs[0]
        if not (0 <= lo <= hi <= 255) or v.is_graph_output or not v.users or v.type is None:
            continue
        want = (float(np.float32(a["out_scale"])), int(a["out_zero_point"]))
        if not all(_int8_conv(u) and u.inputs[0] is v and all(x is not v for x in u.inputs[1:])
                   and not int(u.attrs.get("x_dynamic", 0) or 0) and _text(u.attrs.get("x_dtype", "")) == "uint8"
                   and (float(np.float32(u.attrs["x_scale"])), int(u.attrs["x_zero_point"])) == want
                   for u in v.users):
            continue
        a["out_dtype"] = "uint8"
        v.type = TensorType(np.dtype(np.uint8), v.type.shape)
        made += 1
    return made


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


# ---------------------------------------------------------------------------------------------
# the kernels' shared parameters


def _quant_attrs(spec: KernelSpec, a: dict, prefix: str) -> tuple[float, int, int, int] | None:
    """A fake-quant's ``(scale, zero point, qmin, qmax)`` from the ``<prefix>_*`` attributes, or
    None when absent (refused, naming the node, when bad)."""
    if a.get(f"{prefix}_scale") is None:
        return None
    s, z = float(np.float32(a[f"{prefix}_scale"])), int(a.get(f"{prefix}_zero_point", 0))
    lo, hi = int(a.get(f"{prefix}_qmin", 0)), int(a.get(f"{prefix}_qmax", 255))
    if not (math.isfinite(s) and s > 0 and lo <= z <= hi and -(2 ** 16) <= lo and hi <= 2 ** 16):
        raise refuse(spec, f"needs a finite {prefix}_scale > 0 and {prefix}_qmin <= {prefix}_zero_point <= "
                           f"{prefix}_qmax")
    return s, z, lo, hi


class Quantisation:
    """An int8 op's quantisation attributes, read and checked once (raises naming the node)."""

    def __init__(self, spec: KernelSpec, channels: int) -> None:
        a = spec.attrs
        self.dynamic = bool(int(a.get("x_dynamic", 0) or 0))
        self.x_scale = None if self.dynamic else float(np.float32(a.get("x_scale", 0.0)))
        self.x_zero_point = 0 if self.dynamic else int(a.get("x_zero_point", 0))
        self.x_dtype = "uint8" if self.dynamic else _text(a.get("x_dtype", "uint8"))
        if self.x_dtype not in quant.RANGES:
            raise refuse(spec, f"x_dtype must be one of {', '.join(quant.RANGES)}")
        lo, hi = quant.RANGES[self.x_dtype]
        if self.x_scale is not None and not (math.isfinite(self.x_scale) and self.x_scale > 0
                                             and lo <= self.x_zero_point <= hi):
            raise refuse(spec, "needs a finite x_scale > 0 and an x_zero_point in its type's range")
        ws = np.asarray(a.get("w_scale") or (), np.float32).reshape(-1)
        if ws.size != channels or not np.all(np.isfinite(ws)) or np.any(ws <= 0):
            raise refuse(spec, f"needs {channels} finite w_scale values > 0, not {ws.size}")
        self.w_scale = np.ascontiguousarray(ws)
        self.mid_quant = _quant_attrs(spec, a, "mid")
        self.out_quant = _quant_attrs(spec, a, "out")

    def kwargs(self) -> dict[str, Any]:
        """The quantisation keywords of :func:`ge_native.int8.matmul` / ``conv_nchwc``."""
        kw: dict[str, Any] = {"x_scale": self.x_scale, "x_zero_point": self.x_zero_point, "x_dtype": self.x_dtype,
                              "w_scale": self.w_scale}
        if self.mid_quant is not None:
            kw["mid_quant"] = self.mid_quant
        return kw

    def finish(self, y: np.ndarray) -> None:
        """The output's fake-quant where the kernel did not apply it at its store."""
        if self.out_quant is not None:
            s, z, lo, hi = self.out_quant
            fakequant.fake_quant(y, s, lo - z, hi - z, out=y, width=parallel.native_width())


def int8_matmul_kernel(spec: KernelSpec, k: int, n: int, bias: np.ndarray | None):
    """The kernel of a PackedMatMul whose weight is int8 (:class:`ge_native.int8.PackedB8`)."""
    w = spec.const_inputs[1] if len(spec.const_inputs) > 1 else None
    try:
        packed = int8.PackedB8.from_data(np.asarray(w), k, n)
    except ValueError as err:
        raise refuse(spec, str(err)) from None
    q = Quantisation(spec, n)
    unit = int8_unit()

    def product(a2, y2, clip, z2, act, last) -> bool:
        kw = dict(q.kwargs(), bias=bias, clip=clip, act=act, addend=z2, out_quant=q.out_quant if last else None,
                  width=parallel.native_width())
        # (no integer unit here, an .om from a machine with one: the scalar form, the same bits)
        return int8.matmul(a2, packed, y2, variant=unit, **kw) or int8.matmul(a2, packed, y2, variant="scalar", **kw)

    kernel = packed_kernel(spec, k, n, product, q.finish)
    with_caps(kernel, algorithm="packed_matmul_int8", variant=unit or "scalar")
    return mark_out(kernel)


def _conv_kernel(spec: KernelSpec, w_shape, geometry, bias, has_b: bool, clip, act: str, run, unit: str | None,
                 algorithm: str):
    """An int8 NchwcConv's kernel around ``run(x, y, strides, pads, dilations, variant=..., **kw)``
    (``ge_native.int8.conv_nchwc`` or ``ge_native.int8dw.depthwise_nchwc`` on the packed weight):
    the bias, the output type (uint8 when the next int8 conv reads the integers), the scalar
    form where this machine's variant does not run (an .om from a machine with another unit)."""
    k, s, d, pads = geometry
    m = int(w_shape[0])
    q = Quantisation(spec, m)
    from .kernels.nchwc import out_shape

    odt = np.dtype(spec.outputs[0].dtype or np.float32)
    if odt == np.uint8 and q.out_quant is None:
        raise refuse(spec, "a uint8 output needs out_scale")

    def kernel(x, w_in=None, b_in=None, z=None, sc=None, out=None):
        y = out[0] if out is not None else np.empty(out_shape(spec, x), odt)  # (the batch may be a symbol)
        bv = bias if bias is not None else (None if not has_b or b_in is None else np.asarray(b_in, np.float32).reshape(-1))
        if bv is not None:
            bv = np.ascontiguousarray(bv, np.float32)
            if bv.shape != (m,):
                raise ValueError(f"{spec.describe()}: a bias of shape {bv.shape} for {m} channels")
        kw = dict(q.kwargs(), bias=bv, clip=clip, act=act or None, addend=z, out_quant=q.out_quant,
                  width=parallel.native_width())
        x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        if not run(x, y, tuple(s), tuple(pads), tuple(d), variant=unit, **kw) and \
                not run(x, y, tuple(s), tuple(pads), tuple(d), variant="scalar", **kw):
            raise ValueError(f"{spec.describe()}: operands {x.shape} -> {y.shape} do not fit the {algorithm} kernel")
        return (y,)

    return with_caps(kernel, accepts_out=True, mode="nchwc int8", algorithm=algorithm, variant=unit or "scalar")


def int8_conv_kernel(spec: KernelSpec, wpk, w_shape, cb: int, geometry, bias, has_b: bool, clip, act: str):
    """The kernel of an NchwcConv whose weight is packed in int8 (``wpk``: the stored int8
    values, :class:`ge_native.int8.PackedConv8`'s bits)."""
    data = np.asarray(wpk, np.int8).reshape(-1)
    try:
        packed = int8.PackedConv8.from_data(data.reshape(conv_packed_shape(w_shape, cb)), tuple(w_shape), cb)
    except ValueError as err:
        raise refuse(spec, str(err)) from None

    def run(x, y, *geo, **kw):
        return int8.conv_nchwc(x, packed, y, *geo, **kw)

    return _conv_kernel(spec, w_shape, geometry, bias, has_b, clip, act, run, int8_unit(), "nchwc_int8")


def int8_dw_kernel(spec: KernelSpec, wpk, w_shape, geometry, bias, has_b: bool, clip, act: str):
    """The kernel of a depthwise NchwcConv whose weight is packed in int8
    (:class:`ge_native.int8dw.PackedDW8`'s bits)."""
    data = np.asarray(wpk, np.int8).reshape(-1)
    shape = dw_packed_shape(w_shape)
    if data.size != int(np.prod(shape)):
        raise refuse(spec, f"an int8dw weight of {data.size} values, {int(np.prod(shape))} expected")
    try:
        packed = int8dw.PackedDW8.from_data(data.reshape(shape), tuple(w_shape))
    except ValueError as err:
        raise refuse(spec, str(err)) from None

    def run(x, y, *geo, **kw):
        return int8dw.depthwise_nchwc(x, packed, y, *geo, **kw)

    return _conv_kernel(spec, w_shape, geometry, bias, has_b, clip, act, run, dw_unit(), "nchwc_int8dw")


KERNELS = {(quant.DOMAIN, quant.FAKE_QUANT): fake_quant_factory}
