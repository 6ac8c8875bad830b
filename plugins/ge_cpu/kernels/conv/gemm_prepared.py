"""The layer's GEMM call prepared once for its static input shape (:class:`ge_native.sgemm.Conv2d`):
the general path re-derived the geometry, the bias and the epilogue's arguments on every call,
most of a small layer's time (ShuffleNet's grouped 1x1 layers: 11.5 -> 7 us a call)."""

from __future__ import annotations

from ge_native import isa, parallel, sgemm

from . import packed
from .gemm import epilogue_args, per_image
from .plan import ConvPlan

NAME = "gemm_prepared"


def prepare(plan: ConvPlan):
    """``(input shape, output shape, Conv2d)`` or None (the batch may be a symbol: the call runs an image at a time)."""
    w_rows, w, xs = packed.rows(plan), plan.w_const, plan.x_shape
    if w_rows is None or w is None or plan.nd != 2 or not plan.batch_free_x or xs[1] != w.shape[1] * plan.group \
            or not plan.bias_static:
        return None
    k2 = tuple(int(v) for v in w.shape[2:])
    pb0, _, out_sp0, _ = plan.plans((tuple(xs[2:]), k2))
    try:
        return (tuple(xs), (xs[0], w.shape[0]) + tuple(out_sp0),
                sgemm.Conv2d(w_rows, plan.group, k2, plan.strides, plan.dilations, (pb0[0], pb0[1]), tuple(out_sp0),
                             plan.b_const))
    except ValueError:
        return None


def state(plan: ConvPlan):
    return plan.state(NAME, prepare)


def applies(plan: ConvPlan) -> bool:
    return state(plan) is not None


def run(plan: ConvPlan, fast, x, w, out, epi):
    """The prepared call into the planned output; None when it does not take this call."""
    if not plan.takes_prepared(fast, x, w):
        return None
    shape, call = plan.batch_shape(fast[1], x), fast[2]
    fits, clip, z3, act = epilogue_args(None, shape, epi)  # (the bias is the call's own)
    if fits is False:
        return None
    width = parallel.native_width()
    return per_image(shape, out, z3, epi, lambda i, t2, z2: call.run(x[i], t2, clip, width, z2, act))


def variant(plan: ConvPlan) -> str:
    """GE's GEMM's variant (family ``sgemm``)."""
    return isa.variant_of("sgemm")


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
