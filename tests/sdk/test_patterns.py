"""The pattern language: every construct, explain, rewriting, and anchored (indexed) matching."""

import numpy as np
import pytest

from ge_core import GEError
from ge_core.plugins import get_host
from ge_sdk import GraphBuilder
from ge_sdk import patterns as P
from ge_sdk.patterns import Alt, Const, Op, Optional, Repeat, Rule, Var, apply_rules, explain, match, match_all


def node(g, name):
    n = g.find_node(name)
    assert n is not None, name
    return n


def test_op_alternatives_wildcards_and_names():
    b = GraphBuilder(); x = b.input("x", "float32", (2, 3)); y = b.input("y", "float32", (2, 3))
    b.output(b.Relu(b.Sub(x, y)))
    g = b.build()
    pat = Op("Relu", Op("Add|Sub", Var("a"), Var("b"), name="arith"))
    m = match(pat, node(g, "relu"))
    assert m is not None and m["a"] is g.inputs[0] and m["b"] is g.inputs[1] and m["arith"].op_type == "Sub"
    assert match(Op("Relu", Op(["Add", "Mul"], Var(), Var())), node(g, "relu")) is None
    # the same name twice must be the same value
    assert match(Op("Relu", Op("Sub", Var("a"), Var("a"))), node(g, "relu")) is None
    assert {n.op_type for n in m.nodes} == {"Relu", "Sub"}


def test_attribute_shape_and_type_predicates():
    b = GraphBuilder(); x = b.input("x", "float32", (1, 3, 4, 4))
    b.output(b.LeakyRelu(b.Transpose(x, perm=[0, 2, 3, 1]), alpha=0.2))
    g = b.build()
    lr = node(g, "leakyrelu")
    assert match(Op("LeakyRelu", Op("Transpose", Var(rank=4), attrs={"perm": [0, 2, 3, 1]}),
                    attrs={"alpha": lambda a: a < 0.5}), lr)
    assert not match(Op("LeakyRelu", Var(), attrs={"alpha": 0.01}), lr)
    assert match(Op("LeakyRelu", Var(dtype="float32", shape=(1, 4, None, 3))), lr)
    assert not match(Op("LeakyRelu", Var(dtype="float16")), lr)
    assert not match(Op("LeakyRelu", Var(shape=(1, 3, 4, 4))), lr)
    assert match(Op("LeakyRelu", Var(), pred=lambda n: n.attrs["alpha"] > 0.1, dtype="float32", rank=4), lr)
    assert match(Op("LeakyRelu", Var(pred=lambda v: v.producer is not None)), lr)


def test_attribute_default_comes_from_the_op_definition():
    b = GraphBuilder(); x = b.input("x", "float32", (2,))
    b.output(b.LeakyRelu(x))
    g = b.build()
    ops = get_host().registries.ops
    assert ops.lookup("", "LeakyRelu").attrs.get("alpha") == 0.01  # ge_opset records attribute defaults
    assert match(Op("LeakyRelu", Var(), attrs={"alpha": lambda a: abs(a - 0.01) < 1e-6}), node(g, "leakyrelu"), ops)


def test_commutative_matching_and_constants():
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    b.output(b.Add(np.float32(2.0), x))
    g = b.build()
    add = node(g, "add")
    assert not match(Op("Add", Var("x"), Const("c")), add)
    m = match(Op("Add", Var("x"), Const("c", scalar=True), commutative=True), add)
    assert m and m["x"] is g.inputs[0] and float(m.const("c")) == 2.0
    assert match(Op("Add", Var(), Const(value=2.0), commutative=True), add)
    assert not match(Op("Add", Var(), Const(value=3.0), commutative=True), add)
    assert match(Op("Add", Var(), Const(pred=lambda a: a > 0), commutative=True), add)


def test_optional_part():
    conv_relu = lambda b, x, w, bias: b.Relu(b.Add(b.Conv(x, w), bias) if bias is not None else b.Conv(x, w))  # noqa: E731
    conv = Op("Conv", Var("x"), Const("w"), name="conv")
    pat = Op("Relu", Optional(Op("Add", conv, Const("bias"), commutative=True), conv, name="has_bias"))
    for with_bias in (True, False):
        b = GraphBuilder(); x = b.input("x", "float32", (1, 2, 5, 5))
        w = b.random_const((3, 2, 3, 3)); bias = b.random_const((1, 3, 1, 1)) if with_bias else None
        b.output(conv_relu(b, x, w, bias))
        g = b.build()
        m = match(pat, node(g, "relu"))
        assert m is not None
        assert (m.get("bias") is not None) == with_bias and m["has_bias"] == (0 if with_bias else 1)


def test_optional_and_absent_inputs():
    b = GraphBuilder(); x = b.input("x", "float32", (4,))
    b.output(b.Clip(x, None, np.float32(6.0)))
    g = b.build()
    clip = node(g, "clip")
    assert match(Op("Clip", Var("x"), None, Const("hi")), clip)
    assert match(Op("Clip", Var("x"), Var(optional=True), Var(optional=True)), clip)
    assert not match(Op("Clip", Var("x"), Var(), Const()), clip)
    assert match(Op("Clip", Var("x"), ...), clip)
    assert not match(Op("Clip", Var("x")), clip)  # more inputs than patterns, no ...


def test_repeatable_part():
    b = GraphBuilder(); x = b.input("x", "float32", (4,))
    b.output(b.Exp(b.Relu(b.Sigmoid(b.Tanh(x)))))
    g = b.build()
    chain = Repeat(lambda inner: Op("Relu|Sigmoid|Tanh", inner, name="step"), Var("x"), min=2, name="chain")
    m = match(Op("Exp", chain), node(g, "exp"))
    assert m is not None and [n.op_type for n in m["chain"]] == ["Relu", "Sigmoid", "Tanh"]
    assert [n.op_type for n in m["step"]] == ["Relu", "Sigmoid", "Tanh"] and m["x"] is g.inputs[0]
    capped = Repeat(lambda inner: Op("Relu|Sigmoid|Tanh", inner), Var("x"), min=1, max=2, name="chain")
    m2 = match(Op("Exp", capped), node(g, "exp"))
    assert m2 is not None and len(m2["chain"]) == 2 and m2["x"].producer.op_type == "Tanh"
    assert not match(Op("Exp", Repeat(lambda i: Op("Relu", i), Var(), min=2)), node(g, "exp"))


def test_multi_output_node_and_multi_root_pattern():
    b = GraphBuilder(); x = b.input("x", "float32", (4, 6))
    a, c = b.op("Split", x, b.const(np.array([3, 3], np.int64)), num_outputs=2, axis=1)
    b.output(b.Relu(c), b.Sigmoid(a))
    g = b.build()
    assert match(Op("Relu", Op("Split", Var("x"), ..., output=1, shared=True)), node(g, "relu"))
    assert not match(Op("Relu", Op("Split", Var("x"), ..., output=0, shared=True)), node(g, "relu"))
    assert "outside" in str(explain(Op("Relu", Op("Split", Var("x"), ..., output=1)), node(g, "relu")))
    # two roots sharing x: three MatMuls on the same input (Q, K, V)
    b = GraphBuilder(); x = b.input("x", "float32", (2, 4))
    q, k, v = (b.MatMul(x, b.random_const((4, 4))) for _ in range(3))
    b.output(q, k, v)
    g = b.build()
    rule = Rule("qkv", [Op("MatMul", Var("x"), Const("wq")), Op("MatMul", Var("x"), Const("wk")),
                        Op("MatMul", Var("x"), Const("wv"))])
    m = match(rule, g.node_list()[0])
    assert m is not None and len(m.roots) == 3 and len({r.producer for r in m.roots}) == 3


def test_condition_and_replacement_rewrite_the_graph(assert_pass_preserves_semantics):
    def replace(rw, m):
        return rw.op("Mul", m["x"], rw.const(np.array(m.const("a") * m.const("b"), np.float32)))

    pat = Op("Mul", Op("Mul", Var("x"), Const("a", scalar=True)), Const("b", scalar=True))
    rule = Rule("merge_scales", pat, replace, condition=lambda m: float(m.const("b")) != 0.0)
    b = GraphBuilder(); x = b.input("x", "float32", (2, 3))
    b.output(b.Relu(b.Mul(b.Mul(x, np.float32(2.0)), np.float32(3.0))))
    check = assert_pass_preserves_semantics(P.RewritePass("merge_scales", [rule], stage="optimize"), b.build(),
                                            expect_changed=True)
    muls = [n for n in check.graph.nodes if n.op_type == "Mul"]
    assert len(muls) == 1 and float(muls[0].inputs[1].const_value) == 6.0
    assert len(check.graph.constants) == 1  # the two old scales are gone
    assert "onnxruntime" in check.checked_against
    # a false condition keeps the graph
    b = GraphBuilder(); x = b.input("x", "float32", (2, 3))
    b.output(b.Mul(b.Mul(x, np.float32(2.0)), np.float32(0.0)))
    g = b.build()
    assert not apply_rules(g, [rule])
    why = explain(rule, g.node_list()[-1])
    assert "condition" in str(why)


def test_interior_node_with_outside_users_is_not_fused():
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    t = b.Tanh(x)
    b.output(b.Relu(t), b.Sigmoid(t))
    g = b.build()
    pat = Op("Relu", Op("Tanh", Var("x")))
    assert match(pat, node(g, "relu")) is None
    assert "outside" in str(explain(pat, node(g, "relu")))
    assert match(Op("Relu", Op("Tanh", Var("x"), shared=True)), node(g, "relu")) is not None


def test_explain_names_the_deepest_failure():
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    b.output(b.Relu(b.Add(b.Mul(x, x), np.float32(1.0))))
    g = b.build()
    why = explain(Op("Relu", Op("Add", Op("Mul", Var(), Const()), Var())), node(g, "relu"))
    assert not why
    assert "not a constant" in why.reason and any("'mul'" in p for p in why.path), str(why)
    assert "node 'relu' (Relu) input 0" in str(why)
    assert "op type Relu, pattern wants Sigmoid" in str(explain(Op("Sigmoid", Var()), node(g, "relu")))
    ok = explain(Op("Relu", Var()), node(g, "relu"))
    assert ok and ok.match is not None and "matches" in str(ok)


def test_replacement_errors_are_reported_with_the_rule_name():
    rule = Rule("bad", Op("Relu", Var("x")), lambda rw, m: (m["x"], m["x"]))
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    b.output(b.Sigmoid(b.Relu(x)))
    with pytest.raises(GEError, match="rule 'bad'"):
        apply_rules(b.build(), [rule])
    with pytest.raises(GEError, match="roots must be Op"):
        Rule("r", Var("x"))


def test_rewrite_chains_to_a_fixed_point_and_graph_outputs_keep_names():
    rule = Rule("drop_double_neg", Op("Neg", Op("Neg", Var("x"))), lambda rw, m: rw.op("Identity", m["x"]))
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    y = x
    for _ in range(4):
        y = b.Neg(y)
    b.output(y)
    g = b.build()
    out_name = g.outputs[0].name
    assert apply_rules(g, [rule])
    assert [n.op_type for n in g.nodes].count("Neg") == 0
    assert g.outputs[0].name == out_name
    g.verify()


def test_matching_is_anchored_on_the_root_op_type(monkeypatch):
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    y = x
    for i in range(3000):
        y = b.Relu(y) if i % 100 else b.Sigmoid(y)
    b.output(y)
    g = b.build(infer=False)
    calls = []
    real = Rule.match

    def counting(self, n, ops=None):
        calls.append(n.op_type)
        return real(self, n, ops)

    monkeypatch.setattr(Rule, "match", counting)
    rule = Rule("sig_relu", Op("Sigmoid", Op("Relu", Var("x"), name="r")), lambda rw, m: rw.op("Tanh", m.value("r")))
    assert apply_rules(g, [rule])
    # the rule is tried only at Sigmoid nodes (30 of 3000), never at every node; the second
    # sweep finds only the first Sigmoid (no Relu before it) left
    assert calls == ["Sigmoid"] * 31 and len(g) == 3000
    assert len(match_all(g, Op("Tanh", Op("Relu", Var())))) == 29


def test_alt_and_describe():
    pat = Op("Relu", Alt(Op("Add", Var("a"), Var("b")), Op("Sub", Var("a"), Var("b"))), name="r")
    text = pat.describe()
    assert "Relu 'r'" in text and "Add" in text and "Sub" in text
    assert "Repeat" not in repr(Repeat(lambda i: Op("Relu", i), Var())) and "repeat[1..]" in repr(
        Repeat(lambda i: Op("Relu", i), Var()))
