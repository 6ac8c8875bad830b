"""The graph IR: :class:`Graph`, :class:`Node` and :class:`Value`.

Invariants kept by the IR itself (not by passes):

* every ``Value`` is produced by at most one node (or is a graph input / constant);
* ``value.uses()`` lists exactly the ``(node, input_index)`` pairs that read it, kept in sync by
  :meth:`Node.set_input`, :meth:`Value.replace_all_uses_with` and node removal;
* node order is a doubly linked list, so insertion and removal are O(1) and iterating
  ``graph.nodes`` while removing or inserting nodes is safe (removed nodes are skipped);
* removing a node whose outputs are still used raises :class:`GraphError`.

Constants (ONNX initializers) are values with ``const_value`` set and no producer.
Subgraphs (control flow bodies) are ``Graph`` objects stored in node attributes; a node in a
subgraph may read values of enclosing graphs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import GraphError
from .types import TensorType


class Value:
    """A tensor in the graph: a node output, a graph input or a constant."""

    __slots__ = ("name", "type", "producer", "index", "const_value", "graph", "_uses", "meta")

    def __init__(
        self,
        name: str,
        type: TensorType | None = None,
        *,
        producer: Node | None = None,
        index: int = 0,
        const_value: np.ndarray | None = None,
        graph: Graph | None = None,
    ) -> None:
        self.name = name
        self.type = type if type is not None else TensorType()
        self.producer = producer
        self.index = index
        self.const_value = const_value
        self.graph = graph
        self._uses: dict[tuple[Node, int], None] = {}
        self.meta: dict[str, Any] = {}

    # -- use-def -------------------------------------------------------------------------
    def uses(self) -> list[tuple[Node, int]]:
        """Snapshot of ``(node, input_index)`` pairs reading this value (safe to mutate)."""
        return list(self._uses)

    @property
    def users(self) -> list[Node]:
        """Distinct nodes that read this value, in first-use order."""
        return list(dict.fromkeys(n for n, _ in self._uses))

    def has_uses(self) -> bool:
        return bool(self._uses)

    def is_used_by(self, node: Node, index: int) -> bool:
        """Whether input ``index`` of ``node`` is a recorded use of this value (O(1))."""
        return (node, index) in self._uses

    @property
    def is_constant(self) -> bool:
        return self.const_value is not None

    @property
    def is_graph_input(self) -> bool:
        return self.graph is not None and self.producer is None and self in self.graph._input_set

    @property
    def default(self) -> np.ndarray | None:
        """The value a graph input takes when it is not fed (None: the input must be fed)."""
        g = self.graph
        return None if g is None else g.input_defaults.get(self)

    @property
    def is_graph_output(self) -> bool:
        return self.graph is not None and self in self.graph._output_set

    def replace_all_uses_with(self, other: Value, *, include_outputs: bool = True) -> None:
        """Make every reader of this value read ``other`` instead.

        If this value is a graph output, ``other`` takes its place (and its name, so the
        model's output names never change); where ``other`` cannot be renamed (it is a graph
        input, a constant or already an output) an Identity node carries the name.
        """
        if other is self:
            return
        for node, i in self.uses():
            node.set_input(i, other)
        if include_outputs and self.graph is not None and self.is_graph_output:
            self.graph._replace_output(self, other)

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """One operation: op type and domain, attributes, input and output values."""

    __slots__ = (
        "op_type",
        "domain",
        "name",
        "attrs",
        "_inputs",
        "outputs",
        "graph",
        "_prev",
        "_next",
        "_erased",
        "meta",
    )

    def __init__(
        self,
        op_type: str,
        inputs: Sequence[Value | None] = (),
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = "",
        name: str = "",
        outputs: Sequence[Value] = (),
    ) -> None:
        self.op_type = op_type
        self.domain = domain
        self.name = name
        self.attrs: dict[str, Any] = dict(attrs or {})
        self._inputs: list[Value | None] = []
        self.outputs: list[Value] = list(outputs)
        self.graph: Graph | None = None
        self._prev: Node | None = None
        self._next: Node | None = None
        self._erased = False
        self.meta: dict[str, Any] = {}
        for i, v in enumerate(outputs):
            v.producer, v.index = self, i
        for inp in inputs:
            self._append_input(inp)

    @property
    def erased(self) -> bool:
        """Whether the node was removed from its graph."""
        return self._erased

    # -- inputs --------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[Value | None, ...]:
        """The input values (None for an absent optional input). Change them with set_input."""
        return tuple(self._inputs)

    def _append_input(self, v: Value | None) -> None:
        i = len(self._inputs)
        self._inputs.append(v)
        if v is not None:
            v._uses[(self, i)] = None

    def set_input(self, i: int, v: Value | None) -> None:
        """Replace input ``i``, keeping both values' use lists in sync."""
        old = self._inputs[i]
        if old is v:
            return
        if old is not None:
            old._uses.pop((self, i), None)
        self._inputs[i] = v
        if v is not None:
            v._uses[(self, i)] = None

    def set_inputs(self, values: Sequence[Value | None]) -> None:
        """Replace the whole input list."""
        self._drop_input_uses()
        self._inputs = []
        for v in values:
            self._append_input(v)

    def add_input(self, v: Value | None) -> None:
        self._append_input(v)

    def _drop_input_uses(self) -> None:
        for i, v in enumerate(self._inputs):
            if v is not None:
                v._uses.pop((self, i), None)

    # -- helpers -------------------------------------------------------------------------
    @property
    def output(self) -> Value:
        """The single output (raises if the node has several)."""
        if len(self.outputs) != 1:
            raise GraphError(f"node '{self.name}' ({self.op_type}) has {len(self.outputs)} outputs, not 1")
        return self.outputs[0]

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def subgraphs(self) -> list[Graph]:
        """Graphs held in attributes (control-flow bodies)."""
        out: list[Graph] = []
        for a in self.attrs.values():
            if isinstance(a, Graph):
                out.append(a)
            elif isinstance(a, (list, tuple)) and a and all(isinstance(g, Graph) for g in a):
                out.extend(a)
        return out

    @property
    def users(self) -> list[Node]:
        """Distinct nodes reading any output of this node (a property, as ``Value.users``)."""
        seen: dict[Node, None] = {}
        for v in self.outputs:
            for n, _ in v._uses:
                seen[n] = None
        return list(seen)

    def describe(self) -> str:
        return f"node '{self.name}' ({self.qualified_op})"

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.qualified_op}>"


class NameScope:
    """The one authority for a set of names: the value names of a graph and its subgraphs
    (``graph.names``) or the node names of one graph (``graph.node_names``).

    ``fresh(base)`` is a free name (``base`` itself, else ``base_1``, ``base_2``, ...) that it
    does not reserve: a caller passes it on to ``add_constant``, ``add_input`` or ``add_node``,
    which ``claim`` it. ``new(base)`` reserves a fresh name at once. ``name in scope`` asks
    whether a name is taken.
    """

    def __init__(self, what: str, graph: Graph) -> None:
        self.what = what
        self._graph = graph
        self._used: set[str] = set()
        self._next: dict[str, int] = {}  # where the search for a free base_N goes on

    def __contains__(self, name: object) -> bool:
        return name in self._used

    def fresh(self, base: str = "v") -> str:
        """A name not taken (``base`` if it is free), not reserved."""
        base = base or "v"
        if base not in self._used:
            return base
        i = self._next.get(base, 1)
        while f"{base}_{i}" in self._used:
            i += 1
        self._next[base] = i
        return f"{base}_{i}"

    def claim(self, name: str) -> str:
        """Reserve ``name`` itself; a :class:`GraphError` if it is taken."""
        if name in self._used:
            raise GraphError(f"graph '{self._graph.name}': {self.what} name '{name}' is already used",
                             hint="names must be unique")
        self._used.add(name)
        return name

    def new(self, base: str = "v") -> str:
        """Reserve and return a fresh name."""
        return self.claim(self.fresh(base))

    def release(self, name: str) -> None:
        """Free ``name`` (its value or node left the graph)."""
        self._used.discard(name)


#: ``(op_type, domain)`` of the op set's structural copy (output 0 is input 0), through which a
#: graph routes a repeated or outer output: declared by the op registry when an op set registers
#: an ``OpDef(copy=True)`` (ge_opset: ``Identity``); the IR names no op type of its own.
COPY: list[str] = []


def declare_copy_op(op_type: str, domain: str = "") -> None:
    """Make ``op_type`` (of ``domain``) the structural copy graphs route outputs through."""
    COPY[:] = [op_type, domain]


class Graph:
    """An ordered, verified-on-demand dataflow graph.

    ``opset_imports`` maps domain to version ("" is ONNX's default domain).
    """

    def __init__(self, name: str = "graph", *, parent: Graph | None = None) -> None:
        self.name = name
        self.parent = parent
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self._input_set: set[Value] = set()
        #: Inputs that may be left unfed, with the value each then takes (ONNX initializers
        #: listed as graph inputs). Such an input is a real input: passes never fold it.
        self.input_defaults: dict[Value, np.ndarray] = {}
        self._output_set: dict[Value, None] = {}
        self.constants: dict[str, Value] = {}
        self._head: Node | None = None
        self._tail: Node | None = None
        self._len = 0
        self._value_names = NameScope("value", self)
        #: Node names, unique within this graph.
        self.node_names = NameScope("node", self)
        self._insert_point: tuple[str, Node | None] = ("end", None)
        self.opset_imports: dict[str, int] = {} if parent is None else parent.opset_imports
        self.metadata: dict[str, Any] = {}

    # -- names -----------------------------------------------------------------------------
    @property
    def names(self) -> NameScope:
        """The value names of this graph, its enclosing graphs and the subgraphs inside them:
        one :class:`NameScope`, the root graph's (a body may read an outer value by name)."""
        g = self
        while g.parent is not None:
            g = g.parent
        return g._value_names

    # -- inputs, outputs, constants ----------------------------------------------------------
    def add_input(self, name: str, type: TensorType | None = None, *, default: np.ndarray | None = None) -> Value:
        """Add a graph input; one with a ``default`` may be left out of the feeds."""
        v = Value(self.names.claim(name), type, graph=self)
        self.inputs.append(v)
        self._input_set.add(v)
        if default is not None:
            self.input_defaults[v] = np.asarray(default)
        return v

    def add_constant(self, array: np.ndarray, name: str | None = None) -> Value:
        """Add a constant (initializer) value holding ``array``."""
        array = np.asarray(array) if not isinstance(array, np.ndarray) else array
        nm = self.names.claim(name) if name else self.names.new("const")
        v = Value(nm, TensorType.of(array), const_value=array, graph=self)
        self.constants[nm] = v
        return v

    def remove_constant(self, v: Value) -> None:
        if v.has_uses() or v.is_graph_output:
            raise GraphError(f"constant '{v.name}' is still used and cannot be removed")
        self.constants.pop(v.name, None)
        self.names.release(v.name)
        v.graph = None

    def add_output(self, v: Value) -> None:
        if v in self._output_set:
            # The same value twice as output: route the second through an Identity.
            v = self.copy_node(v, "output_copy").output
        elif v.graph is not self:
            # A body returning an outer value directly: an Identity in the body reads it as a
            # capture, so liveness, dead-code removal and memory plans see the read.
            v = self.copy_node(v, "output_capture").output
        self.outputs.append(v)
        self._output_set[v] = None

    def copy_node(self, v: Value, name: str, after: Node | None = None) -> Node:
        """A node of the op set's structural copy op (:data:`COPY`) reading ``v``."""
        if not COPY:
            raise GraphError(f"graph '{self.name}' needs a copy of '{v.name}', and no op set declares its copy op",
                             hint="load the plugins (ge_core.get_host()); the op set (ge_opset) declares it")
        return self.add_node(COPY[0], [v], domain=COPY[1], name=name, after=after)

    def has_input(self, v: Value) -> bool:
        """Whether ``v`` is one of this graph's inputs."""
        return v in self._input_set

    def restore_outputs(self, values: Iterable[Value]) -> None:
        """Make ``values`` the outputs exactly as given (a stored graph's): unlike
        :meth:`set_outputs`, a repeated or outer value is not routed through an Identity."""
        self.outputs = list(values)
        self._output_set = dict.fromkeys(self.outputs)

    def set_outputs(self, values: Iterable[Value]) -> None:
        self.outputs = []
        self._output_set = {}
        for v in values:
            self.add_output(v)

    def _replace_output(self, old: Value, new: Value) -> None:
        if new.is_graph_input or new.is_constant or new in self._output_set or new.graph is not self:
            ident = self.copy_node(new, "output_keep", after=new.producer)
            new = ident.output
        old_name = old.name
        self.rename_value(old, self.names.fresh(old_name + "_replaced"))
        self.rename_value(new, old_name)
        self.outputs = [new if o is old else o for o in self.outputs]
        self._output_set = dict.fromkeys(self.outputs)

    def rename_value(self, v: Value, name: str) -> None:
        """Give ``v`` the name ``name`` (a :class:`GraphError` if another value has it)."""
        if name == v.name:
            return
        names = self.names
        names.claim(name)
        names.release(v.name)
        if v.is_constant and v.name in self.constants:
            del self.constants[v.name]
            self.constants[name] = v
        v.name = name

    # -- nodes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @property
    def nodes(self) -> Iterator[Node]:
        """Iterate nodes in order; safe while nodes are removed or inserted."""
        return self._iter()

    def _iter(self) -> Iterator[Node]:
        n = self._head
        while n is not None:
            if not n._erased:
                yield n
            n = n._next
            while n is not None and n._erased:
                n = n._next

    def node_list(self) -> list[Node]:
        return list(self._iter())

    def all_constants(self) -> Iterator[Value]:
        """The constant values of this graph and of every nested subgraph, each array once."""
        seen: set[int] = set()
        stack: list[Graph] = [self]
        while stack:
            h = stack.pop()
            for v in h.constants.values():
                if id(v.const_value) not in seen:
                    seen.add(id(v.const_value))
                    yield v
            for n in h.nodes:
                stack.extend(n.subgraphs())

    def walk(self) -> Iterator[Node]:
        """Every node of this graph and of the subgraphs nested in its nodes (to any depth),
        each node followed by the nodes of its subgraphs."""
        for n in self._iter():
            yield n
            for sub in n.subgraphs():
                yield from sub.walk()

    @contextlib.contextmanager
    def inserting_before(self, node: Node):
        """New nodes added inside the block go just before ``node`` (in order)."""
        saved = self._insert_point
        self._insert_point = ("before", node)
        try:
            yield
        finally:
            self._insert_point = saved

    @contextlib.contextmanager
    def inserting_after(self, node: Node | None):
        """New nodes added inside the block go just after ``node``, then after each other."""
        saved = self._insert_point
        self._insert_point = ("after", node)
        try:
            yield
        finally:
            self._insert_point = saved

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[Value | None] = (),
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = "",
        name: str | None = None,
        num_outputs: int = 1,
        output_names: Sequence[str] | None = None,
        output_types: Sequence[TensorType | None] | None = None,
        before: Node | None = None,
        after: Node | None = None,
    ) -> Node:
        """Create a node with fresh output values and insert it.

        Position: ``before``/``after`` if given, else the current ``inserting_*`` point, else
        the end of the graph.
        """
        node_name = self.node_names.new(name or op_type.lower())
        if output_names is not None:
            outs = [Value(self.names.claim(n), graph=self) for n in output_names]
        else:
            outs = [
                Value(self.names.new(f"{node_name}_out{i}" if num_outputs > 1 else node_name), graph=self)
                for i in range(num_outputs)
            ]
        if output_types is not None:
            for v, t in zip(outs, output_types):
                if t is not None:
                    v.type = t
        node = Node(op_type, inputs, attrs, domain=domain, name=node_name, outputs=outs)
        self._link(node, before=before, after=after)
        return node

    def _link(self, node: Node, *, before: Node | None, after: Node | None) -> None:
        if before is None and after is None:
            mode, anchor = self._insert_point
            if mode == "before":
                before = anchor
            elif mode == "after":
                if anchor is None:
                    # insert at the very beginning
                    before = self._head
                    if before is None:
                        after = None
                else:
                    after = anchor
                self._insert_point = ("after", node)
        node.graph = self
        node._erased = False
        if before is not None:
            self._check_member(before)
            node._prev, node._next = before._prev, before
            if before._prev is not None:
                before._prev._next = node
            else:
                self._head = node
            before._prev = node
        elif after is not None:
            self._check_member(after)
            node._prev, node._next = after, after._next
            if after._next is not None:
                after._next._prev = node
            else:
                self._tail = node
            after._next = node
        else:
            node._prev, node._next = self._tail, None
            if self._tail is not None:
                self._tail._next = node
            else:
                self._head = node
            self._tail = node
        self._len += 1

    def _check_member(self, node: Node) -> None:
        if node.graph is not self or node._erased:
            raise GraphError(f"{node.describe()} is not in graph '{self.name}'")

    def remove_node(self, node: Node) -> None:
        """Remove a node whose outputs have no users and are not graph outputs."""
        self._check_member(node)
        for v in node.outputs:
            if v.has_uses() or v.is_graph_output:
                users = ", ".join(sorted({u.name for u in v.users})) or "graph output"
                raise GraphError(
                    f"cannot remove {node.describe()}: its output '{v.name}' is still used by {users}",
                    hint="replace its uses first (Value.replace_all_uses_with)",
                )
        self._unlink(node)

    def remove_nodes(self, nodes: Iterable[Node]) -> None:
        """Remove a set of nodes at once: all or nothing.

        Uses among the removed nodes themselves are allowed; a use from outside the set raises
        and leaves the graph unchanged.
        """
        nodes = list(dict.fromkeys(nodes))
        doomed = set(nodes)
        for node in nodes:
            self._check_member(node)
            for v in node.outputs:
                if v.is_graph_output:
                    raise GraphError(f"cannot remove {node.describe()}: '{v.name}' is a graph output")
                for u, _ in v._uses:
                    if u not in doomed:
                        raise GraphError(
                            f"cannot remove {node.describe()}: its output '{v.name}' is used by {u.describe()}"
                        )
        for node in nodes:
            node._drop_input_uses()
        for node in nodes:
            self._unlink(node, drop_uses=False)

    def _unlink(self, node: Node, drop_uses: bool = True) -> None:
        if drop_uses:
            node._drop_input_uses()
        if node._prev is not None:
            node._prev._next = node._next
        else:
            self._head = node._next
        if node._next is not None:
            node._next._prev = node._prev
        else:
            self._tail = node._prev
        # keep node._next so that an iterator standing on this node can continue
        node._erased = True
        node.graph = None
        self.node_names.release(node.name)
        names = self.names
        for v in node.outputs:
            names.release(v.name)
        self._len -= 1

    def move_before(self, node: Node, anchor: Node) -> None:
        """Move ``node`` just before ``anchor`` (keeps its uses)."""
        self._check_member(node)
        self._check_member(anchor)
        if node is anchor:
            return
        self._detach_links(node)
        self._len -= 1
        self._link(node, before=anchor, after=None)

    def _detach_links(self, node: Node) -> None:
        if node._prev is not None:
            node._prev._next = node._next
        else:
            self._head = node._next
        if node._next is not None:
            node._next._prev = node._prev
        else:
            self._tail = node._prev
        node._prev = node._next = None

    def topological_sort(self) -> None:
        """Reorder nodes topologically (stable: keeps the current order where it is valid).

        Raises GraphError naming a node on a cycle.
        """
        nodes = self.node_list()
        index = {n: i for i, n in enumerate(nodes)}
        indeg: dict[Node, int] = {}
        consumers: dict[Node, list[Node]] = {n: [] for n in nodes}
        for n in nodes:
            preds = set()
            for v in node_reads(n):
                p = v.producer
                if p is not None and p in index and p is not n:
                    preds.add(p)
            indeg[n] = len(preds)
            for p in preds:
                consumers[p].append(n)
        import heapq

        ready = [(index[n], n) for n in nodes if indeg[n] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for c in consumers[n]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(ready, (index[c], c))
        if len(order) != len(nodes):
            stuck = next(n for n in nodes if indeg[n] > 0)
            raise GraphError(f"graph '{self.name}' has a cycle through {stuck.describe()}")
        self._head = self._tail = None
        for i, n in enumerate(order):
            n._prev = order[i - 1] if i else None
            n._next = order[i + 1] if i + 1 < len(order) else None
        if order:
            self._head, self._tail = order[0], order[-1]

    def find_node(self, name: str) -> Node | None:
        for n in self._iter():
            if n.name == name:
                return n
        return None

    def values(self) -> Iterator[Value]:
        """Every value: inputs, constants, node outputs."""
        yield from self.inputs
        yield from self.constants.values()
        for n in self._iter():
            yield from n.outputs

    def value_map(self) -> dict[str, Value]:
        return {v.name: v for v in self.values()}

    # -- whole-graph helpers ----------------------------------------------------------------------
    def verify(self) -> None:
        from .verify import verify_graph

        verify_graph(self)

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)

    def copy(self) -> Graph:
        """A deep copy (constants share their arrays, which the IR never mutates)."""
        return _copy_graph(self, None, {})

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self)} nodes>"


def node_reads(node: Node) -> Iterator[Value]:
    """Inputs of a node plus the outer values its subgraphs read (implicit captures)."""
    for v in node._inputs:
        if v is not None:
            yield v
    for g in node.subgraphs():
        yield from graph_captures(g)


def graph_captures(g: Graph) -> list[Value]:
    """Values of enclosing graphs that ``g`` (or a graph nested in it) reads, each once, in
    first-use order; an output of ``g`` that is an outer value counts as a read (``add_output``
    routes one through an Identity, but a pass may leave one)."""
    seen: dict[Value, None] = {}
    for n in g._iter():
        for v in node_reads(n):
            if v.graph is not g:
                seen.setdefault(v)
    for v in g.outputs:
        if v.graph is not g:
            seen.setdefault(v)
    return list(seen)


def _copy_graph(g: Graph, parent: Graph | None, vmap: dict[Value, Value]) -> Graph:
    new = Graph(g.name, parent=parent)
    if parent is None:
        new.opset_imports = dict(g.opset_imports)
    new.metadata = dict(g.metadata)
    for v in g.inputs:
        nv = new.add_input(v.name, v.type, default=g.input_defaults.get(v))
        nv.meta = dict(v.meta)
        vmap[v] = nv
    for name, v in g.constants.items():
        assert v.const_value is not None
        nv = new.add_constant(v.const_value, name)
        nv.type = v.type
        vmap[v] = nv
    for n in g._iter():
        attrs: dict[str, Any] = {}
        for k, a in n.attrs.items():
            if isinstance(a, Graph):
                attrs[k] = _copy_graph(a, new, vmap)
            elif isinstance(a, list) and a and all(isinstance(x, Graph) for x in a):
                attrs[k] = [_copy_graph(x, new, vmap) for x in a]
            else:
                attrs[k] = a
        nn = new.add_node(
            n.op_type,
            [vmap.get(v, v) if v is not None else None for v in n._inputs],
            attrs,
            domain=n.domain,
            name=n.name,
            output_names=[v.name for v in n.outputs],
            output_types=[v.type for v in n.outputs],
        )
        nn.meta = dict(n.meta)
        for a, b in zip(n.outputs, nn.outputs):
            b.meta = dict(a.meta)
            vmap[a] = b
    for v in g.outputs:
        new.outputs.append(vmap.get(v, v))
        new._output_set[vmap.get(v, v)] = None
    return new
