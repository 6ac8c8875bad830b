"""The blocked-layout kernels (ge_native.nchwc): odd convolution shapes against float64, the
epilogue, depthwise, pooling, the reorders, the same bits at every thread count, what they refuse.

On a CPU without AVX-512F or AVX2 + FMA each entry must refuse (return False, leave the output alone): the
cpu backend's kernels then run their NumPy form, which tests/kernels/test_nchwc_layout.py checks."""

import math

import numpy as np
import pytest

from ge_native import nchwc

RNG = np.random.default_rng(7)
EPS = float(np.finfo(np.float32).eps)

# (n, c, m, h, w, k, stride, pad (t, l, b, r), dilation)
CONVS = [
    (1, 16, 16, 1, 1, 1, 1, (0, 0, 0, 0), 1),
    (1, 32, 64, 9, 11, 3, 1, (1, 1, 1, 1), 1),
    (2, 16, 48, 7, 7, 3, 2, (1, 1, 1, 1), 1),
    (1, 20, 70, 13, 5, 1, 1, (0, 0, 0, 0), 1),   # channels that are not whole blocks
    (1, 256, 32, 6, 6, 1, 1, (0, 0, 0, 0), 1),   # several input-channel batches
    (1, 160, 80, 6, 7, 3, 1, (1, 1, 1, 1), 1),   # ... of a 3x3
    (1, 32, 32, 10, 10, 3, 1, (2, 2, 2, 2), 2),  # dilation
    (1, 48, 16, 5, 9, 5, 1, (0, 2, 1, 0), 1),    # asymmetric padding
    (1, 16, 16, 3, 3, 3, 1, (2, 2, 2, 2), 1),    # pads as wide as the plane
    (1, 64, 64, 56, 3, 1, 2, (0, 0, 0, 0), 1),   # a strided 1x1
    (3, 16, 112, 4, 30, 7, 3, (3, 3, 2, 2), 1),
    (1, 32, 16, 3, 61, 3, 1, (1, 1, 1, 1), 1),   # one output block: tiles of 24, 8 and fewer pixels
    (1, 16, 32, 2, 45, 1, 1, (0, 0, 0, 0), 1),   # two: tiles of 12
]


def blocked(x4):
    out = np.empty(nchwc.blocked_shape(x4.shape), np.float32)
    assert nchwc.to_blocked(np.ascontiguousarray(x4), out)
    return out


def plain(x5, c):
    out = np.empty((x5.shape[0], c, x5.shape[2], x5.shape[3]), np.float32)
    assert nchwc.from_blocked(x5, out)
    return out


def conv64(x, w, stride, pads, dil, group=1):
    """The convolution in float64, and the bound of its float32 rounding."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    pt, pl, pb, pr = pads
    oh = (h + pt + pb - dil * (kh - 1) - 1) // stride + 1
    ow = (wd + pl + pr - dil * (kw - 1) - 1) // stride + 1
    xp = np.zeros((n, c, h + pt + pb + stride, wd + pl + pr + stride))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    y = np.zeros((n, m, oh, ow))
    mag = np.zeros_like(y)
    for i in range(kh):
        for j in range(kw):
            xs = xp[:, :, i * dil:i * dil + stride * oh:stride, j * dil:j * dil + stride * ow:stride]
            for g in range(group):  # group g: input channels [g * cg, ...) to outputs [g * mg, ...)
                mg = m // group
                xg, wg = xs[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg, :, i, j]
                y[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", xg, wg)
                mag[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", np.abs(xg), np.abs(wg))
    return y, (cg * kh * kw + 4) * EPS * mag + 1e-30


ACTS = {None: lambda y: y, "sigmoid": lambda y: 1 / (1 + np.exp(-y)), "silu": lambda y: y / (1 + np.exp(-y)),
        "gelu": lambda y: 0.5 * y * (1 + np.vectorize(math.erf)(y / np.sqrt(2))),
        "hardswish": lambda y: y * np.clip(y / 6 + 0.5, 0, 1)}


def test_kernels_refuse_without_avx512_or_run_with_it():
    x = RNG.standard_normal((1, 16, 4, 4)).astype(np.float32)
    out = np.full((1, 1, 4, 4, 16), 7.0, np.float32)
    x5 = np.zeros((1, 1, 4, 4, 16), np.float32)
    ok = nchwc.to_blocked(x, x5)
    assert ok == nchwc.available()
    if not ok:
        assert not nchwc.conv(x5, nchwc.pack_weights(np.ones((16, 16, 1, 1), np.float32)), out, (1, 1), (1, 1),
                              (1, 1), (0, 0))
        assert (out == 7.0).all()  # refused: nothing written


needs_kernels = pytest.mark.skipif(not nchwc.available(), reason="checked by the refusal test on this CPU")


@needs_kernels
@pytest.mark.parametrize("case", CONVS, ids=lambda c: "x".join(map(str, c[:7])))
@pytest.mark.parametrize("act", [None, "silu"])
def test_conv_is_within_float_rounding_of_float64(case, act):
    n, c, m, h, wd, k, s, pads, d = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((m, c, k, k)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    ref, tol = conv64(x.astype(np.float64), w.astype(np.float64), s, pads, d)
    z = RNG.standard_normal(ref.shape).astype(np.float32)
    out = np.full((n, nchwc.blocks(m)) + ref.shape[2:] + (16,), np.nan, np.float32)
    assert nchwc.conv(blocked(x), nchwc.pack_weights(w), out, (k, k), (s, s), (d, d), pads[:2], nchwc.pad_bias(b, m),
                      clip=(-1.5, 2.5), width=2, addend=blocked(z), act=act)
    want = ACTS[act](np.clip(ref + b[None, :, None, None] + z, -1.5, 2.5))
    got = plain(out, m)
    assert np.all(np.abs(got - want) <= tol + 1e-6 * (1 + np.abs(want))), np.abs(got - want).max()
    # the padded lanes of the last block hold zeros + the padded bias (0): clip(0) then act(0)
    if m % 16:
        assert np.allclose(out[:, -1, ..., m % 16:], ACTS[act](np.clip(0.0, -1.5, 2.5)), atol=1e-7)


def winograd64(x, w, pads, m):
    """F(m x m, 3x3) of x and w in float64 with the kernel's matrices, and the first-order bound of
    its float32 rounding: the products summed over the channels at each point (|U| |V|), through
    |A^T| . |A|, times the length of that sum plus the transforms' few steps."""
    g = nchwc.WINOGRAD_G[m]
    r = m + 2
    bt = {2: np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
          4: np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                       [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)}[m]
    at = {2: np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64),
          4: np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
                      np.float64)}[m]
    n, c, h, wd = x.shape
    pt, pl, pb, pr = pads
    oh, ow = h + pt + pb - 2, wd + pl + pr - 2
    th, tw = -(-oh // m), -(-ow // m)
    xp = np.zeros((n, c, th * m + 2, tw * m + 2))
    xp[:, :, pt:pt + h, pl:pl + wd] = x[:, :, :th * m + 2 - pt, :tw * m + 2 - pl]
    tiles = np.lib.stride_tricks.sliding_window_view(xp, (r, r), axis=(2, 3))[:, :, ::m, ::m]  # n c th tw r r
    v = np.einsum("ai,nctwij,bj->nctwab", bt, tiles, bt)
    u = np.einsum("ai,mcij,bj->mcab", g, w, g)
    y = np.einsum("mcab,nctwab->nmtwab", u, v)
    mag = np.einsum("mcab,nctwab->nmtwab", np.abs(u), np.abs(v))
    out = np.einsum("pa,nmtwab,qb->nmtpwq", at, y, at).reshape(n, -1, th * m, tw * m)[:, :, :oh, :ow]
    bound = np.einsum("pa,nmtwab,qb->nmtpwq", np.abs(at), mag, np.abs(at)).reshape(n, -1, th * m, tw * m)
    return out, (c + 3 * r) * EPS * bound[:, :, :oh, :ow] + 1e-30


# (n, c, m, h, w, pads (t, l, b, r)): odd planes (a partial last tile), channels that are not
# whole blocks, pads other than 1 (asymmetric, none, wider than the window), batch 2
WINO = [(1, 16, 16, 8, 8, (1, 1, 1, 1)), (2, 32, 48, 9, 11, (1, 1, 1, 1)), (1, 20, 70, 7, 13, (0, 2, 1, 0)),
        (1, 64, 32, 5, 5, (0, 0, 0, 0)), (2, 48, 16, 3, 17, (2, 2, 2, 2)), (1, 160, 96, 14, 14, (1, 1, 1, 1))]


@needs_kernels
@pytest.mark.parametrize("case", WINO, ids=lambda c: "x".join(map(str, c[:5])))
@pytest.mark.parametrize("m", [2, 4])
def test_winograd_is_within_its_rounding_bound_of_float64(case, m):
    n, c, mo, h, wd, pads = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((mo, c, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(mo).astype(np.float32)
    ref, tol = winograd64(x.astype(np.float64), w.astype(np.float64), pads, m)
    direct, _ = conv64(x.astype(np.float64), w.astype(np.float64), 1, pads, 1)
    assert np.allclose(ref, direct)  # (the float64 algorithm is the convolution)
    z = RNG.standard_normal(ref.shape).astype(np.float32)
    outs = []
    for width in (1, 3):
        out = np.full((n, nchwc.blocks(mo)) + ref.shape[2:] + (16,), np.nan, np.float32)
        assert nchwc.winograd(blocked(x), nchwc.winograd_weights(w, m), out, m, pads[:2], nchwc.pad_bias(b, mo),
                              clip=(-2.5, 3.5), width=width, addend=blocked(z), act="silu")
        outs.append(out)
    want = ACTS["silu"](np.clip(ref + b[None, :, None, None] + z, -2.5, 3.5))
    got = plain(outs[0], mo)
    # (silu's slope is at most 1.1: the bound carries through it)
    assert np.all(np.abs(got - want) <= 1.1 * tol + 1e-6 * (1 + np.abs(want))), np.abs(got - want).max()
    assert np.array_equal(outs[0], outs[1])  # the same bits at every thread count
    if mo % 16:
        assert np.allclose(outs[0][:, -1, ..., mo % 16:], ACTS["silu"](np.clip(0.0, -2.5, 3.5)), atol=1e-7)


@needs_kernels
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("case", [(1, 128, 128, 2, 12, 10), (2, 96, 192, 3, 7, 9), (1, 64, 32, 2, 5, 6)],
                         ids=lambda c: "x".join(map(str, c)))
def test_grouped_winograd_is_within_float_rounding_of_float64(case, m):
    n, c, mo, g, h, wd = case  # (RegNet's groups: 64 channels a group; 3 groups of 32 -> 64; 32 -> 16)
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((mo, c // g, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(mo).astype(np.float32)
    ref, tol = conv64(x.astype(np.float64), w.astype(np.float64), 1, (1, 1, 1, 1), 1, group=g)
    outs = []
    for width in (1, 2):
        out = np.full((n, mo // 16, h, wd, 16), np.nan, np.float32)
        assert nchwc.winograd(blocked(x), nchwc.winograd_weights(w, m, groups=g), out, m, (1, 1),
                              nchwc.pad_bias(b, mo), width=width, groups=g)
        outs.append(out)
    got = plain(outs[0], mo)
    # (Winograd's transforms multiply the direct sum's rounding by up to 3 (F(2x2)) or 10 (F(4x4)))
    assert np.all(np.abs(got - ref - b[None, :, None, None]) <= (3 if m == 2 else 10) * tol + 1e-6), \
        np.abs(got - ref - b[None, :, None, None]).max()
    assert np.array_equal(outs[0], outs[1])
    out = np.zeros_like(outs[0])  # a weight transformed for other groups, a group count that splits blocks
    assert not nchwc.winograd(blocked(x), nchwc.winograd_weights(w, m, groups=g), out, m, (1, 1), groups=2 * g)
    assert not (out != 0).any()


@needs_kernels
def test_winograd_rounding_is_the_direct_sums_for_f2_and_bounded_for_f4():
    """F(2x2)'s transforms (0, +-1, +-1/2) keep the rounding of the direct sum; F(4x4)'s larger
    coefficients (up to 8) cost up to ten times more (8x here), never orders of magnitude."""
    x = RNG.standard_normal((1, 256, 12, 12)).astype(np.float32)
    w = (RNG.standard_normal((64, 256, 3, 3)) / 48).astype(np.float32)
    ref, _ = conv64(x.astype(np.float64), w.astype(np.float64), 1, (1, 1, 1, 1), 1)
    errs = {}
    for m in (0, 2, 4):
        out = np.empty((1, 4, 12, 12, 16), np.float32)
        if m:
            assert nchwc.winograd(blocked(x), nchwc.winograd_weights(w, m), out, m, (1, 1))
        else:
            assert nchwc.conv(blocked(x), nchwc.pack_weights(w), out, (3, 3), (1, 1), (1, 1), (1, 1))
        errs[m] = np.abs(plain(out, 64) - ref).max() / np.abs(ref).max()
    assert errs[2] < 3 * errs[0] and errs[4] < 20 * errs[0] and errs[4] < 3e-5, errs


@needs_kernels
def test_winograd_refuses_what_it_cannot_run():
    x5 = np.zeros((1, 2, 6, 6, 16), np.float32)
    w = RNG.standard_normal((32, 32, 3, 3)).astype(np.float32)
    u2, u4 = nchwc.winograd_weights(w, 2), nchwc.winograd_weights(w, 4)
    out = np.zeros((1, 2, 6, 6, 16), np.float32)
    assert nchwc.winograd(x5, u2, out, 2, (1, 1)) and nchwc.winograd(x5, u4, out, 4, (1, 1))
    out[...] = 7.0
    assert not nchwc.winograd(x5, u4, out, 2, (1, 1))  # a weight transformed for the other tile
    assert not nchwc.winograd(x5, u2[:-1], out, 2, (1, 1))
    assert not nchwc.winograd(x5, u2, out, 3, (1, 1))
    assert not nchwc.winograd(x5, u2, out[:, :1], 2, (1, 1))  # output blocks the weight does not have
    assert not nchwc.winograd(x5, u2, x5, 2, (1, 1))  # the output over the input
    assert not nchwc.winograd(x5, u2, out, 2, (-1, 1))
    assert (out == 7.0).all()
    with pytest.raises(ValueError):
        nchwc.winograd_weights(w[:, :, :2], 2)

# grouped: (n, c, m, groups, h, w, k, stride, pad, dilation); each group whole blocks
GROUPED = [
    (1, 128, 128, 2, 9, 13, 3, 1, (1, 1, 1, 1), 1),   # RegNet's: 64 channels a group (one tile group each)
    (2, 96, 96, 3, 8, 7, 3, 2, (1, 1, 1, 1), 1),      # 32 a group: tile groups of 2 blocks
    (1, 64, 128, 4, 6, 30, 3, 1, (1, 1, 1, 1), 1),    # 16 in, 32 out a group; one-block input groups
    (1, 160, 320, 2, 5, 6, 1, 1, (0, 0, 0, 0), 1),    # 80 in and 160 out a group: 5 and 10 blocks
    (1, 512, 512, 8, 4, 5, 3, 1, (2, 2, 2, 2), 2),    # many groups, dilation
]


@needs_kernels
@pytest.mark.parametrize("case", GROUPED, ids=lambda c: "x".join(map(str, c[:8])))
def test_grouped_conv_is_within_float_rounding_of_float64(case):
    n, c, m, g, h, wd, k, s, pads, d = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((m, c // g, k, k)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    ref, tol = conv64(x.astype(np.float64), w.astype(np.float64), s, pads, d, group=g)
    outs = []
    for width in (1, 3):
        out = np.full((n, m // 16) + ref.shape[2:] + (16,), np.nan, np.float32)
        assert nchwc.conv(blocked(x), nchwc.pack_weights(w, groups=g), out, (k, k), (s, s), (d, d), pads[:2],
                          nchwc.pad_bias(b, m), width=width, act="silu", groups=g)
        outs.append(out)
    want = ACTS["silu"](ref + b[None, :, None, None])
    got = plain(outs[0], m)
    assert np.all(np.abs(got - want) <= tol + 1e-6 * (1 + np.abs(want))), np.abs(got - want).max()
    assert np.array_equal(outs[0], outs[1])
    # a group count that does not split the blocks, or a weight packed for other groups, is refused
    out = np.zeros_like(outs[0])
    assert not nchwc.conv(blocked(x), nchwc.pack_weights(w, groups=g), out, (k, k), (s, s), (d, d), pads[:2],
                          groups=2 * g)
    assert not (out != 0).any()
    with pytest.raises(ValueError):
        nchwc.pack_weights(w[:, :-1], groups=g)


# depthwise planes large enough that a task's rows are not copied into a padded scratch first
# (the border tiles test their taps instead): at one thread each task is a whole plane
DEPTHWISE_LARGE = [(2, 64, 64, 90, 70, 3, 1, (1, 1, 1, 1), 1), (2, 64, 64, 75, 81, 5, 2, (2, 1, 2, 2), 1),
                   (1, 96, 96, 20, 23, 7, 1, (3, 3, 3, 3), 1), (1, 40, 40, 16, 17, 5, 1, (2, 2, 2, 2), 1)]  # (the input rows in registers)


@needs_kernels
@pytest.mark.parametrize("case", [c for c in CONVS if c[0] * c[1] * c[3] * c[4] < 5000] + DEPTHWISE_LARGE,
                         ids=lambda c: "x".join(map(str, c[:7])))
def test_depthwise_is_within_float_rounding(case):
    n, c, _, h, wd, k, s, pads, d = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((c, 1, k, k)).astype(np.float32)
    ref, tol = conv64(x.astype(np.float64), w.astype(np.float64), s, pads, d, group=c)
    outs = []
    for width in (1, 2):
        out = np.empty((n, nchwc.blocks(c)) + ref.shape[2:] + (16,), np.float32)
        assert nchwc.depthwise(blocked(x), nchwc.pack_depthwise(w), out, (k, k), (s, s), (d, d), pads[:2], clip=(0, 6),
                               width=width)
        outs.append(out)
    got = plain(outs[0], c)
    assert np.all(np.abs(got - np.clip(ref, 0, 6)) <= tol + 1e-6), np.abs(got - np.clip(ref, 0, 6)).max()
    assert np.array_equal(outs[0], outs[1])  # (a copied row or a checked tile: the same sums)


@needs_kernels
def test_every_thread_count_gives_the_same_bits():
    x5 = blocked(RNG.standard_normal((2, 64, 15, 17)).astype(np.float32))
    w = nchwc.pack_weights(RNG.standard_normal((96, 64, 3, 3)).astype(np.float32))
    outs = []
    for width in (1, 2, 3, 8):
        o = np.empty((2, 6, 15, 17, 16), np.float32)
        assert nchwc.conv(x5, w, o, (3, 3), (1, 1), (1, 1), (1, 1), width=width)
        outs.append(o)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


POOL_GEOMETRY = [((3, 3), (2, 2), (1, 1), (1, 1, 1, 1)), ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0)),
                 ((3, 3), (1, 1), (2, 2), (2, 2, 2, 2)), ((5, 3), (1, 2), (1, 1), (2, 1, 2, 1))]


@needs_kernels
@pytest.mark.parametrize("kind,geo", [(kind, geo) for kind in ("max", "avg_pad", "avg") for geo in POOL_GEOMETRY
                                      if kind == "max" or geo[2] == (1, 1)])  # (average pooling: no dilation)
def test_pooling_matches_a_float64_window(kind, geo):
    import torch

    k, s, d, pads = geo
    x = RNG.standard_normal((2, 24, 11, 9)).astype(np.float32)
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(), (pads[1], pads[3], pads[0], pads[2]),
                                 value=-math.inf if kind == "max" else 0.0)
    if kind == "max":
        ref = torch.nn.functional.max_pool2d(xt, k, s, 0, d).numpy()
    else:
        ones = torch.nn.functional.pad(torch.ones_like(torch.from_numpy(x)).double(), (pads[1], pads[3], pads[0], pads[2]))
        sums = torch.nn.functional.avg_pool2d(xt, k, s, 0) * (k[0] * k[1])
        cnt = torch.nn.functional.avg_pool2d(ones, k, s, 0) * (k[0] * k[1]) if kind == "avg" else k[0] * k[1]
        ref = (sums / cnt).numpy()
    out = np.empty((2, 2) + ref.shape[2:] + (16,), np.float32)
    assert nchwc.pool(blocked(x), out, kind, k, s, d, pads[:2])
    assert np.allclose(plain(out, 24), ref, rtol=1e-6, atol=1e-6)


@needs_kernels
def test_global_average_and_reorders_round_trip():
    x = RNG.standard_normal((3, 40, 7, 5)).astype(np.float32)
    x5 = blocked(x)
    assert x5.shape == (3, 3, 7, 5, 16) and (x5[:, 2, ..., 8:] == 0).all()  # 40 = 2.5 blocks: zeros after
    assert np.array_equal(plain(x5, 40), x)
    g = np.empty((3, 48), np.float32)
    assert nchwc.global_average(x5, g)
    assert np.allclose(g[:, :40], x.astype(np.float64).mean(axis=(2, 3)), rtol=1e-6, atol=1e-7)


@needs_kernels
def test_bad_arrays_and_geometry_are_refused():
    x5 = np.zeros((1, 2, 5, 5, 16), np.float32)
    w = nchwc.pack_weights(np.ones((32, 32, 3, 3), np.float32))
    out = np.zeros((1, 2, 5, 5, 16), np.float32)
    geo = ((3, 3), (1, 1), (1, 1), (1, 1))
    assert nchwc.conv(x5, w, out, *geo)
    assert not nchwc.conv(x5, w[:-1], out, *geo)  # a weight of the wrong size
    assert not nchwc.conv(x5, w, out[:, :1], *geo)  # ... for these output channels
    assert not nchwc.conv(x5.astype(np.float64), w, out, *geo)
    assert not nchwc.conv(x5, w, np.zeros((1, 2, 5, 5, 8), np.float32), *geo)  # not 16 lanes
    assert not nchwc.conv(x5, w, out, (3, 3), (0, 1), (1, 1), (1, 1))  # stride 0
    assert not nchwc.conv(x5, w, out, (3, 3), (1, 1), (1, 1), (-1, 1))  # negative padding
    assert not nchwc.conv(x5, w, x5, *geo)  # the output over the input
    assert not nchwc.conv(x5, w, out, *geo, addend=out)  # the addend over the output
    assert not nchwc.conv(x5, w, out, *geo, bias=np.zeros(16, np.float32))  # a bias too short
    assert not nchwc.conv(x5, w, out, *geo, act="tanh")
    assert not nchwc.pool(x5, np.zeros((1, 1, 5, 5, 16), np.float32), "max", *geo)  # blocks must agree
    assert not nchwc.to_blocked(np.zeros((1, 33, 5, 5), np.float32), x5)  # 33 channels are 3 blocks



@needs_kernels
@pytest.mark.parametrize("m", [2, 4])
def test_winograd_weights_pack_the_same_natively_and_in_numpy(m, monkeypatch):
    w = RNG.standard_normal((70, 40, 3, 3)).astype(np.float32)
    wg = RNG.standard_normal((96, 16, 3, 3)).astype(np.float32)  # 3 groups of 16 -> 32
    fast = nchwc.winograd_weights(w, m, in_blocks=4), nchwc.winograd_weights(wg, m, groups=3)
    monkeypatch.setattr(nchwc, "_mod", lambda: None)
    slow = nchwc.winograd_weights(w, m, in_blocks=4), nchwc.winograd_weights(wg, m, groups=3)
    assert fast[0].shape == slow[0].shape == ((m + 2) ** 2 * 80 * 64,)
    assert fast[1].shape == slow[1].shape == ((m + 2) ** 2 * 96 * 16,)
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # (float64 sums in another order)
        assert a.ctypes.data % 64 == 0


@needs_kernels
@pytest.mark.parametrize("case", [(1, 64, 7, 9, 32), (2, 256, 5, 5, 32), (1, 1024, 3, 4, 32), (1, 32, 6, 6, 4),
                                  (1, 48, 3, 3, 48), (2, 96, 20, 13, 3)], ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("relu", [False, True])
def test_group_norm_matches_float64(case, relu):
    n, c, h, w, g = case  # (groups of 2, 8, 32, 8, 1 and 32 channels: inside a block or whole blocks)
    x = (RNG.standard_normal((n, c, h, w)) * 3 + 2).astype(np.float32)  # (a mean far from 0)
    sc, bi = RNG.standard_normal(c).astype(np.float32), RNG.standard_normal(c).astype(np.float32)
    xg = x.astype(np.float64).reshape(n, g, -1)
    ref = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    ref = ref * sc[None, :, None, None] + bi[None, :, None, None]
    ref = np.maximum(ref, 0) if relu else ref
    outs = []
    for width in (1, 2):
        out = np.full(nchwc.blocked_shape(x.shape), np.nan, np.float32)
        assert nchwc.group_norm(blocked(x), out, c // g, nchwc.pad_bias(sc, c), nchwc.pad_bias(bi, c), 1e-5, width, relu)
        outs.append(out)
    np.testing.assert_allclose(plain(outs[0], c), ref, rtol=1e-5, atol=2e-5 * np.abs(sc).max())
    assert np.array_equal(outs[0], outs[1])


@needs_kernels
def test_group_norm_refuses_groups_that_straddle_blocks():
    x5 = blocked(RNG.standard_normal((1, 48, 4, 4)).astype(np.float32))
    out = np.zeros_like(x5)
    ones, zeros = np.ones(48, np.float32), np.zeros(48, np.float32)
    assert nchwc.group_norm(x5, out, 16, ones, zeros, 1e-5)
    out[...] = 7.0
    assert not nchwc.group_norm(x5, out, 24, ones, zeros, 1e-5)  # 24 channels a group: across two blocks
    assert not nchwc.group_norm(x5, out, 6, ones, zeros, 1e-5)  # 6 does not divide 16
    assert not nchwc.group_norm(x5, out, 16, ones[:32], zeros, 1e-5)  # a scale too short
    assert not nchwc.group_norm(x5, out, 16, ones, zeros, -1.0)
    assert not nchwc.group_norm(x5, x5, 16, ones, zeros, 1e-5)  # in place
    assert (out == 7.0).all()
