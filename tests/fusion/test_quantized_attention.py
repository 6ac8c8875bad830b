"""Attention of statically quantised transformers (QDQ): the fusion matches through the
fake-quants (ge.quant::FakeQuant) at the scores, scaled and masked scores, probabilities and
output, which become the Attention op's *_quant attributes, and the kernel rounds exactly there."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from ge_core.errors import GEError
from ge_fusion.ops import check_node
from ge_sdk.fused import ATTENTION_QUANTS
from tests.fusion.common import compile_onnx

S, HID, HEADS = 16, 64, 4
D = HID // HEADS


def _layer(rng, nodes, inits, x: str, i: int, div: bool) -> str:
    """One BERT encoder layer on (1, S, HID) ``x``: self-attention with the additive mask input,
    output projection, residual and LayerNorm, a ReLU feed-forward, residual and LayerNorm."""
    def w(name, shape, scale=0.15):
        inits.append(nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), f"{name}{i}"))
        return f"{name}{i}"

    def norm(y: str, name: str) -> str:
        inits.append(nh.from_array(np.ones(HID, np.float32), f"{name}_g{i}"))
        return n("LayerNormalization", [y, f"{name}_g{i}", w(name + "_b", (HID,), 0.05)], axis=-1)

    def n(op, ins, **attrs):
        out = f"{op.lower()}{len(nodes)}_{i}"
        nodes.append(h.make_node(op, ins, [out], **attrs))
        return out

    heads = {}
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        y = n("Add", [n("MatMul", [x, w("w" + t, (HID, HID))]), w("b" + t, (HID,), 0.05)])
        heads[t] = n("Transpose", [n("Reshape", [y, "split_shape"])], perm=perm)
    s = n("MatMul", [heads["q"], heads["k"]])
    s = n("Div", [s, "four"]) if div else n("Mul", [s, "quarter"])  # 1 / sqrt(D)
    p = n("Softmax", [n("Add", [s, "mask"])], axis=-1)
    o = n("Reshape", [n("Transpose", [n("MatMul", [p, heads["v"]])], perm=[0, 2, 1, 3]), "merge_shape"])
    o = n("Add", [n("Add", [n("MatMul", [o, w("wo", (HID, HID))]), w("bo", (HID,), 0.05)]), x])
    a = norm(o, "ln1")
    f = n("Relu", [n("Add", [n("MatMul", [a, w("wf1", (HID, 2 * HID))]), w("bf1", (2 * HID,), 0.05)])])
    f = n("Add", [n("Add", [n("MatMul", [f, w("wf2", (2 * HID, HID), 0.1)]), w("bf2", (HID,), 0.05)]), a])
    return norm(f, "ln2")


def encoder(layers: int = 2) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [nh.from_array(np.array([1, S, HEADS, D], np.int64), "split_shape"),
             nh.from_array(np.array([1, S, HID], np.int64), "merge_shape"),
             nh.from_array(np.array(4.0, np.float32), "four"), nh.from_array(np.array(0.25, np.float32), "quarter")]
    nodes: list = []
    x = "x"
    for i in range(layers):
        x = _layer(rng, nodes, inits, x, i, div=i % 2 == 0)
    nodes.append(h.make_node("Identity", [x], ["y"]))
    g = h.make_graph(nodes, "qbert", [h.make_tensor_value_info("x", T.FLOAT, [1, S, HID]),
                                      h.make_tensor_value_info("mask", T.FLOAT, [1, 1, 1, S])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, S, HID])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.zeros((1, 1, 1, S), np.float32)
    mask[..., S - 1 - seed % 4:] = -20.0  # the padding of the batch: an additive mask
    return {"x": rng.standard_normal((1, S, HID)).astype(np.float32), "mask": mask}


@pytest.fixture(scope="module")
def qdq(tmp_path_factory):
    """The encoder quantised by onnxruntime: static QDQ, per-channel int8 weights, uint8 activations."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    tmp = tmp_path_factory.mktemp("qbert")
    model = encoder()
    src, dst = tmp / "f32.onnx", tmp / "qdq.onnx"
    onnx.save(model, str(src))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([_feeds(s) for s in range(8)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    return model, onnx.load(str(dst))


def _run(m, feeds):
    r = m.run(feeds)
    return np.asarray(r[0] if isinstance(r, (list, tuple)) else list(r.values())[0])


def _reference(model: onnx.ModelProto):
    """onnx.reference's evaluator of ``model`` (its QuantizeLinear/DequantizeLinear forms start at
    opset 19: the same ops there for these per-tensor and per-axis uses)."""
    from onnx.reference import ReferenceEvaluator

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for op in m.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, 19)
    return ReferenceEvaluator(m)


def _q_scale(model: onnx.ModelProto, producer_op: str) -> list[float]:
    """The scales of the QuantizeLinear nodes reading the outputs of ``producer_op`` nodes."""
    made = {o for n in model.graph.node if n.op_type == producer_op for o in n.output}
    inits = {i.name: nh.to_array(i) for i in model.graph.initializer}
    return [float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in made]


def test_quantised_encoder_runs_one_attention_per_layer_with_its_fake_quants(qdq, tmp_path):
    import onnxruntime as ort

    f32, q = qdq
    blob = q.SerializeToString()
    m1, m2 = compile_onnx(blob, threads=1), compile_onnx(blob, threads=2)
    unfused = compile_onnx(blob, tmp_path, off=("attention_fusion",))
    counts = m1.report["op_counts"]
    assert counts.get("ge.fused::Attention") == 2, counts
    assert "Transpose" not in counts and "ge.fused::Softmax" not in counts and "Softmax" not in counts, counts
    atts = [n for n in m1.graph.nodes if n.op_type == "Attention"]
    for att in atts:  # every point of the QDQ attention, each [scale, lo, hi] with lo/hi the uint8 range less zp
        assert set(ATTENTION_QUANTS) <= set(att.attrs), att.attrs
        for name in ATTENTION_QUANTS:
            s, lo, hi = att.attrs[name]
            assert s > 0 and lo <= 0 <= hi and hi - lo == 255
    assert sorted(float(np.float32(a.attrs["probs_quant"][0])) for a in atts) == \
        sorted(float(np.float32(s)) for s in _q_scale(q, "Softmax"))
    assert sorted(float(np.float32(a.attrs["scaled_quant"][0])) for a in atts) == \
        sorted(float(np.float32(s)) for s in _q_scale(q, "Div") + _q_scale(q, "Mul"))

    oq, of = ort.InferenceSession(blob), ort.InferenceSession(f32.SerializeToString())
    ref = _reference(q)
    for seed in (11, 12, 13):
        feeds = _feeds(seed)
        y, y2, yu = _run(m1, feeds), _run(m2, feeds), _run(unfused, feeds)
        want_q, want_f = oq.run(None, feeds)[0], of.run(None, feeds)[0]
        want_ref = ref.run(None, feeds)[0]
        span = float(want_f.max() - want_f.min())
        assert np.array_equal(y, y2)  # the same bits at 1 and 2 threads
        assert np.abs(y - yu).max() <= 0.01 * span  # the unfused graph's values (up to summation order)
        assert np.abs(y - want_ref).max() <= 0.05 * span
        assert np.abs(y - want_q).max() <= 0.05 * span
        assert np.abs(y - want_f).max() <= 1.25 * np.abs(want_q - want_f).max() + 1e-6


def _fq_nodes(nodes, inits, x: str, y: str, scale: float, zp: int) -> None:
    """QuantizeLinear → DequantizeLinear (uint8) from ``x`` to ``y``."""
    inits += [nh.from_array(np.array(scale, np.float32), y + "_s"), nh.from_array(np.array(zp, np.uint8), y + "_z")]
    nodes += [h.make_node("QuantizeLinear", [x, y + "_s", y + "_z"], [y + "_q"]),
              h.make_node("DequantizeLinear", [y + "_q", y + "_s", y + "_z"], [y])]


def hand_made_attention(probs: bool = True) -> onnx.ModelProto:
    """A QDQ attention over (1, 2, 24, 16) inputs, written by hand; its probabilities' fake-quant is
    uint8 with scale 1/255 (about 1/10 of a typical probability of 24 keys): leaving it out moves
    the output far beyond float noise. Q and K are on a 1/8 grid, so Q·Kᵀ is exact in any order."""
    nodes: list = []
    inits = [nh.from_array(np.array(0.25, np.float32), "scale"),
             nh.from_array(np.triu(np.full((24, 24), -30.0, np.float32), 1), "causal")]
    _fq_nodes(nodes, inits, "q", "qd", 0.125, 128)
    _fq_nodes(nodes, inits, "k", "kd", 0.125, 128)
    _fq_nodes(nodes, inits, "v", "vd", 0.02, 120)
    nodes += [h.make_node("Transpose", ["kd"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["qd", "kt"], ["s"])]
    _fq_nodes(nodes, inits, "s", "sd", 0.0625, 128)
    nodes.append(h.make_node("Mul", ["sd", "scale"], ["ss"]))
    _fq_nodes(nodes, inits, "ss", "ssd", 0.05, 120)
    nodes += [h.make_node("Add", ["ssd", "causal"], ["sm"]), h.make_node("Softmax", ["sm"], ["p"], axis=-1)]
    if probs:
        _fq_nodes(nodes, inits, "p", "pd", 1 / 255, 0)
    nodes.append(h.make_node("MatMul", ["pd" if probs else "p", "vd"], ["o"]))
    _fq_nodes(nodes, inits, "o", "y", 0.01, 128)
    shape = [1, 2, 24, 16]
    g = h.make_graph(nodes, "qattn", [h.make_tensor_value_info(n, T.FLOAT, shape) for n in "qkv"],
                     [h.make_tensor_value_info("y", T.FLOAT, shape)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_coarse_probability_rounding_is_applied_exactly_where_the_graph_has_it():
    model = hand_made_attention()
    m = compile_onnx(model.SerializeToString())
    atts = [n for n in m.graph.nodes if n.op_type == "Attention"]
    assert len(atts) == 1 and "Softmax" not in m.report["op_counts"], m.report["op_counts"]
    a = atts[0].attrs
    assert a["probs_quant"] == [np.float32(1 / 255), 0.0, 255.0]
    assert a["scores_quant"] == [0.0625, -128.0, 127.0] and a["scaled_quant"] == [np.float32(0.05), -120.0, 135.0]
    assert "masked_quant" not in a and a["out_quant"] == [np.float32(0.01), -128.0, 127.0]
    rng = np.random.default_rng(3)
    feeds = {n: (rng.standard_normal((1, 2, 24, 16)) * 0.6).astype(np.float32) for n in "qkv"}
    y = _run(m, feeds)
    want = _reference(model).run(None, feeds)[0]
    without = _reference(hand_made_attention(probs=False)).run(None, feeds)[0]
    noise = 1e-5 * float(np.abs(want).max())
    assert np.abs(y - want).max() <= noise
    assert np.abs(without - want).max() > 100 * noise  # the test sees a kernel that forgets the rounding


def test_attention_checks_its_fake_quant_attributes():
    m = compile_onnx(hand_made_attention().SerializeToString())
    att = next(n for n in m.graph.nodes if n.op_type == "Attention")
    check_node(att)
    for bad in ([0.0, 0.0, 255.0], [float("inf"), 0.0, 255.0], [0.1, 1.0, 255.0], [0.1, -5.0, -1.0], [0.1, 0.0],
                "x"):
        att.attrs["probs_quant"] = bad
        with pytest.raises(GEError, match="probs_quant"):
            check_node(att)
