"""Runs that never hang and feeds that never crash (issue 15, "Crashes, hangs, silent loss").

* a Loop with an enormous trip count ends with an ExecutionError naming the node, through
  ``run(feeds, timeout=)`` on every executor (the deadline reaches the stream threads) and
  through the iteration limit ``GE_MAX_LOOP_ITERATIONS``;
* whatever is passed as feeds (a string, a list, a bare array, ragged lists, dicts, None, object
  arrays), the answer is a result or an InputError naming the input, never a raw exception;
* the feed check is linear in the number of inputs.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ORT
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import ExecutionError, InputError
from ge_core.kernel import MAX_LOOP_ITERATIONS_ENV, check_deadline, run_deadline
from ge_sdk import GraphBuilder

EXECUTORS = {
    "sink": {"executor": "sink", "enable_single_stream": True},
    "arena": {"executor": "arena", "enable_single_stream": True},
    "sequential": {"executor": "sequential", "enable_single_stream": True},
    "streams": {"executor": "streams", "stream_allocator": "dependency", "opt_level": 0},
    "sink/streams": {"executor": "sink", "stream_allocator": "dependency", "opt_level": 0},
}


def _loop_model(trips: int, branches: int = 1) -> onnx.ModelProto:
    """``branches`` independent Loops, each adding 1 to its own copy of x ``trips`` times."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "one")],
    )
    nodes, outs = [], []
    for k in range(branches):
        nodes.append(helper.make_node("Neg", ["x"], [f"x{k}"], name=f"neg{k}"))
        nodes.append(helper.make_node("Loop", ["trips", "cond", f"x{k}"], [f"y{k}"], name=f"runaway_loop{k}",
                                      body=body))
        outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [2]))
    g = helper.make_graph(
        nodes, "loops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], outs,
        [numpy_helper.from_array(np.array(trips, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


X2 = np.array([1.0, -2.0], np.float32)


@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_timeout_ends_a_runaway_loop_on_every_executor(executor):
    model = ge.compile(ge.load(_loop_model(10**12, branches=2)), EXECUTORS[executor])
    if "streams" in executor:
        assert model.streams.count > 1  # one Loop runs on a worker thread
    start = time.monotonic()
    with pytest.raises(ExecutionError, match=r"^node 'runaway_loop\d'(, iteration \d+: node '\w+')?: the run was cancelled "
                                               r"after its timeout of 0\.5 s"):
        model.run({"x": X2}, timeout=0.5)
    assert time.monotonic() - start < 10
    # the deadline ended with that run: a short loop on the same model is unaffected afterwards
    short = ge.compile(ge.load(_loop_model(3, branches=2)), EXECUTORS[executor])
    ref = ORT.InferenceSession(_loop_model(3, branches=2).SerializeToString(), providers=["CPUExecutionProvider"])
    got = short.run({"x": X2}, timeout=60)
    for name, want in zip(short.output_names, ref.run(None, {"x": X2})):
        np.testing.assert_array_equal(got[name], want)
    np.testing.assert_array_equal(short.run({"x": X2})["y0"], -X2 + 3)


def test_iteration_limit_ends_a_loop_and_names_node_and_limit(monkeypatch):
    model = ge.compile(ge.load(_loop_model(10**12)))
    monkeypatch.setenv(MAX_LOOP_ITERATIONS_ENV, "1000")
    start = time.monotonic()
    with pytest.raises(ExecutionError, match=r"runaway_loop0.*limit.*GE_MAX_LOOP_ITERATIONS.*1000"):
        model.run({"x": X2})
    assert time.monotonic() - start < 10
    # a loop of exactly the limit still runs, and agrees with onnxruntime
    exact = _loop_model(1000)
    ref = ORT.InferenceSession(exact.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X2})[0]
    np.testing.assert_array_equal(ge.compile(ge.load(exact)).run({"x": X2})["y0"], ref)
    monkeypatch.setenv(MAX_LOOP_ITERATIONS_ENV, "not a number")
    with pytest.raises(ge.GEError, match=MAX_LOOP_ITERATIONS_ENV):
        model.run({"x": X2})


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "5", True, [1]])
def test_bad_timeouts_are_input_errors(timeout):
    model = ge.compile(_one_input_graph())
    with pytest.raises(InputError, match="timeout"):
        model.run({"x": X}, timeout=timeout)


def test_check_deadline_is_a_context_variable():
    check_deadline("n")  # no deadline: nothing happens
    with run_deadline(0.001):
        time.sleep(0.01)
        with pytest.raises(ExecutionError, match="node 'n'"):
            check_deadline("n")
    check_deadline("n")  # reset on leaving the block


# ------------------------------------------------------------------------------------------
# feeds
# ------------------------------------------------------------------------------------------
X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _one_input_graph():
    b = GraphBuilder("one")
    x = b.input("x", "float32", (2, 3))
    b.output(b.op("Neg", x))
    return b.graph


def _two_input_graph(dtype="float32"):
    b = GraphBuilder("two")
    x = b.input("x", "float32", (2, 3))
    k = b.input("k", dtype, (3,))
    b.output(b.op("Add", x, b.op("Cast", k, to=1)))
    return b.graph


@pytest.fixture(scope="module")
def one():
    return ge.compile(_one_input_graph())


@pytest.fixture(scope="module")
def two():
    return ge.compile(_two_input_graph("int32"))


def test_a_bare_array_feeds_a_model_with_one_input(one):
    np.testing.assert_array_equal(one.run(X)[one.output_names[0]], -X)


@pytest.mark.parametrize("feeds", ["x", b"x", [X], (X,), [[1.0, 2.0, 3.0]] * 2, {X.tobytes()}, 3.0],
                         ids=["str", "bytes", "list", "tuple", "nested-list", "set", "float"])
def test_something_other_than_a_dict_is_an_input_error(one, feeds):
    with pytest.raises(InputError, match="dict of input name -> array"):
        one.run(feeds)


def test_a_bare_array_is_refused_when_the_model_has_several_inputs(two):
    with pytest.raises(InputError, match="exactly one input"):
        two.run(X)


@pytest.mark.parametrize("value, why", [
    ("abc", "text"),
    (b"abc", "text"),
    ([[1.0, 2.0, 3.0], [4.0]], "cannot be made into an array"),
    ({"a": 1}, "dict"),
    (None, "None"),
    (np.array([[1.0, "a", None]] * 2, dtype=object), "dtype object"),
    ([[1.0, None, 2.0]] * 2, "Python objects"),
    (np.ma.masked_array(X, mask=X > 2), "masked array"),
    (lambda: X, "function"),
])
def test_bad_values_are_input_errors_naming_the_input(one, value, why):
    with pytest.raises(InputError, match=rf"input 'x'.*{why}|{why}.*input 'x'") as ei:
        one.run({"x": value})
    assert "internal error" not in str(ei.value)


def test_lists_and_numbers_convert_only_when_their_values_survive(two):
    ok = two.run({"x": X.tolist(), "k": [1, 2, 3]})
    np.testing.assert_array_equal(ok[two.output_names[0]], X + np.array([1, 2, 3], np.float32))
    with pytest.raises(InputError, match="input 'k'.*float64"):
        two.run({"x": X, "k": [1.5, 2.0, 3.0]})  # a float never becomes an int silently
    with pytest.raises(InputError, match="input 'k'.*cannot represent"):
        two.run({"x": X, "k": [2**40, 0, 0]})  # an int never wraps around
    with pytest.raises(InputError, match="input 'k'.*int64"):
        two.run({"x": X, "k": np.array([1, 2, 3], np.int64)})  # arrays keep their dtype: say so


def test_string_inputs_hold_only_strings():
    b = GraphBuilder("strings")
    s = b.input("s", "object", (2,))
    b.output(b.op("Identity", s))
    model = ge.compile(b.graph)
    assert list(model.run({"s": np.array(["a", "b"], dtype=object)})[model.output_names[0]]) == ["a", "b"]
    with pytest.raises(InputError, match="input 's' holds a dict"):
        model.run({"s": np.array(["a", {}], dtype=object)})


def test_unknown_and_missing_inputs_are_named(two):
    with pytest.raises(InputError, match=r"missing input\(s\) 'k'"):
        two.run({"x": X})
    with pytest.raises(InputError, match=r"unknown input\(s\) 0"):
        two.run({"x": X, "k": np.zeros(3, np.int32), 0: X})


def test_feed_check_is_linear_in_the_number_of_inputs():
    n = 100_000
    b = GraphBuilder("wide")
    xs = [b.input(f"x{i}", "float32", (1,)) for i in range(n)]
    b.output(b.op("Neg", xs[0]))
    model = ge.compile(b.graph, {"opt_level": 0})
    feeds = {f"x{i}": np.zeros(1, np.float32) for i in range(n)}
    model.run(feeds)  # builds the executable
    start = time.monotonic()
    out = model.run(feeds)
    # quadratic code (a list scan per name) took ~40 s here; linear code takes well under 1 s
    assert time.monotonic() - start < 5
    np.testing.assert_array_equal(out[model.output_names[0]], np.zeros(1, np.float32))
    del feeds["x77"], feeds["x99999"]
    feeds["nope"] = np.zeros(1, np.float32)
    start = time.monotonic()
    with pytest.raises(InputError, match=r"missing input\(s\) 'x77', 'x99999'; unknown input\(s\) 'nope'") as ei:
        model.run(feeds)
    assert time.monotonic() - start < 5 and len(str(ei.value)) < 2000  # the hint lists 10 names, not 100k
