"""ge export: a compiled .om as ONNX. Without fused ops it round-trips through onnxruntime with
outputs identical to the source model's; with fused ops onnx.checker accepts it, the fused
nodes are in domain ge.fused with their semantics in doc_string (onnxruntime cannot run them)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.cli import main
from tests.tools.models import resnet_like


def _shape_chain(path):
    """Conv -> Relu -> a Reshape whose target shape is computed (Shape/Gather/Concat, folded by
    the compiler) -> MatMul: the compiled graph differs from the source, its numerics do not."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32), "fc"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0, name="gather"),
             helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0, name="concat"),
             helper.make_node("Reshape", ["r", "target"], ["flat"], name="reshape"),
             helper.make_node("MatMul", ["flat", "fc"], ["y"], name="fc")]
    g = helper.make_graph(nodes, "shape_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _ort(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def test_export_round_trips_through_onnxruntime(tmp_path, capsys):
    src = _shape_chain(str(tmp_path / "m.onnx"))
    model = ge.compile(src, disabled_passes=["pattern_fusion", "auto_fusion"])
    assert not any(n.domain for n in model.graph.nodes)
    assert "Shape" not in model.report["op_counts"]  # the compiler did change the graph
    om = model.save(str(tmp_path / "m.om"))
    out = tmp_path / "m_compiled.onnx"
    assert main(["export", om, "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    exported = onnx.load(str(out))
    onnx.checker.check_model(exported, full_check=True)
    assert len(exported.graph.node) == len(model.graph) < 7
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    (a,) = _ort(str(out), {"x": x})
    (b,) = _ort(src, {"x": x})
    np.testing.assert_array_equal(a, b)  # identical: same ops on the same weights
    np.testing.assert_allclose(model.run(x)["y"], b, rtol=1e-5, atol=1e-5)


def test_fused_ops_export_in_their_domain_and_pass_the_checker(tmp_path):
    src = resnet_like(str(tmp_path / "r.onnx"))
    om = ge.compile(src, disabled_passes=["nchwc_layout"]).save(str(tmp_path / "r.om"))  # (FusedConv stays)
    out = tmp_path / "r_compiled.onnx"
    assert main(["export", om, "-o", str(out), "-q", "--keep-compiled-ops"]) == 0
    m = onnx.load(str(out))
    onnx.checker.check_model(m)
    fused = [n for n in m.graph.node if n.domain == "ge.fused"]
    assert fused and {o.domain: o.version for o in m.opset_import}.get("ge.fused") == 1
    assert all(n.doc_string.startswith(f"ge.fused::{n.op_type}: ") for n in fused)
    props = {p.key: p.value for p in m.metadata_props}
    assert "ge.fused::FusedConv" in props["ge.fused_ops"]
    with pytest.raises(Exception, match="ge.fused"):  # onnxruntime has no kernels for the custom domain
        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_export_usage_errors(tmp_path, capsys):
    src = _shape_chain(str(tmp_path / "m.onnx"))
    assert main(["export", src, "-o", str(tmp_path / "x.onnx")]) == 2
    assert "not a compiled .om" in capsys.readouterr().err
    om = ge.compile(src).save(str(tmp_path / "m.om"))
    assert main(["export", om, "-o", str(tmp_path / "no" / "x.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err
