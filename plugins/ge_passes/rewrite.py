"""A worklist rewrite driver: local rules applied until none fires, in time linear in the graph.

A *rule* is ``rule(node, rw) -> bool``: it looks at one node and its neighbours and, when it
matches, rewrites through the :class:`Rewriter` ``rw`` and returns True. The driver visits every
node once in order; a rewrite puts the nodes it may have enabled (the readers of replaced values
and new nodes) back on the worklist, so chains collapse in one run without whole-graph rescans.

A :class:`RulePass` is a pass made of rules keyed by op type (MLIR's greedy pattern driver,
tinygrad's rule tables).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.passes import Pass, PassContext

from ._util import can_replace, default_domain, walk_graphs

log = logging.getLogger("ge.passes")

Rule = Callable[[Node, "Rewriter"], bool]


class Rewriter:
    """The operations rules use to change a graph; it records what to revisit."""

    def __init__(self, graph: Graph, ctx: PassContext) -> None:
        self.graph = graph
        self.ctx = ctx
        self.params = ctx.params
        self.changed = False
        self.rewrites = 0
        self._queue: deque[Node] = deque()
        self._queued: set[Node] = set()

    # -- worklist ------------------------------------------------------------------------------
    def push(self, node: Node) -> None:
        if node not in self._queued and node.graph is not None:
            self._queued.add(node)
            self._queue.append(node)

    def push_users(self, v: Value) -> None:
        for n, _ in v.uses():
            self.push(n)

    def pop(self) -> Node | None:
        while self._queue:
            n = self._queue.popleft()
            self._queued.discard(n)
            if n.graph is not None:
                return n
        return None

    # -- rewriting -----------------------------------------------------------------------------
    def replace_value(self, old: Value, new: Value) -> bool:
        """Make every reader of ``old`` (and the graph output it may be) read ``new``.

        Returns False (and changes nothing) where the graph output ``old`` could not be renamed.
        The readers are re-inferred when ``new`` knows more than ``old`` did and revisited.
        """
        if not can_replace(old, new):
            return False
        readers = [n for n, _ in old.uses()]
        learns = new.is_constant or new.type != old.type
        old.replace_all_uses_with(new)
        self.changed = True
        for n in dict.fromkeys(readers):
            if learns:
                self.reinfer(n)
            self.push(n)
        return True

    def replace_node(self, node: Node, values: Sequence[Value | None]) -> bool:
        """Replace the outputs of ``node`` by ``values`` (None: that output must be unused) and
        remove it. Returns False, changing nothing, when that is not possible."""
        for o, v in zip(node.outputs, values):
            if v is None:
                if o.has_uses() or o.is_graph_output:
                    return False
            elif not can_replace(o, v):
                return False
        for o, v in zip(node.outputs, values):
            if v is not None:
                self.replace_value(o, v)
        self.erase(node)
        self.rewrites += 1
        return True

    def erase(self, node: Node) -> None:
        """Remove ``node`` (its outputs must be unused) and any producer left without readers."""
        if node.graph is None:
            return
        stack = [node]
        while stack:
            n = stack.pop()
            g = n.graph
            if g is None or any(o.has_uses() or o.is_graph_output for o in n.outputs):
                continue
            producers = [v for v in n.inputs if v is not None]
            g.remove_node(n)
            self.changed = True
            for v in producers:
                p = v.producer
                if p is not None and not v.has_uses() and p.graph is not None and pure(p):
                    stack.append(p)
                elif v.is_constant and not v.has_uses() and v.graph is not None and not v.is_graph_output:
                    v.graph.remove_constant(v)

    def constant(self, array: np.ndarray, like: Value | None = None) -> Value:
        """A new constant of the graph holding ``array`` (named after ``like`` where given)."""
        g = like.graph if like is not None and like.graph is not None else self.graph
        if like is None:
            return g.add_constant(array)
        return g.add_constant(array, g.fresh_name(f"{like.name}_const"))

    def add_node(self, op_type: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None, *,
                 before: Node, like: Value | None = None, output_type: TensorType | None = None) -> Node:
        """Insert a single-output node just before ``before``, infer its type, queue it."""
        g = before.graph
        assert g is not None
        name = f"{like.producer.name if like is not None and like.producer is not None else op_type.lower()}"
        n = g.add_node(op_type, list(inputs), attrs or {}, name=name, before=before,
                       output_types=[output_type] if output_type is not None else None)
        self.reinfer(n)
        self.push(n)
        self.changed = True
        return n

    def reinfer(self, node: Node) -> None:
        """Re-run type inference of ``node``; when its outputs learn more, revisit their readers."""
        g = node.graph
        if g is None or self.ctx.registries is None:
            return
        root = g
        while root.parent is not None:
            root = root.parent
        # Types only ever gain information (known dims are kept), so this cascade is bounded.
        stack = [node]
        while stack:
            n = stack.pop()
            try:
                changed = self.ctx.ops.infer_node(n, root.opset_imports)
            except Exception as e:  # noqa: BLE001 - inference failure leaves the known types as they are
                log.debug("re-inference of %s failed: %s", n.describe(), e)
                continue
            if changed:
                for o in n.outputs:
                    for user, _ in o.uses():
                        if user.graph is not None:
                            stack.append(user)
                            self.push(user)


def pure(node: Node) -> bool:
    """Every op the IR knows has no side effects; nodes holding subgraphs are kept to be safe."""
    return not node.subgraphs()


class RulePass(Pass):
    """A pass made of local rewrite rules keyed by op type, run by the worklist driver."""

    #: op type -> rules tried in order on nodes of ONNX's default domain.
    rules: ClassVar[dict[str, Sequence[Rule]]] = {}
    #: Rules tried on every node (any domain) after the op-specific ones.
    any_rules: ClassVar[Sequence[Rule]] = ()

    def enabled(self, ctx: PassContext) -> bool:
        """False to skip the pass for these options."""
        return True

    def generic_rules(self) -> Sequence[Rule]:
        """The rules tried on every node (``any_rules`` unless overridden)."""
        return self.any_rules

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        if not self.enabled(ctx):
            return False
        changed = False
        for g in list(walk_graphs(graph)):
            changed |= self.run_graph(g, ctx)
        return changed

    def run_graph(self, graph: Graph, ctx: PassContext) -> bool:
        rw = Rewriter(graph, ctx)
        for n in graph.nodes:
            rw.push(n)
        rules, any_rules = self.rules, self.generic_rules()
        while True:
            node = rw.pop()
            if node is None:
                break
            for rule in rules.get(node.op_type, ()) if default_domain(node) else ():
                if rule(node, rw):
                    break
            else:
                for rule in any_rules:
                    if rule(node, rw):
                        break
        ctx.stats[self.name] = ctx.stats.get(self.name, 0) + rw.rewrites
        return rw.changed
