"""Lifetimes and sharing: in place, views, zero-copy concat, streams; the schedule pass."""

import numpy as np
import pytest

import ge_core as ge
from ge_core.memory import build_problem, lower_bound
from ge_core.ops import OpKind
from ge_core.plugins import get_host
from ge_core.schedule import StreamAssignment
from ge_sdk import GraphBuilder

#: These tests count kernels and op types: keep the fuse stage empty so fusion cannot merge them.
NO_FUSION = {"pipeline": {"fuse": {"passes": []}}}


def alias(node):
    d = get_host().registries.ops.lookup(node.domain, node.op_type)
    return d.aliasing if d is not None else ""


def problem(g, **kw):
    kw.setdefault("share", True)
    return build_problem(g, g.node_list(), alias=alias, **kw)


def conv_relu_chain():
    b = GraphBuilder("chain")
    x = b.input("x", "float32", (1, 3, 8, 8))
    c = b.op("Conv", x, b.random_const((4, 3, 3, 3)), pads=[1, 1, 1, 1])
    r = b.op("Relu", c)          # c dies here: in place
    s = b.op("Sigmoid", r)       # r is read again below: not in place
    y = b.op("Add", s, r)
    b.output(b.op("Relu", y))
    return b.build()


def test_elementwise_output_takes_the_bytes_of_an_input_that_dies():
    g = conv_relu_chain()
    p = problem(g)
    names = {n.op_type + str(i): n.output.name for i, n in enumerate(g.node_list())}
    assert p.aliases[names["Relu1"]][0] == names["Conv0"] and p.alias_kinds[names["Relu1"]] == "inplace"
    assert names["Sigmoid2"] not in p.aliases  # its input is still read by Add
    assert p.aliases[names["Add3"]][0] in (names["Conv0"], names["Sigmoid2"])  # Add: one input dies
    unshared = problem(g, share=False)
    assert not unshared.aliases and lower_bound(p) < lower_bound(unshared)


def test_no_in_place_over_bytes_another_input_reads_elsewhere():
    b = GraphBuilder("bcast")
    x = b.input("x", "float32", (1, 1, 1, 1))
    a = b.op("Relu", b.op("Neg", x))                  # lies at the start of c
    h = b.op("Relu", b.op("Tile", x, np.array([1, 3, 1, 1], np.int64)))
    c = b.op("Concat", a, h, axis=1)
    y = b.op("Add", c, a)                             # writing y over c would clobber a mid-read
    b.output(b.op("Neg", y))
    g = b.build()
    p = problem(g)
    assert p.aliases[a.name][0] == c.name and y.name not in p.aliases
    xv = np.full((1, 1, 1, 1), -2.0, np.float32)
    np.testing.assert_array_equal(list(ge.compile(g).run({"x": xv}).values())[0], np.array([-4, -2, -2, -2], np.float32).reshape(1, 4, 1, 1))


def concat_graph(batch=1, axis=1):
    b = GraphBuilder("cat")
    x = b.input("x", "float32", (batch, 3, 4, 4))
    u = b.op("Relu", b.op("Conv", x, b.random_const((2, 3, 1, 1))))
    v = b.op("Conv", x, b.random_const((5 if axis == 1 else 2, 3, 1, 1)))
    c = b.op("Concat", u, v, axis=axis)
    b.output(b.op("Sigmoid", c))
    return b.build(), u, v, c


def test_concat_inputs_lie_back_to_back_in_the_output():
    g, u, v, c = concat_graph()
    p = problem(g)
    assert p.aliases[v.name] == (c.name, 2 * 16 * 4, 5 * 16 * 4)
    root, off, _ = p.aliases[u.name]
    assert root == c.name and off == 0  # u is in place over the conv, which lies at c's start
    model = ge.compile(g, NO_FUSION)
    exe = model.executable
    assert exe.noop_steps == 1 and model.report["kernels"] == len(g) - 1
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    off = ge.compile(g, {"memory_optimize_level": "off"}).run({"x": x})
    np.testing.assert_array_equal(model.run({"x": x})[g.outputs[0].name], off[g.outputs[0].name])


@pytest.mark.parametrize("batch,axis", [(2, 1), (1, 2)])
def test_concat_that_is_not_contiguous_copies(batch, axis):
    g, u, v, c = concat_graph(batch, axis)
    p = problem(g)
    assert v.name not in p.aliases and c.name not in p.aliases
    x = np.random.default_rng(1).standard_normal((batch, 3, 4, 4)).astype(np.float32)
    got = ge.compile(g).run({"x": x})
    want = ge.compile(g, {"disable_reuse_memory": True}).run({"x": x})
    np.testing.assert_array_equal(list(got.values())[0], list(want.values())[0])


def test_views_share_their_input_and_run_as_no_ops():
    b = GraphBuilder("view")
    x = b.input("x", "float32", (1, 8, 2, 2))
    h = b.op("Relu", b.op("Conv", x, b.random_const((8, 8, 1, 1))))
    f = b.op("Flatten", h, axis=1)
    b.output(b.op("Gemm", f, b.random_const((10, 32)), transB=1))
    g = b.build()
    p = problem(g)
    assert p.alias_kinds[f.name] == "view"
    model = ge.compile(g)
    assert model.executable.noop_steps == 1


def two_streams(events):
    b = GraphBuilder("streams")
    x = b.input("x", "float32", (1, 256))
    a = b.op("Relu", x)          # 0, stream 0
    s = b.op("Sigmoid", a)       # 1, stream 0
    t = b.op("Tanh", x)          # 2, stream 1
    y = b.op("Add", s, t)        # 3, stream 0
    b.output(b.op("Neg", y))     # 4
    g = b.build()
    return g, StreamAssignment([0, 0, 1, 0, 0], events), a, t


def test_reuse_across_streams_waits_for_an_event():
    g, sa, a, t = two_streams([])
    # without an event, Tanh on stream 1 is unordered with the reads of a: a stays alive to the end of stream 1
    p = build_problem(g, g.node_list(), streams=sa)
    ends = {bf.name: bf.end for bf in p.buffers}
    assert ends[a.name] >= 2
    g, sa, a, t = two_streams([(1, 2)])  # stream 1 waits for Sigmoid: a's last read
    p = build_problem(g, g.node_list(), streams=sa)
    assert {bf.name: bf.end for bf in p.buffers}[a.name] == 1
    single = build_problem(g, g.node_list(), streams=StreamAssignment.single(len(g)))
    assert {bf.name: bf.end for bf in single.buffers}[a.name] == 1
    # in place is only planned on one stream
    assert not build_problem(g, g.node_list(), streams=sa, alias=alias, share=True).alias_kinds.get(t.name) == "inplace"


def test_sink_pass_moves_constant_computations_to_their_reader():
    b = GraphBuilder("sink")
    x = b.input("x", "float32", (1, 64))
    w1 = b.op("ConstantOfShape", np.array([64, 64], np.int64), value=np.array([0.01], np.float32))
    w2 = b.op("ConstantOfShape", np.array([64, 64], np.int64), value=np.array([0.02], np.float32))
    h = b.op("Relu", b.op("MatMul", x, w1))
    b.output(b.op("MatMul", h, w2))
    g = b.build()
    model = ge.compile(g, {"constant_folding": False, **NO_FUSION})
    order = [n.op_type for n in model.schedule]
    assert order == ["ConstantOfShape", "MatMul", "Relu", "ConstantOfShape", "MatMul"], order
    assert model.report["memory"]["lower_bound_bytes"] < 2 * 64 * 64 * 4 + 2 * 256
    off = ge.compile(g, {"memory_optimize_level": "off", "constant_folding": False, **NO_FUSION})
    assert [n.op_type for n in off.schedule][:2] == ["ConstantOfShape", "ConstantOfShape"]
    xv = np.ones((1, 64), np.float32)
    np.testing.assert_allclose(list(model.run({"x": xv}).values())[0], list(off.run({"x": xv}).values())[0])


def test_the_op_sets_alias_fact_is_what_sharing_relies_on():
    relu = conv_relu_chain().node_list()[1]
    d = get_host().registries.ops.lookup(relu.domain, relu.op_type)
    assert d.kind == OpKind.ELEMWISE and d.alias == "inplace" and alias(relu) == "inplace"
    ops = get_host().registries.ops
    assert ops.lookup("", "Reshape").alias == "view" and ops.lookup("", "Concat").alias == "concat"
    assert ops.lookup("", "Conv").aliasing == ""
