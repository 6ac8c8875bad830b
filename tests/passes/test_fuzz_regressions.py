"""Regressions from fuzzing the ONNX target (``scripts/fuzz.py --target onnx``): malformed or
absurd models that used to end in a ``PassError`` (built-in passes failing inside the compile),
a plain ``GEError`` from the .om writer, or a ``GEError`` wrapping the memory planner's
``OverflowError``. Each reproducer is built by hand; the fixed behaviour is a compile that
works (outputs checked against onnxruntime / the value ONNX defines) or a specific GEError
subclass, raised as early as possible, whose message names the node and says what to do.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import ModelFileError, PassError, SecurityError, ShapeInferenceError, UnsupportedOpError
from ge_core.memory import MAX_ARENA_BYTES, Buffer, MemoryProblem
from ge_core.options import CompileOptions
from ge_core.passes import Pass, PassContext, PassManager, StagePlan
from ge_core.serialize import MAX_WEIGHT_ELEMENTS, WeightWriter
from ge_sdk import GraphBuilder
from ge_sdk.testing import run_onnxruntime
from tests.passes.harness import op_counts

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
vi = helper.make_tensor_value_info


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


# ------------------------------------------------------------------------------------------------
# 1. nodes that break their op's schema: refused at load (they made infer_shapes raise PassError)
# ------------------------------------------------------------------------------------------------
BAD_SPECS = [
    # (nodes, inputs, outputs, initializers, opset, message)
    ([helper.make_node("Relu", [], ["y"], name="relu")], [], [vi("y", F32, [2])], [], 17,
     r"node 'relu' \(Relu\) has 0 input\(s\); Relu-14 \(the version ai.onnx opset 17 selects\) takes exactly 1"),
    ([helper.make_node("ConstantOfShape", ["s", "s"], ["y"], name="cos")], [], [vi("y", F32, [2, 2])],
     [i64("s", [2, 2])], 17, r"node 'cos' \(ConstantOfShape\) has 2 input\(s\).*takes exactly 1"),
    ([helper.make_node("Add", ["", "x"], ["y"], name="add")], [vi("x", F32, [2])], [vi("y", F32, [2])], [], 17,
     r"node 'add' \(Add\) leaves input 0 \('A'\) empty; it is required by Add-14"),
    ([helper.make_node("MatMul", ["x", "x", "x"], ["y"], name="mm")], [vi("x", F32, [2, 2])], [vi("y", F32, [2, 2])],
     [], 17, r"node 'mm' \(MatMul\) has 3 input\(s\)"),
    ([helper.make_node("Neg", ["x"], ["y", "z"], name="neg")], [vi("x", F32, [2])], [vi("y", F32, [2])], [], 17,
     r"node 'neg' \(Neg\) has 2 output\(s\); Neg-13 .* gives exactly 1"),
    ([helper.make_node("Softmax", ["x", "x"], ["y"], name="sm")], [vi("x", F32, [1, 4])], [vi("y", F32, [1, 4])], [],
     9, r"node 'sm' \(Softmax\) has 2 input\(s\); Softmax-1 \(the version ai.onnx opset 9 selects\)"),
    ([helper.make_node("Gemm", ["x", "x"], ["y"], name="gemm")], [vi("x", F32, [2, 2])], [vi("y", F32, [2, 2])], [],
     9, r"node 'gemm' \(Gemm\) has 2 input\(s\); Gemm-9 .* takes exactly 3"),  # C became optional in Gemm-11
]


@pytest.mark.parametrize("nodes,inputs,outputs,inits,opset,message", BAD_SPECS)
def test_nodes_breaking_their_schema_are_refused_at_load(nodes, inputs, outputs, inits, opset, message):
    m = model(nodes, inputs, outputs, inits, opset)
    with pytest.raises(ModelFileError, match=message) as ei:
        ge.load(m)
    assert "onnx.checker.check_model" in str(ei.value)
    with pytest.raises(onnx.checker.ValidationError):  # ONNX agrees: the model is malformed
        onnx.checker.check_model(m)


def test_bad_node_specs_in_subgraphs_are_refused_too():
    then_g = helper.make_graph([helper.make_node("Relu", [], ["t"], name="inner_relu")], "then", [],
                               [vi("t", F32, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F32, [2])])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if")],
              [vi("c", TensorProto.BOOL, []), vi("x", F32, [2])], [vi("y", F32, [2])])
    with pytest.raises(ModelFileError, match=r"node 'inner_relu' \(Relu\) has 0 input\(s\)"):
        ge.load(m)


def test_absent_optional_inputs_and_old_schemas_are_fine():
    # Clip-13 with min absent ('') and max given; Gemm-13 without C; Reshape-1 (shape as attribute)
    m = model(
        [helper.make_node("Clip", ["x", "", "hi"], ["c"], name="clip"),
         helper.make_node("Gemm", ["c", "w"], ["y"], name="gemm")],
        [vi("x", F32, [2, 3])], [vi("y", F32, [2, 2])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "hi"),
         numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")])
    onnx.checker.check_model(m)
    g = ge.load(m)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    got = ge.compile(g).run({"x": x})
    np.testing.assert_allclose(got["y"], run_onnxruntime(g, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    old = model([helper.make_node("Reshape", ["x"], ["y"], shape=[3, 2])], [vi("x", F32, [2, 3])],
                [vi("y", F32, [3, 2])], opset=1)
    assert ge.compile(ge.load(old)).run({"x": x})["y"].shape == (3, 2)


def test_ops_removed_before_the_imported_opset_are_unsupported():
    nodes = [helper.make_node("Scatter", ["x", "i", "u"], ["y"], name="scatter")]
    ins = [vi("x", F32, [3]), vi("i", I64, [1]), vi("u", F32, [1])]
    with pytest.raises(UnsupportedOpError, match=r"node 'scatter' \(Scatter\) uses Scatter, which ONNX removed "
                                                 r"in ai.onnx opset 11 \(the model imports opset 17\)"):
        ge.load(model(nodes, ins, [vi("y", F32, [3])], opset=17))
    ge.load(model(nodes, ins, [vi("y", F32, [3])], opset=10))  # still there at opset 10


# ------------------------------------------------------------------------------------------------
# 2. inconsistent types/shapes in the graph as given: ShapeInferenceError, not a pass's PassError
# ------------------------------------------------------------------------------------------------
def _compile_error(m_or_graph) -> ShapeInferenceError:
    with pytest.raises(ShapeInferenceError) as ei:
        ge.compile(m_or_graph)
    assert not isinstance(ei.value, PassError)
    assert "before any pass changed the graph" in str(ei.value) and "fix the model" in str(ei.value)
    return ei.value


def test_constant_of_shape_with_a_negative_dim_is_the_models_error():
    m = model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")], [], [vi("y", F32, None)],
              [i64("s", [4, -1])])
    e = _compile_error(ge.load(m))
    assert "node 'cos' (ConstantOfShape) is inconsistent" in str(e) and "non-negative" in str(e)
    assert "pass 'infer_shapes'" in str(e) and "<ModelProto>" in str(e)


@pytest.mark.parametrize("a,b,message", [
    (((1, 4), "float32"), ((4, 3), "float32"), "Incompatible dimensions"),       # GreaterOrEqual on MatMul inputs
    (((2,), "float32"), ((2,), "int32"), "inconsistent type"),                   # Mul of float and int
])
def test_inconsistent_inputs_name_the_node(a, b, message):
    bld = GraphBuilder()
    x, y = bld.input("x", a[1], a[0]), bld.input("y", b[1], b[0])
    bld.output(bld.op("GreaterOrEqual" if message.startswith("Incompatible") else "Mul", x, y))
    node = next(iter(bld.graph.nodes))
    e = _compile_error(bld.graph)
    assert node.describe() in str(e) and message in str(e)


def test_a_shape_error_after_a_pass_changed_the_graph_stays_a_pass_error():
    class Changes(Pass):
        name, stage = "changes", "optimize"

        def run(self, graph, ctx):
            return True

    class Complains(Pass):
        name, stage = "complains", "optimize"

        def run(self, graph, ctx):
            raise ShapeInferenceError("node 'n' (Add) is inconsistent")

    g = ge.Graph("g")
    g.set_outputs([g.add_input("x", ge.TensorType("float32", (2,)))])
    ctx = PassContext(CompileOptions(), None)
    with pytest.raises(ShapeInferenceError, match="before any pass changed the graph"):
        PassManager([StagePlan("optimize", [Complains()])]).run(g, ctx)
    with pytest.raises(PassError, match=r"pass 'complains' \(stage optimize\) failed.*before it: changes"):
        PassManager([StagePlan("optimize", [Changes(), Complains()])]).run(g, ctx)


# ------------------------------------------------------------------------------------------------
# 3. huge ConstantOfShape shapes: no OverflowError in the planner, no unsaveable folded constants
# ------------------------------------------------------------------------------------------------
def _shape_of_constant_of_shape(dims):
    return model([helper.make_node("ConstantOfShape", ["s"], ["big"], name="cos"),
                  helper.make_node("Shape", ["big"], ["dims"], name="shape")],
                 [], [vi("dims", I64, [len(dims)])], [i64("s", dims)])


@pytest.mark.parametrize("dims", [[2**31, 2**16, 2**16], [65536, 2**31]])
def test_an_intermediate_too_large_for_any_arena_is_refused_by_name(dims):
    # [2**31, 2**16, 2**16] floats are 2**65 bytes: the planner's int64 sums overflowed
    with pytest.raises(SecurityError, match=r"output 'big' of node 'cos' \(ConstantOfShape\) is float32\[.*256 TiB"):
        ge.compile(ge.load(_shape_of_constant_of_shape(dims)))


def test_a_huge_splat_is_saved_as_one_element(tmp_path):
    # 2**40 floats (4 TiB): folded to a splat that stores one element; the writer refused it
    m = ge.compile(ge.load(_shape_of_constant_of_shape([2**40])))
    assert op_counts(m.graph) == {"Shape": 1}
    path = tmp_path / "m.om"
    m.save(str(path))
    assert path.stat().st_size < 1 << 20
    assert ge.load_om(str(path)).run({})["dims"].tolist() == [2**40]


def test_folding_never_makes_a_constant_an_om_cannot_hold(tmp_path):
    # 2**41 elements: more than an .om constant may claim, so the node stays (it used to be folded
    # and then refused by the writer, with the advice to disable constant folding)
    m = ge.compile(ge.load(_shape_of_constant_of_shape([2**20, 2**21])))
    assert op_counts(m.graph) == {"ConstantOfShape": 1, "Shape": 1}
    m.save(str(tmp_path / "m.om"))
    ge.load_om(str(tmp_path / "m.om"))


def test_the_weight_writer_counts_what_a_splat_stores():
    w = WeightWriter()
    w.add(np.broadcast_to(np.float32(1), (2**20, 2**20)))  # 4 TiB claimed, 4 bytes stored
    assert w.table[0]["splat"] and w.table[0]["nbytes"] == 4
    with pytest.raises(ge.GEError, match=r"too large for an \.om"):
        w.add(np.broadcast_to(np.float32(1), (MAX_WEIGHT_ELEMENTS, 2)))


def test_planners_do_not_overflow_on_huge_buffers():
    from ge_memory.planners import live_pressure, plan_auto

    p = MemoryProblem([Buffer("a", 2**65, 0, 1), Buffer("b", 2**64, 1, 2), Buffer("c", 100, 0, 2)])
    assert live_pressure(p)["b"] == 2**65 + 2**64 + 128
    assert plan_auto(p).arena_bytes >= 2**65 + 2**64  # exact Python ints, no OverflowError


def test_an_arena_too_large_for_an_om_is_refused():
    from ge_core.memory import MemoryPlan, verify_plan

    p = MemoryProblem([Buffer("a", MAX_ARENA_BYTES, 0, 0)])
    with pytest.raises(SecurityError, match="256 TiB"):
        verify_plan(p, MemoryPlan({"a": 0}, MAX_ARENA_BYTES, "none"))


# ------------------------------------------------------------------------------------------------
# 4. a graph output that folding cannot replace: the optimize stage settles at once
# ------------------------------------------------------------------------------------------------
def test_unreplaceable_folds_leave_nothing_behind_and_the_stage_settles():
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
               helper.make_node("Dropout", ["r"], ["d", "mask"])],
              [vi("x", F32, [2, 3])], [vi("s", I64, [2]), vi("d", F32, [2, 3]), vi("mask", TensorProto.BOOL, [2, 3])])
    c = ge.compile(ge.load(m))
    optimize = [p for p in c.report["passes"] if p["stage"] == "optimize"]
    assert not any(p["changed"] for p in optimize)  # fold_shapes / dce used to flip-flop for 10 rounds
    assert len(optimize) == len({p["name"] for p in optimize})
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    out = c.run({"x": x})
    assert out["s"].tolist() == [2, 3] and out["mask"].all()
    np.testing.assert_allclose(out["d"], np.maximum(x, 0))
