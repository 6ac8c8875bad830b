"""Symbolic dims: a dim computed from the model's symbolic sizes (``batch*seq*64``, ``min(seq,512)``).

A :data:`~ge_core.ir.types.Dim` is an int, a symbol name (``"batch"``), ``None`` (unknown), or a
:class:`SymExpr`: a polynomial with integer coefficients whose atoms are symbols or the opaque
terms ``min(a,b)``, ``max(a,b)`` and ``floor(a/k)``. Expressions are kept in a canonical form, so
two equal expressions compare equal (sharing and broadcasting decide by ``==``). A constant
normalises to an int and a lone symbol to its name (:func:`norm`).

Every symbol stands for a size: at run time a symbol takes the value of the input dim it names,
and the planned path (:mod:`ge_core.memory`) only runs with every symbol at least 1, which is
what lets ``max(seq - 1, 0)`` simplify to ``seq - 1``.

Expressions are data: :func:`to_json` / :func:`from_json` store them in an .om, the reader bounded
(terms, depth, coefficients, names) as everything an .om holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

#: Bounds of a stored expression (what :func:`from_json` accepts).
MAX_TERMS = 32
MAX_DEPTH = 6
MAX_POWER = 8
MAX_COEFF = 1 << 62
MAX_NAME = 256

Atom = Union[str, tuple]  # a symbol name, or ("min"|"max", SymExpr, SymExpr) / ("floor", SymExpr, k)
Monomial = tuple  # ((atom, power), ...) sorted by atom key


def _key(atom: Atom) -> tuple:
    return (0, atom) if isinstance(atom, str) else (1, atom[0], repr(atom[1:]))


class SymExpr:
    """A canonical polynomial over atoms: ``{monomial: coefficient}`` without zero terms."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, int]) -> None:
        self.terms = tuple(sorted(((m, c) for m, c in terms.items() if c), key=lambda t: [_key(a) + (p,) for a, p in t[0]]))
        self._hash = hash(self.terms)

    # -- construction -----------------------------------------------------------------------
    @staticmethod
    def of(d: Any) -> SymExpr:
        """The expression of a dim (int, symbol name or SymExpr)."""
        if isinstance(d, SymExpr):
            return d
        if isinstance(d, bool):
            raise TypeError("a dim is not a bool")
        if isinstance(d, int):
            return SymExpr({(): d})
        if isinstance(d, str):
            return SymExpr({((d, 1),): 1})
        raise TypeError(f"not a dim: {d!r}")

    @staticmethod
    def atom(a: Atom) -> SymExpr:
        return SymExpr({((a, 1),): 1})

    # -- views -----------------------------------------------------------------------------
    @property
    def constant(self) -> int:
        for m, c in self.terms:
            if not m:
                return c
        return 0

    def symbols(self) -> set[str]:
        """Every symbol name the expression reads (inside min/max/floor too)."""
        out: set[str] = set()
        for m, _ in self.terms:
            for a, _ in m:
                if isinstance(a, str):
                    out.add(a)
                else:
                    for x in a[1:]:
                        if isinstance(x, SymExpr):
                            out |= x.symbols()
        return out

    def evaluate(self, binding: Mapping[str, int]) -> int:
        """The value with each symbol bound (KeyError for an unbound one)."""
        total = 0
        for m, c in self.terms:
            v = c
            for a, p in m:
                v *= _eval_atom(a, binding) ** p
            total += v
        return total

    def monotone(self) -> bool:
        """True when every coefficient but the constant is positive and every atom is monotone
        (so the expression's least value, over symbols >= 1, is at every symbol = 1)."""
        return all(c > 0 and all(_monotone_atom(a) for a, _ in m) for m, c in self.terms if m)

    def least(self) -> int | None:
        """A lower bound over symbols >= 1 when :meth:`monotone`, else None."""
        if not self.monotone():
            return None
        return self.evaluate(_Ones())

    # -- arithmetic --------------------------------------------------------------------------
    def __add__(self, other: Any) -> SymExpr:
        o = SymExpr.of(other)
        t = dict(self.terms)
        for m, c in o.terms:
            t[m] = t.get(m, 0) + c
        return SymExpr(t)

    __radd__ = __add__

    def __neg__(self) -> SymExpr:
        return SymExpr({m: -c for m, c in self.terms})

    def __sub__(self, other: Any) -> SymExpr:
        return self + (-SymExpr.of(other))

    def __rsub__(self, other: Any) -> SymExpr:
        return SymExpr.of(other) - self

    def __mul__(self, other: Any) -> SymExpr:
        o = SymExpr.of(other)
        t: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in o.terms:
                m = _mono_mul(m1, m2)
                t[m] = t.get(m, 0) + c1 * c2
        return SymExpr(t)

    __rmul__ = __mul__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymExpr):
            return self.terms == other.terms
        if isinstance(other, (int, str)) and not isinstance(other, bool):
            return self.terms == SymExpr.of(other).terms
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"SymExpr({self})"

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms, key=lambda t: not t[0]):  # the constant last
            factors = [_atom_str(a) + (f"^{p}" if p > 1 else "") for a, p in m]
            if not factors:
                parts.append(str(c))
            elif c == 1:
                parts.append("*".join(factors))
            elif c == -1:
                parts.append("-" + "*".join(factors))
            else:
                parts.append(f"{c}*" + "*".join(factors))
        s = " + ".join(parts)
        return s.replace("+ -", "- ")


class _Ones(dict):
    def __missing__(self, key: str) -> int:
        return 1


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    d: dict[Atom, int] = dict(a)
    for x, p in b:
        d[x] = d.get(x, 0) + p
    return tuple(sorted(d.items(), key=lambda t: _key(t[0])))


def _eval_atom(a: Atom, binding: Mapping[str, int]) -> int:
    if isinstance(a, str):
        return int(binding[a])
    kind = a[0]
    if kind == "min":
        return min(a[1].evaluate(binding), a[2].evaluate(binding))
    if kind == "max":
        return max(a[1].evaluate(binding), a[2].evaluate(binding))
    return a[1].evaluate(binding) // a[2]  # floor


def _monotone_atom(a: Atom) -> bool:
    return isinstance(a, str) or all(not isinstance(x, SymExpr) or x.monotone() for x in a[1:])


def _atom_str(a: Atom) -> str:
    if isinstance(a, str):
        return a
    if a[0] == "floor":
        return f"floor(({a[1]})/{a[2]})"
    return f"{a[0]}({a[1]},{a[2]})"


# ------------------------------------------------------------------------------------------
# dims
# ------------------------------------------------------------------------------------------
def norm(e: SymExpr) -> Any:
    """An expression as a dim: an int when constant, the name for a lone symbol, else itself."""
    if not e.terms:
        return 0
    if len(e.terms) == 1:
        m, c = e.terms[0]
        if not m:
            return c
        if c == 1 and len(m) == 1 and m[0][1] == 1 and isinstance(m[0][0], str):
            return m[0][0]
    return e


def is_symbolic(d: Any) -> bool:
    return isinstance(d, (str, SymExpr))


def _known(*ds: Any) -> bool:
    return all(d is not None for d in ds)


def add(a: Any, b: Any) -> Any:
    return None if not _known(a, b) else norm(SymExpr.of(a) + b)


def sub(a: Any, b: Any) -> Any:
    return None if not _known(a, b) else norm(SymExpr.of(a) - b)


def mul(a: Any, b: Any) -> Any:
    return None if not _known(a, b) else norm(SymExpr.of(a) * b)


def prod(ds: Any) -> Any:
    out: Any = 1
    for d in ds:
        out = mul(out, d)
    return out


def floordiv(a: Any, k: Any) -> Any:
    """``a // k`` for an int ``k > 0`` (exact when every coefficient divides), else None."""
    if a is None or not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        return None
    if isinstance(a, int):
        return a // k
    e = SymExpr.of(a)
    if k == 1:
        return norm(e)
    if all(c % k == 0 for _, c in e.terms):
        return norm(SymExpr({m: c // k for m, c in e.terms}))
    return norm(SymExpr.atom(("floor", e, k)))


def exact_div(a: Any, b: Any) -> Any:
    """``a / b`` when ``b`` divides ``a`` exactly as polynomials (``b`` one term), else None."""
    if not _known(a, b):
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b and a % b == 0 else None
    ea, eb = SymExpr.of(a), SymExpr.of(b)
    if len(eb.terms) != 1:
        return a if ea == eb else None
    mb, cb = eb.terms[0]
    if cb == 0:
        return None
    out: dict[Monomial, int] = {}
    for m, c in ea.terms:
        d = dict(m)
        for x, p in mb:
            if d.get(x, 0) < p:
                return None
            d[x] -= p
        if c % cb:
            return None
        out[tuple(sorted(((x, p) for x, p in d.items() if p), key=lambda t: _key(t[0])))] = c // cb
    return norm(SymExpr(out))


def _minmax(kind: str, a: Any, b: Any) -> Any:
    if not _known(a, b):
        return None
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b) if kind == "min" else max(a, b)
    ea, eb = SymExpr.of(a), SymExpr.of(b)
    if ea == eb:
        return norm(ea)
    diff = ea - eb
    low = diff.least()
    if low is not None and low >= 0:  # a >= b for every symbol >= 1
        return norm(eb if kind == "min" else ea)
    low = (-diff).least()
    if low is not None and low >= 0:  # b >= a
        return norm(ea if kind == "min" else eb)
    other = "max" if kind == "min" else "min"
    for x, y in ((ea, eb), (eb, ea)):  # max(e, min(e, z)) = e, min(e, max(e, z)) = e
        atom = _lone_atom(y)
        if atom is not None and atom[0] == other and x in (atom[1], atom[2]):
            return norm(x)
    lo, hi = sorted((ea, eb), key=lambda e: repr(e.terms))
    return norm(SymExpr.atom((kind, lo, hi)))


def _lone_atom(e: SymExpr) -> tuple | None:
    if len(e.terms) == 1:
        m, c = e.terms[0]
        if c == 1 and len(m) == 1 and m[0][1] == 1 and isinstance(m[0][0], tuple):
            return m[0][0]
    return None


def dmin(a: Any, b: Any) -> Any:
    return _minmax("min", a, b)


def dmax(a: Any, b: Any) -> Any:
    return _minmax("max", a, b)


def symbols_of(d: Any) -> set[str]:
    if isinstance(d, str):
        return {d}
    if isinstance(d, SymExpr):
        return d.symbols()
    return set()


def evaluate(d: Any, binding: Mapping[str, int]) -> int:
    """The int value of a dim under ``binding`` (KeyError for an unbound symbol, TypeError for None)."""
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        return int(binding[d])
    if isinstance(d, SymExpr):
        return d.evaluate(binding)
    raise TypeError("an unknown dim has no value")


# ------------------------------------------------------------------------------------------
# storage: JSON with bounds
# ------------------------------------------------------------------------------------------
def to_json(e: SymExpr) -> dict[str, Any]:
    """``{"poly": [[coefficient, [[atom, power], ...]], ...]}``; an atom is a name, or
    ``["min"|"max", expr, expr]`` / ``["floor", expr, k]``."""
    return {"poly": [[c, [[_atom_json(a), p] for a, p in m]] for m, c in e.terms]}


def _atom_json(a: Atom) -> Any:
    if isinstance(a, str):
        return a
    if a[0] == "floor":
        return ["floor", to_json(a[1]), a[2]]
    return [a[0], to_json(a[1]), to_json(a[2])]


def from_json(d: Any, depth: int = 0) -> SymExpr:
    """The expression :func:`to_json` wrote; ValueError for anything else (bounded)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"an expression nests deeper than {MAX_DEPTH}")
    if not isinstance(d, dict) or set(d) != {"poly"} or not isinstance(d["poly"], list):
        raise ValueError("an expression is {\"poly\": [...]}")
    terms = d["poly"]
    if len(terms) > MAX_TERMS:
        raise ValueError(f"an expression has more than {MAX_TERMS} terms")
    out: dict[Monomial, int] = {}
    for t in terms:
        if not isinstance(t, list) or len(t) != 2 or not _int(t[0], -MAX_COEFF, MAX_COEFF) or not isinstance(t[1], list):
            raise ValueError("a term is [coefficient, [[atom, power], ...]]")
        if len(t[1]) > MAX_TERMS:
            raise ValueError("a term has too many factors")
        m: dict[Atom, int] = {}
        for f in t[1]:
            if not isinstance(f, list) or len(f) != 2 or not _int(f[1], 1, MAX_POWER):
                raise ValueError(f"a factor is [atom, power 1..{MAX_POWER}]")
            a = _atom_from(f[0], depth)
            if a in m:
                raise ValueError("a term repeats a factor")
            m[a] = f[1]
        key = tuple(sorted(m.items(), key=lambda x: _key(x[0])))
        if key in out:
            raise ValueError("an expression repeats a term")
        out[key] = t[0]
    e = SymExpr(out)
    if len(e.terms) != len(out):
        raise ValueError("an expression has a zero coefficient")
    return e


def _atom_from(a: Any, depth: int) -> Atom:
    if isinstance(a, str):
        if not 0 < len(a) <= MAX_NAME:
            raise ValueError(f"a symbol name has 1..{MAX_NAME} characters")
        return a
    if isinstance(a, list) and len(a) == 3 and a[0] in ("min", "max"):
        return (a[0], *sorted((from_json(a[1], depth + 1), from_json(a[2], depth + 1)), key=lambda e: repr(e.terms)))
    if isinstance(a, list) and len(a) == 3 and a[0] == "floor" and _int(a[2], 2, MAX_COEFF):
        return ("floor", from_json(a[1], depth + 1), a[2])
    raise ValueError("an atom is a name, [\"min\"|\"max\", expr, expr] or [\"floor\", expr, k]")


def _int(x: Any, lo: int, hi: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi
