"""A stored symbolic model is checked as data from a stranger: its symbolic plan's orders, its
reference bindings, its dim expressions and its dim ranges (each tampering an OmFormatError naming
the file, never a crash or a wrong run)."""

import json

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import OmFormatError
from ge_core.ir import symbolic as S
from tests.core.test_trust_om import definition, write


def chain() -> ge.Graph:
    """x[n, s] -> Relu -> Concat with itself along s -> Reshape to [n * 2s] -> Neg: sizes n*s*4 and n*2s*4."""
    g = ge.Graph("chain")
    x = g.add_input("x", ge.TensorType("float32", ("n", "s")))
    r = g.add_node("Relu", [x], name="r").outputs[0]
    c = g.add_node("Concat", [r, r], {"axis": 1}, name="c").outputs[0]
    shape = g.add_constant(np.array([-1], np.int64), "flat")
    f = g.add_node("Reshape", [c, shape], name="f").outputs[0]
    e = g.add_node("Exp", [f], name="e").outputs[0]
    out = g.add_node("Neg", [e], name="out").outputs[0]
    g.set_outputs([out])
    return g


def ref(x):
    y = np.maximum(x, 0)
    return -np.exp(np.concatenate([y, y], axis=1).reshape(-1))


@pytest.fixture(scope="module")
def model():
    return ge.compile(chain(), {"input_shape": "x:1~6,-1"})


def test_symbolic_model_plans_every_buffer_and_round_trips(tmp_path, model):
    assert model.report["memory"]["dynamic_buffers"] == 0
    f = model.graph.node_list()[2].outputs[0]  # the Reshape
    assert f.type.shape == (S.mul(S.mul("n", "s"), 2),)
    d, blob = definition(model)
    assert d["memory_plan"]["symbolic"] is True
    m = ge.load_om(write(tmp_path, d, blob))
    for shape in [(1, 3), (6, 40), (2, 1)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["out"], ref(x), rtol=1e-6)
    assert m.dim_ranges == {"n": (1, 6)}


def test_tampered_symbolic_parts_are_refused(tmp_path, model):
    d, blob = definition(model)

    def bad(mutate, match):
        e = json.loads(json.dumps(d))
        mutate(e)
        p = write(tmp_path, e, blob)
        with pytest.raises(OmFormatError, match=match) as info:
            ge.load_om(p)
        assert str(p) in str(info.value)

    plan = lambda e: e["memory_plan"]  # noqa: E731
    bad(lambda e: plan(e)["orders"][0].pop(), "permutation")
    bad(lambda e: plan(e)["orders"][0].append(plan(e)["orders"][0][0]), "permutation")
    bad(lambda e: plan(e)["orders"][0].__setitem__(0, "x"), "permutation")
    bad(lambda e: plan(e).update(orders=[]), "memory plan is invalid")
    bad(lambda e: plan(e).update(orders=plan(e)["orders"] * 9), "memory plan is invalid")
    bad(lambda e: plan(e).update(orders="abc"), "memory plan is invalid")
    bad(lambda e: plan(e)["references"].append({"n": True, "s": 2}), "memory plan is invalid")
    bad(lambda e: plan(e)["references"].append({"n": 2}), "symbols")
    bad(lambda e: plan(e)["references"].append({"n": 1 << 40, "s": 1 << 40}), "bytes")
    bad(lambda e: plan(e).update(symbolic=False), "symbolic problem needs a symbolic plan|invalid")
    node = lambda e: next(n for n in e["graph"]["nodes"] if n["name"] == "f")  # noqa: E731
    bad(lambda e: node(e)["outputs"][0].update(shape=[{"poly": [[1, [["n", 99]]]]}]), "expression")
    bad(lambda e: node(e)["outputs"][0].update(shape=[{"poly": "import os"}]), "expression")
    bad(lambda e: node(e)["outputs"][0].update(shape=[{"poly": [[3, [["n", 1]]]]}]), "invalid")  # a wrong size
    bad(lambda e: e["graph"]["metadata"].update({"ge.dim_ranges": {"n": [5, 2]}}), "dim ranges")
    bad(lambda e: e["graph"]["metadata"].update({"ge.dim_ranges": "n:1~6"}), "dim ranges")
