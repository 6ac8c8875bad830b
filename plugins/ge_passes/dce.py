"""Dead code elimination."""

from __future__ import annotations

from ge_core.ir.graph import Graph, Node
from ge_core.passes import Pass, PassContext, PassResult

from ._util import walk_graphs


def _dead(node: Node) -> bool:
    return not any(o.has_uses() or o.is_graph_output for o in node.outputs)


def _drop_subgraph_uses(node: Node) -> None:
    """Before removing a node with subgraphs: its bodies stop reading outer values."""
    for sub in node.subgraphs():
        for n in sub.node_list():
            _drop_subgraph_uses(n)
            n.set_inputs([])


class DeadCodeElimination(Pass):
    """Remove nodes none of whose outputs is read or is a graph output, and unused constants."""

    name = "dce"
    stage = "optimize"
    opt_level = 1
    fixed_point = True
    after = ("cse", "fold_constants", "fold_shapes", "eliminate_noops", "share_constants")
    description = ("remove nodes whose outputs nobody reads (recursively, in one backward walk) and constants "
                   "nobody reads; graph inputs are kept")

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        removed = 0
        graphs = list(walk_graphs(graph))
        for g in reversed(graphs):  # inner bodies first: they may release outer values
            # backward: a node's producers come before it, so one walk removes whole dead chains
            for node in reversed(g.node_list()):
                if node.graph is g and _dead(node):
                    if node.subgraphs():
                        _drop_subgraph_uses(node)
                    g.remove_node(node)
                    removed += 1
        for g in graphs:
            for v in list(g.constants.values()):
                if not v.has_uses() and not v.is_graph_output:
                    g.remove_constant(v)
                    removed += 1
        ctx.stats[self.name] = ctx.stats.get(self.name, 0) + removed
        return PassResult(removed > 0, {"removed": removed})
