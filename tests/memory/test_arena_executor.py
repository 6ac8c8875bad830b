"""The arena executor: out= protocol, fresh outputs, several threads, hostile plans."""

import threading

import numpy as np

import ge_core as ge
from ge_core import OpKind, hookimpl
from ge_core.memory import MemoryPlan
from ge_core.ops import OpDef
from ge_sdk import GraphBuilder, temporary_plugin
from tests.conftest import light_model_path

CALLS: list[tuple[str, bool]] = []


def _scale_factory(spec):
    def kernel(x, out=None):
        if out is None:
            CALLS.append(("fresh", False))
            return (x * 2.0,)
        CALLS.append(("out", np.shares_memory(out[0], x)))
        np.multiply(x, 2.0, out=out[0])
        return out

    kernel.accepts_out = True  # the attributes of plugins older than KernelCaps still count
    kernel.inplace_ok = spec.attrs.get("inplace", 1) == 1
    return kernel


class ScalePlugin:
    @hookimpl
    def ge_register_ops(self, register):
        register(OpDef("Scale2", domain="test.mem", min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE,
                       infer=lambda node, opset: [node.inputs[0].type]))

    @hookimpl
    def ge_register_kernels(self, register):
        register("Scale2", _scale_factory, domain="test.mem", backend="cpu")


def scale_graph(inplace):
    b = GraphBuilder("scale")
    x = b.input("x", "float32", (4, 8))
    h = b.op("Relu", x)
    s = b.op("Scale2", h, domain="test.mem", inplace=inplace)   # h dies here: planned in place
    t = b.op("Scale2", s, domain="test.mem", inplace=inplace)
    b.output(b.op("Neg", t))
    return b.build()


def test_kernels_that_accept_out_write_into_the_arena_in_place_only_when_allowed():
    x = np.arange(32, dtype=np.float32).reshape(4, 8) - 10
    with temporary_plugin(ScalePlugin(), "scale_test"):
        for inplace, want in ((1, ("out", True)), (0, ("fresh", False))):
            CALLS.clear()
            model = ge.compile(scale_graph(inplace))
            assert model.report["memory"]["shared_values"]["inplace"] == 2
            y = list(model.run({"x": x}).values())[0]
            np.testing.assert_array_equal(y, -4 * np.maximum(x, 0))
            assert CALLS and all(c == want for c in CALLS), CALLS


def view_out_graph():
    b = GraphBuilder("viewout")
    x = b.input("x", "float32", (2, 6))
    h = b.op("Relu", x)
    b.output(b.op("Reshape", h, np.array([3, 4], np.int64)), b.op("Sigmoid", h))
    return b.build()


def test_graph_outputs_are_fresh_arrays_not_views_of_the_arena():
    model = ge.compile(view_out_graph())
    exe = model.executable
    x1 = np.ones((2, 6), np.float32)
    out1 = model.run({"x": x1})
    first = {k: v.copy() for k, v in out1.items()}
    model.run({"x": -x1 * 5})  # reuses the same arena
    for k in out1:
        np.testing.assert_array_equal(out1[k], first[k])
        for ctx in exe._pool:
            assert not np.shares_memory(out1[k], ctx.arena)


def test_one_model_many_threads_each_with_its_own_arena():
    model = ge.compile(ge.load(light_model_path("squeezenet")))
    rng = np.random.default_rng(0)
    name = model.input_names[0]
    shape = model.graph.inputs[0].type.shape
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    want = [list(model.run({name: x}).values())[0] for x in xs]
    got: dict[int, list] = {}
    errors = []

    def work(k):
        try:
            got[k] = [list(model.run({name: xs[(k + j) % len(xs)]}).values())[0] for j in range(2)]
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, outs in got.items():
        for j, y in enumerate(outs):
            np.testing.assert_array_equal(y, want[(k + j) % len(xs)])
    assert 1 <= len(model.executable._pool) <= 4


def test_a_hostile_plan_cannot_place_a_value_outside_the_arena():
    from ge_core.plugins import get_host
    from ge_cpu.arena import ArenaExecutable

    g = view_out_graph()
    model = ge.compile(g)
    bad = MemoryPlan({k: 10**9 for k in model.memory_plan.offsets}, 64, "hostile")
    exe = ArenaExecutable(model.graph, get_host().registries.kernels_for("cpu"), model.options, bad)
    x = np.ones((2, 6), np.float32)
    np.testing.assert_array_equal(list(exe.run({"x": x}))[1], list(model.run({"x": x}).values())[1])


def test_options_alignment_and_levels():
    import pytest

    from ge_core import OptionError

    g = ge.load(light_model_path("squeezenet"))
    m512 = ge.compile(g, {"memory_alignment": 512})
    assert m512.report["memory"]["alignment"] == 512
    assert all(off % 512 == 0 for k, off in m512.memory_plan.offsets.items() if k not in _aliases(m512))
    with pytest.raises(OptionError, match="power of two"):
        ge.compile(g, {"memory_alignment": 100})
    off = ge.compile(g, {"memory_optimize_level": "off"})
    assert off.report["memory"]["planner"] == "none" and not any(off.report["memory"]["shared_values"].values())
    high = ge.compile(g, {"memory_optimize_level": "high"})
    assert len(high.report["memory"]["planner_candidates"]) > 3
    assert high.report["memory"]["arena_bytes"] <= ge.compile(g).report["memory"]["arena_bytes"]


def _aliases(model):
    from ge_core.compiler import memory_problem
    from ge_core.plugins import get_host

    g = model.graph
    return memory_problem(g, g.node_list(), model.streams, model.options, get_host().registries).aliases
