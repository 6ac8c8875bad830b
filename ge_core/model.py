"""The compiled model: graph, schedule, streams, memory plan, report, and the backend's executable."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import InputError
from .ir.graph import Graph
from .memory import MemoryPlan
from .options import CompileOptions
from .schedule import StreamAssignment


class CompiledModel:
    """A model ready to run: ``model.run({"x": array}) -> {"y": array}``.

    Built by :func:`ge_core.compile` or :func:`ge_core.load_om`. Thread-safe: several threads
    may call :meth:`run` at once.
    """

    def __init__(
        self,
        graph: Graph,
        options: CompileOptions,
        *,
        streams: StreamAssignment,
        memory_plan: MemoryPlan | None,
        report: dict[str, Any],
        host=None,
    ) -> None:
        self.graph = graph
        self.options = options
        self.streams = streams
        self.memory_plan = memory_plan
        self.report = report
        self.source: str | None = None
        self._host = host
        self._executable = None
        self._lock = threading.Lock()
        self._keepalive: Any = None  # the mapped .om file whose weights the graph uses

    # ------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

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
        from .plugins import get_host

        host = self._host or get_host()
        regs = host.registries
        backend = regs.backend(self.options.soc_version)
        kernels = regs.kernels_for(backend.name)
        return backend.build(self, kernels, self.options)

    # ------------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any] | np.ndarray | None = None, *, timeout: float | None = None,
            **kw: Any) -> dict[str, np.ndarray]:
        """Run one inference; returns ``{output name: array}`` in graph output order.

        ``feeds`` maps input names to arrays (keyword arguments add to it); a model with exactly
        one input without a default also takes that input's array alone. An input with a default
        (an ONNX initializer listed as a graph input) takes its default when not fed.
        ``timeout`` (seconds) cancels a run that takes longer with an :class:`ExecutionError`
        naming the node it was at (loop kernels check it every iteration); an input literally
        named ``timeout`` is given through the dict.
        """
        checked = self._check_feeds(self._feed_dict(feeds, kw))
        seconds = _check_timeout(timeout)
        executable = self.executable  # built (once) outside the deadline
        from .kernel import run_deadline

        with run_deadline(seconds):
            outs = executable.run(checked)
        return {name: out for name, out in zip(self.output_names, outs)}

    def _feed_dict(self, feeds: Any, kw: dict[str, Any]) -> dict[Any, Any]:
        if feeds is None:
            return dict(kw)
        if isinstance(feeds, Mapping):
            out = dict(feeds)
            out.update(kw)
            return out
        required = [v.name for v in self.graph.inputs if v.default is None]
        if isinstance(feeds, (np.ndarray, np.generic)) and len(required) == 1 and not kw:
            return {required[0]: feeds}
        takes = ", ".join(repr(n) for n in self.input_names[:10]) or "no inputs"
        if len(self.input_names) > 10:
            takes += f" and {len(self.input_names) - 10} more"
        alone = " (a bare array is taken only by a model with exactly one input)" if isinstance(
            feeds, (np.ndarray, np.generic)) else ""
        raise InputError(
            f"run() takes a dict of input name -> array, not a {type(feeds).__name__}{alone}",
            hint=f"call model.run({{name: array, ...}}); the model takes {takes}",
        )

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
                    raise InputError(
                        f"input '{v.name}' has dtype {a.dtype}, the model expects {t.dtype}",
                        hint=f"convert it with .astype(np.{t.dtype})",
                    )
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
            out[v.name] = a
        return out

    @property
    def input_defaults(self) -> dict[str, np.ndarray]:
        """Inputs that may be left out of the feeds, with the value each then takes."""
        return {v.name: v.default for v in self.graph.inputs if v.default is not None}

    # ------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> str:
        """Write the model as an .om file (atomically); returns the path."""
        from .om import save_om

        return save_om(self, os.fspath(path))

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": v.name, "type": str(v.type)} for v in self.graph.inputs],
            "outputs": [{"name": v.name, "type": str(v.type)} for v in self.graph.outputs],
            "report": self.report,
        }

    def __repr__(self) -> str:
        return f"<CompiledModel {self.graph.name}: {len(self.graph)} nodes on {self.options.soc_version}>"


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
