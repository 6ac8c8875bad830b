"""The compiled model: graph, schedule, streams, memory plan, report, and the backend's executable."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from .backend import BuildContext
from .errors import InputError, OptionError
from .ir.graph import Graph
from .kernel import run_deadline
from .memory import MemoryPlan, SymbolicPlan, dim_ranges
from .options import CompileOptions
from .passes import STAGES
from .plugins import PluginHost
from .registry import close_matches
from .schedule import StreamAssignment


@dataclass(frozen=True)
class NodeArg:
    """One input or output of a model, as onnxruntime's ``NodeArg``: ``name``, ``dtype`` (a NumPy
    dtype, or None when the graph does not say) and ``shape`` (a tuple whose items are ints for
    fixed dims and names such as ``"batch"`` for symbolic ones; None for an unknown rank)."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str, ...] | None

    @property
    def symbolic_dims(self) -> dict[int, str]:
        """``{axis: dim name}`` of the dims that are not fixed."""
        return {i: d for i, d in enumerate(self.shape or ()) if isinstance(d, str)}

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ",".join(str(d) for d in self.shape)
        return f"{self.name}: {self.dtype if self.dtype is not None else '?'}[{dims}]"


def _node_arg(v) -> NodeArg:
    t = v.type
    shape = None if t.shape is None else tuple(d if isinstance(d, (int, str)) else "?" for d in t.shape)
    return NodeArg(v.name, t.dtype, shape)


#: Options a loaded model may be given at load time (``load_om(path, threads=...)``): those that
#: change how it runs, not what was compiled. Plugin-registered options are also accepted
#: (the cpu backend's ``executor`` and ``parallel``); the backend checks their values.
RUN_OPTIONS = ("threads", "log")


class CompiledModel:
    """A model ready to run: ``model.run({"x": array}) -> {"y": array}``.

    Built by :func:`ge_core.compile` or :func:`ge_core.load_om`. Thread-safe: several threads
    may call :meth:`run` at once.
    """

    #: How a model compiles a graph again (:meth:`with_outputs`) and saves itself (:meth:`save`):
    #: ``ge_core.api``, the top of the core, gives ``compiler.compile_graph`` and ``om.save_om``.
    compile_graph: ClassVar[Any] = None
    save_om: ClassVar[Any] = None

    def __init__(
        self,
        graph: Graph,
        options: CompileOptions,
        *,
        streams: StreamAssignment,
        memory_plan: MemoryPlan | SymbolicPlan | None,
        report: dict[str, Any],
        host: PluginHost,
    ) -> None:
        self.graph = graph
        self.options = options
        self.streams = streams
        self.memory_plan = memory_plan
        self.report = report
        self.source: str | None = None
        #: the plugin host whose backend, kernels and options this model uses
        self.host = host
        self._executable = None
        self._dim_ranges: dict[str, tuple[int, int | None]] | None = None
        self._lock = threading.Lock()
        #: the .om's snapshot (private memory) whose weights the graph uses, held as long as the model
        self.keepalive: Any = None
        self._async_runner: AsyncRunner | None = None
        #: ``load_seconds`` (set by :func:`ge_core.load_om`: reading, verifying and building the
        #: .om) and ``first_run_seconds`` (the first :meth:`run`), the cold-start pair
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

    @property
    def inputs(self) -> list[NodeArg]:
        """The inputs in order, each a :class:`NodeArg` (name, dtype, shape with symbolic dims by name)."""
        return [_node_arg(v) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[NodeArg]:
        """The outputs in order, each a :class:`NodeArg`."""
        return [_node_arg(v) for v in self.graph.outputs]

    @property
    def schedule(self) -> list:
        """Nodes in execution order."""
        return self.graph.node_list()

    @property
    def executable(self):
        if self._executable is None:
            with self._lock:
                if self._executable is None:
                    self._executable = self._build()
        return self._executable

    def _build(self):
        regs = self.host.registries
        backend = regs.backend(self.options.soc_version)
        return backend.build(self, regs.kernels_for(backend.name), BuildContext(self.options, regs))

    # ------------------------------------------------------------------------------------------
    def merged_run_options(self, **options: Any) -> CompileOptions:
        """This model's options with the run options ``options`` applied (checked; nothing is
        built). OptionError for options that change what was compiled."""
        core = {f.name for f in fields(CompileOptions)} - {"extra"}
        fixed = [k for k in options if k.replace("-", "_") in core and k.replace("-", "_") not in RUN_OPTIONS]
        if fixed:
            raise OptionError(f"option(s) {', '.join(fixed)} change what was compiled and cannot be set on a "
                              "compiled model", hint="compile the source model again with them")
        opts = replace(self.options, extra=dict(self.options.extra))
        opts.update(options)
        opts.read_by_plugins(self.host.registries.option_readers, options)
        opts.check_extra(self.host.registries.options)
        return opts

    def set_run_options(self, **options: Any) -> None:
        """Change how the model runs (``threads=4``, ``executor="arena"``, ``parallel="blas"``):
        the executable is built again with the new options. Options that change what was
        compiled (passes, shapes, memory plan) raise :class:`OptionError`: compile again for those."""
        if not options:
            return
        opts = self.merged_run_options(**options)
        with self._lock:
            old, self.options = self.options, opts
            try:
                self._executable = self._build()
            except BaseException:
                self.options = old
                raise

    def run(self, feeds: Mapping[str, Any] | np.ndarray | None = None, *, timeout: float | None = None,
            output_names: Sequence[str] | None = None, outputs: Mapping[str, np.ndarray] | None = None,
            **kw: Any) -> dict[str, np.ndarray]:
        """Run one inference; returns ``{output name: array}`` in graph output order (or in the
        order of ``output_names``, which selects some outputs: the others are still computed).

        ``feeds`` maps input names to arrays (keyword arguments add to it); a model with exactly
        one input without a default also takes that input's array alone. An input with a default
        (an ONNX initializer listed as a graph input) takes its default when not fed.
        ``timeout`` (seconds) cancels a run that takes longer with an :class:`ExecutionError`
        naming the node it was at (loop kernels check it every iteration); an input literally
        named ``timeout`` (or ``outputs``) is given through the dict.

        ``outputs`` (IO binding, as onnxruntime's ``IOBinding``) maps output names to arrays the
        caller owns, each of exactly the output's dtype and shape at these feeds (InputError naming
        the output otherwise): the run writes those outputs there and returns those arrays, so a
        generation loop passing its KV cache back moves no bytes it need not. An array may be the
        memory of a feed (``past_present_share_buffer``): see ``ge_core.kernel``. Feeds are used in
        place (a C-contiguous array of the input's dtype is not copied).
        """
        wanted = self._check_output_names(output_names)
        checked = self._check_feeds(self._feed_dict(feeds, kw))
        seconds = _check_timeout(timeout)
        first, t0 = "first_run_seconds" not in self.timings, time.perf_counter()
        executable = self.executable  # built (once) outside the deadline
        if outputs is not None and not getattr(executable, "takes_outputs", False):
            raise InputError("run(outputs=...): this backend's executable cannot fill caller arrays", hint="leave outputs out")
        with run_deadline(seconds):
            outs = executable.run(checked) if outputs is None else executable.run(checked, outputs=outputs)
        if first:
            self.timings.setdefault("first_run_seconds", round(time.perf_counter() - t0, 6))
        result = {name: out for name, out in zip(self.output_names, outs)}
        return result if wanted is None else {n: result[n] for n in wanted}

    def _check_output_names(self, names: Sequence[str] | None) -> list[str] | None:
        if names is None:
            return None
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise InputError(f"output_names must be a list of output names, not {type(names).__name__}",
                             hint=f"e.g. output_names=[{self.output_names[0]!r}]" if self.output_names else None)
        names = list(names)
        have = self.output_names
        bad = [n for n in names if not isinstance(n, str) or n not in have]
        if bad:
            raise InputError(f"unknown output(s) {_listed(bad)}{close_matches(str(bad[0]), have)}",
                             hint=f"the model's outputs are {_listed(have)}")
        return names

    def with_outputs(self, names: Sequence[str] | None = None, **options: Any) -> CompiledModel:
        """A model that runs this compiled graph with more outputs: the values ``names``, or
        every tensor a node computes when None (for debugging: dumping or comparing intermediate
        tensors). The copy is compiled again without passes, so it runs the same kernels on the
        same graph, and without memory reuse; ``options`` (e.g. ``executor="sequential"``) are
        added to this model's."""
        g = self.graph.copy()
        outs = list(g.outputs)
        shown = {v.name for v in outs}
        computed = [o for n in g.node_list() for o in n.outputs]
        if names is None:
            extra = [o for o in computed if o.name not in shown and o.type.dtype is not None]
        else:
            by_name = {o.name: o for o in computed}
            bad = [n for n in names if n not in by_name]
            if bad:
                raise InputError(f"no node of the compiled graph computes {_listed(bad)}"
                                 f"{close_matches(str(bad[0]), list(by_name))}",
                                 hint="the compiled graph's values are its nodes' outputs (see `ge export`)")
            extra = [by_name[n] for n in dict.fromkeys(names) if n not in shown]
        g.set_outputs(outs + extra)
        opts = replace(self.options, extra={**self.options.extra}, pipeline={s: {"passes": []} for s in STAGES},
                       opt_level=0, disable_reuse_memory=True, input_shape={}, out_nodes=[], dump_ir=None,
                       config=None, fusion_switch_file=None)
        opts.update(options)
        opts.read_by_plugins(self.host.registries.option_readers, options)
        return self.compile_graph(g, opts, self.host)

    def run_async(self, feeds: Mapping[str, Any] | np.ndarray | None = None, *,
                  output_names: Sequence[str] | None = None, **kw: Any) -> Future:
        """Queue one inference on the model's shared :class:`AsyncRunner` (one worker per CPU,
        up to twice as many requests waiting); returns a ``concurrent.futures.Future`` of what
        :meth:`run` returns. Blocks while the queue is full."""
        runner = self._async_runner
        if runner is None:
            with self._lock:
                if self._async_runner is None:
                    self._async_runner = AsyncRunner(self)
                runner = self._async_runner
        return runner.submit(feeds, output_names=output_names, **kw)

    def _feed_dict(self, feeds: Any, kw: dict[str, Any]) -> dict[Any, Any]:
        if feeds is None:
            return dict(kw)
        if isinstance(feeds, Mapping):
            return {**feeds, **kw}
        required = [v.name for v in self.graph.inputs if v.default is None]
        if isinstance(feeds, (np.ndarray, np.generic)) and len(required) == 1 and not kw:
            return {required[0]: feeds}
        takes = ", ".join(repr(n) for n in self.input_names[:10]) or "no inputs"
        if len(self.input_names) > 10:
            takes += f" and {len(self.input_names) - 10} more"
        alone = " (a bare array is taken only by a model with exactly one input)" if isinstance(
            feeds, (np.ndarray, np.generic)) else ""
        raise InputError(f"run() takes a dict of input name -> array, not a {type(feeds).__name__}{alone}",
                         hint=f"call model.run({{name: array, ...}}); the model takes {takes}")

    def _check_feeds(self, feeds: dict[str, Any]) -> dict[str, Any]:
        inputs = self.graph.inputs
        by_name = {v.name: v for v in inputs}
        unknown = [k for k in feeds if not isinstance(k, str) or k not in by_name]
        missing = [v.name for v in inputs if v.name not in feeds and v.default is None]
        if unknown or missing:
            parts = []
            if missing:
                parts.append(f"missing input(s) {_listed(missing)}")
            if unknown:
                parts.append(f"unknown input(s) {_listed(unknown)}")
            raise InputError(f"{'; '.join(parts)}", hint=f"the model takes {_listed(list(by_name)) or 'no inputs'}")
        out: dict[str, Any] = {}
        sym: dict[str, int] = {}
        for v in inputs:
            if v.name not in feeds:
                out[v.name] = v.default
                continue
            a = feeds[v.name]
            t = v.type
            if (a is None or isinstance(a, list)) and t.dtype is None and t.shape is None:
                out[v.name] = a  # a sequence or an empty optional: the IR does not type these yet
                continue
            a = _as_array(v.name, a, t.dtype)
            if t.dtype is not None and a.dtype != t.dtype:
                if a.dtype.kind == t.dtype.kind == "U" or (t.dtype == np.dtype(object) and a.dtype.kind in "US"):
                    a = a.astype(object)
                else:
                    raise InputError(f"input '{v.name}' has dtype {a.dtype}, the model expects {t.dtype}",
                                     hint=f"convert it with .astype(np.{t.dtype})")
            if a.dtype == np.dtype(object):
                _check_strings(v.name, a)
            if t.shape is not None:
                if a.ndim != len(t.shape):
                    raise InputError(f"input '{v.name}' has shape {list(a.shape)}, the model expects rank {len(t.shape)} {t}")
                for i, (dim, want) in enumerate(zip(a.shape, t.shape)):
                    if isinstance(want, int) and dim != want:
                        raise InputError(f"input '{v.name}' has shape {list(a.shape)}, the model expects {t} (dim {i})")
                    if isinstance(want, str):
                        if sym.setdefault(want, dim) != dim:
                            raise InputError(f"input '{v.name}' dim {i} ('{want}') is {dim}, but another input set it to {sym[want]}")
                        r = self.dim_ranges.get(want)
                        if r is not None and not (r[0] <= dim and (r[1] is None or dim <= r[1])):
                            raise InputError(
                                f"input '{v.name}' has shape {list(a.shape)}: dim {i} ('{want}') is {dim}, outside the "
                                f"range {r[0]}~{'-1' if r[1] is None else r[1]} the model was compiled for",
                                hint="feed a shape inside the range, or compile again with a wider range "
                                     "(--input_shape x:lo~hi,...)")
            out[v.name] = a
        return out

    @property
    def dim_ranges(self) -> dict[str, tuple[int, int | None]]:
        """The ranges of the input symbols (``--input_shape x:1~8,...``): symbol -> (lo, hi or None)."""
        r = self._dim_ranges
        if r is None:
            r = self._dim_ranges = dim_ranges(self.graph)
        return r

    def arena_bytes_at(self, dims: Mapping[str, int]) -> int:
        """The arena a run whose input symbols take the values ``dims`` uses (a symbolic plan,
        evaluated there); the planned arena of a model with static shapes."""
        if not isinstance(dims, Mapping):
            raise InputError(f"arena_bytes_at takes a dict of symbol name -> int, not {_what(dims)}",
                             hint="e.g. model.arena_bytes_at({'batch': 4})")
        for k, v in dims.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"arena_bytes_at: symbol {k!r:.60} = {_what(v)}: a symbol's value is an int of at "
                                 "least 0 (not a bool, float or string)",
                                 hint="pass the input dims' sizes, e.g. {'batch': 4}")
        plan = self.memory_plan
        if isinstance(plan, SymbolicPlan):
            want = plan.problem.symbols() if plan.problem is not None else set()
            missing = sorted(want - set(dims))
            if missing:
                raise InputError(f"arena_bytes_at needs a value for the symbol(s) {_listed(missing)}",
                                 hint=f"the model's symbols: {_listed(sorted(want))}")
            return plan.at({k: int(dims[k]) for k in want}).arena_bytes
        return int(plan.arena_bytes) if plan is not None else 0

    @property
    def input_defaults(self) -> dict[str, np.ndarray]:
        """Inputs that may be left out of the feeds, with the value each then takes."""
        return {v.name: v.default for v in self.graph.inputs if v.default is not None}

    # -- the interface tools build on (profiling, dumps, queues): a gear model has it too --------
    def check_feeds(self, feeds: Mapping[str, Any] | np.ndarray | None = None, **kw: Any) -> dict[str, Any]:
        """The feeds :meth:`run` would take (a dict, a lone array, keyword arguments), checked as
        :meth:`run` checks them, defaults filled in: ``{input name: array}``; else InputError."""
        return self._check_feeds(self._feed_dict(feeds, kw))

    def check_output_names(self, names: Sequence[str] | None) -> list[str] | None:
        """``output_names`` as :meth:`run` checks them (None: every output); else InputError."""
        return self._check_output_names(names)

    def model_for(self, feeds: Mapping[str, Any] | np.ndarray | None = None, **kw: Any) -> CompiledModel:
        """The compiled model (one graph, one memory plan, one executable) that runs ``feeds``:
        this model; a gear model's gear of the feeds' shapes."""
        return self

    @property
    def registries(self):
        """The plugin registries this model's kernels and backend come from."""
        return self.host.registries

    # ------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> str:
        """Write the model as an .om file (atomically: a failure leaves what was at ``path``
        as it was; see :func:`ge_core.om.save_om`); returns the path."""
        return self.save_om(self, os.fspath(path))

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": v.name, "type": str(v.type)} for v in self.graph.inputs],
            "outputs": [{"name": v.name, "type": str(v.type)} for v in self.graph.outputs],
            "report": self.report,
            "timings": dict(self.timings),
        }

    def __repr__(self) -> str:
        return f"<CompiledModel {self.graph.name}: {len(self.graph)} nodes on {self.options.soc_version}>"


class AsyncRunner:
    """Runs a model's requests on ``jobs`` worker threads with at most ``queue`` requests waiting
    beyond those running (OpenVINO's ``AsyncInferQueue``): :meth:`submit` returns a
    ``concurrent.futures.Future`` and blocks while ``jobs + queue`` requests are in flight, so a
    fast producer cannot pile up unbounded memory. Several threads may submit at once (a model's
    :meth:`CompiledModel.run` is thread-safe). Use it as a context manager, or call :meth:`close`.

    ``callback(result, userdata)`` (optional) is called on the worker thread with each result.
    """

    def __init__(self, model: CompiledModel, jobs: int | None = None, queue: int | None = None, *,
                 callback: Any = None) -> None:
        jobs = _positive("jobs", jobs, os.cpu_count() or 1)
        queue = _positive("queue", queue, 2 * jobs, zero_ok=True)
        self.model, self.jobs, self.queue = model, jobs, queue
        self._callback = callback
        self._slots = threading.BoundedSemaphore(jobs + queue)
        self._pool = ThreadPoolExecutor(jobs, thread_name_prefix="ge-run")
        self._closed = False

    def submit(self, feeds: Mapping[str, Any] | np.ndarray | None = None, *, userdata: Any = None,
               output_names: Sequence[str] | None = None, timeout: float | None = None, **kw: Any) -> Future:
        """Queue one run; returns its Future (its ``result()`` is the outputs dict or raises the
        run's error). Feeds are checked here, so a bad feed raises at once, not in the Future."""
        if self._closed:
            raise InputError("this AsyncRunner is closed", hint="make a new AsyncRunner(model)")
        model = self.model
        wanted = model.check_output_names(output_names)
        checked = model.check_feeds(feeds, **kw)
        _check_timeout(timeout)
        self._slots.acquire()
        try:
            fut = self._pool.submit(self._one, checked, wanted, timeout, userdata)
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _f: self._slots.release())
        return fut

    def _one(self, feeds: dict[str, Any], wanted: list[str] | None, timeout: float | None, userdata: Any):
        out = self.model.run(feeds, output_names=wanted, timeout=timeout)
        if self._callback is not None:
            self._callback(out, userdata)
        return out

    def map(self, feeds: Iterable[Any], **kw: Any) -> list[dict[str, np.ndarray]]:
        """Run every feed (through the bounded queue); the results in the order given."""
        futs = [self.submit(f, **kw) for f in feeds]
        return [f.result() for f in futs]

    def wait_all(self) -> None:
        """Wait until every submitted request has finished."""
        for _ in range(self.jobs + self.queue):
            self._slots.acquire()
        for _ in range(self.jobs + self.queue):
            self._slots.release()

    def close(self, wait: bool = True) -> None:
        self._closed = True
        self._pool.shutdown(wait=wait)

    def __enter__(self) -> AsyncRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _positive(name: str, value: Any, default: int, zero_ok: bool = False) -> int:
    if value is None:
        return default
    low = 0 if zero_ok else 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"AsyncRunner({name}={value!r}): {name} is an integer of at least {low}")
    return int(value)


def _what(v: Any) -> str:
    """``v`` for a message: its repr (shortened) and type."""
    return f"{v!r:.40} ({type(v).__name__})"


def _listed(names: list[Any], most: int = 10) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    ok = isinstance(timeout, (int, float, np.integer, np.floating)) and not isinstance(timeout, bool)
    if not ok or not math.isfinite(float(timeout)) or float(timeout) <= 0:
        raise InputError(f"run(timeout={timeout!r}): the timeout is a positive number of seconds",
                         hint="give e.g. timeout=30, or None for no timeout")
    return float(timeout)


def _as_array(name: str, a: Any, want: np.dtype | None) -> np.ndarray:
    """``a`` as an ndarray for input ``name``, or an InputError saying why it cannot be one.

    Python numbers and (nested, rectangular) lists become arrays of the model's dtype when that
    keeps their values: a float never silently becomes an int, an int never wraps around.
    """
    if isinstance(a, np.ndarray):
        if type(a) is np.ndarray:
            return a
        if isinstance(a, np.ma.MaskedArray):
            raise InputError(f"input '{name}' is a masked array; the model would ignore its mask",
                             hint="feed np.ma.filled(array, fill_value) or the plain data")
        return np.asarray(a)  # np.matrix and other subclasses: their operators mean other things
    if a is None:
        raise InputError(f"input '{name}' is None; the model expects a tensor"
                         + (f" of {want}" if want is not None else ""), hint="feed an array")
    if isinstance(a, (dict, set, frozenset, Mapping)) or callable(a):
        raise InputError(f"input '{name}' is a {type(a).__name__}; the model expects a tensor", hint="feed an array")
    try:
        arr = np.asarray(a)
    except Exception as e:  # ragged lists, objects NumPy refuses
        raise InputError(f"input '{name}' cannot be made into an array: {type(e).__name__}: {e}",
                         hint="feed a NumPy array (nested lists must be rectangular)") from None
    if arr.dtype == np.dtype(object) and (want is None or want != np.dtype(object)):
        raise InputError(f"input '{name}' holds Python objects ({type(a).__name__} of mixed or ragged items), "
                         "not numbers", hint="feed a NumPy array of the model's dtype")
    if want is None or arr.dtype == want:
        return arr
    if arr.dtype.kind in "US" and want.kind not in "USO":
        raise InputError(f"input '{name}' is text; the model expects {want}", hint=f"feed an array of {want}")
    castable = np.can_cast(arr.dtype, want, casting="same_kind") or (arr.dtype.kind in "iu" and want.kind in "iu")
    if want.kind in "USO" or not castable:
        return arr  # the dtype check names the mismatch
    try:
        with np.errstate(all="ignore"):
            cast = arr.astype(want)
    except (TypeError, ValueError, OverflowError):
        return arr
    if want.kind in "iub" and not np.array_equal(cast.astype(arr.dtype), arr):
        raise InputError(f"input '{name}' holds values that {want} cannot represent", hint=f"feed an array of {want}")
    return cast


def _check_strings(name: str, a: np.ndarray) -> None:
    """An object array fed as a string tensor holds only str/bytes (never other Python objects)."""
    for x in a.reshape(-1):
        if not isinstance(x, (str, bytes)):
            raise InputError(f"input '{name}' holds a {type(x).__name__} among its strings",
                             hint="a string input takes an array of str (or bytes)")
