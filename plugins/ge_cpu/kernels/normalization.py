"""Normalisation kernels: GroupNormalization (opsets 18 and 21), RMSNormalization, LpNormalization.

Stage one (the statistics and the normalised values) runs in the precision the spec asks for:
``stash_type`` (float32 by default, as the ONNX function bodies cast to it) for
GroupNormalization-21 and RMSNormalization, the input's own type for GroupNormalization-18;
float16/bfloat16 inputs without a stash type compute in float32. The variance is computed in two
passes (mean, then mean of squared deviations), which cannot go negative as
``E[x^2] - E[x]^2`` can.
"""

from __future__ import annotations

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.kernel import KernelSpec

from ._util import in_dtype, kernel_table, norm_axis, onnx_dtype, out_dtype, unsupported

KERNELS, _reg = kernel_table()

_FLOATS = ("float16", "float32", "float64", "bfloat16")


def _float_input(spec: KernelSpec, i: int = 0) -> np.dtype | None:
    dt = in_dtype(spec, i)
    if dt is not None and dt.name not in _FLOATS:
        raise unsupported(spec, f"input dtype {dt.name}")
    return dt


def _stash(spec: KernelSpec) -> np.dtype:
    code = int(spec.attr("stash_type", 1))
    dt = onnx_dtype(spec, code)
    if dt.name not in ("float32", "float64"):
        raise unsupported(spec, f"stash_type={code} ({dt.name}; float32 or float64 are supported)")
    return dt


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dt.name in ("float16", "bfloat16") else dt


@_reg("GroupNormalization")
def group_norm_factory(spec: KernelSpec):
    _float_input(spec)
    groups_attr = spec.attr("num_groups")
    if groups_attr is None:
        raise unsupported(spec, "a missing num_groups attribute")
    groups = int(groups_attr)
    if groups <= 0:
        raise unsupported(spec, f"num_groups={groups}")
    eps = float(spec.attr("epsilon", 1e-5))
    per_channel = spec.opset >= 21  # opset 18: scale/bias per group
    stash = _stash(spec) if per_channel else None

    def kernel(x, scale, bias):
        if x.ndim < 2:
            raise ExecutionError(f"{spec.describe()}: X must have rank >= 2, got shape {list(x.shape)}",
                                 hint="feed (N, C, ...)")
        n, c = x.shape[:2]
        if c % groups:
            raise ExecutionError(f"{spec.describe()}: {c} channels do not split into {groups} groups",
                                 hint="num_groups must divide the channel count")
        want = c if per_channel else groups
        if scale.size != want or bias.size != want:
            raise ExecutionError(f"{spec.describe()}: scale/bias need {want} values "
                                 f"({'one per channel' if per_channel else 'one per group'}), got "
                                 f"{scale.size}/{bias.size}", hint="check the scale and bias inputs")
        cdt = stash if stash is not None else _compute_dtype(x.dtype)
        xg = x.astype(cdt, copy=False).reshape(n, groups, -1)
        mean = xg.mean(axis=2, keepdims=True)
        d = xg - mean
        var = np.mean(np.square(d), axis=2, keepdims=True)
        var += cdt.type(eps)
        np.sqrt(var, out=var)
        d /= var
        if per_channel:
            # the function body casts the normalised values back to X's type, then scales
            y = d.reshape(n, c, -1).astype(x.dtype, copy=False)
            s, b = scale.astype(x.dtype).reshape(1, c, 1), bias.astype(x.dtype).reshape(1, c, 1)
        else:
            y = d.astype(_compute_dtype(x.dtype), copy=False)
            s = scale.astype(y.dtype).reshape(1, groups, 1)
            b = bias.astype(y.dtype).reshape(1, groups, 1)
        if y.dtype.name == "bfloat16":
            y = y.astype(np.float32)
            s, b = s.astype(np.float32), b.astype(np.float32)
        y = y * s
        y += b
        return (y.astype(x.dtype, copy=False).reshape(x.shape),)

    return kernel


@_reg("RMSNormalization")
def rms_norm_factory(spec: KernelSpec):
    _float_input(spec)
    axis = int(spec.attr("axis", -1))
    eps = float(spec.attr("epsilon", 1e-5))
    stash = _stash(spec)
    odt = out_dtype(spec, 0) or in_dtype(spec, 1)

    def kernel(x, scale):
        ax = norm_axis(axis, x.ndim)
        if not 0 <= ax < max(x.ndim, 1):
            raise ExecutionError(f"{spec.describe()}: axis {axis} is out of range for rank {x.ndim}",
                                 hint="fix the axis attribute")
        axes = tuple(range(ax, x.ndim))
        xu = x.astype(stash, copy=False)
        ms = np.mean(np.square(xu), axis=axes, keepdims=True)
        ms += stash.type(eps)
        np.sqrt(ms, out=ms)
        normed = xu / ms
        ydt = odt if odt is not None else scale.dtype
        cdt = _compute_dtype(ydt)
        # the function body casts the normalised values to the output type, then scales
        y = normed.astype(ydt, copy=False).astype(cdt, copy=False) * scale.astype(cdt, copy=False)
        return (y.astype(ydt, copy=False),)

    return kernel


@_reg("LpNormalization")
def lp_norm_factory(spec: KernelSpec):
    _float_input(spec)
    axis = int(spec.attr("axis", -1))
    p = int(spec.attr("p", 2))
    if p not in (1, 2):
        raise unsupported(spec, f"p={p} (only 1 and 2 are defined)")

    def kernel(x):
        ax = norm_axis(axis, x.ndim)
        cdt = _compute_dtype(x.dtype)
        xc = x.astype(cdt, copy=False)
        if p == 2:
            norm = np.sqrt(np.sum(np.square(xc), axis=ax, keepdims=True))
        else:
            norm = np.sum(np.abs(xc), axis=ax, keepdims=True)
        norm[norm == 0] = 1  # a zero norm means zeros along the axis: they stay zero, not NaN
        return ((xc / norm).astype(x.dtype, copy=False),)

    return kernel
