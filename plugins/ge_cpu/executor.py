"""The sequential NumPy executor: kernels bound at build time, values held in numbered slots.

Build time resolves everything a run needs: each node's kernel (from its factory), the slot
of every input and output, and which slots die after each step (so intermediate arrays are
released as soon as their last reader ran). A run is then a tight loop over prepared steps.
A run keeps its values in a local list, so one executable serves many threads at once.

Every node is built before anything is reported: an op without a kernel, or a kernel factory
that refuses the node (a dtype or attribute it does not support), is collected, and the build
ends with ONE :class:`UnsupportedOpError` naming all of them (subgraphs included).

Control flow. Subgraphs (If/Loop/Scan/SequenceMap bodies) are compiled into
:class:`SubProgram` objects by the same executor. The node's *implicit captures* (values of
enclosing graphs that a body reads) are appended to the node's kernel inputs, after its own
inputs; the factory gets ``spec.options["subgraph"]`` (``graph -> SubProgram``) and
``spec.options["n_captures"]``. ``SubProgram.run(args, captures)`` runs the body with its
formal inputs bound to ``args`` and returns the body's outputs.

Values in slots are NumPy arrays, Python lists of arrays (ONNX sequences) or ``None`` (an
empty optional, or an absent optional input).

BLAS threads. Every run of every executor executes at one definite BLAS thread count: the
``threads`` option, else the process's count outside runs. The count is process-wide, so runs
that need different counts never overlap, and nothing inside a run (stream worker threads,
nested runs) changes it: a model gives the same bits whichever thread calls ``run``. The policy
is :class:`BlasThreads` (one instance, :data:`BLAS`).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ge_core.backend import Backend, Executable
from ge_core.errors import ExecutionError, GEError, UnsupportedOpError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec, check_deadline
from ge_core.ops import OpRegistry


class _Step:
    __slots__ = ("fn", "ins", "outs", "free", "node", "origin")

    def __init__(self, fn, ins, outs, free, node, origin=None):
        self.fn, self.ins, self.outs, self.free, self.node = fn, ins, outs, free, node
        self.origin = origin

    def who(self) -> str:
        """The node, and the plugin whose kernel runs it (for error messages)."""
        return self.node.describe() + (f" [kernel of plugin '{self.origin}']" if self.origin else "")


def _node_reads(node: Node) -> Iterator[Value]:
    """Inputs of ``node`` and the outer values its subgraphs read."""
    for v in node.inputs:
        if v is not None:
            yield v
    for g in node.subgraphs():
        yield from graph_captures(g)


def graph_captures(g: Graph) -> list[Value]:
    """Values of enclosing graphs that ``g`` (or a graph nested in it) reads, first-use order."""
    seen: dict[Value, None] = {}
    for n in g.node_list():
        for v in _node_reads(n):
            if v.graph is not g and v not in seen:
                seen[v] = None
    for v in g.outputs:  # a body may return an outer value directly
        if v.graph is not g and v not in seen:
            seen[v] = None
    return list(seen)


def _fmt(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, list):
        return f"seq[{len(v)}]"
    return f"{getattr(v, 'dtype', '?')}{list(getattr(v, 'shape', ()))}"


def _as_output(v: Any) -> Any:
    if v is None or isinstance(v, (np.ndarray, list)):
        return v
    return np.asarray(v)


class _Program:
    """The prepared steps of one graph (the main graph or a subgraph body)."""

    def __init__(self, graph: Graph, kernels, options, extern: Sequence[Value] = ()) -> None:
        self.graph = graph
        slot: dict[Any, int] = {}

        def slot_of(v) -> int:
            if v not in slot:
                slot[v] = len(slot)
            return slot[v]

        self.input_slots = [(v.name, slot_of(v)) for v in graph.inputs]
        self.extern_slots = [slot_of(v) for v in extern]
        # Constants go in as they are: a folded one may be a zero-stride broadcast view (one value);
        # kernels that feed weights to BLAS (Conv, Gemm, fused MatMul) pack them at build time.
        self.const_slots = [(slot_of(v), v.const_value) for v in graph.constants.values()]
        problems: list[str] = []
        missing: list[Node] = []
        steps: list[_Step] = []
        last_use: dict[int, int] = {}
        for node in graph.node_list():
            f = kernels.get((OpRegistry.norm_domain(node.domain), node.op_type))
            if f is None:
                missing.append(node)
                continue
            caps: list[Value] = []
            extra: dict[str, Any] = {}
            subs = node.subgraphs()
            if subs:
                seen: dict[Value, None] = {}
                for g in subs:
                    for v in graph_captures(g):
                        seen.setdefault(v, None)
                caps = list(seen)
                extra = {"subgraph": _SubBuilder(kernels, options, caps), "n_captures": len(caps)}
            spec = KernelSpec.from_node(node, options, **extra)
            origin = kernels.origin((OpRegistry.norm_domain(node.domain), node.op_type)) if hasattr(kernels, "origin") else None
            try:
                fn = f(spec)
            except GEError as e:
                problems.append(getattr(e, "detail", str(e)))
                continue
            except Exception as e:  # noqa: BLE001 - a factory bug names the node
                problems.append(f"building the kernel of {_Step(None, (), (), (), node, origin).who()} failed: "
                                f"{type(e).__name__}: {e}")
                continue
            if not callable(fn):
                problems.append(f"the kernel factory of {_Step(None, (), (), (), node, origin).who()} returned "
                                f"{type(fn).__name__}, not a callable")
                continue
            ins = tuple(-1 if v is None else slot_of(v) for v in node.inputs) + tuple(slot_of(v) for v in caps)
            outs = tuple(slot_of(v) for v in node.outputs)
            i = len(steps)
            for s in ins:
                if s >= 0:
                    last_use[s] = i
            st = _Step(fn, ins, outs, (), node, origin)
            st.fn = checked_kernel(fn, node, st.who)  # results are checked against the node's types
            steps.append(st)
        if missing:
            by: dict[tuple[str, str], list[str]] = {}
            for n in missing:
                by.setdefault((n.domain or "ai.onnx", n.op_type), []).append(n.name)
            for (d, op), names in sorted(by.items()):
                shown = ", ".join(f"'{x}'" for x in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                problems.insert(0, f"no kernel for {op} (domain {d}) at node(s) {shown}")
        if problems:
            where = "" if graph.parent is None else f" in subgraph '{graph.name}'"
            raise UnsupportedOpError(
                f"the cpu backend cannot run {len(problems)} node(s){where}: " + "; ".join(problems),
                hint="install a plugin that registers these kernels (ge_register_kernels), change the model, "
                     "or choose another soc_version",
            )
        outputs = {slot_of(v) for v in graph.outputs}
        keep = {s for s, _ in self.const_slots} | {s for _, s in self.input_slots} | set(self.extern_slots)
        frees: dict[int, list[int]] = {}
        for s, i in last_use.items():
            if s not in outputs and s not in keep:
                frees.setdefault(i, []).append(s)
        # outputs nobody reads are freed right after they are produced
        for i, st in enumerate(steps):
            for s in st.outs:
                if s not in last_use and s not in outputs:
                    frees.setdefault(i, []).append(s)
        for i, st in enumerate(steps):
            st.free = tuple(frees.get(i, ()))
        self.steps = steps
        self.n_slots = len(slot)
        self.output_slots = [slot_of(v) for v in graph.outputs]
        self.output_types = [v.type for v in graph.outputs]
        self.kernel_count = len(steps)
        modes = collections.Counter(m for st in steps for m in [getattr(st.fn, "mode", "")] if isinstance(m, str) and m)
        self.kernel_modes = dict(sorted(modes.items()))

    def execute(self, env: list[Any]) -> list[Any]:
        for s, a in self.const_slots:
            env[s] = a
        for st in self.steps:
            res = call_step(st, [env[i] if i >= 0 else None for i in st.ins])
            for s, r in zip(st.outs, res):
                env[s] = r
            for s in st.free:
                env[s] = None
        return [_as_output(env[s]) for s in self.output_slots]


def call_step(st: _Step, args: list[Any], out: tuple | None = None) -> Sequence[Any]:
    """Run one step's kernel; a failure, or results that are not what the node declares (see
    :func:`checked_kernel`), names the node and plugin."""
    check_deadline(st.node.name)  # run(timeout=): cancelled between nodes
    try:
        return st.fn(*args) if out is None else st.fn(*args, out=out)
    except GEError:
        raise
    except Exception as e:
        shapes = ", ".join(_fmt(a) for a in args)
        raise ExecutionError(
            f"{st.who()} failed on inputs ({shapes}): {type(e).__name__}: {e}",
            hint="check the input shapes against the model, or report the kernel bug",
        ) from e


# ------------------------------------------------------------------------------------------
# kernel results are checked against the node's declared types
# ------------------------------------------------------------------------------------------
#: Attributes of a kernel that executors read (the out= protocol, the report's kernel modes).
_KERNEL_ATTRS = ("accepts_out", "inplace_ok", "mode", "kernel_kind")


def checked_kernel(fn: Any, node: Node, who: Any) -> Any:
    """``fn`` wrapped so that its results are what ``node`` declares, on every executor.

    A kernel returns a sequence with one value per output of its node; an output whose declared
    type has a dtype or a shape must be an ``np.ndarray`` of that dtype, rank and static dims (a
    NumPy scalar of the right dtype is taken as a 0-d array). Anything else (another dtype or
    shape, a list, None, a bare array instead of a sequence) is an :class:`ExecutionError` that
    names the node, its op, the kernel's plugin (``who()``), and what was expected and returned:
    the bug is the kernel's, not the next op's. Outputs of unknown type (sequences, optionals)
    are not checked. The cost is O(1) per output: a type, shape and dtype comparison when the
    declared type is static.
    """
    if not callable(fn):
        return fn  # the executor reports it when the run calls it
    outs = node.outputs
    n = len(outs)
    # per output: None (anything), (dtype, shape) for a static type (fast check), False (partial)
    fast: list[Any] = []
    for v in outs:
        t = v.type
        if t is None or (t.dtype is None and t.shape is None):
            fast.append(None)
        elif t.dtype is not None and t.dtype != np.dtype(object) and t.shape is not None and t.is_static:
            fast.append((t.dtype, tuple(t.shape)))
        else:
            fast.append(False)
    nd = np.ndarray

    def kernel(*args, **kw):
        res = fn(*args, **kw)
        if (type(res) is tuple or type(res) is list) and len(res) == n:
            for r, f in zip(res, fast):
                if f is None:
                    continue
                if f is False or type(r) is not nd or r.shape != f[1] or r.dtype != f[0]:
                    break
            else:
                return res
        return _conform(res, node, who)

    for a in _KERNEL_ATTRS:
        if hasattr(fn, a):
            setattr(kernel, a, getattr(fn, a))
    kernel.__wrapped__ = fn  # type: ignore[attr-defined]
    return kernel


def _conform(res: Any, node: Node, who: Any) -> list[Any]:
    """The slow path of :func:`checked_kernel`: results converted where harmless, else the error."""
    n = len(node.outputs)
    hint = ("a kernel returns a sequence (tuple or list) with one value per output of its node, each an "
            "ndarray of the type and shape the node declares (ge_core.kernel); report the bug to the kernel's author")
    if isinstance(res, np.ndarray) or not isinstance(res, (tuple, list)):
        got = f"one {_fmt(res)} array" if isinstance(res, np.ndarray) else ("None" if res is None else f"a {type(res).__name__}")
        raise ExecutionError(f"{who()}: the kernel returned {got} instead of a sequence of {n} output(s)", hint=hint)
    if len(res) != n:
        raise ExecutionError(f"{who()}: the kernel returned {len(res)} outputs, expected {n}", hint=hint)
    fixed = list(res)
    for j, (r, v) in enumerate(zip(res, node.outputs)):
        t = v.type
        if t is None or (t.dtype is None and t.shape is None):
            continue
        if isinstance(r, np.generic):
            r = fixed[j] = np.asarray(r)
        problem = _mismatch(r, t)
        if problem:
            raise ExecutionError(f"{who()}: output {j} ('{v.name}') of the kernel is {problem}, the node declares {t}",
                                 hint=hint)
    return fixed


def _mismatch(r: Any, t: Any) -> str:
    """What is wrong with ``r`` as a value of declared type ``t`` ('' when nothing is)."""
    if not isinstance(r, np.ndarray):
        if r is None:
            return "None"
        if isinstance(r, (list, tuple)):
            return f"a {type(r).__name__} of {len(r)} item(s)"
        return f"a {type(r).__name__}"
    got = str(TensorType.of(r))
    if t.dtype is not None and r.dtype != t.dtype and not (t.dtype == np.dtype(object) and r.dtype.kind in "OUS"):
        return got
    if t.shape is not None and (r.ndim != len(t.shape)
                                or any(isinstance(d, int) and d != s for d, s in zip(t.shape, r.shape))):
        return got
    return ""


class SubProgram:
    """A compiled subgraph body: ``run(args, captures) -> outputs``."""

    def __init__(self, graph: Graph, kernels, options, captures: Sequence[Value]) -> None:
        own = graph_captures(graph)
        pos = {v: i for i, v in enumerate(captures)}
        self._take = [pos[v] for v in own]
        self.program = _Program(graph, kernels, options, extern=own)
        self.graph = graph
        self.n_inputs = len(graph.inputs)
        self.n_outputs = len(graph.outputs)
        self.input_types = [v.type for v in graph.inputs]

    def run(self, args: Sequence[Any], captures: Sequence[Any] = ()) -> list[Any]:
        p = self.program
        env: list[Any] = [None] * p.n_slots
        for (_, s), a in zip(p.input_slots, args):
            env[s] = a
        for s, k in zip(p.extern_slots, self._take):
            env[s] = captures[k]
        return p.execute(env)


class _SubBuilder:
    """``spec.options["subgraph"]``: compiles a body of the node being built."""

    def __init__(self, kernels, options, captures: Sequence[Value]) -> None:
        self.kernels, self.options, self.captures = kernels, options, list(captures)

    def __call__(self, graph: Graph) -> SubProgram:
        return SubProgram(graph, self.kernels, self.options, self.captures)


class SequentialExecutable(Executable):
    """Runs a graph's nodes in order on the calling thread."""

    def __init__(self, graph: Graph, kernels, options) -> None:
        self.graph = graph
        self.program = _Program(graph, kernels, options)
        #: BLAS threads of every run (None: the process's baseline); see :class:`BlasThreads`
        self.threads = getattr(options, "threads", None) or None
        BLAS.refresh()
        p = self.program
        self.input_slots = p.input_slots
        self.const_slots = p.const_slots
        self.steps = p.steps
        self.n_slots = p.n_slots
        self.output_slots = p.output_slots
        self.output_types = p.output_types
        self.kernel_count = count_kernels(p)
        self.kernel_modes = p.kernel_modes

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        p = self.program
        env: list[Any] = [None] * p.n_slots
        for name, s in p.input_slots:
            env[s] = feeds[name]
        with BLAS.run(self.threads):
            return p.execute(env)


def count_kernels(p: _Program) -> int:
    return len(p.steps)


# ------------------------------------------------------------------------------------------
# BLAS threads: one count per process, the same for every run that overlaps
# ------------------------------------------------------------------------------------------
#: A run waiting for runs at another BLAS count checks its deadline this often (seconds).
WAIT_SLICE_S = 0.05

#: The count a run executes at: one entry per BLAS library (None outside a run). A context
#: variable, so the worker threads of the stream executors (which run in a copy of the caller's
#: context) and nested runs see their run's count and never change it.
_run_blas: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar("ge_run_blas", default=None)


class BlasThreads:
    """The BLAS thread count every run executes at: the policy, in one object (:data:`BLAS`).

    A BLAS library keeps one thread count per process (OpenBLAS built with pthreads, as bundled
    with NumPy; MKL; BLIS), and how a GEMM splits its work over those threads changes the
    rounding of its result (1 and 2 threads differ by an ulp). So that a model gives the same
    bits whichever thread calls ``run``, alone or concurrently, and every executor (sequential,
    arena, sink, streams) agrees, each run executes at one definite count:

    * the model's ``threads`` option when it is set, else the *baseline*: what the libraries
      report while no run is active (``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``, the core
      count, or what the process set with threadpoolctl outside runs);
    * runs that need the same count overlap freely; a run that needs another count waits until
      the active runs have ended (runs queued behind it wait too, so it is not starved), then
      sets the count once, process-wide, under this object's lock, from whichever thread it was
      called on; the baseline comes back when the last active run ends;
    * nothing changes the count inside a run: a stream executor's worker threads, subgraph
      bodies and nested runs (a kernel that runs another model) execute at their run's count.
      A kernel that runs a model on a thread of its own runs it in a copy of its context
      (``contextvars.copy_context().run``), as the stream executors do; otherwise that run is a
      new one, and waits for the outer run to end if it needs another count.

    threadpoolctl (3.8+) lets only the first thread that set OpenBLAS's count change it again
    and silently ignores the others, which made a per-run limit from a worker thread a no-op;
    this object lifts that rule for the moment it sets the count (``clear_controlling_thread``).
    Changing the count from outside while a run is active is outside this promise.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._libs: list[Any] | None = None  # threadpoolctl controllers of the BLAS libraries
        self._active = 0  # runs executing now
        self._counts: tuple[int, ...] = ()  # the count they execute at
        self._baseline: tuple[int, ...] = ()  # the count outside runs, read when the first one starts
        self._queued = 0  # runs waiting for another count

    # -- the libraries --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Look the loaded BLAS libraries up again (at build time: a library loaded since, such
        as SciPy's own OpenBLAS, is governed from then on). Deferred while runs are active."""
        with self._cond:
            if self._active == 0:
                self._libs = None

    def _controllers(self) -> list[Any]:
        if self._libs is None:
            try:
                from threadpoolctl import ThreadpoolController

                libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
            except Exception:  # noqa: BLE001 - no threadpoolctl, or no BLAS it knows: nothing to govern
                libs = []
            self._libs = libs
        return self._libs

    def _read(self, libs) -> tuple[int, ...]:
        out = []
        for lib in libs:
            try:
                n = int(lib.get_num_threads() or 0)
            except Exception:  # noqa: BLE001
                n = 0
            out.append(n)
        return tuple(out)

    def _apply(self, libs, counts: tuple[int, ...]) -> None:
        for lib, n in zip(libs, counts):
            if n <= 0:
                continue
            clear = getattr(type(lib), "clear_controlling_thread", None)
            try:
                if clear is not None:
                    clear(force=True)  # threadpoolctl: let this thread set the process-wide count
                lib.set_num_threads(n)
            except Exception:  # noqa: BLE001 - a library that refuses keeps its count (for every run alike)
                pass
            finally:
                if clear is not None:
                    clear(force=True)

    # -- runs ---------------------------------------------------------------------------------
    def current(self) -> tuple[int, ...] | None:
        """The counts the current run executes at (one per library), None outside a run."""
        return _run_blas.get()

    def baseline(self) -> tuple[int, ...]:
        """The libraries' counts as a run without ``threads`` would see them now."""
        with self._cond:
            return self._baseline if self._active else self._read(self._controllers())

    @contextlib.contextmanager
    def run(self, threads: int | None = None) -> Iterator[tuple[int, ...]]:
        """Execute the block as one run at ``threads`` BLAS threads (None: the baseline)."""
        inside = _run_blas.get()
        if inside is not None:  # nested run, or a worker thread of this run: keep its count
            yield inside
            return
        cond = self._cond
        with cond:
            libs = self._controllers()
            want = None if threads is None else tuple(int(threads) for _ in libs)
            queued = False
            try:
                while self._active and ((want or self._baseline) != self._counts or (self._queued and not queued)):
                    if not queued and (want or self._baseline) != self._counts:
                        queued = True
                        self._queued += 1
                    cond.wait(WAIT_SLICE_S)
                    check_deadline("(waiting for runs at another BLAS thread count)")  # run(timeout=) holds here too
            finally:
                if queued:
                    self._queued -= 1
            if self._active == 0:
                self._baseline = self._read(libs)
                self._counts = want or self._baseline
                if self._counts != self._baseline:
                    self._apply(libs, self._counts)
            self._active += 1
            counts = self._counts
        token = _run_blas.set(counts)
        try:
            yield counts
        finally:
            _run_blas.reset(token)
            with cond:
                self._active -= 1
                if self._active == 0:
                    if self._counts != self._baseline:
                        self._apply(libs, self._baseline)
                    cond.notify_all()


#: The process's BLAS thread policy (see :class:`BlasThreads`).
BLAS = BlasThreads()


def blas_threads(threads: int | None = None):
    """``with blas_threads(n):`` runs the block as one run at ``n`` BLAS threads (see :data:`BLAS`)."""
    return BLAS.run(threads)


class CpuBackend(Backend):
    """The default backend: NumPy kernels run in schedule order."""

    name = "cpu"
    aliases = ("numpy", "host", "x86", "aarch64", "Ascend310", "Ascend910", "Ascend310P3")

    def build(self, model, kernels, options) -> Executable:
        """Choose the executor (option ``executor``): ``auto``/``sink`` generate the schedule's code
        (one function per stream, each stream on its own thread when there are several);
        ``streams`` interprets a multi-stream schedule, ``arena`` interprets inside the memory
        plan, ``sequential`` interprets without it."""
        from ge_core.errors import OptionError
        from ge_core.memory import MemoryPlan

        choice = str((getattr(options, "extra", {}) or {}).get("executor", "auto") or "auto").lower()
        if choice not in EXECUTORS:
            raise OptionError(f"executor '{choice}' is not one of {', '.join(EXECUTORS)}")
        plan = getattr(model, "memory_plan", None)
        streams = getattr(model, "streams", None)
        if choice == "sequential":
            return SequentialExecutable(model.graph, kernels, options)
        if plan is None:
            plan = MemoryPlan({}, 0, "none")  # nothing planned: every value keeps its own array
        multi = streams is not None and streams.count > 1
        if multi and streams is not None:
            if choice == "streams":  # interpreted, one thread per stream
                from .streams import MultiStreamExecutable

                return MultiStreamExecutable(model.graph, kernels, options, plan, streams)
            if choice in ("auto", "sink"):  # one generated function per stream
                from .sink import StreamSinkExecutable

                return StreamSinkExecutable(model.graph, kernels, options, plan, streams)
        if choice == "arena":
            from .arena import ArenaExecutable

            return ArenaExecutable(model.graph, kernels, options, plan)
        from .sink import SinkExecutable

        return SinkExecutable(model.graph, kernels, options, plan)


#: Values of the ``executor`` option of the cpu backend.
EXECUTORS = ("auto", "sink", "arena", "streams", "sequential")
