"""Fusion on vs off: the nine light models and a chain of eight elementwise ops.

Both variants of each model are compiled in this one process and run interleaved, round by
round, on the same inputs, so machine noise hits them alike. Prints the median latency per
model with fusion on and off, kernel launches of each, and the speed-up; then the same for a
chain of eight elementwise ops on 4M float32 elements (one generated kernel vs eight), and
the row kernels (Softmax, LayerNorm, GELU) fused vs unfused vs onnxruntime.

    python bench/fusion.py [--rounds 5] [--models resnet50,vgg19] [--chain-only] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import onnx
from rich.console import Console
from rich.table import Table

import ge_core as ge
from ge_sdk.testing import GraphBuilder

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
OFF = {"disabled_passes": ["pattern_fusion", "auto_fusion"]}


def chain_graph(n: int = 1 << 22) -> ge.Graph:
    """x -> Mul -> Add -> Relu -> Mul(x) -> Sub -> Abs -> Sqrt -> Neg: eight elementwise ops."""
    b = GraphBuilder("chain")
    x = b.input("x", "float32", (n,))
    t = b.Mul(x, np.float32(1.7))
    t = b.Add(t, np.float32(0.3))
    t = b.Relu(t)
    t = b.Mul(t, x)
    t = b.Sub(t, np.float32(0.25))
    t = b.Abs(t)
    t = b.Sqrt(t)
    b.output(b.Neg(t))
    return b.build()


def row_graph(op: str, shape: tuple) -> ge.Graph:
    """Softmax / LayerNormalization over the last axis, or the erf form of GELU, on ``shape``."""
    b = GraphBuilder(op)
    b.graph.opset_imports[""] = 17
    x = b.input("x", "float32", shape)
    d = shape[-1]
    if op == "Softmax":
        b.output(b.Softmax(x, axis=-1))
    elif op == "LayerNormalization":
        r = np.random.default_rng(0)
        b.output(b.LayerNormalization(x, b.const(r.random(d).astype(np.float32)),
                                      b.const(r.random(d).astype(np.float32)), axis=-1))
    else:
        e = b.Erf(b.Div(x, np.float32(math.sqrt(2))))
        b.output(b.Mul(b.Mul(x, b.Add(e, np.float32(1.0))), np.float32(0.5)))
    return b.build()


def side_by_side(g: ge.Graph, feeds: dict, extra: dict, rounds: int, ort_one_thread: bool = False):
    """Median seconds of ``g`` fused, unfused and in onnxruntime (also on one thread when asked),
    interleaved; outputs checked equal."""
    on = ge.compile(g, dict(extra))
    off = ge.compile(g, {**OFF, **extra})
    np.testing.assert_allclose(on.run(feeds)[on.output_names[0]], off.run(feeds)[off.output_names[0]],
                               rtol=1e-5, atol=1e-6)
    runs: dict[str, object] = {"on": on, "off": off}
    try:
        import onnxruntime as ort

        from ge_core.plugins import get_host

        proto = get_host().registries.frontends.get("onnx").export(g)
        so = ort.SessionOptions()
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])

        class _Ort:
            def __init__(self, session):
                self.session = session

            def run(self, f):
                return self.session.run(None, f)

        runs["onnxruntime"] = _Ort(sess)
        if ort_one_thread:
            so.intra_op_num_threads = 1
            runs["onnxruntime 1 thread"] = _Ort(ort.InferenceSession(proto.SerializeToString(), so,
                                                                    providers=["CPUExecutionProvider"]))
    except ImportError:
        pass
    return interleaved(runs, feeds, rounds), on, off


def interleaved(runs: dict[str, object], feeds: dict, rounds: int) -> dict[str, float]:
    """Median seconds per variant, variants alternating within each round (order flipped each round)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for k in names:  # warm-up
        runs[k].run(feeds)  # type: ignore[attr-defined]
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            runs[k].run(feeds)  # type: ignore[attr-defined]
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="", help="comma-separated light model names (default: all nine)")
    ap.add_argument("--chain-only", action="store_true", help="only the elementwise chain")
    ap.add_argument("--threads", type=int, default=0, help="BLAS threads for the engine (0: default)")
    args = ap.parse_args(argv)
    con = Console(width=120)
    extra = {"threads": args.threads} if args.threads else {}
    rng = np.random.default_rng(0)
    ratios = []
    if not args.chain_only:
        names = sorted(f[6:-5] for f in os.listdir(LIGHT) if f.endswith(".onnx"))
        if args.models:
            names = [n for n in names if n in args.models.split(",")]
        table = Table(title=f"light models, fusion on vs off (median of {args.rounds} interleaved rounds)")
        for col in ("model", "kernels on", "kernels off", "ms on", "ms off", "speed-up"):
            table.add_column(col, justify="right" if col != "model" else "left")
        for name in names:
            g = ge.load(os.path.join(LIGHT, f"light_{name}.onnx"))
            on = ge.compile(g, dict(extra))
            off = ge.compile(g, {**OFF, **extra})
            feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.type.shape or ()])
                     .astype(np.float32) for i in g.inputs}
            med = interleaved({"on": on, "off": off}, feeds, args.rounds)
            ratios.append(med["off"] / med["on"])
            table.add_row(name, str(on.report["kernels"]), str(off.report["kernels"]), f"{med['on'] * 1e3:.1f}",
                          f"{med['off'] * 1e3:.1f}", f"{med['off'] / med['on']:.2f}x")
        con.print(table)
        if ratios:
            con.print(f"geometric mean speed-up: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")
    rounds = max(args.rounds, 7)
    feeds = {"x": rng.standard_normal(1 << 22).astype(np.float32)}
    med, on, off = side_by_side(chain_graph(), feeds, extra, rounds)
    speedup = med["off"] / med["on"]
    modes = ", ".join(f"{k}" for k in on.report.get("kernel_modes", {})) or "?"
    con.print(f"elementwise chain, 8 ops on 4M float32: fused {med['on'] * 1e3:.1f} ms ({on.report['kernels']} {modes} kernel), "
              f"unfused {med['off'] * 1e3:.1f} ms ({off.report['kernels']} kernels): {speedup:.2f}x")
    if "onnxruntime" in med:
        con.print(f"  onnxruntime {med['onnxruntime'] * 1e3:.1f} ms: ge fused / onnxruntime = "
                  f"{med['on'] / med['onnxruntime']:.2f}")
    if not args.chain_only:
        table = Table(title=f"row kernels (median of {rounds} interleaved rounds, ms)")
        for col in ("op", "shape", "fused", "unfused", "onnxruntime", "ort 1 thread", "fused / ort", "fused / ort 1t"):
            table.add_column(col, justify="right" if col not in ("op", "shape") else "left")
        for op, shape in (("Softmax", (8192, 768)), ("LayerNormalization", (8192, 768)), ("Gelu", (8192, 3072))):
            g = row_graph(op, shape)
            m, _, _ = side_by_side(g, {"x": rng.standard_normal(shape).astype(np.float32)}, extra, rounds, True)
            o, o1 = m.get("onnxruntime", math.nan), m.get("onnxruntime 1 thread", math.nan)
            table.add_row(op, "x".join(map(str, shape)), f"{m['on'] * 1e3:.2f}", f"{m['off'] * 1e3:.2f}",
                          f"{o * 1e3:.2f}", f"{o1 * 1e3:.2f}", f"{m['on'] / o:.2f}", f"{m['on'] / o1:.2f}")
        con.print(table)
    return 0 if speedup >= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
