"""Multi-stream execution and model sinking, side by side in one run.

1. Four independent branches of heavy kernels (transcendental chains and MatMuls): single stream
   against the dependency allocator's streams (one BLAS thread per stream).
2. Inception v1 and v2: single stream against multi-stream, each at 1 and 2 BLAS threads.
3. A chain of 2,000 tiny ops (Add, Mul, Sub, Relu on 1x16) with fusion off: microseconds per op
   in sink mode, in the interpreted arena executor and in onnxruntime; and with the default
   pipeline (fusion on) against onnxruntime.
4. Sink mode against the interpreted executor on each light model.

    python bench/streams_sink.py [--rounds 7] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import ge_core as ge

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
NO_FUSION = {"pipeline": {"fuse": {"passes": []}}}


def median_time(fn, rounds: int) -> float:
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def interleaved(fns: dict, rounds: int) -> dict:
    for f in fns.values():
        f()
    ts: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def branches_model(n_branches=4, depth=6, size=1 << 20, mm=512):
    """Each branch: exp/tanh/sin chains on a large vector plus a MatMul chain."""
    nodes, inits = [], []
    outs = []
    for b in range(n_branches):
        # every branch scales its input by its own constant first, so CSE cannot merge branches
        inits.append(onnx.numpy_helper.from_array(np.array(1.0 + 0.1 * b, np.float32), f"s{b}"))
        nodes.append(helper.make_node("Mul", ["x", f"s{b}"], [f"b{b}x"]))
        v = f"b{b}x"
        for d in range(depth):
            op = ("Exp", "Tanh", "Sin")[(d + b) % 3]
            nodes.append(helper.make_node(op, [v], [f"b{b}e{d}"]))
            v = f"b{b}e{d}"
        m = "m"
        for d in range(3):
            w = f"w{b}_{d}"
            inits.append(onnx.numpy_helper.from_array((np.eye(mm, dtype=np.float32) * (0.5 + 0.01 * b + 0.001 * d)), w))
            nodes.append(helper.make_node("MatMul", [m, w], [f"b{b}m{d}"]))
            m = f"b{b}m{d}"
        nodes.append(helper.make_node("ReduceSum", [v], [f"b{b}s"], keepdims=0))
        nodes.append(helper.make_node("ReduceSum", [m], [f"b{b}ms"], keepdims=0))
        nodes.append(helper.make_node("Add", [f"b{b}s", f"b{b}ms"], [f"b{b}o"]))
        outs.append(f"b{b}o")
    nodes.append(helper.make_node("Sum", outs, ["y"]))
    g = helper.make_graph(nodes, "branches",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size]),
                           helper.make_tensor_value_info("m", TensorProto.FLOAT, [mm, mm])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def tiny_chain(n=2000):
    nodes, inits = [], [onnx.numpy_helper.from_array(np.full((1, 16), 0.5, np.float32), "c")]
    v = "x"
    ops = ("Add", "Mul", "Sub", "Relu")
    for i in range(n):
        op = ops[i % 4]
        ins = [v] if op == "Relu" else [v, "c"]
        nodes.append(helper.make_node(op, ins, [f"t{i}"]))
        v = f"t{i}"
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, 16])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def ort_session(model_or_path, threads=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        so.intra_op_num_threads = threads
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smaller models, fewer rounds")
    a = ap.parse_args(argv)
    rounds = 3 if a.quick else a.rounds

    print("== 1. four heavy branches: single stream vs streams ==")
    m = branches_model(size=(1 << 18) if a.quick else (1 << 20))
    g = ge.load(m)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(1 << 18 if a.quick else 1 << 20).astype(np.float32) * 0.1,
             "m": rng.standard_normal((512, 512)).astype(np.float32)}
    # fusion off: the point is four long chains of separate kernels that NumPy runs on one core
    cfgs = {
        "single, 1 BLAS thread": {"enable_single_stream": True, "threads": 1},
        "single, 2 BLAS threads": {"enable_single_stream": True, "threads": 2},
        "dependency, 4 streams": {"stream_allocator": "dependency", "max_streams": 4, "threads": 1},
        "critical_path, 2 streams": {"stream_allocator": "critical_path", "max_streams": 2, "threads": 1},
    }
    models = {k: ge.compile(g, {**NO_FUSION, **v}) for k, v in cfgs.items()}
    want = models["single, 1 BLAS thread"].run(feeds)["y"]
    for mm in models.values():
        np.testing.assert_allclose(mm.run(feeds)["y"], want, rtol=1e-5)
    # OpenBLAS's idle threads spin for a while after a 2-thread GEMM and would steal a core from
    # the run after it: configurations with one BLAS thread are interleaved among themselves, the
    # 2-thread one is timed in a block of its own.
    one = {k: mm for k, mm in models.items() if cfgs[k]["threads"] == 1}
    t = interleaved({k: (lambda mm=mm: mm.run(feeds)) for k, mm in one.items()}, rounds)
    for k, mm in models.items():
        if k not in one:
            t[k] = median_time(lambda mm=mm: mm.run(feeds), rounds)
    for k, v in t.items():
        print(f"{k} {models[k].report['streams']}: {v * 1e3:.1f} ms")
    best_single = min(v for k, v in t.items() if k.startswith("single"))
    best_multi = min(v for k, v in t.items() if not k.startswith("single"))
    print(f"single stream, one core (1 BLAS thread) / best multi-stream: {t['single, 1 BLAS thread'] / best_multi:.2f}x")
    print(f"best single stream (any BLAS threads) / best multi-stream: {best_single / best_multi:.2f}x")

    print("== 2. Inception v1/v2: single vs multi stream, best BLAS thread setting ==")
    for name in ("inception_v1", "inception_v2"):
        p = os.path.join(LIGHT, f"light_{name}.onnx")
        feeds = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in ge.load(p).inputs}
        runs = {}
        for th in (1, 2):
            runs[f"single/{th}"] = ge.compile(p, {"enable_single_stream": True, "threads": th})
            runs[f"multi/{th}"] = ge.compile(p, {"stream_allocator": "dependency", "threads": th})
        t = interleaved({k: (lambda mm=mm, f=feeds: mm.run(f)) for k, mm in runs.items()}, rounds)
        best_s = min(v for k, v in t.items() if k.startswith("single"))
        best_m = min(v for k, v in t.items() if k.startswith("multi"))
        streams = runs["multi/1"].report["streams"]
        print(f"{name} {streams}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in t.items())
              + f"; best single/best multi {best_s / best_m:.2f}x")

    print("== 3. 2,000 tiny ops ==")
    tm = tiny_chain()
    g = ge.load(tm)
    x = {"x": rng.standard_normal((1, 16)).astype(np.float32)}
    sink = ge.compile(g, {**NO_FUSION, "executor": "sink"})
    arena = ge.compile(g, {**NO_FUSION, "executor": "arena"})
    default = ge.compile(g)
    sess = ort_session(tm, threads=1)
    n = 2000
    t = interleaved({"sink": lambda: sink.run(x), "arena": lambda: arena.run(x),
                     "default": lambda: default.run(x), "ort": lambda: sess.run(None, x)}, rounds * 3)
    for k, label in (("sink", "sink, fusion off"), ("arena", "interpreted, fusion off"),
                     ("default", f"default pipeline ({default.report['kernels']} kernels)"), ("ort", "onnxruntime")):
        print(f"{label}: {t[k] * 1e6 / n:.3f} us/op ({t[k] * 1e3:.2f} ms)")
    print(f"default pipeline vs onnxruntime: {t['ort'] / t['default']:.2f}x")

    print("== 4. sink vs interpreted on the light models ==")
    names = sorted(f[6:-5] for f in os.listdir(LIGHT) if f.endswith(".onnx"))
    if a.quick:
        names = names[:3]
    for name in names:
        p = os.path.join(LIGHT, f"light_{name}.onnx")
        s = ge.compile(p, {"executor": "sink", "enable_single_stream": True})
        i = ge.compile(p, {"executor": "arena", "enable_single_stream": True})
        feeds = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in s.graph.inputs}
        t = interleaved({"sink": lambda s=s, f=feeds: s.run(f), "arena": lambda i=i, f=feeds: i.run(f)}, rounds)
        print(f"{name}: sink {t['sink'] * 1e3:.1f} ms, interpreted {t['arena'] * 1e3:.1f} ms, "
              f"ratio {t['arena'] / t['sink']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
