"""A depthwise 1-D or 2-D convolution (one input channel a group) through the compiled window loop
(:mod:`ge_cpu.kernels.window`, native C), its planes split over the run's threads and the
caller's clip and activation (no addend) applied as it writes."""

from __future__ import annotations

import math

import numpy as np

from ge_native import isa, parallel

from .. import _window as window
from .geometry import as4d, delivered, mark_applied, out_target, store_steps
from .plan import ConvPlan

NAME = "depthwise_window"


def prepare(plan: ConvPlan):
    """The loop's memo of the constant weight (M, taps) and bias (M,) per dtype; None where the
    loop does not run (decided once, here: it is compiled now, not on the first run)."""
    if not (plan.nd <= 2 and plan.group > 1 and window.available()):
        return None
    if plan.w_const is not None:
        window.prepare("conv", math.prod(plan.w_const.shape[2:]), plan.dtype)
    return {}


def state(plan: ConvPlan):
    return plan.state(NAME, prepare)


def applies(plan: ConvPlan) -> bool:
    return state(plan) is not None and plan.depthwise and (plan.dtype is None or plan.dtype in window.NP_DTYPES)


def run(plan: ConvPlan, loop_w, x, w, b, out, key, epi=None):
    """The call through the loop; None when it does not take it."""
    dt = x.dtype
    if loop_w is None or dt not in window.NP_DTYPES or w.dtype != dt or x.ndim != plan.nd + 2:
        return None
    w_const, b_const = plan.w_const, plan.b_const
    n, m = x.shape[0], w.shape[0]
    out_sp = plan.plans(key)[2]
    shape = (n, m) + tuple(out_sp)
    if 0 in shape or 0 in x.shape:
        return None
    wt = loop_w.get(("w", dt)) if w_const is not None else None
    if wt is None:
        wt = np.ascontiguousarray(w.reshape(m, -1), dtype=dt)
        if w_const is not None:
            loop_w[("w", dt)] = wt
    bkey = ("b", dt, m) if b is None or b is b_const else None
    bias = loop_w.get(bkey) if bkey is not None else None
    if bias is None:
        bias = np.zeros(m, dt) if b is None else np.ascontiguousarray(np.asarray(b).reshape(-1), dtype=dt)
        if bkey is not None:
            loop_w[bkey] = bias
    if bias.shape != (m,):
        return None
    target = out_target(out, shape, dt)
    clip, act = store_steps(epi, epi is not None and epi["addend"] is None and (epi["act"] is None or dt == np.float32))
    if not window.run("conv", plan.window_plans(key), as4d(x), as4d(target), wt, bias,
                       threads=parallel.native_width(), clip=clip, act=act):
        return None
    mark_applied(epi, clip, act)
    return delivered(target, out)


def variant(plan: ConvPlan) -> str:
    """The window loop's variant (family ``depthwise``)."""
    return isa.variant_of("depthwise")


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
