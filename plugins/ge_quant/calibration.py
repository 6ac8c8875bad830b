"""Range estimation of the quantiser: what interval of a tensor's values its 8-bit grid covers.

A :class:`Collector` sees a tensor's values batch by batch and keeps its minimum, maximum and a
histogram of ``|x|`` (:data:`BINS` bins over ``[0, max|x|]``, re-binned when a later batch goes
further). :meth:`Collector.range` then gives the interval by one of three methods:

- ``minmax``: the smallest and largest value seen;
- ``percentile``: ``|x|`` clipped at the given percentile of its histogram (both tails, as a
  symmetric threshold ``T``: the range is ``[max(min, -T), min(max, T)]``);
- ``entropy``: the threshold ``T`` of the KL-divergence search TensorRT describes ("8-bit
  inference with TensorRT", Migacz 2017; onnxruntime's ``CalibrationMethod.Entropy``): for each
  candidate ``i`` bins, the reference ``P`` is the first ``i`` bins with everything beyond folded
  into the last, the candidate ``Q`` is those ``i`` bins merged into :data:`LEVELS` groups and
  spread back evenly over each group's non-empty bins; ``T`` is the edge of the ``i`` with the
  smallest ``KL(P || Q)`` (:func:`kl_divergence`).
"""

from __future__ import annotations

import numpy as np

#: histogram bins of |x| (TensorRT's 2048)
BINS = 2048
#: quantised levels the entropy search merges into (the 128 magnitudes of int8)
LEVELS = 128
METHODS = ("minmax", "percentile", "entropy")


class Collector:
    """Running statistics of one tensor over the calibration batches."""

    def __init__(self, bins: int = BINS) -> None:
        self.bins = bins
        self.lo = np.inf
        self.hi = -np.inf
        self.top = 0.0
        self.hist = np.zeros(bins, np.float64)

    def add(self, x: np.ndarray) -> None:
        a = np.asarray(x, np.float32).reshape(-1)
        a = a[np.isfinite(a)]
        if a.size == 0:
            return
        self.lo, self.hi = min(self.lo, float(a.min())), max(self.hi, float(a.max()))
        mag = np.abs(a)
        top = float(mag.max())
        if top > self.top:
            self._rebin(top)
        if self.top > 0:
            self.hist += np.histogram(mag, bins=self.bins, range=(0.0, self.top))[0]

    def _rebin(self, top: float) -> None:
        """Widen the histogram to ``[0, top]``: each old bin's count moves to the new bin of its
        centre (the bins only ever grow, so the counts stay in order)."""
        if self.top > 0 and self.hist.any():
            centres = (np.arange(self.bins) + 0.5) * (self.top / self.bins)
            idx = np.minimum((centres / top * self.bins).astype(np.int64), self.bins - 1)
            hist = np.zeros(self.bins, np.float64)
            np.add.at(hist, idx, self.hist)
            self.hist = hist
        self.top = top

    @property
    def seen(self) -> bool:
        return bool(np.isfinite(self.lo))

    def threshold(self, method: str, percentile: float = 99.99) -> float:
        """The magnitude ``T`` beyond which values clip (``max|x|`` for minmax)."""
        if method == "minmax" or self.top == 0:
            return self.top
        width = self.top / self.bins
        if method == "percentile":
            cdf = np.cumsum(self.hist)
            i = int(np.searchsorted(cdf, cdf[-1] * percentile / 100.0))
            return min(self.top, (i + 1) * width)
        if method == "entropy":
            return entropy_bins(self.hist) * width
        raise ValueError(f"calibration method {method!r} is not one of {', '.join(METHODS)}")

    def range(self, method: str, percentile: float = 99.99) -> tuple[float, float]:
        """The ``(lo, hi)`` interval the tensor's grid covers by ``method``."""
        if not self.seen:
            return 0.0, 0.0
        t = self.threshold(method, percentile)
        return max(self.lo, -t), min(self.hi, t)


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """``KL(P || Q)`` of two histograms, each normalised to sum 1; a bin where ``P > 0`` and
    ``Q == 0`` counts as ``Q = 1e-10`` (a finite, large penalty rather than infinity)."""
    p = p / p.sum()
    q = q / q.sum() if q.sum() > 0 else q
    m = p > 0
    return float(np.sum(p[m] * np.log(p[m] / np.maximum(q[m], 1e-10))))


def expand(hist: np.ndarray, levels: int) -> np.ndarray:
    """``hist`` merged into ``levels`` groups of ``len // levels`` bins (the last group takes the
    remainder), each group's total spread evenly over its non-empty bins: the histogram the
    values would have after quantising to ``levels`` magnitudes."""
    n = len(hist)
    step = n // levels
    starts = np.arange(levels) * step
    group = np.minimum(np.arange(n) // step, levels - 1)
    totals = np.add.reduceat(hist, starts)
    nonzero = np.add.reduceat((hist > 0).astype(np.float64), starts)
    share = np.divide(totals, nonzero, out=np.zeros(levels), where=nonzero > 0)
    return np.where(hist > 0, share[group], 0.0)


def entropy_bins(hist: np.ndarray, levels: int = LEVELS) -> int:
    """How many of ``hist``'s bins the KL-divergence search keeps (the threshold's bin edge)."""
    hist = np.asarray(hist, np.float64)
    n = len(hist)
    if n <= levels or hist.sum() == 0:
        return n
    best, best_i = np.inf, n
    tail = np.cumsum(hist[::-1])[::-1]  # tail[i]: the count in bins i..n-1
    for i in range(levels, n + 1):
        p = hist[:i].copy()
        if i < n:
            p[i - 1] += tail[i]
        if p.sum() == 0:
            continue
        kl = kl_divergence(p, expand(hist[:i], levels))
        if kl < best:
            best, best_i = kl, i
    return best_i


def activation_params(lo: float, hi: float, dtype: str) -> tuple[np.float32, int]:
    """Scale and zero point of an activation covering ``[lo, hi]`` (widened to hold 0, so that
    zero padding is exact): uint8 asymmetric, int8 symmetric with zero point 0."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if dtype == "int8":
        t = max(-lo, hi)
        return np.float32(t / 127.0 if t > 0 else 1.0), 0
    if hi == lo:
        return np.float32(1.0), 0
    scale = np.float32((hi - lo) / 255.0)
    return scale, int(np.clip(np.round(-lo / float(scale)), 0, 255))


def weight_params(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights (zero point 0, range [-127, 127]): (int8 values, float32 scales),
    one scale per slice along ``axis`` (None: one for the tensor)."""
    w = np.asarray(w, np.float32)
    if axis is None:
        top = np.asarray(np.abs(w).max() if w.size else 0.0, np.float32)
        shaped = top
    else:
        red = tuple(i for i in range(w.ndim) if i != axis)
        top = np.abs(w).max(axis=red) if w.size else np.zeros(w.shape[axis], np.float32)
        shaped = top.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
    scale = np.where(top > 0, top / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    s = np.where(shaped > 0, shaped / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(w / s), -127, 127).astype(np.int8)
    return q, scale
