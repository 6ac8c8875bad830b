"""Symbolic shape inference: what ONNX's per-node inference leaves unknown on symbolic dims.

ONNX's inference (:mod:`ge_opset.infer`) carries a symbolic dim through as an opaque
``dim_param`` (an expression travels as a token, see :func:`ge_sdk.onnx_types.dim_param`), which
covers elementwise ops, MatMul, Transpose, Gather, normalisations... It cannot compute with them:
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` (how every exporter writes a reshape of a
dynamic tensor) leaves the Reshape's output unknown, and so everything after it. This module
adds, as onnxruntime's ``symbolic_shape_infer`` does:

* **shape data**: the symbolic contents of small integer tensors (what ``Shape`` returns and the
  ops that slice, gather, concatenate and compute with it), kept in ``value.meta`` (key
  :data:`ge_core.ops.INFERRED_META`)
  as ``(dims, scalar)``;
* **rules** for the ops whose output shape is a computation: Reshape (``0`` and ``-1``), Expand,
  ConstantOfShape, Tile, Slice, Range, Resize, Concat, Flatten, convolution and pooling windows,
  and broadcasting of two different symbolic dims (``max(a, b)``: what a successful broadcast
  gives).

A rule only fills what ONNX left unknown; dims ONNX knows are kept. Every result is exact for any
values of the symbols at least 1, or unknown (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.ir import symbolic as S
from ge_core.ir.graph import Node, Value
from ge_core.ir.types import TensorType
from ge_core.ops import INFERRED_META
from ge_sdk.onnx_types import ELEM_TYPES

from .infer import onnx_infer

#: ONNX element types a Cast keeps shape data through (the project's one dtype table).
_INT_ELEMS = frozenset(ELEM_TYPES[n] for n in ("int32", "int64", "uint32", "uint64"))
#: Integer tensors up to this many elements carry shape data.
DATA_LIMIT = 64
#: An end/start at or past this is "to the end" (INT64_MAX and the like).
HUGE = 1 << 31

BROADCAST_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Sum", "Mean", "PRelu", "BitShift", "BitwiseAnd",
    "BitwiseOr", "BitwiseXor",
})


def infer(node: Node, opset: int) -> Sequence[TensorType | None] | None:
    """ONNX's inference, completed symbolically (the op set's ``OpDef.infer``)."""
    types = onnx_infer(node, opset)
    if node.domain not in ("", "ai.onnx"):
        return types
    try:
        _propagate_data(node)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError):
        _clear_data(node)
    data = node.outputs[0].meta.get(INFERRED_META) if node.outputs else None
    if data is not None:  # a shape vector's own shape: its length
        known = TensorType(None, () if data[1] else (len(data[0]),))
        types = [_fill(types[0] if types else None, known), *(types[1:] if types else ())]
    rule = _RULES.get(node.op_type)
    if rule is None and node.op_type not in BROADCAST_OPS:
        return types
    if node.op_type in _CEIL_POOLS and node.attrs.get("ceil_mode", 0):
        return _ceil_pool_types(node, types)
    if types is not None and all(t is not None and t.shape is not None and None not in t.shape for t in types):
        return types  # ONNX knew every dim
    try:
        mine = rule(node) if rule is not None else [_broadcast_type(node)]
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, ZeroDivisionError):
        return types
    if not mine:
        return types
    if types is None:
        return mine
    return [_fill(a, b) for a, b in zip(types, mine)] + list(types[len(mine):])


def _fill(onnx_t: TensorType | None, mine: TensorType | None) -> TensorType | None:
    if mine is None or mine.shape is None:
        return onnx_t
    if onnx_t is None:
        return mine
    dtype = onnx_t.dtype if onnx_t.dtype is not None else mine.dtype
    if onnx_t.shape is None or len(onnx_t.shape) != len(mine.shape):
        return TensorType(dtype, mine.shape)
    return TensorType(dtype, tuple(o if o is not None else m for o, m in zip(onnx_t.shape, mine.shape)))


# ------------------------------------------------------------------------------------------
# shape data
# ------------------------------------------------------------------------------------------
def data_of(v: Value | None) -> tuple[tuple, bool] | None:
    """``(dims, scalar)`` of a small integer value: its constant, or the shape data inference
    found (None when unknown)."""
    if v is None:
        return None
    c = v.const_value
    if c is not None:
        if c.dtype.kind in "iu" and c.ndim <= 1 and c.size <= DATA_LIMIT:
            return tuple(int(x) for x in c.reshape(-1)), c.ndim == 0
        if c.dtype.kind == "b" and c.ndim <= 1 and c.size <= DATA_LIMIT:
            return tuple(bool(x) for x in c.reshape(-1)), c.ndim == 0
        return None
    return v.meta.get(INFERRED_META)


def _ints(v: Value | None) -> tuple | None:
    d = data_of(v)
    return None if d is None else d[0]


def _clear_data(node: Node) -> None:
    for o in node.outputs:
        o.meta.pop(INFERRED_META, None)


def _set(node: Node, dims: Any, scalar: bool = False) -> None:
    if dims is None or len(dims) > DATA_LIMIT:
        _clear_data(node)
        return
    node.outputs[0].meta[INFERRED_META] = (tuple(dims), scalar)


_CEIL_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def _ceil_pool_types(node: Node, types: Sequence[TensorType | None] | None) -> Sequence[TensorType | None] | None:
    """A ``ceil_mode`` pool's types: ONNX's inference keeps a last window that starts in the end
    padding, onnxruntime (and the kernels) drop it, so the rule's dims replace ONNX's here."""
    try:
        mine = _r_window(node)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, ZeroDivisionError):
        mine = None
    if not mine:
        return types
    if types is None:
        return mine
    out = []
    for i, t in enumerate(types):
        m = mine[i] if i < len(mine) else None
        if t is None or t.shape is None or m is None or m.shape is None or len(m.shape) != len(t.shape):
            out.append(t if t is not None else m)
            continue
        dims = tuple(b if b is not None else a for a, b in zip(t.shape, m.shape))
        out.append(TensorType(t.dtype, dims))
    return out


def _propagate_data(node: Node) -> None:
    op, ins = node.op_type, node.inputs
    if not node.outputs:
        return
    fn = _DATA.get(op)
    if fn is None:
        _clear_data(node)
        return
    fn(node, ins)


def _d_shape(node, ins):
    t = ins[0].type
    if t.shape is None:
        return _clear_data(node)
    r = len(t.shape)
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    start = max(0, min(r, start + r if start < 0 else start))
    end = r if end is None else int(end)
    end = max(0, min(r, end + r if end < 0 else end))
    _set(node, t.shape[start:end])


def _d_size(node, ins):
    t = ins[0].type
    _set(node, None if t.shape is None else (S.prod(t.shape),), True)


def _d_gather(node, ins):
    d, idx = data_of(ins[0]), data_of(ins[1])
    if d is None or idx is None or d[1] or int(node.attrs.get("axis", 0)) != 0:
        return _clear_data(node)
    n = len(d[0])
    out = []
    for i in idx[0]:
        if not isinstance(i, int) or not -n <= i < n:
            return _clear_data(node)
        out.append(d[0][i])
    _set(node, out, idx[1])


def _d_unsqueeze(node, ins):
    d = data_of(ins[0])
    _set(node, None if d is None or not d[1] else d[0], False)


def _d_squeeze(node, ins):
    d = data_of(ins[0])
    _set(node, None if d is None or d[1] or len(d[0]) != 1 else d[0], True)


def _d_concat(node, ins):
    out: list = []
    for v in ins:
        d = data_of(v)
        if d is None or d[1]:
            return _clear_data(node)
        out.extend(d[0])
    _set(node, out)


def _d_identity(node, ins):
    d = data_of(ins[0])
    if d is None:
        return _clear_data(node)
    to = node.attrs.get("to")
    if node.op_type == "Cast" and to not in _INT_ELEMS:  # to an integer type only
        return _clear_data(node)
    _set(node, d[0], d[1])


def _d_reshape(node, ins):
    d, target = data_of(ins[0]), _ints(ins[1]) if len(ins) > 1 else None
    if d is None or target is None:
        return _clear_data(node)
    # a shape vector reshaped to 1-D, or a one-element one to a scalar
    if target in ((-1,), (len(d[0]),)):
        _set(node, d[0], False)
    elif target == () and len(d[0]) == 1:
        _set(node, d[0], True)
    else:
        _clear_data(node)


def _d_slice(node, ins):
    d = data_of(ins[0])
    starts, ends = _ints(ins[1]) if len(ins) > 1 else None, _ints(ins[2]) if len(ins) > 2 else None
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else (0,)
    steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else (1,)
    if d is None or d[1] or starts is None or ends is None or axes not in ((0,), (-1,)) or steps is None:
        return _clear_data(node)
    if not all(isinstance(x, int) for x in (*starts, *ends, *steps)) or len(starts) != 1 or steps[0] == 0:
        return _clear_data(node)
    _set(node, list(d[0][slice(starts[0], ends[0], steps[0])]))


def _elementwise(fn):
    def run(node, ins):
        ds = [data_of(v) for v in ins]
        if any(d is None for d in ds) or len(ds) < 2:
            return _clear_data(node)
        n = max(len(d[0]) for d in ds)
        if any(len(d[0]) not in (1, n) for d in ds):
            return _clear_data(node)
        cols = [d[0] if len(d[0]) == n else d[0] * n for d in ds]
        out = [fn(*xs) for xs in zip(*cols)]
        if any(x is _UNKNOWN for x in out):
            return _clear_data(node)
        _set(node, out, all(d[1] for d in ds))
    return run


_UNKNOWN = object()


def _num(fn):
    def f(*xs):
        if any(x is None or isinstance(x, bool) for x in xs):
            return _UNKNOWN
        r = fn(*xs)
        return _UNKNOWN if r is None else r
    return f


def _div(a, b):
    if isinstance(b, int) and b > 0 and (isinstance(a, int) and a >= 0 or not isinstance(a, int)):
        return S.floordiv(a, b)
    if isinstance(a, int) and isinstance(b, int) and b:
        return int(a / b)  # ONNX's integer Div truncates
    return S.exact_div(a, b)


def _equal(a, b):
    if a is None or b is None:
        return _UNKNOWN
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:
        return True
    # a symbolic size against a negative constant (the exporters' "== -1" tests) is never equal
    for x, y in ((a, b), (b, a)):
        if isinstance(y, int) and S.is_symbolic(x):
            low = S.SymExpr.of(x).least()
            if low is not None and y < low:
                return False
    return _UNKNOWN


def _d_where(node, ins):
    c, a, b = data_of(ins[0]), data_of(ins[1]), data_of(ins[2])
    if c is None or a is None or b is None or not all(isinstance(x, bool) for x in c[0]):
        return _clear_data(node)
    n = max(len(c[0]), len(a[0]), len(b[0]))
    if any(len(x[0]) not in (1, n) for x in (c, a, b)):
        return _clear_data(node)

    def at(x, i):
        return x[0][i] if len(x[0]) == n else x[0][0]

    _set(node, [at(a, i) if at(c, i) else at(b, i) for i in range(n)], c[1] and a[1] and b[1])


def _d_constant_of_shape(node, ins):
    d = _ints(ins[0])
    val = node.attrs.get("value")
    if d is None or len(d) != 1 or not isinstance(d[0], int) or d[0] > DATA_LIMIT:
        return _clear_data(node)
    v = np.asarray(val if val is not None else np.zeros(1, np.float32)).reshape(-1)
    if v.dtype.kind not in "iu" or v.size != 1:
        return _clear_data(node)
    _set(node, [int(v[0])] * d[0])


def _d_reduce_prod(node, ins):
    d = data_of(ins[0])
    if d is None or d[1] or int(node.attrs.get("keepdims", 1)):
        return _clear_data(node)
    _set(node, (S.prod(d[0]),), True)


def _d_constant(node, ins):
    val = node.attrs.get("value")
    if val is None:
        val = node.attrs.get("value_int", node.attrs.get("value_ints"))
    a = np.asarray(val) if val is not None else None
    if a is None or a.dtype.kind not in "iu" or a.ndim > 1 or a.size > DATA_LIMIT:
        return _clear_data(node)
    _set(node, [int(x) for x in a.reshape(-1)], a.ndim == 0)


_DATA = {
    "Constant": _d_constant, "Shape": _d_shape, "Size": _d_size, "Gather": _d_gather, "Unsqueeze": _d_unsqueeze, "Squeeze": _d_squeeze,
    "Concat": _d_concat, "Cast": _d_identity, "Identity": _d_identity, "Reshape": _d_reshape, "Slice": _d_slice,
    "Add": _elementwise(_num(S.add)), "Sub": _elementwise(_num(S.sub)), "Mul": _elementwise(_num(S.mul)),
    "Div": _elementwise(_num(_div)), "Max": _elementwise(_num(S.dmax)), "Min": _elementwise(_num(S.dmin)),
    "Equal": _elementwise(_equal), "Where": _d_where, "ConstantOfShape": _d_constant_of_shape,
    "ReduceProd": _d_reduce_prod,
}


# ------------------------------------------------------------------------------------------
# shape rules
# ------------------------------------------------------------------------------------------
def broadcast_dims(a: Any, b: Any) -> Any:
    """The dim a broadcast of ``a`` and ``b`` gives when it succeeds."""
    if a == 1:
        return b
    if b == 1:
        return a
    if a is None or b is None:
        return None
    if a == b:
        return a
    return S.dmax(a, b)


def broadcast_shapes(shapes: Sequence[tuple]) -> tuple | None:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        d: Any = 1
        for s in shapes:
            j = len(s) - rank + i
            if j >= 0:
                d = broadcast_dims(d, s[j])
        out.append(d)
    return tuple(out)


def _broadcast_type(node: Node) -> TensorType | None:
    shapes = [v.type.shape for v in node.inputs if v is not None]
    if not shapes or any(s is None for s in shapes):
        return None
    return TensorType(None, broadcast_shapes([s for s in shapes if s is not None]))


def _r_reshape(node):
    x = node.inputs[0].type
    target = _ints(node.inputs[1])
    if target is None:
        return None
    allowzero = int(node.attrs.get("allowzero", 0))
    dims: list = []
    infer_at = None
    for i, d in enumerate(target):
        if d == 0 and not allowzero and isinstance(d, int):
            dims.append(x.shape[i] if x.shape is not None and i < len(x.shape) else None)
        elif d == -1:
            infer_at = i
            dims.append(None)
        else:
            dims.append(d)
    if infer_at is not None and x.shape is not None and None not in x.shape:
        others = [d for i, d in enumerate(dims) if i != infer_at]
        if None not in others:
            dims[infer_at] = S.exact_div(S.prod(x.shape), S.prod(others))
    return [TensorType(None, tuple(dims))]


def _r_expand(node):
    x, shape = node.inputs[0].type, _ints(node.inputs[1])
    if x.shape is None or shape is None:
        return None
    return [TensorType(None, broadcast_shapes([x.shape, tuple(shape)]))]


def _r_constant_of_shape(node):
    shape = _ints(node.inputs[0])
    return None if shape is None else [TensorType(None, tuple(shape))]


def _r_tile(node):
    x, reps = node.inputs[0].type, _ints(node.inputs[1])
    if x.shape is None or reps is None or len(reps) != len(x.shape):
        return None
    return [TensorType(None, tuple(S.mul(d, r) for d, r in zip(x.shape, reps)))]


def _clamp_index(i: Any, d: Any, step: int) -> Any:
    """Slice's start/end ``i`` on a dim ``d``, resolved and clamped for a positive step."""
    if isinstance(i, int):
        if i >= HUGE:
            return d
        if i < 0:
            if i <= -HUGE:
                return 0
            return S.dmax(S.add(d, i), 0)
        return S.dmin(i, d)
    return S.dmin(i, d)  # a symbolic index is a size (>= 0)


def _r_slice(node):
    ins = node.inputs
    x = ins[0].type
    starts, ends = _ints(ins[1]), _ints(ins[2])
    if x.shape is None or starts is None or ends is None:
        return None
    r = len(x.shape)
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else tuple(range(len(starts)))
    steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else (1,) * len(starts)
    if axes is None or steps is None or not (len(axes) == len(starts) == len(ends) == len(steps)):
        return None
    dims = list(x.shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if not isinstance(a, int) or not isinstance(st, int) or st <= 0:
            return None
        a = a + r if a < 0 else a
        d = dims[a]
        if d is None:
            continue
        lo, hi = _clamp_index(s, d, st), _clamp_index(e, d, st)
        n = S.dmax(S.sub(hi, lo), 0)
        dims[a] = n if st == 1 else S.floordiv(S.add(n, st - 1), st)
    return [TensorType(None, tuple(dims))]


def _r_range(node):
    vals = [data_of(v) for v in node.inputs[:3]]
    if any(v is None or not v[1] for v in vals):
        return None
    start, limit, delta = (v[0][0] for v in vals)  # type: ignore[index]
    if not isinstance(delta, int) or delta <= 0:
        return None
    n = S.sub(limit, start)
    return [TensorType(None, (S.dmax(S.floordiv(S.add(n, delta - 1), delta), 0),))]


def _r_resize(node):
    ins = node.inputs
    x = ins[0].type
    if x.shape is None:
        return None
    sizes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    if sizes is not None and len(sizes) == len(x.shape):
        return [TensorType(None, tuple(sizes))]
    if len(ins) > 2 and ins[2] is not None and ins[2].const_value is not None:
        sc = ins[2].const_value.reshape(-1)
        if sc.size == len(x.shape) and all(float(v).is_integer() and v >= 1 for v in sc):
            return [TensorType(None, tuple(S.mul(d, int(v)) for d, v in zip(x.shape, sc)))]
    return None


def _r_concat(node):
    shapes = [v.type.shape for v in node.inputs if v is not None]
    if not shapes or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return None
    r = len(shapes[0])
    axis = int(node.attrs.get("axis", 0))
    axis = axis + r if axis < 0 else axis
    dims = []
    for i in range(r):
        if i == axis:
            total: Any = 0
            for s in shapes:
                total = S.add(total, s[i])
            dims.append(total)
        else:
            known = [s[i] for s in shapes if s[i] is not None]
            dims.append(known[0] if known else None)
    return [TensorType(None, tuple(dims))]


def _r_flatten(node):
    x = node.inputs[0].type
    if x.shape is None:
        return None
    axis = int(node.attrs.get("axis", 1))
    axis = axis + len(x.shape) if axis < 0 else axis
    return [TensorType(None, (S.prod(x.shape[:axis]), S.prod(x.shape[axis:])))]


def window_dim(d: Any, k: int, stride: int, dilation: int, pad: int, ceil: bool = False, same: bool = False,
               pad_begin: int = 0) -> Any:
    """The output size of a convolution or pooling window along one dim of size ``d``.

    With ``ceil`` (pooling's ``ceil_mode``), a last window that would start in the end padding
    is dropped, as onnxruntime does (and ONNX's own inference does not): its start
    ``(out - 1) * stride`` must be below ``d + pad_begin``.
    """
    if same:
        return S.floordiv(S.add(d, stride - 1), stride)
    span = S.sub(S.add(d, pad), dilation * (k - 1) + 1)
    if ceil:
        span = S.add(span, stride - 1)
        out = S.add(S.floordiv(span, stride), 1)
        return S.dmin(out, S.add(S.floordiv(S.add(d, pad_begin - 1), stride), 1))
    return S.add(S.floordiv(span, stride), 1)


def _r_window(node):
    x = node.inputs[0].type
    if x.shape is None or len(x.shape) < 3:
        return None
    nd = len(x.shape) - 2
    a = node.attrs
    if node.op_type == "Conv":
        w = node.inputs[1].type
        if w.shape is None:
            return None
        k = list(a.get("kernel_shape") or w.shape[2:])
        channels = w.shape[0]
    else:
        k = list(a.get("kernel_shape") or [])
        channels = x.shape[1]
    if len(k) != nd or not all(isinstance(v, int) for v in k):
        return None
    strides = list(a.get("strides") or [1] * nd)
    dil = list(a.get("dilations") or [1] * nd)
    pads = list(a.get("pads") or [0] * (2 * nd))
    auto = a.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    ceil = bool(a.get("ceil_mode", 0))
    dims = [x.shape[0], channels]
    for i in range(nd):
        if auto == "VALID":
            dims.append(window_dim(x.shape[2 + i], k[i], strides[i], dil[i], 0, ceil))
        else:
            dims.append(window_dim(x.shape[2 + i], k[i], strides[i], dil[i], pads[i] + pads[i + nd], ceil,
                                   same=auto in ("SAME_UPPER", "SAME_LOWER"), pad_begin=pads[i]))
    return [TensorType(None, tuple(dims))] + [TensorType(None, tuple(dims))] * (len(node.outputs) - 1)


_RULES = {
    "Reshape": _r_reshape, "Expand": _r_expand, "ConstantOfShape": _r_constant_of_shape, "Tile": _r_tile,
    "Slice": _r_slice, "Range": _r_range, "Resize": _r_resize, "Concat": _r_concat, "Flatten": _r_flatten,
    "Conv": _r_window, "MaxPool": _r_window, "AveragePool": _r_window, "LpPool": _r_window,
}
