"""The cpu backend's :class:`CpuExecutable`: a program and a strategy that runs it, combined.

Every cpu executor is one combination of the same parts (no executor inherits another's
behaviour):

================================  ==========================================================
``executor=``                     program + layout + strategy (+ streams)
================================  ==========================================================
``sequential``                    :class:`~ge_cpu.program.Program` + :class:`~ge_cpu.program.PlainInterpreter`
``arena``                         + :class:`~ge_cpu.arena.Layout` + :class:`~ge_cpu.arena.ArenaInterpreter`
``streams``                       + Layout + ArenaInterpreter + :class:`~ge_cpu.streams.StreamRunner`
``sink`` (one stream)             + Layout + :class:`~ge_cpu.sink.SinkCode` (generated code)
``sink`` / ``auto`` (several)     + Layout + SinkCode + StreamRunner
symbolic dims (any ``executor``)  + :class:`~ge_cpu.shaped.ShapedLayouts` (a Layout per run shape) + ArenaInterpreter
================================  ==========================================================

A run takes an arena context from the pool (when the executor has a layout), and runs the
strategy at its thread setting (:func:`run_threads`): with ``parallel=engine`` (the default)
BLAS executes at one thread and the kernels split their work over GE's pool
(:mod:`ge_native.parallel`) at ``threads`` wide; with ``parallel=blas`` BLAS's own threads are the
parallelism, at ``threads`` (:class:`ge_cpu.blas.BlasThreads`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from ge_core.backend import Executable
from ge_native import parallel

from .blas import BLAS, engine_width, parallel_mode
from .program import Program


@contextlib.contextmanager
def run_threads(threads: int | None, mode: str, width: int = 1) -> Iterator[None]:
    """The thread setting of one run. ``engine``: BLAS at one thread and GE's pool ``width``
    wide (:func:`ge_cpu.blas.engine_width`); ``blas``: BLAS at ``threads`` (None: its
    baseline) and the pool one wide."""
    if mode == "blas":
        with BLAS.run(threads), parallel.use_threads(1):
            yield
        return
    with BLAS.run(1), parallel.use_threads(width):
        yield


class Strategy(Protocol):
    """Runs a program: ``execute(context, feeds)`` returns the outputs (context None without a layout)."""

    def execute(self, ctx: Any, feeds: Mapping[str, Any]) -> list[Any]: ...


class Contexts(Protocol):
    """Where a run gets its arena context (:class:`ge_cpu.arena.ContextPool`)."""

    def acquire(self) -> Any: ...

    def release(self, ctx: Any) -> None: ...


class CpuExecutable(Executable):
    """A program run by a strategy, inside the contexts of a layout when it has one."""

    def __init__(self, program: Program, strategy: Strategy, options, *, layout: Any = None,
                 contexts: Contexts | None = None, streams: Any = None, plan: Any = None) -> None:
        self.program = program
        self.graph = program.graph
        self.steps = program.steps
        self.strategy = strategy
        #: threads of every run (None: the process's baseline); see :func:`run_threads`
        self.threads = options.getoption("threads") or None
        self.parallel = parallel_mode(options)
        #: GE's pool width of every run, fixed when the kernels were built (they cut their work for it)
        self.width = engine_width(options)
        BLAS.refresh()
        self.layout = layout
        self.plan = plan
        self.arena_bytes = layout.arena_bytes if layout is not None else 0
        self.noop_steps = layout.noop_steps if layout is not None else 0
        self.kernel_count = layout.kernel_count if layout is not None else len(program.steps)
        self.kernel_modes = program.kernel_modes
        self.node_kernels = program.node_kernels
        self.native_kernels = program.native_kernels
        #: the stream layout (:class:`ge_cpu.streams.StreamLayout`), None on one stream
        self.streams = streams
        self.stream_count = streams.count if streams is not None else 1
        self._pool = contexts

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        pool = self._pool
        if pool is None:
            with run_threads(self.threads, self.parallel, self.width):
                return self.strategy.execute(None, feeds)
        ctx = pool.acquire()
        try:
            with run_threads(self.threads, self.parallel, self.width):
                return self.strategy.execute(ctx, feeds)
        finally:
            pool.release(ctx)
