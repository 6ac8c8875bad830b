"""A 1-D or 2-D convolution per image on GE's own GEMM (:func:`ge_native.sgemm.conv2d`: the column
matrix packed straight into its panels), the constant float32 weight packed once as row panels
(:class:`ge_native.sgemm.RowPanels`); not a depthwise one (the window loop runs those)."""

from __future__ import annotations

import numpy as np

from ge_native import isa, sgemm

from . import winograd
from .gemm import conv2d_sgemm
from .plan import ConvPlan

NAME = "packed"


def prepare(plan: ConvPlan):
    """The constant weight as row panels (one sequential stream per row block), or None."""
    w = plan.w_const
    if (plan.dtype == np.float32 and not winograd.applies(plan) and w is not None and w.dtype == np.float32
            and w.ndim >= 3 and (plan.group == 1 or w.shape[1] > 1) and sgemm.available()):
        return sgemm.RowPanels(np.ascontiguousarray(w.reshape(w.shape[0], -1)), plan.group)
    return None


def rows(plan: ConvPlan):
    """The weight's row panels (None: none, read in place)."""
    return plan.state(NAME, prepare)


def applies(plan: ConvPlan) -> bool:
    w = plan.w_const
    return (plan.nd <= 2 and not plan.depthwise and plan.dtype == np.float32 and sgemm.available()
            and (w is None or w.dtype == np.float32))


def run(plan: ConvPlan, x, w, b, out, epi, k, pb, shape):
    """The call on GE's GEMM; None when that path does not run these arrays."""
    return conv2d_sgemm(x, plan.weight(w), b, out, shape, plan.group, k, plan.strides, plan.dilations, pb, epi,
                        rows(plan) if w is plan.w_const else None)


def variant(plan: ConvPlan) -> str:
    """GE's GEMM's variant (family ``sgemm``)."""
    return isa.variant_of("sgemm")


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
