"""Standard graph optimisation passes (stage "optimize"): folding, CSE, DCE, no-op elimination,
layout-chain and algebraic simplification, with a default pipeline per optimisation level.

=====  ==========================================================================================
level  passes that run by default
=====  ==========================================================================================
O0     none (the prepare stage's type inference only)
O1     exact clean-ups: fold_constants, fold_shapes, eliminate_noops, share_constants, cse, dce
O2     O1 + simplify_algebra, simplify_layout, merge_constant_arithmetic,
       fold_affine_into_batchnorm, sink_transposes (the default level)
O3     O2 + distribute_constants (reassociates affine chains; rounding may differ more)
=====  ==========================================================================================
"""

from typing import Any

__all__ = ["PASSES"]


def __getattr__(name: str) -> Any:
    if name == "PASSES":  # every pass class, imported on first use (loading an .om needs none)
        from .plugin import pass_classes

        return pass_classes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
