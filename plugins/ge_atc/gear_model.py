"""Gear models: GE's multi-batch, multi-size and dynamic-dims models (``atc --dynamic_batch_size``,
``--dynamic_image_size``, ``--dynamic_dims``), one static model per gear in one .om.

The core reads the .om container and its single models; a gear .om is a kind of .om this plugin
defines (``ge_register_om_kinds``: :class:`GearOmKind` for the ``gears`` partition), so
``ge_core.load_om`` and ``ge_sdk.omdesc.inspect_om`` come here for it. The compile side (the flags'
parsing and checks) is :mod:`ge_atc.gears`.

A gear gives each dynamic (``-1``) dim of ``--input_shape`` a value. Every gear is compiled as an
ordinary static model (its own memory plan, arena and kernels); a run takes the gear whose input
shapes the feed has, and any other shape is an :class:`InputError` listing the gears. (GE builds
one graph that picks its gear with MapIndex + Case; here :class:`GearModel` composes the gears'
:class:`CompiledModel` objects and has their interface.)

The .om of a gear model has three partitions:

* ``model``: the gear table (JSON, format ``ge-gears``): the flag, the gear inputs with their gear
  axes, each gear's input shapes and the size of its definition, and the model's report;
* ``gears``: the gears' model definitions one after another, each a complete ``ge-model``
  definition, read and verified exactly as a single model's ``model`` partition is (graph,
  types, options, streams, memory plan: :func:`ge_core.om.model_from_definition`);
* ``weights``: the constants of all gears, each distinct tensor (dtype, shape, bytes) stored
  once, so gears share their weights.

The table is checked as data from a stranger before any gear is read (types, 2..100 gears,
positive dims in range, gear axes inside each shape, the other dims the same in every gear, no
duplicate gear, the flag's own rules), and each gear's graph must take exactly its gear's shapes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ge_core import __version__
from ge_core.errors import GraphError, InputError, OmFormatError, OptionError
from ge_core.model import CompiledModel, NodeArg
from ge_core.om import (
    ModelFileSave,
    checked_definition,
    model_from_definition,
    read_model_definition,
    remember_types_checked,
    report_problem,
    weight_buffers,
)
from ge_core.om_container import write_container
from ge_core.plugins import get_host
from ge_core.serialize import LIMITS, WeightWriter, dump_definition, load_definition
from ge_sdk.omdesc import definition_summary

GEAR_FORMAT = "ge-gears"
GEAR_VERSION = 1
#: The partition of a gear .om that holds the gears' model definitions (the kind's partition).
GEARS_PARTITION = "gears"
#: The gear flags and what their gears are called (GE: the flags are mutually exclusive).
FLAGS = {"dynamic_batch_size": "batch", "dynamic_image_size": "image size", "dynamic_dims": "dims"}
#: GE's bounds on the number of gears (multi_batch_options.cc: kMinShapesCount, kMaxShapesCount).
MIN_GEARS, MAX_GEARS = 2, 100
MAX_GEAR_INPUTS = 1024
_RECREATE = "re-create it with atc (--dynamic_batch_size, --dynamic_image_size or --dynamic_dims)"


@dataclass(frozen=True)
class GearTable:
    """Which inputs the gears change and how: ``axes`` maps each gear input (in ``--input_shape``
    order) to its gear axes (its ``-1`` dims); ``shapes`` holds each gear's static shape of every
    gear input."""

    flag: str
    axes: dict[str, tuple[int, ...]]
    shapes: tuple[dict[str, tuple[int, ...]], ...]

    def values(self, i: int) -> tuple[int, ...]:
        """Gear ``i`` as GE writes it: its values at the gear axes, in input order (one batch
        value, one height and width, or every dim of ``--dynamic_dims``)."""
        vals = tuple(self.shapes[i][n][a] for n, ax in self.axes.items() for a in ax)
        return vals[:{"dynamic_batch_size": 1, "dynamic_image_size": 2}.get(self.flag, len(vals))]

    def label(self, i: int) -> str:
        return ("x" if self.flag == "dynamic_image_size" else ",").join(map(str, self.values(i)))

    def gear_text(self, i: int) -> str:
        """``gear 2 (batch 4)``."""
        return f"gear {i} ({FLAGS[self.flag]} {self.label(i)})"

    def describe(self) -> str:
        """``batch 1, 2, 4, 8 (--dynamic_batch_size)``."""
        sep = "; " if self.flag == "dynamic_dims" else ", "
        return f"{FLAGS[self.flag]} {sep.join(self.label(i) for i in range(len(self.shapes)))} (--{self.flag})"

    def key(self, shapes: Mapping[str, Sequence[int]]) -> tuple:
        return tuple(tuple(shapes[n]) for n in self.axes)

    def problem(self) -> str | None:
        """What makes this table inconsistent (None when nothing does): the writer refuses it and
        the loader refuses a file that stores it."""
        if self.flag not in FLAGS:
            return f"unknown gear flag {self.flag!r:.40}"
        if not 1 <= len(self.axes) <= MAX_GEAR_INPUTS:
            return f"it names {len(self.axes)} gear inputs"
        if not MIN_GEARS <= len(self.shapes) <= MAX_GEARS:
            return f"it has {len(self.shapes)} gears; a gear model has {MIN_GEARS} to {MAX_GEARS} (GE's limits)"
        first = self.shapes[0]
        for i, gear in enumerate(self.shapes):
            if set(gear) != set(self.axes):
                return f"gear {i} gives shapes of {sorted(gear)[:5]}, the gear inputs are {list(self.axes)[:5]}"
            for name, ax in self.axes.items():
                shape, base = gear[name], first[name]
                if not 1 <= len(shape) <= LIMITS.rank or not ax or list(ax) != sorted(set(ax)) or ax[-1] >= len(shape):
                    return f"gear {i}: input '{name}' has shape {list(shape)[:8]} and gear axes {list(ax)[:8]}"
                if any(isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= LIMITS.dim for d in shape):
                    return f"gear {i}: input '{name}' has shape {list(shape)[:8]}; dims are integers 1..{LIMITS.dim}"
                if len(shape) != len(base) or any(a != b for k, (a, b) in enumerate(zip(shape, base)) if k not in ax):
                    return (f"gear {i}: input '{name}' has shape {list(shape)}, gear 0 {list(base)}: only the gear "
                            f"axes {list(ax)} may differ")
            vals = [gear[n][a] for n, ax in self.axes.items() for a in ax]
            if self.flag == "dynamic_batch_size" and (any(ax != (0,) for ax in self.axes.values()) or len(set(vals)) != 1):
                return f"gear {i}: a batch gear sets dim 0 of each gear input to one value"
            if self.flag == "dynamic_image_size" and (any(len(ax) != 2 for ax in self.axes.values())
                                                      or len({tuple(vals[k:k + 2]) for k in range(0, len(vals), 2)}) != 1):
                return f"gear {i}: an image-size gear sets the height and width of each gear input to one pair"
        seen: dict[tuple, int] = {}
        for i, gear in enumerate(self.shapes):
            j = seen.setdefault(self.key(gear), i)
            if j != i:
                return f"gears {j} and {i} are the same ({self.label(i)}): GE refuses duplicate gears"
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"flag": self.flag, "inputs": [{"name": n, "axes": list(a)} for n, a in self.axes.items()],
                "gears": [{"shapes": {n: list(s) for n, s in g.items()}} for g in self.shapes]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> GearTable:
        """The table stored in an .om, its JSON types checked, then :meth:`problem`; else OmFormatError."""
        def bad(what: str) -> OmFormatError:
            return OmFormatError(f"{where}: the gear table is invalid: {what}", hint=_RECREATE)

        def ints(v: Any, what: str) -> tuple[int, ...]:
            if not isinstance(v, list) or len(v) > LIMITS.rank or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
                raise bad(f"{what} is not a list of at most {LIMITS.rank} integers")
            return tuple(v)

        inputs, gears = d.get("inputs"), d.get("gears")
        if not isinstance(d.get("flag"), str) or not isinstance(inputs, list) or not isinstance(gears, list):
            raise bad("it needs a flag, a list of inputs and a list of gears")
        if not MIN_GEARS <= len(gears) <= MAX_GEARS:
            raise bad(f"it has {len(gears)} gears; a gear model has {MIN_GEARS} to {MAX_GEARS} (GE's limits)")
        if len(inputs) > MAX_GEAR_INPUTS:
            raise bad(f"it names {len(inputs)} inputs")
        axes: dict[str, tuple[int, ...]] = {}
        for k, e in enumerate(inputs):
            name = e.get("name") if isinstance(e, dict) else None
            if not isinstance(name, str) or not 0 < len(name) <= LIMITS.name_length or name in axes:
                raise bad(f"input #{k} has no valid, unique name")
            axes[name] = ints(e.get("axes"), f"the gear axes of input '{name[:80]}'")
        shapes = []
        for i, g in enumerate(gears):
            s = g.get("shapes") if isinstance(g, dict) else None
            if not isinstance(s, dict):
                raise bad(f"gear {i} has no shapes")
            shapes.append({str(n): ints(v, f"gear {i}'s shape of '{str(n)[:80]}'") for n, v in s.items()})
        table = cls(d["flag"], axes, tuple(shapes))
        problem = table.problem()
        if problem:
            raise bad(problem)
        return table


def interface_problem(table: GearTable, gears: Sequence[tuple[list[str], dict[str, Any], list[str]]]) -> str | None:
    """What makes the gears' models disagree with ``table`` or with each other, or None. Each
    gear is given as (input names, {input name: shape}, output names): every gear takes the same
    inputs and gives the same outputs, and its gear inputs have exactly its gear's shapes."""
    if len(gears) != len(table.shapes):
        return f"the table has {len(table.shapes)} gears, the file {len(gears)} gear models"
    ins0, _, outs0 = gears[0]
    for i, (ins, shapes, outs) in enumerate(gears):
        if ins != ins0 or outs != outs0:
            return f"gear {i} takes inputs {ins[:5]} and gives {outs[:5]}, gear 0 takes {ins0[:5]} and gives {outs0[:5]}"
        for name, want in table.shapes[i].items():
            got = shapes.get(name)
            if not isinstance(got, list) or got != list(want):
                return f"gear {i} ({table.label(i)}): input '{name}' of its graph is {got}, the gear table says {list(want)}"
    return None


def _io(m: CompiledModel) -> tuple[list[str], dict[str, Any], list[str]]:
    return m.input_names, {v.name: None if v.type.shape is None else list(v.type.shape) for v in m.graph.inputs}, m.output_names


class SharedWeights(WeightWriter):
    """A weight writer for several graphs: a constant equal to one already added (dtype, shape
    and bytes; SHA-256 of the bytes) takes the stored one's entry, so gears share their weights."""

    def __init__(self) -> None:
        super().__init__()
        self._by_content: dict[tuple, int] = {}

    def add(self, a: np.ndarray, what: str = "a constant") -> int:
        if a.dtype == np.dtype(object):
            return super().add(a, what)
        if a.ndim and a.size > 1 and all(st == 0 for st in a.strides):  # a splat: one value
            key: tuple = ("splat", a.dtype.str, a.shape, a.reshape(-1)[:1].tobytes())
        else:
            raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            key = (a.dtype.str, a.shape, hashlib.sha256(raw.data).digest())
        idx = self._by_content.get(key)
        if idx is None:
            idx = self._by_content[key] = super().add(a, what)
        return idx


class GearModel:
    """A gear model: one compiled static model per gear (``models``, in gear order) behind the
    :class:`CompiledModel` interface. :meth:`run` takes the gear whose shapes the feed has.
    ``graph``, ``options``, ``executable``, ``memory_plan`` and ``streams`` are the first gear's
    (for tools that look at one compiled graph); :meth:`gear` gives any gear's model."""

    def __init__(self, models: Sequence[CompiledModel], table: GearTable, report: dict[str, Any] | None = None) -> None:
        problem = table.problem() or interface_problem(table, [_io(m) for m in models])
        if problem:
            raise GraphError(f"cannot build a gear model: {problem}")
        self.models = list(models)
        self.table = table
        self._index = {table.key(g): i for i, g in enumerate(table.shapes)}
        arena = max(int(m.report.get("memory", {}).get("arena_bytes") or 0) for m in self.models)
        self.report: dict[str, Any] = {"memory": {"arena_bytes": arena}, **(report or {})}
        self.report["gears"] = {"flag": table.flag, "text": table.describe(), "list": [
            {"label": table.label(i), "shapes": {n: list(s) for n, s in g.items()}, "report": m.report}
            for i, (g, m) in enumerate(zip(table.shapes, self.models))]}
        self.source: str | None = None
        self.timings: dict[str, float] = {}
        #: the .om's snapshot whose weights the gears use (as CompiledModel.keepalive)
        self.keepalive: Any = None

    # -- the first gear stands for the model where one graph is asked for ------------------------
    graph = property(lambda self: self.models[0].graph)
    options = property(lambda self: self.models[0].options)
    executable = property(lambda self: self.models[0].executable)
    memory_plan = property(lambda self: self.models[0].memory_plan)
    streams = property(lambda self: self.models[0].streams)
    input_names = property(lambda self: self.models[0].input_names)
    output_names = property(lambda self: self.models[0].output_names)
    input_defaults = property(lambda self: self.models[0].input_defaults)

    def gear(self, i: int) -> CompiledModel:
        """The compiled model of gear ``i`` (0-based, in the order the flag listed them)."""
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.models):
            raise OptionError(f"gear {i!r:.20} does not exist: this model has gears 0..{len(self.models) - 1} "
                              f"({self.table.describe()})")
        return self.models[i]

    @property
    def inputs(self) -> list[NodeArg]:
        """The inputs; a gear axis is a named dim (``batch``, ``height``/``width``, ``dim0``...)."""
        flag, out, k = self.table.flag, [], 0
        for a in self.models[0].inputs:
            ax = self.table.axes.get(a.name, ())
            dims = list(a.shape or ())
            for j, axis in enumerate(ax):
                dims[axis] = "batch" if flag == "dynamic_batch_size" else (
                    ("height", "width")[j % 2] if flag == "dynamic_image_size" else f"dim{k}")
                k += 1
            out.append(NodeArg(a.name, a.dtype, None if a.shape is None else tuple(dims)))
        return out

    @property
    def outputs(self) -> list[NodeArg]:
        """The outputs; a dim that differs between gears is ``"?"``."""
        per_gear = [m.outputs for m in self.models]
        out = []
        for k, a in enumerate(per_gear[0]):
            shapes = [g[k].shape for g in per_gear]
            shape: tuple[int | str, ...] | None = None
            if a.shape is not None and all(s is not None and len(s) == len(a.shape) for s in shapes):
                shape = tuple(d if all(s is not None and s[j] == d for s in shapes) else "?" for j, d in enumerate(a.shape))
            out.append(NodeArg(a.name, a.dtype, shape))
        return out

    def pick(self, feeds: Any, kw: Mapping[str, Any] | None = None) -> CompiledModel:
        """The model of the gear the feeds' shapes select; InputError listing the gears when none
        does. Feeds that are not a mapping of arrays go to the first gear, whose checks name them."""
        if isinstance(feeds, (np.ndarray, np.generic)) and not kw and len(self.input_names) - len(self.input_defaults) == 1:
            feeds = {next(n for n in self.input_names if n not in self.input_defaults): feeds}
        if not isinstance(feeds, Mapping) and feeds is not None:
            return self.models[0]
        feeds = {**(feeds or {}), **(kw or {})}
        shapes = {}
        for name in self.table.axes:
            v = feeds.get(name)
            shape = getattr(v, "shape", None)
            if shape is None and isinstance(v, (list, tuple)):  # nested lists are feeds too
                try:
                    shape = np.shape(v)
                except ValueError:
                    shape = None
            if not isinstance(shape, tuple):
                return self.models[0]  # missing or not an array: the model's own feed check says so
            shapes[name] = shape
        i = self._index.get(self.table.key(shapes))
        if i is not None:
            return self.models[i]
        odd = [n for n in shapes if all(tuple(g[n]) != shapes[n] for g in self.table.shapes)] or list(shapes)
        fed = ", ".join(f"'{n}' has shape {list(shapes[n])}" for n in odd)
        some = " | ".join(", ".join(f"{n}{list(s)}" for n, s in g.items()) for g in self.table.shapes[:8])
        raise InputError(f"input {fed}; this model was compiled for the gears {self.table.describe()}",
                         hint=f"feed the shapes of one gear: {some}{' | ...' if len(self.table.shapes) > 8 else ''}")

    def run(self, feeds: Mapping[str, Any] | np.ndarray | None = None, *, timeout: float | None = None,
            output_names: Sequence[str] | None = None, **kw: Any) -> dict[str, np.ndarray]:
        """:meth:`CompiledModel.run` on the gear the feeds' shapes select."""
        return self.pick(feeds, kw).run(feeds, timeout=timeout, output_names=output_names, **kw)

    def check_feeds(self, feeds: Mapping[str, Any] | np.ndarray | None = None, **kw: Any) -> dict[str, Any]:
        """The feeds checked by the gear they select (:meth:`CompiledModel.check_feeds`)."""
        return self.pick(feeds, kw).check_feeds(feeds, **kw)

    def check_output_names(self, names: Sequence[str] | None) -> list[str] | None:
        """:meth:`CompiledModel.check_output_names` (every gear gives the same outputs)."""
        return self.models[0].check_output_names(names)

    def model_for(self, feeds: Mapping[str, Any] | np.ndarray | None = None, **kw: Any) -> CompiledModel:
        """The gear's compiled model that runs ``feeds`` (:meth:`pick`)."""
        return self.pick(feeds, kw)

    @property
    def registries(self):
        """The plugin registries the gears' kernels come from."""
        return self.models[0].registries

    def run_async(self, feeds: Mapping[str, Any] | np.ndarray | None = None, *,
                  output_names: Sequence[str] | None = None, **kw: Any):
        return self.pick(feeds, kw).run_async(feeds, output_names=output_names, **kw)

    def set_run_options(self, **options: Any) -> None:
        for m in self.models:
            m.set_run_options(**options)

    def with_outputs(self, names: Sequence[str] | None = None, **options: Any) -> CompiledModel:
        """The first gear's :meth:`CompiledModel.with_outputs`."""
        return self.models[0].with_outputs(names, **options)

    def save(self, path: str | os.PathLike, *, external_weight: int = 0) -> str:
        return save_gears(self, os.fspath(path), external_weight=external_weight)

    def describe(self) -> dict[str, Any]:
        return {"inputs": [{"name": a.name, "type": str(a)} for a in self.inputs],
                "outputs": [{"name": a.name, "type": str(a)} for a in self.outputs],
                "gears": [{"label": g["label"], "shapes": g["shapes"]} for g in self.report["gears"]["list"]],
                "report": self.report, "timings": dict(self.timings)}

    def __repr__(self) -> str:
        return f"<GearModel {self.graph.name}: {len(self.models)} gears, {self.table.describe()}>"


def save_gears(model: GearModel, path: str, *, external_weight: int = 0) -> str:
    """Write a gear model as one .om (see the module's docstring); ``external_weight`` as for
    :func:`ge_core.om.save_om`."""
    if external_weight not in (0, 1, 2):
        raise OptionError(f"external_weight must be 0, 1 or 2, not {external_weight!r:.20}")
    if not path:
        raise OptionError("no output path given for the .om file", hint="pass a file name (--output / save(path))")
    shared = SharedWeights()
    defs = [checked_definition(m, path, shared)[0] for m in model.models]  # each stores the shared table
    report = {k: v for k, v in model.report.items() if k != "gears"}
    report["memory"] = {**report.get("memory", {}), "weights_bytes": shared.size}  # each shared constant once
    head: dict[str, Any] = {"format": GEAR_FORMAT, "version": GEAR_VERSION, "producer": f"ge-python {__version__}",
                            **model.table.as_dict(), "report": report}
    data: Any = shared.chunks()
    with ModelFileSave(path) as save:  # the old model, or the new one, is complete at every point
        if external_weight:
            head["external_weights"] = save.external_weights(shared, external_weight)
            data = b""
        blobs = [dump_definition(d, f"'{path}' gear {i}") for i, d in enumerate(defs)]
        for g, b in zip(head["gears"], blobs):
            g["bytes"] = len(b)
        write_container(path, [("model", dump_definition(head, f"'{path}'"), 8), (GEARS_PARTITION, blobs, 8),
                               ("weights", data, 4096)], producer=f"ge-python {__version__}")
    for b, m in zip(blobs, model.models):
        remember_types_checked(b, m.graph, get_host())
    return path


def read_gear_definitions(path: str, container) -> tuple[dict[str, Any], GearTable, list[tuple[Any, dict[str, Any]]]]:
    """The gear table of an open gear .om (checked), and each gear's (bytes, model definition),
    each definition checked as :func:`ge_core.om.read_model_definition` checks a model's."""
    head = load_definition(container.partition("model"), f"'{path}'")
    if not isinstance(head, dict) or head.get("format") != GEAR_FORMAT:
        raise OmFormatError(f"'{path}' has a gears partition, but its model partition is not a gear table",
                            hint=_RECREATE)
    v = head.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= GEAR_VERSION:
        raise OmFormatError(f"'{path}': gear table version {v!r:.20} is not supported by this ge ({GEAR_VERSION})",
                            hint="upgrade ge or re-create the file with this version")
    problem = report_problem(head.get("report", {}))
    if problem or not isinstance(head.get("external_weights", {}), dict):
        raise OmFormatError(f"'{path}': the gear table is invalid: {problem or 'its external weights are not an object'}",
                            hint=_RECREATE)
    table = GearTable.from_dict(head, f"'{path}'")
    part = container.partition(GEARS_PARTITION)
    sizes = [g.get("bytes") for g in head["gears"]]
    if any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in sizes) or sum(sizes) != len(part):
        raise OmFormatError(f"'{path}': the gear table's definition sizes do not add up to the gears partition "
                            f"({len(part)} bytes)", hint=_RECREATE)
    out, at = [], 0
    for i, n in enumerate(sizes):
        raw = part[at:at + n]
        at += n
        d = read_model_definition(gear_where(path, table, i), container, raw)
        if "external_weights" in d:
            raise OmFormatError(f"'{gear_where(path, table, i)}': a gear's definition names weight files; only the "
                                "gear table may", hint=_RECREATE)
        out.append((raw, d))
    return head, table, out


def gear_where(path: str, table: GearTable, i: int) -> str:
    return f"{path}, {table.gear_text(i)}"


def load_gears(path: str, container, host, verify_checksums: bool = True,
               run_options: dict[str, Any] | None = None) -> GearModel:
    """The gear model of an open gear .om: the table checked, every gear verified and built as
    :func:`ge_core.om.load_om` does a single model, then each gear's graph against the table."""
    head, table, defs = read_gear_definitions(path, container)
    if "weights" not in container:
        raise OmFormatError(f"'{path}' has no weights partition", hint=_RECREATE)
    blob = weight_buffers(path, head, container, verify_checksums)
    models = []
    for i, (raw, d) in enumerate(defs):
        m = model_from_definition(gear_where(path, table, i), d, raw, blob, container, host, run_options)
        m.source = path
        models.append(m)
    problem = interface_problem(table, [_io(m) for m in models])
    if problem:
        raise OmFormatError(f"'{path}': the gear models disagree with the gear table: {problem}", hint=_RECREATE)
    model = GearModel(models, table, head.get("report"))
    model.source = path
    model.keepalive = container
    return model


def inspect_gears(path: str, container) -> dict[str, Any]:
    """:func:`ge_sdk.omdesc.inspect_om`'s ``model``, ``report`` and ``streams`` (of the first gear)
    and ``gears`` of an open gear .om, validated as :func:`load_gears` validates it without plugins."""
    head, table, defs = read_gear_definitions(path, container)
    if "weights" not in container:
        raise OmFormatError(f"'{path}' has no weights partition", hint=_RECREATE)
    blob = weight_buffers(path, head, container)
    summaries = [definition_summary(gear_where(path, table, i), d, blob) for i, (_, d) in enumerate(defs)]
    ios = [([e.get("name") for e in d["graph"].get("inputs", [])],
            {e.get("name"): e.get("shape") for e in d["graph"].get("inputs", [])}, d["graph"].get("outputs", []))
           for _, d in defs]
    problem = interface_problem(table, ios)
    if problem:
        raise OmFormatError(f"'{path}': the gear models disagree with the gear table: {problem}", hint=_RECREATE)
    info = dict(summaries[0])
    if head.get("external_weights"):
        info["model"]["external_weights"] = head["external_weights"]
    info["report"] = head.get("report")
    gears = []
    for i, s in enumerate(summaries):
        r = s.get("report") or {}
        gears.append({"index": i, "label": table.label(i), "shapes": {n: list(v) for n, v in table.shapes[i].items()},
                      "nodes": s["model"]["nodes"], "kernels": r.get("kernels"),
                      "arena_bytes": (r.get("memory") or {}).get("arena_bytes"), "report": r})
    info["gears"] = {"flag": table.flag, "text": table.describe(),
                     "inputs": [{"name": n, "axes": list(a)} for n, a in table.axes.items()], "list": gears}
    return info


class GearOmKind:
    """The gear .om kind (``ge_register_om_kinds``, partition ``gears``): what
    :func:`ge_core.om.load_om`, :func:`ge_sdk.omdesc.inspect_om` and
    :func:`ge_core.om.stored_definition` do with a container that holds a ``gears`` partition."""

    def load(self, path: str, container, host, verify_checksums: bool = True,
             run_options: dict[str, Any] | None = None) -> GearModel:
        return load_gears(path, container, host, verify_checksums, run_options)

    def inspect(self, path: str, container) -> dict[str, Any]:
        return inspect_gears(path, container)

    def definition(self, path: str, container) -> dict[str, Any]:
        """The first gear's model definition (the one that stands for the model)."""
        return read_gear_definitions(path, container)[2][0][1]
