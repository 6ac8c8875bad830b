"""Symbolic shapes: a program run inside the arena a :class:`ge_core.memory.SymbolicPlan` gives
each run's shapes (planned once at compile time, evaluated and verified once per arena, at the
largest shapes the arena serves; a run at smaller shapes takes views of it)."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ge_core.errors import GEError
from ge_core.ir import symbolic as sym
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan, SymbolicPlan, dim_ranges
from ge_core.ops import OpRegistry

from .arena import ArenaInterpreter, ContextPool, Layout
from .executable import CpuExecutable, bind_outputs, run_threads
from .program import Program, op_registry
from .streams import StreamLayout, StreamRunner


class ShapedLayouts:
    """A symbolic plan's layouts, for runs at any binding of the input symbols (one run's shapes).

    A new binding runs in a *bucket*: one arena, layout and interpreter planned at a *cap*, a
    binding at least as large (:meth:`cap`), serving every binding up to it. The cap's plan is
    verified once (:meth:`ge_core.memory.SymbolicPlan.at`); a smaller binding keeps its offsets,
    checks that each planned value's bytes at its shapes fit what the cap gave it (so values alive
    at once still do not overlap), and takes views of the arena: a decoder whose past grows by one
    each step pays those views per step, no plan, layout or allocation.

    Caps. A symbol with a declared upper bound (``model.dim_ranges``) is capped at the bound when
    the arena there is at most :data:`RANGE_ARENA_BYTES`; otherwise, and without a bound, at the
    next power of two (at most the bound): a symbol growing one at a time re-plans only
    logarithmically often, and an arena is at most twice its need. The last :data:`BUCKETS`
    buckets are kept; a kept bucket serves any binding below its cap.

    A binding run again within :data:`SEEN` bucket runs (a workload cycling over a few shapes)
    gets its own exact layout (kept for the last :data:`KEEP`), whose *shape steps*
    (:func:`shape_steps`: Shape, and deterministic ops computing small integer tensors from shapes
    and constants only) are computed at its first exact run and are constants after it. A binding
    with a symbol below 1 (a 0-length past) always runs there, unplanned (the symbolic dims'
    simplifications hold for symbols >= 1), made once. A binding met again only later (a
    decoder's lengths, once per generation) runs in its bucket: an exact layout would cost a plan,
    a layout and an arena each step and be evicted before its next use."""

    #: Bindings whose exact layouts (and pooled arenas, and kept shape-step results) are kept.
    KEEP = 8
    #: Buckets (arenas planned at a cap) kept.
    BUCKETS = 4
    #: A declared range is served by one arena at its upper bound when it takes at most this.
    RANGE_ARENA_BYTES = 64 << 20
    #: Runs in buckets remembered: a binding among theirs gets an exact layout.
    SEEN = 8

    def __init__(self, program: Program, plan: SymbolicPlan, streams: Any = None) -> None:
        self.program, self.plan, self.streams = program, plan, streams
        #: (input name, axis, symbol) of every symbolic input dim
        self.dims = _symbolic_dims(program)
        self.ranges = dim_ranges(program.graph)
        self._cache: dict[tuple, tuple[Layout, ArenaInterpreter, ContextPool]] = {}
        self._lock = threading.Lock()
        #: the output slots of the shape steps (kept per binding after its first run)
        self.shape_slots = {s for i in shape_steps(program) for s in program.steps[i].outs}
        self._first: dict[tuple, tuple[MemoryPlan, dict[str, int]]] = {}
        #: the buckets kept (sorted cap items -> bucket), most recently used last
        self.buckets: dict[tuple, _Bucket] = {}
        self._seen: collections.deque[tuple] = collections.deque(maxlen=self.SEEN)
        self._whole: dict[tuple, bool] = {}  # cap at the bounds -> its arena is small enough
        #: layouts made so far (exact ones and buckets'): bounded by the caps a run sequence meets
        self.layouts_made = 0

    def binding(self, feeds: Mapping[str, Any]) -> dict[str, int]:
        return {d: int(np.shape(feeds[name])[i]) for name, i, d in self.dims}

    def entry(self, binding: dict[str, int]) -> tuple[Layout, ArenaInterpreter, ContextPool]:
        """The exact layout of ``binding`` (made and kept on first use)."""
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
        made = self._made(plan, binding)
        with self._lock:
            self._cache[key] = made
            if self.shape_slots:
                self._first[key] = (plan, binding)  # the next run keeps the shape steps' values
            while len(self._cache) > self.KEEP:
                self._first.pop(next(iter(self._cache)), None)
                self._cache.pop(next(iter(self._cache)))
        return made

    def _made(self, plan: MemoryPlan, binding: dict[str, int], fixed: Any = None
              ) -> tuple[Layout, ArenaInterpreter, ContextPool]:
        layout = Layout(self.program, plan, binding, fixed=fixed)
        with self._lock:
            self.layouts_made += 1
        return layout, ArenaInterpreter(self.program, layout, self.streams), ContextPool(self.program, layout)

    def cap(self, binding: dict[str, int]) -> dict[str, int]:
        """The binding whose arena serves ``binding``'s run (see the class docstring)."""
        geo: dict[str, int] = {}
        whole: dict[str, int] = {}
        for k, v in binding.items():
            hi = self.ranges.get(k, (0, None))[1]
            p = 1 << max(v - 1, 0).bit_length()
            geo[k] = p if hi is None else max(min(p, hi), v)
            whole[k] = p if hi is None else max(hi, v)
        if whole == geo:
            return geo
        key = tuple(sorted(whole.items()))
        ok = self._whole.get(key)
        if ok is None:
            try:
                ok = self.plan.at(whole).arena_bytes <= self.RANGE_ARENA_BYTES
            except GEError:
                ok = False
            with self._lock:
                self._whole[key] = ok
        return whole if ok else geo

    def bucket(self, binding: dict[str, int]) -> _Bucket | None:
        """The bucket serving ``binding``: its cap's, else the smallest kept one whose cap is at
        least ``binding`` (a new prompt after a long one plans nothing), else made now; None when
        the plan at its cap cannot be made."""
        cap = self.cap(binding)
        key = tuple(sorted(cap.items()))
        with self._lock:
            if key not in self.buckets:
                fits = [k for k in self.buckets if all(binding[s] <= c for s, c in k)]
                key = min(fits, key=lambda k: sum(c for _, c in k)) if fits else key
            b = self.buckets.pop(key, None)
            if b is not None:
                self.buckets[key] = b
                return b
        try:
            plan = self.plan.at(cap)
        except GEError:
            return None
        layout, interp, pool = self._made(plan, cap)
        b = _Bucket(self.program, layout, interp, pool)
        with self._lock:
            self.buckets[key] = b
            while len(self.buckets) > self.BUCKETS:
                self.buckets.pop(next(iter(self.buckets)))
        return b

    def run(self, feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None = None) -> list[Any]:
        """One run at its feeds' shapes (the caller sets the thread setting); ``outputs``: the
        caller's arrays by output name (:func:`ge_cpu.executable.bind_outputs`)."""
        binding = self.binding(feeds)
        bound = bind_outputs(self.program, outputs, binding) if outputs else None
        key = tuple(sorted(binding.items()))
        with self._lock:
            fresh = key not in self._cache and key not in self._seen and min(binding.values(), default=1) >= 1
            if fresh:
                self._seen.append(key)
        if fresh:
            b = self.bucket(binding)
            views = b.views(binding) if b is not None else None
            if b is not None and views is not None:
                return b.run(feeds, views, bound)
        layout, interp, pool = self.entry(binding)
        first = self._first.pop(key, None) if self._first else None
        ctx = pool.acquire()
        try:
            if first is None:
                return interp.execute(ctx, feeds, outputs=bound)
            kept: dict[int, Any] = dict.fromkeys(self.shape_slots)
            outs = interp.execute(ctx, feeds, capture=kept, outputs=bound)
        finally:
            pool.release(ctx)
        fixed = {s: a for s, a in kept.items() if isinstance(a, np.ndarray) and a.size <= SHAPE_STEP_ELEMENTS}
        for a in fixed.values():
            a.setflags(write=False)
        plan, _ = first
        made = self._made(plan, binding, fixed)
        with self._lock:
            if key in self._cache:
                self._cache[key] = made
        return outs

    def arena_bytes(self, binding: dict[str, int]) -> int:
        return self.entry(binding)[0].arena_bytes


class _Bucket:
    """One arena, layout and interpreter planned at a cap, serving every binding up to it: per
    binding, the views of the planned values whose shapes depend on the symbols."""

    def __init__(self, program: Program, layout: Layout, interp: ArenaInterpreter, pool: ContextPool) -> None:
        self.layout, self.interp, self.pool = layout, interp, pool
        types = {s: v.type for st in program.steps for v, s in zip(st.node.outputs, st.outs)}
        exprs: dict[Any, int] = {}  # each distinct symbolic dim, evaluated once per binding
        #: (slot, offset, dtype, dims: an int, or -1 - k for expression k, nbytes at the cap)
        self.symbolic: list[tuple[int, int, np.dtype, tuple[int, ...], int]] = []
        for s, off, n, dtype, _ in layout.planned:
            t = types.get(s)
            if t is None or t.shape is None or t.is_static:
                continue
            dims = tuple(d if isinstance(d, int) else -1 - exprs.setdefault(d, len(exprs)) for d in t.shape)
            self.symbolic.append((s, off, dtype, dims, n))
        self.exprs = list(exprs)
        self._last: tuple[tuple, list] | None = None  # the expressions' values last seen, and their views

    def views(self, binding: dict[str, int]) -> tuple[tuple, list[tuple[int, int, np.dtype, tuple[int, ...]]]] | None:
        """The values of the symbolic dims at ``binding`` (the views' key), and (slot, offset,
        dtype, shape) of each symbolic planned value there; None when one of them does not fit
        the bytes the cap gave it. Bindings whose dims evaluate alike (a decoder's steps, where
        only the attention mask's length grows and the cache is the shared buffer's) share one."""
        try:
            vals = tuple(sym.evaluate(e, binding) for e in self.exprs)
        except (KeyError, TypeError):
            return None
        last = self._last
        if last is not None and last[0] == vals:
            return last
        out = []
        for s, off, dtype, dims, cap in self.symbolic:
            shape = tuple(d if d >= 0 else vals[-1 - d] for d in dims)
            if min(shape, default=0) < 0 or math.prod(shape) * dtype.itemsize > cap:
                return None
            out.append((s, off, dtype, shape))
        self._last = (vals, out)
        return self._last

    def run(self, feeds: Mapping[str, Any], views: tuple[tuple, list], outputs: Any) -> list[Any]:
        key, views_ = views
        ctx = self.pool.acquire()
        try:
            if ctx.bound is None:  # the context's template at the cap, and the binding of its views
                ctx.bound = [ctx.template, None]
            if ctx.bound[1] != key:
                t = list(ctx.bound[0])
                arena = ctx.arena
                for s, off, dtype, shape in views_:
                    t[s] = np.ndarray(shape, dtype, arena, off)
                ctx.template, ctx.bound[1] = t, key
            return self.interp.execute(ctx, feeds, outputs=outputs)
        finally:
            self.pool.release(ctx)


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

    def run(self, feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None = None) -> list[Any]:
        with run_threads(self.threads, self.parallel, self.width):
            return self.shapes.run(feeds, outputs)
