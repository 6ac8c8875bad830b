"""A memory-aware schedule pass: compute constant-only values just before their first use.

Models often compute all their weights up front (ConstantOfShape, Shape chains, Cast of an
initializer): in file order every such value is alive from the first node to its reader, and
the arena holds all of them at once. Moving each node whose inputs are graph constants or graph
inputs (or such nodes' single-use results) to just before its first reader keeps the order
topological and shortens those lifetimes to a step or two. No other node moves, so no other
lifetime grows.
"""

from __future__ import annotations

from ge_core.ir.graph import Graph, Node
from ge_core.passes import Pass, PassContext


def sink_order(graph: Graph) -> list[Node]:
    """The graph's order with sinkable nodes moved just before their first reader."""
    nodes = graph.node_list()
    outputs = set(graph.outputs)
    sinkable: set[Node] = set()
    for n in nodes:
        if n.subgraphs() or not n.outputs or any(v in outputs for v in n.outputs):
            continue
        ok = True
        for v in n.inputs:
            if v is None or v.producer is None:
                continue  # graph input or constant
            p = v.producer
            if p not in sinkable or len(v.uses()) != 1:
                ok = False
                break
        if not ok:
            continue
        # every reader must be a node of this graph (a subgraph read pins the value)
        users = [u for v in n.outputs for u, _ in v.uses()]
        if users and all(u.graph is graph for u in users):
            sinkable.add(n)
    if not sinkable:
        return nodes
    order: list[Node] = []
    placed: set[Node] = set()

    def emit(n: Node) -> None:
        stack = [(n, False)]
        while stack:
            x, ready = stack.pop()
            if x in placed:
                continue
            if ready:
                placed.add(x)
                order.append(x)
                continue
            stack.append((x, True))
            for v in reversed(x.inputs):
                p = v.producer if v is not None else None
                if p is not None and p in sinkable and p not in placed:
                    stack.append((p, False))

    for n in nodes:
        if n not in sinkable:
            emit(n)
    if len(order) != len(nodes):  # cannot happen: every sinkable node has a reader
        return nodes
    return order


class SinkConstantComputations(Pass):
    """Schedule constant-only computations just before their first reader (shorter lifetimes)."""

    name = "sink_constant_computations"
    stage = "schedule"
    opt_level = 1
    description = "compute constant-only values just before their first reader, so they do not fill the arena"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        if ctx.options.memory_optimize_level == "off":
            return False
        old = graph.node_list()
        new = sink_order(graph)
        if new == old:
            return False
        # place each node just before its successor in the new order, from the back
        for i in range(len(new) - 2, -1, -1):
            graph.move_before(new[i], new[i + 1])
        return True
