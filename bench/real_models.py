"""Latency on real architectures built from code with random weights: this engine vs onnxruntime
vs OpenVINO, at the same thread count, side by side in one run.

Models: a BERT-style encoder and a GPT-2-style decoder (``transformers`` configs, random weights),
and the ResNet-18 of ``tests/torch/torch_zoo.py`` at 224x224, each exported with
``torch.onnx.export``. For every thread count, the engines run interleaved round by round, with
an idle gap before each timed block (OpenBLAS and onnxruntime workers spin-wait and slow whoever
runs next). Prints the median per engine, the ratios to onnxruntime, and their geometric means.

    python bench/real_models.py [--threads 1,2] [--rounds 7] [--models bert,gpt2,resnet18]

Time it with ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` unset in that command; the BLAS kernel
threadpoolctl reports is printed first. Needs the ``bench`` extra (openvino, transformers);
an engine that is not installed is left out of the table.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "torch"))
sys.path.insert(0, HERE)


def _LastHidden(model):
    import torch

    class LastHidden(torch.nn.Module):
        """``input_ids -> last_hidden_state`` (the export sees one tensor in, one out)."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    return LastHidden()


def build(name: str):
    """``(torch module, example inputs as a dict of numpy arrays)``."""
    import torch

    torch.manual_seed(0)
    if name in ("bert", "gpt2"):
        import transformers

        if name == "bert":
            cfg = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                          intermediate_size=1024, vocab_size=8000)
            model = transformers.BertModel(cfg)
        else:
            cfg = transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=8000, n_positions=256,
                                          bos_token_id=0, eos_token_id=0)
            model = transformers.GPT2Model(cfg)
        ids = np.random.default_rng(0).integers(0, 8000, (1, 128)).astype(np.int64)
        return _LastHidden(model.eval()).eval(), {"input_ids": ids}
    import torch_zoo

    model = torch_zoo.ResNet18().eval()
    return model, {"x": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}


def to_onnx(model, feeds: dict) -> bytes:
    import torch

    buf = io.BytesIO()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, buf, input_names=list(feeds), opset_version=17, dynamo=False)
    return buf.getvalue()


def engines(onnx_bytes: bytes, threads: int):
    """``{name: run(feeds)}`` for every installed engine, all at ``threads`` threads (the
    engine set-ups of ``bench/transformer_models.py``)."""
    from transformer_models import ge_engine, ort_engine, ov_engine

    out = {"ge": ge_engine(onnx_bytes, threads), "onnxruntime": ort_engine(onnx_bytes, threads)}
    try:
        import openvino  # noqa: F401
    except ImportError:
        return out
    out["openvino"] = ov_engine(onnx_bytes, threads)
    return out


def first(result):
    if isinstance(result, dict):
        result = list(result.values())
    return np.asarray(result[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="bert,gpt2,resnet18")
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    a = ap.parse_args(argv)
    from threadpoolctl import threadpool_info

    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                    if i.get("user_api") == "blas"])
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    onnx_models = {}
    for name in models:
        model, feeds = build(name)
        onnx_models[name] = (to_onnx(model, feeds), feeds)
    for threads in [int(t) for t in a.threads.split(",")]:
        ratios: dict[str, list[float]] = {}
        print(f"\nthreads={threads}   (median ms; ratio to onnxruntime; max |diff| to onnxruntime)")
        for name, (blob, feeds) in onnx_models.items():
            runs = engines(blob, threads)
            ref = first(runs["onnxruntime"](feeds))
            diffs = {k: float(np.max(np.abs(first(fn(feeds)) - ref))) for k, fn in runs.items()}
            for fn in runs.values():  # warm-up
                for _ in range(2):
                    fn(feeds)
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(a.rounds):
                for k, fn in runs.items():
                    time.sleep(a.gap)
                    t0 = time.perf_counter()
                    for _ in range(3):
                        fn(feeds)
                    times[k].append((time.perf_counter() - t0) / 3)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            base = med["onnxruntime"]
            parts = []
            for k in runs:
                r = med[k] / base
                ratios.setdefault(k, []).append(r)
                parts.append(f"{k} {med[k]:.2f} ms ({r:.2f}x, diff {diffs[k]:.1e})")
            print(f"  {name:9s} " + " | ".join(parts))
        gm = {k: math.exp(sum(math.log(r) for r in v) / len(v)) for k, v in ratios.items()}
        print("  geomean ratio to onnxruntime: " + ", ".join(f"{k} {v:.2f}" for k, v in gm.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
