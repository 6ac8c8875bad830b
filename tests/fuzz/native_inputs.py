"""The native target's inputs: arrays placed before a guard page, random extents, hostile
arguments, clean refusals, and the NumPy references results are checked against."""

from __future__ import annotations

import ctypes
import mmap
import random
from typing import Any

import numpy as np
from fuzz_engine import OracleViolation

from ge_core.errors import ExecutionError

CLEAN = (ValueError, TypeError, OverflowError)


class NativeRefused(ExecutionError):
    """A native entry (or its wrapper) refused its arguments cleanly."""


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


def _epilogue(rng):
    clip = rng.choice([None, None, (0.0, 6.0), (-1.0, 1.0), (float("nan"), 1.0)])
    act = rng.choice([None, None, None, "sigmoid", "silu", "gelu", "gelu_tanh", "hardswish", "relu6", "bogus"])
    return clip, act


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
