"""Latency of the nine light model-zoo models: this engine vs onnxruntime vs onnx.reference.

All engines run in this one process on the same inputs, interleaved round by round so that
machine noise hits them alike. Prints the median latency per model, the ratio to onnxruntime
and the geometric mean of the ratios.

    python bench/light_models.py [--rounds 7] [--reference-rounds 1] [--models resnet50,vgg19]
                                 [--threads 2] [--no-fold]

The light models compute their weights with ConstantOfShape at run time; with constant folding
(the default pipeline) the engine folds them at compile time, onnxruntime does the same in its
graph optimizer. ``--no-fold`` compiles without constant folding, to measure the kernels on the
unfolded graph as onnx.reference runs it.
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
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator
from rich.console import Console
from rich.table import Table

import ge_core as ge

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reference-rounds", type=int, default=1, help="onnx.reference is slow; 0 skips it")
    ap.add_argument("--models", default="")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads for both engines (0: default)")
    ap.add_argument("--no-fold", action="store_true", help="compile without constant folding")
    args = ap.parse_args(argv)
    names = sorted(f[6:-5] for f in os.listdir(LIGHT) if f.endswith(".onnx"))
    if args.models:
        names = [n for n in names if n in args.models.split(",")]
    con = Console(width=140)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # ORT's idle worker threads spin after each run and would steal the cores from the next
    # engine in an interleaved benchmark; without spinning each engine gets the machine alone.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if args.threads:
        so.intra_op_num_threads = args.threads
    rows = []
    for name in names:
        path = os.path.join(LIGHT, f"light_{name}.onnx")
        t0 = time.perf_counter()
        opts: dict = {"threads": args.threads} if args.threads else {}
        if args.no_fold:
            opts["constant_folding"] = False
        model = ge.compile(path, opts or None)
        compile_s = time.perf_counter() - t0
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
                 for i in sess.get_inputs()}
        ref = ReferenceEvaluator(path) if args.reference_rounds else None
        # warm up and check agreement
        got = list(model.run(feeds).values())
        want = sess.run(None, feeds)
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(got, want))
        times = {"ge": [], "ort": [], "ref": []}
        sess.run(None, feeds)
        for r in range(args.rounds):
            times["ge"].append(timed(lambda m=model, f=feeds: m.run(f)))
            times["ort"].append(timed(lambda s=sess, f=feeds: s.run(None, f)))
            if ref is not None and r < args.reference_rounds:
                times["ref"].append(timed(lambda e=ref, f=feeds: e.run(None, f)))
        med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
        rows.append((name, med, compile_s, err, model.report["kernels"]))
        con.print(f"{name}: ge {med['ge'] * 1e3:.1f} ms, onnxruntime {med['ort'] * 1e3:.1f} ms, "
                  f"onnx.reference {med['ref'] * 1e3:.1f} ms", highlight=False)
    t = Table(title=f"light models, median of {args.rounds} interleaved rounds")
    for c in ("model", "ge ms", "onnxruntime ms", "onnx.reference ms", "ge / ort", "ge / reference", "max |diff|", "kernels", "compile s"):
        t.add_column(c, justify="right")
    ratios, rratios = [], []
    for name, med, cs, err, k in rows:
        ratio = med["ge"] / med["ort"]
        ratios.append(ratio)
        rr = med["ge"] / med["ref"] if not math.isnan(med["ref"]) else float("nan")
        if not math.isnan(rr):
            rratios.append(rr)
        t.add_row(name, f"{med['ge'] * 1e3:.1f}", f"{med['ort'] * 1e3:.1f}", f"{med['ref'] * 1e3:.1f}",
                  f"{ratio:.2f}", f"{rr:.3f}", f"{err:.1e}", str(k), f"{cs:.2f}")
    con.print(t)
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    con.print(f"geometric mean latency ratio ge / onnxruntime: {gm:.2f}")
    if rratios:
        gr = math.exp(sum(map(math.log, rratios)) / len(rratios))
        con.print(f"geometric mean latency ratio ge / onnx.reference: {gr:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
