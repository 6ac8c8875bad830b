"""Cancelling and merging chains of Transpose and of Reshape/Squeeze/Unsqueeze/Flatten."""

from __future__ import annotations

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk.rewrite import Rewriter, RulePass

from ._util import axes_of, default_domain, opset_of, shapes_match, static_shape

RESHAPES = frozenset(("Reshape", "Squeeze", "Unsqueeze", "Flatten"))


def _single_use(v: Value | None) -> bool:
    return v is not None and len(v.uses()) == 1 and not v.is_graph_output


def _perm(node: Node) -> list[int] | None:
    p = node.attrs.get("perm")
    if p is not None:
        return [int(i) for i in p]
    r = node.inputs[0].type.rank if node.inputs[0] is not None else None
    return None if r is None else list(range(r))[::-1]


def merge_transposes(node: Node, rw: Rewriter) -> bool:
    """Transpose(Transpose(x, p1), p2) -> x when the permutations cancel, else Transpose(x, p1∘p2)."""
    src = node.inputs[0]
    inner = src.producer if src is not None else None
    if inner is None or inner.op_type != "Transpose" or not default_domain(inner) or inner.graph is not node.graph:
        return False
    p1, p2 = _perm(inner), _perm(node)
    if p1 is None or p2 is None or len(p1) != len(p2):
        return False
    x = inner.inputs[0]
    assert x is not None
    q = [p1[i] for i in p2]
    if q == list(range(len(q))):
        return rw.replace_node(node, [x])
    if not _single_use(src):
        return False  # merging would keep both transposes
    new = rw.add_node("Transpose", [x], {"perm": q}, before=node, like=node.output, output_type=node.output.type)
    return rw.replace_node(node, [new.output])


def merge_reshapes(node: Node, rw: Rewriter) -> bool:
    """A chain of Reshape/Squeeze/Unsqueeze/Flatten: cancelled when the last output has the first
    input's type, else one Reshape to the last output's static shape."""
    src = node.inputs[0]
    inner = src.producer if src is not None else None
    if inner is None or inner.op_type not in RESHAPES or not default_domain(inner) or inner.graph is not node.graph:
        return False
    x = inner.inputs[0]
    out = node.output
    if x is None:
        return False
    if shapes_match(x.type, out.type):
        return rw.replace_node(node, [x])
    if node.op_type == "Squeeze" and inner.op_type == "Unsqueeze":
        # Squeeze(Unsqueeze(x, a), a) is x even when x's shape is not known
        a, b = axes_of(inner), axes_of(node)
        if a is not None and b is not None and a and all(i >= 0 for i in a + b) and sorted(a) == sorted(b):
            return rw.replace_node(node, [x])
    if not _single_use(src):
        return False
    shape = static_shape(out.type)
    if shape is None:
        return False
    attrs = {}
    if 0 in shape:
        if opset_of(node) < 14:
            return False
        attrs["allowzero"] = 1
    target = rw.constant(np.array(shape, dtype=np.int64), like=out)
    new = rw.add_node("Reshape", [x, target], attrs, before=node, like=out, output_type=out.type)
    return rw.replace_node(node, [new.output])


class SimplifyLayout(RulePass):
    """Cancel and merge chains of layout ops."""

    name = "simplify_layout"
    after = ("sink_transposes",)
    stage = "optimize"
    opt_level = 2
    fixed_point = True
    description = ("cancel Transpose pairs whose permutations compose to the identity and merge the rest; "
                   "cancel or merge chains of Reshape/Squeeze/Unsqueeze/Flatten into one Reshape")
    rules = {
        "Transpose": (merge_transposes,),
        "Reshape": (merge_reshapes,),
        "Squeeze": (merge_reshapes,),
        "Unsqueeze": (merge_reshapes,),
        "Flatten": (merge_reshapes,),
    }
