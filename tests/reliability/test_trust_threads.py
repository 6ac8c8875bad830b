"""Results never depend on the calling thread (issue 15).

A BLAS library keeps one thread count per process and its GEMM rounds differently at different
counts, so every run executes at one definite count (the model's ``threads`` option, else the
process's baseline) whichever thread calls it, and runs at different counts never overlap
(``ge_cpu.executor.BlasThreads``). These tests check the count a kernel sees inside runs called
from 16 threads (through a probe op registered like any plugin kernel), and that 16 threads
get the same bits as sequential runs, with ``threads`` set and with the multi-stream executors.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import threadpoolctl

import ge_core as ge
from ge_core import hookimpl
from ge_sdk import GraphBuilder, temporary_plugin

N_THREADS = 16


def _blas_libs():
    return threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers


def _counts() -> tuple[int, ...]:
    return tuple(int(lib.get_num_threads()) for lib in _blas_libs())


@pytest.fixture(scope="module")
def baseline():
    c = _counts()
    assert c, "threadpoolctl finds no BLAS library (NumPy ships OpenBLAS): the thread policy cannot be checked"
    return c


class Probe:
    """``t::BlasProbe(x) -> [count]``: the BLAS thread count its kernel sees (first library)."""

    @hookimpl
    def ge_register_ops(self, register):
        register(ge.OpDef("BlasProbe", domain="t", min_inputs=1, max_inputs=1,
                          infer=lambda n, o: [ge.TensorType("float32", (1,))]))

    @hookimpl
    def ge_register_kernels(self, register):
        libs = _blas_libs()

        def factory(spec):
            def probe(x):
                return (np.array([libs[0].get_num_threads()], np.float32),)
            return probe
        register("BlasProbe", factory, domain="t")


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
    "sequential/threads=1": ({"executor": "sequential", "enable_single_stream": True, "threads": 1}, 1),
    "arena/threads=2": ({"executor": "arena", "enable_single_stream": True, "threads": 2}, 2),
    "sink/baseline": ({"executor": "sink", "enable_single_stream": True}, None),
    "streams/threads=1": ({"executor": "streams", "stream_allocator": "dependency", "threads": 1}, 1),
    "streams/baseline": ({"executor": "streams", "stream_allocator": "dependency"}, None),
    "sink-streams/threads=2": ({"executor": "sink", "stream_allocator": "dependency", "threads": 2}, 2),
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
    assert _counts() == baseline, "the BLAS count leaked out of the runs"


@pytest.mark.parametrize("label", ["sequential/threads=2", "arena/threads=1", "streams", "sink-streams"])
def test_16_threads_get_the_bits_of_sequential_runs(label, baseline):
    opts = {
        "sequential/threads=2": {"executor": "sequential", "enable_single_stream": True, "threads": 2},
        "arena/threads=1": {"executor": "arena", "enable_single_stream": True, "threads": 1},
        "streams": {"executor": "streams", "stream_allocator": "dependency"},
        "sink-streams": {"executor": "sink", "stream_allocator": "dependency", "threads": 2},
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
    m1 = ge.compile(g, {"executor": "arena", "enable_single_stream": True, "threads": 1, "opt_level": 0})
    m2 = ge.compile(g, {"executor": "streams", "stream_allocator": "dependency", "threads": 2, "opt_level": 0})
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
    assert _counts() == baseline


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
        inner_model = ge.compile(_gemm_model(probes=False), {"executor": "arena", "threads": 2, "opt_level": 0})
        Nested.inner = inner_model
        b = GraphBuilder("outer")
        b.graph.opset_imports["t"] = 1
        x = b.input("x", "float32", (48, 192))
        y = b.op("RunInner", x, domain="t")
        b.output(b.op("BlasProbe", y, domain="t"))
        outer = ge.compile(b.graph, {"executor": "sequential", "threads": 1, "opt_level": 0})
        xv = np.ones((48, 192), np.float32)
        done: dict = {}
        t = threading.Thread(target=lambda: done.setdefault("out", outer.run({"x": xv})))
        t.start()
        t.join(60)
        assert not t.is_alive(), "a nested run waited for its own outer run"
        (name,) = outer.output_names
        assert float(done["out"][name][0]) == 1.0  # the outer run's count held throughout
    assert _counts() == baseline


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
        holder = ge.compile(b.graph, {"executor": "sequential", "threads": 1, "opt_level": 0})
        other = ge.compile(_gemm_model(), {"executor": "arena", "threads": 2, "opt_level": 0})
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
    assert _counts() == baseline
