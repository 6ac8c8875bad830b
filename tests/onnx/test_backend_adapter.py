"""ge_onnx.backend: ONNX node test cases run through onnx.backend's interface on GE."""

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ge_core import plugins

OPS = ("relu", "add", "conv", "maxpool", "gemm", "softmax", "reshape", "concat")


@pytest.fixture(scope="module")
def ge_host():
    """The installed plugins (entry points); the in-process ONNX plugins if they are missing."""
    host = plugins.PluginHost()
    names = {i["name"] for i in host.describe() if i["loaded"]}
    if "ge_opset" not in names:
        import ge_opset.plugin

        host.register_plugin(ge_opset.plugin, "ge_opset")
    if "ge_onnx" not in names:
        import ge_onnx.plugin

        host.register_plugin(ge_onnx.plugin, "ge_onnx")
    assert len(host.registries.backends), "no backend plugin is installed (ge_cpu ships with this distribution)"
    old = plugins.reset_host(host)
    try:
        yield host
    finally:
        plugins.reset_host(old)


@functools.lru_cache(maxsize=1)
def _cases():
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return [c for c in cases if c.name.split("_")[1] in OPS and not c.name.endswith("_expanded")]


def _case_names():
    return [c.name for c in _cases()]


@pytest.mark.parametrize("name", _case_names())
def test_node_case(ge_host, name):
    import ge_onnx.backend as backend

    case = next(c for c in _cases() if c.name == name)
    assert backend.supports_device("CPU")
    rep = backend.prepare(case.model, "CPU")
    for inputs, outputs in case.data_sets:
        got = rep.run(inputs)
        assert len(got) == len(outputs)
        for g, e in zip(got, outputs):
            assert g.dtype == e.dtype
            np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)


def test_run_node_and_input_forms(ge_host):
    import ge_onnx.backend as backend

    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    y = np.ones((2, 2), np.float32)
    node = helper.make_node("Add", ["x", "y"], ["z"])
    (z,) = backend.run_node(node, [x, y])
    np.testing.assert_array_equal(z, x + y)
    (z,) = backend.run_node(node, {"x": x, "y": y}, outputs_info=[(np.float32, (2, 2))])
    np.testing.assert_array_equal(z, x + y)
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 2])]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    rep = backend.prepare(model)
    np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))
    np.testing.assert_array_equal(rep.run({"x": x})[0], np.maximum(x, 0))
    np.testing.assert_array_equal(backend.run_model(model, [x])[0], np.maximum(x, 0))
    assert not backend.supports_device("CUDA")
    assert isinstance(backend.GEBackend.prepare(model), onnx.backend.base.BackendRep)
