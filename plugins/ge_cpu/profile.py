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
    return {"wall_seconds": wall, "kernel_seconds": total / runs, "runs": runs, "ops": ops, "nodes": nodes,
            "trace": {"traceEvents": trace, "displayTimeUnit": "ms"}}


def configure(p) -> None:
    p.add_argument("model", help="compiled .om file")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--trace", metavar="FILE.json", help="Chrome/Perfetto trace (default: MODEL.trace.json in the current folder)")
    p.add_argument("--top", type=int, default=10, help="slowest nodes to list")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    p.add_argument("--json", action="store_true")


def run(args) -> int:
    import ge_core as ge
    from ge_core.writes import InputFiles, check_target, write_json_atomic
    from ge_sdk.cli import feed_arg, random_feeds  # feed_arg: NAME=FILE.npy as ge run reads it

    trace_path = args.trace or os.path.splitext(os.path.basename(args.model))[0] + ".trace.json"
    inputs = InputFiles(args.model, *(s.partition("=")[2] for s in args.input or [] if "=" in s))
    check_target(inputs.check(trace_path, "--trace"), "the trace")  # never over the .om or a feed file
    loaded = ge.load_om(args.model)
    feeds = dict(feed_arg(s) for s in args.input or [])
    # the compiled model that runs them (of a gear model: the gear of the given inputs' shapes,
    # the first gear when they do not set it), whose inputs the random ones follow
    model = loaded.model_for(feeds)
    for k, v in random_feeds(model).items():
        feeds.setdefault(k, v)
    result = profile(model, model.check_feeds(feeds), runs=max(1, args.runs))
    write_json_atomic(trace_path, result.pop("trace"), "the trace", inputs=inputs, flag="--trace")
    if args.json:
        print(json.dumps({**result, "trace": trace_path}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False)
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
