"""A 2-D depthwise layer (5x5 and wider) with a constant float32 weight through the blocked
layout's kernel (:func:`ge_native.nchwc.depthwise`), its planes reordered in and out by the call
(onnxruntime runs a lone depthwise layer so too): the NCHW window loop ran ConvNeXt's 7x7 layers
2-5x slower (768 channels at 7x7: 0.30 ms, 0.055); a 3x3 one ran as fast or faster in the window
loop (ShuffleNet's 16 layers 1.33 ms there, 1.59 through the blocked kernel)."""

from __future__ import annotations

import threading

import numpy as np

from ge_native import isa, nchwc, parallel

from .geometry import delivered, mark_applied, out_target, store_steps
from .plan import ConvPlan

NAME = "depthwise_nchwc"


def prepare(plan: ConvPlan):
    """The packed weight and bias (and the per-thread blocked buffers), or None."""
    w, group = plan.w_const, plan.group
    if not (plan.nd == 2 and group > 1 and w is not None and w.dtype == np.float32 and w.shape[1] == 1
            and w.shape[0] == group and min(w.shape[2:]) >= 5 and nchwc.available()):
        return None
    return {"w": nchwc.pack_depthwise(w), "b": nchwc.pad_bias(plan.b_const, group) if plan.b_const is not None else None,
            "local": threading.local()}


def state(plan: ConvPlan):
    return plan.state(NAME, prepare)


def applies(plan: ConvPlan) -> bool:
    return state(plan) is not None


def run(plan: ConvPlan, dw, x, b, out, key, epi=None):
    """The depthwise conv on the blocked kernel, the caller's clip and activation applied there
    (an addend: not this path); None when it does not take the call."""
    group = plan.group
    if not dw or x.dtype != np.float32 or x.ndim != 4 or x.shape[1] != group:
        return None
    if epi is not None and epi["addend"] is not None:
        return None
    if b is not None and b is not plan.b_const:
        return None
    pb, pe, out_sp, _ = plan.plans(key)
    n = x.shape[0]
    shape = (n, group) + tuple(out_sp)
    if 0 in shape or 0 in x.shape:
        return None
    xs5, ys5 = nchwc.blocked_shape(x.shape), nchwc.blocked_shape(shape)
    local = dw["local"]
    bufs = getattr(local, "bufs", None)
    if bufs is None or bufs[0].shape != xs5 or bufs[1].shape != ys5:
        bufs = local.bufs = (np.empty(xs5, np.float32), np.empty(ys5, np.float32))
    x5, y5 = bufs
    width = parallel.native_width()
    clip, act = store_steps(epi)
    target = out_target(out, shape, np.float32)
    if not (nchwc.to_blocked(np.ascontiguousarray(x), x5, width)
            and nchwc.depthwise(x5, dw["w"], y5, tuple(key[1]), tuple(plan.strides), tuple(plan.dilations),
                                (pb[0], pb[1]), dw["b"], clip, width, None, act)
            and nchwc.from_blocked(y5, target, width)):
        return None
    mark_applied(epi, clip, act)
    return delivered(target, out)


def variant(plan: ConvPlan) -> str:
    """The blocked kernels' variant (family ``nchwc``)."""
    return isa.variant_of("nchwc")


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
