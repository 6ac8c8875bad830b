"""The cpu executors are compositions of one program, one arena layout, one strategy and one
stream runner (issue 16): no executor inherits another, the modules import no underscore name
from each other and form no import cycle, and the one stream runner stops every stream on an
error and reports it once."""

from __future__ import annotations

import ast
import os
import threading

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import ExecutionError, GEError

HERE = os.path.dirname(os.path.abspath(__file__))
CPU = os.path.join(os.path.dirname(os.path.dirname(HERE)), "plugins", "ge_cpu")
MODULES = sorted(f[:-3] for f in os.listdir(CPU) if f.endswith(".py") and f != "__init__.py")


def _imports(name: str) -> list[tuple[str, str]]:
    """(module, imported name) of every ``from X import name`` in ge_cpu/<name>.py."""
    with open(os.path.join(CPU, name + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = ("." * node.level) + (node.module or "")
            out += [(mod, a.name) for a in node.names]
    return out


def test_no_module_imports_an_underscore_name_from_another():
    bad = [(m, mod, n) for m in MODULES for mod, n in _imports(m) if n.startswith("_") and n != "__future__"]
    assert not bad, bad


def test_the_executor_modules_form_no_import_cycle():
    deps = {m: {mod.lstrip(".").split(".")[0] for mod, _ in _imports(m) if mod.startswith(".") and mod != "."}
            | {n for mod, n in _imports(m) if mod == "."} for m in MODULES}
    deps = {m: {d for d in ds if d in deps} for m, ds in deps.items()}
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*path, m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in deps[m]:
            visit(d, [*path, m])
        state[m] = 2

    for m in deps:
        visit(m, [])
    assert deps["arena"] and "executor" not in set().union(*(deps[m] for m in deps if m != "plugin"))


def test_every_executor_is_a_composition_not_a_subclass_of_another():
    from ge_cpu.executable import CpuExecutable
    from ge_cpu.executor import (
        ArenaExecutable,
        MultiStreamExecutable,
        SequentialExecutable,
        SinkExecutable,
        StreamSinkExecutable,
    )

    kinds = (SequentialExecutable, ArenaExecutable, MultiStreamExecutable, SinkExecutable, StreamSinkExecutable)
    for k in kinds:
        assert k.__bases__ == (CpuExecutable,), k
        assert set(vars(k)) - {"__module__", "__doc__", "__init__", "__qualname__", "__firstlineno__",
                               "__static_attributes__"} == set(), (k, sorted(vars(k)))


def _branches():
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Sigmoid", ["a"], ["c"]), helper.make_node("Tanh", ["b"], ["d"]),
             helper.make_node("Add", ["c", "d"], ["y"])]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    return ge.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), framework="onnx")


@pytest.mark.parametrize("executor", ["streams", "sink"])
def test_one_stream_runner_serves_both_multi_stream_executors(executor):
    model = ge.compile(_branches(), {"executor": executor, "stream_allocator": "dependency", "max_streams": 2,
                                     "pipeline": {"fuse": {"passes": []}}})
    exe = model.executable
    assert exe.stream_count == 2 and exe.streams.count == 2
    runner = exe.strategy.streams
    assert type(runner).__name__ == "StreamRunner" and runner.layout is exe.streams and runner.layout.records
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    want = 1 / (1 + np.exp(-np.maximum(x, 0))) + np.tanh(-x)
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-6)
    names = []

    class Spy(ExecutionError):
        """The error the spied kernel raises."""

    def record(k, wait, signal):
        names.append(threading.current_thread().name)
        if k == 1:
            raise ValueError("boom")
        wait(min(runner.layout.records))  # left when stream 1 fails, never a hang

    with pytest.raises(GEError, match="a stream failed: ValueError: boom"):
        runner.run(record)
    assert len(names) == 2 and any(n.endswith("-1") for n in names), names
    with pytest.raises(Spy):
        runner.run(record, lambda e, tb: Spy(str(e)))
