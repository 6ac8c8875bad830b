"""Fusion patterns reach If branches and Loop bodies (nested too) exactly as the top level.

Conv+BatchNormalization+Relu and MatMul+Add+Relu are built at the top level, inside a Loop body
and inside both branches of an If; after compiling, every body holds the same fused ops as the
top-level graph, and the compiled model agrees with onnxruntime on the same inputs.
"""

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge

FUSED = ("ge.fused::FusedConv", "ge.fused::FusedMatMul")
UNFUSED = ("BatchNormalization", "Relu", "Add", "MatMul", "Conv")
RNG = np.random.default_rng(7)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def _weights(tag):
    """Initializers of one conv path (4 -> 4 channels, BN) and one matmul path (8 -> 8, bias)."""
    return [
        _init(f"w{tag}", RNG.standard_normal((4, 4, 3, 3)) * 0.3), _init(f"cb{tag}", RNG.standard_normal(4)),
        _init(f"s{tag}", np.linspace(0.5, 2, 4)), _init(f"b{tag}", RNG.standard_normal(4)),
        _init(f"m{tag}", RNG.standard_normal(4)), _init(f"v{tag}", np.linspace(1, 3, 4)),
        _init(f"mw{tag}", RNG.standard_normal((8, 8)) * 0.3), _init(f"mb{tag}", RNG.standard_normal(8)),
    ]


def _paths(tag, x, h, y, k):
    """Nodes: y = Relu(BN(Conv(x))) and k = Relu(MatMul(h, W) + b)."""
    return [
        helper.make_node("Conv", [x, f"w{tag}", f"cb{tag}"], [f"c{tag}"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", [f"c{tag}", f"s{tag}", f"b{tag}", f"m{tag}", f"v{tag}"], [f"bn{tag}"]),
        helper.make_node("Relu", [f"bn{tag}"], [y]),
        helper.make_node("MatMul", [h, f"mw{tag}"], [f"mm{tag}"]),
        helper.make_node("Add", [f"mm{tag}", f"mb{tag}"], [f"ad{tag}"]),
        helper.make_node("Relu", [f"ad{tag}"], [k]),
    ]


X, H = [1, 4, 9, 9], [3, 8]


def top_level_model():
    g = helper.make_graph(_paths("T", "x", "h", "y", "k"), "top", [_vi("x", X), _vi("h", H)],
                          [_vi("y", X), _vi("k", H)], initializer=_weights("T"))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def loop_model():
    """The paths in a Loop body carried over three trips; weights are outer initializers the
    body reads (implicit captures)."""
    body = helper.make_graph(
        _paths("L", "x_in", "h_in", "x_out", "h_out") + [helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL), _vi("x_in", X), _vi("h_in", H)],
        [_vi("c_out", [], TensorProto.BOOL), _vi("x_out", X), _vi("h_out", H)],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x", "h"], ["y", "k"], body=body)], "main",
        [_vi("trips", [], TensorProto.INT64), _vi("go", [], TensorProto.BOOL), _vi("x", X), _vi("h", H)],
        [_vi("y", X), _vi("k", H)], initializer=_weights("L"))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def if_model(nested=False):
    """The paths in both branches of an If, each branch with its own initializers; ``nested``
    puts the If inside a Loop body (a subgraph of a subgraph)."""
    def branch(tag):
        return helper.make_graph(_paths(tag, "xv", "hv", f"y{tag}", f"k{tag}"), f"branch{tag}", [],
                                 [_vi(f"y{tag}", X), _vi(f"k{tag}", H)], initializer=_weights(tag))

    if_node = helper.make_node("If", ["cond"], ["y", "k"], then_branch=branch("A"), else_branch=branch("B"))
    if not nested:
        g = helper.make_graph([helper.make_node("Identity", ["x"], ["xv"]), helper.make_node("Identity", ["h"], ["hv"]),
                               if_node], "main", [_vi("cond", [], TensorProto.BOOL), _vi("x", X), _vi("h", H)],
                              [_vi("y", X), _vi("k", H)])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["x_in"], ["xv"]), helper.make_node("Identity", ["h_in"], ["hv"]),
         helper.make_node("If", ["cond"], ["x_out", "h_out"], then_branch=branch("A"), else_branch=branch("B")),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL), _vi("x_in", X), _vi("h_in", H)],
        [_vi("c_out", [], TensorProto.BOOL), _vi("x_out", X), _vi("h_out", H)],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x", "h"], ["y", "k"], body=body)], "main",
        [_vi("trips", [], TensorProto.INT64), _vi("go", [], TensorProto.BOOL), _vi("cond", [], TensorProto.BOOL),
         _vi("x", X), _vi("h", H)], [_vi("y", X), _vi("k", H)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def fused_counts(graph):
    """Counter of the fused and unfused op types the paths are made of, in one graph."""
    c = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.nodes)
    return {k: c[k] for k in FUSED + UNFUSED if c[k]}


def bodies(graph, op_type):
    return [sub for n in graph.nodes if n.op_type == op_type for sub in n.subgraphs()]


def inputs_for(model, **extra):
    feeds = {"x": RNG.standard_normal(X).astype(np.float32), "h": RNG.standard_normal(H).astype(np.float32)}
    names = {i.name for i in model.graph.input}
    feeds.update(extra)
    return {k: v for k, v in feeds.items() if k in names}


def compile_and_compare(model, feeds_list):
    onnx.checker.check_model(model)
    compiled = ge.compile(ge.load(model, framework="onnx"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        got = compiled.run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-4, err_msg=k)
    return compiled


@pytest.fixture(scope="module")
def top_level():
    model = top_level_model()
    compiled = compile_and_compare(model, [inputs_for(model)])
    counts = fused_counts(compiled.graph)
    assert counts == {"ge.fused::FusedConv": 1, "ge.fused::FusedMatMul": 1}, counts  # BN folded, epilogues fused
    return counts


def test_loop_body_is_fused_as_the_top_level(top_level):
    model = loop_model()
    feeds = inputs_for(model, trips=np.array(3, np.int64), go=np.array(True))
    compiled = compile_and_compare(model, [feeds])
    (body,) = bodies(compiled.graph, "Loop")
    assert fused_counts(body) == top_level


@pytest.mark.parametrize("nested", [False, True], ids=["if", "if_in_loop"])
def test_if_branches_are_fused_as_the_top_level(top_level, nested):
    model = if_model(nested)
    extra = {"trips": np.array(2, np.int64), "go": np.array(True)} if nested else {}
    compiled = compile_and_compare(model, [inputs_for(model, cond=np.array(c), **extra) for c in (True, False)])
    graph = bodies(compiled.graph, "Loop")[0] if nested else compiled.graph
    branches = bodies(graph, "If")
    assert len(branches) == 2
    for branch in branches:
        assert fused_counts(branch) == top_level, branch.name


def test_a_body_pattern_does_not_reach_into_the_enclosing_graph():
    """A Relu in a Loop body reading an outer Conv is not fused with it: the Conv would be
    recomputed on every trip, and the outer graph's node is not the body's to remove."""
    body = helper.make_graph(
        [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["acc_in", "r"], ["acc_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL), _vi("acc_in", X)],
        [_vi("c_out", [], TensorProto.BOOL), _vi("acc_out", X)],
    )
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "wO", "cbO"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)], "main",
        [_vi("trips", [], TensorProto.INT64), _vi("go", [], TensorProto.BOOL), _vi("x", X)], [_vi("y", X)],
        initializer=_weights("O"))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    compiled = compile_and_compare(model, [inputs_for(model, trips=np.array(2, np.int64), go=np.array(True))])
    (body_after,) = bodies(compiled.graph, "Loop")
    assert "ge.fused::FusedConv" not in fused_counts(body_after)
    assert any(n.op_type in ("Conv", "FusedConv") for n in compiled.graph.nodes)
