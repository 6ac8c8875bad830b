"""Symbolic shapes: a program run inside the arena a :class:`ge_core.memory.SymbolicPlan` gives
each run's shapes (planned once at compile time, evaluated and verified per distinct shape)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ge_core.errors import GEError
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan, SymbolicPlan
from ge_core.ops import OpRegistry

from .arena import ArenaInterpreter, ContextPool, Layout
from .executable import CpuExecutable, run_threads
from .program import Program, op_registry
from .streams import StreamLayout, StreamRunner


class ShapedLayouts:
    """A symbolic plan's layouts: per distinct binding of the input symbols (one run's shapes),
    the concrete plan (:meth:`ge_core.memory.SymbolicPlan.at`, verified), its :class:`Layout`,
    interpreter and contexts, made on the first run at those shapes and kept for the last
    :data:`KEEP` bindings. A binding with a symbol below 1 (an empty dim) runs unplanned.

    The program's *shape steps* (:func:`shape_steps`: Shape, and deterministic ops computing
    small integer tensors from shapes and constants only, what an exporter writes around every
    reshape of a dynamic tensor) give the same values at every run of one binding: the first run
    at a binding keeps them, and later runs take them as constants of the layout."""

    #: Bindings whose layouts (and pooled arenas, and kept shape-step results) are kept.
    KEEP = 8

    def __init__(self, program: Program, plan: SymbolicPlan, streams: Any = None) -> None:
        self.program, self.plan, self.streams = program, plan, streams
        #: (input name, axis, symbol) of every symbolic input dim
        self.dims = _symbolic_dims(program)
        self._cache: dict[tuple, tuple[Layout, ArenaInterpreter, ContextPool]] = {}
        self._lock = threading.Lock()
        #: the output slots of the shape steps (kept per binding after its first run)
        self.shape_slots = {s for i in shape_steps(program) for s in program.steps[i].outs}
        self._first: dict[tuple, tuple[MemoryPlan, dict[str, int]]] = {}

    def binding(self, feeds: Mapping[str, Any]) -> dict[str, int]:
        return {d: int(np.shape(feeds[name])[i]) for name, i, d in self.dims}

    def entry(self, binding: dict[str, int]) -> tuple[Layout, ArenaInterpreter, ContextPool]:
        key = tuple(sorted(binding.items()))
        with self._lock:
            hit = self._cache.pop(key, None)
            if hit is not None:
                self._cache[key] = hit  # most recent last
                return hit
        plan = MemoryPlan({}, 0, "none")  # unplanned: an empty dim, or shapes the model cannot take
        if all(v >= 1 for v in binding.values()):
            try:
                plan = self.plan.at(binding)
            except GEError:  # a size below 0 at these shapes: the kernels say what is wrong
                pass
        layout = Layout(self.program, plan, binding)
        made = (layout, ArenaInterpreter(self.program, layout, self.streams), ContextPool(self.program, layout))
        with self._lock:
            self._cache[key] = made
            if self.shape_slots:
                self._first[key] = (plan, binding)  # the next run keeps the shape steps' values
            while len(self._cache) > self.KEEP:
                self._first.pop(next(iter(self._cache)), None)
                self._cache.pop(next(iter(self._cache)))
        return made

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """One run at its feeds' shapes (the caller sets the thread setting)."""
        binding = self.binding(feeds)
        layout, interp, pool = self.entry(binding)
        key = tuple(sorted(binding.items()))
        first = self._first.pop(key, None) if self._first else None
        ctx = pool.acquire()
        try:
            if first is None:
                return interp.execute(ctx, feeds)
            kept: dict[int, Any] = dict.fromkeys(self.shape_slots)
            outs = interp.execute(ctx, feeds, capture=kept)
        finally:
            pool.release(ctx)
        fixed = {s: a for s, a in kept.items() if isinstance(a, np.ndarray) and a.size <= SHAPE_STEP_ELEMENTS}
        for a in fixed.values():
            a.setflags(write=False)
        plan, _ = first
        layout = Layout(self.program, plan, binding, fixed=fixed)
        made = (layout, ArenaInterpreter(self.program, layout, self.streams), ContextPool(self.program, layout))
        with self._lock:
            if key in self._cache:
                self._cache[key] = made
        return outs

    def arena_bytes(self, binding: dict[str, int]) -> int:
        return self.entry(binding)[0].arena_bytes


#: A shape step's result is kept for a binding when it has at most this many elements.
SHAPE_STEP_ELEMENTS = 1 << 20


def shape_steps(program: Program) -> list[int]:
    """Steps whose results follow from the input shapes alone: ``Shape``/``Size`` of a value whose
    type is known in the input symbols, and deterministic ops without subgraphs whose inputs are
    constants or such results (shape vectors, position ids, causal masks), no graph output."""
    ops = op_registry(program)
    bound = {d for _, i, d in _symbolic_dims(program)}
    known = {s for s, _ in program.const_slots}
    outputs = set(program.output_slots)
    steps = []
    for i, st in enumerate(program.steps):
        node = st.node
        d = ops.lookup(node.domain, node.op_type)
        if d is None or not d.deterministic or node.subgraphs() or any(s in outputs for s in st.outs):
            continue
        if node.op_type in ("Shape", "Size") and not node.domain:
            t = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
            ok = t is not None and t.shape is not None and None not in t.shape and t.symbols <= bound
        else:
            ok = all(s < 0 or s in known for s in st.ins)
        if ok:
            steps.append(i)
            known.update(st.outs)
    return steps


def _symbolic_dims(program: Program) -> list[tuple[str, int, str]]:
    return [(name, i, d) for name, _ in program.input_slots for v in [_input(program.graph, name)]
            for i, d in enumerate(v.type.shape or ()) if isinstance(d, str)]


def _input(graph: Graph, name: str):
    return next(v for v in graph.inputs if v.name == name)


class SymbolicArenaExecutable(CpuExecutable):
    """A model with symbolic dims interpreted inside the arena its symbolic plan gives each run's
    shapes (:class:`ShapedLayouts`): planned once at compile time, evaluated per distinct shape."""

    def __init__(self, graph: Graph, kernels, options, plan: SymbolicPlan, assignment: Any = None,
                 ops: OpRegistry | None = None) -> None:
        program = Program(graph, kernels, options, ops=ops)
        runner = sl = None
        if assignment is not None:  # several streams: each on its thread, as MultiStreamExecutable
            sl = StreamLayout(program, assignment)
            runner = StreamRunner(sl, "ge-stream")
        super().__init__(program, ArenaInterpreter(program, Layout(program, MemoryPlan({}, 0, "none"))), options,
                         plan=plan, streams=sl)
        self.shapes = ShapedLayouts(program, plan, runner)

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        with run_threads(self.threads, self.parallel, self.width):
            return self.shapes.run(feeds)
