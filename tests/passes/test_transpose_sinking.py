"""The transpose-sinking pass (``sink_transposes``) on hand-built graphs, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from ge_core.ir.graph import Graph
from ge_sdk.testing import (
    GraphBuilder,
    assert_pass_preserves_semantics,
    count_ops,
    random_inputs,
    run_graph,
    run_onnxruntime,
    run_pass,
    run_reference,
)
from tests.passes.harness import assert_same_outputs, optimize

NHWC = [0, 2, 3, 1]   # NCHW -> NHWC
NCHW = [0, 3, 1, 2]   # NHWC -> NCHW
PASS = "sink_transposes"


def transposes(g: Graph) -> int:
    return count_ops(g)["Transpose"]


def sink(graph: Graph, *, exact: bool = True, changed: bool | None = True, ort: bool = True) -> Graph:
    """Run the pass alone; the outputs must match onnxruntime's on the original graph (or
    onnx.reference's, without ``ort``) and, where ``exact``, equal the original graph's on the cpu
    backend bit for bit (permuting is exact)."""
    check = assert_pass_preserves_semantics(PASS, graph, onnxruntime=ort, expect_changed=changed)
    if ort:
        assert "onnxruntime" in check.checked_against
    else:
        feeds = random_inputs(graph, 0)
        want, got = run_reference(graph, feeds), run_graph(check.graph, feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert [v.name for v in check.graph.outputs] == [v.name for v in graph.outputs]
    assert [v.name for v in check.graph.inputs] == [v.name for v in graph.inputs]
    if exact:
        for seed in (0, 1):
            feeds = random_inputs(graph, seed)
            want, got = run_graph(graph, feeds), run_graph(check.graph, feeds)
            assert list(got) == list(want)
            for k in want:
                assert got[k].dtype == want[k].dtype
                np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    return check.graph


def test_transpose_relu_add_transpose_collapses():
    b = GraphBuilder()
    x = b.input("x", "float32", (2, 3, 4, 5))
    y = b.Transpose(x, perm=NHWC)
    y = b.Relu(y)
    y = b.Add(y, b.random_const((3,)))                # a per-channel [C] constant against NHWC
    y = b.Mul(y, b.random_const((1, 1, 1, 3)))
    b.output(b.Transpose(y, perm=NCHW))
    g = sink(b.graph)
    assert transposes(g) == 0
    assert count_ops(g) == {"Relu": 1, "Add": 1, "Mul": 1}
    shapes = sorted(v.const_value.shape for v in g.constants.values())
    assert shapes == [(1, 3, 1, 1), (3, 1, 1)]      # [C] became [C, 1, 1]; [1,1,1,C] became [1,C,1,1]
    # the whole default pipeline too
    full = optimize(b.graph)
    assert transposes(full) == 0
    assert_same_outputs(b.graph, full)


def test_swish_and_residual_chain_collapse():
    # Conv-like producers in NCHW, elementwise work in NHWC between transposes (a TF model's shape)
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 4, 3, 3))
    z = b.input("z", "float32", (1, 4, 3, 3))
    t = b.Transpose(x, perm=NHWC)
    s = b.Mul(t, b.Sigmoid(t))                          # one Transpose, two readers
    r = b.Add(s, b.Transpose(z, perm=NHWC))             # a residual Add of two transposed values
    r2 = b.Add(r, b.Clip(r, np.float32(0), np.float32(6)))
    b.output(b.Transpose(r2, perm=NCHW), b.Transpose(r, perm=NCHW))
    g = sink(b.graph)
    assert transposes(g) == 0


def test_multi_consumer_transposes_never_multiply():
    # t has two readers; only one path meets the inverse Transpose, the other ends in a graph output
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    t = b.Transpose(x, perm=NHWC)
    out1 = b.Transpose(b.Relu(t), perm=NCHW)
    out2 = b.Sigmoid(t)
    b.output(out1, out2)
    before = transposes(b.graph)
    g = sink(b.graph)
    assert transposes(g) == 1 < before

    # both readers end in graph outputs in NHWC: flipping would need two Transposes instead of one
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    t = b.Transpose(x, perm=NHWC)
    b.output(b.Relu(t), b.Sigmoid(t))
    g = sink(b.graph, changed=False)
    assert transposes(g) == 1

    # a value of the region read outside it in NHWC (by a Reshape) and by the inverse Transpose
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    y = b.Relu(b.Transpose(x, perm=NHWC))
    b.output(b.Transpose(y, perm=NCHW), b.Reshape(y, np.array([-1], np.int64)), b.Neg(b.Reshape(y, [1, 60])))
    g = sink(b.graph)
    assert transposes(g) == 1                           # the rebuilt NHWC value, shared by both Reshapes


def test_a_path_never_gains_transposes():
    # flipping {Add, Add, Relu} would remove three Transposes and add two, but the path from the
    # NHWC input b to the NHWC output would get two Transposes where it had none
    b = GraphBuilder()
    a = b.input("a", "float32", (1, 3, 2, 2))
    c = b.input("c", "float32", (1, 3, 2, 2))
    nhwc = b.input("b", "float32", (1, 2, 2, 3))
    s = b.Add(b.Transpose(a, perm=NHWC), b.Transpose(c, perm=NHWC))
    b.output(b.Add(s, nhwc), b.Transpose(b.Relu(s), perm=NCHW))
    g = sink(b.graph, changed=False)
    assert transposes(g) == 3


def test_concat_axis_and_constant_inputs_are_remapped():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 2, 3, 4))
    y = b.input("y", "float32", (1, 5, 3, 4))
    k = b.random_const((1, 3, 4, 6))                    # an NHWC constant joins the Concat
    cat = b.Concat(b.Transpose(x, perm=NHWC), b.Transpose(y, perm=NHWC), k, axis=-1)
    b.output(b.Transpose(b.Relu(cat), perm=NCHW))
    g = sink(b.graph)
    assert transposes(g) == 0
    (node,) = [n for n in g.nodes if n.op_type == "Concat"]
    assert node.attrs["axis"] == 1
    assert node.output.type.shape == (1, 13, 3, 4)


def test_split_pad_slice_softmax():
    b = GraphBuilder(opset=18)
    x = b.input("x", "float32", (1, 4, 3, 5))
    t = b.Transpose(x, perm=NHWC)                                               # (1, 3, 5, 4)
    p = b.Pad(t, np.array([0, 1, 0, 0, 0, 2, 1, 0], np.int64), mode="reflect")  # (1, 6, 6, 4)
    s = b.Slice(p, np.array([1, 0], np.int64), np.array([5, 3], np.int64),
                np.array([1, 3], np.int64))                                     # H 1:5, C 0:3
    s2 = b.Slice(p, np.array([0, 0, 1], np.int64), np.array([1, 4, 6], np.int64))  # axes implied
    a, c = b.op("Split", s, np.array([2, 4], np.int64), axis=2, num_outputs=2)
    sm = b.Softmax(a, axis=-1)
    b.output(b.Transpose(sm, perm=NCHW), b.Transpose(c, perm=NCHW), b.Transpose(s2, perm=NCHW))
    g = sink(b.graph, exact=False)
    assert transposes(g) == 0
    (sm_node,) = [n for n in g.nodes if n.op_type == "Softmax"]
    assert sm_node.attrs["axis"] == 1


def test_pad_with_axes_and_old_opset_attributes():
    b = GraphBuilder(opset=18)
    x = b.input("x", "float32", (1, 2, 3, 4))
    t = b.Transpose(x, perm=NHWC)
    p = b.Pad(t, np.array([1, 2], np.int64), np.float32(0.5), np.array([3], np.int64))  # pads C only
    b.output(b.Transpose(b.Relu(p), perm=NCHW))
    # onnxruntime's own transpose optimizer fails on this graph (Pad with axes): onnx.reference it is
    assert transposes(sink(b.graph, ort=False)) == 0

    b = GraphBuilder(opset=9)
    x = b.input("x", "float32", (1, 2, 3, 4))
    t = b.Transpose(x, perm=NHWC)
    p = b.Pad(t, pads=[0, 1, 0, 0, 0, 0, 2, 1], value=1.5)
    s = b.Slice(p, starts=[1], ends=[3], axes=[3])
    b.output(b.Transpose(s, perm=NCHW))
    assert transposes(sink(b.graph)) == 0


@pytest.mark.parametrize("opset", [17, 18])
def test_reductions_keep_or_drop_dims(opset):
    b = GraphBuilder(opset=opset)
    x = b.input("x", "float32", (2, 3, 4, 5))
    t = b.Transpose(x, perm=NHWC)
    if opset >= 18:
        kept = b.ReduceMean(t, np.array([1, 2], np.int64), keepdims=1)
        pooled = b.ReduceMean(b.Relu(t), np.array([1, 2], np.int64), keepdims=0)   # global pool: [N, C]
    else:
        kept = b.ReduceMean(t, axes=[1, 2], keepdims=1)
        pooled = b.ReduceMean(b.Relu(t), axes=[1, 2], keepdims=0)
    arg = b.ArgMax(b.Neg(t), axis=3, keepdims=1)
    b.output(b.Transpose(b.Sub(t, kept), perm=NCHW), pooled, b.Transpose(arg, perm=NCHW))
    g = sink(b.graph, exact=False)
    assert transposes(g) == 0
    assert g.outputs[1].type.shape == (2, 3)


def test_keepdims_0_that_would_reorder_the_kept_axes_stays():
    b = GraphBuilder()
    x = b.input("x", "float32", (2, 3, 4, 5))
    t = b.Transpose(x, perm=NHWC)                         # (2, 4, 5, 3)
    b.output(b.ReduceSum(t, np.array([0], np.int64), keepdims=0))  # (4, 5, 3): H, W, C in this order
    g = sink(b.graph, changed=False)
    assert transposes(g) == 1


def test_broadcasting_lower_rank_constants_and_scalars():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    w = b.input("w", "float32", (1, 1, 1, 1))             # one element, not constant
    t = b.Transpose(x, perm=NHWC)                          # (1, 4, 5, 3)
    y = b.Add(t, b.random_const((5, 3)))                   # [W, C] -> [C, 1, W]
    y = b.Div(y, np.float32(3.0))
    y = b.Where(b.Greater(y, b.random_const((1, 5, 1))), y, w)
    y = b.op("PRelu", y, b.random_const((3,)))
    b.output(b.Transpose(y, perm=NCHW))
    g = sink(b.graph)
    assert transposes(g) == 0


def test_non_constant_lower_rank_operands_stop_the_region():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    c = b.input("c", "float32", (3,))
    y = b.Add(b.Transpose(x, perm=NHWC), c)
    b.output(b.Transpose(y, perm=NCHW))
    g = sink(b.graph, changed=False)
    assert transposes(g) == 2


def test_graph_output_inside_the_region_keeps_its_name():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    t = b.Transpose(x, perm=NHWC)
    y = b.Relu(t)
    z = b.Sigmoid(y)
    b.output(y, b.Transpose(z, perm=NCHW), b.Transpose(b.Exp(y), perm=NCHW))
    g = sink(b.graph)
    assert transposes(g) == 1
    assert g.outputs[0].producer.op_type == "Transpose"


def test_other_permutations_compose():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    y = b.Relu(b.Transpose(x, perm=NHWC))
    b.output(b.Transpose(y, perm=[0, 3, 2, 1]), b.Transpose(b.Neg(y), perm=NCHW))
    g = sink(b.graph)
    assert transposes(g) == 1
    (node,) = [n for n in g.nodes if n.op_type == "Transpose"]
    assert node.attrs["perm"] == [0, 1, 3, 2]


def test_symbolic_dims_and_missing_perm():
    b = GraphBuilder()
    x = b.input("x", "float32", ("N", 3, 4, 5))
    t = b.Transpose(x, perm=NHWC)
    b.output(b.Transpose(b.Add(b.Relu(t), b.random_const((3,))), perm=NCHW))
    g = sink(b.graph)
    assert transposes(g) == 0
    assert g.outputs[0].type.shape == ("N", 3, 4, 5)

    b = GraphBuilder()
    x = b.input("x", "float32", (2, 3, 4))
    b.output(b.Transpose(b.Tanh(b.Transpose(x))))
    g = sink(b.graph)                                       # perm absent: reversed both times
    assert transposes(g) == 0


def test_odd_graphs_are_left_alone():
    b = GraphBuilder()
    x = b.input("x", "float32", None)                      # unknown rank
    b.output(b.Transpose(b.Relu(b.Transpose(x, perm=NHWC)), perm=NCHW))
    g, changed = run_pass(PASS, b.graph, verify=True)
    assert not changed and transposes(g) == 2

    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    y = b.Relu(b.Transpose(x, perm=[0, 2, 2, 1]))          # not a permutation
    b.output(b.Transpose(y, perm=NCHW))
    g, changed = run_pass(PASS, b.graph, verify=False)
    assert not changed and transposes(g) == 2

    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 4, 5))
    cls = b.op("Custom", b.Transpose(x, perm=NHWC), domain="my.domain")
    b.output(b.Transpose(b.Relu(cls), perm=NCHW))
    g, changed = run_pass(PASS, b.graph, prepare=False, verify=False)
    assert not changed


def test_unit_dim_transposes_become_reshapes():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 1, 1, 8))
    y = b.Transpose(x, perm=NCHW)                          # (1, 8, 1, 1): only size-1 dims move
    b.output(b.Relu(y), b.Transpose(b.input("z", "float32", (1, 2, 1, 3)), perm=NCHW))
    g = sink(b.graph)
    assert count_ops(g) == {"Reshape": 1, "Relu": 1, "Transpose": 1}


def test_squeeze_excite_block_collapses_in_the_default_pipeline():
    # EfficientNet's squeeze-excite in a TensorFlow model: pool NHWC, 1x1 convs in NCHW, rescale NHWC
    b = GraphBuilder(opset=18)
    x = b.input("x", "float32", (1, 4, 5, 5))
    t = b.Transpose(x, perm=NHWC)
    act = b.Mul(t, b.Sigmoid(t))
    se = b.ReduceMean(act, np.array([1, 2], np.int64), keepdims=0)            # (1, C)
    se = b.Reshape(se, np.array([1, 1, 1, 4], np.int64))
    se = b.Conv(b.Transpose(se, perm=NCHW), b.random_const((2, 4, 1, 1)))
    se = b.Relu(b.Transpose(se, perm=NHWC))
    se = b.Conv(b.Transpose(se, perm=NCHW), b.random_const((4, 2, 1, 1)))
    se = b.Sigmoid(b.Transpose(se, perm=NHWC))
    y = b.Mul(act, se)
    b.output(b.Conv(b.Transpose(y, perm=NCHW), b.random_const((3, 4, 1, 1))))
    assert transposes(b.graph) == 6
    g = optimize(b.graph)
    assert transposes(g) == 0
    assert_same_outputs(b.graph, g)


def test_subgraph_readers_get_the_original_layout():
    from ge_core.ir.types import TensorType

    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 2, 2))
    cond = b.input("cond", "bool", ())
    t = b.Transpose(x, perm=NHWC)
    y = b.Relu(t)
    branches = []
    for op in ("Neg", "Abs"):
        sub = Graph(f"then_{op}", parent=b.graph)
        o = sub.add_node(op, [y]).output
        o.type = TensorType("float32", (1, 2, 2, 3))
        sub.add_output(o)
        branches.append(sub)
    out = b.graph.add_node("If", [cond], {"then_branch": branches[0], "else_branch": branches[1]}).output
    b.output(b.Transpose(y, perm=NCHW), out)
    g, changed = run_pass(PASS, b.graph)
    assert changed and transposes(g) == 1
    for c in (True, False):
        feeds = random_inputs(b.graph, seed=1)
        feeds["cond"] = np.array(c)
        want, got = run_graph(b.graph, feeds), run_graph(g, feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_onnxruntime_agrees_on_a_mixed_graph():
    rng = np.random.default_rng(5)
    b = GraphBuilder(opset=18)
    x = b.input("x", "float32", (2, 6, 4, 4))
    t = b.Transpose(x, perm=NHWC)
    a, c = b.op("Split", t, np.array([3, 3], np.int64), axis=3, num_outputs=2)
    h = b.Concat(b.Relu(a), b.Mul(c, b.const(rng.standard_normal(3).astype(np.float32))), axis=3)
    h = b.Clip(h, np.float32(-0.5), np.float32(2.0))
    h = b.Add(h, b.Cast(b.Greater(h, np.float32(0.1)), to=1))
    out = b.Transpose(h, perm=NCHW)
    b.output(out)
    g = sink(b.graph)
    assert transposes(g) == 0
    feeds = random_inputs(b.graph, seed=3)
    want = run_onnxruntime(b.graph, feeds)
    got = run_graph(g, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
