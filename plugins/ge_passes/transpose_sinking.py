"""Transpose sinking: flip regions of layout-agnostic ops to the layout of the Transposes around
them, so that inverse Transpose pairs cancel (like onnxruntime's transpose optimizer).

Channels-last frontends (TensorFlow) wrap every NCHW op (Conv, pooling) in Transposes:
``T(NCHW->NHWC)`` after it, ``T(NHWC->NCHW)`` before the next one. Between them sit ops that do
not care about the layout: elementwise ops with per-channel constants (folded batch norms),
activations, residual Adds, Concats, Pads, reductions; ``merge_transposes`` never sees two
adjacent Transposes there.

A *region* is a connected set of such ops (joined by the values one computes and the next reads,
all of rank ``r``). Flipping it with a permutation ``P`` (``len(P) == r``) computes each of its
values ``v`` in the permuted layout ``v'``, ``v = Transpose(v', perm=P)``; its axes, constants and
the Transposes at its inputs and readers change with it (:meth:`_Region.apply`).
``keepdims=0`` reductions keeping their axes in order end a region: their output does not depend
on the layout (a global average pool before the classifier).

A region is flipped only when that lowers the graph's Transpose count (each Transpose added or
removed at its boundary counted once; one feeding several readers is never duplicated) and no
path through it gains Transposes (an added input Transpose never reaches an added output one).
Permuting values and constants is exact: results are bit-identical.

Last, a Transpose that only moves size-1 dims (``[1, 1, 1, C] -> [1, C, 1, 1]``, squeeze-excite
blocks) becomes a Reshape, which ``merge_reshapes`` folds into its neighbours.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.passes import Pass, PassContext, PassResult
from ge_sdk import quant
from ge_sdk.rewrite import Rewriter

from ._util import axes_of, default_domain, first_element, int_list, is_splat, opset_of, splat, walk_graphs

log = logging.getLogger("ge.passes")

#: Input 0 carries the layout; the others (Clip's bounds, CastLike's target) do not.
UNARY = frozenset(
    """
    Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Erf Exp Floor Log Neg Reciprocal Round
    Sigmoid Sign Sin Sinh Sqrt Tan Tanh Relu LeakyRelu Elu Selu Celu HardSigmoid HardSwish
    Softplus Softsign ThresholdedRelu Gelu Mish Not IsNaN IsInf BitwiseNot Shrink Cast CastLike
    Identity Clip
    """.split()
)
#: Every input carries the layout, with multidirectional (numpy) broadcasting.
BROADCAST = frozenset(
    """
    Add Sub Mul Div Pow Max Min Sum Mean And Or Xor Equal Greater Less GreaterOrEqual LessOrEqual
    PRelu Where Mod BitShift BitwiseAnd BitwiseOr BitwiseXor
    """.split()
)
REDUCE = frozenset(
    """
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare ReduceL1 ReduceL2
    ReduceLogSum ReduceLogSumExp
    """.split()
)
ARG = frozenset(("ArgMax", "ArgMin"))
SOFTMAX = frozenset(("Softmax", "LogSoftmax", "Hardmax"))


# ------------------------------------------------------------------------------------------------
# permutations
# ------------------------------------------------------------------------------------------------
def _identity(p: Sequence[int]) -> bool:
    return all(i == x for i, x in enumerate(p))


def _inverse(p: Sequence[int]) -> list[int]:
    q = [0] * len(p)
    for i, x in enumerate(p):
        q[x] = i
    return q


def _compose(inner: Sequence[int], outer: Sequence[int]) -> list[int]:
    """The perm of ``Transpose(Transpose(x, inner), outer)``."""
    return [inner[i] for i in outer]


def transpose_perm(node: Node) -> list[int] | None:
    """The permutation of a default-domain Transpose node, or None when it is not known or invalid."""
    if node.op_type != "Transpose" or not default_domain(node) or len(node.inputs) != 1 or len(node.outputs) != 1:
        return None
    x = node.inputs[0]
    rank = x.type.rank if x is not None else None
    p = node.attrs.get("perm")
    if p is None:
        return None if rank is None else list(range(rank))[::-1]
    try:
        perm = [int(i) for i in p]
    except (TypeError, ValueError):
        return None
    if sorted(perm) != list(range(len(perm))) or (rank is not None and rank != len(perm)):
        return None
    return perm


def unit_only(shape: Sequence[Any] | None, perm: Sequence[int]) -> bool:
    """True when transposing ``shape`` by ``perm`` only moves dims of size 1 (a Reshape does it)."""
    if shape is None or len(shape) != len(perm) or not all(isinstance(d, int) and d > 0 for d in shape):
        return False
    moved = [a for a in perm if shape[a] != 1]
    return moved == sorted(moved)


def _permuted_type(t: TensorType, q: Sequence[int]) -> TensorType:
    """The type of ``Transpose(v, q)`` for ``v`` of type ``t``."""
    if t.shape is None or len(t.shape) != len(q):
        return TensorType(t.dtype, None)
    return TensorType(t.dtype, tuple(t.shape[i] for i in q))


def _static_numel_one(v: Value) -> bool:
    t = v.type
    return t.shape is not None and all(d == 1 for d in t.shape)


def _norm_axes(axes: Iterable[int], r: int) -> list[int] | None:
    out = []
    for a in axes:
        a = int(a)
        if a < 0:
            a += r
        if not 0 <= a < r:
            return None
        out.append(a)
    return out if len(set(out)) == len(out) else None


# ------------------------------------------------------------------------------------------------
# which ops can run in either layout
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Flex:
    """How a node takes part in a region: its rank, which inputs carry the layout, and for a
    terminal (a ``keepdims=0`` reduction) the kept axes, whose order must survive the flip."""

    rank: int
    layout: tuple[int, ...]
    terminal: bool = False
    kept: tuple[int, ...] = ()


def _rank(v: Value | None) -> int | None:
    return None if v is None else v.type.rank


def flex_info(node: Node) -> Flex | None:
    """A :class:`Flex` when the node computes the same in any layout, else None."""
    fake_quant = quant.fake_quant_params(node) is not None  # (a quantised model's: elementwise, per tensor)
    if not (default_domain(node) or fake_quant) or node.subgraphs() or not node.outputs:
        return None
    op = node.op_type
    ins = node.inputs
    if op in UNARY or op in SOFTMAX or fake_quant:
        r = _rank(ins[0] if ins else None)
        if r is None or r < 1 or len(node.outputs) != 1 or node.output.type.rank != r:
            return None
        if op in SOFTMAX:
            if opset_of(node) < 13:
                return None  # before opset 13 the axis coerces to 2-D: not a single axis
            ax = _norm_axes([node.attrs.get("axis", -1)], r)
            if ax is None:
                return None
        return Flex(r, (0,))
    if op in BROADCAST:
        if len(node.outputs) != 1:
            return None
        r = node.output.type.rank
        if r is None or r < 1 or not ins:
            return None
        for x in ins:
            if x is None:
                return None
            k = x.type.rank
            if k is None or k > r:
                return None
            if k < r and not (x.is_constant or _static_numel_one(x)):
                return None  # a lower-rank tensor that broadcasts: needs an Unsqueeze, not handled
        return Flex(r, tuple(range(len(ins))))
    if op == "Concat":
        if len(node.outputs) != 1 or not ins:
            return None
        r = node.output.type.rank
        if r is None or r < 1 or any(x is None or x.type.rank != r for x in ins):
            return None
        if _norm_axes([node.attrs.get("axis", 0)], r) is None:
            return None
        return Flex(r, tuple(range(len(ins))))
    if op == "Split":
        r = _rank(ins[0] if ins else None)
        if r is None or r < 1 or any(o.type.rank != r for o in node.outputs):
            return None
        if _norm_axes([node.attrs.get("axis", 0)], r) is None:
            return None
        return Flex(r, (0,))
    if op in REDUCE or op in ARG:
        r = _rank(ins[0] if ins else None)
        if r is None or r < 1 or len(node.outputs) != 1:
            return None
        if op in ARG:
            axes = _norm_axes([node.attrs.get("axis", 0)], r)
        else:
            raw = axes_of(node)
            if raw is None:
                return None
            axes = _norm_axes(raw, r)
            if axes is not None and not axes:
                if int(node.attrs.get("noop_with_empty_axes", 0)):
                    return Flex(r, (0,)) if node.output.type.rank == r else None  # the identity
                axes = list(range(r))
        if axes is None:
            return None
        if int(node.attrs.get("keepdims", 1)):
            return Flex(r, (0,)) if node.output.type.rank == r else None
        kept = tuple(i for i in range(r) if i not in axes)
        return Flex(r, (0,), terminal=True, kept=kept)
    if op == "Pad":
        r = _rank(ins[0] if ins else None)
        if r is None or r < 1 or len(node.outputs) != 1 or node.output.type.rank != r:
            return None
        if opset_of(node) < 11:
            pads = node.attrs.get("pads")
            return Flex(r, (0,)) if pads is not None and len(pads) == 2 * r else None
        pads_v = int_list(ins[1].const_value if len(ins) > 1 and ins[1] is not None else None)
        if pads_v is None:
            return None
        if len(ins) > 3 and ins[3] is not None:
            axes_v = int_list(ins[3].const_value)
            if axes_v is None or _norm_axes(axes_v, r) is None or len(pads_v) != 2 * len(axes_v):
                return None
        elif len(pads_v) != 2 * r:
            return None
        return Flex(r, (0,))
    if op == "Slice":
        r = _rank(ins[0] if ins else None)
        if r is None or r < 1 or len(node.outputs) != 1 or node.output.type.rank != r:
            return None
        return Flex(r, (0,)) if _slice_axes(node, r) is not None else None
    return None


def _slice_axes(node: Node, r: int) -> list[int] | None:
    """The normalised axes of a Slice (given, or implied by the number of starts)."""
    ins = node.inputs
    if opset_of(node) < 10:
        starts = node.attrs.get("starts")
        if starts is None:
            return None
        axes = node.attrs.get("axes", list(range(len(starts))))
        return _norm_axes(axes, r) if len(axes) == len(starts) else None
    if len(ins) > 3 and ins[3] is not None:
        raw = int_list(ins[3].const_value)
        return None if raw is None else _norm_axes(raw, r)
    starts = ins[1] if len(ins) > 1 else None
    shape = starts.type.shape if starts is not None else None
    if shape is None or len(shape) != 1 or not isinstance(shape[0], int):
        return None
    return list(range(shape[0])) if shape[0] <= r else None


@dataclass
class Rewrite:
    """What a node becomes in the permuted layout: its attributes and the non-layout inputs to
    replace (index -> new constant array)."""

    attrs: dict[str, Any]
    inputs: dict[int, np.ndarray]


def rewrite_for(node: Node, f: Flex, p: Sequence[int]) -> Rewrite | None:
    """The attributes and constant inputs of ``node`` computing in the layout ``v'`` with
    ``v = Transpose(v', p)``; None when that is not legal for ``p``."""
    r = f.rank
    q = _inverse(p)
    attrs = dict(node.attrs)
    inputs: dict[int, np.ndarray] = {}
    op = node.op_type
    ins = node.inputs

    def move(axes: Sequence[int]) -> list[int]:
        return [p[a] for a in axes]

    if f.terminal:
        # the kept axes must keep their order, so that the output is the same tensor
        moved = move(f.kept)
        if moved != sorted(moved):
            return None
    if op in UNARY or op in BROADCAST or quant.fake_quant_params(node) is not None:
        return Rewrite(attrs, inputs)
    if op in SOFTMAX or op in ARG or op in ("Concat", "Split"):
        default = -1 if op in SOFTMAX else 0
        ax = _norm_axes([node.attrs.get("axis", default)], r)
        if ax is None:
            return None
        attrs["axis"] = p[ax[0]]
        return Rewrite(attrs, inputs)
    if op in REDUCE:
        raw = axes_of(node)
        axes = _norm_axes(raw, r) if raw is not None else None
        if axes is None:
            return None
        if not axes:
            return Rewrite(attrs, inputs)  # all axes (or the identity): nothing to move
        new = sorted(move(axes))
        if "axes" in node.attrs:
            attrs["axes"] = new
        else:
            inputs[1] = np.array(new, dtype=np.int64)
        return Rewrite(attrs, inputs)
    if op == "Pad":
        if opset_of(node) < 11:
            pads = [int(x) for x in node.attrs["pads"]]
            attrs["pads"] = [pads[q[j]] for j in range(r)] + [pads[r + q[j]] for j in range(r)]
            return Rewrite(attrs, inputs)
        if len(ins) > 3 and ins[3] is not None:
            axes_v = _norm_axes(int_list(ins[3].const_value) or [], r)
            if axes_v is None:
                return None
            inputs[3] = np.array(move(axes_v), dtype=np.int64)
            return Rewrite(attrs, inputs)
        pads_v = int_list(ins[1].const_value if ins[1] is not None else None)
        if pads_v is None or len(pads_v) != 2 * r:
            return None
        inputs[1] = np.array([pads_v[q[j]] for j in range(r)] + [pads_v[r + q[j]] for j in range(r)], dtype=np.int64)
        return Rewrite(attrs, inputs)
    if op == "Slice":
        axes_s = _slice_axes(node, r)
        if axes_s is None:
            return None
        if opset_of(node) < 10:
            attrs["axes"] = move(axes_s)
        else:
            inputs[3] = np.array(move(axes_s), dtype=np.int64)
        return Rewrite(attrs, inputs)
    return None


# ------------------------------------------------------------------------------------------------
# regions
# ------------------------------------------------------------------------------------------------
class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Node, Node] = {}

    def find(self, n: Node) -> Node:
        root = n
        while self.parent.get(root, root) is not root:
            root = self.parent[root]
        while n is not root:
            nxt = self.parent.get(n, n)
            self.parent[n] = root
            n = nxt
        return root

    def union(self, a: Node, b: Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[rb] = ra


class _Constants:
    """The constants one run of the pass adds: a permuted copy of a constant is made once and shared
    by every region reading it; names never probe through a long run of taken ones."""

    def __init__(self) -> None:
        self.permuted: dict[tuple[Value, tuple[int, ...]], Value] = {}

    @staticmethod
    def add(arr: np.ndarray, like: Value, fallback: Graph) -> Value:
        g = like.graph if like.graph is not None else fallback
        base = f"{like.name}_perm"
        return g.add_constant(arr) if base in g.names else g.add_constant(arr, base)


@dataclass
class _Plan:
    """A region flip for one permutation: its cost and what to do."""

    perm: list[int]
    delta: int
    rewrites: dict[Node, Rewrite]


class _Region:
    """A connected set of flexible nodes of one rank, in graph order."""

    def __init__(self, graph: Graph, nodes: list[Node], flex: dict[Node, Flex]) -> None:
        self.graph = graph
        self.nodes = nodes
        self.members = set(nodes)
        self.flex = flex
        self.rank = flex[nodes[0]].rank
        #: (node, input index) pairs where the region reads a value in its own layout
        self.positions = {(n, i) for n in nodes for i in flex[n].layout}
        #: Reshape takes its shape as an input (what a unit-dim move becomes) from opset 5
        self.reshape_ok = opset_of(nodes[0]) >= 5

    def internal(self, v: Value) -> bool:
        """True for a value computed by a non-terminal member (in the region's layout)."""
        p = v.producer
        return p is not None and p in self.members and not self.flex[p].terminal

    def boundary_inputs(self) -> list[Value]:
        seen: dict[Value, None] = {}
        for n in self.nodes:
            for i in self.flex[n].layout:
                x = n.inputs[i]
                if x is not None and not self.internal(x):
                    seen[x] = None
        return list(seen)

    def region_values(self) -> list[Value]:
        return [o for n in self.nodes if not self.flex[n].terminal for o in n.outputs]

    def outside_uses(self, v: Value) -> list[tuple[Node, int]]:
        return [(u, i) for u, i in v.uses() if (u, i) not in self.positions]

    def all_reads_inside(self, x: Value) -> bool:
        return not x.is_graph_output and all((u, i) in self.positions for u, i in x.uses())

    def reader_perm(self, u: Node, i: int) -> list[int] | None:
        """The perm of a Transpose of this graph that reads a region value, else None."""
        if i != 0 or u.graph is not self.graph:
            return None
        s = transpose_perm(u)
        return s if s is not None and len(s) == self.rank else None

    def source_perm(self, x: Value) -> list[int] | None:
        """The perm of the Transpose of this graph producing ``x``, else None."""
        t = x.producer
        if t is None or t.graph is not self.graph:
            return None
        s = transpose_perm(t)
        return s if s is not None and len(s) == self.rank else None

    def candidates(self) -> list[list[int]]:
        out: dict[tuple[int, ...], None] = {}
        for x in self.boundary_inputs():
            s = self.source_perm(x)
            if s is not None and not _identity(s):
                out[tuple(s)] = None
        for v in self.region_values():
            for u, i in self.outside_uses(v):
                s = self.reader_perm(u, i)
                if s is not None and not _identity(s):
                    out[tuple(_inverse(s))] = None
        return [list(p) for p in out]

    # -- cost ------------------------------------------------------------------------------------
    def input_cost(self, x: Value, p: Sequence[int]) -> int:
        """Transposes added (+1) or removed (-1) to read ``x`` in the permuted layout."""
        if x.is_constant or _static_numel_one(x):
            return 0
        s = self.source_perm(x)
        inside = self.all_reads_inside(x)
        if s is not None:
            c = _compose(s, _inverse(p))
            if _identity(c):
                return -1 if inside else 0
            return 0 if inside else 1  # the composed Transpose replaces the old one when it dies
        if self.reshape_ok and unit_only(x.type.shape, _inverse(p)):
            return 0
        return 1

    def output_cost(self, v: Value, p: Sequence[int]) -> tuple[int, bool]:
        """(Transposes removed among the readers of ``v`` outside the region, whether ``v`` must be
        rebuilt as ``Transpose(v', p)`` for the others)."""
        removed, rebuild = 0, v.is_graph_output
        for u, i in self.outside_uses(v):
            s = self.reader_perm(u, i)
            if s is not None:
                if _identity(_compose(p, s)):
                    removed += 1
            else:
                rebuild = True
        return removed, rebuild

    def plan(self, p: list[int]) -> _Plan | None:
        rewrites: dict[Node, Rewrite] = {}
        for n in self.nodes:
            rw = rewrite_for(n, self.flex[n], p)
            if rw is None:
                return None
            rewrites[n] = rw
        delta = 0
        added_in: list[Value] = []
        for x in self.boundary_inputs():
            c = self.input_cost(x, p)
            delta += c
            if c > 0:
                added_in.append(x)
        rebuilt: set[Node] = set()
        for v in self.region_values():
            removed, rebuild = self.output_cost(v, p)
            delta += int(rebuild) - removed
            if rebuild:
                assert v.producer is not None
                rebuilt.add(v.producer)
        if delta >= 0:
            return _Plan(p, delta, rewrites)
        if added_in and rebuilt and self._reaches(added_in, rebuilt):
            return None  # a path would gain Transposes
        return _Plan(p, delta, rewrites)

    def _reaches(self, sources: list[Value], targets: set[Node]) -> bool:
        """True when a member reading one of ``sources`` reaches a member in ``targets``."""
        stack = [u for x in sources for u, i in x.uses() if (u, i) in self.positions]
        seen: set[Node] = set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in targets:
                return True
            if self.flex[n].terminal:
                continue
            for o in n.outputs:
                stack.extend(u for u, i in o.uses() if (u, i) in self.positions)
        return False

    def best_plan(self) -> _Plan | None:
        best: _Plan | None = None
        for p in self.candidates():
            plan = self.plan(p)
            if plan is not None and plan.delta < 0 and (best is None or plan.delta < best.delta):
                best = plan
        return best

    # -- rewrite ---------------------------------------------------------------------------------
    def apply(self, plan: _Plan, rw: Rewriter, consts: _Constants) -> None:
        """Flip the region with ``plan.perm`` (``P``): each value ``v`` is computed as ``v'``,
        ``v = Transpose(v', perm=P)``.

        * axes, pads and per-axis attributes move with ``P`` (Concat/Split/Softmax axis, reduction
          axes, Pad pads, Slice axes);
        * constants are permuted (``[C]`` against NHWC becomes ``[C, 1, 1]`` against NCHW; lower-rank
          constants are first aligned to the right, so broadcasting stays exact);
        * an input ``Transpose(y, perm=P)`` becomes ``y`` (dead when only the region read it); another
          input gets ``Transpose(x, perm=inverse(P))``, or a Reshape where that only moves size-1 dims;
        * an outside reader ``Transpose(v, perm=inverse(P))`` becomes ``v'`` (it dies), another
          Transpose reader gets the composed permutation, any other reader (or graph output) reads one
          new shared ``Transpose(v', perm=P)``.
        """
        g = self.graph
        p = plan.perm
        q = _inverse(p)
        r = self.rank
        new_of: dict[Value, Value] = {}        # region value -> its permuted version
        rebuilt: dict[Value, Value] = {}       # region value -> Transpose(v', p), made on demand
        read_as: dict[Value, Value] = {}       # boundary input -> what the region reads instead
        terminals: list[tuple[Value, Value]] = []

        def rebuild(v: Value) -> Value:
            if v not in rebuilt:
                nv = new_of[v]
                assert nv.producer is not None
                t = g.add_node("Transpose", [nv], {"perm": list(p)}, name=f"{nv.producer.name}_back",
                               output_types=[v.type], after=nv.producer)
                rw.reinfer(t)
                rebuilt[v] = t.output
            return rebuilt[v]

        def read(x: Value, node: Node) -> Value:
            if x in new_of:
                return new_of[x]
            if x in read_as:
                return read_as[x]
            out = self._boundary(x, node, q, r, rw, consts)
            read_as[x] = out
            return out

        for n in self.nodes:
            f = self.flex[n]
            rewrite = plan.rewrites[n]
            ins: list[Value | None] = list(n.inputs)
            for i, x in enumerate(n.inputs):
                if x is None:
                    continue
                if i in f.layout:
                    ins[i] = read(x, n)
                elif self.internal(x):
                    ins[i] = rebuild(x)  # a region value read where the layout does not apply
            for i, arr in rewrite.inputs.items():
                while len(ins) <= i:
                    ins.append(None)
                old = n.inputs[i] if i < len(n.inputs) else None
                ins[i] = consts.add(arr, old if old is not None else n.outputs[0], g)
            types = [o.type if f.terminal else _permuted_type(o.type, q) for o in n.outputs]
            new = g.add_node(n.op_type, ins, rewrite.attrs, domain=n.domain, name=n.name,
                             num_outputs=len(n.outputs), output_types=types, before=n)
            rw.reinfer(new)
            for o, no in zip(n.outputs, new.outputs):
                if f.terminal:
                    terminals.append((o, no))
                else:
                    new_of[o] = no
        # readers outside the region
        for n in self.nodes:
            if self.flex[n].terminal:
                continue
            for v in n.outputs:
                nv = new_of[v]
                for u, i in self.outside_uses(v):
                    if u.graph is None or u.inputs[i] is not v:
                        continue
                    s = self.reader_perm(u, i)
                    if s is None:
                        u.set_input(i, rebuild(v))
                        continue
                    c = _compose(p, s)
                    if _identity(c):
                        u.output.replace_all_uses_with(nv)
                        u.set_input(0, None)
                        g.remove_node(u)
                    else:
                        u.set_input(0, nv)
                        u.attrs["perm"] = c
                    rw.push(u)
                if v.is_graph_output:
                    v.replace_all_uses_with(rebuild(v))
        for old, new_v in terminals:
            old.replace_all_uses_with(new_v)
        for n in reversed(self.nodes):
            rw.erase(n)
        rw.changed = True

    def _boundary(self, x: Value, node: Node, q: list[int], r: int, rw: Rewriter, consts: _Constants) -> Value:
        """What the region reads instead of the boundary input ``x`` (inserted before ``node``)."""
        g = self.graph
        if x.is_constant:
            key = (x, tuple(q))
            cached = consts.permuted.get(key)
            if cached is None or cached.graph is None:
                cached = consts.permuted[key] = self._permuted_constant(x, q, r, consts, g)
            return cached
        if _static_numel_one(x):
            return x
        s = self.source_perm(x)
        if s is not None:
            t = x.producer
            assert t is not None
            y = t.inputs[0]
            assert y is not None
            c = _compose(s, q)
            if _identity(c):
                return y
            n = g.add_node("Transpose", [y], {"perm": c}, name=f"{node.name}_in",
                           output_types=[_permuted_type(x.type, q)], before=node)
            rw.reinfer(n)
            return n.output
        out_type = _permuted_type(x.type, q)
        if self.reshape_ok and unit_only(x.type.shape, q) and out_type.shape is not None:
            shape = consts.add(np.array(out_type.shape, dtype=np.int64), x, g)
            n = g.add_node("Reshape", [x, shape], name=f"{node.name}_in", output_types=[out_type], before=node)
        else:
            n = g.add_node("Transpose", [x], {"perm": list(q)}, name=f"{node.name}_in",
                           output_types=[out_type], before=node)
        rw.reinfer(n)
        return n.output

    @staticmethod
    def _permuted_constant(x: Value, q: list[int], r: int, consts: _Constants, g: Graph) -> Value:
        a = x.const_value
        assert a is not None
        k = a.ndim
        if a.size == 1 and (k < r or all(d == 1 for d in a.shape)):
            return x  # broadcasts the same way in any layout
        full = a.reshape((1,) * (r - k) + a.shape)
        shape = tuple(full.shape[i] for i in q)
        # [C] against NHWC is [C, 1, 1] against NCHW: drop leading 1s, never below the constant's
        # own rank (exact: an operand of full rank keeps the output's rank)
        drop = 0
        while drop < r - k and shape[drop] == 1:
            drop += 1
        shape = shape[drop:]
        if a.size > 1 and is_splat(a):
            arr = splat(first_element(a), shape, dtype=a.dtype)  # still stores one element
        else:
            arr = np.ascontiguousarray(np.transpose(full, q)).reshape(shape)
        return consts.add(arr, x, g)


def find_regions(graph: Graph) -> list[_Region]:
    """The regions of flexible nodes of ``graph`` (not its subgraphs), in graph order."""
    flex: dict[Node, Flex] = {}
    order: list[Node] = []
    for n in graph.nodes:
        f = flex_info(n)
        if f is not None:
            flex[n] = f
            order.append(n)
    uf = _UnionFind()
    for n in order:
        f = flex[n]
        if f.terminal:
            continue
        for o in n.outputs:
            if o.type.rank != f.rank:
                continue
            for u, i in o.uses():
                g = flex.get(u)
                if g is not None and u.graph is graph and g.rank == f.rank and i in g.layout:
                    uf.union(n, u)
    groups: dict[Node, list[Node]] = {}
    for n in order:
        groups.setdefault(uf.find(n), []).append(n)
    return [_Region(graph, nodes, flex) for nodes in groups.values()]


def sink_transposes(graph: Graph, ctx: PassContext, max_rounds: int = 4) -> tuple[bool, int]:
    """Flip every region whose flip lowers the number of Transposes; returns (changed, removed)."""
    rw = Rewriter(graph, ctx)
    consts = _Constants()
    removed = 0
    for _ in range(max(1, max_rounds)):
        flipped = 0
        for region in find_regions(graph):
            if any(n.graph is None for n in region.nodes):
                continue
            try:
                plan = region.best_plan()
            except Exception as e:  # noqa: BLE001 - an odd graph: leave this region as it is
                log.debug("transpose sinking skips a region at %s: %s", region.nodes[0].describe(), e)
                continue
            if plan is None:
                continue
            region.apply(plan, rw, consts)
            flipped += 1
            removed -= plan.delta
        if not flipped:
            break
    # Transposes that only move dims of size 1 are Reshapes
    for n in graph.nodes:
        p = transpose_perm(n)
        x = n.inputs[0] if n.inputs else None
        if p is None or x is None or x.type.shape is None or _identity(p) or not unit_only(x.type.shape, p):
            continue
        if opset_of(n) < 5:
            break
        out = n.output
        target = consts.add(np.array([x.type.shape[i] for i in p], dtype=np.int64), out, graph)
        new = rw.add_node("Reshape", [x, target], before=n, like=out, output_type=out.type)
        if rw.replace_node(n, [new.output]):
            removed += 1
        else:
            rw.erase(new)  # a graph output whose name the Reshape cannot take: keep the Transpose
    return rw.changed, removed


class SinkTransposes(Pass):
    """Move Transposes across layout-agnostic ops so that inverse pairs meet and cancel."""

    name = "sink_transposes"
    after = ("fold_affine_into_batchnorm",)
    stage = "optimize"
    opt_level = 2
    fixed_point = True
    params = {"max_rounds": 4}
    description = ("flip regions of elementwise ops, Concat, Split, Pad, Slice, Softmax and reductions to the layout "
                   "of the Transposes around them when that lowers the number of Transposes; "
                   "unit-dim Transposes become Reshapes")

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        rounds = int(ctx.params.get("max_rounds", 4))
        changed = False
        removed = 0
        for g in list(walk_graphs(graph)):
            c, k = sink_transposes(g, ctx, rounds)
            changed |= c
            removed += k
        ctx.stats[self.name] = ctx.stats.get(self.name, 0) + removed
        return PassResult(changed, {"removed": removed})
