"""The one rewrite driver: a worklist, linear in graph size, that reaches every graph.

:func:`rewrite` applies a :class:`~ge_sdk.rewrite.RuleSet` to a graph and to every subgraph
nested in it (If branches, Loop and Scan bodies, at any depth; outer graphs first, each
subgraph after its enclosing graph is done). Within one graph:

* every node goes on the worklist once, in graph order, and a rule is tried only at nodes of
  its root op types (an index, never a whole-graph scan per node);
* a rewrite puts back on the worklist what it may have enabled: the new nodes and the readers
  of the replaced values (each value is replaced once, so this stays linear);
* with ``order="nodes"`` each node popped tries the rules for its op type in turn (then the
  rules for any op type) and the first that applies wins; with ``order="rules"`` (rule
  priority) each rule in turn is tried at every queued node of its root types before the next
  rule, and the nodes a round queued form the next round;
* with ``order="rules"``, when the worklist runs dry, anchors that failed before a later
  rewrite are tried once more (a rewrite elsewhere can free an inner node of a pattern by
  removing its other reader); this repeats at most ``max_rounds`` times, so the number of rule
  invocations stays proportional to the graph (:attr:`RewriteResult.tries` counts them).

:class:`Rewriter` is what rules change the graph through, in either style.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ge_core.errors import GEError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.passes import Pass, PassContext, PassResult

from .match import Match
from .rule import Rule, RuleLike, RuleSet

__all__ = ["Rewriter", "RewriteResult", "rewrite", "apply_rules", "RewritePass", "RulePass", "can_replace",
           "walk_graphs", "REPLACES_META", "FUSED_FROM_META", "record_replaced"]

log = logging.getLogger("ge.rewrite")


def can_replace(old: Value, new: Value) -> bool:
    """True when ``old`` may be replaced by ``new`` without the IR adding an Identity to keep a
    graph output's name (which would make rewrites loop)."""
    if old is new:
        return False
    if not old.is_graph_output:
        return True
    return not (new.is_graph_input or new.is_constant or new.is_graph_output or new.graph is not old.graph)


def walk_graphs(graph: Graph) -> Iterator[Graph]:
    """``graph`` and every subgraph nested in its nodes, outer first; a graph's subgraphs are
    looked up after the consumer is done with it (so rewriting it first is safe)."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for n in g.nodes:
            if n.attrs:  # only attributes hold subgraphs
                stack.extend(n.subgraphs())


def _root(g: Graph) -> Graph:
    while g.parent is not None:
        g = g.parent
    return g


#: Node meta: for each output, the name of the value it replaced (the last node of a fused
#: region's output, through every rewrite since), or None; ``ge compare --per-node`` matches a
#: fused node's output to the source model's tensor through it.
REPLACES_META = "ge.replaces"

#: Node meta: the names of the source nodes a rule's replacement was made from (through every
#: rewrite since), so a node-name option (``--keep_dtype``) still finds a fused node.
FUSED_FROM_META = "ge.fused_from"


def record_replaced(old: Value, new: Value) -> None:
    """Note on ``new``'s producer that ``new`` stands for ``old`` (or for what ``old`` stood for)."""
    p, q = new.producer, old.producer
    if p is None:
        return
    name = old.name
    prior = q.meta.get(REPLACES_META) if q is not None else None
    if isinstance(prior, list) and old.index < len(prior) and isinstance(prior[old.index], str):
        name = prior[old.index]
    names = p.meta.get(REPLACES_META)
    if not isinstance(names, list) or len(names) != len(p.outputs):
        names = [None] * len(p.outputs)
    names[new.index] = name
    p.meta[REPLACES_META] = names


def _pure(node: Node) -> bool:
    """Every op the IR knows has no side effects; nodes holding subgraphs are kept to be safe."""
    return not node.subgraphs()


class Rewriter:
    """The operations rules use to change one graph; it records what to revisit.

    Imperative rules use :meth:`replace_value`, :meth:`replace_node`, :meth:`set_input`,
    :meth:`erase`, :meth:`add_node` and :meth:`constant`; a declarative rule's replacement builds nodes with
    :meth:`op` and :meth:`const` (inserted before the match's last root, its *anchor*).
    """

    def __init__(self, graph: Graph, ctx: PassContext | None = None, *, ops: Any = None) -> None:
        self.graph = graph
        self.ctx = ctx
        self.params: dict[str, Any] = ctx.params if ctx is not None else {}
        if ops is None and ctx is not None and ctx.registries is not None:
            ops = ctx.registries.ops
        self.ops = ops
        self.changed = False
        self.rewrites = 0  # nodes replaced through replace_node
        self.anchor: Node | None = None
        self.created: list[Node] = []
        self.positions: dict[Node, int] | None = None
        self.multi_root = False
        self._queue: deque[Node] = deque()
        self._queued: set[Node] = set()

    # -- worklist ------------------------------------------------------------------------------
    def push(self, node: Node) -> None:
        """Queue ``node`` (once) for the rules to look at again."""
        if node not in self._queued and node.graph is self.graph:
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

    def drain(self) -> list[Node]:
        """Everything queued (still in the graph), in queue order; the queue is left empty."""
        out = [n for n in self._queue if n.graph is self.graph]
        self._queue.clear()
        self._queued.clear()
        return out

    # -- imperative rewriting ------------------------------------------------------------------
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
                if p is not None and not v.has_uses() and p.graph is not None and _pure(p):
                    stack.append(p)
                elif v.is_constant and not v.has_uses() and v.graph is not None and not v.is_graph_output:
                    v.graph.remove_constant(v)

    def set_input(self, node: Node, index: int, value: Value | None) -> None:
        """Make input ``index`` of ``node`` read ``value``; the old producer goes when nothing
        reads it any more, and ``node`` is looked at again."""
        old = node.inputs[index]
        node.set_input(index, value)
        self.changed = True
        self.push(node)
        if old is not None and old.producer is not None and not old.has_uses() and not old.is_graph_output \
                and _pure(old.producer):
            self.erase(old.producer)

    def constant(self, array: np.ndarray, like: Value | None = None) -> Value:
        """A new constant of the graph holding ``array`` (named after ``like`` where given)."""
        g = like.graph if like is not None and like.graph is not None else self.graph
        if like is None:
            return g.add_constant(array)
        return g.add_constant(array, g.names.fresh(f"{like.name}_const"))

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
        if g is None or self.ops is None:
            return
        opsets = _root(g).opset_imports
        # Types only ever gain information (known dims are kept), so this cascade is bounded.
        stack = [node]
        while stack:
            n = stack.pop()
            try:
                changed = self.ops.infer_node(n, opsets)
            # Raising a ShapeInferenceError of a node with complete inputs here was tried (issue 21):
            # it fails ONNX's affine_grid_*_expanded node cases, where eliminate_noops leaves a Range
            # with a [1]-shaped input for a moment; the passes must be fixed before this can raise.
            except Exception as e:  # noqa: BLE001 - inference failure leaves the known types as they are
                log.debug("re-inference of %s failed: %s", n.describe(), e)
                continue
            if changed:
                for o in n.outputs:
                    for user, _ in o.uses():
                        if user.graph is not None:
                            stack.append(user)
                            self.push(user)

    # -- declarative rewriting -----------------------------------------------------------------
    def op(self, op_type: str, *inputs: Value | None, domain: str = "", name: str | None = None,
           num_outputs: int = 1, output_types: Sequence[TensorType | None] | None = None,
           **attrs: Any) -> Any:
        """Add a node before the anchor; returns its output value (a tuple when ``num_outputs > 1``)."""
        if self.anchor is None:
            raise GEError(f"Rewriter.op({op_type!r}) is for a rule's replacement (no match is being replaced)")
        node = self.graph.add_node(op_type, list(inputs), attrs, domain=domain, name=name or op_type.lower(),
                                   num_outputs=num_outputs, output_types=output_types, before=self.anchor)
        self.created.append(node)
        root = _root(self.graph)
        if domain and domain not in root.opset_imports:
            root.opset_imports[domain] = 1
        if self.ops is not None:
            try:
                self.ops.infer_node(node, root.opset_imports)
            except GEError:
                pass
        return node.outputs[0] if num_outputs == 1 else tuple(node.outputs)

    def const(self, array: Any, name: str | None = None) -> Value:
        """Add a constant."""
        return self.graph.add_constant(np.asarray(array), self.graph.names.fresh(name or "const"))

    def rollback(self) -> None:
        """Remove the nodes the current replacement made (it failed or declined)."""
        for n in reversed(self.created):
            for v in n.outputs:
                if v.has_uses():
                    break
            else:
                self.graph.remove_node(n)
        self.created.clear()

    def apply_match(self, rule: Rule, m: Match) -> bool:
        """Run ``rule``'s replacement for ``m`` and splice it in; True if the graph changed."""
        fn = rule.replacement(m)
        if fn is None:
            return False
        root_nodes = [v.producer for v in m.roots]
        anchor = root_nodes[0]
        if len(root_nodes) > 1:
            if self.positions is None:
                self.positions = {n: i for i, n in enumerate(self.graph.nodes)}
            pos = self.positions
            anchor = max(root_nodes, key=lambda n: pos.get(n, -1))  # type: ignore[arg-type]
        assert anchor is not None
        self.anchor, self.created = anchor, []
        try:
            out = fn(self, m)
        except GEError:
            self.rollback()
            raise
        except Exception as e:
            self.rollback()
            raise GEError(f"rule '{rule.name}': replacement raised {type(e).__name__}: {e} at {anchor.describe()}") from e
        finally:
            self.anchor = None
        if out is None:
            self.rollback()
            return False
        new = [out] if isinstance(out, Value) else list(out)
        if len(new) != len(m.roots) or not all(isinstance(x, Value) for x in new):
            self.rollback()
            raise GEError(f"rule '{rule.name}': the replacement must return {len(m.roots)} value(s), one per root")
        for old, nv in zip(m.roots, new):
            if nv.type.dtype is None and nv.type.shape is None:
                nv.type = old.type
            if nv.producer is not None and nv.producer in self.created:
                record_replaced(old, nv)
            readers = [n for n, _ in old.uses()]
            old.replace_all_uses_with(nv)
            for n in readers:  # the readers of the replaced value, not every reader of nv: linear
                self.push(n)
        made = sorted({x for mn in m.nodes for x in (mn.meta.get(FUSED_FROM_META) or [mn.name])})
        for n in self.created:
            n.meta.setdefault(FUSED_FROM_META, made)
            self.push(n)
        self.created = []
        self._remove_dead(m)
        self.changed = True
        self.multi_root |= len(m.roots) > 1
        return True

    def _remove_dead(self, m: Match) -> None:
        graph = self.graph
        doomed = {n for n in m.nodes if n.graph is graph}
        changed = True
        while changed:
            changed = False
            for n in list(doomed):
                if any(v.is_graph_output or any(u not in doomed for u in v.users) for v in n.outputs):
                    doomed.discard(n)
                    changed = True
        consts = {v: None for n in doomed for v in n.inputs if v is not None and v.is_constant}
        if doomed:
            graph.remove_nodes(doomed)
        for c in consts:
            if not c.has_uses() and not c.is_graph_output and c.graph is graph and c.name in graph.constants:
                graph.remove_constant(c)


@dataclass
class RewriteResult:
    """What :func:`rewrite` did: ``changed``; ``rewrites`` per rule name; ``tries`` (rule
    invocations, proportional to the graph); ``replaced`` (nodes replaced through
    :meth:`Rewriter.replace_node`); ``graphs`` visited."""

    changed: bool = False
    rewrites: dict[str, int] = field(default_factory=dict)
    tries: int = 0
    replaced: int = 0
    graphs: int = 0

    def __bool__(self) -> bool:
        return self.changed

    @property
    def total(self) -> int:
        return sum(self.rewrites.values())

    def count(self, name: str) -> None:
        self.rewrites[name] = self.rewrites.get(name, 0) + 1


def rewrite(graph: Graph, rules: RuleSet | RuleLike | Iterable[RuleLike], *, ctx: PassContext | None = None,
            ops: Any = None, enabled: Callable[[str], bool] | None = None, max_rounds: int = 10,
            subgraphs: bool = True, stats: dict[str, int] | None = None) -> RewriteResult:
    """Apply ``rules`` to ``graph`` and (with ``subgraphs``) every nested subgraph until none
    applies (see the module docstring). ``enabled(rule_name)`` can turn rules off; ``stats``
    gets the count of rewrites per rule added to it."""
    rs = RuleSet.of(rules).select(enabled)
    result = RewriteResult()
    if rs.rules:
        for g in (walk_graphs(graph) if subgraphs else (graph,)):
            rw = Rewriter(g, ctx, ops=ops)
            (_by_node if rs.order == "nodes" else _by_rule)(g, rs, rw, result, max(1, max_rounds))
            if rw.multi_root:
                g.topological_sort()
            result.changed |= rw.changed
            result.replaced += rw.rewrites
            result.graphs += 1
    if stats is not None:
        for k, v in result.rewrites.items():
            stats[k] = stats.get(k, 0) + v
    return result


def _tables(rs: RuleSet) -> tuple[dict[str, list[RuleLike]], list[RuleLike]]:
    by_type: dict[str, list[RuleLike]] = {}
    generic: list[RuleLike] = []
    for r in rs:
        types = r.root_types
        if types is None:
            generic.append(r)
        else:
            for t in dict.fromkeys(types):
                by_type.setdefault(t, []).append(r)
    return by_type, generic


def _by_node(g: Graph, rs: RuleSet, rw: Rewriter, res: RewriteResult, max_rounds: int) -> None:
    by_type, generic = _tables(rs)
    for n in g.nodes:
        rw.push(n)
    while True:
        node = rw.pop()
        if node is None:
            break
        for rule in (*by_type.get(node.op_type, ()), *generic):
            res.tries += 1
            if rule.apply(node, rw):
                res.count(rule.name)
                break


def _by_rule(g: Graph, rs: RuleSet, rw: Rewriter, res: RewriteResult, max_rounds: int) -> None:
    for n in g.nodes:
        rw.push(n)
    failed: dict[Node, int] = {}  # anchor -> number of rewrites done when it last failed
    done = 0
    for _ in range(max_rounds):
        pending = rw.drain()
        if not pending:
            pending = [n for n, at in failed.items() if at < done and n.graph is g]
            if not pending:
                break
            failed.clear()
        rw.positions = None
        index: dict[str, list[Node]] = {}
        for n in pending:
            index.setdefault(n.op_type, []).append(n)
            failed.pop(n, None)  # tried again in this round: its earlier failures are superseded
        for rule in rs:
            types = rule.root_types
            for t in (dict.fromkeys(types) if types is not None else (None,)):
                for n in (index.get(t, ()) if t is not None else pending):
                    if n.graph is not g:
                        continue
                    res.tries += 1
                    if rule.apply(n, rw):
                        done += 1
                        res.count(rule.name)
                        failed.pop(n, None)
                    else:
                        failed.setdefault(n, done)


def apply_rules(graph: Graph, rules: RuleSet | Iterable[RuleLike], *, ops: Any = None, max_sweeps: int = 10,
                enabled: Callable[[str], bool] | None = None, stats: dict[str, int] | None = None,
                subgraphs: bool = True) -> bool:
    """:func:`rewrite` returning only whether the graph changed (the older entry point)."""
    return rewrite(graph, rules, ops=ops, enabled=enabled, max_rounds=max_sweeps, stats=stats,
                   subgraphs=subgraphs).changed


class RewritePass(Pass):
    """A pass that applies a rule set (by default in the ``fuse`` stage) to the graph and its
    subgraphs until no rule applies.

    A rule is skipped when the fusion switch file turns its name off. ``ctx.stats`` gets the
    count of rewrites per rule under ``rewrites``.
    """

    def __init__(self, name: str, rules: RuleSet | Sequence[RuleLike], *, stage: str = "fuse", opt_level: int = 1,
                 description: str = "", **attrs: Any) -> None:
        self.rule_set = RuleSet.of(rules, name=name)
        self.rules = list(self.rule_set)
        attrs.update(name=name, stage=stage, opt_level=opt_level,
                     description=description or f"apply rewrite rules {', '.join(r.name for r in self.rules)}")
        for k, v in attrs.items():
            setattr(self, k, v)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        res = rewrite(graph, self.rule_set, ctx=ctx, enabled=ctx.switch_enabled,
                      stats=ctx.stats.setdefault("rewrites", {}))
        return PassResult(res.changed, dict(res.rewrites))


class RulePass(Pass):
    """A pass made of imperative rules keyed by op type (a table), run in node order.

    ``rules`` maps an op type to functions ``fn(node, rw) -> bool`` tried in order on nodes of
    ONNX's default domain; ``any_rules`` are tried on every node (any domain) after those.
    ``ctx.stats[name]`` counts the nodes replaced.
    """

    #: op type -> rules tried in order on nodes of ONNX's default domain.
    rules: ClassVar[dict[str, Sequence[Callable[[Node, Rewriter], bool]]]] = {}
    #: Rules tried on every node (any domain) after the op-specific ones.
    any_rules: ClassVar[Sequence[Callable[[Node, Rewriter], bool]]] = ()

    def enabled(self, ctx: PassContext) -> bool:
        """False to skip the pass for these options."""
        return True

    def generic_rules(self) -> Sequence[Callable[[Node, Rewriter], bool]]:
        """The rules tried on every node (``any_rules`` unless overridden)."""
        return self.any_rules

    def rule_set(self, ctx: PassContext) -> RuleSet:
        """The rules of this pass as a rule set (node order)."""
        return RuleSet.from_table(self.rules, self.generic_rules(), name=self.name)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if not self.enabled(ctx):
            return PassResult(False)
        res = rewrite(graph, self.rule_set(ctx), ctx=ctx)
        ctx.stats[self.name] = ctx.stats.get(self.name, 0) + res.replaced
        return PassResult(res.changed, {"replaced": res.replaced})

