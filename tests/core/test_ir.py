"""IR invariants: use-def sync, safe mutation, removal rules, verifier, printer, copy."""

import numpy as np
import pytest

from ge_core import GraphError, TensorType
from ge_core.ir import Graph
from ge_core.plugins import get_host


@pytest.fixture(autouse=True)
def _op_set():
    """The op set declares the structural copy op a graph routes outputs through (OpDef.copy)."""
    assert get_host().registries.ops.lookup("", "Identity").copy


def small_graph():
    g = Graph("t")
    x = g.add_input("x", TensorType("float32", (1, "N")))
    w = g.add_constant(np.ones((1, 1), np.float32), "w")
    a = g.add_node("Add", [x, w], name="add")
    r = g.add_node("Relu", [a.output], name="relu")
    g.set_outputs([r.output])
    return g, x, w, a, r


def test_uses_track_inputs_and_replacement():
    g, x, w, a, r = small_graph()
    assert x.uses() == [(a, 0)] and w.uses() == [(a, 1)]
    m = g.add_node("Mul", [x, w], before=a)
    a.output.replace_all_uses_with(m.output)
    assert r.inputs[0] is m.output
    assert not a.output.has_uses()
    g.remove_node(a)
    assert x.uses() == [(m, 0)]
    g.verify()


def test_set_input_moves_use():
    g, x, w, a, r = small_graph()
    a.set_input(1, x)
    assert w.uses() == [] and sorted(i for _, i in x.uses()) == [0, 1]
    g.verify()


def test_remove_node_with_users_raises_and_keeps_graph():
    g, x, w, a, r = small_graph()
    with pytest.raises(GraphError, match="still used by relu"):
        g.remove_node(a)
    assert len(g) == 2
    g.verify()


def test_remove_nodes_is_all_or_nothing():
    g, x, w, a, r = small_graph()
    extra = g.add_node("Neg", [a.output], name="neg")
    g.add_node("Abs", [extra.output], name="abs")
    with pytest.raises(GraphError):
        g.remove_nodes([a, extra])  # abs still reads neg; relu reads add
    assert len(g) == 4
    g.verify()
    tail = [n for n in g.nodes if n.op_type in ("Neg", "Abs")]
    g.remove_nodes(tail)
    assert [n.op_type for n in g.nodes] == ["Add", "Relu"]
    g.verify()


def test_graph_output_cannot_be_removed():
    g, *_, r = small_graph()
    with pytest.raises(GraphError):
        g.remove_node(r)


def test_mutation_while_iterating_is_safe():
    g = Graph("chain")
    v = g.add_input("x", TensorType("float32", (4,)))
    for i in range(10):
        v = g.add_node("Identity", [v], name=f"id{i}").output
    g.set_outputs([v])
    seen = []
    for n in g.nodes:
        seen.append(n.name)
        if n.op_type == "Identity" and n.name != "id9":
            n.output.replace_all_uses_with(n.inputs[0])
            g.remove_node(n)
    assert seen == [f"id{i}" for i in range(10)]
    assert [n.name for n in g.nodes] == ["id9"]
    g.verify()


def test_replacing_a_graph_output_keeps_its_name():
    g, x, w, a, r = small_graph()
    r.output.replace_all_uses_with(a.output)
    assert g.outputs[0] is a.output and a.output.name == "relu"
    g.remove_node(r)
    g.verify()
    # replacing an output by a graph input routes through an Identity carrying the name
    g.outputs[0].replace_all_uses_with(x)
    assert g.outputs[0].name == "relu" and g.outputs[0].producer.op_type == "Identity"
    g.verify()


def test_inserting_before_and_after_keep_order():
    g, x, w, a, r = small_graph()
    with g.inserting_after(a):
        n1 = g.add_node("Neg", [a.output], name="n1")
        n2 = g.add_node("Neg", [n1.output], name="n2")
    with g.inserting_before(a):
        n0 = g.add_node("Abs", [x], name="n0")
    assert [n.name for n in g.nodes] == ["n0", "add", "n1", "n2", "relu"]
    assert n2.inputs[0] is n1.output and n0.output.uses() == []
    g.verify()


def test_verify_detects_bad_order_and_topological_sort_fixes_it():
    g, x, w, a, r = small_graph()
    g.move_before(r, a)
    with pytest.raises(GraphError, match="topological"):
        g.verify()
    g.topological_sort()
    g.verify()
    assert [n.name for n in g.nodes] == ["add", "relu"]


def test_topological_sort_reports_cycle():
    g, x, w, a, r = small_graph()
    a.set_input(0, r.output)
    with pytest.raises(GraphError, match="cycle"):
        g.topological_sort()


def test_duplicate_value_names_rejected():
    g = Graph()
    g.add_input("x")
    with pytest.raises(GraphError, match="already used"):
        g.add_input("x")


def test_one_name_scope_for_a_graph_and_its_subgraphs():
    g = Graph()
    x = g.add_input("x")
    body = Graph("body", parent=g)
    assert body.names is g.names  # a body may read an outer value by name: one scope
    assert "x" in body.names and g.names.fresh("x") == "x_1" and "x_1" not in g.names  # fresh reserves nothing
    with pytest.raises(GraphError, match="value name 'x' is already used"):
        body.add_input("x")
    c = body.add_constant(np.zeros(1, np.float32), body.names.fresh("x"))
    assert c.name == "x_1" and g.names.fresh("x") == "x_2" and g.names.new("x") == "x_2"
    # node names are per graph; a removed node frees its node name and its outputs' names
    a = g.add_node("Relu", [x], name="r")
    b = g.add_node("Relu", [a.output], name="r")
    assert (a.name, b.name) == ("r", "r_1") and b.output.name == "r_1" and "r" in g.node_names
    g.remove_node(b)
    assert "r_1" not in g.node_names and "r_1" not in g.names
    assert g.add_node("Relu", [a.output], name="r").name == "r_1"
    g.rename_value(a.output, "y")
    assert "r" not in g.names and "y" in g.names
    with pytest.raises(GraphError, match="already used"):
        g.rename_value(a.output, "x")


def test_symbolic_dims_and_types():
    t = TensorType("float32", (1, "N", -1, None))
    assert t.shape == (1, "N", None, None) and not t.is_static and t.numel is None
    s = TensorType(np.float16, (2, 3))
    assert s.is_static and s.numel == 6 and s.nbytes == 12 and str(s) == "float16[2,3]"


def test_printer_one_line_per_node():
    g, *_ = small_graph()
    text = str(g)
    assert "= Add(%x, %w)" in text and "= Relu(%add)" in text and "return %relu" in text
    assert len([line for line in text.splitlines() if "# " in line]) == 2


def test_copy_is_deep_and_independent():
    g, x, w, a, r = small_graph()
    h = g.copy()
    h.verify()
    hn = list(h.nodes)
    assert [n.op_type for n in hn] == ["Add", "Relu"]
    assert hn[0].inputs[0] is h.inputs[0] and hn[0].inputs[0] is not x
    hn[1].output.replace_all_uses_with(hn[0].output)
    h.remove_node(hn[1])
    assert len(g) == 2 and len(h) == 1


def test_subgraph_reads_outer_values_and_copies():
    g = Graph("outer")
    c = g.add_input("c", TensorType("bool", ()))
    x = g.add_input("x", TensorType("float32", (2,)))
    then_g = Graph("then", parent=g)
    then_g.set_outputs([then_g.add_node("Relu", [x], name="t_relu").output])
    else_g = Graph("else", parent=g)
    else_g.set_outputs([else_g.add_node("Neg", [x], name="e_neg").output])
    node = g.add_node("If", [c], {"then_branch": then_g, "else_branch": else_g}, name="if")
    g.set_outputs([node.output])
    g.verify()
    assert set(node.subgraphs()) == {then_g, else_g}
    h = g.copy()
    h.verify()
    inner = next(iter(h.find_node("if").attrs["then_branch"].nodes))
    assert inner.inputs[0] is h.inputs[1]
    assert "graph then" in str(g)
