"""Winograd F(2x2, 3x3) convolution (Lavin & Gray, 2015) for 3x3, stride-1, undilated float
convolutions, ungrouped or with wide groups (RegNet's, ResNeXt's: the 16 products per group).

Each 2x2 block of outputs is computed from a 4x4 tile of the padded input:
``Y = A^T [(G g G^T) * (B^T d B)] A``. The weights' transform ``U = G g G^T`` (16 matrices of
M x C) is made once when the kernel is built; a run transforms the input tiles
(``V = B^T d B``, 16 matrices of C x tiles: additions only), multiplies the 16 pairs (one batched
GEMM: 16 * M * C multiplies per 4 outputs instead of 36 for a direct 3x3, 2.25x fewer) and
transforms the products back (additions only). The transforms' coefficients are 0, +-1 and
+-1/2, so the rounding stays within a few units of float32 of the direct sum; the tests bound it
against a float64 reference.

The compiled path's buffers are the thread's, shared by all its Winograd layers (one set stays in
the cache); the NumPy path's are kept per layer, thread and shape. Neither page-faults on the hot
path.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ge_native import isa, native, parallel
from ge_native.jit import enabled as jit_enabled

#: The weight transform G (4 x 3) of F(2, 3).
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

#: Winograd pays when the GEMMs dominate its transforms: at least this many input and output
#: channels (the transforms cost O(C + M) per tile, the products O(C * M)). Measured against GE's
#: own GEMM on the im2col panels (ge_native.sgemm, the epilogue at its store): squeezenet's
#: 16 -> 64 and 32 -> 128 layers and ResNet's 64 -> 256 at 13x13 ran 1.1-1.4x slower as Winograd.
MIN_CHANNELS = 64
#: ... and with groups, at least this many channels per group (each group's GEMMs are that wide).
MIN_GROUP_CHANNELS = 32
#: ... and at least this many output tiles (2x2 outputs each: a 13x13 plane; 7x7 planes lose,
#: 1.2x at 1 thread, 1.5x at 2, 512 channels)
MIN_TILES = 49
#: ... and at least this many input channels times tiles (the GEMMs' k times n: 64 channels on
#: 13x13 lose, 256 on 14x14 and 64 on 56x56 gain)
MIN_WORK = 8192
#: ... with groups, this many (a group's GEMMs are narrow: 7x7 planes lose, 14x14 gain)
MIN_GROUP_TILES = 49
#: Shapes whose buffers a thread keeps (the transformed tiles and products are 4x an activation:
#: a dynamic batch must not keep one set per batch size seen)
KEEP_SHAPES = 2
#: The compiled transforms take planes of at most this many tiles across (2048 pixels).
MAX_TILES_ACROSS = 1024


def transform_weights(w: np.ndarray) -> np.ndarray:
    """``U`` of weights ``w`` (M, C, 3, 3): (16, M, C), in float64 then cast to w's dtype (with
    groups, C is the channels per group and row block g of M is group g's)."""
    u = np.einsum("ik,mckl,jl->ijmc", G, w.astype(np.float64), G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]), dtype=w.dtype)


def applies(x_shape: tuple, w_shape: tuple, strides, dilations, group: int, dtype: Any, pays: bool = True) -> bool:
    """A 3x3 stride-1 undilated float conv (of any group count); with ``pays``, the cost model too
    (enough channels per group and tiles for the GEMMs to outweigh the transforms)."""
    if len(w_shape) != 4 or tuple(w_shape[2:]) != (3, 3) or group < 1 or np.dtype(dtype).kind != "f":
        return False
    if tuple(strides) != (1, 1) or tuple(dilations) != (1, 1) or w_shape[0] % group:
        return False
    if not pays:
        return True
    m, c = w_shape[0] // group, w_shape[1]  # per group
    if m < (MIN_CHANNELS if group == 1 else MIN_GROUP_CHANNELS) or c < (MIN_CHANNELS if group == 1 else MIN_GROUP_CHANNELS):
        return False
    if len(x_shape) == 4 and all(isinstance(d, int) for d in x_shape[2:]):
        tiles = ((x_shape[2] + 1) // 2) * ((x_shape[3] + 1) // 2) * (x_shape[0] if isinstance(x_shape[0], int) else 1)
        if group == 1:
            return tiles >= MIN_TILES and c * tiles >= MIN_WORK
        return tiles >= MIN_GROUP_TILES
    return True


#: The transforms are C in ge_native's ``csrc/winograd.c`` (fixed source: nothing in it comes
#: from a model; every size is checked against the arrays by the entries). ``wino_in``:
#: x (N, C, H, W) -> V (16, C, N*th*tw), the tiles read with the padding (zeros outside the
#: input); ``wino_out``: M (16, M, N*th*tw) + bias -> y (N, M, oh, ow). One task per
#: (image, channel) plane on the native pool.
_native: dict[str, Any] = {}


def native_transforms(dtype: Any):
    """``(wino_in, wino_out)`` of the compiled transforms for float32/float64, or None."""
    dt = np.dtype(dtype)
    if dt.name not in ("float32", "float64") or not jit_enabled("GE_CPU_JIT") or not native.available():
        return None
    mod = _module()
    if mod is None:
        return None
    return (mod.in_f32, mod.out_f32) if dt == np.float32 else (mod.in_f64, mod.out_f64)


def _module() -> Any:
    if "mod" not in _native:
        _native["mod"] = native.build(native.c_source("winograd.c"),
                                      ["in_f32", "in_f64", "out_f32", "out_f64", "wino_isa"])
    return _native["mod"]


def _probe() -> str | None:
    """The instruction set the compiled transforms were built for (None: the NumPy form runs)."""
    if not jit_enabled("GE_CPU_JIT") or not native.available():
        return None
    mod = _module()
    return None if mod is None else str(mod.wino_isa())


#: the transforms' variants (the products are GEMMs on parallel.matmul in each): compiled C
#: for the machine's widest vectors, else NumPy
FAMILY = isa.register(isa.Family("winograd", [isa.Variant("avx512f", frozenset({"avx512f"})),
                                              isa.Variant("avx2", frozenset({"avx2", "fma"})),
                                              isa.Variant("scalar"), isa.Variant("numpy")],
                                 switch="GE_CPU_JIT", probe=_probe))


def variant(compiled: bool = True) -> str:
    """The variant a :class:`Winograd` kernel runs here (``compiled`` False: ``"numpy"``), for
    ``with_caps(kernel, variant=...)``."""
    return FAMILY.chosen() if compiled else FAMILY.fallback


#: Each thread's transformed tiles and products of the compiled path, shared by every Winograd
#: layer it runs (layers run one after the other on a thread): one set the size of the largest
#: layer stays in the cache from layer to layer, where a set per layer (4x an activation each) is
#: tens of MB a model, evicted by the time its layer runs again, and written and read back
#: through DRAM on every run (3x a layer's own time, measured in squeezenet).
_shared = threading.local()


def _scratch(shape_v: tuple, shape_mm: tuple, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """The calling thread's (V, M) buffers of these shapes: views of its two flat buffers, grown
    to the largest size asked for (never shrunk)."""
    bufs = getattr(_shared, "bufs", None)
    if bufs is None:
        bufs = _shared.bufs = {}
    out = []
    for role, shape in (("v", shape_v), ("mm", shape_mm)):
        count = int(np.prod(shape))
        flat = bufs.get((role, np.dtype(dtype)))
        if flat is None or flat.size < count:
            flat = bufs[(role, np.dtype(dtype))] = np.empty(max(count, 1), dtype)
        out.append(flat[:count].reshape(shape))
    return out[0], out[1]


class Winograd:
    """A 3x3 convolution with constant weights (M, C / group, 3, 3), run as F(2x2, 3x3):
    ``run(x, pads, out, bias)``."""

    def __init__(self, w: np.ndarray, compiled: bool = True, group: int = 1) -> None:
        self.group = int(group)
        self.m, self.c = int(w.shape[0]), int(w.shape[1]) * self.group  # output and input channels
        self.dtype = w.dtype
        u = transform_weights(w)  # (16, M, C / group)
        # with groups: (16, group, M / group, C / group), the products (16 * group GEMMs) batched
        self.u = u if self.group == 1 else u.reshape(16, self.group, self.m // self.group, self.c // self.group)
        self._local = threading.local()
        self._last_bias: tuple[Any, np.ndarray] | None = None
        self._native = native_transforms(self.dtype) if compiled else None  # built now, not on the first run

    @property
    def compiled(self) -> bool:
        """True when the transforms run compiled (else in NumPy)."""
        return self._native is not None

    @property
    def variant(self) -> str:
        """The variant of the ``winograd`` family this kernel runs (:func:`variant`)."""
        return variant(self._native is not None)

    def _cached(self, key: tuple, make) -> dict:
        """This thread's buffers for ``key`` (made by ``make()`` on first use; the last
        :data:`KEEP_SHAPES` kept)."""
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = {}
        b = cache.get(key)
        if b is None:
            b = make()
            if len(cache) >= KEEP_SHAPES:
                cache.pop(next(iter(cache)))
            cache[key] = b
        return b

    def _buffers(self, n: int, h: int, wd: int, pads: tuple[int, int, int, int]) -> dict:
        pt, pl, pb, pr = pads
        oh, ow = h + pt + pb - 2, wd + pl + pr - 2
        th, tw = (oh + 1) // 2, (ow + 1) // 2
        dt = self.dtype

        def make() -> dict:
            return {"oh": oh, "ow": ow, "th": th, "tw": tw,
                    "xp": np.zeros((self.c, n, 2 * th + 2, 2 * tw + 2), dt),  # borders stay zero: only the inside is written
                    "t": np.empty((4, 4, self.c, n, th, tw), dt),
                    "v": np.empty((16, self.c, n * th * tw), dt),
                    "mm": np.empty((16, self.m, n * th * tw), dt),
                    "s": np.empty((2, 4, self.m, n, th, tw), dt),
                    "y": np.empty((n, self.m, 2 * th, 2 * tw), dt)}

        return self._cached(("numpy", n, h, wd, pads), make)

    def run(self, x: np.ndarray, pads: tuple[int, int, int, int], out: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> np.ndarray:
        """The convolution of ``x`` (N, C, H, W) with top/left/bottom/right ``pads`` (+ ``bias``),
        into ``out`` when given (C-contiguous, the output's shape)."""
        n, c, h, wd = x.shape
        if c != self.c:
            raise ValueError(f"Conv: input has {c} channels, the weights {self.c}")
        oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
        if oh < 0 or ow < 0:
            raise ValueError(f"Conv: input {x.shape} with pads {tuple(pads)} is smaller than the 3x3 kernel")
        if 0 in (n, c, h, wd, oh, ow, self.m):  # an empty extent first: zeros (+ bias), or nothing
            y = out if out is not None else np.empty((n, self.m, oh, ow), self.dtype)
            y.fill(0)
            if bias is not None and y.size:
                y += np.asarray(bias).reshape((self.m, 1, 1)).astype(y.dtype, copy=False)
            return y
        fns = self._native
        if fns is not None and x.dtype == self.dtype and (wd + pads[1] + pads[3]) // 2 <= MAX_TILES_ACROSS:
            return self._run_native(fns, np.ascontiguousarray(x), pads, out, bias)
        y = self._run_numpy(x, pads, out)
        if bias is not None:
            y += bias.reshape((self.m, 1, 1)).astype(y.dtype, copy=False)
        return y

    def _bias(self, bias: np.ndarray) -> np.ndarray:
        """``bias`` as the output transform reads it (converted once for a constant bias)."""
        last = self._last_bias
        if last is not None and last[0] is bias:
            return last[1]
        bb = np.ascontiguousarray(np.asarray(bias).reshape(-1), dtype=self.dtype)
        self._last_bias = (bias, bb)
        return bb

    def _products(self, v: np.ndarray, mm: np.ndarray) -> None:
        """mm = U V: 16 GEMMs (M x C) @ (C x tiles), or 16 per group."""
        g = self.group
        if g == 1:
            parallel.matmul(self.u, v, out=mm)
            return
        p = v.shape[-1]
        uu = self.u.reshape(16 * g, self.m // g, self.c // g)
        parallel.matmul(uu, v.reshape(16 * g, self.c // g, p), out=mm.reshape(16 * g, self.m // g, p))

    def _run_native(self, fns, x: np.ndarray, pads, out, bias) -> np.ndarray:
        n, c, h, wd = x.shape
        oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
        th, tw = (oh + 1) // 2, (ow + 1) // 2
        v, mm = _scratch((16, c, n * th * tw), (16, self.m, n * th * tw), self.dtype)
        width = parallel.threads()
        fin, fout = fns
        fin(x, v, n, c, h, wd, pads[0], pads[1], th, tw, width)
        self._products(v, mm)
        y = out if out is not None else np.empty((n, self.m, oh, ow), self.dtype)
        bb = None if bias is None else self._bias(bias)
        fout(mm, y, bb, n, self.m, oh, ow, width)
        return y

    def _run_numpy(self, x: np.ndarray, pads: tuple[int, int, int, int], out: np.ndarray | None = None) -> np.ndarray:
        n, c, h, wd = x.shape
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
        self._products(v, mm)
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
