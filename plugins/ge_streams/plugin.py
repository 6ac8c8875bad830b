"""Hook implementations of the ``ge_streams`` plugin."""

from ge_core.hookspecs import hookimpl

from .allocators import DEFAULT_MAX_STREAMS, allocate_critical_path, allocate_dependency, allocate_single


@hookimpl
def ge_register_stream_allocators(register):
    register("single", allocate_single)
    register("dependency", allocate_dependency)
    register("critical_path", allocate_critical_path)


@hookimpl
def ge_register_options(register):
    register("max_streams", DEFAULT_MAX_STREAMS, "most streams a multi-stream allocator opens")
    register("max_stream_nodes", 0, "split a stream longer than this many nodes (0: no limit)")
