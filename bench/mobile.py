"""Mobile and segmentation networks: this engine against onnxruntime and OpenVINO, and where the
time goes per op family, at 1 and 2 threads (#47).

Models, random weights from ``transformers`` configs (``bench/cnn.py``'s realistic weights, so every
layer sees data of unit scale), batch 1, exported with ``torch.onnx.export`` (opset 17):

* ``mobilenet_v2``: MobileNetV2ForImageClassification, 224x224 (depthwise, ReLU6);
* ``efficientnet_b0``: EfficientNetForImageClassification, 224x224 (depthwise, squeeze-excitation,
  SiLU);
* ``segformer_b0``: SegformerForSemanticSegmentation with nvidia/mit-b0's sizes, 512x512
  (overlapping patch embeddings, efficient attention, Mix-FFN's depthwise 3x3, Resize and the
  large-plane all-MLP decoder);
* ``deeplabv3_mnv2``: MobileNetV2ForSemanticSegmentation (DeepLabV3 head: ASPP, Resize), 512x512;
* ``mobilevit_xxs``: MobileViTForImageClassification, MobileViT-XXS sizes, 256x256 (depthwise,
  SiLU, a transformer stage between convolutions).

Per thread count the engines (ge, onnxruntime, OpenVINO f32 and OpenVINO's default precision,
bf16 where the CPU has it) run interleaved, an idle gap before each timed block (``bench/
transformer_models.py``'s timing). Then per model the time per op family of ge (``ge_cpu.profile``)
beside onnxruntime's own profiler (``SessionOptions.enable_profiling``), both at that thread count:
convolutions split into depthwise, 1x1 and kxk, squeeze-excitation (global pooling and its gate),
activations and elementwise, Resize, layout reorders, matmul/attention/norms, the rest.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/mobile.py [--threads 1,2] [--rounds 5]
        [--models segformer_b0,...] [--gap 0.3] [--no-profile]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cnn  # noqa: E402 - realistic weights
import precision  # noqa: E402 - OpenVINO at its default precision, the CPU's flags
import transformer_models as tm  # noqa: E402 - export, engines, timing and tables

MODELS = ["mobilenet_v2", "efficientnet_b0", "segformer_b0", "deeplabv3_mnv2", "mobilevit_xxs"]
FAMILIES = ["conv depthwise", "conv 1x1", "conv kxk", "squeeze-excite", "activation/eltwise", "resize",
            "reorder", "matmul/attn/norm", "other"]
_ACT = {"Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Silu", "Mul", "Add", "Sub", "Div", "Erf", "Gelu",
        "FastGelu", "BiasGelu", "Tanh", "Sqrt", "Pow", "Neg", "Max", "Min", "Fused", "FusedElementwise", "Sum"}
_POOL = {"GlobalAveragePool", "ReduceMean", "GlobalMaxPool", "NchwcGlobalAveragePool"}
_MM = {"MatMul", "Gemm", "FusedMatMul", "Softmax", "LayerNormalization", "SkipLayerNormalization", "Attention",
       "MultiHeadAttention", "Transpose", "Reshape", "BatchMatMul", "Einsum", "MatMulAddBias"}


def build(name: str):
    """``(torch module returning logits, {"pixel_values": array})``."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    size = 224
    model: Any
    if name == "mobilenet_v2":
        model = tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config())
    elif name == "efficientnet_b0":
        model = tf.EfficientNetForImageClassification(tf.EfficientNetConfig(  # (the defaults are B7's)
            width_coefficient=1.0, depth_coefficient=1.0, image_size=224, dropout_rate=0.2, hidden_dim=1280))
    elif name == "segformer_b0":
        model, size = tf.SegformerForSemanticSegmentation(tf.SegformerConfig()), 512  # defaults: mit-b0
    elif name == "deeplabv3_mnv2":
        model, size = tf.MobileNetV2ForSemanticSegmentation(tf.MobileNetV2Config(image_size=512)), 512
    elif name == "mobilevit_xxs":
        cfg = tf.MobileViTConfig(image_size=256, hidden_sizes=[64, 80, 96],
                                 neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], expand_ratio=2.0)
        model, size = tf.MobileViTForImageClassification(cfg), 256
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
    cnn.realistic_weights(model, x)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, px):
            return self.model(pixel_values=px).logits

    return Logits().eval(), {"pixel_values": x}


def family(op: str, weight_shape, group: int, in_shape=None) -> str:
    """The op family of one node (``weight_shape``/``group`` of a convolution, else None/1)."""
    op = op.rsplit(".", 1)[-1].rsplit(":", 1)[-1]
    if "Conv" in op and weight_shape is not None:
        channels = in_shape[1] if in_shape is not None and len(in_shape) > 1 else None
        if group > 1 or (len(weight_shape) > 1 and weight_shape[1] == 1 and channels not in (None, 1)):
            return "conv depthwise"
        return "conv 1x1" if all(int(k) == 1 for k in weight_shape[2:]) else "conv kxk"
    if op in _POOL:
        return "squeeze-excite"
    if op in ("Resize", "Upsample"):
        return "resize"
    if "Reorder" in op or op in ("ToBlocked", "FromBlocked"):
        return "reorder"
    if op in _MM or "MatMul" in op or "Norm" in op:
        return "matmul/attn/norm"
    if op in _ACT or op.startswith("Fused") and "Conv" not in op:
        return "activation/eltwise"
    return "other"


def ge_profile(blob: bytes, feeds: dict, threads: int, runs: int = 5) -> tuple[dict[str, float], float]:
    """ge's ms per op family and its ms per run (profiled)."""
    import onnx

    import ge_core as ge
    from ge_cpu.profile import profile

    model = ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": threads, "parallel": "engine"})
    prof = profile(model, feeds, runs=runs)
    nodes = {n.name: n for n in model.graph.node_list()}
    per: dict[str, float] = {}
    for row in prof["nodes"]:
        node = nodes.get(row["node"])
        w, group, x = None, 1, None
        if node is not None and "Conv" in node.op_type:
            w = node.attrs.get("weight_shape") or (node.inputs[1].type.shape if len(node.inputs) > 1
                                                   and node.inputs[1] is not None else None)
            group = int(node.attrs.get("group", 1) or 1)
        fam = family(row["op"], w, group, x)
        per[fam] = per.get(fam, 0.0) + row["seconds"] * 1e3
    return per, prof["wall_seconds"] * 1e3


def ort_profile(blob: bytes, feeds: dict, threads: int, runs: int = 5) -> tuple[dict[str, float], float]:
    """onnxruntime's ms per op family (its own profiler's node events) and its ms per run."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory() as d:
        so.enable_profiling, so.profile_file_prefix = True, os.path.join(d, "ort")
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        t0 = time.perf_counter()
        for _ in range(runs):
            sess.run(None, feeds)
        wall = (time.perf_counter() - t0) / runs * 1e3
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    per: dict[str, float] = {}
    kernel_events = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    for e in kernel_events[-runs * (len(kernel_events) // (runs + 1)):] if kernel_events else []:
        args = e.get("args", {})
        op = args.get("op_name", "")
        shapes = [next(iter(s.values())) for s in args.get("input_type_shape", []) if s]
        w = shapes[1] if "Conv" in op and len(shapes) > 1 else None
        x = shapes[0] if shapes else None
        fam = family(op, w, 1, x)
        per[fam] = per.get(fam, 0.0) + e["dur"] / 1e3 / runs
    return per, wall


def print_profile(name: str, blob: bytes, feeds: dict, threads: int) -> None:
    g, gw = ge_profile(blob, feeds, threads)
    o, ow = ort_profile(blob, feeds, threads)
    cells = []
    for fam in FAMILIES:
        a, b = g.get(fam, 0.0), o.get(fam, 0.0)
        if a or b:
            cells.append(f"{fam} {a:.2f}/{b:.2f}")
    print(f"  {name:15s} t={threads} ge/ort ms per run {gw:.2f}/{ow:.2f} (profiled) | " + ", ".join(cells),
          flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    ap.add_argument("--no-profile", action="store_true", help="skip the time per op family")
    a = ap.parse_args(argv)
    print("CPU:", precision.cpu_line())
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    models: dict[str, Any] = {}
    for name in [m.strip() for m in a.models.split(",") if m.strip()]:
        t0 = time.perf_counter()
        try:
            module, feeds = build(name)
            models[name] = (tm.to_onnx(module, feeds), feeds)
        except Exception as e:  # noqa: BLE001 - report and go on
            models[name] = tm.err_text(e)
            print(f"export {name}: FAILED {models[name]}")
            continue
        print(f"export {name}: {len(models[name][0]) / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s", flush=True)
    thread_counts = [int(t) for t in a.threads.split(",") if t.strip()]
    ov_default = "ov default"
    saved = tm.engines

    def engines(blob: bytes, threads: int):  # transformer_models' engines and OpenVINO's default precision
        runs, errors = saved(blob, threads)
        try:
            runs[ov_default] = precision.ov_engine(blob, threads, None)[0]
        except Exception as e:  # noqa: BLE001
            errors[ov_default] = f"compile: {tm.err_text(e)}"
        return runs, errors

    tm.engines = engines
    try:
        tm.run_table(models, thread_counts, a.rounds, a.gap, family_of={n: "mobile" for n in models})
    finally:
        tm.engines = saved
    if not a.no_profile:
        print("\nms per run per op family, ge/onnxruntime (each engine's own profiler, 5 runs)")
        for threads in thread_counts:
            for name, entry in models.items():
                if isinstance(entry, str):
                    continue
                try:
                    print_profile(name, entry[0], entry[1], threads)
                except Exception as e:  # noqa: BLE001
                    print(f"  {name:15s} t={threads} FAILED {tm.err_text(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
