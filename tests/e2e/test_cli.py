"""The command lines: ge compile/run/inspect/passes, atc, and clean errors for bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import light_model_path


def ge(*args, check=False, env=None):
    return subprocess.run([sys.executable, "-m", "ge_core.cli", *map(str, args)], capture_output=True, text=True,
                          check=check, env=env)


def atc(*args):
    return subprocess.run([sys.executable, "-c", "import sys; from ge_atc.cli import main; sys.exit(main())", *map(str, args)],
                          capture_output=True, text=True)


def assert_clean_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


@pytest.fixture(scope="module")
def squeezenet_om(tmp_path_factory):
    d = tmp_path_factory.mktemp("om")
    om = d / "sq.om"
    ge("compile", light_model_path("squeezenet"), "-o", om, "-q", check=True)
    return om


def test_inspect_shows_the_om(squeezenet_om):
    r = ge("inspect", squeezenet_om, check=True)
    assert "weights" in r.stdout and "compile report" in r.stdout
    info = json.loads(ge("inspect", squeezenet_om, "--json", check=True).stdout)
    assert info["model"]["nodes"] > 0 and {p["kind"] for p in info["file"]["partitions"]} == {"model", "weights"}
    assert sum(info["report"]["op_counts"].values()) == info["model"]["nodes"] == info["report"]["nodes_after"]
    # outputs with their dtype and shape, as the inputs
    import ge_core as _ge

    want = [{"name": a.name, "dtype": str(a.dtype), "shape": list(a.shape)} for a in _ge.load_om(str(squeezenet_om)).outputs]
    assert info["model"]["output_types"] == want and info["model"]["outputs"] == [w["name"] for w in want]
    assert f"outputs: {want[0]['name']} float32[1, 1000" in r.stdout


def test_atc_compile_and_mode1(tmp_path):
    out = tmp_path / "alex"
    r = atc("--model=" + light_model_path("bvlc_alexnet"), "--framework=5", f"--output={out}", "--soc_version=Ascend310",
            "--input_shape=data_0:1,3,224,224", "--log=error", "--precision_mode=force_fp32")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "alex.om").exists() and "no effect" in r.stderr
    r = atc("--mode=1", f"--om={tmp_path / 'alex.om'}", f"--json={tmp_path / 'alex.json'}")
    assert r.returncode == 0, r.stderr
    info = json.loads((tmp_path / "alex.json").read_text())
    assert info["model"]["inputs"][0]["name"] == "data_0"


def test_atc_out_nodes_and_bad_flags(tmp_path):
    r = atc("--model=" + light_model_path("squeezenet"), "--framework=5", f"--output={tmp_path / 's'}", "--out_nodes=r65")
    assert r.returncode == 0, r.stderr
    r = ge("run", tmp_path / "s.om", "--json", check=True)
    assert list(json.loads(r.stdout)["outputs"]) == ["r65"]
    assert_clean_error(atc("--model=x.onnx", "--framwork=5", "--output=y"), "did you mean", "framework")
    assert_clean_error(atc("--model=" + light_model_path("squeezenet"), "--framework=4", f"--output={tmp_path / 's'}"), "framework 4")


def test_missing_file():
    assert_clean_error(ge("compile", "/nonexistent/model.onnx"), "/nonexistent/model.onnx", "does not exist")
    assert_clean_error(ge("run", "/nonexistent/model.om"), "/nonexistent/model.om")


def test_not_a_model(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("these are my notes, not a model\n" * 10)
    assert_clean_error(ge("compile", p, "-o", tmp_path / "x.om"), str(p))
    q = tmp_path / "data.bin"
    q.write_bytes(os.urandom(300))
    assert_clean_error(ge("compile", q), str(q))
    assert not (tmp_path / "x.om").exists()


def test_truncated_and_bitflipped_om(squeezenet_om, tmp_path):
    raw = squeezenet_om.read_bytes()
    t = tmp_path / "t.om"
    t.write_bytes(raw[: len(raw) // 2])
    assert_clean_error(ge("run", t), "truncated")
    assert_clean_error(ge("inspect", t), "truncated")
    b = bytearray(raw)
    b[len(b) - 100] ^= 0x10
    f = tmp_path / "f.om"
    f.write_bytes(bytes(b))
    assert_clean_error(ge("run", f), str(f))


def test_unknown_op_named_with_domain_and_node(tmp_path):
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_fancy_node", domain="com.example")
    node2 = helper.make_node("Reluu", ["y"], ["z"], name="typo_node")
    g = helper.make_graph([node, node2], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    p = tmp_path / "custom.onnx"
    onnx.save(m, p)
    assert_clean_error(ge("compile", p), "FancyOp", "com.example", "my_fancy_node", "Reluu", "typo_node")


def test_external_data_outside_model_folder(tmp_path):
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    (tmp_path / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
    sub = tmp_path / "model"
    sub.mkdir()
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p = sub / "m.onnx"
    p.write_bytes(m.SerializeToString())
    assert_clean_error(ge("compile", p, "-o", tmp_path / "m.om"), "../secret.bin", "outside")


def test_bad_input_to_run(squeezenet_om, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 10, 10), np.float32))
    assert_clean_error(ge("run", squeezenet_om, "--input", f"data_0={tmp_path / 'x.npy'}"), "data_0", "expects")
    assert_clean_error(ge("run", squeezenet_om, "--input", f"nope={tmp_path / 'x.npy'}"), "unknown input", "nope")
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert_clean_error(ge("run", squeezenet_om, "--input", f"data_0={tmp_path / 'o.npy'}"), "o.npy")


def test_run_output_dir_says_where_each_output_went(squeezenet_om, tmp_path):
    out = tmp_path / "out"
    r = ge("run", squeezenet_om, "--output-dir", out, check=True)
    info = json.loads(ge("run", squeezenet_om, "--output-dir", out, "--json", check=True).stdout)["outputs"]
    assert sorted(os.path.basename(v["file"]) for v in info.values()) == sorted(os.listdir(out))
    for name, v in info.items():
        assert f"{name}: " in r.stdout and f"-> {v['file']}" in r.stdout
        assert list(np.load(v["file"]).shape) == v["shape"]
    unwritable = tmp_path / "file"
    unwritable.write_text("")
    assert_clean_error(ge("run", squeezenet_om, "--output-dir", unwritable / "sub"), "output folder")


def test_passes_and_bad_config(tmp_path):
    data = json.loads(ge("passes", "--json", check=True).stdout)
    assert data["stages"][0]["passes"][0]["name"] == "infer_shapes"
    cfg = tmp_path / "p.toml"
    cfg.write_text('[pipeline.prepare]\npasses = ["infer_shape"]\n')
    assert_clean_error(ge("passes", "--config", cfg), "infer_shape", "did you mean: infer_shapes")
    assert_clean_error(ge("compile", light_model_path("squeezenet"), "--config", cfg, "-o", tmp_path / "x.om"), "infer_shapes")


def test_dump_ir_and_report_list_passes(tmp_path):
    dump = tmp_path / "ir"
    rep = tmp_path / "r.json"
    ge("compile", light_model_path("squeezenet"), "-o", tmp_path / "s.om", "--dump-ir", dump, "--report", rep, "-q", check=True)
    files = sorted(p.name for p in dump.iterdir())
    assert files[0] == "000_input.txt" and any("infer_shapes" in f for f in files)
    assert "Conv(" in (dump / files[0]).read_text()
    report = json.loads(rep.read_text())
    for p in report["passes"]:
        assert set(p) >= {"name", "stage", "seconds", "changed", "nodes_after"}
    assert report["passes"][0]["name"] == "infer_shapes" and report["passes"][0]["changed"] is True


# ------------------------------------------------------------------------------------------------
# polish: help on every flag, did-you-mean, warnings once, tables whole in pipes
# ------------------------------------------------------------------------------------------------
def test_every_flag_of_the_ge_commands_has_help():
    from ge_core.cli import build_parser

    parser = build_parser()
    missing = []
    for name in ("compile", "run", "inspect", "plugins", "passes", "bench", "compare", "export"):
        sp = parser.commands[name]
        for action in sp._actions:  # argparse's own list of what was added
            if not action.help:
                missing.append(f"ge {name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing


def test_did_you_mean_for_commands_and_flags(squeezenet_om):
    r = ge("benhc")
    assert_clean_error(r, "unknown command 'benhc'", "did you mean: bench")
    r = ge("run", squeezenet_om, "--repaet", "3")
    assert_clean_error(r, "ge run: unknown option '--repaet'", "did you mean: --repeat")
    r = ge("compile", "m.onnx", "--opt-levle", "1")
    assert_clean_error(r, "ge compile: unknown option '--opt-levle'", "--opt-level")
    r = ge("run", squeezenet_om, "--rep", "3")  # no abbreviations: a prefix is a typo, not a guess
    assert_clean_error(r, "unknown option '--rep'")


def test_plugin_warnings_print_once_with_a_prefix(fresh_host, tmp_path, capsys):
    from ge_core.cli import main
    from ge_sdk import Plugin

    plugin = Plugin("breaks_test")

    @plugin.graph_pass("always_breaks", stage="optimize")
    def always_breaks(graph, ctx):
        raise RuntimeError("planted failure")

    fresh_host.register_plugin(plugin, "breaks_test")
    capsys.readouterr()
    rc = main(["compile", light_model_path("squeezenet"), "-o", str(tmp_path / "s.om"), "-q"])
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = [x for x in err.splitlines() if "always_breaks" in x]
    assert len(lines) == 1 and lines[0].startswith("warning: "), err


def test_tables_are_whole_in_a_pipe():
    out = ge("passes", check=True).stdout
    assert "…" not in out and "sink_constant_computations" in out
    assert "\x1b[" not in out  # no colour codes into a pipe


def test_run_dump_tensors_writes_every_tensor_with_an_index(squeezenet_om, tmp_path):
    d = tmp_path / "dump"
    x0 = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x0)
    ge("run", squeezenet_om, "--input", f"data_0={tmp_path / 'x.npy'}", "--dump-tensors", d, check=True)
    index = json.loads((d / "index.json").read_text())
    # an intermediate tensor that kept its source name is onnxruntime's on the same input
    import onnxruntime as ort

    src = onnx.load(light_model_path("squeezenet"))
    names = {o for n in src.graph.node for o in n.output}
    mid = next(e for e in index if not e["output"] and e["name"] in names)
    src.graph.output.append(helper.make_empty_tensor_value_info(mid["name"]))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (want,) = ort.InferenceSession(src.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        [mid["name"]], {"data_0": x0})
    np.testing.assert_allclose(np.load(d / mid["file"]), want, rtol=1e-4, atol=1e-4)
    import ge_core as _ge

    model = _ge.load_om(str(squeezenet_om))
    assert len(index) == sum(len(n.outputs) for n in model.graph.nodes) > 20
    assert [e["node"] for e in index] == [n.name for n in model.graph.node_list() for _ in n.outputs]
    last = next(e for e in index if e["output"])
    x = np.load(d / last["file"])
    assert list(x.shape) == last["shape"] and str(x.dtype) == last["dtype"]
    r = json.loads(ge("run", squeezenet_om, "--input", f"data_0={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "o",
                      "--json", check=True).stdout)
    np.testing.assert_array_equal(np.load(r["outputs"][last["name"]]["file"]), x)


def test_log_debug_says_what_each_stage_did(tmp_path):
    r = ge("compile", light_model_path("squeezenet"), "-o", tmp_path / "s.om", "-q", "--log", "debug", check=True)
    assert "debug: optimize: pass fold_constants" in r.stderr and "info: fuse:" in r.stderr
    assert "info: memory plan: planner" in r.stderr and "info: build: backend cpu" in r.stderr
    r = ge("compile", light_model_path("squeezenet"), "-o", tmp_path / "s.om", "-q", check=True)
    assert "debug:" not in r.stderr and "info:" not in r.stderr
