"""Hook implementations of the ge_passes plugin: every standard optimisation pass."""

from __future__ import annotations

from ge_core.hookspecs import hookimpl
from ge_core.passes import Pass

from .algebra import DistributeConstants, FoldAffineIntoBatchNorm, MergeConstantArithmetic, SimplifyAlgebra
from .cse import CommonSubexpressionElimination, ShareConstants
from .dce import DeadCodeElimination
from .folding import FoldConstants, FoldShapes
from .layout import SimplifyLayout
from .noops import EliminateNoops
from .transpose_sinking import SinkTransposes

#: Every pass of the plugin in its canonical order: folding first (it feeds everything else),
#: local simplifications next, then the global clean-ups (sharing, CSE, DCE).
PASSES: tuple[type[Pass], ...] = (
    FoldShapes,
    FoldConstants,
    EliminateNoops,
    SimplifyAlgebra,
    DistributeConstants,
    MergeConstantArithmetic,
    FoldAffineIntoBatchNorm,
    SinkTransposes,
    SimplifyLayout,
    ShareConstants,
    CommonSubexpressionElimination,
    DeadCodeElimination,
)


def make_passes() -> list[Pass]:
    """One instance of each pass; each runs after the passes before it in :data:`PASSES` (when
    they are in the pipeline), whatever subset a level or config selects."""
    out: list[Pass] = []
    for i, cls in enumerate(PASSES):
        p = cls()
        earlier = tuple(c.name for c in PASSES[:i])
        setattr(p, "after", tuple(dict.fromkeys(cls.after + earlier)))  # noqa: B010 - a ClassVar set per instance
        setattr(p, "before", tuple(b for b in cls.before if b not in earlier))  # noqa: B010
        out.append(p)
    return out


@hookimpl
def ge_register_passes(register):
    """Register the standard optimisation passes (stage "optimize", levels O1..O3)."""
    for p in make_passes():
        register(p)
