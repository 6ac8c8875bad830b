"""Winograd F(2x2, 3x3) on NCHW (:class:`ge_cpu.kernels.winograd.Winograd`): a 3x3, stride-1,
undilated 2-D convolution of a constant float weight, where the cost model says it pays (option
``conv_algorithm``: ``winograd`` wherever it applies, ``im2col`` never)."""

from __future__ import annotations

import numpy as np

from ge_native import isa

from .. import winograd as wino_core
from .plan import ConvPlan

NAME = "winograd"


def prepare(plan: ConvPlan):
    """The weight transformed once (a :class:`Winograd`), or None where it does not apply."""
    w = plan.w_const
    if plan.forced is not None:  # (another algorithm forced: nothing of Winograd's is prepared)
        return None
    if (w is not None and plan.nd == 2 and plan.option != "im2col" and w.dtype in (np.float32, np.float64)
            and wino_core.applies(plan.x_shape, w.shape, plan.strides, plan.dilations, plan.group, w.dtype,
                                  pays=plan.option in ("auto", "winograd4"))):
        return wino_core.Winograd(w, group=plan.group)
    return None


def state(plan: ConvPlan):
    return plan.state(NAME, prepare)


def applies(plan: ConvPlan) -> bool:
    return state(plan) is not None


def run(plan: ConvPlan, wino, x, w, b, out, pb, pe):
    """The call on the transformed weight, into the planned output; None when it does not take it."""
    if wino is None or w is not plan.w_const or x.dtype != wino.dtype or x.ndim != 4:
        return None
    o = out[0] if out is not None and out[0].flags.c_contiguous else None
    y = wino.run(x, (pb[0], pb[1], pe[0], pe[1]), out=o, bias=b)
    if out is not None and o is None:
        np.copyto(out[0], y)
        return out
    return (y,) if o is None else out


def variant(plan: ConvPlan) -> str:
    """The instruction-set variant of its transforms (:mod:`ge_native.isa` family ``winograd``)."""
    return isa.variant_of("winograd")


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
