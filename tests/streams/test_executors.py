"""Executors: interpreted, arena, sink (generated code) and multi-stream give identical outputs;
errors in any stream surface as one clear error; the generated source is inspectable."""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import ge_core as ge
from ge_core import ExecutionError, hookimpl
from ge_sdk import GraphBuilder, temporary_plugin
from tests.conftest import LIGHT_MODELS, light_model_path

CONFIGS = {
    "sequential": {"executor": "sequential", "enable_single_stream": True},
    "arena": {"executor": "arena", "enable_single_stream": True},
    "sink": {"executor": "sink", "enable_single_stream": True},
    "streams/dependency": {"executor": "streams", "stream_allocator": "dependency"},
    "streams/critical_path": {"executor": "streams", "stream_allocator": "critical_path", "max_streams": 3},
    "sink/dependency": {"executor": "sink", "stream_allocator": "dependency"},
}


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_outputs_identical_across_executors_and_allocators(name):
    # Exact: every executor runs at the same BLAS thread count by construction (BlasThreads). The
    # light models' dummy weights make logits of 1e10, where one ulp of GEMM rounding flips the
    # softmax, so this holds only at equal counts; test_trust_conditioned.py checks executors on
    # well-conditioned models against onnxruntime too.
    g = ge.load(light_model_path(name))
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in v.type.shape]).astype(np.float32)
             for v in g.inputs}
    results = {}
    for label, opts in CONFIGS.items():
        model = ge.compile(g, opts)
        results[label] = model.run(feeds)
        kind = type(model.executable).__name__
        if label.startswith("streams") and model.streams.count > 1:
            assert kind == "MultiStreamExecutable"
        if label == "sink":
            assert kind == "SinkExecutable"
        if label == "sink/dependency" and model.streams.count > 1:
            assert kind == "StreamSinkExecutable"
    base = results["sequential"]
    for label, out in results.items():
        for k in base:
            np.testing.assert_array_equal(out[k], base[k], err_msg=f"{name} {label} {k}")


def branches():
    b = GraphBuilder("br")
    x = b.input("x", "float32", (64, 64))
    outs = []
    for _ in range(3):
        v = x
        for _ in range(3):
            v = b.op("Tanh", b.op("MatMul", v, b.const(np.eye(64, dtype=np.float32) * 0.9)))
        outs.append(v)
    b.output(b.op("Sum", *outs))
    return b.graph


class Boom:
    """A plugin op whose kernel fails on negative input: used to break one stream."""

    @hookimpl
    def ge_register_ops(self, register):
        register(ge.OpDef("Boom", domain="t", min_inputs=1, max_inputs=1, infer=lambda n, o: [n.inputs[0].type]))

    @hookimpl
    def ge_register_kernels(self, register):
        def factory(spec):
            def k(x):
                if float(x.reshape(-1)[0]) < 0:
                    raise ValueError("negative input")
                return (x,)
            return k
        register("Boom", factory, domain="t")


@pytest.mark.parametrize("executor", ["streams", "sink", "arena"])
def test_error_in_a_stream_is_one_clear_error_and_nothing_hangs(executor):
    with temporary_plugin(Boom(), "boom"):
        b = GraphBuilder("g")
        b.graph.opset_imports["t"] = 1
        x = b.input("x", "float32", (32, 32))
        left = b.op("Boom", b.op("Tanh", x), domain="t")
        right = b.op("Exp", b.op("Tanh", x))
        b.output(b.op("Add", left, right))
        model = ge.compile(b.graph, {"executor": executor, "stream_allocator": "dependency",
                                     "pipeline": {"fuse": {"passes": []}}})
        if executor in ("streams", "sink"):
            assert model.streams.count > 1
        ok = np.full((32, 32), 0.5, np.float32)
        np.testing.assert_allclose(model.run({"x": ok})["add"], np.tanh(ok) + np.exp(np.tanh(ok)), rtol=1e-6)
        result = {}

        def go():
            try:
                model.run({"x": -ok})
            except ExecutionError as e:
                result["err"] = e

        t = threading.Thread(target=go)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the run hung after a stream failed"
        assert "node 'boom' (t::Boom)" in str(result["err"]) and "negative input" in str(result["err"])
        # the model still works after a failed run
        np.testing.assert_allclose(model.run({"x": ok})["add"], np.tanh(ok) + np.exp(np.tanh(ok)), rtol=1e-6)


@pytest.mark.parametrize("executor", ["streams", "sink"])
def test_streams_executor_is_thread_safe(executor):
    model = ge.compile(branches(), {"executor": executor, "stream_allocator": "dependency", "opt_level": 0})
    assert model.streams.count == 3
    xs = [np.random.default_rng(i).standard_normal((64, 64)).astype(np.float32) for i in range(6)]
    want = [model.run({"x": x})["sum"] for x in xs]
    errors = []

    def worker(k):
        try:
            for r in range(10):
                i = (k + r) % len(xs)
                np.testing.assert_array_equal(model.run({"x": xs[i]})["sum"], want[i])
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]


def test_sink_source_is_inspectable(tmp_path):
    b = GraphBuilder("tiny")
    x = b.input("x", "float32", (1, 16))
    v = x
    for i in range(8):
        v = b.op(("Add", "Mul", "Sub", "Relu")[i % 4], v, *([] if i % 4 == 3 else [b.const(np.full((1, 16), 0.5, np.float32))]))
    b.output(v)
    model = ge.compile(b.graph, {"executor": "sink", "pipeline": {"fuse": {"passes": []}}, "opt_level": 0})
    src = model.executable.source
    multi = ge.compile(branches(), {"stream_allocator": "dependency", "opt_level": 0}).executable
    assert type(multi).__name__ == "StreamSinkExecutable"
    assert all(f"def run{k}(feeds, E, _wait, _set):" in multi.source for k in range(3)) and "_wait(" in multi.source
    assert "def run0(feeds):" in src and "np.add(" in src and "out=t" in src
    compile(src, "<check>", "exec")
    path = model.save(tmp_path / "t.om")
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "inspect", str(path), "--source"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "def run0(feeds):" in r.stdout


def test_unknown_executor_option():
    with pytest.raises(ge.OptionError, match="executor 'fast'"):
        ge.compile(branches(), {"executor": "fast"})


def test_report_json_roundtrip_has_streams():
    m = ge.compile(branches(), {"stream_allocator": "dependency", "opt_level": 0})
    assert json.loads(json.dumps(m.report))["streams"]["count"] == 3


def test_ge_profile_table_and_trace(tmp_path):
    model = ge.compile(light_model_path("inception_v1"), {"stream_allocator": "dependency"})
    path = model.save(tmp_path / "inc.om")
    trace = tmp_path / "t.json"
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "profile", str(path), "--runs", "2", "--trace", str(trace),
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert abs(sum(o["share"] for o in res["ops"]) - 1.0) < 1e-6
    assert any(o["op"].endswith("Conv") for o in res["ops"])
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["tid"] for e in events if e["ph"] == "X"}
    assert len(tracks) == model.streams.count > 1
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "profile", str(path), "--runs", "1", "--trace", str(trace)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "share" in r.stdout and "stream" in r.stdout


@pytest.mark.parametrize("executor", ["sink", "streams", "arena", "sequential"])
def test_zero_d_outputs_are_arrays_on_every_executor(executor):
    """A ufunc on a 0-d input returns a NumPy scalar; the run still returns 0-d arrays, like
    onnxruntime, whichever executor runs it (two streams: both sink variants)."""
    b = GraphBuilder("g")
    x = b.input("x", "float32", ())
    b.output(b.op("Neg", x), b.op("Abs", x))
    model = ge.compile(b.graph, {"executor": executor, "stream_allocator": "dependency"})
    outs = list(model.run({"x": np.array(-2.0, np.float32)}).values())
    assert len(outs) == 2
    for got in outs:
        assert type(got) is np.ndarray and got.shape == () and got.dtype == np.float32
        assert float(got) == 2.0
