"""Results never depend on the calling thread (issue 15).

A BLAS library keeps one thread count per process and its GEMM rounds differently at different
counts, so every run executes at one definite count (the model's ``threads`` option, else the
process's baseline) whichever thread calls it, and runs at different counts never overlap
(``ge_cpu.executor.BlasThreads``). These tests check the count a kernel sees inside runs called
from 16 threads (through a probe op registered like any plugin kernel), and that 16 threads
get the same bits as sequential runs, with ``threads`` set and with the multi-stream executors.

Those policy tests compile with ``parallel=blas`` (BLAS's threads are the parallelism). The
default, ``parallel=engine``, runs BLAS at one thread and GE's own pool ``threads`` wide
(``ge_native.parallel``): the last tests check what its kernels see, that its results have the
same bits from 16 calling threads, and at every width above one.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import threadpoolctl

import ge_core as ge
from ge_core import hookimpl
from ge_native import parallel
from ge_sdk import GraphBuilder, temporary_plugin
from ge_sdk.testing import run_reference

N_THREADS = 16


def _blas_libs():
    return threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers


def _counts() -> tuple[int, ...]:
    return tuple(int(lib.get_num_threads()) for lib in _blas_libs())


def _settled() -> tuple[int, ...]:
    """The counts once the last run's count has stopped lingering (ge_cpu.blas.LINGER_S)."""
    from ge_cpu.executor import BLAS

    BLAS.settle()
    return _counts()


@pytest.fixture(scope="module")
def baseline():
    c = _settled()  # an earlier test's run may have left its count lingering
    assert c, "threadpoolctl finds no BLAS library (NumPy ships OpenBLAS): the thread policy cannot be checked"
    return c


class Probe:
    """``t::<op>(x) -> [values]``: what its kernel sees when it runs, as ``report(spec)()``
    builds it. ``Probe()``: ``t::BlasProbe``, the BLAS thread count (first library)."""

    def __init__(self, op="BlasProbe", report=None):
        libs = _blas_libs()
        self.op = op
        self.report = report or (lambda spec: lambda: [libs[0].get_num_threads()])
        self.n = len(self.report(None)())

    @hookimpl
    def ge_register_ops(self, register):
        n = self.n
        register(ge.OpDef(self.op, domain="t", min_inputs=1, max_inputs=1,
                          infer=lambda node, o: [ge.TensorType("float32", (n,))]))

    @hookimpl
    def ge_register_kernels(self, register):
        def factory(spec):
            seen = self.report(spec)
            return lambda x: (np.array(seen(), np.float32),)
        register(self.op, factory, domain="t")


@pytest.fixture
def probe():
    with temporary_plugin(Probe(), "blas_probe"):
        yield


def _weights(rng, n):
    return (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)  # like a real init: O(1) activations


def _gemm_model(branches: int = 3, width: int = 192, probes: bool = False) -> ge.Graph:
    """A well-conditioned MLP: a trunk, then ``branches`` independent branches (one stream each
    under the dependency allocator), summed; with ``probes``, one BlasProbe per branch."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("gemm")
    if probes:
        b.graph.opset_imports["t"] = 1
    x = b.input("x", "float32", (48, width))
    v = b.op("Tanh", b.op("MatMul", x, b.const(_weights(rng, width))))
    outs = []
    for _ in range(branches):
        u = v
        for _ in range(2):
            u = b.op("Tanh", b.op("MatMul", u, b.const(_weights(rng, width))))
        outs.append(u)
        if probes:
            b.output(b.op("BlasProbe", u, domain="t"))
    b.output(b.op("Sum", *outs))
    return b.graph


def _hammer(fn, n_threads: int = N_THREADS, runs: int = 4) -> list:
    """Call ``fn(thread, run)`` from ``n_threads`` threads at once; returns what failed."""
    barrier = threading.Barrier(n_threads)
    errors: list = []

    def worker(t):
        try:
            barrier.wait(30)
            for r in range(runs):
                fn(t, r)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append((t, repr(e)))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a run hung"
    return errors


CONFIGS = {
    "sequential/threads=1": ({"parallel": "blas", "executor": "sequential", "enable_single_stream": True, "threads": 1}, 1),
    "arena/threads=2": ({"parallel": "blas", "executor": "arena", "enable_single_stream": True, "threads": 2}, 2),
    "sink/baseline": ({"parallel": "blas", "executor": "sink", "enable_single_stream": True}, None),
    "streams/threads=1": ({"parallel": "blas", "executor": "streams", "stream_allocator": "dependency", "threads": 1}, 1),
    "streams/baseline": ({"parallel": "blas", "executor": "streams", "stream_allocator": "dependency"}, None),
    "sink-streams/threads=2": ({"parallel": "blas", "executor": "sink", "stream_allocator": "dependency", "threads": 2}, 2),
}


@pytest.mark.parametrize("label", CONFIGS)
def test_kernels_see_the_models_blas_count_whichever_thread_calls(label, probe, baseline):
    opts, threads = CONFIGS[label]
    model = ge.compile(_gemm_model(probes=True), {**opts, "opt_level": 0})
    if "streams" in label:
        assert model.streams.count > 1  # probes run on the streams' worker threads too
    want = float(threads or baseline[0])
    x = np.random.default_rng(0).standard_normal((48, 192)).astype(np.float32)
    probes = [k for k in model.output_names if k != "sum"]
    assert len(probes) == 3

    def check(t, r):
        out = model.run({"x": x})
        got = {k: float(out[k][0]) for k in probes}
        assert set(got.values()) == {want}, f"thread {t}: kernels saw {got}, the model runs at {want:g}"

    # A user who set the count once on the main thread through threadpoolctl becomes its
    # "controlling thread": threadpoolctl then ignores limits set from any other thread, which is
    # how a per-run limit from a worker thread used to be a silent no-op.
    with threadpoolctl.threadpool_limits(limits=baseline[0], user_api="blas"):
        check(-1, 0)
        errors = _hammer(check)
    assert not errors, errors[:3]
    assert _settled() == baseline, "the BLAS count leaked out of the runs"


@pytest.mark.parametrize("label", ["sequential/threads=2", "arena/threads=1", "streams", "sink-streams"])
def test_16_threads_get_the_bits_of_sequential_runs(label, baseline):
    opts = {
        "sequential/threads=2": {"parallel": "blas", "executor": "sequential", "enable_single_stream": True, "threads": 2},
        "arena/threads=1": {"parallel": "blas", "executor": "arena", "enable_single_stream": True, "threads": 1},
        "streams": {"parallel": "blas", "executor": "streams", "stream_allocator": "dependency"},
        "sink-streams": {"parallel": "blas", "executor": "sink", "stream_allocator": "dependency", "threads": 2},
    }[label]
    model = ge.compile(_gemm_model(width=256), {**opts, "opt_level": 0})
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((48, 256)).astype(np.float32) for _ in range(4)]
    want = [model.run({"x": x})["sum"] for x in xs]  # sequential, on the main thread
    assert not np.array_equal(want[0], want[1])
    assert np.isfinite(want[0]).all() and 0.1 < float(np.std(want[0])) < 10  # well conditioned
    mismatches: list = []

    def check(t, r):
        i = (t + r) % len(xs)
        out = model.run({"x": xs[i]})["sum"]
        if not np.array_equal(out, want[i]):
            mismatches.append((t, r, float(np.abs(out - want[i]).max())))

    with threadpoolctl.threadpool_limits(limits=baseline[0], user_api="blas"):
        errors = _hammer(check)
    assert not errors, errors[:3]
    assert not mismatches, f"{len(mismatches)} of {N_THREADS * 4} runs from {N_THREADS} threads differ: {mismatches[:3]}"


def test_models_at_different_counts_never_share_one(probe, baseline):
    """Two models, threads=1 and threads=2, hammered at once from 16 threads: each run's kernels
    see its own model's count, and each result has the bits of that model's sequential run."""
    g = _gemm_model(probes=True)
    m1 = ge.compile(g, {"parallel": "blas", "executor": "arena", "enable_single_stream": True, "threads": 1, "opt_level": 0})
    m2 = ge.compile(g, {"parallel": "blas", "executor": "streams", "stream_allocator": "dependency", "threads": 2, "opt_level": 0})
    x = np.random.default_rng(2).standard_normal((48, 192)).astype(np.float32)
    want = {1: m1.run({"x": x})["sum"], 2: m2.run({"x": x})["sum"]}

    def check(t, r):
        n, m = (1, m1) if (t + r) % 2 else (2, m2)
        out = m.run({"x": x})
        seen = {float(out[k][0]) for k in out if k != "sum"}
        assert seen == {float(n)}, f"a threads={n} run's kernels saw {seen}"
        np.testing.assert_array_equal(out["sum"], want[n])

    errors = _hammer(check)
    assert not errors, errors[:3]
    assert _settled() == baseline


class Nested:
    """``t::RunInner(x)``: a kernel that runs another compiled model (set on the class)."""

    inner = None

    @hookimpl
    def ge_register_ops(self, register):
        register(ge.OpDef("RunInner", domain="t", min_inputs=1, max_inputs=1, infer=lambda n, o: [n.inputs[0].type]))

    @hookimpl
    def ge_register_kernels(self, register):
        def factory(spec):
            def run_inner(x):
                return (Nested.inner.run({"x": x})["sum"],)
            return run_inner
        register("RunInner", factory, domain="t")


def test_a_nested_run_at_another_count_neither_deadlocks_nor_changes_the_count(probe, baseline):
    with temporary_plugin(Nested(), "nested_run"):
        inner_model = ge.compile(_gemm_model(probes=False), {"parallel": "blas", "executor": "arena", "threads": 2, "opt_level": 0})
        Nested.inner = inner_model
        b = GraphBuilder("outer")
        b.graph.opset_imports["t"] = 1
        x = b.input("x", "float32", (48, 192))
        y = b.op("RunInner", x, domain="t")
        b.output(b.op("BlasProbe", y, domain="t"))
        outer = ge.compile(b.graph, {"parallel": "blas", "executor": "sequential", "threads": 1, "opt_level": 0})
        xv = np.ones((48, 192), np.float32)
        done: dict = {}
        t = threading.Thread(target=lambda: done.setdefault("out", outer.run({"x": xv})))
        t.start()
        t.join(60)
        assert not t.is_alive(), "a nested run waited for its own outer run"
        (name,) = outer.output_names
        assert float(done["out"][name][0]) == 1.0  # the outer run's count held throughout
    assert _settled() == baseline


class Hold:
    """``t::Hold(x) -> x``: a kernel that waits until ``Hold.release`` is set."""

    release = threading.Event()
    entered = threading.Event()

    @hookimpl
    def ge_register_ops(self, register):
        register(ge.OpDef("Hold", domain="t", min_inputs=1, max_inputs=1, infer=lambda n, o: [n.inputs[0].type]))

    @hookimpl
    def ge_register_kernels(self, register):
        def factory(spec):
            def hold(x):
                Hold.entered.set()
                Hold.release.wait(30)
                return (x,)
            return hold
        register("Hold", factory, domain="t")


def test_a_run_waiting_for_another_count_keeps_its_timeout(baseline):
    with temporary_plugin(Hold(), "hold_plugin"):
        b = GraphBuilder("hold")
        b.graph.opset_imports["t"] = 1
        x = b.input("x", "float32", (4, 4))
        b.output(b.op("Hold", b.op("Tanh", x), domain="t"))
        holder = ge.compile(b.graph, {"parallel": "blas", "executor": "sequential", "threads": 1, "opt_level": 0})
        other = ge.compile(_gemm_model(), {"parallel": "blas", "executor": "arena", "threads": 2, "opt_level": 0})
        Hold.release.clear()
        Hold.entered.clear()
        t = threading.Thread(target=holder.run, args=({"x": np.ones((4, 4), np.float32)},))
        t.start()
        try:
            assert Hold.entered.wait(30)
            xv = np.ones((48, 192), np.float32)
            with pytest.raises(ge.ExecutionError, match="timeout"):
                other.run({"x": xv}, timeout=0.3)  # would wait for the threads=1 run to end
        finally:
            Hold.release.set()
            t.join(30)
        assert np.isfinite(other.run({"x": xv})["sum"]).all()  # and runs once the other count is gone
    assert _settled() == baseline


# ------------------------------------------------------------------------------------------
# parallel=engine: BLAS at one thread, GE's pool `threads` wide
# ------------------------------------------------------------------------------------------
def _width_probe() -> Probe:
    """``t::WidthProbe(x) -> [BLAS count, pool width, width the kernel was built for]``."""
    libs = _blas_libs()

    def report(spec):
        built = parallel.planned_width(spec)
        return lambda: [libs[0].get_num_threads(), parallel.threads(), built]

    return Probe("WidthProbe", report)


def _width_model() -> ge.Graph:
    b = GraphBuilder("width")
    b.graph.opset_imports["t"] = 1
    x = b.input("x", "float32", (4,))
    b.output(b.op("WidthProbe", b.op("Relu", x), domain="t"))
    return b.graph


@pytest.mark.parametrize("opts,want", [
    ({"threads": 2, "parallel": "engine"}, (1.0, 2.0, 2.0)),
    ({"threads": 1, "parallel": "engine"}, (1.0, 1.0, 1.0)),
    ({"threads": 2, "parallel": "engine", "executor": "streams", "stream_allocator": "dependency"}, (1.0, 2.0, 2.0)),
    ({"threads": 2, "parallel": "blas"}, (2.0, 1.0, 1.0)),
    ({"threads": 2}, (1.0, 2.0, 2.0)),
], ids=["engine-2", "engine-1", "engine-streams-2", "blas-2", "default-2"])
def test_engine_runs_blas_at_one_thread_and_its_pool_threads_wide(opts, want, baseline):
    with temporary_plugin(_width_probe(), "width_probe"):
        model = ge.compile(_width_model(), {**opts, "opt_level": 0})
        if os.cpu_count() == 1:
            want = (want[0], 1.0, 1.0) if opts.get("parallel") != "blas" else want
        got = []
        errors = _hammer(lambda t, r: got.append(tuple(model.run({"x": np.ones(4, np.float32)}).values())[0]),
                         n_threads=4)
    assert not errors, errors[:3]
    assert {tuple(float(v) for v in g) for g in got} == {want}
    assert parallel.threads() == 1  # outside runs
    assert _settled() == baseline


def test_an_unknown_parallel_mode_is_an_option_error():
    with pytest.raises(ge.OptionError, match="parallel"):
        ge.compile(_gemm_model(), {"parallel": "gpu", "opt_level": 0})


def test_engine_results_have_the_same_bits_at_every_width_above_one():
    """Transformer-sized GEMMs (packed weight blocks, native GEMM tasks), 16 calling threads:
    threads=2 and threads=3 compile the same cuts, so they give the same bits."""
    rng = np.random.default_rng(11)
    b = GraphBuilder("mlp")
    x = b.input("x", "float32", (128, 256))
    h = b.op("Gelu", b.op("Add", b.op("MatMul", x, b.const(_weights(rng, 256).repeat(4, axis=1) / 2)),
                          b.const(rng.standard_normal(1024).astype(np.float32) * 0.1)))
    b.output(b.op("MatMul", h, b.const((rng.standard_normal((1024, 256)) / 32).astype(np.float32))))
    g = b.graph
    g.opset_imports[""] = 20
    xs = rng.standard_normal((128, 256)).astype(np.float32)
    m2 = ge.compile(g, {"threads": 2, "parallel": "engine"})
    m3 = ge.compile(g, {"threads": 3, "parallel": "engine"})
    want = m2.run({"x": xs})
    (k,) = want
    np.testing.assert_array_equal(m3.run({"x": xs})[k], want[k])
    ref = list(run_reference(g, {"x": xs}).values())[0]
    np.testing.assert_allclose(want[k], ref, rtol=1e-4, atol=1e-4)
    mismatches = []

    def check(t, r):
        out = m2.run({"x": xs})[k]
        if not np.array_equal(out, want[k]):
            mismatches.append((t, r))

    errors = _hammer(check)
    assert not errors and not mismatches, (errors[:3], mismatches[:3])
