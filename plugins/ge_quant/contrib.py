"""The QOperator ops onnxruntime's quantiser writes in its contrib domain (``com.microsoft``):
``QLinearAdd``, ``QLinearMul``, ``QLinearGlobalAveragePool``, ``QLinearAveragePool``,
``QLinearConcat``, ``QLinearSigmoid``, ``QLinearLeakyRelu`` and ``QGemm``, as onnxruntime defines
them. The ``qdq_regions`` pass reads each as ``DequantizeLinear`` of its inputs -> the float op ->
``QuantizeLinear`` of its output (:func:`to_qdq`), which the rest of the pass turns into int8
regions; so they need no kernel of their own. Their type inference is here (the load checks the
model's types before the pass runs)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.ops import OpDef, OpKind

DOMAIN = "com.microsoft"

#: op -> (float op, the (value, scale, zero point) input triples, the output's (scale, zero
#: point) inputs or None, the attributes the float op keeps)
FORMS: dict[str, tuple[str, list[tuple[int, int, int]], tuple[int, int] | None, tuple[str, ...]]] = {
    "QLinearAdd": ("Add", [(0, 1, 2), (3, 4, 5)], (6, 7), ()),
    "QLinearMul": ("Mul", [(0, 1, 2), (3, 4, 5)], (6, 7), ()),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", [(0, 1, 2)], (3, 4), ()),
    "QLinearAveragePool": ("AveragePool", [(0, 1, 2)], (3, 4),
                           ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")),
    "QLinearSigmoid": ("Sigmoid", [(0, 1, 2)], (3, 4), ()),
    "QLinearLeakyRelu": ("LeakyRelu", [(0, 1, 2)], (3, 4), ("alpha",)),
}


def _qtype(node: Node, zp_index: int) -> np.dtype:
    z = node.inputs[zp_index] if len(node.inputs) > zp_index else None
    return np.dtype(z.type.dtype) if z is not None and z.type is not None and z.type.dtype is not None \
        else np.dtype(np.uint8)


def _shape(v: Value | None) -> tuple | None:
    return None if v is None or v.type is None else v.type.shape


def _broadcast(shapes: list[tuple | None]) -> tuple | None:
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes if s is not None)
    out: list[Any] = []
    for i in range(rank):
        ds = [s[len(s) - rank + i] for s in shapes if s is not None and len(s) - rank + i >= 0]
        known = {d for d in ds if isinstance(d, int) and d != 1}
        out.append(known.pop() if len(known) == 1 else (1 if all(d == 1 for d in ds) else None))
    return tuple(out)


def _infer(node: Node, opset: int) -> list[TensorType]:
    op = node.op_type
    shape: tuple | None = None
    if op == "QGemm":
        a, b = _shape(node.inputs[0]), _shape(node.inputs[3])
        if a is not None and b is not None and len(a) == 2 and len(b) == 2:
            m = a[1] if int(node.attrs.get("transA", 0) or 0) else a[0]
            n = b[0] if int(node.attrs.get("transB", 0) or 0) else b[1]
            shape = (m, n)
        has_y = len(node.inputs) > 7 and node.inputs[7] is not None
        return [TensorType(_qtype(node, 8) if has_y else np.dtype(np.float32), shape)]
    if op == "QLinearConcat":
        shapes = [_shape(node.inputs[i]) for i in range(2, len(node.inputs), 3)]
        axis = int(node.attrs.get("axis", 0))
        if shapes and all(s is not None for s in shapes) and len({len(s) for s in shapes if s is not None}) == 1:
            first = shapes[0]
            assert first is not None
            ax = axis % len(first)
            parts = [s[ax] for s in shapes if s is not None]
            shape = tuple(sum(parts) if i == ax and all(isinstance(p, int) for p in parts) else
                          (first[i] if i != ax else None) for i in range(len(first)))
        return [TensorType(_qtype(node, 1), shape)]
    _, triples, out, _ = FORMS[op]
    x = _shape(node.inputs[0])
    if op in ("QLinearAdd", "QLinearMul"):
        shape = _broadcast([_shape(node.inputs[t[0]]) for t in triples])
    elif op == "QLinearGlobalAveragePool":
        last = int(node.attrs.get("channels_last", 0) or 0)
        shape = None if x is None else ((x[0], *([1] * (len(x) - 2)), x[-1]) if last else (*x[:2], *([1] * (len(x) - 2))))
    elif op == "QLinearAveragePool":
        shape = None  # (the float op's inference gives it once the pass has rewritten the node)
    else:
        shape = x
    assert out is not None
    return [TensorType(_qtype(node, out[1]), shape)]


OPDEFS = [OpDef(op, DOMAIN, min_inputs=len(FORMS[op][1]) * 3 + 1 if op in FORMS else (5 if op == "QLinearConcat" else 6),
                kind=OpKind.OPAQUE, infer=_infer,
                doc=f"onnxruntime's {op} (com.microsoft): read as DequantizeLinear -> the float op -> "
                    "QuantizeLinear by ge_quant's qdq_regions pass")
          for op in (*FORMS, "QLinearConcat", "QGemm")]


def _dq(g: Graph, n: Node, x: Value | None, s: Value | None, z: Value | None, axis: int | None = None) -> Value:
    attrs = {} if axis is None else {"axis": axis}
    shape = x.type.shape if x is not None and x.type is not None else None
    return g.add_node("DequantizeLinear", [x, s, z], attrs, name=f"{n.name}_dq", before=n,
                      output_types=[TensorType(np.dtype(np.float32), shape)]).outputs[0]


def _finish(g: Graph, n: Node, op: str, ins: list, attrs: dict, ys: Value | None, yz: Value | None) -> None:
    y = n.outputs[0]
    f = g.add_node(op, ins, attrs, name=f"{n.name}_float", before=n,
                   output_types=[TensorType(np.dtype(np.float32), y.type.shape if y.type is not None else None)])
    out = f.outputs[0]
    if ys is not None:
        out = g.add_node("QuantizeLinear", [out, ys, yz], name=f"{n.name}_q", before=n, output_types=[y.type]).outputs[0]
    name = y.name
    y.replace_all_uses_with(out)
    g.remove_node(n)
    if name not in g.names:
        g.rename_value(out, name)


def to_qdq(g: Graph, n: Node) -> bool:
    """Rewrite contrib QOperator node ``n`` as DequantizeLinear -> float op -> QuantizeLinear;
    False when it is not one this reads (left for the load's own error)."""
    if n.domain != DOMAIN:
        return False
    ins = list(n.inputs)
    if n.op_type in FORMS:
        op, triples, out, keep = FORMS[n.op_type]
        if n.op_type == "QLinearGlobalAveragePool" and int(n.attrs.get("channels_last", 0) or 0):
            return False
        if n.op_type == "QLinearAveragePool" and int(n.attrs.get("channels_last", 0) or 0):
            return False
        ins += [None] * (max(max(t) for t in triples) + 3 - len(ins))
        floats = [_dq(g, n, ins[a], ins[b], ins[c]) for a, b, c in triples]
        assert out is not None
        _finish(g, n, op, floats, {k: v for k, v in n.attrs.items() if k in keep}, ins[out[0]], ins[out[1]])
        return True
    if n.op_type == "QLinearConcat":
        floats = [_dq(g, n, ins[i], ins[i + 1], ins[i + 2]) for i in range(2, len(ins) - 2, 3)]
        _finish(g, n, "Concat", floats, {"axis": int(n.attrs.get("axis", 0))}, ins[0], ins[1])
        return True
    if n.op_type == "QGemm":
        return _qgemm(g, n, ins + [None] * (9 - len(ins)))
    return False


def _qgemm(g: Graph, n: Node, ins: list) -> bool:
    a, sa, za, b, sb, zb, c, ys, yz = ins[:9]
    trans_b = int(n.attrs.get("transB", 0) or 0)
    sb_c = sb.const_value if sb is not None else None
    sa_c = sa.const_value if sa is not None else None
    if c is not None and (c.const_value is None or sa_c is None or sb_c is None):
        return False
    per_col = sb_c is not None and np.asarray(sb_c).size > 1
    fa = _dq(g, n, a, sa, za)
    fb = _dq(g, n, b, sb, zb, axis=(0 if trans_b else 1) if per_col else None)
    fins = [fa, fb]
    if c is not None:
        assert sa_c is not None and sb_c is not None and c.const_value is not None
        mult = (np.asarray(sa_c, np.float32).reshape(()) * np.asarray(sb_c, np.float32).reshape(-1)).astype(np.float32)
        fins.append(g.add_constant((np.asarray(c.const_value).astype(np.float32) * mult).astype(np.float32),
                                   g.names.fresh(f"{n.name}_bias")))
    attrs = {k: v for k, v in n.attrs.items() if k in ("alpha", "transA", "transB")}
    _finish(g, n, "Gemm", fins, attrs, ys, yz)
    return True
