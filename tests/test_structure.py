"""Structural rules of the shipped code (``ge_core``, ``plugins``, ``sdk``), issue 43: files of a
size a person reads.

* no string literal over 2,000 characters (docstrings included) and no C ``#include`` directive
  in a string literal: C lives in ``.c`` / ``.h`` files, long prose in ``docs/``, templates in
  package data;
* no function (``def`` / ``async def``, methods and nested functions included) over 150 lines;
* ``ge_fusion`` registers no kernels: it rewrites graphs, a backend runs them.

The other rules of the issue have their own tests: no import cycle among ``ge_core`` modules
(tests/core/test_core_chain.py), no op-type literal in ``ge_core`` (tests/core/test_core_literals.py),
no access to another package's private names (tests/test_layering.py). Each rule lists every offender as ``file:line: name``; the checkers are
also tested on small sources, so a rule that finds nothing is known to be able to find something.
"""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("ge_core", "plugins", "sdk")
MAX_STRING = 2000
MAX_FUNCTION_LINES = 150
#: a C preprocessor include at the start of a line: C source held in a Python string
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]', re.M)


def shipped_files() -> list[str]:
    """Paths (relative to the repository) of every Python file of the shipped code."""
    out = []
    for top in SHIPPED:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.endswith(".egg-info"))
            out.extend(os.path.relpath(os.path.join(dirpath, f), ROOT) for f in sorted(files) if f.endswith(".py"))
    return out


def _parse(path: str) -> ast.Module:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _literals(tree: ast.AST):
    """``(node, text)`` for every string or bytes literal; an f-string counts as one literal (its
    text parts joined), the constants inside it are not visited again."""
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            yield n, "".join(v.value for v in n.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        elif isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)) and id(n) not in inner:
            text = n.value if isinstance(n.value, str) else n.value.decode("latin-1")
            yield n, text


def _owner(tree: ast.AST) -> dict[int, str]:
    """``{id(node): name of the innermost def/class around it}`` (``<module>`` at the top)."""
    owner: dict[int, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else name
            owner[id(child)] = name
            visit(child, inner)

    visit(tree, "<module>")
    return owner


def long_strings(tree: ast.AST, limit: int = MAX_STRING) -> list[tuple[int, str]]:
    """``(line, description)`` of each literal longer than ``limit`` characters."""
    owner = _owner(tree)
    return sorted((n.lineno, f"{len(text)}-character string in {owner.get(id(n), '<module>')}")
                  for n, text in _literals(tree) if len(text) > limit)


def includes(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, description)`` of each literal holding a C ``#include`` directive."""
    owner = _owner(tree)
    out = []
    for n, text in _literals(tree):
        m = INCLUDE.search(text)
        if m:
            line = text[m.start():].strip().splitlines()[0]
            out.append((n.lineno, f"{line[:60]!r} in a string in {owner.get(id(n), '<module>')}"))
    return sorted(out)


def long_functions(tree: ast.AST, limit: int = MAX_FUNCTION_LINES) -> list[tuple[int, str]]:
    """``(line, description)`` of each function, method or nested function over ``limit`` lines
    (``end_lineno - lineno + 1``, from its ``def`` line)."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        out.append((child.lineno, f"{name}: {lines} lines"))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _offenders(check) -> list[str]:
    return [f"{path}:{line}: {what}" for path in shipped_files() for line, what in check(_parse(path))]


# -- the rules over the shipped code ------------------------------------------------------------
def test_no_string_literal_over_2000_characters():
    bad = _offenders(long_strings)
    assert not bad, (f"string literals over {MAX_STRING} characters (move prose to docs/, C to .c/.h files, "
                     "templates to package data):\n" + "\n".join(bad))


def test_no_c_include_in_a_python_string():
    bad = _offenders(includes)
    assert not bad, "C source in Python strings (it belongs in .c/.h files):\n" + "\n".join(bad)


def test_no_function_over_150_lines():
    bad = _offenders(long_functions)
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(bad)


def test_ge_fusion_registers_no_kernels():
    import ge_fusion.plugin
    from ge_core.plugins import get_host

    assert not hasattr(ge_fusion.plugin, "ge_register_kernels"), "ge_fusion.plugin implements ge_register_kernels"
    host = get_host()
    info = host.info.get("ge_fusion")
    assert info is not None and info.loaded and not info.errors, info  # else the check below proves nothing
    assert "ge_register_kernels" not in info.hooks, info.hooks
    regs = host.registries
    bad = [f"{backend} kernel {key}" for backend, reg in regs.kernels.items() for key in reg
           if reg.origin(key) == "ge_fusion"]
    assert not bad, "kernels registered by ge_fusion (a backend registers kernels):\n" + "\n".join(bad)
    assert sum(len(reg) for reg in regs.kernels.values()) > 0  # the registry was read


# -- the checkers find what they look for -------------------------------------------------------
def _tree(src: str) -> ast.Module:
    return ast.parse(src)


def test_the_string_rule_finds_long_literals_docstrings_and_fstrings():
    long = "x" * 2001
    src = (f'"""{long}"""\n\ndef f():\n    """ok"""\n    return "{long}"\n\n\nclass C:\n'
           f'    t = b"{long}"\n    u = f"{{t}}{long}"\n    v = "{"y" * 2000}"\n')
    got = long_strings(_tree(src))
    assert got == [(1, "2001-character string in <module>"), (5, "2001-character string in f"),
                   (9, "2001-character string in C"), (10, "2001-character string in C")], got
    # implicit concatenation is one literal
    assert [w for _, w in long_strings(_tree(f'x = ("{"a" * 1500}"\n     "{"b" * 1500}")\n'))] == [
        "3000-character string in <module>"]


def test_the_include_rule_finds_c_source_and_not_prose():
    src = ('A = """\n#include <math.h>\nint f(void);\n"""\n'
           "def g():\n    return f'  # include \"x.h\"\\n{A}'\n"
           'B = b"#include <stdio.h>"\n'
           'C = "each ``#include \\"x.h\\"`` is expanded"\n'
           "D = r'^[ \\t]*#[ \\t]*include'\n")
    got = includes(_tree(src))
    assert [line for line, _ in got] == [1, 6, 7], got
    assert "#include <math.h>" in got[0][1] and got[1][1].endswith("in a string in g"), got


def test_the_function_rule_counts_methods_nested_and_async_functions():
    body = "    x = 1\n" * 149
    src = (f"def ok():\n{body}\n"                       # 150 lines: allowed
           f"async def too_long():\n{body}    x = 2\n\n"  # 151 lines
           "class C:\n    def m(self):\n" + body.replace("    ", "        ") + "        x = 2\n"
           "    def outer(self):\n        def inner():\n" + body.replace("    ", "            ") + "            y = 2\n"
           "        return inner\n")
    got = long_functions(_tree(src))
    assert got == [(152, "too_long: 151 lines"), (305, "C.m: 151 lines"), (456, "C.outer: 153 lines"),
                   (457, "C.outer.inner: 151 lines")], got
