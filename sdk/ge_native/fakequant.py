"""The fake-quant of float32 values (``csrc/fakequant.c``): ``y = clip(rint(x / s), lo, hi) * s``,
QuantizeLinear then DequantizeLinear with a per-tensor scale in one pass (``lo``, ``hi``: the
integer type's range less the zero point). The NumPy form (:func:`reference`) gives the same bits.
``GE_NATIVE_FAKEQUANT=0`` turns the native loop off."""

from __future__ import annotations

import math

import numpy as np

from . import native

_mod = native.lazy_module("GE_NATIVE_FAKEQUANT", native.c_source("fakequant.c"), ["fq", "fq_ok"], "fq_ok")


def available() -> bool:
    """True when the native loop built here and its switch leaves it on."""
    return _mod() is not None


def reference(x: np.ndarray, scale: float, lo: float, hi: float, out: np.ndarray | None = None) -> np.ndarray:
    """The NumPy form (division, rint half to even, clip, multiplication, each in float32)."""
    s = np.float32(scale)
    y = np.divide(x, s, out=out, dtype=np.float32)
    np.rint(y, out=y)
    np.clip(y, np.float32(lo), np.float32(hi), out=y)
    return np.multiply(y, s, out=y)


def fake_quant(x: np.ndarray, scale: float, lo: float, hi: float, out: np.ndarray | None = None,
               width: int = 1) -> np.ndarray:
    """The fake-quant of float32 ``x`` into ``out`` (a new array when None; ``x`` itself is
    allowed): native where it built and the arrays are C-contiguous float32, else NumPy."""
    if not (scale > 0 and math.isfinite(scale) and lo <= hi):
        raise ValueError(f"fake-quant needs a finite scale > 0 and lo <= hi, not {scale}, {lo}, {hi}")
    y = np.empty(x.shape, np.float32) if out is None else out
    mod = _mod()
    if mod is not None and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned \
            and y.dtype == np.float32 and y.flags.c_contiguous and y.flags.writeable and y.shape == x.shape:
        mod.fq(x, y, float(scale), float(lo), float(hi), max(1, int(width)))
        return y
    return reference(x, scale, lo, hi, out=y)
