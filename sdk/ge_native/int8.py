"""GE's int8 GEMM: ``C = dequant(quant(A) @ B)``. ``A`` float32 is quantised as it is packed
(``q = clamp(rint(a / s) + z, lo, hi)``, IEEE division: QuantizeLinear's bits; int8 activations
shifted by 128 into u8; ``x_scale=None``: DynamicQuantizeLinear's scale and zero point, see
:func:`dynamic_params`), or is uint8 already (the integers, no quantisation pass); ``B`` is an int8
constant (zero point 0) packed once; the sums ``sum_k (q - z) * w`` are exact int32. The
epilogue runs in float32 at the store, one rounding a step (no contraction), in this order:
``acc * float32(s * w_scale[j])``, ``+ bias``, the optional ``mid_quant`` fake-quant (a residual
block's output before its shortcut), ``+ addend``, clip, activation, then ``out_quant`` (a
fake-quant: what QuantizeLinear -> DequantizeLinear gives) or, for a uint8 output, its integers.
:func:`reference` (NumPy, int64 sums, the same steps) has every variant's bits, the activations
aside (ulps apart). :func:`conv_nchwc` is the same GEMM as a convolution over the NCHWc layout
(the input quantised once into padded NHWC u8 rows, pads holding ``z``; the weight packed once by
:class:`PackedConv8`).

Variants (family ``int8gemm``): ``amx_int8`` (TDPBUSD), ``avx512_vnni`` (VPDPBUSD), ``avx2``
(widened to int16, VPMADDWD: exact) and ``scalar``. ``GE_NATIVE_INT8=0`` turns the path off,
``=<variant>`` forces one this CPU runs. The sums are integers: the same bits at every thread
count and in every variant. The C is ``csrc/int8gemm.c``; docs/native.md says more.
"""

from __future__ import annotations

import functools

import numpy as np

from . import isa as _isa
from . import native
from .activations import C_IDS, TABLE

#: the entries take uint8 inputs (the quantised integers) and write uint8 outputs (out_quant's)
UINT8_IO = True
#: the entries take ``mid_quant``: a fake-quant after the bias, before the addend
MID_QUANT = True
#: the widest range a mid fake-quant's integers take (``-2^16 <= mlo <= mz <= mhi <= 2^16``)
MID_RANGE = (-(2 ** 16), 2 ** 16)
#: columns of a panel; k is padded to a multiple of KB (one AMX int8 tile's depth)
NR, KB = 32, 64
#: channels per block of the NCHWc layout (:data:`ge_native.nchwc.BLOCK`)
BLOCK = 16
#: the most k one product sums (255 * 128 * k fits int32)
KMAX = 65536

VARIANTS = ("amx_int8", "avx512_vnni", "avx2", "scalar")
_CODES = {"scalar": 0, "avx2": 1, "avx512_vnni": 2, "amx_int8": 3}
#: the activations the epilogue applies, by code (:data:`ge_native.activations.C_IDS`)
ACTIVATIONS = C_IDS
#: the range of each activation dtype
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}

_SRC = native.c_source("int8gemm.c")
_mod = native.lazy_module("GE_NATIVE_INT8", _SRC, ["i8_ok", "i8_caps", "i8_isa", "i8_matmul", "i8_conv"], "i8_ok")
_NO_BIAS = np.zeros(1, np.float32)
_ONE = np.ones(1, np.float32)
_F32_MAX = float(np.finfo(np.float32).max)


_VARIANTS = native.Variants(_mod, VARIANTS, _CODES, "i8_caps", "i8_isa")
#: whether the module built here and its switch leaves it on; the variants this CPU runs, best
#: first; the one that runs (None: off or not built)
available, runnable, isa = _VARIANTS.available, _VARIANTS.runnable, _VARIANTS.isa


class PackedB8:
    """A constant ``(k, n)`` int8 matrix packed into ``ceil(n / 32)`` panels of ``(kp / 4, 32, 4)``
    (``kp``: ``k`` rounded up to 64; zero-padded): row ``t`` of a panel holds the quads
    ``B[4t .. 4t + 3, j]`` of its 32 columns, the layout VPDPBUSD and the AMX tiles read.
    ``data`` (int8, 64-byte aligned) is what a compiled model stores; ``colsum`` (int32 ``(n,)``)
    the column sums the zero point's correction needs, computed from ``data``."""

    def __init__(self, w: np.ndarray) -> None:
        if not isinstance(w, np.ndarray) or w.ndim != 2 or w.dtype != np.int8:
            raise ValueError(f"PackedB8 takes a 2-D int8 matrix, not {getattr(w, 'dtype', type(w))} {np.shape(w)}")
        k, n = (int(s) for s in w.shape)
        if k > KMAX:
            raise ValueError(f"PackedB8 sums at most {KMAX} rows of k exactly, not {k}")
        kp, p = -(-k // KB) * KB, -(-n // NR)
        padded = np.zeros((kp, p * NR), np.int8)
        padded[:k, :n] = w
        # (kp, P*32) -> (P, kp/4, 32, 4): panel, quad-row, column, quad member
        packed = padded.reshape(kp // 4, 4, p, NR).transpose(2, 0, 3, 1).reshape(p, kp // 4, 4 * NR)
        self._init(native.aligned(packed), k, n)

    def _init(self, data: np.ndarray, k: int, n: int) -> None:
        self.k, self.n, self.kp, self.data = k, n, -(-k // KB) * KB, data
        p = data.shape[0]
        sums = data.reshape(p, data.shape[1], NR, 4).sum(axis=(1, 3), dtype=np.int64).reshape(p * NR)
        #: the column sums of every panel column (zeros past n), as the C entry reads them
        self.colsum_padded = np.ascontiguousarray(sums.astype(np.int32))

    @property
    def colsum(self) -> np.ndarray:
        """``sum_k B[k, j]`` for each of the ``n`` columns (int32)."""
        return self.colsum_padded[: self.n]

    @classmethod
    def from_data(cls, data: np.ndarray, k: int, n: int) -> PackedB8:
        """The packed matrix of ``(k, n)`` whose bits are ``data`` (a compiled model's stored
        :attr:`data`, perhaps a read-only memory map), wrapped without a copy; ValueError when
        ``data`` is not a C-contiguous int8 array of ``(ceil(n / 32), kp / 4, 128)``."""
        k, n = int(k), int(n)
        want = (-(-n // NR), -(-k // KB) * KB // 4, 4 * NR)
        if (not isinstance(data, np.ndarray) or data.dtype != np.int8 or data.shape != want
                or not data.flags.c_contiguous or k < 0 or n < 0 or k > KMAX):
            got = (getattr(data, "dtype", type(data)), getattr(data, "shape", None))
            raise ValueError(f"packed int8 bits of ({k}, {n}) are a C-contiguous int8 {want}, not {got}")
        self = cls.__new__(cls)
        self._init(data, k, n)
        return self

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)


def dynamic_params(x: np.ndarray) -> tuple[np.float32, int]:
    """ONNX DynamicQuantizeLinear's ``(scale, zero point)`` of ``x`` (uint8), in float32 as the
    kernel computes them: ``mx = max(0, max x)``, ``mn = min(0, min x)``, ``scale = (mx - mn) /
    255`` (1 where they are equal), ``z = rint(clamp(0 - mn / scale, 0, 255))``."""
    f = np.float32
    x = np.asarray(x, f)
    mx = max(f(0), x.max()) if x.size else f(0)
    mn = min(f(0), x.min()) if x.size else f(0)
    scale = f(1) if mx == mn else f(f(mx - mn) / f(255))
    z = np.rint(np.clip(f(0) - f(mn / scale), f(0), f(255)))
    return f(scale), int(z)


def _qparams(x_scale: float | None, x_zero_point: int, x_dtype: str) -> tuple[float, float] | None:
    """The C entry's (scale, u8 zero point): scale 0 asks for dynamic quantisation (uint8 only);
    None when they do not fit (a scale not finite and positive in float32, a zero point outside
    the dtype's range)."""
    if x_dtype not in RANGES or not isinstance(x_zero_point, (int, np.integer)):
        return None
    lo, hi = RANGES[x_dtype]
    if x_scale is None:
        return (0.0, 0.0) if x_dtype == "uint8" else None
    try:
        s = float(x_scale)
    except (TypeError, ValueError):
        return None
    if not (0.0 < s < _F32_MAX and lo <= int(x_zero_point) <= hi):  # (NaN fails too)
        return None
    s = float(np.float32(s))
    return (s, float(int(x_zero_point) - lo)) if s > 0 else None


def _mid_params(mid_quant) -> tuple[float, ...] | None:
    """The C entries' four extra float32 parameters of ``mid_quant`` (() for None); None when it
    does not fit: a finite scale > 0 in float32, integers ``-2^16 <= mlo <= mz <= mhi <= 2^16``."""
    if mid_quant is None:
        return ()
    try:
        ms, mz, mlo, mhi = (float(v) for v in mid_quant)
    except (TypeError, ValueError, OverflowError):
        return None
    if not (0.0 < ms < _F32_MAX and MID_RANGE[0] <= mlo <= mz <= mhi <= MID_RANGE[1]):  # (NaN fails too)
        return None
    if not (mz == int(mz) and mlo == int(mlo) and mhi == int(mhi)):
        return None
    ms = float(np.float32(ms))
    return (ms, mz, mlo, mhi) if ms > 0 else None


def _epilogue_args(n: int, x_scale, x_zero_point, x_dtype, w_scale, bias, clip, act, out_quant, width, name,
                   mid_quant=None):
    """The float32 and int64 parameter arrays of the C entries, the w_scale and bias padded to
    ``n`` columns; None when one does not fit."""
    qp, mid = _qparams(x_scale, x_zero_point, x_dtype), _mid_params(mid_quant)
    if qp is None or mid is None or name not in _CODES or (act is not None and act not in ACTIVATIONS):
        return None
    if (not isinstance(w_scale, np.ndarray) or w_scale.dtype != np.float32 or w_scale.ndim != 1
            or not (w_scale.shape[0] == 1 or 0 < w_scale.shape[0] <= n)):
        return None
    if bias is not None and (not isinstance(bias, np.ndarray) or bias.dtype != np.float32 or bias.ndim != 1
                             or bias.shape[0] > n):
        return None
    ys = yz = qlo = qhi = 0.0
    if out_quant is not None:
        try:
            ys, yz, qlo, qhi = (float(v) for v in out_quant)
        except (TypeError, ValueError):
            return None
        if not (0.0 < ys < _F32_MAX and -256 <= yz <= 255 and -256 <= qlo <= qhi <= 255):
            return None
        ys = float(np.float32(ys))
    lo, hi = (0.0, 0.0) if clip is None else (float(clip[0]), float(clip[1]))
    return _params((qp[0], qp[1], lo, hi, ys, yz, qlo, qhi, *mid),
                   (int(bias is not None), int(clip is not None), ACTIVATIONS.get(act or "", 0),
                    int(out_quant is not None), max(1, int(width)), _CODES[name]))


@functools.lru_cache(maxsize=1024)
def _params(floats: tuple, ints: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The C entries' parameter arrays (made once per setting, read-only: a model's node calls
    with the same ones every run)."""
    fp, ip = np.array(floats, np.float32), np.array(ints, np.int64)
    fp.setflags(write=False)
    ip.setflags(write=False)
    return fp, ip


def _pad(v: np.ndarray | None, n: int, full: int) -> np.ndarray:
    """``v`` (n or 1 values) as the C entry reads it: 1 value, or ``full`` with zeros past n."""
    if v is None:
        return _NO_BIAS
    if v.shape[0] in (1, full):
        return np.ascontiguousarray(v)
    out = np.zeros(full, np.float32)
    out[: v.shape[0]] = v
    return out


def _fits_addend(addend: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``addend`` is a float32 C-contiguous array of ``out``'s shape that is ``out``
    itself or apart from it (each element is read by the store that writes it)."""
    if not isinstance(addend, np.ndarray) or addend.dtype != np.float32 or addend.shape != out.shape:
        return False
    if not addend.flags.c_contiguous:
        return False
    return addend.ctypes.data == out.ctypes.data or not np.may_share_memory(addend, out)


_DTYPES = (np.dtype(np.float32), np.dtype(np.uint8))


def _dtypes_fit(x: np.ndarray, out: np.ndarray, x_scale, x_dtype: str, out_quant, addend) -> bool:
    """Whether a uint8 input (already quantised: a static scale, ``x_dtype`` "uint8") and a uint8
    output (``out_quant`` given, its zero point and ``0 <= qlo <= qhi <= 255`` integers; an addend
    apart from it) fit."""
    if x.dtype == np.uint8 and (x_scale is None or x_dtype != "uint8"):
        return False
    if out.dtype != np.uint8:
        return True
    try:
        _, yz, qlo, qhi = out_quant
        if not (float(qlo) == int(qlo) and float(qhi) == int(qhi) and float(yz) == int(yz) and 0 <= qlo <= qhi <= 255):
            return False
    except (TypeError, ValueError, OverflowError):
        return False
    return addend is None or not np.may_share_memory(addend, out)


def matmul(a2: np.ndarray, packed: PackedB8, out2: np.ndarray, x_scale: float | None, x_zero_point: int = 0,
           x_dtype: str = "uint8", w_scale: np.ndarray = _ONE, bias: np.ndarray | None = None,
           clip: tuple[float, float] | None = None, act: str | None = None, addend: np.ndarray | None = None,
           out_quant: tuple[float, int, int, int] | None = None, width: int = 1, variant: str | None = None,
           mid_quant: tuple[float, int, int, int] | None = None) -> bool:
    """``out2 = oq(act(clip(mq(dequant(quant(a2) @ B) + bias) + addend)))`` on ``width`` threads
    (module docstring): ``a2`` float32 ``(m, k)``, ``out2`` float32 ``(m, n)``, both C-contiguous;
    ``a2`` uint8: already quantised (``x_zero_point``'s integers; ``x_scale`` a float, ``x_dtype``
    "uint8"); ``out2`` uint8: ``clamp(rint(y / ys) + yz, qlo, qhi)`` of the float32 result ``y``
    (``out_quant`` required, ``0 <= qlo <= qhi <= 255``);
    ``x_scale`` (None: dynamic, uint8), ``x_zero_point``, ``x_dtype`` ``"uint8"|"int8"``: A's
    quantisation; ``w_scale`` float32 ``(n,)`` or ``(1,)``; ``bias`` ``(n,)`` or None; ``addend``
    ``(m, n)`` float32 or None; ``clip`` ``(lo, hi)``; ``act`` a name of :data:`ACTIVATIONS`;
    ``out_quant`` ``(scale, zero point, qlo, qhi)`` or None; ``mid_quant`` ``(ms, mz, mlo, mhi)``
    (finite ``ms > 0``, integers ``-2^16 <= mlo <= mz <= mhi <= 2^16``) or None: the fake-quant
    before the addend (module docstring); ``variant`` one of :func:`runnable`,
    default :func:`isa`. False (nothing written) when the path is off or these do not fit."""
    mod = _mod()
    name = variant or isa()
    if mod is None or not isinstance(packed, PackedB8):
        return False
    for arr in (a2, out2):
        if not isinstance(arr, np.ndarray) or arr.dtype not in _DTYPES or arr.ndim != 2 or not arr.flags.c_contiguous:
            return False
    if not _dtypes_fit(a2, out2, x_scale, x_dtype, out_quant, addend):
        return False
    n = packed.n
    if a2.shape[1] != packed.k or out2.shape != (a2.shape[0], n) or np.may_share_memory(a2, out2):
        return False
    if (bias is not None and getattr(bias, "shape", None) != (n,)) or (addend is not None and not _fits_addend(addend, out2)):
        return False
    if getattr(w_scale, "shape", None) not in ((1,), (n,)):
        return False
    args = _epilogue_args(n, x_scale, x_zero_point, x_dtype, w_scale, bias, clip, act, out_quant, width, name,
                          mid_quant)
    if args is None:
        return False
    try:
        mod.i8_matmul(a2, packed.data, out2, packed.colsum_padded, _pad(w_scale, n, n), _pad(bias, n, n), addend,
                      *args, packed.k)
    except (TypeError, ValueError):
        return False
    return True


class PackedConv8:
    """An ungrouped convolution's ``(M, C, KH, KW)`` int8 weight packed as :func:`conv_nchwc`
    reads it: the :class:`PackedB8` of the ``(k, M)`` matrix whose rows run over ``(kh, kw, input
    block, 16 channels)``, ``k = KH * KW * in_blocks * 16`` (channels past C: zero weights); or,
    ``in_blocks`` 0, a plain NCHW input of ``C <= 16`` channels (a stem), rows over ``(kh, kw, c)``,
    ``k = KH * KW * C``. ``data`` is what a compiled model stores; :meth:`from_data` wraps it again."""

    def __init__(self, w: np.ndarray, in_blocks: int) -> None:
        if not isinstance(w, np.ndarray) or w.ndim != 4 or w.dtype != np.int8:
            raise ValueError(f"PackedConv8 takes a 4-D int8 weight, not {getattr(w, 'dtype', type(w))} {np.shape(w)}")
        m, c, kh, kw = (int(s) for s in w.shape)
        _check_blocks(int(in_blocks), (m, c, kh, kw))
        lanes = int(in_blocks) * BLOCK or c
        full = np.zeros((kh, kw, lanes, m), np.int8)
        full[:, :, :c, :] = w.transpose(2, 3, 1, 0)
        self._init(PackedB8(full.reshape(-1, m)), (m, c, kh, kw), int(in_blocks))

    def _init(self, packed: PackedB8, shape: tuple[int, int, int, int], in_blocks: int) -> None:
        self.packed, self.shape, self.in_blocks = packed, shape, in_blocks
        self.data = packed.data

    @property
    def colsum(self) -> np.ndarray:
        """``sum_k W`` of each of the M output channels (int32)."""
        return self.packed.colsum

    @classmethod
    def from_data(cls, data: np.ndarray, shape: tuple[int, int, int, int], in_blocks: int) -> PackedConv8:
        """The packed weight of ``shape`` whose bits are ``data`` (a stored :attr:`data`, perhaps
        read-only), wrapped without a copy; ValueError when they do not fit."""
        m, c, kh, kw = (int(s) for s in shape)
        if min(m, c, kh, kw) < 0:
            raise ValueError(f"no weight has the shape {tuple(shape)}")
        _check_blocks(int(in_blocks), (m, c, kh, kw))
        self = cls.__new__(cls)
        self._init(PackedB8.from_data(data, kh * kw * (int(in_blocks) * BLOCK or c), m), (m, c, kh, kw), int(in_blocks))
        return self


def _check_blocks(in_blocks: int, shape: tuple[int, int, int, int]) -> None:
    c = shape[1]
    if not (c <= BLOCK if in_blocks == 0 else 0 < in_blocks and c <= in_blocks * BLOCK):
        raise ValueError(f"{in_blocks} input blocks do not hold a weight of {tuple(shape)}")


def conv_out_size(size: int, k: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    """Output extent of one spatial axis (``lo``/``hi``: its pads); below 1 when none fits."""
    return (size + lo + hi - dilation * (k - 1) - 1) // stride + 1


def _geometry(packed: PackedConv8, strides, pads, dilations) -> np.ndarray | None:
    try:
        return _geometry_of(packed.shape[2], packed.shape[3], tuple(strides), tuple(pads), tuple(dilations))
    except TypeError:  # (not iterable, or unhashable values)
        return None


@functools.lru_cache(maxsize=1024)
def _geometry_of(kh: int, kw: int, strides: tuple, pads: tuple, dilations: tuple) -> np.ndarray | None:
    """The C entry's geometry array (made once per setting, read-only), None when it does not fit."""
    try:
        (sh, sw), (top, left, bottom, right), (dh, dw) = strides, pads, dilations
        g = np.array([kh, kw, sh, sw, dh, dw, top, left, bottom, right], np.int64)
    except (TypeError, ValueError):
        return None
    g.setflags(write=False)
    return g if g[2:6].min() >= 1 and g[6:].min() >= 0 else None


def conv_nchwc(x5: np.ndarray, packed: PackedConv8, out5: np.ndarray, strides: tuple[int, int],
               pads: tuple[int, int, int, int], dilations: tuple[int, int], x_scale: float | None,
               x_zero_point: int = 0, x_dtype: str = "uint8", w_scale: np.ndarray = _ONE,
               bias: np.ndarray | None = None, clip: tuple[float, float] | None = None, act: str | None = None,
               addend: np.ndarray | None = None, out_quant: tuple[float, int, int, int] | None = None,
               width: int = 1, variant: str | None = None,
               mid_quant: tuple[float, int, int, int] | None = None) -> bool:
    """The int8 convolution, :func:`matmul`'s epilogue (``mid_quant`` included): ``x5`` ``(N, in_blocks, H, W, 16)`` (or
    plain NCHW ``(N, C, H, W)`` where ``packed.in_blocks`` is 0), ``out5`` ``(N, ceil(M / 16), OH,
    OW, 16)``, ``pads`` ``(top, left, bottom, right)`` (the float 0.0 outside the input),
    ``w_scale`` ``(M,)`` or ``(1,)``, ``bias`` ``(M,)`` (or padded to whole blocks), ``addend`` shaped as ``out5``; lanes past M
    get oq(act(clip(mq(0) + addend))). ``x5`` and ``out5`` may be uint8 as in :func:`matmul` (an
    input's lanes past C hold anything: their weights are zero; its pads hold the zero point).
    False (nothing written) when these do not fit."""
    mod = _mod()
    name = variant or isa()
    if mod is None or not isinstance(packed, PackedConv8):
        return False
    plain = packed.in_blocks == 0 and packed.shape[1] > 0
    for arr, nd in ((x5, 4 if plain else 5), (out5, 5)):
        if not isinstance(arr, np.ndarray) or arr.dtype not in _DTYPES or arr.ndim != nd or not arr.flags.c_contiguous:
            return False
    if not _dtypes_fit(x5, out5, x_scale, x_dtype, out_quant, addend):
        return False
    m, c, kh, kw = packed.shape
    mb = -(-m // BLOCK)
    geo = _geometry(packed, strides, pads, dilations)
    if geo is None:
        return False
    sh, sw, dh, dw, top, left, bottom, right = (int(v) for v in geo[2:])
    n, ib, h, w, lanes = (*x5.shape, BLOCK) if plain else x5.shape
    oh, ow = conv_out_size(h, kh, sh, dh, top, bottom), conv_out_size(w, kw, sw, dw, left, right)
    if ib != (c if plain else packed.in_blocks) or lanes != BLOCK or out5.shape != (n, mb, oh, ow, BLOCK):
        return False
    if np.may_share_memory(x5, out5) or (addend is not None and not _fits_addend(addend, out5)):
        return False
    if (bias is not None and getattr(bias, "shape", None) not in ((m,), (mb * BLOCK,))) or (
            isinstance(w_scale, np.ndarray) and w_scale.shape not in ((1,), (m,))):
        return False
    args = _epilogue_args(mb * BLOCK, x_scale, x_zero_point, x_dtype, w_scale, bias, clip, act, out_quant, width,
                          name, mid_quant)
    if args is None:
        return False
    full = mb * BLOCK
    try:
        mod.i8_conv(x5, packed.data, out5, packed.packed.colsum_padded, _pad(w_scale, m, full), _pad(bias, m, full),
                    addend, *args, geo, int(plain))
    except (TypeError, ValueError):
        return False
    return True


def quantize(a: np.ndarray, x_scale: float | None, x_zero_point: int = 0,
             x_dtype: str = "uint8") -> tuple[np.ndarray, int, np.float32]:
    """``a`` quantised as the kernels quantise it (QuantizeLinear, float32 division, round half to
    even, saturation): ``(q as int64, zero point, scale)``; ``x_scale`` None: dynamic; ``a``
    uint8: already quantised (taken as it is)."""
    if isinstance(a, np.ndarray) and a.dtype == np.uint8:
        return a.astype(np.int64), int(x_zero_point), np.float32(x_scale)
    a = np.asarray(a, np.float32)
    if x_scale is None:
        s, z = dynamic_params(a)
    else:
        s, z = np.float32(x_scale), int(x_zero_point)
    lo, hi = RANGES[x_dtype]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        q = np.clip(np.rint(a / s) + np.float32(z), np.float32(lo), np.float32(hi))
    return q.astype(np.int64), z, np.float32(s)


def epilogue(acc: np.ndarray, mult: np.ndarray, bias: np.ndarray | None = None, clip=None, act: str | None = None,
             addend: np.ndarray | None = None, out_quant=None, out_dtype: str = "float32",
             mid_quant=None) -> np.ndarray:
    """The kernels' float32 epilogue on exact int sums ``acc`` (each step one float32 rounding;
    the activation in NumPy's form, a few ulps from the kernels'); ``out_dtype`` "uint8": the
    quantised integers a uint8 output holds (NaN gives qlo); ``mid_quant``: the fake-quant after
    the bias (NaN gives mlo)."""
    f = np.float32
    y = acc.astype(np.int32).astype(f) * mult
    if bias is not None:
        y = y + bias
    if mid_quant is not None:
        ms, mz, mlo, mhi = (f(v) for v in mid_quant)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            t = np.minimum(np.fmax(np.rint(y / ms) + mz, mlo), mhi)
        y = (t - mz) * ms
    if addend is not None:
        y = y + addend
    if clip is not None:
        y = np.minimum(np.maximum(y, f(clip[0])), f(clip[1]))
    if act is not None:
        with np.errstate(over="ignore", under="ignore"):
            y = TABLE[act].np(y).astype(f)
    if out_dtype == "uint8":
        ys, yz, qlo, qhi = (f(v) for v in out_quant)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            t = np.minimum(np.fmax(np.rint(y / ys) + yz, qlo), qhi)
        return t.astype(np.uint8)
    if out_quant is not None:
        ys, yz, qlo, qhi = (f(v) for v in out_quant)
        t = np.minimum(np.maximum(np.rint(y / ys) + yz, qlo), qhi)
        y = (t - yz) * ys
    return y.astype(f)


def reference(a2: np.ndarray, w: np.ndarray, x_scale: float | None, x_zero_point: int = 0, x_dtype: str = "uint8",
              w_scale: np.ndarray = _ONE, bias: np.ndarray | None = None, clip=None, act: str | None = None,
              addend: np.ndarray | None = None, out_quant=None, out_dtype: str = "float32",
              mid_quant=None) -> np.ndarray:
    """:func:`matmul`'s result in NumPy (``w`` the int8 ``(k, n)`` matrix; ``a2`` float32 or
    uint8, the output's ``out_dtype``): int64 sums, then the float32 epilogue in the kernel's
    order (for tests)."""
    q, z, s = quantize(a2, x_scale, x_zero_point, x_dtype)
    acc = (q - z) @ w.astype(np.int64)
    mult = (s * np.asarray(w_scale, np.float32)).astype(np.float32)
    return epilogue(acc, mult, bias, clip, act, addend, out_quant, out_dtype, mid_quant)


def conv_reference(x: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int],
                   dilations: tuple[int, int], x_scale: float | None, x_zero_point: int = 0, x_dtype: str = "uint8",
                   w_scale: np.ndarray = _ONE, bias: np.ndarray | None = None, clip=None, act: str | None = None,
                   addend: np.ndarray | None = None, out_quant=None, plain: bool = False,
                   out_dtype: str = "float32", mid_quant=None) -> np.ndarray:
    """:func:`conv_nchwc`'s result in NumPy: ``x`` blocked ``(N, ib, H, W, 16)`` (or plain NCHW
    with ``plain``; float32 or uint8), ``w`` int8 ``(M, C, KH, KW)``; blocked ``(N, ceil(M / 16),
    OH, OW, 16)`` of ``out_dtype``, the lanes past M as the kernel makes them (for tests)."""
    m, c, kh, kw = w.shape
    q, z, s = quantize(x, x_scale, x_zero_point, x_dtype)
    if plain:
        n, _, h, wd = x.shape
        xq = q - z
    else:
        n, ib, h, wd, _ = x.shape
        xq = (q - z).transpose(0, 1, 4, 2, 3).reshape(n, ib * BLOCK, h, wd)[:, :c]
    (sh, sw), (top, left, bottom, right), (dh, dw) = strides, pads, dilations
    xq = np.pad(xq, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh, ow = conv_out_size(h, kh, sh, dh, top, bottom), conv_out_size(wd, kw, sw, dw, left, right)
    acc = np.zeros((n, m, oh, ow), np.int64)
    w64 = w.astype(np.int64)
    for a in range(kh):
        for b in range(kw):
            tap = xq[:, :, a * dh: a * dh + (oh - 1) * sh + 1: sh, b * dw: b * dw + (ow - 1) * sw + 1: sw]
            acc += np.einsum("nchw,mc->nmhw", tap, w64[:, :, a, b])
    mb = -(-m // BLOCK)
    full = np.zeros((n, mb * BLOCK, oh, ow), np.int64)
    full[:, :m] = acc
    acc5 = full.reshape(n, mb, BLOCK, oh, ow).transpose(0, 1, 3, 4, 2)
    ws = np.asarray(w_scale, np.float32)
    wsf = np.zeros(mb * BLOCK, np.float32)
    wsf[:] = ws[0] if ws.shape[0] == 1 else 0
    wsf[: ws.shape[0]] = ws
    mult = (s * wsf).astype(np.float32).reshape(mb, 1, 1, BLOCK)
    bf = None
    if bias is not None:
        bf = np.zeros(mb * BLOCK, np.float32)
        bf[:m] = bias
        bf = bf.reshape(mb, 1, 1, BLOCK)
    return epilogue(acc5, mult, bf, clip, act, addend, out_quant, out_dtype, mid_quant)


#: its kernel family (declared in :mod:`ge_native.isa` with the others)
FAMILY = _isa.family("int8gemm")
