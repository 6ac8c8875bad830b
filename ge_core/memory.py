"""Memory planning data: tensor lifetimes over a schedule, plans, bounds and the plan verifier.

The core computes the problem (which intermediate tensors exist, their sizes and lifetimes) and
checks plans; planner plugins (``ge_register_memory_planners``) choose the offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import GEError
from .ir.graph import Graph, Node

DEFAULT_ALIGNMENT = 64


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass
class Buffer:
    """One intermediate tensor to place: alive from node ``start`` to node ``end`` (inclusive)."""

    name: str
    size: int
    start: int
    end: int

    def overlaps_in_time(self, other: Buffer) -> bool:
        return not (self.end < other.start or other.end < self.start)


@dataclass
class MemoryProblem:
    """The buffers of one schedule, plus what a planner may take into account."""

    buffers: list[Buffer]
    alignment: int = DEFAULT_ALIGNMENT
    #: Per buffer, the stream of its producer (for planners that respect streams).
    streams: dict[str, int] = field(default_factory=dict)
    #: Buffers whose size is not static (placed outside the arena, at run time).
    dynamic: list[str] = field(default_factory=list)


@dataclass
class MemoryPlan:
    """Offsets of buffers in one arena."""

    offsets: dict[str, int]
    arena_bytes: int
    planner: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"planner": self.planner, "arena_bytes": self.arena_bytes, "offsets": dict(self.offsets)}


def build_problem(graph: Graph, order: Sequence[Node], alignment: int = DEFAULT_ALIGNMENT) -> MemoryProblem:
    """Lifetimes of every node output (not graph inputs, constants or graph outputs).

    A value lives from its producer's position to its last reader's position; a value nobody
    reads lives only at its producer. Graph outputs are returned to the caller, so they are not
    placed in the reused arena.
    """
    pos = {n: i for i, n in enumerate(order)}
    owner: dict[Graph, int] = {}  # subgraph -> position of the node holding it
    for n, i in pos.items():
        for sub in n.subgraphs():
            _own(sub, i, owner)
    outputs = set(graph.outputs)
    buffers: list[Buffer] = []
    dynamic: list[str] = []
    for node in order:
        i = pos[node]
        for v in node.outputs:
            if v in outputs:
                continue
            size = v.type.nbytes
            if size is None:
                dynamic.append(v.name)
                continue
            end = i
            for user, _ in v._uses:
                p = pos.get(user)
                if p is None:  # read inside a subgraph: alive until the node holding it runs
                    p = owner.get(user.graph) if user.graph is not None else None
                if p is not None and p > end:
                    end = p
            buffers.append(Buffer(v.name, size, i, end))
    return MemoryProblem(buffers, alignment, dynamic=dynamic)


def _own(sub: Graph, pos: int, owner: dict[Graph, int]) -> None:
    owner[sub] = pos
    for n in sub.nodes:
        for s in n.subgraphs():
            _own(s, pos, owner)


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
    return sum(align_up(b.size, problem.alignment) for b in problem.buffers)


def verify_plan(problem: MemoryProblem, plan: MemoryPlan) -> None:
    """Raise GEError if two buffers alive at once overlap, or a buffer leaves the arena."""
    bufs = sorted(problem.buffers, key=lambda b: b.start)
    for b in bufs:
        if b.name not in plan.offsets:
            raise GEError(f"memory plan by '{plan.planner}' misses buffer '{b.name}'")
        off = plan.offsets[b.name]
        if off < 0 or off % problem.alignment or off + b.size > plan.arena_bytes:
            raise GEError(
                f"memory plan by '{plan.planner}': buffer '{b.name}' at {off}+{b.size} is misaligned or "
                f"outside the arena of {plan.arena_bytes} bytes"
            )
    # sweep over time; compare each buffer with the ones alive when it starts
    import heapq

    alive: list[tuple[int, int, Buffer]] = []
    for i, b in enumerate(bufs):
        while alive and alive[0][0] < b.start:
            heapq.heappop(alive)
        ob = plan.offsets[b.name]
        for _, _, a in alive:
            oa = plan.offsets[a.name]
            if ob < oa + a.size and oa < ob + b.size:
                raise GEError(
                    f"memory plan by '{plan.planner}' overlaps '{a.name}' [{oa}, {oa + a.size}) and "
                    f"'{b.name}' [{ob}, {ob + b.size}) while both are alive"
                )
        heapq.heappush(alive, (b.end, i, b))
