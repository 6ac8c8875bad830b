"""Winograd F(2x2, 3x3) convolution (Lavin & Gray, 2015) for 3x3, stride-1, undilated, ungrouped
float convolutions.

Each 2x2 block of outputs is computed from a 4x4 tile of the padded input:
``Y = A^T [(G g G^T) * (B^T d B)] A``. The weights' transform ``U = G g G^T`` (16 matrices of
M x C) is made once when the kernel is built; a run transforms the input tiles
(``V = B^T d B``, 16 matrices of C x tiles: additions only), multiplies the 16 pairs (one batched
GEMM: 16 * M * C multiplies per 4 outputs instead of 36 for a direct 3x3, 2.25x fewer) and
transforms the products back (additions only). The transforms' coefficients are 0, +-1 and
+-1/2, so the rounding stays within a few units of float32 of the direct sum; the tests bound it
against a float64 reference.

Buffers for a shape are kept per thread and reused by every run at that shape (no page faults on
the hot path).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ge_sdk import parallel

#: The weight transform G (4 x 3) of F(2, 3).
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

#: Winograd pays when the GEMMs dominate its transforms: at least this many input and output
#: channels (the transforms cost O(C + M) per tile, the products O(C * M)).
MIN_CHANNELS = 64
#: ... and at least this many output tiles (2x2 outputs each).
MIN_TILES = 16


def transform_weights(w: np.ndarray) -> np.ndarray:
    """``U`` of weights ``w`` (M, C, 3, 3): (16, M, C), in float64 then cast to w's dtype."""
    u = np.einsum("ik,mckl,jl->ijmc", G, w.astype(np.float64), G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]), dtype=w.dtype)


def applies(x_shape: tuple, w_shape: tuple, strides, dilations, group: int, dtype: Any, pays: bool = True) -> bool:
    """A 3x3 stride-1 undilated ungrouped float conv; with ``pays``, the cost model too (enough
    channels and tiles for the GEMMs to outweigh the transforms)."""
    if len(w_shape) != 4 or tuple(w_shape[2:]) != (3, 3) or group != 1 or np.dtype(dtype).kind != "f":
        return False
    if tuple(strides) != (1, 1) or tuple(dilations) != (1, 1):
        return False
    if not pays:
        return True
    m, c = w_shape[0], w_shape[1]
    if m < MIN_CHANNELS or c < MIN_CHANNELS:
        return False
    if len(x_shape) == 4 and all(isinstance(d, int) for d in x_shape[2:]):
        tiles = ((x_shape[2] + 1) // 2) * ((x_shape[3] + 1) // 2) * (x_shape[0] if isinstance(x_shape[0], int) else 1)
        return tiles >= MIN_TILES
    return True


class Winograd:
    """A 3x3 convolution with constant weights, run as F(2x2, 3x3): ``run(x, pads, out)``."""

    def __init__(self, w: np.ndarray) -> None:
        self.m, self.c = int(w.shape[0]), int(w.shape[1])
        self.dtype = w.dtype
        self.u = transform_weights(w)
        self._local = threading.local()

    def _buffers(self, n: int, h: int, wd: int, pads: tuple[int, int, int, int]):
        key = (n, h, wd, pads)
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = {}
        b = cache.get(key)
        if b is None:
            pt, pl, pb, pr = pads
            oh, ow = h + pt + pb - 2, wd + pl + pr - 2
            th, tw = (oh + 1) // 2, (ow + 1) // 2
            dt = self.dtype
            xp = np.zeros((self.c, n, 2 * th + 2, 2 * tw + 2), dt)  # the borders stay zero: only the inside is written
            b = {"oh": oh, "ow": ow, "th": th, "tw": tw, "xp": xp,
                 "t": np.empty((4, 4, self.c, n, th, tw), dt),
                 "v": np.empty((16, self.c, n * th * tw), dt),
                 "mm": np.empty((16, self.m, n * th * tw), dt),
                 "s": np.empty((2, 4, self.m, n, th, tw), dt),
                 "y": np.empty((n, self.m, 2 * th, 2 * tw), dt)}
            if len(cache) >= 8:
                cache.pop(next(iter(cache)))
            cache[key] = b
        return b

    def run(self, x: np.ndarray, pads: tuple[int, int, int, int], out: np.ndarray | None = None) -> np.ndarray:
        n, c, h, wd = x.shape
        if c != self.c:
            raise ValueError(f"Conv: input has {c} channels, the weights {self.c}")
        pt, pl = pads[0], pads[1]
        b = self._buffers(n, h, wd, pads)
        th, tw, oh, ow = b["th"], b["tw"], b["oh"], b["ow"]
        xp, t, v, mm, s, yf = b["xp"], b["t"], b["v"], b["mm"], b["s"], b["y"]
        xp[:, :, pt:pt + h, pl:pl + wd] = x.transpose(1, 0, 2, 3)
        # d[r][q]: the tile element (r, q) of every tile, (C, N, th, tw) strided views
        d = [[xp[:, :, r:r + 2 * th:2, q:q + 2 * tw:2] for q in range(4)] for r in range(4)]
        for q in range(4):  # t = B^T d (over the tile's rows)
            np.subtract(d[0][q], d[2][q], out=t[0, q])
            np.add(d[1][q], d[2][q], out=t[1, q])
            np.subtract(d[2][q], d[1][q], out=t[2, q])
            np.subtract(d[1][q], d[3][q], out=t[3, q])
        vv = v.reshape(16, c, n, th, tw)
        for i in range(4):  # V = t B (over the columns)
            np.subtract(t[i, 0], t[i, 2], out=vv[4 * i])
            np.add(t[i, 1], t[i, 2], out=vv[4 * i + 1])
            np.subtract(t[i, 2], t[i, 1], out=vv[4 * i + 2])
            np.subtract(t[i, 1], t[i, 3], out=vv[4 * i + 3])
        parallel.matmul(self.u, v, out=mm)  # 16 GEMMs (M x C) @ (C x tiles)
        m6 = mm.reshape(4, 4, self.m, n, th, tw)
        for q in range(4):  # S = A^T M (over the rows)
            np.add(m6[0, q], m6[1, q], out=s[0, q])
            s[0, q] += m6[2, q]
            np.subtract(m6[1, q], m6[2, q], out=s[1, q])
            s[1, q] -= m6[3, q]
        y6 = yf.reshape(n, self.m, th, 2, tw, 2)
        for i in range(2):  # Y = S A (over the columns), into the 2x2 blocks of the output
            y6[:, :, :, i, :, 0] = (s[i, 0] + s[i, 1] + s[i, 2]).transpose(1, 0, 2, 3)
            y6[:, :, :, i, :, 1] = (s[i, 1] - s[i, 2] - s[i, 3]).transpose(1, 0, 2, 3)
        res = yf if (oh, ow) == yf.shape[2:] else yf[:, :, :oh, :ow]
        if out is not None:
            np.copyto(out, res)
            return out
        return np.array(res) if res is not yf else yf.copy()
