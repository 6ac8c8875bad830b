"""Every hook, exercised through a ge_sdk.Plugin; meta-tests that every hookspec is documented
in docs/hooks.md and exercised here."""

import argparse
import os

import numpy as np
import pytest

import ge_core as ge
from ge_core import GEError, OpDef, OpKind, PluginError
from ge_core.backend import Backend, Executable
from ge_core.frontend import Frontend
from ge_core.memory import MemoryPlan
from ge_core.schedule import StreamAssignment
from ge_sdk import GraphBuilder, MemoryPlanner, OpMapper, Plugin, StreamAllocator
from ge_sdk.hookdoc import generate, hook_names
from ge_sdk.patterns import Op, Var

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: hook name -> tests that exercise it (filled by @covers)
COVERED: dict[str, list[str]] = {}


def covers(*hooks):
    def wrap(fn):
        for h in hooks:
            COVERED.setdefault(h, []).append(fn.__name__)
        return fn

    return wrap


def relu_graph():
    b = GraphBuilder(); x = b.input("x", "float32", (2, 3))
    b.output(b.Relu(x))
    return b.build()


@covers("ge_register_ops", "ge_register_kernels")
def test_op_decorator_registers_opdef_and_kernel(fresh_host):
    plugin = Plugin("ops_test")

    @plugin.op("Scale", domain="t.ops", kind=OpKind.ELEMWISE)
    def scale(x, factor=2.0):
        return x * factor

    @plugin.kernel("Relu", backend="toy_backend_never_used")
    def relu(x):
        return np.maximum(x, 0)

    plugin.opdef(OpDef("Nothing", domain="t.ops"))
    fresh_host.register_plugin(plugin, "ops_test")
    regs = fresh_host.registries
    d = regs.ops.lookup("t.ops", "Scale")
    assert d.kind == OpKind.ELEMWISE and d.attrs == {"factor": 2.0} and d.max_inputs == 1
    assert regs.ops.origin(("t.ops", "Scale")) == "ops_test"
    assert ("", "Relu") in regs.kernels_for("toy_backend_never_used")
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    b.output(b.op("Scale", x, domain="t.ops", factor=3.0))
    model = ge.compile(b.build())
    np.testing.assert_allclose(model.run({"x": np.ones(3, np.float32)})[model.output_names[0]], [3, 3, 3])
    assert model.graph.outputs[0].type.shape == (3,)
    assert sorted(fresh_host.info["ops_test"].hooks) == ["ge_register_kernels", "ge_register_ops"]


@covers("ge_register_passes", "ge_register_fusion_patterns")
def test_passes_and_fusion_patterns(fresh_host):
    plugin = Plugin("pass_test")

    @plugin.graph_pass("t_noop", stage="optimize", opt_level=3)
    def noop(graph, ctx):
        """Does nothing."""
        return False

    @plugin.rewrite("t_relu_relu", Op("Relu", Op("Relu", Var("x"))))
    def relu_relu(rw, m):
        return rw.op("Relu", m["x"])

    plugin.rewrite_pass("t_fuse", [relu_relu])
    fresh_host.register_plugin(plugin, "pass_test")
    regs = fresh_host.registries
    assert regs.passes.get("t_noop").opt_level == 3 and regs.passes.get("t_noop").description == "Does nothing."
    assert regs.fusion_patterns.get("t_relu_relu") is relu_relu
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    b.output(b.Relu(b.Relu(x)))
    model = ge.compile(b.build(), {"disabled_passes": ["auto_fusion"]})  # keep the Relu a Relu
    assert model.report["op_counts"] == {"Relu": 1}
    # the registered pattern is applied by the plugin's own pass, or earlier by ge_fusion's
    # pattern_fusion, which also runs every fusion pattern other plugins register
    assert any(p["name"] in ("t_fuse", "pattern_fusion") and p["changed"] for p in model.report["passes"])


@covers("ge_register_pass_instruments")
def test_pass_instrument_sees_every_pass_of_every_compile(fresh_host):
    from ge_sdk import PassInstrument

    plugin = Plugin("instrument_test")
    seen, made = [], []

    @plugin.pass_instrument
    class Watch(PassInstrument):
        name = "t_watch"

        def __init__(self):
            made.append(self)
            self.number = len(made)

        def before_pass(self, pass_, graph, ctx):
            seen.append(("before", self.number, pass_.name))

        def after_pass(self, pass_, graph, ctx, result):
            seen.append(("after", self.number, pass_.name, result.changed))

    fresh_host.register_plugin(plugin, "instrument_test")
    assert fresh_host.registries.pass_instruments.origin("t_watch") == "instrument_test"
    for _ in range(2):
        ge.compile(relu_graph(), {"opt_level": 0})
    ran = [s[2] for s in seen if s[0] == "before"]
    assert ran == ["infer_shapes", "atc_aipp", "atc_output_type", "quantize", "qdq_regions", "int8_kernels",
                   "atc_precision", "reduced_precision"] * 2
    assert [s[2] for s in seen if s[0] == "after"] == ran and all(s[3] is False for s in seen if s[0] == "after")
    assert [s[1] for s in seen if s[0] == "before"] == [1] * 8 + [2] * 8  # a registered class: one instance per compile


@covers("ge_register_frontends", "ge_graph_loaded")
def test_frontend_and_graph_loaded_observer(fresh_host, tmp_path):
    plugin = Plugin("fe_test")
    seen = []

    @plugin.frontend
    class Toy(Frontend):
        name = "toy"
        suffixes = (".toy",)

        def load(self, source, options):
            n = int(open(source).read())
            b = GraphBuilder(); x = b.input("x", "float32", (n,))
            b.output(b.Relu(x))
            return b.graph

    @plugin.on("ge_graph_loaded")
    def loaded(graph, framework):
        seen.append((framework, len(graph)))

    fresh_host.register_plugin(plugin, "fe_test")
    path = tmp_path / "m.toy"
    path.write_text("4")
    g = ge.load(str(path))
    assert g.inputs[0].type.shape == (4,) and seen == [("toy", 1)]


@covers("ge_register_op_mappers")
def test_op_mappers(fresh_host):
    plugin = Plugin("map_test")

    @plugin.op_mapper("toyfw", "MyOp")
    def my_op(*args):
        return "mapped"

    class Other(OpMapper):
        framework, op_type = "toyfw", "Other"

        def map(self, *args):
            return "other"

    plugin.op_mapper(Other())
    fresh_host.register_plugin(plugin, "map_test")
    regs = fresh_host.registries
    assert regs.op_mappers.get(("toyfw", "MyOp"))() == "mapped"
    assert regs.op_mappers.get(("toyfw", "Other"))() == "other"


@covers("ge_register_stream_allocators", "ge_register_memory_planners", "ge_model_built")
def test_stream_allocator_memory_planner_and_model_built(fresh_host):
    plugin = Plugin("sched_test")
    built = []

    class Alternate(StreamAllocator):
        name = "t_alternate"

        def allocate(self, graph, options):
            return StreamAssignment([0] * len(graph), [])

    plugin.stream_allocator(Alternate)

    @plugin.memory_planner("t_no_reuse")
    def no_reuse(problem, options):
        offsets, off = {}, 0
        for buf in problem.buffers:
            offsets[buf.name] = off
            off += -(-buf.size // problem.alignment) * problem.alignment
        return MemoryPlan(offsets, off)

    class Stacked(MemoryPlanner):
        name = "t_stacked"

        def plan(self, problem, options):
            return no_reuse(problem, options)

    plugin.memory_planner(Stacked())

    @plugin.on("ge_model_built")
    def on_built(model):
        built.append(model.report["memory"]["planner"])

    fresh_host.register_plugin(plugin, "sched_test")
    b = GraphBuilder(); x = b.input("x", "float32", (2, 3))
    b.output(b.Relu(b.Sigmoid(b.Tanh(x))))
    for planner in ("t_no_reuse", "t_stacked"):
        model = ge.compile(b.build(), {"stream_allocator": "t_alternate", "memory_planner": planner})
        assert model.streams.count == 1
        assert model.run({"x": np.zeros((2, 3), np.float32)})
    assert built == ["t_no_reuse", "t_stacked"]


@covers("ge_register_backends", "ge_register_options")
def test_backend_and_options(fresh_host):
    plugin = Plugin("be_test")
    plugin.option("t_answer", 42, "a plugin option")

    class ConstExe(Executable):
        kernel_count = 7

        def __init__(self, model):
            self.model = model

        def run(self, feeds):
            return [np.full((2, 3), self.model.options.extra.get("t_answer", 42), np.float32)]

    @plugin.backend
    class Toy(Backend):
        name = "toy_be"
        aliases = ("ToyChip",)

        def build(self, model, kernels, context):
            return ConstExe(model)

    fresh_host.register_plugin(plugin, "be_test")
    model = ge.compile(relu_graph(), {"soc_version": "ToyChip", "t_answer": 5})
    assert model.report["backend"] == "toy_be" and model.report["kernels"] == 7
    assert model.run({"x": np.zeros((2, 3), np.float32)})[model.output_names[0]][0, 0] == 5
    with pytest.raises(GEError, match="t_answr.*did you mean: t_answer"):
        ge.compile(relu_graph(), {"t_answr": 1})


@covers("ge_register_cli_commands")
def test_cli_commands(fresh_host, capsys):
    from ge_core.cli import main

    plugin = Plugin("cli_test")

    def configure(p: argparse.ArgumentParser):
        p.add_argument("--times", type=int, default=1)

    @plugin.command("t-hello", "say hello", configure=configure)
    def hello(args):
        print("hello " * args.times)
        return 0

    fresh_host.register_plugin(plugin, "cli_test")
    assert main(["t-hello", "--times", "2"]) == 0
    assert "hello hello" in capsys.readouterr().out
    # the SDK's own commands come through the same door
    assert {"new-plugin", "viz"} <= set(fresh_host.registries.cli_commands.keys())
    assert fresh_host.registries.cli_commands.origin("viz") == "ge_sdk"


class ScaledKind:
    """A toy .om kind (partition ``scale``): the core's model, its outputs times the partition's number."""

    def load(self, path, container, host, verify_checksums, run_options):
        from ge_core.om import model_from_definition, read_model_definition, weight_buffers

        d = read_model_definition(path, container)
        blob = weight_buffers(path, d, container, verify_checksums)
        model = model_from_definition(path, d, container.partition("model"), blob, container, host, run_options)
        factor = int(bytes(container.partition("scale")))
        return argparse.Namespace(run=lambda feeds: {k: v * factor for k, v in model.run(feeds).items()},
                                  timings={}, factor=factor)

    def inspect(self, path, container):
        return {"model": {"scale": int(bytes(container.partition("scale")))}}

    def definition(self, path, container):
        from ge_core.om import read_model_definition

        return read_model_definition(path, container)


@covers("ge_register_om_kinds")
def test_om_kind_reads_an_om_holding_its_partition(fresh_host, tmp_path):
    from ge_core.om import stored_definition
    from ge_core.om_container import read_container, write_container
    from ge_sdk.omdesc import inspect_om

    plain, scaled = str(tmp_path / "m.om"), str(tmp_path / "scaled.om")
    ge.compile(relu_graph()).save(plain)
    with read_container(plain) as c:
        write_container(scaled, [("model", bytes(c.partition("model")), 8), ("weights", bytes(c.partition("weights")), 4096),
                                 ("scale", b"3", 8)], producer="test")
    x = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
    unread = ge.load_om(scaled)  # no plugin reads 'scale': the core's model, the partition ignored
    np.testing.assert_array_equal(next(iter(unread.run({"x": x}).values())), np.maximum(x, 0))

    class Kinds:
        @ge.hookimpl
        def ge_register_om_kinds(self, register):
            register("scale", ScaledKind())

    fresh_host.register_plugin(Kinds(), "kinds_test")
    assert fresh_host.registries.om_kinds.origin("scale") == "kinds_test"
    model = ge.load_om(scaled)
    assert model.factor == 3 and "load_seconds" in model.timings
    np.testing.assert_array_equal(next(iter(model.run({"x": x}).values())), 3 * np.maximum(x, 0))
    info = inspect_om(scaled)
    assert info["model"] == {"scale": 3} and [p["kind"] for p in info["file"]["partitions"]] == ["model", "weights", "scale"]
    with read_container(scaled) as c:
        assert stored_definition(scaled, c, fresh_host)["format"] == "ge-model"
    assert ge.load_om(plain).run({"x": x})  # a plain .om still loads as the core's model


def test_a_failing_or_invalid_om_kind_is_a_plugin_error(fresh_host, tmp_path):
    from ge_core.om_container import read_container, write_container

    class Broken(ScaledKind):
        def load(self, path, container, host, verify_checksums, run_options):
            raise ValueError("boom")

    class Kinds:
        @ge.hookimpl
        def ge_register_om_kinds(self, register):
            register("scale", Broken())

    class Bad:
        @ge.hookimpl
        def ge_register_om_kinds(self, register):
            register("model", ScaledKind())  # the core's own partition

    class Odd:
        @ge.hookimpl
        def ge_register_om_kinds(self, register):
            register("other", object())

    fresh_host.register_plugin(Kinds(), "broken_kind")
    fresh_host.register_plugin(Bad(), "bad_kind")
    fresh_host.register_plugin(Odd(), "odd_kind")
    plain, scaled = str(tmp_path / "m.om"), str(tmp_path / "scaled.om")
    ge.compile(relu_graph()).save(plain)
    with read_container(plain) as c:
        write_container(scaled, [("model", bytes(c.partition("model")), 8), ("weights", bytes(c.partition("weights")), 4096),
                                 ("scale", b"3", 8)], producer="test")
    with pytest.raises(PluginError, match=r"plugin 'broken_kind' failed to load '.*scaled.om' \(its 'scale' partition\): "
                                          r"ValueError: boom"):
        ge.load_om(scaled)
    errors = fresh_host.info["bad_kind"].errors
    assert len(errors) == 1 and "om kind partition 'model' is not a partition name of its own" in errors[0]
    assert "om kind 'other' (object) has no load, inspect and definition methods" in fresh_host.info["odd_kind"].errors[0]
    assert set(fresh_host.registries.om_kinds.keys()) == {"gears", "scale"}  # nothing of theirs kept


@covers("ge_before_pass", "ge_after_pass")
def test_pass_observers(fresh_host):
    plugin = Plugin("obs_test")
    events = []

    @plugin.on("ge_before_pass")
    def before(pass_name, stage):
        events.append(("before", pass_name, stage))

    @plugin.on("ge_after_pass")
    def after(pass_name, changed, seconds):
        events.append(("after", pass_name, seconds >= 0))

    @plugin.on("ge_after_pass")
    def after_too(graph):
        events.append(("graph", len(graph)))

    fresh_host.register_plugin(plugin, "obs_test")
    ge.compile(relu_graph())
    assert ("before", "infer_shapes", "prepare") in events and ("after", "infer_shapes", True) in events
    assert ("graph", 1) in events
    with pytest.raises(PluginError, match="did you mean: ge_after_pass"):
        plugin.on("ge_afterpass")


def test_plugin_lists_only_the_hooks_it_uses(fresh_host):
    plugin = Plugin("few")
    plugin.option("t_x", 1)
    fresh_host.register_plugin(plugin, "few")
    assert fresh_host.info["few"].hooks == ["ge_register_options"] and not fresh_host.info["few"].errors
    assert "ge_register_options" in repr(plugin)


# ------------------------------------------------------------------------------------------------
# meta-tests
# ------------------------------------------------------------------------------------------------
def test_every_hookspec_is_exercised_by_a_test():
    missing = [h for h in hook_names() if h not in COVERED]
    assert not missing, f"hooks without a test: {missing}"
    assert not set(COVERED) - set(hook_names()), "tests claim hooks that do not exist"


def test_every_hookspec_is_documented_and_docs_are_current():
    with open(os.path.join(ROOT, "docs", "hooks.md"), encoding="utf-8") as f:
        text = f.read()
    for h in hook_names():
        assert f"## {h}" in text, h
    assert text == generate(), "docs/hooks.md is stale: run `python -m ge_sdk.hookdoc > docs/hooks.md`"
    with open(os.path.join(ROOT, "docs", "plugin-guide.md"), encoding="utf-8") as f:
        guide = f.read()
    assert "hooks.md" in guide


def test_every_hookspec_says_what_it_returns():
    from ge_core import hookspecs

    for h in hook_names():
        doc = getattr(hookspecs, h).__doc__ or ""
        assert "Return" in doc or "return" in doc, h
