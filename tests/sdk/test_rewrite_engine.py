"""The rewrite engine (ge_sdk.rewrite): both rule styles, composed rule sets, one driver that is
linear in graph size and reaches subgraphs."""

import numpy as np
import pytest

import ge_core as ge
from ge_core import GEError, PluginError
from ge_core.ir.graph import Graph
from ge_core.ir.types import TensorType
from ge_core.options import CompileOptions
from ge_core.passes import PassContext
from ge_core.plugins import get_host
from ge_sdk import GraphBuilder, Plugin, patterns
from ge_sdk.rewrite import (
    Op,
    OpRule,
    RewritePass,
    Rewriter,
    Rule,
    RuleSet,
    Var,
    explain,
    rewrite,
)


def drop_double_neg(node, rw: Rewriter) -> bool:
    """Neg(Neg(x)) -> x (imperative)."""
    inner = node.inputs[0].producer
    if inner is None or inner.op_type != "Neg" or inner.graph is not node.graph:
        return False
    return rw.replace_node(node, [inner.inputs[0]])


DOUBLE_NEG = Rule("double_neg", Op("Neg", Op("Neg", Var("x"))), lambda rw, m: m["x"])
SIG_RELU = Rule("sigmoid_relu", Op("Sigmoid", Op("Relu", Var("x"), name="r")), lambda rw, m: rw.op("Tanh", m.value("r")))


def neg_chain(n, op="Neg"):
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    y = x
    for _ in range(n):
        y = b.op(op, y)
    b.output(b.Relu(y))
    return b.build(infer=False)


def test_the_old_module_is_the_new_engine():
    assert patterns.Rule is Rule and patterns.Op is Op and patterns.RewritePass is RewritePass
    assert patterns.Rewriter is Rewriter
    g = neg_chain(2)
    m = patterns.match(DOUBLE_NEG, g.node_list()[1])
    assert m is not None and patterns.apply_match(DOUBLE_NEG, m, g)
    assert [n.op_type for n in g.nodes] == ["Relu"]


@pytest.mark.parametrize("style", ["declarative", "imperative"])
def test_driver_is_linear_in_graph_size(style):
    """Rule invocations grow with the graph, not with its square: a 20,000-node chain costs ten
    times a 2,000-node chain, about one try per node and round."""
    rules = RuleSet([DOUBLE_NEG]) if style == "declarative" else RuleSet([OpRule("Neg", drop_double_neg)],
                                                                          order="nodes")
    tries = {}
    for n in (2_000, 20_000):
        g = neg_chain(n)
        res = rewrite(g, rules)
        assert res.changed and [node.op_type for node in g.nodes] == ["Relu"]  # every pair cancelled
        assert res.total == n // 2
        tries[n] = res.tries
        assert res.tries <= 2 * n, res
    assert tries[20_000] == 10 * tries[2_000]


def test_rule_sets_compose_and_keep_their_order():
    a = RuleSet([DOUBLE_NEG], name="a")
    b = RuleSet([OpRule("Sigmoid", lambda node, rw: False, name="never")])
    both = a + b + [SIG_RELU]
    assert both.names == ["double_neg", "never", "sigmoid_relu"] and both.order == "rules"
    assert len(a) == 1 and len(b) == 1  # composing makes a new set
    assert ([DOUBLE_NEG] + b).names == ["double_neg", "never"]
    bx = GraphBuilder(); x = bx.input("x", "float32", (3,))
    bx.output(bx.Sigmoid(bx.Relu(bx.Neg(bx.Neg(x)))))
    g = bx.build()
    res = rewrite(g, both)
    assert [n.op_type for n in g.nodes] == ["Relu", "Tanh"]
    assert res.rewrites == {"double_neg": 1, "sigmoid_relu": 1}
    assert rewrite(g, both).changed is False
    with pytest.raises(GEError, match="not a Rule or an OpRule"):
        RuleSet([lambda node, rw: True])
    with pytest.raises(GEError, match="order must be"):
        RuleSet([], order="random")


def test_rule_priority_against_node_order():
    """order="rules": the first rule gets every node before the second; order="nodes": each
    node takes the first rule that applies to it."""
    # Relu(Add(x, y)): an Add rule and a Relu+Add rule; the second is listed first
    relu_add = Rule("relu_add", Op("Relu", Op("Add", Var("a"), Var("b"))),
                    lambda rw, m: rw.op("Max", m["a"], m["b"]))
    add = Rule("add", Op("Add", Var("a"), Var("b")), lambda rw, m: rw.op("Sub", m["a"], m["b"]))
    for order, want in (("rules", ["Max"]), ("nodes", ["Sub", "Relu"])):
        bx = GraphBuilder(); x = bx.input("x", "float32", (3,)); y = bx.input("y", "float32", (3,))
        bx.output(bx.Relu(bx.Add(x, y)))
        g = bx.build()
        rewrite(g, RuleSet([relu_add, add], order=order))
        assert [n.op_type for n in g.nodes] == want, order


def test_a_failed_anchor_is_retried_when_a_rewrite_elsewhere_frees_it():
    """Relu(Tanh(x)) cannot fuse while a Sigmoid also reads the Tanh; once a later rule removes
    the Sigmoid, the driver tries the Relu again (nothing local re-queues it)."""
    fuse = Rule("relu_tanh", Op("Relu", Op("Tanh", Var("x"))), lambda rw, m: rw.op("Elu", m["x"]))
    drop = Rule("sigmoid_of_tanh", Op("Sigmoid", Op("Tanh", Var("x"), shared=True)), lambda rw, m: rw.op("Neg", m["x"]))
    bx = GraphBuilder(); x = bx.input("x", "float32", (3,))
    t = bx.Tanh(x)
    bx.output(bx.Relu(t), bx.Sigmoid(t))
    g = bx.build()
    res = rewrite(g, RuleSet([fuse, drop]))
    assert sorted(n.op_type for n in g.nodes) == ["Elu", "Neg"], [n.op_type for n in g.nodes]
    assert res.rewrites == {"relu_tanh": 1, "sigmoid_of_tanh": 1}
    g.verify()


def _f32(*shape):
    return TensorType("float32", shape)


def _loop_graph():
    """A graph, its Loop body and an If inside that body, each holding Relu(Neg(Neg(x)))."""
    root = GraphBuilder()
    x = root.input("x", "float32", (3,))
    root.output(root.Relu(root.Neg(root.Neg(x))))
    g = root.build()
    body = Graph("loop_body", parent=g)
    body.add_input("i", TensorType("int64", ()))
    c = body.add_input("c", TensorType("bool", ()))
    acc = body.add_input("acc", _f32(3))
    then = Graph("then", parent=body)
    n1 = then.add_node("Neg", [acc], output_types=[_f32(3)])
    n2 = then.add_node("Neg", [n1.output], output_types=[_f32(3)])
    then.add_output(then.add_node("Relu", [n2.output], output_types=[_f32(3)]).output)
    other = Graph("else", parent=body)
    other.add_output(other.add_node("Identity", [acc], output_types=[_f32(3)]).output)
    cond = body.add_node("Identity", [c], output_types=[TensorType("bool", ())])
    iff = body.add_node("If", [cond.output], {"then_branch": then, "else_branch": other}, output_types=[_f32(3)])
    m1 = body.add_node("Neg", [iff.output], output_types=[_f32(3)])
    m2 = body.add_node("Neg", [m1.output], output_types=[_f32(3)])
    body.add_output(cond.output)
    body.add_output(body.add_node("Relu", [m2.output], output_types=[_f32(3)]).output)
    trips = g.add_constant(np.array(2, np.int64), "trips")
    go = g.add_constant(np.array(True), "go")
    loop = g.add_node("Loop", [trips, go, g.outputs[0]], {"body": body}, output_types=[_f32(3)])
    g.set_outputs([loop.output])
    g.verify()
    return g, body, then


@pytest.mark.parametrize("rules", [RuleSet([DOUBLE_NEG]), RuleSet([OpRule("Neg", drop_double_neg)], order="nodes")],
                         ids=["declarative", "imperative"])
def test_driver_reaches_nested_subgraphs(rules):
    g, body, branch = _loop_graph()
    res = rewrite(g, rules)
    assert res.graphs == 4 and res.total == 3  # top, Loop body, both If branches; one pair in each of three
    for graph in (g, body, branch):
        assert "Neg" not in [n.op_type for n in graph.nodes], graph.name
    g.verify()
    g2, body2, _ = _loop_graph()
    assert rewrite(g2, rules, subgraphs=False).total == 1
    assert [n.op_type for n in body2.nodes].count("Neg") == 2


def test_rewrite_pass_reaches_subgraphs_and_counts_per_rule():
    g, body, then = _loop_graph()
    ctx = PassContext(CompileOptions.from_any(None), get_host().registries, {}, {})
    assert RewritePass("t_double_neg", [DOUBLE_NEG], stage="optimize").run(g, ctx)
    assert ctx.stats["rewrites"] == {"double_neg": 3}
    assert "Neg" not in [n.op_type for n in body.nodes] + [n.op_type for n in then.nodes]


def test_explain_and_imperative_rule_errors():
    g = neg_chain(1)
    why = explain(DOUBLE_NEG, g.node_list()[0])
    assert not why and "not produced by a node" in why.reason
    with pytest.raises(GEError, match="not a pattern or a declarative rule"):
        explain(OpRule("Neg", drop_double_neg), g.node_list()[0])
    with pytest.raises(GEError, match="needs a function"):
        OpRule("Neg", "not callable")
    with pytest.raises(GEError, match="op type names"):
        OpRule("", drop_double_neg)


def test_plugin_registers_an_imperative_rule_that_pattern_fusion_applies(fresh_host):
    plugin = Plugin("op_rule_test")

    @plugin.op_rewrite("t_sigmoid_to_tanh", "Sigmoid")
    def sigmoid_to_tanh(node, rw) -> bool:
        """Sigmoid -> Tanh (not the same function: the test sees which ran)."""
        new = rw.add_node("Tanh", [node.inputs[0]], before=node, like=node.output, output_type=node.output.type)
        return rw.replace_node(node, [new.output])

    assert isinstance(sigmoid_to_tanh, OpRule) and sigmoid_to_tanh.name == "t_sigmoid_to_tanh"
    fresh_host.register_plugin(plugin, "op_rule_test")
    assert fresh_host.registries.fusion_patterns.get("t_sigmoid_to_tanh") is sigmoid_to_tanh
    b = GraphBuilder(); x = b.input("x", "float32", (3,))
    b.output(b.Relu(b.Sigmoid(x)))
    model = ge.compile(b.build(), {"disabled_passes": ["auto_fusion"]})
    assert model.report["op_counts"] == {"Tanh": 1, "Relu": 1}
    with pytest.raises(PluginError, match="Rule or OpRule"):
        plugin.fusion_pattern(sigmoid_to_tanh.fn)
