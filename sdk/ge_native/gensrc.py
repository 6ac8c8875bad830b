"""Generated Python source built from validated tokens only.

Plugins that write Python source at build time (ge_fusion's fused kernels and compiled loops,
the cpu backend's sink mode and window loops) hold to one rule: **nothing read from a model
reaches the source text**. Source is made of

* identifiers the generator made itself from a fixed prefix and an int (:func:`name`: ``t3``,
  ``a0``) or took from a fixed set (:func:`ident`);
* literals through :func:`literal`: the ``repr`` of an int, a finite float, a bool or None;

and everything else a model holds (node and value names, attribute values, constants) goes into
the namespace the code runs in, as objects bound to generator-made names.

:func:`compile_checked` is the second line: it parses the finished source and refuses any
name, attribute, keyword, string, import or statement outside the vocabulary the generator
declared (:class:`Vocabulary`), so a token that slipped past the first line (a generator bug)
still cannot become code. Comments vanish in the parse; text that a newline turned from a
comment into code is checked like any other.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z", re.ASCII)


class SourceTokenError(ValueError):
    """A token or a generated source is not made of validated tokens (never compiled)."""


def _plain(text: Any) -> bool:
    return (isinstance(text, str) and bool(_IDENT.match(text)) and not keyword.iskeyword(text)
            and not text.startswith("__"))


def ident(text: Any, allowed: Iterable[str] | None = None) -> str:
    """``text`` if it is a plain ASCII identifier (no keyword, no dunder) and, given ``allowed``,
    one of those; else :class:`SourceTokenError`."""
    if not _plain(text):
        raise SourceTokenError(f"{text!r} is not a plain identifier")
    if allowed is not None and text not in allowed:
        raise SourceTokenError(f"{text!r} is not one of the allowed names")
    return text


def index(i: Any) -> int:
    """``i`` if it is a non-negative int (not a bool); else :class:`SourceTokenError`."""
    if type(i) is not int or i < 0:
        raise SourceTokenError(f"{i!r} is not a non-negative int")
    return i


def name(prefix: str, i: Any) -> str:
    """A generator-made identifier: ``prefix`` (a plain identifier) followed by int ``i``."""
    return ident(ident(prefix) + str(index(i)))


def literal(v: Any) -> str:
    """The source form of int / finite float / bool / None ``v``; else :class:`SourceTokenError`
    (NaN and infinities print as names: bind them in the namespace instead)."""
    if v is None or type(v) is bool:
        return repr(v)
    if type(v) is int:
        return repr(v)
    if type(v) is float:
        if not math.isfinite(v):
            raise SourceTokenError(f"{v!r} has no literal form")
        return repr(v)
    raise SourceTokenError(f"{type(v).__name__} {v!r} is not a number, bool or None")


def label(text: Any, limit: int = 48) -> str:
    """``text`` reduced to ``[A-Za-z0-9_.-]`` (at most ``limit`` characters): for a file name or a
    thread name shown next to generated code, never for the code itself."""
    s = re.sub(r"[^A-Za-z0-9_.\-]", "_", str(text), flags=re.ASCII)
    return s[:limit]


#: statement and expression nodes generated code may contain (no class, lambda, comprehension,
#: with, try, global, f-string, starred, walrus, yield, await)
_NODES: tuple[type, ...] = (
    ast.Module, ast.Expression, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign,
    ast.Delete, ast.For, ast.While, ast.If, ast.Expr, ast.Pass, ast.Break, ast.Continue, ast.Import, ast.alias,
    ast.Call, ast.keyword, ast.Name, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Constant,
    ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp,
    ast.Load, ast.Store, ast.Del,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
    ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot,
    ast.BitOr, ast.BitAnd,
)


@dataclass(frozen=True)
class Vocabulary:
    """What one generator's source may contain.

    ``names``: exact identifiers (builtins included); ``patterns``: regular expressions a
    generator-made name fully matches (``r"t\\d+"``); ``attributes``: attribute names after a
    dot; ``keywords``: keyword-argument names; ``strings``: string constants; ``modules``:
    modules ``import`` may name (``import numpy as np`` also needs ``np`` in ``names``).
    """

    names: frozenset[str] = frozenset()
    patterns: tuple[str, ...] = ()
    attributes: frozenset[str] = frozenset()
    keywords: frozenset[str] = frozenset()
    strings: frozenset[str] = frozenset()
    modules: frozenset[str] = frozenset()
    _compiled: tuple[re.Pattern, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", tuple(re.compile(p + r"\Z", re.ASCII) for p in self.patterns))

    def identity(self) -> str:
        """A text that is the same for equal vocabularies in every process (set order varies)."""
        return "\0".join([*(",".join(sorted(getattr(self, f))) for f in ("names", "attributes", "keywords", "strings",
                                                                          "modules")), *self.patterns])

    def name_ok(self, n: str) -> bool:
        return _plain(n) and (n in self.names or any(p.match(n) for p in self._compiled))


def check_source(src: str, vocab: Vocabulary, *, mode: str = "exec", what: str = "generated code") -> ast.AST:
    """Parse ``src`` and refuse (:class:`SourceTokenError`) anything outside ``vocab``."""
    if not isinstance(src, str) or not src.isascii() or "\x00" in src:
        raise SourceTokenError(f"{what} is not plain ASCII text")
    try:
        tree = ast.parse(src, mode=mode)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise SourceTokenError(f"{what} does not parse: {type(e).__name__}") from None

    def bad(node: ast.AST, why: str) -> SourceTokenError:
        return SourceTokenError(f"{what}, line {getattr(node, 'lineno', '?')}: {why}")

    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise bad(node, f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.Name):
            if not vocab.name_ok(node.id):
                raise bad(node, f"name {node.id!r} is not in the vocabulary")
        elif isinstance(node, ast.Attribute):
            if node.attr not in vocab.attributes or not _plain(node.attr):
                raise bad(node, f"attribute {node.attr!r} is not in the vocabulary")
        elif isinstance(node, ast.keyword):
            if node.arg is None or node.arg not in vocab.keywords:
                raise bad(node, f"keyword {node.arg!r} is not in the vocabulary")
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, str):
                if v not in vocab.strings:
                    raise bad(node, f"string {v!r} is not in the vocabulary")
            elif not (v is None or type(v) in (bool, int) or (type(v) is float and math.isfinite(v))):
                raise bad(node, f"constant {type(v).__name__} {v!r} is not allowed")
        elif isinstance(node, ast.FunctionDef):
            if not vocab.name_ok(node.name):
                raise bad(node, f"function name {node.name!r} is not in the vocabulary")
        elif isinstance(node, ast.arg):
            if not vocab.name_ok(node.arg) or node.annotation is not None:
                raise bad(node, f"parameter {node.arg!r} is not in the vocabulary")
        elif isinstance(node, ast.arguments):
            if node.vararg is not None or node.kwarg is not None:
                raise bad(node, "*args / **kwargs are not allowed")
        elif isinstance(node, ast.alias):
            if node.name not in vocab.modules or (node.asname is not None and not vocab.name_ok(node.asname)):
                raise bad(node, f"import of {node.name!r} is not allowed")
            if node.asname is None and not vocab.name_ok(node.name):
                raise bad(node, f"import of {node.name!r} is not allowed")
    return tree


def compile_checked(src: str, filename: str, vocab: Vocabulary, *, mode: str = "exec", cache: bool = False) -> CodeType:
    """:func:`check_source`, then ``compile``: the only way generated source becomes code.
    ``filename`` is the generator's own (build it with :func:`label` from anything else).

    ``cache``: keep the compiled code in the user's kernel cache (:mod:`ge_native.native`: a folder
    only this user can write, every entry checked against its SHA-256), keyed by the source, the
    vocabulary and the interpreter, so a later process compiling the same source reads it back
    instead of checking and compiling again (a large model's generated executor: ~50 ms). Only
    source that passed the check is ever stored, and an entry is found only by its source's hash."""
    key = None
    if cache:
        import hashlib
        import marshal
        import sys

        from . import native

        ident = "\0".join([src, filename, mode, vocab.identity(), sys.version, str(native.ABI)])
        key = "code_" + hashlib.sha256(ident.encode()).hexdigest()[:32]
        data = native.read_data(key)
        if data is not None:
            try:
                code = marshal.loads(data)
            except (ValueError, EOFError, TypeError):
                code = None
            if isinstance(code, CodeType):
                return code
    tree = check_source(src, vocab, mode=mode, what=f"generated code {filename}")
    code = compile(tree, filename, mode)  # type: ignore[call-overload]  # the checked tree, not parsed twice
    if key is not None:
        import marshal

        from . import native

        native.write_data(key, marshal.dumps(code))
    return code
