"""Weight-only quantisation (``ge.quantize(graph, None, weights_only=4|8)``, ge_quant.weights_only):
on a tiny decoder-like graph (embedding Gather, MatMuls, an lm_head MatMul) the MatMulNBits nodes
and their blobs, scales and zero points equal onnxruntime's ``MatMulNBitsQuantizer`` output bit
for bit; the quantised graph runs as onnxruntime runs that model; the error report."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

import ge_core as ge
from ge_core.errors import OptionError

VOCAB, HID, FF = 50, 48, 100  # FF: K of the second MatMul, not a multiple of the block sizes


def _decoder() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    f = np.float32
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((VOCAB, HID)).astype(f), "emb"),
             onnx.numpy_helper.from_array((rng.standard_normal((HID, FF)) * 0.2).astype(f), "w_up"),
             onnx.numpy_helper.from_array((rng.standard_normal((FF, HID)) * 0.1).astype(f), "w_down"),
             onnx.numpy_helper.from_array((rng.standard_normal((HID, VOCAB)) * 0.3).astype(f), "w_lm")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["x"], name="embed"),
             helper.make_node("MatMul", ["x", "w_up"], ["h"], name="up"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "w_down"], ["d"], name="down"),
             helper.make_node("Add", ["x", "d"], ["res"], name="residual"),
             helper.make_node("MatMul", ["res", "w_lm"], ["logits"], name="lm_head")]
    g = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", VOCAB])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _ort_quantized(model, bits, bs, symmetric, exclude=()) -> onnx.ModelProto:
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=bs, is_symmetric=symmetric, nodes_to_exclude=list(exclude))
    q.process()
    return q.model.model


def _nbits_nodes(model: onnx.ModelProto):
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    return [(n, [inits.get(i) for i in n.input[1:]]) for n in model.graph.node if n.op_type == "MatMulNBits"]


def _ge_nbits_nodes(g):
    return [(n, [v.const_value if v is not None else None for v in n.inputs[1:]]) for n in g.node_list()
            if n.op_type == "MatMulNBits"]


def _run(compiled, ids) -> np.ndarray:
    got = compiled.run({"ids": ids})
    return np.asarray(got["logits"] if isinstance(got, dict) else got[0])


@pytest.mark.parametrize("bits, bs, symmetric, skip", [(4, 32, False, ()), (4, 16, True, ()),
                                                       (8, 64, False, ("lm_head",)), (4, 128, False, ())])
def test_matches_onnxruntimes_quantizer_and_runs(bits, bs, symmetric, skip, tmp_path):
    model = _decoder()
    path = str(tmp_path / "dec.onnx")
    onnx.save(model, path)
    report: dict = {}
    qg = ge.quantize(ge.load(path), None, weights_only=bits, block_size=bs, symmetric=symmetric, skip_layers=skip,
                     report=report)
    want = _ort_quantized(model, bits, bs, symmetric, skip)
    ours, theirs = _ge_nbits_nodes(qg), _nbits_nodes(want)
    assert len(ours) == len(theirs) == 3 - len(skip)
    for (n, arrs), (m, warrs) in zip(ours, theirs):
        attrs = {a.name: helper.get_attribute_value(a) for a in m.attribute}
        assert {k: n.attrs[k] for k in ("K", "N", "bits", "block_size")} == \
            {k: attrs[k] for k in ("K", "N", "bits", "block_size")}
        assert len(arrs) == len(warrs)
        for x, y in zip(arrs, warrs):  # blobs, scales, zero points: the same bits
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    assert [n.op_type for n in qg.node_list()].count("Gather") == 1  # the embedding stays float
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 5)).astype(np.int64)
    got = _run(ge.compile(qg), ids)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(want.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    # the report: every quantised layer's error, the bytes saved, what stayed float and why
    assert report["quantized"] == [r["name"] for r in report["layers"]] and qg.metadata["quantize_report"] == report
    assert "embed" in report["kept_float"] and all(s in report["kept_float"] for s in skip)
    for row, (_, arrs) in zip(report["layers"], ours):
        assert 0 < row["weight_rel_error"] < (0.15 if bits == 4 else 0.01)
        assert 0 < row["output_rel_error"] < (0.15 if bits == 4 else 0.01)
        assert row["bytes_after"] == sum(x.nbytes for x in arrs) and row["bytes_before"] == row["K"] * row["N"] * 4
    float_out = _run(ge.compile(ge.load(path)), ids)
    assert np.abs(got - float_out).max() <= (0.2 if bits == 4 else 0.02) * np.abs(float_out).max()


def test_bad_options_raise(tmp_path):
    path = str(tmp_path / "dec.onnx")
    onnx.save(_decoder(), path)
    g = ge.load(path)
    with pytest.raises(OptionError, match="weights_only"):
        ge.quantize(g, None, weights_only=3)
    with pytest.raises(OptionError, match="block_size"):
        ge.quantize(g, None, weights_only=4, block_size=24)
