"""Save and load compiled models as .om files.

An .om holds two partitions (see :mod:`ge_core.om_container` for the container):

* ``model``: UTF-8 JSON: the compiled graph (constants by reference), schedule, streams and
  events, memory plan, options, report and the producer's version;
* ``weights``: every constant in one blob, each tensor 64-byte aligned, the partition
  4096-byte aligned. Loading reads the file once into private anonymous memory (page aligned,
  so the alignment holds in memory) and the constants are read-only views of that snapshot (no
  further copy); the loaded model does not depend on the file afterwards.

A plugin may define another kind of .om, one whose container holds a partition of its own
(``ge_register_om_kinds``: ge_atc's gear models, partition ``gears``); :func:`load_om`,
:func:`ge_sdk.omdesc.inspect_om` and :func:`stored_definition` hand such a file to its :class:`OmKind`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from . import cache
from .errors import (
    GEError,
    GraphError,
    ModelFileError,
    OmFormatError,
    OptionError,
    PluginError,
    UnsupportedOpError,
    reraise_interrupt,
)
from .ir.graph import Graph
from .ir.verify import verify_graph
from .memory import MAX_ORDERS, MemoryPlan, SymbolicPlan, dim_ranges, memory_problem, verify_plan, verify_symbolic_plan
from .model import CompiledModel
from .om_container import (
    CORE_PARTITIONS,
    Container,
    OmKind,
    anonymous_buffer,
    read_container,
    read_file_into,
    read_partition,
    write_container,
    write_file_atomic,
)
from .options import CompileOptions
from .schedule import StreamAssignment, verify_streams
from .serialize import FORMAT_VERSION, LIMITS, WeightWriter, dump_definition, graph_to_dict, load_definition, read_graph
from .version import __version__
from .writes import COMPANIONS, fsync_directory

if TYPE_CHECKING:
    from .plugins import PluginHost

MODEL_FORMAT = "ge-model"
MAX_MODEL_JSON = LIMITS.model_json_bytes

_RECREATE = "re-create it with `ge compile`"


def model_definition(model: CompiledModel, weights: WeightWriter | None = None) -> tuple[dict[str, Any], WeightWriter]:
    """The JSON definition of ``model`` and the writer holding its constants (``weights``: one
    shared by several models, as the gears of ge_atc's gear models share theirs)."""
    weights = weights if weights is not None else WeightWriter()
    graph = graph_to_dict(model.graph, weights)
    opts = model.options.as_dict()
    opts.pop("dump_ir", None)
    streams = model.streams.as_dict()
    if any(not 0 <= s < LIMITS.streams for s in streams["streams"]):
        raise GraphError(f"the schedule uses stream {max(streams['streams'])}; an .om holds stream ids 0.."
                         f"{LIMITS.streams - 1} (limit streams)", hint="lower the option max_streams")
    d = {"format": MODEL_FORMAT, "version": FORMAT_VERSION, "producer": f"ge-python {__version__}", "graph": graph,
         "weights": weights.table, "streams": streams,
         "memory_plan": model.memory_plan.as_dict() if model.memory_plan else None, "options": opts,
         "report": model.report}
    return d, weights


def external_weight_files(path: str) -> list[str]:
    """The external weight files an .om at ``path`` names (best effort: [] when unreadable).
    Reads only the header, the partition table and the model partition."""
    folder = os.path.dirname(os.path.abspath(path))
    out: list[str] = []
    try:
        raw = read_partition(path, "model", max_size=MAX_MODEL_JSON)
        d = load_definition(raw, path) if raw is not None else None
        files = (d.get("external_weights") or {}).get("files") if isinstance(d, dict) else None
        for f in files if isinstance(files, list) else []:
            rel = f.get("path") if isinstance(f, dict) else None
            if isinstance(rel, str) and rel and "\0" not in rel:
                out.append(os.path.join(folder, *rel.split("/")))
    except Exception:  # a damaged .om: its loader says what is wrong
        pass
    return out


COMPANIONS[".om"] = external_weight_files  # what a command reads with an .om (ge_core.writes)


def type_conflict(graph: Graph, ops) -> str | None:
    """The first node output whose type contradicts what its op infers from the node's inputs
    (a known dtype, rank or dim that differs), or None. The memory plan is checked against these
    types, so a stored type must be what inference gives, not just any type. Inference runs on a
    copy; a node whose inference fails or is absent is not compared."""

    def walk(orig: Graph, cp: Graph) -> str | None:
        for n0, n1 in zip(orig.nodes, cp.nodes):
            for s0, s1 in zip(n0.subgraphs(), n1.subgraphs()):
                found = walk(s0, s1)
                if found:
                    return found
            try:
                ops.infer_node(n1, graph.opset_imports)
            except GEError:
                continue
            for v0, v1 in zip(n0.outputs, n1.outputs):
                a, b = v0.type, v1.type
                bad = a.dtype is not None and b.dtype is not None and a.dtype != b.dtype
                if a.shape is not None and b.shape is not None:
                    bad = bad or len(a.shape) != len(b.shape) or any(
                        isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a.shape, b.shape))
                if bad:
                    return f"output '{v0.name}' of {n0.describe()} is {a}, but its op infers {b} from its inputs"
        return None

    return walk(graph, graph.copy())


_TYPES_OK = b"types agree with inference\n"
#: constants whose values (not only their shapes) may steer type inference: integer and bool
#: tensors (shapes, axes, indices, conditions) and small float ones (Resize's scales, Range's
#: bounds); a larger float tensor (a weight) reaches inference only through its dtype and shape
_SMALL = 64


def types_verdict_key(model_bytes: memoryview, graph: Graph, host) -> str:
    """The cache key under which the verdict of :func:`type_conflict` on this model is kept (the
    user's cache, :mod:`ge_core.cache`): the SHA-256 of the model definition's bytes, of every
    constant whose values may steer inference, and of the installed plugins (name, distribution,
    version) and this ge's version. Only a model that passed is recorded, and another process
    skips the check only for the same bytes under the same plugins."""
    h = hashlib.sha256(b"om-types-1\0" + __version__.encode() + b"\0")
    for name, info in sorted(host.info.items()):
        h.update(f"{name}={info.distribution}:{info.version}:{info.loaded}\0".encode())
    h.update(model_bytes)
    for v in graph.all_constants():
        a = v.const_value
        if a is None:
            continue
        if a.dtype.kind in "biu" or a.size <= _SMALL or a.dtype.kind not in "fc":
            h.update(f"{v.name}\0{a.dtype.str}\0{a.shape}\0".encode())
            h.update(np.ascontiguousarray(a).tobytes() if a.dtype.kind != "O" else repr(a.tolist()).encode())
    return "omtypes_" + h.hexdigest()[:40]


def save_om(model: CompiledModel, path: str, *, external_weight: int = 0) -> str:
    """Write ``model`` to ``path``. ``external_weight`` (ATC's ``--external_weight``): 0 keeps the
    weights in the .om; 1 writes one file per weight, 2 one merged file, in a ``weight`` folder
    beside the .om, which then names them by relative path (with size and CRC32), under names
    unique to this .om's file name and this save (:func:`weight_file_prefix`).

    A save over an existing model never leaves it broken: everything new is written under new
    names first, the .om is switched atomically, and only then are the previous version's weight
    files removed (:class:`ModelFileSave`). A failure before the switch leaves the previous model
    complete and removes what the save wrote."""
    if external_weight not in (0, 1, 2):
        raise OptionError(f"external_weight must be 0, 1 or 2, not {external_weight!r:.20}")
    if not path:
        raise OptionError("no output path given for the .om file", hint="pass a file name (--output / save(path))")
    d, weights = checked_definition(model, path)
    data: Any = weights.chunks()
    with ModelFileSave(path) as save:  # the old model, or the new one, is complete at every point
        if external_weight:
            d["external_weights"] = save.external_weights(weights, external_weight)
            data = b""
        blob = dump_definition(d, f"'{path}'")
        write_container(path, [("model", blob, 8), ("weights", data, 4096)], producer=f"ge-python {__version__}")
    remember_types_checked(blob, model.graph, model.host)
    return path


def checked_definition(model: CompiledModel, path: str,
                       weights: WeightWriter | None = None) -> tuple[dict[str, Any], WeightWriter]:
    """:func:`model_definition` of a model about to be saved at ``path``, its stored types first
    checked against inference (the loader would refuse a conflict: say so now, naming the node)."""
    conflict = type_conflict(model.graph, model.registries.ops)
    if conflict:
        raise GraphError(f"cannot save '{path}': {conflict}",
                         hint="a pass or plugin set a wrong output type; run with verify_each_pass to find which")
    try:
        return model_definition(model, weights)
    except MemoryError:
        raise GraphError(f"cannot save '{path}': the model's constants do not fit in memory",
                      hint="a pass may have folded a huge constant; disable constant folding") from None
    except GraphError as e:
        raise GraphError(f"cannot save '{path}': {e.detail}", hint=e.hint) from None


def remember_types_checked(blob: bytes, graph: Graph, host) -> None:
    """Record that the definition ``blob`` of ``graph`` was just type-checked (by its save): a
    load of these bytes on this machine need not do it again."""
    cache.write_data(types_verdict_key(memoryview(blob), graph, host), _TYPES_OK)


#: The folder beside an .om that holds its external weight files, and how many files one may name.
WEIGHT_DIR = "weight"
MAX_WEIGHT_FILES = 1 << 16
_SAFE_PART = re.compile(r"[A-Za-z0-9_.-]{1,200}")
#: In memory, each external weight file starts at a multiple of this (a tensor's alignment in a blob).
_PART_ALIGNMENT = 64


def _legacy_stem(path: str) -> str:
    """The stem ge up to 0.1 named weight files by (``weight/<stem>.weights.bin``, ``<stem>.w<i>.bin``):
    not unique (``a b.om`` and ``a_b.om``, ``m.om`` and ``m`` share it); kept to recognise them."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.splitext(os.path.basename(path))[0]) or "model"


def weight_file_prefix(path: str) -> str:
    """The prefix of the weight files of the .om at ``path``, unique to its full file name: the
    readable stem (cut to 64 characters) then ``-`` and 12 hex digits of the SHA-256 of the file
    name (``m.om`` -> ``m-3f1c...``). Files of two .om files in one folder never share a name."""
    base = os.path.basename(os.path.abspath(path))
    tag = hashlib.sha256(os.fsencode(base)).hexdigest()[:12]
    return f"{_legacy_stem(path)[:64]}-{tag}"


def _owned_name(path: str, name: str) -> bool:
    """Whether ``name`` (a file in ``weight/``) is one ge writes for the .om at ``path``: a
    version of this name's files (``<prefix>.<8 hex>.weights.bin`` / ``.w<i>.bin``) or the name
    an older ge gave (``<stem>.weights.bin`` / ``<stem>.w<i>.bin``, possibly shared with another
    model of the same stem: see :func:`_referenced_elsewhere`)."""
    ours = re.escape(weight_file_prefix(path)) + r"\.[0-9a-f]{8}\.(?:weights|w[0-9]+)\.bin"
    legacy = re.escape(_legacy_stem(path)) + r"\.(?:weights|w[0-9]+)\.bin"
    return bool(re.fullmatch(ours, name) or re.fullmatch(legacy, name))


def _listed_weight_files(raw: Any) -> list[str]:
    """The relative paths an .om's model definition bytes name as external weight files."""
    try:
        d = load_definition(raw, "a model being replaced")
    except GEError:
        return []
    ext = d.get("external_weights") if isinstance(d, dict) else None
    files = ext.get("files") if isinstance(ext, dict) else None
    if not isinstance(files, list):
        return []
    return [f["path"] for f in files[:MAX_WEIGHT_FILES] if isinstance(f, dict) and isinstance(f.get("path"), str)]


def _referenced_elsewhere(path: str, rels: set[str]) -> set[str]:
    """Those of ``rels`` that another .om in the folder of ``path`` names (a copy of it, or a
    model an older ge gave the same weight file names). Only .om headers and model partitions
    are read; a quoted occurrence counts, so in doubt a file is kept."""
    folder = os.path.dirname(os.path.abspath(path))
    me = os.path.normcase(os.path.abspath(path))
    keep: set[str] = set()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return set(rels)
    for entry in entries:
        try:
            if os.path.normcase(entry.path) == me or not entry.is_file(follow_symlinks=False):
                continue
            raw = read_partition(entry.path, "model", max_size=MAX_MODEL_JSON)
        except (OSError, GEError):
            continue
        if raw:
            keep.update(r for r in rels if f'"{r}"'.encode() in raw)
    return keep


class ModelFileSave:
    """One save of an .om at ``path`` that leaves, at every point, either the model that was
    there or the new one complete, and never touches another model's files.

    New external weight files get names no earlier version used (:func:`weight_file_prefix`, a
    random 8-hex-digit version, written to a temporary name, fsynced, renamed); then the .om is
    written atomically (:func:`write_container`) and only after that switch are the previous
    version's weight files removed (those :func:`_owned_name` says this name owns and no other .om
    in the folder names). On a failure before the switch the new files are removed and the
    previous model is as it was. Use as a context manager around the container write::

        with ModelFileSave(path) as save:
            if mode:
                d["external_weights"] = save.external_weights(weights, mode)
            write_container(path, ...)
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.folder = os.path.dirname(os.path.abspath(path))
        self.written: list[str] = []
        self.old: list[str] = []
        raw = None
        try:
            if os.path.lexists(path):
                raw = read_partition(path, "model", max_size=MAX_MODEL_JSON)
        except GEError:  # not a file we can read: nothing of ours to clean up
            raw = None
        if raw:
            self.old = _listed_weight_files(raw)

    def external_weights(self, weights: WeightWriter, mode: int) -> dict[str, Any]:
        """Write the weights beside the .om (``weight/``): mode 1 one file per weight (table
        entries name their file with ``part``, offset 0), mode 2 one merged file (the blob the
        weights partition would hold). Returns the definition's ``external_weights`` section."""
        wdir = os.path.join(self.folder, WEIGHT_DIR)
        try:
            os.makedirs(wdir, exist_ok=True)
        except OSError as e:
            raise ModelFileError(f"cannot create the weight folder beside {self.path}: {e.strerror or e}") from e
        prefix = weight_file_prefix(self.path)
        taken = {os.path.basename(r) for r in self.old}
        for _ in range(100):
            version = secrets.token_hex(4)
            if not any(n.startswith(f"{prefix}.{version}.") for n in taken) and not os.path.exists(
                    os.path.join(wdir, f"{prefix}.{version}.weights.bin")):
                break
        files = []

        def write(rel: str, chunks: Any) -> None:
            full = os.path.join(self.folder, rel)
            self.written.append(full)  # before the write: a failure after the rename still removes it
            size, crc = write_file_atomic(full, chunks)
            files.append({"path": rel, "size": size, "crc32": f"{crc:08x}"})

        if mode == 2:
            write(f"{WEIGHT_DIR}/{prefix}.{version}.weights.bin", weights.chunks())
        else:
            for i, (entry, a) in enumerate(zip(weights.table, weights.arrays)):
                if "offset" not in entry:
                    continue  # strings live in the definition
                raw = a.tobytes() if not a.ndim else np.ascontiguousarray(a).reshape(-1).view(np.uint8).data
                entry["part"], entry["offset"] = len(files), 0
                write(f"{WEIGHT_DIR}/{prefix}.{version}.w{i}.bin", [raw])
        fsync_directory(wdir)  # the new files are durable before the .om that names them
        return {"mode": mode, "files": files}

    def __enter__(self) -> ModelFileSave:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            if self.written and self._switched():
                return  # interrupted after the switch (a Ctrl-C in the last fsync): the files are in use
            for full in self.written:  # names no one else uses: this save's, never switched to
                try:
                    os.unlink(full)
                except OSError:
                    pass
            return
        self.remove_previous()

    def _switched(self) -> bool:
        """Whether the .om at the path now names a file this save wrote."""
        try:
            raw = read_partition(self.path, "model", max_size=MAX_MODEL_JSON)
        except GEError:
            return False
        mine = {os.path.normcase(os.path.abspath(f)) for f in self.written}
        return bool(raw) and any(os.path.normcase(os.path.join(self.folder, *r.split("/"))) in mine
                                 for r in _listed_weight_files(raw))

    def remove_previous(self) -> None:
        """Remove the weight files of the version this save replaced (after the switch)."""
        new = {os.path.normcase(os.path.abspath(f)) for f in self.written}
        doomed = set()
        for rel in self.old:
            parts = rel.split("/")
            if len(parts) != 2 or parts[0] != WEIGHT_DIR or not _owned_name(self.path, parts[1]):
                continue  # a file ge did not name for this model: never ours to remove
            full = os.path.join(self.folder, WEIGHT_DIR, parts[1])
            if os.path.normcase(os.path.abspath(full)) not in new and not os.path.islink(full):
                doomed.add(rel)
        if doomed:
            doomed -= _referenced_elsewhere(self.path, doomed)
        for rel in sorted(doomed):
            try:
                os.unlink(os.path.join(self.folder, *rel.split("/")))
            except OSError:
                pass  # an orphan left behind is harmless


def _external_path(om_path: str, rel: Any, i: int) -> str:
    """The full path of external weight file ``rel`` of ``om_path``: a relative path inside the
    .om's folder (no absolute path, no ``..``, no link leading out); else OmFormatError."""
    bad = f"'{om_path}': external weight file #{i} "
    if not isinstance(rel, str) or not rel or len(rel) > 1024:
        raise OmFormatError(bad + "has no valid path", hint=_RECREATE)
    parts = rel.split("/")
    if os.path.isabs(rel) or "\\" in rel or any(p in ("", ".", "..") or not _SAFE_PART.fullmatch(p) for p in parts):
        raise OmFormatError(bad + f"'{rel[:80]}' is not a relative path inside the model's folder",
                            hint="an .om names its weight files relative to itself; this file was not written by atc")
    folder = os.path.realpath(os.path.dirname(os.path.abspath(om_path)))
    full = os.path.join(folder, *parts)
    if not os.path.realpath(full).startswith(folder + os.sep):
        raise OmFormatError(bad + f"'{rel[:80]}' leads out of the model's folder (a link)",
                            hint="keep the weight files as atc wrote them beside the .om")
    return full


def weight_buffers(path: str, d: dict[str, Any], container, verify_checksums: bool = True) -> Any:
    """The weights' bytes of an .om: its weights partition, or (``external_weights``) the
    external files, each read once into private memory (one buffer for all, each file 64-byte
    aligned in it) and checked for its recorded size and CRC32 on the bytes read. Like the
    container, the result is a snapshot: later changes to the files do not reach it."""
    ext = d.get("external_weights")
    if ext is None:
        return container.partition("weights")
    files = ext.get("files") if isinstance(ext, dict) else None
    if ext.get("mode") not in (1, 2) or not isinstance(files, list) or len(files) > MAX_WEIGHT_FILES:
        raise OmFormatError(f"'{path}': the external weights section is invalid", hint=_RECREATE)
    hint_copy = "external weights live beside the .om (folder 'weight'): copy them with it"
    specs: list[tuple[str, str, int, str]] = []
    seen: set[str] = set()
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            raise OmFormatError(f"'{path}': external weight file #{i} is not described", hint=_RECREATE)
        full = _external_path(path, f.get("path"), i)
        size, crc = f.get("size"), f.get("crc32")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or not (
                isinstance(crc, str) and re.fullmatch(r"[0-9a-f]{8}", crc)):
            raise OmFormatError(f"'{path}': external weight file '{f.get('path')}' has no valid size and crc32",
                                hint=_RECREATE)
        key = os.path.normcase(os.path.realpath(full))
        if key in seen:
            raise OmFormatError(f"'{path}': external weight file '{f['path']}' is named twice", hint=_RECREATE)
        seen.add(key)
        specs.append((f["path"], full, size, crc))

    def wrong_size(rel: str, got: int, size: int) -> OmFormatError:
        return OmFormatError(f"'{path}': weight file '{rel}' is {got} bytes, the model expects {size}",
                             hint="the weight files were swapped, truncated or come from another build; "
                                  "copy the ones atc wrote with this .om")

    # sizes first (a stat each): no buffer is sized by what the definition claims alone
    for rel, full, size, _ in specs:
        try:
            got = os.stat(full).st_size
        except OSError as e:
            raise ModelFileError(f"'{path}': its weight file '{rel}' cannot be read: {e.strerror or e}",
                                 hint=hint_copy) from None
        if got != size:
            raise wrong_size(rel, got, size)
    offsets, total = [], 0
    for _, _, size, _ in specs:
        offsets.append(total)
        total += -(-size // _PART_ALIGNMENT) * _PART_ALIGNMENT
    buf = anonymous_buffer(total, path) if total else None
    whole = memoryview(buf) if buf is not None else memoryview(b"")
    parts: list[Any] = []
    for (rel, full, size, crc), at in zip(specs, offsets):
        view = whole[at:at + size]
        try:
            got = read_file_into(full, view)
        except ModelFileError as e:
            raise ModelFileError(f"'{path}': its weight file '{rel}' cannot be read: {e.detail}",
                                 hint=e.hint if "changed while" in e.detail else hint_copy) from None
        if got != size:
            raise wrong_size(rel, got, size)
        if verify_checksums and f"{zlib.crc32(view):08x}" != crc:
            raise OmFormatError(f"'{path}': weight file '{rel}' does not match its checksum (crc32 {crc})",
                                hint="the weight files were swapped or changed; copy the ones atc wrote with this .om")
        parts.append(view.toreadonly())
    return parts


#: Sections of a model definition and the JSON types they may have (None: may be absent/null).
_SECTIONS: dict[str, tuple[type, ...]] = {
    "graph": (dict,), "weights": (list,), "streams": (dict, type(None)), "memory_plan": (dict, type(None)),
    "options": (dict,), "report": (dict,), "producer": (str,), "external_weights": (dict,),
}


def read_model_definition(path: str, container, raw: Any = None) -> dict[str, Any]:
    """The model definition of an open container (or the bytes ``raw``: say, one gear's):
    JSON within the .om limits, known format and version, each section of its JSON type and the
    report well typed; else OmFormatError."""
    d = load_definition(container.partition("model") if raw is None else raw, f"'{path}'")
    if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT:
        raise OmFormatError(f"'{path}': the model partition is not a ge model definition", hint=_RECREATE)
    v = d.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or v > FORMAT_VERSION or v < 1:
        raise OmFormatError(f"'{path}': model definition version {v!r:.20} is not supported by this ge ({FORMAT_VERSION})",
                            hint="upgrade ge or re-create the file with this version")
    for key, types in _SECTIONS.items():
        if key in d and not isinstance(d[key], types):
            raise OmFormatError(f"'{path}': the model definition's '{key}' is a {type(d[key]).__name__}, "
                                f"not {' or '.join('null' if t is type(None) else _JSON_NAMES[t] for t in types)}",
                                hint=_RECREATE)
    problem = report_problem(d.get("report", {}))
    if problem:
        raise OmFormatError(f"'{path}': the stored compile report is invalid: {problem}", hint=_RECREATE)
    return d


_JSON_NAMES: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}

#: Compile report keys (see ARCHITECTURE.md) and what each holds; more keys may be added.
_COUNT, _NUMBER, _TEXT, _OBJECT, _ARRAY = "count", "number", "text", "object", "array"
_REPORT_KEYS = {"nodes_before": _COUNT, "nodes_after": _COUNT, "kernels": _COUNT, "op_counts": _OBJECT,
                "passes": _ARRAY, "memory": _OBJECT, "streams": _OBJECT, "backend": _TEXT,
                "compile_seconds": _NUMBER, "kernel_modes": _OBJECT, "pass_failures": _ARRAY,
                "native_kernels": _OBJECT, "node_kernels": _OBJECT}
_MEMORY_KEYS = {"arena_bytes": _COUNT, "lower_bound_bytes": _COUNT, "no_reuse_bytes": _COUNT,
                "weights_bytes": _COUNT, "planner": _TEXT, "alignment": _COUNT, "dynamic_buffers": _COUNT,
                "shared_values": _OBJECT, "planner_candidates": _OBJECT}
_STREAM_KEYS = {"count": _COUNT, "events": _COUNT}


def _kind_ok(v: Any, kind: str) -> bool:
    if kind == _COUNT:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0
    if kind == _NUMBER:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
    if kind == _TEXT:
        return v is None or isinstance(v, str)
    if kind == _OBJECT:
        return isinstance(v, dict)
    return isinstance(v, list)


def report_problem(report: Any) -> str | None:
    """What is wrong with a stored compile report's known keys (their types), or None."""
    if not isinstance(report, dict):
        return "it is not an object"
    for table, keys, prefix in ((report, _REPORT_KEYS, ""), (report.get("memory"), _MEMORY_KEYS, "memory."),
                                (report.get("streams"), _STREAM_KEYS, "streams.")):
        if not isinstance(table, dict):
            continue
        for k, kind in keys.items():
            if k in table and not _kind_ok(table[k], kind):
                return f"'{prefix}{k}' is {table[k]!r:.40}, not a{'n' if kind[0] in 'ao' else ''} {kind}"
    ops = report.get("op_counts", {})
    if not all(_kind_ok(n, _COUNT) for n in ops.values()):
        return "'op_counts' must map op names to counts"
    if not all(isinstance(p, dict) for p in report.get("passes", [])):
        return "'passes' must be an array of objects"
    return None


def _stored(what: str, path: str, e: GEError) -> OmFormatError:
    return OmFormatError(f"'{path}': the stored {what} is invalid: {e.detail}", hint=_RECREATE)


#: Partitions a built-in plugin reads, named when that plugin is missing (or disabled).
PLUGIN_PARTITIONS = {"gears": "ge_atc (gear models: atc --dynamic_batch_size, --dynamic_image_size, --dynamic_dims)"}


def om_kind(path: str, container: Container, host: PluginHost) -> tuple[str, OmKind, str] | None:
    """The (partition, kind, its plugin) that reads the open ``container``, or None for a model
    the core reads. A partition a built-in plugin reads (:data:`PLUGIN_PARTITIONS`) with that plugin
    missing is a ModelFileError naming the plugin; any other partition is ignored."""
    extra = [k for k in container.kinds() if k not in CORE_PARTITIONS]
    if not extra:
        return None
    kinds = host.registries.om_kinds
    for part in extra:
        kind = kinds.get(part)
        if kind is not None:
            return part, kind, kinds.origin(part) or "?"
    for part in extra:
        if part in PLUGIN_PARTITIONS:
            raise ModelFileError(f"'{path}' holds a '{part}' partition, which no installed plugin reads: it needs "
                                 f"the plugin {PLUGIN_PARTITIONS[part]}",
                                 hint="install it, or take it out of GE_DISABLE_PLUGINS")
    return None


def call_kind(found: tuple[str, OmKind, str], path: str, method: str, *args: Any) -> Any:
    """``kind.<method>(path, container, ...)`` of :func:`om_kind`'s answer; anything but a
    GEError it raises is a PluginError naming the plugin, the file and the partition."""
    part, kind, plugin = found
    try:
        return getattr(kind, method)(path, *args)
    except GEError:
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit in a plugin must not end the host
        reraise_interrupt(e)
        raise PluginError(f"plugin '{plugin}' failed to {method} '{path}' (its '{part}' partition): "
                          f"{type(e).__name__}: {e}", hint="this is a bug in the plugin; please report it with the file") from e


def load_om(path: str | os.PathLike, *, host: PluginHost, verify_checksums: bool = True,
            run_options: dict[str, Any] | None = None) -> CompiledModel:
    """Load an .om file; everything is validated before use. The file (and its external weight
    files) is read once into private memory: the model is a snapshot that later changes to the
    files cannot reach (``docs/security.md``, "When a loaded model's files change").
    ``run_options`` (threads, executor, ...) replace the stored ones before the executable is
    built (once). A plugin's kind of .om (:class:`OmKind`) gives the model its ``load`` builds.

    What the file stores is checked as the compiler checks what it computes: the graph
    (:func:`verify_graph` with the registered ops), the options (as user options), the stream
    assignment (:func:`verify_streams`) and the memory plan (:func:`verify_plan` against the
    memory problem rebuilt from the loaded graph, as the compiler builds it).
    """
    path = os.fspath(path)
    container = read_container(path, verify_checksums=verify_checksums)
    try:
        found = om_kind(path, container, host)
        if found:
            return call_kind(found, path, "load", container, host, verify_checksums, run_options)
        d = read_model_definition(path, container)
        if "weights" not in container:
            raise OmFormatError(f"'{path}' has no weights partition", hint=_RECREATE)
        blob = weight_buffers(path, d, container, verify_checksums)
        return model_from_definition(path, d, container.partition("model"), blob, container, host, run_options)
    except BaseException:
        container.close()
        raise


def model_from_definition(path: str, d: dict[str, Any], raw: Any, blob: Any, container, host,
                          run_options: dict[str, Any] | None = None) -> CompiledModel:
    """The model of the definition ``d`` (read from the bytes ``raw``, its constants in ``blob``
    of the open ``container``), verified as :func:`load_om` says, its executable built."""
    graph = read_graph(d.get("graph"), d.get("weights", []), blob, f"'{path}'")
    regs = host.registries
    try:  # every node names a registered op with a valid arity, before a backend sees it
        verify_graph(graph, op_registry=regs.ops)
    except UnsupportedOpError:
        raise  # the op's plugin is missing here, or a node has the wrong number of inputs
    except GEError as e:
        raise OmFormatError(f"'{path}': the stored graph is invalid: {e}",
                            hint="re-create it with `ge compile` (with the plugins it needs installed)") from None
    verdict = types_verdict_key(raw, graph, host)
    if cache.read_data(verdict) != _TYPES_OK:
        conflict = type_conflict(graph, regs.ops)
        if conflict:
            raise OmFormatError(f"'{path}': the stored graph is invalid: {conflict}", hint=_RECREATE)
        cache.write_data(verdict, _TYPES_OK)
    try:
        options = CompileOptions.from_dict(d.get("options") or {}, regs.options)
    except OptionError as e:
        raise OmFormatError(f"'{path}': the stored compile options are invalid: {e.detail}",
                            hint="re-create it with `ge compile` (with the plugins whose options it uses installed)") from None
    order = graph.node_list()
    streams = read_streams(d.get("streams"), len(order), path)
    try:
        verify_streams(order, streams)
    except GEError as e:
        raise _stored("stream assignment", path, e) from None
    plan = read_plan(d.get("memory_plan"), path)
    if plan is not None:
        try:
            problem = memory_problem(graph, order, streams, options, regs)
            dim_ranges(graph)  # the input symbols' ranges: a table of ints, or refused
            if isinstance(plan, SymbolicPlan):
                verify_symbolic_plan(problem, plan)
            else:
                verify_plan(problem, plan)
        except GEError as e:
            raise _stored("memory plan", path, e) from None
    model = CompiledModel(graph, options, streams=streams, memory_plan=plan, report=d.get("report", {}), host=host)
    model.source = path
    model.keepalive = container
    if run_options:  # applied before the one build (threads, executor, ...): checked like set_run_options
        try:
            model.options = model.merged_run_options(**run_options)
        except OptionError as e:
            raise OptionError(f"load_om('{path}'): {e.detail}", hint=e.hint) from None
    try:
        _ = model.executable  # build now so a broken model fails at load, not at first run
    except OptionError as e:  # e.g. a stored plugin option the backend refuses
        if run_options:  # or one the caller gave
            raise OptionError(f"load_om('{path}'): {e.detail}", hint=e.hint) from None
        raise OmFormatError(f"'{path}': the stored compile options are invalid: {e.detail}",
                            hint=e.hint or _RECREATE) from None
    return model


def read_streams(d: Any, n: int, path: str) -> StreamAssignment:
    """The stored stream assignment of ``n`` nodes, well formed (ids below the limit, events as
    index pairs); :func:`verify_streams` then checks that it orders every dependency."""
    if d is None:
        return StreamAssignment.single(n)
    bad = OmFormatError(f"'{path}': the stream assignment is invalid", hint=_RECREATE)
    if not isinstance(d, dict):
        raise bad
    streams, events = d.get("streams", []), d.get("events", [])
    if not isinstance(streams, list) or len(streams) != n or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < LIMITS.streams for s in streams):
        raise OmFormatError(f"'{path}': the stream assignment is invalid: it must give each of the {n} nodes a "
                            f"stream id 0..{LIMITS.streams - 1}", hint=_RECREATE)
    if not isinstance(events, list):
        raise bad
    ev = []
    for e in events:
        if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n for x in e)
                and e[0] < e[1]):
            raise OmFormatError(f"'{path}': the stream assignment is invalid: event {str(e)[:40]} is not a pair of "
                                f"node indices (earlier, later) below {n}", hint=_RECREATE)
        ev.append((e[0], e[1]))
    return StreamAssignment(streams, ev)


def read_plan(d: Any, path: str) -> MemoryPlan | SymbolicPlan | None:
    """The stored memory plan, well formed (integer offsets inside the arena; a symbolic plan's
    orders lists of names, its references bindings of ints); :func:`verify_plan` (or
    :func:`verify_symbolic_plan`) then checks it against the memory problem of the loaded graph."""
    if d is None:
        return None
    bad = OmFormatError(f"'{path}': the memory plan is invalid", hint=_RECREATE)
    if not isinstance(d, dict):
        raise bad
    if d.get("symbolic") is True:
        orders, refs, planner = d.get("orders"), d.get("references", []), d.get("planner", "")
        if (not isinstance(orders, list) or not 1 <= len(orders) <= MAX_ORDERS or not isinstance(planner, str)
                or not isinstance(refs, list) or len(refs) > MAX_ORDERS):
            raise bad
        for o in orders:
            if not isinstance(o, list) or not all(isinstance(n, str) for n in o):
                raise bad
        for r in refs:
            if not isinstance(r, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                                  and 1 <= v <= LIMITS.dim for k, v in r.items()):
                raise bad
        stats = d.get("stats")
        arena = stats.get("arena_at_largest", 0) if isinstance(stats, dict) else 0
        shown = {"arena_at_largest": arena} if isinstance(arena, int) and not isinstance(arena, bool) else {}
        return SymbolicPlan([list(o) for o in orders], planner[:200], [dict(r) for r in refs], shown)
    offsets, arena, planner = d.get("offsets", {}), d.get("arena_bytes", 0), d.get("planner", "")
    if (not isinstance(offsets, dict) or isinstance(arena, bool) or not isinstance(arena, int)
            or not 0 <= arena < LIMITS.arena_bytes or not isinstance(planner, str)):
        raise bad
    for v in offsets.values():
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= arena:
            raise bad
    return MemoryPlan(dict(offsets), arena, planner[:200])


def stored_definition(path: str, container, host: PluginHost) -> dict[str, Any]:
    """The model definition an .om stores (checked as :func:`read_model_definition` checks it);
    of a plugin's kind of .om, the one its :meth:`OmKind.definition` gives."""
    found = om_kind(path, container, host)
    if found:
        return call_kind(found, path, "definition", container)
    return read_model_definition(path, container)
