"""The arena executor: every planned tensor lives at its offset in one preallocated arena.

The compile's memory plan (:class:`ge_core.memory.MemoryPlan`) gives each intermediate value an
offset. An execution context owns one arena (one ``np.empty``, page-aligned) and a view of it
per planned value; contexts are pooled, so concurrent runs from several threads each hold their
own arena and a sequence of runs allocates nothing for its intermediates.

Each step runs one of three ways, chosen at build time:

* *no-op*: a view op (Reshape, Flatten, Squeeze, Unsqueeze, Identity) whose output shares its
  input's bytes, or a Concat whose inputs the plan laid out back to back inside its output:
  the planned view already holds the result;
* *into the plan*: the kernel declares ``accepts_out`` and gets ``out=`` views of the arena
  (an output over a dying input also needs ``inplace_ok``);
* *copy*: the kernel returns arrays, which are copied into their planned views (``np.copyto``)
  unless they already are those views.

Values without a planned offset (graph outputs, values of dynamic shape or object dtype) keep the
kernel's array; one that is a view of the arena is copied at once, so graph outputs are always
arrays of their own, never views of an arena a later run reuses.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.ir.graph import Graph
from ge_core.kernel import accepts_out
from ge_core.memory import VIEW_OPS, MemoryPlan, value_size

from .executor import BLAS, SequentialExecutable, call_step

#: Arena base alignment (covers every buffer alignment a plan may use up to a page).
ARENA_BASE_ALIGNMENT = 4096

_NOOP, _OUT, _CALL = 0, 1, 2


class _Ctx:
    """One execution context: an arena and the per-slot template of a run's values."""

    __slots__ = ("arena", "template")

    def __init__(self, nbytes: int, n_slots: int, consts, planned) -> None:
        try:
            raw = np.empty(nbytes + ARENA_BASE_ALIGNMENT, dtype=np.uint8)
        except (MemoryError, ValueError) as e:
            raise ExecutionError(
                f"the model's memory arena needs {nbytes} bytes, which cannot be allocated here ({type(e).__name__})",
                hint="run on a machine with more memory, or compile with a smaller input_shape",
            ) from None
        pad = (-raw.ctypes.data) % ARENA_BASE_ALIGNMENT
        self.arena = raw[pad:pad + nbytes]
        t: list[Any] = [None] * n_slots
        for s, a in consts:
            t[s] = a
        for s, off, n, dtype, shape in planned:
            t[s] = self.arena[off:off + n].view(dtype).reshape(shape)
        self.template = t


class ArenaExecutable(SequentialExecutable):
    """Runs the schedule with every planned value in its place in a per-context arena."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan) -> None:
        super().__init__(graph, kernels, options)
        self.plan = plan
        self.arena_bytes = int(plan.arena_bytes)
        slot: dict[Any, int] = {}
        for st in self.steps:
            for v, s in zip(st.node.inputs, st.ins):
                if v is not None and s >= 0:
                    slot[v] = s
            for v, s in zip(st.node.outputs, st.outs):
                slot[v] = s
        outputs = set(graph.outputs)
        where: dict[int, tuple[int, int]] = {}  # slot -> (offset, nbytes)
        planned = []
        for v, s in slot.items():
            if v in outputs or v.producer is None or v.name not in plan.offsets:
                continue
            n = value_size(v)
            off = plan.offsets[v.name]
            if n is None or not isinstance(off, int) or off < 0 or off + n > self.arena_bytes or off % v.type.dtype.itemsize:
                continue  # not placeable (or a hostile plan): the value keeps its own array
            where[s] = (off, n)
            planned.append((s, off, n, v.type.dtype, tuple(v.type.shape)))
        self._planned = planned
        self._where = where
        self._modes: list[int] = []
        #: per step, the slots whose planned views must hold the inputs for a no-op to be valid
        self._noop_reads: list[tuple[int, ...]] = []
        launches = 0
        for st in self.steps:
            mode = self._mode(st, where)
            self._modes.append(mode)
            reads = st.ins[:1] if st.node.op_type in VIEW_OPS else st.ins
            self._noop_reads.append(tuple(i for i in reads if i >= 0))
            launches += mode != _NOOP
        self.kernel_count = launches
        self.noop_steps = len(self.steps) - launches
        self._out_types = [[(v.type.dtype, tuple(v.type.shape)) if value_size(v) is not None else None for v in st.node.outputs]
                           for st in self.steps]
        self._pool: list[_Ctx] = []
        self._pool_lock = threading.Lock()
        self._pool_max = max(2, os.cpu_count() or 2)

    # -- build ---------------------------------------------------------------------------------
    def _mode(self, st, where) -> int:
        node = st.node
        outs = [where.get(s) for s in st.outs]
        plain = node.domain in ("", "ai.onnx")
        if plain and node.op_type in VIEW_OPS and outs and outs[0] is not None and len(st.outs) == 1:
            src = where.get(st.ins[0]) if st.ins else None
            if src is not None and src == outs[0]:
                return _NOOP
        if plain and node.op_type == "Concat" and len(st.outs) == 1 and outs[0] is not None:
            off, _ = outs[0]
            ok = True
            for s in st.ins:
                w = where.get(s)
                if w is None or w[0] != off:
                    ok = False
                    break
                off += w[1]
            if ok and off == outs[0][0] + outs[0][1]:
                return _NOOP
        if accepts_out(st.fn) and all(o is not None for o in outs):
            overlap = any(
                w is not None and o[0] < w[0] + w[1] and w[0] < o[0] + o[1]
                for o in outs if o is not None for w in (where.get(s) for s in st.ins if s >= 0)
            )
            if not overlap or getattr(st.fn, "inplace_ok", False):
                return _OUT
        return _CALL

    # -- contexts ------------------------------------------------------------------------------
    def _acquire(self) -> _Ctx:
        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        return _Ctx(self.arena_bytes, self.n_slots, self.const_slots, self._planned)

    def _release(self, ctx: _Ctx) -> None:
        with self._pool_lock:
            if len(self._pool) < self._pool_max:
                self._pool.append(ctx)

    # -- run -----------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        ctx = self._acquire()
        try:
            with BLAS.run(self.threads):
                return self._execute(ctx, feeds)
        finally:
            self._release(ctx)

    def _execute(self, ctx: _Ctx, feeds: Mapping[str, Any]) -> list[Any]:
        env = self._start(ctx, feeds)
        for i in range(len(self.steps)):
            self._step(i, env, ctx, free=True)
        return [_as_output(env[s], ctx.arena) for s in self.output_slots]

    def _start(self, ctx: _Ctx, feeds: Mapping[str, Any]) -> list[Any]:
        env = list(ctx.template)
        for name, s in self.input_slots:
            env[s] = feeds[name]
        return env

    def _step(self, i: int, env: list[Any], ctx: _Ctx, free: bool) -> None:
        """Run step ``i`` on ``env`` (the run's values) inside the context's arena."""
        st = self.steps[i]
        mode = self._modes[i]
        template = ctx.template
        if mode == _NOOP and all(env[j] is template[j] for j in self._noop_reads[i]):
            return
        args = [env[j] if j >= 0 else None for j in st.ins]
        res = call_step(st, args, tuple(env[s] for s in st.outs) if mode == _OUT else None)
        for s, r, t in zip(st.outs, res, self._out_types[i]):
            view = template[s]
            if view is not None and t is not None:
                if r is view:
                    env[s] = view
                    continue
                if isinstance(r, np.ndarray) and r.dtype == t[0] and r.shape == t[1]:
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


def _as_output(v: Any, arena: np.ndarray) -> Any:
    if v is None or isinstance(v, list):
        return v
    a = np.asarray(v)
    return a.copy() if np.may_share_memory(a, arena) else a


def _fmt(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, list):
        return f"seq[{len(v)}]"
    return f"{getattr(v, 'dtype', '?')}{list(getattr(v, 'shape', ()))}"
