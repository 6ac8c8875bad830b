"""A 1x1 convolution with no padding: ``W @ X`` on the (strided) input, no im2col: GE's own GEMM
for an ungrouped float32 one (the bias and the epilogue at the store), else one (batched) BLAS
matmul."""

from __future__ import annotations

import math

import numpy as np

from ge_native import parallel

from . import packed
from .gemm import gemm_variant, pointwise_sgemm
from .plan import ConvPlan

NAME = "pointwise"


def applies(plan: ConvPlan) -> bool:
    return plan.pointwise and not plan.depthwise


def takes(k, pb, pe) -> bool:
    """This call's kernel is 1x1 with no padding."""
    return all(ki == 1 for ki in k) and not any(pb) and not any(pe)


def run(plan: ConvPlan, x, w, b, out, epi, out_sp):
    """``(outputs, None)`` when GE's GEMM delivered them, else ``(None, y)``: y (N, [G,] M, P) for
    the caller to finish (bias, output)."""
    group, strides = plan.group, plan.strides
    n, c = x.shape[:2]
    m, cg = w.shape[0], c // group
    p = math.prod(out_sp)
    wk = plan.weight(w)
    xs = x
    if any(si != 1 for si in strides):
        xs = x[(slice(None), slice(None)) + tuple(slice(None, None, si) for si in strides)]
    xs = xs.reshape(n, group, cg, p) if group > 1 else xs.reshape(n, cg, p)
    done = (pointwise_sgemm(wk, xs, b, out, (n, m) + tuple(out_sp), epi, packed.rows(plan) if w is plan.w_const else None)
            if group == 1 else None)
    if done is not None:
        return done, None
    if out is not None and group == 1:
        return None, parallel.matmul(wk[0], xs, out=out[0].reshape(n, m, p))
    return None, (np.matmul(wk, xs) if group > 1 else parallel.matmul(wk[0], xs))



def variant(plan: ConvPlan) -> str:
    """GE's GEMM's variant (family ``sgemm``) for an ungrouped float32 one, else the BLAS matmul's
    (family ``gemm``)."""
    return gemm_variant(plan)


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
