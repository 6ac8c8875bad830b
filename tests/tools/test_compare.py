"""ge compare: outputs against onnxruntime / onnx.reference with a pass/fail status; a planted
divergence (a deliberately wrong kernel that a test plugin's pass swaps in) is found by node
(--per-node) and by pass (--bisect-passes, which also writes the graph before that pass)."""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.cli import main
from ge_sdk import Plugin, same_as_input


def _model(path):
    """x -> MatMul(w0) -> Tanh 'tanh1' -> MatMul(w1) -> Add(b) -> y (the batch symbolic)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="mm0"),
             helper.make_node("Tanh", ["h"], ["t"], name="tanh1"),
             helper.make_node("MatMul", ["t", "w1"], ["z"], name="mm2"),
             helper.make_node("Add", ["z", "b"], ["y"], name="add3")]
    g = helper.make_graph(nodes, "planted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _swap_tanh(graph, ctx):
    """Turn node 'tanh1' into the wrong test.bad::BadTanh (same name, same output value)."""
    for n in graph.nodes:
        if n.name == "tanh1" and n.op_type == "Tanh":
            n.op_type, n.domain = "BadTanh", "test.bad"
            graph.opset_imports["test.bad"] = 1
            return True
    return False


def planted_plugin(name: str, *, required: bool = False):
    """A test plugin: a wrong kernel (tanh off by 1%) and the pass that plants it in place of
    node 'tanh1' (a ``required`` one, which no bisect can switch off, runs in the prepare stage)."""
    plugin = Plugin(name)

    @plugin.op("BadTanh", domain="test.bad", infer=same_as_input())
    def bad_tanh(x):
        return np.tanh(x) * np.float32(1.01)

    plugin.graph_pass(f"plant_bad_tanh{'_required' if required else ''}", stage="prepare" if required else "optimize",
                      opt_level=0, required=required)(_swap_tanh)
    return plugin


@pytest.fixture
def planted(fresh_host):
    fresh_host.register_plugin(planted_plugin("planted_test"), "planted_test")
    yield fresh_host


def run_compare(capsys, *args):
    """``ge compare ARGS --json`` in this process: (exit status, parsed JSON or None, stderr)."""
    capsys.readouterr()
    rc = main(["compare", *map(str, args), "--json"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if out.out.strip() else None), out.err


def test_a_good_model_passes_against_both_references(tmp_path, capsys):
    src = _model(str(tmp_path / "m.onnx"))
    om = ge.compile(src).save(str(tmp_path / "m.om"))
    for ref in ("onnxruntime", "onnx.reference"):
        rc, r, err = run_compare(capsys, om, "--reference", ref, "--batch", 3)
        assert rc == 0 and r["ok"], (r, err)
        (o,) = r["outputs"]
        assert o["name"] == "y" and o["ok"] and o["max_abs"] < 1e-4
        assert r["inputs"]["x"]["shape"] == [3, 8]
    # the same check by hand: the error compare reports is the one onnxruntime shows
    x = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    rc, r, _ = run_compare(capsys, om, "--input", f"x={tmp_path / 'x.npy'}")
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ge.load_om(om).run(x)["y"]
    assert r["outputs"][0]["max_abs"] == pytest.approx(float(np.abs(got.astype(np.float64) - want).max()), abs=1e-12)


def test_planted_kernel_is_found_by_node_and_by_pass(planted, tmp_path, capsys, monkeypatch):
    src = _model(str(tmp_path / "m.onnx"))
    monkeypatch.chdir(tmp_path)
    rc, r, err = run_compare(capsys, src, "--per-node", "--bisect-passes", "--batch", 2)
    assert rc == 1 and not r["ok"], err
    assert not r["outputs"][0]["ok"] and r["outputs"][0]["max_abs"] > 1e-3
    first = r["per_node"]["first"]
    assert (first["node"], first["op"], first["output"]) == ("tanh1", "test.bad::BadTanh", "t")
    assert first["suspects"] == ["tanh1 (test.bad::BadTanh)"]  # its input agreed: only it can be wrong
    b = r["bisect"]
    assert b["pass"] == "plant_bad_tanh" and b["stage"] == "optimize" and b["plugin"] == "planted_test"
    assert b["passes"].index("plant_bad_tanh") == b["index"] - 1
    assert b["compiles"] < len(b["passes"]) + 2  # a binary search, not one compile per pass
    # the repro is the graph before the pass: standard ONNX that onnxruntime runs, with the good Tanh
    repro = onnx.load(b["repro"])
    onnx.checker.check_model(repro)
    assert "Tanh" in [n.op_type for n in repro.graph.node] and not any(n.domain for n in repro.graph.node)
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    a = ort.InferenceSession(b["repro"], providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    c = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)
    # text output names them too
    capsys.readouterr()
    assert main(["compare", src, "--per-node", "--bisect-passes", "--batch", "1", "--repro", str(tmp_path / "r.onnx")]) == 1
    out = capsys.readouterr().out
    assert "node 'tanh1' (test.bad::BadTanh)" in out and "first diverging pass: 'plant_bad_tanh'" in out
    assert "MISMATCH" in out and out.rstrip().endswith("beyond the tolerance")


def test_a_kernel_wrong_without_any_pass_is_sent_to_per_node(fresh_host, tmp_path, capsys):
    fresh_host.register_plugin(planted_plugin("planted_required", required=True), "planted_required")
    src = _model(str(tmp_path / "m.onnx"))
    rc, r, _ = run_compare(capsys, src, "--bisect-passes", "--per-node", "--batch", 1)
    assert rc == 1 and r["bisect"]["pass"] is None and "--per-node" in r["bisect"]["verdict"]
    assert r["per_node"]["first"]["node"] == "tanh1"


def test_tolerance_decides_and_usage_errors_exit_2(planted, tmp_path, capsys):
    src = _model(str(tmp_path / "m.onnx"))
    rc, r, _ = run_compare(capsys, src, "--batch", 1, "--rtol", "0.5", "--atol", "0.5")  # 1% off is within 50%
    assert rc == 0 and r["ok"]
    rc, _, err = run_compare(capsys, src, "--batch", 1, "--rtol", "-1")
    assert rc == 2 and "--rtol" in err
    rc, _, err = run_compare(capsys, src, "--batch", 1, "--input", "nope=x.npy")
    assert rc == 2 and "'nope'" in err
    rc, _, err = run_compare(capsys, str(tmp_path / "missing.onnx"))
    assert rc == 2 and "does not exist" in err
    np.save(tmp_path / "ints.npy", np.ones((2, 8), np.int64))
    rc, _, err = run_compare(capsys, src, "--batch", 1, "--input", f"x={tmp_path / 'ints.npy'}")
    assert rc == 2 and "input 'x' has dtype int64, the model expects float32" in err


def test_suspects_reach_back_to_the_values_that_agree():
    from ge_sdk import GraphBuilder
    from ge_tools.compare import suspects

    b = GraphBuilder()
    x = b.input("x", "float32", (2,))
    r = b.Relu(x)
    t = b.Tanh(r)
    s = b.Sigmoid(t)
    b.output(b.Add(s, r))
    g = b.build()
    relu, tanh, sig, add = g.node_list()
    assert suspects(g, add, agreed=set()) == [relu, tanh, sig, add]
    assert suspects(g, add, agreed={relu.output.name}) == [tanh, sig, add]
    assert suspects(g, add, agreed={relu.output.name, sig.output.name}) == [add]


def test_an_om_whose_source_is_gone_asks_for_source(tmp_path, capsys):
    src = _model(str(tmp_path / "m.onnx"))
    om = ge.compile(src).save(str(tmp_path / "m.om"))
    moved = tmp_path / "moved.onnx"
    os.replace(src, moved)
    rc, _, err = run_compare(capsys, om)
    assert rc == 2 and "--source" in err
    rc, r, _ = run_compare(capsys, om, "--source", moved, "--batch", 1)
    assert rc == 0 and r["ok"] and r["source"] == str(moved)
    capsys.readouterr()
    assert main(["bench", om, "--against", "onnxruntime", "--runs", "2", "--batch", "1"]) == 2
    assert "--source" in capsys.readouterr().err


def test_diff_and_strict_json():
    from ge_tools.common import diff, to_json

    d = diff("y", np.zeros(2, np.float32), np.zeros(3, np.float32), 1e-3, 1e-4)
    assert not d.ok and "shape [2] vs reference [3]" in d.note
    assert json.loads(to_json(d.as_dict()))["max_abs"] == "inf"
    nan = np.array([np.nan, 1.0, np.inf], np.float32)
    assert diff("y", nan, nan.copy(), 0, 0).ok  # NaN where the reference has NaN, the same infinity
    d = diff("y", np.array([1.0, 2.0]), np.array([1.0, 2.1]), 1e-3, 1e-4)
    assert not d.ok and d.max_abs == pytest.approx(0.1) and d.max_rel == pytest.approx(0.1 / 2.1)
    assert diff("y", np.array([1.0, 2.0]), np.array([1.0, 2.1]), 0.05, 0).ok  # 0.1 <= 0.05 * 2.1
    assert not diff("y", np.array([np.nan]), np.array([1.0]), 1, 1).ok
