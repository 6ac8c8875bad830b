"""Targeted behaviour of the passes: options, limits, safety conditions, names, levels."""

import numpy as np
import pytest

import ge_core as ge
from ge_core.options import CompileOptions
from ge_core.passes import resolve_pipeline
from ge_core.plugins import get_host
from ge_sdk import GraphBuilder
from tests.passes.harness import assert_same_outputs, op_counts, optimize


def test_folding_respects_constant_folding_false_and_the_size_limit():
    b = GraphBuilder()
    x = b.input("x", "float32", (1000,))
    big = b.op("Tile", b.const(np.arange(10, dtype=np.float32)), b.const(np.array([100], np.int64)))
    small = b.op("Add", b.const(np.ones(3, np.float32)), b.const(np.ones(3, np.float32)))
    b.output(b.op("Add", x, big), b.op("Mul", b.input("y", "float32", (3,)), small))
    assert op_counts(optimize(b.graph, ["fold_constants"], constant_folding=False)) == op_counts(b.graph)
    limited = optimize(b.graph, ["fold_constants"], pass_params={"fold_constants": {"size_limit": 1000}})
    assert op_counts(limited) == {"Tile": 1, "Add": 1, "Mul": 1}  # the 4000-byte Tile result is refused
    folded = optimize(b.graph, ["fold_constants"])
    assert op_counts(folded) == {"Add": 1, "Mul": 1}
    assert_same_outputs(b.graph, folded)


def test_splat_results_store_one_element_and_never_count_against_the_limit():
    b = GraphBuilder()
    x = b.input("x", "float32", (64, 1024))
    w = b.op("ConstantOfShape", b.const(np.array([64, 1024], np.int64)), value=np.array([0.5], np.float32))
    w = b.op("Mul", b.op("Transpose", w, perm=[1, 0]), b.const(np.float32(2)))
    b.output(b.op("MatMul", x, w))
    g = optimize(b.graph, ["fold_constants"], pass_params={"fold_constants": {"size_limit": 16}})
    assert op_counts(g) == {"MatMul": 1}
    (c,) = [v.const_value for v in g.constants.values()]
    assert c.shape == (1024, 64) and c.strides == (0, 0) and float(c[3, 5]) == 1.0
    assert_same_outputs(b.graph, g)


def test_random_ops_are_never_folded():
    b = GraphBuilder()
    r = b.op("RandomNormal", shape=[3], dtype=1)
    b.output(b.op("Add", r, b.const(np.zeros(3, np.float32))), b.op("Bernoulli", b.const(np.full(3, 0.5, np.float32))))
    g = optimize(b.graph, ["fold_constants"])
    assert op_counts(g) == op_counts(b.graph)


def test_shape_folding_static_and_partly_static():
    b = GraphBuilder()
    x = b.input("x", "float32", (2, "N", 5))
    s = b.op("Shape", x)
    d0 = b.op("Gather", s, b.const(np.array([0, 2], np.int64)), axis=0)
    d1 = b.op("Gather", s, b.const(np.array(1, np.int64)), axis=0)
    tail = b.op("Slice", s, b.const(np.array([2], np.int64)), b.const(np.array([3], np.int64)))
    n = b.op("Size", b.op("Shape", x, start=-1))
    i = b.input("i", "int64", (1,))
    b.output(*[b.op("Add", v, i) for v in (d0, d1, tail, n)])
    g = optimize(b.graph, ["fold_shapes"])
    assert op_counts(g) == {"Shape": 1, "Gather": 1, "Add": 4}
    assert_same_outputs(b.graph, g)


def test_broadcasting_identity_elements_are_kept_when_they_change_shape_or_dtype():
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    grows = b.op("Add", x, b.const(np.zeros((2, 3), np.float32)))      # (3,) + (2,3) -> (2,3)
    keeps = b.op("Mul", x, b.const(np.ones((1,), np.float32)))
    b.output(grows, b.op("Relu", keeps))
    g = optimize(b.graph, ["simplify_algebra"])
    assert op_counts(g) == {"Add": 1, "Relu": 1}
    assert_same_outputs(b.graph, g)


def test_noops_that_change_something_stay():
    b = GraphBuilder()
    x = b.input("x", "float32", (2, 3))
    i = b.input("i", "int64", (2, 3))
    outs = [
        b.op("Cast", i, to=1),                                             # a real cast
        b.op("Transpose", x, perm=[1, 0]),
        b.op("Pad", x, b.const(np.array([0, 1, 0, -1], np.int64))),        # same shape, shifted
        b.op("Slice", x, b.const(np.array([-1], np.int64)), b.const(np.array([-4], np.int64)),
             b.const(np.array([0], np.int64)), b.const(np.array([-1], np.int64))),  # reversed
        b.op("Reshape", x, b.const(np.array([3, 2], np.int64))),
        b.op("Cast", x, to=1), b.op("Identity", x), b.op("Expand", x, b.const(np.array([2, 3], np.int64))),
    ]
    b.output(*[b.op("Neg", v) for v in outs])
    g = optimize(b.graph, ["eliminate_noops"])
    assert op_counts(g) == {"Cast": 1, "Transpose": 1, "Pad": 1, "Slice": 1, "Reshape": 1, "Neg": 8}
    assert_same_outputs(b.graph, g)


def test_output_names_survive_and_identity_chains_do_not_loop():
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    y = b.op("Relu", x)
    b.output(b.op("Identity", b.op("Identity", y)), b.op("Identity", x))
    names = [v.name for v in b.graph.outputs]
    g = optimize(b.graph)
    assert [v.name for v in g.outputs] == names
    assert op_counts(g) == {"Relu": 1, "Identity": 1}


def test_batchnorm_absorbs_per_channel_scale_and_shift():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 4))
    rng = np.random.default_rng(0)
    prm = [b.const(rng.random(3).astype(np.float32) + 0.5) for _ in range(4)]
    y = b.op("BatchNormalization", x, *prm)
    y = b.op("Mul", y, b.const(rng.random((3, 1, 1)).astype(np.float32)))
    y = b.op("Add", y, b.const(rng.random((3, 1, 1)).astype(np.float32)))
    z = b.op("Mul", b.op("BatchNormalization", x, *prm), b.const(rng.random((4,)).astype(np.float32)))  # not per channel
    b.output(y, z)
    g = optimize(b.graph, ["fold_affine_into_batchnorm", "dce"])
    assert op_counts(g) == {"BatchNormalization": 2, "Mul": 1}
    assert_same_outputs(b.graph, g)


def test_levels_choose_the_documented_passes():
    regs = get_host().registries

    def names(level):
        (opt,) = [s for s in resolve_pipeline(regs.passes, CompileOptions.from_any({"opt_level": level}))
                  if s.name == "optimize"]
        return [p.name for p in opt.passes if regs.passes.origin(p.name) == "ge_passes"]

    o1 = ["fold_shapes", "fold_constants", "eliminate_noops", "share_constants", "cse", "dce"]
    o2 = ["fold_shapes", "fold_constants", "eliminate_noops", "simplify_algebra", "merge_constant_arithmetic",
          "fold_affine_into_batchnorm", "sink_transposes", "simplify_layout", "share_constants", "cse", "dce"]
    assert names(0) == []
    assert names(1) == o1
    assert names(2) == o2
    assert names(3) == o2[:4] + ["distribute_constants"] + o2[4:]
    for p in regs.passes.values():
        if regs.passes.origin(p.name) == "ge_passes":
            assert p.stage == "optimize" and p.description and p.fixed_point


def test_distribute_constants_collapses_affine_chains_at_o3():
    b = GraphBuilder()
    x = b.input("x", "float32", (2, 4))
    v = x
    for k in range(3):
        v = b.op("Add", b.op("Mul", v, b.const(np.float32(k + 2))), b.const(np.float32(k)))
    b.output(v)
    g = optimize(b.graph, opt_level=3)
    assert op_counts(g) == {"Mul": 1, "Add": 1}
    assert_same_outputs(b.graph, g)


def test_passes_run_through_compile_and_disable_by_name():
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    b.output(b.op("Relu", b.op("Identity", x)))
    m = ge.compile(b.graph, {"disabled_passes": ["eliminate_noops"]})
    assert all(r["name"] != "eliminate_noops" for r in m.report["passes"])
    m = ge.compile(b.graph)
    (first,) = [r for r in m.report["passes"] if r["name"] == "eliminate_noops" and r["changed"]]
    assert first["stage"] == "optimize" and first["nodes_after"] == 1


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_merge_constant_arithmetic_keeps_integer_division_apart(dtype):
    b = GraphBuilder()
    x = b.input("x", dtype, (5,))
    two, three = b.const(np.array(2, dtype)), b.const(np.array(3, dtype))
    b.output(b.op("Div", b.op("Div", x, two), three), b.op("Mul", b.op("Mul", x, two), three))
    g = optimize(b.graph, ["merge_constant_arithmetic"])
    assert op_counts(g) == ({"Div": 2, "Mul": 1} if dtype == "int32" else {"Div": 1, "Mul": 1})
    assert_same_outputs(b.graph, g)
