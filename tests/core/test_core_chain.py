"""ge_core is a chain: no import cycle among its modules, imports inside functions included.

Imports under ``if TYPE_CHECKING:`` do not count (they never run); the ``ir`` package counts as one
module (its own internal imports aside).
"""

import ast
import os

CORE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ge_core")


def _modules():
    """``{module name: path}``; ``ge_core.ir.*`` is folded into ``ge_core.ir``."""
    mods = {}
    for dirpath, dirnames, files in os.walk(CORE):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                parts = ["ge_core", *os.path.relpath(path, CORE)[:-3].split(os.sep)]
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                mods.setdefault(_fold(".".join(parts)), []).append(path)
    return mods


def _fold(name):
    return "ge_core.ir" if name.startswith("ge_core.ir.") else name


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree):
    """Every import statement in the tree, in functions too, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(node, package, mods):
    """The ge_core modules an import statement loads (``package`` is the importer's package)."""
    if isinstance(node, ast.Import):
        return {_fold(a.name) for a in node.names if _fold(a.name) in mods}
    if node.level:
        base = package.split(".")
        base = base[:len(base) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    found = set()
    for alias in node.names:
        sub = _fold(f"{module}.{alias.name}")
        if sub in mods:
            found.add(sub)
        elif _fold(module) in mods:
            found.add(_fold(module))
    return found


def import_graph():
    mods = _modules()
    graph = {name: set() for name in mods}
    for name, paths in mods.items():
        for path in paths:
            rel = os.path.relpath(path, CORE)[:-3].split(os.sep)
            package = ".".join(["ge_core", *rel[:-1]])
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in _imports(tree):
                graph[name] |= _targets(node, package, mods) - {name}
    return graph


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    state = {}
    for start in sorted(graph):
        if start in state:
            continue
        path, iters = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                iters.pop()
            elif state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


def test_the_checker_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_checker_resolves_imports():
    graph = import_graph()
    assert "ge_core.ir" in graph and "ge_core" in graph
    assert {"ge_core.api", "ge_core.errors"} <= graph["ge_core"]


def test_ge_core_imports_form_a_chain():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in ge_core: " + " -> ".join(cycle)
