"""Shape and data-movement kernels (Reshape, Transpose, Slice, Gather, Pad, Split, ...).

Kernels here may return views of their inputs (Reshape, Flatten, Squeeze, Unsqueeze, Identity,
Split, Slice, Transpose); no kernel ever writes into an input array.
"""

from __future__ import annotations

import math

import numpy as np

from ge_core.kernel import KernelSpec, with_caps

from ._util import as_str, const_input, has_input, ints, kernel_table, norm_axes, norm_axis, unsupported

KERNELS, _reg = kernel_table()


def _scalar(a) -> int:
    return int(np.asarray(a).reshape(-1)[0])


# ---------------------------------------------------------------------------------------------
# Reshape family


def _reshape_target(in_shape, shape, allowzero):
    shape = list(shape)
    if not allowzero:
        for i, s in enumerate(shape):
            if s == 0:
                if i >= len(in_shape):
                    raise ValueError(f"Reshape: dim 0 at position {i} but input has rank {len(in_shape)}")
                shape[i] = in_shape[i]
    return tuple(shape)


@_reg("Reshape")
def reshape_factory(spec: KernelSpec):
    allowzero = int(spec.attr("allowzero", 0))
    if spec.opset < 5:
        attr_shape = ints(spec.attr("shape"))
        if attr_shape is None:
            raise unsupported(spec, "Reshape-1 without a 'shape' attribute")

        def kernel(x, *_):
            return (x.reshape(_reshape_target(x.shape, attr_shape, 0)),)

        return kernel

    const_shape = const_input(spec, 1)
    if const_shape is not None:
        cs = [int(v) for v in const_shape.reshape(-1)]
        if allowzero or 0 not in cs:
            target = tuple(cs)

            def kernel(x, shape=None):
                return (x.reshape(target),)

            return kernel

    def kernel(x, shape):
        return (x.reshape(_reshape_target(x.shape, [int(v) for v in shape.reshape(-1)], allowzero)),)

    return kernel


@_reg("Flatten")
def flatten_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", 1))

    def kernel(x):
        ax = norm_axis(axis, x.ndim)
        return (x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:])),)

    return kernel


def _axes_from(spec: KernelSpec, attr_until_opset: int, index: int):
    """Axes as an attribute (opset < attr_until_opset) or as input ``index``.

    Returns (static_axes or None, dynamic) where dynamic says they come at run time.
    """
    if spec.opset < attr_until_opset:
        a = spec.attr("axes")
        return (ints(a) if a is not None else None), False
    if not has_input(spec, index):
        return None, False
    c = const_input(spec, index)
    if c is not None:
        return ints(c), False
    return None, True


@_reg("Unsqueeze")
def unsqueeze_factory(spec: KernelSpec):
    axes, dynamic = _axes_from(spec, 13, 1)
    if axes is None and not dynamic:
        raise unsupported(spec, "Unsqueeze without axes")

    def kernel(x, a=None):
        ax = axes if not dynamic else ints(a)
        r = x.ndim + len(ax)
        ax = sorted(norm_axes(ax, r))
        shape = list(x.shape)
        for i in ax:
            shape.insert(i, 1)
        return (x.reshape(shape),)

    return kernel


@_reg("Squeeze")
def squeeze_factory(spec: KernelSpec):
    axes, dynamic = _axes_from(spec, 13, 1)

    def kernel(x, a=None):
        ax = ints(a) if dynamic else axes
        if ax is None:
            return (x.reshape([d for d in x.shape if d != 1]),)
        ax = set(norm_axes(ax, x.ndim))
        for i in ax:
            if x.shape[i] != 1:
                raise ValueError(f"{spec.describe()}: cannot squeeze axis {i} of size {x.shape[i]}")
        return (x.reshape([d for i, d in enumerate(x.shape) if i not in ax]),)

    return kernel


def _swapped_groups(perm, rank: int) -> int | None:
    """``k`` where ``perm`` keeps the leading axes and swaps the trailing axes ``[lead, k)`` with
    ``[k, rank)`` (a batched 2-D transpose of (P, R, C) with R the product of the first group);
    else None."""
    for lead in range(rank - 1):
        if perm[lead] != lead:
            break
    else:
        return None
    k = perm[lead]
    want = list(range(lead)) + list(range(k, rank)) + list(range(lead, k))
    return k if k > lead and list(perm) == want else None


#: the fewest elements a transpose moves natively (below it numpy's strided copy is as fast)
_NATIVE_TRANSPOSE = 1 << 15


@_reg("Transpose")
def transpose_factory(spec: KernelSpec):
    """A view of the input; where the permutation is a batched 2-D transpose of a large float32 or
    int32 value, the data moved into ``out`` in cache tiles by ge_native (``csrc/planes.c``):
    the executor's copy of the view walked one side a cache line per element (SegFormer-B0's
    NCHW <-> token-major reorders at 512x512: 40 ms for one 16 MiB plane stack)."""
    from ge_native import parallel

    from .resize import planes

    perm = ints(spec.attr("perm"))

    def kernel(x, out=None):  # (out: a tuple of the one output's buffer, always filled when given)
        y = np.transpose(x, perm) if perm is not None else x.T
        if not out:
            return (y,)
        o = out[0]
        k = _swapped_groups(perm if perm is not None else list(range(x.ndim))[::-1], x.ndim)
        mod = planes() if (k is not None and x.size >= _NATIVE_TRANSPOSE and x.dtype in (np.float32, np.int32)
                           and o.dtype == x.dtype and o.shape == y.shape and o.flags.c_contiguous
                           and x.flags.c_contiguous and not np.may_share_memory(x, o)) else None
        if mod is None or k is None:
            np.copyto(o, y)
            return (o,)
        lead = next(i for i, p in enumerate(perm if perm is not None else list(range(x.ndim))[::-1]) if p != i)
        p_, r_, c_ = math.prod(x.shape[:lead]), math.prod(x.shape[lead:k]), math.prod(x.shape[k:])
        mod.transpose2d(x.reshape(p_, r_, c_), o.reshape(p_, c_, r_), max(1, parallel.native_width()))
        return (o,)

    return with_caps(kernel, accepts_out=True)


@_reg("Identity")
def identity_factory(spec: KernelSpec):
    return lambda x: (x,)


@_reg("Concat")
def concat_factory(spec: KernelSpec):
    axis = spec.attr("axis", None)
    if axis is None:
        if spec.opset >= 4:
            raise unsupported(spec, "Concat without an axis attribute")
        axis = 1
    axis = int(axis)

    def kernel(*xs, out=None):
        if out is not None:
            np.concatenate([x for x in xs if x is not None], axis=axis, out=out[0])
            return out
        return (np.concatenate([x for x in xs if x is not None], axis=axis),)

    dts = {t.dtype for t in list(spec.inputs) + list(spec.outputs) if t is not None}
    if len(dts) == 1 and None not in dts and np.dtype(object) not in dts:
        with_caps(kernel, accepts_out=True)
    return kernel


@_reg("Split")
def split_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", 0))
    n_out = spec.num_outputs
    num_outputs = spec.attr("num_outputs", None)
    if spec.opset < 13:
        split_static = ints(spec.attr("split"))
        dynamic = False
        if split_static is None and spec.opset < 2 and has_input(spec, 1):
            c = const_input(spec, 1)
            split_static, dynamic = (ints(c), False) if c is not None else (None, True)
    else:
        split_static, dynamic = _axes_from(spec, 0, 1)

    def kernel(x, split=None):
        ax = norm_axis(axis, x.ndim)
        dim = x.shape[ax]
        sizes = ints(split) if dynamic else split_static
        if sizes is None or len(sizes) == 0:
            n = int(num_outputs) if num_outputs is not None else n_out
            if num_outputs is not None:
                chunk = -(-dim // n)
                sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
            else:
                if dim % n:
                    raise ValueError(f"{spec.describe()}: axis of size {dim} does not split into {n}")
                sizes = [dim // n] * n
        idx = np.cumsum(sizes)[:-1]
        return tuple(np.split(x, idx, axis=ax))

    return kernel


# ---------------------------------------------------------------------------------------------
# Slice


def _slice_tuple(shape, starts, ends, axes, steps):
    sl = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = ax + len(shape) if ax < 0 else ax
        dim = shape[ax]
        if sp == 0:
            raise ValueError("Slice: step 0")
        if st < 0:
            st += dim
        if en < 0:
            en += dim
        if sp > 0:
            st = min(max(st, 0), dim)
            en = min(max(en, 0), dim)
            sl[ax] = slice(st, en, sp)
        else:
            st = min(max(st, 0), dim - 1)
            en = min(max(en, -1), dim - 1)
            sl[ax] = slice(st, en if en >= 0 else None, sp)
    return tuple(sl)


@_reg("Slice")
def slice_factory(spec: KernelSpec):
    if spec.opset < 10:
        starts = ints(spec.attr("starts"))
        ends = ints(spec.attr("ends"))
        axes = ints(spec.attr("axes"))
        if starts is None or ends is None:
            raise unsupported(spec, "Slice-1 without starts/ends")

        def kernel(x):
            ax = axes if axes is not None else list(range(len(starts)))
            return (x[_slice_tuple(x.shape, starts, ends, ax, [1] * len(starts))],)

        return kernel

    def kernel(x, starts, ends, axes=None, steps=None):
        st = ints(starts)
        en = ints(ends)
        ax = ints(axes) if axes is not None else list(range(len(st)))
        sp = ints(steps) if steps is not None else [1] * len(st)
        return (x[_slice_tuple(x.shape, st, en, ax, sp)],)

    return kernel


# ---------------------------------------------------------------------------------------------
# Gather / Scatter


@_reg("Gather")
def gather_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", 0))

    def kernel(x, idx):
        ax = norm_axis(axis, x.ndim)
        return (np.take(x, idx.astype(np.int64, copy=False), axis=ax),)

    return kernel


@_reg("GatherElements")
def gather_elements_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", 0))

    def kernel(x, idx):
        ax = norm_axis(axis, x.ndim)
        idx = idx.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + x.shape[ax], idx)
        return (np.take_along_axis(x, idx, axis=ax),)

    return kernel


@_reg("GatherND")
def gather_nd_factory(spec: KernelSpec):
    b = int(spec.attr("batch_dims", 0))

    def kernel(x, idx):
        idx = idx.astype(np.int64, copy=False)
        k = idx.shape[-1]
        batch_shape = x.shape[:b]
        nb = math.prod(batch_shape)
        xb = x.reshape((nb,) + x.shape[b:])
        ib = idx.reshape((nb, -1, k))
        dims = np.array(x.shape[b:b + k], dtype=np.int64)
        ib = np.where(ib < 0, ib + dims, ib)
        bidx = np.arange(nb)[:, None]
        out = xb[(bidx,) + tuple(ib[..., j] for j in range(k))]
        return (out.reshape(idx.shape[:-1] + x.shape[b + k:]),)

    return kernel


@_reg("ScatterND")
def scatter_nd_factory(spec: KernelSpec):
    reduction = as_str(spec.attr("reduction"), "none")
    ufuncs = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    if reduction != "none" and reduction not in ufuncs:
        raise unsupported(spec, f"reduction={reduction!r}")

    def kernel(x, idx, upd):
        y = x.copy()
        k = idx.shape[-1]
        ii = idx.reshape(-1, k).astype(np.int64, copy=False)
        u = upd.reshape((ii.shape[0],) + x.shape[k:])
        key = tuple(ii[:, j] for j in range(k))
        if reduction == "none":
            y[key] = u
        else:
            ufuncs[reduction].at(y, key, u)
        return (y,)

    return kernel


@_reg("ScatterElements", "Scatter")
def scatter_elements_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", 0))
    reduction = as_str(spec.attr("reduction"), "none")
    ufuncs = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    if reduction != "none" and reduction not in ufuncs:
        raise unsupported(spec, f"reduction={reduction!r}")

    def kernel(x, idx, upd):
        ax = norm_axis(axis, x.ndim)
        idx = idx.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + x.shape[ax], idx)
        y = x.copy()
        grids = list(np.indices(idx.shape, sparse=True))
        grids[ax] = idx
        key = tuple(grids)
        if reduction == "none":
            y[key] = upd
        else:
            ufuncs[reduction].at(y, key, upd)
        return (y,)

    return kernel


# ---------------------------------------------------------------------------------------------
# Expand / Tile / Pad


@_reg("Expand")
def expand_factory(spec: KernelSpec):
    def kernel(x, shape):
        target = np.broadcast_shapes(x.shape, tuple(ints(shape)))
        return (np.array(np.broadcast_to(x, target)),)

    return kernel


@_reg("Tile")
def tile_factory(spec: KernelSpec):
    if spec.opset < 6:
        def kernel6(x, tiles, axis):
            reps = [1] * x.ndim
            reps[_scalar(axis)] = _scalar(tiles)
            return (np.tile(x, reps),)
        return kernel6

    def kernel(x, repeats):
        return (np.tile(x, ints(repeats)),)

    return kernel


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _do_pad(x, pads, mode, value, axes=None):
    r = x.ndim
    if axes is None:
        axes = list(range(r))
    axes = norm_axes(axes, r)
    n = len(axes)
    before = [0] * r
    after = [0] * r
    for j, ax in enumerate(axes):
        before[ax] = pads[j]
        after[ax] = pads[n + j]
    # negative pads crop
    crop = tuple(slice(-b if b < 0 else 0, x.shape[i] + a if a < 0 else None)
                 for i, (b, a) in enumerate(zip(before, after)))
    if any(b < 0 or a < 0 for b, a in zip(before, after)):
        x = x[crop]
    width = [(max(b, 0), max(a, 0)) for b, a in zip(before, after)]
    if not any(b or a for b, a in width):
        return x.copy()
    if mode == "constant":
        return np.pad(x, width, mode="constant", constant_values=value)
    return np.pad(x, width, mode=mode)


@_reg("Pad")
def pad_factory(spec: KernelSpec):
    mode = as_str(spec.attr("mode"), "constant")
    if mode not in _PAD_MODES:
        raise unsupported(spec, f"mode={mode!r}")
    if spec.opset < 11:
        pads = ints(spec.attr("pads") if spec.opset >= 2 else spec.attr("paddings"))
        value = float(spec.attr("value", 0.0))
        if pads is None:
            raise unsupported(spec, "Pad without pads")

        def kernel(x):
            return (_do_pad(x, pads, mode, x.dtype.type(value)),)

        return kernel

    def kernel(x, pads, constant_value=None, axes=None):
        v = constant_value.reshape(-1)[0] if constant_value is not None and constant_value.size else 0
        return (_do_pad(x, ints(pads), mode, v, ints(axes) if axes is not None else None),)

    return kernel


# ---------------------------------------------------------------------------------------------
# Shape, Size, constants


@_reg("Shape")
def shape_factory(spec: KernelSpec):
    start = spec.attr("start", None)
    end = spec.attr("end", None)

    def kernel(x):
        return (np.array(x.shape[slice(start, end)], dtype=np.int64),)

    return kernel


@_reg("Size")
def size_factory(spec: KernelSpec):
    return lambda x: (np.array(x.size, dtype=np.int64),)


@_reg("ConstantOfShape")
def constant_of_shape_factory(spec: KernelSpec):
    value = spec.attr("value", None)
    if value is None:
        value = np.zeros(1, np.float32)
    value = np.asarray(value).reshape(-1)
    if value.size != 1:
        raise unsupported(spec, "a 'value' with more than one element")
    fill = value[0]
    dtype = value.dtype

    def kernel(shape):
        return (np.full(tuple(ints(shape)), fill, dtype=dtype),)

    return kernel


@_reg("Constant")
def constant_factory(spec: KernelSpec):
    a = spec.attrs
    if "sparse_value" in a:
        raise unsupported(spec, "sparse_value")
    if "value" in a:
        value = np.asarray(a["value"])
    elif "value_float" in a:
        value = np.array(a["value_float"], dtype=np.float32)
    elif "value_floats" in a:
        value = np.array(a["value_floats"], dtype=np.float32).reshape(-1)
    elif "value_int" in a:
        value = np.array(a["value_int"], dtype=np.int64)
    elif "value_ints" in a:
        value = np.array(a["value_ints"], dtype=np.int64).reshape(-1)
    elif "value_string" in a:
        v = a["value_string"]
        value = np.array(v.decode() if isinstance(v, bytes) else v, dtype=object)
    elif "value_strings" in a:
        value = np.array([v.decode() if isinstance(v, bytes) else v for v in a["value_strings"]],
                         dtype=object).reshape(-1)
    else:
        raise unsupported(spec, "Constant without a value attribute")
    value.setflags(write=False)
    return lambda: (value,)


@_reg("Range")
def range_factory(spec: KernelSpec):
    def kernel(start, limit, delta):
        s = start.reshape(-1)[0]
        lim = limit.reshape(-1)[0]
        d = delta.reshape(-1)[0]
        n = max(int(math.ceil((float(lim) - float(s)) / float(d))), 0)
        out = s + np.arange(n, dtype=start.dtype) * d
        return (out.astype(start.dtype, copy=False),)

    return kernel


# ---------------------------------------------------------------------------------------------
# layout shuffles


@_reg("DepthToSpace")
def depth_to_space_factory(spec: KernelSpec):
    b = int(spec.attr("blocksize"))
    mode = as_str(spec.attr("mode"), "DCR")
    if mode not in ("DCR", "CRD"):
        raise unsupported(spec, f"mode={mode!r}")

    def kernel(x):
        n, c, h, w = x.shape
        if mode == "DCR":
            t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return (t.reshape(n, c // (b * b), h * b, w * b),)

    return kernel


@_reg("SpaceToDepth")
def space_to_depth_factory(spec: KernelSpec):
    b = int(spec.attr("blocksize"))
    perm = (0, 1, 3, 5, 2, 4) if as_str(spec.attr("mode"), "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)

    def kernel(x):
        n, c, h, w = x.shape
        t = x.reshape(n, c, h // b, b, w // b, b).transpose(perm)
        return (t.reshape(n, c * b * b, h // b, w // b),)

    return kernel


@_reg("NonZero")
def nonzero_factory(spec: KernelSpec):
    def kernel(x):
        if x.ndim == 0:
            return (np.zeros((0, 1 if x else 0), np.int64),)
        return (np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1),)

    return kernel


@_reg("OneHot")
def onehot_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", -1))

    def kernel(indices, depth, values):
        d = int(np.asarray(depth).reshape(-1)[0])
        idx = indices.astype(np.int64)
        idx = np.where(idx < 0, idx + d, idx)
        r = indices.ndim + 1
        ax = norm_axis(axis, r)
        shape = [1] * r
        shape[ax] = d
        rng = np.arange(d).reshape(shape)
        hot = np.expand_dims(idx, ax) == rng
        off, on = values.reshape(-1)[0], values.reshape(-1)[1]
        return (np.where(hot, on, off).astype(values.dtype, copy=False),)

    return kernel


@_reg("Trilu")
def trilu_factory(spec: KernelSpec):
    upper = int(spec.attr("upper", 1))

    def kernel(x, k=None):
        kk = _scalar(k) if k is not None else 0
        return ((np.triu(x, kk) if upper else np.tril(x, kk)),)

    return kernel


@_reg("CumSum")
def cumsum_factory(spec: KernelSpec):
    exclusive = int(spec.attr("exclusive", 0))
    reverse = int(spec.attr("reverse", 0))

    def kernel(x, axis):
        ax = norm_axis(_scalar(axis), x.ndim)
        y = np.flip(x, ax) if reverse else x
        c = np.cumsum(y, axis=ax, dtype=x.dtype)
        if exclusive:
            c = np.concatenate([np.zeros_like(np.take(c, [0], axis=ax)),
                                np.take(c, np.arange(c.shape[ax] - 1), axis=ax)], axis=ax)
        if reverse:
            c = np.flip(c, ax)
        return (np.ascontiguousarray(c),)

    return kernel


@_reg("TopK")
def topk_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", -1))
    largest = int(spec.attr("largest", 1))
    k_attr = spec.attr("k", None) if spec.opset < 10 else None

    def kernel(x, k=None):
        kk = int(k_attr) if k_attr is not None else _scalar(k)
        ax = norm_axis(axis, x.ndim)
        if largest:
            key = x.astype(np.float64) if np.issubdtype(x.dtype, np.unsignedinteger) else x
            order = np.argsort(-key, axis=ax, kind="stable")
        else:
            order = np.argsort(x, axis=ax, kind="stable")
        idx = np.take(order, np.arange(kk), axis=ax)
        return (np.take_along_axis(x, idx, axis=ax), idx.astype(np.int64, copy=False))

    return kernel
