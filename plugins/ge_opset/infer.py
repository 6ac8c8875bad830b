"""Type and shape inference of standard ops through ONNX's own per-node inference.

Each call converts one IR node to a ``NodeProto`` (attributes to ``AttributeProto``), its
input types to ``TypeProto`` and its small constant inputs to ``TensorProto`` (so Reshape,
Expand, ConstantOfShape... get static shapes), runs the inference function of the schema
version the model's opset selects, and converts the result back to :class:`TensorType`.

Everything that can be cached is: schemas per (op, opset), attribute types per schema,
serialized input types per :class:`TensorType`, dtypes per ONNX element type.

Policy: when ONNX cannot tell (missing input types, an op it cannot infer, a conversion it
does not support) the result is ``None`` (unknown). A node's inputs are *complete* when every
input has a dtype and a shape whose every dim is known (a number or a named symbolic dim) and
every shape-like input (:data:`SHAPE_INPUTS`: Reshape's shape, Resize's sizes, Slice's starts...)
has a known value. When the inputs are incomplete, an error of ONNX's means "cannot tell yet":
the result is unknown and inference waits for folding (``fold_shapes`` / ``fold_constants``
turn a computed ``Shape -> Slice -> Concat`` into a constant; inference runs again then).
When the inputs are complete and ONNX still reports a type or shape error, the node is
genuinely inconsistent and :class:`ShapeInferenceError` names it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.errors import ShapeInferenceError
from ge_core.ir.graph import Graph, Node
from ge_core.ir.types import TensorType
from ge_sdk.onnx_types import dim_param, dtype_to_elem, elem_to_dtype, type_from_proto  # noqa: F401 - re-exported

#: Constant inputs up to this many elements are handed to ONNX as input data.
CONST_DATA_LIMIT = 1 << 16

#: Inputs whose *value* steers the output shape, by op type and the schema's input name
#: (names, not positions: Resize-10 has scales at 1, Resize-11 at 2). Every ``Reduce*`` op's
#: ``axes`` input is one too. A computed (non-constant) value here makes inference incomplete.
SHAPE_INPUTS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "Reshape": ("shape",), "Expand": ("shape",), "Tile": ("repeats", "tiles", "axis"),
    "Pad": ("pads", "axes"), "Slice": ("starts", "ends", "axes", "steps"), "ConstantOfShape": ("input",),
    "Range": ("start", "limit", "delta"), "TopK": ("K",), "Upsample": ("scales",),
    "Resize": ("roi", "scales", "sizes"), "OneHot": ("depth",), "Squeeze": ("axes",), "Unsqueeze": ("axes",),
    "Split": ("split",), "SplitToSequence": ("split",), "CenterCropPad": ("shape",),
    "Col2Im": ("image_shape", "block_shape"), "DFT": ("dft_length", "axis"), "STFT": ("frame_step", "frame_length"),
    "AffineGrid": ("size",), "MaxUnpool": ("output_shape",), "HannWindow": ("size",), "HammingWindow": ("size",),
    "BlackmanWindow": ("size",), "MelWeightMatrix": ("num_mel_bins", "dft_length"),
}.items()}

_lock = threading.Lock()
_schema_cache: dict[tuple[str, str, int], Any] = {}
_attr_type_cache: dict[int, dict[str, int]] = {}
_shape_input_cache: dict[int, frozenset[int]] = {}


class _Skip(Exception):
    """The node cannot be handed to ONNX (subgraph attributes, odd values): result unknown."""


# ------------------------------------------------------------------------------------------
# schemas
# ------------------------------------------------------------------------------------------
def schema_for(op_type: str, opset: int, domain: str = ""):
    """The schema version that opset ``opset`` selects (cached).

    ``opset <= 0`` means "newest". When the op did not exist yet at ``opset`` (a pass created
    a newer op in an old model) the oldest schema is used rather than failing.
    """
    key = (domain, op_type, opset)
    s = _schema_cache.get(key, _schema_cache)
    if s is not _schema_cache:
        return s
    import onnx.defs

    try:
        if opset > 0:
            s = onnx.defs.get_schema(op_type, opset, domain)
        else:
            s = onnx.defs.get_schema(op_type, domain=domain)
    except Exception:
        try:
            s = onnx.defs.get_schema(op_type, 2**31 - 1, domain)
            history = [
                x for x in onnx.defs.get_all_schemas_with_history() if x.name == op_type and x.domain == domain
            ]
            if history:
                s = min(history, key=lambda x: x.since_version)
        except Exception:
            s = None
    with _lock:
        _schema_cache[key] = s
    return s


def _attr_types(schema) -> dict[str, int]:
    key = id(schema)
    t = _attr_type_cache.get(key)
    if t is None:
        t = {}
        for name, a in schema.attributes.items():
            try:
                t[name] = int(a.type.value)
            except Exception:
                pass
        _attr_type_cache[key] = t
    return t


def shape_input_positions(op_type: str, schema) -> frozenset[int]:
    """Positions of ``schema``'s shape-like inputs (see :data:`SHAPE_INPUTS`), cached per schema."""
    key = id(schema)
    pos = _shape_input_cache.get(key)
    if pos is None:
        names = SHAPE_INPUTS.get(op_type) or (frozenset(("axes",)) if op_type.startswith("Reduce") else frozenset())
        try:
            pos = frozenset(i for i, p in enumerate(schema.inputs) if p.name in names)
        except Exception:
            pos = frozenset()
        _shape_input_cache[key] = pos
    return pos


# ------------------------------------------------------------------------------------------
# conversions
# ------------------------------------------------------------------------------------------
@functools.cache
@functools.lru_cache(maxsize=65536)
def _type_bytes(t: TensorType) -> bytes:
    from onnx import TypeProto

    tp = TypeProto()
    tt = tp.tensor_type
    tt.elem_type = dtype_to_elem(t.dtype)
    if t.shape is not None:
        shape = tt.shape
        shape.SetInParent()
        for d in t.shape:
            dim = shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif d is not None:
                dim.dim_param = dim_param(d)  # a name, or an expression's token
    return tp.SerializeToString()


def _attr_proto(name: str, value: Any, attr_type: int | None):
    from onnx import AttributeProto, helper, numpy_helper

    if isinstance(value, Graph) or (
        isinstance(value, (list, tuple)) and value and any(isinstance(x, Graph) for x in value)
    ):
        raise _Skip
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (list, tuple)):
        if not value:
            a = AttributeProto(name=name)
            a.type = attr_type if attr_type else AttributeProto.INTS  # type: ignore[assignment]
            return a
        if all(isinstance(x, np.ndarray) for x in value):
            return helper.make_attribute(name, [numpy_helper.from_array(x) for x in value])
        value = [x.item() if isinstance(x, np.generic) else x for x in value]
    elif isinstance(value, np.generic):
        value = value.item()
    if attr_type in (AttributeProto.FLOAT, AttributeProto.INT, AttributeProto.STRING,
                     AttributeProto.FLOATS, AttributeProto.INTS, AttributeProto.STRINGS):
        try:
            if attr_type == AttributeProto.FLOAT:
                value = float(value)
            elif attr_type == AttributeProto.INT:
                value = int(value)
            elif attr_type == AttributeProto.FLOATS:
                value = [float(x) for x in value]
            elif attr_type == AttributeProto.INTS:
                value = [int(x) for x in value]
            return helper.make_attribute(name, value, attr_type=attr_type)
        except (TypeError, ValueError):
            pass
    return helper.make_attribute(name, value)


def _node_proto(node: Node, schema) -> bytes:
    from onnx import NodeProto

    proto = NodeProto()
    proto.op_type = node.op_type
    proto.domain = node.domain
    proto.name = node.name
    proto.input.extend("" if v is None else v.name for v in node.inputs)
    proto.output.extend(v.name for v in node.outputs)
    types = _attr_types(schema)
    for k, v in node.attrs.items():
        if v is None or k.startswith("_"):
            continue
        proto.attribute.append(_attr_proto(k, v, types.get(k)))
    return proto.SerializeToString()


def _const_bytes(arr: np.ndarray) -> bytes | None:
    if arr.size > CONST_DATA_LIMIT or arr.dtype == np.dtype(object):
        return None
    from onnx import numpy_helper

    try:
        return numpy_helper.from_array(arr).SerializeToString()
    except Exception:
        return None


# ------------------------------------------------------------------------------------------
# the inference function
# ------------------------------------------------------------------------------------------
def _is_inference_error(e: BaseException) -> bool:
    name = type(e).__name__
    return name in ("InferenceError", "ValidationError")


_NOT_GENUINE = ("unknown", "null", "expected to have", "not supported", "unsupported",
                "requires", "has no", "not implemented", "mismatch in number", "attribute")


def _join(a: TensorType, b: TensorType) -> TensorType:
    """What both branch types agree on."""
    dtype = a.dtype if a.dtype == b.dtype else None
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorType(dtype, None)
    return TensorType(dtype, tuple(x if x == y else None for x, y in zip(a.shape, b.shape)))


def _infer_if(node: Node) -> Sequence[TensorType | None] | None:
    """If: the outputs are what the then and else branches' outputs agree on."""
    then_g, else_g = node.attrs.get("then_branch"), node.attrs.get("else_branch")
    if not isinstance(then_g, Graph) or not isinstance(else_g, Graph):
        return None
    if len(then_g.outputs) != len(node.outputs) or len(else_g.outputs) != len(node.outputs):
        return None
    return [_join(a.type, b.type) for a, b in zip(then_g.outputs, else_g.outputs)]


def onnx_infer(node: Node, opset: int) -> Sequence[TensorType | None] | None:
    """Output types of ``node`` by ONNX's inference for the schema version of ``opset``."""
    if node.op_type == "If" and not node.domain:
        return _infer_if(node)
    if any(isinstance(a, Graph) or (isinstance(a, list) and a and isinstance(a[0], Graph))
           for a in node.attrs.values()):
        return None  # other control flow: bodies are inferred on their own by infer_graph
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    schema = schema_for(node.op_type, opset, domain)
    if schema is None:
        return None
    try:
        node_bytes = _node_proto(node, schema)
    except _Skip:
        return None
    except Exception:
        return None
    types: dict[str, bytes] = {}
    data: dict[str, bytes] = {}
    shape_like = shape_input_positions(node.op_type, schema) if not domain else frozenset()
    complete = True  # every input type fully known, every shape-like input's value known
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        t = v.type
        if t.dtype is None or t.shape is None or None in t.shape:
            complete = False
        if v.const_value is not None and v.name not in data:
            b = _const_bytes(v.const_value)
            if b is not None:
                data[v.name] = b
        if i in shape_like and v.name not in data:
            complete = False  # computed: its value is known only once folding made it a constant
        if t.dtype is None:
            continue  # ONNX rejects a tensor type without element type
        if v.name not in types:
            types[v.name] = _type_bytes(t)
    try:
        out = schema._infer_node_outputs(node_bytes, types, data, {}, {domain: opset if opset > 0 else schema.since_version}, _ir_version())
    except Exception as e:
        if _is_inference_error(e) and complete:
            msg = str(e)
            low = msg.lower()
            if not any(w in low for w in _NOT_GENUINE):
                raise ShapeInferenceError(
                    f"{node.describe()} is inconsistent: {msg.strip()} (inputs: "
                    + ", ".join("-" if v is None else f"'{v.name}' {v.type}" for v in node.inputs)
                    + ")",
                    hint="fix the model, or the pass that produced this node",
                ) from None
        return None
    if not out:
        return None
    from onnx import TypeProto

    result: list[TensorType | None] = []
    for v in node.outputs:
        b = out.get(v.name)
        result.append(type_from_proto(TypeProto.FromString(b)) if b is not None else None)
    return result


@functools.lru_cache(maxsize=1)
def _ir_version() -> int:
    import onnx

    return int(onnx.IR_VERSION)
