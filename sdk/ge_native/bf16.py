"""GE's bf16 GEMM: ``C = A @ B`` with ``A`` float32 rounded to bf16 as it is packed, ``B`` a
constant packed once in bf16, float32 sums, the epilogue (bias per column, clip, activation) in
float32 at the store.

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

import ml_dtypes
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
_mod = native.lazy_module("GE_NATIVE_BF16", _SRC, ["bf_ok", "bf_caps", "bf_isa", "bf_matmul"], "bf_ok")


def available() -> bool:
    """True when the native module built here and ``GE_NATIVE_BF16`` leaves it on."""
    return _mod() is not None


def runnable() -> tuple[str, ...]:
    """The variants this CPU (and this process: AMX needs the kernel's grant) runs, best first."""
    mod = _mod()
    if mod is None:
        return ()
    mask = int(mod.bf_caps())
    return tuple(v for v in VARIANTS if mask >> _CODES[v] & 1)


def isa() -> str | None:
    """The variant :func:`matmul` runs: the one ``GE_NATIVE_BF16`` names where this CPU runs it,
    else the best this CPU runs; None when the path is off or did not build."""
    mod = _mod()
    return None if mod is None else str(mod.bf_isa())


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bf16 (to nearest even), as its uint16 bits."""
    return np.ascontiguousarray(np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)).view(np.uint16)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bf16 and back to float32 (the values the kernel multiplies)."""
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

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)


def matmul(a2: np.ndarray, packed: PackedB, out2: np.ndarray, bias: np.ndarray | None = None,
           clip: tuple[float, float] | None = None, act: str | None = None, width: int = 1,
           variant: str | None = None) -> bool:
    """``out2 = act(clip(bf16(a2) @ B + bias))`` with float32 sums on ``width`` threads (``bias``:
    ``n`` float32 values or None; ``clip``: ``(lo, hi)`` or None; ``act``: a name of
    :data:`ACTIVATIONS` or None; ``variant``: one of :func:`runnable`, default :func:`isa`).
    False (nothing done) when the path is off or these arrays do not fit: not float32, not
    C-contiguous, sizes that disagree. The C entry checks them all again before it reads."""
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
    lo, hi = (0.0, 0.0) if clip is None else (float(clip[0]), float(clip[1]))
    try:
        mod.bf_matmul(a2, packed.data, out2, _NO_BIAS if bias is None else bias, int(bias is not None),
                      int(clip is not None), lo, hi, max(1, int(width)), ACTIVATIONS.get(act or "", 0), _CODES[name],
                      packed.k)
    except (TypeError, ValueError):
        return False
    return True


def reference(a2: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NumPy's ``a2 @ w`` of both rounded to bf16 as the kernel rounds them, summed in float64."""
    return round_bf16(a2).astype(np.float64) @ round_bf16(w).astype(np.float64)


#: its kernel family (declared in :mod:`ge_native.isa` with the others)
FAMILY = _isa.family("bf16gemm")
