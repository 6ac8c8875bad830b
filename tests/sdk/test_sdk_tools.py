"""The SDK's testing helpers, pipeline configs with insert_after/before, ge viz, ge new-plugin."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import ge_core as ge
from ge_core import OptionError, Pass
from ge_core.cli import main
from ge_core.options import CompileOptions
from ge_core.passes import resolve_pipeline
from ge_sdk import GraphBuilder, Plugin
from ge_sdk.testing import count_ops, random_inputs, run_graph
from tests.conftest import light_model_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_graph():
    b = GraphBuilder()
    x = b.input("x", "float32", (2, 3))
    b.output(b.Relu(b.Add(b.Mul(x, 2.0), 1.0)))
    return b.build()


class WrongPass(Pass):
    """Turns Relu into Sigmoid: changes the results."""

    name = "t_wrong"

    def run(self, graph, ctx):
        for n in graph.nodes:
            if n.op_type == "Relu":
                n.op_type = "Sigmoid"
                return True
        return False


# -- testing helpers ---------------------------------------------------------------------------
def test_semantics_check_catches_a_wrong_pass(assert_pass_preserves_semantics):
    with pytest.raises(AssertionError, match="pass 't_wrong': output .* differs"):
        assert_pass_preserves_semantics(WrongPass, small_graph())


def test_semantics_check_expect_changed_and_onnxruntime(assert_pass_preserves_semantics, run_pass):
    with pytest.raises(AssertionError, match="did not change"):
        assert_pass_preserves_semantics("infer_shapes", small_graph(), expect_changed=True)
    check = assert_pass_preserves_semantics("infer_shapes", small_graph(), onnxruntime=True, trials=3)
    assert check.checked_against == ["cpu (before/after)", "onnxruntime"]
    g, changed = run_pass("infer_shapes", small_graph(), prepare=False)
    assert g.outputs[0].type.shape == (2, 3)


def test_ge_plugin_fixture_registers_for_one_test(ge_plugin):
    plugin = Plugin("t_fixture_plugin")
    plugin.option("t_fixture_option", 1)
    assert ge_plugin(plugin) == "t_fixture_plugin"
    assert "t_fixture_option" in ge.get_host().registries.options


def test_ge_plugin_fixture_cleaned_up():
    assert "t_fixture_plugin" not in ge.get_host().info


def test_graph_builder_helpers(graph_builder):
    b = graph_builder("h")
    x = b.input("x", "int64", ("N", 3))
    w = b.random_const((3,), "float32")
    y = b.Add(b.Cast(x, to=1), w)
    b.output(y)
    g = b.build()
    assert count_ops(g) == {"Cast": 1, "Add": 1}
    feeds = random_inputs(g, dims={"N": 5})
    assert feeds["x"].shape == (5, 3) and feeds["x"].dtype == np.int64
    out = run_graph(g, feeds)
    np.testing.assert_allclose(out[g.outputs[0].name], feeds["x"].astype(np.float32) + w.const_value)


# -- pipeline configs ----------------------------------------------------------------------------
class A(Pass):
    name, stage = "t_a", "optimize"

    def run(self, graph, ctx):
        return False


class B(A):
    name = "t_b"
    after = ("t_a",)


class C(A):
    name = "t_c"
    default_enabled = False


def _names(tmp_path, text):
    plugin = Plugin("t_cfg")
    for p in (A, B, C):
        plugin.register_pass(p)
    host = ge.get_host()
    name = host.register_plugin(plugin, "t_cfg")
    try:
        cfg = tmp_path / "p.toml"
        cfg.write_text(text)
        plans = resolve_pipeline(host.registries.passes, CompileOptions.from_config(cfg))
        return [p.name for s in plans if s.name == "optimize" for p in s.passes if p.name.startswith("t_")]
    finally:
        host.unregister_plugin(name)


def test_insert_after_and_before_named_passes(tmp_path):
    assert _names(tmp_path, "") == ["t_a", "t_b"]
    assert _names(tmp_path, '[pipeline.optimize]\ninsert_after = {t_c = "t_a"}\n') == ["t_a", "t_c", "t_b"]
    assert _names(tmp_path, '[pipeline.optimize]\ninsert_before = {t_c = "t_a"}\n') == ["t_c", "t_a", "t_b"]
    assert _names(tmp_path, '[pipeline.optimize]\ninsert_after = {t_a = "t_b"}\n') == ["t_b", "t_a"]
    assert _names(tmp_path, '[pipeline.optimize]\ndisable = ["t_a"]\ninsert_after = {t_c = "t_b"}\n') == ["t_b", "t_c"]
    assert _names(tmp_path, '[pipeline.optimize]\npasses = ["t_b", "t_a"]\ninsert_before = {t_c = "t_a"}\n') == [
        "t_b", "t_c", "t_a"]


@pytest.mark.parametrize("text, message", [
    ('[pipeline.optimize]\ninsert_after = {t_cc = "t_a"}\n', "unknown pass 't_cc'.*did you mean: t_c"),
    ('[pipeline.optimize]\ninsert_after = {t_c = "t_aa"}\n', "unknown pass 't_aa'.*did you mean: t_a"),
    ('[pipeline.optimize]\ndisable = ["t_a"]\ninsert_after = {t_c = "t_a"}\n', "anchor pass 't_a' is not in stage"),
    ('[pipeline.optimize]\ninsert_afterr = {t_c = "t_a"}\n', "unknown key 'insert_afterr'.*did you mean: insert_after"),
    ('[pipeline.optimize]\ninsert_after = ["t_c"]\n', "must be a table"),
    ('[pipeline.fuse]\ninsert_after = {t_c = "t_a"}\n', "belongs to stage 'optimize'"),
])
def test_insert_errors_name_close_matches(tmp_path, text, message):
    with pytest.raises(OptionError, match=message):
        _names(tmp_path, text)


def test_example_pipelines_are_valid_configs():
    folder = os.path.join(ROOT, "examples", "pipelines")
    for f in os.listdir(folder):
        if f.endswith(".toml"):
            opts = CompileOptions.from_config(os.path.join(folder, f))
            assert opts.config.endswith(f)


def test_ge_passes_config_shows_origin_and_unknown_names(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text('[pipeline.optimize]\ndisable = ["infer_shape"]\n')
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "passes", "--config", str(cfg)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "did you mean: infer_shapes" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "passes", "--json"], capture_output=True, text=True,
                       check=True)
    plugin = {p["name"]: p["plugin"] for s in json.loads(r.stdout)["stages"] for p in s["passes"]}
    assert plugin["infer_shapes"] == "ge_opset"


# -- ge viz ------------------------------------------------------------------------------------
def test_viz_svg_marks_fused_groups_and_streams(tmp_path):
    from ge_sdk.viz import render

    g = small_graph()
    for n in g.nodes:
        if n.op_type in ("Mul", "Add"):
            n.meta["fusion_group"] = "affine"
    path = render(g, str(tmp_path / "g.svg"), streams=[0, 1, 1])
    root = ET.parse(path).getroot()
    text = open(path).read()
    assert root.tag.endswith("svg") and text.count('class="node fused"') == 2 and ">s1<" in text
    assert "Relu" in text and "⇥" in text
    html = render(g, str(tmp_path / "g.html"), streams=[0, 1, 1])
    page = open(html).read()
    assert page.startswith("<!DOCTYPE html>") and "affine (2)" in page and "stream 1 (2)" in page
    with pytest.raises(OptionError, match="svg or .html"):
        render(g, str(tmp_path / "g.png"))


def test_ge_viz_cli_on_model_compiled_and_om(tmp_path, capsys):
    model = light_model_path("squeezenet")
    assert main(["viz", model, "-o", str(tmp_path / "before.svg")]) == 0
    assert main(["viz", model, "-o", str(tmp_path / "after.html"), "--compiled",
                 "--option", "stream_allocator=dependency"]) == 0
    ge.compile(model).save(str(tmp_path / "m.om"))
    assert main(["viz", str(tmp_path / "m.om"), "-o", str(tmp_path / "om.svg")]) == 0
    before = open(tmp_path / "before.svg").read()
    assert before.count('class="node') > open(tmp_path / "om.svg").read().count('class="node') > 10
    ET.parse(tmp_path / "om.svg")
    assert main(["viz", model, "-o", str(tmp_path / "x.pdf")]) == 2


# -- ge new-plugin -----------------------------------------------------------------------------
def test_new_plugin_creates_a_distribution(tmp_path):
    assert main(["new-plugin", "My-Thing", "--dir", str(tmp_path)]) == 0
    root = tmp_path / "my-thing"
    assert (root / "my_thing" / "plugin.py").exists() and (root / "tests" / "test_my_thing.py").exists()
    assert 'my_thing = "my_thing.plugin:plugin"' in (root / "pyproject.toml").read_text()
    assert main(["new-plugin", "My-Thing", "--dir", str(tmp_path)]) == 2  # exists
    assert main(["new-plugin", "My-Thing", "--dir", str(tmp_path), "--force"]) == 0
    for bad in ("class", "1abc", "ge_core", "!!"):
        assert main(["new-plugin", bad, "--dir", str(tmp_path)]) == 2


def test_generated_plugin_tests_pass_from_the_checkout(tmp_path):
    """Before installation the generated tests register the plugin in-process (ge_plugin)."""
    assert main(["new-plugin", "t_gen", "--dir", str(tmp_path)]) == 0
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd=tmp_path / "t-gen", capture_output=True, text=True, timeout=300)
    assert "2 passed, 1 skipped" in r.stdout, r.stdout[-2000:]
