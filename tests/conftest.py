"""Shared fixtures: a fresh plugin host per test that wants one, light model paths."""

import os

import onnx
import pytest

from ge_core import plugins

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f[len("light_"):-len(".onnx")] for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))


def light_model_path(name: str) -> str:
    return os.path.join(LIGHT_DIR, f"light_{name}.onnx")


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
