"""Hook implementations of the ``ge_memory`` plugin: planners, the alignment option, a schedule pass."""

from ge_core.hookspecs import RegisterCliCommand, RegisterMemoryPlanner, RegisterOption, RegisterPass, hookimpl


@hookimpl
def ge_register_memory_planners(register: RegisterMemoryPlanner) -> None:
    from ge_core.memory import SYMBOLIC_PLANNER

    from .planners import plan_auto, plan_ge_block_reuse, plan_greedy_by_lifetime, plan_greedy_by_size, plan_no_reuse
    from .symbolic import plan_symbolic

    register("none", plan_no_reuse)
    register("greedy_by_size", plan_greedy_by_size)
    register("greedy_by_lifetime", plan_greedy_by_lifetime)
    register("ge_block_reuse", plan_ge_block_reuse)
    register("auto", plan_auto)
    # the strategy for symbolic problems: the compiler calls it with the planner the options chose
    register(SYMBOLIC_PLANNER, plan_symbolic)


@hookimpl
def ge_register_options(register: RegisterOption) -> None:
    register("memory_alignment", 64,
             "byte alignment of every buffer in the arena: a power of two from 16 (64 by default; GE uses 512)")


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    from .schedule import SinkConstantComputations

    register(SinkConstantComputations())


@hookimpl
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    from . import plot

    register("memory-plot", "draw the memory plan of an .om: tensor lifetime by arena offset (needs matplotlib)",
             plot.configure, plot.run)
