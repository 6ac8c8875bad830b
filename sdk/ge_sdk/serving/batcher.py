"""A dynamic batcher for serving a model over asyncio: a bounded queue, batches of up to
``max_batch`` rows formed within ``max_delay_ms``, runs on a pool of ``workers`` threads.

Requests queue in arrival order (at most ``max_queue``; beyond that :class:`QueueFull` at once,
the server's back-pressure). One dispatcher task forms a batch whenever a worker is free: the
oldest request, then the queued requests whose inputs match it apart from the batch dim (same
input names, dtypes and other dims; equal values for inputs without a batch axis), in order,
while the rows stay within ``max_batch`` (a request larger than that runs alone), waiting at most
``max_delay_ms`` after the oldest one's arrival for more. Their inputs are concatenated along
``batch_axes``, the model runs in a worker thread (its native kernels release the GIL), and the
outputs are split along ``output_axes`` back to each request, so a request gets what running it
alone gives on a model whose rows are independent. Under load the queue fills while the
workers run and batches form without waiting.

A request still queued ``timeout_s`` after its arrival gets :class:`RequestTimeout` and is not run;
an exception from the model goes to the requests of its batch only. :meth:`Batcher.drain` refuses
new requests (:class:`ShuttingDown`) and answers every accepted one.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_core.errors import ExecutionError, GEError, RunCancelledError

from .metrics import Metrics, status_of

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class QueueFull(ExecutionError):
    """The model's request queue is full (HTTP 429/503 with ``Retry-After: retry_after``)."""

    def __init__(self, message: str, *, retry_after: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retry_after = retry_after


class RequestTimeout(RunCancelledError):
    """A request waited in the queue past its timeout and was not run."""


class ShuttingDown(ExecutionError):
    """The batcher is draining (the server got SIGTERM) and takes no new requests."""


@dataclass(eq=False)
class _Request:
    feeds: dict[str, np.ndarray]
    request_id: str
    arrival: float
    future: asyncio.Future
    key: Any  # requests with equal keys may share a batch (None: runs alone)
    rows: int
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)


class Batcher:
    """Queues requests to ``run`` (feeds -> outputs, called in a worker thread) and batches them.

    ``batch_axes`` / ``output_axes``: the batch axis of each input / output (the model's symbolic
    batch dim); an input not named has no batch dim (requests merge only where it is equal); an
    output not named is given whole to each request of a batch. Either None: no batching (each
    request runs alone). ``max_batch``: most rows per run; ``max_delay_ms``: longest wait for more
    requests after the oldest of a batch arrived; ``max_queue``: most requests waiting;
    ``timeout_s``: longest wait in the queue; ``workers``: runs at once (threads);
    ``metrics``: where to count (default :class:`Metrics` of ``model_name``).
    """

    def __init__(self, run: Run, *, batch_axes: dict[str, int] | None, output_axes: dict[str, int] | None,
                 max_batch: int = 1, max_delay_ms: float = 0.0, max_queue: int = 64, timeout_s: float | None = None,
                 workers: int = 1, model_name: str = "", metrics: Metrics | None = None) -> None:
        where = f"model '{model_name}'" if model_name else "batcher"
        for name, value, low in (("max_batch", max_batch, 1), ("max_queue", max_queue, 1), ("workers", workers, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise GEError(f"{where}: {name} must be an integer >= {low}, not {value!r}")
        if not max_delay_ms >= 0:
            raise GEError(f"{where}: max_delay_ms must be >= 0, not {max_delay_ms!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise GEError(f"{where}: timeout_s must be > 0 or None, not {timeout_s!r}")
        self.run = run
        self.batching = batch_axes is not None and output_axes is not None
        self.batch_axes = dict(batch_axes or {})
        self.output_axes = dict(output_axes or {})
        self.max_batch, self.max_delay = max_batch, max_delay_ms / 1e3
        self.max_queue, self.timeout_s, self.workers = max_queue, timeout_s, workers
        self.model_name, self.where = model_name, where
        self.metrics = metrics if metrics is not None else Metrics(model_name)
        self._queue: collections.deque[_Request] = collections.deque()
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatcher: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._free: asyncio.Semaphore | None = None
        self._running: set[asyncio.Task] = set()
        self._closing = False
        self._run_seconds = 0.0  # moving average of a run's time, for QueueFull's retry hint

    @property
    def depth(self) -> int:
        """Requests waiting in the queue (not counting those running)."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Batches running now (at most ``workers``)."""
        return len(self._running)

    async def submit(self, feeds: dict[str, np.ndarray], request_id: str = "") -> dict[str, np.ndarray]:
        """Queue one request and return its outputs (``{name: array}``, arrays of its own).

        Raises :class:`QueueFull` (at once), :class:`ShuttingDown`, :class:`RequestTimeout`, or
        what the model's run raised (a :class:`GEError` keeps its type; anything else becomes an
        :class:`ExecutionError`)."""
        t0 = time.perf_counter()
        try:
            req = self._enqueue(feeds, request_id, t0)
        except GEError as e:
            self.metrics.request(status_of(e), time.perf_counter() - t0)
            raise
        try:
            out = await req.future
        except asyncio.CancelledError:  # the caller went away: a queued request is not run
            self._withdraw(req)
            raise
        except BaseException as e:
            self.metrics.request(status_of(e), time.perf_counter() - t0)
            raise
        self.metrics.request(status_of(None), time.perf_counter() - t0)
        return out

    async def drain(self) -> None:
        """Refuse new requests (:class:`ShuttingDown`), answer every accepted one, then stop the
        dispatcher and the worker threads."""
        self._closing = True
        if self._wake is not None:
            self._wake.set()  # a batch being formed stops waiting for more
        while self._queue or self._running:
            if self._running:
                await asyncio.wait(set(self._running))
            else:
                await asyncio.sleep(0.001)
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- queueing -------------------------------------------------------------------------------
    def _start(self) -> asyncio.AbstractEventLoop:
        """Bind to the running loop and start the dispatcher (on the first request)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._dispatcher is None or self._dispatcher.done():
            if self._loop is not None and self._loop is not loop and (self._queue or self._running):
                raise GEError(f"{self.where}: submit was called from a second event loop while requests are queued",
                              hint="use one batcher per event loop")
            self._loop, self._wake, self._free = loop, asyncio.Event(), asyncio.Semaphore(self.workers)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=f"ge-serve-{self.model_name}")
            self._dispatcher = loop.create_task(self._dispatch())
        return loop

    def _enqueue(self, feeds: dict[str, np.ndarray], request_id: str, t0: float) -> _Request:
        if self._closing:
            raise ShuttingDown(f"{self.where}: the server is shutting down and takes no new requests",
                               hint="retry against another replica, or after it restarts")
        if len(self._queue) >= self.max_queue:
            wait = self.retry_after()
            raise QueueFull(f"{self.where}: the request queue is full ({self.max_queue} requests waiting)",
                            retry_after=wait, hint=f"retry after {wait} s, or start the server with a larger "
                            "--max-queue or more workers")
        loop = self._start()
        arrays = {k: np.asarray(v) for k, v in feeds.items()}
        key, rows = self._key(arrays)
        req = _Request(arrays, request_id, t0, loop.create_future(), key, rows)
        if self.timeout_s is not None:
            req.expiry = loop.call_later(self.timeout_s, self._expire, req)
        self._queue.append(req)
        self.metrics.queue_depth(len(self._queue))
        assert self._wake is not None
        self._wake.set()
        return req

    def retry_after(self) -> int:
        """Seconds after which the queue has likely room again (at least 1): the time to run the
        queued requests, a full batch at a time on every worker."""
        runs = math.ceil(len(self._queue) / max(1, self.max_batch if self.batching else 1) / self.workers)
        return max(1, math.ceil(runs * self._run_seconds))

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple[Any, int]:
        """``(batch key, rows)``: requests with equal keys concatenate; None where the request
        must run alone (no batching, or inputs whose batch dim is missing or disagrees)."""
        if not self.batching:
            return None, 1
        parts: list[tuple] = []
        rows: int | None = None
        for name in sorted(feeds):
            a = feeds[name]
            axis = self.batch_axes.get(name)
            if axis is None:  # no batch dim: requests merge only where the value is the same
                parts.append((name, a.dtype.str, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest()))
                continue
            if not -a.ndim <= axis < a.ndim or (rows is not None and a.shape[axis] != rows):
                return None, 1  # the model reports what is wrong with it
            rows = a.shape[axis]
            parts.append((name, a.dtype.str, a.shape[:axis % a.ndim] + a.shape[axis % a.ndim + 1:]))
        return (tuple(parts), rows) if rows else (None, 1)  # no batch input, or 0 rows: alone

    def _expire(self, req: _Request) -> None:
        """``timeout_s`` passed: fail the request if it is still queued."""
        if req.future.done():
            return
        try:
            self._queue.remove(req)
        except ValueError:
            return  # taken into a batch: it runs
        self.metrics.queue_depth(len(self._queue))
        waited = time.perf_counter() - req.arrival
        rid = f" {req.request_id}" if req.request_id else ""
        req.future.set_exception(RequestTimeout(
            f"{self.where}: request{rid} waited {waited:.2f} s in the queue, past its timeout of {self.timeout_s:g} s, "
            "and was not run", hint="retry later, or start the server with a longer timeout or more workers"))

    def _withdraw(self, req: _Request) -> None:
        if req.expiry is not None:
            req.expiry.cancel()
        try:
            self._queue.remove(req)
        except ValueError:
            return
        self.metrics.queue_depth(len(self._queue))

    # -- batching -------------------------------------------------------------------------------
    async def _dispatch(self) -> None:
        """Form a batch whenever a worker is free, and start it."""
        assert self._wake is not None and self._free is not None and self._loop is not None
        while True:
            await self._free.acquire()
            batch = await self._form()
            task = self._loop.create_task(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _form(self) -> list[_Request]:
        """The next batch: the oldest request and the matching ones after it, waiting up to
        ``max_delay`` after the oldest arrived while there is room (not while draining)."""
        assert self._wake is not None
        while not self._queue:
            self._wake.clear()
            await self._wake.wait()
        first = self._queue[0]
        if first.key is not None and first.rows < self.max_batch:
            until = first.arrival + self.max_delay
            while not self._closing and first in self._queue and self._rows_for(first) < self.max_batch:
                left = until - time.perf_counter()
                if left <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except asyncio.TimeoutError:
                    break
            if first not in self._queue:  # it timed out or was withdrawn meanwhile
                return await self._form()
        batch = [first] if first.key is None else self._matching(first)
        for r in batch:
            self._queue.remove(r)
            if r.expiry is not None:
                r.expiry.cancel()
        self.metrics.queue_depth(len(self._queue))
        return batch

    def _matching(self, first: _Request) -> list[_Request]:
        """The oldest request and the queued ones that match it, in order, within ``max_batch``
        rows (``first`` alone where it is larger)."""
        batch, rows = [first], first.rows
        for r in self._queue:
            if r is not first and r.key == first.key and rows + r.rows <= self.max_batch:
                batch.append(r)
                rows += r.rows
                if rows == self.max_batch:
                    break
        return batch

    def _rows_for(self, first: _Request) -> int:
        return sum(r.rows for r in self._matching(first))

    async def _execute(self, batch: list[_Request]) -> None:
        """Run one batch in a worker thread and answer its requests."""
        assert self._free is not None and self._loop is not None
        try:
            feeds = batch[0].feeds if len(batch) == 1 else {
                k: np.concatenate([r.feeds[k] for r in batch], axis=self.batch_axes[k]) if k in self.batch_axes
                else v for k, v in batch[0].feeds.items()}
            rows = sum(r.rows for r in batch)
            t0 = time.perf_counter()
            try:
                outs = await self._loop.run_in_executor(self._executor, self.run, feeds)
            finally:
                seconds = time.perf_counter() - t0
                self._run_seconds = seconds if not self._run_seconds else 0.8 * self._run_seconds + 0.2 * seconds
            self.metrics.batch(rows, seconds)
            results = [outs] if len(batch) == 1 else self._split(outs, batch)
        except GEError as e:
            self._fail(batch, e)
        except Exception as e:  # noqa: BLE001 - the model's failure goes to its batch; the batcher keeps serving
            err = ExecutionError(f"{self.where}: the model's run failed: {type(e).__name__}: {e}",
                                 hint="see the server's log; other requests are not affected")
            err.__cause__ = e
            self._fail(batch, err)
        else:
            for r, out in zip(batch, results):
                if not r.future.done():
                    r.future.set_result(out)
        finally:
            self._free.release()

    def _split(self, outs: dict[str, np.ndarray], batch: list[_Request]) -> list[dict[str, np.ndarray]]:
        """Each request's slice of the batch's outputs (copies, so each owns its arrays)."""
        total = sum(r.rows for r in batch)
        results: list[dict[str, np.ndarray]] = [{} for _ in batch]
        for name, value in outs.items():
            a = np.asarray(value)
            axis = self.output_axes.get(name)
            if axis is None:
                for res in results:
                    res[name] = a
                continue
            if not -a.ndim <= axis < a.ndim or a.shape[axis] != total:
                raise ExecutionError(f"{self.where}: output '{name}' has shape {a.shape}, not {total} rows along "
                                     f"axis {axis} for a batch of {total} rows",
                                     hint="the model does not batch along this dim: serve it without batching")
            start = 0
            for res, r in zip(results, batch):
                res[name] = np.ascontiguousarray(np.take(a, range(start, start + r.rows), axis=axis))
                start += r.rows
        return results

    @staticmethod
    def _fail(batch: list[_Request], err: BaseException) -> None:
        for r in batch:
            if not r.future.done():
                r.future.set_exception(err)
