"""Reduced precision modes that compute: matrix ops in bf16 with float32 sums (AMX, AVX512-BF16,
or the scalar reference when forced), weights packed in bf16/fp16 at compile time and kept so in
the .om, GE's lists and ``--keep_dtype`` reaching the kernels, If bodies included.

Every model here is checked against a float64 reference of the bf16-rounded operands (the
products the kernels compute) and against onnxruntime float32."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_cpu.reduced import bf16_unit
from ge_native import bf16

from .conftest import conv_net, ort_run, save_model

#: whether this machine computes bf16 on a unit faster than its float32 GEMM (AMX; AVX512-BF16
#: where it measured faster), else bf16 weights are widened to float32
UNIT = bf16_unit() is not None
BF16 = "allow_mix_precision_bf16"


def _r(a: np.ndarray) -> np.ndarray:
    """float32 ``a`` rounded to bf16, as float64."""
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _mlp(path, seed=0) -> tuple[str, dict[str, np.ndarray]]:
    """x[2, 8, 64] -> fc1 (MatMul + b1, Relu) -> fc2 (MatMul) + x -> y; and a Gemm head on z[5, 64]."""
    rng = np.random.default_rng(seed)
    w = {"w1": rng.standard_normal((64, 96)) * 0.2, "b1": rng.standard_normal(96) * 0.1,
         "w2": rng.standard_normal((96, 64)) * 0.2, "wg": rng.standard_normal((40, 64)) * 0.2,
         "cg": rng.standard_normal(40) * 0.1}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1_bias"),
             helper.make_node("Relu", ["a1"], ["h"], name="act"),
             helper.make_node("MatMul", ["h", "w2"], ["m2"], name="fc2"),
             helper.make_node("Add", ["m2", "x"], ["y"], name="residual"),
             helper.make_node("Gemm", ["z", "wg", "cg"], ["g"], name="head", transB=1, alpha=0.5, beta=2.0)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 64]),
              helper.make_tensor_value_info("z", TensorProto.FLOAT, [5, 64])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("g", TensorProto.FLOAT, None)]
    save_model(path, nodes, inputs, outputs, [numpy_helper.from_array(v, k) for k, v in w.items()])
    return str(path), w


def _feeds(seed=1):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((2, 8, 64)).astype(np.float32), "z": rng.standard_normal((5, 64)).astype(np.float32)}


def _mlp_reference(w, f, unit: bool) -> dict[str, np.ndarray]:
    """float64 of the kernels' products: weights rounded to bf16; activations too where a bf16
    unit computes."""
    act = _r if unit else (lambda a: np.asarray(a, np.float64))
    h = np.maximum(act(f["x"]) @ _r(w["w1"]) + w["b1"], 0)
    y = act(h.astype(np.float32)) @ _r(w["w2"]) + f["x"]
    g = act(f["z"]) @ _r(w["wg"].T * np.float32(0.5)) + 2.0 * w["cg"]
    return {"y": y, "g": g}


def _range_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / (ref.max() - ref.min()))


def test_bf16_mode_computes_matmul_gemm_and_epilogues_in_bf16(tmp_path):
    src, w = _mlp(tmp_path / "mlp.onnx")
    m = ge.compile(src, {"precision_mode": BF16})
    f = _feeds()
    got = m.run(f)
    ref = _mlp_reference(w, f, UNIT)
    for name in ("y", "g"):
        assert _range_err(got[name], ref[name]) < 2e-5, name  # the bf16 products, float32 sums
    ort = dict(zip(("y", "g"), ort_run(src, f)))
    for name in ("y", "g"):
        err = _range_err(got[name], ort[name].astype(np.float64))
        assert 0 < err < 1e-2, (name, err)  # bf16: close to float32, not float32 itself
    table = m.report["precision"]
    packed = [n for n in m.graph.node_list() if n.op_type == "PackedMatMul"]
    assert len(packed) == 3 and all(n.inputs[1].const_value.dtype == np.uint16 for n in packed)
    assert table["compute"] == {("bfloat16" if UNIT else "float32"): 3}
    for e in table["nodes"].values():
        assert e["weights"] == "bfloat16" and e["compute"] == ("bfloat16" if UNIT else "float32")
        assert e["bytes_saved"] > 0 and ("why" in e) != UNIT
    kernels = m.report["node_kernels"]
    variants = {kernels[n.name]["variant"] for n in packed}
    assert variants == {bf16.isa() if UNIT else "float32 sgemm"}  # the dispatch says which ran


def test_bf16_weights_stay_packed_in_the_om_and_run_the_same(tmp_path):
    src, _ = _mlp(tmp_path / "mlp.onnx")
    fp32 = ge.compile(src)
    m = ge.compile(src, {"precision_mode": BF16})
    fp32.save(str(tmp_path / "f.om"))
    m.save(str(tmp_path / "b.om"))
    from ge_sdk.omdesc import inspect_om

    size = {k: next(p["size"] for p in inspect_om(str(tmp_path / f"{k}.om"))["file"]["partitions"]
                    if p["kind"] == "weights") for k in "fb"}
    assert size["b"] < 0.6 * size["f"], size
    back = ge.load_om(str(tmp_path / "b.om"))
    assert sum(n.op_type == "PackedMatMul" for n in back.graph.node_list()) == 3
    f = _feeds(2)
    a, b = m.run(f), back.run(f)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert back.report["precision"]["compute"] == m.report["precision"]["compute"]


def test_bf16_bits_are_the_same_at_one_and_two_threads(tmp_path):
    src, _ = _mlp(tmp_path / "mlp.onnx")
    f = _feeds(3)
    one = ge.compile(src, {"precision_mode": BF16, "threads": 1}).run(f)
    two = ge.compile(src, {"precision_mode": BF16, "threads": 2}).run(f)
    for name in one:
        np.testing.assert_array_equal(one[name], two[name])


_VARIANT_SCRIPT = r"""
import json, sys, numpy as np
import ge_core as ge
from ge_cpu.reduced import bf16_unit
from ge_native import bf16
m = ge.compile(sys.argv[1], {"precision_mode": "allow_mix_precision_bf16"})
rng = np.random.default_rng(1)
f = {"x": rng.standard_normal((2, 8, 64)).astype(np.float32), "z": rng.standard_normal((5, 64)).astype(np.float32)}
out = m.run(f)
np.save(sys.argv[2], out["y"])
print(json.dumps({"isa": bf16.isa(), "compute": m.report["precision"]["compute"],
                  "variants": sorted({v["variant"] for v in m.report["node_kernels"].values()})}))
"""


@pytest.mark.parametrize("forced", ["scalar", "0"])
def test_forced_variants_compute_the_same_products(tmp_path, forced):
    """GE_NATIVE_BF16=scalar: the plain-C reference computes in bf16 (the same rounding as the
    units, within the float32 sums' order); =0: no bf16 path, the bf16 weights widened to float32."""
    src, w = _mlp(tmp_path / "mlp.onnx")
    env = {**os.environ, "GE_NATIVE_BF16": forced}
    r = subprocess.run([sys.executable, "-c", _VARIANT_SCRIPT, src, str(tmp_path / "y.npy")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    y = np.load(tmp_path / "y.npy")
    unit = forced == "scalar"
    assert info["compute"] == {("bfloat16" if unit else "float32"): 3}
    assert info["variants"] == (["scalar"] if unit else ["float32 sgemm"])
    ref = _mlp_reference(w, _feeds(), unit)["y"]
    assert _range_err(y, ref) < 2e-5


def test_keep_dtype_keeps_a_node_float32_and_the_lists_reach_the_kernels(tmp_path, atc):
    src, _ = _mlp(tmp_path / "mlp.onnx")
    keep = tmp_path / "keep.cfg"
    keep.write_text("fc1\n")
    rc, _, err = atc(f"--model={src}", f"--output={tmp_path / 'k'}", f"--precision_mode={BF16}", f"--keep_dtype={keep}",
                     f"--report={tmp_path / 'r.json'}")
    assert rc == 0, err
    g = ge.load_om(str(tmp_path / "k.om")).graph
    ops = [n.op_type for n in g.node_list()]
    assert ops.count("PackedMatMul") == 2 and ops.count("FusedMatMul") == 1  # fc1 (fused with its bias, Relu)
    kept = next(n for n in g.node_list() if n.op_type == "FusedMatMul")
    assert kept.inputs[1].const_value.dtype == np.float32
    table = json.loads((tmp_path / "r.json").read_text())["precision"]
    assert len(table["nodes"]) == 2
    assert "accuracy" in table and "compute in" in err
    mix = tmp_path / "mix.json"  # MatMul onto the black list: only the Gemm computes reduced
    mix.write_text(json.dumps({"black-list": {"to-add": ["MatMulV2"]}}))
    rc, _, err = atc(f"--model={src}", f"--output={tmp_path / 'b'}", f"--precision_mode={BF16}",
                     f"--modify_mixlist={mix}")
    assert rc == 0, err
    kinds = [n.op_type for n in ge.load_om(str(tmp_path / "b.om")).graph.node_list()]
    assert kinds.count("PackedMatMul") == 1


def test_fp16_modes_store_float16_and_compute_float32(tmp_path):
    src, w = _mlp(tmp_path / "mlp.onnx")
    f = _feeds(4)
    for mode in ("force_fp16", "allow_fp32_to_fp16", "allow_mix_precision"):
        m = ge.compile(src, {"precision_mode": mode})
        packed = [n for n in m.graph.node_list() if n.op_type == "PackedMatMul"]
        assert len(packed) == 3 and all(n.inputs[1].const_value.dtype == np.float16 for n in packed), mode
        assert m.report["precision"]["compute"] == {"float32": 3}
        assert all("float16 weight is widened" in e["why"] for e in m.report["precision"]["nodes"].values())
        got = m.run(f)
        h = np.maximum(f["x"].astype(np.float64) @ w["w1"].astype(np.float16) + w["b1"], 0)
        y = h @ w["w2"].astype(np.float16).astype(np.float64) + f["x"]
        assert _range_err(got["y"], y) < 1e-5  # exactly the float16 weights' products
        assert _range_err(got["y"], ort_run(src, f)[0].astype(np.float64)) < 2e-3


def test_the_precision_pass_reaches_if_bodies(tmp_path):
    rng = np.random.default_rng(6)
    wt = numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "wt")
    then = helper.make_graph([helper.make_node("MatMul", ["x", "wt"], ["t"], name="then_mm")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)], [wt])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="else_id")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    src = save_model(tmp_path / "if.onnx", nodes, [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                                   helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = ge.compile(src, {"precision_mode": BF16})
    body_ops = [n.op_type for top in m.graph.node_list() for g in top.subgraphs() for n in g.node_list()]
    assert "PackedMatMul" in body_ops
    assert any(k.endswith("then_mm") for k in m.report["precision"]["nodes"])
    x = rng.standard_normal((4, 32)).astype(np.float32)
    y = m.run({"c": np.array(True), "x": x})["y"]
    act = _r if UNIT else (lambda a: np.asarray(a, np.float64))
    ref = act(x) @ _r(numpy_helper.to_array(wt))
    assert _range_err(y, ref) < 2e-5


def test_bf16_convolutions_in_the_blocked_layout(tmp_path):
    src = conv_net(tmp_path / "c.onnx", channels=(32, 48))
    m = ge.compile(src, {"precision_mode": "allow_fp32_to_bf16"})
    nodes = m.report["precision"]["nodes"]
    conv = [e for e in nodes.values() if e["op"] == "NchwcConv"]
    assert len(conv) == 2
    # the 3-channel stem reads NCHW (its own bf16 packing), the second conv the blocked layout
    assert all(e["weights"] == "bfloat16" and e["compute"] == ("bfloat16" if UNIT else "float32") for e in conv)
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    y = m.run({"x": x})["y"]
    ref = ort_run(src, {"x": x})[0].astype(np.float64)
    assert 0 < _range_err(y, ref) < 1e-2


def test_a_float32_compile_says_what_the_bf16_mode_would_buy_where_the_cpu_has_the_unit(tmp_path, atc, monkeypatch):
    import ge_sdk.precision

    # the trial compile is skipped when the first compile took longer than the budget: a loaded
    # CI machine must not decide what this test checks
    monkeypatch.setattr(ge_sdk.precision, "HINT_BUDGET_S", 1e9)
    src, _ = _mlp(tmp_path / "mlp.onnx")
    line = ge.compile(src).report.get("precision_hint")
    assert ge.compile(src, {"precision_mode": BF16}).report.get("precision_hint") is None
    rc, _, err = atc(f"--model={src}", f"--output={tmp_path / 'f'}", f"--report={tmp_path / 'r.json'}")
    assert rc == 0, err
    from ge_atc.precision_hint import MIN_RATIO

    if bf16.isa() not in ("amx_bf16", "avx512_bf16") or (bf16.measured_speedup(bf16.isa()) or 0) < MIN_RATIO:  # (no bf16 unit faster than float32 here)
        assert line is None and "allow_mix_precision_bf16" not in err
        return
    assert bf16.isa() in line and "allow_mix_precision_bf16" in line and "3 matrix op(s)" in line
    assert "209,408 multiply-adds" in line  # 2*8*64*96 + 2*8*96*64 + 5*64*40
    ratio = float(line.split("GEMM runs ")[1].split("x")[0])
    assert ratio >= MIN_RATIO
    # atc compiled the model in the bf16 mode too (a quick compile): its measured speed and error
    report = json.loads((tmp_path / "r.json").read_text())
    trial = report["precision_trial"]
    assert trial["mode"] == BF16 and trial["speedup"] > 0 and 0 < trial["max_abs_over_range"] < 1e-2
    assert trial["cosine"] > 0.9999 and f"within {trial['max_abs_over_range']:.1e}" in err


def test_bf16_mode_computes_attention_products_in_bf16(tmp_path):
    """A tiny BERT (transformers, random weights, a padding mask as input): its fused Attention
    computes both products in bf16 where the CPU has the unit, the softmax in float32."""
    import onnx
    import torch
    import transformers as tf

    from tests.fusion.common import export_last_hidden

    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, attn_implementation="eager")
    blob = export_last_hidden(tf.BertModel(cfg).eval(), 24, mask="input")
    (tmp_path / "bert.onnx").write_bytes(blob)
    ids = np.random.default_rng(8).integers(0, 97, (1, 24)).astype(np.int64)
    mask = np.ones((1, 24), np.int64)
    mask[0, 19:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    fp32 = ge.compile(ge.load(onnx.load_from_string(blob)))
    m = ge.compile(ge.load(onnx.load_from_string(blob)), {"precision_mode": BF16})
    att = {k: e for k, e in m.report["precision"]["nodes"].items() if e["op"] == "Attention"}
    assert len(att) == 2
    assert all(e["compute"] == ("bfloat16" if UNIT else "float32") for e in att.values())
    kernels = [v for v in m.report["node_kernels"].values() if v["op"] == "Attention"]
    assert all(v["algorithm"] == ("bf16_heads" if UNIT else v["algorithm"]) for v in kernels) and len(kernels) == 2
    got, base = m.run(feeds)["last_hidden_state"], fp32.run(feeds)["last_hidden_state"]
    ref = ort_run(str(tmp_path / "bert.onnx"), feeds)[0].astype(np.float64)
    assert 0 < _range_err(got, ref) < 1e-2
    assert _range_err(base, ref) < 1e-5
    cos = float((got * ref).sum() / np.sqrt((got.astype(np.float64) ** 2).sum() * (ref ** 2).sum()))
    assert cos > 0.9999


def test_fp16_mode_leaves_a_causal_masks_constant_alone(tmp_path):
    """A decoder's causal mask constant (-3.4e38 below the diagonal) is an input of its
    Attention, not a weight: force_fp16 compiles (nothing is stored in float16 that would
    overflow), its matrix weights float16, within 2e-3 of float32."""
    import onnx
    import torch
    import transformers as tf

    from tests.fusion.common import export_last_hidden

    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64, attn_implementation="eager")
    blob = export_last_hidden(tf.GPT2Model(cfg).eval(), 16)
    feeds = {"input_ids": np.random.default_rng(9).integers(0, 97, (1, 16)).astype(np.int64)}
    base = ge.compile(ge.load(onnx.load_from_string(blob))).run(feeds)["last_hidden_state"]
    m = ge.compile(ge.load(onnx.load_from_string(blob)), {"precision_mode": "force_fp16"})
    weights = [n.inputs[1].const_value.dtype for n in m.graph.node_list() if n.op_type == "PackedMatMul"]
    assert len(weights) == 8 and set(weights) == {np.dtype(np.float16)}
    got = m.run(feeds)["last_hidden_state"]
    assert 0 < _range_err(got, base.astype(np.float64)) < 2e-3


@pytest.mark.parametrize("attr, value, says", [("k", 999, "weight must be uint16"), ("weight_dtype", "int4", "weight_dtype"),
                                               ("n", 0, "infers float32"), ("epilogue", '[["Exec", ["y"], {}]]', "epilogue")])
def test_a_tampered_packed_matmul_in_an_om_is_refused_at_load(tmp_path, attr, value, says):
    src, _ = _mlp(tmp_path / "mlp.onnx")
    m = ge.compile(src, {"precision_mode": BF16})
    next(n for n in m.graph.node_list() if n.op_type == "PackedMatMul").attrs[attr] = value
    with pytest.raises(ge.GEError, match=says):  # (refused when saved, or when loaded)
        m.save(str(tmp_path / "bad.om"))
        ge.load_om(str(tmp_path / "bad.om"))


_LOAD_SCRIPT = r"""
import json, sys, numpy as np
import ge_core as ge
m = ge.load_om(sys.argv[1])
x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
np.save(sys.argv[2], m.run({"x": x})["y"])
print(json.dumps(sorted({v["variant"] for v in m.executable.node_kernels.values()})))
"""


def test_a_bf16_om_runs_where_the_cpu_has_no_bf16_unit(tmp_path):
    """The .om keeps the bf16 packing; a process without the bf16 path (GE_NATIVE_BF16=0, as on
    a CPU without a unit) widens the weights once into the float32 blocked kernels' packing."""
    src = conv_net(tmp_path / "c.onnx", channels=(32, 48))
    ge.compile(src, {"precision_mode": "allow_fp32_to_bf16"}).save(str(tmp_path / "c.om"))
    env = {**os.environ, "GE_NATIVE_BF16": "0"}
    r = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT, str(tmp_path / "c.om"), str(tmp_path / "y.npy")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    from ge_native import nchwc

    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["float32 " + ("nchwc" if nchwc.available() else "numpy")]
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = ort_run(src, {"x": x})[0].astype(np.float64)
    assert 0 < _range_err(np.load(tmp_path / "y.npy"), ref) < 1e-2  # bf16 weights, float32 activations


@pytest.mark.parametrize("channels", [3, 24])
def test_a_lone_convolution_computes_in_bf16_between_reorders(tmp_path, channels):
    """ViT's patch embedding (one strided Conv the layout pass leaves in NCHW): a bf16 NchwcConv,
    its input read as NCHW (3 channels) or reordered in (24), its output reordered out."""
    rng = np.random.default_rng(10)
    w = numpy_helper.from_array((rng.standard_normal((40, channels, 4, 4)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="patch", strides=[4, 4]),
             helper.make_node("Flatten", ["c"], ["y"], name="flat")]
    src = save_model(tmp_path / "p.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 20, 24])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    m = ge.compile(src, {"precision_mode": BF16})
    ops = [n.op_type for n in m.graph.node_list()]
    e = m.report["precision"]["nodes"]["patch"]
    if UNIT:
        assert "NchwcConv" in ops and "NchwcReorderOutput" in ops and ("NchwcReorderInput" in ops) == (channels > 16)
        assert e["weights"] == "bfloat16" and e["compute"] == "bfloat16"
    else:
        assert ops.count("Conv") == 1 and e["compute"] == "float32" and "bf16 unit" in e["why"]
    x = rng.standard_normal((1, channels, 20, 24)).astype(np.float32)
    y = m.run({"x": x})["y"]
    ref = ort_run(src, {"x": x})[0].astype(np.float64)
    assert _range_err(y, ref) < 1e-2 and (_range_err(y, ref) > 0) == UNIT
