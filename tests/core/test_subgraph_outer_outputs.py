"""A body that returns a value of the enclosing graph directly (an If branch whose output is an
outer value, a Loop body passing one through) reads it: dead-code removal keeps its producer and
the memory plan keeps its bytes alive until the If/Loop runs. Before, the arena and sink
executors returned the other branch's bytes and opt_level 1 refused the graph. onnxruntime
refuses such models ("Subgraph output is an outer scope value being returned directly"), so
onnx.reference is the oracle."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

import ge_core as ge


def _if_model():
    then = h.make_graph([], "then", [], [h.make_tensor_value_info("b", T.FLOAT, [4])])
    els = h.make_graph([], "else", [], [h.make_tensor_value_info("c", T.FLOAT, [4])])
    g = h.make_graph([h.make_node("Relu", ["a"], ["b"]), h.make_node("Neg", ["a"], ["c"]),
                      h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)], "m",
                     [h.make_tensor_value_info("a", T.FLOAT, [4]), h.make_tensor_value_info("cond", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _loop_model():
    # the body passes the outer value 'e' straight out as its scan output
    body = h.make_graph([h.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, [])],
                        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("e", T.FLOAT, [4])])
    g = h.make_graph([h.make_node("Exp", ["a"], ["e"]),
                      h.make_node("Loop", ["n", "t"], ["stacked"], body=body)], "m",
                     [h.make_tensor_value_info("a", T.FLOAT, [4]), h.make_tensor_value_info("n", T.INT64, []),
                      h.make_tensor_value_info("t", T.BOOL, [])],
                     [h.make_tensor_value_info("stacked", T.FLOAT, [None, 4])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


A = np.array([-2.0, -1.0, 0.5, 1.0], np.float32)
CASES = {
    "if_then": (_if_model, {"a": A, "cond": np.array(True)}),
    "if_else": (_if_model, {"a": A, "cond": np.array(False)}),
    "loop": (_loop_model, {"a": A, "n": np.array(3, np.int64), "t": np.array(True)}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("opt_level", [0, 1, 2])
@pytest.mark.parametrize("executor", ["arena", "sink", "sequential", "streams"])
def test_a_body_returning_an_outer_value_matches_onnxruntime(case, opt_level, executor, tmp_path):
    make, feeds = CASES[case]
    m = make()
    want = ReferenceEvaluator(m).run(None, feeds)
    model = ge.compile(m, opt_level=opt_level, executor=executor)
    got = list(model.run(feeds).values())
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=1e-6)
    path = str(tmp_path / "m.om")
    model.save(path)
    for g_, w in zip(ge.load_om(path).run(feeds).values(), want):
        np.testing.assert_allclose(g_, w, rtol=1e-6)
