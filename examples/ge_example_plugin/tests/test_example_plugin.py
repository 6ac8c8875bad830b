"""Tests of the example plugin, with the fixtures of the ge_sdk pytest plugin."""

import numpy as np
import pytest
from ge_example_plugin.plugin import PATTERN, plugin

import ge_core as ge
from ge_core.plugins import get_host
from ge_sdk import explain


@pytest.fixture(autouse=True)
def _registered(ge_plugin):
    """Installed, the plugin comes through its entry point; from a checkout, register it here."""
    if "ge_example" not in get_host().info:
        ge_plugin(plugin, "ge_example")


def affine(graph_builder, neg=False):
    b = graph_builder()
    x = b.input("x", "float32", (2, 5))
    y = b.Add(b.Mul(x, np.float32(3.0)), np.float32(0.5))
    if neg:
        y = b.Neg(b.Neg(y))
    b.output(b.Relu(y))
    return b.build()


def test_everything_is_registered():
    regs = get_host().registries
    assert "example_fold_double_neg" in regs.passes and "example_fusion" in regs.passes
    assert regs.ops.lookup("ge.example", "ScaleShift") is not None
    assert ("ge.example", "ScaleShift") in regs.kernels_for("cpu")
    assert "example_scale_shift" in regs.fusion_patterns


def test_fold_double_neg_keeps_semantics(graph_builder, assert_pass_preserves_semantics):
    check = assert_pass_preserves_semantics("example_fold_double_neg", affine(graph_builder, neg=True),
                                            expect_changed=True)
    assert not any(n.op_type == "Neg" for n in check.graph.nodes)


def test_fusion_keeps_semantics_and_uses_the_custom_op(graph_builder, assert_pass_preserves_semantics):
    check = assert_pass_preserves_semantics("example_fusion", affine(graph_builder), expect_changed=True)
    assert [n.op_type for n in check.graph.nodes] == ["ScaleShift", "Relu"]


def test_compiled_model_runs_the_custom_op(graph_builder):
    model = ge.compile(affine(graph_builder))
    assert model.report["op_counts"].get("ge.example::ScaleShift") == 1
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_allclose(model.run({"x": x})[model.output_names[0]], np.maximum(x * 3 + 0.5, 0), rtol=1e-6)


def test_fusion_switch_turns_the_pattern_off(graph_builder, tmp_path):
    switch = tmp_path / "switch.json"
    switch.write_text('{"Switch": {"GraphFusion": {"example_scale_shift": "off"}}}')
    model = ge.compile(affine(graph_builder), {"fusion_switch_file": str(switch)})
    assert "ge.example::ScaleShift" not in model.report["op_counts"]


def test_explain_says_why_not(graph_builder):
    b = graph_builder()
    x = b.input("x", "float32", (4,))
    b.output(b.Add(b.Mul(x, x), np.float32(1.0)))
    g = b.build()
    why = explain(PATTERN, g.find_node("add"))
    assert not why and "not a constant" in str(why)
