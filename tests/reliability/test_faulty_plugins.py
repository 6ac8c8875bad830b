"""Faulty plugins are named in the error: hooks that raise, passes that return garbage or break
the graph (skipped and rolled back by default, fatal in strict mode), planners and allocators
that return garbage, kernels that are not callable or return the wrong number of outputs,
duplicate names."""

import logging
import os

import numpy as np
import onnx
import pytest

import ge_core as ge
from ge_core import hookimpl
from ge_core.errors import GEError, PassError, PluginError
from ge_core.memory import MemoryPlan
from ge_core.ops import OpDef, OpKind
from ge_core.passes import Pass
from ge_core.plugins import get_host
from ge_sdk import GraphBuilder, temporary_plugin

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
X = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)


def _graph():
    b = GraphBuilder("g")
    x = b.input("x", "float32", (1, 4))
    b.output(b.op("Neg", b.op("Relu", x)))
    return b.graph


@pytest.fixture(autouse=True)
def _no_strict_env(monkeypatch):
    monkeypatch.delenv("GE_STRICT_PLUGINS", raising=False)


def _pass_plugin(run, name="bad_pass", stage="optimize"):
    class BadPass(Pass):
        """A pass whose name, stage and run the caller sets."""

    BadPass.name, BadPass.stage = name, stage
    BadPass.run = lambda self, graph, ctx: run(graph)  # type: ignore[method-assign]

    class Plugin:
        @hookimpl
        def ge_register_passes(self, register):
            register(BadPass())

    return Plugin()


def _raises(graph):
    raise RuntimeError("boom")


def _partial_then_raise(graph):
    n = next(n for n in graph.nodes if n.op_type == "Neg")
    n.output.replace_all_uses_with(n.inputs[0])
    graph.remove_node(n)  # a real change...
    raise ValueError("...then a crash")


def _garbage(graph):
    return ["not", "a", "bool"]


def _invalid_graph(graph):
    relu = next(n for n in graph.nodes if n.op_type == "Relu")
    neg = next(n for n in graph.nodes if n.op_type == "Neg")
    neg.name = relu.name  # two nodes with one name: graph.verify() refuses it
    return True


def _wrong_arity(graph):
    n = next(n for n in graph.nodes if n.op_type == "Neg")
    n.set_input(0, None) if hasattr(n, "set_input") else None
    n.op_type = "Add"  # Add with one input: fails the op registry's arity check
    return True


FAULTS = {"raises": _raises, "partial_then_raises": _partial_then_raise, "returns_garbage": _garbage,
          "invalid_graph": _invalid_graph, "wrong_arity": _wrong_arity}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_failing_pass_is_skipped_and_rolled_back_by_default(fault, caplog):
    expected = ge.compile(_graph()).run({"x": X})
    with temporary_plugin(_pass_plugin(FAULTS[fault]), "faulty_pass_plugin"):
        with caplog.at_level(logging.WARNING, logger="ge"):
            model = ge.compile(_graph())
        got = model.run({"x": X})
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])
    assert any("bad_pass" in r.getMessage() for r in caplog.records), "no warning names the pass"
    rec = [p for p in model.report["passes"] if p["name"] == "bad_pass"]
    assert rec and not rec[0]["changed"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("how", ["option", "env"])
def test_failing_pass_stops_the_compile_in_strict_mode(fault, how, monkeypatch):
    opts = {}
    if how == "option":
        opts["strict_passes"] = True
    else:
        monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
    with temporary_plugin(_pass_plugin(FAULTS[fault]), "faulty_pass_plugin"):
        with pytest.raises(PassError) as ei:
            ge.compile(_graph(), opts)
    assert "bad_pass" in str(ei.value)


def test_failing_pass_error_names_its_plugin():
    with temporary_plugin(_pass_plugin(_raises), "faulty_pass_plugin"):
        with pytest.raises(PassError, match="faulty_pass_plugin"):
            ge.compile(_graph(), strict_passes=True)


def test_hook_that_raises_is_reported_and_the_rest_keeps_working(monkeypatch):
    class Broken:
        @hookimpl
        def ge_register_passes(self, register):
            raise RuntimeError("broken hook")

    with temporary_plugin(Broken(), "broken_hook_plugin"):
        model = ge.compile(_graph())  # the other plugins still work
        assert model.run({"x": X})
        errors = get_host().info["broken_hook_plugin"].errors
        assert errors and "ge_register_passes" in errors[0] and "broken hook" in errors[0]
        monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
        get_host()._registries = None
        with pytest.raises(PluginError, match="broken_hook_plugin"):
            get_host().registries  # noqa: B018


def test_observer_that_raises_does_not_stop_the_compile():
    class Observer:
        @hookimpl
        def ge_after_pass(self, pass_name, stage, graph, changed, seconds):
            raise RuntimeError("observer bug")

    with temporary_plugin(Observer(), "bad_observer"):
        assert ge.compile(_graph()).run({"x": X})
        assert any("observer bug" in e for e in get_host().info["bad_observer"].errors)


def test_duplicate_pass_name_names_both_plugins(monkeypatch):
    a = _pass_plugin(lambda g: False, name="dup_pass")
    b = _pass_plugin(lambda g: False, name="dup_pass")
    with temporary_plugin(a, "dup_plugin_a"), temporary_plugin(b, "dup_plugin_b"):
        get_host().registries  # noqa: B018
        msgs = get_host().info["dup_plugin_a"].errors + get_host().info["dup_plugin_b"].errors
        assert any("dup_plugin_a" in m and "dup_plugin_b" in m for m in msgs), msgs
        monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
        get_host()._registries = None
        with pytest.raises(PluginError) as ei:
            get_host().registries  # noqa: B018
        assert "dup_plugin_a" in str(ei.value) and "dup_plugin_b" in str(ei.value)


def test_duplicate_plugin_name_is_refused():
    with temporary_plugin(_pass_plugin(lambda g: False, name="p1"), "same_name"):
        with pytest.raises(PluginError, match="same_name"):
            get_host().register_plugin(_pass_plugin(lambda g: False, name="p2"), "same_name")


@pytest.mark.parametrize("garbage", [None, {"x": 0}, "plan"])
def test_memory_planner_returning_garbage_is_named(garbage):
    class Planner:
        @hookimpl
        def ge_register_memory_planners(self, register):
            register("junk_planner", lambda problem, options: garbage)

    with temporary_plugin(Planner(), "junk_planner_plugin"):
        with pytest.raises(GEError) as ei:
            ge.compile(_graph(), memory_planner="junk_planner")
    assert "junk_planner" in str(ei.value) and "junk_planner_plugin" in str(ei.value)


def test_memory_planner_with_overlapping_buffers_is_named():
    def overlapping(problem, options):
        return MemoryPlan({b.name: 0 for b in problem.buffers}, max((b.size for b in problem.buffers), default=0),
                          "overlap_planner")

    class Planner:
        @hookimpl
        def ge_register_memory_planners(self, register):
            register("overlap_planner", overlapping)

    with temporary_plugin(Planner(), "overlap_plugin"):
        with pytest.raises(GEError, match="overlap_planner"):
            ge.compile(os.path.join(LIGHT_DIR, "light_squeezenet.onnx"), memory_planner="overlap_planner")


@pytest.mark.parametrize("bad", ["short", "raises", "garbage"])
def test_stream_allocator_returning_garbage_is_named(bad):
    from ge_core.schedule import StreamAssignment

    def alloc(graph, options):
        if bad == "raises":
            raise RuntimeError("allocator bug")
        if bad == "garbage":
            return [0] * len(graph)
        return StreamAssignment([0] * (len(graph) - 1), [])

    class Alloc:
        @hookimpl
        def ge_register_stream_allocators(self, register):
            register("junk_streams", alloc)

    with temporary_plugin(Alloc(), "junk_streams_plugin"):
        with pytest.raises(GEError) as ei:
            ge.compile(_graph(), stream_allocator="junk_streams")
    assert "junk_streams" in str(ei.value) and "junk_streams_plugin" in str(ei.value)


def _op_plugin(factory):
    class P:
        @hookimpl
        def ge_register_ops(self, register):
            register(OpDef("Twice", domain="test.faulty", min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE,
                           infer=lambda node, opset: [node.inputs[0].type]))

        @hookimpl
        def ge_register_kernels(self, register):
            register("Twice", factory, domain="test.faulty", backend="cpu")

    return P()


def _twice_graph():
    b = GraphBuilder("g")
    b.graph.opset_imports["test.faulty"] = 1
    x = b.input("x", "float32", (1, 4))
    b.output(b.op("Relu", b.op("Twice", x, domain="test.faulty")))
    return b.graph


def test_custom_kernel_works():  # the control for the faulty kernels below
    with temporary_plugin(_op_plugin(lambda spec: (lambda x: (x * 2,))), "twice_plugin"):
        out = ge.compile(_twice_graph()).run({"x": X})
    np.testing.assert_array_equal(next(iter(out.values())), np.maximum(X * 2, 0))


@pytest.mark.parametrize("kernel", ["no_outputs", "two_outputs", "not_a_sequence"])
def test_kernel_returning_the_wrong_number_of_outputs_is_named(kernel):
    fns = {"no_outputs": lambda x: (), "two_outputs": lambda x: (x, x), "not_a_sequence": lambda x: 42}
    with temporary_plugin(_op_plugin(lambda spec: fns[kernel]), "twice_plugin"):
        with pytest.raises(GEError) as ei:
            ge.compile(_twice_graph()).run({"x": X})
    assert "Twice" in str(ei.value)


@pytest.mark.parametrize("product", [None, 42, "kernel"])
def test_kernel_factory_returning_a_non_callable_is_named(product):
    with temporary_plugin(_op_plugin(lambda spec: product), "twice_plugin"):
        with pytest.raises(GEError) as ei:
            ge.compile(_twice_graph()).run({"x": X})
    assert "Twice" in str(ei.value)


def test_kernel_factory_that_raises_is_named():
    def factory(spec):
        raise RuntimeError("factory bug")

    with temporary_plugin(_op_plugin(factory), "twice_plugin"):
        with pytest.raises(GEError) as ei:
            ge.compile(_twice_graph())
    assert "Twice" in str(ei.value) and "factory bug" in str(ei.value)


def test_kernel_errors_name_the_plugin():
    with temporary_plugin(_op_plugin(lambda spec: (lambda x: ())), "twice_plugin"):
        with pytest.raises(GEError, match="twice_plugin"):
            ge.compile(_twice_graph()).run({"x": X})


def test_frontend_that_raises_is_named(tmp_path):
    from ge_core.frontend import Frontend

    class BadFrontend(Frontend):
        name = "badfmt"
        suffixes = (".bad",)

        def sniff(self, path, head):
            return path.endswith(".bad")

        def load(self, source, options=None):
            raise KeyError("frontend bug")

    class P:
        @hookimpl
        def ge_register_frontends(self, register):
            register(BadFrontend())

    p = tmp_path / "m.bad"
    p.write_bytes(b"x")
    with temporary_plugin(P(), "bad_frontend_plugin"):
        with pytest.raises(GEError) as ei:
            ge.load(str(p))
    assert "badfmt" in str(ei.value) and "bad_frontend_plugin" in str(ei.value)


# ------------------------------------------------------------------------------------------
# SystemExit and other BaseExceptions are isolated like any plugin failure (only Ctrl-C passes)
# ------------------------------------------------------------------------------------------
class PluginExit(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


class FakeInterrupt(KeyboardInterrupt):
    """A plugin's own KeyboardInterrupt subclass: not a real Ctrl-C."""


_IMPORT_FAULTS = {
    "system_exit": "raise SystemExit(3)\n",
    "base_exception": "class PluginExit(BaseException):\n    pass\nraise PluginExit('custom base exception at import')\n",
}


def _entry_point_plugins(monkeypatch, tmp_path, modules: dict[str, str]):
    import importlib.metadata as md

    eps = []
    for name, text in modules.items():
        mod = f"ge_trust_fault_{name}"
        (tmp_path / f"{mod}.py").write_text(text)
        eps.append(md.EntryPoint(name=f"fault_{name}", value=mod, group="ge.plugins"))
    monkeypatch.syspath_prepend(str(tmp_path))
    real = md.entry_points

    def fake(**kw):
        found = real(**kw)
        return list(found) + eps if kw.get("group") == "ge.plugins" else found

    monkeypatch.setattr(md, "entry_points", fake)


def test_base_exceptions_at_import_are_reported_by_ge_plugins(monkeypatch, tmp_path, capsys):
    import json

    from ge_core import cli, plugins

    _entry_point_plugins(monkeypatch, tmp_path, _IMPORT_FAULTS)
    old = plugins.reset_host(plugins.PluginHost())  # would end the test process before the fix
    try:
        rc = cli.main(["plugins", "--json"])
        out = capsys.readouterr().out
        rows = {r["name"]: r for r in json.loads(out[out.index("["):])} if rc == 0 else {}
        assert rc == 0, out
        assert not rows["fault_system_exit"]["loaded"]
        assert "SystemExit: 3" in rows["fault_system_exit"]["errors"][0]
        assert not rows["fault_base_exception"]["loaded"]
        assert "custom base exception at import" in rows["fault_base_exception"]["errors"][0]
        assert rows["ge_cpu"]["loaded"]
        model = ge.compile(_graph())
        np.testing.assert_array_equal(model.run({"x": X})[model.output_names[0]], -np.maximum(X, 0))
    finally:
        plugins.reset_host(old)


def test_base_exception_at_import_is_fatal_in_strict_mode(monkeypatch, tmp_path):
    from ge_core import plugins

    _entry_point_plugins(monkeypatch, tmp_path, {"system_exit": _IMPORT_FAULTS["system_exit"]})
    monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="fault_system_exit"):
        plugins.PluginHost()


@pytest.mark.parametrize("exc", [SystemExit(3), PluginExit("custom base exception"), FakeInterrupt("not ctrl-c")],
                         ids=["system_exit", "base_exception", "keyboard_interrupt_subclass"])
def test_base_exceptions_in_hooks_are_isolated(exc):
    class Registers:
        @hookimpl
        def ge_register_passes(self, register):
            raise exc

    class Observes:
        @hookimpl
        def ge_after_pass(self, pass_name, stage, graph, changed, seconds):
            raise exc

    with temporary_plugin(Registers(), "base_exc_hook"), temporary_plugin(Observes(), "base_exc_observer"):
        model = ge.compile(_graph())
        np.testing.assert_array_equal(model.run({"x": X})[model.output_names[0]], -np.maximum(X, 0))
        host = get_host()
        assert any(type(exc).__name__ in e and "ge_register_passes" in e for e in host.info["base_exc_hook"].errors)
        assert any(type(exc).__name__ in e and "ge_after_pass" in e for e in host.info["base_exc_observer"].errors)


def test_base_exception_instantiating_a_plugin_class_is_isolated(fresh_host):
    class Explodes:
        def __init__(self):
            raise SystemExit(4)

        @hookimpl
        def ge_register_passes(self, register):
            """Never called: the plugin fails when it is made."""

    fresh_host.register_plugin(Explodes, "explodes_at_init")
    assert "SystemExit: 4" in fresh_host.info["explodes_at_init"].errors[0]
    assert "infer_shapes" in fresh_host.registries.passes


def test_a_real_keyboard_interrupt_still_stops_everything():
    class CtrlC:
        @hookimpl
        def ge_register_passes(self, register):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with temporary_plugin(CtrlC(), "ctrl_c_plugin"):
            get_host().registries  # noqa: B018


def _raise(exc):
    raise exc


@pytest.mark.parametrize("exc", [SystemExit(5), PluginExit("custom base exception"), FakeInterrupt("not ctrl-c")],
                         ids=["system_exit", "base_exception", "keyboard_interrupt_subclass"])
def test_base_exception_in_a_pass_is_rolled_back_like_any_failure(exc, caplog):
    with temporary_plugin(_pass_plugin(lambda g: _raise(exc)), "base_exc_pass"):
        with caplog.at_level(logging.WARNING, logger="ge"):
            model = ge.compile(_graph())
        np.testing.assert_array_equal(model.run({"x": X})[model.output_names[0]], -np.maximum(X, 0))
        assert any("bad_pass" in r.getMessage() and type(exc).__name__ in r.getMessage() for r in caplog.records)
        with pytest.raises(PassError, match="bad_pass"):
            ge.compile(_graph(), strict_passes=True)


@pytest.mark.parametrize("where", ["memory_planner", "stream_allocator", "frontend", "inference"])
def test_base_exception_in_other_plugin_code_is_a_geerror_naming_it(where, tmp_path):
    from ge_core.frontend import Frontend

    class P:
        @hookimpl
        def ge_register_memory_planners(self, register):
            register("exit_planner", lambda problem, options: _raise(SystemExit(6)))

        @hookimpl
        def ge_register_stream_allocators(self, register):
            register("exit_alloc", lambda graph, options: _raise(SystemExit(6)))

        @hookimpl
        def ge_register_frontends(self, register):
            class ExitFrontend(Frontend):
                name = "exitfmt"
                suffixes = (".exit",)

                def sniff(self, path, head):
                    return path.endswith(".exit")

                def load(self, source, options=None):
                    raise SystemExit(6)

            register(ExitFrontend())

        @hookimpl
        def ge_register_ops(self, register):
            register(OpDef("ExitOp", domain="exit.test", min_inputs=1, max_inputs=1, kind=OpKind.ELEMWISE,
                           infer=lambda node, opset: _raise(SystemExit(6))))

    with temporary_plugin(P(), "base_exc_everywhere"):
        with pytest.raises(GEError) as ei:
            if where == "memory_planner":
                ge.compile(_graph(), memory_planner="exit_planner")
            elif where == "stream_allocator":
                ge.compile(_graph(), stream_allocator="exit_alloc")
            elif where == "frontend":
                p = tmp_path / "m.exit"
                p.write_bytes(b"x")
                ge.load(str(p))
            else:
                b = GraphBuilder("g")
                x = b.input("x", "float32", (1, 4))
                b.output(b.op("ExitOp", x, domain="exit.test"))
                ge.compile(b.graph)
    msg = str(ei.value)
    assert "SystemExit" in msg or "6" in msg, msg
    assert {"memory_planner": "exit_planner", "stream_allocator": "exit_alloc", "frontend": "exitfmt",
            "inference": "ExitOp"}[where] in msg, msg
