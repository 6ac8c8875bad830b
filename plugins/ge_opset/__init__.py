"""ge_opset: the standard operator set (ONNX semantics) for GE.

Registers one :class:`ge_core.ops.OpDef` per op type of ONNX's default domain (arity, attribute
defaults, fusion kind, determinism, type and shape inference through ONNX's own per-node
inference) and the ``infer_shapes`` prepare pass. ONNX is imported lazily, inside the hooks.
"""

__all__ = ["plugin"]
