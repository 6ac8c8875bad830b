"""``ge bench MODEL``: latency percentiles and throughput of one model, the cold first run apart,
optionally beside onnxruntime on the source ONNX (same threads, interleaved blocks, an idle gap
before each timed block so neither engine runs in the other's wake); with --precision, one build per
precision mode side by side (:mod:`ge_tools.bench_precision`)."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ge_core.errors import OptionError

from .common import (
    add_model_flags,
    emit,
    is_om,
    make_feeds,
    open_model,
    ort_session,
    ran_with,
    ran_with_text,
    source_onnx,
)

#: Timed blocks per engine when --against interleaves them.
BLOCKS = 5
#: Idle seconds before each timed block with --against.
IDLE_GAP_S = 0.2


def configure(p: argparse.ArgumentParser) -> None:
    add_model_flags(p)
    p.add_argument("--warmup", type=int, default=5, metavar="N", help="untimed runs before timing (default 5)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--runs", type=int, metavar="N", help="timed runs per engine (default: as many as --time allows)")
    g.add_argument("--time", type=float, metavar="S", help="seconds of timed runs per engine (default 3)")
    p.add_argument("--threads", type=int, metavar="T",
                   help="threads per run, for this engine and onnxruntime alike (default: the model's setting; "
                        "onnxruntime then gets the CPU count)")
    p.add_argument("--concurrency", type=int, default=1, metavar="C",
                   help="requests in flight at once, through an AsyncRunner with C workers (default 1)")
    p.add_argument("--against", choices=["onnxruntime"], help="time onnxruntime on the source ONNX too")
    p.add_argument("--precision", metavar="MODES",
                   help="compile a source model once per precision mode and compare them side by side: a comma "
                        "list of fp32, bf16, fp16, all (= fp32,bf16,fp16) or ATC precision_mode names; the fp32 "
                        "build is the baseline of speed-up and output error")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def stats(seconds: list[float], wall: float, items: int) -> dict[str, Any]:
    """Latency statistics in milliseconds and throughput (runs and items per second)."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    q = np.percentile(ms, [50, 90, 99]) if ms.size else [float("nan")] * 3
    return {
        "runs": int(ms.size),
        "min_ms": float(ms.min()) if ms.size else float("nan"),
        "p50_ms": float(q[0]), "p90_ms": float(q[1]), "p99_ms": float(q[2]),
        "max_ms": float(ms.max()) if ms.size else float("nan"),
        "mean_ms": float(ms.mean()) if ms.size else float("nan"),
        "throughput_per_s": (ms.size / wall) if wall > 0 else float("nan"),
        "items_per_s": (ms.size * items / wall) if wall > 0 else float("nan"),
    }


def _timed(fn: Callable[[], Any], runs: int | None, seconds: float | None) -> tuple[list[float], float]:
    """Run ``fn`` ``runs`` times, or for ``seconds``; per-run seconds and the wall time."""
    out: list[float] = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        out.append(t1 - t0)
        if runs is not None:
            if len(out) >= runs:
                break
        elif t1 - t_start >= (seconds or 0):
            break
    return out, time.perf_counter() - t_start


def _timed_concurrent(model, feeds, concurrency: int, runs: int | None, seconds: float | None) -> tuple[list[float], float]:
    """``concurrency`` requests in flight through an AsyncRunner (queue 0: a request is submitted
    when a worker is free, so its latency is its service time)."""
    from ge_core import AsyncRunner

    lat: list[float] = []
    t_start = time.perf_counter()
    with AsyncRunner(model, jobs=concurrency, queue=0) as runner:
        futs = []
        n = 0
        while True:
            f = runner.submit(feeds)
            f.add_done_callback(_stopwatch(lat, time.perf_counter()))
            futs.append(f)
            n += 1
            if runs is not None:
                if n >= runs:
                    break
            elif time.perf_counter() - t_start >= (seconds or 0):
                break
        for f in futs:
            f.result()
    return lat, time.perf_counter() - t_start


def _stopwatch(into: list[float], t0: float) -> Callable[[Any], None]:
    """A done-callback that appends the seconds since ``t0``."""

    def done(_future: Any) -> None:
        into.append(time.perf_counter() - t0)

    return done


def _positive(flag: str, v: int | float | None, low: float = 1) -> None:
    if v is not None and (not np.isfinite(v) or v < low):
        raise OptionError(f"{flag} {v}: give a number of at least {low:g}")


def batch_items(feeds: dict[str, np.ndarray], model) -> int:
    for a in model.inputs:
        if a.shape and isinstance(a.shape[0], str) and a.name in feeds and np.ndim(feeds[a.name]):
            return int(np.shape(feeds[a.name])[0])
    return 1


def check_flags(args: argparse.Namespace) -> float | None:
    """OptionError for a bad count or duration; the timed seconds per engine (None: --runs counts)."""
    _positive("--warmup", args.warmup, 0)
    _positive("--runs", args.runs)
    _positive("--time", args.time, 0.001)
    _positive("--threads", args.threads)
    _positive("--concurrency", args.concurrency)
    return None if args.runs is not None else (args.time if args.time is not None else 3.0)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Measure; returns what ``--json`` prints."""
    seconds = check_flags(args)
    opened = open_model(args, threads=args.threads)
    model = opened.model
    feeds = make_feeds(model, args)
    items = batch_items(feeds, model)
    t0 = time.perf_counter()
    model.run(feeds)
    cold = time.perf_counter() - t0
    result: dict[str, Any] = {
        "model": opened.path,
        **ran_with(model, feeds),  # inputs, threads (as run: the option or the pool's width), gear
        "concurrency": args.concurrency,
        "batch": items,
        ("load_seconds" if is_om(opened.path) else "compile_seconds"): opened.compile_seconds,
        "cold_first_run_ms": cold * 1e3,
        "warmup": args.warmup,
        "engines": {},
    }
    engines: dict[str, Callable[[], Any]] = {"ge": lambda: model.run(feeds)}
    if args.against == "onnxruntime":
        threads = args.threads or model.options.threads or os.cpu_count() or 1
        sess = ort_session(source_onnx(opened), threads)
        want = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in want}
        t0 = time.perf_counter()
        sess.run(None, ort_feeds)
        result["onnxruntime_cold_first_run_ms"] = (time.perf_counter() - t0) * 1e3
        result["onnxruntime_threads"] = threads
        engines["onnxruntime"] = lambda: sess.run(None, ort_feeds)
    for name, (lat, w) in time_interleaved(engines, args, seconds, {"ge": model}, feeds).items():
        result["engines"][name] = stats(lat, w, items)
    if "onnxruntime" in engines:
        a, b2 = result["engines"]["ge"]["p50_ms"], result["engines"]["onnxruntime"]["p50_ms"]
        result["p50_ratio_ge_over_onnxruntime"] = a / b2 if b2 else float("nan")
    return result


def time_interleaved(engines: dict[str, Callable[[], Any]], args: argparse.Namespace, seconds: float | None,
                     models: dict[str, Any], feeds: dict[str, np.ndarray]) -> dict[str, tuple[list[float], float]]:
    """Warm up, then time each engine: ``{name: (per-run seconds, wall seconds)}``. Several engines
    run in BLOCKS interleaved blocks with IDLE_GAP_S idle before each (neither runs in the other's
    wake); with --concurrency, an engine of ``models`` (name -> CompiledModel) through an
    AsyncRunner, the others from threads."""
    for fn in engines.values():
        for _ in range(args.warmup):
            fn()
    per: dict[str, list[float]] = {k: [] for k in engines}
    wall: dict[str, float] = {k: 0.0 for k in engines}
    blocks = BLOCKS if len(engines) > 1 else 1
    for b in range(blocks):
        for name, fn in engines.items():
            n = None
            if args.runs is not None:
                n = args.runs // blocks + (1 if b < args.runs % blocks else 0)
                if n == 0:
                    continue
            s = None if seconds is None else seconds / blocks
            if len(engines) > 1:
                time.sleep(IDLE_GAP_S)
            if name in models and args.concurrency > 1:
                lat, w = _timed_concurrent(models[name], feeds, args.concurrency, n, s)
            elif args.concurrency > 1:
                lat, w = _timed_threads(fn, args.concurrency, n, s)
            else:
                lat, w = _timed(fn, n, s)
            per[name] += lat
            wall[name] += w
    return {k: (per[k], wall[k]) for k in engines}


def _timed_threads(fn: Callable[[], Any], concurrency: int, runs: int | None, seconds: float | None):
    """``concurrency`` threads calling ``fn`` (onnxruntime's session is thread-safe) for the same budget."""
    from concurrent.futures import ThreadPoolExecutor

    lat: list[float] = []
    t_start = time.perf_counter()
    per = None if runs is None else max(1, runs // concurrency)

    def worker() -> list[float]:
        out, _ = _timed(fn, per, seconds)
        return out

    with ThreadPoolExecutor(concurrency) as ex:
        for r in ex.map(lambda _i: worker(), range(concurrency)):
            lat += r
    return lat, time.perf_counter() - t_start


def format_table(result: dict[str, Any]) -> str:
    cols = ("runs", "min", "p50", "p90", "p99", "max", "mean")
    rows = [("engine",) + cols + ("runs/s", "items/s")]
    for name, s in result["engines"].items():
        rows.append((name, str(s["runs"]), *(f"{s[c + '_ms']:.3f}" for c in cols[1:]),
                     f"{s['throughput_per_s']:.1f}", f"{s['items_per_s']:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    head = [f"model {result['model']}: {ran_with_text(result)}; concurrency {result['concurrency']}"]
    setup = "load" if "load_seconds" in result else "compile"
    head.append(f"{setup} {result.get(setup + '_seconds') or 0:.3f} s; cold first run {result['cold_first_run_ms']:.3f} ms"
                + (f" (onnxruntime {result['onnxruntime_cold_first_run_ms']:.3f} ms)"
                   if "onnxruntime_cold_first_run_ms" in result else "")
                + f"; then {result['warmup']} warm-up runs")
    head.append("latency in ms over the warm runs:")
    tail = []
    if "p50_ratio_ge_over_onnxruntime" in result:
        tail.append(f"p50 ge / onnxruntime = {result['p50_ratio_ge_over_onnxruntime']:.2f} "
                    f"(onnxruntime at {result['onnxruntime_threads']} threads; {BLOCKS} interleaved blocks each, "
                    f"{IDLE_GAP_S:g} s idle before each)")
    return "\n".join(head + lines + tail)


def run(args: argparse.Namespace) -> int:
    if args.precision is not None:
        from .bench_precision import bench_precision, format_precision_table

        emit(bench_precision(args), args, format_precision_table)
        return 0
    emit(bench(args), args, format_table)
    return 0
