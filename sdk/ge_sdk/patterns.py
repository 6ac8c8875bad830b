"""The pattern language under its older name: a re-export of :mod:`ge_sdk.rewrite`.

Existing code (``from ge_sdk.patterns import Op, Var, Rule, apply_rules``) keeps working; new
code imports from :mod:`ge_sdk.rewrite`, which holds the one implementation.
"""

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

__all__ = [
    "Pattern", "Op", "Var", "Const", "Alt", "Optional", "Repeat", "Absent", "Match", "Rule", "Rewriter",
    "Explanation", "explain", "match", "match_all", "apply_rules", "RewritePass",
]
