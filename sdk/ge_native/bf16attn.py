"""GE's bf16 attention: ``out = softmax(scale * bf16(q) @ bf16(kt) + mask) @ bf16(v)`` per head,
both products with float32 sums, the softmax in float32 (the row's max subtracted, the
prelude's ``expneg32``: exactly 0 below -87.3), its ``P`` rounded to bf16 before the second
product. The operands are float32 arrays of any strides (transposed views, a stride of 0 for
heads broadcast): the C rounds them to bf16 as it packs them, so a strided read costs no copy.
A row of scores that are all -inf gives NaN, as the float32 kernel (``attention_heads.c``)
and NumPy's softmax do (its max is -inf, and -inf - -inf is NaN).

Variants (the ``bf16attn`` family of :mod:`ge_native.isa`), as :mod:`ge_native.bf16`'s GEMM:
``amx_bf16`` (``TDPBF16PS``), ``avx512_bf16`` (``VDPBF16PS``) and ``scalar`` (plain C; on
normal inputs the same bits as ``avx512_bf16``: the same sums in the same order); the same
``GE_NATIVE_BF16`` switch (``0``: off; a variant's name: that variant where this CPU runs it).
Tasks are (head, block of 32 query rows) on ``width`` threads; a row's result never depends on
the other rows, so the bits are the same at every thread count. The C is ``csrc/bf16attn.c``.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import byte_bounds

from . import isa as _isa
from . import native
from .bf16 import round_bf16

#: the variants, best first, and their codes in the C entry (bf16gemm's)
VARIANTS = ("amx_bf16", "avx512_bf16", "scalar")
_CODES = {"scalar": 0, "avx512_bf16": 1, "amx_bf16": 2}

_SRC = native.c_source("bf16attn.c")
_mod = native.lazy_module("GE_NATIVE_BF16", _SRC, ["ba_ok", "ba_caps", "ba_isa", "ba_attention"], "ba_ok")


_VARIANTS = native.Variants(_mod, VARIANTS, _CODES, "ba_caps", "ba_isa")
#: whether the module built here and its switch leaves it on; the variants this CPU runs, best
#: first; the one that runs (None: off or not built)
available, runnable, isa = _VARIANTS.available, _VARIANTS.runnable, _VARIANTS.isa


def _inside(a: np.ndarray) -> bool:
    """Whether the bytes ``a`` spans lie inside the array that holds its memory (the last ndarray
    along its ``base`` chain): a view ``as_strided`` made past its buffer is refused."""
    owner, b = a, a.base
    while b is not None:
        if isinstance(b, np.ndarray):
            owner = b
        b = getattr(b, "base", None)
    if owner is a:
        return True
    lo, hi = byte_bounds(a)
    olo, ohi = byte_bounds(owner)
    return olo <= lo and hi <= ohi


def _fits(x: object, shape: tuple[int, ...]) -> bool:
    return (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.shape == shape and x.flags.aligned
            and _inside(x))


def attention(q: np.ndarray, kt: np.ndarray, v: np.ndarray, out: np.ndarray, scale: float,
              mask: np.ndarray | None = None, width: int = 1, variant: str | None = None) -> bool:
    """``out[g] = softmax(scale * bf16(q[g]) @ bf16(kt[g]) + mask[g]) @ bf16(v[g])`` for each head
    ``g`` on ``width`` threads: ``q`` ``(G, m, d)``, ``kt`` ``(G, d, n)`` (K transposed), ``v``
    ``(G, n, dv)``, ``out`` ``(G, m, dv)`` writeable, ``mask`` None or ``(G, m, n)`` added to
    the scaled scores; float32 arrays of any strides; ``variant``: one of :func:`runnable`,
    default :func:`isa`. False (nothing written) when the path is off or the arrays do not fit:
    dtypes, shapes, ``out`` overlapping an input or itself. The C entry checks them all again."""
    mod = _mod()
    name = variant or isa()
    if mod is None or name not in _CODES:
        return False
    if not all(isinstance(x, np.ndarray) and x.ndim == 3 for x in (q, kt, v, out)):
        return False
    (g, m, d), n, dv = q.shape, kt.shape[-1], v.shape[-1]
    if not (_fits(q, (g, m, d)) and _fits(kt, (g, d, n)) and _fits(v, (g, n, dv)) and _fits(out, (g, m, dv))):
        return False
    if mask is not None and not _fits(mask, (g, m, n)):
        return False
    if not out.flags.writeable or any(x is not None and np.may_share_memory(out, x) for x in (q, kt, v, mask)):
        return False
    try:
        mod.ba_attention(q, kt, v, out, mask, float(scale), max(1, int(width)), _CODES[name])
    except (TypeError, ValueError):
        return False
    return True


def reference(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float,
              mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The attention in float64 of ``q``, ``kt`` and ``v`` rounded to bf16 as the kernel rounds
    them, ``P`` rounded to bf16 as the kernel rounds it: ``(out, |P| @ |bf16(v)|)``, the second
    the scale of the error one bf16 ulp of each element of ``P`` makes (for tests)."""
    s = float(scale) * (round_bf16(q).astype(np.float64) @ round_bf16(kt).astype(np.float64))
    if mask is not None:
        s = s + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = round_bf16((e / e.sum(-1, keepdims=True)).astype(np.float32)).astype(np.float64)
    vb = np.abs(round_bf16(v).astype(np.float64))
    return p @ round_bf16(v).astype(np.float64), np.abs(p) @ vb


#: its kernel family (declared in :mod:`ge_native.isa` with the others)
FAMILY = _isa.family("bf16attn")
