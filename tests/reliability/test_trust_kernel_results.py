"""Kernel results are checked against the node's declared type and shape (issue 15).

A plugin kernel registered through the normal hooks returns something other than what its node
declares: a wrong shape, a wrong dtype, a list, None, a bare array instead of a sequence. On
every executor (sink, arena, streams, sink over streams, sequential) the run ends with one
ExecutionError that names the node, its op, the kernel's plugin, what the node declares and
what came back, instead of an error blamed on the next op or a wrong result.
"""

from __future__ import annotations

import numpy as np
import pytest

import ge_core as ge
from ge_core import hookimpl
from ge_core.errors import ExecutionError
from ge_sdk import GraphBuilder, temporary_plugin

X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)

EXECUTORS = {
    "sink": {"executor": "sink", "enable_single_stream": True},
    "arena": {"executor": "arena", "enable_single_stream": True},
    "sequential": {"executor": "sequential", "enable_single_stream": True},
    "streams": {"executor": "streams", "stream_allocator": "dependency"},
    "sink/streams": {"executor": "sink", "stream_allocator": "dependency"},
}

#: what each faulty kernel returns for x: float32[4,8], and what the error must say it got
FAULTS = {
    "wrong_shape": (lambda x: (x.reshape(8, 4),), "float32[8,4]"),
    "wrong_rank": (lambda x: (x.reshape(-1),), "float32[32]"),
    "wrong_dtype": (lambda x: (x.astype(np.float64),), "float64[4,8]"),
    "list": (lambda x: (x.tolist(),), "a list of 4 item(s)"),
    "none": (lambda x: (None,), "None"),
    "bare_array": (lambda x: x, "returned one float32[4, 8] array instead of a sequence"),
    "returns_none": (lambda x: None, "returned None instead of a sequence"),
    "too_many": (lambda x: (x, x), "returned 2 outputs, expected 1"),
}


def _plugin(kernel):
    class Faulty:
        @hookimpl
        def ge_register_ops(self, register):
            register(ge.OpDef("Scale", domain="test.trust", min_inputs=1, max_inputs=1,
                              infer=lambda node, opset: [node.inputs[0].type]))

        @hookimpl
        def ge_register_kernels(self, register):
            register("Scale", lambda spec: kernel, domain="test.trust", backend="cpu")

    return Faulty()


def _graph():
    """Two branches (two streams under the dependency allocator); the faulty node feeds a Relu
    and an Add, so an unchecked result would surface in the next op, or as a wrong output."""
    b = GraphBuilder("g")
    b.graph.opset_imports["test.trust"] = 1
    x = b.input("x", "float32", (4, 8))
    left = b.op("Relu", b.op("Scale", b.op("Tanh", x), domain="test.trust"))
    right = b.op("Exp", b.op("Tanh", x))
    b.output(b.op("Add", left, right))
    return b.graph


def _compile(opts):
    model = ge.compile(_graph(), {**opts, "pipeline": {"fuse": {"passes": []}}})
    if "streams" in opts.get("executor", "") or opts.get("stream_allocator"):
        assert model.streams.count > 1
    return model


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_correct_plugin_kernel_runs(executor):  # the control for the faulty ones
    with temporary_plugin(_plugin(lambda x: (x * 2,)), "trust_scale_plugin"):
        out = _compile(EXECUTORS[executor]).run({"x": X})
    np.testing.assert_allclose(out["add"], np.maximum(np.tanh(X) * 2, 0) + np.exp(np.tanh(X)), rtol=1e-6)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_kernel_result_unlike_its_node_is_named(executor, fault):
    kernel, got = FAULTS[fault]
    with temporary_plugin(_plugin(kernel), "trust_scale_plugin"):
        model = _compile(EXECUTORS[executor])
        with pytest.raises(ExecutionError) as ei:
            model.run({"x": X})
    msg = str(ei.value)
    assert "node 'scale' (test.trust::Scale)" in msg, msg
    assert "kernel of plugin 'trust_scale_plugin'" in msg, msg
    assert got in msg, msg
    if fault not in ("bare_array", "returns_none", "too_many"):
        assert "the node declares float32[4,8]" in msg and "output 0 ('scale')" in msg, msg
    assert "relu" not in msg.lower() and "Add" not in msg  # not blamed on the next op


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_numpy_scalar_of_the_declared_type_is_accepted(executor):
    class Sum:
        @hookimpl
        def ge_register_ops(self, register):
            register(ge.OpDef("Total", domain="test.trust", min_inputs=1, max_inputs=1,
                              infer=lambda node, opset: [ge.TensorType(node.inputs[0].type.dtype, ())]))

        @hookimpl
        def ge_register_kernels(self, register):
            register("Total", lambda spec: (lambda x: (np.float32(x.sum()),)), domain="test.trust", backend="cpu")

    with temporary_plugin(Sum(), "trust_sum_plugin"):
        b = GraphBuilder("s")
        b.graph.opset_imports["test.trust"] = 1
        x = b.input("x", "float32", (4, 8))
        b.output(b.op("Total", b.op("Relu", x), domain="test.trust"))
        out = ge.compile(b.graph, EXECUTORS[executor]).run({"x": X})
    (v,) = out.values()
    assert isinstance(v, np.ndarray) and v.shape == () and v.dtype == np.float32
    np.testing.assert_allclose(v, np.maximum(X, 0).sum(), rtol=1e-6)


def test_a_factory_returning_a_non_callable_is_named_at_build():
    with temporary_plugin(_plugin(42), "trust_scale_plugin"):
        with pytest.raises(ge.GEError) as ei:
            _compile(EXECUTORS["sequential"])
    msg = str(ei.value)
    assert "node 'scale' (test.trust::Scale)" in msg and "trust_scale_plugin" in msg and "not a callable" in msg


def test_the_check_costs_little_on_a_light_model():
    """The check is O(1) per output: well under a microsecond per kernel call (measured: ~0.4 us
    on a 2-core EPYC), which is under 1% of a squeezenet run (39 kernels, ~7 ms). Measured as the
    extra time of a checked trivial kernel, best of several repeats, so a loaded machine makes the
    run slower but not the ratio worse."""
    import timeit

    from ge_cpu.executor import checked_kernel
    from tests.conftest import light_model_path

    model = ge.compile(light_model_path("squeezenet"), {"executor": "arena", "enable_single_stream": True})
    node = next(st.node for st in model.executable.steps if st.node.outputs[0].type.is_static)
    t = node.outputs[0].type
    a = np.zeros(t.shape, t.dtype)

    def raw(x):
        return (x,)

    checked = checked_kernel(raw, node, lambda: node.describe())
    assert checked(a)[0] is a
    cost = {f: min(timeit.repeat(lambda f=f: f(a), number=5000, repeat=7)) / 5000 for f in (raw, checked)}
    per_call = cost[checked] - cost[raw]
    feeds = {v.name: np.random.default_rng(0).standard_normal(v.type.shape).astype(np.float32) for v in model.graph.inputs}
    model.run(feeds)
    run = min(timeit.repeat(lambda: model.run(feeds), number=1, repeat=5))
    n = len(model.executable.steps)
    assert per_call < 5e-6, f"{per_call * 1e6:.2f} us per kernel call"
    assert per_call * n < 0.02 * run, f"{n} kernels x {per_call * 1e6:.2f} us vs a {run * 1e3:.2f} ms run"
