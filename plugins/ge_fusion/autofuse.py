"""Automatic fusion by op kind (TVM's FuseOps, specialised to elementwise groups).

Nodes are visited in reverse topological order. An elementwise/broadcast node joins the group
of its users when *all* its users are in one group (so that group post-dominates it: every path
from the node stays inside the group until the group's single result) and the group is below
the size cap; otherwise it starts a group of its own. Such a group is convex and has one
result. An out-elementwise-fusable producer (Conv, MatMul, Gemm) whose only reader is one group
becomes that group's anchor: the group is fused into it as an epilogue, computed in place on
the producer's output.

Each group of two or more ops (or one op with an anchor) becomes one node with a generated
kernel: ``ge.fused::FusedElemwise`` (or the anchor as ``FusedConv`` / ``FusedMatMul``) whose
``program`` / ``epilogue`` attribute is the group body (the program format of :mod:`ge_sdk.fused`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.ops import OpKind
from ge_native import native
from ge_native.jit import enabled as jit_enabled
from ge_sdk import fused, quant
from ge_sdk.fused import CONV_ATTRS, DOMAIN
from ge_sdk.rewrite.driver import FUSED_FROM_META

from .rules import activation_steps

#: The most external inputs a generated kernel takes (numexpr's operand limit is 32).
MAX_INPUTS = 24


class _Group:
    __slots__ = ("root", "members", "anchor")

    def __init__(self, root: Node) -> None:
        self.root = root
        self.members: list[Node] = [root]
        self.anchor: Node | None = None


def _float(v: Value | None) -> bool:
    return v is not None and v.type.dtype is not None and v.type.dtype.kind == "f"


def fusible(node: Node, ops) -> bool:
    """Whether ``node`` can be part of a generated elementwise kernel."""
    if len(node.outputs) != 1 or node.subgraphs():
        return False
    out = node.outputs[0]
    if not _float(out) or out.type.rank is None:
        return False
    if node.domain == DOMAIN:
        return node.op_type in ("Gelu", "Silu")
    if quant.fake_quant_params(node) is not None:  # (a quantised model's fake-quant)
        x = node.inputs[0]
        return x is not None and _float(x) and x.type.dtype == out.type.dtype
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "BatchNormalization":
        return len(node.inputs) == 5 and all(v is not None and v.const_value is not None for v in node.inputs[1:]) \
            and out.type.rank >= 2
    if node.op_type == "Clip":
        return all(v is None or v.const_value is not None for v in node.inputs[1:]) and _float(node.inputs[0])
    if not fused.supported(node.op_type):
        return False
    d = ops.lookup(node.domain, node.op_type) if ops is not None else None
    if d is None or d.kind not in (OpKind.ELEMWISE, OpKind.BROADCAST):
        return False
    if node.op_type == "Pow":
        e = node.inputs[1] if len(node.inputs) > 1 else None
        return _float(node.inputs[0]) and e is not None and (_float(e) or e.const_value is not None)
    return all(v is not None and _float(v) and v.type.dtype == out.type.dtype for v in node.inputs)


def _anchor_ok(p: Node, g: _Group, ops) -> bool:
    """``p`` may take group ``g`` as its epilogue."""
    if len(p.outputs) != 1:
        return False
    y = p.outputs[0]
    res = g.root.outputs[0]
    if y.type.shape is None or y.type.shape != res.type.shape or y.type.dtype != res.type.dtype or not _float(y):
        return False
    if p.domain == DOMAIN:
        return p.op_type in ("FusedConv", "FusedMatMul") and not p.attrs.get("epilogue") and len(p.inputs) <= 3
    if p.domain not in ("", "ai.onnx"):
        return False
    if p.op_type == "Conv":
        return True
    if p.op_type == "MatMul":
        return True
    if p.op_type == "Gemm":
        return p.inputs[0] is not None and p.inputs[0].type.rank == 2
    return False


def find_groups(graph: Graph, ops, max_size: int = 32) -> list[_Group]:
    """The fusible groups of ``graph`` (reverse topological sweep, see the module docstring)."""
    nodes = graph.node_list()
    group_of: dict[Node, _Group] = {}
    groups: list[_Group] = []
    for n in reversed(nodes):
        if fusible(n, ops):
            out = n.outputs[0]
            users = out.users
            g = group_of.get(users[0]) if users and not out.is_graph_output else None
            if g is not None and len(g.members) < max_size and all(group_of.get(u) is g for u in users):
                g.members.append(n)
                group_of[n] = g
                continue
            g = _Group(n)
            group_of[n] = g
            groups.append(g)
            continue
        if len(n.outputs) == 1 and not n.outputs[0].is_graph_output:
            users = n.outputs[0].users
            g = group_of.get(users[0]) if users else None
            if g is not None and g.anchor is None and all(group_of.get(u) is g for u in users) and _anchor_ok(n, g, ops):
                g.anchor = n
    return groups


def _bn_constants(graph: Graph, node: Node) -> tuple[Value, Value]:
    x = node.inputs[0]
    assert x is not None and x.type.rank is not None
    scale, bias, mean, var = (np.asarray(v.const_value) for v in node.inputs[1:] if v is not None)
    eps = float(node.attrs.get("epsilon", 1e-5))
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = bias - mean * s
    shape = (-1,) + (1,) * (x.type.rank - 2)
    dt = x.type.dtype
    return (graph.add_constant(s.reshape(shape).astype(dt), graph.names.fresh("bn_scale")),
            graph.add_constant(np.asarray(b).reshape(shape).astype(dt), graph.names.fresh("bn_shift")))


#: Ops that one compiled loop runs several times faster than the cpu backend's NumPy kernel
#: even alone (erf 40x, softplus 15x, leaky relu, elu, clip, hard sigmoid/swish 3-7x on 1M float32).
SINGLE_OP_LOOPS = frozenset({"Erf", "Softplus", "Elu", "LeakyRelu", "Clip", "HardSwish", "HardSigmoid"})


def _single_op_loop(node: Node) -> bool:
    """A lone op worth a generated kernel: a compiled float32 loop beats NumPy on it."""
    if node.op_type not in SINGLE_OP_LOOPS or node.domain not in ("", "ai.onnx"):
        return False
    t = node.outputs[0].type
    if t.dtype is None or t.dtype.name != "float32" or t.shape is None \
            or not all(isinstance(d, int) for d in t.shape) or math.prod(t.shape) < fused.LOOP_MIN_ELEMENTS:
        return False
    return jit_enabled(fused.LOOPS_SWITCH) and native.available()  # (the cpu backend's compiled loops)


def materialize(graph: Graph, g: _Group) -> bool:
    """Replace group ``g`` by one node with a generated kernel; False if it is not worth it."""
    if len(g.members) < 2 and g.anchor is None and not _single_op_loop(g.members[0]):
        return False
    members = list(reversed(g.members))  # the sweep added them in reverse topological order
    inside = {m.outputs[0]: f"t{i}" for i, m in enumerate(members)}
    anchor_out = g.anchor.outputs[0] if g.anchor is not None else None
    inputs: dict[Value, str] = {}
    steps: list[fused.Step] = []
    refs: dict[Value, str] = {}
    created: list[Value] = []

    def ref(v: Value) -> str:
        if v in refs:
            return refs[v]
        if v is anchor_out:
            return "y"
        if v not in inputs:
            inputs[v] = f"a{len(inputs)}"
        return inputs[v]

    for m in members:
        op = m.op_type
        if op == "BatchNormalization":
            s, b = _bn_constants(graph, m)
            created += [s, b]
            x = ref(m.inputs[0])  # type: ignore[arg-type]
            steps.append(("Mul", [x, ref(s)], {}))
            steps.append(("Add", [f"t{len(steps) - 1}", ref(b)], {}))
        elif op in ("Clip", "LeakyRelu", "HardSigmoid", "Gelu"):
            steps.extend(activation_steps(m, ref(m.inputs[0])))  # type: ignore[arg-type]
        elif m.domain == quant.DOMAIN:
            fq = quant.fake_quant_params(m)
            assert fq is not None and m.inputs[0] is not None
            steps.append((fused.FAKE_QUANT_STEP, [ref(m.inputs[0])],
                          {"scale": fq[0], "lo": float(fq[2] - fq[1]), "hi": float(fq[3] - fq[1])}))
        else:
            attrs: dict[str, Any] = {}
            if op == "Elu":
                attrs = {"alpha": float(m.attrs.get("alpha", 1.0))}
            steps.append((op, [ref(v) for v in m.inputs if v is not None], attrs))
        refs[m.outputs[0]] = f"t{len(steps) - 1}"
    del inside
    if len(inputs) > MAX_INPUTS:
        for c in created:
            graph.remove_constant(c)
        return False
    root_out = g.root.outputs[0]
    ext = list(inputs)
    # Pow exponents of another float type are cast at build time
    program = fused.dumps(steps)
    if g.anchor is None:
        node = graph.add_node("FusedElemwise", ext, {"program": program}, domain=DOMAIN, name=f"fused_{g.root.name}",
                              output_types=[root_out.type], before=g.root)
    else:
        a = g.anchor
        base: list[Value | None] = list(a.inputs) + [None] * (3 - len(a.inputs))
        if a.op_type in ("Conv", "FusedConv"):
            attrs = {k: v for k, v in a.attrs.items() if k in CONV_ATTRS}
            op_type = "FusedConv"
        else:
            attrs = {k: a.attrs[k] for k in ("transA", "transB", "alpha", "beta") if k in a.attrs}
            op_type = "FusedMatMul"
        attrs["epilogue"] = program
        node = graph.add_node(op_type, base + list(ext), attrs, domain=DOMAIN, name=a.name, output_types=[root_out.type],
                              before=g.root)
    graph.opset_imports.setdefault(DOMAIN, 1)
    node.meta["fusion_group"] = [m.name for m in members] + ([g.anchor.name] if g.anchor is not None else [])
    root_out.replace_all_uses_with(node.outputs[0])
    doomed = members + ([g.anchor] if g.anchor is not None else [])
    # the source names, as the rewrite driver records them (a --keep_dtype name, an int8 entry)
    node.meta[FUSED_FROM_META] = sorted({x for m in doomed for x in (m.meta.get(FUSED_FROM_META) or [m.name])})
    consts = {v for m in doomed for v in m.inputs if v is not None and v.is_constant}
    graph.remove_nodes(doomed)
    for c in consts:
        if not c.has_uses() and not c.is_graph_output and c.name in graph.constants:
            graph.remove_constant(c)
    return True


def auto_fuse(graph: Graph, ops, max_size: int = 32) -> int:
    """Fuse every group of ``graph``; returns how many fused nodes were made."""
    made = 0
    for g in find_groups(graph, ops, max_size):
        if materialize(graph, g):
            made += 1
    return made
