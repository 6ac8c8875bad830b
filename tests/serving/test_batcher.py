"""The serving batcher: batches of concurrent requests, results equal to single runs, back-pressure,
timeouts, failures confined to their batch, draining; its Prometheus metrics."""

import asyncio
import threading
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

import ge_core as ge
from ge_core.errors import ExecutionError, GEError, InputError
from ge_sdk import GraphBuilder
from ge_sdk.serving.batcher import Batcher, QueueFull, RequestTimeout, ShuttingDown
from ge_sdk.serving.metrics import Metrics

AXES = {"x": 0}, {"y": 0}


class Fake:
    """A model ``y = 2 x + 1`` row by row that records each run's rows and can hold runs at a gate."""

    def __init__(self, gated=False, fail=None):
        self.rows: list[int] = []
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.fail = fail

    def __call__(self, feeds):
        assert self.gate.wait(10)
        x = feeds["x"]
        self.rows.append(x.shape[0])
        if self.fail is not None and (x < 0).any():
            raise self.fail
        return {"y": x * 2 + 1, "n": np.int64(x.shape[0])}


def rows(n, start=0.0, width=4, dtype=np.float32):
    return {"x": (np.arange(n * width, dtype=np.float64).reshape(n, width) + start).astype(dtype)}


async def until(cond, timeout=5.0):
    t0 = time.perf_counter()
    while not cond():
        assert time.perf_counter() - t0 < timeout, "condition not reached"
        await asyncio.sleep(0.002)


def sample(name, labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_concurrent_requests_merge_and_each_gets_its_rows():
    fake = Fake(gated=True)
    b = Batcher(fake, batch_axes=AXES[0], output_axes=AXES[1], max_batch=4, max_delay_ms=50, model_name="t-merge")

    async def main():
        first = asyncio.ensure_future(b.submit(rows(1, 100.0)))
        await until(lambda: b.depth == 0 and b.in_flight)  # taken: the next ones queue behind its run
        reqs = [rows(1 + i % 2, 10.0 * i) for i in range(6)]
        tasks = [asyncio.ensure_future(b.submit(r, request_id=f"r{i}")) for i, r in enumerate(reqs)]
        await until(lambda: b.depth == 6)
        fake.gate.set()
        outs = await asyncio.gather(first, *tasks)
        await b.drain()
        return reqs, outs[1:]

    reqs, outs = asyncio.run(main())
    for r, o in zip(reqs, outs):
        np.testing.assert_array_equal(o["y"], r["x"] * 2 + 1)
        assert o["y"].shape == r["x"].shape and o["y"].flags.c_contiguous
    assert fake.rows[0] == 1 and max(fake.rows[1:]) > 1 and all(n <= 4 for n in fake.rows)
    assert sum(fake.rows) == 1 + sum(r["x"].shape[0] for r in reqs)
    assert outs[0]["n"] == fake.rows[1]  # an output without a batch axis: each request gets it whole
    # the batch-size histogram saw batches of more than one row
    total = sample("ge_batch_size_count", {"model": "t-merge"})
    ones = sample("ge_batch_size_bucket", {"model": "t-merge", "le": "1.0"})
    assert total == len(fake.rows) and total - ones >= 1
    assert sample("ge_requests_total", {"model": "t-merge", "status": "ok"}) == 7
    assert sample("ge_queue_depth", {"model": "t-merge"}) == 0


def mlp():
    rng = np.random.default_rng(0)
    b = GraphBuilder("mlp")
    x = b.input("x", "float32", ("N", 64))
    w1 = b.const(rng.standard_normal((64, 96)).astype(np.float32), "w1")
    w2 = b.const(rng.standard_normal((96, 10)).astype(np.float32), "w2")
    y = b.op("Softmax", b.op("MatMul", b.op("Relu", b.op("MatMul", x, w1)), w2), axis=-1)
    b.output(y)
    return b.graph


def test_real_model_batched_results_equal_single_runs():
    model = ge.compile(mlp(), {"threads": 1})
    out = model.output_names[0]
    seen = []

    def run(feeds):
        seen.append(feeds["x"].shape[0])
        return model.run(feeds)

    b = Batcher(run, batch_axes={"x": 0}, output_axes={out: 0}, max_batch=8, max_delay_ms=100, workers=2,
                model_name="t-real")
    rng = np.random.default_rng(1)
    reqs = [{"x": rng.standard_normal((n, 64)).astype(np.float32)} for n in (1, 3, 2, 1, 1, 4, 2, 1, 5, 1)]

    async def main():
        outs = await asyncio.gather(*(b.submit(r) for r in reqs))
        await b.drain()
        return outs

    outs = asyncio.run(main())
    assert max(seen) > 1 and len(seen) < len(reqs) and sum(seen) == sum(r["x"].shape[0] for r in reqs)
    for r, o in zip(reqs, outs):
        np.testing.assert_array_equal(o[out], model.run(r)[out])  # bit-equal to running it alone


def test_full_queue_refuses_at_once_with_a_retry_hint():
    fake = Fake(gated=True)
    b = Batcher(fake, batch_axes=None, output_axes=None, max_queue=2, model_name="t-full")

    async def main():
        running = asyncio.ensure_future(b.submit(rows(1)))
        await until(lambda: b.depth == 0 and b.in_flight)
        queued = [asyncio.ensure_future(b.submit(rows(1, i))) for i in (1, 2)]
        await until(lambda: b.depth == 2)
        t0 = time.perf_counter()
        with pytest.raises(QueueFull, match="queue is full.*retry after 1 s.*--max-queue") as e:
            await b.submit(rows(1))
        assert time.perf_counter() - t0 < 0.5 and e.value.retry_after >= 1
        assert isinstance(e.value, GEError)
        fake.gate.set()
        await asyncio.gather(running, *queued)
        await b.submit(rows(1))  # room again
        await b.drain()

    asyncio.run(main())
    assert sample("ge_requests_total", {"model": "t-full", "status": "queue_full"}) == 1
    assert sample("ge_requests_total", {"model": "t-full", "status": "ok"}) == 4


def test_request_past_its_timeout_in_the_queue_is_not_run():
    fake = Fake(gated=True)
    b = Batcher(fake, batch_axes=AXES[0], output_axes=AXES[1], max_batch=4, timeout_s=0.1, model_name="t-timeout")

    async def main():
        running = asyncio.ensure_future(b.submit(rows(1)))
        await until(lambda: b.depth == 0 and b.in_flight)
        with pytest.raises(RequestTimeout, match="request late waited .* past its timeout of 0.1 s"):
            await b.submit(rows(1, 5.0), request_id="late")
        assert b.depth == 0
        fake.gate.set()
        await running  # taken into a run before its deadline: answered
        await b.drain()

    asyncio.run(main())
    assert fake.rows == [1]
    assert sample("ge_requests_total", {"model": "t-timeout", "status": "timeout"}) == 1


def test_a_failing_run_fails_only_its_batch():
    fake = Fake(gated=True, fail=InputError("input 'x': negative values"))
    b = Batcher(fake, batch_axes=AXES[0], output_axes=AXES[1], max_batch=2, model_name="t-fail")

    async def main():
        hold = asyncio.ensure_future(b.submit(rows(1)))
        await until(lambda: b.depth == 0 and b.in_flight)
        bad = {"x": -np.ones((1, 4), np.float32)}
        tasks = [asyncio.ensure_future(b.submit(r)) for r in (bad, rows(1, 1.0), rows(1, 2.0), rows(1, 3.0))]
        await until(lambda: b.depth == 4)
        fake.gate.set()
        res = await asyncio.gather(hold, *tasks, return_exceptions=True)
        fake.fail = ValueError("boom")
        other = await asyncio.gather(b.submit(bad), return_exceptions=True)
        after = await b.submit(rows(2))  # the batcher keeps serving
        await b.drain()
        return res, other[0], after

    res, other, after = asyncio.run(main())
    assert fake.rows[:3] == [1, 2, 2]
    assert isinstance(res[1], InputError) and isinstance(res[2], InputError)  # a GEError keeps its type
    for r, start in zip(res[3:], (2.0, 3.0)):
        np.testing.assert_array_equal(r["y"], rows(1, start)["x"] * 2 + 1)
    assert isinstance(other, ExecutionError) and "ValueError: boom" in str(other)
    np.testing.assert_array_equal(after["y"], rows(2)["x"] * 2 + 1)
    assert sample("ge_requests_total", {"model": "t-fail", "status": "bad_request"}) == 2
    assert sample("ge_requests_total", {"model": "t-fail", "status": "error"}) == 1


def test_drain_answers_accepted_requests_and_refuses_new_ones():
    fake = Fake(gated=True)
    b = Batcher(fake, batch_axes=AXES[0], output_axes=AXES[1], max_batch=2, max_delay_ms=1000, model_name="t-drain")

    async def main():
        accepted = [asyncio.ensure_future(b.submit(rows(1, i))) for i in range(5)]
        await until(lambda: b.in_flight and b.depth == 3)
        draining = asyncio.ensure_future(b.drain())
        await asyncio.sleep(0.01)
        with pytest.raises(ShuttingDown, match="shutting down"):
            await b.submit(rows(1))
        fake.gate.set()
        t0 = time.perf_counter()
        outs = await asyncio.gather(*accepted)
        await draining
        assert time.perf_counter() - t0 < 0.5  # no batch waits out max_delay while draining
        return outs

    outs = asyncio.run(main())
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o["y"], rows(1, i)["x"] * 2 + 1)
    assert sum(fake.rows) == 5


def test_no_batching_without_batch_axes():
    fake = Fake()
    b = Batcher(fake, batch_axes=None, output_axes=None, max_batch=8, max_delay_ms=50, workers=2, model_name="t-none")

    async def main():
        outs = await asyncio.gather(*(b.submit(rows(n)) for n in (1, 2, 3, 1)))
        await b.drain()
        return outs

    outs = asyncio.run(main())
    assert sorted(fake.rows) == [1, 1, 2, 3] and [o["y"].shape[0] for o in outs] == [1, 2, 3, 1]


def test_mismatched_shapes_dtypes_and_oversized_requests_are_not_merged():
    fake = Fake(gated=True)
    b = Batcher(fake, batch_axes=AXES[0], output_axes=AXES[1], max_batch=4, model_name="t-mismatch")
    reqs = [rows(1, width=4), rows(1, width=6), rows(1, width=4, dtype=np.float64), rows(5), rows(2, width=6)]

    async def main():
        hold = asyncio.ensure_future(b.submit(rows(1)))
        await until(lambda: b.depth == 0 and b.in_flight)
        tasks = [asyncio.ensure_future(b.submit(r)) for r in reqs]
        await until(lambda: b.depth == len(reqs))
        fake.gate.set()
        outs = await asyncio.gather(hold, *tasks)
        await b.drain()
        return outs[1:]

    outs = asyncio.run(main())
    for r, o in zip(reqs, outs):
        assert o["y"].dtype == r["x"].dtype
        np.testing.assert_array_equal(o["y"], r["x"] * 2 + 1)
    # runs: the held one; width 4 float32 alone (the float64 and 5-row ones differ); both width 6
    # requests together; the float64 one; the 5 rows alone (more than max_batch)
    assert fake.rows == [1, 1, 3, 1, 5]


def test_bad_settings_and_metrics_without_prometheus(monkeypatch):
    with pytest.raises(GEError, match="max_batch must be an integer >= 1"):
        Batcher(Fake(), batch_axes=None, output_axes=None, max_batch=0, model_name="m")
    with pytest.raises(GEError, match="timeout_s must be > 0"):
        Batcher(Fake(), batch_axes=None, output_axes=None, timeout_s=0)
    from ge_sdk.serving import metrics

    monkeypatch.setattr(metrics, "_collectors", {})  # as if prometheus_client were absent
    m = Metrics("quiet")
    assert not m.enabled
    m.request("ok", 0.1), m.queue_depth(3), m.batch(2, 0.01)
    assert sample("ge_requests_total", {"model": "quiet", "status": "ok"}) == 0
