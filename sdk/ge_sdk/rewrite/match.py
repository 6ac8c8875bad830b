"""Matching: a :class:`Matcher` (one or more root patterns and a condition) finds
:class:`Match` es anchored at a node; :func:`explain` says why it did not match.

A list of root patterns is a multi-output pattern: later roots are found through the users of
the values bound by the earlier ones. A match may not use a node from inside it from outside
(unless its pattern says ``shared=True``), nor make an inner value that is a graph output
disappear.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_core.errors import GEError
from ge_core.ir.graph import Graph, Node, Value

from .pattern import MatchState, Op, Pattern, show

__all__ = ["Match", "Matcher", "Explanation", "explain", "match", "match_all"]


@dataclass
class Match:
    """One match: named bindings, the matched nodes and the values the roots matched.

    ``rule`` is the rule that matched (for a rule made of alternatives, the alternative).
    """

    bindings: dict[str, Any]
    nodes: list[Node]
    roots: list[Value]
    shared: set[Node] = field(default_factory=set)
    rule: Any = None

    def __getitem__(self, name: str) -> Any:
        try:
            return self.bindings[name]
        except KeyError:
            raise KeyError(f"pattern binds no '{name}' (bound: {', '.join(sorted(self.bindings)) or 'none'})") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self.bindings.get(name, default)

    def __contains__(self, name: str) -> bool:
        return name in self.bindings

    def value(self, name: str) -> Value:
        """The value bound to ``name`` (a named Op gives its first output)."""
        obj = self[name]
        return obj.outputs[0] if isinstance(obj, Node) else obj

    def const(self, name: str) -> np.ndarray:
        """The array of the constant bound to ``name``."""
        v = self.value(name)
        if v.const_value is None:
            raise GEError(f"'{name}' is bound to {show(v)}, not a constant")
        return v.const_value

    @property
    def root(self) -> Value:
        return self.roots[0]


class Matcher:
    """Root pattern(s) with an optional condition on the match; the matching half of a rule."""

    def __init__(self, name: str, pattern: Op | Sequence[Op], *,
                 condition: Callable[[Match], bool] | None = None) -> None:
        roots = [pattern] if isinstance(pattern, Pattern) else list(pattern)
        if not roots or not all(isinstance(r, Op) for r in roots):
            raise GEError(f"rule '{name}': roots must be Op patterns (matching anchors on their op type)")
        self.name: str = name
        self.roots: list[Op] = roots
        self.condition = condition

    @property
    def pattern(self) -> Op:
        return self.roots[0]

    @property
    def root_types(self) -> tuple[str, ...] | None:
        """The op types a match can be anchored at (None: any)."""
        return self.roots[0].op_types

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {', '.join(r.describe() for r in self.roots)}>"

    # -- matching ---------------------------------------------------------------------------
    def matches(self, node: Node, st: MatchState) -> Iterator[Match]:
        """Every match anchored at ``node`` (the first root matching one of its outputs)."""
        root = self.roots[0]
        outs = node.outputs if root.output is None else node.outputs[root.output:root.output + 1]
        for v in outs:
            for roots in self._roots(0, [v], root, st):
                shared = {n for n in st.nodes if st.bindings.get(("shared", n))}
                m = Match({k: v for k, v in st.bindings.items() if isinstance(k, str)}, list(st.nodes), list(roots),
                          shared, self)
                why = interior_uses(m)
                if why:
                    st.fail(why)
                    continue
                if self.condition is not None:
                    try:
                        ok = self.condition(m)
                    except Exception as e:
                        raise GEError(f"rule '{self.name}': condition raised {type(e).__name__}: {e}") from e
                    if not ok:
                        st.fail(f"the condition of rule '{self.name}' is false for this match")
                        continue
                yield m

    def _roots(self, k: int, found: list[Value], pat: Op, st: MatchState) -> Iterator[list[Value]]:
        for _ in pat.match_value(found[-1], st):
            if k + 1 == len(self.roots):
                yield found
                continue
            nxt = self.roots[k + 1]
            cands: dict[Value, None] = {}
            for obj in list(st.bindings.values()):
                vals = obj.outputs if isinstance(obj, Node) else [obj] if isinstance(obj, Value) else []
                for bv in vals:
                    for u in bv.users:
                        if u.op_type in nxt.op_types and u not in st.nodes:
                            for o in (u.outputs if nxt.output is None else u.outputs[nxt.output:nxt.output + 1]):
                                cands[o] = None
            if not cands:
                st.fail(f"no user of the values bound so far is a {'|'.join(nxt.op_types)} for root {k + 1}")
            for c in cands:
                yield from self._roots(k + 1, found + [c], nxt, st)

    def match(self, node: Node, ops=None) -> Match | None:
        """The first match anchored at ``node`` (as the first root), or None."""
        types = self.root_types
        if types is not None and node.op_type not in types:
            return None
        st = MatchState(node.graph, ops)
        for m in self.matches(node, st):
            return m
        return None


def interior_uses(m: Match) -> str:
    """Why the nodes of ``m`` cannot be replaced ('' when they can): an inner node whose value
    is a graph output or is read outside the match."""
    inside = set(m.nodes)
    roots = {v.producer for v in m.roots}
    for n in m.nodes:
        if n in roots or n in m.shared:
            continue
        for v in n.outputs:
            if v.is_graph_output:
                return f"{n.describe()} is inside the pattern but its output '{v.name}' is a graph output"
            for u in v.users:
                if u not in inside:
                    return (f"{n.describe()} is inside the pattern but {u.describe()} outside it uses it "
                            "(mark it shared=True if it may stay)")
    return ""


def as_matcher(pattern: Matcher | Op | Sequence[Op]) -> Matcher:
    """``pattern`` itself when it is a rule or matcher, else a matcher of the root pattern(s)."""
    if isinstance(pattern, Matcher):
        return pattern
    if not isinstance(pattern, (Pattern, list, tuple)):
        raise GEError(f"{pattern!r} is not a pattern or a declarative rule (an imperative rule is a function: "
                      "it cannot be matched or explained without running it)")
    return Matcher("pattern", pattern)


def match(pattern: Matcher | Op | Sequence[Op], node: Node, ops=None) -> Match | None:
    """The first match of ``pattern`` anchored at ``node``, or None."""
    return as_matcher(pattern).match(node, ops)


def match_all(graph: Graph, pattern: Matcher | Op | Sequence[Op], ops=None) -> list[Match]:
    """Every match in ``graph`` (one per anchor node; the top-level graph only)."""
    m_ = as_matcher(pattern)
    types = m_.root_types
    out = []
    for n in graph.nodes:
        if types is None or n.op_type in types:
            m = m_.match(n, ops)
            if m is not None:
                out.append(m)
    return out


@dataclass
class Explanation:
    """Why a pattern did or did not match at a node."""

    matched: bool
    node: Node
    reason: str = ""
    path: list[str] = field(default_factory=list)
    match: Match | None = None

    def __bool__(self) -> bool:
        return self.matched

    def __str__(self) -> str:
        if self.matched:
            return f"matches at {self.node.describe()}"
        where = " → ".join(self.path)
        return f"no match at {self.node.describe()}: " + (f"at {where}: " if where else "") + self.reason


def explain(pattern: Matcher | Op | Sequence[Op], node: Node, ops=None) -> Explanation:
    """Try ``pattern`` at ``node`` and say why it did not match (the deepest failure)."""
    rule = as_matcher(pattern)
    st = MatchState(node.graph, ops, explain=True)
    for m in rule.matches(node, st):
        return Explanation(True, node, match=m)
    types = rule.root_types
    if types is not None and node.op_type not in types and st.failure is None:
        return Explanation(False, node, f"{node.describe()} has op type {node.op_type}, pattern wants "
                                        f"{' or '.join(types)}")
    if st.failure is None:
        return Explanation(False, node, "no candidate matched")
    _, path, reason = st.failure
    return Explanation(False, node, reason, path)
