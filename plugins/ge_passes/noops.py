"""No-op elimination: nodes whose output is their input (by type and value)."""

from __future__ import annotations

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk.rewrite import Rewriter, RulePass

from ._util import const, int_list, opset_of, shape_elements, shapes_match, splat, static_shape


def _forward(node: Node, rw: Rewriter, src: Value | None = None) -> bool:
    """Replace the node's first output by ``src`` (its first input by default)."""
    src = node.inputs[0] if src is None else src
    if src is None:
        return False
    return rw.replace_node(node, [src] + [None] * (len(node.outputs) - 1))


def identity(node: Node, rw: Rewriter) -> bool:
    return _forward(node, rw)


def dropout(node: Node, rw: Rewriter) -> bool:
    """Dropout at inference (training_mode absent or false) is the identity; its mask all true."""
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        tm = const(node.inputs[2])
        if tm is None or bool(np.asarray(tm).reshape(-1)[0]):
            return False
    x = node.inputs[0]
    if x is None:
        return False
    values: list[Value | None] = [x]
    if len(node.outputs) > 1:
        mask = node.outputs[1]
        if mask.has_uses() or mask.is_graph_output:
            s = static_shape(x.type)
            if s is None or mask.type.dtype != np.dtype(bool):
                return False
            values.append(rw.constant(splat(True, s, bool), like=mask))
        else:
            values.append(None)
    if rw.replace_node(node, values):
        return True
    for v in values[1:]:  # not replaced (the mask is a graph output): leave no unused constant behind
        if v is not None and v.is_constant and not v.has_uses() and v.graph is not None:
            v.graph.remove_constant(v)
    return False


def cast(node: Node, rw: Rewriter) -> bool:
    """Cast (or CastLike) to the type the input already has."""
    x = node.inputs[0]
    if x is None or x.type.dtype is None or node.output.type.dtype != x.type.dtype:
        return False
    return _forward(node, rw)


def same_type(node: Node, rw: Rewriter) -> bool:
    """Reshape/Expand/Squeeze/Unsqueeze/Flatten/Tile/Split whose output type is its input type."""
    x = node.inputs[0]
    if x is None or len(node.outputs) != 1 or not shapes_match(x.type, node.output.type):
        return False
    return _forward(node, rw)


def reshape(node: Node, rw: Rewriter) -> bool:
    """Reshape to the input's own shape, also where some dims are unknown (0 or -1 copies them)."""
    if same_type(node, rw):
        return True
    x = node.inputs[0]
    target = shape_elements(node.inputs[1]) if len(node.inputs) > 1 else None
    if x is None or target is None or x.type.shape is None or len(target) != len(x.type.shape):
        return False
    allowzero = int(node.attrs.get("allowzero", 0))
    unknown = 0
    for i, (t, d) in enumerate(zip(target, x.type.shape)):
        if t == 0 and not allowzero:
            continue
        if isinstance(d, int) and t == d:
            continue
        if t == ("sym", d) or (isinstance(t, tuple) and t[0] == "dim" and t[1] is x and t[2] == i):
            continue
        if t == -1:
            unknown += 1
            continue
        return False
    if unknown > 1:
        return False
    if node.output.type.dtype is not None and node.output.type.dtype != x.type.dtype:
        return False
    return _forward(node, rw)


def slice_(node: Node, rw: Rewriter) -> bool:
    """Slice with unit steps whose output has the input's shape takes everything."""
    steps = int_list(const(node.inputs[4])) if len(node.inputs) > 4 and node.inputs[4] is not None else []
    if steps is None or any(s != 1 for s in steps):
        return False
    return same_type(node, rw)


def transpose(node: Node, rw: Rewriter) -> bool:
    """Transpose by the identity permutation."""
    x = node.inputs[0]
    perm = node.attrs.get("perm")
    if perm is None:
        if x is None or x.type.rank is None or x.type.rank > 1:
            return False
    elif list(perm) != list(range(len(perm))):
        return False
    return _forward(node, rw)


def pad(node: Node, rw: Rewriter) -> bool:
    """Pad by zero everywhere (any mode)."""
    pads: list[int] | None
    if opset_of(node) < 11 or "pads" in node.attrs:
        pads = [int(p) for p in node.attrs.get("pads", [])]
    else:
        pads = int_list(const(node.inputs[1])) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if pads is None or any(p != 0 for p in pads):
        return False
    x = node.inputs[0]
    if x is None or (node.output.type.dtype is not None and x.type.dtype != node.output.type.dtype):
        return False
    return _forward(node, rw)


def single_input(node: Node, rw: Rewriter) -> bool:
    """Concat/Sum/Max/Min/Mean of a single input."""
    if len(node.inputs) != 1:
        return False
    x = node.inputs[0]
    if x is None:
        return False
    if node.op_type == "Concat":
        return _forward(node, rw)
    if node.output.type.dtype is not None and x.type.dtype is not None and node.output.type.dtype != x.type.dtype:
        return False
    return _forward(node, rw)


def reduce_empty_axes(node: Node, rw: Rewriter) -> bool:
    """Reduce* with no axes and noop_with_empty_axes=1."""
    if not int(node.attrs.get("noop_with_empty_axes", 0)) or "axes" in node.attrs:
        return False
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const(node.inputs[1])
        if axes is None or axes.size:
            return False
    return _forward(node, rw)


_REDUCE = ("ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceSumSquare ReduceL1 ReduceL2 "
           "ReduceLogSum ReduceLogSumExp").split()


class EliminateNoops(RulePass):
    """Remove nodes that return their input unchanged."""

    name = "eliminate_noops"
    after = ("fold_constants",)
    stage = "optimize"
    opt_level = 1
    fixed_point = True
    description = ("remove Identity, Dropout at inference, Cast to the same type, Reshape/Expand/Squeeze/"
                   "Unsqueeze/Flatten/Tile/Slice that change nothing, identity Transpose, zero Pad, "
                   "single-input Concat/Sum/Max/Min/Mean, Reduce* with noop_with_empty_axes")
    rules = {
        "Identity": (identity,),
        "Dropout": (dropout,),
        "Cast": (cast,),
        "CastLike": (cast,),
        "Reshape": (reshape,),
        "Expand": (same_type,),
        "Squeeze": (same_type,),
        "Unsqueeze": (same_type,),
        "Flatten": (same_type,),
        "Tile": (same_type,),
        "Split": (same_type,),
        "Slice": (slice_,),
        "Transpose": (transpose,),
        "Pad": (pad,),
        "Concat": (single_input,),
        "Sum": (single_input,),
        "Max": (single_input,),
        "Min": (single_input,),
        "Mean": (single_input,),
        **{op: (reduce_empty_axes,) for op in _REDUCE},
    }
