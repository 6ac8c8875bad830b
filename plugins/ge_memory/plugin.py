"""Hook implementations of the ``ge_memory`` plugin."""

from ge_core.hookspecs import hookimpl


@hookimpl
def ge_register_memory_planners(register):
    from .planners import plan_auto, plan_greedy_by_size, plan_no_reuse

    register("none", plan_no_reuse)
    register("greedy_by_size", plan_greedy_by_size)
    register("auto", plan_auto)
