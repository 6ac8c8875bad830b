"""ge bench: its timings agree with timing the same runs in-process; --against onnxruntime,
--concurrency, --batch; ge run --repeat shows the warm time apart from the cold first run."""

import json
import time

import numpy as np
import pytest

import ge_core as ge
from ge_core.cli import main
from tests.tools.models import matmul_chain


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    src = matmul_chain(str(d / "chain.onnx"), width=384, layers=8)  # about 1 ms a run: long enough to time
    om = ge.compile(src, threads=1).save(str(d / "chain.om"))
    return src, om


def _bench(capsys, *args):
    capsys.readouterr()
    rc = main(["bench", *map(str, args), "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


def _timed_in_process(om, x, runs=150):
    """(min, median) ms of ``runs`` runs of the .om in this process."""
    model = ge.load_om(om, threads=1)
    for _ in range(10):
        model.run(x)
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        model.run(x)
        t.append(time.perf_counter() - t0)
    return float(np.min(t)) * 1e3, float(np.median(t)) * 1e3


def test_timings_agree_with_in_process_timing(chain, capsys):
    src, om = chain
    x = np.random.default_rng(0).standard_normal((64, 384)).astype(np.float32)
    before = _timed_in_process(om, {"x": x})
    r = _bench(capsys, om, "--batch", 64, "--runs", 150, "--warmup", 10, "--threads", 1)
    after = _timed_in_process(om, {"x": x})
    s = r["engines"]["ge"]
    assert s["runs"] == 150 and r["inputs"]["x"]["shape"] == [64, 384] and r["batch"] == 64
    assert s["min_ms"] <= s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
    assert r["cold_first_run_ms"] > 0 and "load_seconds" in r
    assert before[0] > 0.5, f"the model runs in {before[0]:.3f} ms: too short to time reliably"
    # the fastest run agrees (another process's load, CI's second worker, only slows runs down:
    # the medians moved by half under it, 2.1 ms in process against 3.1 in the tool), and the
    # median is not off by a factor (a load or a compile timed with the runs would be)
    fastest = min(before[0], after[0])
    assert abs(s["min_ms"] / fastest - 1) < 0.3, (s["min_ms"], before, after)
    assert 0.5 < s["p50_ms"] / ((before[1] + after[1]) / 2) < 2.0, (s["p50_ms"], before, after)
    assert abs(s["items_per_s"] / s["throughput_per_s"] - 64) < 1e-6


def test_against_onnxruntime_and_concurrency(chain, capsys):
    src, om = chain
    r = _bench(capsys, om, "--source", src, "--batch", 8, "--runs", 20, "--warmup", 2, "--threads", 1,
               "--against", "onnxruntime")
    assert set(r["engines"]) == {"ge", "onnxruntime"}
    assert all(e["runs"] == 20 for e in r["engines"].values()) and r["onnxruntime_threads"] == 1
    assert r["p50_ratio_ge_over_onnxruntime"] == pytest.approx(
        r["engines"]["ge"]["p50_ms"] / r["engines"]["onnxruntime"]["p50_ms"])
    r = _bench(capsys, src, "--batch", 4, "--runs", 24, "--warmup", 1, "--concurrency", 3)  # a source model
    assert r["engines"]["ge"]["runs"] == 24 and r["concurrency"] == 3 and "compile_seconds" in r


def test_text_output_and_usage_errors(chain, capsys, tmp_path):
    src, om = chain
    capsys.readouterr()
    assert main(["bench", str(om), "--runs", "5", "--warmup", "1", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "cold first run" in out and "p50" in out and "p99" in out and out.count("\n") >= 4
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "fixed.onnx"))
    assert main(["bench", str(tmp_path / "fixed.onnx"), "--batch", "4", "--runs", "2"]) == 2
    assert "no input of" in capsys.readouterr().err
    assert main(["bench", str(om), "--runs", "0"]) == 2
    assert "--runs 0" in capsys.readouterr().err


def test_run_repeat_reports_the_warm_time_apart(chain, capsys):
    src, om = chain
    capsys.readouterr()
    assert main(["run", str(om), "--repeat", "5", "--input-shape", "x:4,384", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["warm_runs"] == 4 and 0 < r["warm_seconds_min"] <= r["warm_seconds_median"]
    assert r["cold_seconds"] == r["seconds"]
    assert main(["run", str(om), "--repeat", "3", "--input-shape", "x:4,384"]) == 0
    out = capsys.readouterr().out
    assert "first run (cold)" in out and "2 warm run(s): median" in out
