"""The example plugin: one op with its CPU kernel, one pass, one fusion pattern.

* op ``ge.example::ScaleShift`` — ``y = x * scale + shift`` (float attributes), with a NumPy kernel;
* pass ``example_fold_double_neg`` (stage optimize) — ``Neg(Neg(x))`` becomes ``x``;
* fusion pattern ``example_scale_shift`` — ``Add(Mul(x, c1), c2)`` with scalar constants becomes
  ``ScaleShift(x, scale=c1, shift=c2)``, applied by the pass ``example_fusion`` (stage fuse) and
  turned off by name in a fusion switch file.

Installed, it is found through the entry point in pyproject.toml; no change to ge itself.
"""

from __future__ import annotations

import numpy as np

from ge_core import OpKind, Pass
from ge_sdk import Const, Op, Plugin, Var, same_as_input

DOMAIN = "ge.example"

plugin = Plugin("ge_example")


# -- a custom op and its CPU kernel, in one decorator -------------------------------------------
@plugin.op("ScaleShift", domain=DOMAIN, kind=OpKind.ELEMWISE, infer=same_as_input())
def scale_shift(x, scale=1.0, shift=0.0):
    """y = x * scale + shift"""
    y = np.multiply(x, np.asarray(scale, dtype=x.dtype))
    y += np.asarray(shift, dtype=x.dtype)
    return y


# -- a pass, written as a Pass subclass --------------------------------------------------------
@plugin.register_pass
class FoldDoubleNeg(Pass):
    """Neg(Neg(x)) -> x."""

    name = "example_fold_double_neg"
    stage = "optimize"
    opt_level = 1
    description = "remove pairs of negations"

    def run(self, graph, ctx) -> bool:
        changed = False
        for node in graph.nodes:
            if node.op_type != "Neg" or node.domain not in ("", "ai.onnx"):
                continue
            inner = node.inputs[0].producer
            if inner is None or inner.op_type != "Neg" or inner.domain not in ("", "ai.onnx"):
                continue
            node.output.replace_all_uses_with(inner.inputs[0])
            graph.remove_node(node)
            if not inner.output.has_uses() and not inner.output.is_graph_output:
                graph.remove_node(inner)
            changed = True
        return changed


# -- a fusion pattern in the pattern language, and the pass that applies it ----------------------
x = Var("x", dtype=["float32", "float64"])
scale = Const("scale", scalar=True)
shift = Const("shift", scalar=True)
PATTERN = Op("Add", Op("Mul", x, scale, commutative=True), shift, commutative=True)


@plugin.rewrite("example_scale_shift", PATTERN)
def to_scale_shift(rw, m):
    """Add(Mul(x, scale), shift) with scalar constants -> ScaleShift(x)."""
    return rw.op("ScaleShift", m["x"], domain=DOMAIN,
                 scale=float(m.const("scale").reshape(())), shift=float(m.const("shift").reshape(())))


# Until a fusion plugin applies every registered pattern, this plugin applies its own.
plugin.rewrite_pass("example_fusion", [to_scale_shift], stage="fuse",
                    description="fuse x * c1 + c2 into ge.example::ScaleShift")
