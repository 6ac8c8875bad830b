"""Shared fixtures: a fresh plugin host per test that wants one, light model paths."""

import os

import onnx
import pytest

from ge_core import plugins

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f[len("light_"):-len(".onnx")] for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))


def light_model_path(name: str) -> str:
    return os.path.join(LIGHT_DIR, f"light_{name}.onnx")


def with_softmax_logits(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of ``model`` that also outputs the input of its final Softmax (last output), or
    None when it does not end in one."""
    if not model.graph.node or model.graph.node[-1].op_type != "Softmax":
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.append(onnx.helper.make_tensor_value_info(m.graph.node[-1].input[0], onnx.TensorProto.FLOAT, None))
    return m


def assert_light_outputs_match(name: str, path: str, feeds: dict, got: dict, want: list, rtol: float,
                               atol: float) -> None:
    """ge's outputs ``got`` of light model ``path`` against onnxruntime's ``want``, at a
    tolerance that fits the model's conditioning (see :func:`ill_conditioned`)."""
    import numpy as np
    import onnxruntime as ort

    import ge_core as ge

    m = with_softmax_logits(onnx.load(path))
    if m is not None:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        ref = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[-1]
        if ill_conditioned(ref):
            mine = np.asarray(list(ge.compile(ge.load(m)).run(feeds).values())[-1])
            np.testing.assert_allclose(mine, ref, rtol=1e-4, atol=0, err_msg=f"{name}: logits")
            for k, g in got.items():
                np.testing.assert_allclose(np.sum(g), 1.0, rtol=1e-4, err_msg=f"{name}:{k}")
            return
    for (k, g), w in zip(got.items(), want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{name}:{k}")


def ill_conditioned(logits) -> bool:
    """True when float32 rounding of ``logits`` (relative 1e-7) moves their softmax by more
    than 1e-4: the light models' weights are constants, and squeezenet's logits are ~7e9 and
    equal to 1e-7 relative, so how a GEMM splits its sum alone decides its softmax. Such a
    model is compared at its logits (relative to their size) instead of its probabilities."""
    import numpy as np

    return float(np.abs(np.asarray(logits)).max()) * 1e-7 > 1e-4


@pytest.fixture
def fresh_host():
    """A new host that loads the installed entry points; the global one is restored afterwards."""
    old = plugins.reset_host(plugins.PluginHost())
    try:
        yield plugins.get_host()
    finally:
        plugins.reset_host(old)


@pytest.fixture
def empty_host():
    """A host with no entry-point plugins at all."""
    old = plugins.reset_host(plugins.PluginHost(load_entry_points=False))
    try:
        yield plugins.get_host()
    finally:
        plugins.reset_host(old)


@pytest.fixture
def onnx_host():
    """A host holding only ge_opset and ge_onnx (registered in-process, no entry points)."""
    import ge_onnx.plugin
    import ge_opset.plugin

    host = plugins.PluginHost(load_entry_points=False)
    host.register_plugin(ge_opset.plugin, "ge_opset")
    host.register_plugin(ge_onnx.plugin, "ge_onnx")
    old = plugins.reset_host(host)
    try:
        yield host
    finally:
        plugins.reset_host(old)
