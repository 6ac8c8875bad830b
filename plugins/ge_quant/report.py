"""The compile report's ``int8`` section: what share of the quantised model's multiply-adds ran
on integer units, each quantised matrix op's kernel (or why it stayed float32), and the
quantisation boundaries left in the compiled graph."""

from __future__ import annotations

from typing import Any

from ge_sdk import quant

#: the ops that mark a quantisation boundary left in a compiled graph
BOUNDARY_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
                "QLinearConv", "QLinearMatMul")


def summarize(graph: Any) -> dict[str, Any] | None:
    """The ``int8`` section of a compiled ``graph``, or None when the model had no int8 entry."""
    table = graph.metadata.get(quant.TABLE)
    if not isinstance(table, dict) or not table:
        return None
    nodes: dict[str, dict[str, Any]] = {}
    boundaries: list[str] = []
    macs_int8 = macs_all = 0
    stack = [graph]
    while stack:
        g = stack.pop()
        for n in g.node_list():
            stack.extend(n.subgraphs())
            got = n.meta.get(quant.META)
            if isinstance(got, dict):
                macs = int(got.get("macs", 0))
                macs_all += macs
                if not got.get("why"):
                    macs_int8 += macs
                nodes[n.name] = {"op": n.qualified_op, "kernel": got.get("kernel", ""), "why": got.get("why", ""),
                                 "macs": macs}
            if n.op_type in BOUNDARY_OPS:
                boundaries.append(f"{n.name} ({n.op_type})")
    unplaced = sorted(set(table) - _sources(graph))
    return {
        "ops": len(nodes),
        "ops_int8": sum(1 for v in nodes.values() if not v["why"]),
        "macs_int8_share": round(macs_int8 / macs_all, 4) if macs_all else 0.0,
        "macs": macs_all,
        "nodes": nodes,
        "float32": {k: v["why"] for k, v in nodes.items() if v["why"]},
        "not_reached": unplaced,
        "boundaries": boundaries,
    }


def _sources(graph: Any) -> set[str]:
    """The source names the compiled nodes that carry an int8 record were made from."""
    names: set[str] = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        for n in g.node_list():
            stack.extend(n.subgraphs())
            if quant.META in n.meta:
                names.add(n.name)
                names.update(n.meta.get(quant.FUSED_FROM) or ())
    return names
