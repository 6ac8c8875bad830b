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
    private module (``pkg._util``) may be imported inside its own package and its subpackages."""
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
            parent = ".".join(parts[:i])
            inside = package == parent or package.startswith(parent + ".")  # the package or a subpackage of it
            if _private(part) and not inside and not module.startswith(".".join(parts[: i + 1])):
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


# -- no module reaches into another module's objects' private attributes --------------------------
#: Private attributes of third-party objects that have no public form, with why they are read
#: (file relative to the repository, attribute). Anything else is the project's own.
THIRD_PARTY_PRIVATE = {
    ("plugins/ge_atc/cli.py", "_option_string_actions"): "argparse lists a parser's flags nowhere else",
    ("plugins/ge_opset/infer.py", "_infer_node_outputs"): "onnx's per-node inference on serialized protos",
    ("plugins/ge_torch/dynamo.py", "_version"): "torch's in-place version counter of a baked tensor",
    ("plugins/ge_torch/pt2.py", "_ops"): "torch._ops.OpOverload / HigherOrderOperator, the op classes",
    ("plugins/ge_torch/convert.py", "_name"): "a torch higher-order operator's name",
    ("plugins/ge_torch/convert.py", "_schema"): "a torch OpOverload's schema",
}
_ATTR_FUNCTIONS = ("getattr", "hasattr", "setattr", "delattr")


def _own_private_attributes(tree):
    """The private attribute names this module's classes define: methods and class attributes,
    ``__slots__`` entries, and attributes assigned through ``self``/``cls``."""
    import ast

    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    own.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
                for t in targets:
                    if isinstance(t, ast.Name):
                        own.add(t.id)
                        if t.id == "__slots__" and item.value is not None:
                            own.update(c.value for c in ast.walk(item.value)
                                       if isinstance(c, ast.Constant) and isinstance(c.value, str))
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            own.add(node.attr)
    return {n for n in own if _private(n)}


def _private_attribute_uses(path):
    """``(line, text)`` for each ``x._name`` (read, write or call; also ``getattr(x, "_name")``)
    where ``x`` is not ``self``/``cls`` and no class of this module defines ``_name``: the
    attribute belongs to another module's object, which must offer a public name instead."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    own = _own_private_attributes(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base, attr = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTR_FUNCTIONS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            base, attr = node.args[0], node.args[1].value
        else:
            continue
        if not _private(attr) or attr in own or (isinstance(base, ast.Name) and base.id in ("self", "cls")):
            continue
        out.append((node.lineno, f"{ast.unparse(base)}.{attr}"))
    return out


def test_no_module_reaches_into_another_modules_private_attributes():
    bad = []
    used_exceptions = set()
    for _module, path in sorted(_project_modules().items()):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        for line, what in _private_attribute_uses(path):
            key = (rel, what.rpartition(".")[2])
            if key in THIRD_PARTY_PRIVATE:
                used_exceptions.add(key)
                continue
            bad.append(f"{rel}:{line}: {what}")
    assert not bad, ("private attributes of another module's objects (add a public method or property to "
                     "the owning class):\n" + "\n".join(bad))
    assert used_exceptions == set(THIRD_PARTY_PRIVATE), f"stale exceptions: {set(THIRD_PARTY_PRIVATE) - used_exceptions}"


def test_the_private_attribute_rule_catches_each_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "class Mine:\n"
        "    __slots__ = ('_slot',)\n"
        "    _flag = 1\n"
        "    def __init__(self, other):\n"
        "        self._state = other._host\n"                     # another object's _host
        "    def _helper(self):\n"
        "        return cls._flag, self.__class__\n"
        "def f(model, v, converter, g, o):\n"
        "    model._check_feeds({})\n"                            # another class's private method
        "    for n, i in v._uses:\n"                              # another class's private slot
        "        pass\n"
        "    converter._map_nodes(1, 2, 3)\n"                     # another module's private method
        "    g._output_set = {}\n"                                # writing another object's state
        "    getattr(o, '_secret', None)\n"                       # the same through getattr
        "    return o._state, o._slot, o._helper(), Mine._flag\n"  # this module's own: allowed
    )
    got = [w for _, w in _private_attribute_uses(str(src))]
    assert sorted(got) == sorted(["other._host", "model._check_feeds", "v._uses", "converter._map_nodes",
                                  "g._output_set", "o._secret"]), got
