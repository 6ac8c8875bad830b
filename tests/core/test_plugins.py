"""Plugin discovery, isolation of failures, duplicates, disabling and strict mode."""

import importlib.metadata as md
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import ge_core as ge
from ge_core import DuplicateRegistrationError, OpDef, OpKind, PluginError, hookimpl, plugins
from ge_core.ir.types import TensorType

BUILTIN = {"ge_opset", "ge_onnx", "ge_cpu", "ge_memory", "ge_streams"}


def test_builtins_come_through_entry_points(fresh_host):
    eps = {e.name for e in md.entry_points(group="ge.plugins")}
    assert BUILTIN <= eps
    info = {r["name"]: r for r in fresh_host.describe()}
    for name in BUILTIN:
        assert info[name]["loaded"] and not info[name]["errors"], info[name]
        assert info[name]["distribution"] == "ge-python" and info[name]["version"] == ge.__version__
        assert info[name]["source"] == "entry point"
    regs = fresh_host.registries
    assert regs.ops.lookup("", "Conv") is not None
    assert ("", "Conv") in regs.kernels_for("cpu")
    assert "onnx" in regs.frontends and "cpu" in regs.backends


class Negate:
    """A throw-away plugin: a new op in a custom domain with its kernel."""

    @hookimpl
    def ge_register_ops(self, register):
        register(OpDef("Negate", domain="test.domain", min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE,
                       infer=lambda node, opset: [node.inputs[0].type]))

    @hookimpl
    def ge_register_kernels(self, register):
        register("Negate", lambda spec: (lambda x: (np.negative(x),)), domain="test.domain")


def test_throwaway_plugin_registered_in_process(fresh_host):
    fresh_host.register_plugin(Negate(), "negate_test")
    g = ge.Graph("g")
    g.opset_imports.update({"": 17, "test.domain": 1})
    x = g.add_input("x", TensorType("float32", (3,)))
    g.set_outputs([g.add_node("Negate", [x], domain="test.domain").output])
    model = ge.compile(g)
    out = model.run({"x": np.arange(3, dtype=np.float32)})
    np.testing.assert_array_equal(out[model.output_names[0]], [-0.0, -1.0, -2.0])
    assert model.graph.outputs[0].type == TensorType("float32", (3,))
    fresh_host.unregister_plugin("negate_test")
    assert fresh_host.registries.ops.lookup("test.domain", "Negate") is None


def _fake_entry_points(extra):
    real = md.entry_points

    def fake(**kw):
        eps = list(real(**kw))
        if kw.get("group") == "ge.plugins":
            eps += extra
        return eps

    return fake


def test_plugin_that_fails_to_import_is_reported_and_rest_work(monkeypatch):
    broken = md.EntryPoint(name="broken_plugin", value="ge_no_such_module_xyz.plugin", group="ge.plugins")
    monkeypatch.setattr(md, "entry_points", _fake_entry_points([broken]))
    host = plugins.PluginHost()
    info = {r["name"]: r for r in host.describe()}
    assert not info["broken_plugin"]["loaded"]
    assert "ge_no_such_module_xyz" in info["broken_plugin"]["errors"][0]
    assert info["ge_cpu"]["loaded"] and "cpu" in host.registries.backends


def test_strict_mode_makes_import_failure_fatal(monkeypatch):
    broken = md.EntryPoint(name="broken_plugin", value="ge_no_such_module_xyz.plugin", group="ge.plugins")
    monkeypatch.setattr(md, "entry_points", _fake_entry_points([broken]))
    monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="broken_plugin"):
        plugins.PluginHost()


class Raises:
    @hookimpl
    def ge_register_passes(self, register):
        raise RuntimeError("boom in hook")


def test_plugin_raising_in_hook_is_isolated(fresh_host):
    fresh_host.register_plugin(Raises(), "raiser")
    regs = fresh_host.registries
    info = {r["name"]: r for r in fresh_host.describe()}
    assert any("boom in hook" in e for e in info["raiser"]["errors"])
    assert "infer_shapes" in regs.passes  # other plugins' passes still there


class DupA:
    @hookimpl
    def ge_register_memory_planners(self, register):
        register("dup_planner", lambda p, o: None)


class DupB:
    @hookimpl
    def ge_register_memory_planners(self, register):
        register("dup_planner", lambda p, o: None)


def test_duplicate_names_are_an_error_naming_both(fresh_host, monkeypatch):
    fresh_host.register_plugin(DupA(), "plugin_a")
    fresh_host.register_plugin(DupB(), "plugin_b")
    fresh_host.registries  # noqa: B018 - builds registries
    errors = [e for r in fresh_host.describe() for e in r["errors"]]
    assert any("plugin_a" in e and "plugin_b" in e and "dup_planner" in e for e in errors), errors
    monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
    fresh_host._registries = None
    with pytest.raises(DuplicateRegistrationError, match="plugin_a.*plugin_b"):
        fresh_host.registries  # noqa: B018


def test_registry_records_origin(fresh_host):
    assert fresh_host.registries.ops.origin(("", "Relu")) == "ge_opset"
    assert fresh_host.registries.kernels_for("cpu").origin(("", "Relu")) == "ge_cpu"


def test_disable_plugins_env(monkeypatch):
    monkeypatch.setenv("GE_DISABLE_PLUGINS", "ge_memory, ge_streams")
    host = plugins.PluginHost()
    info = {r["name"]: r for r in host.describe()}
    assert info["ge_memory"]["disabled"] and not info["ge_memory"]["loaded"]
    assert len(host.registries.memory_planners) == 0
    assert "cpu" in host.registries.backends


def test_unknown_hook_name_is_reported(fresh_host):
    mod = types.SimpleNamespace(ge_register_passs=lambda register: None)
    fresh_host.register_plugin(mod, "typo_plugin")
    info = {r["name"]: r for r in fresh_host.describe()}
    assert any("ge_register_passs" in e for e in info["typo_plugin"]["errors"])


def test_observer_hooks_see_the_flow(fresh_host):
    seen = []

    class Watch:
        @hookimpl
        def ge_after_pass(self, pass_name, changed):
            seen.append(pass_name)

        @hookimpl
        def ge_model_built(self, model):
            seen.append("built")

        @hookimpl
        def ge_before_pass(self, pass_name):
            raise ValueError("observer bug")  # reported, not fatal

    fresh_host.register_plugin(Watch(), "watch")
    g = ge.Graph("g")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType("float32", (2,)))
    g.set_outputs([g.add_node("Relu", [x]).output])
    ge.compile(g)
    assert "infer_shapes" in seen and seen[-1] == "built"
    info = {r["name"]: r for r in fresh_host.describe()}
    assert any("observer bug" in e for e in info["watch"]["errors"])


def test_ge_plugins_json_cli():
    out = subprocess.run([sys.executable, "-m", "ge_core.cli", "plugins", "--json"], capture_output=True, text=True, check=True)
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert BUILTIN <= set(rows)
    for name in BUILTIN:
        assert rows[name]["distribution"] == "ge-python" and rows[name]["version"]
        assert rows[name]["hooks"], name
    assert rows["ge_cpu"]["provides"]["cpu_kernels"] > 50


def test_ge_plugins_cli_reports_disabled():
    env = dict(os.environ, GE_DISABLE_PLUGINS="ge_streams")
    out = subprocess.run([sys.executable, "-m", "ge_core.cli", "plugins", "--json"], capture_output=True, text=True, check=True, env=env)
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["ge_streams"]["disabled"] and not rows["ge_streams"]["loaded"]
