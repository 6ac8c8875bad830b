"""Nothing an .om stores is trusted unchecked (issue 15): the memory plan and stream assignment
are verified as the compiler verifies them, writer and reader share one table of limits, options
survive save and load exactly, and hostile JSON gets an OmFormatError."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ge_core as ge
from ge_core import GEError, GraphError, OmFormatError, OptionError, TensorType
from ge_core.om import model_definition
from ge_core.om_container import write_container
from ge_core.plugins import get_host
from ge_core.schedule import StreamAssignment
from ge_core.serialize import LIMITS, json_problem
from ge_sdk.omdesc import inspect_om


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def diamond(name_x: str = "x", name_out: str = "out") -> ge.Graph:
    """Several intermediates alive at once, so a plan that puts them together is wrong."""
    g = ge.Graph("diamond")
    g.opset_imports[""] = 17
    x = g.add_input(name_x, TensorType("float32", (4, 8)))
    a = g.add_node("Relu", [x], name="a").output
    b = g.add_node("Sigmoid", [a], name="b").output
    c = g.add_node("Tanh", [a], name="c").output
    d = g.add_node("Add", [b, c], name="d").output
    e = g.add_node("Mul", [d, a], name="e").output
    g.set_outputs([g.add_node("Neg", [e], name=name_out).output])
    return g


def diamond_ref(x: np.ndarray) -> np.ndarray:
    a = np.maximum(x, 0)
    return -((1 / (1 + np.exp(-a)) + np.tanh(a)) * a)


def branches(width: int = 3, depth: int = 3) -> ge.Graph:
    """Independent chains a multi-stream allocator spreads over streams."""
    g = ge.Graph("branches")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType("float32", (16, 16)))
    ends = []
    for i in range(width):
        v = x
        for j in range(depth):
            v = g.add_node(["Relu", "Sigmoid", "Tanh"][(i + j) % 3], [v], name=f"n{i}_{j}").output
        ends.append(v)
    s = ends[0]
    for k, v in enumerate(ends[1:]):
        s = g.add_node("Add", [s, v], name=f"sum{k}").output
    g.set_outputs([s])
    return g


def definition(model):
    d, weights = model_definition(model)
    return json.loads(json.dumps(d)), b"".join(bytes(c) for c in weights.chunks())


def write(tmp_path, d, blob, text: str | None = None, name: str = "h.om"):
    p = tmp_path / name
    raw = (text if text is not None else json.dumps(d)).encode()
    write_container(p, [("model", raw, 8), ("weights", blob, 4096)], producer="test")
    return p


X = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def diamond_model():
    return ge.compile(diamond(), {"opt_level": 0})


# ------------------------------------------------------------------------------------------------
# 1. the stored memory plan and stream assignment are verified
# ------------------------------------------------------------------------------------------------
def test_stored_plan_is_verified_like_a_fresh_one(tmp_path, diamond_model):
    d, blob = definition(diamond_model)
    assert len(d["memory_plan"]["offsets"]) >= 3
    np.testing.assert_allclose(ge.load_om(write(tmp_path, d, blob)).run({"x": X})["out"], diamond_ref(X), rtol=1e-6)

    def bad(mutate, match):
        e = json.loads(json.dumps(d))
        mutate(e["memory_plan"])
        p = write(tmp_path, e, blob)
        with pytest.raises(OmFormatError, match=match) as info:
            ge.load_om(p)
        assert str(p) in str(info.value) and "memory plan" in str(info.value)

    bad(lambda m: m.update(offsets={k: 0 for k in m["offsets"]}), "overlaps")  # loaded and ran wrong before
    bad(lambda m: m["offsets"].update(a=m["offsets"]["a"] + 1), "misaligned")
    bad(lambda m: m["offsets"].update(out=0), "no intermediate buffer")  # the graph output into the arena
    bad(lambda m: m["offsets"].update(x=0), "no intermediate buffer")  # the graph input
    bad(lambda m: m["offsets"].pop("a"), "misses")
    bad(lambda m: m.update(arena_bytes=1 << 40), "every buffer side by side")
    shared = [k for k, v in diamond_model.report["memory"]["shared_values"].items() if v]
    assert shared  # in-place outputs share their input's bytes: moving one apart is refused too
    member = next(k for k in d["memory_plan"]["offsets"]
                  if list(d["memory_plan"]["offsets"].values()).count(d["memory_plan"]["offsets"][k]) > 1)
    bad(lambda m: m["offsets"].update({member: m["offsets"][member] + 64 if m["offsets"][member] == 0 else 0}),
        "apart from|overlaps|misses")


def test_stored_stream_assignment_is_verified(tmp_path):
    model = ge.compile(branches(), {"stream_allocator": "dependency", "opt_level": 0, "executor": "streams"})
    assert model.streams.count > 1 and model.streams.events
    d, blob = definition(model)
    x = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    want = model.run({"x": x})
    got = ge.load_om(write(tmp_path, d, blob)).run({"x": x})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])

    e = json.loads(json.dumps(d))
    e["streams"]["events"] = []  # cross-stream reads with nothing ordering them: a data race
    with pytest.raises(OmFormatError, match="stream assignment.*no event ordering them"):
        ge.load_om(write(tmp_path, e, blob))
    e = json.loads(json.dumps(d))
    e["streams"]["streams"] = [i % 2 for i in range(len(e["streams"]["streams"]))]
    with pytest.raises(OmFormatError, match="stream assignment"):
        ge.load_om(write(tmp_path, e, blob))
    e = json.loads(json.dumps(d))
    e["streams"]["streams"][0] = LIMITS.streams
    with pytest.raises(OmFormatError, match="stream id 0..1023"):
        ge.load_om(write(tmp_path, e, blob))


def test_memory_problem_is_one_public_function():
    from ge_core import compiler

    assert callable(compiler.memory_problem) and not hasattr(compiler, "_memory_problem")


# ------------------------------------------------------------------------------------------------
# 2. writer and reader share limits: just under round-trips, just over is refused at save
# ------------------------------------------------------------------------------------------------
def nested_ifs(levels: int) -> ge.Graph:
    """``levels`` subgraphs inside each other (If in the then-branch of an If ...)."""
    g = ge.Graph("nested")
    g.opset_imports[""] = 17
    c = g.add_input("c", TensorType("bool", ()))
    x = g.add_input("x", TensorType("float32", (3,)))

    def body(parent: ge.Graph, level: int) -> ge.Graph:
        sub = ge.Graph(f"then{level}", parent=parent)
        if level == levels:
            sub.set_outputs([sub.add_node("Relu", [x], name=f"relu{level}").output])
            return sub
        els = ge.Graph(f"else{level}", parent=sub)
        els.set_outputs([els.add_node("Neg", [x], name=f"neg{level}").output])
        node = sub.add_node("If", [c], {"then_branch": body(sub, level + 1), "else_branch": els}, name=f"if{level}")
        sub.set_outputs([node.output])
        return sub

    els = ge.Graph("else0", parent=g)
    els.set_outputs([els.add_node("Neg", [x], name="neg0").output])
    node = g.add_node("If", [c], {"then_branch": body(g, 1), "else_branch": els}, name="if0")
    g.set_outputs([node.output])
    return g


def roundtrip(model, tmp_path, feeds, name="m.om"):
    want = model.run(feeds)
    loaded = ge.load_om(model.save(tmp_path / name))
    got = loaded.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    return loaded


def test_subgraph_depth_limit(tmp_path):
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    feeds = {"c": np.array(True), "x": x}
    ok = ge.compile(nested_ifs(LIMITS.subgraph_depth), {"opt_level": 0})
    assert LIMITS.subgraph_depth == 32
    loaded = roundtrip(ok, tmp_path, feeds)
    np.testing.assert_array_equal(loaded.run(feeds)[loaded.output_names[0]], np.maximum(x, 0))
    over = ge.compile(nested_ifs(LIMITS.subgraph_depth + 1), {"opt_level": 0})
    over.run(feeds)  # the engine runs it; only an .om cannot hold it
    with pytest.raises(GraphError, match="subgraph_depth") as info:
        over.save(tmp_path / "over.om")
    assert "over.om" in str(info.value)
    assert not (tmp_path / "over.om").exists()


def one_node(input_name="x", shape=(2, 3), op="Relu", attrs=None, node_name="n", out_name=None) -> ge.Graph:
    g = ge.Graph("one")
    g.opset_imports[""] = 17
    x = g.add_input(input_name, TensorType("float32", shape))
    n = g.add_node(op, [x], attrs or {}, name=node_name, output_names=[out_name] if out_name else None)
    g.set_outputs([n.output])
    return g


def test_name_rank_symbol_limits(tmp_path):
    n = LIMITS.name_length
    x = np.ones((2, 3), np.float32)
    roundtrip(ge.compile(one_node("x" * n, node_name="n" * n), {"opt_level": 0}), tmp_path, {"x" * n: x})
    with pytest.raises(GraphError, match="name_length"):
        ge.compile(one_node("x" * (n + 1)), {"opt_level": 0}).save(tmp_path / "long.om")
    with pytest.raises(GraphError, match="name_length"):
        ge.compile(one_node(node_name="n" * (n + 1)), {"opt_level": 0}).save(tmp_path / "long2.om")

    r = LIMITS.rank
    xr = np.ones((1,) * r, np.float32)
    roundtrip(ge.compile(one_node(shape=(1,) * r), {"opt_level": 0}), tmp_path, {"x": xr})
    over = ge.compile(one_node(shape=(1,) * (r + 1)), {"opt_level": 0})
    with pytest.raises(GraphError, match="limit rank"):
        over.save(tmp_path / "rank.om")

    s = LIMITS.symbol_length
    roundtrip(ge.compile(one_node(shape=("N" * s, 3)), {"opt_level": 0}), tmp_path, {"x": x})
    with pytest.raises(GraphError, match="symbol_length"):
        ge.compile(one_node(shape=("N" * (s + 1), 3)), {"opt_level": 0}).save(tmp_path / "sym.om")


def test_attribute_int_limit(tmp_path):
    x = np.ones((2, 3), np.float32)
    ok = ge.compile(one_node(attrs={"zz_note": LIMITS.int_max}), {"opt_level": 0})
    loaded = roundtrip(ok, tmp_path, {"x": x})
    assert next(iter(loaded.graph.nodes)).attrs["zz_note"] == 2**63 - 1
    over = ge.compile(one_node(attrs={"zz_note": LIMITS.int_max + 1}), {"opt_level": 0})
    with pytest.raises(GraphError, match="outside int64"):
        over.save(tmp_path / "int.om")


def test_json_depth_limit_is_the_same_at_both_ends(tmp_path):
    """Find the deepest nested-list attribute the writer takes: it loads; one more is refused at save."""
    def model(depth):
        v: object = 0
        for _ in range(depth):
            v = [v]
        return ge.compile(one_node(attrs={"zz_nested": v}), {"opt_level": 0})

    lo, hi = 1, LIMITS.json_depth
    while lo < hi:  # the largest depth whose definition is within the limits
        mid = (lo + hi + 1) // 2
        if json_problem(model_definition(model(mid))[0]) is None:
            lo = mid
        else:
            hi = mid - 1
    assert LIMITS.json_depth // 2 - 8 < lo < LIMITS.json_depth // 2
    roundtrip(model(lo), tmp_path, {"x": np.ones((2, 3), np.float32)})
    with pytest.raises(GraphError, match="json_depth"):
        model(lo + 1).save(tmp_path / "deep.om")


def test_stream_id_limit(tmp_path):
    x = np.ones((2, 3), np.float32)
    m = ge.compile(one_node(), {"opt_level": 0, "executor": "sequential"})
    n = len(m.graph)
    m.streams = StreamAssignment([LIMITS.streams - 1] * n, [])
    loaded = roundtrip(m, tmp_path, {"x": x})
    assert loaded.streams.streams == [LIMITS.streams - 1] * n
    m.streams = StreamAssignment([LIMITS.streams] * n, [])
    with pytest.raises(GraphError, match="limit streams"):
        m.save(tmp_path / "streams.om")


def test_limits_are_one_table():
    from ge_core import memory, om, om_container, serialize

    assert serialize.MAX_NAME == LIMITS.name_length and serialize.MAX_RANK == LIMITS.rank
    assert LIMITS.partitions == om_container.MAX_PARTITIONS and LIMITS.arena_bytes == memory.MAX_ARENA_BYTES
    assert om.MAX_MODEL_JSON == LIMITS.model_json_bytes


# ------------------------------------------------------------------------------------------------
# 3. options survive save and load, and are checked like user options
# ------------------------------------------------------------------------------------------------
#: A valid non-default value for each plugin option of this repository.
PLUGIN_VALUES = {"executor": "arena", "memory_alignment": 128, "max_streams": 3, "max_stream_nodes": 7,
                 "example_inputs": [[1, 2]], "example_kwargs": {"k": 1}, "dynamic_shapes": {"x": {"0": "N"}},
                 "torch_decompose": False,
                 "fusion_switches": {"ALL": False}}  # what fusion_switch_file (below) gives


def non_default(default):
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 2 + 1
    if isinstance(default, str):
        return default
    return ["x"]


def test_every_option_roundtrips(tmp_path):
    regs = get_host().registries
    switch = tmp_path / "switch.json"
    switch.write_text(json.dumps({"Switch": {"GraphFusion": {"ALL": "off"}}}))
    config = tmp_path / "p.toml"
    config.write_text("[options]\nlog = \"error\"\n")
    core = {
        "framework": "onnx", "input_shape": {"x": [4, 8]}, "out_nodes": ["out"], "soc_version": "host",
        "fusion_switch_file": str(switch), "memory_optimize_level": "high", "constant_folding": False,
        "enable_single_stream": True, "disable_reuse_memory": True, "log": "error", "stream_allocator": "single",
        "memory_planner": "greedy_by_size", "opt_level": 3, "verify_each_pass": True, "strict_passes": True,
        "pass_transactions": "all", "dump_ir": str(tmp_path / "dump"), "threads": 2,
        "pipeline": {"optimize": {"fixed_point": True, "max_iterations": 3}},
        "pass_params": {"fold_constants": {"size_limit": 4096}}, "disabled_passes": ["cse"], "config": str(config),
    }
    defaults = ge.CompileOptions().as_dict()
    assert set(core) == set(defaults) - {"extra", "fusion_switches"}, "a new core option needs a value here"
    plugin = {k: PLUGIN_VALUES.get(k, non_default(v[0])) for k, v in regs.options.items()}
    assert set(PLUGIN_VALUES) <= set(plugin)
    opts = ge.CompileOptions.from_any({**core, **plugin})
    opts.read_by_plugins(regs.option_readers)  # as ge.compile does
    d = opts.as_dict()
    for k, v in d.items():
        assert v != defaults[k], f"option {k} is not set to a non-default value"
    model = ge.compile(diamond(), opts)
    assert type(model.executable).__name__.startswith("Arena")
    loaded = roundtrip(model, tmp_path, {"x": X})
    want = dict(d, dump_ir=None)  # the dump folder is a compile-time choice: an .om never dumps
    assert loaded.options.as_dict() == want
    assert loaded.options.extra == plugin and "extra" not in loaded.options.extra  # not nested as extra.extra
    assert type(loaded.executable).__name__ == type(model.executable).__name__
    assert loaded.memory_plan.planner == model.memory_plan.planner == "none"  # disable_reuse_memory


def test_options_nested_by_the_old_loader_are_read(tmp_path, diamond_model):
    """ge 0.1.0 nested plugin options as extra.extra on load, and kept that on re-save."""
    d, blob = definition(diamond_model)
    d["options"]["extra"] = {"extra": {"extra": {"executor": "arena"}, "memory_alignment": 64}}
    loaded = ge.load_om(write(tmp_path, d, blob))
    assert loaded.options.extra == {"executor": "arena", "memory_alignment": 64}
    assert type(loaded.executable).__name__.startswith("Arena")


def test_update_takes_as_dict_output():
    opts = ge.CompileOptions.from_any({"executor": "sink", "max_streams": 2})
    again = ge.CompileOptions.from_any(opts.as_dict())
    assert again.extra == {"executor": "sink", "max_streams": 2} and again.as_dict() == opts.as_dict()
    with pytest.raises(OptionError, match="extra"):
        ge.CompileOptions.from_any({"extra": [1]})


@pytest.mark.parametrize("options, match", [
    ({"bogus_option": 1}, "unknown compile option 'bogus_option'"),
    ({"extra": {"bogus_plugin_option": 1}}, "unknown compile option 'bogus_plugin_option'"),
    ({"opt_level": "fast"}, "opt_level"),
    ({"constant_folding": "maybe"}, "constant_folding"),
    ({"input_shape": {"x": [1.5]}}, "input_shape"),
    ({"pipeline": {"optimize": {"fixed_point": 3}}}, "fixed_point"),
    ({"extra": {"executor": 5}}, "executor .*must be str"),
    ({"extra": {"executor": "turbo"}}, "executor 'turbo'"),
    ({"extra": {"memory_alignment": 100}}, "alignment"),
    ({"extra": {"max_streams": "many"}}, "max_streams .*must be int"),
    ({"extra": {"opt_level": 1}}, "extra"),
    ({"config": 5}, "config"),
    ([], "options"),
])
def test_stored_options_are_checked_like_user_options(tmp_path, diamond_model, options, match):
    d, blob = definition(diamond_model)
    if isinstance(options, dict):
        d["options"].update(options)
    else:
        d["options"] = options
    with pytest.raises(OmFormatError, match=match):
        ge.load_om(write(tmp_path, d, blob))


def test_plugin_options_are_type_checked_at_compile_too():
    with pytest.raises(OptionError, match="max_streams .*must be int"):
        ge.compile(diamond(), {"max_streams": "many"})


# ------------------------------------------------------------------------------------------------
# 4. hostile JSON: OmFormatError, never a raw ValueError/TypeError/OverflowError/RecursionError
# ------------------------------------------------------------------------------------------------
RAW = "@@RAW@@"


def _set(path: str, value):
    def f(d):
        keys = path.split(".")
        t = d
        for k in keys[:-1]:
            t = t[int(k)] if isinstance(t, list) else t[k]
        t[int(keys[-1]) if isinstance(t, list) else keys[-1]] = value
    return f


HOSTILE = [
    ("metadata-huge-int", _set("graph.metadata.zz", RAW), "9" * 5000),
    ("metadata-30-digits", _set("graph.metadata.zz", RAW), "1" + "0" * 30),
    ("metadata-not-object", _set("graph.metadata", [1, 2]), None),
    ("report-nan", _set("report.zz", RAW), "NaN"),
    ("report-infinity", _set("report.memory.arena_bytes", RAW), "-Infinity"),
    ("report-overflow-float", _set("report.compile_seconds", RAW), "1e999"),
    ("report-arena-string", _set("report.memory.arena_bytes", "lots"), None),
    ("report-op-counts", _set("report.op_counts", {"Relu": "many"}), None),
    ("report-memory-list", _set("report.memory", []), None),
    ("report-not-object", _set("report", "zzz"), None),
    ("report-deep", _set("report.zz", RAW), "[" * 300 + "]" * 300),
    ("report-very-deep", _set("report.zz", RAW), "[" * 100000 + "]" * 100000),
    ("options-list", _set("options", [1]), None),
    ("options-huge-int", _set("options.threads", RAW), "9" * 400),
    ("options-nan", _set("options.opt_level", RAW), "NaN"),
    ("options-opt-level", _set("options.opt_level", [3]), None),
    ("streams-string", _set("streams", "s"), None),
    ("streams-ids", _set("streams.streams", ["a"] * 6), None),
    ("streams-bool", _set("streams.events", [[True, 2]]), None),
    ("plan-offsets-string", _set("memory_plan.offsets.a", "0"), None),
    ("plan-list", _set("memory_plan", [0]), None),
    ("plan-arena-float", _set("memory_plan.arena_bytes", 1.5), None),
    ("graph-name-int", _set("graph.name", 5), None),
    ("graph-list", _set("graph", []), None),
    ("node-meta-list", _set("graph.nodes.0.meta", [1]), None),
    ("node-attr-huge", _set("graph.nodes.0.attrs", {"zz": {"i": RAW}}), "-" + "9" * 20),
    ("node-attr-float-huge", _set("graph.nodes.0.attrs", {"zz": {"f": RAW}}), "9" * 30),
    ("weights-offset-huge", _set("weights", [{"dtype": "float32", "shape": [1], "offset": RAW, "nbytes": 4}]), "9" * 25),
    ("producer-int", _set("producer", 7), None),
    ("version-bool", _set("version", True), None),
]


@pytest.mark.parametrize("name, mutate, raw", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_json_is_an_omformaterror(tmp_path, diamond_model, name, mutate, raw):
    d, blob = definition(diamond_model)
    mutate(d)
    text = json.dumps(d)
    if raw is not None:
        text = text.replace(json.dumps(RAW), raw)
    p = write(tmp_path, d, blob, text)
    for reader in (ge.load_om, inspect_om):
        try:
            reader(p)
        except OmFormatError as e:
            assert str(p) in str(e)
        else:
            pytest.fail(f"{reader.__name__} accepted {name}")


def test_metadata_is_data(tmp_path, diamond_model):
    """Metadata the reader once used for its own bookkeeping (a TypeError then) is plain data."""
    d, blob = definition(diamond_model)
    d["graph"]["metadata"]["_depth"] = "x"
    loaded = ge.load_om(write(tmp_path, d, blob))
    assert loaded.graph.metadata["_depth"] == "x"
    np.testing.assert_allclose(loaded.run({"x": X})["out"], diamond_ref(X), rtol=1e-6)


def test_inspect_and_run_print_model_text_as_plain_text(tmp_path):
    from ge_core.cli import main

    model = ge.compile(diamond("x[/b]", "[red]y:thumbs_up:"), {"opt_level": 0})
    p = model.save(tmp_path / "markup.om")
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "inspect", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "x[/b] float32" in r.stdout and "[red]y:thumbs_up:" in r.stdout
    np.save(tmp_path / "x.npy", X)
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "run", str(p), "--input", f"x[/b]={tmp_path / 'x.npy'}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "[red]y:thumbs_up:: float32[4, 8]" in r.stdout
    assert main(["inspect", str(p)]) == 0  # in-process too (no MarkupError)


# ------------------------------------------------------------------------------------------------
# 5. ge run --output-dir: one file per output, and the command says which
# ------------------------------------------------------------------------------------------------
def clashing_outputs() -> ge.Graph:
    g = ge.Graph("clash")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType("float32", (2, 2)))
    outs = [g.add_node(op, [x], name=f"n{i}", output_names=[name]).output
            for i, (op, name) in enumerate([("Relu", "a/b"), ("Neg", "a_b"), ("Abs", "A_b"), ("Sigmoid", "a:b")])]
    g.set_outputs(outs)
    return g


def test_output_file_names_are_unique_and_deterministic():
    from ge_sdk.cli import output_file_names

    names = ["a/b", "a_b", "A_b", "a:b", "", "ok", "a_b_2", "é"]
    got = output_file_names(names)
    assert got == ["a_b.npy", "a_b_2.npy", "A_b_3.npy", "a_b_4.npy", "output4.npy", "ok.npy", "a_b_2_2.npy", "é.npy"]
    assert len({n.lower() for n in got}) == len(got) and output_file_names(names) == got
    assert all(len(n) <= 108 for n in output_file_names(["x" * 5000, "x" * 5000]))


def test_run_output_dir_keeps_every_output(tmp_path):
    model = ge.compile(clashing_outputs(), {"opt_level": 0})
    p = model.save(tmp_path / "clash.om")
    x = np.array([[-1.0, 2.0], [0.5, -3.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "run", str(p), "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = {"a/b": np.maximum(x, 0), "a_b": -x, "A_b": np.abs(x), "a:b": 1 / (1 + np.exp(-x))}
    files = sorted(os.listdir(out))
    assert len(files) == 4, files
    for name, fname in zip(want, ["a_b.npy", "a_b_2.npy", "A_b_3.npy", "a_b_4.npy"]):
        np.testing.assert_allclose(np.load(out / fname), want[name], rtol=1e-6)
        assert f"{name}: float32[2, 2]" in r.stdout and str(out / fname) in r.stdout
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "run", str(p), "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(out), "--json"], capture_output=True, text=True)
    info = json.loads(r.stdout)["outputs"]
    assert {k: v["file"] for k, v in info.items()} == {
        "a/b": str(out / "a_b.npy"), "a_b": str(out / "a_b_2.npy"), "A_b": str(out / "A_b_3.npy"),
        "a:b": str(out / "a_b_4.npy")}


# ------------------------------------------------------------------------------------------------
# 6. Python 3.10 (tomli) and TOML configs checked like other inputs
# ------------------------------------------------------------------------------------------------
def test_tomli_is_used_where_tomllib_is_missing(tmp_path):
    """On Python 3.10 there is no tomllib: options reads TOML with tomli (the same parser)."""
    code = (
        "import sys\n"
        "try:\n    import tomllib as real\nexcept ImportError:\n    import tomli as real\n"
        "sys.modules['tomli'] = real\n"  # stands in for the tomli distribution (on 3.11+)
        "sys.modules['tomllib'] = None\n"   # import tomllib now fails, as on 3.10
        "sys.version_info = (3, 10, 14, 'final', 0)\n"
        "import ge_core.options as o\n"
        "assert o.tomllib is sys.modules['tomli']\n"
        f"opts = o.CompileOptions.from_config({str(tmp_path / 'c.toml')!r})\n"
        "assert opts.opt_level == 3, opts.opt_level\n"
        "print('ok')\n"
    )
    (tmp_path / "c.toml").write_text("[options]\nopt_level = 3\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    pyproject = open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")).read()
    assert "tomli>=1.1; python_version < '3.11'" in pyproject
    assert 'requires-python = ">=3.10"' in pyproject


@pytest.mark.parametrize("text, match", [
    ("[options]\nthreads = " + "9" * 5000 + "\n", "not valid TOML"),  # a raw ValueError before
    ("[options]\nthreads = 99999999999999999999\n", "beyond 64 bits"),
    ("[passes.fold_constants]\nsize_limit = nan\n", "not a finite number"),
    ("[passes.fold_constants]\nwhen = 1979-05-27\n", "date or time"),
    ("[options]\nexecutor = 1979-05-27T07:32:00\n", "date or time"),
])
def test_config_values_are_checked(tmp_path, text, match):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(OptionError, match=match) as info:
        ge.CompileOptions.from_config(p)
    assert str(p) in str(info.value)


def test_config_size_is_capped(tmp_path):
    from ge_core.options import MAX_CONFIG_BYTES

    p = tmp_path / "big.toml"
    p.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(OptionError, match="more than"):
        ge.CompileOptions.from_config(p)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(OptionError, match="not a regular file"):
        ge.CompileOptions.from_config(fifo)


def test_geerror_is_the_only_error(tmp_path, diamond_model):
    """A definition cut anywhere is refused cleanly (no raw json/Unicode error)."""
    d, blob = definition(diamond_model)
    text = json.dumps(d)
    for cut in range(1, len(text), max(1, len(text) // 97)):
        p = write(tmp_path, d, blob, text[:cut])
        with pytest.raises(GEError):
            ge.load_om(p)


def test_stored_types_agree_with_inference(tmp_path, diamond_model):
    """The plan is checked against the stored types: a type that lies (a smaller buffer than the op
    writes) is refused at load, before a kernel could write past its buffer."""
    d, blob = definition(diamond_model)
    for n in d["graph"]["nodes"]:
        for o in n["outputs"]:
            if o["name"] == "a":
                o["shape"] = [1, 1]
    with pytest.raises(OmFormatError, match=r"output 'a' of node 'a' \(Relu\) is float32\[1,1\].*infers float32\[4,8\]"):
        ge.load_om(write(tmp_path, d, blob))
    e = json.loads(json.dumps(definition(diamond_model)[0]))
    e["graph"]["nodes"][1]["outputs"][0]["dtype"] = "float64"
    with pytest.raises(OmFormatError, match="infers"):
        ge.load_om(write(tmp_path, e, blob))
    model = ge.compile(diamond(), {"opt_level": 0})
    model.graph.find_node("b").output.type = TensorType("float32", (4, 9))  # what a buggy pass could leave
    with pytest.raises(GraphError, match="cannot save .*infers"):
        model.save(tmp_path / "lie.om")
