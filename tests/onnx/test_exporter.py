"""IR -> ONNX exporter: the exported model passes onnx.checker and onnxruntime agrees with the original."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ge_core.options import CompileOptions

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))


def _load(model):
    from ge_onnx.frontend import OnnxFrontend

    return OnnxFrontend().load(model, CompileOptions())


def _export(graph):
    from ge_onnx.exporter import export_onnx

    return export_onnx(graph)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _session(model):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _random_feeds(model, rng):
    feeds = {}
    inits = {t.name for t in model.graph.initializer}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype == np.bool_:
            feeds[i.name] = np.asarray(rng.random(shape) > 0.5)
        elif np.issubdtype(dtype, np.integer):
            feeds[i.name] = np.asarray(rng.integers(0, 3, size=shape)).astype(dtype)
        else:
            feeds[i.name] = np.asarray(rng.standard_normal(shape)).astype(dtype)
    return feeds


def _roundtrip_compare(model, rng, rtol=1e-5, atol=1e-5):
    g = _load(model)
    exported = _export(g)
    onnx.checker.check_model(exported, full_check=True)
    feeds = _random_feeds(model, rng)
    expected = _session(model).run(None, feeds)
    got = _session(exported).run(None, feeds)
    assert len(expected) == len(got)
    for e, a in zip(expected, got):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
    return exported


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_add_relu(onnx_host):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "w")
    m = _model(
        [helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        [_vi("x", ["N", 2, 3])],
        [_vi("y", ["N", 2, 3])],
        [w],
    )
    exported = _roundtrip_compare(m, rng)
    assert [t.name for t in exported.graph.initializer] == ["w"]
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def test_conv_bn_pool_gemm(onnx_host):
    rng = np.random.default_rng(1)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(f(4, 3, 3, 3), "cw"), numpy_helper.from_array(f(4), "cb"),
        numpy_helper.from_array(f(4), "sc"), numpy_helper.from_array(f(4), "bb"),
        numpy_helper.from_array(f(4), "mean"), numpy_helper.from_array(np.abs(f(4)) + 0.5, "var"),
        numpy_helper.from_array(f(5, 4), "gw"), numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "sc", "bb", "mean", "var"], ["b"], epsilon=1e-3),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["gp"]),
        helper.make_node("Reshape", ["gp", "shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "gw"], ["y"], transB=1, alpha=0.5),
        helper.make_node("Softmax", ["y"], ["z"], axis=-1),
    ]
    m = _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("z", [1, 5])], inits, opset=13)
    _roundtrip_compare(m, rng)


def test_if_subgraph_and_constant_node(onnx_host):
    rng = np.random.default_rng(2)
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "else", [], [_vi("t", [3])])
    k = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32))
    nodes = [
        helper.make_node("Constant", [], ["k"], value=k),
        helper.make_node("If", ["c"], ["i"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Mul", ["i", "k"], ["y"]),
    ]
    m = _model(nodes, [_vi("c", [], TensorProto.BOOL), _vi("x", [3])], [_vi("y", [3])])
    for _ in range(2):
        _roundtrip_compare(m, rng)


def test_absent_optional_outputs_and_inputs(onnx_host):
    rng = np.random.default_rng(3)
    h = 2
    f = lambda *sh: rng.standard_normal(sh).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Clip", ["x", "", "hi"], ["c"]),
        helper.make_node("LSTM", ["c", "W", "R"], ["", "y_h"], hidden_size=h, name="lstm"),
        helper.make_node("Dropout", ["y_h"], ["y", ""]),
    ]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "hi"),
             numpy_helper.from_array(f(1, 4 * h, 3), "W"), numpy_helper.from_array(f(1, 4 * h, h), "R")]
    m = _model(nodes, [_vi("x", [2, 1, 3])], [_vi("y", [1, 1, h])], inits, opset=17)
    onnx.checker.check_model(m)
    exported = _roundtrip_compare(m, rng)
    lstm = [n for n in exported.graph.node if n.op_type == "LSTM"][0]
    assert list(lstm.output) == ["", "y_h"]
    drop = [n for n in exported.graph.node if n.op_type == "Dropout"][0]
    assert list(drop.output) == ["y"]
    clip = [n for n in exported.graph.node if n.op_type == "Clip"][0]
    assert list(clip.input)[1] == ""


def test_string_constant_roundtrip(onnx_host):
    s = numpy_helper.from_array(np.array(["a", "bc"], dtype=object), "s")
    m = _model([helper.make_node("Identity", ["s"], ["y"])], [], [_vi("y", [2], TensorProto.STRING)], [s])
    exported = _export(_load(m))
    onnx.checker.check_model(exported)
    got = [x.decode() if isinstance(x, bytes) else x for x in numpy_helper.to_array(exported.graph.initializer[0])]
    assert got == ["a", "bc"]


@pytest.mark.parametrize("fname", LIGHT_MODELS)
def test_light_model_roundtrip(onnx_host, fname):
    m = onnx.load(os.path.join(LIGHT_DIR, fname))
    _roundtrip_compare(m, np.random.default_rng(4), rtol=1e-4, atol=1e-5)


def test_frontend_export_method_writes_file(onnx_host, tmp_path):
    from ge_onnx.frontend import OnnxFrontend

    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    g = _load(m)
    out = tmp_path / "out.onnx"
    model = OnnxFrontend().export(g, str(out))
    onnx.checker.check_model(str(out))
    assert onnx.load(str(out)).graph.node[0].op_type == "Relu"
    assert model.graph.output[0].name == "y"


def test_export_after_inference_has_value_info(onnx_host):
    from ge_core.ops import infer_graph
    from ge_core.plugins import registries

    m = onnx.load(os.path.join(LIGHT_DIR, "light_squeezenet.onnx"))
    g = _load(m)
    infer_graph(g, registries().ops)
    exported = _export(g)
    onnx.checker.check_model(exported)
    assert len(exported.graph.value_info) >= len(m.graph.node) - 2
