"""Hook implementations of the ge_passes plugin: every standard optimisation pass."""

from __future__ import annotations

import importlib
from typing import Any

from ge_core.hookspecs import RegisterPass, hookimpl

#: Every pass of the plugin, as (module, class): imported when the passes are first asked for
#: (``PASSES`` or the hook), so that loading and running an .om imports none of them. Their
#: order is not this tuple's: each pass declares it (``after`` / ``before``) and the pipeline
#: resolves the declarations (``ge passes`` shows the result): folding first (it feeds everything
#: else), local simplifications next, then the global clean-ups (sharing, CSE, DCE), each after
#: the one before it in this list. A pass of another plugin places itself among them with its own
#: ``after``/``before``.
PASS_CLASSES: tuple[tuple[str, str], ...] = (
    ("folding", "FoldShapes"),
    ("folding", "FoldConstants"),
    ("noops", "EliminateNoops"),
    ("algebra", "SimplifyAlgebra"),
    ("algebra", "DistributeConstants"),
    ("algebra", "MergeConstantArithmetic"),
    ("algebra", "FoldAffineIntoBatchNorm"),
    ("transpose_sinking", "SinkTransposes"),
    ("layout", "SimplifyLayout"),
    ("cse", "ShareConstants"),
    ("cse", "CommonSubexpressionElimination"),
    ("dce", "DeadCodeElimination"),
)


def pass_classes() -> tuple[type, ...]:
    """The pass classes of :data:`PASS_CLASSES`, imported."""
    return tuple(getattr(importlib.import_module(f"{__package__}.{m}"), c) for m, c in PASS_CLASSES)


def __getattr__(name: str) -> Any:
    if name == "PASSES":  # the pass classes (kept by name for the users of ``ge_passes.PASSES``)
        return pass_classes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    """Register the standard optimisation passes (stage "optimize", levels O1..O3)."""
    for cls in pass_classes():
        register(cls())
