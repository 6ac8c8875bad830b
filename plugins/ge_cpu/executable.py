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
symbolic dims (any ``executor``)  + :class:`~ge_cpu.shaped.ShapedLayouts` (a Layout per cap of the run shapes) + ArenaInterpreter
================================  ==========================================================

A run takes an arena context from the pool (when the executor has a layout), and runs the
strategy at its thread setting (:func:`run_threads`): with ``parallel=engine`` (the default)
BLAS executes at one thread and the kernels split their work over GE's pool
(:mod:`ge_native.parallel`) at ``threads`` wide; with ``parallel=blas`` BLAS's own threads are the
parallelism, at ``threads`` (:class:`ge_cpu.blas.BlasThreads`).

IO binding (``model.run(feeds, outputs={name: array})``): :func:`bind_outputs` checks the
caller's arrays; the arena interpreter writes them in place (the sink's runs with ``outputs``
are interpreted in its layout for that), the plain interpreter fills them after the run
(:func:`fill_outputs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from ge_core.backend import Executable
from ge_core.errors import InputError
from ge_core.ir.symbolic import evaluate
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

    #: runs take ``outputs=`` (IO binding: :func:`bind_outputs`)
    takes_outputs = True

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

    def run(self, feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None = None) -> list[Any]:
        """The outputs of one run; ``outputs`` (output name -> caller array, IO binding) are
        filled and returned in their places (:func:`bind_outputs`)."""
        bound = bind_outputs(self.program, outputs) if outputs else None
        pool = self._pool
        if pool is None:
            with run_threads(self.threads, self.parallel, self.width):
                outs = self.strategy.execute(None, feeds)
            return outs if bound is None else fill_outputs(self.program, bound, outs)
        ctx = pool.acquire()
        binder = None if bound is None else self.binding_strategy()
        try:
            with run_threads(self.threads, self.parallel, self.width):
                if binder is not None:
                    return binder.execute(ctx, feeds, outputs=bound)
                outs = self.strategy.execute(ctx, feeds)
        finally:
            pool.release(ctx)
        return outs if bound is None else fill_outputs(self.program, bound, outs)

    def binding_strategy(self) -> Any:
        """The strategy of runs with IO binding (None: fill the arrays after the run): this one
        when it binds outputs, else the interpreter of the contexts' layout (the sink's generated
        code does not bind: its runs with ``outputs=`` are interpreted, in schedule order)."""
        if getattr(self.strategy, "binds_outputs", False):
            return self.strategy
        make = getattr(self._pool, "interpreter", None)
        return make() if make is not None else None


def bind_outputs(program: Program, outputs: Any, binding: Mapping[str, int] | None = None) -> dict[int, np.ndarray]:
    """IO binding (``model.run(feeds, outputs={name: array})``, as onnxruntime's ``IOBinding``):
    the caller's arrays by output slot, each checked to be a writeable C-contiguous ndarray of the
    output's exact dtype and, where the output's type gives it (at ``binding``, the run's input
    symbols, each at least 1), its exact shape; an :class:`InputError` naming the output otherwise."""
    if not isinstance(outputs, Mapping):
        raise InputError(f"run(outputs=...) takes a dict of output name -> array, not {type(outputs).__name__}",
                         hint="e.g. outputs={'present.0.key': np.empty(shape, np.float32)}")
    slots = program.output_index
    bound: dict[int, np.ndarray] = {}
    spans: list[tuple[int, int]] = []  # the byte spans of the arrays taken (each C-contiguous)
    memo: dict[Any, int] = {}  # each symbolic dim's value at ``binding`` (a decoder's caches share theirs)
    for name, a in outputs.items():
        if name not in slots:
            raise InputError(f"run(outputs=...): {name!r:.80} is no output of the model",
                             hint=f"the model's outputs are {', '.join(repr(n) for n in list(slots)[:10])}")
        s, t = slots[name]
        if type(a) is not np.ndarray or not a.flags.c_contiguous or not a.flags.writeable:
            raise InputError(f"run(outputs=...): output '{name}' must be given a writeable C-contiguous numpy "
                             f"array, not {_what(a)}", hint="allocate it with np.empty(shape, dtype)")
        want = _shape_at(t, binding, memo)
        if (t.dtype is not None and a.dtype != t.dtype) or (want is not None and a.shape != want):
            raise InputError(f"run(outputs=...): output '{name}' is {t.dtype}{list(want or t.shape or [])} at these "
                             f"inputs, the array given is {a.dtype}{list(a.shape)}",
                             hint="give an array of exactly the output's dtype and shape")
        lo = a.__array_interface__["data"][0] if a.nbytes else 0
        hi = lo + a.nbytes
        if any(lo < e and b < hi for b, e in spans):
            raise InputError(f"run(outputs=...): the array of output '{name}' shares memory with another output's",
                             hint="give each output its own array")
        spans.append((lo, hi))
        bound[s] = a
    return bound


def fill_outputs(program: Program, bound: Mapping[int, np.ndarray], outs: list[Any]) -> list[Any]:
    """``outs`` (a run's outputs) with each bound output's array in its place, filled with the
    run's value where the run did not write it there (InputError if dtype or shape differ)."""
    outs = list(outs)
    for k, s in enumerate(program.output_slots):
        a = bound.get(s)
        if a is None or outs[k] is a:
            continue
        r = outs[k]
        if not isinstance(r, np.ndarray) or r.dtype != a.dtype or r.shape != a.shape:
            raise InputError(f"run(outputs=...): output '{program.graph.outputs[k].name}' is {_what(r)} at these inputs, "
                             f"the array given is {a.dtype}{list(a.shape)}",
                             hint="give an array of exactly the output's dtype and shape")
        np.copyto(a, r)
        outs[k] = a
    return outs


def _shape_at(t: Any, binding: Mapping[str, int] | None, memo: dict[Any, int] | None = None) -> tuple[int, ...] | None:
    """The shape of type ``t`` at ``binding`` (None when it is not known before the run);
    ``memo``: symbolic dim -> its value at ``binding``, filled as dims are evaluated."""
    if t is None or t.shape is None or None in t.shape:
        return None
    if t.is_static:
        return tuple(t.shape)
    if not binding or min(binding.values()) < 1:  # the symbolic dims hold for symbols >= 1
        return None
    memo = {} if memo is None else memo
    try:  # (each dim evaluated: no bound TensorType made, this runs for every bound output each step)
        return tuple(d if type(d) is int else memo[d] if d in memo else memo.setdefault(d, evaluate(d, binding))
                     for d in t.shape)
    except (KeyError, TypeError):
        return None


def _what(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype}{list(a.shape)}" + ("" if a.flags.c_contiguous else " (not C-contiguous)") + (
            "" if a.flags.writeable else " (read-only)")
    return "None" if a is None else f"a {type(a).__name__}"
