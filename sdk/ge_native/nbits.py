"""GE's MatMulNBits kernels: ``C = A @ W + bias`` with ``W`` ``(k, n)`` held as 4- or 8-bit integers
in blocks of ``block_size`` rows per column, ``w = (q - z) * s`` (onnxruntime's com.microsoft
``MatMulNBits``; its 2-bit form is stored as 4 bits). :class:`PackedNBits` repacks onnxruntime's
``B`` ``(n, k_blocks, blob)`` with its scales and zero points (packed integers or floats; default
``2^(bits - 1)``) once, at build time, into the layout every variant reads (``csrc/nbits.c``):
quads of 16-column panels, 8 nibbles (or 4 bytes) of one column per uint32 lane, scales per
(panel, block, lane) in float32, zero points the same in uint8 or float32, or one for all.

:func:`matmul` picks its path by ``m`` and ``accuracy_level`` only: decode (``m <= 4``) reads the
weights and dequantises them in registers, prefill dequantises a panel quad to float32 into the
thread's scratch and runs register tiles over it, ``accuracy_level`` 4 quantises A to int8 per
block (onnxruntime's CompInt8) with exact int32 sums (VPDPBUSD; AVX2 VPMADDUBSW on nibbles),
the same bits in every variant. Threads split over columns only: the same bits at every thread
count. :func:`dequantize` is the exact float64 weight (tests and the ``g_idx`` fallback).

Variants (family ``nbits``): ``avx512_vnni``, ``avx2``, ``scalar``; ``GE_NATIVE_NBITS=0`` turns
the path off, ``=<variant>`` forces one this CPU runs.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import isa as _isa
from . import native

VARIANTS = ("avx512_vnni", "avx2", "scalar")
_CODES = {"scalar": 0, "avx2": 1, "avx512_vnni": 2}
#: the bit widths onnxruntime's MatMulNBits takes, the block sizes (powers of two)
BITS = (2, 4, 8)
BLOCK_SIZES = (16, 32, 64, 128, 256)
#: columns of a panel; panels are padded to quads (64 columns), the unit a thread takes
LANES, QUAD = 16, 4
#: the most rows of k an entry takes
KMAX = 1 << 24

_SRC = native.c_source("nbits.c")
_mod = native.lazy_module("GE_NATIVE_NBITS", _SRC, ["nb_ok", "nb_caps", "nb_isa", "nb_matmul"], "nb_ok")
_VARIANTS = native.Variants(_mod, VARIANTS, _CODES, "nb_caps", "nb_isa")
#: whether the module built here and its switch leaves it on; the variants this CPU runs, best
#: first; the one that runs (None: off or not built)
available, runnable, isa = _VARIANTS.available, _VARIANTS.runnable, _VARIANTS.isa
_NO_BIAS = np.zeros(1, np.float32)


def blob_size(bits: int, block_size: int) -> int:
    """Bytes of one block of one column in onnxruntime's ``B``."""
    return block_size * bits // 8


def unpack_b(b: np.ndarray, bits: int) -> np.ndarray:
    """onnxruntime's packed ``B`` ``(n, k_blocks, blob)`` uint8 as integers ``(n, k_blocks *
    block_size)`` (the lowest bits of a byte first)."""
    per = 8 // bits
    flat = np.asarray(b, np.uint8).reshape(b.shape[0], -1)
    parts = [(flat >> (bits * j)) & ((1 << bits) - 1) for j in range(per)]
    return np.stack(parts, axis=-1).reshape(b.shape[0], -1).astype(np.uint8)


def zero_points(zp: np.ndarray | None, n: int, k_blocks: int, bits: int) -> np.ndarray:
    """The zero points ``(n, k_blocks)`` as float64: packed uint8 (``ceil(k_blocks * bits / 8)``
    bytes a column, the lowest bits first), float (one a block), or the default ``2^(bits-1)``."""
    if zp is None:
        return np.full((n, k_blocks), float(1 << (bits - 1)))
    if zp.dtype != np.uint8:
        return np.asarray(zp, np.float64).reshape(n, k_blocks)
    per = 8 // bits
    rows = np.asarray(zp).reshape(n, -(-k_blocks // per))
    parts = [(rows >> (bits * j)) & ((1 << bits) - 1) for j in range(per)]
    return np.stack(parts, axis=-1).reshape(n, -1)[:, :k_blocks].astype(np.float64)


def dequantize(b: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, k: int, n: int, bits: int,
               block_size: int, g_idx: np.ndarray | None = None) -> np.ndarray:
    """The weight ``(k, n)`` in float64: ``(q - z) * s`` of each row's block (``g_idx[row]`` where
    given, else ``row // block_size``)."""
    kb = -(-k // block_size)
    q = unpack_b(b.reshape(n, kb, -1), bits)[:, :k].astype(np.float64)
    s = np.asarray(scales, np.float64).reshape(n, kb)
    z = zero_points(zp, n, kb, bits)
    rows = np.arange(k) // block_size if g_idx is None else np.asarray(g_idx, np.int64)
    return ((q - z[:, rows]) * s[:, rows]).T


class PackedNBits:
    """onnxruntime's ``B``, scales and zero points of a ``(k, n)`` weight repacked once into the
    native layout (module docstring): ``w`` uint32 ``(panels, kp / per, 16)``, ``scales`` float32
    ``(panels, k_blocks, 16)``, ``zeros`` the same grid in uint8 (integer zero points) or float32
    (float ones), or float32 ``(1,)`` (the default, one for all). ValueError when a size does not fit ``k, n,
    bits, block_size`` (the caller names the node)."""

    def __init__(self, b: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, k: int, n: int, bits: int,
                 block_size: int) -> None:
        check_sizes(b, scales, zp, k, n, bits, block_size)
        kb = -(-k // block_size)
        kp = kb * block_size
        q = unpack_b(np.asarray(b).reshape(n, kb, -1), bits)
        s = np.asarray(scales, np.float32).reshape(n, kb)
        self.k, self.n, self.bits, self.block_size, self.k_blocks = k, n, bits, block_size, kb
        self.stored_bits = 8 if bits == 8 else 4
        per = 32 // self.stored_bits
        panels = -(-n // (LANES * QUAD)) * QUAD
        cols = panels * LANES
        qp = np.zeros((cols, kp), np.uint32)
        qp[:n] = q
        if self.stored_bits == 4:
            order = [(t >> 1) + 4 * (t & 1) for t in range(8)]  # nibble t holds row order[t] of its group
        else:
            order = list(range(4))
        g = qp.reshape(panels, LANES, kp // per, per)
        word = np.zeros((panels, LANES, kp // per), np.uint32)
        for t, row in enumerate(order):
            word |= g[..., row] << np.uint32(self.stored_bits * t)
        self.w = native.aligned(np.ascontiguousarray(word.transpose(0, 2, 1)))
        self.scales = self._lanes(s, panels, kb)
        if zp is None:  # one value for all: the kernels read no zero point bytes
            self.zeros = np.array([1 << (bits - 1)], np.float32)
        elif zp.dtype == np.uint8:  # integers: a quarter of float32's bytes
            self.zeros = self._lanes(zero_points(zp, n, kb, bits).astype(np.uint8), panels, kb)
        else:
            self.zeros = self._lanes(np.asarray(zp, np.float32).reshape(n, kb), panels, kb)

    @staticmethod
    def _lanes(v: np.ndarray, panels: int, kb: int) -> np.ndarray:
        full = np.zeros((panels * LANES, kb), v.dtype)
        full[: v.shape[0]] = v
        return np.ascontiguousarray(full.reshape(panels, LANES, kb).transpose(0, 2, 1))

    @property
    def nbytes(self) -> int:
        return int(self.w.nbytes + self.scales.nbytes + self.zeros.nbytes)


def check_sizes(b: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, k: int, n: int, bits: int,
                block_size: int) -> None:
    """ValueError naming what does not fit: ``bits`` in :data:`BITS`, ``block_size`` a power of
    two in 16..256, ``B`` of ``n * k_blocks * blob`` uint8, ``scales`` of ``n * k_blocks``,
    ``zero_points`` of ``n * ceil(k_blocks * bits / 8)`` uint8 or ``n * k_blocks`` of the scales'
    float type."""
    if bits not in BITS:
        raise ValueError(f"bits is {bits}; MatMulNBits takes {', '.join(map(str, BITS))}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size is {block_size}; it is a power of two from 16 to 256")
    if not (0 < k <= KMAX and n > 0):
        raise ValueError(f"K {k} and N {n} must be positive (K at most {KMAX})")
    kb = -(-k // block_size)
    want = n * kb * blob_size(bits, block_size)
    if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.size != want:
        raise ValueError(f"B holds {getattr(b, 'size', '?')} {getattr(b, 'dtype', type(b))} values; "
                         f"K {k}, N {n}, bits {bits}, block_size {block_size} need {want} uint8 ({n}, {kb}, "
                         f"{blob_size(bits, block_size)})")
    if not isinstance(scales, np.ndarray) or scales.size != n * kb or scales.dtype.kind != "f":
        raise ValueError(f"scales hold {getattr(scales, 'size', '?')} values; N * k_blocks = {n * kb} floats are needed")
    if zp is not None:
        packed = zp.dtype == np.uint8
        zn = n * -(-kb * bits // 8) if packed else n * kb
        if zp.size != zn or not (packed or zp.dtype.kind == "f"):
            raise ValueError(f"zero_points hold {zp.size} {zp.dtype} values; {zn} are needed "
                             "(packed uint8, or one float a block)")


def matmul(a2: np.ndarray, packed: PackedNBits, out2: np.ndarray, bias: np.ndarray | None = None,
           accuracy_level: int = 0, width: int = 1, variant: str | None = None) -> bool:
    """``out2 = a2 @ W + bias`` on ``width`` threads: ``a2`` float32 ``(m, k)``, ``out2`` float32
    ``(m, n)``, both C-contiguous and apart; ``bias`` float32 ``(n,)`` or None; ``accuracy_level``
    4: int8 activations (module docstring); ``variant`` one of :func:`runnable`, default
    :func:`isa`. False (nothing written) when the path is off or these do not fit."""
    mod = _mod()
    if mod is None or not isinstance(packed, PackedNBits) or not isinstance(a2, np.ndarray) \
            or not isinstance(out2, np.ndarray):
        return False
    code = _CODES.get(variant or isa() or "")
    # (the C entry checks the dtypes, the C order and every size against the packed weight)
    if code is None or a2.ndim != 2 or out2.shape != (a2.shape[0], packed.n) or np.may_share_memory(a2, out2):
        return False
    if bias is not None and (not isinstance(bias, np.ndarray) or bias.shape != (packed.n,)):
        return False
    ip = _params(packed.k, packed.stored_bits, packed.block_size, int(accuracy_level == 4), int(bias is not None),
                 max(1, min(4096, int(width))), code)
    try:
        mod.nb_matmul(a2, packed.w, packed.scales, packed.zeros, _NO_BIAS if bias is None else bias, out2, ip)
    except (TypeError, ValueError):
        return False
    return True


def prepared(packed: PackedNBits, bias: np.ndarray | None = None, accuracy_level: int = 0,
             variant: str | None = None) -> Any:
    """:func:`matmul` with ``packed``, ``bias``, ``accuracy_level`` and the variant (default
    :func:`isa`, read now) fixed: ``run(a2, out2, width) -> bool``, what a model's node calls
    every token without deciding them again; None when the path is off or these do not fit."""
    mod = _mod()
    code = _CODES.get(variant or isa() or "")
    if mod is None or code is None or not isinstance(packed, PackedNBits) or (
            bias is not None and (not isinstance(bias, np.ndarray) or bias.shape != (packed.n,))):
        return None
    entry, n, args = mod.nb_matmul, packed.n, (packed.w, packed.scales, packed.zeros, _NO_BIAS if bias is None else bias)
    fixed = (packed.k, packed.stored_bits, packed.block_size, int(accuracy_level == 4), int(bias is not None))

    def run(a2: np.ndarray, out2: np.ndarray, width: int = 1) -> bool:
        # (the C entry checks the dtypes, the C order and every size against the packed weight)
        if a2.ndim != 2 or out2.shape != (a2.shape[0], n) or np.may_share_memory(a2, out2):
            return False
        try:
            entry(a2, *args, out2, _params(*fixed, max(1, min(4096, int(width))), code))
        except (TypeError, ValueError):
            return False
        return True

    return run


@functools.lru_cache(maxsize=1024)
def _params(*ints: int) -> np.ndarray:
    """The C entry's int64 parameters (made once per setting, read-only: a model's node calls
    with the same ones every token)."""
    ip = np.array(ints, np.int64)
    ip.setflags(write=False)
    return ip


def _probe() -> str | None:
    return isa()


#: its kernel family
FAMILY = _isa.register(_isa.Family("nbits", [
    _isa.Variant("avx512_vnni", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"})),
    _isa.Variant("avx2", frozenset({"avx2", "fma"})), _isa.Variant("scalar")], switch="GE_NATIVE_NBITS", probe=_probe))
