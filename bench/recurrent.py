"""Latency of a bidirectional LSTM and GRU: this engine vs onnxruntime vs onnx.reference.

One node each (seq 64, batch 8, input 128, hidden 256, bidirectional, weights as initializers;
the GRU also with ``linear_before_reset=1``, the form PyTorch exports). All engines run in this
one process on the same input, interleaved round by round so that machine noise hits them alike;
prints the median latency of each and the ratios.

    python bench/recurrent.py [--rounds 15] [--reference-rounds 3] [--threads 1]
                              [--seq 64] [--batch 8] [--input 128] [--hidden 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ge_core as ge

GATES = {"LSTM": 4, "GRU": 3}


def build(op: str, seq: int, batch: int, isz: int, hidden: int, extra: dict) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(0)
    g = GATES[op]
    nd = 2
    k = 1 / np.sqrt(hidden)
    w = rng.uniform(-k, k, (nd, g * hidden, isz)).astype(np.float32)
    r = rng.uniform(-k, k, (nd, g * hidden, hidden)).astype(np.float32)
    b = rng.uniform(-k, k, (nd, 2 * g * hidden)).astype(np.float32)
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["X", "W", "R", "B"], outs, hidden_size=hidden, direction="bidirectional", **extra)
    graph = helper.make_graph(
        [node], op.lower(), [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [seq, batch, isz])],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    feeds = {"X": rng.standard_normal((seq, batch, isz)).astype(np.float32)}
    return model, feeds


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reference-rounds", type=int, default=3, help="onnx.reference is slow; 0 skips it")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads for both engines (0: default)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args(argv)

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if args.threads:
        so.intra_op_num_threads = args.threads
    cases = [("LSTM", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1})]
    rows: list[tuple[str, dict[str, float], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for op, extra in cases:
            label = op + ("" if not extra else " (linear_before_reset=1)")
            model, feeds = build(op, args.seq, args.batch, args.input, args.hidden, extra)
            path = os.path.join(tmp, f"{op}_{len(rows)}.onnx")
            onnx.save(model, path)
            compiled = ge.compile(path, {"threads": args.threads} if args.threads else None)
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = ReferenceEvaluator(model) if args.reference_rounds else None
            got = list(compiled.run(feeds).values())
            want = sess.run(None, feeds)
            err = max(float(np.max(np.abs(a - b))) for a, b in zip(got, want))
            times: dict[str, list[float]] = {"ge": [], "ort": [], "ref": []}
            for rnd in range(args.rounds):
                times["ge"].append(timed(lambda m=compiled, f=feeds: m.run(f)))
                times["ort"].append(timed(lambda s=sess, f=feeds: s.run(None, f)))
                if ref is not None and rnd < args.reference_rounds:
                    times["ref"].append(timed(lambda e=ref, f=feeds: e.run(None, f)))
            med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
            rows.append((label, med, err))

    print(f"seq {args.seq}, batch {args.batch}, input {args.input}, hidden {args.hidden}, bidirectional; "
          f"median of {args.rounds} interleaved rounds (onnx.reference: {args.reference_rounds}); "
          f"threads {args.threads or 'default'}")
    head = f"{'op':<32}{'ge ms':>9}{'ort ms':>9}{'ref ms':>10}{'ge/ort':>9}{'ref/ge':>9}{'max|diff|':>11}"
    print(head)
    print("-" * len(head))
    for label, med, err in rows:
        print(f"{label:<32}{med['ge'] * 1e3:>9.2f}{med['ort'] * 1e3:>9.2f}{med['ref'] * 1e3:>10.1f}"
              f"{med['ge'] / med['ort']:>9.2f}{med['ref'] / med['ge']:>9.1f}{err:>11.1e}")
    print("ge/ort: this engine's latency over onnxruntime's (lower is better); "
          "ref/ge: how many times faster than onnx.reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
