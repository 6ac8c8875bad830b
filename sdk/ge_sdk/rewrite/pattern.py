"""Patterns: what a rewrite looks for, as ordinary Python objects.

A pattern matches one value by how it was computed:

* :class:`Op` — a value produced by a node of one of the given op types (alternatives as a
  list or ``"Add|Sub"``), with input patterns (``...`` as the last one accepts any further
  inputs, ``None`` an absent optional input), attribute values or predicates, a node predicate,
  dtype/shape/rank predicates, ``commutative=True`` (inputs 0 and 1 in either order) and
  ``output=i`` for an output of a multi-output node;
* :class:`Var` — a wildcard; a name binds it, and the same name twice must be the same value;
* :class:`Const` — a constant (initializer), optionally with a value or predicate;
* :class:`Alt` — the first of several patterns that matches; :func:`Optional` — an optional
  part, ``Optional(Op("Add", inner, Var("bias")), inner)``;
* :class:`Repeat` — a chain of one step repeated ``min..max`` times.

An :class:`Op` pattern matches only nodes of the graph the match is anchored in: inside an
If/Loop/Scan body a pattern never reaches into the enclosing graph's nodes (it may read its
values and constants). ``Pattern.match_value(value, state)`` is the protocol a new kind of
pattern implements.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ge_core.errors import GEError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType

__all__ = ["Pattern", "Op", "Var", "Const", "Alt", "Optional", "Repeat", "Absent", "MatchState", "show", "as_pattern"]

_MISSING = object()

# ------------------------------------------------------------------------------------------------
# matching state (bindings with an undo trail, failure tracking for explain)
# ------------------------------------------------------------------------------------------------
class MatchState:
    """The state of one matching attempt: bindings with an undo trail, the matched nodes, and
    (with ``explain=True``) the deepest failure seen, for :func:`ge_sdk.rewrite.explain`."""

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
            self.fail(f"'{key}' is already bound to {show(old)}, here it would be {show(obj)}")
            return False
        else:
            new = obj
        self.trail.append(("b", key, old))
        self.bindings[key] = new
        return True

    def bound(self, key: Any, obj: Any) -> Iterator[None]:
        """Yield once with ``key`` bound to ``obj`` (nothing when it is bound to another
        object; a None key binds nothing), then undo the binding."""
        mark = self.mark()
        if key is None or self.bind(key, obj):
            yield
        self.undo(mark)

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


def show(obj: Any) -> str:
    """A short description of a node, value or binding, for messages."""
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

    def match_value(self, v: Value | None, st: MatchState) -> Iterator[None]:  # pragma: no cover - interface
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

    def check(self, v: Value, st: MatchState) -> bool:
        t: TensorType = v.type
        if self.dtypes is not None and t.dtype not in self.dtypes:
            st.fail(f"{show(v)} has dtype {t.dtype}, pattern wants {' or '.join(sorted(str(d) for d in self.dtypes))}")
            return False
        if self.rank is not None and t.rank != self.rank:
            st.fail(f"{show(v)} has rank {t.rank}, pattern wants {self.rank}")
            return False
        if self.shape is not None:
            if t.shape is None or len(t.shape) != len(self.shape) or any(
                w is not None and (not callable(w) and d != w or callable(w) and not w(d))
                for d, w in zip(t.shape, self.shape)
            ):
                st.fail(f"{show(v)} has shape {t}, pattern wants {list(self.shape)}")
                return False
        if self.vpred is not None and not self.vpred(v):
            st.fail(f"{show(v)} fails the value predicate {getattr(self.vpred, '__name__', 'pred')}")
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

    def match_value(self, v, st):
        if v is None:
            if self.optional:
                yield
            else:
                st.fail(f"input is absent, pattern wants {self.describe()}")
            return
        if not self.check(v, st):
            return
        yield from st.bound(self.name, v)

    def describe(self) -> str:
        return f"${self.name or '_'}{self._checks_desc()}"


class Absent(Pattern):
    """Matches an absent optional input only."""

    def match_value(self, v, st):
        if v is None:
            yield
        else:
            st.fail(f"{show(v)} is present, pattern wants an absent input")

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

    def match_value(self, v, st):
        if v is None or v.const_value is None:
            st.fail(f"{show(v)} is not a constant")
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
        yield from st.bound(self.name, v)

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
        self.inputs: list[Pattern] = [Absent() if p is None else as_pattern(p) for p in pats]
        self.domain = None if domain in (None, "*") else _norm_domain(domain)
        self.attrs = dict(attrs or {})
        self.npred = pred
        self.commutative = commutative
        if commutative and len(self.inputs) < 2:
            raise GEError(f"commutative Op pattern {self.op_types} needs two input patterns")
        self.name = name
        self.output = output
        self.shared = shared

    def match_value(self, v, st):
        if v is None:
            st.fail(f"input is absent, pattern wants {self._head()}")
            return
        node = v.producer
        if node is None:
            st.fail(f"{show(v)} is not produced by a node, pattern wants {self._head()}")
            return
        if st.graph is not None and node.graph is not st.graph:
            st.fail(f"{node.describe()} is in another graph than the match (an enclosing or nested graph)")
            return
        if node.op_type not in self.op_types:
            st.fail(f"{node.describe()} has op type {node.op_type}, pattern wants {' or '.join(self.op_types)}")
            return
        if self.domain is not None and _norm_domain(node.domain) != self.domain:
            st.fail(f"{node.describe()} is in domain '{node.domain}', pattern wants '{self.domain or 'ai.onnx'}'")
            return
        if self.output is not None and v.index != self.output:
            st.fail(f"{show(v)} is output {v.index} of its node, pattern wants output {self.output}")
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

    def _check_attrs(self, node: Node, st: MatchState) -> bool:
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

    def _inputs(self, node: Node, st: MatchState) -> Iterator[None]:
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


def _seq(pats: list[Pattern], vals: list[Value | None], order: list[int], node: Node, st: MatchState,
         i: int = 0) -> Iterator[None]:
    if i == len(pats):
        yield
        return
    if st.explain:
        st.path.append(f"{node.describe()} input {order[i]}")
    try:
        for _ in pats[i].match_value(vals[order[i]], st):
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


def as_pattern(p: Any) -> Pattern:
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
        self.options = [as_pattern(p) for p in patterns]
        self.name = name

    def match_value(self, v, st):
        for i, p in enumerate(self.options):
            mark = st.mark()
            if self.name is not None:
                st.bind(self.name, i, overwrite=True)
            yield from p.match_value(v, st)
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

    def match_value(self, v, st):
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
        self.base = as_pattern(base)
        self.min, self.max, self.name = min, max, name

    def match_value(self, v, st):
        yield from self._rep(v, st, 0, ())

    def _rep(self, v, st, count: int, acc: tuple) -> Iterator[None]:
        if self.max is None or count < self.max:
            st.collect += 1
            try:
                for _ in self.template.match_value(v, st):
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
            yield from self.base.match_value(v, st)
            st.undo(mark)
        elif not (self.max is None or count < self.max):
            st.fail(f"chain has {count} steps, pattern wants at least {self.min}")

    def describe(self) -> str:
        rng = f"{self.min}..{'' if self.max is None else self.max}"
        return f"repeat[{rng}]({self.template.describe()} on {self.base.describe()})"


