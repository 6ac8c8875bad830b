"""Every registration hookimpl shipped with ge types ``register`` with its spec's callback protocol.

``ge_core/hookspecs.py`` annotates each ``ge_register_*`` spec's ``register`` with a protocol
(``RegisterOp``, ``RegisterKernel``, ...); a hookimpl in ``plugins/``, ``sdk/`` or ``examples/``
must use the same name and return ``None``, so mypy checks every ``register(...)`` call.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("plugins", "sdk", "examples")


def _spec_annotations() -> dict[str, str]:
    tree = ast.parse((ROOT / "ge_core" / "hookspecs.py").read_text())
    specs = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("ge_register_"):
            ann = node.args.args[0].annotation
            assert node.args.args[0].arg == "register" and ann is not None, node.name
            specs[node.name] = ast.unparse(ann)
    return specs


def _register_param(fn: ast.FunctionDef) -> ast.arg | None:
    args = [a for a in fn.args.posonlyargs + fn.args.args if a.arg not in ("self", "cls")]
    return next((a for a in args if a.arg == "register"), None)


def _problems(path: Path, source: str, specs: dict[str, str]) -> list[str]:
    """What is wrong with the ``ge_register_*`` hook functions of one module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name not in specs:
            continue
        where = f"{path}:{node.lineno} {node.name}"
        param = _register_param(node)
        want = specs[node.name]
        if param is None:
            out.append(f"{where}: no parameter named 'register'")
        elif param.annotation is None:
            out.append(f"{where}: 'register' is not annotated (want {want})")
        elif ast.unparse(param.annotation).rpartition(".")[2] != want:
            out.append(f"{where}: 'register' is annotated {ast.unparse(param.annotation)}, the spec says {want}")
        if node.returns is None or ast.unparse(node.returns) != "None":
            out.append(f"{where}: return type is not '-> None'")
    return out


def _hookimpl_modules() -> list[Path]:
    files = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*.py")):
            if "ge_register_" in p.read_text(errors="replace"):
                files.append(p)
    return files


def test_every_spec_has_a_protocol_annotation():
    specs = _spec_annotations()
    assert len(specs) >= 13, sorted(specs)
    assert all(v.startswith("Register") for v in specs.values()), specs


def test_every_registration_hookimpl_types_register():
    specs = _spec_annotations()
    problems: list[str] = []
    checked = in_text = 0
    for p in _hookimpl_modules():
        src = p.read_text()
        problems += _problems(p.relative_to(ROOT), src, specs)
        checked += sum(isinstance(n, ast.FunctionDef) and n.name in specs for n in ast.walk(ast.parse(src)))
        in_text += len(re.findall(r"^\s*def (ge_register_\w+)\(", src, flags=re.M))
    # the AST walk saw every hook function a text search sees (the plugins have about 30)
    assert checked == in_text and checked >= 20, (checked, in_text)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, expect", [
    ("def ge_register_ops(register):\n    pass\n", "not annotated"),
    ("def ge_register_ops(register: RegisterPass) -> None:\n    pass\n", "the spec says RegisterOp"),
    ("def ge_register_ops(register: RegisterOp):\n    pass\n", "not '-> None'"),
    ("class P:\n    def ge_register_kernels(self, reg):\n        pass\n", "no parameter named 'register'"),
])
def test_the_check_finds_what_it_should(source, expect):
    problems = _problems(Path("x.py"), source, _spec_annotations())
    assert problems and any(expect in m for m in problems), problems


def test_the_check_accepts_a_typed_hookimpl():
    src = ("import ge_core.hookspecs as hs\n"
           "def ge_register_ops(register: hs.RegisterOp) -> None:\n    pass\n")
    assert _problems(Path("x.py"), src, _spec_annotations()) == []
