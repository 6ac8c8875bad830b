"""Neural-network kernels: Conv, ConvTranspose, pooling, LRN, normalisations, Softmax, Dropout.

The Conv kernel's algorithms (Winograd, the prepared and packed GEMM forms, the depthwise ones,
1x1, im2col) are a table of their own: :mod:`ge_cpu.kernels.conv`. The pooling ops share its
window geometry (:mod:`ge_cpu.kernels.conv.geometry`) and the compiled window loop
(:mod:`._window`)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ge_core.kernel import KernelSpec, with_caps
from ge_native import native, parallel
from ge_native.jit import enabled as jit_enabled

from . import _window, conv
from ._util import cast_like, const_input, has_input, in_dtype, ints, kernel_table, norm_axis, unsupported
from .conv.geometry import PlanCache as _PlanCache
from .conv.geometry import as4d as _as4d
from .conv.geometry import auto_pad_of as _auto_pad
from .conv.geometry import out_dtype_ok, window_plan
from .conv.geometry import out_target as _out_target
from .conv.geometry import pad_spatial as _pad_spatial
from .conv.geometry import plan_2d as _plan_2d
from .conv.geometry import position_slices as _position_slices
from .conv.geometry import spatial_rank as _spatial_rank

KERNELS, _reg = kernel_table()


# ---------------------------------------------------------------------------------------------
# Conv


KERNELS[("", "Conv")] = conv.factory


# ---------------------------------------------------------------------------------------------
# ConvTranspose


@_reg("ConvTranspose")
def conv_transpose_factory(spec: KernelSpec):
    auto_pad = _auto_pad(spec)
    group = int(spec.attr("group", 1))
    kernel_shape = ints(spec.attr("kernel_shape"))
    nd = _spatial_rank(spec, kernel_shape, 0, 1)
    if nd is None:
        raise unsupported(spec, "unknown spatial rank")
    strides = ints(spec.attr("strides")) or [1] * nd
    dilations = ints(spec.attr("dilations")) or [1] * nd
    pads_attr = ints(spec.attr("pads"))
    out_pad = ints(spec.attr("output_padding")) or [0] * nd
    output_shape = ints(spec.attr("output_shape"))
    w_const = const_input(spec, 1)
    b_const = const_input(spec, 2) if has_input(spec, 2) else None

    def plan(in_sp, k):
        eff = [(k[i] - 1) * dilations[i] + 1 for i in range(nd)]
        if output_shape is not None:
            osz = list(output_shape[-nd:])
            total = [strides[i] * (in_sp[i] - 1) + out_pad[i] + eff[i] - osz[i] for i in range(nd)]
            if auto_pad == "SAME_UPPER":
                pb = [t // 2 for t in total]
            else:
                pb = [t - t // 2 for t in total]
            return pb, osz
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            osz = [in_sp[i] * strides[i] for i in range(nd)]
            total = [strides[i] * (in_sp[i] - 1) + out_pad[i] + eff[i] - osz[i] for i in range(nd)]
            if auto_pad == "SAME_UPPER":
                pb = [t // 2 for t in total]
            else:
                pb = [t - t // 2 for t in total]
            return pb, osz
        pads = [0] * (2 * nd) if auto_pad == "VALID" or pads_attr is None else pads_attr
        pb = list(pads[:nd])
        osz = [strides[i] * (in_sp[i] - 1) + out_pad[i] + eff[i] - pads[i] - pads[nd + i]
               for i in range(nd)]
        return pb, osz

    plans = _PlanCache(lambda key: plan(*key))
    wpack = None
    if w_const is not None:
        c, mg = w_const.shape[:2]
        cg = c // group
        # (g, Mg*K, Cg): columns = W_g^T @ X_g
        wpack = np.ascontiguousarray(
            w_const.reshape(group, cg, mg * math.prod(w_const.shape[2:])).transpose(0, 2, 1))

    def kernel(x, w, b=None, out=None):
        if b_const is not None:
            b = b_const
        n, c = x.shape[:2]
        in_sp = x.shape[2:]
        mg = w.shape[1]
        k = w.shape[2:]
        kk = math.prod(k)
        cg = c // group
        m = mg * group
        pb, osz = plans((tuple(in_sp), tuple(k)))
        if any(p < 0 for p in pb):
            raise ValueError("ConvTranspose: negative padding")
        wt = wpack if wpack is not None else w.reshape(group, cg, mg * kk).transpose(0, 2, 1)
        xs = x.reshape(n, group, cg, math.prod(in_sp))
        cols = np.matmul(wt, xs)  # (n, g, mg*kk, P)
        cols = cols.reshape((n, m, kk) + tuple(in_sp))
        full = [max((in_sp[i] - 1) * strides[i] + (k[i] - 1) * dilations[i] + 1, pb[i] + osz[i])
                for i in range(nd)]
        y = np.zeros((n, m) + tuple(full), dtype=x.dtype)
        for j, pos in enumerate(itertools.product(*[range(ki) for ki in k])):
            sl = tuple(slice(pos[i] * dilations[i], pos[i] * dilations[i] + (in_sp[i] - 1) * strides[i] + 1,
                             strides[i]) for i in range(nd))
            y[(slice(None), slice(None)) + sl] += cols[:, :, j]
        y = y[(slice(None), slice(None)) + tuple(slice(pb[i], pb[i] + osz[i]) for i in range(nd))]
        if b is not None:
            y = y + b.reshape((m,) + (1,) * nd).astype(y.dtype, copy=False)
        else:
            y = np.ascontiguousarray(y)
        return (cast_like(y, x.dtype),)

    return kernel


# ---------------------------------------------------------------------------------------------
# pooling


def _pool_common(spec: KernelSpec):
    auto_pad = _auto_pad(spec)
    k = ints(spec.attr("kernel_shape"))
    if not k:
        raise unsupported(spec, "missing kernel_shape")
    nd = len(k)
    s = ints(spec.attr("strides")) or [1] * nd
    d = ints(spec.attr("dilations")) or [1] * nd
    pads = ints(spec.attr("pads")) or [0] * (2 * nd)
    ceil_mode = bool(spec.attr("ceil_mode", 0))
    if len(s) != nd or len(d) != nd or len(pads) != 2 * nd:
        raise unsupported(spec, "strides/dilations/pads whose length does not match kernel_shape")
    return auto_pad, k, s, d, pads, ceil_mode


def _lowest(dtype):
    if np.issubdtype(dtype, np.floating):
        return -np.inf
    if dtype == np.bool_:
        return False
    return np.iinfo(dtype).min


def _axis_taps(in_len, k, s, d, pb, out_len):
    """For each tap of a 1-D window: (first output, output count, first input) it contributes to.

    Taps that would read padding are clipped away, so pooling never needs a padded copy.
    """
    taps = []
    for j in range(k):
        off = j * d - pb
        lo = max(0, -(off // s)) if off < 0 else 0  # ceil(-off / s)
        hi = min(out_len, (in_len - 1 - off) // s + 1) if in_len - 1 - off >= 0 else 0
        if hi > lo:
            taps.append((lo, hi - lo, lo * s + off))
    return taps


def _separable_pool(x, plan_axes, ufunc, init):
    """Pool x over its spatial axes one axis at a time (max or sum windows are separable)."""
    y = x
    for ax, (taps, out_len, s) in plan_axes:
        shape = list(y.shape)
        shape[ax] = out_len
        if len(taps) == 1 and taps[0][0] == 0 and taps[0][1] == out_len:
            lo, cnt, start = taps[0]
            idx = [slice(None)] * y.ndim
            idx[ax] = slice(start, start + (cnt - 1) * s + 1, s)
            y = y[tuple(idx)]
            continue
        r = None
        full = [t for t in taps if t[0] == 0 and t[1] == out_len]
        rest = [t for t in taps if not (t[0] == 0 and t[1] == out_len)]
        src = [slice(None)] * y.ndim
        dst = [slice(None)] * y.ndim
        if full:
            lo, cnt, start = full[0]
            src[ax] = slice(start, start + (cnt - 1) * s + 1, s)
            r = y[tuple(src)].copy()
            full = full[1:]
        else:
            r = np.full(shape, init, y.dtype)
        for lo, cnt, start in full + rest:
            src[ax] = slice(start, start + (cnt - 1) * s + 1, s)
            dst[ax] = slice(lo, lo + cnt)
            d_ = tuple(dst)
            ufunc(r[d_], y[tuple(src)], out=r[d_])
        y = r
    return y


def _separable_plan(in_sp, k, s, d, pb, out):
    return [(2 + i, (_axis_taps(in_sp[i], k[i], s[i], d[i], pb[i], out[i]), out[i], s[i]))
            for i in range(len(k))]


def _pool_loop(kind, window_plans, x, nd, out, dv_of=None):
    """A 1-D/2-D float pool through the compiled window loop; None when it does not apply."""
    dt = x.dtype
    if dt not in _window.NP_DTYPES or x.ndim != nd + 2:
        return None
    in_sp = tuple(x.shape[2:])
    plan = window_plans(in_sp)
    if plan.out_hw == (1, 1):
        # one window over the plane (a global pool): NumPy's reduction is as fast, and needs no
        # loop compiled for its many taps
        return None
    osp = plan.out_hw if nd == 2 else plan.out_hw[1:]
    shape = x.shape[:2] + tuple(osp)
    if 0 in shape or 0 in x.shape:
        return None
    target = _out_target(out, shape, dt)
    dv = dv_of(in_sp, dt) if dv_of is not None else None
    if not _window.run(kind, plan, _as4d(x), _as4d(target), dv=dv, threads=parallel.native_width()):
        return None
    return _pool_result(target, out)


def _pool_result(y, out):
    if out is None:
        return (y,)
    if y is not out[0]:
        np.copyto(out[0], y)
    return out


def _pool_out(spec: KernelSpec, kernel, want_idx: bool = False):
    """Let the executor hand a float pool its output array (the loop writes it directly)."""
    dt = in_dtype(spec, 0)
    if not want_idx and dt is not None and dt in _window.NP_DTYPES and out_dtype_ok(spec, dt):
        with_caps(kernel, accepts_out=True)
    return kernel


@_reg("MaxPool")
def maxpool_factory(spec: KernelSpec):
    auto_pad, k, s, d, pads, ceil_mode = _pool_common(spec)
    nd = len(k)
    storage_order = int(spec.attr("storage_order", 0))
    want_idx = spec.num_outputs > 1

    def planner(in_sp):
        pb, pe, out, pend = window_plan(auto_pad, pads, in_sp, k, s, d, ceil_mode)
        return pb, pend, out, _position_slices(k, s, d, out), _separable_plan(in_sp, k, s, d, pb, out)

    plans = _PlanCache(planner)
    use_loop = nd <= 2 and not want_idx and _window.available()
    if use_loop:
        _window.prepare("max", math.prod(k), in_dtype(spec, 0))
    window_plans = _PlanCache(lambda in_sp: _plan_2d(in_sp, k, s, d, plans(in_sp)[0], plans(in_sp)[2]))

    def kernel(x, out=None):
        in_sp = x.shape[2:]
        if use_loop:
            r = _pool_loop("max", window_plans, x, nd, out)
            if r is not None:
                return r
        pb, pend, osp, slices, sep = plans(tuple(in_sp))
        if not want_idx:
            y = _separable_pool(x, sep, np.maximum, _lowest(x.dtype))
            return _pool_result(y if y.base is None else y.copy(), out)
        xp = _pad_spatial(x, pb, pend, _lowest(x.dtype))
        lead = (slice(None), slice(None))
        # Indices: flattened over the whole input (N*C*spatial), padding not counted.
        if storage_order:
            strides_el = [math.prod(in_sp[:i]) for i in range(nd)]
        else:
            strides_el = [math.prod(in_sp[i + 1:]) for i in range(nd)]
        coords = [np.arange(osp[i]) * s[i] - pb[i] for i in range(nd)]
        y = None
        best = None
        for pos, sl in zip(itertools.product(*[range(ki) for ki in k]), slices):
            flat = 0
            for i in range(nd):
                ci = (coords[i] + pos[i] * d[i]) * strides_el[i]
                flat = flat + ci.reshape((-1,) + (1,) * (nd - 1 - i))
            xs = xp[lead + sl]
            if y is None:
                y = xs.copy()
                best = np.broadcast_to(flat, x.shape[:2] + tuple(osp)).astype(np.int64)
            else:
                mask = xs > y
                np.copyto(y, xs, where=mask)
                np.copyto(best, np.broadcast_to(flat, best.shape), where=mask)
        plane = math.prod(in_sp)
        base = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * plane).reshape(
            x.shape[:2] + (1,) * nd)
        return (y, best + base)

    return _pool_out(spec, kernel, want_idx)


def _avg_divisor(in_sp, k, s, d, pb, pe, out, include_pad):
    """Per-output element counts of an average pool (separable: product of 1-D counts)."""
    div = None
    for i in range(len(k)):
        starts = np.arange(out[i]) * s[i] - pb[i]
        taps = starts[:, None] + np.arange(k[i]) * d[i]
        lo, hi = (-pb[i], in_sp[i] + pe[i]) if include_pad else (0, in_sp[i])
        cnt = ((taps >= lo) & (taps < hi)).sum(axis=1)
        cnt = cnt.reshape((-1,) + (1,) * (len(k) - 1 - i))
        div = cnt if div is None else div * cnt
    return div


@_reg("AveragePool")
def avgpool_factory(spec: KernelSpec):
    auto_pad, k, s, d, pads, ceil_mode = _pool_common(spec)
    include_pad = bool(spec.attr("count_include_pad", 0))

    def planner(in_sp):
        pb, pe, out, pend = window_plan(auto_pad, pads, in_sp, k, s, d, ceil_mode)
        div = _avg_divisor(in_sp, k, s, d, pb, pe, out, include_pad)
        full = math.prod(k)
        uniform = bool(np.all(div == full))
        return _separable_plan(in_sp, k, s, d, pb, out), (full if uniform else div)

    plans = _PlanCache(planner)
    nd = len(k)
    use_loop = nd <= 2 and _window.available()
    if use_loop:
        _window.prepare("avg", math.prod(k), in_dtype(spec, 0))

    def loop_planner(in_sp):
        pb, pe, out, _ = window_plan(auto_pad, pads, in_sp, k, s, d, ceil_mode)
        return _plan_2d(in_sp, k, s, d, pb, out)

    window_plans = _PlanCache(loop_planner)
    divisors: dict = {}

    def dv_of(in_sp, dt):
        # window counts per output element, flattened, in the input dtype
        dv = divisors.get((in_sp, dt))
        if dv is None:
            pb, pe, out, _ = window_plan(auto_pad, pads, in_sp, k, s, d, ceil_mode)
            div = _avg_divisor(in_sp, k, s, d, pb, pe, out, include_pad)
            dv = np.ascontiguousarray(np.broadcast_to(div, tuple(out)).reshape(-1), dtype=dt)
            if len(divisors) < 64:
                divisors[(in_sp, dt)] = dv
        return dv

    def whole_plane(in_sp):
        # one window that is the whole plane, no padding (ShuffleNet's closing 7x7 pool): a row
        # sum per plane (einsum's, no BLAS: the same bits at every thread count) over the count;
        # the separable pool ran 14 strided passes (95 us at 544 x 7 x 7, 5 here)
        pb, pe, out, _ = window_plan(auto_pad, pads, in_sp, k, s, d, ceil_mode)
        return (tuple(k) == tuple(in_sp) and not any(pb) and not any(pe) and all(o == 1 for o in out)
                and all(di == 1 for di in d))

    global_of = _PlanCache(whole_plane)

    def kernel(x, out=None):
        in_sp = tuple(x.shape[2:])
        if x.dtype in _window.NP_DTYPES and x.ndim == nd + 2 and global_of(in_sp) and 0 not in x.shape:
            n, c = x.shape[:2]
            y = np.einsum("ij->i", np.ascontiguousarray(x).reshape(n * c, -1))
            y /= y.dtype.type(math.prod(in_sp))
            return _pool_result(y.reshape((n, c) + (1,) * nd), out)
        if use_loop:
            r = _pool_loop("avg", window_plans, x, nd, out, dv_of)
            if r is not None:
                return r
        sep, div = plans(in_sp)
        y = _separable_pool(x, sep, np.add, 0)
        if y.base is not None or y is x:
            y = y.copy()
        if isinstance(div, int):
            if div != 1:
                y *= y.dtype.type(1.0 / div)
        else:
            y /= div.astype(y.dtype)
        return _pool_result(y, out)

    return _pool_out(spec, kernel)


@_reg("LpPool")
def lppool_factory(spec: KernelSpec):
    auto_pad, k, s, d, pads, ceil_mode = _pool_common(spec)
    p = float(spec.attr("p", 2))

    def kernel(x):
        pb, pe, out, pend = window_plan(auto_pad, pads, x.shape[2:], k, s, d, ceil_mode)
        xp = _pad_spatial(np.abs(x) ** x.dtype.type(p), pb, pend, 0)
        lead = (slice(None), slice(None))
        slices = _position_slices(k, s, d, out)
        y = xp[lead + slices[0]].copy()
        for sl in slices[1:]:
            y += xp[lead + sl]
        return ((y ** y.dtype.type(1.0 / p)).astype(x.dtype, copy=False),)

    return kernel


@_reg("GlobalAveragePool")
def global_avgpool_factory(spec: KernelSpec):
    ones: dict = {}  # (count, dtype) -> a vector of ones

    def kernel(x):
        axes = tuple(range(2, x.ndim))
        count = math.prod(x.shape[2:])
        if x.dtype in (np.float32, np.float64) and x.ndim >= 3 and x.flags.c_contiguous and count > 0 and x.size:
            # each plane's sum as a dot product with ones (BLAS's vector kernel: 3-7x NumPy's
            # reduction over the trailing axes on an SE block's planes), then the mean
            key = (count, x.dtype)
            v = ones.get(key)
            if v is None:
                if len(ones) >= 16:  # (dynamic shapes: a bounded memo)
                    ones.clear()
                v = ones[key] = np.ones(count, x.dtype)
            y = x.reshape(-1, count) @ v
            y /= x.dtype.type(count)
            return (y.reshape(x.shape[:2] + (1,) * len(axes)),)
        return (cast_like(x.mean(axis=axes, keepdims=True), x.dtype),)

    return kernel


@_reg("GlobalMaxPool")
def global_maxpool_factory(spec: KernelSpec):
    def kernel(x):
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)

    return kernel


@_reg("GlobalLpPool")
def global_lppool_factory(spec: KernelSpec):
    p = float(spec.attr("p", 2))

    def kernel(x):
        t = x.dtype.type
        r = (np.abs(x) ** t(p)).sum(axis=tuple(range(2, x.ndim)), keepdims=True) ** t(1.0 / p)
        return (cast_like(r, x.dtype),)

    return kernel


# ---------------------------------------------------------------------------------------------
# LRN and normalisations


@_reg("LRN")
def lrn_factory(spec: KernelSpec):
    size = spec.attr("size")
    if size is None:
        raise unsupported(spec, "missing 'size' attribute")
    size = int(size)
    alpha = float(spec.attr("alpha", 1e-4))
    beta = float(spec.attr("beta", 0.75))
    bias = float(spec.attr("bias", 1.0))
    before = (size - 1) // 2  # channels below; ceil((size-1)/2) above

    def kernel(x):
        t = x.dtype.type
        c = x.shape[1]
        sq = np.zeros((x.shape[0], c + size - 1) + x.shape[2:], x.dtype)
        np.square(x, out=sq[:, before:before + c])
        acc = sq[:, 0:c].copy()
        for i in range(1, size):
            acc += sq[:, i:i + c]
        acc *= t(alpha / size)
        acc += t(bias)
        if beta == 0.75:
            r = np.sqrt(acc)
            r *= np.sqrt(r)
        else:
            r = np.power(acc, t(beta))
        return (x / r,)

    return kernel


@_reg("BatchNormalization")
def batchnorm_factory(spec: KernelSpec):
    if int(spec.attr("training_mode", 0)):
        raise unsupported(spec, "training_mode=1")
    if spec.opset < 7 and spec.attr("is_test", 0) == 0 and spec.num_outputs > 1:
        raise unsupported(spec, "training outputs (is_test=0)")
    eps = float(spec.attr("epsilon", 1e-5))
    spatial = int(spec.attr("spatial", 1))
    consts = [const_input(spec, i) for i in range(1, 5)]
    n_out = spec.num_outputs

    def fold(scale, bias, mean, var):
        dt = scale.dtype
        a = (scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps))
        b = bias.astype(np.float64) - mean.astype(np.float64) * a
        return a.astype(dt), b.astype(dt)

    def shape_for(p, x):
        if p.ndim == 1 or spatial:
            return p.reshape((-1,) + (1,) * (x.ndim - 2))
        return p

    folded = fold(*consts) if all(c is not None for c in consts) else None
    dt = in_dtype(spec, 0)
    out_ok = n_out == 1 and dt is not None and dt.kind == "f" and dt.name != "bfloat16"

    def kernel(x, scale, bias, mean, var, out=None):
        a, b = folded if folded is not None else fold(scale, bias, mean, var)
        if out is not None:
            y = np.multiply(x, shape_for(a, x).astype(x.dtype, copy=False), out=out[0])
        else:
            y = x * shape_for(a, x).astype(x.dtype, copy=False)
        y += shape_for(b, x).astype(x.dtype, copy=False)
        if n_out == 1:
            return (y,)
        extra = [mean, var, mean, var][: n_out - 1]
        return (y, *extra)

    if out_ok:
        with_caps(kernel, accepts_out=True, inplace_ok=True)
    return kernel


_instnorm: dict[str, Any] = {}


def _instnorm_kernel(dt: np.dtype):
    """The native instance-norm rows for float32/float64 (ge_native's ``csrc/instnorm.c``: each
    (image, channel) row normalised, then the channel's gamma and beta), or None (no native kernels)."""
    if dt.name not in ("float32", "float64") or not jit_enabled("GE_CPU_JIT") or not native.available():
        return None
    if "mod" not in _instnorm:
        _instnorm["mod"] = native.build(native.c_source("instnorm.c"), ["instnorm_f32", "instnorm_f64"])
    mod = _instnorm["mod"]
    return None if mod is None else (mod.instnorm_f32 if dt == np.float32 else mod.instnorm_f64)


@_reg("InstanceNormalization")
def instancenorm_factory(spec: KernelSpec):
    eps = float(spec.attr("epsilon", 1e-5))
    dt0 = in_dtype(spec, 0)
    rows_fn = _instnorm_kernel(np.dtype(dt0)) if dt0 is not None else None  # built now, not on the first run
    gb_cache: dict = {}

    def native_rows(x, scale, bias):
        fn = rows_fn if rows_fn is not None and x.dtype == np.dtype(dt0) else None
        if fn is None or x.ndim < 3 or x.size == 0 or not x.flags.c_contiguous:
            return None
        n, c = x.shape[:2]
        key = (id(scale), id(bias), c)
        gb = gb_cache.get(key)
        if gb is None or gb[1] is not scale or gb[2] is not bias:
            both = np.concatenate([np.asarray(scale, x.dtype).reshape(-1), np.asarray(bias, x.dtype).reshape(-1)])
            if both.shape != (2 * c,):
                return None
            gb = gb_cache[key] = (both, scale, bias)
        y = np.empty_like(x)
        fn(x.reshape(n * c, -1), y.reshape(n * c, -1), gb[0], eps, c, parallel.threads())
        return (y,)

    def kernel(x, scale, bias):
        r = native_rows(x, scale, bias)
        if r is not None:
            return r
        axes = tuple(range(2, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        xc = x - mean
        var = np.mean(np.square(xc), axis=axes, keepdims=True)
        bshape = (-1,) + (1,) * (x.ndim - 2)
        y = xc / np.sqrt(var + x.dtype.type(eps))
        y *= scale.reshape(bshape).astype(x.dtype, copy=False)
        y += bias.reshape(bshape).astype(x.dtype, copy=False)
        return (y,)

    return kernel


@_reg("LayerNormalization")
def layernorm_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", -1))
    eps = float(spec.attr("epsilon", 1e-5))
    stash = int(spec.attr("stash_type", 1))
    n_out = spec.num_outputs

    def kernel(x, scale, bias=None):
        ax = norm_axis(axis, x.ndim)
        axes = tuple(range(ax, x.ndim))
        xc_src = x.astype(np.float32) if stash == 1 and x.dtype != np.float64 else x
        mean = xc_src.mean(axis=axes, keepdims=True)
        xc = xc_src - mean
        var = np.mean(np.square(xc), axis=axes, keepdims=True)
        inv = 1.0 / np.sqrt(var + xc.dtype.type(eps))
        y = xc * inv
        y = (y * scale).astype(x.dtype, copy=False)
        if bias is not None:
            y = y + bias
        outs = [cast_like(y, x.dtype)]
        # Mean and InvStdDev have the node's declared type (stash_type), whatever precision computed them
        declared = spec.outputs[1].dtype if n_out > 1 and spec.outputs[1] is not None else None
        sdt = declared if declared is not None else mean.dtype
        if n_out > 1:
            outs.append(mean.astype(sdt))
        if n_out > 2:
            outs.append(inv.astype(sdt))
        return tuple(outs)

    return kernel


@_reg("MeanVarianceNormalization")
def mvn_factory(spec: KernelSpec):
    axes = tuple(ints(spec.attr("axes")) or [0, 2, 3])

    def kernel(x):
        mean = x.mean(axis=axes, keepdims=True)
        xc = x - mean
        std = np.sqrt(np.mean(np.square(xc), axis=axes, keepdims=True))
        return (cast_like(xc / (std + x.dtype.type(1e-9)), x.dtype),)

    return kernel


# ---------------------------------------------------------------------------------------------
# Softmax family


def _softmax_axis(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.subtract(x, m)
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def _logsoftmax_axis(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.subtract(x, m)
    lse = np.log(np.sum(np.exp(e), axis=axis, keepdims=True))
    e -= lse
    return e


def _hardmax_axis(x, axis):
    idx = np.argmax(x, axis=axis)
    y = np.zeros_like(x)
    np.put_along_axis(y, np.expand_dims(idx, axis), 1, axis=axis)
    return y


def _softmax_like(fn):
    def factory(spec: KernelSpec):
        legacy = spec.opset < 13
        axis = int(spec.attr("axis", 1 if legacy else -1))

        if legacy:
            def kernel(x):
                if x.ndim == 0:
                    return (fn(x.reshape(1, 1), 1).reshape(()),)
                ax = norm_axis(axis, x.ndim)
                x2 = x.reshape(math.prod(x.shape[:ax]), -1)
                return (fn(x2, 1).reshape(x.shape),)
        else:
            def kernel(x):
                return (fn(x, norm_axis(axis, x.ndim)),)
        return kernel

    return factory


KERNELS[("", "Softmax")] = _softmax_like(_softmax_axis)
KERNELS[("", "LogSoftmax")] = _softmax_like(_logsoftmax_axis)
KERNELS[("", "Hardmax")] = _softmax_like(_hardmax_axis)


# ---------------------------------------------------------------------------------------------
# Dropout (inference only)


@_reg("Dropout")
def dropout_factory(spec: KernelSpec):
    want_mask = spec.num_outputs > 1
    mask_dtype = np.bool_
    if spec.opset < 10:
        mask_dtype = None  # same type as the input before opset 10
    if spec.opset >= 12:
        tm = const_input(spec, 2) if has_input(spec, 2) else None
        ratio = const_input(spec, 1) if has_input(spec, 1) else None
        if tm is not None and bool(np.asarray(tm).reshape(())) and not (
                ratio is not None and float(np.asarray(ratio).reshape(())) == 0.0):
            raise unsupported(spec, "training_mode=true (only inference is supported)")

    def kernel(x, ratio=None, training_mode=None):
        if training_mode is not None and bool(np.asarray(training_mode).reshape(())) and not (
                ratio is not None and float(np.asarray(ratio).reshape(())) == 0.0):
            raise ValueError(f"{spec.describe()}: training_mode=true is not supported")
        if not want_mask:
            return (x,)
        return (x, np.ones(x.shape, mask_dtype or x.dtype))

    return kernel
