"""Resize (opset 10, 11, 13, 18, 19) and Upsample: nearest, linear and cubic, done separably.

Every resized axis is handled on its own: nearest is one ``np.take``; linear blends two takes;
cubic blends four. The per-axis index and weight tables depend only on the input shape and the
scales/sizes, and are memoised per shape. A float32 linear resize of the last two axes only (the
bilinear upsampling of segmentation decoders) runs natively (ge_native's ``csrc/planes.c``: the
same arithmetic in the same order, so the same bits, on the native pool, without the numpy path's
four full-size temporaries per axis: SegFormer-B0's decoder at 512x512 spent as long in its four
Resizes as in all its convolutions).
"""

from __future__ import annotations

import math

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.kernel import KernelSpec, with_caps
from ge_native import native, parallel

from ._util import as_str, ints, norm_axes, unsupported

KERNELS: dict = {}

_COORD_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                "tf_half_pixel_for_nn", "half_pixel_symmetric")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _coords(mode, out_len, in_len, scale):
    x = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        # ONNX divides by (in_len * scale - 1), the unrounded output length (== out_len - 1
        # when sizes were given)
        length = in_len * scale
        return x * ((in_len - 1) / (length - 1)) if out_len > 1 and length != 1 else np.zeros_like(x)
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adj = out_len / (scale * in_len)
        center = in_len / 2
        offset = center * (1 - adj)
        return offset + (x + 0.5) / scale - 0.5
    raise AssertionError(mode)


def _nearest_index(c, nearest_mode, in_len):
    if nearest_mode == "round_prefer_floor":
        i = np.where(c - np.floor(c) == 0.5, np.floor(c), np.round(c))
    elif nearest_mode == "round_prefer_ceil":
        i = np.where(c - np.floor(c) == 0.5, np.ceil(c), np.round(c))
    elif nearest_mode == "floor":
        i = np.floor(c)
    else:
        i = np.ceil(c)
    return np.clip(i, 0, in_len - 1).astype(np.int64)


def _cubic_weights(t, a):
    """Keys cubic convolution weights for offsets t in [0, 1): taps at -1, 0, 1, 2."""
    def w(d):
        d = np.abs(d)
        return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                        np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    return np.stack([w(t + 1), w(t), w(1 - t), w(2 - t)], axis=-1)


#: ge_native's large-plane kernels (``csrc/planes.c``; ``GE_CPU_PLANES=0`` turns them off), built on first use
planes = native.lazy_module("GE_CPU_PLANES", native.c_source("planes.c"), ["planes_ok", "resize_linear2d", "transpose2d"],
                            "planes_ok")
_native = planes


class _Resizer:
    def __init__(self, spec, mode, coord_mode, nearest_mode, cubic_a, exclude_outside):
        self.spec = spec
        self.mode = mode
        self.coord_mode = coord_mode
        self.nearest_mode = nearest_mode
        self.cubic_a = cubic_a
        self.exclude_outside = exclude_outside
        self.cache: dict = {}

    def tables(self, in_len, out_len, scale):
        key = (in_len, out_len, scale)
        t = self.cache.get(key)
        if t is not None:
            return t
        c = _coords(self.coord_mode, out_len, in_len, scale)
        if self.mode == "nearest":
            t = ("nearest", _nearest_index(c, self.nearest_mode, in_len))
        elif self.mode == "linear":
            c = np.clip(c, 0, in_len - 1)
            i0 = np.floor(c).astype(np.int64)
            i1 = np.minimum(i0 + 1, in_len - 1)
            w1 = c - i0
            t = ("taps", np.stack([i0, i1], -1), np.stack([1 - w1, w1], -1))
        else:
            f = np.floor(c)
            w = _cubic_weights(c - f, self.cubic_a)
            idx = f.astype(np.int64)[:, None] + np.arange(-1, 3)
            if self.exclude_outside:
                inside = (idx >= 0) & (idx < in_len)
                w = np.where(inside, w, 0.0)
                w = w / w.sum(axis=1, keepdims=True)
            t = ("taps", np.clip(idx, 0, in_len - 1), w)
        if len(self.cache) < 64:
            self.cache[key] = t
        return t

    def native_tables(self, in_len, out_len, scale):
        """The linear taps of one axis as the native kernel takes them, (2, out_len): int32 indices
        and float32 weights (rounded as the numpy path rounds them), first taps then second."""
        key = ("native", in_len, out_len, scale)
        t = self.cache.get(key)
        if t is None:
            _, idx, w = self.tables(in_len, out_len, scale)
            t = (np.ascontiguousarray(idx.T, np.int32), np.ascontiguousarray(w.T, np.float32))
            if len(self.cache) < 64:
                self.cache[key] = t
        return t

    def native_linear(self, x, out_shape, scales, out=None):
        """The float32 linear resize of the last two axes natively (into ``out`` when that is a
        C-contiguous float32 buffer of the output's shape: a slice of a Concat's planned
        buffer, the decoder's four upsampled maps), or None where it does not apply (another
        mode or dtype, a leading axis resized, no native kernels)."""
        r = x.ndim
        if (self.mode != "linear" or x.dtype != np.float32 or r < 2 or x.size == 0
                or any(out_shape[a] != x.shape[a] or scales[a] != 1.0 for a in range(r - 2))
                or max(x.shape[-2:]) >= 2 ** 31 or (mod := _native()) is None):
            return None
        keep = [out_shape[a] == x.shape[a] and scales[a] == 1.0 for a in (r - 2, r - 1)]
        if all(keep):
            return None
        ty = self.native_tables(x.shape[-2], out_shape[-2], scales[-2])
        tx = self.native_tables(x.shape[-1], out_shape[-1], scales[-1])
        xs = np.ascontiguousarray(x).reshape(-1, x.shape[-2], x.shape[-1])
        y = out if (out is not None and out.dtype == np.float32 and out.shape == tuple(out_shape)
                    and out.flags.c_contiguous and not np.may_share_memory(out, x)) else np.empty(tuple(out_shape), np.float32)
        mod.resize_linear2d(xs, y.reshape(-1, out_shape[-2], out_shape[-1]), ty[0], ty[1], tx[0], tx[1],
                            int(keep[0]), int(keep[1]), max(1, parallel.native_width()))
        return y

    def __call__(self, x, out_shape, scales, out=None):
        y = self.native_linear(x, out_shape, scales, out)
        if y is not None:
            return y
        y = x
        for ax in range(x.ndim):
            if out_shape[ax] == x.shape[ax] and scales[ax] == 1.0:
                continue
            t = self.tables(x.shape[ax], out_shape[ax], scales[ax])
            if t[0] == "nearest":
                y = np.take(y, t[1], axis=ax)
            else:
                idx, w = t[1], t[2]
                wshape = [1] * y.ndim
                wshape[ax] = -1
                acc = None
                for j in range(idx.shape[1]):
                    term = np.take(y, idx[:, j], axis=ax) * w[:, j].astype(y.dtype).reshape(wshape)
                    acc = term if acc is None else acc + term
                y = acc
        if y is x:  # (nothing resized: a copy, into the planned buffer where there is one)
            if out is not None and out.shape == x.shape and out.dtype == x.dtype and not np.may_share_memory(out, x):
                np.copyto(out, x)
                return out
            y = x.copy()
        return y.astype(x.dtype, copy=False)


def _floats(a):
    if a is None:
        return None
    a = np.asarray(a).reshape(-1)
    return [float(v) for v in a] if a.size else None


def _check_lengths(spec, rank, ax, axes, given, what):
    """``sizes`` / ``scales`` hold one entry per resized axis: the input's rank, or ``len(axes)``
    (onnxruntime refuses anything else; zipping them silently resized the wrong axes)."""
    if given is None or len(given) == len(ax):
        return
    per = f"the {len(ax)} entries of 'axes' {list(axes)}" if axes else f"the input's rank {rank}"
    raise ExecutionError(
        f"{spec.describe()}: '{what}' has {len(given)} element(s) {list(given)}, but it needs one per resized "
        f"axis: {per}",
        hint=f"give '{what}' with {len(ax)} entries (one per axis of the input, or per entry of 'axes')",
    )


def _make(spec, mode, coord_mode, nearest_mode, cubic_a=-0.75, exclude_outside=0,
          antialias=0, axes=None, policy="stretch", scales_index=None, sizes_index=None,
          attr_scales=None):
    if mode not in ("nearest", "linear", "cubic"):
        raise unsupported(spec, f"mode={mode!r}")
    if coord_mode == "tf_crop_and_resize":
        raise unsupported(spec, "coordinate_transformation_mode='tf_crop_and_resize'")
    if coord_mode not in _COORD_MODES:
        raise unsupported(spec, f"coordinate_transformation_mode={coord_mode!r}")
    if nearest_mode not in _NEAREST_MODES:
        raise unsupported(spec, f"nearest_mode={nearest_mode!r}")
    if antialias and mode != "nearest":
        raise unsupported(spec, "antialias=1")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise unsupported(spec, f"keep_aspect_ratio_policy={policy!r}")
    resizer = _Resizer(spec, mode, coord_mode, nearest_mode, cubic_a, exclude_outside)

    def kernel(x, *rest, out=None):  # (out: a tuple of the one output's buffer, which the native path fills)
        def arg(i):
            if i is None:
                return None
            j = i - 1
            return rest[j] if j < len(rest) else None

        target = out
        r = x.ndim
        ax = list(norm_axes(axes, r)) if axes else list(range(r))
        scales = attr_scales if attr_scales is not None else _floats(arg(scales_index))
        sizes = ints(arg(sizes_index)) if sizes_index is not None and arg(sizes_index) is not None else None
        if sizes is not None and len(sizes) == 0:
            sizes = None
        _check_lengths(spec, r, ax, axes, scales if sizes is None else sizes, "scales" if sizes is None else "sizes")
        if sizes is not None and any(sz < 0 for sz in sizes):
            raise ExecutionError(f"{spec.describe()}: 'sizes' {list(sizes)} has a negative size",
                                 hint="every output size is at least 0")
        full_scales = [1.0] * r
        out = list(x.shape)
        if sizes is not None:
            if policy == "stretch":
                for a, sz in zip(ax, sizes):
                    full_scales[a] = sz / x.shape[a]
                    out[a] = sz
            else:
                ratios = [sz / x.shape[a] for a, sz in zip(ax, sizes)]
                sc = min(ratios) if policy == "not_larger" else max(ratios)
                for a in ax:
                    full_scales[a] = sc
                    out[a] = int(math.floor(sc * x.shape[a] + 0.5))
        elif scales is not None:
            for a, sc in zip(ax, scales):
                full_scales[a] = sc
                out[a] = int(math.floor(x.shape[a] * sc))
        else:
            raise ValueError(f"{spec.describe()}: neither scales nor sizes given")
        y = resizer(x, out, full_scales, target[0] if target else None)
        if target and y is not target[0]:  # (the numpy path: the planned buffer is always filled)
            np.copyto(target[0], y)
            return target
        return (y,)

    return with_caps(kernel, accepts_out=True)


def resize_factory(spec: KernelSpec):
    mode = as_str(spec.attr("mode"), "nearest")
    if spec.opset < 11:
        # Resize-10: asymmetric coordinates, nearest rounds down like Upsample.
        return _make(spec, mode, "asymmetric", "floor" if mode == "nearest" else "round_prefer_floor",
                     scales_index=1)
    coord_mode = as_str(spec.attr("coordinate_transformation_mode"), "half_pixel")
    nearest_mode = as_str(spec.attr("nearest_mode"), "round_prefer_floor")
    return _make(
        spec, mode, coord_mode, nearest_mode,
        cubic_a=float(spec.attr("cubic_coeff_a", -0.75)),
        exclude_outside=int(spec.attr("exclude_outside", 0)),
        antialias=int(spec.attr("antialias", 0)),
        axes=ints(spec.attr("axes")),
        policy=as_str(spec.attr("keep_aspect_ratio_policy"), "stretch"),
        scales_index=2, sizes_index=3,
    )


def upsample_factory(spec: KernelSpec):
    mode = as_str(spec.attr("mode"), "nearest")
    if mode == "bilinear":
        mode = "linear"
    attr_scales = None
    if spec.opset < 9:
        attr_scales = [float(v) for v in spec.attr("scales") or []]
        if not attr_scales:
            raise unsupported(spec, "Upsample without scales")
    return _make(spec, mode, "asymmetric", "floor", scales_index=None if attr_scales else 1,
                 attr_scales=attr_scales)


KERNELS[("", "Resize")] = resize_factory
KERNELS[("", "Upsample")] = upsample_factory
