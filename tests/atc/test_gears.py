"""ATC's gears: ``--dynamic_batch_size``, ``--dynamic_image_size``, ``--dynamic_dims``.

GE's rules, as its documentation and source state them:

* hiascend ATC pages "--dynamic_batch_size" (atlasatcparam_16_0018; aoerc_16_0027 in English):
  used with --input_shape, not with --dynamic_image_size / --dynamic_dims / --input_shape_range;
  only N first (set to -1), else use --dynamic_dims; 2 to 100 gears ("(1,100]"); the example
  ``--input_shape="data:-1,3,416,416;img_info:-1,4" --dynamic_batch_size="1,2,4,8"`` gives every
  input with a -1 batch the gear's value.
* graphengine ge/ir_build/atc_ir_common.cc: CheckDynamicInputParamValid (the flags are mutually
  exclusive: E10009; input_shape required: E10004), CheckDynamicBatchSizeInputShapeValid (some
  input's N is -1: E10031; digits, commas and spaces only), CheckDynamicImagesizeInputShapeValid
  (4-D, -1 only at H and W: E10019; two values per gear: E10020), CheckDynamicDimsInputShapeValid
  (input_format ND; 1 to 4 dims per input; some -1) and CheckAndParseDynamicDims (at most 100
  gears; "each gear setting needs to be consistent with the number of -1 in the inputshape";
  positive integers).
* graphengine ge/graph/preprocess/multi_batch_options.cc: CheckDynamicParams (kMinShapesCount 2,
  kMaxShapesCount 100: E10035/E10036; same size per gear: E10037; dims > 0: E10038; duplicate
  shapes: E10039) and ParserDataToDynamicInfo (dynamic_dims values are taken in order across the
  inputs of --input_shape).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import InputError, ModelFileError, OmFormatError, OptionError
from ge_core.om_container import read_container, write_container
from ge_sdk.omdesc import inspect_om

from .conftest import ort_run, save_model


def cnn(path, seed: int = 0) -> str:
    """x[N,3,H,W] -> Conv(8)+Relu -> Conv(4, stride 2)+Relu -> MaxPool -> y, random weights."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 3, 3)) * 0.1).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    return save_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def matmul_net(path) -> str:
    """(a[M,K] @ b[K,8]) @ w[8,4] -> y: two inputs whose -1 dims one --dynamic_dims gear fills in order."""
    w = numpy_helper.from_array(np.random.default_rng(4).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("MatMul", ["m", "w"], ["y"])]
    return save_model(path, nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", "K"]),
                                    helper.make_tensor_value_info("b", TensorProto.FLOAT, ["K", 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])


def _compile(atc, tmp_path, src, *flags) -> str:
    rc, _, err = atc(f"--model={src}", "--framework=5", f"--output={tmp_path / 'g'}", *flags)
    assert rc == 0, err
    return str(tmp_path / "g.om")


def _check_gears(om: str, src: str, feeds_per_gear: list[dict[str, tuple]]) -> ge.CompiledModel:
    """Each gear's output matches onnxruntime, and each gear has a static arena plan."""
    model = ge.load_om(om)
    assert len(model.models) == len(feeds_per_gear)
    rng = np.random.default_rng(1)
    for i, shapes in enumerate(feeds_per_gear):
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        got = model.run(feeds)["y"]
        np.testing.assert_allclose(got, ort_run(src, feeds)[0], rtol=1e-4, atol=1e-5)
        gear = model.gear(i)
        assert [tuple(v.type.shape) for v in gear.graph.inputs] == list(shapes.values())  # a static model
        mem = gear.report["memory"]
        assert mem["arena_bytes"] > 0 and mem.get("dynamic_buffers", 0) == 0, mem
        assert gear.memory_plan is not None and gear.memory_plan.arena_bytes == mem["arena_bytes"]
    arenas = [g.report["memory"]["arena_bytes"] for g in model.models]
    assert model.report["memory"]["arena_bytes"] == max(arenas)
    return model


def test_dynamic_batch_size_one_static_model_per_gear_sharing_weights(tmp_path, atc):
    src = cnn(tmp_path / "cnn.onnx")
    om = _compile(atc, tmp_path, src, "--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2,4")
    model = _check_gears(om, src, [{"x": (b, 3, 16, 16)} for b in (1, 2, 4)])
    arenas = [g.report["memory"]["arena_bytes"] for g in model.models]
    assert arenas[0] < arenas[1] < arenas[2]  # each gear planned for its own shapes
    assert model.inputs[0].shape == ("batch", 3, 16, 16) and model.input_names == ["x"]
    assert model.outputs[0].shape == ("?", 4, 4, 4)
    # the gears share their weights: the weights partition holds each constant once
    parts = {p["kind"]: p["size"] for p in inspect_om(om)["file"]["partitions"]}
    one = model.gear(0).report["memory"]["weights_bytes"]
    assert set(parts) == {"model", "gears", "weights"} and one <= parts["weights"] < 1.5 * one
    # a feed outside the gears names the input, its shape and the gears
    with pytest.raises(InputError) as e:
        model.run({"x": np.zeros((3, 3, 16, 16), np.float32)})
    assert "input 'x' has shape [3, 3, 16, 16]; this model was compiled for the gears batch 1, 2, 4 " \
           "(--dynamic_batch_size)" in str(e.value)
    with pytest.raises(InputError, match="gears batch 1, 2, 4"):
        model.run(np.zeros((2, 3, 17, 16), np.float32))  # a bare array too
    # saved again (GearModel.save) it loads and computes the same
    x = np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(np.float32)
    again = ge.load_om(model.save(tmp_path / "again.om"))
    np.testing.assert_array_equal(again.run({"x": x})["y"], model.run({"x": x})["y"])


def test_dynamic_image_size_gears(tmp_path, atc):
    src = cnn(tmp_path / "cnn.onnx", seed=2)
    om = _compile(atc, tmp_path, src, "--input_shape=x:2,3,-1,-1", "--dynamic_image_size=16,16;24,32;32,8")
    model = _check_gears(om, src, [{"x": (2, 3, 16, 16)}, {"x": (2, 3, 24, 32)}, {"x": (2, 3, 32, 8)}])
    assert model.inputs[0].shape == (2, 3, "height", "width")
    with pytest.raises(InputError, match=r"\[2, 3, 16, 32\]; this model was compiled for the gears image size "
                                         r"16x16, 24x32, 32x8 \(--dynamic_image_size\)"):
        model.run({"x": np.zeros((2, 3, 16, 32), np.float32)})


def test_dynamic_dims_fill_the_minus_ones_in_order_across_inputs(tmp_path, atc):
    src = cnn(tmp_path / "cnn.onnx", seed=3)
    om = _compile(atc, tmp_path, src, "--input_shape=x:-1,3,-1,16", "--dynamic_dims=1,16;2,32", "--input_format=ND")
    _check_gears(om, src, [{"x": (1, 3, 16, 16)}, {"x": (2, 3, 32, 16)}])
    src = matmul_net(tmp_path / "mm.onnx")
    om = _compile(atc, tmp_path, src, "--input_shape=a:-1,-1;b:-1,8", "--dynamic_dims=2,16,16;3,32,32")
    model = _check_gears(om, src, [{"a": (2, 16), "b": (16, 8)}, {"a": (3, 32), "b": (32, 8)}])
    assert [a.shape for a in model.inputs] == [("dim0", "dim1"), ("dim2", 8)]
    with pytest.raises(InputError, match="input 'a' has shape \\[2, 32\\]; this model was compiled for the gears "
                                         "dims 2,16,16; 3,32,32 \\(--dynamic_dims\\)"):
        model.run({"a": np.zeros((2, 32), np.float32), "b": np.zeros((32, 8), np.float32)})
    with pytest.raises(InputError, match="input 'a' has shape \\[2, 16\\], 'b' has shape \\[32, 8\\]; "):
        model.run({"a": np.zeros((2, 16), np.float32), "b": np.zeros((32, 8), np.float32)})  # each of some gear


def _atc_error(tmp_path, src, *flags) -> str:
    from ge_atc.cli import build_atc_parser, run

    args = build_atc_parser().parse_args([f"--model={src}", f"--output={tmp_path / 'bad'}", *flags])
    with pytest.raises(OptionError) as e:
        run(args)
    assert not (tmp_path / "bad.om").exists()
    return str(e.value)


BAD = [
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2", "--dynamic_dims=1;2"], "cannot be used together"),
    (["--dynamic_image_size=16,16;24,24", "--dynamic_dims=1;2", "--input_shape=x:1,3,-1,-1"], "cannot be used together"),
    (["--dynamic_batch_size=1,2"], "needs --input_shape with -1"),
    (["--input_shape=x:1,3,16,16", "--dynamic_batch_size=1,2"], "has no -1 dim"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size="], "is empty"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size=4"], "1 gear(s) given; GE takes 2 to 100"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size=" + ",".join(map(str, range(1, 102)))],
     "101 gear(s) given; GE takes 2 to 100"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,0"], "'0' is not a positive integer"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,-2"], "'-2' is not a positive integer"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2.5"], "'2.5' is not a positive integer"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2,2"], "given twice"),
    (["--input_shape=x:-1,3,-1,16", "--dynamic_batch_size=1,2"], "beyond the batch dim"),
    (["--input_shape=x:1~4,3,16,16", "--dynamic_batch_size=1,2"], "a shape range cannot be combined with gears"),
    (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=16;24"], "has 1 value(s); each gear needs 2"),
    (["--input_shape=x:-1,3,16,16", "--dynamic_image_size=16,16;24,24"], "-1 exactly at its height and width"),
    (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=16,16;16,16"], "given twice"),
    (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=16,16"], "1 gear(s) given"),
    (["--input_shape=x:-1,3,-1,16", "--dynamic_dims=1;2"], "has 1 value(s); each gear needs 2"),
    (["--input_shape=x:-1,3,-1,16", "--dynamic_dims=1,16;2,32", "--input_format=NCHW"], "--input_format=ND only"),
    (["--input_shape=x:-1,3,-1,16", "--dynamic_dims=1,16;1,16"], "given twice"),
    (["--input_shape=x:-1,3,-1,16", "--dynamic_dims=1,16;0,32"], "'0' is not a positive integer"),
    (["--input_shape=x:-1,3,-1,16,1", "--dynamic_dims=1,16;2,32"], "GE takes 1 to 4 dims"),
]


@pytest.mark.parametrize("flags,needle", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_gear_flags_are_option_errors_naming_the_flag(tmp_path, flags, needle):
    src = cnn(tmp_path / "cnn.onnx")
    msg = _atc_error(tmp_path, src, *flags)
    assert needle in msg and "atc --dynamic_" in msg, msg


def test_ge_inspect_and_run_show_the_gears(tmp_path, atc, capsys):
    from ge_core.cli import main

    src = cnn(tmp_path / "cnn.onnx")
    om = _compile(atc, tmp_path, src, "--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2,4")
    assert main(["inspect", om]) == 0
    out = capsys.readouterr().out
    assert "gears:   batch 1, 2, 4 (--dynamic_batch_size)" in out and "x[4, 3, 16, 16]" in out
    assert main(["inspect", om, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    gears = info["gears"]["list"]
    assert [g["label"] for g in gears] == ["1", "2", "4"] and [g["shapes"]["x"][0] for g in gears] == [1, 2, 4]
    assert all(g["arena_bytes"] > 0 and g["report"]["memory"]["dynamic_buffers"] == 0 for g in gears)
    assert info["model"]["output_types"][0]["name"] == "y"
    assert main(["run", om, "--random", "--gear", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["outputs"]["y"]["shape"] == [2, 4, 4, 4] and "gear 1 (batch 2)" in captured.err
    assert main(["run", om, "--json"]) == 0  # the first gear by default
    assert json.loads(capsys.readouterr().out)["outputs"]["y"]["shape"] == [1, 4, 4, 4]
    assert main(["run", om, "--gear", "3"]) == 2 and "gears 0..2" in capsys.readouterr().err
    rc, out, _ = atc("--mode=6", f"--om={om}")
    assert rc == 0 and "dynamic  info: --dynamic_batch_size gears 1[" in out


def _tamper(om: str, out: str, edit) -> str:
    with read_container(om) as c:
        head = json.loads(bytes(c.partition("model")))
        edit(head)
        parts = [("model", json.dumps(head).encode(), 8), ("gears", bytes(c.partition("gears")), 8),
                 ("weights", bytes(c.partition("weights")), 4096)]
    write_container(out, parts, producer="tampered")
    return out


def _set(path, value):
    def edit(head):
        *keys, last = path
        d = head
        for k in keys:
            d = d[k]
        d[last] = value(d[last]) if callable(value) else value
    return edit


TAMPERED = [
    ("a gear shape changed", _set(["gears", 1, "shapes", "x", 0], 3), "gear table says [3, 3, 16, 16]"),
    ("a duplicate gear", _set(["gears", 1, "shapes"], lambda s: {"x": [1, 3, 16, 16]}), "are the same"),
    ("too many gears", _set(["gears"], lambda g: g * 34), "102 gears"),
    ("one gear", _set(["gears"], lambda g: g[:1]), "1 gears"),
    ("a dim that is text", _set(["gears", 0, "shapes", "x", 1], "3"), "not a list of at most"),
    ("a negative dim", _set(["gears", 2, "shapes", "x", 2], -16), "dims are integers 1.."),
    ("a huge dim", _set(["gears", 2, "shapes", "x", 2], 2**63 - 1), "dims are integers 1.."),
    ("a non-gear axis that differs", _set(["gears", 2, "shapes", "x", 1], 4), "only the gear axes [0] may differ"),
    ("an axis beyond the rank", _set(["inputs", 0, "axes"], [7]), "gear axes [7]"),
    ("an unknown flag", _set(["flag"], "dynamic_magic"), "unknown gear flag"),
    ("an input the gears do not give", _set(["inputs", 0, "name"], "z"), "the gear inputs are ['z']"),
    ("wrong definition sizes", _set(["gears", 0, "bytes"], lambda n: n + 1), "do not add up"),
    ("no gear list", _set(["gears"], {"a": 1}), "a list of gears"),
]


@pytest.mark.parametrize("what,edit,needle", TAMPERED, ids=[t[0] for t in TAMPERED])
def test_a_tampered_gear_table_is_an_om_format_error(tmp_path, atc, what, edit, needle):
    src = cnn(tmp_path / "cnn.onnx")
    om = _compile(atc, tmp_path, src, "--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2,4")
    bad = _tamper(om, str(tmp_path / "bad.om"), edit)
    for load in (ge.load_om, inspect_om):
        with pytest.raises(OmFormatError) as e:
            load(bad)
        assert needle in str(e.value), (what, str(e.value))


def test_gear_weights_can_live_beside_the_om(tmp_path, atc):
    src = cnn(tmp_path / "cnn.onnx")
    om = _compile(atc, tmp_path, src, "--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2",
                  "--external_weight=2")
    assert len(list((tmp_path / "weight").iterdir())) == 1
    _check_gears(om, src, [{"x": (1, 3, 16, 16)}, {"x": (2, 3, 16, 16)}])


def test_a_gear_om_without_ge_atc_names_the_plugin_it_needs(tmp_path, atc, monkeypatch):
    from ge_core import plugins
    from ge_core.om import stored_definition

    def definition(path):
        with read_container(path) as c:
            return stored_definition(path, c, plugins.get_host())

    src = cnn(tmp_path / "cnn.onnx")
    om = _compile(atc, tmp_path, src, "--input_shape=x:-1,3,16,16", "--dynamic_batch_size=1,2")
    monkeypatch.setenv("GE_DISABLE_PLUGINS", "ge_atc")
    old = plugins.reset_host(plugins.PluginHost())
    try:
        assert "gears" not in plugins.get_host().registries.om_kinds
        for load in (ge.load_om, inspect_om, definition):
            with pytest.raises(ModelFileError) as e:
                load(om)
            assert f"'{om}' holds a 'gears' partition, which no installed plugin reads: it needs the plugin " \
                   "ge_atc (gear models" in str(e.value) and "GE_DISABLE_PLUGINS" in str(e.value)
    finally:
        plugins.reset_host(old)
