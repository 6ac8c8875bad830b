"""The input_shape / out_nodes options applied by the op set's prepare-stage pass (ge_opset's
``infer_shapes``, before it infers), with the one rank/dimension conflict rule
(``ge_sdk.shapes.check_dims``)."""

import numpy as np
import pytest

import ge_core as ge
from ge_core import OptionError, TensorType
from ge_core.memory import dim_ranges
from ge_core.options import CompileOptions, DimRange
from ge_core.passes import PassContext, resolve_pipeline
from ge_core.plugins import get_host
from ge_sdk.shapes import check_dims, frontend_dims


def _graph():
    g = ge.Graph("g")
    x = g.add_input("x", TensorType("float32", ("N", 3)))
    y = g.add_input("y", TensorType("float32", (None, 3)))
    a = g.add_node("Add", [x, y], name="add")
    r = g.add_node("Relu", [a.output], name="relu")
    g.set_outputs([r.output])
    return g


def test_the_op_sets_first_prepare_pass_applies_them_at_every_level():
    regs = get_host().registries
    p = regs.passes.get("infer_shapes")
    assert p is not None and regs.passes.origin("infer_shapes") == "ge_opset"
    assert p.stage == "prepare" and p.opt_level == 0 and p.default_enabled
    assert resolve_pipeline(regs.passes, CompileOptions(opt_level=0))[0].passes[0] is p


def test_the_pass_overrides_inputs_names_unknown_dims_and_cuts_outputs():
    regs = get_host().registries
    g = _graph()
    ctx = PassContext(CompileOptions.from_any({"input_shape": "x:1~8,3", "out_nodes": "add:0"}), regs)
    assert regs.passes.get("infer_shapes").run(g, ctx) is True
    assert g.inputs[0].type.shape == ("N", 3) and g.inputs[1].type.shape == ("y_0", 3)
    assert dim_ranges(g) == {"N": (1, 8)}
    assert [v.producer.name for v in g.outputs] == ["add"]
    assert len(g.outputs[0].type.shape) == 2 and g.outputs[0].type.shape[1] == 3  # inferred after the override
    assert regs.passes.get("infer_shapes").run(g, ctx) is False  # nothing left to do


@pytest.mark.parametrize("shape,words", [("x:2,4", "fixes it to 3"), ("x:2,3,1", "rank 3, the model's input has rank 2"),
                                         ("x:2,1~4", "fixes it to 3"), ("z:1,3", "not an input of the model")])
def test_a_compile_refuses_what_conflicts_with_the_model(shape, words):
    with pytest.raises(OptionError, match=words):
        ge.compile(_graph(), {"input_shape": shape})


def test_out_nodes_naming_nothing_is_refused_with_a_close_match():
    with pytest.raises(OptionError, match="did you mean"):
        ge.compile(_graph(), {"out_nodes": "ad:0"})


def test_a_compile_applies_the_shapes():
    model = ge.compile(_graph(), {"input_shape": "x:2,3;y:2,3"})
    x = np.ones((2, 3), np.float32)
    (out,) = model.run({"x": x, "y": -2 * x}).values()
    np.testing.assert_array_equal(out, np.zeros((2, 3), np.float32))
    assert [v.type.shape for v in model.graph.inputs] == [(2, 3), (2, 3)]


def test_one_rule_for_frontends_and_the_pass():
    check_dims(("N", 3), (4, 3), "x")
    check_dims(None, (4, 3, 2), "x")  # rank unknown: anything goes
    with pytest.raises(OptionError, match="dim 1 = 4, the model fixes it to 3"):
        check_dims(("N", 3), (1, 4), "x")
    with pytest.raises(OptionError, match="dim 1 = 1~4, the model fixes it to 3"):
        check_dims(("N", 3), (1, DimRange(1, 4)), "x")
    assert frontend_dims(("N", 3), (None, 3), "x") == ("N", 3)
    assert frontend_dims(("N", 3), (DimRange(1, 8), 3), "x") == ("N", 3)
    assert frontend_dims((None, 3), (5, 3), "x") == (5, 3)
