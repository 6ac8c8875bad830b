"""ge compare --per-node through fused nodes: a FusedConv (Conv+BatchNormalization+Relu) and a
FusedMatMul (MatMul+Add+GELU in its erf form) are compared with the source tensor each one
replaced (the last original node's output, which the rewrite driver records in the node's meta,
kept in the .om), so a divergence planted inside a fused region is named at the fused node
instead of at the first unfused node after it."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.cli import main
from ge_sdk import Plugin
from ge_sdk.rewrite.driver import REPLACES_META


def _model(path):
    """x -> Conv 'conv' -> BN 'bn' -> Relu 'relu' (r) -> Flatten (fl) -> MatMul 'mm' -> Add 'add'
    -> GELU (Div, Erf, Add, Mul, Mul: g) -> MatMul 'mm3' -> y."""
    rng = np.random.default_rng(0)

    def f(*s):
        return rng.standard_normal(s).astype(np.float32)

    inits = [numpy_helper.from_array(f(8, 3, 3, 3) * 0.3, "w"),
             numpy_helper.from_array(f(8), "s"), numpy_helper.from_array(f(8), "b"),
             numpy_helper.from_array(f(8), "m"), numpy_helper.from_array(np.abs(f(8)) + 0.5, "v"),
             numpy_helper.from_array(f(8 * 6 * 6, 16) * 0.1, "w2"), numpy_helper.from_array(f(16), "b2"),
             numpy_helper.from_array(np.array([1.4142135], np.float32), "sq2"),
             numpy_helper.from_array(np.array([1.0], np.float32), "one"),
             numpy_helper.from_array(np.array([0.5], np.float32), "half"),
             numpy_helper.from_array(f(16, 4) * 0.3, "w3")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["fl"], name="flat"),
             helper.make_node("MatMul", ["fl", "w2"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b2"], ["ad"], name="add"),
             helper.make_node("Div", ["ad", "sq2"], ["dv"], name="div"),
             helper.make_node("Erf", ["dv"], ["er"], name="erf"),
             helper.make_node("Add", ["er", "one"], ["e1"], name="add1"),
             helper.make_node("Mul", ["ad", "e1"], ["g0"], name="mul"),
             helper.make_node("Mul", ["g0", "half"], ["g"], name="mul1"),
             helper.make_node("MatMul", ["g", "w3"], ["y"], name="mm3")]
    g = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _perturb(op, index):
    """A pass (after fusion) that adds 0.05 to constant input ``index`` of the ``op`` node: a
    wrong value inside the fused region."""

    def plant(graph, ctx):
        for n in graph.nodes:
            if n.qualified_op == op:
                w = n.inputs[index]
                n.set_input(index, graph.add_constant(w.const_value + np.float32(0.05), graph.names.fresh("planted")))
                return True
        return False

    return plant


def _planted(host, op, index):
    plugin = Plugin("planted_fused")
    plugin.graph_pass("plant_in_fused", stage="schedule", opt_level=0)(_perturb(op, index))
    host.register_plugin(plugin, "planted_fused")


def _compare(capsys, *args):
    capsys.readouterr()
    rc = main(["compare", *map(str, args), "--json"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if out.out.strip() else None), out.err


def test_fused_nodes_carry_the_source_tensor_they_replaced(tmp_path):
    model = ge.compile(_model(str(tmp_path / "m.onnx")))
    ops = {n.qualified_op: n for n in model.graph.node_list()}
    assert "ge.fused::FusedConv" in ops and "ge.fused::FusedMatMul" in ops  # the fusions this test is about
    assert not {"BatchNormalization", "Relu", "Erf", "Add"} & set(ops)
    conv, mm = ops["ge.fused::FusedConv"], ops["ge.fused::FusedMatMul"]
    assert conv.meta[REPLACES_META] == ["r"] and conv.output.name != "r"
    assert mm.meta[REPLACES_META] == ["g"] and mm.output.name != "g"
    om = model.save(str(tmp_path / "m.om"))
    loaded = {n.qualified_op: n for n in ge.load_om(om).graph.node_list()}
    assert loaded["ge.fused::FusedConv"].meta[REPLACES_META] == ["r"]  # kept in the .om


@pytest.mark.parametrize("from_om", [False, True])
def test_a_good_model_compares_the_fused_outputs_too(tmp_path, capsys, from_om):
    src = _model(str(tmp_path / "m.onnx"))
    target = ge.compile(src).save(str(tmp_path / "m.om")) if from_om else src
    rc, r, err = _compare(capsys, target, "--per-node")
    assert rc == 0 and r["ok"], err
    pn = r["per_node"]
    # fl and y by name, r (FusedConv) and g (FusedMatMul) through what they replaced
    assert pn["compared"] == 4 and pn["renamed"] == 2 and pn["first"] is None


@pytest.mark.parametrize("op, index, output, diverged", [
    ("ge.fused::FusedConv", 2, "r", 4),       # its folded bias (conv + bn + relu region): r, fl, g, y diverge
    ("ge.fused::FusedMatMul", 1, "g", 2),     # its weights (matmul + add + gelu region): fl agrees; g, y diverge
])
def test_a_divergence_inside_a_fused_region_is_named_at_the_fused_node(fresh_host, tmp_path, capsys, op, index,
                                                                       output, diverged):
    _planted(fresh_host, op, index)
    src = _model(str(tmp_path / "m.onnx"))
    rc, r, err = _compare(capsys, src, "--per-node")
    assert rc == 1 and not r["ok"], err
    first = r["per_node"]["first"]
    assert first["op"] == op and first["output"] == output and first["value"] != output
    assert first["max_abs"] > 1e-3
    assert first["suspects"] == [f"{first['node']} ({op})"]  # its inputs agreed: only it can be wrong
    assert r["per_node"]["compared"] == 4 and r["per_node"]["diverged"] == diverged
    capsys.readouterr()
    assert main(["compare", src, "--per-node"]) == 1
    out = capsys.readouterr().out
    assert f"the first is node '{first['node']}' ({op}), output '{output}' (compiled as '{first['value']}')" in out


def test_meta_from_a_stranger_is_checked():
    from ge_core.ir.graph import Graph
    from ge_core.ir.types import TensorType
    from ge_tools.compare import source_names

    g = Graph("g")
    x = g.add_input("x", TensorType("float32", (2,)))
    n = g.add_node("Relu", [x], name="n")
    names, outs = {"a", "b"}, {"src": ["a"]}
    for bad in (5, "a", [5], ["a", "b"], {"0": "a"}):
        n.meta = {REPLACES_META: bad}
        assert source_names(n, names, outs) == [None], bad
    n.meta = {REPLACES_META: ["b"]}
    assert source_names(n, names, outs) == ["b"]
    n.meta = {REPLACES_META: ["not-in-source"]}
    assert source_names(n, names, outs) == [None]
    n.op_type = "FusedElemwise"
    n.meta = {"fusion_group": ["src"]}
    assert source_names(n, names, outs) == ["a"]
    n.meta = {"fusion_group": [3]}
    assert source_names(n, names, outs) == [None]
