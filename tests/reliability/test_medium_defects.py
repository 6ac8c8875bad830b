"""The "Medium" defects of issue 42.

* pooling with ``ceil_mode=1`` whose last window would start in the end padding: the inferred
  type follows onnxruntime (the window is dropped), on the plain and the blocked kernels;
* a crafted .om whose blocked convolution's attributes contradict its packed weight is refused
  at load (OmFormatError naming the node);
* gear models (ATC's ``--dynamic_batch_size``) work with ``ge profile``, ``ge bench
  --concurrency``, ``AsyncRunner`` and ``ge run --dump-tensors`` through the public interface;
* validation: ``arena_bytes_at`` symbol values, the ``threads`` and ``max_streams`` ranges,
  ``force_fp16`` overflow of a weight;
* a Loop's default iteration limit ends a runaway trivial loop quickly, naming the option.
"""

from __future__ import annotations

import copy
import os
import sys

import numpy as np
import onnx
import onnxruntime as ORT
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import GEError, OmFormatError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fuzz"))
from fuzz_targets import read_om, write_om  # noqa: E402


def _ort(model: onnx.ModelProto, feeds: dict) -> list:
    sess = ORT.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ------------------------------------------------------------------------------------------------
# 1. ceil_mode pooling
# ------------------------------------------------------------------------------------------------
def _pool_model(op: str, shape, k, s, pads, dil=None, opset=19, **extra) -> onnx.ModelProto:
    attrs = dict(kernel_shape=k, strides=s, pads=pads, ceil_mode=1, **extra)
    if dil is not None:
        attrs["dilations"] = dil
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    g = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


# (shape, kernel, strides, pads, dilations): every one has a last ceil window that would start in
# the end padding, or one that starts inside the input and is kept
POOL_GEOMETRIES = [
    ([1, 2, 5], [2], [2], [1, 1], None),
    ([1, 2, 6], [3], [3], [0, 2], None),
    ([1, 1, 7], [3], [3], [1, 2], None),
    ([1, 1, 9], [2], [2], [0, 0], None),  # kept: it starts inside the input
    ([2, 3, 5, 7], [2, 2], [2, 2], [1, 1, 1, 1], None),
    ([1, 2, 6, 6], [3, 2], [2, 3], [1, 0, 2, 1], None),
    ([1, 1, 8, 8], [3, 3], [3, 3], [0, 0, 2, 2], None),
    ([1, 2, 6, 6], [2, 2], [3, 2], [0, 1, 1, 1], [2, 1]),
]


POOL_OPS = [("MaxPool", {}), ("AveragePool", {}), ("AveragePool", {"count_include_pad": 1}), ("LpPool", {"p": 2})]


@pytest.mark.parametrize("op, attrs", POOL_OPS, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
@pytest.mark.parametrize("geometry", POOL_GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])) + f"k{g[1]}s{g[2]}p{g[3]}d{g[4]}")
def test_ceil_mode_pool_matches_onnxruntime(op, attrs, geometry):
    shape, k, s, pads, dil = geometry
    model = _pool_model(op, shape, k, s, pads, dil, **attrs)
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    want = _ort(model, {"x": x})[0]
    compiled = ge.compile(ge.load(model))
    assert tuple(compiled.graph.outputs[0].type.shape) == want.shape  # the inferred type
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_ceil_mode_pool_with_symbolic_dims_matches_onnxruntime():
    model = _pool_model("MaxPool", ["N", 2, "W"], [2], [2], [1, 1])
    compiled = ge.compile(ge.load(model))
    for w in (4, 5, 6, 7):
        x = np.random.default_rng(w).standard_normal((1, 2, w)).astype(np.float32)
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], _ort(model, {"x": x})[0])


def _convs_then_pool(pool_attrs: dict, hw: int = 9) -> onnx.ModelProto:
    """Four 3x3 convolutions (enough for the blocked layout) and a pool, NCHW 16 channels."""
    rng = np.random.default_rng(3)
    inits, nodes, cur = [], [], "x"
    for i, (c, m) in enumerate([(16, 32), (32, 32), (32, 32), (32, 32)]):
        inits.append(numpy_helper.from_array((rng.standard_normal((m, c, 3, 3)) / 10).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [cur, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        cur = f"r{i}"
    if pool_attrs:
        nodes.append(helper.make_node("MaxPool", [cur], ["y"], name="pool", **pool_attrs))
    else:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("pool", [dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=1),
                                  dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
                                  dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)])
def test_ceil_mode_max_pool_in_the_blocked_layout_saves_and_matches(tmp_path, pool):
    model = _convs_then_pool(pool)
    x = np.random.default_rng(5).standard_normal((1, 16, 9, 9)).astype(np.float32)
    want = _ort(model, {"x": x})[0]
    compiled = ge.compile(ge.load(model))
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    loaded = ge.load_om(compiled.save(tmp_path / "m.om"))  # (a blocked ceil pool could not be saved)
    np.testing.assert_allclose(loaded.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# 2. a blocked convolution's attributes against its packed weight
# ------------------------------------------------------------------------------------------------
def _ints(*v):
    return {"list": [{"i": i} for i in v]}


@pytest.fixture(scope="module")
def blocked_om(tmp_path_factory):
    from ge_native import nchwc

    if not nchwc.available():
        pytest.skip("the blocked (NCHWc) kernels need AVX-512F or AVX2+FMA and a C compiler")
    compiled = ge.compile(ge.load(_convs_then_pool({})))
    path = str(compiled.save(tmp_path_factory.mktemp("om") / "blocked.om"))
    d, blob = read_om(path)
    convs = [i for i, n in enumerate(d["graph"]["nodes"]) if n.get("op") == "NchwcConv"]
    assert convs, "the model did not run in the blocked layout"
    return d, blob, convs


TAMPERS = {
    # the output shape the attributes give is still the stored one: only the weight contradicts
    "kernel_shape 1x1, no pads": ({"kernel_shape": _ints(1, 1), "pads": _ints(0, 0, 0, 0)}, "kernel_shape"),
    "kernel_shape 5x5, pads 2": ({"kernel_shape": _ints(5, 5), "pads": _ints(2, 2, 2, 2)}, "kernel_shape"),
    "dilations 2, pads 2": ({"dilations": _ints(2, 2), "pads": _ints(2, 2, 2, 2)}, "weight_packing"),
    "group 2": ({"group": {"i": 2}}, "group"),
    "weight_shape of fewer channels": ({"weight_shape": _ints(16, 16, 3, 3)}, "floats"),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_blocked_conv_attributes_that_contradict_the_weight_are_refused(tmp_path, blocked_om, tamper):
    d0, blob, convs = blocked_om
    change, what = TAMPERS[tamper]
    for i in convs[:2]:
        d = copy.deepcopy(d0)
        node = d["graph"]["nodes"][i]
        node["attrs"].update(change)
        path = str(tmp_path / "bad.om")
        write_om(path, d, blob)
        with pytest.raises(OmFormatError, match=rf"node '{node['name']}' \(ge\.cpu::NchwcConv\).*{what}"):
            ge.load_om(path)


def test_the_untampered_blocked_om_loads_and_runs(blocked_om, tmp_path):
    d, blob, _ = blocked_om
    path = str(tmp_path / "ok.om")
    write_om(path, d, blob)
    x = np.random.default_rng(1).standard_normal((1, 16, 9, 9)).astype(np.float32)
    want = _ort(_convs_then_pool({}), {"x": x})[0]
    np.testing.assert_allclose(ge.load_om(path).run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_fused_conv_kernel_shape_that_contradicts_the_weight_is_refused(tmp_path):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) / 10).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    compiled = ge.compile(ge.load(m))
    d0, blob = read_om(str(compiled.save(tmp_path / "f.om")))
    i = next(i for i, n in enumerate(d0["graph"]["nodes"]) if n.get("op") == "FusedConv")
    for change, what in (({"kernel_shape": _ints(1, 1), "pads": _ints(0, 0, 0, 0)}, "kernel_shape"),
                         ({"group": {"i": 2}}, "group")):
        d = copy.deepcopy(d0)
        d["graph"]["nodes"][i]["attrs"].update(change)
        write_om(str(tmp_path / "bad.om"), d, blob)
        with pytest.raises(OmFormatError, match=rf"FusedConv.*{what}"):
            ge.load_om(str(tmp_path / "bad.om"))


# ------------------------------------------------------------------------------------------------
# 3. gear models through the tools
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gear_om(tmp_path_factory):
    """A batch-gear model (atc --dynamic_batch_size=1,2,4) of a small CNN, and its source."""
    from ge_atc.cli import main as atc

    d = tmp_path_factory.mktemp("gears")
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 3, 3)) * 0.1).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    src = str(d / "cnn.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    rc = atc(["--model=" + src, "--framework=5", f"--output={d / 'g'}", "--input_shape=x:-1,3,8,8",
              "--dynamic_batch_size=1,2,4"])
    assert rc == 0
    return str(d / "g.om"), onnx.load(src)


def _batch(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)


def test_async_runner_and_run_async_on_a_gear_model(gear_om):
    om, src = gear_om
    model = ge.load_om(om)
    feeds = [{"x": _batch(n, n)} for n in (1, 2, 4, 2)]
    with ge.AsyncRunner(model, jobs=2) as runner:
        got = runner.map(feeds)
        assert runner.submit({"x": _batch(4)}, output_names=["y"]).result()["y"].shape[0] == 4
        with pytest.raises(ge.InputError, match="gears"):
            runner.submit({"x": _batch(3)})
    for f, out in zip(feeds, got):
        np.testing.assert_allclose(out["y"], _ort(src, f)[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.run_async({"x": _batch(2)}).result()["y"], _ort(src, {"x": _batch(2)})[0],
                               rtol=1e-4, atol=1e-5)


def test_gear_model_has_the_public_interface_tools_use(gear_om):
    om, _ = gear_om
    model = ge.load_om(om)
    x = _batch(2)
    assert model.model_for({"x": x}) is model.gear(1)
    assert model.check_feeds({"x": x})["x"] is not None and model.check_output_names(["y"]) == ["y"]
    assert model.registries is not None
    single = model.gear(1)
    assert single.model_for({"x": x}) is single and single.check_feeds(x)["x"].shape == (2, 3, 8, 8)


def test_ge_profile_on_a_gear_model(gear_om, tmp_path, capsys):
    from ge_core.cli import main

    om, _ = gear_om
    trace = tmp_path / "t.json"
    assert main(["profile", om, "--runs", "1", "--trace", str(trace), "--json"]) == 0
    import json

    result = json.loads(capsys.readouterr().out)
    assert result["nodes"] and trace.exists()
    np.save(tmp_path / "x4.npy", _batch(4))  # an input of gear 2: that gear is profiled
    assert main(["profile", om, "--runs", "1", "--trace", str(trace), "--json", "--input", f"x={tmp_path / 'x4.npy'}"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"]


def test_ge_bench_with_concurrency_on_a_gear_model(gear_om, capsys):
    from ge_core.cli import main

    om, _ = gear_om
    assert main(["bench", om, "--concurrency", "2", "--runs", "4", "--warmup", "0", "--json"]) == 0
    import json

    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["engines"]["ge"]["runs"] == 4


@pytest.mark.parametrize("gear", [0, 1])
def test_ge_run_dump_tensors_on_a_gear_model(gear_om, tmp_path, gear, capsys):
    import json

    from ge_core.cli import main

    om, src = gear_om
    dump = tmp_path / f"dump{gear}"
    assert main(["run", om, "--random", "--gear", str(gear), "--dump-tensors", str(dump), "--json"]) == 0
    index = json.loads((dump / "index.json").read_text())
    outs = [e for e in index if e["output"]]
    assert [e["name"] for e in outs] == ["y"] and outs[0]["shape"][0] == (1, 2)[gear]
    assert len(index) > 1  # the intermediate tensors too


# ------------------------------------------------------------------------------------------------
# 4. validation
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def symbolic_model():
    from ge_sdk import GraphBuilder

    b = GraphBuilder("sym")
    x = b.input("x", "float32", ("batch", 8))
    b.output(b.op("Relu", b.op("Neg", b.op("Exp", x))))
    return ge.compile(b.graph, {"opt_level": 0})


@pytest.mark.parametrize("dims", [None, "batch", 7, ["batch"], {"batch": "7"}, {"batch": 2.5}, {"batch": True},
                                  {"batch": -1}, {"batch": None}, {1: 4}])
def test_arena_bytes_at_refuses_what_is_not_a_dict_of_ints(symbolic_model, dims):
    with pytest.raises(ge.InputError, match="arena_bytes_at"):
        symbolic_model.arena_bytes_at(dims)


def test_arena_bytes_at_takes_ints(symbolic_model):
    small, big = symbolic_model.arena_bytes_at({"batch": 1}), symbolic_model.arena_bytes_at({"batch": np.int64(64)})
    assert 0 < small <= big


@pytest.mark.parametrize("option, value", [("threads", 1_000_000_000), ("threads", 0), ("threads", -3), ("threads", True),
                                           ("threads", 2.5), ("threads", "many"), ("max_streams", -5),
                                           ("max_streams", 0), ("max_streams", 10**9), ("max_stream_nodes", -1)])
def test_thread_and_stream_options_have_sane_ranges(option, value):
    from ge_sdk import GraphBuilder

    b = GraphBuilder("g")
    b.output(b.op("Relu", b.input("x", "float32", (2,))))
    with pytest.raises(ge.OptionError, match=rf"option {option} .*must be"):
        ge.compile(b.graph, {option: value})


def test_in_range_thread_and_stream_options_are_taken():
    from ge_sdk import GraphBuilder

    b = GraphBuilder("g")
    b.output(b.op("Relu", b.input("x", "float32", (2,))))
    m = ge.compile(b.graph, {"threads": 2, "max_streams": 2, "max_stream_nodes": 0})
    assert m.options.threads == 2 and m.options.extra["max_streams"] == 2
    with pytest.raises(ge.OptionError, match="option threads"):
        m.set_run_options(threads=10**9)


def test_force_fp16_of_a_weight_beyond_float16_names_it(tmp_path):
    from ge_atc.cli import main as atc

    w = np.ones((4, 4), np.float32)
    w[1, 2] = -1e6
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    src = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    with pytest.raises(GEError, match=r"initializer 'w' \(read by node\(s\) 'mm\w*'\) has values up to \|1e\+06\|, outside the "
                                      r"float16 range \+-65504.*keep_dtype.*allow_mix_precision"):
        ge.compile(ge.load(src), {"precision_mode": "force_fp16"})
    assert atc([f"--model={src}", "--framework=5", f"--output={tmp_path / 'a'}", "--precision_mode=force_fp16"]) != 0
    keep = tmp_path / "keep.txt"
    keep.write_text("mm\n")  # the remedy the message gives
    assert atc([f"--model={src}", "--framework=5", f"--output={tmp_path / 'b'}", "--precision_mode=force_fp16",
                f"--keep_dtype={keep}"]) == 0
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(ge.load_om(str(tmp_path / "b.om")).run({"x": x})["y"], x @ w)
    # a weight inside the range still goes to float16
    w[1, 2] = 60000.0
    g.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    ge.compile(ge.load(src), {"precision_mode": "force_fp16"})


def test_force_fp16_overflow_on_the_command_line_is_an_error_not_a_json_message(tmp_path, capsys):
    from ge_atc.cli import main as atc

    w = np.full((4, 4), 70000.0, np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    src = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    assert atc([f"--model={src}", "--framework=5", f"--output={tmp_path / 'a'}", "--precision_mode=force_fp16"]) != 0
    err = capsys.readouterr().err
    assert "initializer 'w'" in err and "65504" in err and "JSON" not in err


# ------------------------------------------------------------------------------------------------
# 5. a runaway Loop ends quickly by default
# ------------------------------------------------------------------------------------------------
def _loop_model(trips: int) -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "one")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], name="runaway", body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(trips, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_runaway_loop_ends_quickly_by_default_and_names_the_option(monkeypatch):
    import time

    from ge_core.kernel import DEFAULT_MAX_LOOP_ITERATIONS, MAX_LOOP_ITERATIONS_ENV

    monkeypatch.delenv(MAX_LOOP_ITERATIONS_ENV, raising=False)
    assert DEFAULT_MAX_LOOP_ITERATIONS <= 200_000
    model = ge.compile(ge.load(_loop_model(2**62)))
    x = np.zeros(2, np.float32)
    start = time.monotonic()
    with pytest.raises(ge.ExecutionError, match=rf"node 'runaway': the loop ran {DEFAULT_MAX_LOOP_ITERATIONS} iterations, "
                                                rf"the limit \(environment variable {MAX_LOOP_ITERATIONS_ENV}\).*"
                                                rf"set the environment variable {MAX_LOOP_ITERATIONS_ENV}"):
        model.run({"x": x})
    assert time.monotonic() - start < 10  # (about a second; 10 million iterations took minutes)
    # the option raises it: a loop just past the default runs, and agrees with onnxruntime
    monkeypatch.setenv(MAX_LOOP_ITERATIONS_ENV, str(DEFAULT_MAX_LOOP_ITERATIONS + 10))
    longer = _loop_model(DEFAULT_MAX_LOOP_ITERATIONS + 5)
    np.testing.assert_array_equal(ge.compile(ge.load(longer)).run({"x": x})["y"], _ort(longer, {"x": x})[0])


def test_input_shape_selects_the_gear_of_bench_and_run(gear_om, tmp_path, capsys):
    import json

    from ge_core.cli import main

    om, _ = gear_om
    assert main(["bench", om, "--input-shape", "x:4,3,8,8", "--runs", "2", "--warmup", "0", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["inputs"]["x"]["shape"] == [4, 3, 8, 8]
    dump = tmp_path / "d"
    assert main(["run", om, "--input-shape", "x:4,3,8,8", "--dump-tensors", str(dump), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"]["y"]["shape"][0] == 4
    assert next(e for e in json.loads((dump / "index.json").read_text()) if e["output"])["shape"][0] == 4
    assert main(["bench", om, "--input-shape", "x:3,3,8,8", "--runs", "1"]) != 0
    assert "gears batch 1, 2, 4" in capsys.readouterr().err
