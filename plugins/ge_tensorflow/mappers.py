"""Built-in TensorFlow op mappers: TF ops to IR ops of ONNX's default domain (opset 18).

Each mapper takes a :class:`ge_tensorflow.convert.NodeContext` and returns the output values
(see that module). ``MAPPERS`` maps TF op type to mapper; the plugin registers every entry with
``register("tensorflow", op_type, mapper)``. Importing this module does not import TensorFlow.

Layout: TF's NHWC convolutions, pooling etc. become NCHW ONNX ops between two Transposes; the
optimisation passes cancel the Transposes that meet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ge_core.ir.graph import Value
from ge_sdk.onnx_types import ELEM_TYPES

MAPPERS: dict[str, Callable] = {}
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def mapper(*op_types: str):
    def deco(fn):
        for t in op_types:
            MAPPERS[t] = fn
        return fn

    return deco


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
def i64(ctx, values) -> Value:
    return ctx.constant(np.asarray(values, dtype=np.int64))


def as_i64(ctx, i: int) -> Value:
    """Input ``i`` as an int64 tensor (constant-converted when it is a constant)."""
    c = ctx.const(i)
    if c is not None:
        return i64(ctx, c)
    v = ctx.input(i)
    if ctx.in_type(i).dtype == np.int64:
        return v
    return ctx.op("Cast", v, to=7)


def scalar(ctx, value, dtype) -> Value:
    return ctx.constant(np.asarray(value, dtype=dtype))


def nchw_perm(rank: int) -> list[int]:
    return [0, rank - 1] + list(range(1, rank - 1))


def nhwc_perm(rank: int) -> list[int]:
    return [0] + list(range(2, rank)) + [1]


def to_nchw(ctx, v: Value, rank: int) -> Value:
    n = v.producer
    if n is not None and n.op_type == "Transpose" and n.domain == "" \
            and list(n.attrs.get("perm") or ()) == nhwc_perm(rank):
        src = n.inputs[0]
        if src is not None:
            return src  # (a fake-quant's NCHW values: the quantisation pass finds them at the Conv)
    return ctx.op("Transpose", v, perm=nchw_perm(rank))


def to_nhwc(ctx, v: Value, rank: int) -> Value:
    return ctx.op("Transpose", v, perm=nhwc_perm(rank))


def is_channels_last(fmt: Any) -> bool:
    return not str(fmt or "NHWC").startswith("NC")


def onnx_type(ctx, dtype) -> int:
    """ONNX TensorProto element type of a NumPy dtype (the ``to`` attribute of Cast)."""
    name = np.dtype(dtype).name
    if name not in ELEM_TYPES:
        ctx.fail(f"uses dtype {name}, which has no ONNX equivalent")
    return ELEM_TYPES[name]


def cast_to(ctx, v: Value, dtype) -> Value:
    return ctx.op("Cast", v, to=onnx_type(ctx, dtype))


def _pads_same(in_sp, k, s, d) -> list[int] | None:
    """Explicit ONNX pads for TF's SAME padding (extra on the end), or None when a size is unknown."""
    begins, ends = [], []
    for n, kk, ss, dd in zip(in_sp, k, s, d):
        if not isinstance(n, int):
            return None
        out = -(-n // ss)
        eff = (kk - 1) * dd + 1
        total = max((out - 1) * ss + eff - n, 0)
        begins.append(total // 2)
        ends.append(total - total // 2)
    return begins + ends


def _window_attrs(ctx, padding: str, in_sp, k, s, d, explicit: list[int] | None = None) -> dict[str, Any]:
    if padding == "VALID":
        return {"pads": [0] * (2 * len(k))}
    if padding == "EXPLICIT" and explicit is not None:
        return {"pads": explicit}
    if padding == "SAME":
        pads = _pads_same(in_sp, k, s, d)
        return {"pads": pads} if pads is not None else {"auto_pad": "SAME_UPPER"}
    ctx.fail(f"has padding {padding!r}, which is not supported")
    return {}


# ------------------------------------------------------------------------------------------
# pass-through, constants
# ------------------------------------------------------------------------------------------
@mapper("Identity", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics",
        "PlaceholderWithDefault", "DebugIdentity", "DebugIdentityV2")
def _identity(ctx):
    return ctx.raw_input(0)


@mapper("IdentityN")
def _identity_n(ctx):
    return [ctx.raw_input(i) for i in range(ctx.num_inputs)]


@mapper("Const")
def _const(ctx):
    return ctx.graph.add_constant(np.asarray(ctx.attr("value")), ctx.graph.names.fresh(ctx.name))


# ------------------------------------------------------------------------------------------
# element-wise
# ------------------------------------------------------------------------------------------
_UNARY = {
    "Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
    "Neg": "Neg", "Abs": "Abs", "Floor": "Floor", "Ceil": "Ceil", "Round": "Round", "Rint": "Round",
    "Sign": "Sign", "Reciprocal": "Reciprocal", "Inv": "Reciprocal", "Erf": "Erf", "Sin": "Sin", "Cos": "Cos",
    "Tan": "Tan", "Asin": "Asin", "Acos": "Acos", "Atan": "Atan", "Sinh": "Sinh", "Cosh": "Cosh",
    "Asinh": "Asinh", "Acosh": "Acosh", "Atanh": "Atanh", "Elu": "Elu", "Selu": "Selu", "Softplus": "Softplus",
    "Softsign": "Softsign", "LogicalNot": "Not", "IsNan": "IsNaN", "IsInf": "IsInf",
}


def _unary(onnx_op: str):
    def m(ctx):
        return ctx.op(onnx_op, ctx.input(0))

    return m


for _tf, _ox in _UNARY.items():
    MAPPERS[_tf] = _unary(_ox)

_BINARY = {
    "Add": "Add", "AddV2": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div", "Div": "Div",
    "Maximum": "Max", "Minimum": "Min", "Pow": "Pow", "Equal": "Equal", "Less": "Less",
    "LessEqual": "LessOrEqual", "Greater": "Greater", "GreaterEqual": "GreaterOrEqual",
    "LogicalAnd": "And", "LogicalOr": "Or", "BitwiseAnd": "BitwiseAnd", "BitwiseOr": "BitwiseOr",
}


def _binary(onnx_op: str):
    def m(ctx):
        return ctx.op(onnx_op, ctx.input(0), ctx.input(1))

    return m


for _tf, _ox in _BINARY.items():
    MAPPERS[_tf] = _binary(_ox)


@mapper("NotEqual")
def _not_equal(ctx):
    return ctx.op("Not", ctx.op("Equal", ctx.input(0), ctx.input(1)))


@mapper("Rsqrt")
def _rsqrt(ctx):
    return ctx.op("Reciprocal", ctx.op("Sqrt", ctx.input(0)))


@mapper("Square")
def _square(ctx):
    x = ctx.input(0)
    return ctx.op("Mul", x, x)


@mapper("SquaredDifference")
def _sqdiff(ctx):
    d = ctx.op("Sub", ctx.input(0), ctx.input(1))
    return ctx.op("Mul", d, d)


@mapper("Relu6")
def _relu6(ctx):
    dt = ctx.in_type(0).dtype or np.float32
    return ctx.op("Clip", ctx.input(0), scalar(ctx, 0, dt), scalar(ctx, 6, dt))


@mapper("LeakyRelu")
def _leaky(ctx):
    return ctx.op("LeakyRelu", ctx.input(0), alpha=float(ctx.attr("alpha", 0.2)))


@mapper("Log1p")
def _log1p(ctx):
    dt = ctx.in_type(0).dtype or np.float32
    return ctx.op("Log", ctx.op("Add", ctx.input(0), scalar(ctx, 1, dt)))


@mapper("Expm1")
def _expm1(ctx):
    dt = ctx.in_type(0).dtype or np.float32
    return ctx.op("Sub", ctx.op("Exp", ctx.input(0)), scalar(ctx, 1, dt))


@mapper("IsFinite")
def _isfinite(ctx):
    x = ctx.input(0)
    return ctx.op("Not", ctx.op("Or", ctx.op("IsNaN", x), ctx.op("IsInf", x)))


@mapper("FloorDiv")
def _floordiv(ctx):
    x, y = ctx.input(0), ctx.input(1)
    dt = ctx.in_type(0).dtype
    if dt is not None and np.issubdtype(dt, np.integer):
        return ctx.op("Div", ctx.op("Sub", x, ctx.op("Mod", x, y, fmod=0)), y)
    return ctx.op("Floor", ctx.op("Div", x, y))


@mapper("FloorMod")
def _floormod(ctx):
    x, y = ctx.input(0), ctx.input(1)
    dt = ctx.in_type(0).dtype
    if dt is not None and np.issubdtype(dt, np.integer):
        return ctx.op("Mod", x, y, fmod=0)
    return ctx.op("Sub", x, ctx.op("Mul", y, ctx.op("Floor", ctx.op("Div", x, y))))


@mapper("TruncateDiv")
def _truncdiv(ctx):
    return ctx.op("Div", ctx.input(0), ctx.input(1))


@mapper("DivNoNan")
def _div_no_nan(ctx):
    x, y = ctx.input(0), ctx.input(1)
    dt = ctx.in_type(0).dtype or np.float32
    zero = scalar(ctx, 0, dt)
    return ctx.op("Where", ctx.op("Equal", y, zero), zero, ctx.op("Div", x, y))


@mapper("AddN")
def _addn(ctx):
    xs = ctx.inputs()
    return xs[0] if len(xs) == 1 else ctx.op("Sum", *xs)


@mapper("BiasAdd", "BiasAddV1")
def _bias_add(ctx):
    x, b = ctx.input(0), ctx.input(1)
    if is_channels_last(ctx.attr("data_format")):
        return ctx.op("Add", x, b)
    rank = ctx.in_rank(0)
    c = ctx.const(1)
    bb = ctx.constant(c.reshape((-1,) + (1,) * (rank - 2))) if c is not None else ctx.op(
        "Reshape", b, i64(ctx, [-1] + [1] * (rank - 2)))
    return ctx.op("Add", x, bb)


@mapper("ClipByValue")
def _clip(ctx):
    return ctx.op("Max", ctx.op("Min", ctx.input(0), ctx.input(2)), ctx.input(1))


@mapper("Cast")
def _cast(ctx):
    dst = ctx.attr("DstT")
    if dst is None:
        ctx.fail("has no DstT")
    if ctx.in_type(0).dtype == dst:
        return ctx.input(0)
    return cast_to(ctx, ctx.input(0), dst)


@mapper("Select", "SelectV2")
def _select(ctx):
    c, x, y = ctx.input(0), ctx.input(1), ctx.input(2)
    if ctx.op_type == "Select":
        rc, rx = ctx.in_type(0).rank, ctx.in_type(1).rank
        if rc == 1 and rx is not None and rx > 1:
            c = ctx.op("Unsqueeze", c, i64(ctx, list(range(1, rx))))
    return ctx.op("Where", c, x, y)


# ------------------------------------------------------------------------------------------
# activations and normalisation
# ------------------------------------------------------------------------------------------
@mapper("Softmax", "LogSoftmax")
def _softmax(ctx):
    return ctx.op(ctx.op_type, ctx.input(0), axis=-1)


@mapper("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_bn(ctx):
    if ctx.attr("is_training", False):
        mean, var = ctx.const(3), ctx.const(4)
        if mean is None or var is None or mean.size == 0:
            ctx.fail("is in training mode (batch statistics); freeze the model for inference")
    eps = float(ctx.attr("epsilon", 1e-4))
    fmt = ctx.attr("data_format", "NHWC")
    x = ctx.input(0)
    consts = [ctx.const(i) for i in range(1, 5)]
    rank = ctx.in_rank(0)
    dt = ctx.in_type(0).dtype or np.float32
    if all(c is not None for c in consts):
        scale, offset, mean, var = (np.asarray(c, dtype=np.float64) for c in consts)
        a = scale / np.sqrt(var + eps)
        b = offset - mean * a
        if not is_channels_last(fmt):
            a = a.reshape((-1,) + (1,) * (rank - 2))
            b = b.reshape((-1,) + (1,) * (rank - 2))
        y = ctx.op("Add", ctx.op("Mul", x, ctx.constant(a.astype(dt))), ctx.constant(b.astype(dt)))
        return [y]
    xn = to_nchw(ctx, x, rank) if is_channels_last(fmt) else x
    y = ctx.op("BatchNormalization", xn, *[ctx.input(i) for i in range(1, 5)], epsilon=eps)
    return [to_nhwc(ctx, y, rank) if is_channels_last(fmt) else y]


@mapper("LRN")
def _lrn(ctx):
    r = int(ctx.attr("depth_radius", 5))
    size = 2 * r + 1
    x = to_nchw(ctx, ctx.input(0), 4)
    y = ctx.op("LRN", x, size=size, alpha=float(ctx.attr("alpha", 1.0)) * size, beta=float(ctx.attr("beta", 0.5)),
               bias=float(ctx.attr("bias", 1.0)))
    return to_nhwc(ctx, y, 4)


# ------------------------------------------------------------------------------------------
# convolution and pooling
# ------------------------------------------------------------------------------------------
def _spatial(ctx, values, rank: int, channels_last: bool) -> list[int]:
    values = list(values)
    return values[1:rank - 1] if channels_last else values[2:rank]


def _in_spatial(ctx, i: int, rank: int, channels_last: bool):
    sh = ctx.in_type(i).shape
    if sh is None:
        return [None] * (rank - 2)
    return _spatial(ctx, sh, rank, channels_last)


def _filter(ctx, i: int, perm: list[int], reshape=None) -> Value:
    dq = _moved_dq(ctx, i, perm, reshape)
    if dq is not None:
        return dq
    w = ctx.const(i)
    if w is not None:
        if reshape is not None:
            w = w.reshape(reshape)
        return ctx.constant(np.ascontiguousarray(np.transpose(w, perm)))
    v = ctx.input(i)
    if reshape is not None:
        v = ctx.op("Reshape", v, i64(ctx, reshape))
    return ctx.op("Transpose", v, perm=perm)


def _explicit_pads(ctx, rank: int, channels_last: bool) -> list[int] | None:
    ep = ctx.attr("explicit_paddings") or []
    if not ep:
        return None
    pairs = [ep[2 * i:2 * i + 2] for i in range(rank)]
    sp = pairs[1:rank - 1] if channels_last else pairs[2:rank]
    return [p[0] for p in sp] + [p[1] for p in sp]


@mapper("Conv2D", "Conv3D", "DepthwiseConv2dNative")
def _conv(ctx):
    fmt = ctx.attr("data_format", "NHWC")
    cl = is_channels_last(fmt)
    rank = ctx.in_rank(0)
    w_shape = ctx.in_type(1).shape
    if w_shape is None or any(not isinstance(d, int) for d in w_shape):
        ctx.fail("needs a filter of static shape")
    k = list(w_shape[:rank - 2])
    s = _spatial(ctx, ctx.attr("strides") or [1] * rank, rank, cl)
    d = _spatial(ctx, ctx.attr("dilations") or [1] * rank, rank, cl)
    perm = [rank - 1, rank - 2] + list(range(rank - 2))
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": s, "dilations": d}
    if ctx.op_type == "DepthwiseConv2dNative":
        cin, mult = w_shape[2], w_shape[3]
        w = _filter(ctx, 1, perm, reshape=tuple(k) + (1, cin * mult))
        attrs["group"] = int(cin)
    else:
        w = _filter(ctx, 1, perm)
        cin = ctx.in_type(0).shape[rank - 1 if cl else 1] if ctx.in_type(0).shape else None
        if isinstance(cin, int) and cin != w_shape[rank - 2]:
            attrs["group"] = int(cin // w_shape[rank - 2])
    attrs.update(_window_attrs(ctx, ctx.attr("padding", "VALID"), _in_spatial(ctx, 0, rank, cl), k, s, d,
                               _explicit_pads(ctx, rank, cl)))
    x = ctx.input(0)
    xn = to_nchw(ctx, x, rank) if cl else x
    y = ctx.op("Conv", xn, w, **attrs)
    return to_nhwc(ctx, y, rank) if cl else y


@mapper("Conv2DBackpropInput", "Conv3DBackpropInputV2")
def _conv_transpose(ctx):
    fmt = ctx.attr("data_format", "NHWC")
    cl = is_channels_last(fmt)
    rank = ctx.in_rank(2)
    out_shape = ctx.out_type(0).shape
    sizes = ctx.const(0)
    if sizes is None and out_shape is not None:
        sizes = out_shape
    sp_sizes = _spatial(ctx, sizes, rank, cl) if sizes is not None else [None]
    if any(not isinstance(v, (int, np.integer)) for v in sp_sizes):
        ctx.fail("needs static output sizes (input_sizes)")
    w_shape = ctx.in_type(1).shape
    if w_shape is None or any(not isinstance(d, int) for d in w_shape):
        ctx.fail("needs a filter of static shape")
    k = list(w_shape[:rank - 2])
    s = _spatial(ctx, ctx.attr("strides") or [1] * rank, rank, cl)
    d = _spatial(ctx, ctx.attr("dilations") or [1] * rank, rank, cl)
    out_sp = [int(v) for v in sp_sizes]
    in_sp = _in_spatial(ctx, 2, rank, cl)
    if any(not isinstance(v, int) for v in in_sp):
        ctx.fail("needs static spatial input sizes")
    padding = ctx.attr("padding", "VALID")
    explicit = _explicit_pads(ctx, rank, cl)
    pads_b, pads_e, out_pad = [], [], []
    for i, (n_in, n_out, kk, ss, dd) in enumerate(zip(in_sp, out_sp, k, s, d)):
        eff = (kk - 1) * dd + 1
        if padding == "SAME":
            total = max((n_in - 1) * ss + eff - n_out, 0)
            b = total // 2
            e = total - b
        elif padding == "EXPLICIT" and explicit is not None:
            b, e = explicit[i], explicit[i + rank - 2]
        else:
            b = e = 0
        full = ss * (n_in - 1) + eff - b - e
        op_ = n_out - full
        if op_ < 0:
            # crop more at the end
            e += -op_
            op_ = 0
        pads_b.append(b)
        pads_e.append(e)
        out_pad.append(op_)
    # TF filter: spatial..., out_channels, in_channels -> ONNX (C_in, C_out, spatial...)
    perm = [rank - 1, rank - 2] + list(range(rank - 2))
    w = _filter(ctx, 1, perm)
    x = ctx.input(2)
    xn = to_nchw(ctx, x, rank) if cl else x
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads_b + pads_e}
    if any(out_pad):
        attrs["output_padding"] = out_pad
    y = ctx.op("ConvTranspose", xn, w, **attrs)
    return to_nhwc(ctx, y, rank) if cl else y


@mapper("MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "MaxPoolV2")
def _pool(ctx):
    fmt = ctx.attr("data_format", "NHWC")
    cl = is_channels_last(fmt)
    rank = ctx.in_rank(0)
    if ctx.op_type == "MaxPoolV2":
        ksize = list(ctx.require_const(1, "ksize"))
        strides = list(ctx.require_const(2, "strides"))
    else:
        ksize, strides = ctx.attr("ksize"), ctx.attr("strides")
    k = [int(v) for v in _spatial(ctx, ksize, rank, cl)]
    s = [int(v) for v in _spatial(ctx, strides, rank, cl)]
    onnx_op = "MaxPool" if ctx.op_type.startswith("MaxPool") else "AveragePool"
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": s}
    attrs.update(_window_attrs(ctx, ctx.attr("padding", "VALID"), _in_spatial(ctx, 0, rank, cl), k, s, [1] * len(k)))
    if onnx_op == "AveragePool":
        attrs["count_include_pad"] = 0
    x = ctx.input(0)
    xn = to_nchw(ctx, x, rank) if cl else x
    y = ctx.op(onnx_op, xn, **attrs)
    return to_nhwc(ctx, y, rank) if cl else y


# ------------------------------------------------------------------------------------------
# matrix products
# ------------------------------------------------------------------------------------------
def _swap_last(ctx, i: int) -> Value:
    c = ctx.const(i)
    if c is not None:
        return ctx.constant(np.ascontiguousarray(np.swapaxes(c, -1, -2)))
    r = ctx.in_rank(i)
    perm = list(range(r))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    dq = _moved_dq(ctx, i, perm)
    if dq is not None:
        return dq
    return ctx.op("Transpose", ctx.input(i), perm=perm)


@mapper("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _matmul(ctx):
    ta = ctx.attr("transpose_a", False) or ctx.attr("adj_x", False)
    tb = ctx.attr("transpose_b", False) or ctx.attr("adj_y", False)
    a = _swap_last(ctx, 0) if ta else ctx.input(0)
    b = _swap_last(ctx, 1) if tb else ctx.input(1)
    y = ctx.op("MatMul", a, b)
    out_dt = ctx.attr("Tout")
    if out_dt is not None and out_dt != ctx.in_type(0).dtype:
        y = cast_to(ctx, y, out_dt)
    return y


@mapper("Einsum")
def _einsum(ctx):
    return ctx.op("Einsum", *ctx.inputs(), equation=ctx.attr("equation"))


# ------------------------------------------------------------------------------------------
# reductions
# ------------------------------------------------------------------------------------------
_REDUCE = {"Mean": "ReduceMean", "Sum": "ReduceSum", "Max": "ReduceMax", "Min": "ReduceMin", "Prod": "ReduceProd"}


def _reduce(onnx_op: str):
    def m(ctx):
        keep = int(bool(ctx.attr("keep_dims", False)))
        axes = ctx.const(1)
        x = ctx.input(0)
        if axes is not None:
            axes = np.asarray(axes).reshape(-1)
            if axes.size == 0:
                return x
            return ctx.op(onnx_op, x, i64(ctx, axes), keepdims=keep)
        return ctx.op(onnx_op, x, as_i64(ctx, 1), keepdims=keep, noop_with_empty_axes=1)

    return m


for _tf, _ox in _REDUCE.items():
    MAPPERS[_tf] = _reduce(_ox)


@mapper("All", "Any")
def _all_any(ctx):
    keep = int(bool(ctx.attr("keep_dims", False)))
    x = cast_to(ctx, ctx.input(0), np.int32)
    op = "ReduceMin" if ctx.op_type == "All" else "ReduceMax"
    axes = ctx.const(1)
    if axes is not None and np.asarray(axes).size == 0:
        return ctx.input(0)
    y = ctx.op(op, x, as_i64(ctx, 1), keepdims=keep)
    return cast_to(ctx, y, np.bool_)


@mapper("ArgMax", "ArgMin")
def _argmax(ctx):
    axis = int(np.asarray(ctx.require_const(1, "dimension")).reshape(-1)[0])
    y = ctx.op(ctx.op_type, ctx.input(0), axis=axis, keepdims=0)
    out = ctx.attr("output_type", np.dtype(np.int64))
    if out != np.dtype(np.int64):
        y = cast_to(ctx, y, out)
    return y


# ------------------------------------------------------------------------------------------
# shapes and data movement
# ------------------------------------------------------------------------------------------
@mapper("Shape")
def _shape(ctx):
    out = ctx.attr("out_type", np.dtype(np.int32))
    t = ctx.in_type(0)
    if t.is_static:
        return ctx.constant(np.asarray(t.shape, dtype=out))
    y = ctx.op("Shape", ctx.input(0))
    return cast_to(ctx, y, out) if out != np.dtype(np.int64) else y


@mapper("ShapeN")
def _shape_n(ctx):
    out = ctx.attr("out_type", np.dtype(np.int32))
    res = []
    for i in range(ctx.num_inputs):
        t = ctx.in_type(i)
        if t.is_static:
            res.append(ctx.constant(np.asarray(t.shape, dtype=out)))
        else:
            y = ctx.op("Shape", ctx.input(i))
            res.append(cast_to(ctx, y, out) if out != np.dtype(np.int64) else y)
    return res


@mapper("Size")
def _size(ctx):
    out = ctx.attr("out_type", np.dtype(np.int32))
    n = ctx.in_type(0).numel
    if n is not None:
        return ctx.constant(np.asarray(n, dtype=out))
    y = ctx.op("Size", ctx.input(0))
    return cast_to(ctx, y, out) if out != np.dtype(np.int64) else y


@mapper("Rank")
def _rank(ctx):
    return ctx.constant(np.asarray(ctx.in_rank(0), dtype=np.int32))


@mapper("Reshape")
def _reshape(ctx):
    shape = ctx.const(1)
    x = ctx.input(0)
    if shape is not None:
        shape = np.asarray(shape, dtype=np.int64).reshape(-1)
        attrs = {"allowzero": 1} if (shape == 0).any() and not (shape == -1).any() else {}
        return ctx.op("Reshape", x, i64(ctx, shape), **attrs)
    out = ctx.out_type(0)
    if out.is_static:
        return ctx.op("Reshape", x, i64(ctx, out.shape))
    return ctx.op("Reshape", x, as_i64(ctx, 1))


@mapper("Squeeze")
def _squeeze(ctx):
    axes = ctx.attr("squeeze_dims") or []
    if not axes:
        return ctx.op("Squeeze", ctx.input(0))
    return ctx.op("Squeeze", ctx.input(0), i64(ctx, axes))


@mapper("ExpandDims")
def _expand_dims(ctx):
    axis = np.asarray(ctx.require_const(1, "axis")).reshape(-1)
    return ctx.op("Unsqueeze", ctx.input(0), i64(ctx, axis))


@mapper("Transpose")
def _transpose(ctx):
    perm = [int(p) for p in np.asarray(ctx.require_const(1, "perm")).reshape(-1)]
    if perm == list(range(len(perm))):
        return ctx.input(0)
    return ctx.op("Transpose", ctx.input(0), perm=perm)


@mapper("ConcatV2", "Concat")
def _concat(ctx):
    if ctx.op_type == "ConcatV2":
        axis = int(np.asarray(ctx.require_const(ctx.num_inputs - 1, "axis")))
        xs = [ctx.input(i) for i in range(ctx.num_inputs - 1)]
    else:
        axis = int(np.asarray(ctx.require_const(0, "concat_dim")))
        xs = [ctx.input(i) for i in range(1, ctx.num_inputs)]
    if len(xs) == 1:
        return xs[0]
    return ctx.op("Concat", *xs, axis=axis)


@mapper("Pack")
def _pack(ctx):
    axis = int(ctx.attr("axis", 0))
    ax = i64(ctx, [axis])
    xs = [ctx.op("Unsqueeze", ctx.input(i), ax) for i in range(ctx.num_inputs)]
    return xs[0] if len(xs) == 1 else ctx.op("Concat", *xs, axis=axis)


@mapper("Unpack")
def _unpack(ctx):
    num = int(ctx.attr("num"))
    axis = int(ctx.attr("axis", 0))
    parts = ctx.make("Split", [ctx.input(0)], {"axis": axis, "num_outputs": num}, num_outputs=num).outputs
    ax = i64(ctx, [axis])
    return [ctx.op("Squeeze", p, ax) for p in parts]


@mapper("Split")
def _split(ctx):
    axis = int(np.asarray(ctx.require_const(0, "axis")))
    num = int(ctx.attr("num_split"))
    if num == 1:
        return [ctx.input(1)]
    return list(ctx.make("Split", [ctx.input(1)], {"axis": axis, "num_outputs": num}, num_outputs=num).outputs)


@mapper("SplitV")
def _splitv(ctx):
    sizes = np.asarray(ctx.require_const(1, "size_splits"), dtype=np.int64).reshape(-1)
    axis = int(np.asarray(ctx.require_const(2, "axis")))
    if (sizes < 0).any():
        sh = ctx.in_type(0).shape
        dim = sh[axis] if sh is not None else None
        if not isinstance(dim, int):
            ctx.fail("needs a static size along the split axis")
        sizes = sizes.copy()
        sizes[sizes < 0] = dim - sizes[sizes >= 0].sum()
    n = len(sizes)
    if n == 1:
        return [ctx.input(0)]
    return list(ctx.make("Split", [ctx.input(0), i64(ctx, sizes)], {"axis": axis}, num_outputs=n).outputs)


@mapper("Slice")
def _slice(ctx):
    begin = np.asarray(ctx.require_const(1, "begin"), dtype=np.int64).reshape(-1)
    size = np.asarray(ctx.require_const(2, "size"), dtype=np.int64).reshape(-1)
    end = np.where(size < 0, INT64_MAX, begin + size)
    return ctx.op("Slice", ctx.input(0), i64(ctx, begin), i64(ctx, end), i64(ctx, list(range(len(begin)))))


@mapper("StridedSlice")
def _strided_slice(ctx):
    x = ctx.input(0)
    begin = np.asarray(ctx.require_const(1, "begin"), dtype=np.int64).reshape(-1)
    end = np.asarray(ctx.require_const(2, "end"), dtype=np.int64).reshape(-1)
    strides = np.asarray(ctx.require_const(3, "strides"), dtype=np.int64).reshape(-1)
    rank = ctx.in_rank(0)
    bm, em = int(ctx.attr("begin_mask", 0)), int(ctx.attr("end_mask", 0))
    elm, nam, sam = int(ctx.attr("ellipsis_mask", 0)), int(ctx.attr("new_axis_mask", 0)), int(ctx.attr("shrink_axis_mask", 0))
    n = len(begin)
    starts, ends, axes, steps = [], [], [], []
    shrink: list[int] = []
    new_pos: list[int] = []
    dim = 0
    pos = 0
    real_after = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        real_after[i] = real_after[i + 1] + (0 if (nam >> i) & 1 or (elm >> i) & 1 else 1)
    for i in range(n):
        if (elm >> i) & 1:
            covered = rank - dim - real_after[i + 1]
            dim += covered
            pos += covered
            continue
        if (nam >> i) & 1:
            new_pos.append(pos)
            pos += 1
            continue
        if dim >= rank:
            ctx.fail("slices more dimensions than its input has")
        b, e, s = int(begin[i]), int(end[i]), int(strides[i])
        if (sam >> i) & 1:
            starts.append(b)
            ends.append(INT64_MAX if b == -1 else b + 1)
            steps.append(1)
            axes.append(dim)
            shrink.append(dim)
        else:
            if s == 0:
                ctx.fail("has a zero stride")
            if (bm >> i) & 1:
                b = 0 if s > 0 else INT64_MAX
            if (em >> i) & 1:
                e = INT64_MAX if s > 0 else INT64_MIN
            if not (b == 0 and e == INT64_MAX and s == 1):
                starts.append(b)
                ends.append(e)
                steps.append(s)
                axes.append(dim)
            pos += 1
        dim += 1
    y = x
    if axes:
        y = ctx.op("Slice", y, i64(ctx, starts), i64(ctx, ends), i64(ctx, axes), i64(ctx, steps))
    if shrink:
        y = ctx.op("Squeeze", y, i64(ctx, shrink))
    if new_pos:
        y = ctx.op("Unsqueeze", y, i64(ctx, new_pos))
    if y is x:
        y = ctx.op("Identity", x)
    return y


@mapper("Pad", "PadV2", "MirrorPad")
def _pad(ctx):
    p = np.asarray(ctx.require_const(1, "paddings"), dtype=np.int64).reshape(-1, 2)
    pads = i64(ctx, np.concatenate([p[:, 0], p[:, 1]]))
    x = ctx.input(0)
    if ctx.op_type == "MirrorPad":
        mode = str(ctx.attr("mode", "REFLECT")).upper()
        if mode != "REFLECT":
            ctx.fail(f"uses mode {mode}, which ONNX Pad has no equivalent of")
        return ctx.op("Pad", x, pads, mode="reflect")
    if ctx.op_type == "PadV2":
        return ctx.op("Pad", x, pads, ctx.input(2), mode="constant")
    return ctx.op("Pad", x, pads, mode="constant")


@mapper("Tile")
def _tile(ctx):
    return ctx.op("Tile", ctx.input(0), as_i64(ctx, 1))


@mapper("BroadcastTo")
def _broadcast_to(ctx):
    return ctx.op("Expand", ctx.input(0), as_i64(ctx, 1))


@mapper("Fill")
def _fill(ctx):
    value = ctx.const(1)
    dims = as_i64(ctx, 0)
    if value is not None:
        return ctx.op("ConstantOfShape", dims, value=np.asarray(value).reshape(1))
    return ctx.op("Expand", ctx.input(1), dims)


@mapper("ZerosLike", "OnesLike")
def _zeros_like(ctx):
    t = ctx.in_type(0)
    dt = t.dtype or np.float32
    val = np.asarray([0 if ctx.op_type == "ZerosLike" else 1], dtype=dt)
    if t.is_static:
        return ctx.constant(np.full(t.shape, val[0], dtype=dt))
    return ctx.op("ConstantOfShape", ctx.op("Shape", ctx.input(0)), value=val)


@mapper("Range")
def _range(ctx):
    return ctx.op("Range", ctx.input(0), ctx.input(1), ctx.input(2))


@mapper("GatherV2", "Gather", "ResourceGather")
def _gather(ctx):
    axis = 0
    if ctx.op_type == "GatherV2":
        axis = int(np.asarray(ctx.require_const(2, "axis")))
    if int(ctx.attr("batch_dims", 0) or 0) != 0:
        ctx.fail("uses batch_dims, which is not supported")
    return ctx.op("Gather", ctx.input(0), ctx.input(1), axis=axis)


@mapper("GatherNd")
def _gather_nd(ctx):
    return ctx.op("GatherND", ctx.input(0), as_i64(ctx, 1))


@mapper("OneHot")
def _one_hot(ctx):
    axis = int(ctx.attr("axis", -1))
    on, off = ctx.input(2), ctx.input(3)
    ax = i64(ctx, [0])
    values = ctx.op("Concat", ctx.op("Unsqueeze", off, ax), ctx.op("Unsqueeze", on, ax), axis=0)
    return ctx.op("OneHot", ctx.input(0), as_i64(ctx, 1), values, axis=axis)


@mapper("Where")
def _where(ctx):
    nz = ctx.op("NonZero", ctx.input(0))
    return ctx.op("Transpose", nz, perm=[1, 0])


@mapper("TopKV2")
def _topk(ctx):
    k = ctx.const(1)
    kk = i64(ctx, np.asarray(k).reshape(1)) if k is not None else ctx.op("Reshape", as_i64(ctx, 1), i64(ctx, [1]))
    node = ctx.make("TopK", [ctx.input(0), kk], {"axis": -1, "largest": 1, "sorted": 1}, num_outputs=2)
    return [node.outputs[0], cast_to(ctx, node.outputs[1], np.int32)]


@mapper("Cumsum")
def _cumsum(ctx):
    return ctx.op("CumSum", ctx.input(0), as_i64(ctx, 1), exclusive=int(bool(ctx.attr("exclusive", False))),
                  reverse=int(bool(ctx.attr("reverse", False))))


@mapper("SpaceToDepth", "DepthToSpace")
def _space_depth(ctx):
    bs = int(ctx.attr("block_size"))
    cl = is_channels_last(ctx.attr("data_format"))
    x = to_nchw(ctx, ctx.input(0), 4) if cl else ctx.input(0)
    attrs: dict[str, Any] = {"blocksize": bs}
    if ctx.op_type == "DepthToSpace":
        attrs["mode"] = "DCR"
    y = ctx.op(ctx.op_type, x, **attrs)
    return to_nhwc(ctx, y, 4) if cl else y


# ------------------------------------------------------------------------------------------
# resize
# ------------------------------------------------------------------------------------------
@mapper("ResizeBilinear", "ResizeNearestNeighbor", "ResizeBicubic")
def _resize(ctx):
    align = bool(ctx.attr("align_corners", False))
    half = bool(ctx.attr("half_pixel_centers", False))
    sizes = as_i64(ctx, 1)
    attrs: dict[str, Any] = {"axes": [1, 2]}
    if ctx.op_type == "ResizeNearestNeighbor":
        attrs["mode"] = "nearest"
        if align:
            attrs.update(coordinate_transformation_mode="align_corners", nearest_mode="round_prefer_ceil")
        elif half:
            attrs.update(coordinate_transformation_mode="tf_half_pixel_for_nn", nearest_mode="floor")
        else:
            attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        attrs["mode"] = "linear" if ctx.op_type == "ResizeBilinear" else "cubic"
        if ctx.op_type == "ResizeBicubic":
            attrs["cubic_coeff_a"] = -0.5
        if align:
            attrs["coordinate_transformation_mode"] = "align_corners"
        elif half:
            attrs["coordinate_transformation_mode"] = "half_pixel"
        else:
            attrs["coordinate_transformation_mode"] = "asymmetric"
    x = ctx.input(0)
    dt = ctx.in_type(0).dtype
    y = ctx.op("Resize", x, None, None, sizes, **attrs)
    if ctx.op_type != "ResizeNearestNeighbor" and dt is not None and dt != np.float32:
        y = cast_to(ctx, y, np.float32)  # TF's bilinear/bicubic resize always returns float32
    return y


# ------------------------------------------------------------------------------------------
# fake quantisation (quantisation-aware training): QuantizeLinear -> DequantizeLinear
# ------------------------------------------------------------------------------------------
def nudge(lo, hi, num_bits: int, narrow_range: bool):
    """TensorFlow's ``Nudge`` (fake_quant_ops_functor.h) in float32 as TensorFlow computes it:
    ``(scale, zero_point, qmin, qmax)`` with scale = (max - min) / (qmax - qmin) and the zero
    point qmin - min / scale rounded half away from zero and clamped to [qmin, qmax], so that
    real 0 is on the grid (per channel when ``lo``/``hi`` are vectors)."""
    qmin, qmax = (1 if narrow_range else 0), (1 << num_bits) - 1
    lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
    scale = ((hi - lo) / np.float32(qmax - qmin)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zf = (np.float32(qmin) - lo / scale).astype(np.float32)
    zp = np.clip(np.floor(zf + np.float32(0.5)), qmin, qmax)  # (zf >= qmin >= 0 where it counts)
    return scale, zp.astype(np.int64), qmin, qmax


def _fq_integers(x: np.ndarray, scale, zp, qmin: int, qmax: int, axis: int | None) -> np.ndarray:
    """TensorFlow's integers of a constant ``x`` (its clamp, then floor(x / scale + 0.5)) on the
    ``zero_point`` grid, channels along ``axis`` (None: per tensor)."""
    s, z = np.asarray(scale, np.float32), np.asarray(zp, np.float32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    lo = ((np.float32(qmin) - z) * s).astype(np.float32)
    hi = ((np.float32(qmax) - z) * s).astype(np.float32)
    shifted = (np.minimum(np.maximum(np.asarray(x, np.float32), lo), hi) - lo).astype(np.float32)
    q = np.floor((shifted / s).astype(np.float32) + np.float32(0.5)) + np.float32(qmin)
    return np.clip(q, qmin, qmax)


@mapper("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel")
def _fake_quant(ctx):
    """TF's fake-quant with constant ranges as ONNX QuantizeLinear -> DequantizeLinear with TF's
    nudged scale and zero point (uint8, uint16 above 8 bits; per channel along the last axis),
    which the quantisation pass reads as int8 regions. A constant input (a weight) becomes its
    integers now, with TF's rounding, and a DequantizeLinear. Activations round as ONNX does
    (x / scale, half to even) where TF computes floor(x / scale + 0.5) (x * (1 / scale) for
    FakeQuantWithMinMaxArgs): results differ by one step at ties."""
    bits, narrow = int(ctx.attr("num_bits", 8)), bool(ctx.attr("narrow_range", False))
    if not 2 <= bits <= 16:
        ctx.invalid(f"has num_bits={bits}; TensorFlow takes 2 to 16")
    if ctx.op_type == "FakeQuantWithMinMaxArgs":
        lo, hi = np.float32(ctx.attr("min", -6.0)), np.float32(ctx.attr("max", 6.0))
    else:
        lo, hi = ctx.const(1), ctx.const(2)
        if lo is None or hi is None:
            ctx.fail("has min/max that are not constants (a model still training its ranges); freeze the "
                     "trained ranges into constants (convert_variables_to_constants_v2) before loading")
    per_channel = ctx.op_type == "FakeQuantWithMinMaxVarsPerChannel"
    rank = ctx.in_rank(0)
    axis = rank - 1 if per_channel else None
    if (per_channel and (np.ndim(lo) != 1 or np.shape(lo) != np.shape(hi))) \
            or (not per_channel and (np.size(lo) != 1 or np.size(hi) != 1)):
        ctx.invalid(f"has min/max of shapes {np.shape(lo)} and {np.shape(hi)}")
    scale, zp, qmin, qmax = nudge(np.reshape(lo, -1 if per_channel else ()), np.reshape(hi, -1 if per_channel else ()),
                                  bits, narrow)
    if not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
        ctx.fail(f"has a range [{lo}, {hi}] that is empty or not finite; min must be below max")
    qdt = np.uint8 if bits <= 8 else np.uint16
    attrs = {"axis": axis} if per_channel else {}
    s_c, z_c = ctx.constant(scale), ctx.constant(zp.astype(qdt))
    c = ctx.const(0)
    if c is not None:
        q = _fq_integers(c, scale, zp, qmin, qmax, axis)
        return ctx.op("DequantizeLinear", ctx.constant(q.astype(qdt)), s_c, z_c, **attrs)
    # channels-last activations are fake-quantised in NCHW between two Transposes: the next
    # Conv's Transpose cancels the second (to_nchw), so the quantised values reach the Conv
    nchw = rank >= 3
    x = to_nchw(ctx, ctx.input(0), rank) if nchw else ctx.input(0)
    if per_channel and nchw:
        attrs["axis"] = 1
    if (qmin, qmax) != (0, np.iinfo(qdt).max):  # narrow range, fewer bits: TF's clamp to [qmin, qmax]
        shape = [1] * rank
        shape[attrs.get("axis", 0)] = -1
        lo_v = ((np.float32(qmin) - zp.astype(np.float32)) * scale).astype(np.float32).reshape(shape)
        hi_v = ((np.float32(qmax) - zp.astype(np.float32)) * scale).astype(np.float32).reshape(shape)
        x = ctx.op("Min", ctx.op("Max", x, ctx.constant(lo_v)), ctx.constant(hi_v))
    y = ctx.op("DequantizeLinear", ctx.op("QuantizeLinear", x, s_c, z_c, **attrs), s_c, z_c, **attrs)
    return to_nhwc(ctx, y, rank) if nchw else y


def _moved_dq(ctx, i: int, perm: list[int], reshape=None) -> Value | None:
    """Input ``i`` when it is a DequantizeLinear of constants (a fake-quantised weight), as the
    DequantizeLinear of its integers reshaped and transposed by ``perm``, the channel axis
    following (the quantisation pass finds the int8 weight at the Conv / MatMul); else None."""
    v = ctx.raw_input(i)
    n = v.producer if isinstance(v, Value) else None
    if n is None or n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx") or len(n.inputs) != 3 \
            or any(u is None or u.const_value is None for u in n.inputs):
        return None
    q, s, z = (np.asarray(u.const_value) for u in n.inputs if u is not None)
    axis = int(n.attrs.get("axis", 1)) % max(q.ndim, 1) if s.size > 1 else None
    if reshape is not None:
        if axis is not None:  # (a depthwise filter: (kh, kw, cin, mult) -> (kh, kw, 1, cin * mult))
            if q.ndim != 4 or axis < 2:
                return None
            s = np.broadcast_to(s.reshape((-1, 1) if axis == 2 else (1, -1)), q.shape[2:]).reshape(-1)
            z = np.broadcast_to(z.reshape((-1, 1) if axis == 2 else (1, -1)), q.shape[2:]).reshape(-1)
            axis = len(reshape) - 1
        q = q.reshape(reshape)
    attrs = {"axis": perm.index(axis)} if axis is not None else {}
    q = np.ascontiguousarray(np.transpose(q, perm))
    return ctx.op("DequantizeLinear", ctx.constant(q), ctx.constant(s), ctx.constant(z), **attrs)
