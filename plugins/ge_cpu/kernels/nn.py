"""Neural-network kernels: Conv, ConvTranspose, pooling, LRN, normalisations, Softmax, Dropout.

Convolution strategy (all per call work is a handful of large NumPy/BLAS calls):

* 1x1, unpadded conv: a direct batched GEMM on the (strided) input, no im2col;
* depthwise conv (group == C, one input channel per group), 1-D or 2-D, float32/float64: a
  compiled loop per plane (:mod:`._window`, native C); without it (or for other dtypes and
  ranks) a loop over the *kernel positions* only, each one a multiply-add over the whole tensor;
* everything else: pad once, im2col through ``sliding_window_view`` (one copy into the column
  matrix) and a single ``np.matmul`` for all groups and the whole batch.
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ge_core.kernel import KernelSpec, with_caps
from ge_native import native, nchwc, parallel, sgemm
from ge_native.jit import enabled as jit_enabled

from . import _window, winograd
from ._util import as_str, cast_like, const_input, has_input, in_dtype, ints, kernel_table, norm_axis, unsupported

KERNELS, _reg = kernel_table()


_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _auto_pad(spec: KernelSpec) -> str:
    ap = as_str(spec.attr("auto_pad"), "NOTSET") or "NOTSET"
    if ap not in _AUTO_PADS:
        raise unsupported(spec, f"auto_pad={ap!r}")
    return ap


def _spatial_rank(spec: KernelSpec, kernel_shape, input_index: int = 0, weight_index: int | None = None):
    if kernel_shape is not None:
        return len(kernel_shape)
    if weight_index is not None:
        w = const_input(spec, weight_index)
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


def _pad_spatial(x, pb, pe, value=0):
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


def _position_slices(k, s, d, out):
    """For every kernel position, the tuple of spatial slices of the padded input it reads."""
    res = []
    for pos in itertools.product(*[range(ki) for ki in k]):
        res.append(tuple(slice(pos[i] * d[i], pos[i] * d[i] + (out[i] - 1) * s[i] + 1, s[i])
                         for i in range(len(k))))
    return res


def _plan_2d(in_sp, k, s, d, pb, out_sp) -> _window.WindowPlan:
    """The compiled window loop's plan of a 1-D or 2-D window op (1-D runs as one row)."""
    if len(in_sp) == 1:
        return _window.WindowPlan((1, in_sp[0]), (1, k[0]), (1, s[0]), (1, d[0]), (0, pb[0]), (1, out_sp[0]))
    return _window.WindowPlan(in_sp, k, s, d, pb, out_sp)


def _as4d(a: np.ndarray) -> np.ndarray:
    return a if a.ndim == 4 else a.reshape(a.shape[:2] + (1,) + a.shape[2:])


def _out_target(out, shape, dt):
    """The caller's output array when the loop can write it directly, else a new one."""
    o = out[0] if out is not None else None
    if o is not None and o.dtype == dt and o.shape == shape and o.flags.c_contiguous and o.flags.writeable:
        return o
    return np.empty(shape, dt)


class _PlanCache:
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


# ---------------------------------------------------------------------------------------------
# Conv

#: Element count (64 MiB of float32) above which the im2col matrix is built and multiplied in
#: blocks of output rows: a memory guard; blocking does not make the GEMM faster here.
_COLS_BLOCK = 1 << 24


def _conv2d_sgemm(x, wk, b, out, shape, group, k, strides, dilations, pb, epi, rows=None):
    """A 2-D convolution per image on GE's own GEMM (:func:`ge_native.sgemm.conv2d`: the column
    matrix packed straight into its panels, the bias and the caller's epilogue ``epi`` at the
    store), written into the planned output; None when that path does not run these arrays. A
    1-D convolution (wav2vec2's feature extractor and its grouped positional conv) runs as a
    2-D one of height 1. ``rows``: the constant weight as :class:`ge_native.sgemm.RowPanels`, or
    None (then ``wk`` is read in place)."""
    if x.dtype != np.float32 or wk.dtype != np.float32 or x.ndim not in (3, 4) or not sgemm.available():
        return None
    out_hw = tuple(shape[2:])
    if x.ndim == 3:
        x = x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])
        k, strides, dilations, pb, out_hw = (1, k[0]), (1, strides[0]), (1, dilations[0]), (0, pb[0]), (1,) + out_hw
    x = np.ascontiguousarray(x)
    n, m = shape[:2]
    bias, clip, z3, act = _epilogue_args(b, shape, epi)
    if bias is False:
        return None
    w2 = wk.reshape(m, -1) if rows is None else rows
    width = parallel.native_width()
    geo = (group, tuple(k), tuple(strides), tuple(dilations), (pb[0], pb[1]), out_hw)
    return _per_image(shape, out, z3, epi, lambda i, t2, z2: sgemm.conv2d(x[i], w2, t2, *geo, bias, clip, width, z2, act))


def _per_image(shape, out, z3, epi, run_one):
    """Run ``run_one(i, output (M, P), addend (M, P) or None) -> bool`` for each image into the
    planned output (or a new array); the outputs, or None when it refused the first image (the
    caller's BLAS form runs; the arrays are alike, so a refusal comes at the first or never)."""
    n, m = shape[:2]
    target = _out_target(out, shape, np.float32)
    if z3 is not None and np.may_share_memory(target, z3):
        target = np.empty(shape, np.float32)
    t3 = target.reshape(n, m, -1)
    for i in range(n):
        if not run_one(i, t3[i], None if z3 is None else z3[i]):
            return None
    if epi is not None:
        epi["applied"] = True
    return _delivered(target, out)


def _delivered(target, out):
    """The kernel's outputs for a result in ``target``: ``out`` (the planned output, ``target``
    copied into it when it is another array) when the caller gave one, else ``(target,)``."""
    if out is None:
        return (target,)
    if target is not out[0]:
        np.copyto(out[0], target)
    return out


def _epilogue_args(b, shape, epi):
    """``(bias, clip, addend per image, act)`` for a GEMM path from a conv's bias and epilogue;
    ``bias`` False when they do not fit it."""
    n, m = shape[:2]
    bias = None
    if b is not None:
        bias = np.asarray(b)
        if bias.dtype != np.float32 or bias.size != m:
            return False, None, None, None
        bias = np.ascontiguousarray(bias.reshape(-1))
    if epi is None:
        return bias, None, None, None
    z = epi["addend"]
    if z is not None and (z.dtype != np.float32 or z.shape != shape or not z.flags.c_contiguous):
        return False, None, None, None
    return bias, epi["clip"], None if z is None else z.reshape(n, m, -1), epi["act"]


def _pointwise_sgemm(wk, xs, b, out, shape, epi=None, rows=None):
    """A 1x1 convolution (or an im2col column matrix) as ``W @ X`` per image on GE's own GEMM
    (:mod:`ge_native.sgemm`: the activation packed by the call; the bias and the caller's epilogue
    ``epi`` -- an addend, a clip, an activation: :class:`ge_core.kernel.KernelCaps` -- applied
    at the store), written into the planned output; None when that path does not run these
    arrays (the caller's BLAS form runs). ``rows``: the constant weight as
    :class:`ge_native.sgemm.RowPanels`, or None."""
    if xs.dtype != np.float32 or wk.dtype != np.float32 or not xs.flags.c_contiguous or not sgemm.available():
        return None
    n, m = shape[:2]
    bias, clip, z3, act = _epilogue_args(b, shape, epi)
    if bias is False:
        return None
    width = parallel.native_width()
    a = wk[0] if rows is None else rows
    return _per_image(shape, out, z3, epi, lambda i, t2, z2: sgemm.matmul_rows(a, xs[i], t2, bias, clip, width, z2, act))


@_reg("Conv")
def conv_factory(spec: KernelSpec):
    auto_pad = _auto_pad(spec)
    group = int(spec.attr("group", 1))
    kernel_shape = ints(spec.attr("kernel_shape"))
    nd = _spatial_rank(spec, kernel_shape, 0, 1)
    if nd is None:
        raise unsupported(spec, "unknown spatial rank (no kernel_shape and untyped weights)")
    strides = ints(spec.attr("strides")) or [1] * nd
    dilations = ints(spec.attr("dilations")) or [1] * nd
    pads = ints(spec.attr("pads")) or [0] * (2 * nd)
    if len(strides) != nd or len(dilations) != nd or len(pads) != 2 * nd:
        raise unsupported(spec, "strides/dilations/pads whose length does not match the kernel rank")
    if any(p < 0 for p in pads):
        raise unsupported(spec, "negative pads")

    w_const = const_input(spec, 1)
    b_const = const_input(spec, 2) if has_input(spec, 2) else None
    packed = {}

    def pack(w):
        m = w.shape[0]
        return w.reshape(group, m // group, -1)

    if w_const is not None:
        packed["w"] = np.ascontiguousarray(pack(w_const))
        packed["dw"] = None
    algorithm = str(spec.options.get("conv_algorithm", "auto") or "auto")
    x_shape = tuple(spec.inputs[0].shape) if spec.inputs and spec.inputs[0] is not None and spec.inputs[0].shape else ()
    wino = None  # Winograd F(2x2, 3x3), chosen once here by the cost model (winograd.applies)
    if (w_const is not None and nd == 2 and algorithm != "im2col" and w_const.dtype in (np.float32, np.float64)
            and winograd.applies(x_shape, w_const.shape, strides, dilations, group, w_const.dtype,
                                 pays=algorithm in ("auto", "winograd4"))):
        wino = winograd.Winograd(w_const, group=group)

    def planner(key):
        in_sp, k = key
        return window_plan(auto_pad, pads, in_sp, k, strides, dilations)

    plans = _PlanCache(planner)

    def window_planner(key):
        pb, _, out_sp, _ = plans(key)
        return _plan_2d(key[0], key[1], strides, dilations, pb, out_sp)

    window_plans = _PlanCache(window_planner)
    # depthwise 1-D/2-D convs run the compiled window loop (decided once, when the kernel is built)
    use_loop = nd <= 2 and group > 1 and _window.available()
    if use_loop and w_const is not None:
        _window.prepare("conv", math.prod(w_const.shape[2:]), in_dtype(spec, 0))  # built now, not on the first run
    loop_w: dict = {}  # constant weights as (M, taps) and bias as (M,) per dtype
    # the constant float32 weight packed once for GE's GEMM (one sequential stream per row block)
    # (not a depthwise one: the window loop runs those)
    w_rows = None
    if (in_dtype(spec, 0) == np.float32 and wino is None and w_const is not None and w_const.dtype == np.float32
            and w_const.ndim >= 3 and (group == 1 or w_const.shape[1] > 1) and sgemm.available()):
        w_rows = sgemm.RowPanels(np.ascontiguousarray(w_const.reshape(w_const.shape[0], -1)), group)

    # the layer's GEMM call prepared once for its static input shape (ge_native.sgemm.Conv2d): the
    # general path below re-derived the geometry, the bias and the epilogue's arguments on every
    # call, most of a small layer's time (ShuffleNet's grouped 1x1 layers: 11.5 -> 7 us a call)
    fast = None
    if (w_rows is not None and nd == 2 and len(x_shape) == 4 and all(isinstance(v, int) and v > 0 for v in x_shape)
            and x_shape[1] == w_const.shape[1] * group and (b_const is not None or not has_input(spec, 2))):
        k2 = tuple(int(v) for v in w_const.shape[2:])
        pb0, _, out_sp0, _ = plans((tuple(x_shape[2:]), k2))
        try:
            fast = (tuple(x_shape), (x_shape[0], w_const.shape[0]) + tuple(out_sp0),
                    sgemm.Conv2d(w_rows, group, k2, strides, dilations, (pb0[0], pb0[1]), tuple(out_sp0), b_const))
        except ValueError:
            fast = None

    # a 3x3 (or smaller) depthwise layer with a constant weight and a static input shape: its
    # direct-kernel call prepared once (_window.DirectConv; the general path spent 10 us of a
    # ShuffleNet layer's 32 re-deriving it)
    dw_fast = None
    if (use_loop and w_const is not None and nd == 2 and w_const.shape[1] == 1 and w_const.shape[0] == group
            and min(w_const.shape[2:]) < 5 and in_dtype(spec, 0) == np.float32 and w_const.dtype == np.float32
            and len(x_shape) == 4 and all(isinstance(v, int) and v > 0 for v in x_shape) and x_shape[1] == group
            and (b_const is not None or not has_input(spec, 2)) and _window.direct_available()):
        k2 = tuple(int(v) for v in w_const.shape[2:])
        dw_shape = (x_shape[0], group) + tuple(plans((tuple(x_shape[2:]), k2))[2])
        bias0 = np.zeros(group, np.float32) if b_const is None else np.asarray(b_const, np.float32).reshape(-1)
        try:
            dw_fast = (tuple(x_shape), dw_shape,
                       _window.DirectConv(window_plans((tuple(x_shape[2:]), k2)), x_shape, dw_shape,
                                          w_const.reshape(group, -1), bias0))
        except ValueError:
            dw_fast = None

    def _fast_dw(x, out, epi):
        """The prepared depthwise call (``dw_fast``) into the planned output; None when it does not apply."""
        shape, call = dw_fast[1], dw_fast[2]
        target = _out_target(out, shape, np.float32)
        clip = act = None
        if epi is not None and epi["addend"] is None:
            clip, act = epi["clip"], epi["act"]
        if not call.run(x, target, parallel.native_width(), clip, act):
            return None
        if epi is not None and (clip is not None or act is not None):
            epi["applied"] = True
        return _delivered(target, out)

    def _fast_conv(x, out, epi):
        """The prepared call (``fast``) into the planned output; None when it does not apply."""
        shape, call = fast[1], fast[2]
        fits, clip, z3, act = _epilogue_args(None, shape, epi)  # (the bias is the call's own)
        if fits is False:
            return None
        width = parallel.native_width()
        return _per_image(shape, out, z3, epi, lambda i, t2, z2: call.run(x[i], t2, clip, width, z2, act))

    # a 2-D depthwise one with a constant weight through the blocked layout's kernel, its planes
    # reordered in and out by the call (onnxruntime runs a lone depthwise layer so too): the NCHW
    # window loop ran ConvNeXt's 7x7 layers 2-5x slower (768 channels at 7x7: 0.30 ms, 0.055)
    dw_blocked: dict = {}
    # (5x5 and wider: a 3x3 one ran as fast or faster in the window loop, ShuffleNet's 16 layers 1.33 ms
    # there, 1.59 through the blocked kernel)
    if (nd == 2 and group > 1 and w_const is not None and w_const.dtype == np.float32 and w_const.shape[1] == 1
            and w_const.shape[0] == group and min(w_const.shape[2:]) >= 5
            and nchwc.available()):
        dw_blocked["w"] = nchwc.pack_depthwise(w_const)
        dw_blocked["b"] = nchwc.pad_bias(b_const, group) if b_const is not None else None
    local = threading.local()

    def _depthwise_nchwc(x, b, out, key, epi=None):
        """The depthwise conv on the blocked kernel, the caller's clip and activation applied there
        (an addend: not this path); None when it does not apply."""
        if not dw_blocked or x.dtype != np.float32 or x.ndim != 4 or x.shape[1] != group:
            return None
        if epi is not None and epi["addend"] is not None:
            return None
        if b is not None and b is not b_const:
            return None
        pb, pe, out_sp, _ = plans(key)
        n = x.shape[0]
        shape = (n, group) + tuple(out_sp)
        if 0 in shape or 0 in x.shape:
            return None
        xs5, ys5 = nchwc.blocked_shape(x.shape), nchwc.blocked_shape(shape)
        bufs = getattr(local, "bufs", None)
        if bufs is None or bufs[0].shape != xs5 or bufs[1].shape != ys5:
            bufs = local.bufs = (np.empty(xs5, np.float32), np.empty(ys5, np.float32))
        x5, y5 = bufs
        width = parallel.native_width()
        clip = act = None
        if epi is not None:
            clip, act = epi["clip"], epi["act"]
        target = _out_target(out, shape, np.float32)
        if not (nchwc.to_blocked(np.ascontiguousarray(x), x5, width)
                and nchwc.depthwise(x5, dw_blocked["w"], y5, tuple(key[1]), tuple(strides), tuple(dilations),
                                    (pb[0], pb[1]), dw_blocked["b"], clip, width, None, act)
                and nchwc.from_blocked(y5, target, width)):
            return None
        if epi is not None and (clip is not None or act is not None):
            epi["applied"] = True
        return _delivered(target, out)

    def _depthwise_loop(x, w, b, out, key, epi=None):
        """Depthwise conv through the compiled window loop, its planes split over the run's
        threads and the caller's clip and activation (``epi``, no addend) applied as it writes;
        None when it does not apply."""
        dt = x.dtype
        if dt not in _window.NP_DTYPES or w.dtype != dt or x.ndim != nd + 2:
            return None
        n, m = x.shape[0], w.shape[0]
        out_sp = plans(key)[2]
        shape = (n, m) + tuple(out_sp)
        if 0 in shape or 0 in x.shape:
            return None
        wt = loop_w.get(("w", dt)) if w_const is not None else None
        if wt is None:
            wt = np.ascontiguousarray(w.reshape(m, -1), dtype=dt)
            if w_const is not None:
                loop_w[("w", dt)] = wt
        bkey = ("b", dt, m) if b is None or b is b_const else None
        bias = loop_w.get(bkey) if bkey is not None else None
        if bias is None:
            bias = np.zeros(m, dt) if b is None else np.ascontiguousarray(np.asarray(b).reshape(-1), dtype=dt)
            if bkey is not None:
                loop_w[bkey] = bias
        if bias.shape != (m,):
            return None
        target = _out_target(out, shape, dt)
        clip = act = None
        if epi is not None and epi["addend"] is None and (epi["act"] is None or dt == np.float32):
            clip, act = epi["clip"], epi["act"]
        if not _window.run("conv", window_plans(key), _as4d(x), _as4d(target), wt, bias,
                           threads=parallel.native_width(), clip=clip, act=act):
            return None
        if epi is not None and (clip is not None or act is not None):
            epi["applied"] = True
        return _delivered(target, out)

    def _empty_conv(x, w, b, out):
        """The result of a convolution with an empty extent (a batch, channels, plane or kernel
        of 0): an empty output, or (no input channels, an empty kernel) the bias alone."""
        if x.ndim != nd + 2 or w.ndim != nd + 2:
            raise ValueError(f"Conv: input {x.shape} and weight {w.shape} are not {nd}-D convolution operands")
        n, c, m = x.shape[0], x.shape[1], w.shape[0]
        if c % group or m % group or w.shape[1] != c // group:
            raise ValueError(f"Conv: input channels {c} / group {group} do not match weights {w.shape}")
        out_sp = plans((x.shape[2:], w.shape[2:]))[2]
        if any(o < 0 for o in out_sp):
            raise ValueError(f"Conv: input {x.shape} is smaller than the kernel {w.shape[2:]} with these pads")
        shape = (n, m) + tuple(out_sp)
        target = _out_target(out, shape, x.dtype)
        target.fill(0)
        if b is not None and target.size:
            bv = np.asarray(b).reshape(-1)
            if bv.shape != (m,):
                raise ValueError(f"Conv: a bias of {bv.size} values for {m} output channels")
            target += bv.astype(x.dtype).reshape((m,) + (1,) * nd)
        return _delivered(target, out)

    def kernel(x, w, b=None, out=None, *, clip=None, addend=None, act=None):
        if clip is None and addend is None and act is None:
            return conv(x, w, b, out)
        epi = {"clip": clip, "addend": addend, "act": act, "applied": False}
        res = conv(x, w, b, out, epi)
        return res, epi["applied"]

    def conv(x, w, b=None, out=None, epi=None):
        if 0 in x.shape or 0 in w.shape:  # an empty extent first: no native path takes one
            return _empty_conv(x, w, b_const if b_const is not None else b, out)
        if fast is not None and w is w_const and x.shape == fast[0] and x.dtype == np.float32 and x.flags.c_contiguous:
            r = _fast_conv(x, out, epi)
            if r is not None:
                return r
        if dw_fast is not None and w is w_const and x.shape == dw_fast[0] and x.dtype == np.float32 \
                and x.flags.c_contiguous:
            r = _fast_dw(x, out, epi)
            if r is not None:
                return r
        if b_const is not None:
            b = b_const
        n, c = x.shape[:2]
        m = w.shape[0]
        k = w.shape[2:]
        cg = c // group
        if w.shape[1] != cg or c % group or m % group:
            raise ValueError(f"Conv: input channels {c} / group {group} do not match weights {w.shape}")
        in_sp = x.shape[2:]
        if dw_blocked and w is w_const and cg == 1 and group == c:
            r = _depthwise_nchwc(x, b, out, (in_sp, k), epi)
            if r is not None:
                return r
        if use_loop and cg == 1 and group == c:
            r = _depthwise_loop(x, w, b, out, (in_sp, k), epi)
            if r is not None:
                return r
        pb, pe, out_sp, _ = plans((in_sp, k))
        if 0 in out_sp:
            return _empty_conv(x, w, b, out)
        if wino is not None and w is w_const and x.dtype == wino.dtype and x.ndim == 4:
            o = out[0] if out is not None and out[0].flags.c_contiguous else None
            y = wino.run(x, (pb[0], pb[1], pe[0], pe[1]), out=o, bias=b)
            if out is not None and o is None:
                np.copyto(out[0], y)
                return out
            return (y,) if o is None else out
        wk = packed["w"] if w_const is not None else pack(w)
        p = math.prod(out_sp)
        # every 1-D/2-D convolution but a depthwise one on GE's GEMM (a 1x1 stride-1 one too, at
        # every plane size: its panels are copies of the activation's rows, and the weight is
        # packed once; BLAS packs both on every call and needs a pass of its own for the epilogue)
        if nd <= 2 and not (cg == 1 and group == c and group > 1):
            done = _conv2d_sgemm(x, wk, b, out, (n, m) + tuple(out_sp), group, k, strides, dilations, pb, epi,
                                 w_rows if w is w_const else None)
            if done is not None:
                return done
        if all(ki == 1 for ki in k) and not any(pb) and not any(pe):
            xs = x
            if any(si != 1 for si in strides):
                xs = x[(slice(None), slice(None)) + tuple(slice(None, None, si) for si in strides)]
            xs = xs.reshape(n, group, cg, p) if group > 1 else xs.reshape(n, cg, p)
            done = (_pointwise_sgemm(wk, xs, b, out, (n, m) + tuple(out_sp), epi, w_rows if w is w_const else None)
                    if group == 1 else None)
            if done is not None:
                return done
            if out is not None and group == 1:
                y = parallel.matmul(wk[0], xs, out=out[0].reshape(n, m, p))
            else:
                y = np.matmul(wk, xs) if group > 1 else parallel.matmul(wk[0], xs)
        elif cg == 1 and group == c and group > 1:
            y = _depthwise(x, w, pb, pe, out_sp, k)
        else:  # (one input channel and one group, wav2vec2's first conv: a K=taps GEMM, not 128 passes)
            xp = _pad_spatial(x, pb, pe)
            eff = [(k[i] - 1) * dilations[i] + 1 for i in range(nd)]
            v = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
            v = v[(slice(None), slice(None))
                  + tuple(slice(0, (out_sp[i] - 1) * strides[i] + 1, strides[i]) for i in range(nd))
                  + tuple(slice(None, None, di) for di in dilations)]
            perm = (0, 1) + tuple(range(2 + nd, 2 + 2 * nd)) + tuple(range(2, 2 + nd))
            kdim = cg * math.prod(k)
            rows = out_sp[0]
            row_p = p // rows if rows else 0
            # Tile over the first output axis when the column matrix would be large, so the
            # im2col copy and the GEMM work on bounded blocks (peak memory stays low).
            step = max(1, _COLS_BLOCK // max(1, n * c * math.prod(k) * row_p))
            if step >= rows:
                cols = v.transpose(perm).reshape(n, group, kdim, p)
                done = _pointwise_sgemm(wk, cols[:, 0], b, out, (n, m) + tuple(out_sp), epi) if group == 1 else None
                if done is not None:
                    return done
                if group > 1 and n == 1:
                    y = parallel.matmul(wk, cols[0])[None]  # a task per group on the run's threads
                elif group > 1:
                    y = np.matmul(wk, cols)
                elif out is not None:
                    y = parallel.matmul(wk[0], cols[:, 0], out=out[0].reshape(n, m, p))
                else:
                    y = parallel.matmul(wk[0], cols[:, 0])
            else:
                y = np.empty((n, group, m // group, rows, row_p), x.dtype)
                vt = v.transpose(perm)
                for r0 in range(0, rows, step):
                    r1 = min(rows, r0 + step)
                    blk = vt[(Ellipsis, slice(r0, r1)) + (slice(None),) * (nd - 1)]
                    cols = blk.reshape(n, group, kdim, (r1 - r0) * row_p)
                    part = np.matmul(wk, cols) if group > 1 else parallel.matmul(wk[0], cols[:, 0])[:, None]
                    y[:, :, :, r0:r1] = part.reshape(n, group, m // group, r1 - r0, row_p)
        y = y.reshape((n, m) + tuple(out_sp))
        if out is not None:
            o = out[0]
            if not np.shares_memory(y, o):
                np.copyto(o, y)
            if b is not None:
                o += b.reshape((m,) + (1,) * nd).astype(o.dtype, copy=False)
            return out
        if b is not None:
            y += b.reshape((m,) + (1,) * nd).astype(y.dtype, copy=False)
        return (cast_like(y, x.dtype),)

    dw_cache: dict = {}

    def _depthwise(x, w, pb, pe, out_sp, k):
        n, c = x.shape[:2]
        mult = w.shape[0] // c
        if mult == 1 and nd == 2 and x.dtype.kind == "f":
            return _depthwise_nhwc(x, w, pb, pe, out_sp, k)
        xp = _pad_spatial(x, pb, pe)
        wd = w.reshape((c, mult) + tuple(k))
        y = None
        tmp = None
        lead = (slice(None), slice(None))
        for pos, sl in zip(itertools.product(*[range(ki) for ki in k]),
                           _position_slices(k, strides, dilations, out_sp)):
            xs = xp[lead + sl]
            if mult == 1:
                wp = wd[(slice(None), 0) + pos].reshape((c,) + (1,) * nd)
            else:
                xs = xs[:, :, None]
                wp = wd[(slice(None), slice(None)) + pos].reshape((c, mult) + (1,) * nd)
            if y is None:
                y = xs * wp
                tmp = np.empty_like(y)
            else:
                np.multiply(xs, wp, out=tmp)
                y += tmp
        return y

    def _depthwise_nhwc(x, w, pb, pe, out_sp, k):
        """Depthwise 2-D conv channels-last: every tap is one multiply-add over a view whose
        innermost axis is the (contiguous) channel axis, so NumPy's loops run long and SIMD."""
        n, c, h, wd_ = x.shape
        key = id(w)
        wt = dw_cache.get(key)
        if wt is None or wt[0] is not w:
            wt = (w, np.ascontiguousarray(w.reshape(c, -1).T.astype(x.dtype, copy=False)))
            if w_const is not None:
                dw_cache.clear()
                dw_cache[key] = wt
        taps = wt[1]
        hp, wp_ = h + pb[0] + pe[0], wd_ + pb[1] + pe[1]
        if pb[0] or pb[1] or pe[0] or pe[1]:
            xp = np.empty((n, hp, wp_, c), x.dtype)
            xp[:, :pb[0]] = 0
            xp[:, hp - pe[0]:] = 0
            xp[:, :, :pb[1]] = 0
            xp[:, :, wp_ - pe[1]:] = 0
            xp[:, pb[0]:pb[0] + h, pb[1]:pb[1] + wd_] = x.transpose(0, 2, 3, 1)
        else:
            xp = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        oh, ow = out_sp
        sh, sw = strides
        dh, dw = dilations
        y = np.empty((n, oh, ow, c), x.dtype)
        tmp = np.empty_like(y)
        for t, (a, b) in enumerate(itertools.product(range(k[0]), range(k[1]))):
            xs = xp[:, a * dh:a * dh + (oh - 1) * sh + 1:sh, b * dw:b * dw + (ow - 1) * sw + 1:sw]
            if t == 0:
                np.multiply(xs, taps[0], out=y)
            else:
                np.multiply(xs, taps[t], out=tmp)
                y += tmp
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))

    dt = in_dtype(spec, 0)
    if dt is not None and dt.kind == "f" and dt.name != "bfloat16" and out_dtype_ok(spec, dt):
        with_caps(kernel, accepts_out=True)
    if wino is not None:
        with_caps(kernel, mode="winograd")  # the report's kernel_modes count the layers
    with_caps(kernel, epilogue=("clip", "addend", "act"))  # applied by the GEMM paths on GE's own GEMM
    return kernel


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


#: fixed source: each (image, channel) row of x normalised over its elements, then scaled by
#: the channel's gamma and shifted by its beta; rows are tasks of the native pool (blocks of at
#: least 16K elements), the sums reassociated (vectorised)
_INSTNORM_SRC = """
#define INSTNORM(NAME, T, NPY, SQRT)                                                                 \\
typedef struct { const T *x, *g, *b; T *y; int64_t rows, cols, c, per; T eps; } NAME##_ctx;           \\
static void NAME##_task(void *vc, int64_t blk, int slot) {                                            \\
    NAME##_ctx *q = (NAME##_ctx *)vc;                                                                 \\
    int64_t d = q->cols, end = (blk + 1) * q->per < q->rows ? (blk + 1) * q->per : q->rows;          \\
    (void)slot;                                                                                       \\
    for (int64_t i = blk * q->per; i < end; i++) {                                                    \\
        const T *r = q->x + i * d; T *o = q->y + i * d;                                               \\
        T s = 0, v = 0;                                                                               \\
        _Pragma("omp simd reduction(+:s)")                                                            \\
        for (int64_t k = 0; k < d; k++) s += r[k];                                                    \\
        T m = s / (T)d;                                                                               \\
        _Pragma("omp simd reduction(+:v)")                                                            \\
        for (int64_t k = 0; k < d; k++) { T t = r[k] - m; v += t * t; }                               \\
        T a = q->g[i % q->c] / SQRT(v / (T)d + q->eps), sh = q->b[i % q->c];                          \\
        for (int64_t k = 0; k < d; k++) o[k] = (r[k] - m) * a + sh;                                   \\
    }                                                                                                 \\
}                                                                                                     \\
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \\
    int64_t rows, cols, c, threads, nr, nc;                                                           \\
    if (ge_nargs(n, 6)) return NULL;                                                                  \\
    if (ge_int(args, 4, 0, 1LL << 40, &c) || ge_int(args, 5, 1, 4096, &threads)) return NULL;        \\
    const T *x = (const T *)ge_mat(args, 0, NPY, 0, &rows, &cols);                                    \\
    T *y = x ? (T *)ge_mat(args, 1, NPY, 1, &nr, &nc) : NULL;                                         \\
    if (!y) return NULL;                                                                              \\
    if (nr != rows || nc != cols || c < 1 || rows % c) return ge_fail();                              \\
    double e = PyFloat_AsDouble(args[3]);                                                             \\
    if (e == -1.0 && PyErr_Occurred()) return NULL;                                                   \\
    const T *g = (const T *)ge_arr(args, 2, NPY, 0, 2 * c);                                           \\
    if (!g) return NULL;                                                                              \\
    if (rows == 0 || cols == 0) Py_RETURN_NONE;  /* an empty extent first (a row of 0: no mean) */    \\
    NAME##_ctx q = {x, g, g + c, y, rows, cols, c, cols >= 16384 ? 1 : 16384 / cols, (T)e};           \\
    if (rows * cols < 65536) threads = 1;                                                             \\
    Py_BEGIN_ALLOW_THREADS                                                                            \\
    ge_parallel(NAME##_task, &q, (rows + q.per - 1) / q.per, threads);                                \\
    Py_END_ALLOW_THREADS                                                                              \\
    Py_RETURN_NONE;                                                                                   \\
}
INSTNORM(instnorm_f32, float, NPY_FLOAT, sqrtf)
INSTNORM(instnorm_f64, double, NPY_DOUBLE, sqrt)
"""
_instnorm: dict[str, Any] = {}


def _instnorm_kernel(dt: np.dtype):
    """The native instance-norm rows for float32/float64, or None (no native kernels)."""
    if dt.name not in ("float32", "float64") or not jit_enabled("GE_CPU_JIT") or not native.available():
        return None
    if "mod" not in _instnorm:
        _instnorm["mod"] = native.build(_INSTNORM_SRC, ["instnorm_f32", "instnorm_f64"])
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
