"""The compiled model: graph, schedule, streams, memory plan, report, and the backend's executable."""

from __future__ import annotations

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
    def run(self, feeds: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, np.ndarray]:
        """Run one inference; returns ``{output name: array}`` in graph output order."""
        feeds = dict(feeds or {})
        feeds.update(kw)
        checked = self._check_feeds(feeds)
        outs = self.executable.run(checked)
        return {name: out for name, out in zip(self.output_names, outs)}

    def _check_feeds(self, feeds: dict[str, Any]) -> dict[str, Any]:
        names = self.input_names
        unknown = [k for k in feeds if k not in names]
        missing = [n for n in names if n not in feeds]
        if unknown or missing:
            parts = []
            if missing:
                parts.append(f"missing input(s) {', '.join(repr(m) for m in missing)}")
            if unknown:
                parts.append(f"unknown input(s) {', '.join(repr(u) for u in unknown)}")
            raise InputError(f"{'; '.join(parts)}", hint=f"the model takes {', '.join(repr(n) for n in names) or 'no inputs'}")
        out: dict[str, Any] = {}
        sym: dict[str, int] = {}
        for v in self.graph.inputs:
            a = feeds[v.name]
            if (a is None or isinstance(a, list)) and v.type.dtype is None and v.type.shape is None:
                out[v.name] = a  # a sequence or an empty optional: the IR does not type these yet
                continue
            if not isinstance(a, np.ndarray):
                a = np.asarray(a, dtype=v.type.dtype)
            t = v.type
            if t.dtype is not None and a.dtype != t.dtype:
                if a.dtype.kind == t.dtype.kind == "U" or (t.dtype == np.dtype(object) and a.dtype.kind in "US"):
                    a = a.astype(object)
                else:
                    raise InputError(
                        f"input '{v.name}' has dtype {a.dtype}, the model expects {t.dtype}",
                        hint=f"convert it with .astype(np.{t.dtype})",
                    )
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


