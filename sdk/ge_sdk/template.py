"""The new-plugin template behind ``ge new-plugin NAME``: a ready, tested plugin distribution."""

from __future__ import annotations

import keyword
import os
import re
from string import Template

from ge_core.errors import OptionError

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "A GE for Python plugin"
requires-python = ">=3.10"
dependencies = ["ge-python", "numpy"]

# ge finds the plugin through this entry point once the distribution is installed.
[project.entry-points."ge.plugins"]
$pkg = "$pkg.plugin:plugin"

[project.optional-dependencies]
test = ["pytest"]

[tool.setuptools.packages.find]
include = ["$pkg*"]

[tool.pytest.ini_options]
pythonpath = ["."]
"""

INIT = '''\
"""$dist: a GE for Python plugin."""

__version__ = "0.1.0"
'''

PLUGIN = '''\
"""The hooks of $dist: a sample op with its CPU kernel, a rewrite pass, a pass that reports
what it found, and a pass instrument.

Grow it with the decorators of ``ge_sdk.Plugin``: ``op``, ``kernel``, ``graph_pass``,
``register_pass``, ``pass_instrument``, ``rewrite`` / ``op_rewrite`` / ``rewrite_pass`` (the
rewrite engine, ``ge_sdk.rewrite``), ``op_mapper``, ``stream_allocator``, ``memory_planner``,
``option``, ``command`` and ``on`` (observers).
"""

from __future__ import annotations

import logging

from ge_core import Graph, OpKind
from ge_sdk import Pass, PassContext, PassInstrument, PassResult, Plugin, same_as_input
from ge_sdk.rewrite import Op, OpRule, Rule, RuleSet, Var

DOMAIN = "$pkg"
log = logging.getLogger("$pkg")

plugin = Plugin("$pkg")


@plugin.op("Square", domain=DOMAIN, kind=OpKind.ELEMWISE, infer=same_as_input())
def square(x):
    """y = x * x (the CPU kernel: NumPy arrays in, array out)."""
    return x * x


# A declarative rule: a pattern (the same name twice is the same value) and a replacement.
def to_square(rw, m):
    """Mul(x, x) -> $pkg::Square(x)."""
    return rw.op("Square", m["x"], domain=DOMAIN)


MUL_SELF = Rule("${pkg}_mul_self", Op("Mul", Var("x"), Var("x")), to_square)


# An imperative rule: an op type and a function that rewrites through the Rewriter ``rw``.
def square_of_neg(node, rw) -> bool:
    """$pkg::Square(Neg(x)) -> $pkg::Square(x)."""
    src = node.inputs[0].producer
    if src is None or src.op_type != "Neg" or src.domain not in ("", "ai.onnx") or src.graph is not node.graph:
        return False
    rw.set_input(node, 0, src.inputs[0])
    return True


RULES = RuleSet([MUL_SELF]) + RuleSet([OpRule("Square", square_of_neg, domain=DOMAIN)])

# One pass applies the rule set to the graph and to every If/Loop/Scan body in it.
plugin.rewrite_pass("${pkg}_mul_self_to_square", RULES, stage="optimize",
                    description="rewrite Mul(x, x) into $pkg::Square(x)")


# A pass as a class. ``after`` places it in its stage (the passes' declarations are the
# pipeline's order; `ge passes` shows it); ``run`` returns a PassResult: whether the graph
# changed, and counts for the compile report (report["passes"][i]["stats"]).
@plugin.register_pass
class CountSquares(Pass):
    """Count the $pkg::Square nodes (an analysis: the graph stays as it is)."""

    name = "${pkg}_count_squares"
    stage = "optimize"
    after = ("${pkg}_mul_self_to_square",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        squares = sum(1 for n in graph.nodes if n.domain == DOMAIN and n.op_type == "Square")
        return PassResult(changed=False, stats={"squares": squares})


# An instrument runs around every pass of every compile (a class: one instance per compile).
@plugin.pass_instrument
class LogNodeCounts(PassInstrument):
    """Log (at debug level) how many nodes each pass left, and its time."""

    name = "${pkg}_log_node_counts"

    def before_pass(self, pass_: Pass, graph: Graph, ctx: PassContext) -> None:
        self.nodes_before = len(graph)

    def after_pass(self, pass_: Pass, graph: Graph, ctx: PassContext, result: PassResult) -> None:
        log.debug("%s: %d -> %d nodes in %.4f s", pass_.name, self.nodes_before, len(graph), result.seconds)
'''

TEST = '''\
"""Tests of $dist, with the fixtures of the ge_sdk pytest plugin."""

import importlib.metadata as md
import logging

import numpy as np
import pytest

import ge_core as ge
from ge_core.plugins import get_host
from $pkg.plugin import plugin

PASS = "${pkg}_mul_self_to_square"


@pytest.fixture(autouse=True)
def _registered(ge_plugin):
    """Installed, the plugin comes through its entry point; from a checkout, register it here."""
    if "$pkg" not in get_host().info:
        ge_plugin(plugin, "$pkg")


def squares(graph_builder):
    b = graph_builder()
    x = b.input("x", "float32", (2, 3))
    b.output(b.Relu(b.Mul(x, x)))
    return b.build()


def test_found_through_the_entry_point_when_installed():
    if not any(ep.name == "$pkg" for ep in md.entry_points(group="ge.plugins")):
        pytest.skip("$dist is not installed")
    info = get_host().info["$pkg"]
    assert info.loaded and not info.errors and info.distribution == "$dist"


def test_pass_keeps_semantics(graph_builder, assert_pass_preserves_semantics):
    check = assert_pass_preserves_semantics(PASS, squares(graph_builder), expect_changed=True)
    assert [n.op_type for n in check.graph.nodes] == ["Square", "Relu"]


def test_compiled_model_runs_the_op(graph_builder, caplog):
    with caplog.at_level(logging.DEBUG, logger="$pkg"):
        model = ge.compile(squares(graph_builder))
    assert model.report["op_counts"].get("$pkg::Square") == 1
    ran = [p["name"] for p in model.report["passes"]]
    count = ran.index("${pkg}_count_squares")
    assert ran.index(PASS) < count  # placed by its after= declaration
    assert model.report["passes"][count]["stats"] == {"squares": 1}
    assert any(r.getMessage().startswith(PASS + ":") for r in caplog.records)  # the instrument saw it
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(model.run({"x": x})[model.output_names[0]], np.maximum(x * x, 0))
'''

README = """\
# $dist

A plugin for GE for Python, made by `ge new-plugin`.

```bash
pip install -e .          # ge finds it through the ge.plugins entry point
ge plugins                # $pkg is listed
ge passes                 # ${pkg}_mul_self_to_square, then ${pkg}_count_squares, in stage optimize
python -m pytest tests    # fixtures come from the ge_sdk pytest plugin
```
"""


def names(name: str) -> tuple[str, str]:
    """(distribution name, package name) for a plugin called ``name``."""
    pkg = re.sub(r"[^0-9a-zA-Z_]", "_", name.strip()).lower()
    if not re.fullmatch(r"[a-z][a-z0-9_]*", pkg) or keyword.iskeyword(pkg):
        raise OptionError(f"'{name}' cannot be a plugin name", hint="use letters, digits and underscores, e.g. my_plugin")
    if pkg.startswith("ge_") and pkg in ("ge_core", "ge_sdk", "ge_opset", "ge_onnx", "ge_cpu", "ge_passes",
                                          "ge_memory", "ge_streams", "ge_fusion", "ge_tensorflow"):
        raise OptionError(f"'{name}' is the name of a built-in package", hint="choose another name")
    return pkg.replace("_", "-"), pkg


def create(name: str, directory: str = ".", force: bool = False) -> str:
    """Write a new plugin distribution into ``directory/<dist>``; returns its path."""
    dist, pkg = names(name)
    root = os.path.join(directory, dist)
    from ge_core.writes import make_folder

    make_folder(root, "the plugin's folder")  # a file in the way, no permission: said with the path
    if os.listdir(root) and not force:
        raise OptionError(f"'{root}' already exists and is not empty", hint="choose another --dir or pass --force")
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"{pkg}/__init__.py": INIT,
        f"{pkg}/plugin.py": PLUGIN,
        f"tests/test_{pkg}.py": TEST,
    }
    for rel, text in files.items():
        path = os.path.join(root, rel)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(Template(text).substitute(dist=dist, pkg=pkg))
        except OSError as e:
            from ge_core.errors import ModelFileError

            raise ModelFileError(f"cannot write '{path}': {e.strerror or e}",
                                 hint="choose a --dir this user can write") from None
    return root
