"""``--precision_mode``, ``--keep_dtype`` and ``--modify_mixlist``.

GE's pages: ``--precision_mode`` https://www.hiascend.com/document/detail/zh/canncommercial/900/devaids/atctool/atlasatcparam_16_0068.html
(force_fp16: float16 where an op has both; allow_fp32_to_fp16: matrix ops float16, vector ops keep
float32; allow_mix_precision: black/gray/white lists; must_keep_origin_dtype; force_fp32;
the _bf16 variants), ``--keep_dtype`` .../atlasatcparam_16_0074.html (one node name or
OpType::TypeName per line keeps its precision), ``--modify_mixlist`` (JSON black-list/white-list/
gray-list with to-add/to-remove). GE's repository pages under docs/zh/user_guides/atc_tools/
CLI_options/ were not in the stored index. On this engine a reduced mode packs the matrix ops'
weights in bf16/fp16 and computes bf16 on the CPU's bf16 unit (tests/atc/test_precision_compute.py);
vector ops compute in float32 with float32 weights; see docs/atc.md.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_sdk.omdesc import inspect_om

from .conftest import conv_net, ort_run, save_model


def _weights_size(om: str) -> int:
    return next(p["size"] for p in inspect_om(om)["file"]["partitions"] if p["kind"] == "weights")


def _const_dtypes(om: str) -> dict[str, set[str]]:
    """For each node of the loaded model with a constant weight (input 1): the weight's dtype
    (uint16: bf16 bits packed for the kernel)."""
    g = ge.load_om(om).graph
    out: dict[str, set[str]] = {}
    for n in g.node_list():
        v = n.inputs[1] if len(n.inputs) > 1 else None
        if v is not None and v.const_value is not None and v.const_value.size >= 16:
            out.setdefault(n.name, set()).add(v.const_value.dtype.name)
    assert not any(n.op_type == "Cast" for n in g.node_list())  # no cast of a weight at each run
    return out


@pytest.fixture
def net(tmp_path):
    return conv_net(tmp_path / "net.onnx")


def _x(seed=1):
    return np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)


def test_force_fp16_halves_the_weights_and_stays_within_1e_2_of_float32(tmp_path, net, atc):
    rc, _, err = atc(f"--model={net}", "--framework=5", f"--output={tmp_path / 'f32'}")
    assert rc == 0, err
    rc, _, err = atc(f"--model={net}", "--framework=5", f"--output={tmp_path / 'f16'}",
                     "--precision_mode=force_fp16", f"--report={tmp_path / 'r.json'}")
    assert rc == 0, err
    w32, w16 = _weights_size(str(tmp_path / "f32.om")), _weights_size(str(tmp_path / "f16.om"))
    assert w16 <= 0.51 * w32, (w16, w32)
    x = _x()
    ref = ort_run(net, {"x": x})[0]
    out = ge.load_om(str(tmp_path / "f16.om")).run({"x": x})["y"]
    err16 = float(np.abs(out - ref).max())
    assert err16 <= 1e-2 and err16 > 0  # float16 weights: close, and not the float32 result itself
    table = json.loads((tmp_path / "r.json").read_text())["precision"]
    acc = table["accuracy"]  # measured by atc itself, on its own random inputs
    assert acc["against"] == "onnxruntime, float32" and 0 < acc["outputs"]["y"]["max_abs_error"] <= 1e-2
    assert "largest error" in err
    assert table["mode"] == "force_fp16" and table["weights_dtype"] == "float16"
    assert table["compute_float16_ops"] == [] and table["nodes"]
    assert all(n["weights"] == "float16" and n["compute"] == "float32" for n in table["nodes"].values())
    assert set().union(*_const_dtypes(str(tmp_path / "f16.om")).values()) == {"float16"}


def test_keep_dtype_keeps_the_named_node_in_float32(tmp_path, net, atc):
    keep = tmp_path / "keep.cfg"
    keep.write_text("# keep the second conv\nconv2\n")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'k'}", "--precision_mode=force_fp16", f"--keep_dtype={keep}")
    assert rc == 0, err
    dtypes = _const_dtypes(str(tmp_path / "k.om"))
    conv2 = next(k for k in dtypes if "conv2" in k)
    conv1 = next(k for k in dtypes if "conv1" in k)
    assert dtypes[conv2] == {"float32"} and dtypes[conv1] == {"float16"}
    keep.write_text("OpType::Conv\n")  # by type: both convs keep float32, nothing shrinks
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 't'}", "--precision_mode=force_fp16", f"--keep_dtype={keep}")
    assert rc == 0, err
    assert set().union(*_const_dtypes(str(tmp_path / "t.om")).values()) == {"float32"}
    x = _x(2)
    np.testing.assert_allclose(ge.load_om(str(tmp_path / "t.om")).run({"x": x})["y"], ort_run(net, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)


def _matmul_add_net(path) -> str:
    """MatMul (matrix op) then Add of a 16x16 constant (vector op)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "bias_map")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["c"], name="mm"),
             helper.make_node("Add", ["c", "bias_map"], ["y"], name="add")]
    return save_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_allow_fp32_to_fp16_reduces_matrix_ops_only_and_mixlist_moves_ops(tmp_path, atc):
    model = _matmul_add_net(tmp_path / "ca.onnx")
    rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'a'}", "--precision_mode=allow_fp32_to_fp16",
                     "--oo_level=O0")
    assert rc == 0, err
    d = _const_dtypes(str(tmp_path / "a.om"))
    assert d == {"mm": {"float16"}, "add": {"float32"}}  # matrix ops only
    # allow_mix_precision: MatMul is on the white list (Add, gray, follows it but computes float32
    # here, its constant float32); a mixlist moving MatMul to the black list keeps it float32
    rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'm'}", "--precision_mode=allow_mix_precision",
                     "--oo_level=O0")
    assert rc == 0, err
    assert _const_dtypes(str(tmp_path / "m.om")) == {"mm": {"float16"}, "add": {"float32"}}
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"black-list": {"to-add": ["MatMulV2"]}}))  # GE's name of MatMul
    rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'b'}", "--precision_mode=allow_mix_precision",
                     f"--modify_mixlist={mix}", "--oo_level=O0")
    assert rc == 0, err
    assert set().union(*_const_dtypes(str(tmp_path / "b.om")).values()) == {"float32"}


def test_bf16_variant_stores_bfloat16(tmp_path, net, atc):
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'b'}", "--precision_mode=allow_fp32_to_bf16")
    assert rc == 0, err
    # both convs' weights are bf16 bits (the 3-channel stem's packed for its NCHW input)
    assert sorted(map(sorted, _const_dtypes(str(tmp_path / "b.om")).values())) == [["uint16"], ["uint16"]]
    x = _x(4)
    ref = ort_run(net, {"x": x})[0]
    out = ge.load_om(str(tmp_path / "b.om")).run({"x": x})["y"]
    assert float(np.abs(out - ref).max()) <= 5e-2 * max(1.0, float(np.abs(ref).max()))
    assert ml_dtypes.bfloat16 is not None


def test_force_fp32_computes_float16_matmul_in_float32(tmp_path, atc):
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float16), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = save_model(tmp_path / "h.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [8, 64])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], [w])
    rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'h'}", "--precision_mode=force_fp32",
                     f"--report={tmp_path / 'r.json'}")
    assert rc == 0, err
    table = json.loads((tmp_path / "r.json").read_text())["precision"]
    assert table["nodes"]["mm"]["compute"] == "float32"
    m = ge.load_om(str(tmp_path / "h.om"))
    assert any(n.op_type == "MatMul" and n.outputs[0].type.dtype == np.float32 for n in m.graph.node_list())
    x = rng.standard_normal((8, 64)).astype(np.float16)
    out = m.run({"x": x})["y"]
    assert out.dtype == np.float16
    exact = (x.astype(np.float32) @ np.asarray(numpy_helper.to_array(w), np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out, exact)  # float32 accumulation, rounded once at the end


def test_bad_precision_flags_are_clean_errors(tmp_path, net, atc):
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'x'}", "--precision_mode=force_fp61")
    assert rc == 2 and "force_fp16" in err and "precision_mode" in err
    bad = tmp_path / "keep.cfg"
    bad.write_text("OpType::\n")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'x'}", "--precision_mode=force_fp16", f"--keep_dtype={bad}")
    assert rc == 2 and "line 1" in err and str(bad) in err
    mix = tmp_path / "mix.json"
    mix.write_text('{"grey-list": {}}')
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'x'}", "--precision_mode=allow_mix_precision",
                     f"--modify_mixlist={mix}")
    assert rc == 2 and "gray-list" in err
    assert not (tmp_path / "x.om").exists()
