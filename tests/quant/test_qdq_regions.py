"""Quantised ONNX models (onnxruntime's quantiser: static QDQ, dynamic) read into int8 regions
(ge_quant's qdq_regions pass) and run on the int8 kernels (ge_cpu's int8_kernels pass): outputs
against onnxruntime's int8 run on the same inputs, the int8 report, the float32 fallback, the .om
round trip."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ge_core as ge
from ge_sdk import quant

from . import models


def _ort(path: str, feed: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _ge(model, feed: dict) -> np.ndarray:
    got = model.run(feed)
    return np.asarray(list(got.values())[0] if isinstance(got, dict) else got[0])


def _ops(model) -> dict:
    return model.report["op_counts"]


@pytest.fixture(scope="module")
def qdq_cnn(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("qdq"))
    f32 = models.residual_cnn()
    paths = {(act, pc): models.quantized(f32, tmp, "qdq", activation=act, per_channel=pc)
             for act in ("uint8", "int8") for pc in (True, False)}
    paths.update({("qoperator", act, pc): models.quantized(f32, tmp, "qoperator", activation=act, per_channel=pc)
                  for act in ("uint8", "int8") for pc in (True, False)})
    return f32, paths


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
@pytest.mark.parametrize("act", ["uint8", "int8"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_static_cnn_runs_in_int8_and_matches_onnxruntime(qdq_cnn, fmt, act, per_channel):
    """onnxruntime's static quantisation, QDQ and QOperator (QLinearConv, its contrib QLinearAdd,
    QLinearGlobalAveragePool, QGemm), uint8 and int8 activations, per channel and per tensor."""
    f32, paths = qdq_cnn
    path = paths[(act, per_channel) if fmt == "qdq" else (fmt, act, per_channel)]
    model = ge.compile(ge.load(path))
    report = model.report["int8"]
    # every quantised conv and the classifier found their int8 entry; no Q/DQ node is left
    assert report["ops"] == 5 and not report["not_reached"] and report["boundaries"] == []
    assert not any(k.endswith(("QuantizeLinear", "DequantizeLinear")) or k.startswith(("QLinear", "com.microsoft"))
                   for k in _ops(model))
    from ge_native import int8

    if int8.isa() in ("amx_int8", "avx512_vnni", "avx2"):
        assert report["ops_int8"] == 5 and report["macs_int8_share"] == 1.0, report["float32"]
        assert _ops(model).get("ge.cpu::NchwcConv", 0) == 4
    for i, feed in enumerate(models.feeds(f32, seed=11, count=3)):
        want, got = _ort(path, feed), _ge(model, feed)
        ref = _ort_f32(f32, feed)
        scale = float(np.ptp(ref))
        # the same integers as onnxruntime's int8 run up to the rounding of the requantisation
        # (onnxruntime adds the int32 bias before scaling): a few output steps at most
        assert np.abs(got - want).max() <= 0.05 * scale, (i, np.abs(got - want).max(), scale)
        # and as close to the float model as onnxruntime's own int8 run is
        assert np.abs(got - ref).max() <= 1.25 * np.abs(want - ref).max() + 1e-6 * scale


def _ort_f32(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_the_int8_build_equals_the_float32_arithmetic_on_the_grid(qdq_cnn, monkeypatch):
    """Without an integer unit the same model runs float32 on the grid values, each node saying
    why: int8 and float32 builds agree to the float sums' rounding."""
    f32, paths = qdq_cnn
    path = paths[("uint8", True)]
    feed = models.feeds(f32, seed=3)[0]
    fast = _ge(ge.compile(ge.load(path)), feed)
    import ge_cpu.int8 as cpu_int8

    monkeypatch.setattr(cpu_int8, "int8_unit", lambda: None)
    model = ge.compile(ge.load(path))
    report = model.report["int8"]
    assert report["ops_int8"] == 0 and report["macs_int8_share"] == 0.0
    assert all("no integer matrix unit" in why for why in report["float32"].values())
    slow = _ge(model, feed)
    assert np.abs(fast - slow).max() <= 0.02 * float(np.ptp(slow))


def test_an_int8_model_survives_the_om_round_trip(qdq_cnn, tmp_path):
    f32, paths = qdq_cnn
    model = ge.compile(ge.load(paths[("uint8", True)]))
    feed = models.feeds(f32, seed=5)[0]
    om = str(tmp_path / "int8.om")
    model.save(om)
    back = ge.load_om(om)
    assert np.array_equal(_ge(back, feed), _ge(model, feed))


@pytest.mark.parametrize("per_channel", [True, False])
def test_dynamic_quantisation_runs_as_one_int8_matmul(tmp_path, per_channel):
    f32 = models.mlp()
    path = models.quantized(f32, str(tmp_path), "dynamic", per_channel=per_channel)
    model = ge.compile(ge.load(path))
    ops = _ops(model)
    assert not any(k in ops for k in ("DynamicQuantizeLinear", "MatMulInteger", "Cast"))
    report = model.report["int8"]
    assert report["ops"] == 2 and report["boundaries"] == []
    from ge_native import int8

    if int8.isa() in ("amx_int8", "avx512_vnni", "avx2"):
        assert report["ops_int8"] == 2 and ops.get("ge.cpu::PackedMatMul") == 2
    for feed in models.feeds(f32, seed=21, count=2):
        want, got = _ort(path, feed), _ge(model, feed)
        # the same dynamic scale, the same integers, the same float32 scaling: equal up to the
        # order onnxruntime adds the bias in (its own Add node after the scaling: the same here)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_the_pass_records_each_entry_in_the_int8_table(qdq_cnn):
    f32, paths = qdq_cnn
    g = ge.load(paths[("uint8", True)])
    model = ge.compile(g)
    table = model.graph.metadata[quant.TABLE]
    assert len(table) == 5
    for e in table.values():
        assert e["x"]["dtype"] == "uint8" and e["x"]["scale"] > 0 and 0 <= e["x"]["zero_point"] <= 255
        assert all(s > 0 for s in e["w"]["scale"])


def test_a_weight_a_pass_changed_stays_float32():
    w = np.array([[0.5, -1.0], [0.25, 0.75]], np.float32)
    s = np.array([0.25, 0.25], np.float32)
    assert np.array_equal(quant.recover(w, s, 1), np.array([[2, -4], [1, 3]], np.int8))
    assert quant.recover(w * np.float32(1.1), s, 1) is None  # (a folded scale: no longer on the grid)
    assert quant.recover(w * 1000, s, 1) is None  # (outside int8)
    assert quant.recover(w + 1e-6, s, 1) is None and quant.recover(w + 1e-6, s, 1, tol=1e-2) is not None


@pytest.mark.parametrize("shape", [[], [1], [3, 5]])
def test_a_quantize_dequantize_pair_is_one_fake_quant_of_the_same_values(shape):
    """Q -> DQ with a per-tensor scale and zero point: one FakeQuant whose values are onnx.reference's
    (a 0-d value too)."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx.reference import ReferenceEvaluator

    g = h.make_graph(
        [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
        "fq", [h.make_tensor_value_info("x", T.FLOAT, shape)], [h.make_tensor_value_info("y", T.FLOAT, shape)],
        [h.make_tensor("s", T.FLOAT, [], [0.07]), h.make_tensor("z", T.INT8, [], [-3])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    model = ge.compile(ge.load(m.SerializeToString()))
    assert "ge.quant::FakeQuant" in _ops(model) and "QuantizeLinear" not in _ops(model)
    x = (np.random.default_rng(0).standard_normal(shape) * 10).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = _ge(model, {"x": x})
    assert got.shape == tuple(shape) and np.array_equal(got, want)


def test_this_engines_quantiser_output_runs_in_int8():
    """ge.quantize's QDQ graph (BN folded, the convs renamed back, fused with their Relu by the
    automatic fusion) finds every int8 entry through the fused and blocked forms."""
    f32 = models.residual_cnn()
    q = ge.quantize(ge.load(f32.SerializeToString()), models.feeds(f32, 1, 8))
    model = ge.compile(q)
    report = model.report["int8"]
    assert report["ops"] == 5 and report["not_reached"] == []
    from ge_native import int8

    if int8.isa() in ("amx_int8", "avx512_vnni", "avx2"):
        assert report["ops_int8"] == 5 and report["macs_int8_share"] == 1.0
    feed = models.feeds(f32, seed=9)[0]
    ref = _ort_f32(f32, feed)
    assert np.abs(_ge(model, feed) - ref).max() <= 0.1 * float(np.ptp(ref))


@pytest.mark.parametrize("jit", ["1", "0"])
def test_a_fake_quant_fuses_into_an_elementwise_loop_with_the_same_bits(jit, monkeypatch):
    """Add -> Q -> DQ -> Mul -> Round: one generated loop (and its NumPy form with the loops off)
    whose values are onnx.reference's bit for bit (the division, rint half to even, the clip)."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx.reference import ReferenceEvaluator

    monkeypatch.setenv("GE_FUSION_JIT", jit)
    shape = [2, 3, 33, 17]
    g = h.make_graph(
        [h.make_node("Add", ["x", "one"], ["a"]), h.make_node("QuantizeLinear", ["a", "s", "z"], ["q"]),
         h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), h.make_node("Mul", ["d", "three"], ["m"]),
         h.make_node("Round", ["m"], ["y"])],
        "fq_loop", [h.make_tensor_value_info("x", T.FLOAT, shape)], [h.make_tensor_value_info("y", T.FLOAT, shape)],
        [h.make_tensor("s", T.FLOAT, [], [0.05]), h.make_tensor("z", T.UINT8, [], [17]),
         h.make_tensor("one", T.FLOAT, [], [1.0]), h.make_tensor("three", T.FLOAT, [], [3.3])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    model = ge.compile(ge.load(m.SerializeToString()))
    assert _ops(model) == {"ge.fused::FusedElemwise": 1}
    x = (np.random.default_rng(1).standard_normal(shape) * 8).astype(np.float32)
    x.reshape(-1)[:6] = np.array([0.025, 0.075, -0.025, -1.0, 100.0, -100.0], np.float32) - 1  # ties, saturation
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert np.array_equal(_ge(model, {"x": x}), want)


def test_a_depthwise_block_runs_in_int8_and_matches_onnxruntime(tmp_path):
    """MobileNetV2's inverted residual: the 1x1 convolutions on the int8 GEMM, the depthwise one
    on the int8 depthwise kernel (ge_native.int8dw); the .om keeps it (the same bits back)."""
    f32 = models.inverted_residual()
    path = models.quantized(f32, str(tmp_path), "qdq")
    model = ge.compile(ge.load(path))
    report = model.report["int8"]
    assert report["ops"] == 4 and not report["not_reached"]
    from ge_native import int8, int8dw

    if int8.isa() in ("amx_int8", "avx512_vnni", "avx2") and int8dw.isa() in ("avx512_vnni", "avx2"):
        assert report["ops_int8"] == 4, report["float32"]
        assert sum(v["kernel"].startswith("nchwc_int8dw_") for v in report["nodes"].values()) == 1
    om = str(tmp_path / "dw.om")
    model.save(om)
    back = ge.load_om(om)
    feed0 = models.feeds(f32, seed=2)[0]
    assert np.array_equal(_ge(back, feed0), _ge(model, feed0))
    for feed in models.feeds(f32, seed=4, count=2):
        want, got, ref = _ort(path, feed), _ge(model, feed), _ort_f32(f32, feed)
        scale = float(np.ptp(ref))
        assert np.abs(got - want).max() <= 0.05 * scale
        assert np.abs(got - ref).max() <= 1.25 * np.abs(want - ref).max() + 1e-6 * scale


@pytest.mark.parametrize("attr, value", [("w_scale", [1.0]), ("x_scale", -1.0), ("x_zero_point", 999),
                                         ("out_scale", float("nan")), ("x_dtype", "int4")])
def test_a_damaged_int8_attribute_in_an_om_is_refused_at_load(qdq_cnn, tmp_path, attr, value):
    """What a loader reads back is checked as if from a stranger: a bad quantisation attribute
    of an int8 convolution is a GEError naming the node, never a crash or a silent wrong run."""
    f32, paths = qdq_cnn
    model = ge.compile(ge.load(paths[("uint8", True)]))
    conv = next(n for n in model.graph.node_list()
                if n.op_type == "NchwcConv" and n.attrs.get("weight_packing") == "int8" and "out_scale" in n.attrs)
    conv.attrs[attr] = value
    om = str(tmp_path / "bad.om")
    model.save(om)
    with pytest.raises(ge.GEError, match=re.escape(conv.name)):
        ge.load_om(om).run(models.feeds(f32, seed=1)[0])


@pytest.mark.parametrize("per_channel", [True, False])
def test_a_static_qdq_mlp_runs_in_int8_whatever_its_nodes_were_renamed_to(tmp_path, per_channel):
    """MatMul + bias (+ Relu) fused into FusedMatMul nodes whose names collide with other sources'
    ('matmul' -> 'matmul_1'): each finds its own entry through ge.fused_from, not another's by name."""
    f32 = models.mlp()
    path = models.quantized(f32, str(tmp_path), "qdq", per_channel=per_channel)
    model = ge.compile(ge.load(path))
    report = model.report["int8"]
    assert report["ops"] == 2 and not report["not_reached"] and not report["float32"], report["float32"]
    for feed in models.feeds(f32, seed=8, count=2):
        want, got, ref = _ort(path, feed), _ge(model, feed), _ort_f32(f32, feed)
        assert np.abs(got - want).max() <= 0.05 * float(np.ptp(ref))


def test_dynamic_convolutions_run_as_int8_convolutions(tmp_path):
    """quantize_dynamic of a CNN: DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul (+ the bias
    Add) becomes a Conv whose input the int8 kernel quantises per run, as DynamicQuantizeLinear."""
    f32 = models.residual_cnn()
    path = models.quantized(f32, str(tmp_path), "dynamic")
    model = ge.compile(ge.load(path))
    assert not any(k in _ops(model) for k in ("ConvInteger", "DynamicQuantizeLinear", "MatMulInteger"))
    report = model.report["int8"]
    assert report["ops"] == 5 and not report["not_reached"]
    from ge_native import int8

    if int8.isa() in ("amx_int8", "avx512_vnni", "avx2"):
        assert not report["float32"] and all(v["kernel"] for v in report["nodes"].values())
    for feed in models.feeds(f32, seed=13, count=2):
        want, got = _ort(path, feed), _ge(model, feed)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_values_between_int8_convolutions_are_stored_as_uint8_with_the_same_bits(qdq_cnn, monkeypatch):
    """A value only int8 convolutions read, written fake-quantised: uint8 integers (a quarter of
    the bytes); the model's outputs are the float32-grid build's, bit for bit."""
    from ge_native import int8

    f32, paths = qdq_cnn
    path = paths[("uint8", True)]
    model = ge.compile(ge.load(path))
    stored = [v for v in model.graph.values() if v.type is not None and v.type.dtype == np.uint8]
    # (without an integer unit nothing runs in int8, so nothing is stored as uint8)
    assert bool(stored) == (int8.isa() in ("amx_int8", "avx512_vnni", "avx2"))
    assert all(v.producer.attrs.get("out_dtype") == "uint8" for v in stored)
    monkeypatch.setattr(int8, "UINT8_IO", False)
    grid = ge.compile(ge.load(path))
    assert not any(v.type is not None and v.type.dtype == np.uint8 for v in grid.graph.values())
    for feed in models.feeds(f32, seed=17, count=2):
        assert np.array_equal(_ge(model, feed), _ge(grid, feed))


def test_a_residual_block_end_runs_in_the_convolutions_store_with_the_same_bits(qdq_cnn, monkeypatch):
    """conv3 -> FQ -> Add(shortcut) [-> Relu: onnxruntime drops it before a zero point of 0] -> FQ
    (a quantised ResNet block's end): the Add and both fake-quants at the int8 convolution's store
    (mid_*, the addend, out_*),
    no elementwise pass of its own; the outputs bit-identical to the build that keeps the pass."""
    from ge_native import int8

    f32, paths = qdq_cnn
    path = paths[("uint8", True)]
    model = ge.compile(ge.load(path))
    ends = [n for n in model.graph.node_list() if n.op_type == "NchwcConv" and "mid_scale" in n.attrs]
    assert len(ends) == (1 if int8.isa() in ("amx_int8", "avx512_vnni", "avx2") else 0)
    if ends:
        assert len(ends[0].inputs) == 4 and ends[0].attrs.get("out_scale") is not None  # (the shortcut, FQ2)
        assert "ge.fused::FusedElemwise" not in _ops(model)
    monkeypatch.setattr(int8, "MID_QUANT", False)
    kept = ge.compile(ge.load(path))
    assert not any("mid_scale" in n.attrs for n in kept.graph.node_list())
    for feed in models.feeds(f32, seed=23, count=2):
        assert np.array_equal(_ge(model, feed), _ge(kept, feed))


def test_transposes_cancel_across_a_fake_quant():
    """NHWC -> NCHW -> Q -> DQ -> NHWC (a channels-last model's quantised layer boundary): the
    fake-quant is elementwise, so the transpose sinking moves the pair through it and they cancel."""
    from onnx import TensorProto as T
    from onnx import helper as h

    shape = [1, 5, 6, 8]
    g = h.make_graph(
        [h.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]), h.make_node("QuantizeLinear", ["t", "s", "z"], ["q"]),
         h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), h.make_node("Transpose", ["d"], ["u"], perm=[0, 2, 3, 1]),
         h.make_node("Relu", ["u"], ["y"])],
        "tq", [h.make_tensor_value_info("x", T.FLOAT, shape)], [h.make_tensor_value_info("y", T.FLOAT, shape)],
        [h.make_tensor("s", T.FLOAT, [], [0.1]), h.make_tensor("z", T.UINT8, [], [128])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    model = ge.compile(ge.load(m.SerializeToString()))
    assert "Transpose" not in _ops(model)
    from onnx.reference import ReferenceEvaluator

    x = (np.random.default_rng(2).standard_normal(shape) * 5).astype(np.float32)
    assert np.array_equal(_ge(model, {"x": x}), ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_a_zero_pad_before_a_fake_quant_folds_into_the_convolution():
    """Pad (zeros) -> Q -> DQ -> Conv (a quantiser's output for a model that pads explicitly): the
    padding becomes the convolution's own across the fake-quant (it maps 0 to 0); the values are
    onnx.reference's up to the float32 sums' order."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(4)
    w = nh.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w")
    g = h.make_graph(
        [h.make_node("Pad", ["x", "pads"], ["p"]), h.make_node("QuantizeLinear", ["p", "s", "z"], ["q"]),
         h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), h.make_node("Conv", ["d", "w"], ["y"])],
        "padfq", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 9, 9])], [h.make_tensor_value_info("y", T.FLOAT, None)],
        [w, h.make_tensor("pads", T.INT64, [8], [0, 0, 1, 2, 0, 0, 2, 1]), h.make_tensor("s", T.FLOAT, [], [0.05]),
         h.make_tensor("z", T.UINT8, [], [100])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    model = ge.compile(ge.load(m.SerializeToString()))
    assert "Pad" not in _ops(model)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(_ge(model, {"x": x}), want, rtol=1e-5, atol=1e-5)
