"""Pass manager: stages, ordering, fixed point, timing, verify-after-pass, IR dumps, errors."""

import numpy as np
import pytest

import ge_core as ge
from ge_core import OptionError, PassError, TensorType, hookimpl
from ge_core.options import CompileOptions
from ge_core.passes import Pass, PassContext, PassManager, graph_pass, order_passes, resolve_pipeline
from ge_core.registry import Registry


def chain(n=4):
    g = ge.Graph("g")
    g.opset_imports[""] = 17
    v = g.add_input("x", TensorType("float32", (2,)))
    for i in range(n):
        v = g.add_node("Identity", [v], name=f"id{i}").output
    g.set_outputs([g.add_node("Relu", [v], name="relu").output])
    return g


@graph_pass("drop_one_identity", stage="optimize", fixed_point=True, opt_level=0)
def drop_one_identity(graph, ctx):
    """Remove a single Identity per run (so only a fixed point removes all)."""
    for n in graph.nodes:
        if n.op_type == "Identity":
            n.output.replace_all_uses_with(n.inputs[0])
            graph.remove_node(n)
            return True
    return False


class Breaks(Pass):
    name = "breaks_graph"
    stage = "optimize"
    opt_level = 0

    def run(self, graph, ctx):
        relu = graph.find_node("relu")
        graph.move_before(relu, next(iter(graph.nodes)))  # out of topological order
        return True


class Raises(Pass):
    name = "raises"
    stage = "fuse"

    def run(self, graph, ctx):
        raise ZeroDivisionError("oops")


def registry(*passes):
    r = Registry("pass")
    for p in passes:
        r.add(p.name, p, "test")
    return r


def run(reg, g, **opts):
    options = CompileOptions.from_any(opts)
    pm = PassManager(resolve_pipeline(reg, options), verify_each=options.verify_each_pass, dump_dir=options.dump_ir)
    out = pm.run(g, PassContext(options, None))
    assert out is g  # unguarded passes rewrite the graph in place
    return pm.records


def test_fixed_point_repeats_stage_until_no_change():
    g = chain(4)
    records = run(registry(drop_one_identity), g)
    assert [n.op_type for n in g.nodes] == ["Relu"]
    assert [r.changed for r in records] == [True, True, True, True, False]
    assert all(r.seconds >= 0 and r.stage == "optimize" for r in records)
    assert records[-1].nodes_after == 1


def test_verify_each_pass_names_the_pass_and_history():
    reg = registry(drop_one_identity, Breaks())
    pipeline = {"optimize": {"passes": ["drop_one_identity", "breaks_graph"], "fixed_point": False}}
    with pytest.raises(PassError, match=r"pass 'breaks_graph'.*invalid graph.*topological.*before it: drop_one_identity\)"):
        run(reg, chain(2), verify_each_pass=True, pipeline=pipeline)
    # without verification the broken graph goes through the pass manager unnoticed
    run(reg, chain(2), pipeline=pipeline)


def test_raising_pass_is_named_with_passes_before_it():
    with pytest.raises(PassError, match=r"pass 'raises' \(stage fuse\) raised ZeroDivisionError: oops.*passes before it: drop_one_identity"):
        run(registry(drop_one_identity, Raises()), chain(1))


def test_ordering_constraints():
    class A(Pass):
        name, stage = "a", "optimize"

    class B(Pass):
        name, stage, before = "b", "optimize", ("a",)

    class C(Pass):
        name, stage, after = "c", "optimize", ("a",)

    assert [p.name for p in order_passes([A(), B(), C()])] == ["b", "a", "c"]

    class D(Pass):
        name, stage, after = "d", "optimize", ("e",)

    class E(Pass):
        name, stage, after = "e", "optimize", ("d",)

    with pytest.raises(OptionError, match="cycle"):
        order_passes([D(), E()])


def test_opt_level_and_disable():
    class Heavy(Pass):
        name, stage, opt_level = "heavy", "optimize", 3

        def run(self, graph, ctx):
            return False

    reg = registry(drop_one_identity, Heavy())
    names = lambda **o: [p.name for s in resolve_pipeline(reg, CompileOptions.from_any(o)) for p in s.passes]  # noqa: E731
    assert names() == ["drop_one_identity"]
    assert names(opt_level="O3") == ["drop_one_identity", "heavy"]
    assert names(opt_level=3, disabled_passes="heavy") == ["drop_one_identity"]
    assert names(opt_level=0) == ["drop_one_identity"]  # an O0 pass runs at every level


def test_unknown_pass_gets_close_matches():
    with pytest.raises(OptionError, match="did you mean: drop_one_identity"):
        resolve_pipeline(registry(drop_one_identity), CompileOptions.from_any({"disabled_passes": ["drop_one_identiti"]}))


def test_pipeline_from_toml_config(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text(
        '[options]\nopt_level = 1\n[pipeline.optimize]\npasses = ["drop_one_identity"]\nfixed_point = false\n'
    )
    g = chain(3)
    records = run(registry(drop_one_identity), g, config=str(cfg))
    assert len(records) == 1 and sum(n.op_type == "Identity" for n in g.nodes) == 2


def test_bad_config_errors(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[pipeline.optimise]\npasses = []\n")
    with pytest.raises(OptionError, match="unknown stage 'optimise'.*did you mean: optimize"):
        resolve_pipeline(registry(), CompileOptions.from_config(cfg))
    cfg.write_text("[options\n")
    with pytest.raises(OptionError, match="not valid TOML"):
        CompileOptions.from_config(cfg)
    cfg.write_text("[optoins]\n")
    with pytest.raises(OptionError, match="did you mean: options"):
        CompileOptions.from_config(cfg)


def test_pass_params_from_config(tmp_path):
    seen = {}

    class P(Pass):
        name, stage, params = "param_pass", "optimize", {"limit": 10}

        def run(self, graph, ctx):
            seen.update(ctx.params)
            return False

    cfg = tmp_path / "p.toml"
    cfg.write_text("[passes.param_pass]\nlimit = 99\n")
    run(registry(P()), chain(1), config=str(cfg))
    assert seen == {"limit": 99}
    cfg.write_text("[passes.param_pass]\nlimt = 99\n")
    with pytest.raises(OptionError, match="no parameter 'limt'.*did you mean: limit"):
        run(registry(P()), chain(1), config=str(cfg))


def test_dump_ir_after_each_changing_pass(tmp_path):
    run(registry(drop_one_identity), chain(2), dump_ir=str(tmp_path))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0] == "000_input.txt" and len(files) == 3
    assert "Identity" not in (tmp_path / files[-1]).read_text()


def test_plugin_pass_runs_in_compile_and_report(fresh_host):
    class Plug:
        @hookimpl
        def ge_register_passes(self, register):
            register(drop_one_identity)

    fresh_host.register_plugin(Plug(), "dropper")
    model = ge.compile(chain(3), {"opt_level": 0})  # O0: only these tests' passes and infer_shapes
    assert model.report["op_counts"] == {"Relu": 1}
    assert model.report["nodes_before"] == 4 and model.report["nodes_after"] == 1
    names = [p["name"] for p in model.report["passes"]]
    assert names.count("drop_one_identity") == 4 and "infer_shapes" in names
    out = model.run({"x": np.array([-1, 2], np.float32)})
    np.testing.assert_array_equal(out["relu"], [0, 2])


class Vandal(Pass):
    """A third-party pass that corrupts the graph and then raises."""

    name, stage, opt_level = "vandal", "optimize", 0

    def run(self, graph, ctx):
        for n in list(graph.nodes):
            if n.op_type == "Identity":
                n.output.replace_all_uses_with(n.inputs[0])
                graph.remove_node(n)
        raise RuntimeError("vandal gave up halfway")


class Garbage(Pass):
    name, stage, opt_level = "garbage", "optimize", 0

    def run(self, graph, ctx):
        return "yes"


@pytest.mark.parametrize("bad", [Vandal(), Garbage(), Breaks()])
def test_failing_plugin_pass_is_rolled_back_by_default(fresh_host, bad, caplog):
    class Plug:
        @hookimpl
        def ge_register_passes(self, register):
            register(bad)

    fresh_host.register_plugin(Plug(), "sloppy_plugin")
    g = chain(3)
    model = ge.compile(g, {"opt_level": 0})
    # the graph from before the pass is kept, the compile goes on and says what happened
    assert model.report["op_counts"] == {"Identity": 3, "Relu": 1}
    failure = model.report["pass_failures"][0]
    assert failure["pass"] == bad.name
    rec = next(p for p in model.report["passes"] if p["name"] == bad.name)
    assert rec["changed"] is False and bad.name in rec["error"]
    assert any(bad.name in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(model.run({"x": np.array([-1, 2], np.float32)})["relu"], [0, 2])


def test_strict_mode_stops_at_failing_plugin_pass(fresh_host, monkeypatch):
    class Plug:
        @hookimpl
        def ge_register_passes(self, register):
            register(Vandal())

    fresh_host.register_plugin(Plug(), "sloppy_plugin")
    with pytest.raises(PassError, match="pass 'vandal'.*vandal gave up halfway"):
        ge.compile(chain(2), {"strict_passes": True, "opt_level": 0})
    monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
    with pytest.raises(PassError, match="vandal"):
        ge.compile(chain(2), {"opt_level": 0})
    monkeypatch.delenv("GE_STRICT_PLUGINS")
    # without transactions even a plugin pass's failure stops the compile
    with pytest.raises(PassError, match="vandal"):
        ge.compile(chain(2), {"pass_transactions": "none", "opt_level": 0})
