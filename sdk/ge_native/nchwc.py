"""Convolutions on channel-blocked activations (NCHWc, 16 channels a block) in vector registers.

In the blocked layout ``(N, C/16, H, W, 16)`` (onnxruntime's NCHWc, GE's NC1HWC0) the 16 channels
of a pixel are one vector, so direct kernels read their inputs in place instead of building a
column matrix every layer:

- :func:`conv`: register tiles of output pixels times blocks of output channels (grouped
  convolutions whose groups are whole blocks too); :func:`winograd` for 3x3 stride-1
  convolutions (F(2x2, 3x3) or F(4x4, 3x3), weights from :func:`winograd_weights`);
  :func:`depthwise`;
- the epilogue, as :mod:`ge_native.sgemm` has it: a bias per channel, an addend, a clip, an
  activation;
- :func:`pool`, :func:`global_average` and the reorders :func:`to_blocked` / :func:`from_blocked`.

Each output vector is one chain of fused multiply-adds in a fixed order whatever the thread
count, so results have the same bits at every width; every entry checks its arrays' dtype,
layout and sizes against the geometry before it runs. The kernels (``csrc/nchwc*``) are built
for AVX-512F or AVX2 with FMA, with the same layout, packed weights and sum order on both, so an
.om blocked on one machine runs on the other with the same bits. :func:`available` says whether
they run here, :func:`isa` which (the ``nchwc`` family of :mod:`ge_native.isa`);
``GE_NATIVE_NCHWC=0`` turns them off. docs/native.md says more.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import native
from .sgemm import ACTIVATIONS

#: channels per block (one AVX-512 vector of float32)
BLOCK = 16
#: output channel blocks a convolution tile holds
GROUP = 4

#: Winograd's weight transforms G ((m + 2) x 3) of F(m x m, 3 x 3) by output tile size m (Lavin &
#: Gray's points 0, +-1, +-2 and infinity for m 4; 0, +-1 and infinity for m 2)
WINOGRAD_G = {
    2: np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]]),
    4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                 [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
}

_SRC = native.c_source("nchwc.c", "nchwc_layout.c")

_NO_BIAS = np.zeros(1, np.float32)


#: the module of _SRC, built on first use
_mod = native.lazy_module("GE_NATIVE_NCHWC", _SRC, ["nc_ok", "nc_isa", "nc_conv", "nc_conv_plain", "nc_dwconv", "nc_pool",
                                                    "nc_gap", "nc_reorder", "nc_wino", "nc_wino_pack", "nc_scale_w", "nc_groupnorm"], "nc_ok")


def available() -> bool:
    """True when the blocked kernels run here (AVX-512F, or AVX2 with FMA, and the native kernels build)."""
    return _mod() is not None


def isa() -> str | None:
    """The instruction set the blocked kernels run on here: ``"avx512f"``, ``"avx2"``, or None."""
    mod = _mod()
    return None if mod is None else {2: "avx512f", 1: "avx2"}.get(int(mod.nc_isa()))


def blocks(channels: int) -> int:
    """Blocks of :data:`BLOCK` channels that hold ``channels``."""
    return -(-int(channels) // BLOCK)


def blocked_shape(shape: tuple) -> tuple:
    """The blocked shape ``(N, C/16, H, W, 16)`` of an NCHW ``shape``."""
    n, c, h, w = shape
    return (n, blocks(c), h, w, BLOCK)


def pack_weights(w: np.ndarray, in_blocks: int | None = None, groups: int = 1) -> np.ndarray:
    """A convolution's ``(M, C, KH, KW)`` weight as :func:`conv` reads it (1-D float32): groups of
    :data:`GROUP` output blocks, each ``(cb, kh, kw, 16 in, FB * 16 out)``; the channels past M and
    C (up to ``in_blocks`` blocks) are zeros. A grouped one (``groups`` > 1, ``C`` the channels of a
    group): each group's output channels packed so in turn (M and C whole blocks a group)."""
    m, c, kh, kw = w.shape
    if groups > 1:
        if m % (groups * BLOCK) or c % BLOCK:
            raise ValueError(f"a grouped weight {w.shape} needs whole blocks of {BLOCK} channels a group")
        step = m // groups
        return native.aligned(np.concatenate([pack_weights(w[i * step:(i + 1) * step]) for i in range(groups)]))
    mb, cb = blocks(m), max(blocks(c), int(in_blocks or 0))
    full = np.zeros((mb * BLOCK, cb * BLOCK, kh, kw), np.float32)
    full[:m, :c] = w
    parts = []
    for g0 in range(0, mb, GROUP):
        fb = min(GROUP, mb - g0)
        blk = full[g0 * BLOCK:(g0 + fb) * BLOCK].reshape(fb, BLOCK, cb, BLOCK, kh, kw)
        # (f, out, cb, in, kh, kw) -> (cb, kh, kw, in, f, out)
        parts.append(blk.transpose(2, 4, 5, 3, 0, 1).reshape(-1))
    return native.aligned(np.concatenate(parts).astype(np.float32, copy=False))


def pack_plain(w: np.ndarray) -> np.ndarray:
    """A convolution's ``(M, C, KH, KW)`` weight as :func:`conv_plain` reads it: groups of
    :data:`GROUP` output blocks, each ``(c, kh, kw, FB * 16 out)`` (the channels past M zeros)."""
    m, c, kh, kw = w.shape
    mb = blocks(m)
    full = np.zeros((mb * BLOCK, c, kh, kw), np.float32)
    full[:m] = w
    parts = []
    for g0 in range(0, mb, GROUP):
        fb = min(GROUP, mb - g0)
        blk = full[g0 * BLOCK:(g0 + fb) * BLOCK].reshape(fb, BLOCK, c, kh, kw)
        parts.append(blk.transpose(2, 3, 4, 0, 1).reshape(-1))  # (f, out, c, kh, kw) -> (c, kh, kw, f, out)
    return native.aligned(np.concatenate(parts).astype(np.float32, copy=False))


def pack_depthwise(w: np.ndarray) -> np.ndarray:
    """A depthwise ``(C, 1, KH, KW)`` weight as :func:`depthwise` reads it: ``(cb, kh, kw, 16)``."""
    c, _, kh, kw = w.shape
    cb = blocks(c)
    full = np.zeros((cb * BLOCK, kh, kw), np.float32)
    full[:c] = w[:, 0]
    return native.aligned(full.reshape(cb, BLOCK, kh, kw).transpose(0, 2, 3, 1).reshape(-1))


def pad_bias(b: np.ndarray | None, m: int) -> np.ndarray | None:
    """A bias of ``m`` channels padded to whole blocks (None stays None)."""
    if b is None:
        return None
    out = np.zeros(blocks(m) * BLOCK, np.float32)
    out[:m] = np.asarray(b, np.float32).reshape(-1)
    return out


@functools.lru_cache(maxsize=512)
def _geometry(kernel, strides, dilations, pads) -> np.ndarray:
    """The geometry array of the native entries (made once per geometry: read-only, a call made
    a new one each time)."""
    g = np.array([*kernel, *strides, *dilations, *pads], np.int64)
    g.setflags(write=False)
    return g


def _conv_call(entry, x5, wpk, out5, kernel, strides, dilations, pads, bias, clip, width, addend, act,
               x_ndim: int = 5, groups: int | None = None, extra: tuple[int, ...] = ()) -> bool:
    mod = _mod()
    if mod is None or act not in (None, *ACTIVATIONS):
        return False
    for a, nd in ((x5, x_ndim), (out5, 5)) + (() if addend is None else ((addend, 5),)):
        if a.dtype != np.float32 or a.ndim != nd or not a.flags.c_contiguous:
            return False
    # (may_share_memory compares extents: exact overlap tests cost a microsecond a call, and the
    # arena's values never overlap; a false alarm only sends the call to the NumPy form)
    if addend is not None and (addend.shape != out5.shape or np.may_share_memory(addend, out5)):
        return False
    if np.may_share_memory(x5, out5):
        return False
    lo, hi = (0.0, 0.0) if clip is None else (float(clip[0]), float(clip[1]))
    try:
        geo = _geometry(tuple(kernel), tuple(strides), tuple(dilations), tuple(pads))
        getattr(mod, entry)(x5, wpk, out5, _NO_BIAS if bias is None else bias, int(bias is not None),
                            int(clip is not None), lo, hi, max(1, int(width)), addend, ACTIVATIONS.get(act or "", 0),
                            geo, *(() if groups is None else (int(groups),)), *extra)
    except (TypeError, ValueError):
        return False
    return True


def conv(x5: np.ndarray, wpk: np.ndarray, out5: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
         dilations: tuple[int, int], pads: tuple[int, int], bias: np.ndarray | None = None,
         clip: tuple[float, float] | None = None, width: int = 1, addend: np.ndarray | None = None,
         act: str | None = None, groups: int = 1) -> bool:
    """``out5 = act(clip(conv(x5) + bias + addend))`` on blocked arrays (``wpk`` from
    :func:`pack_weights`, ``bias`` from :func:`pad_bias`; ``pads`` top and left: the taps outside
    the input are zeros; ``groups``: a grouped convolution, whole blocks a group). False (nothing
    done) when the arrays or the geometry do not fit."""
    return _conv_call("nc_conv", x5, wpk, out5, kernel, strides, dilations, pads, bias, clip, width, addend, act,
                      groups=groups)


def winograd_weights(w: np.ndarray, m: int, in_blocks: int | None = None, groups: int = 1) -> np.ndarray:
    """A 3x3 convolution's ``(M, C, 3, 3)`` weight as :func:`winograd` reads it for F(m x m, 3 x 3)
    (``m`` 4 or 2): ``U = G g G^T`` in float64 at each of the ``(m + 2)^2`` points, each point's
    ``(M, C)`` matrix packed as a 1x1 convolution's weight (:func:`pack_weights`, with ``groups``
    as it packs a grouped one: ``C`` the channels of a group, whole blocks), one after the other."""
    mo, c, kh, kw = w.shape
    if (kh, kw) != (3, 3) or m not in WINOGRAD_G:
        raise ValueError(f"winograd_weights takes a 3x3 weight and m of {sorted(WINOGRAD_G)}, not {w.shape} and {m}")
    if groups > 1 and (mo % (groups * BLOCK) or c % BLOCK):
        raise ValueError(f"a grouped weight {w.shape} needs whole blocks of {BLOCK} channels a group")
    g = WINOGRAD_G[m]
    r = g.shape[0]
    mb, cb = blocks(mo), (blocks(c) if groups > 1 else max(blocks(c), int(in_blocks or 0)))
    # U[a, b] = sum over i, j of G[a, i] G[b, j] w[i, j]: kron(G, G) (P x 9), in float64
    k = np.kron(g, g)
    mod = _mod()
    if mod is not None:  # one pass, in place (a large weight's NumPy copies cost 0.1-0.4 s)
        out = native.aligned(np.empty(r * r * mb * BLOCK * cb * BLOCK, np.float32))
        mod.nc_wino_pack(np.ascontiguousarray(w, np.float32).reshape(-1), mo, c, cb, m, out, k.reshape(-1),
                         int(groups))
        return out
    u = np.matmul(k, w.reshape(-1, 9).astype(np.float64).T).reshape(r * r, mo, c).astype(np.float32)
    # each point's (M, C) packed as pack_weights packs a 1x1 weight, the points one after the other
    points = [pack_weights(u[i][:, :, None, None], groups=groups) if groups > 1
              else pack_weights(u[i][:, :, None, None], in_blocks=cb) for i in range(r * r)]
    return native.aligned(np.concatenate(points))


def winograd(x5: np.ndarray, upk: np.ndarray, out5: np.ndarray, m: int, pads: tuple[int, int],
             bias: np.ndarray | None = None, clip: tuple[float, float] | None = None, width: int = 1,
             addend: np.ndarray | None = None, act: str | None = None, groups: int = 1) -> bool:
    """:func:`conv` of a 3x3 stride-1 undilated convolution by Winograd F(m x m, 3 x 3) (``upk``
    from :func:`winograd_weights` with the same ``m`` and ``groups``). False (nothing done) when
    the arrays or the geometry do not fit."""
    if m not in WINOGRAD_G:
        return False
    return _conv_call("nc_wino", x5, upk, out5, (3, 3), (1, 1), (1, 1), pads, bias, clip, width, addend, act,
                      extra=(int(m), int(groups)))


def scale_weights(wpk: np.ndarray, scale: np.ndarray, out: np.ndarray, in_blocks: int, taps: int, out_blocks: int,
                  depthwise: bool = False) -> bool:
    """``out``: the packed weight ``wpk`` (:func:`pack_weights` of ``out_blocks`` output and
    ``in_blocks`` input blocks and ``taps`` = kh * kw, or :func:`pack_depthwise`) with input
    channel c scaled by ``scale[c]`` (``in_blocks * 16`` of them): a convolution of ``x * scale``
    (an SE block's gate) by the convolution of ``x``. False when the arrays do not fit."""
    return _entry("nc_scale_w", wpk, scale, out, int(in_blocks), int(taps), int(out_blocks), int(bool(depthwise)))


def conv_plain(x4: np.ndarray, wpk: np.ndarray, out5: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
               dilations: tuple[int, int], pads: tuple[int, int], bias: np.ndarray | None = None,
               clip: tuple[float, float] | None = None, width: int = 1, addend: np.ndarray | None = None,
               act: str | None = None) -> bool:
    """:func:`conv` of an NCHW ``x4`` (a network's first layer, on its 3 channels) into a blocked
    ``out5`` (``wpk`` from :func:`pack_plain`): the layout is entered without a reorder."""
    mod = _mod()
    if mod is None or x4.dtype != np.float32 or x4.ndim != 4 or not x4.flags.c_contiguous:
        return False
    return _conv_call("nc_conv_plain", x4, wpk, out5, kernel, strides, dilations, pads, bias, clip, width, addend,
                      act, x_ndim=4)


def depthwise(x5: np.ndarray, wpk: np.ndarray, out5: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
              dilations: tuple[int, int], pads: tuple[int, int], bias: np.ndarray | None = None,
              clip: tuple[float, float] | None = None, width: int = 1, addend: np.ndarray | None = None,
              act: str | None = None) -> bool:
    """The depthwise form of :func:`conv` (``wpk`` from :func:`pack_depthwise`)."""
    return _conv_call("nc_dwconv", x5, wpk, out5, kernel, strides, dilations, pads, bias, clip, width, addend, act)


#: pooling kinds of :func:`pool`
POOLS = {"max": 0, "avg_pad": 1, "avg": 2}


def pool(x5: np.ndarray, out5: np.ndarray, kind: str, kernel: tuple[int, int], strides: tuple[int, int],
         dilations: tuple[int, int], pads: tuple[int, int], width: int = 1) -> bool:
    """Max or average pooling of blocked arrays (``kind`` of :data:`POOLS`; ``avg_pad`` divides by
    the whole window, ``avg`` by the taps inside). False when the arrays do not fit."""
    if kind not in POOLS:
        return False
    return _entry("nc_pool", x5, POOLS[kind], out5, max(1, int(width)), _geometry(tuple(kernel), tuple(strides), tuple(dilations), tuple(pads)))


def _entry(entry: str, *args: Any) -> bool:
    """Call a kernel entry whose arrays it checks itself; False when it refuses them."""
    mod = _mod()
    if mod is None:
        return False
    try:
        getattr(mod, entry)(*args)
    except (TypeError, ValueError):
        return False
    return True


def group_norm(x5: np.ndarray, out5: np.ndarray, group_channels: int, scale: np.ndarray, bias: np.ndarray,
               epsilon: float, width: int = 1, relu: bool = False) -> bool:
    """``out5``: group normalization of the blocked ``x5``, the mean and variance over each group of
    ``group_channels`` channels (dividing 16, or whole blocks) and the plane, then ``scale`` and
    ``bias`` per channel (``C/16 * 16`` each), then max(0, .) with ``relu``. False when the arrays
    do not fit."""
    return _entry("nc_groupnorm", x5, out5, scale, bias, int(group_channels), float(epsilon), max(1, int(width)),
                  int(bool(relu)))


def global_average(x5: np.ndarray, out2: np.ndarray, width: int = 1) -> bool:
    """``out2 (N, CB * 16)``: the mean of each blocked plane. False when the arrays do not fit."""
    return _entry("nc_gap", x5, out2, max(1, int(width)))


def to_blocked(x4: np.ndarray, out5: np.ndarray, width: int = 1) -> bool:
    """NCHW ``x4`` into the blocked ``out5`` (the channels past C zeros). False when they do not fit."""
    return _entry("nc_reorder", x4, out5, max(1, int(width)), 0)


def from_blocked(x5: np.ndarray, out4: np.ndarray, width: int = 1) -> bool:
    """The blocked ``x5`` back into NCHW ``out4`` (its channel count: the padding is dropped)."""
    return _entry("nc_reorder", x5, out4, max(1, int(width)), 1)
