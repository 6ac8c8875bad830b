"""Standard ONNX forms of the cpu backend's ops (``OpDef.lower``, for ``ge export``).

The blocked-layout ops (domain ``ge.cpu``, :mod:`.blocked`) become the ONNX op they stand for
between :meth:`ge_sdk.lowering.Builder.unblock` and :meth:`~ge_sdk.lowering.Builder.block`, so
the standard ops the layout pass left on blocked 5-D values (Relu, Add, Concat over the blocks'
axis...) stay as they are; a packed weight is unpacked into its plain constant (a Winograd one by
its transform's pseudo-inverse: the float32 rounding of the transformed weight left, a bf16 or
float16 one widened: the values the kernels compute with). ``PackedMatMul`` becomes MatMul with
its bias and epilogue program. The int8 kernels' forms are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk.lowering import BLOCK, Builder, refuse


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _blocks(v: Value | None) -> int | None:
    s = None if v is None else v.type.shape
    return s[1] if s is not None and len(s) == 5 and isinstance(s[1], int) else None


def _const(node: Node, i: int) -> np.ndarray | None:
    """Input ``i``'s constant value, through a Cast of a constant (a precision mode's float16 store)."""
    v = node.inputs[i] if i < len(node.inputs) else None
    if v is None:
        return None
    if v.const_value is not None:
        return np.asarray(v.const_value)
    p = v.producer
    if p is not None and p.op_type == "Cast" and p.inputs and p.inputs[0] is not None and p.inputs[0].const_value is not None:
        return np.asarray(p.inputs[0].const_value).astype(np.float32)
    return None


def _conv_weight(node: Node, b: Builder, cb: int, group: int) -> Value:
    """An NchwcConv's (M, C/group, KH, KW) float32 weight, unpacked where the pass packed it."""
    packing = _text(node.attrs.get("weight_packing", ""))
    w_in = node.inputs[1]
    if not packing:
        if w_in is not None and w_in.type.dtype == np.float16:
            return b.op("Cast", [w_in], {"to": 1})
        assert w_in is not None
        return w_in
    if packing in ("int8", "int8dw"):
        raise refuse(node, "an int8 convolution (its integer weight and scales have no float form here)")
    wpk = _const(node, 1)
    if wpk is None:
        raise refuse(node, f"its {packing} weight is computed at run time")
    w_shape = tuple(int(v) for v in node.attrs["weight_shape"])
    if packing == "bf16":
        from .kernels.nchwc_reduced import widened

        return b.const(widened(wpk, w_shape, cb), np.float32)
    from .kernels.nchwc import unpack

    return b.const(unpack(packing, np.asarray(wpk, np.float32).reshape(-1), w_shape, cb, group), np.float32)


def _window(attrs: dict[str, Any], pool: bool) -> dict[str, Any]:
    out = {k: [int(x) for x in attrs[k]] for k in ("kernel_shape", "strides", "pads") if attrs.get(k) is not None}
    d = attrs.get("dilations")
    if d is not None and any(int(x) != 1 for x in d):
        out["dilations"] = [int(x) for x in d]
    return out


def lower_conv(node: Node, opset: int) -> Sequence[Value]:
    """NchwcConv: ``act(clip(Conv(X * S, W) + B + Z))`` in NCHW, blocked again."""
    b, a = Builder(node, opset), node.attrs
    if _text(a.get("out_dtype", "")) == "uint8":
        raise refuse(node, "an int8 convolution writing quantised integers")
    x, bias = node.inputs[0], node.inputs[2] if len(node.inputs) > 2 else None
    z, scale = (node.inputs[i] if len(node.inputs) > i else None for i in (3, 4))
    plain = bool(int(a.get("plain_input", 0) or 0))
    group = int(a.get("group", 1) or 1)
    cb = 0 if plain else _blocks(x)
    if x is None or cb is None:
        raise refuse(node, "its blocked input's shape is unknown")
    w = _conv_weight(node, b, cb, group)
    w_shape = a.get("weight_shape") or (w.type.shape if w.type.shape is not None else None)
    if w_shape is None or len(w_shape) != 4:
        raise refuse(node, "its weight's shape is unknown")
    m, cg = int(w_shape[0]), int(w_shape[1])
    if not plain:
        if scale is not None:
            x = b.op("Mul", [x, scale])
        depthwise = group > 1 and cg == 1 and group == m
        x = b.unblock(x, m if depthwise else (cg if group == 1 else cg * group))
    y = b.op("Conv", [x, w, bias], {**_window(a, False), "group": group})
    if z is not None:
        y = b.op("Add", [y, b.unblock(z, m)])
    lo, hi = a.get("clip_min"), a.get("clip_max")
    y = b.clip(y, None if lo is None else float(lo), None if hi is None else float(hi))
    return [b.block(b.activation(y, _text(a.get("activation", ""))), m)]


def lower_pool(node: Node, opset: int) -> Sequence[Value]:
    """NchwcMaxPool / NchwcAveragePool: the pool over every lane."""
    b, a = Builder(node, opset), node.attrs
    x = node.inputs[0]
    cb = _blocks(x)
    if x is None or cb is None:
        raise refuse(node, "its blocked input's shape is unknown")
    attrs = _window(a, True)
    if node.op_type == "NchwcAveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 0) or 0)
        if "dilations" in attrs and opset < 19:
            raise refuse(node, f"a dilated AveragePool needs opset 19 (the model's is {opset})")
    y = b.op("MaxPool" if node.op_type == "NchwcMaxPool" else "AveragePool", [b.unblock(x)], attrs)
    return [b.block(y, cb * BLOCK)]


def lower_gap(node: Node, opset: int) -> Sequence[Value]:
    """NchwcGlobalAveragePool: the NCHW (N, C, 1, 1) means of the first ``channels`` lanes."""
    b = Builder(node, opset)
    x = node.inputs[0]
    if x is None:
        raise refuse(node, "it has no input")
    y = b.op("GlobalAveragePool", [b.unblock(x)])
    c = int(node.attrs.get("channels", 0) or 0)
    cb = _blocks(x)
    return [b.slice_axis(y, 1, 0, c) if c and c != (cb or 0) * BLOCK else y]


def lower_group_norm(node: Node, opset: int) -> Sequence[Value]:
    """NchwcGroupNorm: mean and variance over groups of ``group_channels`` lanes and the plane,
    then Scale and Bias per lane (then a Relu)."""
    b, a = Builder(node, opset), node.attrs
    x, sc, bi = node.inputs[:3]
    cb = _blocks(x)
    if x is None or sc is None or bi is None or cb is None:
        raise refuse(node, "its blocked input's shape is unknown")
    x4 = b.unblock(x)
    gs = int(a.get("group_channels", 1) or 1)
    g = b.op("Reshape", [x4, b.ints([0, cb * BLOCK // gs, -1])])
    centred = b.op("Sub", [g, b.reduce("ReduceMean", g, [2])])
    var = b.reduce("ReduceMean", b.op("Mul", [centred, centred]), [2])
    eps = b.const(float(a.get("epsilon", 1e-5)), np.float32)
    norm = b.op("Reshape", [b.op("Div", [centred, b.op("Sqrt", [b.op("Add", [var, eps])])]), b.op("Shape", [x4])])
    lane = b.ints([1, -1, 1, 1])
    y = b.op("Add", [b.op("Mul", [norm, b.op("Reshape", [sc, lane])]), b.op("Reshape", [bi, lane])])
    if int(a.get("relu", 0) or 0):
        y = b.op("Relu", [y])
    return [b.block(y, cb * BLOCK)]


def lower_reorder_input(node: Node, opset: int) -> Sequence[Value]:
    b = Builder(node, opset)
    x = node.inputs[0]
    c = None if x is None or x.type.shape is None or len(x.type.shape) != 4 else x.type.shape[1]
    if x is None or not isinstance(c, int):
        raise refuse(node, "its input's channels are unknown")
    return [b.block(x, c)]


def lower_reorder_output(node: Node, opset: int) -> Sequence[Value]:
    b = Builder(node, opset)
    assert node.inputs[0] is not None
    return [b.unblock(node.inputs[0], int(node.attrs.get("channels", 0) or 0) or None)]


def lower_packed_matmul(node: Node, opset: int) -> Sequence[Value]:
    """PackedMatMul: ``epilogue(A @ W + B)``, W unpacked to its float32 values."""
    b, a = Builder(node, opset), node.attrs
    dt, k, n = _text(a.get("weight_dtype", "bfloat16")), int(a["k"]), int(a["n"])
    if dt == "int8":
        raise refuse(node, "an int8 matrix product (its A is quantised by the kernel)")
    w = _const(node, 1)
    if w is None:
        raise refuse(node, "its weight is not a constant")
    if dt == "bfloat16":
        from .reduced import unpack_bf16

        dense = unpack_bf16(w, k, n)
    else:
        dense = np.asarray(w, np.float32).reshape(k, n)
    x = node.inputs[0]
    assert x is not None
    y = b.op("MatMul", [x, b.const(dense, np.float32)])
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        y = b.op("Add", [y, node.inputs[2]])
    prog = a.get("epilogue", "")
    if prog:
        y = b.program(prog, list(node.inputs[3:]), y)
    return [y]


#: op type (domain ge.cpu) -> its lowering (the OpDefs' ``lower``, set by the plugin)
LOWERINGS: dict[str, Callable[[Node, int], Sequence[Value]]] = {
    "NchwcConv": lower_conv,
    "NchwcMaxPool": lower_pool,
    "NchwcAveragePool": lower_pool,
    "NchwcGlobalAveragePool": lower_gap,
    "NchwcGroupNorm": lower_group_norm,
    "NchwcReorderInput": lower_reorder_input,
    "NchwcReorderOutput": lower_reorder_output,
    "PackedMatMul": lower_packed_matmul,
}
