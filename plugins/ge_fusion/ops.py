"""Op definitions of the fused ops (domain ``ge.fused``) with their type and shape inference.

Their names, shared attributes and program format are :mod:`ge_sdk.fused`'s (the cpu backend's
kernels read the same); the kernels live with the backend (``ge_cpu.fused``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import GraphError
from ge_core.ir.types import TensorType
from ge_core.ops import OpDef, OpKind
from ge_sdk import fused
from ge_sdk.fused import ATTENTION_PERMS, CONV_ATTRS, DOMAIN, attention_perm
from ge_sdk.kit import broadcast_inputs, same_as_input

__all__ = ["ATTENTION_PERMS", "CONV_ATTRS", "DOMAIN", "OPDEFS", "attention_perm", "check_node"]


def _conv_infer(node, opset):
    x, w = node.inputs[0].type, node.inputs[1].type
    if x.shape is None or w.shape is None:
        return [TensorType(x.dtype, None)]
    nd = len(x.shape) - 2
    a = node.attrs
    k = list(a.get("kernel_shape") or w.shape[2:])
    strides = list(a.get("strides") or [1] * nd)
    dil = list(a.get("dilations") or [1] * nd)
    pads = list(a.get("pads") or [0] * (2 * nd))
    auto = a.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    dims: list = [x.shape[0], w.shape[0]]
    for i in range(nd):
        d = x.shape[2 + i]
        if not isinstance(d, int) or not isinstance(k[i], int):
            dims.append(None)
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            dims.append(-(-d // strides[i]))
        elif auto == "VALID":
            dims.append((d - dil[i] * (k[i] - 1) - 1) // strides[i] + 1)
        else:
            dims.append((d + pads[i] + pads[i + nd] - dil[i] * (k[i] - 1) - 1) // strides[i] + 1)
    return [TensorType(x.dtype, tuple(dims))]


def _matmul_infer(node, opset):
    a, b = node.inputs[0].type, node.inputs[1].type
    if a.shape is None or b.shape is None or len(a.shape) < 2 or len(b.shape) < 2:
        return [TensorType(a.dtype, None)]
    sa, sb = list(a.shape), list(b.shape)
    if node.attrs.get("transA", 0):
        sa[-2], sa[-1] = sa[-1], sa[-2]
    if node.attrs.get("transB", 0):
        sb[-2], sb[-1] = sb[-1], sb[-2]
    ba, bb = sa[:-2], sb[:-2]
    rank = max(len(ba), len(bb))
    ba, bb = [1] * (rank - len(ba)) + ba, [1] * (rank - len(bb)) + bb
    batch = [y if x == 1 else x for x, y in zip(ba, bb)]
    return [TensorType(a.dtype, tuple(batch) + (sa[-2], sb[-1]))]


def _permuted(shape, perm):
    return shape if shape is None or perm is None else tuple(shape[i] for i in perm)


def _attention_infer(node, opset):
    q, v = node.inputs[0].type, node.inputs[2].type
    if q.shape is None or v.shape is None:
        return [TensorType(q.dtype, None)]
    qs = _permuted(q.shape, attention_perm(node, "perm_q", len(q.shape)))
    vs = _permuted(v.shape, attention_perm(node, "perm_v", len(v.shape)))
    out = tuple(qs[:-1]) + (vs[-1],)
    return [TensorType(q.dtype, _permuted(out, attention_perm(node, "perm_out", len(out))))]


# ------------------------------------------------------------------------------------------------
# attribute checks: a fused node's attributes steer generated code (its program / epilogue) and
# the kernels' arithmetic, so an .om's are validated at load (OpRegistry.check_node) against
# these types; attributes outside them are not read by any kernel
# ------------------------------------------------------------------------------------------------
def _bad(node, what: str) -> GraphError:
    return GraphError(f"{node.describe()}: {what}", hint="re-create the model with `ge compile`")


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _is_int(v) -> bool:
    return type(v) is int or isinstance(v, np.integer)


def _is_num(v) -> bool:
    return (type(v) in (int, float) or isinstance(v, (np.integer, np.floating))) and not isinstance(v, bool)


#: attribute -> (test, what it must be) for the scalar attributes of each fused op
_INT = (_is_int, "an int")
_NUM = (_is_num, "a number")
_FLAG = (lambda v: _is_int(v) and int(v) in (0, 1), "0 or 1")
_INTS = (lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) <= 64 and all(_is_int(x) for x in v)),
         "a list of ints")
_AUTO_PAD = (lambda v: _text(v) in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"), "NOTSET, SAME_UPPER, SAME_LOWER or VALID")
_APPROX = (lambda v: _text(v) in ("none", "tanh"), "none or tanh")
_CONV_TYPES = {"auto_pad": _AUTO_PAD, "group": _INT, "dilations": _INTS, "kernel_shape": _INTS, "pads": _INTS,
               "strides": _INTS}
_TYPES = {
    "FusedConv": _CONV_TYPES,
    "FusedMatMul": {"transA": _FLAG, "transB": _FLAG, "alpha": _NUM, "beta": _NUM},
    "Attention": {"scale": _NUM, "perm_q": _INTS, "perm_kt": _INTS, "perm_v": _INTS, "perm_out": _INTS,
                  "compute_dtype": (lambda v: _text(v) in fused.ATTENTION_COMPUTE, '"" or "bfloat16"')},
    "LayerNorm": {"epsilon": _NUM},
    "RMSNorm": {"epsilon": _NUM},
    "Softmax": {"axis": _INT},
    "Gelu": {"approximate": _APPROX},
}


def _check_program(node, attr: str, n_inputs: int, anchor: bool, required: bool) -> None:
    text = _text(node.attrs.get(attr, ""))
    if text is None or text == "":
        if required:
            raise _bad(node, f"has no {attr} program")
        return
    try:
        fused.loads(text, n_inputs=n_inputs, anchor=anchor)
    except ValueError as e:
        raise _bad(node, f"bad {attr}: {e}") from None


def check_node(node) -> None:
    """Validate a fused node's attributes (raises GraphError naming the node)."""
    for name, (ok, what) in _TYPES.get(node.op_type, {}).items():
        if name in node.attrs and not ok(node.attrs[name]):
            raise _bad(node, f"attribute {name} must be {what}")
    if node.op_type == "Softmax" and "axis" in node.attrs and node.inputs and node.inputs[0] is not None:
        rank = node.inputs[0].type.rank
        if rank is not None and not -max(rank, 1) <= int(node.attrs["axis"]) < max(rank, 1):
            raise _bad(node, f"axis {node.attrs['axis']} is out of range for rank {rank}")
    if node.op_type == "Attention":
        for name, i in (*zip(ATTENTION_PERMS, range(3)), ("perm_out", 0)):
            x = node.inputs[i] if i < len(node.inputs) else None
            try:
                attention_perm(node, name, x.type.rank if x is not None else None)
            except ValueError as e:
                raise _bad(node, str(e)) from None
        for name in fused.ATTENTION_QUANTS:
            try:
                fused.attention_quant(node, name)
            except ValueError as e:
                raise _bad(node, str(e)) from None
    if node.op_type == "FusedElemwise":
        _check_program(node, "program", len(node.inputs), anchor=False, required=True)
    elif node.op_type in ("FusedConv", "FusedMatMul"):
        _check_program(node, "epilogue", max(0, len(node.inputs) - 3), anchor=True, required=False)
    if node.op_type == "FusedConv":
        _check_conv_weight(node)


def _check_conv_weight(node) -> None:
    """A FusedConv's kernel_shape and group against its weight (M, C/group, K...) and input: the
    kernel runs the weight's window, the node's output type comes from the attributes."""
    x = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
    w = node.inputs[1].type if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if w is None or w.shape is None or not all(isinstance(d, int) for d in w.shape):
        return
    ws = tuple(w.shape)
    if len(ws) < 3:
        raise _bad(node, f"the weight must be (M, C/group, K...), it is {list(ws)}")
    k = node.attrs.get("kernel_shape")
    if k is not None and tuple(int(v) for v in k) != ws[2:]:
        raise _bad(node, f"attribute kernel_shape {list(k)} contradicts the weight's shape {list(ws)}")
    group = int(node.attrs.get("group", 1))
    if group < 1 or ws[0] % group:
        raise _bad(node, f"attribute group {group} does not divide the {ws[0]} output channels of the weight {list(ws)}")
    if x is not None and x.shape is not None and len(x.shape) == len(ws) and isinstance(x.shape[1], int) \
            and x.shape[1] != ws[1] * group:
        raise _bad(node, f"attribute group {group} and the input's {x.shape[1]} channels contradict the weight's "
                         f"shape {list(ws)}")


#: every op of this plugin is made by the compiler only, and has its attributes checked
_FUSED: dict[str, Any] = {"internal": True, "check": check_node}

OPDEFS = [
    OpDef(fused.FUSED_CONV, DOMAIN, **_FUSED, min_inputs=2, kind=OpKind.OUT_ELEMWISE_FUSABLE, infer=_conv_infer,
          attrs={**CONV_ATTRS, "epilogue": ""},
          doc="Conv(X, W, B) followed by an elementwise epilogue program over extra inputs (residual, ...)"),
    OpDef(fused.FUSED_MATMUL, DOMAIN, **_FUSED, min_inputs=2, kind=OpKind.OUT_ELEMWISE_FUSABLE, infer=_matmul_infer,
          attrs={"transA": 0, "transB": 0, "alpha": 1.0, "beta": 1.0, "epilogue": ""},
          doc="alpha * op(A) @ op(B) + beta * C, then an elementwise epilogue program over extra inputs"),
    OpDef(fused.FUSED_ELEMWISE, DOMAIN, **_FUSED, min_inputs=1, kind=OpKind.BROADCAST, infer=broadcast_inputs(),
          attrs={"program": ""}, doc="a generated kernel for a group of elementwise/broadcast ops"),
    OpDef(fused.ATTENTION, DOMAIN, **_FUSED, min_inputs=3, max_inputs=4, kind=OpKind.OPAQUE, infer=_attention_infer,
          attrs={"scale": 1.0, "perm_q": None, "perm_kt": None, "perm_v": None, "perm_out": None, "compute_dtype": "",
                 **dict.fromkeys(fused.ATTENTION_QUANTS)},
          doc="softmax(Q @ Kt * scale + mask) @ V; perm_q/perm_kt/perm_v: the transposes of inputs 0-2 that are "
              "Q, Kt, V, perm_out: the transpose of the result that is the output (absent: none); compute_dtype "
              "bfloat16: both products in bf16 with float32 sums (a precision mode's); scores_quant, scaled_quant, "
              "masked_quant, probs_quant, out_quant: [scale, lo, hi] fake-quants of a quantised model at those "
              "points (absent: none)"),
    OpDef(fused.LAYER_NORM, DOMAIN, **_FUSED, min_inputs=1, max_inputs=3, kind=OpKind.OPAQUE, infer=same_as_input(),
          attrs={"epsilon": 1e-5}, doc="layer normalisation over the last axis, then * gamma + beta"),
    OpDef(fused.RMS_NORM, DOMAIN, **_FUSED, min_inputs=1, max_inputs=2, kind=OpKind.OPAQUE, infer=same_as_input(),
          attrs={"epsilon": 1e-6}, doc="x / sqrt(mean(x^2 over the last axis) + epsilon), then * gamma (T5, LLaMA)"),
    OpDef(fused.SOFTMAX, DOMAIN, **_FUSED, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE, infer=same_as_input(),
          attrs={"axis": -1}, doc="softmax along one axis"),
    OpDef(fused.GELU, DOMAIN, **_FUSED, min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE, infer=same_as_input(),
          attrs={"approximate": "none"}, doc="x * Phi(x) (erf form, or the tanh approximation)"),
    OpDef(fused.SILU, DOMAIN, **_FUSED, min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE, infer=same_as_input(),
          doc="x * sigmoid(x)"),
    OpDef(fused.ROTARY, DOMAIN, **_FUSED, min_inputs=3, max_inputs=3, kind=OpKind.OPAQUE, infer=same_as_input(),
          doc="rotary position embedding, non-interleaved over the whole last axis (LLaMA's, GPT-NeoX's): "
              "X * Cos + rotate_half(X) * Sin, rotate_half(X) = concat(-X[..., d/2:], X[..., :d/2])"),
]
