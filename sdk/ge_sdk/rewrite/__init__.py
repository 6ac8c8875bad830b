"""The rewrite engine: patterns, matches, rules of two styles, rule sets, one driver.

A rule is either declarative — a pattern, an optional condition and a replacement::

    from ge_sdk.rewrite import Const, Op, Rule, RuleSet, OpRule, Var, rewrite

    x = Var("x", dtype="float32")
    pattern = Op("Add", Op("Mul", x, Const("scale", scalar=True), commutative=True),
                 Const("shift", scalar=True), commutative=True)

    def to_scale_shift(rw, m):
        return rw.op("ScaleShift", m["x"], domain="my.domain",
                     scale=float(m.const("scale")), shift=float(m.const("shift")))

    scale_shift = Rule("mul_add_to_scale_shift", pattern, to_scale_shift)

or imperative — an op type and a function that rewrites through the :class:`Rewriter`::

    def drop_double_neg(node, rw):
        inner = node.inputs[0].producer
        return inner is not None and inner.op_type == "Neg" and rw.replace_node(node, [inner.inputs[0]])

    rules = RuleSet([scale_shift]) + RuleSet([OpRule("Neg", drop_double_neg)])
    rewrite(graph, rules)        # the graph and every If/Loop/Scan body in it

Modules: :mod:`.pattern` (Op, Var, Const, Alt, Optional, Repeat), :mod:`.match` (Match,
match, match_all, explain), :mod:`.rule` (Rule, AnyOf, OpRule, RuleSet), :mod:`.driver`
(Rewriter, rewrite, RewritePass, RulePass), :mod:`.nodes` (axes_of, attr_of, const_of, ints_of: the
node readers rule families share).
"""

from .driver import RewritePass, Rewriter, RewriteResult, RulePass, apply_rules, can_replace, rewrite, walk_graphs
from .match import Explanation, Match, Matcher, explain, match, match_all
from .nodes import attr_of, axes_of, const_of, ints_of
from .pattern import Absent, Alt, Const, MatchState, Op, Optional, Pattern, Repeat, Var, as_pattern, show
from .rule import ORDERS, AnyOf, OpRule, Replacement, Rule, RuleLike, RuleSet

__all__ = [
    "Pattern", "Op", "Var", "Const", "Alt", "Optional", "Repeat", "Absent", "MatchState", "show", "as_pattern",
    "Match", "Matcher", "Explanation", "explain", "match", "match_all",
    "Rule", "AnyOf", "OpRule", "RuleSet", "RuleLike", "Replacement", "ORDERS",
    "Rewriter", "RewriteResult", "rewrite", "apply_rules", "RewritePass", "RulePass", "can_replace", "walk_graphs",
    "axes_of", "attr_of", "const_of", "ints_of",
]
