"""Rules and rule sets.

A rule comes in one of two styles, and both go in the same :class:`RuleSet`:

* declarative, :class:`Rule`: a pattern (or a list of root patterns), an optional condition on
  the match and a replacement ``replace(rw, match)`` that builds new nodes with ``rw.op(...)``
  and returns the value(s) replacing the root(s) (None declines);
* imperative, :class:`OpRule`: an op type (or several, or None for any) and a function
  ``fn(node, rw) -> bool`` that looks at one node and its neighbours and, when it applies,
  rewrites through the :class:`~ge_sdk.rewrite.Rewriter` ``rw`` and returns True.

Rule sets compose: ``RuleSet(a) + RuleSet(b)`` (or ``+ [rule]``) is a rule set with the rules
of both in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

from ge_core.errors import GEError
from ge_core.ir.graph import Node, Value

from .match import Match, Matcher
from .pattern import MatchState, Op

if TYPE_CHECKING:
    from .driver import Rewriter

__all__ = ["Rule", "AnyOf", "OpRule", "RuleSet", "Replacement", "RuleLike", "ORDERS"]

Replacement = Callable[["Rewriter", Match], "Value | Sequence[Value] | None"]

#: How a rule set is applied: ``"rules"`` gives each rule a turn at every node before the next
#: rule (rule priority, as onnxscript's rule sets); ``"nodes"`` tries every rule at each node in
#: turn (MLIR's greedy driver, tinygrad's PatternMatcher).
ORDERS = ("rules", "nodes")


class Rule(Matcher):
    """A declarative rewrite: pattern, condition and replacement (see the module docstring)."""

    def __init__(self, name: str, pattern: Op | Sequence[Op], replace: Replacement | None = None, *,
                 condition: Callable[[Match], bool] | None = None, description: str = "") -> None:
        super().__init__(name, pattern, condition=condition)
        self.replace = replace
        self.description = description or (getattr(replace, "__doc__", None) or "").strip().split("\n")[0]

    def apply(self, node: Node, rw: Rewriter) -> bool:
        """Match at ``node`` and, when it matches, splice the replacement in; True if changed."""
        m = self.match(node, rw.ops)
        return m is not None and rw.apply_match(self, m)

    def replacement(self, m: Match) -> Replacement | None:
        """The replacement that builds the new nodes for ``m``."""
        return self.replace

    @property
    def multi_root(self) -> bool:
        return len(self.roots) > 1


class AnyOf(Rule):
    """One named rule made of several alternative rules (different root shapes); the first
    alternative that matches at a node wins. Root types are tried in the alternatives' order."""

    def __init__(self, name: str, alternatives: Sequence[Rule], description: str = "") -> None:
        if not alternatives:
            raise GEError(f"rule '{name}': AnyOf needs at least one alternative")
        super().__init__(name, alternatives[0].roots, alternatives[0].replace, description=description)
        self.alternatives = list(alternatives)

    @property
    def root_types(self) -> tuple[str, ...] | None:
        types: dict[str, None] = {}
        for r in self.alternatives:
            rt = r.root_types
            if rt is None:
                return None
            types.update(dict.fromkeys(rt))
        return tuple(types)

    @property
    def multi_root(self) -> bool:
        return any(r.multi_root for r in self.alternatives)

    def matches(self, node: Node, st: MatchState) -> Iterator[Match]:
        for r in self.alternatives:
            types = r.root_types
            if types is None or node.op_type in types:
                for m in r.matches(node, st):
                    m.rule = r
                    yield m

    def match(self, node: Node, ops=None) -> Match | None:
        for r in self.alternatives:
            m = r.match(node, ops)
            if m is not None:
                m.rule = r
                return m
        return None

    def replacement(self, m: Match) -> Replacement | None:
        alt = m.rule if isinstance(m.rule, Rule) and m.rule is not self else self.alternatives[0]
        return alt.replacement(m)


class OpRule:
    """An imperative rewrite: ``fn(node, rw) -> bool`` tried at nodes of ``op_type``.

    ``op_type``: a name, ``"A|B"``, a list, or None for every node. ``domain``: the nodes'
    domain (``""``, the default, is ONNX's default domain; None: any domain).
    """

    def __init__(self, op_type: str | Sequence[str] | None, fn: Callable[[Node, Rewriter], bool], *,
                 name: str | None = None, domain: str | None = "", description: str = "") -> None:
        if not callable(fn):
            raise GEError(f"OpRule for {op_type!r} needs a function fn(node, rw) -> bool, not {fn!r}")
        if op_type is None:
            self._types: tuple[str, ...] | None = None
        else:
            types = op_type.split("|") if isinstance(op_type, str) else list(op_type)
            if not types or not all(isinstance(t, str) and t for t in types):
                raise GEError(f"OpRule needs op type names, not {op_type!r}")
            self._types = tuple(types)
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "rule"))
        self.domain = None if domain is None else ("" if domain in ("", "ai.onnx") else domain)
        self.description = description or (getattr(fn, "__doc__", None) or "").strip().split("\n")[0]

    @property
    def root_types(self) -> tuple[str, ...] | None:
        return self._types

    multi_root = False

    def apply(self, node: Node, rw: Rewriter) -> bool:
        if self.domain is not None and ("" if node.domain in ("", "ai.onnx") else node.domain) != self.domain:
            return False
        return bool(self.fn(node, rw))

    def __repr__(self) -> str:
        return f"<OpRule {self.name}: {'|'.join(self._types) if self._types else '*'}>"


RuleLike = Union[Rule, OpRule]


class RuleSet:
    """An ordered collection of rules of either style, applied by :func:`ge_sdk.rewrite.rewrite`.

    ``order`` is one of :data:`ORDERS`. ``a + b`` composes (``b`` may be a rule set, a rule or a
    list of rules); the result keeps ``a``'s order.
    """

    def __init__(self, rules: Iterable[RuleLike] = (), *, order: str = "rules", name: str = "") -> None:
        if order not in ORDERS:
            raise GEError(f"rule set {name or '?'}: order must be one of {', '.join(ORDERS)}, not {order!r}")
        self.rules: list[RuleLike] = []
        for r in rules:
            if not isinstance(r, (Rule, OpRule)):
                raise GEError(f"rule set {name or '?'}: {r!r} is not a Rule or an OpRule")
            self.rules.append(r)
        self.order = order
        self.name = name

    @classmethod
    def of(cls, rules: RuleSet | RuleLike | Iterable[RuleLike], **kw: Any) -> RuleSet:
        """``rules`` as a rule set (a rule set is returned as it is)."""
        if isinstance(rules, RuleSet):
            return rules
        if isinstance(rules, (Rule, OpRule)):
            return cls([rules], **kw)
        return cls(rules, **kw)

    @classmethod
    def from_table(cls, table: dict[str, Sequence[Callable[[Node, Rewriter], bool]]],
                   any_rules: Sequence[Callable[[Node, Rewriter], bool]] = (), *, name: str = "") -> RuleSet:
        """A node-ordered rule set from ``{op_type: (fn, ...)}`` (default-domain nodes) and
        functions tried on every node of any domain after the op-specific ones."""
        rules: list[RuleLike] = [OpRule(t, f) for t, fns in table.items() for f in fns]
        rules += [OpRule(None, f, domain=None) for f in any_rules]
        return cls(rules, order="nodes", name=name)

    def __add__(self, other: RuleSet | RuleLike | Iterable[RuleLike]) -> RuleSet:
        more = RuleSet.of(other, order=self.order)
        return RuleSet(self.rules + more.rules, order=self.order, name=self.name or more.name)

    def __radd__(self, other: Iterable[RuleLike]) -> RuleSet:
        return RuleSet(list(other), order=self.order) + self

    def __iter__(self) -> Iterator[RuleLike]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rules]

    def select(self, enabled: Callable[[str], bool] | None) -> RuleSet:
        """The rules whose name ``enabled(name)`` accepts (all when ``enabled`` is None)."""
        if enabled is None:
            return self
        return RuleSet([r for r in self.rules if enabled(r.name)], order=self.order, name=self.name)

    def __repr__(self) -> str:
        return f"<RuleSet {self.name or ''}({self.order}): {', '.join(self.names)}>"
