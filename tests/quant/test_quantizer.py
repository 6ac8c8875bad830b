"""The quantiser (``ge.quantize``, ATC's ``--compression_optimize_conf``): the QDQ graph it writes,
its weight grid, its range estimators, accuracy control, and GE's config files end to end.

Models are built here (onnx.helper, seeded random weights); the quantised graphs run on this
engine and, exported by its ONNX exporter, on onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import OptionError
from ge_quant.calibration import Collector, entropy_bins

from ..atc.conftest import run_atc


def _model(nodes, inputs, inits, name="m") -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def conv_net(seed: int = 0) -> onnx.ModelProto:
    """x[2,3,8,8] -> conv1 -> bn1 -> relu -> conv2 -> bn2 -> add(relu) -> relu -> pool -> gemm."""
    rng = np.random.default_rng(seed)
    f = np.float32
    inits = {"w1": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(f), "b1": (rng.standard_normal(8) * 0.1).astype(f),
             "w2": (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(f),
             "fw": (rng.standard_normal((4, 8)) * 0.5).astype(f), "fb": (rng.standard_normal(4) * 0.1).astype(f)}
    for i in (1, 2):
        inits.update({f"g{i}": rng.uniform(0.5, 1.5, 8).astype(f), f"be{i}": (rng.standard_normal(8) * 0.1).astype(f),
                      f"m{i}": (rng.standard_normal(8) * 0.1).astype(f), f"v{i}": rng.uniform(0.5, 2, 8).astype(f)})
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["n1"], name="bn1"),
             helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "g2", "be2", "m2", "v2"], ["n2"], name="bn2"),
             helper.make_node("Add", ["n2", "r1"], ["s"], name="residual"),
             helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["fl"], name="flatten"),
             helper.make_node("Gemm", ["fl", "fw", "fb"], ["y"], name="fc", transB=1)]
    return _model(nodes, [("x", [2, 3, 8, 8])], inits, "convnet")


def mlp(bad: bool = False, seed: int = 1) -> onnx.ModelProto:
    """x[16,16] -> fc1 (Gemm) -> relu -> fc2 (Gemm) -> relu -> fc3 (MatMul). ``bad``: input
    channel 5 of fc2 is dead (relu of a large negative) and its weight row is huge, so fc2's
    per-channel int8 grid is too coarse for every other row."""
    rng = np.random.default_rng(seed)
    f = np.float32
    w1, b1 = (rng.standard_normal((16, 32)) * 0.3).astype(f), (rng.standard_normal(32) * 0.1).astype(f)
    w2, b2 = (rng.standard_normal((32, 32)) * 0.2).astype(f), (rng.standard_normal(32) * 0.1).astype(f)
    if bad:
        w1[:, 5], b1[5], w2[5, :] = 0.0, -1.0, 60.0
    inits = {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": (rng.standard_normal((32, 8)) * 0.3).astype(f)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1"),
             helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
             helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], name="fc2"),
             helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
             helper.make_node("MatMul", ["r2", "w3"], ["y"], name="fc3")]
    return _model(nodes, [("x", [16, 16])], inits, "mlp")


def matmul_block(seed: int = 2) -> onnx.ModelProto:
    """Attention-like scores: q = x Wq, k = x Wk, y = q k^T (a product of two activations)."""
    rng = np.random.default_rng(seed)
    inits = {"wq": (rng.standard_normal((16, 8)) * 0.3).astype(np.float32),
             "wk": (rng.standard_normal((16, 8)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="proj_q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="proj_k"),
             helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[1, 0]),
             helper.make_node("MatMul", ["q", "kt"], ["y"], name="scores")]
    return _model(nodes, [("x", [6, 16])], inits, "block")


def feeds(shape, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def _load(model: onnx.ModelProto) -> ge.Graph:
    return ge.load(model.SerializeToString())


def _run(graph_or_model, batch) -> np.ndarray:
    return ge.compile(graph_or_model).run(batch)["y"]


def _ort(graph: ge.Graph, batch) -> np.ndarray:
    from ge_onnx.exporter import export_onnx

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(export_onnx(graph).SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(["y"], batch)[0]


def _reader(node: ge.Node, i: int) -> ge.Node | None:
    v = node.inputs[i]
    return None if v is None else v.producer


def _error(q: np.ndarray, f: np.ndarray) -> float:
    return float(np.abs(q - f).max() / (f.max() - f.min()))


def test_conv_net_bn_folded_qdq_placed_skip_layers_float_and_onnxruntime_agrees():
    graph = _load(conv_net())
    cal = feeds((2, 3, 8, 8), 6, seed=3)
    rep: dict = {}
    q = ge.quantize(graph, cal, skip_layers=["conv2"], report=rep)
    nodes = {n.name: n for n in q.nodes}
    assert not any(n.op_type == "BatchNormalization" for n in q.nodes) and rep["batchnorm_folded"] == 2
    assert any(n.op_type == "BatchNormalization" for n in graph.nodes)  # the source graph is not changed
    conv1 = nodes["conv1"]
    dq_x, dq_w, dq_b = (_reader(conv1, i) for i in range(3))
    assert dq_x.op_type == "DequantizeLinear" and dq_x.inputs[0].producer.op_type == "QuantizeLinear"
    assert dq_w.op_type == "DequantizeLinear" and dq_w.inputs[0].const_value.dtype == np.int8 and dq_w.attrs["axis"] == 0
    assert dq_b.op_type == "DequantizeLinear" and dq_b.inputs[0].const_value.dtype == np.int32
    np.testing.assert_array_equal(dq_b.inputs[1].const_value,
                                  np.float32(dq_x.inputs[1].const_value) * dq_w.inputs[1].const_value)
    conv2 = nodes["conv2"]  # skipped: float input, float weight, no Q/DQ
    assert all(_reader(conv2, i) is None or _reader(conv2, i).op_type != "DequantizeLinear" for i in range(len(conv2.inputs)))
    assert conv2.inputs[1].const_value.dtype == np.float32
    assert all(_reader(nodes["residual"], i).op_type == "DequantizeLinear" for i in (0, 1))
    assert _reader(nodes["fc"], 1).attrs["axis"] == 0  # transB: output channels on axis 0
    assert rep["kept_float"] == {"conv2": "skip_layers"} and "conv2" not in rep["layers"]
    assert set(rep["quantized"]) == {"conv1", "residual", "pool", "fc"}
    for batch in feeds((2, 3, 8, 8), 2, seed=4):
        ours, theirs, flt = _run(q, batch), _ort(q, batch), _run(graph, batch)
        span = float(flt.max() - flt.min())
        assert np.abs(ours - theirs).max() <= 0.01 * span  # int8 tolerance: a step here and there
        assert np.abs(ours - flt).max() <= 0.05 * span


def test_per_channel_weights_lie_exactly_on_their_int8_grid():
    graph = _load(mlp())
    cal = feeds((16, 16), 4, seed=5)
    for per_channel in (True, False):
        q = ge.quantize(graph, cal, per_channel=per_channel)
        nodes = {n.name: n for n in q.nodes}
        for name, w_name, axis in (("fc1", "w1", 1), ("fc2", "w2", 1), ("fc3", "w3", 1)):
            w = graph.constants[w_name].const_value
            dq = _reader(nodes[name], 1)
            wq, s, z = (dq.inputs[i].const_value for i in range(3))
            want_s = (np.abs(w).max(axis=0) / np.float32(127)).astype(np.float32) if per_channel else \
                np.float32(np.abs(w).max() / np.float32(127))
            np.testing.assert_array_equal(s, want_s)
            assert wq.dtype == np.int8 and not z.any() and np.abs(wq).max() == 127
            np.testing.assert_array_equal(wq, np.clip(np.rint(w / s), -127, 127).astype(np.int8))
            assert dq.attrs.get("axis") == (axis if per_channel else None)
            assert np.abs(wq.astype(np.float32) * s - w).max() <= np.max(s) / 2 * (1 + 1e-6)
        batch = feeds((16, 16), 1, seed=6)[0]
        np.testing.assert_allclose(_run(q, batch), _ort(q, batch), atol=1e-4)


def test_a_product_of_two_activations_quantises_both_sides_and_int8_activations_are_symmetric():
    graph = _load(matmul_block())
    cal = feeds((6, 16), 4, seed=7)
    rep: dict = {}
    q = ge.quantize(graph, cal, activation_type="int8", method="percentile", percentile=99.9, report=rep)
    scores = next(n for n in q.nodes if n.name == "scores")
    for i in (0, 1):
        dq = _reader(scores, i)
        assert dq.op_type == "DequantizeLinear" and dq.inputs[2].const_value.dtype == np.int8
        assert dq.inputs[2].const_value == 0
    assert set(rep["layers"]["scores"]["inputs"]) == {"q", "kt"}
    batch = feeds((6, 16), 1, seed=8)[0]
    flt = _run(graph, batch)
    assert _error(_run(q, batch), flt) < 0.05 and _error(_ort(q, batch), flt) < 0.05


def test_percentile_and_entropy_clip_a_heavy_tail_that_minmax_keeps():
    rng = np.random.default_rng(9)
    col = Collector()
    for _ in range(4):
        col.add(rng.standard_t(2, 20000).astype(np.float32))  # Student's t, 2 degrees: heavy tails
    lo_mm, hi_mm = col.range("minmax")
    lo_p, hi_p = col.range("percentile", 99.9)
    lo_e, hi_e = col.range("entropy")
    assert hi_mm > hi_p > 0 and lo_mm < lo_p < 0 and hi_mm > hi_e > 0 and lo_mm < lo_e < 0
    assert hi_mm > 4 * max(hi_p, hi_e)
    assert col.range("percentile", 100.0)[1] == pytest.approx(hi_mm, rel=1e-6)


def _kl_brute(hist: np.ndarray, levels: int) -> int:
    """TensorRT's search written out bin by bin: the bin count whose clipped reference P and
    quantised candidate Q have the smallest KL(P || Q)."""
    best, best_i = None, len(hist)
    for i in range(levels, len(hist) + 1):
        p = [float(v) for v in hist[:i]]
        p[-1] += float(sum(hist[i:]))
        step = i // levels
        q = [0.0] * i
        for j in range(levels):
            lo, hi = j * step, (i if j == levels - 1 else (j + 1) * step)
            nz = [k for k in range(lo, hi) if hist[k] > 0]
            for k in nz:
                q[k] = float(sum(hist[lo:hi])) / len(nz)
        ps, qs = sum(p), sum(q)
        kl = sum((a / ps) * np.log((a / ps) / max(b / qs, 1e-10)) for a, b in zip(p, q) if a > 0)
        if best is None or kl < best:
            best, best_i = kl, i
    return best_i


def test_entropy_threshold_matches_a_brute_force_kl_search():
    rng = np.random.default_rng(10)
    for trial in range(4):
        hist = np.histogram(np.abs(rng.standard_t(3, 5000)), bins=96)[0].astype(np.float64)
        if trial == 3:
            hist[40:50] = 0  # empty bins inside the range
        assert entropy_bins(hist, 8) == _kl_brute(hist, 8)


def test_max_error_keeps_exactly_the_bad_layer_float_and_holds_on_held_back_inputs():
    graph = _load(mlp(bad=True))
    cal = feeds((16, 16), 8, seed=11)
    rep: dict = {}
    q = ge.quantize(graph, cal, max_error=0.03, report=rep)
    assert rep["model_error_before"] > 0.03 >= rep["model_error_after"]
    assert list(rep["kept_float"]) == ["fc2"] and "max_error" in rep["kept_float"]["fc2"]
    layers = rep["layers"]
    assert layers["fc2"]["kept_float"] and layers["fc2"]["sqnr_db"] < min(layers[n]["sqnr_db"] for n in ("fc1", "fc3"))
    assert layers["fc2"]["cosine"] < layers["fc1"]["cosine"]
    fc2 = next(n for n in q.nodes if n.name == "fc2")
    assert all(_reader(fc2, i) is None or _reader(fc2, i).op_type != "DequantizeLinear" for i in range(3))
    assert q.metadata["quantize_report"]["kept_float"] == rep["kept_float"]
    model_q, model_f = ge.compile(q), ge.compile(graph)
    held = feeds((16, 16), 6, seed=12)
    got = np.stack([model_q.run(b)["y"] for b in held])
    want = np.stack([model_f.run(b)["y"] for b in held])
    assert _error(got, want) <= 0.03
    without = ge.quantize(graph, cal, report=(plain := {}))  # no budget: everything quantised, fc2 diverges
    assert plain["kept_float"] == {} and plain["first_divergence"]["layer"] == "fc2"
    assert _error(np.stack([ge.compile(without).run(b)["y"] for b in held]), want) > 0.03


def test_bad_quantize_arguments_raise_option_errors():
    graph = _load(mlp())
    cal = feeds((16, 16), 1, seed=13)
    for kw, word in (({"method": "kl"}, "method"), ({"skip_layers": ["fc9"]}, "fc9"),
                     ({"activation_type": "int4"}, "activation_type"), ({"max_error": -1}, "max_error")):
        with pytest.raises(OptionError, match=word):
            ge.quantize(graph, cal, **kw)
    with pytest.raises(OptionError, match="no feed"):
        ge.quantize(graph, [])


def _conf(tmp_path, data: str, shape: str, cfg: str | None = None, name: str = "conf.cfg") -> str:
    text = f"calibration:\n{{\n    input_data_dir: {data}\n    input_shape: {shape}\n"
    if cfg is not None:
        (tmp_path / "simple.cfg").write_text(cfg)
        text += "    config_file: simple.cfg\n"
    text += "    infer_soc: Ascend310P3\n    log: info\n}\n"
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


SIMPLE = ('batch_num: 3\nactivation_offset: true\nskip_layers: "conv2"\ncommon_config : {\n'
          '    arq_quantize : { channel_wise : true }\n    hfmg_quantize : { num_of_bins : 4096 }\n}\n')


def test_atc_compression_optimize_conf_with_bin_and_npy_batches(tmp_path):
    model = tmp_path / "net.onnx"
    onnx.save(conv_net(), str(model))
    cal = feeds((2, 3, 8, 8), 4, seed=14)
    (tmp_path / "bins").mkdir()
    (tmp_path / "npys").mkdir()
    for i, b in enumerate(cal):
        b["x"].tofile(tmp_path / "bins" / f"batch_{i}.bin")
        np.save(tmp_path / "npys" / f"batch_{i}.npy", b["x"])
    graph = _load(conv_net())
    want = ge.compile(ge.quantize(graph, cal[:3], method="entropy", skip_layers=["conv2"]))
    batch = feeds((2, 3, 8, 8), 1, seed=15)[0]
    for data in ("bins", "npys"):
        conf = _conf(tmp_path, data, "x:2,3,8,8", SIMPLE)
        rc, _, err = run_atc(f"--model={model}", "--framework=5", f"--output={tmp_path / data}",
                             f"--compression_optimize_conf={conf}")
        assert rc == 0, err
        got = ge.load_om(str(tmp_path / f"{data}.om")).run(batch)["y"]
        np.testing.assert_allclose(got, want.run(batch)["y"], rtol=1e-5, atol=1e-5)
    # one .bin holding every batch (GE's form), through the compile option
    np.concatenate([b["x"] for b in cal]).tofile(tmp_path / "all.bin")
    conf = _conf(tmp_path, "all.bin", "x:2,3,8,8", SIMPLE)
    got = ge.compile(str(model), {"compression_optimize_conf": conf}).run(batch)["y"]
    np.testing.assert_allclose(got, want.run(batch)["y"], rtol=1e-5, atol=1e-5)


def test_a_two_input_model_reads_comma_separated_files_and_prefixed_npy(tmp_path):
    rng = np.random.default_rng(16)
    w = (rng.standard_normal((8, 4)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="join"), helper.make_node("MatMul", ["s", "w"], ["y"], name="mm")]
    model = _model(nodes, [("a", [3, 8]), ("b", [3, 8])], {"w": w}, "two")
    graph = _load(model)
    cal = [{"a": rng.standard_normal((3, 8)).astype(np.float32), "b": rng.standard_normal((3, 8)).astype(np.float32)}
           for _ in range(2)]
    np.concatenate([c["a"] for c in cal]).tofile(tmp_path / "a.bin")
    np.concatenate([c["b"] for c in cal]).tofile(tmp_path / "b.bin")
    (tmp_path / "d").mkdir()
    for i, c in enumerate(cal):
        for k in "ab":
            np.save(tmp_path / "d" / f"{k}_{i}.npy", c[k])
    want = ge.compile(ge.quantize(graph, cal))
    batch = {"a": cal[0]["a"] + 0.1, "b": cal[1]["b"]}
    for data in ("a.bin,b.bin", "d"):
        conf = _conf(tmp_path, data, "a:3,8;b:3,8")
        got = ge.compile(graph, {"compression_optimize_conf": conf}).run(batch)["y"]
        np.testing.assert_allclose(got, want.run(batch)["y"], rtol=1e-5, atol=1e-5)
        assert graph.find_node("join").inputs[0].producer is None  # the pass rewrote a copy of the graph


@pytest.mark.parametrize("case, key", [
    ("missing_dir", "input_data_dir"), ("shape", "input_shape"), ("algo", "act_algo"), ("no_block", "calibration"),
    ("name", "input_shape"), ("batch_num", "batch_num"), ("unknown_key", "skip_layer"), ("no_cfg", "config_file"),
])
def test_bad_compression_conf_files_raise_option_errors_naming_the_key(tmp_path, capsys, case, key):
    model = tmp_path / "net.onnx"
    onnx.save(mlp(), str(model))
    np.zeros((2, 16, 16), np.float32).tofile(tmp_path / "x.bin")
    cfg = {"algo": "act_algo: kl_divergence\n", "batch_num": "batch_num: 5\n", "unknown_key": "skip_layer: fc1\n"}.get(case)
    shape = {"shape": "x:16,15", "name": "z:16,16"}.get(case, "x:16,16")
    conf = _conf(tmp_path, "nowhere" if case == "missing_dir" else "x.bin", shape, cfg)
    if case == "no_block":
        (tmp_path / "conf.cfg").write_text("enable_first_layer_quantization: true\n")
    if case == "no_cfg":
        conf = _conf(tmp_path, "x.bin", shape, "batch_num: 1\n")
        (tmp_path / "simple.cfg").unlink()
    with pytest.raises(OptionError, match=key) as e:
        ge.compile(str(model), {"compression_optimize_conf": conf})
    assert "conf.cfg" in str(e.value) or "simple.cfg" in str(e.value)
    rc, _, err = run_atc(f"--model={model}", "--framework=5", f"--output={tmp_path / 'o'}",
                         f"--compression_optimize_conf={conf}", capsys=capsys)
    assert rc == 2 and key in err


def test_calibration_that_is_not_feed_dicts_is_an_option_error():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "r",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    graph = ge.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    for bad in ([...], [3], 5):
        with pytest.raises(OptionError, match="feed dicts"):
            ge.quantize(graph, bad)
