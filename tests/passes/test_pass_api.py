"""The pass API: a pass returns a bool or a PassResult; instruments run around every pass; the
passes' after/before declarations are the one source of the pipeline's order."""

import json

import numpy as np
import pytest

import ge_core as ge
from ge_core import GEError, OptionError, PassError, hookimpl
from ge_core.cli import main
from ge_core.options import CompileOptions
from ge_core.passes import (
    Pass,
    PassContext,
    PassInstrument,
    PassManager,
    PassResult,
    StagePlan,
    order_passes,
    resolve_pipeline,
)
from ge_sdk import Plugin
from tests.core.test_passes import chain as identity_chain


def chain():
    return identity_chain(3)  # x -> Identity x3 -> Relu


def drop_identities(graph):
    n = 0
    for node in list(graph.nodes):
        if node.op_type == "Identity":
            node.output.replace_all_uses_with(node.inputs[0])
            graph.remove_node(node)
            n += 1
    return n


class ReturnsBool(Pass):
    name, stage, opt_level = "t_returns_bool", "optimize", 0

    def run(self, graph, ctx):
        return drop_identities(graph) > 0


class ReturnsResult(Pass):
    name, stage, opt_level = "t_returns_result", "optimize", 0

    def run(self, graph, ctx):
        n = drop_identities(graph)
        return PassResult(n > 0, {"removed": n, "untouched": 0})


class Recorder(PassInstrument):
    name = "t_recorder"

    def __init__(self):
        self.calls = []

    def before_pipeline(self, graph, ctx):
        self.calls.append(("start", len(graph)))

    def before_pass(self, pass_, graph, ctx):
        self.calls.append(("before", pass_.name, ctx.stage, ctx.iteration, len(graph)))

    def after_pass(self, pass_, graph, ctx, result):
        self.calls.append(("after", pass_.name, result.changed, len(graph), result.seconds >= 0, result.error))

    def after_pipeline(self, graph, ctx):
        self.calls.append(("end", len(graph)))


def run_stage(*passes, instruments=(), **opts):
    g = chain()
    pm = PassManager([StagePlan("optimize", list(passes))], instruments=instruments)
    out = pm.run(g, PassContext(CompileOptions.from_any(opts), None))
    return out, pm


# -- results --------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [ReturnsBool(), ReturnsResult()], ids=["bool", "PassResult"])
def test_a_pass_returns_a_bool_or_a_result(p):
    g, pm = run_stage(p)
    assert [n.op_type for n in g.nodes] == ["Relu"]
    (rec,) = pm.records
    assert rec.name == p.name and rec.changed is True and rec.nodes_after == 1 and rec.seconds >= 0
    d = rec.as_dict()
    if isinstance(p, ReturnsResult):
        assert d["stats"] == {"removed": 3}  # zero counts left out of the report
    else:
        assert "stats" not in d


def test_both_kinds_land_in_the_compile_report(fresh_host):
    class Plug:
        @hookimpl
        def ge_register_passes(self, register):
            register(ReturnsResult())

    fresh_host.register_plugin(Plug(), "t_result_plugin")
    model = ge.compile(chain(), {"opt_level": 0})
    rec = next(p for p in model.report["passes"] if p["name"] == "t_returns_result")
    assert rec["changed"] is True and rec["stats"] == {"removed": 3}
    assert model.report["op_counts"] == {"Relu": 1}
    np.testing.assert_array_equal(model.run({"x": np.array([-1, 2], np.float32)})["relu"], [0, 2])


def test_the_one_conversion():
    assert PassResult.of(True) == PassResult(True) and PassResult.of(None) == PassResult(False)
    assert PassResult.of(2).changed is True and bool(PassResult(True)) and not PassResult()
    r = PassResult(True, {"n": 1})
    assert PassResult.of(r) is r
    with pytest.raises(TypeError, match="returned str, not bool or PassResult"):
        PassResult.of("yes")

    class Garbage(Pass):
        name, stage = "t_garbage", "optimize"

        def run(self, graph, ctx):
            return ["changed"]

    with pytest.raises(PassError, match=r"pass 't_garbage' \(stage optimize\) returned list, not bool or PassResult"):
        run_stage(Garbage())


def _logging_pass(name, log, changes=0, rerun=None):
    """A pass that records its runs and says it changed the graph its first ``changes`` times."""

    class P(Pass):
        def run(self, graph, ctx):
            log.append((name, ctx.iteration))
            done = sum(1 for n, _ in log if n == name)
            return PassResult(done <= changes, rerun=rerun)

    P.name, P.stage = name, "optimize"
    return P()


def _rounds(fixed_point, specs):
    log = []
    passes = [_logging_pass(n, log, c, r) for n, c, r in specs]
    PassManager([StagePlan("optimize", passes, fixed_point=fixed_point)]).run(chain(), PassContext(CompileOptions(), None))
    return log


def test_a_pass_says_what_it_wants_re_run():
    # fixed point, no rerun named: a change re-runs every pass that ran before it (those after it
    # see the change in the same round)
    assert _rounds(True, [("a", 1, None), ("b", 0, None), ("c", 0, None)]) == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1)]
    assert _rounds(True, [("a", 0, None), ("b", 1, None), ("c", 0, None)]) == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1)]
    # a change that names what it wants: only that, an earlier pass in the next round
    assert _rounds(True, [("a", 0, None), ("b", 0, None), ("c", 1, ("a",))]) == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1)]
    # rerun=(): changed, but nothing to re-run (the pass reached its own fixed point)
    assert _rounds(True, [("a", 2, ()), ("b", 0, None)]) == [("a", 0), ("b", 0)]
    # a later pass asked for runs in the same round; a pass the pipeline leaves out is skipped
    assert _rounds(True, [("a", 1, ("c", "t_returns_bool")), ("b", 0, None), ("c", 0, None)]) == [
        ("a", 0), ("b", 0), ("c", 0)]
    # in a stage that is no fixed point, a change re-runs nothing unless named; a named earlier
    # pass runs once more, and one that asks for itself repeats until it stops changing
    assert _rounds(False, [("a", 0, None), ("b", 1, None)]) == [("a", 0), ("b", 0)]
    assert _rounds(False, [("a", 0, None), ("b", 1, ("a",))]) == [("a", 0), ("b", 0), ("a", 1)]
    assert _rounds(False, [("a", 2, ("a",)), ("b", 0, None)]) == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]
    # bounded: a pass that always changes and asks for itself stops at max_iterations
    assert len(_rounds(False, [("a", 99, ("a",))])) == StagePlan("optimize", []).max_iterations


def test_a_rerun_of_an_unknown_pass_is_the_pass_s_bug(fresh_host):
    class AsksNonsense(Pass):
        name, stage, opt_level = "t_asks_nonsense", "optimize", 0

        def run(self, graph, ctx):
            return PassResult(drop_identities(graph) > 0, rerun=self.rerun)

    class Plug:
        @hookimpl
        def ge_register_passes(self, register):
            register(AsksNonsense())

    fresh_host.register_plugin(Plug(), "t_rerun_plugin")
    for bad, msg in ((("dcee",), r"asks to re-run unknown pass 'dcee' \(did you mean: dce"),
                     ("dce", "asks to re-run 'dce', not a tuple of pass names")):
        AsksNonsense.rerun = bad
        with pytest.raises(GEError, match=msg):
            ge.compile(chain(), {"opt_level": 0, "strict_passes": True})
    AsksNonsense.rerun = ("dce",)
    model = ge.compile(chain(), {"opt_level": 0})
    assert model.report["op_counts"] == {"Relu": 1}


def test_the_context_is_typed():
    ctx = PassContext({"constant_folding": False}, None)
    assert isinstance(ctx.options, CompileOptions) and ctx.options.constant_folding is False
    assert ctx.ops is None and ctx.switch_enabled("anything")
    with pytest.raises(OptionError):
        PassContext({"pass_transactions": "maybe"}, None)

    seen = {}

    class Reads(Pass):
        name, stage, params = "t_reads", "optimize", {"k": 1}

        def run(self, graph, ctx):
            seen.update(options=ctx.options, params=dict(ctx.params), who=ctx.who, stage=ctx.stage)
            return False

    run_stage(Reads(), pass_params={"t_reads": {"k": 5}})
    assert seen["params"] == {"k": 5} and seen["who"] == "pass 't_reads'" and seen["stage"] == "optimize"
    assert seen["options"].pass_params == {"t_reads": {"k": 5}}


# -- instruments ----------------------------------------------------------------------------------
def test_an_instrument_sees_before_and_after_of_every_pass():
    rec = Recorder()
    g, pm = run_stage(ReturnsBool(), ReturnsResult(), instruments=[rec])
    assert rec.calls == [
        ("start", 4),
        ("before", "t_returns_bool", "optimize", 0, 4), ("after", "t_returns_bool", True, 1, True, None),
        ("before", "t_returns_result", "optimize", 0, 1), ("after", "t_returns_result", False, 1, True, None),
        ("end", 1),
    ]


def test_a_registered_instrument_sees_every_pass_of_a_compile(fresh_host):
    made = []

    class Registered(Recorder):
        def __init__(self):
            super().__init__()
            made.append(self)

    plugin = Plugin("t_instrumented")
    plugin.pass_instrument(Registered)
    fresh_host.register_plugin(plugin, "t_instrumented")
    model = ge.compile(chain(), {"opt_level": 1})
    (rec,) = made
    befores = [c[1] for c in rec.calls if c[0] == "before"]
    afters = [c[1] for c in rec.calls if c[0] == "after"]
    assert befores == afters == [p["name"] for p in model.report["passes"]]
    assert rec.calls[0][0] == "start" and rec.calls[-1][0] == "end"
    # before and after alternate: each pass is wrapped, one at a time
    assert [c[0] for c in rec.calls[1:-1]] == ["before", "after"] * len(befores)
    changed = [c[2] for c in rec.calls if c[0] == "after"]
    assert changed == [p["changed"] for p in model.report["passes"]]


class Vandal(Pass):
    name, stage, opt_level = "t_vandal", "optimize", 0

    def run(self, graph, ctx):
        drop_identities(graph)
        raise RuntimeError("gave up halfway")


def test_a_rolled_back_pass_reaches_the_instrument_with_its_error():
    rec = Recorder()
    g = chain()
    pm = PassManager([StagePlan("optimize", [Vandal(), ReturnsBool()])], strict=False, guard=lambda p: True,
                     instruments=[rec])
    out = pm.run(g, PassContext(CompileOptions(), None))
    after = [c for c in rec.calls if c[0] == "after"]
    assert after[0][:4] == ("after", "t_vandal", False, 4) and "gave up halfway" in after[0][5]
    assert after[1] == ("after", "t_returns_bool", True, 1, True, None)
    assert [r.name for r in pm.records] == ["t_vandal", "t_returns_bool"] and "gave up" in pm.records[0].error
    assert pm.failures[0]["pass"] == "t_vandal" and len(out) == 1


def test_an_instrument_raising_a_ge_error_fails_the_pass():
    class Refuses(PassInstrument):
        name = "t_refuses"

        def after_pass(self, pass_, graph, ctx, result):
            if result.changed:
                raise GEError("no changes allowed")

    with pytest.raises(PassError, match=r"pass 't_returns_bool' \(stage optimize\) was refused by pass instrument "
                                        r"'t_refuses': no changes allowed \(it was the first pass\)"):
        run_stage(ReturnsBool(), instruments=[Refuses()])


def test_a_buggy_instrument_is_reported_and_the_compile_goes_on(caplog):
    class Buggy(PassInstrument):
        name = "t_buggy"

        def before_pass(self, pass_, graph, ctx):
            raise ZeroDivisionError("oops")

    g = PassManager([StagePlan("optimize", [ReturnsBool()])], strict=False, instruments=[Buggy()]).run(
        chain(), PassContext(CompileOptions(), None))
    assert len(g) == 1  # the pass ran
    assert any("t_buggy" in r.getMessage() and "ZeroDivisionError" in r.getMessage() for r in caplog.records)
    with pytest.raises(GEError, match="pass instrument 't_buggy' raised ZeroDivisionError in before_pass"):
        PassManager([StagePlan("optimize", [ReturnsBool()])], strict=True, instruments=[Buggy()]).run(
            chain(), PassContext(CompileOptions(), None))


# -- order ----------------------------------------------------------------------------------------
def test_the_standard_passes_are_ordered_by_their_declarations(fresh_host):
    from ge_passes import PASSES

    regs = fresh_host.registries
    (optimize,) = [s for s in resolve_pipeline(regs.passes, CompileOptions.from_any({"opt_level": 3}))
                   if s.name == "optimize"]
    ours = [p.name for p in optimize.passes if p.name in {c.name for c in PASSES}]
    assert ours == [c.name for c in PASSES]
    # the declarations, not the tuple: the same passes given in reverse come out in the same order
    assert [p.name for p in order_passes([c() for c in reversed(PASSES)])] == ours


def test_a_chain_of_declarations_holds_through_a_pass_left_out():
    class A(Pass):
        name = "zz_a"

    class B(Pass):
        name, after = "mm_b", ("zz_a",)

    class C(Pass):
        name, after = "aa_c", ("mm_b",)

    assert [p.name for p in order_passes([A(), C()])] == ["aa_c", "zz_a"]  # nothing relates them alone
    assert [p.name for p in order_passes([A(), C()], among=[A(), B(), C()])] == ["zz_a", "aa_c"]


class LandsAfter(Pass):
    """A third-party pass that places itself: after simplify_layout, before cse."""

    name, stage, opt_level = "aaa_third_party", "optimize", 1
    after, before = ("simplify_layout",), ("cse",)

    def run(self, graph, ctx):
        return False


def _optimize_order(capsys, *args):
    capsys.readouterr()
    assert main(["passes", "--json", *args]) == 0
    data = json.loads(capsys.readouterr().out)
    return [p["name"] for s in data["stages"] if s["stage"] == "optimize" for p in s["passes"]]


def test_a_third_party_after_declaration_places_the_pass(fresh_host, capsys, tmp_path):
    plugin = Plugin("t_third_party")
    plugin.register_pass(LandsAfter)
    fresh_host.register_plugin(plugin, "t_third_party")
    order = _optimize_order(capsys)
    i = order.index("aaa_third_party")
    # by name it would run first of the stage; its declarations put it between its anchors
    assert order[i - 1] == "simplify_layout" and order.index("cse") > i
    assert order[i + 1] == "share_constants"  # which the chain of declarations puts after simplify_layout too
    # with its anchor out of the pipeline it still follows what the anchor follows
    cfg = tmp_path / "p.toml"
    cfg.write_text('[pipeline.optimize]\ndisable = ["simplify_layout"]\n')
    order = _optimize_order(capsys, "--config", str(cfg))
    i = order.index("aaa_third_party")
    assert "simplify_layout" not in order and order[i - 1] == "sink_transposes" and order.index("cse") > i
    # at O1 (no sink_transposes, no simplify_layout) it still runs after the passes before them
    order = _optimize_order(capsys, "-O", "1")
    assert order.index("eliminate_noops") < order.index("aaa_third_party") < order.index("cse")


def test_a_contradicting_declaration_is_refused(fresh_host, capsys):
    class Contradicts(Pass):
        name, stage, opt_level = "t_contradicts", "optimize", 1
        after, before = ("dce",), ("fold_constants",)

        def run(self, graph, ctx):
            return False

    plugin = Plugin("t_contradicts")
    plugin.register_pass(Contradicts)
    fresh_host.register_plugin(plugin, "t_contradicts")
    with pytest.raises(OptionError, match="cycle among: .*t_contradicts"):
        resolve_pipeline(fresh_host.registries.passes, CompileOptions())
