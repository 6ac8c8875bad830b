"""ge export writes standard ONNX that onnxruntime runs with the .om's outputs (issue #47): the
cpu backend's blocked-layout ops and PackedMatMul, the fused ops and a quantised model's
fake-quants are lowered back to standard ops, every domain written is declared; an op with no
standard form (an int8 kernel) is refused by name and no file is written; --keep-compiled-ops
keeps the compiler's ops under their declared domains."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ge_core as ge
from ge_core.cli import main
from ge_core.errors import GEError
from tests.conftest import light_model_path
from tests.quant import models as qm
from tests.tools.models import bert_like, resnet_like


def _squeezenet(tmp):
    return light_model_path("squeezenet"), {"data_0": np.random.default_rng(0).standard_normal((1, 3, 224, 224))}


def _resnet24(tmp):  # 24 channels: blocks padded to 32 lanes, residual addends, the global pool
    return resnet_like(os.path.join(tmp, "r.onnx"), width=24), {"pixels": np.random.default_rng(1).standard_normal((2, 3, 32, 32))}


def _saved(model, tmp, name):
    path = os.path.join(tmp, name + ".onnx")
    onnx.save(model, path)
    return path


def _inverted_residual(tmp):  # depthwise, ReLU6 clips, a plain (NCHW) stem
    m = qm.inverted_residual()
    return _saved(m, tmp, "ir"), qm.feeds(m, 2)[0]


def _residual_cnn(tmp):  # strided stem, max pool, 1x1 residual, global pool, Gemm
    m = qm.residual_cnn()
    return _saved(m, tmp, "rc"), qm.feeds(m, 3)[0]


def _opset9_padded(tmp):  # 24 channels in opset 9: Pad and Slice in their attribute forms
    m = qm.residual_cnn(width=24)
    m.opset_import[0].version, m.ir_version = 9, 7
    return _saved(m, tmp, "rc9"), qm.feeds(m, 7)[0]


def _mlp(tmp):  # FusedMatMul with bias + Relu epilogues
    m = qm.mlp()
    return _saved(m, tmp, "mlp"), qm.feeds(m, 4)[0]


def _bert(tmp):  # Attention, LayerNorm, the Gelu epilogue, FusedMatMul
    return bert_like(os.path.join(tmp, "b.onnx"), hidden=64, layers=1), \
        {"input_ids": np.random.default_rng(5).integers(0, 1000, (2, 16))}


def _export_and_compare(model, feeds, rtol=1e-4, atol=1e-5):
    from ge_tools.export import export_om

    proto = export_om(model)
    onnx.checker.check_model(proto, full_check=True)
    declared = {o.domain for o in proto.opset_import}
    assert {n.domain for n in proto.graph.node} <= declared | {""}
    assert not any(n.domain.startswith("ge.") for n in proto.graph.node)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    want = model.run(feeds)
    assert len(got) == len(want)
    for g, (name, w) in zip(got, want.items()):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max())), err_msg=name)
    return proto


@pytest.mark.parametrize("build", [_squeezenet, _resnet24, _inverted_residual, _residual_cnn, _opset9_padded,
                                   _mlp, _bert],
                         ids=lambda f: f.__name__.strip("_"))
def test_the_export_runs_in_onnxruntime_with_the_om_outputs(tmp_path, build):
    src, feeds = build(str(tmp_path))
    model = ge.compile(src)
    feeds = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
    kept = {n.domain for n in model.graph.walk() if n.domain.startswith("ge.")}
    assert kept, model.report["op_counts"]  # the compiled graph does hold the compiler's ops
    proto = _export_and_compare(model, feeds)
    props = {p.key: p.value for p in proto.metadata_props}
    assert all(d in props["ge.lowered_ops"] for d in kept)


def test_a_quantised_models_fake_quants_lower(tmp_path):
    m = qm.residual_cnn()
    q = qm.quantized(m, str(tmp_path), "qdq")
    model = ge.compile(q, disabled_passes=["int8_kernels"])  # float kernels between the fake-quants
    assert any(n.domain == "ge.quant" for n in model.graph.walk())
    _export_and_compare(model, qm.feeds(m, 6)[0], rtol=1e-3, atol=1e-3)


def test_bf16_packed_weights_lower_to_their_values(tmp_path):
    src, feeds = _mlp(str(tmp_path))
    model = ge.compile(src, precision_mode="allow_mix_precision_bf16")
    assert any(n.op_type == "PackedMatMul" for n in model.graph.walk())
    _export_and_compare(model, feeds, rtol=3e-2, atol=3e-2)  # (the kernel rounds A to bf16 as well)


def test_an_int8_kernel_is_refused_by_name_and_no_file_is_written(tmp_path, capsys):
    m = qm.mlp()
    om = ge.compile(qm.quantized(m, str(tmp_path), "qdq")).save(str(tmp_path / "q.om"))
    out = tmp_path / "q.onnx"
    assert main(["export", om, "-o", str(out)]) != 0
    err = capsys.readouterr().err
    assert "PackedMatMul" in err and "--keep-compiled-ops" in err
    assert not out.exists()
    from ge_tools.export import export_om

    with pytest.raises(GEError, match="ge.cpu::PackedMatMul"):
        export_om(ge.load_om(om))


def test_keep_compiled_ops_declares_every_domain(tmp_path, capsys):
    om = ge.compile(light_model_path("squeezenet")).save(str(tmp_path / "sq.om"))
    out = tmp_path / "sq_kept.onnx"
    assert main(["export", om, "-o", str(out), "--keep-compiled-ops"]) == 0
    assert "compiled ops kept" in capsys.readouterr().err
    m = onnx.load(str(out))
    onnx.checker.check_model(m)
    assert any(n.domain == "ge.cpu" for n in m.graph.node)
    assert {n.domain for n in m.graph.node} - {""} <= {o.domain for o in m.opset_import if o.version == 1}
    low = tmp_path / "sq.onnx"
    assert main(["export", om, "-o", str(low)]) == 0
    assert "lowered to standard ONNX" in capsys.readouterr().err
    ort.InferenceSession(str(low), providers=["CPUExecutionProvider"])
