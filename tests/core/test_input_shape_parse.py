"""``--input-shape`` / ATC's ``--input_shape`` refuse malformed dims instead of making them symbol
names (issue #47): a symbol is an identifier, ``1-8`` and ``1..8`` are refused with "did you
mean 1~8", brackets are taken around the whole list only, a fixed batch of 0 is refused; a range
may start at 0 (an empty past), and such a model runs at 0 and above."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import ge_core as ge
from ge_core.cli import main
from ge_core.errors import OptionError
from ge_core.options import parse_input_shape
from tests.atc.conftest import run_atc, save_model

MALFORMED = [
    ("x:1-8,3,8,8", "did you mean 1~8"),
    ("x:1..8,3,8,8", "did you mean 1~8"),
    ("x:1 .. 8,3,8,8", "did you mean 1~8"),
    ("x:[1,3],8,8", "'[1'"),
    ("x:1,3,8,8]", "'8]'"),
    ("x:1,3,8 8,8", "'8 8'"),
    ("x:n-1,3,8,8", "'n-1'"),
    ("x:0,3,8,8", "a batch of 0"),
    ("x:0~4,3,8,8", "a batch of 0"),
]


def _net(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return save_model(tmp_path / "m.onnx", [helper.make_node("Relu", ["x"], ["y"])], [x], [y])


@pytest.mark.parametrize("text,message", MALFORMED)
def test_malformed_dims_are_refused_by_the_parser_and_the_api(tmp_path, text, message):
    with pytest.raises(OptionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_input_shape(text)
    with pytest.raises(OptionError, match="input_shape of 'x'"):
        ge.compile(_net(tmp_path), input_shape=text)


@pytest.mark.parametrize("text,message", MALFORMED)
def test_malformed_dims_fail_the_cli(tmp_path, capsys, text, message):
    src = _net(tmp_path)
    assert main(["compile", src, "--input-shape", text, "-o", str(tmp_path / "m.om"), "-q"]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m.om").exists()
    rc, _, err = run_atc(f"--model={src}", "--framework=5", f"--input_shape={text}", f"--output={tmp_path / 'a'}",
                         capsys=capsys)
    assert rc != 0 and message in err


def test_well_formed_dims_still_parse():
    assert parse_input_shape("x:[1,3,224,224]") == {"x": (1, 3, 224, 224)}
    assert parse_input_shape("x: [ 2 , 3 ] ;y:batch,-1,?") == {"x": (2, 3), "y": ("batch", None, None)}
    assert parse_input_shape({"x": ["seq_len", 4]}) == {"x": ("seq_len", 4)}
    assert parse_input_shape("past:1,4,0~512,64")["past"][2] == (0, 512)
    assert parse_input_shape("x:1,3,0") == {"x": (1, 3, 0)}  # (an empty tensor past the batch axis)
    with pytest.raises(OptionError, match="0 <= lo"):
        parse_input_shape("x:-2~4,3")


def test_a_bracketed_list_compiles_static(tmp_path):
    m = ge.compile(_net(tmp_path), input_shape="x:[2,3,8,8]")
    assert m.graph.inputs[0].type.shape == (2, 3, 8, 8)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(m.run(x)["y"], np.maximum(x, 0))


def test_a_range_from_0_compiles_and_runs_an_empty_past(tmp_path):
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 4, "p", 8])
    cur = helper.make_tensor_value_info("cur", TensorProto.FLOAT, [1, 4, 1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Concat", ["past", "cur"], ["y"], axis=2),
             helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)]
    src = save_model(tmp_path / "kv.onnx", nodes, [past, cur], [y, s])
    m = ge.compile(src, input_shape="past:1,4,0~16,8;cur:1,4,1,8")
    rng = np.random.default_rng(1)
    c = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    for n in (0, 3):
        p = rng.standard_normal((1, 4, n, 8)).astype(np.float32)
        out = m.run({"past": p, "cur": c})
        want = np.concatenate([p, c], axis=2)
        np.testing.assert_array_equal(out["y"], want)
        np.testing.assert_allclose(out["s"], want.sum(), rtol=1e-5)
    with pytest.raises(ge.GEError):
        m.run({"past": np.zeros((1, 4, 17, 8), np.float32), "cur": c})
