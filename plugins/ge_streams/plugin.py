"""Hook implementations of the ``ge_streams`` plugin."""

from ge_core.hookspecs import hookimpl
from ge_core.schedule import StreamAssignment


def allocate_single(graph, options=None) -> StreamAssignment:
    """Everything on stream 0: no events."""
    return StreamAssignment.single(len(graph))


@hookimpl
def ge_register_stream_allocators(register):
    register("single", allocate_single)
