"""``ge run`` / ``ge bench`` and the API on models with symbolic or unknown dims (issue 20).

Random inputs for such a model need sizes: ``--input-shape "x:2,3,8,8;y:2,3"`` gives them (the
syntax compile takes), a symbolic dim shared by several inputs takes one size (given for one
input, the others follow), a shape that contradicts the model is an InputError naming the input,
and without sizes ``ge run`` says which input needs one and how to give it instead of guessing 1.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ge_core as ge
from ge_core.errors import InputError, OptionError
from ge_sdk.inputs import input_shapes, random_inputs
from tests.e2e.test_cli import assert_clean_error
from tests.e2e.test_cli import ge as ge_cli

F32 = TensorProto.FLOAT


def _shared_batch_model() -> onnx.ModelProto:
    """x [batch, 3, 8, 8] and y [batch, 3]: out = mean of x over H, W + y (the batches must agree)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("Add", ["m", "y"], ["out"])]
    g = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", F32, ["batch", 3, 8, 8]),
                                            helper.make_tensor_value_info("y", F32, ["batch", 3])],
                          [helper.make_tensor_value_info("out", F32, ["batch", 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _unknown_dim_model() -> onnx.ModelProto:
    """x [?, 4]: a dim with neither a size nor a name."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "unknown",
                          [helper.make_tensor_value_info("x", F32, [None, 4])],
                          [helper.make_tensor_value_info("y", F32, [None, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    d = tmp_path_factory.mktemp("dyn")
    m = _shared_batch_model()
    om = str(d / "shared.om")
    ge.compile(ge.load(m)).save(om)
    return m, om


def _ort(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


# ------------------------------------------------------------------------------------------------
# ge run
# ------------------------------------------------------------------------------------------------
def test_run_random_without_shapes_names_the_inputs_and_the_option(shared):
    _, om = shared
    for args in (["--random"], []):  # no feeds at all: random inputs too
        r = ge_cli("run", om, *args)
        assert_clean_error(r, "'x' [batch, 3, 8, 8]", "'y' [batch, 3]", "--input-shape", "symbolic or unknown dims")
        assert "ran in" not in r.stdout


def test_run_with_input_shape_matches_onnxruntime(shared, tmp_path):
    m, om = shared
    out = tmp_path / "o"
    r = ge_cli("run", om, "--random", "--input-shape", "x:2,3,8,8", "--output-dir", out, "--json", "--seed", "3")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["outputs"]
    assert info["out"]["shape"] == [2, 3]
    # y's batch followed x's: the same random feeds made in-process, checked against onnxruntime
    from ge_sdk.cli import random_feeds

    feeds = random_feeds(ge.load_om(om), 3, {"x": (2, 3, 8, 8)}, strict=True)
    assert feeds["x"].shape == (2, 3, 8, 8) and feeds["y"].shape == (2, 3)
    got = np.load(out / "out.npy")
    np.testing.assert_allclose(got, _ort(m, feeds)[0], rtol=1e-5, atol=1e-6)
    # --input-shape alone implies random inputs; a second input's shape is welcome when it agrees
    r = ge_cli("run", om, "--input-shape", "x:5,3,8,8;y:5,3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outputs"]["out"]["shape"] == [5, 3]


@pytest.mark.parametrize("spec, needles", [
    ("x:2,3,8,8;y:3,3", ["symbolic dim 'batch'", "2 in input 'x'", "3 in input 'y'"]),
    ("x:2,3,8", ["input 'x'", "3 dim(s) [2, 3, 8]", "[batch, 3, 8, 8]"]),
    ("x:2,4,8,8", ["input 'x' dim 1 = 4", "the model's input has 3 there"]),
    ("z:2,3", ["'z'", "not an input of the model", "x [batch, 3, 8, 8]"]),
    ("x:N,3,8,8", ["input 'x'", "a run needs a size"]),
    ("x:-1,3,8,8", ["input 'x'", "a run needs a size"]),
    ("x2,3,8,8", ["name:d1,d2"]),
])
def test_run_input_shape_must_agree_with_the_model(shared, spec, needles):
    _, om = shared
    assert_clean_error(ge_cli("run", om, "--random", "--input-shape", spec), *needles)


def test_run_feeds_from_a_file_size_the_random_inputs(shared, tmp_path):
    m, om = shared
    x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o"
    r = ge_cli("run", om, "--input", f"x={tmp_path / 'x.npy'}", "--random", "--output-dir", out, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outputs"]["out"]["shape"] == [4, 3]  # y took x's batch from the file
    # a shape for an input the file feeds is refused: the file's array has its own
    assert_clean_error(ge_cli("run", om, "--input", f"x={tmp_path / 'x.npy'}", "--input-shape", "x:4,3,8,8"),
                       "--input-shape names 'x'", "--input feeds")


def test_run_unknown_dim_needs_a_shape(tmp_path):
    m = _unknown_dim_model()
    om = str(tmp_path / "u.om")
    ge.compile(ge.load(m)).save(om)
    r = ge_cli("run", om, "--random")
    assert_clean_error(r, "input 'x' [", '--input-shape "x:1,4"')
    # the dim is shown as unknown ('?') or as the symbol the compiler gave it
    assert "'x' [?, 4]" in r.stderr or "'x' [x_0, 4]" in r.stderr, r.stderr
    r = ge_cli("run", om, "--random", "--input-shape", "x:5,4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outputs"]["y"]["shape"] == [5, 4]


def test_static_model_runs_random_as_before(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "static",
                          [helper.make_tensor_value_info("x", F32, [2, 3])], [helper.make_tensor_value_info("y", F32, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    om = str(tmp_path / "s.om")
    ge.compile(ge.load(m)).save(om)
    r = ge_cli("run", om, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["outputs"]["y"]["shape"] == [2, 3]
    assert_clean_error(ge_cli("run", om, "--input-shape", "x:2,4"), "input 'x' dim 1 = 4")


# ------------------------------------------------------------------------------------------------
# ge bench
# ------------------------------------------------------------------------------------------------
def test_bench_takes_input_shape(shared, capsys):
    from ge_core.cli import main

    _, om = shared
    capsys.readouterr()
    assert main(["bench", om, "--input-shape", "x:3,3,8,8", "--runs", "2", "--warmup", "0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["inputs"]["x"]["shape"] == [3, 3, 8, 8] and r["inputs"]["y"]["shape"] == [3, 3] and r["batch"] == 3
    assert main(["bench", om, "--input-shape", "x:3,3,8,8", "--dim", "batch=2", "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "symbolic dim 'batch'" in err and "input 'x'" in err
    assert main(["bench", om, "--input-shape", "x:3,3,8", "--runs", "1"]) == 2
    assert "[batch, 3, 8, 8]" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# the API: ge_sdk.inputs
# ------------------------------------------------------------------------------------------------
def test_input_shapes_api():
    g = ge.load(_shared_batch_model())
    assert input_shapes(g, {"y": [6, 3]}) == {"x": (6, 3, 8, 8), "y": (6, 3)}
    assert input_shapes(g, dims={"batch": 2}) == {"x": (2, 3, 8, 8), "y": (2, 3)}
    assert input_shapes(g) == {"x": (1, 3, 8, 8), "y": (1, 3)}  # the lenient default: 1
    assert input_shapes(g, known={"x": np.zeros((7, 3, 8, 8))}, default_dim=None)["y"] == (7, 3)
    with pytest.raises(InputError, match=r"'x' \[batch, 3, 8, 8\], 'y' \[batch, 3\] have symbolic") as ei:
        input_shapes(g, default_dim=None, option="shapes=")
    assert 'shapes= "x:1,3,8,8;y:1,3"' in ei.value.hint
    with pytest.raises(InputError, match="symbolic dim 'batch' is 2 in the given dims but 4 in input 'x'"):
        input_shapes(g, {"x": (4, 3, 8, 8)}, {"batch": 2})
    with pytest.raises(OptionError, match="a run needs a size"):
        input_shapes(g, {"x": (None, 3, 8, 8)})
    feeds = random_inputs(g, 0, shapes={"x": (2, 3, 8, 8)}, default_dim=None)
    assert {k: v.shape for k, v in feeds.items()} == {"x": (2, 3, 8, 8), "y": (2, 3)}
    model = ge.compile(g)
    np.testing.assert_allclose(model.run(feeds)["out"], _ort(_shared_batch_model(), feeds)[0], rtol=1e-5, atol=1e-6)
