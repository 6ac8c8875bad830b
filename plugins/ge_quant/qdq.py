"""The ``qdq_regions`` pass: a quantised model read into int8 regions a backend runs on its
integer units (the handshake is :mod:`ge_sdk.quant`).

Quantised ONNX models come in three forms, all read into one:

- **QDQ** (onnxruntime's ``quantize_static`` default, PyTorch's PT2E export, TensorFlow's
  fake-quant): ``DequantizeLinear`` of int8 constants for the weights, ``QuantizeLinear`` ->
  ``DequantizeLinear`` pairs on the activations;
- **QOperator**: ``QLinearConv`` / ``QLinearMatMul`` on uint8/int8 tensors (and onnxruntime's
  contrib ``QLinearAdd``, ``QGemm``, ... of :mod:`.contrib`): each becomes ``DequantizeLinear`` ->
  the float op -> ``QuantizeLinear`` first (an int32 bias dequantised with ``x_scale * w_scale``),
  then read as QDQ;
- **dynamic** (``quantize_dynamic``): ``DynamicQuantizeLinear`` -> ``MatMulInteger`` (``ConvInteger``)
  -> ``Cast`` -> ``Mul`` by ``x_scale * w_scale`` becomes a ``MatMul`` (``Conv``) whose input is
  quantised per run.

Then: a ``DequantizeLinear`` of constants becomes the float32 constant it computes (the same
bits as the kernel's ``(q - zero_point) * scale``); a ``QuantizeLinear`` whose ``DequantizeLinear``
uses the same per-tensor scale and zero point becomes one elementwise ``ge.quant::FakeQuant``
(``clip(rint(x / s), lo - z, hi - z) * s``: exactly the dequantised values); and each Conv / MatMul / Gemm whose input is such a fake-quant
(or dynamically quantised) and whose weight was an int8 constant with zero point 0, per tensor
or per output channel, gets an entry in the graph's int8 table: the backend quantises its input
while packing it (the same integers as the fake-quant), multiplies in int8 with int32 sums and
dequantises at the store. What a backend has no int8 kernel for runs the same float32 arithmetic
on the grid values, which is what the quantised model means.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.passes import PassContext, PassResult
from ge_sdk import quant

from . import contrib

ONNX = ("", "ai.onnx")
#: the integer types a fake-quant keeps (their ranges)
RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}
#: the attributes a Conv keeps of a QLinearConv / ConvInteger
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
#: matrix ops and the input index of their weight
MATRIX = {"Conv": 1, "MatMul": 1, "Gemm": 1}


def qdq_pass(graph: Graph, ctx: PassContext) -> PassResult:
    """Read QDQ / QOperator / dynamic quantisation into fake-quant arithmetic and int8 entries."""
    stats = {"qoperator": 0, "dynamic": 0, "weights": 0, "fake_quant": 0, "int8_ops": 0}
    stack = [graph]
    while stack:
        g = stack.pop()
        nodes = g.node_list()
        for n in nodes:
            stack.extend(n.subgraphs())
        if not any((n.op_type in ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                                  "MatMulInteger", "ConvInteger") and n.domain in ONNX) or n.domain == contrib.DOMAIN for n in nodes):
            continue
        dyn: dict[Value, tuple] = {}
        for n in nodes:
            if n.domain == contrib.DOMAIN and contrib.to_qdq(g, n):
                stats["qoperator"] += 1
            if n.erased or n.domain not in ONNX:
                continue
            if n.op_type in ("QLinearConv", "QLinearMatMul") and _qoperator(g, n):
                stats["qoperator"] += 1
            elif n.op_type in ("MatMulInteger", "ConvInteger"):
                got = _dynamic(g, n)
                if got is not None:
                    dyn[got[0]] = got[1]
                    stats["dynamic"] += 1
        weights: dict[Value, tuple] = {}
        fq: dict[Value, tuple] = {}
        for n in g.node_list():
            if n.domain not in ONNX:
                continue
            if n.op_type == "DequantizeLinear":
                got = _const_dq(g, n)
                if got is not None:
                    weights[got[0]] = got[1]
                    stats["weights"] += 1
            elif n.op_type == "QuantizeLinear":
                for v, info in _fake_quant(g, n):
                    fq[v] = info
                    stats["fake_quant"] += 1
        for n in g.node_list():
            if n.domain in ONNX and n.op_type in MATRIX and _entry(g, n, fq, weights, dyn):
                stats["int8_ops"] += 1
    changed = any(stats.values())
    return PassResult(changed, {k: v for k, v in stats.items() if v})


# ------------------------------------------------------------------------------------------------
# helpers


def _const(v: Value | None) -> np.ndarray | None:
    return None if v is None or v.const_value is None else np.asarray(v.const_value)


def _input(n: Node, i: int) -> Value | None:
    return n.inputs[i] if len(n.inputs) > i else None


def _ftype(like: Value | None) -> TensorType:
    return TensorType(np.dtype(np.float32), like.type.shape if like is not None and like.type is not None else None)


def _replace(g: Graph, old: Value, new: Value) -> None:
    """Every use of ``old`` (a graph output too) reads ``new``, which takes ``old``'s name."""
    name = old.name
    old.replace_all_uses_with(new)
    producer = old.producer
    if producer is not None and not any(o.has_uses() or o.is_graph_output for o in producer.outputs):
        g.remove_node(producer)
    if name not in g.names:
        g.rename_value(new, name)


def _scalar(a: np.ndarray | None) -> bool:
    return a is not None and a.size == 1


def _dq_values(q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int) -> np.ndarray:
    """DequantizeLinear's float32 values of constant ``q`` (per tensor or along ``axis``)."""
    s = np.asarray(scale, np.float32)
    z = np.zeros(1, np.float32) if zp is None else np.asarray(zp).astype(np.float32)
    if s.size > 1 or z.size > 1:
        shape = [1] * q.ndim
        shape[axis % q.ndim] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    else:
        s, z = s.reshape(()), z.reshape(())
    return np.ascontiguousarray((q.astype(np.float32) - z) * s, np.float32)


# ------------------------------------------------------------------------------------------------
# QOperator -> QDQ


def _dq(g: Graph, x: Value | None, s: Value | None, z: Value | None, before: Node, axis: int | None = None) -> Value:
    attrs = {} if axis is None else {"axis": axis}
    return g.add_node("DequantizeLinear", [x, s, z], attrs, name=f"{before.name}_dq", before=before,
                      output_types=[_ftype(x)]).outputs[0]


def _qoperator(g: Graph, n: Node) -> bool:
    """QLinearConv / QLinearMatMul ``n`` as DequantizeLinear -> Conv/MatMul -> QuantizeLinear."""
    conv = n.op_type == "QLinearConv"
    ins = list(n.inputs) + [None] * (9 - len(n.inputs))
    x, xs, xz, w, ws, wz, ys, yz = ins[:8]
    if any(v is None for v in (x, xs, w, ws, ys)) or _const(xs) is None or _const(ws) is None:
        return False
    y = n.outputs[0]
    ws_arr, xs_arr = _const(ws), _const(xs)
    b = _const(ins[8]) if conv and ins[8] is not None else None
    if ws_arr is None or xs_arr is None or (conv and ins[8] is not None and b is None):
        return False
    dx = _dq(g, x, xs, xz, n)
    dw = _dq(g, w, ws, wz, n, axis=0 if conv else (1 if ws_arr.size > 1 else None))
    bias = None
    if b is not None:
        mult = (np.asarray(xs_arr, np.float32).reshape(()) * np.asarray(ws_arr, np.float32).reshape(-1)).astype(np.float32)
        bias = g.add_constant((b.astype(np.float32) * mult).astype(np.float32), g.names.fresh(f"{n.name}_bias"))
    attrs = {k: v for k, v in n.attrs.items() if k in CONV_ATTRS} if conv else {}
    mm = g.add_node("Conv" if conv else "MatMul", [dx, dw, bias] if bias is not None else [dx, dw], attrs,
                    name=f"{n.name}_float", before=n, output_types=[_ftype(y)])
    q = g.add_node("QuantizeLinear", [mm.outputs[0], ys, yz], name=f"{n.name}_q", before=n,
                   output_types=[y.type])
    _replace(g, y, q.outputs[0])
    return True


# ------------------------------------------------------------------------------------------------
# dynamic quantisation


def _only_user(v: Value) -> Node | None:
    us = v.users
    return us[0] if len(us) == 1 and not v.is_graph_output else None


def _dynamic(g: Graph, n: Node) -> tuple[Value, Any] | None:
    """``Mul(Cast(MatMulInteger(DQL(x)[0], Wq, DQL(x)[2], wz)), Mul(DQL(x)[1], ws))`` as a float
    MatMul of ``x`` by the dequantised weight (ConvInteger: a float Conv with its attributes);
    returns (its output, the weight's scales)."""
    conv = n.op_type == "ConvInteger"
    a, wq_v = _input(n, 0), _input(n, 1)
    dql = a.producer if a is not None else None
    wq = _const(wq_v)
    if dql is None or dql.op_type != "DynamicQuantizeLinear" or a is not dql.outputs[0] or wq is None \
            or wq.ndim != (4 if conv else 2) or wq.dtype != np.int8 or _input(n, 2) is not dql.outputs[2]:
        return None
    wz = _const(_input(n, 3))
    if _input(n, 3) is not None and (wz is None or np.any(wz != 0)):
        return None
    cast = _only_user(n.outputs[0])
    if cast is None or cast.op_type != "Cast" or int(cast.attrs.get("to", 0)) != 1:
        return None
    mul = _only_user(cast.outputs[0])
    if mul is None or mul.op_type != "Mul":
        return None
    other = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
    smul = other.producer if other is not None else None
    if smul is None or smul.op_type != "Mul":
        return None
    s0, s1 = smul.inputs[0], smul.inputs[1]
    ws_v = s1 if s0 is dql.outputs[1] else s0 if s1 is dql.outputs[1] else None
    ws = _const(ws_v)
    channels = wq.shape[0 if conv else 1]
    if ws is None or ws.dtype != np.float32 or not (ws.size == 1 or ws.size == channels):
        return None
    if ws.size > 1 and ws.shape not in ((channels,), (channels, 1, 1)):
        return None
    x = dql.inputs[0]
    w_f = _dq_values(wq, ws.reshape(-1), None, 0 if conv else 1)
    y = mul.outputs[0]
    attrs = {k: v for k, v in n.attrs.items() if k in CONV_ATTRS} if conv else {}
    mm = g.add_node("Conv" if conv else "MatMul", [x, g.add_constant(w_f, g.names.fresh(f"{n.name}_w"))], attrs,
                    name=f"{n.name}_float", before=mul, output_types=[_ftype(y)])
    _replace(g, y, mm.outputs[0])
    return mm.outputs[0], ("dynamic", ws.reshape(-1))


# ------------------------------------------------------------------------------------------------
# constants and fake-quant


def _const_dq(g: Graph, n: Node) -> tuple[Value, Any] | None:
    """A DequantizeLinear of constants as the float32 constant it computes; returns (that
    constant, (int8 scales, axis)) when it is an int8 weight with zero point 0, or a uint8 one
    with zero point 128 (TensorFlow's symmetric narrow-range weights: the int8 weight q - 128
    with zero point 0, the same float values); else (None, None)."""
    q, s = _const(_input(n, 0)), _const(_input(n, 1))
    zv = _input(n, 2)
    z = _const(zv)
    if q is None or s is None or (zv is not None and z is None) or int(n.attrs.get("block_size", 0) or 0):
        return None
    if q.dtype.name not in ("int8", "uint8", "int16", "uint16", "int32") or s.dtype != np.float32:
        return None
    axis = int(n.attrs.get("axis", 1))
    if s.size > 1 and (q.ndim == 0 or s.ndim != 1 or s.shape[0] != q.shape[axis % q.ndim]):
        return None
    vals = _dq_values(q, s, z, axis)
    v = g.add_constant(vals, g.names.fresh(f"{n.name}_values"))
    info: tuple = (None, None)
    if (q.dtype == np.int8 and (z is None or not np.any(z != 0))) \
            or (q.dtype == np.uint8 and z is not None and z.dtype == np.uint8 and np.all(z == 128)):
        info = (s.reshape(-1).astype(np.float32), axis % q.ndim if s.size > 1 else None)
    _replace(g, n.outputs[0], v)
    return v, info


def _fake_quant(g: Graph, n: Node) -> list[tuple[Value, tuple]]:
    """Each DequantizeLinear reading QuantizeLinear ``n`` with its per-tensor scale and zero point
    as a FakeQuant of ``n``'s input (exactly its values); returns the FakeQuant's output with
    (scale, zero point, type)."""
    x, sv, zv = _input(n, 0), _input(n, 1), _input(n, 2)
    s, z = _const(sv), _const(zv)
    if x is None or x.type is None or x.type.dtype != np.float32 or not _scalar(s) or (zv is not None and not _scalar(z)):
        return []
    assert s is not None
    qdt = z.dtype.name if z is not None else str(np.dtype(np.uint8))
    if qdt not in RANGES or s.dtype != np.float32 or int(n.attrs.get("block_size", 0) or 0) \
            or not np.isfinite(s).all() or float(s.reshape(())) <= 0 or int(n.attrs.get("saturate", 1)) != 1:
        return []
    zi = int(z.reshape(())) if z is not None else 0
    lo, hi = RANGES[qdt]
    q = n.outputs[0]
    sf = float(s.reshape(()))
    made: list[tuple[Value, tuple]] = []
    fq: list[Value] = []

    def fake() -> Value:
        if not fq:
            fq.append(_fq_nodes(g, x, np.float32(sf), zi, lo, hi, n))
            made.append((fq[0], (sf, zi, qdt)))
        return fq[0]

    for d in list(q.users):
        if _same_dq(d, q, sf, zi):
            _replace(g, d.outputs[0], fake())
        elif d.op_type in MOVES and d.domain in ONNX and d.inputs[0] is q and len(d.outputs) == 1 \
                and d.outputs[0].users and not d.outputs[0].is_graph_output \
                and all(_same_dq(u, d.outputs[0], sf, zi) for u in d.outputs[0].users):
            # DequantizeLinear after a data movement of the integers (Flatten, Reshape, MaxPool,
            # ...): the same movement of the fake-quant's values (quantisation is monotonic)
            t = d.outputs[0].type
            moved = g.add_node(d.op_type, [fake(), *d.inputs[1:]], dict(d.attrs), name=f"{d.name}_float", before=d,
                               output_types=[TensorType(np.dtype(np.float32), t.shape if t is not None else None)])
            for u in list(d.outputs[0].users):
                _replace(g, u.outputs[0], moved.outputs[0])
            made.append((moved.outputs[0], (sf, zi, qdt)))  # (grid values of the same quantisation)
    if not q.has_uses() and not q.is_graph_output:
        g.remove_node(n)
    return made


#: single-output ops that move quantised integers without changing them (or, MaxPool, keep their
#: order): a DequantizeLinear after one is the op on the dequantised values
MOVES = frozenset(("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "MaxPool", "Slice"))


def _same_dq(d: Node, q: Value, s: float, z: int) -> bool:
    """Whether ``d`` is a DequantizeLinear of ``q`` with the per-tensor scale ``s`` and zero point ``z``."""
    if d.op_type != "DequantizeLinear" or d.domain not in ONNX or d.inputs[0] is not q:
        return False
    ds, dz = _const(_input(d, 1)), _const(_input(d, 2))
    dz_i = int(dz.reshape(())) if dz is not None and dz.size == 1 else (0 if _input(d, 2) is None else None)
    return ds is not None and ds.size == 1 and ds.dtype == np.float32 and float(ds.reshape(())) == s and dz_i == z


def _fq_nodes(g: Graph, x: Value, s: np.float32, zp: int, lo: int, hi: int, at: Node) -> Value:
    attrs = {"scale": float(s), "zero_point": zp, "qmin": lo, "qmax": hi}
    return g.add_node(quant.FAKE_QUANT, [x], attrs, domain=quant.DOMAIN, name=f"{at.name}_fq", before=at,
                      output_types=[_ftype(x)]).outputs[0]


# ------------------------------------------------------------------------------------------------
# entries


def _entry(g: Graph, n: Node, fq: dict[Value, tuple], weights: dict[Value, tuple], dyn: dict[Value, tuple]) -> bool:
    """Put matrix op ``n``'s int8 entry in the table when its input is quantised and its weight
    is an int8 constant along the output channel; True when it did."""
    x, w = _input(n, 0), _input(n, 1)
    if n.op_type == "Gemm" and (int(n.attrs.get("transA", 0) or 0) or float(n.attrs.get("alpha", 1.0)) != 1.0):
        return False
    if n.op_type in ("MatMul", "Conv") and n.outputs[0] in dyn:
        kind, ws = dyn[n.outputs[0]]
        quant.table(g)[n.name] = quant.entry(None, w_scale=ws, w_axis=1 if n.op_type == "MatMul" else 0)
        return True
    if x is None or w is None or x not in fq or w not in weights:
        return False
    scales, axis = weights[w]
    if scales is None:
        return False
    wc = _const(w)
    assert wc is not None
    out_axis = {"Conv": 0, "MatMul": 1, "Gemm": 0 if int(n.attrs.get("transB", 0) or 0) else 1}[n.op_type]
    if (n.op_type != "Conv" and wc.ndim != 2) or (axis is not None and axis != out_axis):
        return False
    s, z, dt = fq[x]
    if dt not in quant.RANGES:
        return False
    quant.table(g)[n.name] = quant.entry(s, z, dt, scales, out_axis)
    return True
