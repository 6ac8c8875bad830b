"""A depthwise convolution (one input channel a group) in NumPy, where the window loop does not
run (no compiler, other dtypes or ranks): a loop over the *kernel positions* only, each one a
multiply-add over the whole tensor (channels-last for a 2-D float one: long SIMD loops)."""

from __future__ import annotations

import itertools

import numpy as np

from .geometry import pad_spatial, position_slices
from .plan import ConvPlan

NAME = "depthwise_numpy"


def prepare(plan: ConvPlan):
    """The memo of the channels-last taps of a constant weight."""
    return {}


def applies(plan: ConvPlan) -> bool:
    return plan.depthwise


def takes(plan: ConvPlan, c: int, cg: int) -> bool:
    return cg == 1 and plan.group == c and plan.group > 1


def run(plan: ConvPlan, x, w, pb, pe, out_sp, k):
    n, c = x.shape[:2]
    nd, strides, dilations = plan.nd, plan.strides, plan.dilations
    mult = w.shape[0] // c
    if mult == 1 and nd == 2 and x.dtype.kind == "f":
        return _nhwc(plan, plan.state(NAME, prepare), x, w, pb, pe, out_sp, k)
    xp = pad_spatial(x, pb, pe)
    wd = w.reshape((c, mult) + tuple(k))
    y = None
    tmp = None
    lead = (slice(None), slice(None))
    for pos, sl in zip(itertools.product(*[range(ki) for ki in k]), position_slices(k, strides, dilations, out_sp)):
        xs = xp[lead + sl]
        if mult == 1:
            wp = wd[(slice(None), 0) + pos].reshape((c,) + (1,) * nd)
        else:
            xs = xs[:, :, None]
            wp = wd[(slice(None), slice(None)) + pos].reshape((c, mult) + (1,) * nd)
        if y is None:
            y = xs * wp
            tmp = np.empty_like(y)
        else:
            np.multiply(xs, wp, out=tmp)
            y += tmp
    return y


def _nhwc(plan: ConvPlan, dw_cache: dict, x, w, pb, pe, out_sp, k):
    """Depthwise 2-D conv channels-last: every tap is one multiply-add over a view whose
    innermost axis is the (contiguous) channel axis, so NumPy's loops run long and SIMD."""
    n, c, h, wd_ = x.shape
    key = id(w)
    wt = dw_cache.get(key)
    if wt is None or wt[0] is not w:
        wt = (w, np.ascontiguousarray(w.reshape(c, -1).T.astype(x.dtype, copy=False)))
        if plan.w_const is not None:
            dw_cache.clear()
            dw_cache[key] = wt
    taps = wt[1]
    hp, wp_ = h + pb[0] + pe[0], wd_ + pb[1] + pe[1]
    if pb[0] or pb[1] or pe[0] or pe[1]:
        xp = np.empty((n, hp, wp_, c), x.dtype)
        xp[:, :pb[0]] = 0
        xp[:, hp - pe[0]:] = 0
        xp[:, :, :pb[1]] = 0
        xp[:, :, wp_ - pe[1]:] = 0
        xp[:, pb[0]:pb[0] + h, pb[1]:pb[1] + wd_] = x.transpose(0, 2, 3, 1)
    else:
        xp = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    oh, ow = out_sp
    sh, sw = plan.strides
    dh, dw = plan.dilations
    y = np.empty((n, oh, ow, c), x.dtype)
    tmp = np.empty_like(y)
    for t, (a, b) in enumerate(itertools.product(range(k[0]), range(k[1]))):
        xs = xp[:, a * dh:a * dh + (oh - 1) * sh + 1:sh, b * dw:b * dw + (ow - 1) * sw + 1:sw]
        if t == 0:
            np.multiply(xs, taps[0], out=y)
        else:
            np.multiply(xs, taps[t], out=tmp)
            y += tmp
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def variant(plan: ConvPlan) -> str:
    return "numpy"


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
