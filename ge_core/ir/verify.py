"""Graph verification: ownership, use-def consistency, topological order, types and names."""

from __future__ import annotations

from ..errors import GraphError
from .graph import Graph, Node, Value


def verify_graph(graph: Graph, *, op_registry=None) -> None:
    """Raise :class:`GraphError` describing the first broken invariant, or return None.

    With ``op_registry`` every node must also name a registered op and respect its arity.
    """
    _verify(graph, set(), op_registry)


def _verify(graph: Graph, outer: set[Value], ops) -> None:
    where = f"graph '{graph.name}'"
    defined: set[Value] = set(outer)
    names: dict[str, Value] = {}

    def define(v: Value, what: str) -> None:
        if v.name in names and names[v.name] is not v:
            raise GraphError(f"{where}: two values are named '{v.name}' ({what})")
        names[v.name] = v
        defined.add(v)

    for v in graph.inputs:
        if v.graph is not graph:
            raise GraphError(f"{where}: input '{v.name}' belongs to another graph")
        define(v, "input")
    for v, d in graph.input_defaults.items():
        if not graph.has_input(v):
            raise GraphError(f"{where}: a default is recorded for '{v.name}', which is not an input of the graph")
        t = v.type
        fits = (t.dtype is None or d.dtype == t.dtype) and (t.shape is None or (
            d.ndim == len(t.shape) and all(not isinstance(w, int) or w == n for w, n in zip(t.shape, d.shape))))
        if not fits:
            raise GraphError(f"{where}: the default of input '{v.name}' ({d.dtype}{list(d.shape)}) does not fit {v.type}")
    for name, v in graph.constants.items():
        if v.const_value is None:
            raise GraphError(f"{where}: constant '{name}' has no value")
        if v.name != name:
            raise GraphError(f"{where}: constant table key '{name}' does not match value name '{v.name}'")
        if v.type.shape is not None and tuple(v.const_value.shape) != v.type.shape:
            raise GraphError(
                f"{where}: constant '{name}' has shape {v.const_value.shape} but its type says {v.type}"
            )
        define(v, "constant")
    seen_nodes: set[Node] = set()
    node_names: set[str] = set()
    count = 0
    for node in graph.nodes:
        count += 1
        if node.graph is not graph:
            raise GraphError(f"{where}: {node.describe()} does not record this graph as its owner")
        if node in seen_nodes:
            raise GraphError(f"{where}: {node.describe()} appears twice")
        seen_nodes.add(node)
        if not node.name:
            raise GraphError(f"{where}: a {node.qualified_op} node has no name")
        if node.name in node_names:
            raise GraphError(f"{where}: two nodes are named '{node.name}'")
        node_names.add(node.name)
        for i, inp in enumerate(node.inputs):
            if inp is None:
                continue
            v = inp
            if v not in defined:
                if v.producer is not None and v.producer.graph is graph:
                    raise GraphError(
                        f"{where}: {node.describe()} reads '{v.name}' before its producer "
                        f"{v.producer.describe()} (not in topological order)",
                        hint="call graph.topological_sort()",
                    )
                raise GraphError(f"{where}: {node.describe()} reads '{v.name}', which is not defined in scope")
            if not v.is_used_by(node, i):
                raise GraphError(f"{where}: use list of '{v.name}' misses {node.describe()} input {i}")
        for i, v in enumerate(node.outputs):
            if v.producer is not node or v.index != i:
                raise GraphError(f"{where}: output {i} '{v.name}' of {node.describe()} does not point back to it")
            if v.graph is not graph:
                raise GraphError(f"{where}: output '{v.name}' of {node.describe()} belongs to another graph")
            define(v, f"output of {node.describe()}")
        if ops is not None:
            ops.check_node(node)
        for sub in node.subgraphs():
            if sub.parent is not graph:
                raise GraphError(f"{where}: subgraph '{sub.name}' of {node.describe()} has the wrong parent")
            _verify(sub, defined, ops)
    if count != len(graph):
        raise GraphError(f"{where}: node count {len(graph)} does not match the node list ({count})")
    for v in graph.outputs:
        if v not in defined:
            raise GraphError(f"{where}: output '{v.name}' is not defined in the graph")
    # Every recorded use must be a live node input in this graph or a subgraph.
    for v in list(defined - outer):
        for n, i in v.uses():
            if n.erased or n.graph is None:
                raise GraphError(f"{where}: '{v.name}' records a use by removed {n.describe()}")
            if i >= len(n.inputs) or n.inputs[i] is not v:
                raise GraphError(f"{where}: '{v.name}' records a stale use by {n.describe()} input {i}")
