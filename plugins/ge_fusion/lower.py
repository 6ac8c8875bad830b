"""Standard ONNX forms of the fused ops (``OpDef.lower``, for ``ge export``).

Each fused op becomes the ops it was fused from: FusedConv a Conv and its epilogue program,
FusedMatMul a MatMul (Gemm's transposes, alpha and beta) and its epilogue, FusedElemwise its
program step by step (:meth:`ge_sdk.lowering.Builder.program`), Attention its two products and
softmax (the fake-quants of a quantised model where the kernel applies them; a bf16 compute_dtype
exported as float32), the norms their reductions, Rotary its halves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ge_core.ir.graph import Node, Value
from ge_sdk import fused
from ge_sdk.lowering import Builder, refuse


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _inputs(node: Node, first: int) -> list[Value | None]:
    return list(node.inputs[first:])


def lower_conv(node: Node, opset: int) -> Sequence[Value]:
    b, a = Builder(node, opset), node.attrs
    attrs = {k: a[k] for k in fused.CONV_ATTRS if a.get(k) is not None}
    if _text(attrs.get("auto_pad", "NOTSET")) == "NOTSET":
        attrs.pop("auto_pad", None)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    y = b.op("Conv", [node.inputs[0], node.inputs[1], bias], attrs)
    prog = a.get("epilogue", "")
    return [b.program(prog, _inputs(node, 3), y) if prog else y]


def lower_matmul(node: Node, opset: int) -> Sequence[Value]:
    b, a = Builder(node, opset), node.attrs
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    if int(a.get("transA", 0) or 0):
        x = b.transpose_last2(x)
    if int(a.get("transB", 0) or 0):
        w = b.transpose_last2(w)
    y = b.op("MatMul", [x, w])
    dt = b.dtype(node.outputs[0])
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    if alpha != 1.0:
        y = b.op("Mul", [y, b.const(alpha, dt)])
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is not None:
        y = b.op("Add", [y, c if beta == 1.0 else b.op("Mul", [c, b.const(beta, dt)])])
    prog = a.get("epilogue", "")
    return [b.program(prog, _inputs(node, 3), y) if prog else y]


def lower_elemwise(node: Node, opset: int) -> Sequence[Value]:
    return [Builder(node, opset).program(node.attrs.get("program", ""), _inputs(node, 0))]


def _perm(b: Builder, node: Node, x: Value, name: str, rank: int | None) -> Value:
    try:
        p = fused.attention_perm(node, name, rank)
    except ValueError as e:
        raise refuse(node, str(e)) from None
    return x if p is None else b.op("Transpose", [x], {"perm": p})


def lower_attention(node: Node, opset: int) -> Sequence[Value]:
    b, a = Builder(node, opset), node.attrs
    q, kt, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    assert q is not None and kt is not None and v is not None
    q = _perm(b, node, q, "perm_q", q.type.rank)
    kt = _perm(b, node, kt, "perm_kt", kt.type.rank)
    v = _perm(b, node, v, "perm_v", v.type.rank)
    quants = [fused.attention_quant(node, name) for name in fused.ATTENTION_QUANTS]

    def fq(x: Value, i: int) -> Value:
        return x if quants[i] is None else b.fake_quant(x, *quants[i])  # type: ignore[misc]

    s = fq(b.op("MatMul", [q, kt]), 0)
    scale = float(a.get("scale", 1.0))
    if scale != 1.0:
        s = b.op("Mul", [s, b.const(scale, b.dtype(node.outputs[0]))])
    s = fq(s, 1)
    if mask is not None:
        s = b.op("Add", [s, mask])
    p = fq(b.softmax(fq(s, 2), -1, None), 3)
    y = fq(b.op("MatMul", [p, v]), 4)
    return [_perm(b, node, y, "perm_out", node.inputs[0].type.rank if node.inputs[0] is not None else None)]


def lower_layer_norm(node: Node, opset: int) -> Sequence[Value]:
    b = Builder(node, opset)
    x = node.inputs[0]
    assert x is not None
    eps = b.const(float(node.attrs.get("epsilon", 1e-5)), b.dtype(x))
    centred = b.op("Sub", [x, b.reduce("ReduceMean", x, [-1])])
    var = b.reduce("ReduceMean", b.op("Mul", [centred, centred]), [-1])
    return [_affine(b, node, b.op("Div", [centred, b.op("Sqrt", [b.op("Add", [var, eps])])]))]


def lower_rms_norm(node: Node, opset: int) -> Sequence[Value]:
    b = Builder(node, opset)
    x = node.inputs[0]
    assert x is not None
    eps = b.const(float(node.attrs.get("epsilon", 1e-6)), b.dtype(x))
    ms = b.reduce("ReduceMean", b.op("Mul", [x, x]), [-1])
    return [_affine(b, node, b.op("Div", [x, b.op("Sqrt", [b.op("Add", [ms, eps])])]))]


def _affine(b: Builder, node: Node, y: Value) -> Value:
    """``y * gamma + beta`` with the norm's optional inputs 1 and 2."""
    gamma, beta = (node.inputs[i] if len(node.inputs) > i else None for i in (1, 2))
    if gamma is not None:
        y = b.op("Mul", [y, gamma])
    return y if beta is None else b.op("Add", [y, beta])


def lower_softmax(node: Node, opset: int) -> Sequence[Value]:
    x = node.inputs[0]
    assert x is not None
    return [Builder(node, opset).softmax(x, int(node.attrs.get("axis", -1)), x.type.rank)]


def lower_gelu(node: Node, opset: int) -> Sequence[Value]:
    assert node.inputs[0] is not None
    return [Builder(node, opset).gelu(node.inputs[0], _text(node.attrs.get("approximate", "none")) or "none")]


def lower_silu(node: Node, opset: int) -> Sequence[Value]:
    assert node.inputs[0] is not None
    return [Builder(node, opset).activation(node.inputs[0], "silu")]


def lower_rotary(node: Node, opset: int) -> Sequence[Value]:
    """``X * Cos + rotate_half(X) * Sin``, rotate_half(X) = concat(-X[..., d/2:], X[..., :d/2])."""
    b = Builder(node, opset)
    x, cos, sin = node.inputs[:3]
    assert x is not None and cos is not None and sin is not None
    d = x.type.shape[-1] if x.type.shape else None
    if not isinstance(d, int) or d % 2:
        raise refuse(node, "the last axis of its input is not a static even size")
    rank = len(x.type.shape or ())
    lo, hi = b.slice_axis(x, rank - 1, 0, d // 2), b.slice_axis(x, rank - 1, d // 2, d)
    rot = b.op("Concat", [b.op("Neg", [hi]), lo], {"axis": rank - 1})
    return [b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rot, sin])])]


#: op type (domain ge.fused) -> its lowering (the OpDefs' ``lower``)
LOWERINGS: dict[str, Callable[[Node, int], Sequence[Value]]] = {
    fused.FUSED_CONV: lower_conv,
    fused.FUSED_MATMUL: lower_matmul,
    fused.FUSED_ELEMWISE: lower_elemwise,
    fused.ATTENTION: lower_attention,
    fused.LAYER_NORM: lower_layer_norm,
    fused.RMS_NORM: lower_rms_norm,
    fused.SOFTMAX: lower_softmax,
    fused.GELU: lower_gelu,
    fused.SILU: lower_silu,
    fused.ROTARY: lower_rotary,
}
