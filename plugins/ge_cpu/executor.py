"""The cpu backend: it chooses an executor (option ``executor``) and builds it.

Every executor is a :class:`~ge_cpu.executable.CpuExecutable` that combines the same parts:
a :class:`~ge_cpu.program.Program` (kernels bound to slots, :mod:`ge_cpu.program`), for all but
``sequential`` an arena :class:`~ge_cpu.arena.Layout` (:mod:`ge_cpu.arena`), a strategy that
runs the program (the plain interpreter, the arena interpreter, or the sink code generator of
:mod:`ge_cpu.sink`) and for a multi-stream schedule the :class:`~ge_cpu.streams.StreamRunner`.

BLAS threads. Every run of every executor executes at one definite BLAS thread count: the
``threads`` option, else the process's count outside runs (:mod:`ge_cpu.blas`). Kernel results
are checked against the node's declared types on every executor (:mod:`ge_cpu.checked`).
"""

from __future__ import annotations

from ge_core.backend import Backend, BuildContext, Executable
from ge_core.errors import OptionError
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan, SymbolicPlan
from ge_core.ops import OpRegistry
from ge_native import native

from .arena import ArenaExecutable
from .blas import BLAS, WAIT_SLICE_S, BlasThreads, blas_threads
from .checked import checked_kernel
from .executable import CpuExecutable
from .program import PlainInterpreter, Program, SubProgram, call_step, graph_captures
from .shaped import SymbolicArenaExecutable
from .sink import SinkExecutable, StreamSinkExecutable
from .streams import MultiStreamExecutable

__all__ = ["BLAS", "EXECUTORS", "WAIT_SLICE_S", "ArenaExecutable", "BlasThreads", "CpuBackend", "CpuExecutable",
           "MultiStreamExecutable", "SequentialExecutable", "SinkExecutable", "StreamSinkExecutable", "SubProgram",
           "blas_threads", "call_step", "checked_kernel", "graph_captures"]


class SequentialExecutable(CpuExecutable):
    """Runs a graph's nodes in order on the calling thread, without an arena (``executor=sequential``)."""

    def __init__(self, graph: Graph, kernels, options, ops: OpRegistry | None = None) -> None:
        program = Program(graph, kernels, options, ops=ops)
        super().__init__(program, PlainInterpreter(program), options)


class CpuBackend(Backend):
    """The default backend: NumPy kernels run in schedule order."""

    name = "cpu"
    aliases = ("numpy", "host", "x86", "aarch64", "Ascend310", "Ascend910", "Ascend310P3")

    def build(self, model, kernels, context: BuildContext) -> Executable:
        """Choose the executor (option ``executor``): ``auto``/``sink`` generate the schedule's code
        (one function per stream, each stream on its own thread when there are several);
        ``streams`` interprets a multi-stream schedule, ``arena`` interprets inside the memory
        plan, ``sequential`` interprets without it. With the option ``native_kernels=probe`` no
        native kernel is compiled: the executable's ``native_kernels`` says how many modules the
        model needs and how many of them the kernel cache holds (``ge inspect``)."""
        options = context.options
        mode = str(options.getoption("native_kernels", "build") or "build").lower()
        if mode not in ("build", "probe"):
            raise OptionError(f"native_kernels '{mode}' is not one of build, probe")
        if mode == "build":
            return self._build(model, kernels, context)
        with native.probe() as found:
            exe = self._build(model, kernels, context)
        keys = dict(found)
        exe.native_kernels = {"modules": len(keys), "in_cache": sum(keys.values()),  # type: ignore[attr-defined]
                              "missing": len(keys) - sum(keys.values())}
        return exe

    def _build(self, model, kernels, context: BuildContext) -> Executable:
        # the op registry of the compiling (or loading) host goes down to the programs' layouts
        options, ops = context.options, context.registries.ops
        choice = str(options.getoption("executor", "auto") or "auto").lower()
        if choice not in EXECUTORS:
            raise OptionError(f"executor '{choice}' is not one of {', '.join(EXECUTORS)}")
        plan = getattr(model, "memory_plan", None)
        streams = getattr(model, "streams", None)
        if choice == "sequential":
            return SequentialExecutable(model.graph, kernels, options, ops)
        if plan is None:
            plan = MemoryPlan({}, 0, "none")  # nothing planned: every value keeps its own array
        multi = streams is not None and streams.count > 1
        if isinstance(plan, SymbolicPlan):  # interpreted in the arena each run's shapes give
            return SymbolicArenaExecutable(model.graph, kernels, options, plan,
                                           streams if multi and choice != "arena" else None, ops)
        if multi and streams is not None:
            if choice == "streams":  # interpreted, one thread per stream
                return MultiStreamExecutable(model.graph, kernels, options, plan, streams, ops)
            if choice in ("auto", "sink"):  # one generated function per stream
                return StreamSinkExecutable(model.graph, kernels, options, plan, streams, ops)
        if choice == "arena":
            return ArenaExecutable(model.graph, kernels, options, plan, ops)
        return SinkExecutable(model.graph, kernels, options, plan, ops)


#: Values of the ``executor`` option of the cpu backend.
EXECUTORS = ("auto", "sink", "arena", "streams", "sequential")
