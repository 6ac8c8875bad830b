"""Op definitions of the fused ops (domain ``ge.fused``) with their type and shape inference."""

from __future__ import annotations

from ge_core.ir.types import TensorType
from ge_core.ops import OpDef, OpKind
from ge_sdk.kit import broadcast_inputs, same_as_input

DOMAIN = "ge.fused"


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


def _attention_infer(node, opset):
    q, v = node.inputs[0].type, node.inputs[2].type
    if q.shape is None or v.shape is None:
        return [TensorType(q.dtype, None)]
    return [TensorType(q.dtype, tuple(q.shape[:-1]) + (v.shape[-1],))]


CONV_ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "pads": None,
              "strides": None}

OPDEFS = [
    OpDef("FusedConv", DOMAIN, min_inputs=2, kind=OpKind.OUT_ELEMWISE_FUSABLE, infer=_conv_infer,
          attrs={**CONV_ATTRS, "epilogue": ""},
          doc="Conv(X, W, B) followed by an elementwise epilogue program over extra inputs (residual, ...)"),
    OpDef("FusedMatMul", DOMAIN, min_inputs=2, kind=OpKind.OUT_ELEMWISE_FUSABLE, infer=_matmul_infer,
          attrs={"transA": 0, "transB": 0, "alpha": 1.0, "beta": 1.0, "epilogue": ""},
          doc="alpha * op(A) @ op(B) + beta * C, then an elementwise epilogue program over extra inputs"),
    OpDef("FusedElemwise", DOMAIN, min_inputs=1, kind=OpKind.BROADCAST, infer=broadcast_inputs(),
          attrs={"program": ""}, doc="a generated kernel for a group of elementwise/broadcast ops"),
    OpDef("Attention", DOMAIN, min_inputs=3, max_inputs=4, kind=OpKind.OPAQUE, infer=_attention_infer,
          attrs={"scale": 1.0}, doc="softmax(Q @ Kt * scale + mask) @ V"),
    OpDef("LayerNorm", DOMAIN, min_inputs=1, max_inputs=3, kind=OpKind.OPAQUE, infer=same_as_input(),
          attrs={"epsilon": 1e-5}, doc="layer normalisation over the last axis, then * gamma + beta"),
    OpDef("Softmax", DOMAIN, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE, infer=same_as_input(),
          attrs={"axis": -1}, doc="softmax along one axis"),
    OpDef("Gelu", DOMAIN, min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE, infer=same_as_input(),
          attrs={"approximate": "none"}, doc="x * Phi(x) (erf form, or the tanh approximation)"),
    OpDef("Silu", DOMAIN, min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE, infer=same_as_input(),
          doc="x * sigmoid(x)"),
]
