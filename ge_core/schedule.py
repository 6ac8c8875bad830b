"""The schedule: execution order of nodes and their assignment to streams with events.

A stream allocator plugin returns a :class:`StreamAssignment`. An event ``(src, dst)`` means:
node ``dst`` (on one stream) waits until node ``src`` (on another stream) has finished. Within a
stream nodes run in schedule order. The core checks every assignment: each data dependency
between streams must be ordered by the events (directly or through other events), so an
executor that honours them never reads a value before it is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import GEError
from .ir.graph import node_reads


@dataclass
class StreamAssignment:
    """Which stream each node runs on (by node index in the schedule) and cross-stream events."""

    #: Stream id per node, in schedule order.
    streams: list[int] = field(default_factory=list)
    #: (producer index, consumer index) pairs that need a record/wait event.
    events: list[tuple[int, int]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return (max(self.streams) + 1) if self.streams else 1

    def as_dict(self) -> dict[str, Any]:
        return {"streams": list(self.streams), "events": [list(e) for e in self.events]}

    @classmethod
    def single(cls, n: int) -> StreamAssignment:
        return cls([0] * n, [])


def data_edges(order: Sequence) -> list[tuple[int, int]]:
    """(producer index, consumer index) for every data dependency between scheduled nodes,
    counting values read inside a node's subgraphs."""
    pos = {n: i for i, n in enumerate(order)}
    edges: set[tuple[int, int]] = set()
    for j, n in enumerate(order):
        for v in node_reads(n):
            p = v.producer
            if p is not None and p in pos and pos[p] != j:
                edges.add((pos[p], j))
    return sorted(edges)


class HappensBefore:
    """Vector clocks over a stream assignment: what each node is guaranteed to see finished.

    ``clock[i][s]`` is the highest position on stream ``s`` known complete when node ``i``
    starts (-1 for none). Built in schedule order from stream order plus events.
    """

    def __init__(self, assignment: StreamAssignment) -> None:
        streams = assignment.streams
        k = assignment.count
        self.stream_pos: list[int] = []
        counters = [0] * k
        for s in streams:
            self.stream_pos.append(counters[s])
            counters[s] += 1
        incoming: dict[int, list[int]] = {}
        for src, dst in assignment.events:
            incoming.setdefault(dst, []).append(src)
        last_on: list[int | None] = [None] * k
        self.clock: list[list[int]] = []
        for i, s in enumerate(streams):
            prev = last_on[s]
            c = list(self.clock[prev]) if prev is not None else [-1] * k
            if prev is not None:
                c[s] = max(c[s], self.stream_pos[prev])
            for src in incoming.get(i, ()):
                if src < i:
                    sc = self.clock[src]
                    for t in range(k):
                        if sc[t] > c[t]:
                            c[t] = sc[t]
                    ss = streams[src]
                    c[ss] = max(c[ss], self.stream_pos[src])
            self.clock.append(c)
            last_on[s] = i

    def ordered(self, src: int, dst: int, streams: Sequence[int]) -> bool:
        """True if ``src`` is guaranteed finished when ``dst`` starts."""
        if streams[src] == streams[dst]:
            return src < dst
        return self.clock[dst][streams[src]] >= self.stream_pos[src]


def verify_streams(order: Sequence, assignment: StreamAssignment, who: str = "") -> None:
    """Raise GEError unless the assignment is well formed and orders every data dependency."""
    n = len(order)
    by = f" by stream allocator '{who}'" if who else ""
    if len(assignment.streams) != n:
        raise GEError(f"stream assignment{by} has {len(assignment.streams)} entries for {n} nodes")
    if any(not isinstance(s, int) or s < 0 for s in assignment.streams):
        raise GEError(f"stream assignment{by} has a negative or non-integer stream id")
    for src, dst in assignment.events:
        if not (0 <= src < dst < n):
            raise GEError(f"stream assignment{by}: event ({src}, {dst}) does not point forward in the schedule")
    hb = HappensBefore(assignment)
    for src, dst in data_edges(order):
        if not hb.ordered(src, dst, assignment.streams):
            raise GEError(
                f"stream assignment{by}: node '{order[dst].name}' on stream {assignment.streams[dst]} reads a value of "
                f"'{order[src].name}' on stream {assignment.streams[src]} with no event ordering them",
                hint="the allocator must add an event for every cross-stream dependency",
            )

