"""The contrib norms, activations, rotary and embedding ops, as onnxruntime defines them (its
ContribOperators.md and CPU kernels): SkipLayerNormalization, SkipSimplifiedLayerNormalization,
RotaryEmbedding, FastGelu, BiasGelu, QuickGelu, Gelu, BiasAdd and EmbedLayerNormalization in
``com.microsoft``; SimplifiedLayerNormalization, which onnxruntime registers in the ONNX domain
(onnxruntime-genai's builder writes it there). Each with the type and shape of every output,
the optional ones included (the norms' ``mean`` and ``inv_std_var`` stash outputs are float32,
onnxruntime's ``U`` under ``stash_type`` 1). Their kernels are ``ge_cpu.contrib.norms``'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.errors import GraphError
from ge_core.ir.graph import Node, Value
from ge_core.ir.types import TensorType
from ge_core.ops import OpDef, OpKind

DOMAIN = "com.microsoft"

_F32 = np.dtype(np.float32)


def _type(v: Value | None) -> TensorType | None:
    return None if v is None else v.type


def _dtype(v: Value | None) -> np.dtype | None:
    t = _type(v)
    return None if t is None else t.dtype


def _shape(v: Value | None) -> tuple | None:
    t = _type(v)
    return None if t is None else t.shape


def _input(node: Node, i: int) -> Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _stats(shape: tuple | None, axis: int) -> tuple | None:
    """The shape of a norm's mean / inv_std_var: the dims before ``axis``, then 1s."""
    if shape is None:
        return None
    ax = axis + len(shape) if axis < 0 else axis
    return tuple(d if i < ax else 1 for i, d in enumerate(shape))


def _infer_simplified(node: Node, opset: int) -> list[TensorType]:
    x = _input(node, 0)
    axis = int(node.attrs.get("axis", -1))
    return [TensorType(_dtype(x), _shape(x)), TensorType(_F32, _stats(_shape(x), axis))][:len(node.outputs)]


def _infer_skip(node: Node, opset: int) -> list[TensorType]:
    """output, mean, inv_std_var, input_skip_bias_sum"""
    x = _input(node, 0)
    stats = _stats(_shape(x), -1)
    same = TensorType(_dtype(x), _shape(x))
    return [same, TensorType(_F32, stats), TensorType(_F32, stats), same][:len(node.outputs)]


def _infer_same(node: Node, opset: int) -> list[TensorType]:
    x = _input(node, 0)
    return [TensorType(_dtype(x), _shape(x))]


def _infer_embed(node: Node, opset: int) -> list[TensorType]:
    """output (B, S, hidden), mask_index (B,) int32, embedding_sum (B, S, hidden)"""
    ids, word = _shape(_input(node, 0)), _shape(_input(node, 2))
    dt = _dtype(_input(node, 2))
    hidden = word[1] if word is not None and len(word) == 2 else None
    out = (ids[0], ids[1], hidden) if ids is not None and len(ids) == 2 else None
    mask = (ids[0],) if ids is not None and len(ids) == 2 else None
    return [TensorType(dt, out), TensorType(np.dtype(np.int32), mask), TensorType(dt, out)][:len(node.outputs)]


def _check_attrs(**valid: Callable[[Any], bool]) -> Callable[[Node], None]:
    """A check that the node's attributes named in ``valid`` pass their test, naming the node."""
    def check(node: Node) -> None:
        for name, ok in valid.items():
            v = node.attrs.get(name)
            if v is not None and not ok(v):
                raise GraphError(f"{node.describe()}: attribute {name}={v!r} is out of range",
                                 hint="check the exporter's attributes (onnxruntime's ContribOperators.md)")
    return check


def _nonneg(v: Any) -> bool:
    return float(v) >= 0


def _bit(v: Any) -> bool:
    return int(v) in (0, 1)


def _def(op: str, domain: str, ins: tuple[int, int], outs: tuple[int, int], infer: Any, attrs: dict[str, Any],
         doc: str, kind: OpKind = OpKind.OPAQUE, check: Callable[[Node], None] | None = None) -> OpDef:
    return OpDef(op, domain, min_inputs=ins[0], max_inputs=ins[1], min_outputs=outs[0], max_outputs=outs[1],
                 kind=kind, infer=infer, attrs=attrs, doc=doc, check=check, alias="")


_EPS = _check_attrs(epsilon=_nonneg)

OPDEFS: Sequence[OpDef] = [
    _def("SimplifiedLayerNormalization", "", (2, 2), (1, 2), _infer_simplified,
         {"axis": -1, "epsilon": 1e-5, "stash_type": 1},
         "onnxruntime's RMSNorm (registered in the ONNX domain): Y = X / sqrt(mean(X^2 over axis..) + epsilon) * "
         "scale; inv_std_var (float32, dims before axis then 1s)", check=_EPS),
    _def("SkipLayerNormalization", DOMAIN, (3, 5), (1, 4), _infer_skip, {"epsilon": 1e-12},
         "s = input + skip (broadcast over leading rows) + bias; output = LayerNorm(s) * gamma + beta over the last "
         "axis; optional mean, inv_std_var (float32) and input_skip_bias_sum (s)", check=_EPS),
    _def("SkipSimplifiedLayerNormalization", DOMAIN, (3, 4), (1, 4), _infer_skip, {"epsilon": 1e-12},
         "s = input + skip + bias; output = s / sqrt(mean(s^2) + epsilon) * gamma; optional mean, inv_std_var and "
         "input_skip_bias_sum (s)", check=_EPS),
    _def("RotaryEmbedding", DOMAIN, (4, 4), (1, 1), _infer_same,
         {"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": 0, "scale": 1.0, "is_packed_batching": 0},
         "rotary position embedding of (batch, seq, hidden) or (batch, heads, seq, head) input: the first "
         "rotary_embedding_dim elements of each head rotated by the cos/sin cache rows of its position "
         "(position_ids: one offset, or (batch, seq))",
         check=_check_attrs(interleaved=_bit, is_packed_batching=_bit, rotary_embedding_dim=_nonneg,
                            num_heads=_nonneg)),
    _def("FastGelu", DOMAIN, (1, 2), (1, 1), _infer_same, {},
         "GELU's tanh approximation of X + bias (bias optional, along the last axis)", OpKind.BROADCAST),
    _def("BiasGelu", DOMAIN, (2, 2), (1, 1), _infer_same, {}, "GELU (erf) of A + B (B along the last axis)",
         OpKind.BROADCAST),
    _def("Gelu", DOMAIN, (1, 1), (1, 1), _infer_same, {}, "GELU (erf): 0.5 X (1 + erf(X / sqrt 2))", OpKind.ELEMWISE),
    _def("QuickGelu", DOMAIN, (1, 1), (1, 1), _infer_same, {"alpha": 1.702}, "X * sigmoid(alpha X)",
         OpKind.ELEMWISE),
    _def("BiasAdd", DOMAIN, (3, 3), (1, 1), _infer_same, {}, "X + bias (along the last axis) + skip",
         OpKind.BROADCAST),
    _def("EmbedLayerNormalization", DOMAIN, (7, 9), (1, 3), _infer_embed, {"epsilon": 1e-12, "mask_index_type": 1},
         "word_embedding[input_ids] + position_embedding[position_ids or s] (+ segment_embedding[segment_ids]), "
         "LayerNorm over hidden with gamma and beta; mask_index (int32: the mask's 1s per batch row); "
         "embedding_sum (the sum before the norm)", check=_EPS),
]
