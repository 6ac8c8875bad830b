"""Fixtures for the ONNX frontend/exporter tests: the op set and ONNX plugins registered in-process."""

import pytest

from ge_core import plugins


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
