"""The arena: a program's planned values at their offsets in one preallocated buffer.

The compile's memory plan (:class:`ge_core.memory.MemoryPlan`) gives each intermediate value an
offset. A :class:`Layout` is what a program makes of a plan (data, computed once at build time):
which slots have a planned view, and how each step runs there. A :class:`Context` owns one arena
(one ``np.empty``, page-aligned) and a view of it per planned value; a :class:`ContextPool` pools
them, so concurrent runs from several threads each hold their own arena and a sequence of runs
allocates nothing for its intermediates.

Each step runs one of three ways (its *mode*), chosen at build time:

* :data:`NOOP`: a view op (Reshape, Flatten, Squeeze, Unsqueeze, Identity) whose output shares
  its input's bytes, or a Concat whose inputs the plan laid out back to back inside its output:
  the planned view already holds the result;
* :data:`OUT` (into the plan): the kernel's capabilities (:func:`ge_core.kernel.caps`) declare
  ``accepts_out`` and it gets ``out=`` views of the arena (an output over a dying input also
  needs ``inplace_ok``);
* :data:`CALL` (copy): the kernel returns arrays, which are copied into their planned views
  (``np.copyto``) unless they already are those views.

Values without a planned offset (graph outputs, values of dynamic shape or object dtype) keep the
kernel's array; one that is a view of the arena is copied at once, so graph outputs are always
arrays of their own, never views of an arena a later run reuses.

Two strategies run a program inside a layout: :class:`ArenaInterpreter` here (steps interpreted,
on one stream or, with a :class:`ge_cpu.streams.StreamRunner`, on several) and the code
generator of :mod:`ge_cpu.sink`. :class:`ArenaExecutable` is the interpreter on one stream.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.ir.graph import Graph, Node
from ge_core.kernel import accepts_out, caps
from ge_core.memory import MemoryPlan
from ge_core.ops import OpRegistry

from .executable import CpuExecutable, fill_outputs
from .program import Program, Step, call_step, op_registry
from .values import as_output

#: Arena base alignment (covers every buffer alignment a plan may use up to a page).
ARENA_BASE_ALIGNMENT = 4096

#: Step modes (see the module docstring).
NOOP, OUT, CALL = 0, 1, 2


class Layout:
    """Where a program's values live in one arena (planned views), and each step's mode.

    ``binding`` (symbol -> int) gives the sizes of a symbolic program's values at one run's shapes
    (:class:`ge_cpu.shaped.ShapedLayouts`); a value whose type it cannot evaluate keeps its own
    array. ``fixed`` (slot -> array) are values known for every run of the layout (a symbolic
    program's shape computations at one binding): their steps are no-ops, the arrays constants."""

    def __init__(self, program: Program, plan: MemoryPlan, binding: Mapping[str, int] | None = None,
                 fixed: Mapping[int, Any] | None = None) -> None:
        self.arena_bytes = int(plan.arena_bytes)
        #: (slot, array) of every value fixed for the layout's runs
        self.fixed = list((fixed or {}).items())

        def typed(v) -> Any:
            if binding is None or v.type.shape is None or v.type.is_static:
                return v.type
            try:
                return v.type.bind(binding)
            except (KeyError, TypeError):
                return None

        def size(v) -> int | None:
            t = typed(v)
            if t is None or t.dtype is None or t.dtype.kind in "OUSV":
                return None
            return t.nbytes

        slot: dict[Any, int] = {}
        for st in program.steps:
            for v, s in zip(st.node.inputs, st.ins):
                if v is not None and s >= 0:
                    slot[v] = s
            for v, s in zip(st.node.outputs, st.outs):
                slot[v] = s
        outputs = set(program.graph.outputs)
        where: dict[int, tuple[int, int]] = {}  # slot -> (offset, nbytes)
        planned = []
        for v, s in slot.items():
            if v in outputs or v.producer is None or v.name not in plan.offsets or (fixed and s in fixed):
                continue
            n = size(v)
            off = plan.offsets[v.name]
            if n is None or not isinstance(off, int) or off < 0 or off + n > self.arena_bytes or off % v.type.dtype.itemsize:
                continue  # not placeable (or a hostile plan): the value keeps its own array
            where[s] = (off, n)
            planned.append((s, off, n, v.type.dtype, tuple(typed(v).shape)))
        #: (slot, offset, nbytes, dtype, shape) of every planned value
        self.planned = planned
        #: slot -> (offset, nbytes) of every planned value
        self.where = where
        #: per step, its mode (NOOP, OUT or CALL)
        self.modes: list[int] = []
        #: per step, the slots whose planned views must hold the inputs for a no-op to be valid
        self.noop_reads: list[tuple[int, ...]] = []
        ops = op_registry(program)
        for st in program.steps:
            if fixed and st.outs and all(o in fixed for o in st.outs):
                self.modes.append(NOOP)  # its results are the layout's constants
                self.noop_reads.append(())
                continue
            kind = op_alias(st.node, ops)
            self.modes.append(step_mode(st, where, kind))
            reads = st.ins[:1] if kind == "view" else st.ins
            self.noop_reads.append(tuple(i for i in reads if i >= 0))
        #: kernel launches one run makes (steps that are not no-ops), and the no-ops
        self.kernel_count = sum(m != NOOP for m in self.modes)
        self.noop_steps = len(program.steps) - self.kernel_count
        #: per step, per output: (dtype, shape) when the value has a static size, else None
        self.out_types = [[(v.type.dtype, tuple(typed(v).shape)) if size(v) is not None else None
                           for v in st.node.outputs] for st in program.steps]


def op_alias(node: Node, ops: OpRegistry) -> str:
    """The op set's aliasing fact of ``node`` (``OpDef.aliasing``: "view", "inplace", "concat" or
    ""), the same fact the memory problem shared the node's bytes by; ``ops``: the op registry."""
    d = ops.lookup(node.domain, node.op_type)
    return d.aliasing if d is not None else ""


def step_mode(st: Step, where: Mapping[int, tuple[int, int]], alias: str = "") -> int:
    """How step ``st`` runs with the planned values ``where`` (slot -> (offset, nbytes)); ``alias``
    is its node's aliasing fact (:func:`op_alias`)."""
    outs = [where.get(s) for s in st.outs]
    if alias == "view" and outs and outs[0] is not None and len(st.outs) == 1:
        src = where.get(st.ins[0]) if st.ins else None
        if src is not None and src == outs[0]:
            return NOOP
    if alias == "concat" and len(st.outs) == 1 and outs[0] is not None:
        off, _ = outs[0]
        ok = True
        for s in st.ins:
            w = where.get(s)
            if w is None or w[0] != off:
                ok = False
                break
            off += w[1]
        if ok and off == outs[0][0] + outs[0][1]:
            return NOOP
    if accepts_out(st.fn) and all(o is not None for o in outs):
        overlap = any(
            w is not None and o[0] < w[0] + w[1] and w[0] < o[0] + o[1]
            for o in outs if o is not None for w in (where.get(s) for s in st.ins if s >= 0)
        )
        if not overlap or caps(st.fn).inplace_ok:
            return OUT
    return CALL


class Context:
    """One execution context: an arena, the per-slot template of a run's values (constants and
    planned views), and what a strategy bound to this arena (the sink's generated functions)."""

    __slots__ = ("arena", "template", "bound")

    def __init__(self, program: Program, layout: Layout) -> None:
        nbytes = layout.arena_bytes
        try:
            raw = np.empty(nbytes + ARENA_BASE_ALIGNMENT, dtype=np.uint8)
        except (MemoryError, ValueError) as e:
            raise ExecutionError(
                f"the model's memory arena needs {nbytes} bytes, which cannot be allocated here ({type(e).__name__})",
                hint="run on a machine with more memory, or compile with a smaller input_shape",
            ) from None
        pad = (-raw.ctypes.data) % ARENA_BASE_ALIGNMENT
        self.arena = raw[pad:pad + nbytes]
        t: list[Any] = [None] * program.n_slots
        for s, a in program.const_slots:
            t[s] = a
        for s, off, n, dtype, shape in layout.planned:
            t[s] = self.arena[off:off + n].view(dtype).reshape(shape)
        for s, a in layout.fixed:
            t[s] = a
        self.template = t
        self.bound: Any = None

    def start(self, program: Program, feeds: Mapping[str, Any]) -> list[Any]:
        """A run's values before its first step: the template with the feeds in their slots."""
        env = list(self.template)
        for name, s in program.input_slots:
            env[s] = feeds[name]
        return env


class ContextPool:
    """Contexts kept between runs: a run takes one (or makes one) and gives it back."""

    def __init__(self, program: Program, layout: Layout) -> None:
        self.program, self.layout = program, layout
        self._free: list[Context] = []
        self._lock = threading.Lock()
        self._max = max(2, os.cpu_count() or 2)
        self._interp: ArenaInterpreter | None = None

    def interpreter(self) -> ArenaInterpreter:
        """The layout's interpreter on one stream (made once): it runs a sink executable's runs
        that bind outputs (:meth:`ge_cpu.executable.CpuExecutable.binding_strategy`)."""
        if self._interp is None:
            self._interp = ArenaInterpreter(self.program, self.layout)
        return self._interp

    def acquire(self) -> Context:
        with self._lock:
            if self._free:
                return self._free.pop()
        return Context(self.program, self.layout)

    def release(self, ctx: Context) -> None:
        with self._lock:
            if len(self._free) < self._max:
                self._free.append(ctx)

    def __iter__(self) -> Iterator[Context]:
        """The contexts waiting for a run now."""
        with self._lock:
            return iter(list(self._free))

    def __len__(self) -> int:
        return len(self._free)


class Streams(Protocol):
    """What the interpreter needs of a stream runner (:class:`ge_cpu.streams.StreamRunner`): its
    layout (``steps`` per stream, ``waits`` per step, the steps that record an event) and
    ``run(body)``, which calls ``body(k, wait, signal)`` once per stream ``k``, each on its thread."""

    @property
    def layout(self) -> Any: ...

    def run(self, body: Any, explain: Any = None) -> None: ...


class ArenaInterpreter:
    """Interprets a program's steps inside a layout's arena: on the calling thread, or with
    ``streams`` each stream of the schedule on its own thread.

    On several streams values are never freed early (a value's last reader in schedule order may
    run before an earlier reader on another stream); the arena holds planned values anyway."""

    #: runs take ``outputs=`` (caller arrays by output slot, :func:`ge_cpu.executable.bind_outputs`)
    binds_outputs = True

    def __init__(self, program: Program, layout: Layout, streams: Streams | None = None) -> None:
        self.program, self.layout, self.streams = program, layout, streams
        #: slot -> the step computing it, and slot -> the steps reading it (IO binding)
        self.producer = {s: i for i, st in enumerate(program.steps) for s in st.outs}
        self.readers: dict[int, set[int]] = {}
        for i, st in enumerate(program.steps):
            for s in st.ins:
                self.readers.setdefault(s, set()).add(i)

    def execute(self, ctx: Context, feeds: Mapping[str, Any], capture: dict[int, Any] | None = None,
                outputs: Mapping[int, np.ndarray] | None = None) -> list[Any]:
        """The run's outputs; ``capture`` (slot -> None) gets the value of each of its slots;
        ``outputs`` (output slot -> caller array) are written in place where the kernels can (see
        :meth:`bind`), else filled after the run (:func:`ge_cpu.executable.fill_outputs`)."""
        if not outputs:
            return self._execute(ctx, feeds, capture, None)
        base = ctx.template
        try:
            modes = self.bind(ctx, feeds, outputs)
            return fill_outputs(self.program, outputs, self._execute(ctx, feeds, capture, modes))
        finally:
            ctx.template = base

    def bind(self, ctx: Context, feeds: Mapping[str, Any], outputs: Mapping[int, np.ndarray]) -> list[int] | None:
        """Put the caller's output arrays in this run's template (``ctx.template``, a copy) as the
        views their steps write, and return the run's step modes (None: the layout's).

        A step whose outputs all have a place (planned or bound) and whose kernel accepts ``out=``
        writes into them directly. An array sharing memory with a feed is written by the step only
        when it is the feed's only reader (an earlier reader may have left a view of the feed that
        a later step reads), and given as ``out=`` only to a kernel that declares ``inplace_ok``
        when the array IS the feed (same address, shape and strides: onnxruntime-genai's
        ``past_present_share_buffer``); otherwise the step writes apart and the array is filled
        after the run."""
        p, where = self.program, self.layout.where
        t = ctx.template = list(ctx.template)
        fed = [(s, x, _span(x)) for n, s in p.input_slots for x in [feeds.get(n)] if isinstance(x, np.ndarray)]
        modes: list[int] | None = None
        shared: dict[int, list[tuple[int, np.ndarray]]] = {}
        for s, a in outputs.items():
            i = self.producer.get(s)
            if i is None:
                continue
            sa = _span(a)
            over = [(f, x) for f, x, sx in fed
                    if (sa[0] < sx[1] and sx[0] < sa[1] if sa is not None and sx is not None else np.may_share_memory(a, x))]
            if any(self.readers.get(f, {i}) != {i} for f, _ in over):
                continue  # another step reads that feed: filled after the run
            t[s] = a
            shared.setdefault(i, []).extend(over)
        for i, over in shared.items():
            st = p.steps[i]
            if self.layout.modes[i] != CALL or not accepts_out(st.fn) or any(t[o] is None for o in st.outs):
                continue
            inplace = caps(st.fn).inplace_ok
            if any(f in self.readers and not (inplace and _same(t[o], x))
                   for f, x in over for o in st.outs if t[o] is not None and np.may_share_memory(t[o], x)):
                continue
            spans = [where[o] for o in st.outs if o in where]
            if not inplace and any(w is not None and a[0] < w[0] + w[1] and w[0] < a[0] + a[1]
                                   for a in spans for w in (where.get(j) for j in st.ins if j >= 0)):
                continue
            modes = list(self.layout.modes) if modes is None else modes
            modes[i] = OUT
        return modes

    def _execute(self, ctx: Context, feeds: Mapping[str, Any], capture: dict[int, Any] | None,
                 modes: list[int] | None) -> list[Any]:
        p = self.program
        env = ctx.start(p, feeds)
        streams = self.streams
        if capture is not None:  # one stream, in order, keeping the values asked for
            for i, st in enumerate(p.steps):
                self.step(i, env, ctx, False, modes)
                for s in st.outs:
                    if s in capture:  # a copy now: an arena view's bytes are reused later in the run
                        capture[s] = np.array(env[s]) if isinstance(env[s], np.ndarray) else env[s]
        elif streams is None:
            self._run_in_order(env, ctx, modes)
        else:
            groups, waits, records = streams.layout.steps, streams.layout.waits, streams.layout.records

            def run_stream(k: int, wait, signal) -> None:
                for i in groups[k]:
                    for src in waits.get(i, ()):
                        wait(src)
                    self.step(i, env, ctx, False, modes)
                    if i in records:
                        signal(i)

            streams.run(run_stream)
        return [as_output(env[s], ctx.arena) for s in p.output_slots]

    def _run_in_order(self, env: list[Any], ctx: Context, modes: list[int] | None) -> None:
        """Every step in order on the calling thread, each dead value released at once: what
        :meth:`step` does, in one loop (a decoder's step runs ~80 nodes, each a call less)."""
        template, arena, reads = ctx.template, ctx.arena, self.layout.noop_reads
        for st, mode, need in zip(self.program.steps, modes or self.layout.modes, reads):
            if mode == NOOP and all(env[j] is template[j] for j in need):
                continue
            res = call_step(st, [env[j] if j >= 0 else None for j in st.ins],
                            tuple(env[s] for s in st.outs) if mode == OUT else None)
            for s, r in zip(st.outs, res):
                view = template[s]
                if view is not None:
                    if r is view:
                        env[s] = view
                        continue
                    if isinstance(r, np.ndarray) and r.dtype == view.dtype and r.shape == view.shape:
                        np.copyto(view, r)
                        env[s] = view
                        continue
                if isinstance(r, np.ndarray) and np.may_share_memory(r, arena):
                    r = r.copy()
                env[s] = r
            for s in st.free:
                env[s] = None

    def step(self, i: int, env: list[Any], ctx: Context, free: bool, modes: list[int] | None = None) -> None:
        """Run step ``i`` on ``env`` (the run's values) inside the context's arena; ``modes``: the
        run's step modes (None: the layout's)."""
        st = self.program.steps[i]
        mode = (modes or self.layout.modes)[i]
        template = ctx.template
        if mode == NOOP and all(env[j] is template[j] for j in self.layout.noop_reads[i]):
            return
        args = [env[j] if j >= 0 else None for j in st.ins]
        res = call_step(st, args, tuple(env[s] for s in st.outs) if mode == OUT else None)
        for s, r in zip(st.outs, res):
            view = template[s]  # a planned view (of this run's shapes) or a caller's output array
            if view is not None:
                if r is view:
                    env[s] = view
                    continue
                if isinstance(r, np.ndarray) and r.dtype == view.dtype and r.shape == view.shape:
                    np.copyto(view, r)
                    env[s] = view
                    continue
            # unplanned, or not what the plan expected: the value keeps an array of its own
            if isinstance(r, np.ndarray) and np.may_share_memory(r, ctx.arena):
                r = r.copy()
            env[s] = r
        if free:
            for s in st.free:
                env[s] = None


def _span(a: np.ndarray) -> tuple[int, int] | None:
    """The byte span of a C-contiguous array (None for another layout: ``np.may_share_memory``
    decides); the bounds ``np.may_share_memory`` compares, read without its call per pair."""
    if not a.flags.c_contiguous:
        return None
    if a.nbytes == 0:
        return 0, 0  # (no bytes: it overlaps nothing, as np.may_share_memory says)
    lo = a.__array_interface__["data"][0]
    return lo, lo + a.nbytes


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` are the same memory seen the same way (address, dtype, shape, strides)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.dtype == b.dtype
            and a.shape == b.shape and a.strides == b.strides)


class ArenaExecutable(CpuExecutable):
    """The schedule interpreted on the calling thread, every planned value in its place in a
    per-context arena (option ``executor=arena``)."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan, ops: OpRegistry | None = None) -> None:
        program = Program(graph, kernels, options, ops=ops)
        layout = Layout(program, plan)
        super().__init__(program, ArenaInterpreter(program, layout), options, layout=layout,
                         contexts=ContextPool(program, layout), plan=plan)
