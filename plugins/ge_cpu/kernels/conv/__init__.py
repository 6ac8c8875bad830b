"""The cpu Conv kernel's algorithms as a table (TVM's op strategies with ``add_implementation``).

A :class:`~.plan.ConvPlan` parses the node once; each algorithm is a module with ``NAME``,
``applies(plan)`` and ``build(plan)``; :data:`ALGORITHMS` orders them by priority and
:func:`choose` returns the first that applies (or the one the ``conv_algorithm`` option names: a
GEError naming the node when it does not apply). The kernel built runs the chosen algorithm and,
for a call it does not take, the ones after it (:mod:`.chain`); the report's ``node_kernels``
names the chosen one. The ``nchwc_layout`` pass asks the same table (``applies("nchwc", plan)``).

The option's values ``auto``, ``im2col``, ``winograd`` and ``winograd4`` keep their meaning as
preferences (:data:`~.plan.PREFERENCES`); another value names one algorithm of the table."""

from __future__ import annotations

from types import ModuleType

from ge_core.errors import OptionError
from ge_core.kernel import KernelSpec

from . import (
    depthwise_direct,
    depthwise_nchwc,
    depthwise_numpy,
    depthwise_window,
    gemm_prepared,
    im2col,
    nchwc,
    packed,
    pointwise,
    winograd,
)
from .plan import PREFERENCES, ConvPlan

#: ``(priority, algorithm)``, the highest first: a prepared call before the general forms, the
#: depthwise ones before Winograd (which a forced option builds for a depthwise 3x3 too)
ALGORITHMS: list[tuple[int, ModuleType]] = []


def add_implementation(algorithm: ModuleType, priority: int) -> None:
    """Put ``algorithm`` (a module with NAME, applies and build) in the table by ``priority``."""
    ALGORITHMS.append((priority, algorithm))
    ALGORITHMS.sort(key=lambda e: -e[0])


for _prio, _alg in ((200, nchwc), (100, gemm_prepared), (95, depthwise_direct), (90, depthwise_nchwc),
                    (85, depthwise_window), (80, winograd), (70, packed), (60, pointwise), (50, depthwise_numpy),
                    (40, im2col)):
    add_implementation(_alg, _prio)


def names() -> tuple[str, ...]:
    """The algorithms' names, by priority."""
    return tuple(a.NAME for _, a in ALGORITHMS)


def by_name(name: str) -> ModuleType | None:
    return next((a for _, a in ALGORITHMS if a.NAME == name), None)


def applies(name: str, plan: ConvPlan) -> bool:
    """Whether the algorithm ``name`` applies to ``plan``."""
    alg = by_name(name)
    return alg is not None and bool(alg.applies(plan))


def choose(plan: ConvPlan) -> ModuleType:
    """The first algorithm by priority that applies to ``plan``, or the one the ``conv_algorithm``
    option forces (OptionError naming the node when it is unknown or does not apply)."""
    forced = plan.forced
    if forced is not None:
        alg = by_name(forced)
        if alg is None:
            raise OptionError(f"{plan.name}: conv_algorithm '{forced}' is not one of "
                              f"{', '.join(PREFERENCES + names())}")
        if not alg.applies(plan):
            fits = [a.NAME for _, a in ALGORITHMS if a.applies(plan)]
            raise OptionError(f"{plan.name}: conv_algorithm '{forced}' does not apply to this convolution",
                              hint=f"algorithms that apply to it: {', '.join(fits)}; or leave conv_algorithm at auto")
        return alg
    for _, alg in ALGORITHMS:
        if alg.applies(plan):
            return alg
    return im2col  # pragma: no cover - pointwise, depthwise_numpy and im2col cover every plan


def factory(spec: KernelSpec):
    """The Conv kernel factory: the plan parsed once, the algorithm chosen, its kernel built."""
    plan = ConvPlan(spec)
    alg = choose(plan)
    return alg.build(plan, forced=plan.forced is not None)


__all__ = ["ALGORITHMS", "PREFERENCES", "ConvPlan", "add_implementation", "applies", "by_name", "choose", "factory", "names"]
