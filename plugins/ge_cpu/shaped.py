"""Symbolic shapes: a program run inside the arena a :class:`ge_core.memory.SymbolicPlan` gives
each run's shapes (planned once at compile time, evaluated and verified per distinct shape)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan, SymbolicPlan

from .arena import ArenaInterpreter, ContextPool, Layout
from .executable import CpuExecutable, run_threads
from .program import Program
from .streams import StreamLayout, StreamRunner


class ShapedLayouts:
    """A symbolic plan's layouts: per distinct binding of the input symbols (one run's shapes),
    the concrete plan (:meth:`ge_core.memory.SymbolicPlan.at`, verified), its :class:`Layout`,
    interpreter and contexts, made on the first run at those shapes and kept for the last
    :data:`KEEP` bindings. A binding with a symbol below 1 (an empty dim) runs unplanned."""

    #: Bindings whose layouts (and pooled arenas) are kept.
    KEEP = 8

    def __init__(self, program: Program, plan: SymbolicPlan, streams: Any = None) -> None:
        self.program, self.plan, self.streams = program, plan, streams
        #: (input slot, axis, symbol) of every symbolic input dim
        self.dims = [(name, i, d) for name, _ in program.input_slots
                     for v in [_input(program.graph, name)] for i, d in enumerate(v.type.shape or ())
                     if isinstance(d, str)]
        self._cache: dict[tuple, tuple[Layout, ArenaInterpreter, ContextPool]] = {}
        self._lock = threading.Lock()

    def binding(self, feeds: Mapping[str, Any]) -> dict[str, int]:
        return {d: int(np.shape(feeds[name])[i]) for name, i, d in self.dims}

    def entry(self, binding: dict[str, int]) -> tuple[Layout, ArenaInterpreter, ContextPool]:
        key = tuple(sorted(binding.items()))
        with self._lock:
            hit = self._cache.pop(key, None)
            if hit is not None:
                self._cache[key] = hit  # most recent last
                return hit
        if all(v >= 1 for v in binding.values()):
            plan = self.plan.at(binding)
        else:
            plan = MemoryPlan({}, 0, "none")
        layout = Layout(self.program, plan, binding)
        made = (layout, ArenaInterpreter(self.program, layout, self.streams), ContextPool(self.program, layout))
        with self._lock:
            self._cache[key] = made
            while len(self._cache) > self.KEEP:
                self._cache.pop(next(iter(self._cache)))
        return made

    def arena_bytes(self, binding: dict[str, int]) -> int:
        return self.entry(binding)[0].arena_bytes


def _input(graph: Graph, name: str):
    return next(v for v in graph.inputs if v.name == name)


class SymbolicArenaExecutable(CpuExecutable):
    """A model with symbolic dims interpreted inside the arena its symbolic plan gives each run's
    shapes (:class:`ShapedLayouts`): planned once at compile time, evaluated per distinct shape."""

    def __init__(self, graph: Graph, kernels, options, plan: SymbolicPlan, assignment: Any = None) -> None:
        program = Program(graph, kernels, options)
        runner = sl = None
        if assignment is not None:  # several streams: each on its thread, as MultiStreamExecutable
            sl = StreamLayout(program, assignment)
            runner = StreamRunner(sl, "ge-stream")
        super().__init__(program, ArenaInterpreter(program, Layout(program, MemoryPlan({}, 0, "none"))), options,
                         plan=plan, streams=sl)
        self.shapes = ShapedLayouts(program, plan, runner)

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        layout, interp, pool = self.shapes.entry(self.shapes.binding(feeds))
        ctx = pool.acquire()
        try:
            with run_threads(self.threads, self.parallel, self.width):
                return interp.execute(ctx, feeds)
        finally:
            pool.release(ctx)
