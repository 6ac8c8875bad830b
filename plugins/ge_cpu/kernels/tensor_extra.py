"""Tensor kernels of the long tail: CumProd, ReverseSequence, Compress, EyeLike, ReduceLogSum."""

from __future__ import annotations

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.kernel import KernelSpec

from ._util import (
    const_input,
    has_input,
    in_dtype,
    ints,
    kernel_table,
    norm_axes,
    norm_axis,
    onnx_dtype,
    out_dtype,
    unsupported,
)

KERNELS, _reg = kernel_table()


def _exotic(dt: np.dtype) -> bool:
    """ml_dtypes types (bfloat16, float8): NumPy's reductions on them go through float32."""
    return dt.kind == "V" or dt.name == "bfloat16" or dt.name.startswith("float8")


# ------------------------------------------------------------------------------------------------
# CumProd


@_reg("CumProd")
def cumprod_factory(spec: KernelSpec):
    exclusive = bool(int(spec.attr("exclusive", 0) or 0))
    reverse = bool(int(spec.attr("reverse", 0) or 0))
    axis_const = const_input(spec, 1)

    def kernel(x, axis):
        a = np.asarray(axis_const if axis_const is not None else axis)
        if a.size != 1:
            raise ExecutionError(f"{spec.describe()}: axis must be a scalar, got shape {list(a.shape)}",
                                 hint="feed a 0-d axis")
        ax = norm_axis(int(a.reshape(-1)[0]), x.ndim)
        if not 0 <= ax < x.ndim:
            raise ExecutionError(f"{spec.describe()}: axis {int(a.reshape(-1)[0])} is out of range for rank "
                                 f"{x.ndim}", hint="fix the axis")
        xc = x.astype(np.float32) if _exotic(x.dtype) else x
        if reverse:
            xc = np.flip(xc, ax)
        if exclusive:
            res = np.ones(xc.shape, xc.dtype)
            n = xc.shape[ax]
            if n > 1:
                src = [slice(None)] * xc.ndim
                dst = [slice(None)] * xc.ndim
                src[ax] = slice(0, n - 1)
                dst[ax] = slice(1, n)
                np.cumprod(xc[tuple(src)], axis=ax, dtype=xc.dtype, out=res[tuple(dst)])
        else:
            res = np.cumprod(xc, axis=ax, dtype=xc.dtype)
        if reverse:
            res = np.flip(res, ax)
        return (np.ascontiguousarray(res, dtype=x.dtype),)

    return kernel


# ------------------------------------------------------------------------------------------------
# ReverseSequence


@_reg("ReverseSequence")
def reverse_sequence_factory(spec: KernelSpec):
    batch_axis = int(spec.attr("batch_axis", 1))
    time_axis = int(spec.attr("time_axis", 0))
    if sorted((batch_axis, time_axis)) != [0, 1]:
        raise unsupported(spec, f"batch_axis={batch_axis}, time_axis={time_axis} (one must be 0, the other 1)")

    def kernel(x, sequence_lens):
        steps, batch = x.shape[time_axis], x.shape[batch_axis]
        lens = np.asarray(sequence_lens).reshape(-1).astype(np.int64)
        if lens.shape[0] != batch or (lens.size and (lens.min() < 0 or lens.max() > steps)):
            raise ExecutionError(f"{spec.describe()}: sequence_lens {lens.tolist()} must have {batch} values in "
                                 f"[0, {steps}]", hint="one length per batch entry, at most the time axis' size")
        t = np.arange(steps)[:, None]
        src = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # (time, batch)
        b = np.arange(batch)[None, :]
        if time_axis == 0:
            return (x[src, b],)
        return (x[b.T, src.T],)

    return kernel


# ------------------------------------------------------------------------------------------------
# Compress


@_reg("Compress")
def compress_factory(spec: KernelSpec):
    axis_attr = spec.attr("axis")

    def kernel(x, condition):
        cond = np.asarray(condition).reshape(-1).astype(bool)
        if axis_attr is None:
            flat = x.reshape(-1)
            if cond.shape[0] > flat.shape[0]:
                raise ExecutionError(f"{spec.describe()}: condition has {cond.shape[0]} entries for "
                                     f"{flat.shape[0]} elements", hint="the condition may not be longer")
            return (flat[: cond.shape[0]][cond],)
        ax = norm_axis(int(axis_attr), x.ndim)
        if not 0 <= ax < x.ndim:
            raise ExecutionError(f"{spec.describe()}: axis {axis_attr} is out of range for rank {x.ndim}",
                                 hint="fix the axis")
        if cond.shape[0] > x.shape[ax]:
            raise ExecutionError(f"{spec.describe()}: condition has {cond.shape[0]} entries for axis size "
                                 f"{x.shape[ax]}", hint="the condition may not be longer than the axis")
        idx = np.flatnonzero(cond)
        return (np.take(x, idx, axis=ax),)

    return kernel


# ------------------------------------------------------------------------------------------------
# EyeLike


@_reg("EyeLike")
def eyelike_factory(spec: KernelSpec):
    k = int(spec.attr("k", 0) or 0)
    code = spec.attr("dtype")
    if code is not None:
        dt = onnx_dtype(spec, int(code))
    else:
        dt = in_dtype(spec, 0) or out_dtype(spec, 0)
    if dt is not None and (dt == np.dtype(object) or dt.kind == "c"):
        raise unsupported(spec, f"dtype {dt}")

    def kernel(x):
        if x.ndim != 2:
            raise ExecutionError(f"{spec.describe()}: EyeLike needs a 2-D input, got shape {list(x.shape)}",
                                 hint="feed a matrix")
        want = dt if dt is not None else x.dtype
        if _exotic(want):
            return (np.eye(x.shape[0], x.shape[1], k, dtype=np.float32).astype(want),)
        return (np.eye(x.shape[0], x.shape[1], k, dtype=want),)

    return kernel


# ------------------------------------------------------------------------------------------------
# ReduceLogSum


@_reg("ReduceLogSum")
def reduce_log_sum_factory(spec: KernelSpec):
    keep = bool(int(spec.attr("keepdims", 1)))
    noop = bool(int(spec.attr("noop_with_empty_axes", 0) or 0))
    if spec.opset < 18:
        static, dynamic = ints(spec.attr("axes")), False
    elif has_input(spec, 1):
        c = const_input(spec, 1)
        static, dynamic = (ints(c), False) if c is not None else (None, True)
    else:
        static, dynamic = None, False

    def kernel(x, axes=None):
        ax = ints(axes) if dynamic and axes is not None else static
        if not ax:
            # noop_with_empty_axes: a reduction over no axes (the log of each element)
            ax_t: tuple[int, ...] = () if noop else tuple(range(x.ndim))
        else:
            ax_t = tuple(sorted(set(norm_axes(ax, x.ndim))))
        xc = x.astype(np.float32) if _exotic(x.dtype) else x
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(np.sum(xc, axis=ax_t, keepdims=keep) if ax_t else xc)
        return (np.asarray(r).astype(x.dtype, copy=False),)

    return kernel
