"""The ONNX frontend against hostile or unusual models (issue 15).

* local functions that expand exponentially are refused before onnx.inliner builds them;
  normal functions still inline and agree with onnxruntime;
* duplicate value names inside a subgraph, and a subgraph redefining a name of an enclosing
  graph (ONNX forbids shadowing), are refused with a ModelFileError naming graph, node and name;
* a graph input that is also an initializer (IR >= 4) can be fed, as onnxruntime allows: the
  initializer is its default, and the compiler never folds it away.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import InputError, ModelFileError

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _model(nodes, inputs, outputs, initializers=(), functions=(), **kw):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=OPSETS if functions else OPSETS[:1], functions=list(functions), **kw)


# ------------------------------------------------------------------------------------------
# local functions
# ------------------------------------------------------------------------------------------
def _doubling_chain(levels: int) -> onnx.ModelProto:
    """f0 = Neg; f(i) calls f(i-1) twice: a few KB that inline into 2**levels nodes."""
    funcs = [helper.make_function("local", "f0", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])], OPSETS[:1])]
    for i in range(1, levels + 1):
        funcs.append(helper.make_function(
            "local", f"f{i}", ["x"], ["y"],
            [helper.make_node(f"f{i - 1}", ["x"], ["t"], domain="local"),
             helper.make_node(f"f{i - 1}", ["t"], ["y"], domain="local")], OPSETS))
    return _model([helper.make_node(f"f{levels}", ["x"], ["y"], domain="local")], [_vi("x", [2])], [_vi("y", [2])],
                  functions=funcs)


def test_exponentially_expanding_functions_are_refused_before_inlining():
    m = _doubling_chain(30)
    assert len(m.SerializeToString()) < 10_000
    start = time.monotonic()
    with pytest.raises(ModelFileError, match=r"'local::f30' alone expands into 1,073,741,824 nodes"):
        ge.load(m)
    assert time.monotonic() - start < 5


def test_a_chain_below_the_limit_still_inlines_and_matches_onnxruntime():
    m = _doubling_chain(6)  # 64 Negs: an even count, so y == x
    x = np.array([1.5, -2.0], np.float32)
    model = ge.compile(ge.load(m), {"opt_level": 0})
    np.testing.assert_array_equal(model.run({"x": x})["y"], _ort(m, {"x": x})[0])


def test_recursive_functions_are_refused():
    a = helper.make_function("local", "a", ["x"], ["y"], [helper.make_node("b", ["x"], ["y"], domain="local")], OPSETS)
    b = helper.make_function("local", "b", ["x"], ["y"], [helper.make_node("a", ["x"], ["y"], domain="local")], OPSETS)
    m = _model([helper.make_node("a", ["x"], ["y"], domain="local")], [_vi("x", [2])], [_vi("y", [2])], functions=[a, b])
    with pytest.raises(ModelFileError, match=r"calls itself \('local::a' -> 'local::b' -> 'local::a'\)"):
        ge.load(m)


def test_functions_called_in_subgraphs_and_twice_inline_and_match_onnxruntime():
    scale = helper.make_function(  # y = x * 2 + 1, through a nested function call
        "local", "scale", ["x"], ["y"],
        [helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
         helper.make_node("Mul", ["x", "two"], ["m"]),
         helper.make_node("inc", ["m"], ["y"], domain="local")], OPSETS)
    inc = helper.make_function(
        "local", "inc", ["x"], ["y"],
        [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float32))),
         helper.make_node("Add", ["x", "one"], ["y"])], OPSETS[:1])
    then_g = helper.make_graph([helper.make_node("scale", ["x"], ["t"], domain="local")], "then", [], [_vi("t", [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [3])])
    m = _model(
        [helper.make_node("scale", ["x"], ["s"], domain="local", name="call1"),
         helper.make_node("scale", ["s"], ["s2"], domain="local", name="call2"),
         helper.make_node("If", ["c"], ["b"], then_branch=then_g, else_branch=else_g, name="branch"),
         helper.make_node("Add", ["s2", "b"], ["y"])],
        [_vi("x", [3]), _vi("c", [], TensorProto.BOOL)], [_vi("y", [3])], functions=[scale, inc])
    onnx.checker.check_model(m)
    model = ge.compile(ge.load(m))
    x = np.array([0.5, -1.0, 3.0], np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_allclose(model.run(feeds)["y"], _ort(m, feeds)[0], rtol=1e-6)


# ------------------------------------------------------------------------------------------
# duplicate value names inside subgraphs
# ------------------------------------------------------------------------------------------
def _loop_with_body(body_nodes, body_inputs=None, body_inits=(), outer_extra=()):
    body = helper.make_graph(
        body_nodes, "body",
        body_inputs or [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("v_in", [2])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [2])], initializer=list(body_inits))
    trips = numpy_helper.from_array(np.array(3, np.int64), "trips")
    return _model(list(outer_extra) + [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="the_loop", body=body)],
                  [_vi("x", [2])], [_vi("y", [2])], [trips])


_COND = helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")


def test_a_subgraph_defining_a_name_twice_is_refused():
    m = _loop_with_body([_COND,
                         helper.make_node("Neg", ["v_in"], ["t"], name="first"),
                         helper.make_node("Abs", ["v_in"], ["t"], name="second"),
                         helper.make_node("Identity", ["t"], ["v_out"], name="out")])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(m)  # onnx agrees the model is malformed
    with pytest.raises(ModelFileError, match=r"subgraph 'body' \(attribute the_loop\.body\), node 'second' \(Abs\), "
                                             r"defines tensor 't', which this graph already defines"):
        ge.load(m)


def test_a_subgraph_initializer_and_node_output_with_one_name_are_refused():
    m = _loop_with_body([_COND, helper.make_node("Neg", ["v_in"], ["w"], name="neg"),
                         helper.make_node("Add", ["w", "v_in"], ["v_out"], name="add")],
                        body_inits=[numpy_helper.from_array(np.ones(2, np.float32), "w")])
    with pytest.raises(ModelFileError, match=r"subgraph 'body'.*node 'neg'.*tensor 'w'.*already defines"):
        ge.load(m)


def test_a_subgraph_node_output_shadowing_an_outer_value_is_refused():
    outer = helper.make_node("Abs", ["x"], ["a"], name="outer_abs")
    m = _loop_with_body([_COND, helper.make_node("Neg", ["v_in"], ["a"], name="inner_neg"),
                         helper.make_node("Add", ["a", "v_in"], ["v_out"], name="add")], outer_extra=[outer])
    with pytest.raises(ModelFileError, match=r"subgraph 'body'.*node 'inner_neg' \(Neg\).*tensor 'a', which shadows a value "
                                             r"of an enclosing graph"):
        ge.load(m)


def test_a_subgraph_input_shadowing_an_outer_value_is_refused():
    m = _loop_with_body([_COND, helper.make_node("Neg", ["x"], ["v_out"], name="neg")],
                        body_inputs=[_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("x", [2])])
    with pytest.raises(ModelFileError, match=r"subgraph 'body'.*graph input 'x', which shadows"):
        ge.load(m)


def test_nested_subgraph_shadowing_a_grandparent_value_is_refused():
    inner_then = helper.make_graph([helper.make_node("Neg", ["v_in"], ["x"], name="deep")], "inner_then", [],
                                   [_vi("x", [2])])
    inner_else = helper.make_graph([helper.make_node("Abs", ["v_in"], ["e"], name="fine")], "inner_else", [],
                                   [_vi("e", [2])])
    m = _loop_with_body([_COND, helper.make_node("If", ["cond_in"], ["v_out"], name="inner_if",
                                                 then_branch=inner_then, else_branch=inner_else)])
    with pytest.raises(ModelFileError, match=r"subgraph 'inner_then'.*node 'deep'.*'x', which shadows"):
        ge.load(m)


def test_the_main_graph_shares_the_check():
    m = _model([helper.make_node("Neg", ["x"], ["t"], name="a"), helper.make_node("Abs", ["x"], ["t"], name="b"),
                helper.make_node("Identity", ["t"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ModelFileError, match=r"graph 'g', node 'b' \(Abs\), defines tensor 't', which this graph already"):
        ge.load(m)


def test_sibling_subgraphs_may_reuse_a_name_and_match_onnxruntime():
    m = _loop_with_body([_COND, helper.make_node("Neg", ["v_in"], ["t"], name="neg"),
                         helper.make_node("Add", ["t", "v_in"], ["u"], name="add"),
                         helper.make_node("Sub", ["u", "t"], ["v_out"], name="sub")])
    onnx.checker.check_model(m)
    x = np.array([1.0, -4.0], np.float32)
    np.testing.assert_array_equal(ge.compile(ge.load(m)).run({"x": x})["y"], _ort(m, {"x": x})[0])


# ------------------------------------------------------------------------------------------
# graph inputs that are also initializers
# ------------------------------------------------------------------------------------------
W = np.arange(6, dtype=np.float32).reshape(2, 3)


def _overridable(ir_version=8):
    """y = x + w * 2 with w an initializer listed as a graph input: folding w * 2 would be wrong."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    return _model([helper.make_node("Mul", ["w", "two"], ["w2"], name="scale"),
                   helper.make_node("Add", ["x", "w2"], ["y"], name="add")],
                  [_vi("x", [2, 3]), _vi("w", [2, 3])], [_vi("y", [2, 3])],
                  [numpy_helper.from_array(W, "w"), two], ir_version=ir_version)


@pytest.mark.parametrize("options", [{}, {"constant_folding": True, "opt_level": 3},
                                     {"executor": "sequential"}, {"executor": "arena"}],
                         ids=["default", "folding", "sequential", "arena"])
def test_an_initializer_listed_as_input_can_be_fed_or_left_out_like_onnxruntime(options):
    m = _overridable()
    model = ge.compile(ge.load(m), options)
    assert model.input_names == ["x", "w"] and list(model.input_defaults) == ["w"]
    x = np.ones((2, 3), np.float32)
    w = np.full((2, 3), -5.0, np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], _ort(m, {"x": x})[0])  # not fed: the initializer
    np.testing.assert_array_equal(model.run(x)["y"], _ort(m, {"x": x})[0])  # x is the one input without a default
    got = model.run({"x": x, "w": w})["y"]
    np.testing.assert_array_equal(got, _ort(m, {"x": x, "w": w})[0])  # fed: the value given
    np.testing.assert_array_equal(got, x + 2 * w)
    with pytest.raises(InputError, match="input 'w' has shape"):
        model.run({"x": x, "w": np.ones((3, 3), np.float32)})


def test_before_ir4_such_an_initializer_stays_a_folded_constant():
    m = _overridable(ir_version=3)
    m.opset_import[0].version = 8
    model = ge.compile(ge.load(m))
    assert model.input_names == ["x"] and model.input_defaults == {}
    assert "Mul" not in model.report["op_counts"]  # folded: w is a weight here
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], x + 2 * W)


def test_the_backend_adapter_feeds_lists_as_onnxruntime_does():
    from ge_onnx import backend

    m = _overridable()
    x = np.ones((2, 3), np.float32)
    rep = backend.prepare(m)
    np.testing.assert_array_equal(rep.run([x])[0], _ort(m, {"x": x})[0])  # the required input first
    w = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(rep.run([x, w])[0], _ort(m, {"x": x, "w": w})[0])


def test_an_om_keeps_the_default_of_such_an_input(tmp_path):
    m = _overridable()
    path = ge.compile(ge.load(m)).save(tmp_path / "m.om")
    model = ge.load_om(path)
    assert list(model.input_defaults) == ["w"]
    np.testing.assert_array_equal(model.input_defaults["w"], W)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], _ort(m, {"x": x})[0])
    w = np.full((2, 3), 3.0, np.float32)
    np.testing.assert_array_equal(model.run({"x": x, "w": w})["y"], _ort(m, {"x": x, "w": w})[0])


def test_ge_run_keeps_the_default_of_an_input_it_makes_random_feeds_for(tmp_path):
    """``ge run`` without --input makes random feeds for the inputs that have no default only."""
    import subprocess
    import sys

    m = _overridable()
    om = str(tmp_path / "m.om")
    ge.compile(ge.load(m)).save(om)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "run", om, "--output-dir", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    from ge_sdk.cli import random_feeds

    feeds = random_feeds(ge.load_om(om))
    assert list(feeds) == ["x"]
    y = np.load(out / "y.npy")
    np.testing.assert_array_equal(y, _ort(m, {"x": feeds["x"]})[0])
