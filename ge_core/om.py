"""Save and load compiled models as .om files.

An .om holds two partitions (see :mod:`ge_core.om_container` for the container):

* ``model``: UTF-8 JSON: the compiled graph (constants by reference), schedule, streams and
  events, memory plan, options, report and the producer's version;
* ``weights``: every constant in one blob, each tensor 64-byte aligned, the partition
  4096-byte aligned, so loading maps it and the constants are views of the file (no copy).
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import __version__
from .errors import GEError, GraphError, OmFormatError, OptionError, UnsupportedOpError
from .ir.verify import verify_graph
from .memory import MAX_ARENA_BYTES, MemoryPlan
from .model import CompiledModel
from .om_container import read_container, write_container
from .options import CompileOptions
from .schedule import StreamAssignment
from .serialize import FORMAT_VERSION, WeightWriter, graph_to_dict, read_graph

MODEL_FORMAT = "ge-model"
MAX_MODEL_JSON = 1 << 30


def model_definition(model: CompiledModel) -> tuple[dict[str, Any], WeightWriter]:
    weights = WeightWriter()
    graph = graph_to_dict(model.graph, weights)
    opts = model.options.as_dict()
    opts.pop("dump_ir", None)
    d = {
        "format": MODEL_FORMAT,
        "version": FORMAT_VERSION,
        "producer": f"ge-python {__version__}",
        "graph": graph,
        "weights": weights.table,
        "streams": model.streams.as_dict(),
        "memory_plan": model.memory_plan.as_dict() if model.memory_plan else None,
        "options": opts,
        "report": model.report,
    }
    return d, weights


def save_om(model: CompiledModel, path: str) -> str:
    if not path:
        raise OptionError("no output path given for the .om file", hint="pass a file name (--output / save(path))")
    try:
        d, weights = model_definition(model)
    except MemoryError:
        raise GraphError(f"cannot save '{path}': the model's constants do not fit in memory",
                      hint="a pass may have folded a huge constant; disable constant folding") from None
    try:
        blob = json.dumps(d, separators=(",", ":"), allow_nan=False, default=_json_default).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise GraphError(f"cannot serialise the model for '{path}': {e}",
                         hint="a node attribute or metadata holds a value an .om cannot store") from e
    write_container(
        path,
        [("model", blob, 8), ("weights", weights.chunks(), 4096)],
        producer=f"ge-python {__version__}",
    )
    return path


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


def read_model_definition(path: str, container) -> dict[str, Any]:
    raw = container.partition("model")
    if len(raw) > MAX_MODEL_JSON:
        raise OmFormatError(f"'{path}': the model definition is larger than {MAX_MODEL_JSON} bytes")
    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise OmFormatError(f"'{path}': the model definition is not valid JSON ({type(e).__name__})",
                            hint="re-create the file with `ge compile`") from None
    if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT:
        raise OmFormatError(f"'{path}': the model partition is not a ge model definition",
                            hint="re-create the file with `ge compile`")
    v = d.get("version")
    if not isinstance(v, int) or v > FORMAT_VERSION or v < 1:
        raise OmFormatError(f"'{path}': model definition version {v!r} is not supported by this ge ({FORMAT_VERSION})",
                            hint="upgrade ge or re-create the file with this version")
    return d


def load_om(path: str | os.PathLike, *, host=None, verify_checksums: bool = True) -> CompiledModel:
    """Load an .om file; everything is validated before use. Weights stay memory-mapped."""
    from .plugins import get_host

    path = os.fspath(path)
    container = read_container(path, verify_checksums=verify_checksums)
    try:
        d = read_model_definition(path, container)
        if "weights" not in container:
            raise OmFormatError(f"'{path}' has no weights partition", hint="re-create it with `ge compile`")
        blob = container.partition("weights")
        graph = read_graph(d.get("graph"), d.get("weights", []), blob, f"'{path}'")
        host = host or get_host()
        try:  # every node names a registered op with a valid arity, before a backend sees it
            verify_graph(graph, op_registry=host.registries.ops)
        except UnsupportedOpError:
            raise  # the op's plugin is missing here, or a node has the wrong number of inputs
        except GEError as e:
            raise OmFormatError(f"'{path}': the stored graph is invalid: {e}",
                                hint="re-create it with `ge compile` (with the plugins it needs installed)") from None
        n = len(graph)
        streams = _read_streams(d.get("streams"), n, path)
        plan = _read_plan(d.get("memory_plan"), path)
        try:
            raw_opts = d.get("options") or {}
            if not isinstance(raw_opts, dict):
                raise OmFormatError(f"'{path}': stored options are not an object")
            known = {k: raw_opts[k] for k in CompileOptions.__dataclass_fields__ if k in raw_opts and k not in ("config", "fusion_switch_file")}
            options = CompileOptions.from_any(known)
        except GEError as e:
            raise OmFormatError(f"'{path}': stored compile options are invalid: {e}") from None
        report: dict[str, Any] = d["report"] if isinstance(d.get("report"), dict) else {}
        model = CompiledModel(graph, options, streams=streams, memory_plan=plan, report=report, host=host)
        model.source = path
        model._keepalive = container
        _ = model.executable  # build now so a broken model fails at load, not at first run
        return model
    except BaseException:
        container.close()
        raise


def _read_streams(d: Any, n: int, path: str) -> StreamAssignment:
    if d is None:
        return StreamAssignment.single(n)
    bad = OmFormatError(f"'{path}': the stream assignment is invalid", hint="re-create it with `ge compile`")
    if not isinstance(d, dict):
        raise bad
    streams, events = d.get("streams", []), d.get("events", [])
    if not isinstance(streams, list) or len(streams) != n or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1024 for s in streams):
        raise bad
    if not isinstance(events, list):
        raise bad
    ev = []
    for e in events:
        if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, int) and 0 <= x < n for x in e) and e[0] < e[1]):
            raise bad
        ev.append((e[0], e[1]))
    return StreamAssignment(streams, ev)


def _read_plan(d: Any, path: str) -> MemoryPlan | None:
    if d is None:
        return None
    bad = OmFormatError(f"'{path}': the memory plan is invalid", hint="re-create it with `ge compile`")
    if not isinstance(d, dict):
        raise bad
    offsets, arena = d.get("offsets", {}), d.get("arena_bytes", 0)
    if not isinstance(offsets, dict) or not isinstance(arena, int) or not 0 <= arena < MAX_ARENA_BYTES:
        raise bad
    for v in offsets.values():
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= arena:
            raise bad
    return MemoryPlan(dict(offsets), arena, str(d.get("planner", "")))


def inspect_om(path: str) -> dict[str, Any]:
    """A JSON-able description: container header and partitions, model summary and report."""
    from .om_container import describe

    info: dict[str, Any] = {"file": describe(path)}
    with read_container(path) as c:
        d = read_model_definition(path, c)
    g: dict[str, Any] = d["graph"] if isinstance(d.get("graph"), dict) else {}
    nodes = g.get("nodes", []) if isinstance(g.get("nodes"), list) else []
    info["model"] = {
        "producer": d.get("producer"),
        "inputs": g.get("inputs"),
        "outputs": g.get("outputs"),
        "nodes": len(nodes),
        "constants": len(g["constants"]) if isinstance(g.get("constants"), list) else 0,
        "opset_imports": g.get("opset_imports"),
        "soc_version": d["options"].get("soc_version") if isinstance(d.get("options"), dict) else None,
    }
    info["report"] = d.get("report")
    info["streams"] = d.get("streams", {})
    return info
