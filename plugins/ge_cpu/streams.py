"""The multi-stream executor: one worker thread per stream, events as synchronisation.

The compile's :class:`ge_core.schedule.StreamAssignment` puts every node on a stream and lists
the events ``(src, dst)`` that order cross-stream dependencies. A run starts one thread per
extra stream (stream 0 runs on the calling thread); each thread runs its stream's steps in
schedule order, waiting for the events into a step and setting its own event when a step that
records one finishes. NumPy releases the GIL inside large kernels and BLAS, so those run truly
in parallel.

Values are never freed early here (a value's last reader in schedule order may run before an
earlier reader on another stream); the arena holds planned values anyway. An error in any stream
stops every stream (waiters wake up and leave) and surfaces as one :class:`ExecutionError`;
nothing waits forever.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Mapping
from typing import Any

from ge_core.errors import ExecutionError, GEError
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan
from ge_core.schedule import StreamAssignment

from .arena import ArenaExecutable, _as_output

#: A waiting stream checks this often whether another stream failed.
WAIT_SLICE_S = 0.05


class _Abort(Exception):
    """Raised inside a stream when another stream failed."""


class MultiStreamExecutable(ArenaExecutable):
    """Runs each stream of the schedule on its own thread inside one arena per run."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan, streams: StreamAssignment) -> None:
        super().__init__(graph, kernels, options, plan)
        n_nodes = len(graph)
        if len(streams.streams) != n_nodes or len(self.steps) != n_nodes:
            raise GEError("the stream assignment does not match the compiled schedule", hint="recompile the model")
        self.assignment = streams
        step_of = {st.node: i for i, st in enumerate(self.steps)}
        order = graph.node_list()
        self.stream_steps: list[list[int]] = [[] for _ in range(streams.count)]
        for idx, node in enumerate(order):
            self.stream_steps[streams.streams[idx]].append(step_of[node])
        self.waits: dict[int, list[int]] = {}
        self.records: set[int] = set()
        for src, dst in streams.events:
            self.waits.setdefault(step_of[order[dst]], []).append(step_of[order[src]])
            self.records.add(step_of[order[src]])
        self.stream_count = streams.count
        # BLAS threads: the same count as every other executor (the ``threads`` option, else the
        # process's baseline), so a schedule's streams never change a result's bits; the worker
        # threads run in the caller's context and never set the count themselves (BlasThreads)

    def _execute(self, ctx, feeds: Mapping[str, Any]) -> list[Any]:
        env = self._start(ctx, feeds)
        done = {i: threading.Event() for i in self.records}
        failed = threading.Event()
        errors: list[BaseException] = []

        def wait_for(src: int) -> None:
            ev = done[src]
            while not ev.wait(WAIT_SLICE_S):
                if failed.is_set():
                    raise _Abort
            if failed.is_set():
                raise _Abort

        def run_stream(k: int) -> None:
            try:
                for i in self.stream_steps[k]:
                    for src in self.waits.get(i, ()):
                        wait_for(src)
                    self._step(i, env, ctx, free=False)
                    if i in done:
                        done[i].set()
            except _Abort:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
                errors.append(e)
                failed.set()
                for ev in done.values():
                    ev.set()

        # each worker runs in a copy of the caller's context: it sees the run's deadline
        workers = [threading.Thread(target=contextvars.copy_context().run, args=(run_stream, k), name=f"ge-stream-{k}",
                                    daemon=True)
                   for k in range(1, self.stream_count)]
        for w in workers:
            w.start()
        run_stream(0)
        for w in workers:
            w.join()
        if errors:
            e = errors[0]
            if isinstance(e, GEError):
                raise e
            raise ExecutionError(f"a stream failed: {type(e).__name__}: {e}") from e
        return [_as_output(env[s], ctx.arena) for s in self.output_slots]
