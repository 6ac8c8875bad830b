"""The Python API a user of onnxruntime/OpenVINO expects: input/output metadata, output
selection, a bare array for a one-input model, run options at load, an async runner with a
bounded queue. Numerics against onnxruntime on the same inputs."""

import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from tests.tools.models import matmul_chain


def _two_outputs(path):
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Tanh", ["y"], ["t"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def model_and_om(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    src = _two_outputs(str(d / "m.onnx"))
    model = ge.compile(src)
    om = model.save(str(d / "m.om"))
    return src, model, om


def _ort(src, x):
    s = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {"x": x})))


def test_inputs_and_outputs_are_node_args_with_symbolic_dims(model_and_om):
    _, model, om = model_and_om
    for m in (model, ge.load_om(om)):
        (x,) = m.inputs
        assert isinstance(x, ge.NodeArg)
        assert (x.name, x.dtype, x.shape) == ("x", np.dtype("float32"), ("batch", 4))
        assert x.symbolic_dims == {0: "batch"}
        assert [(o.name, o.shape) for o in m.outputs] == [("t", ("batch", 3)), ("y", ("batch", 3))]
        with pytest.raises(AttributeError):
            x.name = "z"  # frozen, like onnxruntime's NodeArg


def test_bare_array_and_output_names(model_and_om):
    src, model, om = model_and_om
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    want = _ort(src, x)
    for m in (model, ge.load_om(om)):
        out = m.run(x)  # a bare array for the one input
        assert list(out) == ["t", "y"]
        np.testing.assert_allclose(out["t"], want["t"], rtol=1e-5, atol=1e-6)
        sel = m.run({"x": x}, output_names=["y"])
        assert list(sel) == ["y"]
        np.testing.assert_allclose(sel["y"], want["y"], rtol=1e-5, atol=1e-6)
        assert list(m.run(x, output_names=["y", "t"])) == ["y", "t"]
    with pytest.raises(ge.InputError, match="unknown output.*'tt'.*did you mean"):
        model.run(x, output_names=["tt"])
    with pytest.raises(ge.InputError, match="list of output names"):
        model.run(x, output_names="t")


def test_bare_array_for_a_model_with_an_initializer_input(tmp_path):
    # IR 3 lists initializers as inputs: the bare array goes to the one input without a default
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 3
    onnx.save(m, str(tmp_path / "m.onnx"))
    model = ge.compile(str(tmp_path / "m.onnx"))
    np.testing.assert_array_equal(model.run(np.array([[1, 2]], np.float32))["y"], [[3, 3]])


def test_load_om_takes_run_options(model_and_om):
    src, model, om = model_and_om
    m = ge.load_om(om, threads=2, executor="arena")
    assert m.options.threads == 2 and m.options.extra["executor"] == "arena"
    assert type(m.executable).__name__ != type(ge.load_om(om, executor="sequential").executable).__name__
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(m.run(x)["t"], _ort(src, x)["t"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ge.OptionError, match="executor 'bogus'"):
        ge.load_om(om, executor="bogus")
    with pytest.raises(ge.OptionError, match="opt_level change what was compiled"):
        ge.load_om(om, opt_level=1)
    with pytest.raises(ge.OptionError, match="did you mean: threads"):
        ge.load_om(om, thread=1)
    with pytest.raises(ge.OptionError, match="threads must be a positive integer"):
        ge.load_om(om, threads=0)


def test_run_async_and_async_runner_agree_with_run(tmp_path):
    model = ge.compile(matmul_chain(str(tmp_path / "mm.onnx"), width=64, layers=3))
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal((3, 64)).astype(np.float32) for _ in range(20)]
    want = [model.run(f)["y"] for f in feeds]
    futs = [model.run_async(f) for f in feeds]
    for f, w in zip(futs, want):
        np.testing.assert_array_equal(f.result(timeout=30)["y"], w)
    seen = []
    with ge.AsyncRunner(model, jobs=3, queue=2, callback=lambda out, tag: seen.append(tag)) as runner:
        got = [runner.submit(f, userdata=i) for i, f in enumerate(feeds)]
        for f, w in zip(got, want):
            np.testing.assert_array_equal(f.result(timeout=30)["y"], w)
        assert [r["y"].shape for r in runner.map(feeds[:4])] == [(3, 64)] * 4
    assert sorted(t for t in seen if t is not None) == list(range(20)) and seen.count(None) == 4
    with pytest.raises(ge.InputError, match="closed"):
        runner.submit(feeds[0])
    with pytest.raises(ge.InputError, match="missing input"):
        model.run_async({"nope": feeds[0]})  # a bad feed fails at submit, not inside the future


def test_async_runner_queue_is_bounded(tmp_path):
    model = ge.compile(matmul_chain(str(tmp_path / "mm.onnx"), width=32, layers=1))
    gate = threading.Event()
    running = []

    def slow(out, tag):
        running.append(tag)
        gate.wait(10)

    runner = ge.AsyncRunner(model, jobs=1, queue=2, callback=slow)
    x = np.ones((1, 32), np.float32)
    for i in range(3):  # one running (held in the callback) + two queued: all accepted at once
        runner.submit(x, userdata=i)
    blocked = threading.Thread(target=runner.submit, args=(x,), kwargs={"userdata": 3})
    blocked.start()
    time.sleep(0.3)
    assert blocked.is_alive(), "a fourth request must wait for a free slot (jobs 1 + queue 2)"
    gate.set()
    blocked.join(10)
    assert not blocked.is_alive()
    runner.close()
    assert sorted(running) == [0, 1, 2, 3]
    with pytest.raises(ge.InputError, match="jobs"):
        ge.AsyncRunner(model, jobs=0)


def test_with_outputs_exposes_intermediate_tensors(model_and_om):
    src, model, om = model_and_om
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    m = ge.load_om(om)
    every = m.with_outputs()
    assert every.output_names[:2] == ["t", "y"]
    out = every.run(x)
    want = _ort(src, x)
    for k in ("t", "y"):
        np.testing.assert_allclose(out[k], want[k], rtol=1e-5, atol=1e-6)
    assert list(m.with_outputs(["y"], executor="sequential").run(x)) == ["t", "y"]
    with pytest.raises(ge.InputError, match="no node of the compiled graph computes 'yy'"):
        m.with_outputs(["yy"])
