"""GE's bf16 GEMM: ``C = A @ B`` with ``A`` float32 rounded to bf16 as it is packed, ``B`` a
constant packed once in bf16, float32 sums, the epilogue (bias per column, clip, activation) in
float32 at the store; an addend (a residual) laid out as ``C`` added after the bias.
:func:`conv_nchwc` is the same GEMM as a convolution over the NCHWc blocked layout of
:mod:`ge_native.nchwc`: its rows of ``A`` gathered from the input as each task packs them
(an implicit GEMM: no column matrix), its weight packed once (:class:`PackedConv`).

Variants (the ``bf16gemm`` family of :mod:`ge_native.isa`), chosen at run time by the CPU's
features: ``amx_bf16`` (AMX tiles, ``TDPBF16PS``; Linux grants the process the tile state once,
else the next variant runs), ``avx512_bf16`` (``VDPBF16PS``) and ``scalar`` (plain C, the same
rounding and float32 sums: the reference the others match). ``GE_NATIVE_BF16=0`` turns the path
off; ``GE_NATIVE_BF16=<variant>`` forces a variant this CPU runs (a name it cannot run is
ignored). :class:`PackedB` has one layout every variant reads, so packed bytes move between
machines. Each element of ``C`` is one task's sum in a fixed order: the same bits at every
thread count. The C is ``csrc/bf16gemm.c``; docs/native.md says more.
"""

from __future__ import annotations

import functools

import numpy as np

from . import isa as _isa
from . import native
from .activations import C_IDS

#: columns of a panel; k is padded to a multiple of KB (one AMX tile's depth)
NR, KB = 32, 32

#: the variants, best first, and their codes in the C entry
VARIANTS = ("amx_bf16", "avx512_bf16", "scalar")
_CODES = {"scalar": 0, "avx512_bf16": 1, "amx_bf16": 2}

#: the activations the epilogue applies, by code (:data:`ge_native.activations.C_IDS`)
ACTIVATIONS = C_IDS

_SRC = native.c_source("bf16gemm.c")
_NO_BIAS = np.zeros(1, np.float32)
_mod = native.lazy_module("GE_NATIVE_BF16", _SRC, ["bf_ok", "bf_caps", "bf_isa", "bf_matmul", "bf_conv", "bf_conv_plain"], "bf_ok")
#: channels per block of the NCHWc layout (:data:`ge_native.nchwc.BLOCK`)
BLOCK = 16
#: the most channels a plain NCHW input of :func:`conv_nchwc` has (a stem's RGB)
PLAIN_MAX_CHANNELS = BLOCK


_VARIANTS = native.Variants(_mod, VARIANTS, _CODES, "bf_caps", "bf_isa")
#: whether the module built here and its switch leaves it on; the variants this CPU runs, best
#: first; the one that runs (None: off or not built)
available, runnable, isa = _VARIANTS.available, _VARIANTS.runnable, _VARIANTS.isa


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bf16 (to nearest even), as its uint16 bits."""
    import ml_dtypes  # (here, not at import: a float32 model's load never needs it)

    return np.ascontiguousarray(np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)).view(np.uint16)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bf16 and back to float32 (the values the kernel multiplies)."""
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


class PackedB:
    """A constant ``(k, n)`` float32 matrix rounded to bf16 and packed into ``ceil(n / 32)``
    panels of ``(kp / 2, 32, 2)`` (``kp``: ``k`` rounded up to 32; zero-padded): each row of a
    panel holds the pairs ``(B[2t, j], B[2t + 1, j])`` of its 32 columns, the layout VDPBF16PS and
    the AMX tiles read. ``data`` (uint16, 64-byte aligned) is what a compiled model stores."""

    def __init__(self, w: np.ndarray) -> None:
        if w.ndim != 2 or w.dtype != np.float32:
            raise ValueError(f"PackedB takes a 2-D float32 matrix, not {w.dtype} {w.shape}")
        self.k, self.n = (int(s) for s in w.shape)
        self.kp = -(-self.k // KB) * KB
        p = -(-self.n // NR)
        padded = np.zeros((self.kp, p * NR), np.uint16)
        padded[: self.k, : self.n] = to_bf16_bits(w)
        # (kp, P*32) -> (P, kp/2, 32, 2): panel, pair-row, column, pair member
        packed = padded.reshape(self.kp // 2, 2, p, NR).transpose(2, 0, 3, 1).reshape(p, self.kp // 2, 2 * NR)
        self.data = native.aligned(packed)

    @classmethod
    def from_data(cls, data: np.ndarray, k: int, n: int) -> PackedB:
        """The packed matrix of ``(k, n)`` whose bits are ``data`` (a compiled model's stored
        :attr:`data`, perhaps a read-only memory map), wrapped without a copy; ValueError when
        ``data`` is not a C-contiguous uint16 array of ``(ceil(n / 32), kp / 2, 64)``."""
        k, n = int(k), int(n)
        kp = -(-k // KB) * KB
        want = (-(-n // NR), kp // 2, 2 * NR)
        if (not isinstance(data, np.ndarray) or data.dtype != np.uint16 or data.shape != want
                or not data.flags.c_contiguous or not data.flags.aligned or k < 0 or n < 0):
            got = (getattr(data, "dtype", type(data)), getattr(data, "shape", None))
            raise ValueError(f"packed bf16 bits of ({k}, {n}) are a C-contiguous uint16 {want}, not {got}")
        self = cls.__new__(cls)
        self.k, self.n, self.kp, self.data = k, n, kp, data
        return self

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)


def matmul(a2: np.ndarray, packed: PackedB, out2: np.ndarray, bias: np.ndarray | None = None,
           clip: tuple[float, float] | None = None, act: str | None = None, width: int = 1,
           variant: str | None = None, addend: np.ndarray | None = None) -> bool:
    """``out2 = act(clip(bf16(a2) @ B + bias + addend))`` with float32 sums on ``width`` threads
    (``bias``: ``n`` float32 values or None; ``addend``: an ``(m, n)`` float32 C-contiguous array
    (a residual; ``out2`` itself adds in place) or None; ``clip``: ``(lo, hi)`` or None; ``act``:
    a name of :data:`ACTIVATIONS` or None; ``variant``: one of :func:`runnable`, default
    :func:`isa`). False (nothing done) when the path is off or these arrays do not fit: not
    float32, not C-contiguous, sizes that disagree. The C entry checks them all again before it
    reads."""
    mod = _mod()
    name = variant or isa()
    if mod is None or name not in _CODES or not isinstance(packed, PackedB):
        return False
    if a2.dtype != np.float32 or out2.dtype != np.float32 or a2.ndim != 2 or out2.ndim != 2:
        return False
    if a2.shape[1] != packed.k or out2.shape != (a2.shape[0], packed.n):
        return False
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (packed.n,)):
        return False
    if act is not None and act not in ACTIVATIONS:
        return False
    if addend is not None and not _fits_addend(addend, out2):
        return False
    lo, hi = (0.0, 0.0) if clip is None else (float(clip[0]), float(clip[1]))
    try:
        mod.bf_matmul(a2, packed.data, out2, _NO_BIAS if bias is None else bias, int(bias is not None),
                      int(clip is not None), lo, hi, max(1, int(width)), ACTIVATIONS.get(act or "", 0), _CODES[name],
                      packed.k, addend)
    except (TypeError, ValueError):
        return False
    return True


def _fits_addend(addend: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``addend`` is a float32 C-contiguous array of ``out``'s shape that is ``out``
    itself or apart from it (each element is read by the store that writes it: one that overlaps
    elsewhere would read values other tasks wrote)."""
    if not isinstance(addend, np.ndarray) or addend.dtype != np.float32 or addend.shape != out.shape:
        return False
    if not addend.flags.c_contiguous:
        return False
    same = addend.ctypes.data == out.ctypes.data
    return same or not np.may_share_memory(addend, out)


class PackedConv:
    """An ungrouped convolution's ``(M, C, KH, KW)`` float32 weight rounded to bf16 and packed
    as :func:`conv_nchwc` reads it: the :class:`PackedB` of the ``(k, M)`` matrix whose rows run
    over ``(kh, kw, input block, 16 channels)``, ``k = KH * KW * in_blocks * 16`` (the channels C
    .. ``in_blocks * 16``, zero lanes of the blocked input, have zero weights), so each 16 of a row
    of ``A`` is one 64-byte load of the input at one tap and block. ``in_blocks`` 0: the input is
    plain NCHW of ``C <= 16`` channels (a stem), the rows run over ``(kh, kw, c)`` of the real
    channels only, ``k = KH * KW * C``. ``data`` is what a compiled model stores; :meth:`from_data`
    wraps it again."""

    def __init__(self, w: np.ndarray, in_blocks: int) -> None:
        if w.ndim != 4 or w.dtype != np.float32:
            raise ValueError(f"PackedConv takes a 4-D float32 weight, not {w.dtype} {w.shape}")
        m, c, kh, kw = (int(s) for s in w.shape)
        _check_blocks(int(in_blocks), (m, c, kh, kw))
        lanes = int(in_blocks) * BLOCK or c
        full = np.zeros((kh, kw, lanes, m), np.float32)
        full[:, :, :c, :] = w.transpose(2, 3, 1, 0)
        self._init(PackedB(full.reshape(-1, m)), (m, c, kh, kw), int(in_blocks))

    def _init(self, packed: PackedB, shape: tuple[int, int, int, int], in_blocks: int) -> None:
        self.packed, self.shape, self.in_blocks = packed, shape, in_blocks
        self.data = packed.data

    @classmethod
    def from_data(cls, data: np.ndarray, shape: tuple[int, int, int, int], in_blocks: int) -> PackedConv:
        """The packed weight of ``shape`` whose bits are ``data`` (a stored :attr:`data`, perhaps
        read-only), wrapped without a copy; ValueError when they do not fit."""
        m, c, kh, kw = (int(s) for s in shape)
        if min(m, c, kh, kw) < 0:
            raise ValueError(f"no weight has the shape {tuple(shape)}")
        _check_blocks(int(in_blocks), (m, c, kh, kw))
        self = cls.__new__(cls)
        self._init(PackedB.from_data(data, kh * kw * (int(in_blocks) * BLOCK or c), m), (m, c, kh, kw), int(in_blocks))
        return self


def _check_blocks(in_blocks: int, shape: tuple[int, int, int, int]) -> None:
    """ValueError unless ``in_blocks`` blocks hold the weight's channels (0: a plain input of
    up to 16 channels; of none, k is 0 either way)."""
    c = shape[1]
    if not (c <= BLOCK if in_blocks == 0 else 0 < in_blocks and c <= in_blocks * BLOCK):
        raise ValueError(f"{in_blocks} input blocks do not hold a weight of {tuple(shape)}")


def conv_out_size(size: int, k: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    """Output extent of one spatial axis (``lo``/``hi``: its pads); below 1 when none fits."""
    return (size + lo + hi - dilation * (k - 1) - 1) // stride + 1


@functools.lru_cache(maxsize=512)
def _geometry(kernel: tuple, strides: tuple, dilations: tuple, pads: tuple) -> np.ndarray:
    """The C entry's int64 geometry (made once per geometry, read-only)."""
    g = np.array([*kernel, *strides, *dilations, *pads], np.int64)
    g.setflags(write=False)
    return g


def conv_nchwc(x5: np.ndarray, packed: PackedConv, out5: np.ndarray, strides: tuple[int, int],
               pads: tuple[int, int, int, int], dilations: tuple[int, int], bias: np.ndarray | None = None,
               clip: tuple[float, float] | None = None, act: str | None = None, addend: np.ndarray | None = None,
               width: int = 1, variant: str | None = None) -> bool:
    """``out5 = act(clip(conv(bf16(x5), W) + bias + addend))`` on blocked arrays, float32 sums:
    ``x5`` ``(N, in_blocks, H, W, 16)`` (or plain NCHW ``(N, C, H, W)`` where ``packed.in_blocks``
    is 0 and C > 0: a stem's input, its rows of ``A`` gathered from a padded NHWC bf16 copy),
    ``out5`` ``(N, ceil(M / 16), OH, OW, 16)``, ``pads``
    ``(top, left, bottom, right)`` (the taps outside the input are zeros), ``bias`` M float32
    values or already padded to ``ceil(M / 16) * 16`` (:func:`ge_native.nchwc.pad_bias`),
    ``addend`` (a residual) shaped as ``out5``; the lanes past M get act(clip(0 + addend)).
    ``width``, ``variant``: as :func:`matmul`. False (nothing written) when the path is off or the
    arrays or the geometry do not fit; the C entry checks them all again."""
    mod = _mod()
    name = variant or isa()
    if mod is None or name not in _CODES or not isinstance(packed, PackedConv):
        return False
    if act is not None and act not in ACTIVATIONS:
        return False
    plain = packed.in_blocks == 0 and packed.shape[1] > 0  # of 0 channels: the blocked form of 0 blocks
    for a, nd in ((x5, 4 if plain else 5), (out5, 5)):
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != nd or not a.flags.c_contiguous:
            return False
    m, c, kh, kw = packed.shape
    mb = -(-m // BLOCK)
    try:
        (sh, sw), (top, left, bottom, right), (dh, dw) = strides, pads, dilations
        geo = _geometry((kh, kw), (int(sh), int(sw)), (int(dh), int(dw)),
                        (int(top), int(left), int(bottom), int(right)))
    except (TypeError, ValueError):
        return False
    sh, sw, dh, dw, top, left, bottom, right = (int(v) for v in geo[2:])
    if min(sh, sw, dh, dw) < 1 or min(top, left, bottom, right) < 0:
        return False
    n, ib, h, w, lanes = (*x5.shape, BLOCK) if plain else x5.shape
    oh, ow = conv_out_size(h, kh, sh, dh, top, bottom), conv_out_size(w, kw, sw, dw, left, right)
    if ib != (c if plain else packed.in_blocks) or lanes != BLOCK or out5.shape != (n, mb, oh, ow, BLOCK):
        return False
    if np.may_share_memory(x5, out5):
        return False
    if addend is not None and not _fits_addend(addend, out5):
        return False
    if bias is not None:
        if not isinstance(bias, np.ndarray) or bias.dtype != np.float32 or bias.shape not in ((m,), (mb * BLOCK,)):
            return False
        if bias.shape != (mb * BLOCK,):
            bias = np.concatenate([bias, np.zeros(mb * BLOCK - m, np.float32)])
    lo, hi = (0.0, 0.0) if clip is None else (float(clip[0]), float(clip[1]))
    try:
        (mod.bf_conv_plain if plain else mod.bf_conv)(x5, packed.data, out5, _NO_BIAS if bias is None else np.ascontiguousarray(bias),
                    int(bias is not None), int(clip is not None), lo, hi, max(1, int(width)),
                    ACTIVATIONS.get(act or "", 0), _CODES[name], geo, addend)
    except (TypeError, ValueError):
        return False
    return True


def conv_reference(x5: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int],
                   dilations: tuple[int, int]) -> np.ndarray:
    """The convolution of the blocked ``x5`` by ``w (M, C, KH, KW)``, both rounded to bf16 as
    :func:`conv_nchwc` rounds them, summed in float64: blocked ``(N, ceil(M / 16), OH, OW, 16)``,
    zeros in the lanes past M (for tests)."""
    m, c, kh, kw = w.shape
    n, ib, h, wd, _ = x5.shape
    (sh, sw), (top, left, bottom, right), (dh, dw) = strides, pads, dilations
    x = round_bf16(x5).astype(np.float64).transpose(0, 1, 4, 2, 3).reshape(n, ib * BLOCK, h, wd)[:, :c]
    x = np.pad(x, ((0, 0), (0, 0), (top, max(0, bottom)), (left, max(0, right))))
    oh, ow = conv_out_size(h, kh, sh, dh, top, bottom), conv_out_size(wd, kw, sw, dw, left, right)
    wr = round_bf16(w).astype(np.float64)
    y = np.zeros((n, m, oh, ow))
    for a in range(kh):
        for b in range(kw):
            tap = x[:, :, a * dh: a * dh + (oh - 1) * sh + 1: sh, b * dw: b * dw + (ow - 1) * sw + 1: sw]
            y += np.einsum("nchw,mc->nmhw", tap, wr[:, :, a, b])
    mb = -(-m // BLOCK)
    out = np.zeros((n, mb * BLOCK, oh, ow))
    out[:, :m] = y
    return out.reshape(n, mb, BLOCK, oh, ow).transpose(0, 1, 3, 4, 2).copy()


def reference(a2: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NumPy's ``a2 @ w`` of both rounded to bf16 as the kernel rounds them, summed in float64."""
    return round_bf16(a2).astype(np.float64) @ round_bf16(w).astype(np.float64)


#: its kernel family (declared in :mod:`ge_native.isa` with the others)
FAMILY = _isa.family("bf16gemm")


#: the GEMM :func:`measured_speedup` times (a transformer's projection, a CNN's 1x1 layer)
SPEEDUP_SHAPE = (256, 768, 768)
_SPEEDUP_ENTRY = "bf16_gemm_speedup_v1"


_SPEEDUPS: dict[str, float | None] = {}


def measured_speedup(variant: str) -> float | None:
    """:func:`measure_speedup`, once per process (every kernel build of a model asks)."""
    if variant not in _SPEEDUPS:
        _SPEEDUPS[variant] = measure_speedup(variant)
    return _SPEEDUPS[variant]


def measure_speedup(variant: str) -> float | None:
    """This machine's float32 GEMM time over ``variant``'s on :data:`SPEEDUP_SHAPE` at one
    thread: measured once per machine and kept in the user's cache (read back as data, range
    checked); None where it cannot be measured (the variant does not run here, no sgemm). A
    vector bf16 unit is not faster than float32 FMAs on every core (VDPBF16PS gains nothing on a
    Sapphire Rapids core): this is how a caller knows, on this machine."""
    import json
    import time

    from ge_core import cache

    from . import sgemm

    key = f"{_SPEEDUP_ENTRY}_{variant}"
    raw = cache.read_data(key) if cache.enabled() and variant in _CODES else None
    if raw is not None:
        try:
            v = float(json.loads(raw.decode())["speedup"])
            if 0.01 < v < 1000:
                return v
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            pass
    if variant not in runnable() or not sgemm.available():
        return None
    m, k, n = SPEEDUP_SHAPE
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    y = np.empty((m, n), np.float32)
    pb, pn = PackedB(w), sgemm.Panels(w)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    t32 = best(lambda: sgemm.matmul_packed(a, pn, y, None, None, 1))
    t16 = best(lambda: matmul(a, pb, y, width=1, variant=variant))
    speedup = t32 / t16 if t16 > 0 else None
    if speedup is not None:
        cache.write_data(key, json.dumps({"speedup": speedup, "shape": SPEEDUP_SHAPE}).encode())
    return speedup
