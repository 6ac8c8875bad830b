"""Common subexpression elimination and duplicate-constant sharing."""

from __future__ import annotations

from ge_core.ir.graph import Graph, Node, Value
from ge_core.passes import Pass, PassContext, PassResult

from ._util import attr_key, can_replace, const_key, same_bytes, walk_graphs

#: Ops whose inputs may be reordered without changing the result (type and shape included).
COMMUTATIVE = frozenset(
    "Add Mul Max Min Sum Mean And Or Xor Equal BitwiseAnd BitwiseOr BitwiseXor".split()
)


class ShareConstants(Pass):
    """Make constants with the same dtype, shape and bytes one constant."""

    name = "share_constants"
    after = ("simplify_layout",)
    stage = "optimize"
    opt_level = 1
    fixed_point = True
    before = ("cse",)
    description = "merge constants with equal dtype, shape and bytes (hashed, then compared bit for bit)"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        changed = False
        merged = 0
        for g in walk_graphs(graph):
            # cheap grouping first: only constants sharing dtype and shape are hashed
            groups: dict[tuple, list[Value]] = {}
            for v in list(g.constants.values()):
                a = v.const_value
                assert a is not None
                groups.setdefault((a.dtype.str, a.shape), []).append(v)
            for vs in groups.values():
                if len(vs) < 2:
                    continue
                seen: dict[tuple, list[Value]] = {}
                for v in vs:
                    a = v.const_value
                    assert a is not None
                    bucket = seen.setdefault(const_key(a), [])
                    keep = next((k for k in bucket if same_bytes(k.const_value, a)), None)  # type: ignore[arg-type]
                    if keep is None:
                        bucket.append(v)
                        continue
                    if v.is_graph_output or not v.has_uses():
                        continue
                    v.replace_all_uses_with(keep)
                    g.remove_constant(v)
                    merged += 1
                    changed = True
        ctx.stats[self.name] = ctx.stats.get(self.name, 0) + merged
        return PassResult(changed, {"merged": merged})


class CommonSubexpressionElimination(Pass):
    """Merge nodes computing the same op on the same inputs with the same attributes."""

    name = "cse"
    stage = "optimize"
    opt_level = 1
    fixed_point = True
    description = ("merge nodes with the same op, domain, inputs and attributes (arrays by value, commutative "
                   "inputs in any order); never random ops or nodes with subgraphs")

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        merged = sum(self._run_graph(g, ctx) for g in walk_graphs(graph))
        return PassResult(merged > 0, {"merged": merged})

    def _run_graph(self, graph: Graph, ctx: PassContext) -> int:
        table: dict[tuple, Node] = {}
        ids: dict[Value, int] = {}
        deterministic: dict[tuple[str, str], bool] = {}

        def vid(v: Value | None) -> int:
            if v is None:
                return -1
            i = ids.get(v)
            if i is None:
                i = ids[v] = len(ids)
            return i

        merged = 0
        for node in graph.nodes:
            op = (node.domain, node.op_type)
            det = deterministic.get(op)
            if det is None:
                d = ctx.ops.lookup(node.domain, node.op_type) if ctx.ops is not None else None
                det = deterministic[op] = d is not None and d.deterministic
            if not det or not node.outputs:
                continue
            try:
                attrs = tuple(sorted((k, attr_key(a)) for k, a in node.attrs.items()))
            except TypeError:  # a subgraph attribute
                continue
            ins = [vid(v) for v in node.inputs]
            if node.op_type in COMMUTATIVE and node.domain in ("", "ai.onnx"):
                ins.sort()
            key = (node.domain or "", node.op_type, tuple(ins), attrs, len(node.outputs))
            first = table.get(key)
            if first is None:
                table[key] = node
                continue
            if not all(can_replace(a, b) for a, b in zip(node.outputs, first.outputs)):
                continue
            for a, b in zip(node.outputs, first.outputs):
                if b.type.shape is None and a.type.shape is not None:
                    b.type = a.type  # keep what the duplicate knew
                a.replace_all_uses_with(b)
            graph.remove_node(node)
            merged += 1
        ctx.stats[self.name] = ctx.stats.get(self.name, 0) + merged
        return merged
