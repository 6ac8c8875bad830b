"""Geometry of the sliding-window ops (Conv, pooling): auto_pad, the spatial rank, the window
plan (pads and output size), padding and the compiled window loop's plan."""

from __future__ import annotations

import itertools

import numpy as np

from ge_core.kernel import KernelSpec

from .. import _util as util
from .. import _window as window

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def auto_pad_of(spec: KernelSpec) -> str:
    ap = util.as_str(spec.attr("auto_pad"), "NOTSET") or "NOTSET"
    if ap not in AUTO_PADS:
        raise util.unsupported(spec, f"auto_pad={ap!r}")
    return ap


def spatial_rank(spec: KernelSpec, kernel_shape, input_index: int = 0, weight_index: int | None = None):
    if kernel_shape is not None:
        return len(kernel_shape)
    if weight_index is not None:
        w = util.const_input(spec, weight_index)
        if w is not None:
            return w.ndim - 2
        if weight_index < len(spec.inputs) and spec.inputs[weight_index] is not None \
                and spec.inputs[weight_index].rank is not None:
            return spec.inputs[weight_index].rank - 2
    if input_index < len(spec.inputs) and spec.inputs[input_index] is not None \
            and spec.inputs[input_index].rank is not None:
        return spec.inputs[input_index].rank - 2
    return None


def window_plan(auto_pad, pads, in_sp, k, s, d, ceil_mode=False):
    """Return (pad_begin, pad_end, out_spatial, padded_end) for a sliding-window op.

    ``padded_end`` is the end padding the buffer needs so every output window fits (it can
    exceed ``pad_end`` with ``ceil_mode``); ``pad_end`` itself is the model's padding.
    """
    nd = len(in_sp)
    eff = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-in_sp[i] // s[i]) for i in range(nd)]
        total = [max(0, (out[i] - 1) * s[i] + eff[i] - in_sp[i]) for i in range(nd)]
        if auto_pad == "SAME_UPPER":
            pb = [t // 2 for t in total]
        else:
            pb = [t - t // 2 for t in total]
        pe = [total[i] - pb[i] for i in range(nd)]
    else:
        if auto_pad == "VALID":
            pb = [0] * nd
            pe = [0] * nd
        else:
            pb = list(pads[:nd]) if pads else [0] * nd
            pe = list(pads[nd:]) if pads else [0] * nd
        out = []
        for i in range(nd):
            span = in_sp[i] + pb[i] + pe[i] - eff[i]
            if ceil_mode:
                o = -(-span // s[i]) + 1
                # the last window must start inside the input or the left padding
                if (o - 1) * s[i] >= in_sp[i] + pb[i]:
                    o -= 1
            else:
                o = span // s[i] + 1
            out.append(max(o, 0))
    padded_end = [max(pe[i], (out[i] - 1) * s[i] + eff[i] - in_sp[i] - pb[i]) for i in range(nd)]
    return pb, pe, out, padded_end


def out_dtype_ok(spec: KernelSpec, dt) -> bool:
    return bool(spec.outputs) and spec.outputs[0] is not None and spec.outputs[0].dtype == dt


def pad_spatial(x, pb, pe, value=0):
    """Pad the spatial axes (2..) of x; returns x itself when there is nothing to pad."""
    if not any(pb) and not any(pe):
        return x
    shape = x.shape[:2] + tuple(x.shape[2 + i] + pb[i] + pe[i] for i in range(len(pb)))
    if value == 0:
        xp = np.zeros(shape, x.dtype)
    else:
        xp = np.full(shape, value, x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(pb[i], pb[i] + x.shape[2 + i]) for i in range(len(pb)))] = x
    return xp


def position_slices(k, s, d, out):
    """For every kernel position, the tuple of spatial slices of the padded input it reads."""
    res = []
    for pos in itertools.product(*[range(ki) for ki in k]):
        res.append(tuple(slice(pos[i] * d[i], pos[i] * d[i] + (out[i] - 1) * s[i] + 1, s[i])
                         for i in range(len(k))))
    return res


def plan_2d(in_sp, k, s, d, pb, out_sp) -> window.WindowPlan:
    """The compiled window loop's plan of a 1-D or 2-D window op (1-D runs as one row)."""
    if len(in_sp) == 1:
        return window.WindowPlan((1, in_sp[0]), (1, k[0]), (1, s[0]), (1, d[0]), (0, pb[0]), (1, out_sp[0]))
    return window.WindowPlan(in_sp, k, s, d, pb, out_sp)


def as4d(a: np.ndarray) -> np.ndarray:
    return a if a.ndim == 4 else a.reshape(a.shape[:2] + (1,) + a.shape[2:])


def out_target(out, shape, dt):
    """The caller's output array when the loop can write it directly, else a new one."""
    o = out[0] if out is not None else None
    if o is not None and o.dtype == dt and o.shape == shape and o.flags.c_contiguous and o.flags.writeable:
        return o
    return np.empty(shape, dt)


class PlanCache:
    """Per input spatial shape memo of window plans (shapes rarely change between calls)."""

    def __init__(self, fn):
        self.fn = fn
        self.plans: dict = {}

    def __call__(self, key):
        p = self.plans.get(key)
        if p is None:
            p = self.fn(key)
            if len(self.plans) < 64:
                self.plans[key] = p
        return p


def store_steps(epi, ok: bool = True):
    """``(clip, act)``: the epilogue steps a kernel applies at its store (None, None without an
    epilogue or when ``ok`` is False)."""
    return (epi["clip"], epi["act"]) if epi is not None and ok else (None, None)


def mark_applied(epi, clip, act) -> None:
    """Tell the caller the kernel applied the epilogue's clip or activation."""
    if epi is not None and (clip is not None or act is not None):
        epi["applied"] = True


def delivered(target, out):
    """The kernel's outputs for a result in ``target``: ``out`` (the planned output, ``target``
    copied into it when it is another array) when the caller gave one, else ``(target,)``."""
    if out is None:
        return (target,)
    if target is not out[0]:
        np.copyto(out[0], target)
    return out
