"""Base classes for the things plugins provide besides passes and ops.

Each is a callable object with a ``name``, so it registers like a plain function would and can
carry parameters and helpers of its own.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan, MemoryProblem
from ge_core.schedule import StreamAssignment


class StreamAllocator:
    """Assigns every node of the schedule to a stream. Implement :meth:`allocate`."""

    name: ClassVar[str] = ""

    def allocate(self, graph: Graph, options: Any) -> StreamAssignment:  # pragma: no cover - interface
        """Return one stream per node (in ``graph.nodes`` order) and the cross-stream events."""
        raise NotImplementedError

    def __call__(self, graph: Graph, options: Any = None) -> StreamAssignment:
        return self.allocate(graph, options)


class MemoryPlanner:
    """Places the buffers of a :class:`ge_core.memory.MemoryProblem`. Implement :meth:`plan`."""

    name: ClassVar[str] = ""

    def plan(self, problem: MemoryProblem, options: Any) -> MemoryPlan:  # pragma: no cover - interface
        """Return offsets for every buffer; the core verifies that live buffers never overlap."""
        raise NotImplementedError

    def __call__(self, problem: MemoryProblem, options: Any = None) -> MemoryPlan:
        return self.plan(problem, options)


class OpMapper:
    """Turns one framework op into IR nodes (as GE's REGISTER_CUSTOM_OP).

    ``framework`` is the frontend's name, ``op_type`` the framework op; the call signature is
    the one the frontend documents, so :meth:`map` receives whatever the frontend passes.
    """

    framework: ClassVar[str] = ""
    op_type: ClassVar[str] = ""

    def map(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.map(*args, **kwargs)
