"""The blocked layout (:mod:`ge_cpu.blocked`): a 2-D Conv the ``nchwc_layout`` pass rewrites into an
``NchwcConv`` (:mod:`ge_cpu.kernels.nchwc`'s direct or Winograd kernels on (N, C/16, H, W, 16)
values). It applies to a plan the pass asks about (``ConvPlan(spec, layout=True)``), never to a
kernel's build: an NCHW Conv left to the kernels keeps its layout."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import UnsupportedOpError
from ge_core.ir.types import TensorType
from ge_native import isa
from ge_native import nchwc as native_nchwc

from .. import nchwc as blocked_kernels
from .plan import ConvPlan

NAME = "nchwc"
BLOCK = native_nchwc.BLOCK
#: the most input channels a convolution reading NCHW directly takes (a stem's RGB, a mask)
PLAIN_MAX_CHANNELS = 8


def static4(t: TensorType | None) -> tuple[int, ...] | None:
    """A float32 4-D type's static shape (every extent a positive int), else None."""
    if t is None or t.shape is None or len(t.shape) != 4:
        return None
    if t.dtype is None or np.dtype(t.dtype) != np.float32:
        return None
    return tuple(t.shape) if all(isinstance(d, int) and d > 0 for d in t.shape) else None


def geometry(plan: ConvPlan) -> dict[str, Any] | None:
    """What the blocked kernels need of the convolution (``group``, ``k``, ``strides``,
    ``dilations``, ``plain``: it reads its NCHW input directly, ``xs``, ``ys``), or None when they
    do not run it: static float32 4-D input and output, a constant float32 4-D weight (and bias),
    ungrouped, depthwise or whole blocks a group."""
    spec = plan.spec
    if not plan.layout or plan.forced not in (None, NAME) or len(spec.inputs) < 2 or len(spec.outputs) != 1:
        return None
    xs, ys, wv = static4(spec.inputs[0]), static4(spec.outputs[0]), plan.w_const
    if xs is None or ys is None or wv is None or wv.ndim != 4 or wv.dtype != np.float32:
        return None
    if plan.has_bias and (plan.b_const is None or plan.b_const.size != wv.shape[0]):
        return None
    group = int(spec.attr("group", 1) or 1)
    m, c = wv.shape[0], xs[1]
    # a network's first layer (3 channels) reads its NCHW input directly (no reorder, no padding
    # of 3 channels to a block); other channel counts must be whole blocks
    plain = c % BLOCK != 0 and c <= PLAIN_MAX_CHANNELS and group == 1
    depthwise = group == c == m and wv.shape[1] == 1
    # a grouped one (RegNet's, ResNeXt's): each group's input and output channels whole blocks
    whole_groups = group > 1 and wv.shape[1] * group == c and c % (group * BLOCK) == 0 and m % (group * BLOCK) == 0
    if group != 1 and not (depthwise or whole_groups):
        return None
    if group == 1 and wv.shape[1] != c:
        return None
    k = tuple(int(v) for v in (spec.attr("kernel_shape") or wv.shape[2:]))
    if k != tuple(wv.shape[2:]):
        return None
    strides = [int(v) for v in (spec.attr("strides") or (1, 1))]
    dil = [int(v) for v in (spec.attr("dilations") or (1, 1))]
    if len(strides) != 2 or len(dil) != 2 or min(strides + dil) < 1:
        return None
    return {"group": group, "k": k, "strides": strides, "dilations": dil, "plain": plain, "xs": xs, "ys": ys}


def applies(plan: ConvPlan) -> bool:
    return geometry(plan) is not None


def packing(plan: ConvPlan, in_blocks: int, y_shape) -> str:
    """The weight packing, and so the blocked algorithm (direct, Winograd F(2x2) or F(4x4)), the
    ``NchwcConv`` of this plan runs (:data:`ge_cpu.kernels.nchwc.PACKINGS`), by the option."""
    g = geometry(plan)
    if g is None or plan.w_const is None:
        raise UnsupportedOpError(f"{plan.name}: the blocked layout does not run this convolution")
    return blocked_kernels.packing_for(plan.option, plan.w_const.shape, g["group"], list(g["k"]), g["strides"],
                                       g["dilations"], g["plain"], in_blocks, y_shape)


def variant(plan: ConvPlan) -> str:
    """The blocked kernels' variant (family ``nchwc``)."""
    return isa.variant_of("nchwc")


def build(plan: ConvPlan, forced: bool = False):
    """Not a kernel of an NCHW Conv: the ``nchwc_layout`` pass rewrites the node (its kernel is
    :func:`ge_cpu.kernels.nchwc.conv_factory`'s)."""
    raise UnsupportedOpError(f"{plan.name}: the nchwc algorithm runs only where the nchwc_layout pass rewrote "
                             "the convolution", hint="leave conv_algorithm at auto, or name an NCHW algorithm")
