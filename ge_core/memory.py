"""Memory planning data: tensor lifetimes over a schedule, plans, bounds and the plan verifier.

The core computes the problem (which intermediate tensors exist, their sizes and lifetimes,
which of them share bytes: views, in-place outputs, concat inputs, as ``OpDef.alias`` says) and
checks plans; planner plugins (``ge_register_memory_planners``) choose the offsets. How sharing
and streams shape the problem is described in ``docs/memory.md``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sortedcontainers

from .errors import GEError, GraphError, OptionError, SecurityError
from .ir import symbolic as sym
from .ir.graph import Graph, Node, Value
from .options import CompileOptions
from .schedule import HappensBefore, StreamAssignment

DEFAULT_ALIGNMENT = 64

#: Arenas (bytes) must be smaller than this: what an .om stores and loads (256 TiB). A static shape
#: can claim far more (a ConstantOfShape of [2**31, 2**16, 2**16] floats is 2**65 bytes).
MAX_ARENA_BYTES = 1 << 48

def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def check_alignment(a: Any) -> int:
    """An arena alignment: a power of two from 16 to 1 MiB (64 by default, 512 as GE)."""
    try:
        v = int(a)
    except (TypeError, ValueError):
        raise GEError(f"memory alignment must be an integer, not {a!r}") from None
    if v < 16 or v > 1 << 20 or v & (v - 1):
        raise GEError(f"memory alignment must be a power of two between 16 and 1048576, not {v}",
                      hint="64 is the default; GE uses 512")
    return v


@dataclass
class Buffer:
    """One intermediate tensor to place: alive from node ``start`` to node ``end`` (inclusive).
    ``size`` is bytes, or in a symbolic problem an expression of the input symbols."""

    name: str
    size: Any
    start: int
    end: int


@dataclass
class MemoryProblem:
    """The buffers of one schedule, plus what a planner may take into account."""

    buffers: list[Buffer]
    alignment: int = DEFAULT_ALIGNMENT
    #: Per buffer, the stream of its producer (for planners that respect streams).
    streams: dict[str, int] = field(default_factory=dict)
    #: Buffers whose size is not static (placed outside the arena, at run time).
    dynamic: list[str] = field(default_factory=list)
    #: Values sharing a buffer's bytes: ``member -> (root buffer, byte offset in it, size)``.
    aliases: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    #: How each alias came about: ``member -> "view" | "inplace" | "concat"``.
    alias_kinds: dict[str, str] = field(default_factory=dict)

    @property
    def symbolic(self) -> bool:
        """True when some size is an expression of the input symbols (see :meth:`bind`)."""
        return any(not isinstance(b.size, int) for b in self.buffers) or any(
            not isinstance(n, int) for _, _, n in self.aliases.values())

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for b in self.buffers:
            out |= sym.symbols_of(b.size)
        return out

    def bind(self, binding: dict[str, int]) -> MemoryProblem:
        """The problem at one value of every symbol: every size in bytes (GEError for a size that
        is negative there, or too large for an arena)."""
        def size(name: str, e: Any) -> int:
            n = sym.evaluate(e, binding)
            if not 0 <= n < MAX_ARENA_BYTES:
                raise GEError(f"buffer '{name}' takes {n} bytes at {_binding_text(binding)}, outside 0..{MAX_ARENA_BYTES}",
                              hint="check the input shapes against the model")
            return n
        return MemoryProblem([Buffer(b.name, size(b.name, b.size), b.start, b.end) for b in self.buffers],
                             self.alignment, dict(self.streams), list(self.dynamic),
                             {m: (r, off, size(m, n)) for m, (r, off, n) in self.aliases.items()}, dict(self.alias_kinds))


def _binding_text(binding: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(binding.items())) or "no symbols"


@dataclass
class MemoryPlan:
    """Offsets of buffers in one arena (after :func:`expand_plan`, of every shared value too)."""

    offsets: dict[str, int]
    arena_bytes: int
    planner: str = ""
    #: Planner statistics (e.g. the arena each candidate of ``auto`` reached).
    stats: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"planner": self.planner, "arena_bytes": self.arena_bytes, "offsets": dict(self.offsets)}
        if self.stats:
            d["stats"] = dict(self.stats)
        return d


def value_size(v: Value, symbols: set[str] | None = None) -> Any:
    """Bytes of a value that can live in an arena (fixed-size dtype, static shape), else None.

    With ``symbols`` (the symbols a run binds: the graph inputs' symbolic dims) a shape whose dims
    are expressions of those symbols has a size too: an expression (:mod:`ge_core.ir.symbolic`)."""
    t = v.type
    if t is None or t.dtype is None or t.dtype.kind in "OUSV":
        return None
    if symbols is None or t.shape is None or t.is_static:
        return t.nbytes
    if None in t.shape or not t.symbols <= symbols:
        return None
    return sym.mul(sym.prod(t.shape), t.dtype.itemsize)


def input_symbols(graph: Graph) -> set[str]:
    """The symbols a run binds: symbolic dims of the graph's inputs (plain names, each a dim)."""
    return {d for v in graph.inputs for d in (v.type.shape or ()) if isinstance(d, str)}


def build_problem(
    graph: Graph,
    order: Sequence[Node],
    alignment: int = DEFAULT_ALIGNMENT,
    *,
    streams: Any = None,
    alias: Callable[[Node], str] | None = None,
    share: bool = False,
) -> MemoryProblem:
    """Lifetimes of every node output (not graph inputs, constants or graph outputs).

    A value lives from its producer's position to its last reader's position; a value nobody
    reads lives only at its producer. Graph outputs are returned to the caller, so they are not
    placed in the reused arena. ``streams`` (a :class:`ge_core.schedule.StreamAssignment`)
    extends lifetimes across streams (see the module docstring); ``share`` groups views,
    in-place outputs and concat inputs, as ``alias(node)`` (the node's ``OpDef.aliasing``) says.
    """
    pos = {n: i for i, n in enumerate(order)}
    owner: dict[Graph, int] = {}  # subgraph -> position of the node holding it
    for n, i in pos.items():
        for sub in n.subgraphs():
            owner[sub] = i
            owner.update((s, i) for m in sub.walk() for s in m.subgraphs())
    outputs = set(graph.outputs)
    bound = input_symbols(graph)
    sizes: dict[str, Any] = {}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    dynamic: list[str] = []
    for node in order:
        i = pos[node]
        for v in node.outputs:
            if v in outputs:
                continue
            size = value_size(v, bound)
            if size is None:
                dynamic.append(v.name)
                continue
            if isinstance(size, int) and size >= MAX_ARENA_BYTES:
                raise SecurityError(
                    f"output '{v.name}' of {node.describe()} is {v.type}: {size} bytes, too large for a memory "
                    f"arena (less than {MAX_ARENA_BYTES} bytes, 256 TiB)",
                    hint="the model's shapes are wrong or hostile: check the shape inputs of that node (and the "
                         "input_shape option, if given)",
                )
            e = i
            rs = []
            for user, _ in v.uses():
                p = pos.get(user)
                if p is None:  # read inside a subgraph: alive until the node holding it runs
                    p = owner.get(user.graph) if user.graph is not None else None
                if p is not None:
                    rs.append(p)
                    e = max(e, p)
            sizes[v.name], start[v.name], end[v.name] = size, i, e
            readers[v.name] = rs
    stream_of = list(streams.streams) if streams is not None and len(getattr(streams, "streams", ())) == len(order) else None
    multi = stream_of is not None and len(set(stream_of)) > 1
    if multi:
        assert stream_of is not None
        end = _extend_across_streams(order, stream_of, list(streams.events), start, end, readers)
    groups = _Groups(sizes)
    if share:
        _share(order, pos, groups, sizes, end, alias or _no_alias, stream_of, inplace=not multi)
    # one buffer per group root
    bstart: dict[str, int] = {}
    bend: dict[str, int] = {}
    for name in sizes:
        r, _ = groups.find(name)
        bstart[r] = min(bstart.get(r, start[name]), start[name])
        bend[r] = max(bend.get(r, end[name]), end[name])
    buffers = [Buffer(name, sizes[name], bstart[name], bend[name]) for name in sizes if name in bstart]
    aliases = {}
    for name in sizes:
        r, off = groups.find(name)
        if r != name:
            aliases[name] = (r, off, sizes[name])
    prob = MemoryProblem(buffers, alignment, dynamic=dynamic, aliases=aliases, alias_kinds=dict(groups.kind))
    if stream_of is not None:
        by_name = {v.name: stream_of[pos[n]] for n in order for v in n.outputs}
        prob.streams = {b.name: by_name.get(b.name, 0) for b in buffers}
    return prob


#: ``graph.metadata`` key of the input symbols' ranges (``{symbol: [lo, hi or None]}``).
DIM_RANGES = "ge.dim_ranges"


def dim_ranges(g: Graph) -> dict[str, tuple[int, int | None]]:
    """The ranges of the input symbols (``ge_sdk.shapes.apply_input_shapes``), checked as data from outside:
    GraphError for anything but ``{symbol: [lo >= 0, hi >= lo or None]}`` of the graph's symbols."""
    raw = g.metadata.get(DIM_RANGES)
    if raw is None:
        return {}
    ok = isinstance(raw, dict) and len(raw) <= 1024
    out: dict[str, tuple[int, int | None]] = {}
    for k, r in (raw.items() if ok else ()):
        good = (isinstance(k, str) and isinstance(r, (list, tuple)) and len(r) == 2
                and all(x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in r)
                and isinstance(r[0], int) and r[0] >= 0 and (r[1] is None or r[1] >= r[0]))
        if not good:
            ok = False
            break
        out[k] = (r[0], r[1])
    if not ok:
        raise GraphError(f"graph '{g.name}': metadata '{DIM_RANGES}' is not a table of dim ranges",
                         hint="recompile the model; ranges come from --input_shape (x:1~8,...)")
    return out


def reuse_enabled(options: CompileOptions) -> bool:
    return not (options.disable_reuse_memory or options.memory_optimize_level == "off")


def memory_problem(g: Graph, order, streams: StreamAssignment, options: CompileOptions, regs) -> MemoryProblem:
    """Lifetimes over the schedule; with reuse on, views, in-place outputs and concat inputs share bytes.

    The one way the memory problem of a compiled graph is built: the compiler plans it, and
    :func:`ge_core.om.load_om` rebuilds it from the loaded graph to verify the stored plan."""
    raw = options.extra.get("memory_alignment", DEFAULT_ALIGNMENT)
    try:
        alignment = check_alignment(raw)
    except GEError as e:
        raise OptionError(f"option memory_alignment: {e}", hint="64 is the default; GE uses 512") from None

    def alias(node):
        d = regs.ops.lookup(node.domain, node.op_type)
        return d.aliasing if d is not None else ""

    return build_problem(g, order, alignment, streams=streams, alias=alias, share=reuse_enabled(options))


class _Groups:
    """Union of values sharing bytes: ``parent[v] = (p, offset of v inside p)``."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.parent: dict[str, tuple[str, int]] = {}
        self.kind: dict[str, str] = {}
        self.sizes = sizes
        self.group_end: dict[str, int] = {}

    def find(self, v: str) -> tuple[str, int]:
        off = 0
        path = []
        x = v
        while x in self.parent:
            path.append(x)
            p, o = self.parent[x]
            off += o
            x = p
        # compress: every node on the path points at the root with its total offset
        acc = off
        for y in path:
            p, o = self.parent[y]
            self.parent[y] = (x, acc)
            acc -= o
        return x, off

    def join(self, member: str, root_of: str, offset: int, kind: str, end: dict[str, int]) -> None:
        self.parent[member] = (root_of, offset)
        self.kind[member] = kind
        r, _ = self.find(root_of)
        e = max(self.end(member, end), self.end(r, end))
        self.group_end[r] = e

    def end(self, root: str, end: dict[str, int]) -> int:
        return self.group_end.get(root, end.get(root, -1))


def _no_alias(node: Node) -> str:
    return ""


def _share(order, pos, groups: _Groups, sizes, end, alias: Callable[[Node], str], stream_of, *, inplace: bool) -> None:
    def same_stream(node, v) -> bool:
        if stream_of is None or v.producer is None or v.producer not in pos:
            return True
        return stream_of[pos[node]] == stream_of[pos[v.producer]]

    for node in order:
        i = pos[node]
        if not node.outputs:
            continue
        out = node.outputs[0]
        if out.name not in sizes:
            continue
        kind = alias(node)
        if kind == "view" and node.inputs and node.inputs[0] is not None:
            x = node.inputs[0]
            if x.name in sizes and sizes[x.name] == sizes[out.name] and same_stream(node, x):
                r, off = groups.find(x.name)
                groups.join(out.name, r, off, "view", end)
            continue
        if kind == "concat":
            _share_concat(node, groups, sizes, end, same_stream)
            continue
        if inplace and kind == "inplace":
            for x in node.inputs:
                if x is None or x.name not in sizes or x.type.dtype != out.type.dtype or x.type.shape != out.type.shape:
                    continue
                r, off = groups.find(x.name)
                if groups.end(r, end) > i or sizes[x.name] != sizes[out.name]:
                    continue
                if not _reads_other_bytes(node, groups, sizes, r, off, sizes[x.name]):
                    groups.join(out.name, r, off, "inplace", end)
                    break


def _reads_other_bytes(node: Node, groups: _Groups, sizes, root: str, off: int, n: int) -> bool:
    """True if ``node`` reads bytes of group ``root`` other than exactly ``[off, off + n)``."""
    for y in node.inputs:
        if y is not None and y.name in sizes:
            ry, oy = groups.find(y.name)
            if ry == root and (oy != off or sizes[y.name] != n):
                return True
    return False


def _share_concat(node: Node, groups: _Groups, sizes, end, same_stream) -> None:
    out = node.outputs[0]
    shape = out.type.shape
    if shape is None or not all(isinstance(d, int) for d in shape) or not shape:
        return
    axis = int(node.attrs.get("axis", 0))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape) or math.prod(shape[:axis]) != 1:
        return
    k = 0
    for x in node.inputs:
        if x is None:
            continue
        n = value_size(x)
        if n is None:
            return
        if x.name in sizes and same_stream(node, x):
            r, off = groups.find(x.name)
            if off == 0 and sizes[r] == n and r != out.name and groups.find(out.name)[0] != r:
                groups.join(r, out.name, k, "concat", end)
        k += n


def _extend_across_streams(order, stream_of, events, start, end, readers) -> dict[str, int]:
    """Per buffer, the last position at which a node may still run unordered with its reads.

    The happens-before clocks of the streams (:class:`ge_core.schedule.HappensBefore`) give, for
    each node and stream, the latest node of that stream ordered before it (through events,
    transitively); on its own stream a node is its own latest.
    """
    n = len(order)
    hb = HappensBefore(StreamAssignment(list(stream_of), [(a, b) for a, b in events if 0 <= a < b < n]))
    k = max(stream_of) + 1
    positions: list[list[int]] = [[] for _ in range(k)]
    for i, s in enumerate(stream_of):
        positions[s].append(i)

    def latest_before(p: int, s: int) -> int:
        if s == stream_of[p]:
            return p
        c = hb.clock[p][s]
        return positions[s][c] if c >= 0 else -1

    # col[t][s][j]: latest position of stream s ordered before the j-th node of stream t
    col = [[[latest_before(p, s) for p in positions[t]] for s in range(k)] for t in range(k)]
    new_end = dict(end)
    for name, rs in readers.items():
        uses = set(rs)
        uses.add(start[name])
        latest = end[name]
        for t, pt in enumerate(positions):
            if not pt:
                continue
            first = max(bisect.bisect_left(col[t][stream_of[u]], u) for u in uses)
            latest = max(latest, pt[first] - 1 if first < len(pt) else pt[-1])
        new_end[name] = latest
    return new_end


def expand_plan(problem: MemoryProblem, plan: MemoryPlan) -> MemoryPlan:
    """Give every shared value (``problem.aliases``) its absolute offset in ``plan``."""
    for member, (root, off, _) in problem.aliases.items():
        if root in plan.offsets:
            plan.offsets[member] = plan.offsets[root] + off
    return plan


def lower_bound(problem: MemoryProblem) -> int:
    """Largest total (aligned) size of buffers alive at one step: no plan can be smaller."""
    if not problem.buffers:
        return 0
    n = max(b.end for b in problem.buffers) + 2
    delta = [0] * n
    for b in problem.buffers:
        s = align_up(b.size, problem.alignment)
        delta[b.start] += s
        delta[b.end + 1] -= s
    best = cur = 0
    for d in delta:
        cur += d
        best = max(best, cur)
    return best


def no_reuse_bytes(problem: MemoryProblem) -> int:
    """Every intermediate tensor in its own (aligned) range, shared values included."""
    a = problem.alignment
    return sum(align_up(b.size, a) for b in problem.buffers) + sum(align_up(n, a) for _, _, n in problem.aliases.values())


class SortedList(sortedcontainers.SortedList):
    """Sorted keys, duplicates allowed (the ``sortedcontainers`` package: add and remove in
    O(log n)), with the neighbour queries the planners and :func:`verify_plan` ask."""

    def last(self) -> Any:
        """The largest key, or None."""
        return self[-1] if self else None

    def floor(self, x: Any) -> Any:
        """The largest key <= x, or None."""
        i = self.bisect_right(x)
        return self[i - 1] if i else None

    def lower(self, x: Any) -> Any:
        """The largest key < x, or None."""
        i = self.bisect_left(x)
        return self[i - 1] if i else None

    def ceiling(self, x: Any) -> Any:
        """The smallest key >= x, or None."""
        i = self.bisect_left(x)
        return self[i] if i < len(self) else None

    def higher(self, x: Any) -> Any:
        """The smallest key > x, or None."""
        i = self.bisect_right(x)
        return self[i] if i < len(self) else None

    def pop_range(self, lo: Any, hi: Any) -> list[Any]:
        """Remove and return the keys in [lo, hi], in order."""
        i, j = self.bisect_left(lo), self.bisect_right(hi)
        out = list(self.islice(i, j))
        del self[i:j]
        return out


def _overlap_error(plan: MemoryPlan, a: Buffer, oa: int, b: Buffer, ob: int) -> GEError:
    return GEError(f"memory plan by '{plan.planner}' overlaps '{a.name}' [{oa}, {oa + a.size}) and "
                   f"'{b.name}' [{ob}, {ob + b.size}) while both are alive")


def verify_plan(problem: MemoryProblem, plan: MemoryPlan) -> None:
    """Raise GEError if two buffers alive at once overlap, or a buffer leaves the arena.

    Shared values are checked to lie inside their buffer at the offset the problem gives; the
    plan places exactly the problem's buffers and shared values (after :func:`expand_plan`), and
    its arena is no larger than every buffer side by side. The compiler checks each planner's
    plan with it, and the .om loader each stored plan, against the problem rebuilt from the graph.
    """
    if problem.symbolic:
        raise GEError(f"the memory plan by '{plan.planner}' gives fixed offsets to buffers whose sizes depend on "
                      "the input shapes (a symbolic problem needs a symbolic plan)")
    if plan.arena_bytes >= MAX_ARENA_BYTES:
        raise SecurityError(f"the memory plan by '{plan.planner}' needs an arena of {plan.arena_bytes} bytes; an arena "
                            f"must be smaller than {MAX_ARENA_BYTES} bytes (256 TiB)",
                            hint="the model's shapes are wrong or hostile (check the input_shape option, if given)")
    most = no_reuse_bytes(problem)
    if plan.arena_bytes > most:
        raise GEError(f"the memory plan by '{plan.planner}' claims an arena of {plan.arena_bytes} bytes, more than the "
                      f"{most} that every buffer side by side needs")
    bufs = sorted(problem.buffers, key=lambda b: b.start)
    known = {b.name for b in bufs}
    for name in plan.offsets:
        if name not in known and name not in problem.aliases:
            raise GEError(f"memory plan by '{plan.planner}' places '{str(name)[:200]}', which is no intermediate "
                          f"buffer of the schedule (a graph input, output, constant, dynamic or unknown value must "
                          f"not live in the arena)")
    for b in bufs:
        if b.name not in plan.offsets:
            raise GEError(f"memory plan by '{plan.planner}' misses buffer '{b.name}'")
        off = plan.offsets[b.name]
        if off < 0 or off % problem.alignment or off + b.size > plan.arena_bytes:
            raise GEError(f"memory plan by '{plan.planner}': buffer '{b.name}' at {off}+{b.size} is misaligned or "
                          f"outside the arena of {plan.arena_bytes} bytes")
    sizes = {b.name: b.size for b in problem.buffers}
    for member, (root, off, size) in problem.aliases.items():
        if root not in sizes:
            raise GEError(f"memory problem: '{member}' shares the bytes of '{root}', which is no buffer")
        if off < 0 or off + size > sizes[root]:
            raise GEError(f"memory problem: '{member}' at {off}+{size} leaves its buffer '{root}' of {sizes[root]} bytes")
        if member not in plan.offsets:
            raise GEError(f"memory plan by '{plan.planner}' misses '{member}', which shares the bytes of '{root}' "
                          "(expand_plan gives it its offset)")
        if plan.offsets[member] != plan.offsets[root] + off:
            raise GEError(f"memory plan by '{plan.planner}' places '{member}' apart from '{root}', whose bytes it shares")
    # Sweep over time (buffers by start) with the live buffers also in offset order. While no two
    # live buffers overlap, those of nonzero size are disjoint ranges, so a new buffer overlaps one
    # of them only if it overlaps its neighbour below or above: O(n log n), where comparing it with
    # every live buffer was quadratic in the buffers alive at once (a wide graph's .om took minutes
    # to load). A zero-size buffer at x overlaps [o, o + n) when o < x < o + n: those live apart.
    offsets = plan.offsets
    alive: list[tuple[int, int, Buffer]] = []  # heap by end
    ranges = SortedList()  # offsets of the live buffers of nonzero size ...
    top: dict[int, int] = {}  # ... and their ends
    points = SortedList()  # offsets of the live buffers of size zero
    for i, b in enumerate(bufs):
        while alive and alive[0][0] < b.start:
            _, _, a = heapq.heappop(alive)
            oa = offsets[a.name]
            if a.size:
                ranges.remove(oa)
                del top[oa]
            else:
                points.remove(oa)
        ob = offsets[b.name]
        if b.size:
            below, above, point = ranges.floor(ob), ranges.higher(ob), points.higher(ob)
            bad = ((below is not None and top[below] > ob) or (above is not None and above < ob + b.size)
                   or (point is not None and point < ob + b.size))
        else:
            below = ranges.lower(ob)
            bad = below is not None and top[below] > ob
        if bad:
            for _, _, a in alive:  # name the pair that comparing with every live buffer names
                oa = offsets[a.name]
                if ob < oa + a.size and oa < ob + b.size:
                    raise _overlap_error(plan, a, oa, b, ob)
            raise GEError(f"memory plan by '{plan.planner}' overlaps '{b.name}' with a buffer alive with it")
        if b.size:
            ranges.add(ob)
            top[ob] = ob + b.size
        else:
            points.add(ob)
        heapq.heappush(alive, (b.end, i, b))


# ------------------------------------------------------------------------------------------------
# symbolic plans: one plan for every value of the input symbols
# ------------------------------------------------------------------------------------------------
#: At most this many placement orders in a symbolic plan (and reference bindings planned).
MAX_ORDERS = 8
#: The memory planner registry's name of the strategy that plans a symbolic problem (given the
#: concrete planner the ``memory_planner`` option chose): ``ge_memory`` registers it.
SYMBOLIC_PLANNER = "symbolic"


@dataclass
class SymbolicPlan:
    """A memory plan for a problem whose sizes are expressions of the input symbols.

    It is a few *placement orders* (each a permutation of the buffers), planned once at compile
    time by a concrete planner at reference values of the symbols. At a run's values each order
    places every buffer, in turn, just above the buffers before it in the order that are alive
    at the same time (:func:`place_in_order`); the plan takes the order with the smallest arena.
    That placement never overlaps two live buffers whatever the sizes are, so the plan holds for
    every value of the symbols: the loader checks only that each order is a permutation, and a
    run checks its concrete plan (:meth:`at`). At a reference binding the order reproduces its
    planner's arena or better.
    """

    orders: list[list[str]]
    planner: str = ""
    #: The bindings the orders were planned at, and the arena each reached there.
    references: list[dict[str, int]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    #: The problem the plan places (set by the compiler and the loader; not stored).
    problem: MemoryProblem | None = None
    _below: list[list[list[int]]] | None = field(default=None, repr=False)

    @property
    def arena_bytes(self) -> int:
        """The arena at the largest reference binding (what a report shows)."""
        return int(self.stats.get("arena_at_largest", 0))

    @property
    def offsets(self) -> dict[str, int]:
        return {}

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"planner": self.planner, "symbolic": True, "orders": [list(o) for o in self.orders],
                             "references": [dict(r) for r in self.references]}
        if self.stats:
            d["stats"] = dict(self.stats)
        return d

    def at(self, binding: dict[str, int]) -> MemoryPlan:
        """The concrete plan at ``binding`` (every input symbol bound to its run's value), verified."""
        problem = self.problem
        if problem is None:
            raise GEError("a symbolic memory plan was used without its problem")
        concrete = problem.bind(binding)
        if self._below is None:
            self._below = [_below_lists(problem.buffers, order) for order in self.orders]
        best: MemoryPlan | None = None
        for k, order in enumerate(self.orders):
            plan = place_in_order(concrete, order, self._below[k], f"{self.planner} (order {k})")
            if best is None or plan.arena_bytes < best.arena_bytes:
                best = plan
        assert best is not None
        expand_plan(concrete, best)
        verify_plan(concrete, best)
        return best


def _below_lists(buffers: Sequence[Buffer], order: Sequence[str]) -> list[list[int]]:
    """Per position in ``order``, the earlier positions a buffer must lie above: of the earlier
    buffers alive at the same time, those placed last among the ones alive at some step of its
    lifetime.

    Every other earlier buffer alive with it lies below one of these at every binding (a buffer
    placed later and alive at a common step lies above it), so :func:`place_in_order` gives the
    same offsets as with all of them. It is the skyline over time: the steps as pieces, each
    owned by the buffer placed last over it; placing a buffer reads the owners of the pieces over
    its lifetime and makes them one piece of its own. Each placement adds at most two pieces, so
    the lists hold at most 3n positions in all and take O(n log n) to find (all the earlier
    buffers alive at once were n^2 / 2 for a wide graph)."""
    by_name = {b.name: b for b in buffers}
    starts = sorted({b.start for b in buffers})
    # steps as ranks of the distinct starts: two lifetimes meet iff the later start is in both
    spans = [(bisect.bisect_left(starts, by_name[n].start), bisect.bisect_right(starts, by_name[n].end) - 1)
             for n in order]
    steps = len(starts)
    owner = [-1] * (steps + 1)  # per piece start, the buffer placed last over it
    pieces = SortedList([0])
    out: list[list[int]] = []
    for i, (s, e) in enumerate(spans):
        first = pieces.floor(s)
        inner = pieces.pop_range(s + 1, e)
        last = owner[first]
        below = [last] if last >= 0 else []
        for k in inner:
            o = owner[k]
            if o >= 0 and o != last:
                below.append(o)
            last = o
        if e + 1 < steps and pieces.ceiling(e + 1) != e + 1:
            pieces.add(e + 1)
            owner[e + 1] = last
        if first < s:
            pieces.add(s)
        owner[s] = i
        out.append(below)
    return out


def place_in_order(problem: MemoryProblem, order: Sequence[str], below: Sequence[Sequence[int]] | None = None,
                   name: str = "order") -> MemoryPlan:
    """Place the buffers of a concrete problem in ``order``, each just above (aligned) every
    earlier buffer of the order alive at the same time; ``below`` is :func:`_below_lists`."""
    if below is None:
        below = _below_lists(problem.buffers, order)
    size = {b.name: b.size for b in problem.buffers}
    a = problem.alignment
    top = [0] * len(order)
    offsets: dict[str, int] = {}
    arena = 0
    for i, n in enumerate(order):
        off = 0
        for j in below[i]:
            if top[j] > off:
                off = top[j]
        off = align_up(off, a)
        offsets[n] = off
        top[i] = off + size[n]
        arena = max(arena, align_up(top[i], a))
    return MemoryPlan(offsets, arena, name)


def verify_symbolic_plan(problem: MemoryProblem, plan: SymbolicPlan) -> None:
    """Raise GEError unless every order of ``plan`` is a permutation of the problem's buffers
    (which makes the placement valid at every binding) and the plan is valid at each reference."""
    names = [b.name for b in problem.buffers]
    want = set(names)
    if not 1 <= len(plan.orders) <= MAX_ORDERS:
        raise GEError(f"symbolic memory plan by '{plan.planner}' has {len(plan.orders)} orders (1..{MAX_ORDERS})")
    for k, order in enumerate(plan.orders):
        if len(order) != len(names) or set(order) != want:
            raise GEError(f"symbolic memory plan by '{plan.planner}': order {k} is not a permutation of the "
                          f"{len(names)} buffers of the schedule")
    symbols = problem.symbols()
    plan.problem = problem
    for b in plan.references:
        if set(b) != symbols:
            raise GEError(f"symbolic memory plan by '{plan.planner}': a reference binding names {sorted(b)[:8]}, "
                          f"the problem's symbols are {sorted(symbols)[:8]}")
        plan.problem = problem
        plan.at(b)
