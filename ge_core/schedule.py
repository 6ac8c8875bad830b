"""The schedule: execution order of nodes and their assignment to streams with events.

A stream allocator plugin returns a :class:`StreamAssignment`. An event ``(src, dst)`` means:
node ``dst`` on one stream waits for node ``src`` on another stream to finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
