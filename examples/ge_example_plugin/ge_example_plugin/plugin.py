"""The example plugin: one op with its CPU kernel, one pass, one fusion pattern.

* op ``ge.example::ScaleShift`` — ``y = x * scale + shift`` (float attributes), with a NumPy kernel;
* pass ``example_fold_double_neg`` (stage optimize) — ``Neg(Neg(x))`` becomes ``x`` (an imperative
  rule of the SDK's rewrite engine, run by its driver);
* fusion pattern ``example_scale_shift`` (a declarative rule) — ``Add(Mul(x, c1), c2)`` with scalar constants becomes
  ``ScaleShift(x, scale=c1, shift=c2)``, applied by the pass ``example_fusion`` (stage fuse) and
  turned off by name in a fusion switch file.

Installed, it is found through the entry point in pyproject.toml; no change to ge itself.
"""

from __future__ import annotations

import numpy as np

from ge_core import Graph, OpKind, Pass
from ge_sdk import PassContext, PassResult, Plugin, same_as_input
from ge_sdk.rewrite import Const, Op, OpRule, Rewriter, RuleSet, Var, rewrite

DOMAIN = "ge.example"

plugin = Plugin("ge_example")


# -- a custom op and its CPU kernel, in one decorator -------------------------------------------
@plugin.op("ScaleShift", domain=DOMAIN, kind=OpKind.ELEMWISE, infer=same_as_input())
def scale_shift(x, scale=1.0, shift=0.0):
    """y = x * scale + shift"""
    y = np.multiply(x, np.asarray(scale, dtype=x.dtype))
    y += np.asarray(shift, dtype=x.dtype)
    return y


# -- a pass, written as a Pass subclass around an imperative rule ----------------------------------
def fold_double_neg(node, rw: Rewriter) -> bool:
    """Neg(Neg(x)) -> x: an imperative rule (an op type and a function)."""
    inner = node.inputs[0].producer
    if inner is None or inner.op_type != "Neg" or inner.domain not in ("", "ai.onnx") or inner.graph is not node.graph:
        return False
    return rw.replace_node(node, [inner.inputs[0]])


@plugin.register_pass
class FoldDoubleNeg(Pass):
    """Neg(Neg(x)) -> x, in the graph and in every If/Loop/Scan body."""

    name = "example_fold_double_neg"
    stage = "optimize"
    opt_level = 1
    description = "remove pairs of negations"
    rules = RuleSet([OpRule("Neg", fold_double_neg)], order="nodes")

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        res = rewrite(graph, self.rules, ctx=ctx)
        return PassResult(res.changed, {"folded": res.replaced})  # the report shows the count


# -- a fusion pattern: a declarative rule (pattern and replacement), and the pass that applies it ---
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
