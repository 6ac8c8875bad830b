"""The pattern language under its older name: a re-export of :mod:`ge_sdk.rewrite`.

Existing code (``from ge_sdk.patterns import Op, Var, Rule, apply_rules``) keeps working; new
code imports from :mod:`ge_sdk.rewrite`, which holds the one implementation.
"""

from typing import Any

from ge_core.ir.graph import Graph

from .rewrite import (
    Absent,
    Alt,
    Const,
    Explanation,
    Match,
    Op,
    Optional,
    Pattern,
    Repeat,
    RewritePass,
    Rewriter,
    Rule,
    Var,
    apply_rules,
    explain,
    match,
    match_all,
)


def apply_match(rule: Rule, m: Match, graph: Graph, ops: Any = None, positions: Any = None) -> bool:
    """Run ``rule``'s replacement for ``m`` in ``graph`` and splice it in (older entry point of
    :meth:`ge_sdk.rewrite.Rewriter.apply_match`); True if the graph changed."""
    return Rewriter(graph, ops=ops).apply_match(rule, m)


__all__ = [
    "Pattern", "Op", "Var", "Const", "Alt", "Optional", "Repeat", "Absent", "Match", "Rule", "Rewriter",
    "Explanation", "explain", "match", "match_all", "apply_rules", "RewritePass",
]
