"""ge compare QUANT --origin FLOAT: a model quantised by onnxruntime against the float model it was
quantised from, per output (max error, error over the range, SQNR, cosine) and per layer
(--per-node: each tensor of the float model the compiled quantised model computes too, with the
int8 kernel that computed it); a layer made wrong on purpose is named as the first to diverge."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import ge_core as ge
from ge_core.cli import main
from tests.quant.models import feeds, mlp, quantized, residual_cnn


def _compare(capsys, *args, as_json=True):
    """``ge compare ARGS [--json]`` in this process: (exit status, parsed JSON or text, stderr)."""
    capsys.readouterr()
    rc = main(["compare", *map(str, args), *(["--json"] if as_json else [])])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if as_json and out.out.strip() else out.out), out.err


def _sqnr(got, want):
    e = got.astype(np.float64) - want.astype(np.float64)
    return 10 * np.log10(np.sum(want.astype(np.float64) ** 2) / np.sum(e * e))


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """(quantised QDQ file, float file, feed file, feed) of the residual CNN."""
    tmp = tmp_path_factory.mktemp("cnn")
    m = residual_cnn()
    q = quantized(m, str(tmp), "qdq")
    x = feeds(m, 7)[0]["x"]
    np.save(tmp / "x.npy", x)
    return q, str(tmp / "residual_cnn_f32.onnx"), str(tmp / "x.npy"), x


def _rows_by_node(r):
    return {x["node"]: x for x in r["per_node"]["layers"]}


def test_every_quantised_conv_has_its_sqnr_cosine_and_kernel(cnn, capsys):
    q, f, xfile, x = cnn
    rc, r, err = _compare(capsys, q, "--origin", f, "--per-node", "--input", f"x={xfile}")
    assert rc == 0 and r["ok"], err
    int8 = ge.compile(q).report["int8"]["nodes"]
    assert len(int8) == 5  # 4 convs and the classifier's Gemm
    rows = _rows_by_node(r)
    for name, rec in int8.items():
        row = rows[name]
        assert row["kernel"] == (rec["kernel"] if not rec["why"] else f"float32: {rec['why']}")
        assert np.isfinite(row["sqnr_db"]) and row["sqnr_db"] > 20 and 0 < row["cosine"] <= 1
    # (c3, conv3's own output, is compared where it is a value: the block's Add runs at conv3's store
    # on a machine with an integer unit, and conv3's node then stands for r3)
    assert {x["tensor"] for x in r["per_node"]["layers"]} >= {"r1", "r2", "r3", "r4", "y"}
    assert [x["tensor"] for x in r["per_node"]["layers"]] == sorted(
        (x["tensor"] for x in r["per_node"]["layers"]), key=["r1", "r2", "c3", "r3", "mp", "r4", "p", "f", "y"].index)
    assert r["per_node"]["first_divergence"] is None and len(r["per_node"]["worst"]) == 5
    assert r["per_node"]["int8_unmatched"] == []
    # the output's SQNR is what NumPy gives from onnxruntime's float output and this engine's int8 one
    want = ort.InferenceSession(f, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ge.compile(q).run(x)["y"]
    (out,) = r["outputs"]
    assert out["sqnr_db"] == pytest.approx(_sqnr(got, want), rel=1e-9)
    assert out["max_abs"] == pytest.approx(float(np.abs(got.astype(np.float64) - want).max()), rel=1e-9)
    assert out["max_rel_range"] == pytest.approx(out["max_abs"] / (float(want.max()) - float(want.min())), rel=1e-9)
    cos = float(np.dot(got.ravel().astype(np.float64), want.ravel())
                / (np.linalg.norm(got.astype(np.float64)) * np.linalg.norm(want.astype(np.float64))))
    assert out["cosine"] == pytest.approx(cos, rel=1e-9)


def test_max_error_decides_the_exit_status(cnn, capsys):
    q, f, xfile, _ = cnn
    rc, r, _ = _compare(capsys, q, "--origin", f, "--input", f"x={xfile}", "--max-error", "0.5")
    assert rc == 0 and r["ok"] and r["max_error"] == 0.5
    rc, r, _ = _compare(capsys, q, "--origin", f, "--input", f"x={xfile}", "--max-error", "1e-6")
    assert rc == 1 and not r["ok"]
    rc, text, _ = _compare(capsys, q, "--origin", f, "--max-error", "1e-6", as_json=False)
    assert rc == 1 and "FAIL" in text and "SQNR dB" in text
    rc, _, err = _compare(capsys, q, "--max-error", "0.1")  # needs --origin
    assert rc == 2 and "--origin" in err


def test_a_layer_made_wrong_is_the_first_divergence(cnn, tmp_path, capsys):
    q, f, xfile, _ = cnn
    m = onnx.load(q)
    (dq,) = [n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w2_quantized"]
    (scale,) = [t for t in m.graph.initializer if t.name == dq.input[1]]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(4), scale.name))
    bad = str(tmp_path / "bad.onnx")
    onnx.save(m, bad)
    rc, r, err = _compare(capsys, bad, "--origin", f, "--per-node", "--input", f"x={xfile}", "--threads", 2)
    assert rc == 0, err  # no --max-error: measures only
    pn = r["per_node"]
    first = pn["first_divergence"]
    assert first["tensor"] == "r2" and first["op"] == "Relu" and first["sqnr_db"] < 20
    assert first["kernel"] == _rows_by_node(r)[first["node"]]["kernel"] and first["kernel"]
    assert _rows_by_node(r)["conv"]["sqnr_db"] > 20  # the layer before it agrees
    assert pn["worst"][0] in ("r2", "c3", "r3", "mp", "r4", "p", "f", "y")
    rc, text, _ = _compare(capsys, bad, "--origin", f, "--per-node", "--sqnr-threshold", 10, as_json=False)
    assert rc == 0 and "first layer that diverges (SQNR under 10 dB): 'r2' (Relu)" in text


def test_the_mlp_dynamic_and_static(tmp_path, capsys):
    m = mlp()
    for how in ("qdq", "dynamic"):
        q = quantized(m, str(tmp_path), how)
        rc, r, err = _compare(capsys, q, "--origin", tmp_path / "mlp_f32.onnx", "--per-node")
        assert rc == 0, err
        int8 = ge.compile(q).report["int8"]["nodes"]
        rows = _rows_by_node(r)
        assert set(int8) <= set(rows) and [x["tensor"] for x in r["per_node"]["layers"]] == ["r1", "y"]
        for name, rec in int8.items():
            assert rows[name]["kernel"] == (rec["kernel"] if not rec["why"] else f"float32: {rec['why']}")
            assert 0 < rows[name]["cosine"] <= 1 and rows[name]["sqnr_db"] > 20


def test_mismatched_or_missing_origins_are_usage_errors(cnn, tmp_path, capsys):
    q, _, _, _ = cnn
    other = tmp_path / "mlp_f32.onnx"
    onnx.save(mlp(), other)
    rc, _, err = _compare(capsys, q, "--origin", other)
    assert rc == 2 and "take different inputs" in err and q in err and str(other) in err
    rc, _, err = _compare(capsys, q, "--origin", tmp_path / "nope.onnx")
    assert rc == 2 and "nope.onnx" in err and "does not exist" in err
    rc, _, err = _compare(capsys, q, "--origin", other, "--reference", "torch")
    assert rc == 2 and "--origin" in err
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    rc, _, err = _compare(capsys, q, "--origin", junk)
    assert rc == 2 and f"the float origin '{junk}' is not an ONNX model" in err
