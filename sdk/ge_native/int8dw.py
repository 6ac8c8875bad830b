"""GE's int8 depthwise convolution over the NCHWc blocked layout: ``x5`` ``(N, C/16, H, W, 16)``
float32 quantised on read (``q = clamp(rint(x / s) + z, lo, hi)``, IEEE division, half to even:
QuantizeLinear's bits; int8 activations shifted by 128 into u8) or uint8 holding the integers
already, an int8 ``(C, 1, KH, KW)`` weight (zero point 0) packed once (:class:`PackedDW8`), exact
int32 sums ``sum_taps (q - z) * w`` (spatial pads are the float 0.0: the integer ``z``), and the
epilogue in float32 at the store, in :mod:`ge_native.int8`'s order: ``y = float(acc) * mult[c]``
(``mult = float32(s * w_scale[c])``), ``+ bias[c]``, ``+ addend``, clip, activation (``act32``
of ``csrc/activations.h`` in every variant, which :func:`reference` repeats in NumPy), then a
float32 output (optionally fake-quantised by ``out_quant=(ys, yz, qlo, qhi)``: ``(clamp(rint(y /
ys) + yz, qlo, qhi) - yz) * ys``) or a uint8 output holding ``clamp(rint(y / ys) + yz, qlo,
qhi)``. Each step is one float32 rounding (no contraction), so :func:`reference` matches every
variant bit for bit; the clamps take the bound for a NaN (VMAXPS's rule).

Variants (the ``int8dw`` family of :mod:`ge_native.isa`): ``avx512_vnni`` (VPDPBUSD: 16 channels
by 4 taps of a kernel row an instruction, from the input rows laid out as per-channel tap quads
in a thread's scratch), ``avx2`` (the quads widened to int16, VPMADDWD) and ``scalar``.
``GE_NATIVE_INT8DW=0`` turns the path off; ``GE_NATIVE_INT8DW=<variant>`` forces a variant this
CPU runs. Tasks are (image, channel block, output rows): the same bits at every thread count.
The C is ``csrc/int8dw.c``.
"""

from __future__ import annotations

import functools

import numpy as np

from . import isa as _isa
from . import native
from .activations import C_IDS

#: channels per block of the NCHWc layout
BLOCK = 16
#: the most taps (KH * KW) a sum may have (255 * 128 * taps fits int32)
KMAX = 65536
VARIANTS = ("avx512_vnni", "avx2", "scalar")
_CODES = {"scalar": 0, "avx2": 1, "avx512_vnni": 2}
#: the activations the epilogue applies, by code (:data:`ge_native.activations.C_IDS`); ``relu``
#: and ``relu6`` are folded into the clip
ACTIVATIONS = C_IDS
#: the range of each activation dtype
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}

_SRC = native.c_source("int8dw.c")
_mod = native.lazy_module("GE_NATIVE_INT8DW", _SRC, ["dw8_ok", "dw8_caps", "dw8_isa", "dw8_conv"], "dw8_ok")
_ONE = np.ones(1, np.float32)
_F32_MAX = float(np.finfo(np.float32).max)
_LIM = 1 << 20
_seen: dict[str, tuple[str, ...]] = {}


def available() -> bool:
    """True when the native module built here and ``GE_NATIVE_INT8DW`` leaves it on."""
    return _mod() is not None


def runnable() -> tuple[str, ...]:
    """The variants this CPU runs, best first (empty when the path is off)."""
    if "runs" not in _seen:
        mod = _mod()
        if mod is None:
            return ()
        mask = int(mod.dw8_caps())
        _seen["runs"] = tuple(v for v in VARIANTS if mask >> _CODES[v] & 1)
    return _seen["runs"]


def isa() -> str | None:
    """The variant :func:`depthwise_nchwc` runs: the one ``GE_NATIVE_INT8DW`` names where this CPU
    runs it, else the best this CPU runs; None when the path is off or did not build."""
    mod = _mod()
    return None if mod is None else str(mod.dw8_isa())


def _groups(kw: int) -> int:
    return -(-kw // 4)


class PackedDW8:
    """A depthwise ``(C, 1, KH, KW)`` int8 weight packed as ``(ceil(C / 16), KH, ceil(KW / 4), 64)``
    int8 (64-byte aligned): byte ``4c + j`` of ``(cb, ky, t)`` is channel ``16 cb + c``'s tap ``(ky,
    4t + j)``, zero past KW and past C (a VPDPBUSD operand: 16 channels by 4 taps). ``data`` is
    what a compiled model stores; ``wsum`` (int32, one per lane of the blocks) the per-channel
    sums the zero point's correction needs."""

    def __init__(self, w: np.ndarray) -> None:
        if not isinstance(w, np.ndarray) or w.ndim != 4 or w.dtype != np.int8 or w.shape[1] != 1:
            raise ValueError(f"PackedDW8 takes an int8 (C, 1, KH, KW) weight, not {getattr(w, 'dtype', type(w))} "
                             f"{np.shape(w)}")
        c, _, kh, kw = (int(s) for s in w.shape)
        _check_shape((c, 1, kh, kw))
        cb, g = -(-c // BLOCK), _groups(kw)
        full = np.zeros((cb * BLOCK, kh, g * 4), np.int8)
        full[:c, :, :kw] = w[:, 0]
        # (cb, 16, kh, g, 4) -> (cb, kh, g, 16, 4): channel-major quads of a kernel row's taps
        packed = full.reshape(cb, BLOCK, kh, g, 4).transpose(0, 2, 3, 1, 4).reshape(cb, kh, g, 4 * BLOCK)
        self._init(native.aligned(packed), (c, 1, kh, kw))

    def _init(self, data: np.ndarray, shape: tuple[int, int, int, int]) -> None:
        self.data, self.shape = data, shape
        cb, kh, g, _ = data.shape
        sums = data.reshape(cb, kh, g, BLOCK, 4).sum(axis=(1, 2, 4), dtype=np.int64)
        self.wsum = np.ascontiguousarray(sums.reshape(cb * BLOCK).astype(np.int32))

    @property
    def blocks(self) -> int:
        """The channel blocks (``ceil(C / 16)``)."""
        return int(self.data.shape[0])

    @classmethod
    def from_data(cls, data: np.ndarray, shape: tuple[int, int, int, int]) -> PackedDW8:
        """The packed weight of ``shape`` ``(C, 1, KH, KW)`` whose bits are ``data`` (a stored
        :attr:`data`, perhaps a read-only memory map), wrapped without a copy; ValueError when
        ``data`` is not a C-contiguous int8 array of the packed shape with zeros past C and KW."""
        try:
            c, one, kh, kw = (int(s) for s in shape)
        except (TypeError, ValueError):
            raise ValueError(f"no depthwise weight has the shape {shape!r}") from None
        _check_shape((c, one, kh, kw))
        want = (-(-c // BLOCK), kh, _groups(kw), 4 * BLOCK)
        if (not isinstance(data, np.ndarray) or data.dtype != np.int8 or data.shape != want
                or not data.flags.c_contiguous):
            got = (getattr(data, "dtype", type(data)), getattr(data, "shape", None))
            raise ValueError(f"packed int8 depthwise bits of {tuple(shape)} are a C-contiguous int8 {want}, not {got}")
        # (block, row, quad, lane, member): channel 16 * block + lane, tap 4 * quad + member
        channel = np.arange(want[0])[:, None, None, None, None] * BLOCK + np.arange(BLOCK)[None, None, None, :, None]
        tap = np.arange(want[2])[None, None, :, None, None] * 4 + np.arange(4)[None, None, None, None, :]
        live = (channel < c) & (tap < kw)
        if np.any(data.reshape(want[0], kh, want[2], BLOCK, 4)[~np.broadcast_to(live, (want[0], kh, want[2], BLOCK, 4))]):
            raise ValueError(f"packed int8 depthwise bits of {tuple(shape)} hold weights past C or KW")
        self = cls.__new__(cls)
        self._init(data, (c, one, kh, kw))
        return self


def _check_shape(shape: tuple[int, int, int, int]) -> None:
    c, one, kh, kw = shape
    if one != 1 or c < 1 or kh < 1 or kw < 1 or kh * kw > KMAX or max(c, kh, kw) > _LIM:
        raise ValueError(f"a depthwise weight is (C, 1, KH, KW) with C, KH, KW >= 1 and KH * KW <= {KMAX}, "
                         f"not {tuple(shape)}")


def conv_out_size(size: int, k: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    """Output extent of one spatial axis (``lo``/``hi``: its pads); below 1 when none fits."""
    return (size + lo + hi - dilation * (k - 1) - 1) // stride + 1


@functools.lru_cache(maxsize=512)
def _geo(kh: int, kw: int, strides, pads, dilations) -> tuple[tuple[int, ...], np.ndarray] | None:
    """The geometry ``(kh, kw, sh, sw, dh, dw, top, left, bottom, right)`` and its array for the C
    entry (made once per geometry, read-only); None when a stride or dilation is below 1, a pad
    negative, or a value past 2^20."""
    try:
        (sh, sw), (top, left, bottom, right), (dh, dw) = strides, pads, dilations
        g = tuple(int(v) for v in (kh, kw, sh, sw, dh, dw, top, left, bottom, right))
    except (TypeError, ValueError, OverflowError):
        return None
    if min(g[2:6]) < 1 or min(g[6:]) < 0 or max(g) > _LIM:
        return None
    arr = np.array(g, np.int64)
    arr.setflags(write=False)
    return g, arr


def _geometry(packed: PackedDW8, strides, pads, dilations) -> tuple[tuple[int, ...], np.ndarray] | None:
    try:
        return _geo(packed.shape[2], packed.shape[3], strides, pads, dilations)
    except TypeError:  # (lists: unhashable)
        pass
    try:
        return _geo(packed.shape[2], packed.shape[3], tuple(strides), tuple(pads), tuple(dilations))
    except TypeError:
        return None


def _fold_act(clip, act: str | None) -> tuple[tuple[float, float] | None, str | None] | None:
    """``(clip, act)`` with ``relu``/``relu6`` folded into the clip (they follow it: relu6(clip(y))
    is the clip of the bounds clamped to [0, 6]); None when they do not fit."""
    if clip is not None:
        try:
            lo, hi = (float(v) for v in clip)
        except (TypeError, ValueError):
            return None
        if lo != lo or hi != hi:
            return None
        clip = (lo, hi)
    if act in ("relu", "relu6"):
        top = 6.0 if act == "relu6" else float("inf")
        lo, hi = clip if clip is not None else (float("-inf"), float("inf"))
        return (min(max(lo, 0.0), top) + 0.0, min(max(hi, 0.0), top) + 0.0), None  # (+ 0.0: no -0.0 bound)
    if act is not None and act not in ACTIVATIONS:
        return None
    return clip, act


@functools.lru_cache(maxsize=256)
def _scalars(x_scale: float, x_zero_point: int, x_dtype: str, clip, act: str | None, out_quant, u8_out: bool,
             width: int, name: str, has_bias: bool, c: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The C entry's float32 and int64 parameters (made once per setting, read-only); None when
    one does not fit."""
    if x_dtype not in RANGES or name not in _CODES:
        return None
    lo, hi = RANGES[x_dtype]
    try:
        s, z, width = float(np.float32(x_scale)), int(x_zero_point), int(width)
    except (TypeError, ValueError, OverflowError):
        return None
    if not (0.0 < s < _F32_MAX and lo <= z <= hi and 1 <= width <= 4096):
        return None
    folded = _fold_act(clip, act)
    if folded is None:
        return None
    clip, act = folded
    ys = yz = qlo = qhi = 0.0
    if out_quant is not None:
        if len(out_quant) != 4:
            return None
        ys, yz, qlo, qhi = (float(v) for v in out_quant)
        ys = float(np.float32(ys))
        if not (0.0 < ys < _F32_MAX and -256 <= yz <= 255 and (0 if u8_out else -256) <= qlo <= qhi <= 255):
            return None
        if any(v != int(v) for v in (yz, qlo, qhi)):
            return None
    elif u8_out:
        return None
    cl = (0.0, 0.0) if clip is None else clip
    fp = np.array([s, float(z - lo), cl[0], cl[1], ys, yz, qlo, qhi], np.float32)
    ip = np.array([has_bias, clip is not None, ACTIVATIONS.get(act or "", 0), out_quant is not None, width,
                   _CODES[name], c], np.int64)
    fp.setflags(write=False)
    ip.setflags(write=False)
    return fp, ip


def _params(c: int, x_scale, x_zero_point, x_dtype, w_scale, bias, clip, act, out_quant, u8_out: bool, width,
            name) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_scalars` of the call's arguments, after checking w_scale and bias; None when one
    does not fit."""
    if (not isinstance(w_scale, np.ndarray) or w_scale.dtype != np.float32 or w_scale.shape not in ((1,), (c,))
            or not w_scale.flags.c_contiguous):
        return None
    if bias is not None and (not isinstance(bias, np.ndarray) or bias.dtype != np.float32 or bias.shape != (c,)
                             or not bias.flags.c_contiguous):
        return None
    if not isinstance(x_zero_point, (int, np.integer)) or isinstance(x_zero_point, bool):
        return None
    try:
        return _scalars(x_scale, x_zero_point, x_dtype, clip, act, out_quant, u8_out, width, name, bias is not None, c)
    except TypeError:  # (an unhashable clip or out_quant: a list)
        pass
    try:
        key = (float(x_scale), int(x_zero_point), str(x_dtype), None if clip is None else tuple(float(v) for v in clip),
               act, None if out_quant is None else tuple(float(v) for v in out_quant), bool(u8_out), int(width),
               name, bias is not None, c)
        return _scalars(*key)
    except (TypeError, ValueError, OverflowError):
        return None


def _fits(x5, out5, addend, packed: PackedDW8, geo: tuple[int, ...], x_dtype: str) -> bool:
    """Whether the arrays fit the call: dtypes, shapes, layout, no overlap but an addend that is
    the (float32) output itself."""
    for arr in (x5, out5):
        if (not isinstance(arr, np.ndarray) or arr.dtype not in (np.float32, np.uint8) or arr.ndim != 5
                or not arr.flags.c_contiguous or not arr.flags.aligned):
            return False
    if not out5.flags.writeable or (x5.dtype == np.uint8 and x_dtype != "uint8"):
        return False
    n, cb, h, w, lanes = x5.shape
    kh, kw, sh, sw, dh, dw, top, left, bottom, right = geo
    oh, ow = conv_out_size(h, kh, sh, dh, top, bottom), conv_out_size(w, kw, sw, dw, left, right)
    if lanes != BLOCK or cb != packed.blocks or out5.shape != (n, cb, oh, ow, BLOCK) or oh < 1 or ow < 1:
        return False
    if np.may_share_memory(x5, out5):
        return False
    if addend is None:
        return True
    if (not isinstance(addend, np.ndarray) or addend.dtype != np.float32 or addend.shape != out5.shape
            or not addend.flags.c_contiguous or not addend.flags.aligned):
        return False
    same = out5.dtype == np.float32 and addend.ctypes.data == out5.ctypes.data
    return same or not np.may_share_memory(addend, out5)


def depthwise_nchwc(x5: np.ndarray, packed: PackedDW8, out5: np.ndarray, strides: tuple[int, int],
                    pads: tuple[int, int, int, int], dilations: tuple[int, int], x_scale: float,
                    x_zero_point: int = 0, x_dtype: str = "uint8", w_scale: np.ndarray = _ONE,
                    bias: np.ndarray | None = None, clip: tuple[float, float] | None = None, act: str | None = None,
                    addend: np.ndarray | None = None, out_quant: tuple[float, int, int, int] | None = None,
                    width: int = 1, variant: str | None = None) -> bool:
    """``out5 = out(act(clip(dequant(dwconv(quant(x5))) + bias + addend)))`` on ``width`` threads
    (module docstring): ``x5`` float32 or uint8 (then ``x_dtype`` "uint8") ``(N, CB, H, W, 16)``,
    ``out5`` float32 or uint8 ``(N, CB, OH, OW, 16)``, both C-contiguous; ``pads`` ``(top, left,
    bottom, right)``; ``x_scale``, ``x_zero_point``, ``x_dtype`` ``"uint8"|"int8"``: the input's
    quantisation; ``w_scale`` float32 ``(C,)`` or ``(1,)``; ``bias`` ``(C,)`` or None; ``addend``
    float32 shaped as ``out5`` or None; ``clip`` ``(lo, hi)``; ``act`` a name of
    :data:`ACTIVATIONS`, ``"relu"`` or ``"relu6"``; ``out_quant`` ``(scale, zero point, qlo, qhi)``
    (required for a uint8 ``out5``, ``0 <= qlo``); ``variant`` one of :func:`runnable`, default
    :func:`isa`. Lanes past C get ``out(act(clip(0 + addend)))``. False (nothing written) when the
    path is off or these do not fit."""
    mod = _mod()
    name = variant or isa()
    if mod is None or not isinstance(packed, PackedDW8) or name not in runnable():
        return False
    got = _geometry(packed, strides, pads, dilations)
    if got is None or not _fits(x5, out5, addend, packed, got[0], x_dtype):
        return False
    args = _params(packed.shape[0], x_scale, x_zero_point, x_dtype, w_scale, bias, clip, act, out_quant,
                   out5.dtype == np.uint8, width, name)
    if args is None:
        return False
    try:
        mod.dw8_conv(x5, packed.data, out5, packed.wsum, w_scale, _ONE if bias is None else bias, addend, *args, got[1])
    except (TypeError, ValueError):
        return False
    return True


# ---- the NumPy form (for tests): activations.h's act32, term for term, in float32 ----
_F = np.float32


def _sel(cond: np.ndarray, a, b) -> np.ndarray:
    return np.where(cond, a, b).astype(_F)


def _exp32(x: np.ndarray) -> np.ndarray:
    xc = _sel(x < _F(88.8), x, _F(88.8))
    xc = _sel(xc > _F(-104.0), xc, _F(-104.0))
    t = xc * _F(1.44269504088896341) + _F(12582912.0)
    fx = t - _F(12582912.0)
    r = xc - fx * _F(0.693359375) - fx * _F(-2.12194440e-4)
    z = r * r
    y = (((((_F(1.9875691500e-4) * r + _F(1.3981999507e-3)) * r + _F(8.3334519073e-3)) * r + _F(4.1665795894e-2)) * r
          + _F(1.6666665459e-1)) * r + _F(5.0000001201e-1)) * z + r + _F(1.0)
    n = t.view(np.int32) - np.int32(0x4B400000)
    n1 = n >> np.int32(1)
    n2 = n - n1
    y = y * ((n1 + np.int32(127)) << np.int32(23)).view(_F) * ((n2 + np.int32(127)) << np.int32(23)).view(_F)
    return _sel(x == x, y, x)


def _erf32(x: np.ndarray) -> np.ndarray:
    c = _sel(x > _F(3.92), _F(3.92), _sel(x < _F(-3.92), _F(-3.92), x))
    t = c * c
    p = _F(1.992528e-08)
    for k in (-1.9577806e-06, 1.4182818e-04, 3.7006338e-03, 5.0570205e-02, 1.999013e-01, 1.1283791e+00):
        p = p * t + _F(k)
    d = _F(9.558066e-04)
    for k in (1.4351207e-02, 1.1498877e-01, 5.104896e-01, 1.0):
        d = d * t + _F(k)
    r = c * p / d
    r = _sel(r > _F(1.0), _F(1.0), _sel(r < _F(-1.0), _F(-1.0), r))
    return _sel(x == x, r, x)


def act32(y: np.ndarray, act: str | None) -> np.ndarray:
    """``act32(y, code)`` of ``csrc/activations.h`` in NumPy, the same float32 operations in the
    same order (so the same bits)."""
    one = _F(1.0)
    if act == "sigmoid":
        return one / (one + _exp32(-y))
    if act == "silu":
        return y / (one + _exp32(-y))
    if act == "gelu":
        return _F(0.5) * y * (one + _erf32(y * _F(0.70710678118654752)))
    if act == "gelu_tanh":
        return y / (one + _exp32(-(y * (_F(1.5957691216057308) + _F(0.0713548162726) * y * y))))
    if act == "hardswish":
        g = y * (one / _F(6.0)) + _F(0.5)
        g = _sel(g > _F(0.0), g, _F(0.0))
        return y * _sel(g < one, g, one)
    return y


def _clamp(t: np.ndarray, lo, hi) -> np.ndarray:
    """max then min with VMAXPS's rule: a NaN gives the bound."""
    t = _sel(t > _F(lo), t, _F(lo))
    return _sel(t < _F(hi), t, _F(hi))


def reference(x5: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int],
              dilations: tuple[int, int], x_scale: float, x_zero_point: int = 0, x_dtype: str = "uint8",
              w_scale: np.ndarray = _ONE, bias: np.ndarray | None = None, clip=None, act: str | None = None,
              addend: np.ndarray | None = None, out_quant=None, out_dtype=np.float32) -> np.ndarray:
    """:func:`depthwise_nchwc`'s result in NumPy (``w`` the int8 ``(C, 1, KH, KW)`` weight): int64
    sums, then the float32 epilogue in the kernel's order, every lane of the blocks as the kernel
    makes it; ``out_dtype`` ``np.uint8`` gives the integers a uint8 output holds."""
    folded = _fold_act(clip, act)
    assert folded is not None, (clip, act)
    clip, act = folded
    n, cb, h, wd, _ = x5.shape
    c, _, kh, kw = w.shape
    lo, hi = RANGES[x_dtype]
    s, z = _F(x_scale), int(x_zero_point)
    if x5.dtype == np.uint8:
        q = x5.astype(np.int64)
    else:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            q = _clamp(np.rint(x5 / s) + _F(z), lo, hi).astype(np.int64)
    (sh, sw), (top, left, bottom, right), (dh, dw) = strides, pads, dilations
    xq = np.pad(q - z, ((0, 0), (0, 0), (top, bottom), (left, right), (0, 0)))
    oh, ow = conv_out_size(h, kh, sh, dh, top, bottom), conv_out_size(wd, kw, sw, dw, left, right)
    wf = np.zeros((cb * BLOCK, kh, kw), np.int64)
    wf[:c] = w[:, 0]
    wf = wf.reshape(cb, BLOCK, kh, kw)
    acc = np.zeros((n, cb, oh, ow, BLOCK), np.int64)
    for a in range(kh):
        for b in range(kw):
            tap = xq[:, :, a * dh: a * dh + (oh - 1) * sh + 1: sh, b * dw: b * dw + (ow - 1) * sw + 1: sw]
            acc += tap * wf[:, :, a, b][None, :, None, None, :]
    ws = np.asarray(w_scale, _F)
    wsf = np.full(cb * BLOCK, ws[0], _F) if ws.shape[0] == 1 else np.zeros(cb * BLOCK, _F)
    wsf[: ws.shape[0]] = ws
    y = acc.astype(np.int32).astype(_F) * (s * wsf).astype(_F).reshape(cb, 1, 1, BLOCK)
    if bias is not None:
        bf = np.zeros(cb * BLOCK, _F)
        bf[:c] = bias
        y = y + bf.reshape(cb, 1, 1, BLOCK)
    if addend is not None:
        y = y + addend
    if clip is not None:
        y = _clamp(y, clip[0], clip[1])
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = act32(y.astype(_F), act)
        if out_quant is None:
            return y.astype(_F)
        ys, yz, qlo, qhi = (_F(v) for v in out_quant)
        t = _clamp(np.rint(y / ys) + yz, qlo, qhi)
    if out_dtype == np.uint8:
        return t.astype(np.uint8)
    return ((t - yz) * ys).astype(_F)


#: its kernel family (declared in :mod:`ge_native.isa` with the others)
FAMILY = _isa.family("int8dw")
