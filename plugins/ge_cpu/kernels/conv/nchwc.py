"""The blocked layout (:mod:`ge_cpu.blocked`): a 2-D Conv the ``nchwc_layout`` pass rewrites into an
``NchwcConv`` (:mod:`ge_cpu.kernels.nchwc`'s direct or Winograd kernels on (N, C/16, H, W, 16)
values). It applies to a plan the pass asks about (``ConvPlan(spec, layout=True)``), never to a
kernel's build: an NCHW Conv left to the kernels keeps its layout."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import UnsupportedOpError
from ge_core.ir.symbolic import SymExpr
from ge_core.ir.types import TensorType
from ge_native import isa
from ge_native import nchwc as native_nchwc

from .. import nchwc as blocked_kernels
from .plan import ConvPlan

NAME = "nchwc"
BLOCK = native_nchwc.BLOCK
#: the most input channels a convolution reading NCHW directly takes (a stem's RGB, a mask)
PLAIN_MAX_CHANNELS = 8


def batch_ok(d) -> bool:
    """A batch extent the blocked kernels take: a positive int, or a symbol (an export's dynamic
    batch): the batch only scales their outer loop, so a symbolic one gets the same kernels."""
    return (isinstance(d, int) and not isinstance(d, bool) and d > 0) or isinstance(d, (str, SymExpr))


def shape_reason(t: TensorType | None, what: str) -> str | None:
    """Why a value of type ``t`` cannot be a blocked kernel's 4-D float32 operand, None when it can
    (static channels and plane; the batch a positive int or a symbol)."""
    if t is None or t.shape is None:
        return f"the {what}'s shape is unknown"
    if len(t.shape) != 4:
        return f"the {what} is {len(t.shape)}-D, not 4-D (N, C, H, W)"
    if t.dtype is None or np.dtype(t.dtype) != np.float32:
        return f"the {what} is {t.dtype}, the blocked kernels take float32"
    if not batch_ok(t.shape[0]):
        return f"the {what}'s batch dim {t.shape[0]!r} is unknown"
    for name, d in zip(("channel", "height", "width"), t.shape[1:]):
        if not (isinstance(d, int) and d > 0):
            return f"the {what}'s {name} dim {d!r} is not static (only the batch may be symbolic)"
    return None


def static4(t: TensorType | None) -> tuple | None:
    """A float32 4-D type's shape with static channels and plane (positive ints) and a batch that
    is a positive int or a symbol (:func:`batch_ok`), else None."""
    return None if shape_reason(t, "value") is not None else tuple(t.shape)  # type: ignore[union-attr]


def geometry(plan: ConvPlan) -> dict[str, Any] | None:
    """What the blocked kernels need of the convolution (``group``, ``k``, ``strides``,
    ``dilations``, ``plain``: it reads its NCHW input directly, ``xs``, ``ys``), or None when they
    do not run it (:func:`decline_reason` says why)."""
    g = geometry_or_reason(plan)
    return g if isinstance(g, dict) else None


def decline_reason(plan: ConvPlan) -> str | None:
    """Why the blocked kernels do not run the convolution (a compile report's line), None when they do."""
    g = geometry_or_reason(plan)
    return g if isinstance(g, str) else None


def geometry_or_reason(plan: ConvPlan) -> dict[str, Any] | str:
    """:func:`geometry`'s dict, or why not: static float32 4-D input and output (the batch may be
    a symbol), a constant float32 4-D weight (and bias), ungrouped, depthwise or whole blocks a group."""
    spec = plan.spec
    if not plan.layout or len(spec.inputs) < 2 or len(spec.outputs) != 1:
        return "not a convolution of one input, one weight and one output"
    if plan.forced not in (None, NAME):
        return f"conv_algorithm {plan.forced} names an NCHW algorithm"
    why = shape_reason(spec.inputs[0], "input") or shape_reason(spec.outputs[0], "output")
    if why:
        return why
    xs, ys, wv = tuple(spec.inputs[0].shape), tuple(spec.outputs[0].shape), plan.w_const  # type: ignore[union-attr]
    if wv is None or wv.ndim != 4 or wv.dtype != np.float32:
        return "its weight is not a constant float32 (M, C, KH, KW) array (the blocked kernels pack it at compile time)"
    if plan.has_bias and (plan.b_const is None or plan.b_const.size != wv.shape[0]):
        return "its bias is not a constant of one value per output channel"
    group = int(spec.attr("group", 1) or 1)
    m, c = wv.shape[0], xs[1]
    # a network's first layer (3 channels) reads its NCHW input directly (no reorder, no padding
    # of 3 channels to a block); other channel counts must be whole blocks
    plain = c % BLOCK != 0 and c <= PLAIN_MAX_CHANNELS and group == 1
    depthwise = group == c == m and wv.shape[1] == 1
    # a grouped one (RegNet's, ResNeXt's): each group's input and output channels whole blocks
    whole_groups = group > 1 and wv.shape[1] * group == c and c % (group * BLOCK) == 0 and m % (group * BLOCK) == 0
    if group != 1 and not (depthwise or whole_groups):
        return f"group {group} is neither depthwise nor whole blocks of {BLOCK} channels a group ({c} in, {m} out)"
    if group == 1 and wv.shape[1] != c:
        return f"its weight's {wv.shape[1]} input channels do not match the input's {c}"
    k = tuple(int(v) for v in (spec.attr("kernel_shape") or wv.shape[2:]))
    if k != tuple(wv.shape[2:]):
        return f"kernel_shape {list(k)} contradicts the weight's {list(wv.shape[2:])}"
    strides = [int(v) for v in (spec.attr("strides") or (1, 1))]
    dil = [int(v) for v in (spec.attr("dilations") or (1, 1))]
    if len(strides) != 2 or len(dil) != 2 or min(strides + dil) < 1:
        return "not a 2-D convolution (strides, dilations)"
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
