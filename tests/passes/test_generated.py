"""Generated graphs with a known number of redundancies: CSE and DCE remove exactly those, and
every pass and the whole pipeline keep the outputs (onnxruntime on the original as the oracle)."""

import random

import numpy as np
import pytest

from ge_core import TensorType
from ge_sdk import GraphBuilder
from tests.passes.harness import assert_same_outputs, op_counts, optimize

UNARY = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh"]
BINARY = ["Add", "Mul", "Sub", "Max"]
COMMUTATIVE = {"Add", "Mul", "Max"}


def generated(seed, n_unique=40, n_dup=10, n_dead=6):
    """A random DAG of ``n_unique`` distinct nodes, plus ``n_dup`` duplicate nodes (same op and
    inputs, commutative ones with swapped inputs) whose readers are real, plus ``n_dead`` dead
    branch nodes. Returns (graph, the number of duplicates, the number of dead nodes)."""
    rnd = random.Random(seed)
    b = GraphBuilder(f"gen{seed}")
    xs = [b.input(f"x{i}", "float32", (2, 3)) for i in range(3)]
    values = list(xs)
    keys = set()
    made = []
    while len(made) < n_unique:
        if rnd.random() < 0.4:
            op, ins = rnd.choice(UNARY), [rnd.choice(values)]
        else:
            op, ins = rnd.choice(BINARY), [rnd.choice(values), rnd.choice(values)]
        key = (op, tuple(sorted(map(id, ins))) if op in COMMUTATIVE else tuple(map(id, ins)))
        if key in keys:
            continue
        keys.add(key)
        v = b.op(op, *ins)
        values.append(v)
        made.append((op, ins, v))
    dups = []
    for op, ins, _v in rnd.sample(made, n_dup):
        if op in COMMUTATIVE and len(ins) == 2:
            ins = ins[::-1]
        dups.append(b.op(op, *ins))
    # every unique node and every duplicate is read (so only CSE, not DCE, can remove a
    # duplicate) through one combining chain of Sub nodes (never equal to a generated node)
    unread = [v for _, _, v in made[:-1] if not v.has_uses()] + dups
    acc = made[-1][2]
    for d in unread:
        acc = b.op("Sub", acc, d)
    dead_start = rnd.choice(values[3:])
    v = dead_start
    for i in range(n_dead):
        v = b.op(UNARY[i % len(UNARY)], v)
    b.output(acc)
    return b.graph, n_dup, n_dead


@pytest.mark.parametrize("seed", range(4))
def test_cse_and_dce_remove_exactly_the_planted_redundancy(seed):
    g, n_dup, n_dead = generated(seed)
    before = op_counts(g)
    after_dce = optimize(g, ["dce"])
    assert len(after_dce) == len(g) - n_dead
    after_cse = optimize(g, ["cse"])
    assert len(after_cse) == len(g) - n_dup
    both = optimize(g, ["cse", "dce"])
    assert len(both) == len(g) - n_dup - n_dead
    assert sum(before.values()) - sum(op_counts(both).values()) == n_dup + n_dead
    assert_same_outputs(g, both)


def test_cse_merges_whole_duplicated_subtrees_and_counts_each_node():
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    a1 = b.op("Exp", b.op("Relu", x))
    a2 = b.op("Exp", b.op("Relu", x))
    b.output(b.op("Add", a1, a2))
    g = optimize(b.graph, ["cse"])
    assert op_counts(g) == {"Relu": 1, "Exp": 1, "Add": 1}


def test_cse_never_merges_random_ops_and_distinguishes_attributes():
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    r1, r2 = b.op("RandomNormalLike", x), b.op("RandomNormalLike", x)
    l1, l2 = b.op("LeakyRelu", x, alpha=0.1), b.op("LeakyRelu", x, alpha=0.2)
    c1, c2 = b.op("Cast", x, to=7), b.op("Cast", x, to=7)
    b.output(b.op("Add", r1, r2), b.op("Add", l1, l2), b.op("Add", c1, c2))
    g = optimize(b.graph, ["cse"])
    assert op_counts(g) == {"RandomNormalLike": 2, "LeakyRelu": 2, "Cast": 1, "Add": 3}


def test_cse_compares_array_attributes_by_value():
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    y1 = b.op("ConstantOfShape", b.const(np.array([4], np.int64)), value=np.array([1.5], np.float32))
    y2 = b.op("ConstantOfShape", b.const(np.array([4], np.int64)), value=np.array([1.5], np.float32))
    y3 = b.op("ConstantOfShape", b.const(np.array([4], np.int64)), value=np.array([2.5], np.float32))
    b.output(b.op("Sum", x, y1, y2, y3))
    g = optimize(b.graph, ["share_constants", "cse"])
    assert op_counts(g)["ConstantOfShape"] == 2


def test_dce_removes_unused_constants_and_keeps_inputs():
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    unused_in = b.input("unused", "float32", (4,))
    b.const(np.ones(3, np.float32), "lonely")
    c = b.const(np.ones(4, np.float32), "used")
    b.output(b.op("Add", x, c))
    g = optimize(b.graph, ["dce"])
    assert list(g.constants) == ["used"] and [v.name for v in g.inputs] == ["x", "unused"]
    assert unused_in is not None


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("seed", range(2))
def test_every_level_keeps_generated_graph_outputs(seed, level):
    g, _, _ = generated(seed + 10)
    out = optimize(g, opt_level=level)
    assert len(out) < len(g)
    assert_same_outputs(g, out)


def redundancy_zoo():
    """One graph holding one instance of every redundancy the passes know."""
    b = GraphBuilder("zoo")
    x = b.input("x", "float32", (2, 3, 4))
    y = b.input("y", "float32", ("N", 3))
    ones = b.const(np.ones((4,), np.float32))
    zeros = b.const(np.zeros((1, 1, 1), np.float32))
    v = b.op("Identity", x)
    v = b.op("Mul", v, ones)                                  # x * 1
    v = b.op("Add", zeros, v)                                 # 0 + x
    v = b.op("Div", v, b.const(np.ones((), np.float32)))      # x / 1
    v = b.op("Neg", b.op("Neg", v))                           # --x
    v = b.op("Mul", b.op("Mul", v, b.const(np.float32(2.0))), b.const(np.full((4,), 3.0, np.float32)))
    v = b.op("Div", b.op("Mul", v, b.const(np.float32(4.0))), b.const(np.float32(8.0)))
    v = b.op("Sub", b.op("Add", v, b.const(np.float32(1.0))), b.const(np.float32(0.5)))
    v = b.op("Transpose", b.op("Transpose", v, perm=[1, 0, 2]), perm=[1, 0, 2])
    v = b.op("Transpose", b.op("Transpose", v, perm=[1, 2, 0]), perm=[2, 0, 1])
    v = b.op("Transpose", v, perm=[0, 1, 2])
    v = b.op("Reshape", b.op("Reshape", v, b.const(np.array([6, 4], np.int64))), b.const(np.array([2, 3, 4], np.int64)))
    v = b.op("Squeeze", b.op("Unsqueeze", v, b.const(np.array([0], np.int64))), b.const(np.array([0], np.int64)))
    shape = b.op("Shape", v)
    v = b.op("Reshape", v, b.op("Concat", b.op("Slice", shape, b.const(np.array([0], np.int64)),
                                                b.const(np.array([2], np.int64))),
                                 b.const(np.array([-1], np.int64)), axis=0))
    v = b.op("Cast", v, to=1)                                 # to float: no-op
    v = b.op("Pad", v, b.const(np.zeros(6, np.int64)))
    v = b.op("Dropout", v)
    cf = b.op("Add", b.const(np.full((4,), 2.0, np.float32)), b.const(np.full((4,), 3.0, np.float32)))
    v = b.op("Mul", v, b.op("ConstantOfShape", b.const(np.array([4], np.int64)), value=np.array([1.0], np.float32)))
    v = b.op("Add", v, cf)
    d1, d2 = b.op("Exp", v), b.op("Exp", v)                    # duplicate
    b.op("Sigmoid", b.op("Tanh", v))                           # dead branch
    out1 = b.op("Add", d1, d2)
    # partly static shapes: the static dim folds, the symbolic one does not
    sy = b.op("Shape", y)
    dim1 = b.op("Gather", sy, b.const(np.array(1, np.int64)), axis=0)
    dim0 = b.op("Gather", sy, b.const(np.array(0, np.int64)), axis=0)
    out2 = b.op("Reshape", y, b.op("Concat", b.op("Unsqueeze", dim0, b.const(np.array([0], np.int64))),
                                   b.op("Unsqueeze", dim1, b.const(np.array([0], np.int64))), axis=0))
    out2 = b.op("Identity", out2)
    b.output(out1, out2)
    return b.graph


ALL_PASSES = ["fold_shapes", "fold_constants", "eliminate_noops", "simplify_algebra", "distribute_constants",
              "merge_constant_arithmetic", "fold_affine_into_batchnorm", "sink_transposes", "simplify_layout",
              "share_constants", "cse", "dce"]


@pytest.mark.parametrize("name", ALL_PASSES)
def test_each_pass_alone_keeps_the_zoo_outputs(name):
    g = redundancy_zoo()
    assert_same_outputs(g, optimize(g, [name]))


def test_default_pipeline_on_the_zoo():
    g = redundancy_zoo()
    out = optimize(g)
    assert_same_outputs(g, out)
    counts = op_counts(out)
    assert counts.get("Exp") == 1
    for op in ("Dropout", "Cast", "Pad", "Neg", "Div", "Sub", "Transpose", "Squeeze", "Unsqueeze",
               "ConstantOfShape", "Tanh", "Sigmoid", "Concat", "Slice"):
        assert op not in counts, counts
    assert counts["Mul"] == 1 and counts["Add"] == 2  # the constant chains merged into one Mul and one Add
    # the second output reshapes y to (its own dim 0, 3): a no-op even though dim 0 is symbolic; the
    # only Identity left keeps the output's name, which a graph input cannot take
    assert "Shape" not in counts and "Gather" not in counts and "Reshape" not in counts
    assert counts["Identity"] == 1 and out.outputs[1].producer.inputs[0].is_graph_input
    assert [v.name for v in out.outputs] == [v.name for v in g.outputs]
    assert out.outputs[1].type == TensorType("float32", ("N", 3))
