"""onnxruntime's attention ops (domain ``com.microsoft``) with their KV cache: GroupQueryAttention
(onnxruntime-genai's model builder writes one per decoder layer), MultiHeadAttention and Attention
(Optimum's and onnxruntime's transformer optimizer write them). Their type and shape inference is
here; the kernels are ``ge_cpu.contrib.attention``.

GroupQueryAttention's present cache is ``(B, kv_num_heads, max(total_sequence_length, past), D)``
as onnxruntime sizes it: with ``past_present_share_buffer`` the past buffer has the largest length
and the present is that buffer; else the present is the past plus the new rows."""

from __future__ import annotations

import numpy as np

from ge_core.errors import GraphError
from ge_core.ir import symbolic
from ge_core.ir.graph import Node, Value
from ge_core.ir.types import TensorType
from ge_core.ops import INFERRED_META, OpDef, OpKind

DOMAIN = "com.microsoft"


def _shape(v: Value | None) -> tuple | None:
    return None if v is None or v.type is None else v.type.shape


def _dtype(v: Value | None) -> np.dtype:
    return np.dtype(v.type.dtype) if v is not None and v.type is not None and v.type.dtype is not None \
        else np.dtype(np.float32)


def _heads(node: Node, name: str) -> int:
    try:
        n = int(node.attrs[name])
    except (KeyError, TypeError, ValueError):
        n = 0
    if n < 1:
        raise GraphError(f"node '{node.name}' ({DOMAIN}::{node.op_type}): attribute {name} (a positive integer) "
                         "is required", hint="the exporter wrote an incomplete node: export the model again")
    return n


def _scalar_dim(v: Value | None):
    """The value of scalar ``v`` as a dim: its constant, or its symbolic contents, else None."""
    if v is None:
        return None
    if v.const_value is not None and np.size(v.const_value) == 1:
        return int(np.asarray(v.const_value).reshape(-1)[0])
    data = v.meta.get(INFERRED_META)
    if isinstance(data, tuple) and len(data) == 2 and len(data[0]) == 1:
        return data[0][0]
    return None


def check_gqa(node: Node) -> None:
    """Validate a GroupQueryAttention's head counts (num_heads a multiple of kv_num_heads)."""
    n, kv = _heads(node, "num_heads"), _heads(node, "kv_num_heads")
    if n % kv:
        raise GraphError(f"node '{node.name}' ({DOMAIN}::GroupQueryAttention): num_heads {n} is not a multiple of "
                         f"kv_num_heads {kv}", hint="export the model again with matching head counts")


def _infer_gqa(node: Node, opset: int) -> list[TensorType]:
    n, kv = _heads(node, "num_heads"), _heads(node, "kv_num_heads")
    q = _shape(node.inputs[0])
    dt = _dtype(node.inputs[0])
    packed = len(node.inputs) < 2 or node.inputs[1] is None
    b = s = d = None
    if q is not None and len(q) == 3:
        b, s = q[0], q[1]
        d = symbolic.exact_div(q[2], n + 2 * kv) if packed else symbolic.exact_div(q[2], n)
    past = _shape(node.inputs[3]) if len(node.inputs) > 3 else None
    total = _scalar_dim(node.inputs[6]) if len(node.inputs) > 6 else None
    length = None
    if past is not None and len(past) == 4:
        d = d if d is not None else past[3]
        length = symbolic.dmax(total, past[2]) if total is not None else None
    elif total is not None:
        length = total
    elif s is not None:
        length = s
    out = TensorType(dt, (b, s, symbolic.mul(d, n) if d is not None else None))
    cache = TensorType(dt, (b, kv, length, d))
    return [out, cache, cache][:len(node.outputs)]


def _infer_mha(node: Node, opset: int) -> list[TensorType]:
    n = _heads(node, "num_heads")
    q, k, v = (_shape(node.inputs[i]) if len(node.inputs) > i else None for i in range(3))
    dt = _dtype(node.inputs[0])
    b = s = hv = d = None
    if q is not None and len(q) == 3:
        b, s, d = q[0], q[1], symbolic.exact_div(q[2], n)
        hv = q[2]
    elif q is not None and len(q) == 5:  # packed QKV (B, S, N, 3, D)
        b, s, d = q[0], q[1], q[4]
        hv = symbolic.mul(q[4], n)
    kv_len = None
    if k is not None and len(k) == 3:
        kv_len = k[1]
        if v is not None and len(v) == 3:
            hv = v[2]
    elif k is not None and len(k) == 4:  # BNSH (cross attention's cache)
        kv_len = k[2]
    elif k is not None and len(k) == 5:  # packed KV (B, L, N, 2, D)
        kv_len = k[1]
    elif k is None:
        kv_len = s
    dv = symbolic.exact_div(hv, n) if hv is not None else d
    past = _shape(node.inputs[6]) if len(node.inputs) > 6 else None
    total = symbolic.add(past[2], kv_len) if past is not None and len(past) == 4 else kv_len
    outs = [TensorType(dt, (b, s, hv)), TensorType(dt, (b, n, total, d)), TensorType(dt, (b, n, total, dv))]
    return outs[:len(node.outputs)]


def _infer_attention(node: Node, opset: int) -> list[TensorType]:
    n = _heads(node, "num_heads")
    x, w = _shape(node.inputs[0]), _shape(node.inputs[1])
    dt = _dtype(node.inputs[0])
    sizes = [int(v) for v in node.attrs.get("qkv_hidden_sizes", []) or []]
    b = s = hv = hk = None
    if x is not None and len(x) == 3:
        b, s = x[0], x[1]
    if len(sizes) == 3:
        hk, hv = sizes[0], sizes[2]
    elif w is not None and len(w) == 2 and isinstance(w[1], int):
        hk = hv = w[1] // 3
    past = _shape(node.inputs[4]) if len(node.inputs) > 4 else None
    total = symbolic.add(past[3], s) if past is not None and len(past) == 5 else s
    d = hk // n if isinstance(hk, int) else None
    return [TensorType(dt, (b, s, hv)), TensorType(dt, (2, b, n, total, d))][:len(node.outputs)]


OPDEFS = [
    OpDef("GroupQueryAttention", DOMAIN, min_inputs=7, max_inputs=17, max_outputs=3, kind=OpKind.OPAQUE,
          infer=_infer_gqa, check=check_gqa, alias="",
          attrs={"num_heads": None, "kv_num_heads": None, "scale": 0.0, "softcap": 0.0, "do_rotary": 0,
                 "rotary_interleaved": 0, "local_window_size": -1, "smooth_softmax": 0},
          doc="onnxruntime's grouped-query attention over a KV cache (BNSH past/present, seqlens_k = total - 1 "
              "per row, rotary from cos/sin caches, packed QKV, local window, softcap)"),
    OpDef("MultiHeadAttention", DOMAIN, min_inputs=1, max_inputs=10, max_outputs=3, kind=OpKind.OPAQUE,
          infer=_infer_mha, alias="",
          attrs={"num_heads": None, "scale": 0.0, "unidirectional": 0, "mask_filter_value": -10000.0},
          doc="onnxruntime's multi-head attention (separate, packed or BNSH K/V, bias, key padding mask, "
              "attention bias, past/present)"),
    OpDef("Attention", DOMAIN, min_inputs=2, max_inputs=7, max_outputs=2, kind=OpKind.OPAQUE,
          infer=_infer_attention, alias="",
          attrs={"num_heads": None, "scale": 0.0, "unidirectional": 0, "mask_filter_value": -10000.0,
                 "qkv_hidden_sizes": [], "past_present_share_buffer": 0},
          doc="onnxruntime's self-attention with the QKV projection (mask_index forms, past (2, B, N, P, D), "
              "unidirectional)"),
]
