"""A declarative pattern language for graph rewrites.

A *pattern* describes a value by how it was computed; a :class:`Rule` pairs a pattern with a
condition and a replacement. Patterns are ordinary Python objects::

    from ge_sdk.patterns import Op, Var, Const, Optional, Rule

    x = Var("x", dtype="float32")
    mul = Op("Mul", x, Const("scale", scalar=True), commutative=True)
    pattern = Op("Add", mul, Const("shift", scalar=True), commutative=True)

    def replace(rw, m):
        return rw.op("ScaleShift", m["x"], domain="my.domain",
                     scale=float(m.const("scale")), shift=float(m.const("shift")))

    rule = Rule("mul_add_to_scale_shift", pattern, replace)

Building blocks (each matches one value):

* :class:`Op` — a value produced by a node of one of the given op types (alternatives as a
  list or ``"Add|Sub"``), with input patterns (``...`` as the last one accepts any further
  inputs, ``None`` an absent optional input), attribute values or predicates, a node predicate,
  dtype/shape/rank predicates, ``commutative=True`` (inputs 0 and 1 in either order) and
  ``output=i`` for an output of a multi-output node;
* :class:`Var` — a wildcard; a name binds it, and the same name twice must be the same value;
* :class:`Const` — a constant (initializer), optionally with a value or predicate;
* :class:`Alt` — the first of several patterns that matches; :func:`Optional` — an optional
  part, ``Optional(Op("Add", inner, Var("bias")), inner)``;
* :class:`Repeat` — a chain of one step repeated ``min..max`` times;
* a list of root patterns in a :class:`Rule` — a multi-output pattern whose roots are found
  through the users of values bound by the first root.

Matching anchors on the root's op type through a per-op-type index built once per sweep
(:func:`apply_rules`), so a sweep costs O(graph size x pattern size): no whole-graph scan per
node. :func:`explain` says why a pattern did not match at a node.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_core.errors import GEError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.passes import Pass, PassContext

__all__ = [
    "Pattern", "Op", "Var", "Const", "Alt", "Optional", "Repeat", "Absent", "Match", "Rule", "Rewriter",
    "Explanation", "explain", "match", "match_all", "apply_rules", "RewritePass",
]

_MISSING = object()


# ------------------------------------------------------------------------------------------------
# matching state (bindings with an undo trail, failure tracking for explain)
# ------------------------------------------------------------------------------------------------
class _State:
    def __init__(self, graph: Graph | None, ops=None, explain: bool = False) -> None:
        self.graph = graph
        self.ops = ops
        self.bindings: dict[Any, Any] = {}
        self.nodes: dict[Node, None] = {}
        self.trail: list[tuple[str, Any, Any]] = []
        self.collect = 0  # > 0 inside a Repeat step: names collect tuples
        self.explain = explain
        self.path: list[str] = []
        self.failure: tuple[int, list[str], str] | None = None

    # -- bindings ---------------------------------------------------------------------------
    def mark(self) -> int:
        return len(self.trail)

    def undo(self, mark: int) -> None:
        while len(self.trail) > mark:
            kind, key, old = self.trail.pop()
            if kind == "b":
                if old is _MISSING:
                    self.bindings.pop(key, None)
                else:
                    self.bindings[key] = old
            else:
                self.nodes.pop(key, None)

    def bind(self, key: Any, obj: Any, *, overwrite: bool = False) -> bool:
        old = self.bindings.get(key, _MISSING)
        if self.collect and isinstance(key, str):
            new = (old if isinstance(old, tuple) else ()) + (obj,)
        elif old is not _MISSING and not overwrite:
            if old is obj:
                return True
            self.fail(f"'{key}' is already bound to {_show(old)}, here it would be {_show(obj)}")
            return False
        else:
            new = obj
        self.trail.append(("b", key, old))
        self.bindings[key] = new
        return True

    def add_node(self, node: Node) -> None:
        if node not in self.nodes:
            self.nodes[node] = None
            self.trail.append(("n", node, None))

    # -- failures ---------------------------------------------------------------------------
    def fail(self, reason: str) -> None:
        if not self.explain:
            return
        depth = len(self.path)
        if self.failure is None or depth > self.failure[0]:
            self.failure = (depth, list(self.path), reason)


def _show(obj: Any) -> str:
    if isinstance(obj, Node):
        return obj.describe()
    if isinstance(obj, Value):
        if obj.producer is not None:
            return f"value '{obj.name}' of {obj.producer.describe()}"
        if obj.is_constant:
            return f"constant '{obj.name}'"
        return f"graph input '{obj.name}'"
    if obj is None:
        return "an absent input"
    return repr(obj)


def _norm_domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


# ------------------------------------------------------------------------------------------------
# patterns
# ------------------------------------------------------------------------------------------------
class Pattern:
    """Base class: something that matches one value (possibly absent, ``None``)."""

    name: str | None = None

    def _m(self, v: Value | None, st: _State) -> Iterator[None]:  # pragma: no cover - interface
        """Yield once per way of matching ``v``; bindings stay while the generator is suspended."""
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.describe()


class _ValueChecks:
    """dtype / shape / rank / predicate checks shared by value patterns."""

    def __init__(self, dtype: Any = None, shape: Sequence | None = None, rank: int | None = None,
                 pred: Callable[[Value], bool] | None = None) -> None:
        if dtype is None:
            self.dtypes = None
        else:
            items = dtype if isinstance(dtype, (list, tuple, set)) else [dtype]
            self.dtypes = {np.dtype(d) for d in items}
        self.shape = None if shape is None else tuple(shape)
        self.rank = rank
        self.vpred = pred

    def check(self, v: Value, st: _State) -> bool:
        t: TensorType = v.type
        if self.dtypes is not None and t.dtype not in self.dtypes:
            st.fail(f"{_show(v)} has dtype {t.dtype}, pattern wants {' or '.join(sorted(str(d) for d in self.dtypes))}")
            return False
        if self.rank is not None and t.rank != self.rank:
            st.fail(f"{_show(v)} has rank {t.rank}, pattern wants {self.rank}")
            return False
        if self.shape is not None:
            if t.shape is None or len(t.shape) != len(self.shape) or any(
                w is not None and (not callable(w) and d != w or callable(w) and not w(d))
                for d, w in zip(t.shape, self.shape)
            ):
                st.fail(f"{_show(v)} has shape {t}, pattern wants {list(self.shape)}")
                return False
        if self.vpred is not None and not self.vpred(v):
            st.fail(f"{_show(v)} fails the value predicate {getattr(self.vpred, '__name__', 'pred')}")
            return False
        return True

    def _checks_desc(self) -> str:
        parts = []
        if self.dtypes:
            parts.append("dtype=" + "|".join(sorted(str(d) for d in self.dtypes)))
        if self.rank is not None:
            parts.append(f"rank={self.rank}")
        if self.shape is not None:
            parts.append(f"shape={list(self.shape)}")
        return (" " + " ".join(parts)) if parts else ""


class Var(Pattern, _ValueChecks):
    """A wildcard value. ``Var("x")`` binds ``x``; ``optional=True`` also matches an absent input."""

    def __init__(self, name: str | None = None, *, dtype: Any = None, shape: Sequence | None = None,
                 rank: int | None = None, pred: Callable[[Value], bool] | None = None, optional: bool = False) -> None:
        _ValueChecks.__init__(self, dtype, shape, rank, pred)
        self.name = name
        self.optional = optional

    def _m(self, v, st):
        if v is None:
            if self.optional:
                yield
            else:
                st.fail(f"input is absent, pattern wants {self.describe()}")
            return
        if not self.check(v, st):
            return
        mark = st.mark()
        if self.name is None or st.bind(self.name, v):
            yield
        st.undo(mark)

    def describe(self) -> str:
        return f"${self.name or '_'}{self._checks_desc()}"


class Absent(Pattern):
    """Matches an absent optional input only."""

    def _m(self, v, st):
        if v is None:
            yield
        else:
            st.fail(f"{_show(v)} is present, pattern wants an absent input")

    def describe(self) -> str:
        return "absent"


class Const(Pattern, _ValueChecks):
    """A constant value (initializer). ``value`` compares with ``np.allclose``; ``scalar=True``
    wants a single element; ``pred(array)`` tests the array."""

    def __init__(self, name: str | None = None, *, value: Any = None, scalar: bool = False,
                 pred: Callable[[np.ndarray], bool] | None = None, dtype: Any = None, shape: Sequence | None = None,
                 rank: int | None = None) -> None:
        _ValueChecks.__init__(self, dtype, shape, rank, None)
        self.name = name
        self.value = None if value is None else np.asarray(value)
        self.scalar = scalar
        self.apred = pred

    def _m(self, v, st):
        if v is None or v.const_value is None:
            st.fail(f"{_show(v)} is not a constant")
            return
        a = v.const_value
        if self.scalar and a.size != 1:
            st.fail(f"constant '{v.name}' has {a.size} elements, pattern wants a scalar")
            return
        if not self.check(v, st):
            return
        if self.value is not None:
            try:
                same = a.shape == self.value.shape or a.size == self.value.size == 1
                same = same and bool(np.allclose(a.reshape(self.value.shape), self.value))
            except (TypeError, ValueError):
                same = False
            if not same:
                st.fail(f"constant '{v.name}' is not {self.value.tolist()}")
                return
        if self.apred is not None and not self.apred(a):
            st.fail(f"constant '{v.name}' fails the predicate {getattr(self.apred, '__name__', 'pred')}")
            return
        mark = st.mark()
        if self.name is None or st.bind(self.name, v):
            yield
        st.undo(mark)

    def describe(self) -> str:
        val = "" if self.value is None else f"={self.value.tolist()}"
        return f"const {self.name or '_'}{val}{self._checks_desc()}"


class Op(Pattern, _ValueChecks):
    """A value produced by a node of one of ``op_type`` (a name, ``"A|B"`` or a list).

    ``inputs``: patterns for the node's inputs in order; ``...`` as the last accepts any further
    inputs; with no input patterns at all, any inputs are accepted. ``attrs``: attribute name to
    a value (compared with ``==``, ``None`` for "absent") or a predicate on the attribute value;
    absent attributes take the op definition's default where one is known. ``pred(node)`` tests
    the node. ``commutative`` tries inputs 0 and 1 in both orders. ``output`` is the output index
    the value must be (``None``: any). A named Op binds its node (``m["name"]``).
    ``shared=True`` lets the node keep users outside the pattern (it is then not removed).
    """

    def __init__(self, op_type: str | Sequence[str], *inputs: Pattern | None | Any, domain: str | None = "",
                 attrs: dict[str, Any] | None = None, pred: Callable[[Node], bool] | None = None,
                 commutative: bool = False, name: str | None = None, output: int | None = 0,
                 dtype: Any = None, shape: Sequence | None = None, rank: int | None = None,
                 shared: bool = False) -> None:
        _ValueChecks.__init__(self, dtype, shape, rank, None)
        types = op_type.split("|") if isinstance(op_type, str) else list(op_type)
        if not types or not all(isinstance(t, str) and t for t in types):
            raise GEError(f"Op pattern needs op type names, not {op_type!r}")
        self.op_types = tuple(types)
        self.any_inputs = not inputs
        self.variadic = bool(inputs) and inputs[-1] is Ellipsis
        pats = list(inputs[:-1] if self.variadic else inputs)
        self.inputs: list[Pattern] = [Absent() if p is None else _as_pattern(p) for p in pats]
        self.domain = None if domain in (None, "*") else _norm_domain(domain)
        self.attrs = dict(attrs or {})
        self.npred = pred
        self.commutative = commutative
        if commutative and len(self.inputs) < 2:
            raise GEError(f"commutative Op pattern {self.op_types} needs two input patterns")
        self.name = name
        self.output = output
        self.shared = shared

    def _m(self, v, st):
        if v is None:
            st.fail(f"input is absent, pattern wants {self._head()}")
            return
        node = v.producer
        if node is None:
            st.fail(f"{_show(v)} is not produced by a node, pattern wants {self._head()}")
            return
        if node.op_type not in self.op_types:
            st.fail(f"{node.describe()} has op type {node.op_type}, pattern wants {' or '.join(self.op_types)}")
            return
        if self.domain is not None and _norm_domain(node.domain) != self.domain:
            st.fail(f"{node.describe()} is in domain '{node.domain}', pattern wants '{self.domain or 'ai.onnx'}'")
            return
        if self.output is not None and v.index != self.output:
            st.fail(f"{_show(v)} is output {v.index} of its node, pattern wants output {self.output}")
            return
        if not self.check(v, st) or not self._check_attrs(node, st):
            return
        if self.npred is not None and not self.npred(node):
            st.fail(f"{node.describe()} fails the node predicate {getattr(self.npred, '__name__', 'pred')}")
            return
        mark = st.mark()
        if self.name is not None and not st.bind(self.name, node):
            st.undo(mark)
            return
        st.add_node(node)
        if self.shared:
            st.bind(("shared", node), True, overwrite=True)
        yield from self._inputs(node, st)
        st.undo(mark)

    def _check_attrs(self, node: Node, st: _State) -> bool:
        for k, want in self.attrs.items():
            have = node.attrs.get(k, _MISSING)
            if have is _MISSING and st.ops is not None:
                d = st.ops.lookup(node.domain, node.op_type)
                have = d.attrs.get(k, None) if d is not None else None
            if have is _MISSING:
                have = None
            ok = bool(want(have)) if callable(want) else _attr_eq(have, want)
            if not ok:
                st.fail(f"{node.describe()} has {k}={have!r}, pattern wants "
                        f"{getattr(want, '__name__', 'a predicate') if callable(want) else repr(want)}")
                return False
        return True

    def _inputs(self, node: Node, st: _State) -> Iterator[None]:
        if self.any_inputs:
            yield
            return
        vals = list(node.inputs)
        n = len(self.inputs)
        if not self.variadic:
            while len(vals) > n and vals[-1] is None:
                vals.pop()
            if len(vals) > n:
                st.fail(f"{node.describe()} has {len(vals)} inputs, pattern wants {n}")
                return
        vals += [None] * (n - len(vals))
        orders = [list(range(n))]
        if self.commutative:
            orders.append([1, 0] + list(range(2, n)))
        for order in orders:
            yield from _seq(self.inputs, vals, order, node, st)

    def _head(self) -> str:
        return "|".join(self.op_types) + (f" '{self.name}'" if self.name else "")

    def describe(self) -> str:
        args = [] if self.any_inputs else [p.describe() for p in self.inputs]
        if self.variadic:
            args.append("...")
        extra = [f"{k}={getattr(v, '__name__', 'pred') if callable(v) else repr(v)}" for k, v in self.attrs.items()]
        if self.commutative:
            extra.append("commutative")
        inner = ", ".join(args + extra)
        return f"{self._head()}({inner}){self._checks_desc()}"


def _seq(pats: list[Pattern], vals: list[Value | None], order: list[int], node: Node, st: _State,
         i: int = 0) -> Iterator[None]:
    if i == len(pats):
        yield
        return
    if st.explain:
        st.path.append(f"{node.describe()} input {order[i]}")
    try:
        for _ in pats[i]._m(vals[order[i]], st):
            if st.explain:
                st.path.pop()
            try:
                yield from _seq(pats, vals, order, node, st, i + 1)
            finally:
                if st.explain:
                    st.path.append(f"{node.describe()} input {order[i]}")
    finally:
        if st.explain:
            st.path.pop()


def _attr_eq(have: Any, want: Any) -> bool:
    if isinstance(have, np.ndarray) or isinstance(want, np.ndarray):
        try:
            return bool(np.array_equal(np.asarray(have), np.asarray(want)))
        except (TypeError, ValueError):
            return False
    if isinstance(have, (list, tuple)) and isinstance(want, (list, tuple)):
        return list(have) == list(want)
    return bool(have == want)


def _as_pattern(p: Any) -> Pattern:
    if isinstance(p, Pattern):
        return p
    if isinstance(p, str):
        return Var(p)
    raise GEError(f"an input pattern must be a Pattern, a name or None, not {p!r}")


class Alt(Pattern):
    """The first of ``patterns`` that matches (later ones are tried on backtracking)."""

    def __init__(self, *patterns: Pattern, name: str | None = None) -> None:
        if not patterns:
            raise GEError("Alt needs at least one pattern")
        self.options = [_as_pattern(p) for p in patterns]
        self.name = name

    def _m(self, v, st):
        for i, p in enumerate(self.options):
            mark = st.mark()
            if self.name is not None:
                st.bind(self.name, i, overwrite=True)
            yield from p._m(v, st)
            st.undo(mark)

    def describe(self) -> str:
        return "(" + " | ".join(p.describe() for p in self.options) + ")"


def Optional(pattern: Pattern, otherwise: Pattern, name: str | None = None) -> Alt:  # noqa: N802 - a pattern
    """An optional part: ``pattern`` (which wraps ``otherwise``) if it is there, else ``otherwise``.

    ``Optional(Op("Add", conv, Var("bias")), conv)`` matches ``conv + bias`` or just ``conv``;
    ``m.get("bias")`` is None in the second case. ``name`` binds 0 (present) or 1 (absent).
    """
    return Alt(pattern, otherwise, name=name)


class _Hole(Pattern):
    _ids = itertools.count()

    def __init__(self) -> None:
        self.key = ("hole", next(self._ids))

    def _m(self, v, st):
        mark = st.mark()
        st.bind(self.key, v, overwrite=True)
        yield
        st.undo(mark)

    def describe(self) -> str:
        return "…"


class Repeat(Pattern):
    """A chain: ``step`` applied ``min..max`` times on top of ``base``.

    ``step`` is a function from the inner pattern to the step pattern, e.g.
    ``Repeat(lambda inner: Op("Relu|Sigmoid", inner), Var("x"), min=2)`` matches two or more
    such ops in a row. Longer chains are tried first. Names bound inside the step collect a
    tuple (outermost first); ``name`` binds the tuple of the steps' nodes.
    """

    def __init__(self, step: Callable[[Pattern], Pattern], base: Pattern, *, min: int = 1, max: int | None = None,
                 name: str | None = None) -> None:
        self.hole = _Hole()
        self.template = step(self.hole)
        if not isinstance(self.template, Op):
            raise GEError("Repeat's step must build an Op pattern around its argument")
        self.base = _as_pattern(base)
        self.min, self.max, self.name = min, max, name

    def _m(self, v, st):
        yield from self._rep(v, st, 0, ())

    def _rep(self, v, st, count: int, acc: tuple) -> Iterator[None]:
        if self.max is None or count < self.max:
            st.collect += 1
            try:
                for _ in self.template._m(v, st):
                    inner = st.bindings[self.hole.key]
                    st.collect -= 1
                    try:
                        yield from self._rep(inner, st, count + 1, acc + (v.producer,))  # type: ignore[union-attr]
                    finally:
                        st.collect += 1
            finally:
                st.collect -= 1
        if count >= self.min:
            mark = st.mark()
            if self.name is not None:
                st.bind(self.name, acc, overwrite=True)
            yield from self.base._m(v, st)
            st.undo(mark)
        elif not (self.max is None or count < self.max):
            st.fail(f"chain has {count} steps, pattern wants at least {self.min}")

    def describe(self) -> str:
        rng = f"{self.min}..{'' if self.max is None else self.max}"
        return f"repeat[{rng}]({self.template.describe()} on {self.base.describe()})"


# ------------------------------------------------------------------------------------------------
# matches, rules, rewriting
# ------------------------------------------------------------------------------------------------
@dataclass
class Match:
    """One match: named bindings, the matched nodes and the values the roots matched."""

    bindings: dict[str, Any]
    nodes: list[Node]
    roots: list[Value]
    shared: set[Node] = field(default_factory=set)

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
            raise GEError(f"'{name}' is bound to {_show(v)}, not a constant")
        return v.const_value

    @property
    def root(self) -> Value:
        return self.roots[0]


Replacement = Callable[["Rewriter", Match], "Value | Sequence[Value] | None"]


class Rule:
    """A named rewrite: a pattern (or a list of root patterns), an optional condition on the
    match, and a replacement ``replace(rewriter, match)`` that builds new nodes with
    ``rewriter.op(...)`` and returns the value(s) replacing the root(s) (None declines)."""

    def __init__(self, name: str, pattern: Op | Sequence[Op], replace: Replacement | None = None, *,
                 condition: Callable[[Match], bool] | None = None, description: str = "") -> None:
        roots = [pattern] if isinstance(pattern, Pattern) else list(pattern)
        if not roots or not all(isinstance(r, Op) for r in roots):
            raise GEError(f"rule '{name}': roots must be Op patterns (matching anchors on their op type)")
        self.name = name
        self.roots: list[Op] = roots
        self.replace = replace
        self.condition = condition
        self.description = description or (getattr(replace, "__doc__", None) or "").strip().split("\n")[0]

    @property
    def pattern(self) -> Op:
        return self.roots[0]

    @property
    def root_types(self) -> tuple[str, ...]:
        return self.roots[0].op_types

    def __repr__(self) -> str:
        return f"<Rule {self.name}: {', '.join(r.describe() for r in self.roots)}>"

    # -- matching ---------------------------------------------------------------------------
    def _matches(self, node: Node, st: _State) -> Iterator[Match]:
        root = self.roots[0]
        outs = node.outputs if root.output is None else node.outputs[root.output:root.output + 1]
        for v in outs:
            for roots in self._roots(0, [v], root, st):
                shared = {n for n in st.nodes if st.bindings.get(("shared", n))}
                m = Match({k: v for k, v in st.bindings.items() if isinstance(k, str)}, list(st.nodes), list(roots),
                          shared)
                why = self._interior_uses(m)
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

    def _roots(self, k: int, found: list[Value], pat: Op, st: _State) -> Iterator[list[Value]]:
        for _ in pat._m(found[-1], st):
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

    def _interior_uses(self, m: Match) -> str:
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

    def match(self, node: Node, ops=None) -> Match | None:
        """The first match anchored at ``node`` (as the first root), or None."""
        if node.op_type not in self.root_types:
            return None
        st = _State(node.graph, ops)
        for m in self._matches(node, st):
            return m
        return None


class Rewriter:
    """What a replacement uses to build nodes; they are inserted before the (last) root."""

    def __init__(self, graph: Graph, anchor: Node, ops=None) -> None:
        self.graph = graph
        self.anchor = anchor
        self.ops = ops
        self.created: list[Node] = []

    def op(self, op_type: str, *inputs: Value | None, domain: str = "", name: str | None = None,
           num_outputs: int = 1, output_types: Sequence[TensorType | None] | None = None, **attrs: Any):
        """Add a node; returns its output value (a tuple when ``num_outputs > 1``)."""
        node = self.graph.add_node(op_type, list(inputs), attrs, domain=domain, name=name or op_type.lower(),
                                   num_outputs=num_outputs, output_types=output_types, before=self.anchor)
        self.created.append(node)
        if domain and domain not in self.graph.opset_imports:
            self.graph.opset_imports[domain] = 1
        if self.ops is not None:
            try:
                self.ops.infer_node(node, self.graph.opset_imports)
            except GEError:
                pass
        return node.outputs[0] if num_outputs == 1 else tuple(node.outputs)

    def const(self, array: Any, name: str | None = None) -> Value:
        """Add a constant."""
        return self.graph.add_constant(np.asarray(array), self.graph.fresh_name(name or "const"))

    def rollback(self) -> None:
        for n in reversed(self.created):
            for v in n.outputs:
                if v.has_uses():
                    break
            else:
                self.graph.remove_node(n)
        self.created.clear()


def apply_match(rule: Rule, m: Match, graph: Graph, ops=None, positions: dict[Node, int] | None = None) -> bool:
    """Run ``rule``'s replacement for ``m`` and splice it in; True if the graph changed."""
    if rule.replace is None:
        return False
    root_nodes = [v.producer for v in m.roots]
    anchor = root_nodes[0]
    if len(root_nodes) > 1:
        pos = positions or {n: i for i, n in enumerate(graph.nodes)}
        anchor = max(root_nodes, key=lambda n: pos.get(n, -1))  # type: ignore[arg-type]
    assert anchor is not None
    rw = Rewriter(graph, anchor, ops)
    try:
        out = rule.replace(rw, m)
    except GEError:
        rw.rollback()
        raise
    except Exception as e:
        rw.rollback()
        raise GEError(f"rule '{rule.name}': replacement raised {type(e).__name__}: {e} at {anchor.describe()}") from e
    if out is None:
        rw.rollback()
        return False
    new = [out] if isinstance(out, Value) else list(out)
    if len(new) != len(m.roots) or not all(isinstance(x, Value) for x in new):
        rw.rollback()
        raise GEError(f"rule '{rule.name}': the replacement must return {len(m.roots)} value(s), one per root")
    for old, nv in zip(m.roots, new):
        if nv.type.dtype is None and nv.type.shape is None:
            nv.type = old.type
        old.replace_all_uses_with(nv)
    _remove_dead(graph, m)
    return True


def _remove_dead(graph: Graph, m: Match) -> None:
    doomed = {n for n in m.nodes if n.graph is graph}
    changed = True
    while changed:
        changed = False
        for n in list(doomed):
            if any(v.is_graph_output or any(u not in doomed for u in v.users) for v in n.outputs):
                doomed.discard(n)
                changed = True
    consts = {n_in for n in doomed for n_in in n.inputs if n_in is not None and n_in.is_constant}
    if doomed:
        graph.remove_nodes(doomed)
    for c in consts:
        if not c.has_uses() and not c.is_graph_output and c.graph is graph and c.name in graph.constants:
            graph.remove_constant(c)


# ------------------------------------------------------------------------------------------------
# entry points
# ------------------------------------------------------------------------------------------------
def _rule_of(pattern: Rule | Op | Sequence[Op]) -> Rule:
    return pattern if isinstance(pattern, Rule) else Rule("pattern", pattern)


def match(pattern: Rule | Op | Sequence[Op], node: Node, ops=None) -> Match | None:
    """The first match of ``pattern`` anchored at ``node``, or None."""
    return _rule_of(pattern).match(node, ops)


def match_all(graph: Graph, pattern: Rule | Op | Sequence[Op], ops=None) -> list[Match]:
    """Every match in ``graph`` (one per anchor node), found through the op-type index."""
    rule = _rule_of(pattern)
    out = []
    for n in _index(graph, set(rule.root_types)):
        m = rule.match(n, ops)
        if m is not None:
            out.append(m)
    return out


def _index(graph: Graph, types: set[str]) -> list[Node]:
    return [n for n in graph.nodes if n.op_type in types]


def apply_rules(graph: Graph, rules: Iterable[Rule], *, ops=None, max_sweeps: int = 10,
                enabled: Callable[[str], bool] | None = None, stats: dict[str, int] | None = None) -> bool:
    """Apply ``rules`` until none matches (at most ``max_sweeps`` sweeps); True if changed.

    Each sweep walks the graph once to index nodes by op type, then tries each rule only at
    nodes of its root op types. ``enabled(rule_name)`` can turn rules off; ``stats`` counts
    rewrites per rule.
    """
    rules = [r for r in rules if enabled is None or enabled(r.name)]
    wanted = {t for r in rules for t in r.root_types}
    changed_any = False
    for _ in range(max_sweeps):
        index: dict[str, list[Node]] = {}
        positions: dict[Node, int] = {}
        for i, n in enumerate(graph.nodes):
            positions[n] = i
            if n.op_type in wanted:
                index.setdefault(n.op_type, []).append(n)
        changed = False
        resort = False
        for rule in rules:
            for t in rule.root_types:
                for n in index.get(t, ()):
                    if n.graph is not graph:
                        continue
                    m = rule.match(n, ops)
                    if m is None:
                        continue
                    if apply_match(rule, m, graph, ops, positions):
                        changed = True
                        resort |= len(m.roots) > 1
                        if stats is not None:
                            stats[rule.name] = stats.get(rule.name, 0) + 1
        if resort:
            graph.topological_sort()
        changed_any |= changed
        if not changed:
            break
    return changed_any


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


def explain(pattern: Rule | Op | Sequence[Op], node: Node, ops=None) -> Explanation:
    """Try ``pattern`` at ``node`` and say why it did not match (the deepest failure)."""
    rule = _rule_of(pattern)
    st = _State(node.graph, ops, explain=True)
    for m in rule._matches(node, st):
        return Explanation(True, node, match=m)
    if node.op_type not in rule.root_types and st.failure is None:
        return Explanation(False, node, f"{node.describe()} has op type {node.op_type}, pattern wants "
                                        f"{' or '.join(rule.root_types)}")
    if st.failure is None:
        return Explanation(False, node, "no candidate matched")
    _, path, reason = st.failure
    return Explanation(False, node, reason, path)


class RewritePass(Pass):
    """A pass that applies rules (by default in the ``fuse`` stage) until none matches.

    A rule is skipped when the fusion switch file turns its name off. ``ctx.stats`` gets the
    count of rewrites per rule under ``rewrites``.
    """

    def __init__(self, name: str, rules: Sequence[Rule], *, stage: str = "fuse", opt_level: int = 1,
                 description: str = "", **attrs: Any) -> None:
        self.rules = list(rules)
        attrs.update(name=name, stage=stage, opt_level=opt_level,
                     description=description or f"apply rewrite rules {', '.join(r.name for r in self.rules)}")
        for k, v in attrs.items():
            setattr(self, k, v)

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        opts = ctx.options
        enabled = getattr(opts, "pass_enabled_by_switch", None)
        stats = ctx.stats.setdefault("rewrites", {}) if isinstance(ctx.stats, dict) else None
        return apply_rules(graph, self.rules, ops=ctx.registries.ops if ctx.registries is not None else None,
                           enabled=enabled, stats=stats)
