"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSumExp/SumSquare, ArgMax/ArgMin."""

from __future__ import annotations

import numpy as np

from ge_core.kernel import KernelSpec

from ._util import cast_like, const_input, has_input, ints, norm_axes, norm_axis

KERNELS: dict = {}


def _sum(x, axes, keep):
    return np.sum(x, axis=axes, keepdims=keep)


def _mean(x, axes, keep):
    return np.mean(x, axis=axes, keepdims=keep)


def _max(x, axes, keep):
    if x.size == 0:
        return np.full(_out_shape(x.shape, axes, keep), _low(x.dtype), x.dtype)
    return np.max(x, axis=axes, keepdims=keep)


def _min(x, axes, keep):
    if x.size == 0:
        return np.full(_out_shape(x.shape, axes, keep), _high(x.dtype), x.dtype)
    return np.min(x, axis=axes, keepdims=keep)


def _prod(x, axes, keep):
    return np.prod(x, axis=axes, keepdims=keep)


def _l1(x, axes, keep):
    return np.sum(np.abs(x), axis=axes, keepdims=keep)


def _l2(x, axes, keep):
    return np.sqrt(np.sum(np.square(x), axis=axes, keepdims=keep))


def _sumsq(x, axes, keep):
    return np.sum(np.square(x), axis=axes, keepdims=keep)


def _logsumexp(x, axes, keep):
    if x.size == 0:
        return np.full(_out_shape(x.shape, axes, keep), -np.inf, x.dtype)
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    s = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return s if keep else np.squeeze(s, axis=axes)


def _low(dt):
    if dt == np.bool_:
        return False
    return -np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).min


def _high(dt):
    if dt == np.bool_:
        return True
    return np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).max


def _out_shape(shape, axes, keep):
    axes = set(range(len(shape)) if axes is None else axes)
    if keep:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


_FNS = {
    "ReduceSum": (_sum, 13),
    "ReduceMean": (_mean, 18),
    "ReduceMax": (_max, 18),
    "ReduceMin": (_min, 18),
    "ReduceProd": (_prod, 18),
    "ReduceL1": (_l1, 18),
    "ReduceL2": (_l2, 18),
    "ReduceSumSquare": (_sumsq, 18),
    "ReduceLogSumExp": (_logsumexp, 18),
}


def _make_reduce(op: str):
    fn, input_axes_from = _FNS[op]

    def factory(spec: KernelSpec):
        keep = bool(spec.attr("keepdims", 1))
        noop = bool(spec.attr("noop_with_empty_axes", 0))
        if spec.opset < input_axes_from:
            static = ints(spec.attr("axes"))
            dynamic = False
        elif has_input(spec, 1):
            c = const_input(spec, 1)
            static, dynamic = (ints(c), False) if c is not None else (None, True)
        else:
            static, dynamic = None, False

        def kernel(x, axes=None):
            ax = ints(axes) if dynamic and axes is not None else static
            if not ax:
                if noop:
                    return (x,)
                ax_t = tuple(range(x.ndim))
            else:
                ax_t = tuple(sorted(set(norm_axes(ax, x.ndim))))
            r = fn(x, ax_t, keep)
            return (cast_like(np.asarray(r), x.dtype),)

        return kernel

    return factory


for _op in _FNS:
    KERNELS[("", _op)] = _make_reduce(_op)


def _make_arg(fn):
    def factory(spec: KernelSpec):
        axis = int(spec.attr("axis", 0))
        keep = bool(spec.attr("keepdims", 1))
        last = bool(spec.attr("select_last_index", 0))

        def kernel(x):
            ax = norm_axis(axis, x.ndim)
            if last:
                r = x.shape[ax] - 1 - fn(np.flip(x, ax), axis=ax)
            else:
                r = fn(x, axis=ax)
            r = np.asarray(r, dtype=np.int64)
            if keep:
                r = np.expand_dims(r, ax)
            return (r,)

        return kernel

    return factory


KERNELS[("", "ArgMax")] = _make_arg(np.argmax)
KERNELS[("", "ArgMin")] = _make_arg(np.argmin)
