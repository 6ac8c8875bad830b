"""Hook implementations of the ge_passes plugin: every standard optimisation pass."""

from __future__ import annotations

from ge_core.hookspecs import RegisterPass, hookimpl
from ge_core.passes import Pass

from .algebra import DistributeConstants, FoldAffineIntoBatchNorm, MergeConstantArithmetic, SimplifyAlgebra
from .cse import CommonSubexpressionElimination, ShareConstants
from .dce import DeadCodeElimination
from .folding import FoldConstants, FoldShapes
from .layout import SimplifyLayout
from .noops import EliminateNoops
from .transpose_sinking import SinkTransposes

#: Every pass of the plugin. Their order is not this tuple's: each pass declares it (``after`` /
#: ``before``) and the pipeline resolves the declarations (``ge passes`` shows the result):
#: folding first (it feeds everything else), local simplifications next, then the global
#: clean-ups (sharing, CSE, DCE), each after the one before it in this list. A pass of another
#: plugin places itself among them with its own ``after``/``before``.
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


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    """Register the standard optimisation passes (stage "optimize", levels O1..O3)."""
    for cls in PASSES:
        register(cls())
