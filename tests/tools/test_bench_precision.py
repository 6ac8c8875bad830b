"""ge bench --precision: one build per precision mode, timed side by side, each one's speed-up
and output error against the fp32 build; the usage errors (an unknown mode, an .om)."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.cli import main
from ge_tools import bench
from ge_tools.bench_precision import ATC_MODES, output_error, parse_modes, precision_summary


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """MatMul+Add+Relu+MatMul on x [8, 64] (random weights), the hidden Relu a second output."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((64, 96)) / 8).astype(np.float32)
    b1 = (rng.standard_normal(96) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((96, 32)) / np.sqrt(96)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["mm1"], name="mm1"),
             helper.make_node("Add", ["mm1", "b1"], ["pre"], name="add1"),
             helper.make_node("Relu", ["pre"], ["hidden"], name="relu1"),
             helper.make_node("MatMul", ["hidden", "w2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32]),
                           helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [8, 96])],
                          [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    d = tmp_path_factory.mktemp("bench_precision")
    src = str(d / "mlp.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    return src


@pytest.fixture(autouse=True)
def short_gap(monkeypatch):
    monkeypatch.setattr(bench, "IDLE_GAP_S", 0.01)  # (the interleaving is what is tested, not the gap)


def _bench(capsys, *args):
    capsys.readouterr()
    rc = main(["bench", *map(str, args), "--runs", "3", "--warmup", "1"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return cap.out


def test_a_row_per_mode_with_speedup_and_error_against_fp32(mlp, capsys):
    r = json.loads(_bench(capsys, mlp, "--precision", "all", "--threads", "1", "--json"))
    rows = r["rows"]
    assert list(rows) == ["fp32", "bf16", "fp16"] and r["baseline"] == "fp32" and r["threads"] == 1
    assert [rows[k]["precision_mode"] for k in rows] == ["must_keep_origin_dtype", "allow_mix_precision_bf16",
                                                         "force_fp16"]
    for row in rows.values():
        assert row["runs"] == 3 and row["compile_seconds"] > 0 and row["p50_ms"] <= row["p90_ms"]
        assert set(row["outputs"]) == {"y", "hidden"}
        assert row["speedup_vs_fp32"] == pytest.approx(rows["fp32"]["p50_ms"] / row["p50_ms"])
    base = rows["fp32"]
    assert base["speedup_vs_fp32"] == 1 and base["precision"] is None
    assert all(e == {"max_abs": 0.0, "max_abs_over_range": 0.0, "cosine": 1.0} for e in base["outputs"].values())
    bf16, fp16 = rows["bf16"]["outputs"], rows["fp16"]["outputs"]
    assert bf16["y"]["max_abs"] > 0 and all(e["max_abs_over_range"] < 5e-2 and e["cosine"] > 0.999
                                            for e in bf16.values()), bf16
    assert all(e["max_abs_over_range"] < 5e-3 and e["cosine"] > 0.9999 for e in fp16.values()), fp16
    p = rows["bf16"]["precision"]
    assert p["mode"] == "allow_mix_precision_bf16" and p["nodes"] >= 2, p  # both MatMuls (fused or not)

    # the errors are the fp32 build's outputs against each build's, on the same (seeded) inputs
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    want = ge.compile(mlp, threads=1).run({"x": x})
    got = ge.compile(mlp, {"precision_mode": "allow_mix_precision_bf16"}, threads=1).run({"x": x})
    ref = want["y"].astype(np.float64)
    assert np.abs(got["y"] - ref).max() / (ref.max() - ref.min()) < 5e-2


def test_text_table_against_onnxruntime_and_concurrency(mlp, capsys):
    out = _bench(capsys, mlp, "--precision", "bf16", "--against", "onnxruntime")
    lines = out.splitlines()
    assert "speed-up" in lines[2] and "cosine" in lines[2] and "abs/range" in lines[2]
    starts = [ln.split()[0] for ln in lines[3:] if ln and not ln.startswith(" ")]
    assert starts[:3] == ["fp32", "bf16", "onnxruntime"], out  # the fp32 baseline is built though not named
    assert "compile report's precision table:" in out and "bf16 (allow_mix_precision_bf16)" in out
    r = json.loads(_bench(capsys, mlp, "--precision", "fp32,allow_fp32_to_bf16", "--against", "onnxruntime",
                          "--concurrency", "2", "--json"))
    assert list(r["rows"]) == ["fp32", "allow_fp32_to_bf16", "onnxruntime"] and r["concurrency"] == 2
    ort = r["rows"]["onnxruntime"]
    assert ort["precision_mode"] is None and ort["runs"] >= 2
    assert all(e["max_abs_over_range"] < 1e-5 for e in ort["outputs"].values()), ort["outputs"]


def test_unknown_mode_and_om_are_usage_errors(mlp, capsys, tmp_path):
    capsys.readouterr()
    assert main(["bench", mlp, "--precision", "fp32,bf61", "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "unknown precision mode 'bf61'" in err and "did you mean: bf16" in err
    assert "fp32, bf16, fp16, all" in err and "allow_mix_precision_bf16" in err
    om = ge.compile(mlp).save(str(tmp_path / "mlp.om"))
    assert main(["bench", str(om), "--precision", "bf16", "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "mlp.om' is an .om" in err and "source model" in err
    assert main(["bench", mlp, "--precision", "bf16", "--option", "precision_mode=force_fp16"]) == 2
    assert "--precision and --option precision_mode" in capsys.readouterr().err


def test_parse_modes_summary_and_error_measures():
    from ge_atc.precision import MODES

    assert set(ATC_MODES) == set(MODES)  # the tool's list (no plugin imports another) is the plugin's
    assert parse_modes("bf16") == {"fp32": "must_keep_origin_dtype", "bf16": "allow_mix_precision_bf16"}
    assert parse_modes("all, force_fp16,") == {"fp32": "must_keep_origin_dtype", "bf16": "allow_mix_precision_bf16",
                                               "fp16": "force_fp16"}  # a mode named twice: once
    assert list(parse_modes("fp16,must_keep_origin_dtype")) == ["fp16", "must_keep_origin_dtype"]
    report = {"precision": {"mode": "force_fp16", "compute": {"float16": 1}, "extra": [1], "accuracy": {"a": {}},
                            "nodes": {"a": {"op": "MatMul", "weights": "float16", "compute": "float16"},
                                      "b": {"op": "Conv", "compute": "float32", "kernel": "amx"}, "c": "odd"}}}
    s = precision_summary(report)
    assert s == {"mode": "force_fp16", "compute": {"float16": 1}, "nodes": 3,
                 "nodes_by_compute": {"float16": 1, "float32": 1}, "nodes_by_weights": {"float16": 1},
                 "nodes_by_kernel": {"amx": 1}}
    assert precision_summary({}) is None and precision_summary({"precision": "?"}) is None
    ref = np.array([[0.0, 2.0], [-2.0, 4.0]], np.float32)
    e = output_error(ref + np.float32(0.06), ref)
    assert e["max_abs"] == pytest.approx(0.06) and e["max_abs_over_range"] == pytest.approx(0.01)
    assert 0.999 < e["cosine"] < 1
    assert output_error(ref, ref) == {"max_abs": 0.0, "max_abs_over_range": 0.0, "cosine": 1.0}
    assert output_error(ref[0], ref)["max_abs"] == float("inf")
    assert output_error(np.zeros(3), np.zeros(3))["cosine"] == 1.0


def test_ge_compile_measures_a_reduced_builds_error_against_fp32(mlp, capsys, tmp_path):
    rc = main(["compile", str(mlp), "-o", str(tmp_path / "b.om"), "--quiet", "--report", str(tmp_path / "r.json"),
               "--option", "precision_mode=allow_mix_precision_bf16"])
    err = capsys.readouterr().err
    assert rc == 0, err
    acc = json.loads((tmp_path / "r.json").read_text())["precision"]["accuracy"]
    assert acc["against"] == "this engine's float32 build" and acc["outputs"]
    worst = max(o["max_abs_over_range"] for o in acc["outputs"].values())
    assert 0 < worst < 5e-2 and "largest error against the float32 build" in err
    assert ge.load_om(str(tmp_path / "b.om")).report["precision"]["accuracy"] == acc  # (kept in the .om too)
    rc = main(["compile", str(mlp), "-o", str(tmp_path / "f.om"), "--quiet", "--report", str(tmp_path / "f.json")])
    report = json.loads((tmp_path / "f.json").read_text())
    assert rc == 0 and "precision" not in report
    # float32 on a CPU with a bf16 unit: the bf16 mode compiled and measured on this model, one note
    assert ("precision_trial" in report) == ("precision_hint" in report)
    if "precision_trial" in report:
        assert 0 < report["precision_trial"]["max_abs_over_range"] < 5e-2 and "float32 output's range" in \
            capsys.readouterr().err
