"""What the tools share: opening a model (an .om, or a source model compiled first), building
feeds, finding the source ONNX a reference runs, and comparing arrays."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ge_core.errors import GEError, InputError, ModelFileError, OptionError

REFERENCES = ("onnxruntime", "onnx.reference")


def add_model_flags(p: argparse.ArgumentParser, *, compile_flags: bool = True) -> None:
    """The flags every tool takes to find, compile and feed a model."""
    p.add_argument("model", help="an .om, or a source model (.onnx, ...) that is compiled first")
    p.add_argument("--source", metavar="MODEL.onnx",
                   help="the source model of an .om, for a reference run (default: the path the .om was "
                        "compiled from, when that file still exists)")
    p.add_argument("--input", "--inputs", dest="input", action="extend", nargs="+", metavar="NAME=FILE.npy",
                   help="feed inputs from .npy files (--input a=x.npy b=y.npy, or the flag repeated); inputs "
                        "not given get random data")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--batch", type=int, metavar="B",
                   help="size of the first symbolic dim of the inputs (the batch); of a gear model (atc "
                        "--dynamic_batch_size), the batch gear to run. Other symbolic dims are never guessed: "
                        "give them with --dim or --input-shape")
    p.add_argument("--dim", action="append", metavar="NAME=SIZE",
                   help="size of a symbolic dim by name, e.g. --dim seq=128 (repeatable)")
    p.add_argument("--input-shape", dest="input_shape", metavar='"NAME:D1,D2,...;..."',
                   help='shapes of the random inputs, as ge run takes them, e.g. "x:2,3,224,224;y:2,7" (a symbol '
                        "shared by inputs takes the size given for one of them; of a gear model, the shapes of "
                        "the gear to run)")
    if compile_flags:
        p.add_argument("--framework", help="frontend of a source model: name or ATC number (5 ONNX, 3 TensorFlow)")
        p.add_argument("--config", help="pipeline config (TOML) used when compiling a source model")
        p.add_argument("-O", "--opt-level", dest="opt_level", help="optimisation level 0..3 for a source model")
        p.add_argument("--option", action="append", metavar="NAME=VALUE",
                       help="a compile option for a source model (repeatable), e.g. --option executor=arena")
        p.add_argument("--log", choices=["debug", "info", "warning", "error", "null"],
                       help="log level while compiling a source model: info says what each stage did, "
                            "debug each pass")


@dataclass
class Opened:
    model: Any  #: the CompiledModel
    path: str  #: what the user named
    source: str | None  #: the source model file, when known
    compile_seconds: float | None = None  #: compile (source model) or load (.om) time


def compile_options(args: argparse.Namespace, **more: Any) -> dict[str, Any]:
    from ge_sdk.cli import parse_kv

    opts: dict[str, Any] = {}
    if getattr(args, "config", None):
        opts["config"] = args.config
    if getattr(args, "framework", None):
        opts["framework"] = args.framework
    if getattr(args, "opt_level", None) is not None:
        opts["opt_level"] = args.opt_level
    if getattr(args, "log", None):
        opts["log"] = args.log
    opts.update(parse_kv(getattr(args, "option", None), "--option"))
    opts.update({k: v for k, v in more.items() if v is not None})
    return opts


def is_om(path: str) -> bool:
    if path.lower().endswith(".om"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GEOM"
    except OSError:
        return False


def open_model(args: argparse.Namespace, *, threads: int | None = None, quiet: bool = True, **more: Any) -> Opened:
    """The model ``args.model`` names: an .om loaded (with ``threads``), or a source model compiled."""
    import time

    import ge_core as ge
    from ge_sdk.cli import compile_with_progress, log_stages

    path = os.fspath(args.model)
    t0 = time.perf_counter()
    if is_om(path):
        run_opts = {k: v for k, v in more.items() if v is not None}
        model = ge.load_om(path, threads=threads, **run_opts)
        source = getattr(args, "source", None)
        if source is None:
            stored = model.graph.metadata.get("source")
            source = stored if isinstance(stored, str) and os.path.isfile(stored) else None
        return Opened(model, path, source, time.perf_counter() - t0)
    opts = compile_options(args, threads=threads, **more)
    model = compile_with_progress(ge, path, opts, quiet=quiet)
    log_stages(model.report)
    return Opened(model, path, getattr(args, "source", None) or path, time.perf_counter() - t0)


def symbolic_dims(model, args: argparse.Namespace, *, with_batch: bool = True) -> dict[str, int]:
    """Sizes of symbolic dims from ``--batch`` (the first symbolic dim of the inputs; not with
    ``with_batch=False``, where it picked a gear) and ``--dim``."""
    from ge_sdk.cli import parse_kv

    dims: dict[str, int] = {}
    for k, v in parse_kv(getattr(args, "dim", None), "--dim").items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OptionError(f"--dim {k}={v}: the size is a positive integer")
        dims[k] = v
    batch = getattr(args, "batch", None) if with_batch else None
    if batch is not None:
        if batch < 1:
            raise OptionError(f"--batch {batch}: the batch is a positive integer")
        first = next((d for a in model.inputs for d in (a.shape or ())[:1] if isinstance(d, str)), None)
        if first is None:
            shown = ", ".join(str(a) for a in model.inputs) or "no inputs"
            raise OptionError(f"--batch {batch}: no input of '{args.model}' has a symbolic first dim ({shown})",
                              hint="the batch is fixed when the model was exported; export it with a dynamic "
                                   "batch axis, or compile with --input-shape")
        dims.setdefault(first, batch)
    return dims


def model_for_shapes(model, feeds: Mapping[str, Any], shapes: Mapping[str, Any]):
    """The compiled model whose input types random inputs follow (``model.model_for``): of a
    gear model, the gear that the fed arrays' and the ``--input-shape`` shapes select (its first
    gear when they set none; InputError listing the gears when they match none); else ``model``."""
    sized = {n: np.broadcast_to(np.zeros((), np.float32), tuple(s)) for n, s in shapes.items()
             if n not in feeds and all(type(d) is int and d >= 0 for d in s)}  # (shapes only: no memory)
    return model.model_for({**sized, **feeds})


def batch_gear_shapes(model, args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """``--batch N`` on a gear model (atc --dynamic_batch_size): the input shapes of its gear of
    batch N (empty without ``--batch`` or for a model without gears); an OptionError naming the
    gears when none has that batch or the gears are not batch gears."""
    table = getattr(model, "table", None)
    batch = getattr(args, "batch", None)
    if batch is None or table is None or not hasattr(model, "gear"):
        return {}
    n = len(table.shapes)
    if table.flag != "dynamic_batch_size":
        raise OptionError(f"--batch {batch}: '{args.model}' is a gear model of {table.describe()}, not of batch gears",
                          hint="pick a gear by its shapes with --input-shape, e.g. --input-shape \""
                               + ";".join(f"{k}:{','.join(map(str, v))}" for k, v in table.shapes[0].items()) + '"')
    for i in range(n):
        if table.values(i) == (batch,):
            return {k: tuple(v) for k, v in table.shapes[i].items()}
    raise OptionError(f"--batch {batch}: '{args.model}' has no gear of batch {batch}; its gears are {table.describe()}",
                      hint="give --batch with one of " + ", ".join(table.label(i) for i in range(n)))


def refuse_unsized(model, shapes: Mapping[str, Any], dims: dict[str, int], known: Mapping[str, Any]) -> None:
    """Never guess a dim of a random input: a symbolic dim that nothing sizes (``--batch``,
    ``--dim``, ``--input-shape``, an input fed from a file) takes the one value of its declared
    range (``lo~lo``), added to ``dims``; any other, an unknown dim or rank included, is an
    InputError naming the input, the dim and its range, and the flag that sizes it."""
    ranges = getattr(model, "dim_ranges", None) or {}
    bound = set(dims)
    for v in model.graph.inputs:
        got = shapes.get(v.name) if v.name in shapes else np.shape(known[v.name]) if v.name in known else None
        if got is not None and v.type.shape is not None and len(got) == len(v.type.shape):
            bound.update(d for d in v.type.shape if isinstance(d, str))
    for v in model.graph.inputs:
        if v.name in shapes or v.name in known:
            continue
        model_dims = v.type.shape
        for i, d in enumerate(model_dims if model_dims is not None else [None]):
            if isinstance(d, int) or d in bound:
                continue
            lo, hi = ranges.get(d, (None, None)) if isinstance(d, str) else (None, None)
            if lo is not None and lo == hi:
                dims[d] = lo
                bound.add(d)
                continue
            what = ("an unknown rank" if model_dims is None else
                    f"dim {i} ('{d}'{f', range {lo}~{-1 if hi is None else hi}' if lo is not None else ''})"
                    if isinstance(d, str) else f"dim {i} (unknown)")
            shown = "[" + ", ".join("?" if x is None else str(x) for x in model_dims) + "]" if model_dims else "[*]"
            example = ",".join(str(x) if isinstance(x, int) else "N" for x in model_dims or [1])
            others = f", --dim {d}=N" if isinstance(d, str) else ""
            raise InputError(f"input '{v.name}' {shown} has {what} that nothing sizes: the tools do not guess a size",
                             hint=f"give it with --input-shape \"{v.name}:{example}\"{others}"
                                  f"{' or --batch N' if i == 0 and isinstance(d, str) else ''}")


def ran_threads(model) -> int | None:
    """The threads a run of ``model`` uses: its ``threads`` option, else the width of GE's pool
    its executable was built for; None when BLAS's own default threads do the work."""
    threads = getattr(model.options, "threads", None)
    if threads:
        return int(threads)
    exe = getattr(model, "executable", None)
    width = getattr(exe, "width", None)
    return int(width) if isinstance(width, int) and getattr(exe, "parallel", "engine") == "engine" else None


def ran_with(model, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """What a tool ran with: each input's dtype and shape, the threads and, of a gear model, the gear."""
    out: dict[str, Any] = {"inputs": {k: {"dtype": str(getattr(v, "dtype", "")), "shape": list(np.shape(v))}
                                      for k, v in feeds.items()},
                           "threads": ran_threads(model)}
    table = getattr(model, "table", None)
    if table is not None and hasattr(model, "models"):
        gear = model.model_for(feeds)
        i = next(k for k, m in enumerate(model.models) if m is gear)
        out["gear"] = f"{table.gear_text(i)} of {table.describe()}"
    return out


def ran_with_text(r: Mapping[str, Any]) -> str:
    """``inputs x float32[4, 64]; threads 2; gear 2 (batch 4) of ...``: one line."""
    ins = ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in r["inputs"].items()) or "none"
    thr = r["threads"] if r.get("threads") is not None else "BLAS's default"
    return f"inputs {ins}; threads {thr}" + (f"; {r['gear']}" if r.get("gear") else "")


def check_shape_ranks(model, shapes: Mapping[str, Any]) -> None:
    """``--input-shape`` entries whose rank is not their input's: an InputError naming the input
    and its shape (before anything else is concluded from the shapes)."""
    for v in model.graph.inputs:
        want = v.type.shape if v.type is not None else None
        got = shapes.get(v.name)
        if got is not None and want is not None and len(got) != len(want):
            shown = "[" + ", ".join(str(d) for d in want) + "]"
            raise InputError(f"--input-shape gives input '{v.name}' {len(got)} dims {list(got)}, but it has "
                             f"{len(want)}: {shown}", hint=f'for example --input-shape "{v.name}:'
                             + ",".join(str(d) if isinstance(d, int) else "N" for d in want) + '"')


def make_feeds(model, args: argparse.Namespace) -> dict[str, np.ndarray]:
    """Feeds from ``--input`` files, the rest random (seeded): shapes from ``--input-shape``,
    symbolic dims from ``--batch``/``--dim`` and the files' shapes (:func:`refuse_unsized`: a
    dim nothing sizes is an error, never 1); of a gear model, ``--batch`` picks the batch gear."""
    from ge_sdk.cli import random_input_shapes
    from ge_sdk.inputs import random_inputs, read_feed_file

    feeds: dict[str, np.ndarray] = {}
    names = set(model.input_names)
    for spec in getattr(args, "input", None) or []:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise InputError(f"--input '{spec}' must look like name=file.npy")
        if name not in names:
            from ge_core.registry import close_matches

            raise InputError(f"--input names '{name}', which is not an input of the model{close_matches(name, names)}",
                             hint=f"inputs: {', '.join(model.input_names)}")
        feeds[name] = read_feed_file(name, path)
    shapes = random_input_shapes(getattr(args, "input_shape", None), feeds)
    gear = batch_gear_shapes(model, args)
    for k, v in gear.items():
        have = shapes.get(k, np.shape(feeds[k]) if k in feeds else v)
        if tuple(have) != v:
            raise OptionError(f"--batch {args.batch} picks the gear where input '{k}' is {list(v)}, but "
                              f"{'--input-shape' if k in shapes else '--input'} gives it {list(have)}",
                              hint="give one of them")
    shapes = {**{k: v for k, v in gear.items() if k not in feeds}, **shapes}
    model = model_for_shapes(model, feeds, shapes)  # (a gear model: the gear those shapes select)
    defaults = {v.name: v.default for v in model.graph.inputs if v.default is not None}
    dims = symbolic_dims(model, args, with_batch=not gear)
    check_shape_ranks(model, shapes)  # a wrong --input-shape first: it may be what leaves a dim unsized
    refuse_unsized(model, shapes, dims, {**defaults, **feeds})
    check_random_sizes(model.graph, shapes, dims, known={**defaults, **feeds}, default_dim=None)
    try:
        rnd = random_inputs(model.graph, check_seed(getattr(args, "seed", 0) or 0), dims, shapes=shapes,
                            known={**defaults, **feeds}, default_dim=None, option="--input-shape")
    except MemoryError:
        raise InputError("the random inputs do not fit in memory",
                         hint="give smaller dims with --input-shape, or feed inputs from files with --input") from None
    for v in model.graph.inputs:
        if v.name not in feeds and v.default is None:
            feeds[v.name] = rnd[v.name]
    return feeds


def source_onnx(opened: Opened) -> bytes:
    """The source model as serialized ONNX: the file itself for an .onnx, else the loaded graph
    written by the registered ``onnx`` frontend's exporter (a TensorFlow model, say)."""
    import ge_core as ge

    src = opened.source
    if src is None:
        raise OptionError(f"'{opened.path}' is an .om whose source model is not known here",
                          hint="give it with --source MODEL.onnx")
    if src.lower().endswith(".onnx") and os.path.isfile(src):
        with open(src, "rb") as f:
            return f.read()
    graph = ge.load(src)
    return export_graph(graph).SerializeToString()


def export_graph(graph, path: str | None = None):
    """``graph`` as an ONNX ModelProto through the ``onnx`` frontend's exporter (found by
    registry), also written to ``path`` when given."""
    from ge_core.plugins import get_host

    fe = get_host().registries.frontends.get("onnx")
    if fe is None:
        raise GEError("no 'onnx' frontend is registered, so the graph cannot be written as ONNX",
                      hint="is the ge_onnx plugin disabled (GE_DISABLE_PLUGINS)?")
    return fe.export(graph, path)


def ort_session(onnx_bytes: bytes, threads: int | None, *, optimize: bool = True):
    try:
        import onnxruntime as ort
    except ImportError:
        raise OptionError("onnxruntime is not installed", hint="pip install onnxruntime") from None
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise GEError(f"onnxruntime cannot load the source model: {type(e).__name__}: {str(e)[:300]}") from None


def run_reference(kind: str, onnx_bytes: bytes, feeds: Mapping[str, np.ndarray], threads: int | None = None,
                  *, optimize: bool = True) -> dict[str, np.ndarray]:
    """Outputs of the source model by ``kind`` (onnxruntime or onnx.reference), by output name."""
    if kind == "onnxruntime":
        sess = ort_session(onnx_bytes, threads, optimize=optimize)
        want = {i.name for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        try:
            outs = sess.run(names, {k: v for k, v in feeds.items() if k in want})
        except Exception as e:
            raise GEError(f"onnxruntime failed to run the source model: {type(e).__name__}: {str(e)[:300]}") from None
        return dict(zip(names, outs))
    if kind == "onnx.reference":
        from onnx.reference import ReferenceEvaluator

        try:
            ev = ReferenceEvaluator(onnx_bytes)
            outs = ev.run(None, {k: v for k, v in feeds.items() if k in set(ev.input_names)})
        except Exception as e:
            raise GEError(f"onnx.reference failed to run the source model: {type(e).__name__}: {str(e)[:300]}") from None
        return dict(zip(ev.output_names, outs))
    raise OptionError(f"unknown reference '{kind}'", hint=f"choose one of {', '.join(REFERENCES)}")


def with_outputs(onnx_bytes: bytes, names: list[str]) -> bytes:
    """A copy of the ONNX model with the values ``names`` added as graph outputs (untyped)."""
    import onnx
    from onnx import helper

    m = onnx.load_from_string(onnx_bytes)
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(helper.make_empty_tensor_value_info(n))
            have.add(n)
    return m.SerializeToString()


def onnx_node_outputs(onnx_bytes: bytes) -> dict[str, list[str]]:
    """``{node name: the names of the values it computes}`` of the source graph (top level; a
    node without a name is listed under its first output's name)."""
    import onnx

    m = onnx.load_from_string(onnx_bytes)
    out: dict[str, list[str]] = {}
    for n in m.graph.node:
        outs = [o for o in n.output if o]
        if outs:
            out.setdefault(n.name or outs[0], outs)
    return out


@dataclass
class Diff:
    """How one array differs from its reference."""

    name: str
    ok: bool
    max_abs: float
    max_rel: float
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "max_abs": self.max_abs, "max_rel": self.max_rel,
                **({"note": self.note} if self.note else {})}


def diff(name: str, got: Any, want: Any, rtol: float, atol: float) -> Diff:
    """``got`` against ``want``: the largest absolute and relative error, and whether every element
    is within ``atol + rtol * |want|`` (NaN where the reference has NaN counts as equal)."""
    a, b = np.asarray(got), np.asarray(want)
    if a.shape != b.shape:
        return Diff(name, False, float("inf"), float("inf"), f"shape {list(a.shape)} vs reference {list(b.shape)}")
    if a.dtype.kind not in "fciub" or b.dtype.kind not in "fciub":
        same = a.shape == b.shape and bool(np.all(a == b))
        return Diff(name, same, 0.0 if same else float("inf"), 0.0 if same else float("inf"),
                    "" if same else "values differ")
    if not a.size:
        return Diff(name, True, 0.0, 0.0)
    x, y = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(x - y)
        both_nan = np.isnan(x) & np.isnan(y)
        same_inf = np.isinf(x) & (x == y)
        err = np.where(both_nan | same_inf, 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        rel = np.where(err == 0, 0.0, err / np.maximum(np.abs(y), np.finfo(np.float64).tiny))
        ok = bool(np.all(err <= atol + rtol * np.abs(np.where(np.isfinite(y), y, 0.0))))
    note = "" if a.dtype == b.dtype else f"dtype {a.dtype} vs reference {b.dtype}"
    return Diff(name, ok, float(err.max()), float(rel.max()), note)


def check_tolerances(rtol: float, atol: float) -> None:
    for flag, v in (("--rtol", rtol), ("--atol", atol)):
        if not np.isfinite(v) or v < 0:
            raise OptionError(f"{flag} {v}: a tolerance is a finite number of at least 0")


def file_arg(path: str, what: str) -> str:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise ModelFileError(f"cannot write {what} '{path}': folder '{d}' does not exist")
    return path


def command_inputs(args: argparse.Namespace, *more: Any):
    """The files a command reads (:class:`ge_core.writes.InputFiles`): the model (with its
    external weights or data), ``--source``, the ``--input`` feed files, ``--config``,
    ``--fusion-switch-file`` and ``more``; its writers refuse to write over any of them."""
    from ge_core.writes import InputFiles

    files = InputFiles(getattr(args, "model", None), getattr(args, "source", None) if isinstance(
        getattr(args, "source", None), str) else None, getattr(args, "config", None),
        getattr(args, "fusion_switch_file", None), *more)
    for spec in getattr(args, "input", None) or []:
        if isinstance(spec, str) and "=" in spec:
            files.add(spec.partition("=")[2])
    return files


def _available_bytes() -> int:
    """Memory this process may reasonably take: MemAvailable, else the physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_seed(seed: Any) -> int:
    """``--seed``: an integer of at least 0 (NumPy's generators take no negative seed)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise OptionError(f"--seed {seed}: the seed is an integer of at least 0")
    return seed


def check_random_sizes(graph, shapes: Mapping[str, Any] | None, dims: Mapping[str, int] | None = None, *,
                       known: Mapping[str, Any] | None = None, default_dim: int | None = 1,
                       option: str = "--input-shape") -> None:
    """Refuse random inputs too large to allocate, before allocating them: an InputError naming
    the input, its shape and its byte size (a random float input takes 8 bytes per element
    while it is drawn)."""
    from ge_sdk.inputs import input_shapes

    sized = input_shapes(graph, shapes, dims, default_dim=default_dim, known=known, option=option)
    avail = _available_bytes()
    total = 0
    for v in graph.inputs:
        if v.name in (known or {}) or v.name not in sized:
            continue
        n = 1
        for d in sized[v.name]:
            n *= int(d)
        dt = np.dtype(getattr(v.type, "dtype", None) or np.float32)
        nbytes = n * dt.itemsize
        total += n * max(dt.itemsize, 8)  # drawn as 64-bit numbers, then cast
        if total > avail:
            raise InputError(f"random input '{v.name}' of shape {list(sized[v.name])} ({dt}) is {nbytes:,} bytes: "
                             f"more than the {avail:,} bytes of memory available",
                             hint=f"give smaller dims with {option}, or feed it from a file with --input")


def to_json(data: Any) -> str:
    """``data`` as strict JSON: infinities and NaN (an error where shapes differ) as the strings
    ``"inf"``, ``"-inf"``, ``"nan"``; NumPy scalars as numbers."""
    import json
    import math

    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (np.floating, np.integer, np.bool_)):
            x = x.item()
        if isinstance(x, float) and not math.isfinite(x):
            return str(x)
        return x

    return json.dumps(clean(data), indent=1, allow_nan=False, default=str)


def emit(result: Any, args: argparse.Namespace, text: Callable[[Any], str]) -> None:
    """Print ``result`` as JSON (``--json``) or as ``text(result)``, flushed (a pipe sees it at once)."""
    print(to_json(result) if args.json else text(result))
    sys.stdout.flush()


def quant_error(got: Any, want: Any) -> dict[str, Any]:
    """How far a quantised model's array is from its float origin's: the largest absolute error,
    that error over the reference's range (max - min), the signal-to-quantisation-noise ratio
    ``10 log10(sum want^2 / sum (got - want)^2)`` in dB (inf when equal) and the cosine of the
    two as vectors (1 when both are zero). Measures, not a pass/fail tolerance."""
    a, b = np.asarray(got), np.asarray(want)
    if a.shape != b.shape:
        inf = float("inf")
        return {"max_abs": inf, "max_rel_range": inf, "sqnr_db": -inf, "cosine": 0.0,
                "note": f"shape {list(a.shape)} vs reference {list(b.shape)}"}
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    if not x.size:
        return {"max_abs": 0.0, "max_rel_range": 0.0, "sqnr_db": float("inf"), "cosine": 1.0}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        e = x - y
        max_abs = float(np.max(np.abs(e)))
        span = float(np.max(y) - np.min(y)) or float(np.max(np.abs(y)))
        rel = max_abs / span if span else (0.0 if max_abs == 0 else float("inf"))
        noise, signal = float(np.dot(e, e)), float(np.dot(y, y))
        sqnr = float("inf") if noise == 0 else 10.0 * float(np.log10(signal / noise)) if signal else float("-inf")
        nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
        cos = 1.0 if nx == 0 and ny == 0 else (float(np.dot(x, y)) / (nx * ny) if nx and ny else 0.0)
    if not np.isfinite(max_abs):  # a NaN or an infinity on either side
        return {"max_abs": float("inf"), "max_rel_range": float("inf"), "sqnr_db": float("-inf"), "cosine": 0.0,
                "note": "non-finite values"}
    return {"max_abs": max_abs, "max_rel_range": rel, "sqnr_db": sqnr, "cosine": min(cos, 1.0)}


def unblock(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A value in a blocked channel layout (NCHWc: ``(N, C/b, H, W, b)``, the channels padded to a
    multiple of b) as the plain ``shape`` ``(N, C, H, W)`` it stands for; ``a`` itself when it is
    not such a value."""
    a = np.asarray(a)
    shape = tuple(shape)
    if a.shape == shape or a.ndim != len(shape) + 1 or len(shape) < 3 or a.shape[0] != shape[0] \
            or a.shape[2:-1] != shape[2:] or not 0 < shape[1] <= a.shape[1] * a.shape[-1] < shape[1] + a.shape[-1]:
        return a
    return np.moveaxis(a, -1, 2).reshape((a.shape[0], a.shape[1] * a.shape[-1], *shape[2:]))[:, :shape[1]]
