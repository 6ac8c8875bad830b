"""Dynamic shapes: one compiled model with symbolic dims against onnxruntime, shape by shape.

Two real architectures built from code with random weights, exported once with dynamic axes
(``torch.onnx.export(dynamo=False, opset 17, dynamic_axes=...)``):

* a BERT encoder (``transformers.BertConfig``: hidden 384, 4 layers, 6 heads) with dynamic batch
  and sequence;
* a ResNet-style CNN (``timm``'s resnet18 at 112x112 when timm imports, else torchvision-free
  code of the same layout) with a dynamic batch.

GE compiles each once (symbolic plan); onnxruntime plans each shape on its first run (its
arena grows to the largest shape seen). For every shape the bench prints:

* latency: median ms of GE and onnxruntime at the same thread count, runs interleaved with an
  idle gap before each timed block, and the ratio; and GE's model compiled statically for exactly
  that shape (what the symbolic model costs over a static one);
* memory: GE's arena at that shape from the one symbolic plan, next to the arena of the best
  static plan for exactly that shape (the same model compiled with ``--input_shape`` fixed to
  it) and their ratio (the target is <= 1.05), and each engine's peak RSS growth while running
  that shape in a fresh process.

Run: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/dynamic.py --threads 1``.

``--symbolic-vs-static resnet18,efficientnet_b0 [--batches 1,4]`` times only what a symbolic batch
costs: timm's CNNs at 224x224 exported with a dynamic batch against static exports at each batch,
GE's two builds interleaved (the ratio, and whether both got the same blocked ops). It needs
timm, which imports torchvision's Python package (its C ops may be missing: :func:`_timm`).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from transformer_models import interleaved  # noqa: E402 - the bench folder's shared timing loop

BERT_SHAPES = [(1, 16), (2, 64), (4, 128), (3, 77), (8, 256)]
CNN_BATCHES = [1, 2, 5, 8]


def bert_onnx(hidden: int = 384, layers: int = 4, heads: int = 6, vocab: int = 8000) -> bytes:
    """A BERT encoder (``input_ids``, ``attention_mask`` -> ``out``) with dynamic batch and sequence."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=512,
                        attn_implementation="eager")
    model = tf.BertModel(cfg).eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.randint(0, vocab, (2, 16))
    return _export(Wrap().eval(), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"],
                   {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                    "out": {0: "batch", 1: "seq"}})


def _timm():
    """timm, imported past torchvision's missing C ops (their schemas defined first: its import
    registers fake kernels for them)."""
    import torch

    try:
        torch.library.define("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torch.library.define("torchvision::qnms", "(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
    except Exception:  # noqa: BLE001 - already defined
        pass
    import timm

    return timm


def cnn_onnx() -> tuple[bytes, str]:
    import torch

    torch.manual_seed(0)
    try:
        net = _timm().create_model("resnet18", pretrained=False, num_classes=100).eval()
        name = "timm resnet18"
    except Exception:  # noqa: BLE001 - timm missing or not importable here
        from torch import nn

        def block(c_in, c_out, stride):
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                                 nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())

        net = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                            block(64, 64, 1), block(64, 128, 2), block(128, 256, 2), block(256, 512, 2),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)).eval()
        name = "resnet18-layout CNN"
    return _export(net, (torch.zeros(1, 3, 112, 112),), ["x"], {"x": {0: "n"}, "out": {0: "n"}}), name


def _export(module, args, names, dynamic) -> bytes:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=names, output_names=["out"], opset_version=17,
                          dynamo=False, dynamic_axes=dynamic)
    return buf.getvalue()


def bert_feeds(shape, seed=0):
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, 8000, shape).astype(np.int64), "attention_mask": np.ones(shape, np.int64)}


def cnn_feeds(n, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((n, 3, 112, 112)).astype(np.float32)}


def ge_model(blob: bytes, threads: int, input_shape: str | None = None):
    import onnx

    import ge_core as ge

    opts = {"threads": threads}
    if input_shape:
        opts["input_shape"] = input_shape
    return ge.compile(ge.load(onnx.load_from_string(blob)), opts)


def ort_session(blob: bytes, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def time_pair(runs: dict, feeds: dict, rounds: int, gap: float) -> dict[str, float]:
    for fn in runs.values():  # first run at this shape (plans it) and a warm-up, untimed
        fn(feeds)
        fn(feeds)
    return interleaved(runs, feeds, rounds, gap)


# -- peak memory, each (engine, shape) in a fresh process -------------------------------------------
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_child(argv: list[str]) -> int:
    """Peak resident memory above the process's level after loading the model and one run at a
    small shape: sampled every millisecond while the engine runs the shape 3 times."""
    import threading

    engine, path, kind, shape, threads = argv[0], argv[1], argv[2], json.loads(argv[3]), int(argv[4])
    with open(path, "rb") as f:
        blob = f.read()
    feeds = bert_feeds(tuple(shape)) if kind == "bert" else cnn_feeds(shape[0])
    if engine == "ge":
        fn = ge_model(blob, threads).run
    else:
        s = ort_session(blob, threads)
        fn = lambda f: s.run(None, f)  # noqa: E731
    fn(bert_feeds((1, 8)) if kind == "bert" else cnn_feeds(1))
    base = _rss()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.001):
            peak[0] = max(peak[0], _rss())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    for _ in range(3):
        fn(feeds)
    done.set()
    t.join()
    peak[0] = max(peak[0], _rss())
    print(json.dumps({"bytes": peak[0] - base}))
    return 0


def peak_growth(engine: str, path: str, kind: str, shape, threads: int) -> float:
    r = subprocess.run([sys.executable, __file__, "--peak-child", engine, path, kind, json.dumps(list(shape)),
                        str(threads)], capture_output=True, text=True, timeout=600)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])["bytes"] / (1 << 20)
    except (IndexError, ValueError, KeyError):
        return float("nan")


def geomean(v):
    v = [x for x in v if x == x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")


def bench(kind: str, blob: bytes, shapes, threads: int, rounds: int, gap: float, memory: bool) -> dict:
    sym_model = ge_model(blob, threads)
    sess = ort_session(blob, threads)
    runs = {"ge": sym_model.run, "onnxruntime": lambda f: sess.run(None, f)}
    print(f"  symbolic plan: {sym_model.report['memory'].get('symbolic', {}).get('symbols')}, "
          f"dynamic buffers {sym_model.report['memory']['dynamic_buffers']}, "
          f"{sym_model.report['memory'].get('symbolic', {}).get('orders')} placement orders")
    print(f"  {'shape':>10s} {'ge ms':>9s} {'ort ms':>9s} {'ge/ort':>7s} {'static ms':>9s} {'|diff|':>9s} "
          f"{'arena sym':>12s} {'arena static':>12s} {'sym/static':>10s}"
          + (f" {'ge peak MiB':>11s} {'ort peak MiB':>12s}" if memory else ""))
    rows = []
    path = None
    if memory:
        fd, path = tempfile.mkstemp(suffix=".onnx")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
    try:
        for shape in shapes:
            feeds = bert_feeds(shape, 1) if kind == "bert" else cnn_feeds(shape[0], 1)
            diff = float(np.max(np.abs(sym_model.run(feeds)["out"] - sess.run(None, feeds)[0])))
            if kind == "bert":
                dims = {"batch": shape[0], "seq": shape[1]}
                fixed = f"input_ids:{shape[0]},{shape[1]};attention_mask:{shape[0]},{shape[1]}"
            else:
                dims = {"n": shape[0]}
                fixed = f"x:{shape[0]},3,112,112"
            static = ge_model(blob, threads, fixed)  # the same model compiled for exactly this shape
            med = time_pair({**runs, "static": static.run}, feeds, rounds, gap)
            sym_arena = sym_model.arena_bytes_at(dims)
            static_arena = static.report["memory"]["arena_bytes"]
            row = {"shape": list(shape), "ge_ms": med["ge"], "ort_ms": med["onnxruntime"], "static_ms": med["static"],
                   "ratio": med["ge"] / med["onnxruntime"], "diff": diff, "arena_symbolic": sym_arena,
                   "arena_static": static_arena, "arena_ratio": sym_arena / static_arena if static_arena else float("nan")}
            line = (f"  {str(tuple(shape)):>10s} {med['ge']:9.2f} {med['onnxruntime']:9.2f} {row['ratio']:7.2f} "
                    f"{med['static']:9.2f} {diff:9.1e} {sym_arena:12,d} {static_arena:12,d} {row['arena_ratio']:10.3f}")
            if memory:
                assert path is not None
                row["ge_peak_mib"] = peak_growth("ge", path, kind, shape, threads)
                row["ort_peak_mib"] = peak_growth("onnxruntime", path, kind, shape, threads)
                line += f" {row['ge_peak_mib']:11.1f} {row['ort_peak_mib']:12.1f}"
            print(line, flush=True)
            rows.append(row)
    finally:
        if path:
            os.unlink(path)
    print(f"  geomean ge/ort {geomean([r['ratio'] for r in rows]):.2f}, symbolic/static latency "
          f"{geomean([r['ge_ms'] / r['static_ms'] for r in rows]):.2f}; symbolic/static arena worst "
          f"{max(r['arena_ratio'] for r in rows):.3f}")
    return {"rows": rows}


def timm_onnx(name: str, batch: int, dynamic: bool, side: int = 224) -> bytes:
    """timm's ``name`` (random weights, 1000 classes) at ``side`` x ``side``, exported with a
    dynamic batch (``dynamic_axes``) or static at ``batch``."""
    import torch

    torch.manual_seed(0)
    net = _timm().create_model(name, pretrained=False).eval()
    return _export(net, (torch.zeros(batch, 3, side, side),), ["x"],
                   {"x": {0: "n"}, "out": {0: "n"}} if dynamic else None)


def bench_symbolic_vs_static(models, batches, threads: int, rounds: int, gap: float, side: int = 224) -> dict:
    """Each timm CNN exported once with a dynamic batch (one compiled model for every batch) and
    once static per batch: GE's two builds interleaved at each batch, their ratio, and each
    build's blocked ops (a symbolic batch must keep the static build's kernels)."""
    out: dict = {}
    print(f"\nsymbolic batch against static builds, {side}x{side}, threads={threads} (median ms, interleaved)")
    print(f"  {'model':16s} {'batch':>5s} {'static ms':>10s} {'symbolic ms':>12s} {'sym/static':>10s} "
          f"{'best st':>9s} {'best sym':>9s} {'best s/s':>9s} {'paired':>9s} {'|diff|':>9s}  blocked ops")
    for name in models:
        sym = ge_model(timm_onnx(name, 2, True, side), threads)
        sym_ops = {k: v for k, v in sym.report["op_counts"].items() if "Conv" in k or "Pool" in k}
        for b in batches:
            static = ge_model(timm_onnx(name, b, False, side), threads)
            st_ops = {k: v for k, v in static.report["op_counts"].items() if "Conv" in k or "Pool" in k}
            feeds = {"x": np.random.default_rng(b).standard_normal((b, 3, side, side)).astype(np.float32)}
            diff = float(np.max(np.abs(sym.run(feeds)["out"] - static.run(feeds)["out"])))
            blocks = _blocks({"static": static.run, "symbolic": sym.run}, feeds, rounds, gap)
            med = {k: statistics.median(v) for k, v in blocks.items()}
            best = {k: min(v) for k, v in blocks.items()}
            ratio, best_ratio = med["symbolic"] / med["static"], best["symbolic"] / best["static"]
            # each round's two adjacent blocks as a pair: a load that drifts between rounds cancels
            paired = statistics.median(a / b for a, b in zip(blocks["symbolic"], blocks["static"]))
            same = "same" if sym_ops == st_ops else f"symbolic {sym_ops} static {st_ops}"
            print(f"  {name:16s} {b:5d} {med['static']:10.2f} {med['symbolic']:12.2f} {ratio:10.3f} "
                  f"{best['static']:9.2f} {best['symbolic']:9.2f} {best_ratio:9.3f} {paired:9.3f} {diff:9.1e}  "
                  f"{same}: {sym_ops}",
                  flush=True)
            out[f"{name}@{b}"] = {"static_ms": med["static"], "symbolic_ms": med["symbolic"], "ratio": ratio,
                                  "static_best_ms": best["static"], "symbolic_best_ms": best["symbolic"],
                                  "best_ratio": best_ratio, "paired_ratio": paired, "diff": diff,
                                  "same_ops": sym_ops == st_ops}
    for key in ("ratio", "best_ratio", "paired_ratio"):
        print(f"  {key.replace('_ratio', '') if key != 'ratio' else 'median'} symbolic/static: geomean "
              f"{geomean([r[key] for r in out.values()]):.3f}, worst {max(r[key] for r in out.values()):.3f}")
    return out


def _blocks(runs: dict, feeds: dict, rounds: int, gap: float) -> dict[str, list[float]]:
    """ms per call of each engine's timed blocks (3 calls each), the engines in turn, ``gap`` idle
    seconds before each block, after two untimed runs (the median says what a run costs, the
    best what it costs when no other process takes the core)."""
    for fn in runs.values():
        fn(feeds)
        fn(feeds)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for k, fn in (list(runs.items()) if r % 2 == 0 else list(runs.items())[::-1]):  # (order alternates)
            time.sleep(gap)
            t0 = time.perf_counter()
            for _ in range(3):
                fn(feeds)
            times[k].append((time.perf_counter() - t0) / 3 * 1e3)
    return times


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--peak-child":
        return _peak_child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-RSS child processes")
    ap.add_argument("--quick", action="store_true", help="three shapes per model")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--symbolic-vs-static", metavar="MODELS",
                    help="only timm CNNs (e.g. resnet18,efficientnet_b0) exported with a dynamic batch against "
                         "static exports, at --batches")
    ap.add_argument("--batches", default="1,4", help="batches of --symbolic-vs-static (default 1,4)")
    args = ap.parse_args(argv)
    if args.symbolic_vs_static:
        res = {f"@{t}": bench_symbolic_vs_static(args.symbolic_vs_static.split(","),
                                                 [int(b) for b in args.batches.split(",")], int(t), args.rounds,
                                                 args.gap)
               for t in args.threads.split(",")}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    import threadpoolctl

    blas = [f"{i.get('internal_api')} {i.get('architecture')}" for i in threadpoolctl.threadpool_info()]
    print(f"BLAS: {', '.join(blas)}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')!r}")
    results = {}
    bert = bert_onnx()
    cnn, cnn_name = cnn_onnx()
    shapes_b = BERT_SHAPES[:3] if args.quick else BERT_SHAPES
    shapes_c = [(n,) for n in (CNN_BATCHES[:3] if args.quick else CNN_BATCHES)]
    for threads in [int(t) for t in args.threads.split(",")]:
        print(f"\nBERT encoder (384 wide, 4 layers), dynamic batch and sequence, threads={threads}")
        results[f"bert@{threads}"] = bench("bert", bert, shapes_b, threads, args.rounds, args.gap, not args.no_memory)
        print(f"\n{cnn_name} at 112x112, dynamic batch, threads={threads}")
        results[f"cnn@{threads}"] = bench("cnn", cnn, shapes_c, threads, args.rounds, args.gap, not args.no_memory)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
