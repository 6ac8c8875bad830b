"""Built-in op mappers: core ATen (and a few composite ATen ops kept whole) to ONNX-semantics IR.

Each mapper is ``mapper(ctx, node)`` (see :mod:`ge_torch.convert`). ``MAPPERS`` maps the op key
(``"aten.convolution.default"``) to its mapper; the plugin registers each one as
``register("torch", key, mapper)``. This module imports no torch at import time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ge_core.errors import UnsupportedOpError
from ge_core.ir.types import TensorType
from ge_sdk.onnx_types import ELEM_TYPES

from .convert import INT64_MAX, INT64_MIN, MapContext, np_dtype

Mapper = Callable[[MapContext, Any], Any]
MAPPERS: dict[str, Mapper] = {}

def onnx_code(dtype: Any) -> int:
    """ONNX TensorProto code of a NumPy dtype (Cast's ``to``)."""
    return ELEM_TYPES[np.dtype(dtype).name]


def reg(*keys: str) -> Callable[[Mapper], Mapper]:
    def deco(fn: Mapper) -> Mapper:
        for k in keys:
            MAPPERS[k] = fn
        return fn

    return deco


def _cast(ctx: MapContext, v, dtype):
    dt = np.dtype(dtype)
    if v.type.dtype == dt:
        return v
    return ctx.op("Cast", [v], to=onnx_code(dt))


def _val(ctx: MapContext, arg, dtype=None):
    """ctx.value with Cast codes (the context's own cast uses ONNX codes through here)."""
    v = ctx.value(arg, None)
    if dtype is None:
        return v
    have = ctx.dtype(arg) if not isinstance(arg, (int, float, bool)) else None
    if isinstance(arg, (int, float, bool)) or (have is None and v.is_constant):
        if v.is_constant and v.const_value is not None and v.const_value.dtype != np.dtype(dtype):
            return ctx.const(np.asarray(v.const_value).astype(dtype))
        return v
    return _cast(ctx, v, dtype)


def _norm_axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _consts_i64(ctx: MapContext, values) -> Any:
    return ctx.const(np.asarray(values, dtype=np.int64))


# ------------------------------------------------------------------------------------------
# elementwise
# ------------------------------------------------------------------------------------------
_UNARY = {
    "aten.relu.default": "Relu", "aten.sigmoid.default": "Sigmoid", "aten.tanh.default": "Tanh",
    "aten.exp.default": "Exp", "aten.log.default": "Log", "aten.sqrt.default": "Sqrt",
    "aten.abs.default": "Abs", "aten.neg.default": "Neg", "aten.reciprocal.default": "Reciprocal",
    "aten.erf.default": "Erf", "aten.sin.default": "Sin", "aten.cos.default": "Cos", "aten.tan.default": "Tan",
    "aten.asin.default": "Asin", "aten.acos.default": "Acos", "aten.atan.default": "Atan",
    "aten.sinh.default": "Sinh", "aten.cosh.default": "Cosh", "aten.floor.default": "Floor",
    "aten.ceil.default": "Ceil", "aten.round.default": "Round", "aten.sign.default": "Sign",
    "aten.isnan.default": "IsNaN", "aten.hardswish.default": "HardSwish", "aten.mish.default": "Mish",
    "aten.softsign.default": "Softsign",
}


def _unary(onnx_op: str) -> Mapper:
    def m(ctx: MapContext, node):
        x = node.args[0]
        out = ctx.out_dtype()
        v = _val(ctx, x, out if onnx_op not in ("IsNaN",) else None)
        return ctx.op(onnx_op, [v])

    return m


for _k, _op in _UNARY.items():
    MAPPERS[_k] = _unary(_op)


@reg("aten.rsqrt.default")
def _rsqrt(ctx, node):
    x = _val(ctx, node.args[0], ctx.out_dtype())
    return ctx.op("Reciprocal", [ctx.op("Sqrt", [x])])


@reg("aten.log1p.default")
def _log1p(ctx, node):
    dt = ctx.out_dtype()
    return ctx.op("Log", [ctx.op("Add", [_val(ctx, node.args[0], dt), ctx.const(1, dt)])])


@reg("aten.expm1.default")
def _expm1(ctx, node):
    dt = ctx.out_dtype()
    return ctx.op("Sub", [ctx.op("Exp", [_val(ctx, node.args[0], dt)]), ctx.const(1, dt)])


@reg("aten.log2.default")
def _log2(ctx, node):
    dt = ctx.out_dtype()
    return ctx.op("Div", [ctx.op("Log", [_val(ctx, node.args[0], dt)]), ctx.const(math.log(2.0), dt)])


@reg("aten.isinf.default")
def _isinf(ctx, node):
    return ctx.op("IsInf", [ctx.value(node.args[0])])


@reg("aten.logical_not.default", "aten.bitwise_not.default")
def _not(ctx, node):
    x = node.args[0]
    if ctx.dtype(x) != np.dtype(bool):
        if node.target.__name__.startswith("bitwise"):
            raise UnsupportedOpError("bitwise_not of integer tensors is not supported")
        return ctx.op("Not", [_val(ctx, x, bool)])
    return ctx.op("Not", [ctx.value(x)])


@reg("aten.gelu.default")
def _gelu(ctx, node):
    a = ctx.args(node)
    x = _val(ctx, a["self"], ctx.out_dtype())
    return ctx.op("Gelu", [x], approximate=a.get("approximate") or "none")


@reg("aten.silu.default")
def _silu(ctx, node):
    x = _val(ctx, node.args[0], ctx.out_dtype())
    return ctx.op("Mul", [x, ctx.op("Sigmoid", [x])])


@reg("aten.hardsigmoid.default")
def _hardsigmoid(ctx, node):
    x = _val(ctx, node.args[0], ctx.out_dtype())
    return ctx.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)


@reg("aten.leaky_relu.default")
def _leaky_relu(ctx, node):
    a = ctx.args(node)
    return ctx.op("LeakyRelu", [ctx.value(a["self"])], alpha=float(a.get("negative_slope", 0.01)))


@reg("aten.elu.default")
def _elu(ctx, node):
    a = ctx.args(node)
    alpha, scale, iscale = float(a["alpha"]), float(a["scale"]), float(a["input_scale"])
    x = ctx.value(a["self"])
    dt = ctx.out_dtype()
    if iscale != 1.0:
        x = ctx.op("Mul", [x, ctx.const(iscale, dt)])
    y = ctx.op("Elu", [x], alpha=alpha)
    if scale != 1.0:
        y = ctx.op("Mul", [y, ctx.const(scale, dt)])
    return y


@reg("aten.softplus.default")
def _softplus(ctx, node):
    a = ctx.args(node)
    beta, threshold = float(a["beta"]), float(a["threshold"])
    dt = ctx.out_dtype()
    x = ctx.value(a["self"])
    bx = ctx.op("Mul", [x, ctx.const(beta, dt)]) if beta != 1.0 else x
    sp = ctx.op("Softplus", [bx])
    if beta != 1.0:
        sp = ctx.op("Div", [sp, ctx.const(beta, dt)])
    return ctx.op("Where", [ctx.op("Greater", [bx, ctx.const(threshold, dt)]), x, sp])


@reg("aten.hardtanh.default", "aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default",
     "aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def _clamp(ctx, node):
    key = str(node.target)
    a = ctx.args(node)
    dt = ctx.out_dtype()
    x = _val(ctx, a["self"], dt)
    if key.startswith("aten.hardtanh"):
        lo, hi = a["min_val"], a["max_val"]
    elif "clamp_min" in key:
        lo, hi = a.get("min"), None
    elif "clamp_max" in key:
        lo, hi = None, a.get("max")
    else:
        lo, hi = a.get("min"), a.get("max")
    if key.endswith(".Tensor"):
        if lo is not None:
            x = ctx.op("Max", [x, _val(ctx, lo, dt)])
        if hi is not None:
            x = ctx.op("Min", [x, _val(ctx, hi, dt)])
        return x
    return ctx.op("Clip", [x, None if lo is None else ctx.const(lo, dt), None if hi is None else ctx.const(hi, dt)])


_BINARY = {
    "aten.add.Tensor": "Add", "aten.add.Scalar": "Add", "aten.sub.Tensor": "Sub", "aten.sub.Scalar": "Sub",
    "aten.mul.Tensor": "Mul", "aten.mul.Scalar": "Mul", "aten.maximum.default": "Max",
    "aten.minimum.default": "Min", "aten.pow.Tensor_Tensor": "Pow", "aten.pow.Tensor_Scalar": "Pow",
    "aten.pow.Scalar": "Pow", "aten.fmod.Tensor": "Mod", "aten.fmod.Scalar": "Mod",
    "aten.atan2.default": "Atan2",
}


def _binary(onnx_op: str) -> Mapper:
    def m(ctx: MapContext, node):
        a = ctx.args(node)
        names = list(a)
        x, y = a[names[0]], a[names[1]]
        dt = ctx.out_dtype()
        if onnx_op == "Pow" and ctx.dtype(x) is not None and isinstance(y, (int, float)):
            if y == 2:
                xv = _val(ctx, x, dt)
                return ctx.op("Mul", [xv, xv])
            if y == 0.5:
                return ctx.op("Sqrt", [_val(ctx, x, dt)])
            if y == 1:
                return ctx.op("Identity", [_val(ctx, x, dt)])
        xv, yv = _val(ctx, x, dt), _val(ctx, y, dt)
        alpha = a.get("alpha")
        if alpha is not None and alpha != 1:
            yv = ctx.op("Mul", [yv, ctx.const(alpha, dt)])
        if onnx_op == "Atan2":
            raise UnsupportedOpError("atan2 is not supported")
        attrs: dict[str, Any] = {"fmod": 1} if onnx_op == "Mod" else {}
        return ctx.op(onnx_op, [xv, yv], **attrs)

    return m


for _k, _op in _BINARY.items():
    MAPPERS[_k] = _binary(_op)


@reg("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype()
    y = _val(ctx, a["other"], dt)
    x = _val(ctx, a["self"], dt)
    if a.get("alpha", 1) != 1:
        x = ctx.op("Mul", [x, ctx.const(a["alpha"], dt)])
    return ctx.op("Sub", [y, x])


@reg("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode",
     "aten.floor_divide.default", "aten.true_divide.Tensor")
def _div(ctx, node):
    a = ctx.args(node)
    names = list(a)
    x, y = a[names[0]], a[names[1]]
    mode = a.get("rounding_mode")
    if "floor_divide" in str(node.target):
        mode = "floor"
    out = ctx.out_dtype()
    if mode is None:
        return ctx.op("Div", [_val(ctx, x, out), _val(ctx, y, out)])
    if out.kind == "f":
        q = ctx.op("Div", [_val(ctx, x, out), _val(ctx, y, out)])
        return ctx.op("Floor", [q]) if mode == "floor" else _trunc(ctx, q, out)
    # integers: ONNX Div truncates toward zero
    xv, yv = _val(ctx, x, out), _val(ctx, y, out)
    q = ctx.op("Div", [xv, yv])
    if mode == "trunc":
        return q
    # floor: q - ((x % y != 0) & ((x < 0) != (y < 0)))
    r = ctx.op("Mod", [xv, yv], fmod=1)
    zero = ctx.const(0, out)
    nonzero = ctx.op("Not", [ctx.op("Equal", [r, zero])])
    signs = ctx.op("Xor", [ctx.op("Less", [xv, zero]), ctx.op("Less", [yv, zero])])
    adj = _cast(ctx, ctx.op("And", [nonzero, signs]), out)
    return ctx.op("Sub", [q, adj])


def _trunc(ctx, q, dt):
    # trunc(q) = sign(q) * floor(|q|)
    return ctx.op("Mul", [ctx.op("Sign", [q]), ctx.op("Floor", [ctx.op("Abs", [q])])])


@reg("aten.remainder.Tensor", "aten.remainder.Scalar")
def _remainder(ctx, node):
    a = ctx.args(node)
    names = list(a)
    dt = ctx.out_dtype()
    x, y = _val(ctx, a[names[0]], dt), _val(ctx, a[names[1]], dt)
    if dt.kind in "iu":
        return ctx.op("Mod", [x, y], fmod=0)
    q = ctx.op("Floor", [ctx.op("Div", [x, y])])
    return ctx.op("Sub", [x, ctx.op("Mul", [q, y])])


_COMPARE = {
    "eq": "Equal", "ne": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
}


def _compare(name: str) -> Mapper:
    onnx_op = _COMPARE[name]

    def m(ctx, node):
        x, y = node.args[0], node.args[1]
        dt = ctx.result_type(x, y)
        r = ctx.op(onnx_op, [_val(ctx, x, dt), _val(ctx, y, dt)])
        return ctx.op("Not", [r]) if name == "ne" else r

    return m


for _n in _COMPARE:
    MAPPERS[f"aten.{_n}.Tensor"] = _compare(_n)
    MAPPERS[f"aten.{_n}.Scalar"] = _compare(_n)


def _logical(onnx_op: str) -> Mapper:
    def m(ctx, node):
        x, y = node.args[0], node.args[1]
        if ctx.out_dtype() != np.dtype(bool):
            raise UnsupportedOpError(f"{node.target} of non-boolean tensors is not supported")
        return ctx.op(onnx_op, [_val(ctx, x, bool), _val(ctx, y, bool)])

    return m


for _n, _op in (("and", "And"), ("or", "Or"), ("xor", "Xor")):
    MAPPERS[f"aten.logical_{_n}.default"] = _logical(_op)
    MAPPERS[f"aten.bitwise_{_n}.Tensor"] = _logical(_op)
    MAPPERS[f"aten.bitwise_{_n}.Scalar"] = _logical(_op)


@reg("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx, node):
    c, x, y = node.args[0], node.args[1], node.args[2]
    dt = ctx.out_dtype()
    return ctx.op("Where", [_val(ctx, c, bool), _val(ctx, x, dt), _val(ctx, y, dt)])


@reg("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx, node):
    x, mask, value = node.args[0], node.args[1], node.args[2]
    dt = ctx.out_dtype()
    return ctx.op("Where", [_val(ctx, mask, bool), _val(ctx, value, dt), _val(ctx, x, dt)])


@reg("aten._to_copy.default", "aten.to.dtype", "aten._to_dtype.default", "aten.type_as.default")
def _to_copy(ctx, node):
    x = ctx.value(node.args[0])
    dt = ctx.out_dtype()
    if ctx.dtype(node.args[0]) == dt:
        return ctx.op("Identity", [x])
    return ctx.op("Cast", [x], to=onnx_code(dt))


@reg("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.contiguous.default",
     "aten.lift_fresh_copy.default", "aten.dropout.default", "aten.feature_dropout.default",
     "aten.alpha_dropout.default", "aten._local_scalar_dense.default", "aten.item.default",
     "aten.lift_fresh.default", "aten.copy.default")
def _identity(ctx, node):
    arg = node.args[1] if str(node.target) == "aten.copy.default" else node.args[0]
    if str(node.target) == "aten.copy.default":
        return ctx.op("Identity", [_val(ctx, arg, ctx.out_dtype())])
    return ctx.op("Identity", [ctx.value(arg)])


@reg("aten.native_dropout.default")
def _native_dropout(ctx, node):
    a = ctx.args(node)
    if a.get("train"):
        raise UnsupportedOpError("dropout in training mode (export the model in eval() mode)")
    return [ctx.op("Identity", [ctx.value(a["input"])]), None]


@reg("aten._assert_tensor_metadata.default", "aten._assert_async.msg", "aten._assert_async.default",
     "aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
     "aten.sym_constrain_range.default", "aten._functional_assert_async.msg")
def _no_op(ctx, node):
    return None


# ------------------------------------------------------------------------------------------
# matmul family
# ------------------------------------------------------------------------------------------
@reg("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _mm(ctx, node):
    dt = ctx.out_dtype()
    return ctx.op("MatMul", [_val(ctx, node.args[0], dt), _val(ctx, node.args[1], dt)])


@reg("aten.addmm.default")
def _addmm(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype()
    c, m1, m2 = _val(ctx, a["self"], dt), _val(ctx, a["mat1"], dt), _val(ctx, a["mat2"], dt)
    if dt.kind == "f":
        return ctx.op("Gemm", [m1, m2, c], alpha=float(a.get("alpha", 1)), beta=float(a.get("beta", 1)))
    return ctx.op("Add", [ctx.op("MatMul", [m1, m2]), c])


@reg("aten.baddbmm.default")
def _baddbmm(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype()
    prod = ctx.op("MatMul", [_val(ctx, a["batch1"], dt), _val(ctx, a["batch2"], dt)])
    if a.get("alpha", 1) != 1:
        prod = ctx.op("Mul", [prod, ctx.const(a["alpha"], dt)])
    c = _val(ctx, a["self"], dt)
    if a.get("beta", 1) == 0:
        return prod
    if a.get("beta", 1) != 1:
        c = ctx.op("Mul", [c, ctx.const(a["beta"], dt)])
    return ctx.op("Add", [prod, c])


@reg("aten.linear.default")
def _linear(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype()
    x, w = _val(ctx, a["input"], dt), _val(ctx, a["weight"], dt)
    b = a.get("bias")
    if ctx.rank(a["input"]) == 2 and dt.kind == "f":
        ins = [x, w] + ([_val(ctx, b, dt)] if b is not None else [])
        return ctx.op("Gemm", ins, transB=1)
    wt = ctx.op("Transpose", [w], perm=[1, 0]) if ctx.rank(a["weight"]) == 2 else w
    y = ctx.op("MatMul", [x, wt])
    if b is not None:
        y = ctx.op("Add", [y, _val(ctx, b, dt)])
    return y


# ------------------------------------------------------------------------------------------
# convolution, pooling, normalisation
# ------------------------------------------------------------------------------------------
def _tuple(v, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    v = [int(x) for x in v]
    if len(v) == 1 and n > 1:
        return v * n
    return v


@reg("aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
     "aten.conv_transpose1d.default", "aten.conv_transpose2d.input", "aten.conv_transpose3d.input")
def _conv(ctx, node):
    a = ctx.args(node)
    key = str(node.target)
    transposed = bool(a.get("transposed", False)) or "conv_transpose" in key
    nsp = ctx.rank(a["input"]) - 2
    dt = ctx.out_dtype()
    x, w = _val(ctx, a["input"], dt), _val(ctx, a["weight"], dt)
    b = a.get("bias")
    ins = [x, w] + ([_val(ctx, b, dt)] if b is not None else [])
    padding = a.get("padding", 0)
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        else:
            raise UnsupportedOpError(f"convolution padding='{padding}'")
    pads = _tuple(padding, nsp)
    attrs: dict[str, Any] = dict(
        strides=_tuple(a.get("stride", 1), nsp), pads=pads + pads, dilations=_tuple(a.get("dilation", 1), nsp),
        group=int(a.get("groups", 1)),
        kernel_shape=[int(k) for k in ctx.shape(a["weight"])[2:]] if all(isinstance(k, int) for k in ctx.shape(a["weight"])[2:]) else None,
    )
    if transposed:
        op = a.get("output_padding", 0)
        attrs["output_padding"] = _tuple(op, nsp) if op else None
        return ctx.op("ConvTranspose", ins, **attrs)
    return ctx.op("Conv", ins, **attrs)


@reg("aten._native_batch_norm_legit_no_training.default", "aten.native_batch_norm.default",
     "aten._native_batch_norm_legit.default", "aten.batch_norm.default")
def _batch_norm(ctx, node):
    a = ctx.args(node)
    if a.get("training"):
        raise UnsupportedOpError("batch norm in training mode (export the model in eval() mode)")
    dt = ctx.out_dtype(node)
    x = _val(ctx, a["input"], dt)
    c = ctx.shape(a["running_mean"])[0]
    w = _val(ctx, a["weight"], dt) if a.get("weight") is not None else ctx.const(np.ones(c, dt))
    b = _val(ctx, a["bias"], dt) if a.get("bias") is not None else ctx.const(np.zeros(c, dt))
    y = ctx.op("BatchNormalization", [x, w, b, _val(ctx, a["running_mean"], dt), _val(ctx, a["running_var"], dt)],
               epsilon=float(a["eps"]))
    if str(node.target) == "aten.batch_norm.default":
        return y
    return [y, None, None]


@reg("aten.native_layer_norm.default", "aten.layer_norm.default")
def _layer_norm(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype(node)
    shape = [int(s) for s in a["normalized_shape"]]
    x = _val(ctx, a["input"], dt)
    w = _val(ctx, a["weight"], dt) if a.get("weight") is not None else ctx.const(np.ones(shape, dt))
    ins = [x, w] + ([_val(ctx, a["bias"], dt)] if a.get("bias") is not None else [])
    y = ctx.op("LayerNormalization", ins, axis=-len(shape), epsilon=float(a["eps"]))
    if str(node.target) == "aten.layer_norm.default":
        return y
    return [y, None, None]


@reg("aten.native_group_norm.default", "aten.group_norm.default")
def _group_norm(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype(node)
    x = _val(ctx, a["input"], dt)
    shape = ctx.shape(a["input"])
    g = int(a["group"] if "group" in a else a["num_groups"])
    n, c = shape[0], shape[1]
    if not isinstance(c, int):
        raise UnsupportedOpError("group norm with a dynamic channel count")
    # (N, G, -1) -> normalise the last axis -> back
    xr = ctx.op("Reshape", [x, ctx.ints([n if isinstance(n, int) else 0, g, -1])])
    ones = ctx.const(np.ones((1,), dt))
    yr = ctx.op("LayerNormalization", [xr, ones], axis=-1, epsilon=float(a["eps"]))
    y = ctx.op("Reshape", [yr, ctx.op("Shape", [x])])
    bshape = [c] + [1] * (len(shape) - 2)
    if a.get("weight") is not None:
        y = ctx.op("Mul", [y, ctx.op("Reshape", [_val(ctx, a["weight"], dt), _consts_i64(ctx, bshape)])])
    if a.get("bias") is not None:
        y = ctx.op("Add", [y, ctx.op("Reshape", [_val(ctx, a["bias"], dt), _consts_i64(ctx, bshape)])])
    if str(node.target) == "aten.group_norm.default":
        return y
    return [y, None, None]


def _pool_attrs(a, nsp, ceil_default=False):
    k = _tuple(a["kernel_size"], nsp)
    stride = a.get("stride") or k
    s = _tuple(stride, nsp)
    p = _tuple(a.get("padding", 0), nsp)
    return dict(kernel_shape=k, strides=s, pads=p + p, ceil_mode=int(bool(a.get("ceil_mode", ceil_default))))


@reg("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.max_pool1d.default",
     "aten.max_pool3d_with_indices.default", "aten.max_pool3d.default", "aten.max_pool1d_with_indices.default")
def _max_pool(ctx, node):
    a = ctx.args(node)
    nsp = ctx.rank(a["self"]) - 2
    attrs = _pool_attrs(a, nsp)
    attrs["dilations"] = _tuple(a.get("dilation", 1), nsp)
    y = ctx.op("MaxPool", [ctx.value(a["self"])], **attrs)
    return [y, None] if "with_indices" in str(node.target) else y


@reg("aten.avg_pool2d.default", "aten.avg_pool1d.default", "aten.avg_pool3d.default")
def _avg_pool(ctx, node):
    a = ctx.args(node)
    if a.get("divisor_override") is not None:
        raise UnsupportedOpError("avg_pool with divisor_override")
    nsp = ctx.rank(a["self"]) - 2
    attrs = _pool_attrs(a, nsp)
    attrs["count_include_pad"] = int(bool(a.get("count_include_pad", True)))
    return ctx.op("AveragePool", [ctx.value(a["self"])], **attrs)


@reg("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool1d.default",
     "aten.adaptive_avg_pool1d.default", "aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool3d.default")
def _adaptive_avg_pool(ctx, node):
    x = node.args[0]
    out = [int(o) for o in node.args[1]]
    shape = ctx.shape(x)
    sp = shape[2:]
    if all(o == 1 for o in out):
        return ctx.op("GlobalAveragePool", [ctx.value(x)])
    if not all(isinstance(d, int) and d % o == 0 for d, o in zip(sp, out)):
        raise UnsupportedOpError(f"adaptive average pooling of {list(sp)} to {out} (sizes must divide)")
    k = [d // o for d, o in zip(sp, out)]
    return ctx.op("AveragePool", [ctx.value(x)], kernel_shape=k, strides=k)


@reg("aten._softmax.default", "aten.softmax.int", "aten._log_softmax.default", "aten.log_softmax.int",
     "aten._safe_softmax.default")
def _softmax(ctx, node):
    key = str(node.target)
    x, dim = node.args[0], int(node.args[1])
    dt = ctx.out_dtype()
    v = _val(ctx, x, dt)
    op = "LogSoftmax" if "log_softmax" in key else "Softmax"
    y = ctx.op(op, [v], axis=dim)
    if key == "aten._safe_softmax.default":  # rows of all -inf give 0, not NaN
        y = ctx.op("Where", [ctx.op("IsNaN", [y]), ctx.const(0, dt), y])
    return y


# ------------------------------------------------------------------------------------------
# reductions
# ------------------------------------------------------------------------------------------
def _dims(ctx, x, dim) -> list[int] | None:
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    dim = [int(d) for d in dim]
    if not dim:
        return None
    return dim


def _reduce(onnx_op: str) -> Mapper:
    def m(ctx, node):
        a = ctx.args(node)
        x = a["self"]
        dt = ctx.out_dtype()
        v = _val(ctx, x, dt)
        dims = _dims(ctx, x, a.get("dim"))
        keep = int(bool(a.get("keepdim", False)))
        if ctx.rank(x) == 0:
            return ctx.op("Identity", [v])
        ins = [v] + ([_consts_i64(ctx, dims)] if dims is not None else [])
        return ctx.op(onnx_op, ins, keepdims=keep)

    return m


for _k, _op in (("sum.dim_IntList", "ReduceSum"), ("sum.default", "ReduceSum"), ("mean.dim", "ReduceMean"),
                ("mean.default", "ReduceMean"), ("amax.default", "ReduceMax"), ("amin.default", "ReduceMin"),
                ("prod.dim_int", "ReduceProd"), ("prod.default", "ReduceProd"), ("max.default", "ReduceMax"),
                ("min.default", "ReduceMin"), ("logsumexp.default", "ReduceLogSumExp")):
    MAPPERS[f"aten.{_k}"] = _reduce(_op)


@reg("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim", "aten.all.dims", "aten.all.default")
def _any_all(ctx, node):
    a = ctx.args(node)
    x = a["self"]
    dims = _dims(ctx, x, a.get("dim"))
    keep = int(bool(a.get("keepdim", False)))
    v = _val(ctx, x, np.int32) if ctx.dtype(x) != np.dtype(np.int32) else ctx.value(x)
    if ctx.dtype(x) == np.dtype(bool) or ctx.dtype(x).kind != "i":
        v = _cast(ctx, ctx.op("Not", [ctx.op("Equal", [ctx.value(x), ctx.const(0, ctx.dtype(x))])]), np.int32)
    op = "ReduceMax" if ".any." in str(node.target) else "ReduceMin"
    ins = [v] + ([_consts_i64(ctx, dims)] if dims is not None else [])
    return _cast(ctx, ctx.op(op, ins, keepdims=keep), bool)


@reg("aten.max.dim", "aten.min.dim")
def _max_dim(ctx, node):
    a = ctx.args(node)
    x, dim, keep = a["self"], int(a["dim"]), int(bool(a.get("keepdim", False)))
    v = ctx.value(x)
    red = "ReduceMax" if str(node.target).startswith("aten.max") else "ReduceMin"
    arg = "ArgMax" if red == "ReduceMax" else "ArgMin"
    return [ctx.op(red, [v, _consts_i64(ctx, [dim])], keepdims=keep), ctx.op(arg, [v], axis=dim, keepdims=keep)]


@reg("aten.argmax.default", "aten.argmin.default")
def _argmax(ctx, node):
    a = ctx.args(node)
    x, dim, keep = a["self"], a.get("dim"), int(bool(a.get("keepdim", False)))
    op = "ArgMax" if "argmax" in str(node.target) else "ArgMin"
    v = ctx.value(x)
    if dim is None:
        v = ctx.op("Reshape", [v, _consts_i64(ctx, [-1])])
        return ctx.op(op, [v], axis=0, keepdims=0)
    return ctx.op(op, [v], axis=int(dim), keepdims=keep)


@reg("aten.var.correction", "aten.var.dim", "aten.std.correction", "aten.std.dim", "aten.var_mean.correction")
def _var(ctx, node):
    a = ctx.args(node)
    x = a["self"]
    dt = ctx.out_dtype()
    v = _val(ctx, x, dt)
    shape = ctx.shape(x)
    dims = _dims(ctx, x, a.get("dim"))
    dims = dims if dims is not None else list(range(len(shape)))
    corr = a.get("correction")
    if corr is None:
        corr = 1 if a.get("unbiased", True) else 0
    keep = int(bool(a.get("keepdim", False)))
    n = 1
    for d in dims:
        s = shape[_norm_axis(d, len(shape))]
        if not isinstance(s, int):
            raise UnsupportedOpError("variance over a dynamic dimension")
        n *= s
    axes = _consts_i64(ctx, dims)
    mean = ctx.op("ReduceMean", [v, axes], keepdims=1)
    diff = ctx.op("Sub", [v, mean])
    ss = ctx.op("ReduceSum", [ctx.op("Mul", [diff, diff]), axes], keepdims=keep)
    var = ctx.op("Div", [ss, ctx.const(max(n - float(corr), 0.0), dt)])
    key = str(node.target)
    if key.startswith("aten.std"):
        return ctx.op("Sqrt", [var])
    if key.startswith("aten.var_mean"):
        m = mean if keep else ctx.op("ReduceMean", [v, axes], keepdims=0)
        return [var, m]
    return var


@reg("aten.cumsum.default")
def _cumsum(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype()
    return ctx.op("CumSum", [_val(ctx, a["self"], dt), ctx.const(int(a["dim"]), np.int64)])


# ------------------------------------------------------------------------------------------
# shape and data movement
# ------------------------------------------------------------------------------------------
@reg("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default")
def _view(ctx, node):
    x, size = node.args[0], node.args[1]
    out_shape = ctx.shape(node)
    if all(isinstance(d, int) for d in out_shape):
        shape = ctx.const(np.asarray(out_shape, dtype=np.int64).reshape(len(out_shape)))
    else:
        shape = ctx.ints(size)
    return ctx.op("Reshape", [ctx.value(x), shape])


@reg("aten.flatten.using_ints")
def _flatten(ctx, node):
    return _view_to_meta(ctx, node)


def _view_to_meta(ctx, node):
    out_shape = ctx.shape(node)
    if not all(isinstance(d, int) for d in out_shape):
        raise UnsupportedOpError(f"{node.target} with a dynamic output shape")
    return ctx.op("Reshape", [ctx.value(node.args[0]), _consts_i64(ctx, list(out_shape))])


@reg("aten.unflatten.int")
def _unflatten(ctx, node):
    return _view_to_meta(ctx, node)


@reg("aten.permute.default", "aten.permute_copy.default")
def _permute(ctx, node):
    x, dims = node.args[0], node.args[1]
    r = ctx.rank(x)
    return ctx.op("Transpose", [ctx.value(x)], perm=[_norm_axis(int(d), r) for d in dims])


@reg("aten.transpose.int", "aten.t.default", "aten.numpy_T.default")
def _transpose(ctx, node):
    x = node.args[0]
    r = ctx.rank(x)
    if r < 2:
        return ctx.op("Identity", [ctx.value(x)])
    if str(node.target) == "aten.transpose.int":
        d0, d1 = _norm_axis(int(node.args[1]), r), _norm_axis(int(node.args[2]), r)
    else:
        d0, d1 = r - 2, r - 1
    perm = list(range(r))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.op("Transpose", [ctx.value(x)], perm=perm)


@reg("aten.expand.default", "aten.expand_copy.default", "aten.broadcast_to.default", "aten.expand_as.default")
def _expand(ctx, node):
    x = node.args[0]
    out_shape = ctx.shape(node)
    if all(isinstance(d, int) for d in out_shape):
        return ctx.op("Expand", [ctx.value(x), _consts_i64(ctx, list(out_shape))])
    sizes = list(node.args[1])
    xr = ctx.rank(x)
    off = len(sizes) - xr
    items: list[Any] = []
    xshape = None
    for i, s in enumerate(sizes):
        if isinstance(s, int) and s == -1:
            if xshape is None:
                xshape = ctx.op("Shape", [ctx.value(x)])
            items.append(ctx.op("Gather", [xshape, ctx.const(i - off, np.int64)], axis=0))
        else:
            items.append(s)
    parts = []
    for it in items:
        if hasattr(it, "type") and not _is_node(it):  # an IR value
            parts.append(ctx.op("Reshape", [it, _consts_i64(ctx, [1])]))
        else:
            parts.append(ctx.ints([it]))
    return ctx.op("Expand", [ctx.value(x), ctx.op("Concat", parts, axis=0)])


def _is_node(x):
    return type(x).__name__ == "Node" and hasattr(x, "op")


@reg("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def _unsqueeze(ctx, node):
    x, d = node.args[0], int(node.args[1])
    r = ctx.rank(x)
    d = d + r + 1 if d < 0 else d
    return ctx.op("Unsqueeze", [ctx.value(x), _consts_i64(ctx, [d])])


@reg("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.squeeze_copy.dims",
     "aten.squeeze_copy.dim")
def _squeeze(ctx, node):
    x = node.args[0]
    shape = ctx.shape(x)
    r = len(shape)
    if len(node.args) > 1:
        dims = node.args[1]
        dims = [dims] if isinstance(dims, int) else list(dims)
        dims = [_norm_axis(int(d), r) for d in dims]
    else:
        dims = list(range(r))
    dims = [d for d in dims if shape[d] == 1]
    if not dims:
        return ctx.op("Identity", [ctx.value(x)])
    return ctx.op("Squeeze", [ctx.value(x), _consts_i64(ctx, dims)])


@reg("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(ctx, node):
    a = ctx.args(node)
    x = a["self"]
    r = ctx.rank(x)
    dim = _norm_axis(int(a.get("dim", 0)), r)
    start = a.get("start")
    end = a.get("end")
    step = int(a.get("step", 1) or 1)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if isinstance(end, int) and end > INT64_MAX:
        end = INT64_MAX
    if ctx.static_int(start) == 0 and ctx.static_int(end) is not None and step == 1:
        size = ctx.shape(x)[dim]
        if isinstance(size, int) and ctx.static_int(end) >= size:
            return ctx.op("Identity", [ctx.value(x)])
    return ctx.op("Slice", [ctx.value(x), ctx.ints([start]), ctx.ints([end]), _consts_i64(ctx, [dim]),
                            _consts_i64(ctx, [step])])


@reg("aten.select.int", "aten.select_copy.int")
def _select(ctx, node):
    x, dim, index = node.args[0], int(node.args[1]), node.args[2]
    r = ctx.rank(x)
    return ctx.op("Gather", [ctx.value(x), ctx.value(index, np.int64)], axis=_norm_axis(dim, r))


@reg("aten.narrow.default")
def _narrow(ctx, node):
    x, dim, start, length = node.args
    s = ctx.static_int(start)
    ln = ctx.static_int(length)
    if s is None or ln is None:
        raise UnsupportedOpError("narrow with symbolic bounds")
    return ctx.op("Slice", [ctx.value(x), _consts_i64(ctx, [s]), _consts_i64(ctx, [s + ln]), _consts_i64(ctx, [dim])])


@reg("aten.cat.default", "aten.concat.default", "aten.concatenate.default")
def _cat(ctx, node):
    tensors = list(node.args[0])
    dim = int(node.args[1]) if len(node.args) > 1 else int(node.kwargs.get("dim", 0))
    dt = ctx.out_dtype()
    r = ctx.rank(node)
    keep = [t for t in tensors if not (ctx.rank(t) == 1 and ctx.shape(t)[0] == 0 and r != 1)]
    vals = [_val(ctx, t, dt) for t in keep]
    if len(vals) == 1:
        return ctx.op("Identity", vals)
    return ctx.op("Concat", vals, axis=_norm_axis(dim, r))


@reg("aten.stack.default")
def _stack(ctx, node):
    tensors = list(node.args[0])
    dim = int(node.args[1]) if len(node.args) > 1 else int(node.kwargs.get("dim", 0))
    r = ctx.rank(node)
    d = _norm_axis(dim, r)
    dt = ctx.out_dtype()
    parts = [ctx.op("Unsqueeze", [_val(ctx, t, dt), _consts_i64(ctx, [d])]) for t in tensors]
    return ctx.op("Concat", parts, axis=d) if len(parts) > 1 else ctx.op("Identity", parts)


@reg("aten.split_with_sizes.default", "aten.split.Tensor", "aten.split_with_sizes_copy.default",
     "aten.split.sizes", "aten.unsafe_split.Tensor", "aten.chunk.default", "aten.unbind.int")
def _split(ctx, node):
    key = str(node.target)
    x = node.args[0]
    shape = ctx.shape(x)
    r = len(shape)
    outs = ctx.meta(node)
    n = len(outs)
    if key == "aten.unbind.int":
        dim = _norm_axis(int(node.args[1]) if len(node.args) > 1 else int(node.kwargs.get("dim", 0)), r)
        parts = ctx.op("Split", [ctx.value(x)], axis=dim, num_outputs=n) if n > 1 else [ctx.value(x)]
        parts = parts if isinstance(parts, list) else [parts]
        return [ctx.op("Squeeze", [p, _consts_i64(ctx, [dim])]) for p in parts]
    dim = _norm_axis(int(node.args[2]) if len(node.args) > 2 else int(node.kwargs.get("dim", 0)), r)
    sizes = [ctx.converter.dim(o.shape[dim]) for o in outs]
    if not all(isinstance(s, int) for s in sizes):
        raise UnsupportedOpError("split along a dynamic dimension")
    if n == 1:
        return [ctx.op("Identity", [ctx.value(x)])]
    res = ctx.op("Split", [ctx.value(x), _consts_i64(ctx, sizes)], axis=dim, num_outputs=n)
    return list(res)


@reg("aten.flip.default")
def _flip(ctx, node):
    x, dims = node.args[0], [int(d) for d in node.args[1]]
    n = len(dims)
    return ctx.op("Slice", [ctx.value(x), _consts_i64(ctx, [-1] * n), _consts_i64(ctx, [INT64_MIN] * n),
                            _consts_i64(ctx, dims), _consts_i64(ctx, [-1] * n)])


@reg("aten.repeat.default")
def _repeat(ctx, node):
    x, reps = node.args[0], [int(r) for r in node.args[1]]
    v = ctx.value(x)
    r = ctx.rank(x)
    if len(reps) > r:
        v = ctx.op("Unsqueeze", [v, _consts_i64(ctx, list(range(len(reps) - r)))])
    return ctx.op("Tile", [v, _consts_i64(ctx, reps)])


@reg("aten.constant_pad_nd.default")
def _pad(ctx, node):
    a = ctx.args(node)
    x = a["self"]
    pad = [int(p) for p in a["pad"]]
    r = ctx.rank(x)
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        d = r - 1 - i
        begins[d], ends[d] = pad[2 * i], pad[2 * i + 1]
    dt = ctx.out_dtype()
    return ctx.op("Pad", [ctx.value(x), _consts_i64(ctx, begins + ends), ctx.const(a.get("value", 0) or 0, dt)],
                  mode="constant")


@reg("aten.embedding.default")
def _embedding(ctx, node):
    w, idx = node.args[0], node.args[1]
    return ctx.op("Gather", [ctx.value(w), ctx.value(idx)], axis=0)


@reg("aten.index_select.default")
def _index_select(ctx, node):
    x, dim, idx = node.args
    return ctx.op("Gather", [ctx.value(x), ctx.value(idx)], axis=_norm_axis(int(dim), ctx.rank(x)))


@reg("aten.index.Tensor", "aten._unsafe_index.Tensor")
def _index(ctx, node):
    x, indices = node.args[0], list(node.args[1])
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) == 1:
        k = used[0]
        if ctx.dtype(indices[k]) == np.dtype(bool):
            raise UnsupportedOpError("boolean mask indexing (its output shape depends on the data)")
        return ctx.op("Gather", [ctx.value(x), ctx.value(indices[k], np.int64)], axis=k)
    if used == list(range(len(used))):
        # x[i0, i1, ...] with broadcast index tensors: GatherND over stacked indices
        idx = [ctx.value(indices[i], np.int64) for i in used]
        shape_nodes = [ctx.op("Shape", [v]) for v in idx]
        bshape = shape_nodes[0]
        for s in shape_nodes[1:]:
            bshape = ctx.op("Max", [bshape, s])
        ex = [ctx.op("Unsqueeze", [ctx.op("Expand", [v, bshape]), _consts_i64(ctx, [-1])]) for v in idx]
        return ctx.op("GatherND", [ctx.value(x), ctx.op("Concat", ex, axis=-1)])
    raise UnsupportedOpError("advanced indexing with non-leading index tensors")


@reg("aten.gather.default")
def _gather(ctx, node):
    a = ctx.args(node)
    x = a["self"]
    return ctx.op("GatherElements", [ctx.value(x), ctx.value(a["index"], np.int64)],
                  axis=_norm_axis(int(a["dim"]), ctx.rank(x)))


#: The most elements an as_strided's index table (the general, Gather form) may have.
AS_STRIDED_MAX = 1 << 24


def _storage_positions(shape: list[int], strides: list[int], offset: int) -> np.ndarray:
    """Storage position of each element of a strided view, in row-major order."""
    pos = np.full((), offset, np.int64)
    for i, (d, s) in enumerate(zip(shape, strides)):
        pos = pos[..., None] + np.arange(d, dtype=np.int64).reshape((1,) * i + (d,)) * s
    return pos.reshape(-1)


@reg("aten.as_strided.default", "aten.as_strided_copy.default")
def _as_strided(ctx, node):
    """A strided view of the input's storage (AdaptiveAvgPool2d's restride, say). The input's own
    strides and offset (its example value) say where each of its elements lies in the storage;
    each element of the view is the input element at its storage position: a Reshape when that is
    the input in order, else a Gather of the flattened input with a constant index table."""
    a = ctx.args(node)
    x = a["self"]
    meta = ctx.meta(x)
    size = [ctx.static_int(d) for d in a["size"]]
    stride = [ctx.static_int(s) for s in a["stride"]]
    in_shape = ctx.shape(x)
    hint = "export the model with static shapes, or make the view a reshape/slice (.reshape, .contiguous())"
    if None in size or None in stride or not all(isinstance(d, int) for d in in_shape) \
            or not hasattr(meta, "stride") or not hasattr(meta, "storage_offset"):
        raise UnsupportedOpError("as_strided with symbolic sizes, strides or input shape", hint=hint)
    in_stride = [int(s) for s in meta.stride()]
    in_off = int(meta.storage_offset())
    off = in_off if a.get("storage_offset") is None else ctx.static_int(a["storage_offset"])
    n_in, n_out = math.prod(in_shape), math.prod(size)
    if off is None or max(n_in, n_out) > AS_STRIDED_MAX or min(size + stride + [off]) < 0:
        raise UnsupportedOpError(f"as_strided of {list(in_shape)} to size {size}, stride {stride}, offset {off}: "
                                 f"a symbolic offset, a negative value or more than {AS_STRIDED_MAX} elements", hint=hint)
    have = _storage_positions(list(in_shape), in_stride, in_off)
    want = _storage_positions(size, stride, off)
    order = np.argsort(have, kind="stable")
    k = np.searchsorted(have[order], want)
    k = np.minimum(k, max(n_in - 1, 0))
    if n_out and (not n_in or np.any(have[order][k] != want)):
        raise UnsupportedOpError(f"as_strided of {list(in_shape)} (strides {in_stride}, offset {in_off}) to size "
                                 f"{size}, stride {stride}, offset {off} reads storage outside its input", hint=hint)
    idx = order[k] if n_out else np.zeros(0, np.int64)
    if n_out == n_in and np.array_equal(idx, np.arange(n_out)):
        return ctx.op("Reshape", [ctx.value(x), _consts_i64(ctx, size)])
    flat = ctx.op("Reshape", [ctx.value(x), _consts_i64(ctx, [-1])])
    return ctx.op("Gather", [flat, ctx.const(idx.astype(np.int64).reshape(size))], axis=0)


@reg("aten.tril.default", "aten.triu.default")
def _trilu(ctx, node):
    a = ctx.args(node)
    return ctx.op("Trilu", [ctx.value(a["self"]), ctx.const(int(a.get("diagonal", 0)), np.int64)],
                  upper=int("triu" in str(node.target)))


@reg("aten.topk.default")
def _topk(ctx, node):
    a = ctx.args(node)
    x = a["self"]
    k = ctx.static_int(a["k"])
    if k is None:
        raise UnsupportedOpError("topk with a symbolic k")
    y = ctx.op("TopK", [ctx.value(x), _consts_i64(ctx, [k])], axis=int(a.get("dim", -1)),
               largest=int(bool(a.get("largest", True))), sorted=int(bool(a.get("sorted", True))), num_outputs=2)
    return list(y)


@reg("aten.upsample_nearest2d.vec", "aten.upsample_bilinear2d.vec", "aten.upsample_nearest2d.default",
     "aten.upsample_bilinear2d.default", "aten.upsample_nearest1d.vec", "aten.upsample_linear1d.vec")
def _upsample(ctx, node):
    a = ctx.args(node)
    x = a["input"] if "input" in a else a["self"]
    out_shape = ctx.shape(node)
    if not all(isinstance(d, int) for d in out_shape):
        raise UnsupportedOpError("upsampling to a dynamic size")
    nearest = "nearest" in str(node.target)
    attrs: dict[str, Any] = {"mode": "nearest" if nearest else "linear"}
    if nearest:
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        attrs["coordinate_transformation_mode"] = "align_corners" if a.get("align_corners") else "pytorch_half_pixel"
    return ctx.op("Resize", [ctx.value(x), None, None, _consts_i64(ctx, list(out_shape))], **attrs)


# ------------------------------------------------------------------------------------------
# factories
# ------------------------------------------------------------------------------------------
def _fill(ctx, node, size, value):
    dt = ctx.out_dtype()
    out_shape = ctx.shape(node)
    if all(isinstance(d, int) for d in out_shape):
        if isinstance(value, (int, float, bool)) or value is None:
            return ctx.const(np.full(out_shape, 0 if value is None else value, dtype=dt))
        v = _val(ctx, value, dt)
        return ctx.op("Expand", [v, _consts_i64(ctx, list(out_shape))])
    shape = size if hasattr(size, "type") and not _is_node(size) else ctx.ints(size)
    if isinstance(value, (int, float, bool)) or value is None:
        return ctx.op("ConstantOfShape", [shape], value=np.asarray([0 if value is None else value], dtype=dt))
    return ctx.op("Expand", [_val(ctx, value, dt), shape])


@reg("aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.empty.memory_format",
     "aten.new_full.default", "aten.new_zeros.default", "aten.new_ones.default", "aten.new_empty.default",
     "aten.empty.default")
def _full(ctx, node):
    key = str(node.target)
    a = ctx.args(node)
    size = a.get("size")
    if key.startswith("aten.full") or key.startswith("aten.new_full"):
        value = a["fill_value"]
    elif "ones" in key:
        value = 1
    else:
        value = 0
    return _fill(ctx, node, size, value)


@reg("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default",
     "aten.fill.Scalar", "aten.fill.Tensor")
def _full_like(ctx, node):
    key = str(node.target)
    a = ctx.args(node)
    x = a["self"]
    if key.startswith("aten.full_like"):
        value = a["fill_value"]
    elif key.startswith("aten.fill"):
        value = a["value"]
    elif "ones" in key:
        value = 1
    else:
        value = 0
    out_shape = ctx.shape(node)
    size = None if all(isinstance(d, int) for d in out_shape) else ctx.op("Shape", [ctx.value(x)])
    return _fill(ctx, node, size, value)


@reg("aten.scalar_tensor.default")
def _scalar_tensor(ctx, node):
    v = node.args[0]
    dt = ctx.out_dtype()
    if isinstance(v, (int, float, bool)):
        return ctx.const(np.asarray(v, dtype=dt))
    return ctx.op("Reshape", [_val(ctx, v, dt), _consts_i64(ctx, [])])


@reg("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(ctx, node):
    a = ctx.args(node)
    key = str(node.target)
    if key == "aten.arange.default":
        start, end, step = 0, a["end"], 1
    else:
        start, end, step = a["start"], a["end"], a.get("step", 1)
    dt = ctx.out_dtype()
    s, e, st = (ctx.static_int(v) if not isinstance(v, float) else v for v in (start, end, step))
    if s is not None and e is not None and st is not None:
        return ctx.const(np.arange(s, e, st, dtype=dt))
    return ctx.op("Range", [_val(ctx, start, dt), _val(ctx, end, dt), _val(ctx, step, dt)])


# ------------------------------------------------------------------------------------------
# symbolic sizes and Python operators on them
# ------------------------------------------------------------------------------------------
@reg("aten.sym_size.int")
def _sym_size(ctx, node):
    x, dim = node.args[0], int(node.args[1])
    s = ctx.static_int(node)
    if s is not None:
        return s
    shape = ctx.op("Shape", [ctx.value(x)])
    return ctx.op("Gather", [shape, ctx.const(_norm_axis(dim, ctx.rank(x)), np.int64)], axis=0)


@reg("aten.sym_numel.default")
def _sym_numel(ctx, node):
    s = ctx.static_int(node)
    if s is not None:
        return s
    return ctx.op("ReduceProd", [ctx.op("Shape", [ctx.value(node.args[0])])], keepdims=0)


_PY_OPS = {
    "add": ("Add", lambda a, b: a + b), "sub": ("Sub", lambda a, b: a - b), "mul": ("Mul", lambda a, b: a * b),
    "floordiv": ("Div", lambda a, b: a // b), "mod": ("Mod", lambda a, b: a % b),
    "truediv": ("Div", lambda a, b: a / b),
    "eq": ("Equal", lambda a, b: a == b), "lt": ("Less", lambda a, b: a < b), "gt": ("Greater", lambda a, b: a > b),
    "le": ("LessOrEqual", lambda a, b: a <= b), "ge": ("GreaterOrEqual", lambda a, b: a >= b),
}


def _py_op(name: str) -> Mapper:
    onnx_op, fn = _PY_OPS[name]

    def m(ctx, node):
        x, y = node.args[0], node.args[1]
        sx, sy = ctx.static_int(x), ctx.static_int(y)
        if sx is not None and sy is not None:
            return fn(sx, sy)
        if name == "truediv":
            xv, yv = ctx.value(x, np.float64), ctx.value(y, np.float64)
            return ctx.op("Div", [xv, yv])
        xv, yv = ctx.value(x, np.int64), ctx.value(y, np.int64)
        attrs = {"fmod": 0} if onnx_op == "Mod" else {}
        return ctx.op(onnx_op, [xv, yv], **attrs)

    return m


for _n in _PY_OPS:
    MAPPERS[f"operator.{_n}"] = _py_op(_n)


@reg("operator.neg")
def _py_neg(ctx, node):
    s = ctx.static_int(node.args[0])
    if s is not None:
        return -s
    return ctx.op("Neg", [ctx.value(node.args[0], np.int64)])


@reg("torch.sym_max", "torch.sym_min")
def _sym_max(ctx, node):
    x, y = node.args
    sx, sy = ctx.static_int(x), ctx.static_int(y)
    is_max = str(node.target).endswith("max") or getattr(node.target, "__name__", "") == "sym_max"
    if sx is not None and sy is not None:
        return max(sx, sy) if is_max else min(sx, sy)
    return ctx.op("Max" if is_max else "Min", [ctx.value(x, np.int64), ctx.value(y, np.int64)])


@reg("torch.sym_float", "torch.sym_int")
def _sym_cast(ctx, node):
    x = node.args[0]
    s = ctx.static_int(x)
    is_float = getattr(node.target, "__name__", "") == "sym_float"
    if s is not None:
        return float(s) if is_float else int(s)
    return ctx.value(x, np.float64 if is_float else np.int64)


# ------------------------------------------------------------------------------------------
# control flow
# ------------------------------------------------------------------------------------------
@reg("higher_order.cond")
def _cond(ctx, node):
    pred, true_gm, false_gm, operands = node.args[:4]
    true_gm = ctx.env[true_gm] if _is_node(true_gm) else true_gm
    false_gm = ctx.env[false_gm] if _is_node(false_gm) else false_gm
    s = ctx.static_int(pred) if not isinstance(pred, bool) else int(pred)
    if s is not None:
        pred = bool(s)
    if isinstance(pred, bool):
        gm = true_gm if pred else false_gm
        body_inputs = [ctx.value(o) if _is_node(o) else o for o in operands]
        return _inline(ctx, gm, body_inputs)
    p = ctx.value(pred)
    if p.type.dtype is not None and p.type.dtype != np.dtype(bool):
        p = _cast(ctx, p, bool)
    if p.type.shape not in (None, ()):
        p = ctx.op("Reshape", [p, _consts_i64(ctx, [])])
    ins = [ctx.value(o) if _is_node(o) else o for o in operands]
    label = node.name
    then_g = ctx.subgraph(true_gm, ins, f"{label}_then")
    else_g = ctx.subgraph(false_gm, ins, f"{label}_else")
    n_out = len(then_g.outputs)
    outs = ctx.op("If", [p], then_branch=then_g, else_branch=else_g, num_outputs=n_out)
    return list(outs) if n_out != 1 else [outs]


def _inline(ctx, gm, inputs):
    env = ctx.env
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sub_env = dict(zip(phs, inputs))
    saved = ctx.env
    ctx.env = {**env, **sub_env}
    try:
        ctx.converter.map_nodes(gm, ctx.graph, ctx.env)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        flat = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
        return [ctx.env.get(a, a) if _is_node(a) else a for a in flat]
    finally:
        ctx.env = saved


#: Composite ops the frontend keeps whole (not decomposed to core ATen) because a mapper maps
#: them better than their decomposition: the frontend removes every op that has a mapper from
#: the decomposition table, so this is only documentation of intent.
KEPT_WHOLE = ("aten.linear.default", "aten.layer_norm.default", "aten.gelu.default", "aten.silu.default",
              "aten.hardswish.default", "aten.conv2d.default", "aten.conv1d.default")


# ------------------------------------------------------------------------------------------
# fused inference fast paths (nn.TransformerEncoderLayer / nn.MultiheadAttention under no_grad)
# ------------------------------------------------------------------------------------------
def _linear_v(ctx, x, w, b):
    """x @ w.T + b for IR values (w 2-D)."""
    y = ctx.op("MatMul", [x, ctx.op("Transpose", [w], perm=[1, 0])])
    return ctx.op("Add", [y, b]) if b is not None else y


def _attention(ctx, q_arg, k_arg, v_arg, embed_dim, heads, qkv_w, qkv_b, proj_w, proj_b, mask, mask_type, dt):
    """Multi-head attention of the fused ops; inputs (B, L, E), masks as nn.MultiheadAttention merges them."""
    e, h = int(embed_dim), int(heads)
    d = e // h
    w, b = _val(ctx, qkv_w, dt), _val(ctx, qkv_b, dt)
    if q_arg is k_arg and k_arg is v_arg:
        qkv = _linear_v(ctx, _val(ctx, q_arg, dt), w, b)
        q, k, v = ctx.op("Split", [qkv, _consts_i64(ctx, [e, e, e])], axis=-1, num_outputs=3)
    else:
        ws = ctx.op("Split", [w, _consts_i64(ctx, [e, e, e])], axis=0, num_outputs=3)
        bs = ctx.op("Split", [b, _consts_i64(ctx, [e, e, e])], axis=0, num_outputs=3)
        q, k, v = (_linear_v(ctx, _val(ctx, a, dt), ws[i], bs[i]) for i, a in enumerate((q_arg, k_arg, v_arg)))
    heads_shape = _consts_i64(ctx, [0, 0, h, d])

    def split_heads(t):
        return ctx.op("Transpose", [ctx.op("Reshape", [t, heads_shape])], perm=[0, 2, 1, 3])

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    q = ctx.op("Mul", [q, ctx.const(1.0 / math.sqrt(d), dt)])
    scores = ctx.op("MatMul", [q, ctx.op("Transpose", [k], perm=[0, 1, 3, 2])])
    if mask is not None:
        mv = ctx.value(mask)
        if ctx.dtype(mask) == np.dtype(bool):
            mv = ctx.op("Where", [mv, ctx.const(-np.inf, dt), ctx.const(0.0, dt)])
        else:
            mv = _cast(ctx, mv, dt)
        if int(mask_type or 0) == 1:  # key padding mask (B, L) -> (B, 1, 1, L)
            mv = ctx.op("Unsqueeze", [mv, _consts_i64(ctx, [1, 2])])
        scores = ctx.op("Add", [scores, mv])
    attn = ctx.op("Softmax", [scores], axis=-1)
    out = ctx.op("MatMul", [attn, v])
    out = ctx.op("Reshape", [ctx.op("Transpose", [out], perm=[0, 2, 1, 3]), _consts_i64(ctx, [0, 0, e])])
    return _linear_v(ctx, out, _val(ctx, proj_w, dt), _val(ctx, proj_b, dt))


@reg("aten._native_multi_head_attention.default")
def _native_mha(ctx, node):
    a = ctx.args(node)
    if a.get("need_weights"):
        raise UnsupportedOpError("_native_multi_head_attention with need_weights=True")
    dt = ctx.out_dtype(node)
    out = _attention(ctx, a["query"], a["key"], a["value"], a["embed_dim"], a["num_head"], a["qkv_weight"],
                     a["qkv_bias"], a["proj_weight"], a["proj_bias"], a.get("mask"), a.get("mask_type"), dt)
    return [out, None]


@reg("aten._transformer_encoder_layer_fwd.default")
def _encoder_layer(ctx, node):
    a = ctx.args(node)
    dt = ctx.out_dtype(node)
    src = a["src"]
    eps = float(a["eps"])
    norm_first = bool(a["norm_first"])

    def ln(x, wn, bn):
        return ctx.op("LayerNormalization", [x, _val(ctx, a[wn], dt), _val(ctx, a[bn], dt)], axis=-1, epsilon=eps)

    x = _val(ctx, src, dt)
    attn_in = ln(x, "norm_weight_1", "norm_bias_1") if norm_first else x
    att = _attention(ctx, attn_in, attn_in, attn_in, a["embed_dim"], a["num_heads"], a["qkv_weight"],
                     a["qkv_bias"], a["proj_weight"], a["proj_bias"], a.get("mask"), a.get("mask_type"), dt)
    x = ctx.op("Add", [att, x])
    if not norm_first:
        x = ln(x, "norm_weight_1", "norm_bias_1")
    res = x
    f = ln(x, "norm_weight_2", "norm_bias_2") if norm_first else x
    f = _linear_v(ctx, f, _val(ctx, a["ffn_weight_1"], dt), _val(ctx, a["ffn_bias_1"], dt))
    f = ctx.op("Gelu", [f]) if a["use_gelu"] else ctx.op("Relu", [f])
    f = _linear_v(ctx, f, _val(ctx, a["ffn_weight_2"], dt), _val(ctx, a["ffn_bias_2"], dt))
    x = ctx.op("Add", [f, res])
    if not norm_first:
        x = ln(x, "norm_weight_2", "norm_bias_2")
    return x


# ------------------------------------------------------------------------------------------
# PT2E quantisation (convert_pt2e of torch.ao / torchao): quantized_decomposed Q/DQ
# ------------------------------------------------------------------------------------------
#: integer types of ONNX's QuantizeLinear / DequantizeLinear (what the quantisation pass reads)
_QTYPES = ("int8", "uint8", "int16", "uint16")


def _qconst(ctx, arg, what: str, dtype) -> np.ndarray:
    """A quantisation parameter (a Python number, a buffer, a folded constant) as a NumPy array."""
    if isinstance(arg, (bool, int, float)):
        return np.asarray(arg, dtype)
    v = ctx.value(arg)
    if v.const_value is None:
        raise UnsupportedOpError(f"its {what} is computed at run time (dynamic quantisation); only constant "
                                 "scales and zero points (PT2E static quantisation) are supported",
                                 hint="quantise with a static config (is_dynamic=False) before export")
    return np.asarray(v.const_value).astype(dtype)


def _qparams(ctx, node) -> tuple:
    """``(args, storage dtype, scale, zero point, quant_min, quant_max, axis or None)`` of a
    quantized_decomposed Q/DQ node (per tensor or per channel, each overload)."""
    a = ctx.args(node)
    qdt = np_dtype(a["dtype"])
    if qdt.name not in _QTYPES:
        raise UnsupportedOpError(f"quantises to {qdt.name}; {', '.join(_QTYPES)} are supported")
    per_channel = "per_channel" in str(node.target)
    s = _qconst(ctx, a["scales" if per_channel else "scale"], "scale", np.float32)
    zarg = a["zero_points" if per_channel else "zero_point"]
    z = np.zeros(s.shape, np.int64) if zarg is None else _qconst(ctx, zarg, "zero point", np.int64)
    lo, hi = (int(_qconst(ctx, a[k], k, np.int64)) for k in ("quant_min", "quant_max"))
    info = np.iinfo(qdt)
    if not (np.all(np.isfinite(s)) and np.all(s > 0)) or not info.min <= lo <= hi <= info.max \
            or np.any(z < info.min) or np.any(z > info.max):
        raise UnsupportedOpError(f"has scale {s.reshape(-1)[:4]}, zero point {z.reshape(-1)[:4]}, range [{lo}, {hi}] "
                                 f"that do not fit {qdt.name}", hint="re-run convert_pt2e on the calibrated model")
    axis = None
    if per_channel:
        axis = _norm_axis(int(a["axis"]), ctx.rank(a["input"]))
        s, z = s.reshape(-1), z.reshape(-1)
    else:
        s, z = s.reshape(()), z.reshape(())
    return a, qdt, s, z.astype(qdt), lo, hi, axis


def _static(ctx, node) -> tuple | None:
    shape = ctx.shape(node)
    return shape if all(isinstance(d, int) for d in shape) else None


def _bcast(arr: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    if axis is None:
        return arr
    shape = [1] * rank
    shape[axis] = -1
    return arr.reshape(shape)


@reg("quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.tensor",
     "quantized_decomposed.quantize_per_tensor.tensor2", "quantized_decomposed.quantize_per_channel.default")
def _quantize(ctx, node):
    """PT2E's quantize as QuantizeLinear (torch rounds x * (1 / scale) half to even, ONNX x / scale:
    one step apart at most, at ties), after a clamp to [quant_min, quant_max] where that range is
    narrower than the type's (XNNPACK's -127); a constant input (an unfolded weight) is quantised
    now, as torch does."""
    a, qdt, s, z, lo, hi, axis = _qparams(ctx, node)
    x = ctx.value(a["input"])
    rank = ctx.rank(a["input"])
    sb, zb = _bcast(s, rank, axis), _bcast(z.astype(np.float32), rank, axis)
    if x.const_value is not None:
        xc = np.asarray(x.const_value, np.float32)
        q = np.clip(np.rint(xc * (np.float32(1) / sb)) + zb, lo, hi)
        return ctx.const(q.astype(qdt), name=f"{node.name}_q")
    if ctx.dtype(a["input"]) not in (None, np.dtype(np.float32)):
        x = _cast(ctx, x, np.float32)
    info = np.iinfo(qdt)
    if (lo, hi) != (info.min, info.max):
        x = ctx.op("Max", [x, ctx.const(((np.float32(lo) - zb) * sb).astype(np.float32))])
        x = ctx.op("Min", [x, ctx.const(((np.float32(hi) - zb) * sb).astype(np.float32))])
    y = ctx.op("QuantizeLinear", [x, ctx.const(s), ctx.const(z)], axis=axis)
    y.type = TensorType(qdt, _static(ctx, node))
    return y


@reg("quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_tensor.tensor",
     "quantized_decomposed.dequantize_per_tensor.tensor2", "quantized_decomposed.dequantize_per_channel.default")
def _dequantize(ctx, node):
    """PT2E's dequantize as DequantizeLinear ((q - zero_point) * scale, float32; ``out_dtype``
    by a Cast): an int8 weight with zero point 0 per output channel makes its Conv / Linear int8."""
    a, qdt, s, z, lo, hi, axis = _qparams(ctx, node)
    q = ctx.value(a["input"])
    if ctx.dtype(a["input"]) not in (None, qdt):
        q = _cast(ctx, q, qdt)
    y = ctx.op("DequantizeLinear", [q, ctx.const(s), ctx.const(z)], axis=axis)
    # (typed now: the Conv / Linear reading it adds no Cast between, so the quantisation pass
    # finds the fake-quant and the int8 weight at its inputs)
    y.type = TensorType(np.dtype(np.float32), _static(ctx, node))
    out = a.get("out_dtype")
    if out is not None and np_dtype(out) != np.float32:
        y = _cast(ctx, y, np_dtype(out))
    return y
