"""Architecture rules kept by tools: import-linter contracts and ruff."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _tool(name):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        path = shutil.which(name)
    assert path, f"{name} is a dev dependency; install the project with [dev]"
    return path


def test_import_contracts_are_kept():
    r = subprocess.run([_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "broken" not in r.stdout.split("Contracts:")[-1] or "0 broken" in r.stdout


@pytest.mark.parametrize("target", ["ge_core", "sdk", "plugins", "tests", "bench"])
def test_ruff_clean(target):
    r = subprocess.run([_tool("ruff"), "check", "--quiet", target], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


def test_core_does_not_import_onnx_at_runtime():
    code = "import sys, ge_core; ge_core.get_host; assert 'onnx' not in sys.modules, [m for m in sys.modules if 'onnx' in m]"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_type_checker_passes():
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


# -- no module uses another module's underscore names ---------------------------------------------
SOURCE_ROOTS = {"ge_core": ROOT, "plugins": os.path.join(ROOT, "plugins"), "sdk": os.path.join(ROOT, "sdk")}


def _project_modules():
    """``{module name: path}`` of every module in ge_core, the plugins and the SDK."""
    mods = {}
    for top, base in SOURCE_ROOTS.items():
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.endswith(".egg-info")]
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    parts = os.path.relpath(path, base)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    if parts:
                        mods[".".join(parts)] = path
    return mods


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _underscore_uses(module, path, modules):
    """``(line, text)`` for each underscore name of another project module this file uses:
    ``from m import _x``, ``import m._x``, or ``m._x`` on a name bound to a project module. A
    private module (``pkg._util``) may be imported inside its own package."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]

    def resolve(level, name):
        if not level:
            return name or ""
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([name] if name else []))

    def check_module(target, line, out):
        parts = target.split(".")
        for i, part in enumerate(parts):
            if _private(part) and ".".join(parts[:i]) != package and not module.startswith(".".join(parts[: i + 1])):
                out.append((line, f"imports private module {target}"))
                return

    out = []
    bound = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = resolve(node.level, node.module)
            if src.split(".")[0] not in {m.split(".")[0] for m in modules}:
                continue
            check_module(src, node.lineno, out)
            for a in node.names:
                full = f"{src}.{a.name}"
                if full in modules:
                    check_module(full, node.lineno, out)
                    bound[a.asname or a.name] = full
                elif _private(a.name) and src != module:
                    out.append((node.lineno, f"from {src} import {a.name}"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in {m.split(".")[0] for m in modules}:
                    check_module(a.name, node.lineno, out)
                    bound[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain = [node.attr]
            v = node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in bound:
                target = ".".join([bound[v.id], *reversed(chain[1:])])
                if target in modules and target != module:
                    out.append((node.lineno, f"{target}.{node.attr}"))
    return out


def test_no_module_uses_another_modules_underscore_names():
    modules = _project_modules()
    bad = []
    for module, path in sorted(modules.items()):
        for line, what in _underscore_uses(module, path, modules):
            bad.append(f"{os.path.relpath(path, ROOT)}:{line}: {what}")
    assert not bad, "underscore names are private to their module:\n" + "\n".join(bad)


def test_the_underscore_rule_catches_each_form(tmp_path):
    modules = {"ge_core.a": "", "ge_core.b": "", "ge_x._util": "", "ge_x.m": "", "ge_y.m": ""}
    src = tmp_path / "m.py"
    src.write_text("from ge_core.a import _f, g\nimport ge_core.b\nfrom ge_core import a\nfrom ge_x._util import h\n"
                   "ge_core.b._secret\na._priv\na.__name__\ng._fine_on_a_class\n")
    got = [w for _, w in _underscore_uses("ge_y.m", str(src), modules)]
    assert got == ["from ge_core.a import _f", "imports private module ge_x._util", "ge_core.b._secret",
                   "ge_core.a._priv"], got
    # a private module is its package's own: ge_x.m may import ge_x._util
    assert "imports private module ge_x._util" not in [w for _, w in _underscore_uses("ge_x.m", str(src), modules)]
