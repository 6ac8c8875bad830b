"""GE's own float32 GEMM: register tiles (AVX-512 or AVX2), a constant operand packed once, epilogue at the store.

- ``C = A @ B`` with ``B`` a constant ``(k, n)`` matrix packed at build time into panels of 32
  columns (:class:`Panels`), ``A`` read in place: the transformer's ``x @ W``;
- ``C = A @ B`` with ``A`` a constant matrix (read in place, or packed into blocks of 12 rows,
  :class:`RowPanels`) and ``B`` an activation packed into panels by the call: a convolution's
  ``W @ X`` (:class:`Conv2d`, :func:`conv2d`);
- a 12 x 32 tile of ``C`` stays in registers for the whole of ``k`` and is stored once, with its
  epilogue applied there: a bias per column or per row, an addend (a residual), a clip and an
  activation of :data:`ACTIVATIONS` (the table of :mod:`ge_native.activations`).

Each element of ``C`` is one chain of fused multiply-adds in the order of ``k`` whatever the
split, so a product has the same bits at every thread count; every entry checks its arrays
(dtype, C order, sizes) before it runs. The C is ``csrc/sgemm.c``. :func:`available` says
whether the path runs here (the native kernels build and the compiler targets AVX-512F or AVX2
with FMA), :func:`isa` which (the ``sgemm`` family of :mod:`ge_native.isa`); elsewhere callers
keep their BLAS path. ``GE_NATIVE_SGEMM=0`` turns it off. docs/native.md says more.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import native
from .activations import C_IDS

#: columns of a panel and rows of a register tile (the C source's SG_NR / SG_MR)
NR, MR = 32, 12


#: the activations an epilogue applies at the store, by code (this kernel's and the depthwise
#: window loops' of ge_cpu): :data:`ge_native.activations.C_IDS`, the one table's codes
ACTIVATIONS = C_IDS

#: C of ``act32(v, code)``, the activation of :data:`ACTIVATIONS` code ``code`` (0: none) on the
#: native prelude's float32 math, one value at a time; fixed source, for kernels without AVX-512
#: (the window loops' epilogue falls back to it); :data:`ACTIVATION_C16` is the same math in registers
ACTIVATION_C = native.c_source("activations.h")

#: C of the activations 1-3 of :data:`ACTIVATIONS` on 16 float32 lanes in AVX-512 registers,
#: ``sg_act16(v, code)`` (and ``sg_exp16``, ``sg_erf16``): the prelude's exp32 and erf32 with
#: fused multiply-adds (sigmoid and SiLU through ``sg_expneg16``: exp32 of a clamped argument, one
#: scaling), and ``sg_softmax_row16``, the softmax row the row kernels and the attention heads
#: share; fixed source, shared like :data:`ACTIVATION_C`; on AVX2 (no AVX-512) it holds the same
#: activation math on 8 lanes instead, ``sg_act8`` (the blocked kernels' AVX2 form)
ACTIVATION_C16 = native.c_source("activations16.h")

_SRC = native.c_source("sgemm.c")

_NO_BIAS = np.zeros(1, np.float32)


#: the module of _SRC, built on first use
_mod = native.lazy_module("GE_NATIVE_SGEMM", _SRC, ["sg_ok", "sg_width", "sg_packed", "sg_conv"], "sg_ok")


def available() -> bool:
    """True when this machine runs the kernel (AVX-512F or AVX2 + FMA, and the native kernels build)."""
    return _mod() is not None


def isa() -> str | None:
    """The instruction set the GEMM's tiles run on here: ``"avx512f"``, ``"avx2"``, or None."""
    mod = _mod()
    return None if mod is None else {2: "avx512f", 1: "avx2"}.get(int(mod.sg_width()))


class Panels:
    """A constant ``(k, n)`` float32 matrix packed into ``ceil(n / 32)`` panels of ``(k, 32)``
    (the last zero-padded), the operand :func:`matmul_packed` reads."""

    def __init__(self, w: np.ndarray) -> None:
        if w.ndim != 2 or w.dtype != np.float32:
            raise ValueError(f"Panels takes a 2-D float32 matrix, not {w.dtype} {w.shape}")
        self.k, self.n = w.shape
        p, full = -(-self.n // NR), self.n // NR
        # written straight into the aligned panels (no padded copy: a large weight is not held 3x)
        raw = np.zeros(p * self.k * NR * 4 + 64, np.uint8)
        at = (-raw.ctypes.data) % 64
        self.data = raw[at:at + p * self.k * NR * 4].view(np.float32).reshape(p, self.k, NR)
        if full:
            self.data[:full] = w[:, : full * NR].reshape(self.k, full, NR).transpose(1, 0, 2)
        if self.n % NR:
            self.data[full, :, : self.n % NR] = w[:, full * NR:]

    @classmethod
    def from_data(cls, data: np.ndarray, k: int, n: int) -> Panels:
        """The panels of a ``(k, n)`` matrix from their stored :attr:`data` (``(ceil(n / NR), k,
        NR)`` float32: a model's packed weight), used in place when C-contiguous and 64-byte
        aligned (an .om's weights are: no second copy of the weight), else copied once."""
        data = np.asarray(data)
        if data.dtype != np.float32 or data.shape != (-(-int(n) // NR), int(k), NR):
            raise ValueError(f"Panels of ({k}, {n}) take float32 data of shape {(-(-int(n) // NR), int(k), NR)}, "
                             f"not {data.dtype} {data.shape}")
        self = cls.__new__(cls)
        self.k, self.n = int(k), int(n)
        self.data = data if data.flags.c_contiguous and data.ctypes.data % 64 == 0 else native.aligned(data)
        return self

    def dense(self) -> np.ndarray:
        """The ``(k, n)`` matrix the panels hold (a new array: their inverse)."""
        p = self.data.shape[0]
        return np.ascontiguousarray(self.data.transpose(1, 0, 2).reshape(self.k, p * NR)[:, : self.n])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)


def _epilogue_fits(out2: np.ndarray, addend: np.ndarray | None, act: str | None) -> bool:
    """Whether the store's epilogue takes ``addend`` (a residual: a C-contiguous float32 array of
    the output's size that is not the output, or None) and ``act`` (a name of :data:`ACTIVATIONS`,
    or None)."""
    if addend is not None and (addend.dtype != np.float32 or addend.size != out2.size
                               or not addend.flags.c_contiguous or np.may_share_memory(addend, out2)):
        return False
    return act is None or act in ACTIVATIONS


class Conv2d:
    """One layer's :func:`conv2d` with everything but the activation prepared once: the packed
    weight, the geometry vector and the bias. :meth:`run` then checks only what a call can
    change (the epilogue's arguments; the kernel checks the arrays and the geometry against
    them), a few microseconds less a call than :func:`conv2d` for the small layers of a
    ShuffleNet, whose calls were mostly that."""

    __slots__ = ("a", "arows", "m", "geo", "bias", "kind")

    def __init__(self, w: RowPanels, group: int, kernel: tuple[int, int], strides: tuple[int, int],
                 dilations: tuple[int, int], pads: tuple[int, int], out_hw: tuple[int, int],
                 bias: np.ndarray | None = None) -> None:
        if not isinstance(w, RowPanels) or w.group != int(group):
            raise ValueError(f"Conv2d takes the RowPanels of its group {group}")
        self.a, self.arows, self.m = w.data, w.m, w.m
        self.geo = _geometry(int(group), *map(tuple, (kernel, strides, dilations, pads, out_hw)))
        if bias is not None:
            bias = np.ascontiguousarray(np.asarray(bias, np.float32).reshape(-1))
            if bias.shape != (w.m,):
                raise ValueError(f"Conv2d: a bias of {bias.size} values for {w.m} rows")
        self.bias = _NO_BIAS if bias is None else bias
        self.kind = 0 if bias is None else 2

    def run(self, x3: np.ndarray, out2: np.ndarray, clip: tuple[float, float] | None = None, width: int = 1,
            addend: np.ndarray | None = None, act: str | None = None) -> bool:
        """``out2 (M, OH*OW) = act(clip(W @ im2col(x3) + bias + addend))``; False (nothing done)
        when the arrays or the arguments do not fit."""
        mod = _mod()
        if mod is None or not _epilogue_fits(out2, addend, act):
            return False
        lo, hi = (0.0, 0.0) if clip is None else (float(clip[0]), float(clip[1]))
        try:
            mod.sg_conv(x3, self.a, out2, self.bias, self.kind, int(clip is not None), lo, hi, max(1, int(width)),
                        addend, ACTIVATIONS.get(act or "", 0), self.geo, self.arows)
        except (TypeError, ValueError):
            return False
        return True


def _call(entry: Any, a2: np.ndarray, b: np.ndarray, out2: np.ndarray, bias: np.ndarray | None, bias_len: int,
          bias_kind: int, clip: tuple[float, float] | None, width: int, addend: np.ndarray | None,
          act: str | None) -> bool:
    """Check the epilogue's arguments and call a kernel entry; False (nothing done) when the
    arrays or arguments do not fit it."""
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (bias_len,)):
        return False
    if not _epilogue_fits(out2, addend, act):
        return False
    lo, hi = (0.0, 0.0) if clip is None else (float(clip[0]), float(clip[1]))
    try:
        entry(a2, b, out2, _NO_BIAS if bias is None else bias, bias_kind if bias is not None else 0,
              int(clip is not None), lo, hi, max(1, int(width)), addend, ACTIVATIONS.get(act or "", 0))
    except (TypeError, ValueError):
        return False
    return True


def matmul_packed(a2: np.ndarray, panels: Panels, out2: np.ndarray, bias: np.ndarray | None = None,
                  clip: tuple[float, float] | None = None, width: int = 1, addend: np.ndarray | None = None,
                  act: str | None = None) -> bool:
    """``out2 = act(clip(a2 @ W + bias + addend))`` for the packed ``W`` (``bias``: ``n`` values
    or None; ``addend``: an array of ``out2``'s size, or None; ``clip``: ``(lo, hi)`` or None;
    ``act``: a name of :data:`ACTIVATIONS` or None) on ``width`` threads. False (nothing done)
    when the path cannot run these arrays: not float32, not C-contiguous, sizes that disagree."""
    mod = _mod()
    if mod is None or a2.dtype != np.float32 or out2.dtype != np.float32 or a2.ndim != 2 or out2.ndim != 2:
        return False
    if a2.shape[1] != panels.k or out2.shape != (a2.shape[0], panels.n):
        return False
    return _call(mod.sg_packed, a2, panels.data, out2, bias, panels.n, 1, clip, width, addend, act)


class RowPanels:
    """A constant ``(m, k)`` float32 matrix (``group`` row blocks of ``m / group`` rows: a
    convolution's weight) packed into blocks of 12 rows laid out ``(k, 12)``, zero-padded: the
    ``A`` operand :func:`matmul_rows` and :func:`conv2d` then read as one sequential stream (in
    place they read 12 rows at once, 12 streams a prefetcher loses when the weight is not in the
    cache, as in a whole model's run)."""

    def __init__(self, w: np.ndarray, group: int = 1) -> None:
        if w.ndim != 2 or w.dtype != np.float32 or group < 1 or w.shape[0] % group:
            raise ValueError(f"RowPanels takes a 2-D float32 matrix of rows divisible by the group, not {w.dtype} {w.shape} / {group}")
        self.m, self.k = w.shape
        self.group = int(group)
        mg = self.m // self.group
        nb = -(-mg // MR)
        padded = np.zeros((self.group, nb * MR, self.k), np.float32)
        padded[:, :mg] = w.reshape(self.group, mg, self.k)
        self.data = native.aligned(
            padded.reshape(self.group, nb, MR, self.k).transpose(0, 1, 3, 2).reshape(-1, MR))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.m, self.k)


def _a_operand(a2: np.ndarray | RowPanels, group: int) -> tuple[np.ndarray, int, int] | None:
    """(array, arows, rows) for the kernel's A argument: a matrix read in place (arows -1) or a
    :class:`RowPanels` packed for ``group`` (arows its rows); None when it does not fit."""
    if isinstance(a2, RowPanels):
        return (a2.data, a2.m, a2.m) if a2.group == group else None
    if a2.dtype != np.float32 or a2.ndim != 2:
        return None
    return a2, -1, a2.shape[0]


@functools.lru_cache(maxsize=1024)
def _geometry(group: int, *parts: tuple) -> np.ndarray:
    """The kernel's int64 geometry vector, made once per layer shape (a layer calls with the
    same one every image of every run); read-only, the kernel checks its values."""
    geo = np.array([group, *(int(v) for p in parts for v in p)], np.int64)
    geo.setflags(write=False)
    return geo


def matmul_rows(a2: np.ndarray | RowPanels, b2: np.ndarray, out2: np.ndarray, bias: np.ndarray | None = None,
                clip: tuple[float, float] | None = None, width: int = 1, addend: np.ndarray | None = None,
                act: str | None = None) -> bool:
    """``out2 = act(clip(a2 @ b2 + bias[:, None] + addend))`` with ``a2`` a matrix read in place
    or a :class:`RowPanels` and ``b2`` packed by the call, in cache-sized chunks (``bias``: one
    value per row of ``a2``, or None), on ``width`` threads: a 1x1 convolution's ``W @ X``.
    False (nothing done) when the path cannot run these arrays."""
    mod = _mod()
    a = _a_operand(a2, 1)
    if mod is None or a is None or b2.dtype != np.float32 or out2.dtype != np.float32 or b2.ndim != 2:
        return False
    if out2.shape != (a[2], b2.shape[1]) or a2.shape[1] != b2.shape[0] or not b2.flags.c_contiguous:
        return False
    k, n = b2.shape
    geo = _geometry(1, (1, 1), (1, 1), (1, 1), (0, 0), (1, n))
    return _call(lambda *r: mod.sg_conv(*r, geo, a[1]), b2.reshape(k, 1, n), a[0], out2, bias, a[2], 2, clip,
                 width, addend, act)


def conv2d(x3: np.ndarray, w2: np.ndarray | RowPanels, out2: np.ndarray, group: int, kernel: tuple[int, int],
           strides: tuple[int, int], dilations: tuple[int, int], pads: tuple[int, int], out_hw: tuple[int, int],
           bias: np.ndarray | None = None, clip: tuple[float, float] | None = None, width: int = 1,
           addend: np.ndarray | None = None, act: str | None = None) -> bool:
    """One image's 2-D convolution ``out2 (M, OH*OW) = act(clip(W @ im2col(x3) + bias + addend))``
    per group: ``x3`` is ``(C, H, W)``, ``w2`` ``(M, C/group*KH*KW)`` (a matrix read in place, or
    a :class:`RowPanels` of that group); the column matrix is packed straight into panels in
    cache-sized chunks (a read outside the image is 0, so ``pads``, top and left, is the only
    padding given). False (nothing done) when the arrays or the geometry do not fit."""
    mod = _mod()
    a = _a_operand(w2, int(group)) if isinstance(group, (int, np.integer)) else None
    if mod is None or a is None or x3.dtype != np.float32 or out2.dtype != np.float32 or x3.ndim != 3:
        return False
    try:
        geo = _geometry(int(group), *map(tuple, (kernel, strides, dilations, pads, out_hw)))
    except (TypeError, ValueError):
        return False
    if geo.shape != (11,) or out2.ndim != 2 or out2.shape[0] != a[2]:
        return False
    return _call(lambda *r: mod.sg_conv(*r, geo, a[1]), x3, a[0], out2, bias, a[2], 2, clip, width, addend, act)
