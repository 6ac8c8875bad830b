"""The Conv kernel: the algorithms' build-time states prepared once, then each call offered to them
in order (a prepared call first, then the general forms), the first that takes it running it.

The order is the table's (:data:`ge_cpu.kernels.conv.ALGORITHMS`); a call a prepared algorithm
does not take (another input shape, a weight computed at run time, an epilogue it cannot apply)
falls through to the next, down to the general forms (``pointwise``, ``depthwise_numpy``,
``im2col``), which take every call."""

from __future__ import annotations

import numpy as np

from ge_core.kernel import caps, with_caps

from .. import _util as util
from . import (
    depthwise_direct,
    depthwise_nchwc,
    depthwise_numpy,
    depthwise_window,
    gemm_prepared,
    im2col,
    packed,
    pointwise,
    winograd,
)
from .geometry import delivered, out_dtype_ok, out_target
from .plan import ConvPlan

#: the algorithms with a build-time state, prepared when the kernel is built
PREPARED = (winograd, depthwise_window, packed, gemm_prepared, depthwise_direct, depthwise_nchwc)


def empty_conv(plan: ConvPlan, x, w, b, out):
    """The result of a convolution with an empty extent (a batch, channels, plane or kernel
    of 0): an empty output, or (no input channels, an empty kernel) the bias alone."""
    nd, group = plan.nd, plan.group
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        raise ValueError(f"Conv: input {x.shape} and weight {w.shape} are not {nd}-D convolution operands")
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    if c % group or m % group or w.shape[1] != c // group:
        raise ValueError(f"Conv: input channels {c} / group {group} do not match weights {w.shape}")
    out_sp = plan.plans((x.shape[2:], w.shape[2:]))[2]
    if any(o < 0 for o in out_sp):
        raise ValueError(f"Conv: input {x.shape} is smaller than the kernel {w.shape[2:]} with these pads")
    shape = (n, m) + tuple(out_sp)
    target = out_target(out, shape, x.dtype)
    target.fill(0)
    if b is not None and target.size:
        bv = np.asarray(b).reshape(-1)
        if bv.shape != (m,):
            raise ValueError(f"Conv: a bias of {bv.size} values for {m} output channels")
        target += bv.astype(x.dtype).reshape((m,) + (1,) * nd)
    return delivered(target, out)


def _finish(plan: ConvPlan, x, y, b, out, m, out_sp):
    """A general form's y as the kernel's outputs: the planned output, the bias added."""
    nd = plan.nd
    y = y.reshape((x.shape[0], m) + tuple(out_sp))
    if out is not None:
        o = out[0]
        if not np.shares_memory(y, o):
            np.copyto(o, y)
        if b is not None:
            o += b.reshape((m,) + (1,) * nd).astype(o.dtype, copy=False)
        return out
    if b is not None:
        y += b.reshape((m,) + (1,) * nd).astype(y.dtype, copy=False)
    return (util.cast_like(y, x.dtype),)


def _steps(plan: ConvPlan, only: str | None):
    """The prepared states a call is offered to (None: off): all, or ``only``'s when one is
    forced (every state is prepared now, not on the first run)."""
    states = {mod.NAME: plan.state(mod.NAME, mod.prepare) for mod in PREPARED}
    return {name: s if only is None or name == only else None for name, s in states.items()}


def build(plan: ConvPlan, chosen: str, forced: bool = False):
    """The kernel of ``plan``, named ``chosen`` in the report; ``forced``: only that algorithm's
    prepared state is offered calls (the general forms still take the rest)."""
    st = _steps(plan, chosen if forced else None)
    packed_on = not forced or chosen == packed.NAME
    w_const, b_const, nd, group = plan.w_const, plan.b_const, plan.nd, plan.group
    fast, dw_fast, dw_blocked = st[gemm_prepared.NAME], st[depthwise_direct.NAME], st[depthwise_nchwc.NAME]
    loop_w, wino = st[depthwise_window.NAME], st[winograd.NAME]
    _ = plan.packed_w  # the constant weight packed now, not on the first run

    def kernel(x, w, b=None, out=None, *, clip=None, addend=None, act=None):
        if clip is None and addend is None and act is None:
            return conv(x, w, b, out)
        epi = {"clip": clip, "addend": addend, "act": act, "applied": False}
        res = conv(x, w, b, out, epi)
        return res, epi["applied"]

    def conv(x, w, b=None, out=None, epi=None):
        if 0 in x.shape or 0 in w.shape:  # an empty extent first: no native path takes one
            return empty_conv(plan, x, w, b_const if b_const is not None else b, out)
        r = None if fast is None else gemm_prepared.run(plan, fast, x, w, out, epi)
        if r is None and dw_fast is not None:
            r = depthwise_direct.run(plan, dw_fast, x, w, out, epi)
        if r is not None:
            return r
        if b_const is not None:
            b = b_const
        n, c = x.shape[:2]
        m, k, cg = w.shape[0], w.shape[2:], c // group
        if w.shape[1] != cg or c % group or m % group:
            raise ValueError(f"Conv: input channels {c} / group {group} do not match weights {w.shape}")
        key = (x.shape[2:], k)
        dw = cg == 1 and group == c
        if dw and dw_blocked is not None and w is w_const:
            r = depthwise_nchwc.run(plan, dw_blocked, x, b, out, key, epi)
        if r is None and dw and loop_w is not None:
            r = depthwise_window.run(plan, loop_w, x, w, b, out, key, epi)
        if r is not None:
            return r
        pb, pe, out_sp, _ = plan.plans(key)
        if 0 in out_sp:
            return empty_conv(plan, x, w, b, out)
        r = None if wino is None else winograd.run(plan, wino, x, w, b, out, pb, pe)
        if r is None and packed_on and nd <= 2 and not (dw and group > 1):
            r = packed.run(plan, x, w, b, out, epi, k, pb, (n, m) + tuple(out_sp))
        if r is not None:
            return r
        if pointwise.takes(k, pb, pe):
            r, y = pointwise.run(plan, x, w, b, out, epi, out_sp)
        elif depthwise_numpy.takes(plan, c, cg):
            y = depthwise_numpy.run(plan, x, w, pb, pe, out_sp, k)
        else:
            r, y = im2col.run(plan, x, w, b, out, epi, pb, pe, out_sp, k)
        if r is not None:
            return r
        return _finish(plan, x, y, b, out, m, out_sp)

    dt = plan.dtype
    if dt is not None and dt.kind == "f" and dt.name != "bfloat16" and out_dtype_ok(plan.spec, dt):
        with_caps(kernel, accepts_out=True)
    if wino is not None:
        with_caps(kernel, mode="winograd")  # the report's kernel_modes count the layers
    with_caps(kernel, epilogue=("clip", "addend", "act"))  # applied by the GEMM paths on GE's own GEMM
    alg = next(a for a in (*PREPARED, pointwise, depthwise_numpy, im2col) if a.NAME == chosen)
    return with_caps(kernel, algorithm=chosen, variant=caps(kernel).variant or alg.variant(plan))
