"""A 3x3 (or smaller) depthwise 2-D layer with a constant float32 weight and a static input shape:
its direct-kernel call prepared once (:class:`ge_cpu.kernels.window.DirectConv`; the general path
spent 10 us of a ShuffleNet layer's 32 re-deriving it)."""

from __future__ import annotations

import numpy as np

from ge_native import isa, parallel

from .. import _window as window
from . import depthwise_window
from .geometry import delivered, mark_applied, out_target, store_steps
from .plan import ConvPlan

NAME = "depthwise_direct"


def prepare(plan: ConvPlan):
    """``(input shape, output shape, DirectConv)`` or None; a symbolic batch's call is
    :class:`PerBatch` (a DirectConv a batch, made at its first run)."""
    w, xs, group = plan.w_const, plan.x_shape, plan.group
    if not (depthwise_window.state(plan) is not None and w is not None and plan.nd == 2 and w.shape[1] == 1
            and w.shape[0] == group and min(w.shape[2:]) < 5 and plan.dtype == np.float32 and w.dtype == np.float32
            and plan.batch_free_x and xs[1] == group and plan.bias_static and window.direct_available()):
        return None
    k2 = tuple(int(v) for v in w.shape[2:])
    dw_shape = (xs[0], group) + tuple(plan.plans((tuple(xs[2:]), k2))[2])
    bias0 = np.zeros(group, np.float32) if plan.b_const is None else np.asarray(plan.b_const, np.float32).reshape(-1)

    def direct(n: int):
        return window.DirectConv(plan.window_plans((tuple(xs[2:]), k2)), (n, *xs[1:]), (n, *dw_shape[1:]),
                                 w.reshape(group, -1), bias0)

    try:
        return tuple(xs), dw_shape, (direct(xs[0]) if isinstance(xs[0], int) else PerBatch(direct, direct(1)))
    except ValueError:
        return None


class PerBatch:
    """A depthwise layer's prepared calls for a symbolic batch: one DirectConv a batch seen (its
    geometry holds the batch), the first made at build time (so a plan the kernel refuses is
    refused there)."""

    def __init__(self, make, first) -> None:
        self.make, self.calls = make, {1: first}

    def run(self, x: np.ndarray, out: np.ndarray, *args) -> bool:
        n = int(x.shape[0])
        call = self.calls.get(n)
        if call is None:
            call = self.calls[n] = self.make(n)  # (a dict store: safe across concurrent runs)
        return call.run(x, out, *args)


def state(plan: ConvPlan):
    return plan.state(NAME, prepare)


def applies(plan: ConvPlan) -> bool:
    return state(plan) is not None


def run(plan: ConvPlan, dw_fast, x, w, out, epi):
    """The prepared call into the planned output; None when it does not take this call."""
    if not plan.takes_prepared(dw_fast, x, w):
        return None
    shape, call = plan.batch_shape(dw_fast[1], x), dw_fast[2]
    target = out_target(out, shape, np.float32)
    clip, act = store_steps(epi, epi is not None and epi["addend"] is None)
    if not call.run(x, target, parallel.native_width(), clip, act):
        return None
    mark_applied(epi, clip, act)
    return delivered(target, out)


def variant(plan: ConvPlan) -> str:
    """The direct kernel's variant (family ``depthwise``)."""
    return isa.variant_of("depthwise")


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
