"""Scaling of the default optimisation pipeline, side by side with onnxsim and onnxoptimizer.

Builds synthetic ONNX models of about 10k, 30k and 100k nodes made of a repeated block that holds
every redundancy the standard passes remove (Identity, Dropout, x*1, x+0, cancelling Transpose
and Reshape pairs, Shape arithmetic, constant-fed arithmetic, duplicate constants, duplicate
subexpressions, dead branches), runs this engine's prepare + optimize stages (default level) on
each, and prints the time, the time per node and the node count after, next to onnxsim's and
onnxoptimizer's on the same models. Linear scaling shows as a flat time per node.

    python bench/passes_scaling.py [--sizes 10000,30000,100000] [--no-others]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.options import CompileOptions
from ge_core.passes import PassContext, PassManager, resolve_pipeline
from ge_core.plugins import get_host

WIDTH = 8
BLOCK_NODES = 18


def synthetic_model(n_nodes: int) -> onnx.ModelProto:
    """A chain of identical blocks, ``BLOCK_NODES`` nodes each, of about ``n_nodes`` nodes."""
    nodes, inits = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out] if isinstance(out, str) else out, name=out if isinstance(out, str) else out[0], **attrs))
        return out

    h = "x"
    for b in range(max(1, n_nodes // BLOCK_NODES)):
        p = f"b{b}_"
        one = const(p + "one", np.ones((1,), np.float32))           # duplicate constants everywhere
        zero = const(p + "zero", np.zeros((WIDTH,), np.float32))
        c1 = const(p + "c1", np.full((WIDTH,), 0.5, np.float32))
        c2 = const(p + "c2", np.full((WIDTH,), 2.0, np.float32))
        a = node("Identity", [h], p + "id")
        m = node("Mul", [a, one], p + "mul1")                          # x * 1
        z = node("Add", [m, zero], p + "add0")                         # x + 0
        t1 = node("Transpose", [z], p + "t1", perm=[1, 0])              # cancelling transposes
        t2 = node("Transpose", [t1], p + "t2", perm=[1, 0])
        shp = node("Shape", [t2], p + "shape")                          # shape arithmetic
        two = node("Gather", [shp, const(p + "i1", np.array(1, np.int64))], p + "dim")
        cat = node("Concat", [const(p + "lead", np.array([-1], np.int64)),
                              node("Unsqueeze", [two, const(p + "ax", np.array([0], np.int64))], p + "unsq")],
                   p + "newshape", axis=0)
        r = node("Reshape", [t2, cat], p + "reshape")                   # a Reshape that changes nothing
        k = node("Mul", [c1, c2], p + "cmul")                           # constant-fed arithmetic
        w = node("Mul", [r, k], p + "scale")
        d1 = node("Relu", [w], p + "relu_a")                            # duplicate subexpression
        d2 = node("Relu", [w], p + "relu_b")
        s = node("Add", [d1, d2], p + "sum")
        node("Sigmoid", [node("Neg", [s], p + "dead_neg")], p + "dead_sig")  # dead branch
        h = node("Dropout", [s], p + "drop")
    graph = helper.make_graph(nodes, "synthetic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, WIDTH])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def run_ge(model: onnx.ModelProto) -> tuple[int, int, float, float]:
    """(nodes before, nodes after, prepare seconds, optimize seconds) of the default pipeline."""
    g = ge.load(model)
    before = len(g)
    host = get_host()
    opts = CompileOptions.from_any(None)
    stages = [s for s in resolve_pipeline(host.registries.passes, opts) if s.name in ("prepare", "optimize")]
    pm = PassManager(stages)
    pm.run(g, PassContext(opts, host.registries))
    secs = {"prepare": 0.0, "optimize": 0.0}
    for r in pm.records:
        secs[r.stage] += r.seconds
    out = pm.records[-1].nodes_after
    return before, out, secs["prepare"], secs["optimize"]


def run_onnxsim(model):
    import onnxsim

    t0 = time.perf_counter()
    simplified, _ = onnxsim.simplify(model, check_n=0)
    return len(simplified.graph.node), time.perf_counter() - t0


def run_onnxoptimizer(model):
    import onnxoptimizer

    t0 = time.perf_counter()
    optimized = onnxoptimizer.optimize(model)
    return len(optimized.graph.node), time.perf_counter() - t0


OTHERS = {"onnxsim": run_onnxsim, "onnxoptimizer": run_onnxoptimizer}


def run_other(name: str, model: onnx.ModelProto, timeout: float) -> tuple[int, float]:
    """Run a competitor in a child process (killed after ``timeout`` s): (nodes after, seconds)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        onnx.save(model, path)
        try:
            out = subprocess.run([sys.executable, __file__, "--worker", name, path], capture_output=True,
                                 text=True, timeout=timeout, check=True)
        except subprocess.TimeoutExpired:
            return -1, float("inf")
        except subprocess.CalledProcessError as e:
            print(f"{name} failed: {e.stderr[-300:]}", file=sys.stderr)
            return -1, float("nan")
    nodes, secs = out.stdout.strip().splitlines()[-1].split()
    return int(nodes), float(secs)


def _fmt_s(s: float) -> str:
    return "timeout" if s == float("inf") else f"{s:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,30000,100000")
    ap.add_argument("--no-others", action="store_true", help="skip onnxsim and onnxoptimizer")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds each competitor gets per model")
    ap.add_argument("--worker", nargs=2, metavar=("TOOL", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        nodes, secs = OTHERS[args.worker[0]](onnx.load(args.worker[1]))
        print(nodes, secs)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        model = synthetic_model(n)
        before, after, prep, opt = run_ge(model)
        row = {"nodes": before, "ge_after": after, "ge_prepare_s": prep, "ge_optimize_s": opt}
        if not args.no_others:
            for name in OTHERS:
                row[f"{name}_after"], row[f"{name}_s"] = run_other(name, model, args.timeout)
        rows.append(row)
        total = prep + opt
        print(f"{before:>7} nodes: ge {total:6.2f} s (prepare {prep:.2f} + optimize {opt:.2f}), "
              f"{total / before * 1e6:6.1f} us/node, {before} -> {after} nodes", flush=True)
        if not args.no_others:
            print(f"{'':>14} onnxsim {_fmt_s(row['onnxsim_s'])} s -> {row['onnxsim_after']} nodes; "
                  f"onnxoptimizer {_fmt_s(row['onnxoptimizer_s'])} s -> {row['onnxoptimizer_after']} nodes "
                  f"(-1: no result within {args.timeout:.0f} s)", flush=True)
    print()
    hdr = f"{'nodes':>8} {'ge s':>7} {'us/node':>8} {'ge after':>9}"
    if not args.no_others:
        hdr += f" {'onnxsim s':>10} {'onnxsim after':>14} {'onnxopt s':>10} {'onnxopt after':>14}"
    print(hdr)
    for r in rows:
        t = r["ge_prepare_s"] + r["ge_optimize_s"]
        line = f"{r['nodes']:>8} {t:7.2f} {t / r['nodes'] * 1e6:8.1f} {r['ge_after']:>9}"
        if not args.no_others:
            line += (f" {_fmt_s(r['onnxsim_s']):>10} {r['onnxsim_after']:>14} {_fmt_s(r['onnxoptimizer_s']):>10}"
                     f" {r['onnxoptimizer_after']:>14}")
        print(line)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        ratio = ((last["ge_prepare_s"] + last["ge_optimize_s"]) / (first["ge_prepare_s"] + first["ge_optimize_s"])) \
            / (last["nodes"] / first["nodes"])
        print(f"time-per-node ratio {last['nodes']} vs {first['nodes']} nodes: {ratio:.2f} (1.0 = linear)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
