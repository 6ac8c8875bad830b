"""``ge bench MODEL --precision fp32,bf16,fp16``: the source model compiled once per precision mode
(compile option ``precision_mode``, the other options alike), the builds timed interleaved on the
same feeds, each one's speed-up and output error against the fp32 build (must_keep_origin_dtype,
always built: the baseline), with the compile report's precision summary."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ge_core.errors import OptionError

from .bench import BLOCKS, IDLE_GAP_S, batch_items, check_flags, stats, time_interleaved
from .common import is_om, make_feeds, open_model, ort_session, source_onnx

#: Short names of the precision modes ``--precision`` takes beside ATC's own names.
SHORT = {"fp32": "must_keep_origin_dtype", "bf16": "allow_mix_precision_bf16", "fp16": "force_fp16"}
#: What ``--precision all`` stands for.
ALL = ("fp32", "bf16", "fp16")
BASELINE = "must_keep_origin_dtype"


#: ATC's precision_mode values (its documented flag). The plugin that registers the option (ge_atc,
#: reached through the option registry only) checks each again when it compiles.
ATC_MODES = ("must_keep_origin_dtype", "force_fp32", "cube_fp16in_fp32out", "force_fp16", "allow_fp32_to_fp16",
             "allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16", "allow_fp32_to_bf16")


def atc_modes() -> tuple[str, ...]:
    """ATC's precision modes; OptionError when no plugin registers option ``precision_mode``."""
    from ge_core.plugins import get_host

    if "precision_mode" not in get_host().registries.options:
        raise OptionError("--precision needs compile option precision_mode, which no plugin registers",
                          hint="is the ge_atc plugin installed and enabled (GE_DISABLE_PLUGINS)?")
    return ATC_MODES


def parse_modes(spec: str) -> dict[str, str]:
    """``--precision``'s list as ``{row label: ATC mode}`` in the order given (a mode named twice
    once), the fp32 baseline first when the list leaves it out; OptionError for an unknown name."""
    modes = atc_modes()
    names = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not names:
        raise OptionError("--precision: give a comma list of precision modes",
                          hint=f"e.g. --precision fp32,bf16,fp16; names: {', '.join(valid_names(modes))}")
    out: dict[str, str] = {}
    for name in names:
        for label in (ALL if name == "all" else (name,)):
            mode = SHORT.get(label, label)
            if mode not in modes:
                from ge_core.registry import close_matches

                raise OptionError(f"--precision: unknown precision mode '{label}'"
                                  f"{close_matches(label, valid_names(modes))}",
                                  hint=f"valid names: {', '.join(valid_names(modes))}")
            if mode not in out.values():
                out[label] = mode
    if BASELINE not in out.values():
        out = {"fp32": BASELINE, **out}
    return out


def valid_names(modes: tuple[str, ...]) -> list[str]:
    return [*SHORT, "all", *modes]


def precision_summary(report: Any) -> dict[str, Any] | None:
    """The compile report's ``precision`` table in brief: its scalar entries (mode, weights_dtype,
    weights_bytes_saved, ...) and flat dicts of them, the number of nodes it lists and how many of
    them compute in, read weights of, or run a kernel of each kind. None when there is no table."""
    table = report.get("precision") if isinstance(report, dict) else None
    if not isinstance(table, dict):
        return None
    scalar = (str, int, float, bool, type(None))
    out: dict[str, Any] = {k: v for k, v in table.items() if k != "nodes" and (isinstance(v, scalar) or (
        isinstance(v, dict) and all(isinstance(x, scalar) for x in v.values())))}
    nodes = table.get("nodes")
    if isinstance(nodes, dict):
        out["nodes"] = len(nodes)
        for key in ("compute", "weights", "kernel"):
            counts: dict[str, int] = {}
            for spec in nodes.values():
                if isinstance(spec, dict) and isinstance(spec.get(key), str) and spec[key]:
                    counts[spec[key]] = counts.get(spec[key], 0) + 1
            out[f"nodes_by_{key}"] = dict(sorted(counts.items()))
    return out


def output_error(got: Any, ref: Any) -> dict[str, Any]:
    """How ``got`` differs from the baseline output ``ref``: the largest absolute error, that over
    the range (max - min) of ``ref``, and the cosine similarity of the two, flattened."""
    a, b = np.asarray(got), np.asarray(ref)
    if a.shape != b.shape:
        return {"max_abs": float("inf"), "max_abs_over_range": float("inf"), "cosine": float("nan"),
                "note": f"shape {list(a.shape)} vs fp32 {list(b.shape)}"}
    if a.dtype.kind not in "fiub" or b.dtype.kind not in "fiub" or not a.size:
        same = bool(np.array_equal(a, b))
        return {"max_abs": 0.0 if same else float("inf"), "max_abs_over_range": 0.0 if same else float("inf"),
                "cosine": 1.0 if same else float("nan")}
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = float(np.max(np.abs(x - y)))
        fin = y[np.isfinite(y)]
        span = float(fin.max() - fin.min()) if fin.size else 0.0
        span = span or (float(np.abs(fin).max()) if fin.size else 0.0)
        rel = err / span if span else (0.0 if err == 0 else float("inf"))
        nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
        if np.array_equal(x, y):
            cos = 1.0
        else:
            cos = float(np.dot(x, y) / (nx * ny)) if nx and ny else 0.0
    return {"max_abs": err, "max_abs_over_range": rel, "cosine": min(cos, 1.0)}


def _compile_all(args: argparse.Namespace, modes: dict[str, str]) -> dict[str, Any]:
    """``{label: Opened}``: the source model compiled once per mode, the other options alike."""
    from ge_sdk.cli import parse_kv

    if is_om(os.fspath(args.model)):
        raise OptionError(f"--precision: '{args.model}' is an .om, whose precision was fixed when it was compiled",
                          hint="pass the source model instead (the .onnx it was compiled from, say): it is "
                               "compiled once per precision mode")
    if "precision_mode" in parse_kv(getattr(args, "option", None), "--option"):
        raise OptionError("--precision and --option precision_mode=... both set the precision mode",
                          hint="give the modes with --precision only")
    return {label: open_model(args, threads=args.threads, precision_mode=mode) for label, mode in modes.items()}


def bench_precision(args: argparse.Namespace) -> dict[str, Any]:
    """Compile per mode, run each build once cold (its outputs compared with the fp32 build's), then
    time them interleaved; returns what ``--json`` prints."""
    seconds = check_flags(args)
    modes = parse_modes(args.precision)
    opened = _compile_all(args, modes)
    base = next(label for label, mode in modes.items() if mode == BASELINE)
    first = opened[base].model
    feeds = make_feeds(first, args)
    items = batch_items(feeds, first)
    rows: dict[str, dict[str, Any]] = {}
    outs: dict[str, dict[str, Any]] = {}
    engines: dict[str, Callable[[], Any]] = {}
    for label, o in opened.items():
        t0 = time.perf_counter()
        outs[label] = o.model.run(feeds)
        rows[label] = {"precision_mode": modes[label], "compile_seconds": o.compile_seconds,
                       "cold_first_run_ms": (time.perf_counter() - t0) * 1e3,
                       "precision": precision_summary(o.model.report)}
        engines[label] = (lambda m: lambda: m.run(feeds))(o.model)
    result: dict[str, Any] = {
        "model": opened[base].path, "threads": first.options.threads, "concurrency": args.concurrency,
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(np.shape(v))} for k, v in feeds.items()},
        "batch": items, "warmup": args.warmup, "blocks": BLOCKS if len(opened) > 1 or args.against else 1,
        "baseline": base, "rows": rows,
    }
    if args.against == "onnxruntime":
        threads = args.threads or first.options.threads or os.cpu_count() or 1
        sess = ort_session(source_onnx(opened[base]), threads)
        want = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in want}
        names = [x.name for x in sess.get_outputs()]
        t0 = time.perf_counter()
        outs["onnxruntime"] = dict(zip(names, sess.run(names, ort_feeds)))
        rows["onnxruntime"] = {"precision_mode": None, "compile_seconds": None,
                               "cold_first_run_ms": (time.perf_counter() - t0) * 1e3, "precision": None}
        result["onnxruntime_threads"] = threads
        engines["onnxruntime"] = lambda: sess.run(None, ort_feeds)
    models = {label: o.model for label, o in opened.items()}
    for label, (lat, w) in time_interleaved(engines, args, seconds, models, feeds).items():
        rows[label].update(stats(lat, w, items))
    ref_p50 = rows[base]["p50_ms"]
    for label, row in rows.items():
        row["speedup_vs_fp32"] = ref_p50 / row["p50_ms"] if row["p50_ms"] else float("nan")
        row["outputs"] = {n: output_error(outs[label][n], r) for n, r in outs[base].items() if n in outs[label]}
    return result


def _cells(label: str, row: dict[str, Any]) -> list[str]:
    comp = row.get("compile_seconds")
    return [label, row.get("precision_mode") or "-", "-" if comp is None else f"{comp:.3f}",
            f"{row['p50_ms']:.3f}", f"{row['p90_ms']:.3f}", f"{row['speedup_vs_fp32']:.2f}"]


def _summary_line(label: str, p: dict[str, Any]) -> str:
    parts = [f"{p.get('nodes', 0)} node(s) listed"]
    for key in ("weights", "compute", "kernel"):
        counts = p.get(f"nodes_by_{key}") or {}
        if counts:
            parts.append(f"{key} " + ", ".join(f"{d} {n}" for d, n in counts.items()))
    if isinstance(p.get("weights_bytes_saved"), int):
        parts.append(f"{p['weights_bytes_saved']:,} weight bytes saved")
    return f"  {label} ({p.get('mode', '?')}): " + "; ".join(parts)


def format_precision_table(result: dict[str, Any]) -> str:
    """One row per build (a row per further output beneath it): mode, compile seconds, p50/p90,
    speed-up and output error against the fp32 build; then the precision summaries."""
    head = ["mode", "precision_mode", "compile s", "p50 ms", "p90 ms", "speed-up",
            "output", "max abs", "abs/range", "cosine"]
    rows = [head]
    for label, row in result["rows"].items():
        cells = _cells(label, row)
        errs = list(row["outputs"].items()) or [("-", None)]
        for i, (name, e) in enumerate(errs):
            err = ["-"] * 3 if e is None else [f"{e['max_abs']:.3g}", f"{e['max_abs_over_range']:.2e}",
                                                f"{e['cosine']:.8f}"]
            rows.append((cells if i == 0 else [""] * len(cells)) + [name] + err)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i in (0, 1, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    ins = ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in result["inputs"].items())
    thr = result["threads"] if result["threads"] is not None else "default"
    top = [f"model {result['model']}: inputs {ins}; threads {thr}; concurrency {result['concurrency']}",
           f"one build per precision mode, {result['warmup']} warm-up runs each, then {result['blocks']} interleaved "
           f"block(s) ({IDLE_GAP_S:g} s idle before each); speed-up and error against the {result['baseline']} build:"]
    tail = [_summary_line(k, r["precision"]) for k, r in result["rows"].items() if r.get("precision")]
    return "\n".join(top + lines + (["compile report's precision table:"] + tail if tail else []))


#: options that choose a precision (left out of the float32 build an error is measured against)
PRECISION_OPTIONS = ("precision_mode", "keep_dtype", "modify_mixlist")


def error_vs_fp32(source: Any, opts: dict[str, Any], model: Any) -> dict[str, Any]:
    """``ge compile``'s measured error of a reduced-precision build: ``model`` (compiled from
    ``source`` with ``opts``) and this engine's float32 build of the same source on the same
    random inputs (seed 0), per float output (:func:`output_error`)."""
    import ge_core as ge
    from ge_sdk.inputs import random_inputs

    feeds = {k: v for k, v in random_inputs(model.graph, 0).items() if k in model.input_names}
    base = {k: v for k, v in opts.items() if k not in PRECISION_OPTIONS}
    got, ref = model.run(feeds), ge.compile(source, base).run(feeds)
    outs = {name: output_error(got[name], ref[name]) for name in got
            if name in ref and np.asarray(ref[name]).dtype.kind == "f"}
    return {"against": "this engine's float32 build", "inputs": "random, seed 0", "outputs": outs}
