"""The "native" fuzz target: every native kernel entry called directly (issue 42).

Each case picks one entry and calls it -- mostly through its Python wrapper, the rest straight
on the built module -- with random extents (0-size dims, 1, odd sizes, large ones), and in a
share of the cases one hostile change: a wrong dtype, rank or size, a non-contiguous, Fortran,
unaligned or read-only array, a bad stride, geometry or attribute value, a huge or negative
integer, a NaN epsilon. Inputs are also placed right before an unreadable guard page, so that a
read past an array's end faults. A case ends in

* a result, checked against a NumPy float64 reference where that is cheap (a wrong value is an
  :class:`~fuzz_engine.OracleViolation`): outcome ``ok``, labelled with the entry;
* a clean refusal: the wrapper's False / None, or the ValueError, TypeError or OverflowError of
  the entry's argument checks (which the executor turns into an ExecutionError naming the node),
  reported as :class:`NativeRefused` (a GEError);
* anything else is a crash: another exception, a hang, or (seen from the parent) a signal.

Entries covered: sgemm (``sg_packed`` / ``sg_conv`` through matmul_packed, matmul_rows, conv2d,
Conv2d.run, and raw), nchwc (``nc_conv``, ``nc_conv_plain``, ``nc_dwconv``, ``nc_pool``,
``nc_gap``, ``nc_reorder``, ``nc_wino``, ``nc_wino_pack``, ``nc_scale_w``, ``nc_groupnorm``), gemm
(``rows``, ``cols``/``blocks``, ``batch``), attention heads, loopgen's generated loops (static
and dynamic layouts, and the raw entry) and row kernels (layernorm, rmsnorm, softmax,
softmax_scaled, rotary), the window loops and the direct depthwise kernel, Winograd's
transforms, instance norm and erf. Entries that take raw pointers (gemm blocks' pointer table,
the attention heads' base addresses, a BLAS function address) trust their caller for those
pointers: only their other arguments are fuzzed.

A campaign: ``python scripts/fuzz.py --target native --cases 20000`` (20,000 cases took 98 s on 2
busy cores, 0 crashes: 8,303 results, 11,697 clean refusals).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import random
from typing import Any

import numpy as np
from fuzz_engine import OracleViolation, Target

from ge_core.errors import ExecutionError

CLEAN = (ValueError, TypeError, OverflowError)


class NativeRefused(ExecutionError):
    """A native entry (or its wrapper) refused its arguments cleanly."""


# ------------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------------
_KEEP: list = []  # guard-page mappings of the current case (released at the next one)


def guarded(shape, dtype=np.float32) -> np.ndarray:
    """An array of ``shape`` whose last byte ends a page followed by an unreadable one."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape)) if len(shape) else 1
    page = mmap.PAGESIZE
    nbytes = count * dt.itemsize
    pages = max(1, -(-nbytes // page))
    buf = mmap.mmap(-1, (pages + 1) * page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if libc.mprotect(base + pages * page, page, 0) != 0:
        raise OSError("mprotect failed")
    a = np.frombuffer(buf, dt, count, pages * page - nbytes).reshape(shape)
    _KEEP.append(buf)
    return a


def dim(rng: random.Random, big: int = 40) -> int:
    """An extent: 0 and 1 often, small odd sizes, sometimes a larger one."""
    r = rng.random()
    if r < 0.15:
        return 0
    if r < 0.3:
        return 1
    if r < 0.85 or big <= 17:
        return rng.randint(2, min(17, max(2, big)))
    return rng.randint(18, big)


def arr(rng: random.Random, shape, dtype=np.float32, guard: float = 0.15) -> np.ndarray:
    data = np.asarray(np.random.default_rng(rng.randrange(1 << 30)).standard_normal(shape), dtype)
    if rng.random() < guard:
        g = guarded(data.shape, dtype)
        g[...] = data
        return g
    return data


def weird_int(rng: random.Random) -> int:
    return rng.choice([0, -1, 1, 2, 3, 16, 17, 4095, 4096, 4097, 2**20, 2**20 + 1, 2**30, 2**31, 2**40, 2**40 + 1,
                       2**62, 2**63 - 1, -(2**63), 2**64, 2**70])


def hostile_array(rng: random.Random, a: np.ndarray) -> tuple[Any, str]:
    """``a`` made hostile one way; (array, what)."""
    k = rng.randrange(9)
    if k == 0:
        return a.astype(rng.choice([np.float64, np.float16, np.int32, np.int64, np.bool_]) if a.dtype != np.float64
                        else np.float32), "dtype"
    if k == 1 and a.ndim >= 1 and a.shape[-1] > 1:
        return a[..., ::2], "strided"
    if k == 2 and a.ndim >= 2:
        return np.asfortranarray(a) if a.shape[-1] > 1 and a.shape[-2] > 1 else a.T, "fortran"
    if k == 3:
        raw = np.zeros(a.size * a.itemsize + 1, np.uint8)
        u = np.frombuffer(raw.data, a.dtype, a.size, 1).reshape(a.shape)
        return u, "unaligned"
    if k == 4:
        r = a.copy()
        r.setflags(write=False)
        return r, "readonly"
    if k == 5:
        return a.reshape(-1), "rank"
    if k == 6:
        return a.reshape(-1)[: max(0, a.size - rng.choice((1, 16, 1000)))], "short"
    if k == 7:
        return rng.choice([None, 3, "x", [1.0, 2.0], np.float32(1)]), "not-an-array"
    return np.expand_dims(a, 0), "extra-dim"


def refused(entry: str, why: Any) -> NativeRefused:
    return NativeRefused(f"{entry}: {why}")


def through_wrapper(entry, what, call):
    """``call()`` of a kernel's Python wrapper: the native entry's clean refusal, or (for hostile
    arguments, ``what`` says which) the wrapper's own failure on them, is a refusal; anything else
    propagates (a wrapper failing on valid arguments is a bug)."""
    try:
        return call()
    except CLEAN as e:
        raise refused(entry, e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused(entry, f"wrapper: {type(e).__name__}: {e}") from None
        raise


def close(entry: str, got: np.ndarray, want: np.ndarray, tol: float = 1e-3) -> None:
    got = np.asarray(got, np.float64)
    if got.shape != want.shape:
        raise OracleViolation(f"{entry}: shape {got.shape}, the reference {want.shape}")
    if want.size:
        scale = max(1.0, float(np.max(np.abs(want))))
        if not np.allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True):
            raise OracleViolation(f"{entry}: max |d| {float(np.nanmax(np.abs(got - want)))} (scale {scale})")


# ------------------------------------------------------------------------------------------------
# references
# ------------------------------------------------------------------------------------------------
def conv_ref(x, w, group, k, s, d, pads, out_hw):
    """float64 (M, OH, OW) of one image's convolution; reads outside the image are zero."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    c, h, wd = x.shape
    m = w.shape[0]
    oh, ow = out_hw
    need_h = max(h + pads[0], (oh - 1) * s[0] + (k[0] - 1) * d[0] + 1)
    need_w = max(wd + pads[1], (ow - 1) * s[1] + (k[1] - 1) * d[1] + 1)
    xp = np.zeros((c, need_h, need_w))
    xp[:, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    out = np.zeros((m, oh, ow))
    cg, mg = c // group, m // group
    for i in range(k[0]):
        for j in range(k[1]):
            patch = xp[:, i * d[0]: i * d[0] + (oh - 1) * s[0] + 1: s[0], j * d[1]: j * d[1] + (ow - 1) * s[1] + 1: s[1]]
            for g in range(group):
                out[g * mg:(g + 1) * mg] += np.einsum("mc,chw->mhw", w[g * mg:(g + 1) * mg, :, i, j],
                                                      patch[g * cg:(g + 1) * cg])
    return out


def act_ref(y, act, clip):
    if clip is not None:
        y = np.clip(y, clip[0], clip[1])
    if act == "sigmoid":
        y = 1 / (1 + np.exp(-y))
    elif act == "silu":
        y = y / (1 + np.exp(-y))
    elif act in ("gelu", "gelu_tanh"):
        from math import erf

        y = 0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2))) if y.size else y
    elif act == "hardswish":
        y = y * np.clip(y / 6 + 0.5, 0, 1)
    return y


# ------------------------------------------------------------------------------------------------
# the entries
# ------------------------------------------------------------------------------------------------
def _epilogue(rng):
    clip = rng.choice([None, None, (0.0, 6.0), (-1.0, 1.0), (float("nan"), 1.0)])
    act = rng.choice([None, None, None, "sigmoid", "silu", "gelu", "gelu_tanh", "hardswish", "relu6", "bogus"])
    return clip, act


def e_sgemm_packed(rng, hostile):
    from ge_native import sgemm

    m, k, n = dim(rng, 100), dim(rng, 70), dim(rng, 80)
    a = arr(rng, (m, k))
    w = arr(rng, (k, n), guard=0)
    panels = sgemm.Panels(w)
    out = np.full((m, n), np.nan, np.float32)
    bias = arr(rng, (n,)) if rng.random() < 0.5 else None
    clip, act = _epilogue(rng)
    z = arr(rng, (m, n)) if rng.random() < 0.3 else None
    width = rng.choice([1, 1, 2, 3])
    what = ""
    if hostile:
        which = rng.randrange(5)
        if which == 0:
            a, what = hostile_array(rng, a)
        elif which == 1:
            out, what = hostile_array(rng, out)
        elif which == 2 and bias is not None:
            bias, what = hostile_array(rng, bias)
        elif which == 3:
            width, what = weird_int(rng), "width"
        else:
            z, what = (out if rng.random() < 0.5 else hostile_array(rng, arr(rng, (m, n)))[0]), "addend"
    ok = through_wrapper("sg_packed", what, lambda: sgemm.matmul_packed(a, panels, out, bias, clip, width, z, act))
    if not ok:
        raise refused("sg_packed", f"wrapper refused ({what or 'valid arguments'})")
    if not what:
        want = np.asarray(a, np.float64) @ np.asarray(w, np.float64)
        if bias is not None:
            want = want + bias
        if z is not None:
            want = want + z
        if not (clip is not None and np.isnan(clip[0])):
            close("sg_packed", out, act_ref(want, act, clip))
    return "sg_packed"


def e_sgemm_rows(rng, hostile):
    from ge_native import sgemm

    m, k, n = dim(rng, 60), dim(rng, 50), dim(rng, 90)
    w = arr(rng, (m, k))
    a = sgemm.RowPanels(w) if rng.random() < 0.5 else w
    b = arr(rng, (k, n))
    out = np.full((m, n), np.nan, np.float32)
    bias = arr(rng, (m,)) if rng.random() < 0.5 else None
    what = ""
    if hostile:
        which = rng.randrange(3)
        if which == 0:
            b, what = hostile_array(rng, b)
        elif which == 1:
            out, what = hostile_array(rng, out)
        else:
            bias, what = hostile_array(rng, arr(rng, (m,)))
    ok = through_wrapper("sg_conv", what, lambda: sgemm.matmul_rows(a, b, out, bias, None, rng.choice([1, 2])))
    if not ok:
        raise refused("sg_conv", f"wrapper refused ({what or 'valid'})")
    if not what:
        want = np.asarray(w, np.float64) @ np.asarray(b, np.float64)
        if bias is not None:
            want = want + np.asarray(bias, np.float64)[:, None]
        close("sg_conv/rows", out, want)
    return "sg_conv:rows"


def _conv_geometry(rng, channels_mult=1):
    group = rng.choice([1, 1, 2, 3, 4])
    cg, mg = dim(rng, 9), dim(rng, 20)
    c, m = cg * group * channels_mult, mg * group
    kh, kw = rng.choice([1, 1, 2, 3, 3, 5]), rng.choice([1, 1, 2, 3, 3, 5])
    sh, sw = rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2, 3])
    dh, dw = rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
    h, wd = dim(rng, 20), dim(rng, 20)
    pt, pl = rng.choice([0, 0, 1, 2]), rng.choice([0, 0, 1, 2])
    oh = max(1, (h + 2 * pt - (kh - 1) * dh - 1) // sh + 1)
    ow = max(1, (wd + 2 * pl - (kw - 1) * dw - 1) // sw + 1)
    return group, c, m, (kh, kw), (sh, sw), (dh, dw), (pt, pl), (h, wd), (oh, ow)


def e_sgemm_conv(rng, hostile):
    from ge_native import sgemm

    group, c, m, k, s, d, p, (h, wd), (oh, ow) = _conv_geometry(rng)
    x = arr(rng, (c, h, wd))
    w = arr(rng, (m, c // group if group else 0, *k), guard=0)
    w2 = w.reshape(m, -1) if m else np.zeros((0, (c // group) * k[0] * k[1]), np.float32)
    rows = sgemm.RowPanels(np.ascontiguousarray(w2), group) if rng.random() < 0.5 else np.ascontiguousarray(w2)
    out = np.full((m, oh * ow), np.nan, np.float32)
    bias = arr(rng, (m,)) if rng.random() < 0.5 else None
    clip, act = _epilogue(rng)
    geo = [group, k, s, d, p, (oh, ow)]
    what = ""
    if hostile:
        which = rng.randrange(4)
        if which == 0:
            x, what = hostile_array(rng, x)
        elif which == 1:
            out, what = hostile_array(rng, out)
        elif which == 2:
            i = rng.randrange(6)
            geo[i] = weird_int(rng) if i == 0 else (weird_int(rng), rng.choice([1, weird_int(rng)]))
            what = f"geometry {i}"
        else:
            bias, what = hostile_array(rng, arr(rng, (m,)))
    prepared = rng.random() < 0.3 and isinstance(rows, sgemm.RowPanels) and not what
    try:
        if prepared:
            ok = sgemm.Conv2d(rows, *geo, bias).run(x, out, clip, rng.choice([1, 2]), None, act)
        else:
            ok = sgemm.conv2d(x, rows, out, *geo, bias, clip, rng.choice([1, 2]), None, act)
    except CLEAN as e:
        raise refused("sg_conv", e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("sg_conv", f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not ok:
        raise refused("sg_conv", f"wrapper refused ({what or 'valid'})")
    if not what:
        want = conv_ref(x, w, group, k, s, d, p, (oh, ow)).reshape(m, oh * ow)
        if bias is not None:
            want = want + np.asarray(bias, np.float64)[:, None]
        if not (clip is not None and np.isnan(clip[0])):
            close("sg_conv", out, act_ref(want, act, clip))
    return "sg_conv:prepared" if prepared else "sg_conv"


def _raw_call(entry_name, fn, args, rng, hostile):
    """Call a raw entry with ``args``, one of them made hostile."""
    args = list(args)
    if hostile and args:
        i = rng.randrange(len(args))
        a = args[i]
        if isinstance(a, np.ndarray):
            args[i] = hostile_array(rng, a)[0]
        elif isinstance(a, (int, np.integer)):
            args[i] = weird_int(rng)
        elif isinstance(a, float):
            args[i] = rng.choice([float("nan"), float("inf"), -1.0, 1e300, "x"])
        else:
            args[i] = rng.choice([None, 1, np.zeros(3, np.float32)])
        if rng.random() < 0.2:
            args = args[: rng.randrange(len(args))]
    try:
        fn(*args)
    except CLEAN as e:
        raise refused(entry_name, e) from None
    return entry_name + ":raw"


def e_sgemm_raw(rng, hostile):
    from ge_native import sgemm

    mod = sgemm._mod()
    if mod is None:
        raise refused("sgemm", "not built here")
    if rng.random() < 0.5:
        m, k, n = dim(rng), dim(rng), dim(rng)
        p = sgemm.Panels(arr(rng, (k, n), guard=0))
        args = [arr(rng, (m, k)), p.data, np.zeros((m, n), np.float32), np.zeros(max(n, 1), np.float32),
                rng.choice([0, 1]), rng.choice([0, 1]), 0.0, 6.0, rng.choice([1, 2]), None, rng.randrange(6)]
        return _raw_call("sg_packed", mod.sg_packed, args, rng, True if hostile else False)
    group, c, m, k, s, d, p, (h, wd), (oh, ow) = _conv_geometry(rng)
    geo = np.array([group, *k, *s, *d, *p, oh, ow], np.int64)
    w2 = arr(rng, (m, (c // group) * k[0] * k[1]), guard=0)
    if hostile and rng.random() < 0.15:  # channels x kernel sides that wrap int64 to 0 (a weight of no columns)
        x = arr(rng, (16 * group, 3, 3))
        geo[1] = geo[2] = 2**30
        w2 = np.zeros((m, 0), np.float32)
        args = [x, w2, np.zeros((m, oh * ow), np.float32), np.zeros(max(m, 1), np.float32), 0, 0, 0.0, 0.0, 1, None,
                0, geo, -1]
        return _raw_call("sg_conv", mod.sg_conv, args, rng, False)
    if hostile and rng.random() < 0.5:
        geo[rng.randrange(11)] = rng.choice([0, -1, 2**31, 2**40, 2**62])
        hostile = False
    args = [arr(rng, (c, h, wd)), w2, np.zeros((m, oh * ow), np.float32), np.zeros(max(m, 1), np.float32),
            rng.choice([0, 2]), 0, 0.0, 0.0, rng.choice([1, 2]), None, 0, geo, -1]
    return _raw_call("sg_conv", mod.sg_conv, args, rng, hostile)


def e_nchwc(rng, hostile):
    from ge_native import nchwc

    if not nchwc.available():
        raise refused("nchwc", "not built here")
    kind = rng.choice(["conv", "conv", "dw", "pool", "gap", "reorder", "wino", "plain", "gn", "scale"])
    n = rng.choice([0, 1, 1, 2])
    cb, mb = rng.choice([0, 1, 1, 2]), rng.choice([0, 1, 1, 2])
    h, wd = dim(rng, 12), dim(rng, 12)
    k = (rng.choice([1, 3, 3, 5]), rng.choice([1, 3, 3]))
    s = (rng.choice([1, 1, 2]), rng.choice([1, 1, 2]))
    d = (1, 1) if rng.random() < 0.7 else (2, 2)
    p = (rng.choice([0, 1]), rng.choice([0, 1]))
    oh = max(0, (h + 2 * p[0] - (k[0] - 1) * d[0] - 1) // s[0] + 1)
    ow = max(0, (wd + 2 * p[1] - (k[1] - 1) * d[1] - 1) // s[1] + 1)
    x5 = arr(rng, (n, cb, h, wd, 16))
    width = rng.choice([1, 2])
    what = ""
    hb = hostile
    args: dict[str, Any] = {}
    try:
        if kind == "conv":
            w = arr(rng, (mb * 16, cb * 16, *k), guard=0)
            wpk = nchwc.pack_weights(w)
            out = np.full((n, mb, oh, ow, 16), np.nan, np.float32)  # (an output left unwritten shows)
            args = {"x": x5, "out": out}
            if hb:
                key = rng.choice(list(args))
                args[key], what = hostile_array(rng, args[key])
            ok = nchwc.conv(args["x"], wpk, args["out"], k, s, d, p, None, None, width)
            if ok and not what and n and mb and oh and ow:
                x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                if not (nchwc.from_blocked(x5, x4) if cb else True):
                    raise OracleViolation("from_blocked refused a valid array")
                y4 = np.zeros((n, mb * 16, oh, ow), np.float32)
                nchwc.from_blocked(out, y4)
                for i in range(n):
                    close("nc_conv", y4[i], conv_ref(x4[i], w, 1, k, s, d, p, (oh, ow)))
        elif kind == "dw":
            w = arr(rng, (cb * 16, 1, *k), guard=0)
            wpk = nchwc.pack_depthwise(w)
            out = np.full((n, cb, oh, ow, 16), np.nan, np.float32)
            args = {"x": x5, "out": out}
            if hb:
                key = rng.choice(list(args))
                args[key], what = hostile_array(rng, args[key])
            ok = nchwc.depthwise(args["x"], wpk, args["out"], k, s, d, p, None, None, width)
            if ok and not what and n and cb and oh and ow:
                x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                nchwc.from_blocked(x5, x4)
                y4 = np.zeros((n, cb * 16, oh, ow), np.float32)
                nchwc.from_blocked(out, y4)
                for i in range(n):
                    close("nc_dwconv", y4[i], conv_ref(x4[i], w, cb * 16, k, s, d, p, (oh, ow)))
        elif kind == "pool":
            out = np.zeros((n, cb, oh, ow, 16), np.float32)
            pk = rng.choice(list(nchwc.POOLS) + (["bad"] if hb else []))
            geo = [k, s, d, p]
            if hb and rng.random() < 0.5:
                geo[rng.randrange(4)] = (weird_int(rng), 1)
                what = "geometry"
            ok = nchwc.pool(x5, out, pk, *geo, width)
        elif kind == "gap":
            out = np.zeros((n, cb * 16), np.float32)
            if hb:
                out, what = hostile_array(rng, out)
            ok = nchwc.global_average(x5, out, width)
            if ok and not what and h * wd:
                x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                nchwc.from_blocked(x5, x4)
                close("nc_gap", out, x4.astype(np.float64).mean(axis=(2, 3)))
        elif kind == "reorder":
            c = rng.choice([0, 1, 3, 16, 17, 33])
            x4 = arr(rng, (n, c, h, wd))
            y5 = np.zeros(nchwc.blocked_shape(x4.shape), np.float32)
            if hb:
                y5, what = hostile_array(rng, y5)
            ok = nchwc.to_blocked(x4, y5, width)
            if ok and not what:
                back = np.zeros_like(x4)
                if not nchwc.from_blocked(y5, back, width):
                    raise OracleViolation("from_blocked refused what to_blocked wrote")
                close("nc_reorder", back, x4.astype(np.float64), 0)
        elif kind == "wino":
            m = rng.choice([2, 4])
            w = arr(rng, (mb * 16, cb * 16, 3, 3), guard=0)
            if not mb or not cb:
                ok = False
                what = "no channels"
            else:
                upk = nchwc.winograd_weights(w, m)
                oh3, ow3 = max(0, h + 2 * p[0] - 2), max(0, wd + 2 * p[1] - 2)
                out = np.full((n, mb, oh3, ow3, 16), np.nan, np.float32)
                if hb:
                    out, what = hostile_array(rng, out)
                ok = nchwc.winograd(x5, upk, out, m, p, None, None, width)
                if ok and not what and n and oh3 and ow3:
                    x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                    nchwc.from_blocked(x5, x4)
                    y4 = np.zeros((n, mb * 16, oh3, ow3), np.float32)
                    nchwc.from_blocked(out, y4)
                    for i in range(n):
                        close("nc_wino", y4[i], conv_ref(x4[i], w, 1, (3, 3), (1, 1), (1, 1), p, (oh3, ow3)), 2e-3)
        elif kind == "plain":
            c = rng.choice([0, 1, 3])
            x4 = arr(rng, (n, c, h, wd))
            w = arr(rng, (mb * 16, c, *k), guard=0)
            out = np.full((n, mb, oh, ow, 16), np.nan, np.float32)
            if hb:
                out, what = hostile_array(rng, out)
            ok = nchwc.conv_plain(x4, nchwc.pack_plain(w), out, k, s, d, p, None, None, width)
            if ok and not what and n and mb and oh and ow:
                y4 = np.zeros((n, mb * 16, oh, ow), np.float32)
                nchwc.from_blocked(out, y4)
                for i in range(n):
                    close("nc_conv_plain", y4[i], conv_ref(x4[i], w, 1, k, s, d, p, (oh, ow)))
        elif kind == "gn":
            gs = rng.choice([1, 2, 4, 8, 16, 32, 3, 0])
            out = np.zeros_like(x5)
            eps = rng.choice([1e-5, 0.0, float("nan"), -1.0]) if hb else 1e-5
            what = "eps" if hb else ""
            ok = nchwc.group_norm(x5, out, gs, np.ones(cb * 16, np.float32), np.zeros(cb * 16, np.float32), eps,
                                  width, rng.random() < 0.5)
        else:
            taps = k[0] * k[1]
            wpk = np.asarray(nchwc.pack_weights(arr(rng, (mb * 16, cb * 16, *k), guard=0)))
            sc = arr(rng, (cb * 16,))
            out = np.zeros_like(wpk)
            ib, ob = (cb, mb) if not hb else (rng.choice([cb, weird_int(rng)]), rng.choice([mb, weird_int(rng)]))
            what = "blocks" if hb else ""
            ok = nchwc.scale_weights(wpk, sc, out, ib, taps, ob)
    except CLEAN as e:
        raise refused("nc_" + kind, e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("nc_" + kind, f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not ok:
        raise refused("nc_" + kind, f"wrapper refused ({what or 'valid'})")
    return "nc_" + kind


def e_gemm(rng, hostile):
    from ge_native import gemm

    if not gemm.available():
        raise refused("gemm", "not built here")
    kind = rng.choice(["rows", "cols", "batch", "blocks"])
    dt = rng.choice([np.float32, np.float64])
    m, k, n = rng.choice([0, 8, 9, 17, 33]), dim(rng), dim(rng)
    a = arr(rng, (m, k), dt)
    b = arr(rng, (k, n), dt)
    out = np.full((m, n), np.nan, dt)
    what = ""
    try:
        if kind in ("rows", "cols"):
            cut = rng.randint(0, m if kind == "rows" else n)
            end = m if kind == "rows" else n
            cuts = [(0, cut), (cut, end)] if 0 < cut < end else [(0, end)]
            if hostile:
                r = rng.randrange(3)
                if r == 0:
                    cuts, what = [(0, end + rng.choice([1, 2**40])), (end, end)], "cuts"
                elif r == 1:
                    out, what = hostile_array(rng, out)
                else:
                    a, what = hostile_array(rng, a)
            if kind == "rows":
                ok = gemm.run_rows(a, b, out, cuts, rng.choice([1, 2]))
            else:
                ok = gemm.run_cols(a, b, out, cuts, rng.choice([1, 2]))
            want = np.asarray(a, np.float64) @ np.asarray(b, np.float64) if not what else None
        elif kind == "batch":
            bt = rng.choice([0, 1, 3])
            a3, b3 = arr(rng, (bt, m, k), dt), arr(rng, (bt, k, n), dt)
            o3 = np.full((bt, m, n), np.nan, dt)
            if hostile:
                o3, what = hostile_array(rng, o3)
            ok = gemm.run_batched(a3, b3, o3, rng.choice([1, 2]))
            out = o3
            want = np.matmul(a3.astype(np.float64), b3.astype(np.float64)) if not what else None
        else:
            cut = rng.randint(0, n)
            parts = [np.ascontiguousarray(b[:, :cut]), np.ascontiguousarray(b[:, cut:])]
            prep = gemm.Blocks(parts, [0, cut])
            bias = arr(rng, (n,), dt) if rng.random() < 0.5 else None
            if hostile:
                out, what = hostile_array(rng, out)
            ok = gemm.run_blocks(prep, a, out, bias, rng.choice([1, 2]))
            want = None
            if not what:
                want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
                if bias is not None:
                    want = want + bias
    except CLEAN as e:
        raise refused("gemm_" + kind, e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("gemm_" + kind, f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not ok:
        raise refused("gemm_" + kind, f"wrapper refused ({what or 'valid'})")
    if want is not None:
        close("gemm_" + kind, out, want, 1e-3)
    return "gemm_" + kind


def e_attention(rng, hostile):
    from ge_fusion import attention

    dt = rng.choice([np.float32, np.float64])
    b, hd = rng.choice([0, 1, 2]), rng.choice([1, 2, 3])
    m, n, d, dv = dim(rng, 30), dim(rng, 30), dim(rng, 20), dim(rng, 20)
    q = arr(rng, (b, hd, m, d), dt)
    kt = arr(rng, (b, hd, d, n), dt)
    if rng.random() < 0.3:  # a transposed view of K
        kt = np.swapaxes(arr(rng, (b, hd, n, d), dt), -1, -2)
    v = arr(rng, (b, hd, n, dv), dt)
    mask = arr(rng, rng.choice([(n,), (m, n), (1, 1, m, n), (b, 1, 1, n)]), dt) if rng.random() < 0.3 else None
    out = None
    what = ""
    if hostile:
        r = rng.randrange(4)
        if r == 0:
            q, what = hostile_array(rng, q)
        elif r == 1:
            v, what = hostile_array(rng, v)
        elif r == 2:
            mask, what = hostile_array(rng, arr(rng, (m, n), dt))
        else:
            out, what = np.zeros((b, hd, m, dv), dt)[..., ::-1], "reversed output"
    scale = rng.choice([0.125, 1.0, float("nan")]) if hostile else 0.125
    res = through_wrapper("attention", what, lambda: attention.run(q, kt, v, mask, scale, out, rng.choice([1, 2])))
    if res is None:
        raise refused("attention", f"wrapper refused ({what or 'valid'})")
    if not what and not np.isnan(scale):
        s = np.matmul(np.asarray(q, np.float64), np.asarray(kt, np.float64)) * scale
        if mask is not None:
            s = s + np.asarray(mask, np.float64)
        if s.size:
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
        close("attention", res, np.matmul(s, np.asarray(v, np.float64)), 2e-3)
    return "attention_heads"


_BN_RELU: list[tuple[str, list[str], dict[str, Any]]] = [("Mul", ["a0", "a1"], {}), ("Add", ["t0", "a2"], {}), ("Relu", ["t1"], {}), ("Sub", ["t2", "a1"], {})]
_LOOPS: dict = {}


def e_loop(rng, hostile):
    from ge_fusion import loopgen

    if not loopgen.available():
        raise refused("loop", "not built here")
    dt = rng.choice(["float32", "float64"])
    lead = [dim(rng, 6), dim(rng, 9)]
    c, hw = dim(rng, 9), dim(rng, 30)
    pattern = rng.choice(["full", "channel", "scalar"])
    full = tuple(lead[:1] + [c, hw])
    shapes = {"full": [full, full, full], "channel": [full, (c, 1), (c, 1)], "scalar": [full, (), ()]}[pattern]
    dynamic = rng.random() < 0.4
    key = (dt, pattern, tuple(shapes) if not dynamic else None, dynamic)
    fn = _LOOPS.get(key)
    if fn is None and key not in _LOOPS:
        if dynamic:
            sym = {"full": [("N", "C", "H")] * 3, "channel": [("N", "C", "H"), ("C", 1), ("C", 1)],
                   "scalar": [("N", "C", "H"), (), ()]}[pattern]
            fn = loopgen.loop_kernel_dynamic(_BN_RELU, ["a0", "a1", "a2"], [dt] * 3, sym, dt, ("N", "C", "H"))
        else:
            fn = loopgen.loop_kernel(_BN_RELU, ["a0", "a1", "a2"], [dt] * 3, shapes, dt, full)
        if len(_LOOPS) > 200:
            _LOOPS.clear()
        _LOOPS[key] = fn
    if fn is None:
        raise refused("loop", "no loop form")
    xs = [arr(rng, s, dt) for s in shapes]
    what = ""
    out = None
    if hostile:
        r = rng.randrange(3)
        if r == 0:
            i = rng.randrange(3)
            xs[i], what = hostile_array(rng, xs[i])
        elif r == 1:
            out, what = hostile_array(rng, np.zeros(full, dt))
        else:
            xs, what = xs[:2], "operands"
    got = through_wrapper("loop", what, lambda: fn(*xs, out=out) if out is not None else fn(*xs))
    if not what:
        x64 = [np.asarray(x, np.float64) for x in xs]
        close("loop", got, np.maximum(x64[0] * x64[1] + x64[2], 0) - x64[1], 1e-5)
    return "loop:" + ("dynamic" if dynamic else "static")


def e_loop_raw(rng, hostile):
    from ge_fusion import loopgen

    dt = np.dtype(rng.choice(["float32", "float64"]))
    built = _LOOPS.get(("raw", dt.name))
    if built is None:
        built = _LOOPS[("raw", dt.name)] = loopgen._compile(_BN_RELU, ["a0", "a1", "a2"], dt, (1, 1, 1), ())
    if built is None:
        raise refused("loop", "no loop form")
    d0, d1, d2 = dim(rng, 5), dim(rng, 5), dim(rng, 30)
    out = np.zeros(d0 * d1 * d2, dt)
    xs = [arr(rng, (d0 * d1 * d2,), dt) for _ in range(3)]
    args = [d0, d1, d2, out, d1 * d2, d2]
    for x in xs:
        args += [x, d1 * d2, d2]
    args.append(rng.choice([1, 2]))
    return _raw_call("loop", built.kernel, args, rng, hostile)


def e_rows(rng, hostile):
    from ge_fusion import loopgen

    kind = rng.choice(list(loopgen.ROW_KINDS))
    dt = rng.choice([np.float32, np.float64])
    fn = loopgen.row_kernel(kind, dt)
    if fn is None:
        raise refused("rows", "not built here")
    rows, cols = dim(rng, 40), dim(rng, 70)
    if kind == "rotary":
        cols -= cols % 2
    x = arr(rng, (rows, cols), dt)
    out = np.zeros((rows, cols), dt)
    g, b = arr(rng, (cols,), dt), arr(rng, (cols,), dt)
    P = rng.choice([1, rows]) if rows else 1
    params: list[Any] = {"layernorm": [g, b, 1e-5], "rmsnorm": [g, 1e-5], "softmax": [],
                         "rotary": [arr(rng, (P, cols), dt), arr(rng, (P, cols), dt), P],
                         "softmax_scaled": [0.5, arr(rng, (P, cols), dt) if rng.random() < 0.5 else
                                            np.zeros((0, cols), dt), P]}[kind]
    if kind == "softmax_scaled" and params[1].size == 0:
        params[2] = 0
    what = ""
    if hostile:
        r = rng.randrange(3)
        if r == 0:
            x, what = hostile_array(rng, x)
        elif r == 1:
            out, what = hostile_array(rng, out)
        elif params:
            i = rng.randrange(len(params))
            params[i] = hostile_array(rng, params[i])[0] if isinstance(params[i], np.ndarray) else weird_int(rng)
            what = "parameter"
        else:
            what = "none"
    if hostile and rng.random() < 0.3:  # the raw entry with rows, cols or threads of its own
        from ge_native import native, sgemm

        key = ("rows-module", np.dtype(dt).name)
        if key not in _LOOPS:
            _LOOPS[key] = native.build(loopgen._ROW_TYPES[np.dtype(dt).name] + sgemm.ACTIVATION_C16 + loopgen._ROW_SRC,
                                       list(loopgen.ROW_KINDS))
        mod = _LOOPS[key]
        if mod is None:
            raise refused("rows", "not built here")
        ints = [rows, cols, 1]
        ints[rng.randrange(3)] = weird_int(rng)
        return _raw_call("rows_" + kind, getattr(mod, kind), [x, *params, out, *ints], rng, False)
    try:
        if what and rng.random() < 0.5:  # the raw entry itself (the shape as given)
            fn(x, *params, out)
        else:
            loopgen.by_rows(fn, x, out, *params)
    except CLEAN as e:
        raise refused("rows_" + kind, e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("rows_" + kind, f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not what and rows and cols:
        x64 = x.astype(np.float64)
        if kind == "layernorm":
            mu = x64.mean(-1, keepdims=True)
            want = (x64 - mu) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * g + b
            close("rows_layernorm", out, want, 1e-3)
        elif kind == "softmax":
            ex = np.exp(x64 - x64.max(-1, keepdims=True))
            close("rows_softmax", out, ex / ex.sum(-1, keepdims=True), 1e-4)
    return "rows_" + kind


def e_window(rng, hostile):
    from ge_cpu.kernels import _window

    if not _window.available():
        raise refused("window", "not built here")
    kind = rng.choice(["conv", "max", "avg"])
    dt = np.dtype(rng.choice(["float32", "float64"]))
    n, c = rng.choice([0, 1, 2]), dim(rng, 6)
    h, wd = dim(rng, 14), dim(rng, 14)
    k = (rng.choice([1, 2, 3]), rng.choice([1, 2, 3]))
    s = (rng.choice([1, 2]), rng.choice([1, 2]))
    d = (rng.choice([1, 1, 2]), 1)
    pb = (rng.choice([0, 1]), rng.choice([0, 1]))
    oh = (h + 2 * pb[0] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (wd + 2 * pb[1] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    if oh < 1 or ow < 1:
        oh, ow = max(oh, 0), max(ow, 0)
    try:
        plan = _window.WindowPlan((h, wd), k, s, d, pb, (oh, ow))
    except CLEAN as e:
        raise refused("window", e) from None
    x = arr(rng, (n, c, h, wd), dt)
    out = np.full((n, c, oh, ow), np.nan, dt)
    wt = arr(rng, (c, k[0] * k[1]), dt) if kind == "conv" else None
    bias = arr(rng, (c,), dt) if kind == "conv" else None
    dv = np.full(oh * ow, float(k[0] * k[1]), dt) if kind == "avg" else None
    what = ""
    if hostile:
        r = rng.randrange(3)
        if r == 0:
            x, what = hostile_array(rng, x)
        elif r == 1:
            out, what = hostile_array(rng, out)
        elif kind == "conv":
            wt, what = hostile_array(rng, wt)
        else:
            dv, what = hostile_array(rng, np.ones(oh * ow, dt))
    ok = through_wrapper("window_" + kind, what, lambda: _window.run(kind, plan, x, out, wt, bias, dv, threads=rng.choice([1, 2]), direct=rng.random() < 0.5))
    if not ok:
        raise refused("window_" + kind, f"wrapper refused ({what or 'valid'})")
    if not what and kind == "conv" and n and c and oh and ow:
        for i in range(n):
            want = conv_ref(x[i], wt.reshape(c, 1, *k), c, k, s, d, pb, (oh, ow)) + np.asarray(bias, np.float64)[:, None, None]
            close("window_conv", out[i], want, 1e-3)
    return "window_" + kind


def e_dw_direct(rng, hostile):
    from ge_cpu.kernels import _window

    mod = _window._direct()
    if mod is None:
        raise refused("dw_conv", "not built here")
    n, c, h, w = rng.choice([0, 1, 2]), dim(rng, 20), dim(rng, 16), dim(rng, 16)
    kh, kw, sh, sw = rng.choice([1, 3, 5]), rng.choice([1, 3, 5]), rng.choice([1, 2]), rng.choice([1, 2])
    pt, pl, dh, dw, mult = rng.choice([0, 1, 2]), rng.choice([0, 1, 2]), 1, 1, rng.choice([1, 1, 2])
    oh = max(0, (h + 2 * pt - kh) // sh + 1)
    ow = max(0, (w + 2 * pl - kw) // sw + 1)
    x = arr(rng, (n, c, h, w))
    wt = arr(rng, (c * mult, kh * kw))
    b = arr(rng, (c * mult,))
    out = np.zeros((n, c * mult, oh, ow), np.float32)
    args = [n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, mult, x, wt, b, out, rng.choice([1, 2]),
            rng.randrange(6), float("-inf"), float("inf")]
    label = _raw_call("dw_conv", mod.dw_conv, args, rng, hostile)
    if not hostile and n and c and oh and ow and mult == 1 and args[20] == 0:
        for i in range(n):
            want = conv_ref(x[i], wt.reshape(c, 1, kh, kw), c, (kh, kw), (sh, sw), (1, 1), (pt, pl), (oh, ow))
            close("dw_conv", out[i], want + np.asarray(b, np.float64)[:, None, None], 1e-3)
    return label


def e_winograd(rng, hostile):
    from ge_cpu.kernels import winograd

    dt = rng.choice([np.float32, np.float64])
    if rng.random() < 0.5:  # the layer
        n, c, m = rng.choice([0, 1, 2]), dim(rng, 8), dim(rng, 8)
        h, wd = dim(rng, 12), dim(rng, 12)
        pads = tuple(rng.choice([0, 1]) for _ in range(4))
        w = arr(rng, (m, c, 3, 3), dt, guard=0)
        if not c or not m:
            raise refused("winograd", "no channels")
        wino = winograd.Winograd(w)
        x = arr(rng, (n, c, h, wd), dt)
        bias = arr(rng, (m,), dt) if rng.random() < 0.5 else None
        if hostile:
            x = hostile_array(rng, x)[0]
        try:
            y = wino.run(x, pads, None, bias)
        except CLEAN as e:
            raise refused("winograd", e) from None
        except (AttributeError, IndexError) as e:
            if hostile:
                raise refused("winograd", f"wrapper: {type(e).__name__}: {e}") from None
            raise
        if not hostile:
            oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
            want = np.stack([conv_ref(x[i], w, 1, (3, 3), (1, 1), (1, 1), pads[:2], (oh, ow)) for i in range(n)]) \
                if n else np.zeros((0, m, oh, ow))
            if bias is not None:
                want = want + np.asarray(bias, np.float64)[:, None, None]
            close("winograd", y, want, 2e-3)
        return "winograd"
    fns = winograd.native_transforms(dt)
    if fns is None:
        raise refused("winograd", "not built here")
    fin, fout = fns
    n, c, h, w = rng.choice([0, 1, 2]), dim(rng, 6), dim(rng, 10), dim(rng, 10)
    th, tw = (h + 1) // 2, (w + 1) // 2
    if rng.random() < 0.5:
        args = [arr(rng, (n, c, h, w), dt), np.zeros((16, c, n * th * tw), dt), n, c, h, w, 1, 1, th, tw,
                rng.choice([1, 2])]
        return _raw_call("wino_in", fin, args, rng, hostile)
    m = dim(rng, 6)
    oh, ow = 2 * th, 2 * tw
    args = [arr(rng, (16, m, n * th * tw), dt), np.zeros((n, m, oh, ow), dt), None, n, m, oh, ow, rng.choice([1, 2])]
    return _raw_call("wino_out", fout, args, rng, hostile)


def e_misc(rng, hostile):
    from ge_cpu.kernels import elementwise, nn

    dt = np.dtype(rng.choice(["float32", "float64"]))
    if rng.random() < 0.5:
        fn = nn._instnorm_kernel(dt)
        if fn is None:
            raise refused("instnorm", "not built here")
        c = rng.choice([1, 2, 3])
        rows, cols = c * rng.choice([0, 1, 2]), dim(rng, 40)
        x = arr(rng, (rows, cols), dt)
        y = np.zeros_like(x)
        gb = np.concatenate([np.ones(c, dt), np.zeros(c, dt)])
        args = [x, y, gb, 1e-5, c, rng.choice([1, 2])]
        label = _raw_call("instnorm", fn, args, rng, hostile)
        if not hostile and rows and cols:
            x64 = x.astype(np.float64)
            want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
            close("instnorm", y, want, 2e-3)
        return label
    x = arr(rng, (rng.choice([0, 1, 63, 64, 65, 1000]),), dt)
    if rng.random() < 0.5:
        loop = elementwise._erf_loop(dt)
        if loop is None:
            raise refused("erf", "not built here")
        return _raw_call("erf", loop, [x, np.zeros_like(x)], rng, hostile)
    if hostile:
        x = hostile_array(rng, x)[0]
        if not isinstance(x, np.ndarray):
            raise refused("erf", "not an array")
    try:
        y = elementwise.erf(x)
    except CLEAN as e:
        raise refused("erf", e) from None
    if not hostile:
        from math import erf

        close("erf", y, np.array([erf(v) for v in x.astype(np.float64)]).reshape(x.shape), 1e-5)
    return "erf"


class _Recorder:
    """A stand-in for a built module that records the raw arguments of every entry call."""

    def __init__(self, mod: Any) -> None:
        self._mod = mod
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._mod, name)
        if not callable(fn) or name.endswith(("_ok", "_isa", "_width")):
            return fn

        def rec(*args):
            self.calls.append((name, args))
            return fn(*args)

        return rec


def _mutate_raw(rng, orig: tuple) -> list:
    """``args`` with one changed: an int to a weird one, an int64 vector's element (a geometry,
    offsets) to a weird value, an array made hostile, a float to NaN; or cut short."""
    args = list(orig)
    arrays = [j for j, x in enumerate(args) if isinstance(x, np.ndarray)]
    if len(arrays) >= 2 and rng.random() < 0.15:  # one array passed again where another belongs (aliasing)
        j, k = rng.sample(arrays, 2)
        args[j] = args[k]
        return args
    i = rng.randrange(len(args))
    a = args[i]
    if isinstance(a, np.ndarray) and a.dtype == np.int64 and a.size and rng.random() < 0.7:
        b = a.copy()
        b.reshape(-1)[rng.randrange(b.size)] = rng.choice([0, -1, 2, 2**20 + 1, 2**31, 2**40, 2**62, -(2**63)])
        args[i] = b
    elif isinstance(a, np.ndarray):
        args[i] = hostile_array(rng, a)[0]
    elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        args[i] = weird_int(rng) if rng.random() < 0.7 else int(a) + rng.choice([-1, 1])
    elif isinstance(a, float):
        args[i] = rng.choice([float("nan"), float("-inf"), -1.0])
    else:
        args[i] = rng.choice([None, 0, np.zeros(1, np.float32)])
    if rng.random() < 0.1:
        args = args[: rng.randrange(len(args))]
    return args


def e_replay(rng, hostile):
    """A valid wrapper call of sgemm or nchwc recorded, then its raw entry called again with one
    argument changed (the entries check every size, stride and attribute themselves)."""
    from ge_native import nchwc, sgemm

    which, run = rng.choice([(nchwc, e_nchwc), (sgemm, e_sgemm_conv), (sgemm, e_sgemm_packed)])
    mod = which._mod()
    if mod is None:
        raise refused("replay", "not built here")
    rec = _Recorder(mod)
    saved = which._mod
    which._mod = lambda: rec
    try:
        with contextlib.suppress(NativeRefused):  # a refused valid call records no less
            run(rng, False)
    finally:
        which._mod = saved
    if not rec.calls:
        raise refused("replay", "no entry called")
    name, args = rng.choice(rec.calls)
    fn = getattr(mod, name)
    try:
        fn(*(_mutate_raw(rng, args) if hostile else args))
    except CLEAN as e:
        raise refused(name, e) from None
    return name + ":replay"


ENTRIES = [(e_replay, 3), (e_sgemm_packed, 3), (e_sgemm_rows, 2), (e_sgemm_conv, 3), (e_sgemm_raw, 2), (e_nchwc, 5), (e_gemm, 2),
           (e_attention, 2), (e_loop, 2), (e_loop_raw, 1), (e_rows, 2), (e_window, 2), (e_dw_direct, 1),
           (e_winograd, 2), (e_misc, 2)]


class NativeTarget(Target):
    """Every native kernel entry, called directly with random extents and hostile arguments."""

    name = "native"
    case_timeout = 20.0
    #: the share of cases with one hostile argument
    hostile_share = 0.7

    def warm_up(self) -> None:
        import ge_cpu.kernels  # noqa: F401
        import ge_fusion.attention  # noqa: F401
        from ge_native import gemm, nchwc, sgemm

        sgemm.available()
        nchwc.available()
        gemm.available()

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        self.warm_up()
        self._pool = [f for f, w in ENTRIES for _ in range(w)]
        #: GE_FUZZ_NATIVE_EVEN=1: the entry groups in turn (case i runs group i % 15), for a
        #: campaign of a given number of cases per group (scripts/fuzz.py --target native)
        self._even = os.environ.get("GE_FUZZ_NATIVE_EVEN", "") not in ("", "0")

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        _KEEP.clear()
        fn = ENTRIES[index % len(ENTRIES)][0] if self._even else rng.choice(self._pool)
        hostile = rng.random() < self.hostile_share
        ctx["mutation"] = f"{fn.__name__[2:]}:{'hostile' if hostile else 'valid'}"
        ctx["input"] = f"{fn.__name__} index {index}".encode()
        return fn(rng, hostile)
