"""The core names no op type and stays a size a person reads (issue #43).

* No op-type literal in ``ge_core``: every op type the op set (``ge_opset``) registers is absent
  from ge_core's string constants (docstrings and ``__all__`` names aside); what the core needs
  of an op (the structural copy a graph routes outputs through, aliasing, kinds) comes from the
  op set's declarations (``OpDef.copy``, ``OpDef.alias``, ``OpDef.kind``).
* ``ge_core`` has at most 6,600 lines of code, at most 4,800 outside the .om format modules
  (om.py, serialize.py, om_container.py, cache.py). Lines are counted as cloc counts them: blank
  lines, ``#`` comment lines and every line of a docstring (the first-statement string of a
  module, class or function) are not code.
"""

from __future__ import annotations

import ast
import pathlib

import ge_core

CORE = pathlib.Path(ge_core.__file__).parent
OM_FORMAT = {"om.py", "serialize.py", "om_container.py", "cache.py"}
MAX_LINES = 6600
MAX_LINES_OUTSIDE_OM = 4800


def _op_types() -> set[str]:
    from ge_core.plugins import PluginHost

    host = PluginHost()
    ops = host.registries.ops
    return {key[1] for key in ops.keys() if ops.origin(key) == "ge_opset"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
            out.add(id(body[0].value))
    return out


def _all_names(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                out |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return out


def op_type_literals(root: pathlib.Path, op_types: set[str]) -> list[str]:
    """``file:line: 'Op'`` for every string constant under ``root`` that is an op type."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree) | _all_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                if node.value in op_types:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_the_op_set_registers_the_op_types_checked():
    ops = _op_types()
    assert len(ops) > 150 and {"Identity", "Constant", "If", "Loop", "Scan", "Conv"} <= ops


def test_no_op_type_literal_in_ge_core():
    found = op_type_literals(CORE, _op_types())
    assert not found, "op types named in ge_core (declare them in the op set, ask the op registry):\n" + "\n".join(found)


def test_the_check_finds_an_op_type_literal(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text('"""Identity in a docstring is prose."""\n__all__ = ["Shape"]\nOP = "Identity"\n')
    assert op_type_literals(pkg, {"Identity", "Shape"}) == ["pkg/m.py:3: 'Identity'"]


def code_lines(text: str) -> int:
    """Lines of code in Python source ``text``, as cloc counts them (no blanks, comments, docstrings)."""
    tree = ast.parse(text)
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc = body[0]
            doc_lines.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    return sum(1 for number, line in enumerate(text.splitlines(), start=1)
               if line.strip() and not line.strip().startswith("#") and number not in doc_lines)


def _lines(path: pathlib.Path) -> int:
    return code_lines(path.read_text(encoding="utf-8"))


def test_the_counter_skips_docstrings_comments_and_blank_lines():
    source = (
        '"""Module docstring,\n\nover three lines."""\n'
        "\n"
        "# a comment\n"
        "X = 1  # code with a trailing comment\n"
        "\n"
        "def f():\n"
        "    '''Function docstring.'''\n"
        "    return '''not a docstring,\n"
        "    a string value'''\n"
        "\n"
        "class C:\n"
        '    """Class\n'
        '    docstring."""\n'
        "    y = 2\n"
    )
    # code: X = 1, def f, the two lines of the return, class C, y = 2
    assert code_lines(source) == 6


def test_ge_core_size():
    sizes = {str(p.relative_to(CORE)): _lines(p) for p in sorted(CORE.rglob("*.py"))}
    total = sum(sizes.values())
    outside = sum(n for name, n in sizes.items() if name not in OM_FORMAT)
    table = "\n".join(f"{n:6d} {name}" for name, n in sorted(sizes.items(), key=lambda kv: -kv[1]))
    assert total <= MAX_LINES, f"ge_core has {total} lines, more than {MAX_LINES}:\n{table}"
    assert outside <= MAX_LINES_OUTSIDE_OM, (
        f"ge_core has {outside} lines outside {sorted(OM_FORMAT)}, more than {MAX_LINES_OUTSIDE_OM}:\n{table}")
