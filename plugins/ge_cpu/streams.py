"""Several streams: a schedule's :class:`StreamLayout` and the one :class:`StreamRunner`.

The compile's :class:`ge_core.schedule.StreamAssignment` puts every node on a stream and lists
the events ``(src, dst)`` that order cross-stream dependencies. A run starts one thread per
extra stream (stream 0 runs on the calling thread); each thread runs its stream's steps in
schedule order, waiting for the events into a step and signalling its own event when a step that
records one finishes. NumPy releases the GIL inside large kernels and BLAS, so those run truly
in parallel. Both multi-stream strategies use this runner: the interpreter
(:class:`MultiStreamExecutable`) and the generated code (``ge_cpu.sink.StreamSinkExecutable``).

An error in any stream stops every stream (waiters wake up and leave) and surfaces once on the
calling thread; nothing waits forever. Worker threads run in a copy of the caller's context
(``contextvars.copy_context().run``): they see the run's deadline and its BLAS thread count.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable
from typing import Any

from ge_core.errors import ExecutionError, GEError
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan
from ge_core.ops import OpRegistry
from ge_core.schedule import StreamAssignment

from .arena import ArenaInterpreter, ContextPool, Layout
from .executable import CpuExecutable
from .program import Program

#: A waiting stream checks this often whether another stream failed.
WAIT_SLICE_S = 0.05


class StreamLayout:
    """A program's steps per stream, the steps each step waits for, and the steps that record an event."""

    def __init__(self, program: Program, assignment: StreamAssignment) -> None:
        order = program.graph.node_list()
        if len(assignment.streams) != len(order) or len(program.steps) != len(order):
            raise GEError("the stream assignment does not match the compiled schedule", hint="recompile the model")
        step_of = {st.node: i for i, st in enumerate(program.steps)}
        self.count = assignment.count
        #: per stream, its steps in schedule order
        self.steps: list[list[int]] = [[] for _ in range(assignment.count)]
        for idx, node in enumerate(order):
            self.steps[assignment.streams[idx]].append(step_of[node])
        #: step -> the steps whose events it waits for
        self.waits: dict[int, list[int]] = {}
        #: the steps that signal an event when they finish
        self.records: set[int] = set()
        for src, dst in assignment.events:
            self.waits.setdefault(step_of[order[dst]], []).append(step_of[order[src]])
            self.records.add(step_of[order[src]])


class _Abort(Exception):
    """Raised inside a stream when another stream failed."""


def stream_failed(e: BaseException, tb: Any) -> ExecutionError:
    """The error a run reports for a stream that raised ``e`` (not a GEError)."""
    return ExecutionError(f"a stream failed: {type(e).__name__}: {e}")


class StreamRunner:
    """Runs one body per stream of a :class:`StreamLayout`, each on its own thread, with one
    ``threading.Event`` per recorded step."""

    def __init__(self, layout: StreamLayout, thread_name: str = "ge-stream") -> None:
        self.layout = layout
        self.thread_name = thread_name

    def run(self, body: Callable[[int, Callable[[int], None], Callable[[int], None]], None],
            explain: Callable[[BaseException, Any], ExecutionError] = stream_failed) -> None:
        """Call ``body(k, wait, signal)`` for every stream ``k`` (stream 0 on this thread) and
        return when all have finished. ``wait(step)`` blocks until ``signal(step)`` was called
        (or leaves the stream when another one failed). The first error of any stream is raised
        here: a GEError as it is, anything else as ``explain(error, traceback)``."""
        done = {i: threading.Event() for i in self.layout.records}
        failed = threading.Event()
        errors: list[tuple[BaseException, Any]] = []

        def wait(src: int) -> None:
            ev = done[src]
            while not ev.wait(WAIT_SLICE_S):
                if failed.is_set():
                    raise _Abort
            if failed.is_set():
                raise _Abort

        def signal(i: int) -> None:
            done[i].set()

        def go(k: int) -> None:
            try:
                body(k, wait, signal)
            except _Abort:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
                errors.append((e, sys.exc_info()[2]))
                failed.set()
                for ev in done.values():
                    ev.set()

        # each worker runs in a copy of the caller's context: it sees the run's deadline
        workers = [threading.Thread(target=contextvars.copy_context().run, args=(go, k),
                                    name=f"{self.thread_name}-{k}", daemon=True)
                   for k in range(1, self.layout.count)]
        for w in workers:
            w.start()
        go(0)
        for w in workers:
            w.join()
        if errors:
            e, tb = errors[0]
            if isinstance(e, GEError):
                raise e
            raise explain(e, tb) from e


class MultiStreamExecutable(CpuExecutable):
    """Each stream of the schedule interpreted on its own thread inside one arena per run
    (option ``executor=streams``).

    BLAS threads: the same count as every other executor (the ``threads`` option, else the
    process's baseline), so a schedule's streams never change a result's bits; the worker
    threads run in the caller's context and never set the count themselves (BlasThreads)."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan, streams: StreamAssignment,
                 ops: OpRegistry | None = None) -> None:
        program = Program(graph, kernels, options, ops=ops)
        layout = Layout(program, plan)
        sl = StreamLayout(program, streams)
        super().__init__(program, ArenaInterpreter(program, layout, StreamRunner(sl, "ge-stream")), options,
                         layout=layout, contexts=ContextPool(program, layout), streams=sl, plan=plan)
        self.assignment = streams
