"""``ge profile MODEL.om``: per-op timing table and a Chrome/Perfetto trace with one track per stream.

The model runs on the interpreted executor matching its schedule (multi-stream when it has
several streams, else the arena executor) with each kernel wrapped by a timer; the first run
warms up, the following ones are recorded.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np

from ge_core.kernel import caps, copy_caps


def profile(model, feeds: dict[str, np.ndarray], runs: int = 5) -> dict[str, Any]:
    """Time every kernel over ``runs`` runs; returns rows per op type, per node, and trace events."""
    from ge_core.memory import MemoryPlan

    from .arena import ArenaExecutable
    from .executable import CpuExecutable
    from .streams import MultiStreamExecutable

    model = model.model_for(feeds)  # (a gear model: the gear of the feeds' shapes)
    kernels = model.registries.kernels_for("cpu")
    plan = model.memory_plan or MemoryPlan({}, 0, "none")
    if model.streams.count > 1:
        exe: CpuExecutable = MultiStreamExecutable(model.graph, kernels, model.options, plan, model.streams)
    else:
        exe = ArenaExecutable(model.graph, kernels, model.options, plan)
    order = {n: i for i, n in enumerate(model.graph.node_list())}
    stream_of = {st.node: model.streams.streams[order[st.node]] for st in exe.steps}
    events: list[tuple[int, float, float]] = []
    lock = threading.Lock()
    recording = [False]

    def timed(i, fn):
        def call(*a, **kw):
            t0 = time.perf_counter()
            r = fn(*a, **kw)
            t1 = time.perf_counter()
            if recording[0]:
                with lock:
                    events.append((i, t0, t1))
            return r

        return copy_caps(call, fn)

    for i, st in enumerate(exe.steps):
        st.fn = timed(i, st.fn)
    exe.run(feeds)  # warm-up
    recording[0] = True
    t_start = time.perf_counter()
    for _ in range(runs):
        exe.run(feeds)
    wall = (time.perf_counter() - t_start) / runs
    per_node: dict[int, float] = {}
    for i, t0, t1 in events:
        per_node[i] = per_node.get(i, 0.0) + (t1 - t0)
    total = sum(per_node.values()) or 1e-12
    by_op: dict[str, dict[str, Any]] = {}
    nodes = []
    for i, secs in per_node.items():
        st = exe.steps[i]
        op = st.node.qualified_op
        row = by_op.setdefault(op, {"op": op, "seconds": 0.0, "count": 0, "streams": set()})
        row["seconds"] += secs / runs
        row["count"] += 1
        row["streams"].add(stream_of[st.node])
        nodes.append({"node": st.node.name, "op": op, "stream": stream_of[st.node], "seconds": secs / runs,
                      "kernel_mode": caps(st.fn).mode})
    ops = sorted(by_op.values(), key=lambda r: -r["seconds"])
    for r in ops:
        r["share"] = r["seconds"] * runs / total
        r["streams"] = sorted(r["streams"])
    nodes.sort(key=lambda r: -r["seconds"])
    base = min((t0 for _, t0, _ in events), default=0.0)
    trace = [{"name": exe.steps[i].node.name, "cat": exe.steps[i].node.qualified_op, "ph": "X",
              "ts": (t0 - base) * 1e6, "dur": (t1 - t0) * 1e6, "pid": 0, "tid": stream_of[exe.steps[i].node]}
             for i, t0, t1 in events]
    trace += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stream {s}"}}
              for s in range(model.streams.count)]
    threads = exe.width if exe.parallel == "engine" else exe.threads  # (None: BLAS's default)
    return {"wall_seconds": wall, "kernel_seconds": total / runs, "runs": runs, "threads": threads,
            "inputs": {k: {"dtype": str(v.dtype), "shape": list(np.shape(v))} for k, v in feeds.items()},
            "ops": ops, "nodes": nodes,
            "trace": {"traceEvents": trace, "displayTimeUnit": "ms"}}


def configure(p) -> None:
    p.add_argument("model", help="compiled .om file")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--trace", metavar="FILE.json", help="Chrome/Perfetto trace (default: MODEL.trace.json in the current folder)")
    p.add_argument("--top", type=int, default=10, help="slowest nodes to list")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    p.add_argument("--input-shape", dest="input_shape", metavar='"NAME:D1,D2,...;..."',
                   help='shapes of the random inputs, e.g. "x:2,3,224,224;y:2,7"; every symbolic dim needs one '
                        "(never guessed); of a gear model, the shapes of the gear to profile")
    p.add_argument("--threads", type=int, metavar="T", help="threads per run (default: the model's setting)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--json", action="store_true")


def _feeds(loaded, args) -> tuple[Any, dict[str, np.ndarray]]:
    """The compiled model to profile (of a gear model: the gear the fed and ``--input-shape``
    shapes select, the first when they set none) and its checked feeds: ``--input`` files, the
    rest random with ``--input-shape``'s shapes; a symbolic dim nothing sizes is an InputError
    (a dim declared with a one-value range takes that value), never 1."""
    from ge_core.errors import OptionError
    from ge_sdk.cli import feed_arg, random_input_shapes  # feed_arg: NAME=FILE.npy as ge run reads it
    from ge_sdk.inputs import random_inputs

    if isinstance(args.seed, bool) or not isinstance(args.seed, int) or args.seed < 0:
        raise OptionError(f"--seed {args.seed}: the seed is an integer of at least 0")
    feeds = dict(feed_arg(s) for s in args.input or [])
    shapes = random_input_shapes(args.input_shape, feeds)
    sized = {n: np.broadcast_to(np.zeros((), np.float32), tuple(d)) for n, d in shapes.items()
             if all(type(x) is int and x >= 0 for x in d)}  # (shapes only, to pick a gear: no memory)
    model = loaded.model_for({**sized, **feeds})
    defaults = {v.name: v.default for v in model.graph.inputs if v.default is not None}
    dims = {k: lo for k, (lo, hi) in (getattr(model, "dim_ranges", None) or {}).items() if lo == hi}
    rnd = random_inputs(model.graph, args.seed, dims, shapes=shapes, known={**defaults, **feeds}, default_dim=None,
                        option="--input-shape")
    for v in model.graph.inputs:
        if v.name not in feeds and v.default is None:
            feeds[v.name] = rnd[v.name]
    return model, model.check_feeds(feeds)


def run(args) -> int:
    import ge_core as ge
    from ge_core.errors import OptionError
    from ge_core.writes import InputFiles, check_target, write_json_atomic

    if args.threads is not None and args.threads < 1:
        raise OptionError(f"--threads {args.threads}: give a positive number")
    trace_path = args.trace or os.path.splitext(os.path.basename(args.model))[0] + ".trace.json"
    inputs = InputFiles(args.model, *(s.partition("=")[2] for s in args.input or [] if "=" in s))
    check_target(inputs.check(trace_path, "--trace"), "the trace")  # never over the .om or a feed file
    loaded = ge.load_om(args.model, threads=args.threads)
    model, feeds = _feeds(loaded, args)
    result = profile(model, feeds, runs=max(1, args.runs))
    table, gears = getattr(loaded, "table", None), list(getattr(loaded, "models", None) or ())
    if table is not None and model in gears:  # say which gear ran
        result["gear"] = f"{table.gear_text(gears.index(model))} of {table.describe()}"
    write_json_atomic(trace_path, result.pop("trace"), "the trace", inputs=inputs, flag="--trace")
    if args.json:
        print(json.dumps({**result, "trace": trace_path}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False)
    ins = ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in result["inputs"].items()) or "none"
    gear = f"; {result['gear']}" if result.get("gear") else ""
    con.print(f"inputs {ins}; threads {result['threads'] if result['threads'] is not None else 'BLAS default'}{gear}",
              markup=False, soft_wrap=True)
    t = Table(title=f"{args.model}: {result['wall_seconds'] * 1e3:.2f} ms per run, "
                    f"{result['kernel_seconds'] * 1e3:.2f} ms in kernels ({result['runs']} runs)")
    for c in ("op", "ms", "share", "nodes", "streams"):
        t.add_column(c, justify="right" if c != "op" else "left")
    for r in result["ops"]:
        t.add_row(r["op"], f"{r['seconds'] * 1e3:.3f}", f"{r['share'] * 100:.1f}%", str(r["count"]),
                  ",".join(map(str, r["streams"])))
    con.print(t)
    n = Table(title=f"slowest {args.top} nodes")
    for c in ("node", "op", "stream", "ms"):
        n.add_column(c)
    for r in result["nodes"][: args.top]:
        n.add_row(r["node"], r["op"], str(r["stream"]), f"{r['seconds'] * 1e3:.3f}")
    con.print(n)
    con.print(f"trace: {trace_path} (open in chrome://tracing or ui.perfetto.dev)")
    return 0
