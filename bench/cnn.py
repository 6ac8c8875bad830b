"""Convolution networks: this engine against onnxruntime and OpenVINO, at 1 and 2 threads.

Two families, all with random weights (no downloads):

* ``light``: the onnx package's nine light model-zoo models (its test data; its resnet50 is
  ``resnet50_zoo`` in the tables, apart from the real family's);
* ``real``: eight CNN architectures built from ``transformers`` configs at 224x224, batch 1:
  ResNet-50, ConvNeXt-Tiny, ConvNeXt-V2-Tiny, RegNet (the config's default), MobileNetV2,
  EfficientNet-B0, BiT (ResNet-V2 with weight standardisation), MobileViT-S (convolutions with
  a transformer stage).

Each model is exported once (``torch.onnx.export(dynamo=False, opset 17)``); the engines run it at
the same thread count, interleaved, with an idle gap before each timed block (the timing and
table code is ``bench/transformer_models.py``'s). Then, per model, GE's time per convolution
algorithm (one profiled run at one thread): the blocked layout's kernels (NCHWc direct, Winograd
F(2x2,3x3) on blocked values for 3x3 stride-1 layers, 1x1, depthwise), and outside it Winograd
F(2x2,3x3), 1x1 as GEMM, depthwise window loops, im2col + GEMM.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/cnn.py [--threads 1,2] [--rounds 5]
        [--families light,real] [--models resnet50,convnext] [--gap 0.3] [--no-profile]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import transformer_models as tm  # noqa: E402 - the bench folder's engines, timing and tables

REAL = ["resnet50", "convnext_tiny", "convnextv2_tiny", "regnet", "mobilenet_v2", "efficientnet_b0", "bit",
        "mobilevit_s"]


def light_models() -> dict[str, tuple[bytes, dict]]:
    import onnx

    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    out = {}
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".onnx"):
            continue
        with open(os.path.join(folder, f), "rb") as fh:
            blob = fh.read()
        m = onnx.load_from_string(blob)
        inits = {i.name for i in m.graph.initializer}
        rng = np.random.default_rng(0)
        feeds = {}
        for i in m.graph.input:
            if i.name in inits:
                continue
            shape = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        name = f[6:-5]
        # (the zoo's resnet50 and the real family's share a name: the table is keyed by it)
        out[name + "_zoo" if name in REAL else name] = (blob, feeds)
    return out


def build_real(name: str):
    """``(torch module returning last_hidden_state, {"pixel_values": array})``."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if name == "resnet50":
        model = tf.ResNetModel(tf.ResNetConfig())  # the config's default: ResNet-50
    elif name == "convnext_tiny":
        model = tf.ConvNextModel(tf.ConvNextConfig())  # default: ConvNeXt-T
    elif name == "convnextv2_tiny":
        model = tf.ConvNextV2Model(tf.ConvNextV2Config(depths=[3, 3, 9, 3], hidden_sizes=[96, 192, 384, 768]))
    elif name == "regnet":
        model = tf.RegNetModel(tf.RegNetConfig())
    elif name == "mobilenet_v2":
        model = tf.MobileNetV2Model(tf.MobileNetV2Config())
    elif name == "efficientnet_b0":
        model = tf.EfficientNetModel(tf.EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0,
                                                           image_size=224, dropout_rate=0.2, hidden_dim=1280))
    elif name == "bit":
        model = tf.BitModel(tf.BitConfig())
    elif name == "mobilevit_s":
        model = tf.MobileViTModel(tf.MobileViTConfig(image_size=224))
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(REAL)}")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    realistic_weights(model, x)
    return tm.wrap(model, "pixels"), {"pixel_values": x}


def realistic_weights(model, x: np.ndarray) -> None:
    """Weights whose activations stay O(1), as a trained network's do, and ``model.eval()``.

    ``transformers``' own initialisation (conv std 0.02, BatchNorm at identity, ConvNeXt's layer
    scale 1e-6, GRN at zero) makes the outputs vanish: EfficientNet-B0's last hidden state is 0.0,
    MobileNetV2's 5e-21 and MobileViT-S's 9e-40 (denormals, which also distort the timing), so a
    diff to onnxruntime says nothing. Here convolutions and linear layers are Kaiming-normal
    (fan-in), norm scales U(0.5, 1.5) and shifts N(0, 0.1), layer scales U(0.1, 0.5), and each
    BatchNorm's running statistics are those of the network's own activations on a few random
    images (a calibration pass in training mode), so every layer sees data of unit scale."""
    import torch

    g = torch.Generator().manual_seed(1)

    def normal_(t, std):
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=g) * std)

    def uniform_(t, lo, hi):
        with torch.no_grad():
            t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)

    norms = (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            fan_in = mod.weight[0].numel()
            normal_(mod.weight, (2.0 / fan_in) ** 0.5)
            if mod.bias is not None:
                normal_(mod.bias, 0.05)
        elif isinstance(mod, norms) and getattr(mod, "weight", None) is not None:
            uniform_(mod.weight, 0.5, 1.5)
            normal_(mod.bias, 0.1)
    for pname, p in model.named_parameters():
        leaf = pname.rsplit(".", 1)[-1]
        if "layer_scale" in leaf:
            uniform_(p, 0.1, 0.5)
        elif ".grn." in f".{pname}" and p.abs().max() == 0:  # ConvNeXt-V2's GRN, zero at init
            normal_(p, 0.1)
    bns = [m for m in model.modules() if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d))]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the calibration batches
    model.train()
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for _ in range(2):
            model(torch.from_numpy(np.concatenate([x, rng.standard_normal((3,) + x.shape[1:]).astype(np.float32)])))
    model.eval()


def conv_kind(node, mode: str) -> str:
    """The convolution algorithm a profiled node ran (None for other ops)."""
    if node.op_type not in ("Conv", "FusedConv", "NchwcConv"):
        return ""
    if mode == "winograd":
        return "winograd"
    if mode.startswith("nchwc winograd"):  # the blocked layout's Winograd F(2x2) / F(4x4)
        return "nchwc winograd"
    w = node.attrs.get("weight_shape") or (node.inputs[1].type.shape if len(node.inputs) > 1 and node.inputs[1] is not None
                                           else None)  # (a packed weight is 1-D: its shape an attribute)
    group = int(node.attrs.get("group", 1) or 1)
    if node.op_type == "NchwcConv":  # the blocked layout's direct kernels
        if group > 1:
            return "nchwc depthwise"
        return "nchwc 1x1" if w is not None and all(k == 1 for k in w[2:]) else "nchwc direct"
    if w is not None and len(w) >= 3 and all(k == 1 for k in w[2:]) and not any(node.attrs.get("pads") or ()):
        return "1x1 gemm"
    if group > 1 and w is not None and w[1] == 1:
        return "depthwise"
    return "im2col gemm" if group == 1 else "grouped"


def conv_profile(blob: bytes, feeds: dict) -> str:
    """GE's time per convolution algorithm (and the rest) over 5 runs at one thread."""
    import onnx

    import ge_core as ge
    from ge_cpu.profile import profile

    model = ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": 1})
    prof = profile(model, feeds, runs=5)
    nodes = {n.name: n for n in model.graph.node_list()}
    per: dict[str, list] = {}
    for row in prof["nodes"]:
        node = nodes.get(row["node"])
        kind = conv_kind(node, row.get("kernel_mode", "")) if node is not None else ""
        e = per.setdefault(kind or "other ops", [0.0, 0])
        e[0] += row["seconds"]
        e[1] += 1
    order = ["nchwc direct", "nchwc winograd", "nchwc 1x1", "nchwc depthwise", "winograd", "1x1 gemm", "im2col gemm",
             "depthwise", "grouped", "other ops"]
    return ", ".join(f"{k} {per[k][0] * 1e3:.2f} ms ({per[k][1]})" for k in order if k in per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--families", default="light,real")
    ap.add_argument("--models", default="", help="comma list of model names (default: every model of the families)")
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    ap.add_argument("--no-profile", action="store_true", help="skip the time per convolution algorithm")
    a = ap.parse_args(argv)
    from threadpoolctl import threadpool_info

    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                    if i.get("user_api") == "blas"])
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    fams = [f.strip() for f in a.families.split(",") if f.strip()]
    wanted = {m.strip() for m in a.models.split(",") if m.strip()}
    models: dict[str, object] = {}
    family_of: dict[str, str] = {}
    if "light" in fams:
        for name, entry in light_models().items():
            if not wanted or name in wanted:
                models[name], family_of[name] = entry, "light"
    if "real" in fams:
        for name in REAL:
            if wanted and name not in wanted:
                continue
            t0 = time.perf_counter()
            family_of[name] = "real"
            try:
                module, feeds = build_real(name)
                models[name] = (tm.to_onnx(module, feeds), feeds)
            except Exception as e:  # noqa: BLE001 - report and go on
                models[name] = tm.err_text(e)
                print(f"export {name}: FAILED {tm.err_text(e)}")
                continue
            print(f"export {name}: {len(models[name][0]) / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s", flush=True)
    thread_counts = [int(t) for t in a.threads.split(",") if t.strip()]
    tm.run_table(models, thread_counts, a.rounds, a.gap, family_of=family_of)
    if not a.no_profile:
        print("\nGE's time per convolution algorithm (one thread, 5 profiled runs; layers in parentheses)")
        for name, entry in models.items():
            if isinstance(entry, str):
                continue
            try:
                print(f"  {name:16s} {conv_profile(*entry)}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  {name:16s} FAILED {tm.err_text(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
