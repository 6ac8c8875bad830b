"""GE's bf16 convolution over the NCHWc layout (ge_native.bf16.conv_nchwc): every variant this
machine runs against float64 references of the bf16-rounded inputs, against each other, across
thread counts, its epilogue, its packed weight, its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from ge_native import activations, bf16

from .switch import probe

RUNS = bf16.runnable()
#: (N, C, H, W, M, KH, KW, strides, dilations, pads (top, left, bottom, right)): odd channel
#: counts, 1x1 / 3x3 / 7x7, strides 1 and 2, dilation 2, asymmetric pads, OW and M off 16 and 32
CASES = [
    (1, 3, 15, 17, 20, 7, 7, (2, 2), (1, 1), (3, 3, 2, 3)),
    (2, 17, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 40, 10, 13, 33, 3, 3, (2, 2), (2, 2), (2, 1, 0, 2)),
    (1, 64, 8, 8, 64, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0)),
    (2, 17, 7, 35, 17, 1, 1, (2, 1), (1, 1), (0, 0, 0, 0)),
    (1, 40, 12, 12, 16, 3, 3, (1, 2), (1, 1), (0, 2, 1, 0)),
    (1, 32, 6, 37, 96, 3, 1, (1, 1), (2, 1), (2, 0, 2, 0)),
]


def _blocked(x: np.ndarray) -> np.ndarray:
    """NCHW ``x`` in the blocked layout (the channels past C zeros)."""
    n, c, h, w = x.shape
    cb = -(-c // 16)
    full = np.zeros((n, cb * 16, h, w), np.float32)
    full[:, :c] = x
    return np.ascontiguousarray(full.reshape(n, cb, 16, h, w).transpose(0, 1, 3, 4, 2))


def _case(n, c, h, w, m, kh, kw, strides, dilations, pads, seed=0):
    rng = np.random.default_rng(seed + 131 * c + 7 * m + kh)
    x5 = _blocked(rng.standard_normal((n, c, h, w)).astype(np.float32))
    wt = rng.standard_normal((m, c, kh, kw)).astype(np.float32)
    oh = bf16.conv_out_size(h, kh, strides[0], dilations[0], pads[0], pads[2])
    ow = bf16.conv_out_size(w, kw, strides[1], dilations[1], pads[1], pads[3])
    return x5, wt, bf16.PackedConv(wt, x5.shape[1]), (n, -(-m // 16), oh, ow, 16)


def _bound(x5, wt, strides, pads, dilations, plain=False) -> np.ndarray:
    """float32 summation's error bound over the k of the rounded inputs' products (a plain
    input's k: the real channels only)."""
    k = wt.shape[2] * wt.shape[3] * (wt.shape[1] if plain else x5.shape[1] * 16)
    absdot = bf16.conv_reference(np.abs(x5), np.abs(wt), strides, pads, dilations)
    return 2.0 * (k + 2) * 2.0 ** -24 * absdot + 1e-30


def _run(x5, pk, shape, variant, strides, pads, dilations, width=1, **kw) -> np.ndarray:
    out = np.full(shape, np.nan, np.float32)
    assert bf16.conv_nchwc(x5, pk, out, strides, pads, dilations, width=width, variant=variant, **kw)
    return out


@pytest.mark.parametrize("variant", RUNS)
def test_geometries_match_the_float64_reference(variant):
    for n, c, h, w, m, kh, kw, s, d, p in CASES:
        x5, wt, pk, shape = _case(n, c, h, w, m, kh, kw, s, d, p)
        out = _run(x5, pk, shape, variant, s, p, d)
        err = np.abs(out - bf16.conv_reference(x5, wt, s, p, d))
        # the padded lanes (M .. blocks * 16) are zeros: zero weights
        assert np.all(err <= _bound(x5, wt, s, p, d)), (variant, c, m, kh, float(err.max()))


@pytest.mark.parametrize("variant", RUNS)
@pytest.mark.parametrize("act", [None, *bf16.ACTIVATIONS])
def test_every_epilogue(variant, act):
    geo = (2, 17, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 0, 1, 2))
    s, d, p = geo[7], geo[8], geo[9]
    x5, wt, pk, shape = _case(*geo, seed=3)
    rng = np.random.default_rng(5)
    bias = np.linspace(-1.5, 1.5, 40, dtype=np.float32)
    padded = np.concatenate([bias, np.zeros(8, np.float32)])
    add = rng.standard_normal(shape).astype(np.float32)
    ref = bf16.conv_reference(x5, wt, s, p, d)
    tol = 2.0 * _bound(x5, wt, s, p, d)
    for b, clip, addend in ((None, None, None), (bias, None, None), (padded, (-1.0, 2.5), None),
                            (None, None, add), (bias, (0.0, 6.0), add), (padded, None, add)):
        y = ref + (0.0 if b is None else padded.reshape(3, 1, 1, 16).astype(np.float64))
        y = y + (0.0 if addend is None else addend)
        if clip is not None:
            y = np.clip(y, *clip)
        if act is not None:
            y = activations.TABLE[act].np(y)
        out = _run(x5, pk, shape, variant, s, p, d, bias=b, clip=clip, act=act, addend=addend)
        err = np.abs(out - y)
        assert np.all(err <= tol + 2e-6 * np.maximum(1.0, np.abs(y))), (variant, act, clip, float(err.max()))


def test_the_variants_agree():
    for geo in (CASES[1], CASES[2], CASES[6]):
        s, d, p = geo[7], geo[8], geo[9]
        x5, wt, pk, shape = _case(*geo, seed=7)
        scalar = _run(x5, pk, shape, "scalar", s, p, d, bias=np.ones(geo[4], np.float32))
        for v in RUNS:
            got = _run(x5, pk, shape, v, s, p, d, bias=np.ones(geo[4], np.float32))
            assert np.all(np.abs(got - scalar) <= 2.0 * _bound(x5, wt, s, p, d)), v
        if "avx512_bf16" in RUNS:  # the scalar form sums in VDPBF16PS's order
            got = _run(x5, pk, shape, "avx512_bf16", s, p, d, bias=np.ones(geo[4], np.float32))
            assert np.array_equal(got.view(np.uint32), scalar.view(np.uint32))


@pytest.mark.parametrize("variant", RUNS)
def test_bits_are_the_same_at_every_width(variant):
    for geo in (CASES[1], (1, 64, 9, 40, 96, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))):
        s, d, p = geo[7], geo[8], geo[9]
        x5, wt, pk, shape = _case(*geo, seed=9)
        for kw in ({}, {"act": "silu", "addend": np.ones(shape, np.float32)}):
            one = _run(x5, pk, shape, variant, s, p, d, **kw)
            for width in (2, 3):
                assert np.array_equal(_run(x5, pk, shape, variant, s, p, d, width=width, **kw).view(np.uint32),
                                      one.view(np.uint32)), (variant, geo, width)


def _im2col(x5: np.ndarray, kh: int, kw: int, strides, pads, dilations) -> np.ndarray:
    """Each image's rows of A as the conv reads them: (N, OH * OW, kh * kw * in_blocks * 16) over
    (kh, kw, block, channel), zeros for the taps outside the input."""
    n, ib, h, w, _ = x5.shape
    (sh, sw), (top, left, bottom, right), (dh, dw) = strides, pads, dilations
    oh, ow = bf16.conv_out_size(h, kh, sh, dh, top, bottom), bf16.conv_out_size(w, kw, sw, dw, left, right)
    xp = np.pad(x5, ((0, 0), (0, 0), (top, max(0, bottom)), (left, max(0, right)), (0, 0)))
    taps = [xp[:, :, a * dh: a * dh + (oh - 1) * sh + 1: sh, b * dw: b * dw + (ow - 1) * sw + 1: sw]
            for a in range(kh) for b in range(kw)]  # each (N, ib, OH, OW, 16)
    cols = np.stack(taps, axis=1).transpose(0, 3, 4, 1, 2, 5)  # (N, OH, OW, taps, ib, 16)
    return np.ascontiguousarray(cols.reshape(n, oh * ow, -1), np.float32)


@pytest.mark.parametrize("variant", RUNS)
def test_a_conv_has_the_bits_of_the_gemm_of_its_rows(variant):
    """A conv of several taps (the vector variants round its input once into a padded NHWC copy
    and copy rows from it) or of one (rows rounded as gathered) sums each output as the GEMM of
    its rows of A by the same packed matrix: the same bits, with the epilogue, at every width;
    7x7 and 6x8 outputs end in row blocks of 17 and 16 rows (AMX computes only the upper half
    of a block of up to 16)."""
    for n, c, h, w, m, kh, kw, s, d, p in (CASES[1], CASES[2], CASES[5], CASES[6],
                                           (1, 48, 7, 7, 70, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
                                           (1, 32, 11, 15, 40, 3, 3, (2, 2), (1, 1), (1, 1, 0, 0)),
                                           (1, 64, 6, 8, 33, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))):
        x5, wt, pk, shape = _case(n, c, h, w, m, kh, kw, s, d, p, seed=13)
        bias = np.linspace(-1.0, 2.0, m, dtype=np.float32)
        rows = _im2col(x5, kh, kw, s, p, d)
        for width in (1, 2, 3):
            out = _run(x5, pk, shape, variant, s, p, d, width=width, bias=bias, act="gelu")
            got = out.transpose(0, 2, 3, 1, 4).reshape(n, rows.shape[1], -1)[:, :, :m]
            for i in range(n):
                want = np.full((rows.shape[1], m), np.nan, np.float32)
                assert bf16.matmul(rows[i], pk.packed, want, bias=bias, act="gelu", variant=variant)
                assert np.array_equal(got[i].view(np.uint32), want.view(np.uint32)), (variant, c, kh, width)


def test_the_packed_weight_is_a_packed_matrix_and_wraps_again_without_a_copy():
    m, c, kh, kw = 40, 17, 3, 3
    wt = np.random.default_rng(1).standard_normal((m, c, kh, kw)).astype(np.float32)
    pk = bf16.PackedConv(wt, 2)
    assert pk.shape == (m, c, kh, kw) and pk.in_blocks == 2 and pk.data.dtype == np.uint16
    # k runs over (kh, kw, block, 16 channels), zeros for the channels past C
    rows = np.zeros((kh, kw, 32, m), np.float32)
    rows[:, :, :c] = wt.transpose(2, 3, 1, 0)
    assert np.array_equal(pk.data, bf16.PackedB(rows.reshape(-1, m)).data)
    assert pk.data.shape == (2, 9 * 32 // 2, 64)
    stored = pk.data.copy()
    stored.setflags(write=False)
    again = bf16.PackedConv.from_data(stored, (m, c, kh, kw), 2)
    assert np.shares_memory(again.data, stored) and again.shape == pk.shape and again.in_blocks == 2
    x5, _, _, shape = _case(1, c, 9, 11, m, kh, kw, (1, 1), (1, 1), (1, 1, 1, 1))
    want = _run(x5, pk, shape, RUNS[0], (1, 1), (1, 1, 1, 1), (1, 1))
    got = _run(x5, again, shape, RUNS[0], (1, 1), (1, 1, 1, 1), (1, 1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(stored, pk.data)
    for data, shp, ib in ((stored, (m, c, kh, kw), 3), (stored, (m + 32, c, kh, kw), 2), (stored, (m, c, 1, 1), 2),
                          (stored, (m, 40, kh, kw), 2), (stored.astype(np.int16), (m, c, kh, kw), 2),
                          (stored[:, :, ::2], (m, c, kh, kw), 2)):
        with pytest.raises(ValueError):
            bf16.PackedConv.from_data(data, shp, ib)
    with pytest.raises(ValueError):
        bf16.PackedConv(wt, 1)  # one block does not hold 17 channels
    with pytest.raises(ValueError):
        bf16.PackedConv(wt.astype(np.float64), 2)


def test_bad_arrays_are_refused_without_a_write():
    geo = (1, 17, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1))
    x5, wt, pk, shape = _case(*geo)
    s, d, p = geo[7], geo[8], geo[9]
    out = np.full(shape, 7.0, np.float32)
    wide = np.zeros(shape[:-1] + (32,), np.float32)  # wide[..., :16]: the right shape, not contiguous
    calls = [
        lambda: bf16.conv_nchwc(x5.astype(np.float64), pk, out, s, p, d),
        lambda: bf16.conv_nchwc(x5[:, :1].copy(), pk, out, s, p, d),
        lambda: bf16.conv_nchwc(x5[:, :, :, ::2], pk, out, s, p, d),
        lambda: bf16.conv_nchwc(x5, pk, out[:, :, 1:], s, p, d),
        lambda: bf16.conv_nchwc(x5, pk, out[:, :2], s, p, d),
        lambda: bf16.conv_nchwc(x5, pk, wide[..., :16], s, p, d),
        lambda: bf16.conv_nchwc(x5, pk, out, (2, 2), p, d),
        lambda: bf16.conv_nchwc(x5, pk, out, (0, 1), p, d),
        lambda: bf16.conv_nchwc(x5, pk, out, s, (1, 1, -1, 3), d),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, (1, 0)),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, d, bias=np.zeros(41, np.float32)),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, d, bias=np.zeros(40)),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, d, addend=np.zeros(shape)),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, d, addend=np.zeros((2, *shape[1:]), np.float32)),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, d, addend=wide[..., :16]),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, d, act="tanh"),
        lambda: bf16.conv_nchwc(x5, pk, out, s, p, d, variant="sse9"),
        lambda: bf16.conv_nchwc(x5, bf16.PackedB(np.ones((16, 40), np.float32)), out, s, p, d),
        lambda: bf16.conv_nchwc(x5, bf16.PackedConv(wt, 3), out, s, p, d),
    ]
    for i, call in enumerate(calls):
        assert call() is False, i
    assert np.all(out == 7.0)
    # the output overlapping the input
    room = np.zeros(x5.size * 4, np.float32)
    xin = room[: x5.size].reshape(x5.shape)
    assert bf16.conv_nchwc(xin, pk, room[:int(np.prod(shape))].reshape(shape), s, p, d) is False
    # the C entry checks again: it raises, it does not crash
    mod = bf16._mod()
    geo_arr = np.array([3, 3, 1, 1, 1, 1, 1, 1, 1, 1], np.int64)
    good = [x5, pk.data, out, np.zeros(48, np.float32), 1, 0, 0.0, 0.0, 1, 0, bf16._CODES[RUNS[0]], geo_arr, None]
    mod.bf_conv(*good)
    assert np.isfinite(out).all()
    out[...] = 7.0
    bad = {
        0: [x5[:, :, :, :10].copy(), x5.reshape(1, 2, 9, 11, 4, 4), x5[..., :8].copy()],
        1: [pk.data[:1].copy(), pk.data[:, :-1].copy(), pk.data.astype(np.int16)],
        2: [out[:, :, :-1].copy(), out[:, :2].copy(), np.zeros((2, 3, 9, 11, 16), np.float32)],
        3: [np.zeros(40, np.float32)],
        10: [3, -1],
        11: [geo_arr[:9].copy(), np.array([3, 3, 0, 1, 1, 1, 1, 1, 1, 1]), np.array([3, 3, 1, 1, 1, 1, -1, 1, 1, 1]),
             np.array([3, 3, 1, 1, 1, 1, 1, 1, 0, 1]), np.array([5, 3, 1, 1, 1, 1, 1, 1, 1, 1])],
        12: [np.zeros((1, 3, 9, 10, 16), np.float32), out.astype(np.float64)],
    }
    for i, values in bad.items():
        for v in values:
            args = list(good)
            args[i] = v
            with pytest.raises((TypeError, ValueError)):
                mod.bf_conv(*args)
    assert np.all(out == 7.0)


_PROBE = """
import json, numpy as np
from ge_native import bf16
x5 = np.cos(np.arange(2 * 9 * 11 * 16, dtype=np.float32)).reshape(1, 2, 9, 11, 16)
w = np.sin(np.arange(40 * 32 * 9, dtype=np.float32)).reshape(40, 32, 3, 3)
out = np.zeros((1, 3, 9, 11, 16), np.float32)
ran = bf16.conv_nchwc(x5, bf16.PackedConv(w, 2), out, (1, 1), (1, 1, 1, 1), (1, 1))
print(json.dumps({"isa": bf16.isa(), "ran": ran, "bits": out.view(np.uint32).reshape(-1).tolist()}))
"""


def _probe(value: str | None) -> dict:
    return probe(_PROBE, value)


def test_the_dispatch_runs_the_variant_the_switch_names():
    x5 = np.cos(np.arange(2 * 9 * 11 * 16, dtype=np.float32)).reshape(1, 2, 9, 11, 16)
    pk = bf16.PackedConv(np.sin(np.arange(40 * 32 * 9, dtype=np.float32)).reshape(40, 32, 3, 3), 2)
    default = _probe(None)
    assert default["isa"] == RUNS[0] and default["ran"]
    for v in RUNS:
        got = _probe(v)
        assert got["isa"] == v and got["ran"]
        want = _run(x5, pk, (1, 3, 9, 11, 16), v, (1, 1), (1, 1, 1, 1), (1, 1))
        assert got["bits"] == want.view(np.uint32).reshape(-1).tolist(), v
    assert _probe("0")["ran"] is False
    mod = bf16._mod()
    out = np.zeros((1, 3, 9, 11, 16), np.float32)
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 1, 1], np.int64)
    for v in bf16.VARIANTS:
        if v not in RUNS:  # a variant this CPU lacks: refused, and the switch naming it falls back
            assert bf16.conv_nchwc(x5, pk, out, (1, 1), (1, 1, 1, 1), (1, 1), variant=v) is False
            with pytest.raises(ValueError):
                mod.bf_conv(x5, pk.data, out, np.zeros(1, np.float32), 0, 0, 0.0, 0.0, 1, 0, bf16._CODES[v], geo, None)
            assert _probe(v)["isa"] == RUNS[0]


@pytest.mark.parametrize("variant", RUNS)
def test_empty_extents(variant):
    x5, wt, pk, shape = _case(2, 17, 5, 6, 20, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1))
    assert bf16.conv_nchwc(x5[:0], pk, np.zeros((0, *shape[1:]), np.float32), (1, 1), (1, 1, 1, 1), (1, 1),
                           variant=variant)
    # no input block: the sums are zeros, the bias stays
    empty = bf16.PackedConv(np.zeros((20, 0, 3, 3), np.float32), 0)
    out = np.full(shape, np.nan, np.float32)
    bias = np.arange(20, dtype=np.float32)
    assert bf16.conv_nchwc(np.zeros((2, 0, 5, 6, 16), np.float32), empty, out, (1, 1), (1, 1, 1, 1), (1, 1),
                           bias=bias, variant=variant)
    want = np.zeros(32, np.float32)
    want[:20] = bias
    assert np.array_equal(out, np.broadcast_to(want.reshape(2, 1, 1, 16), shape))


#: plain NCHW stems (PackedConv(w, 0)): C of 1 .. 16, 7x7/2 as ResNet's, dilation, asymmetric
#: pads, a kw * C run past 32 values (16 channels x 3), OW and M off 16 and 32
PLAIN = [
    (1, 3, 23, 21, 20, 7, 7, (2, 2), (1, 1), (3, 3, 2, 3)),
    (2, 1, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 16, 10, 13, 33, 3, 3, (2, 2), (2, 2), (2, 1, 0, 2)),
    (1, 5, 6, 37, 96, 3, 1, (1, 1), (2, 1), (2, 0, 2, 0)),
    (1, 4, 9, 9, 17, 3, 3, (1, 2), (1, 2), (0, 2, 1, 0)),
    (2, 3, 5, 70, 16, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0)),
]


def _plain(n, c, h, w, m, kh, kw, strides, dilations, pads, seed=0):
    """A plain NCHW case: x4, its blocked copy (for the reference), the weight, its plain packing
    and out's shape."""
    rng = np.random.default_rng(seed + 131 * c + 7 * m + kh)
    x4 = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c, kh, kw)).astype(np.float32)
    oh = bf16.conv_out_size(h, kh, strides[0], dilations[0], pads[0], pads[2])
    ow = bf16.conv_out_size(w, kw, strides[1], dilations[1], pads[1], pads[3])
    return x4, _blocked(x4), wt, bf16.PackedConv(wt, 0), (n, -(-m // 16), oh, ow, 16)


@pytest.mark.parametrize("variant", RUNS)
def test_a_plain_nchw_stem_matches_the_float64_reference(variant):
    for n, c, h, w, m, kh, kw, s, d, p in PLAIN:
        x4, x5, wt, pk, shape = _plain(n, c, h, w, m, kh, kw, s, d, p)
        assert pk.in_blocks == 0 and pk.packed.k == kh * kw * c
        out = _run(x4, pk, shape, variant, s, p, d)
        err = np.abs(out - bf16.conv_reference(x5, wt, s, p, d))
        assert np.all(err <= _bound(x5, wt, s, p, d, plain=True)), (variant, c, m, kh, float(err.max()))
        # the same sums as the blocked input's where the variant sums k in the same pairs
        blocked = _run(x5, bf16.PackedConv(wt, 1), shape, variant, s, p, d)
        assert np.all(np.abs(out - blocked) <= 2.0 * _bound(x5, wt, s, p, d)), (variant, c)


@pytest.mark.parametrize("variant", RUNS)
@pytest.mark.parametrize("act", [None, "gelu", "silu", "hardswish"])
def test_a_plain_stem_epilogue_and_widths(variant, act):
    geo = PLAIN[0]
    s, d, p = geo[7], geo[8], geo[9]
    x4, x5, wt, pk, shape = _plain(*geo, seed=3)
    bias = np.linspace(-1.5, 1.5, geo[4], dtype=np.float32)
    add = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    y = bf16.conv_reference(x5, wt, s, p, d) + np.concatenate([bias, np.zeros(12, np.float32)]).reshape(2, 1, 1, 16)
    y = np.clip(y + add, -1.0, 2.5)
    if act is not None:
        y = activations.TABLE[act].np(y)
    kw = {"bias": bias, "clip": (-1.0, 2.5), "act": act, "addend": add}
    one = _run(x4, pk, shape, variant, s, p, d, **kw)
    tol = 2.0 * _bound(x5, wt, s, p, d, plain=True)
    assert np.all(np.abs(one - y) <= tol + 2e-6 * np.maximum(1.0, np.abs(y))), (variant, act)
    for width in (2, 3):
        assert np.array_equal(_run(x4, pk, shape, variant, s, p, d, width=width, **kw).view(np.uint32),
                              one.view(np.uint32)), (variant, width)


def test_a_plain_stem_packing_and_its_refusals():
    x4, x5, wt, pk, shape = _plain(*PLAIN[0])
    s, d, p = PLAIN[0][7], PLAIN[0][8], PLAIN[0][9]
    again = bf16.PackedConv.from_data(pk.data, wt.shape, 0)
    assert again.data is pk.data and again.in_blocks == 0
    assert np.array_equal(_run(x4, again, shape, RUNS[0], s, p, d), _run(x4, pk, shape, RUNS[0], s, p, d))
    # k is (kh, kw, c) over the real channels: the packed rows are the transposed weight's
    want = bf16.PackedB(np.ascontiguousarray(wt.transpose(2, 3, 1, 0).reshape(-1, wt.shape[0])))
    assert np.array_equal(pk.data, want.data)
    with pytest.raises(ValueError):
        bf16.PackedConv(np.zeros((8, 17, 3, 3), np.float32), 0)  # a plain input holds at most 16 channels
    with pytest.raises(ValueError):
        bf16.PackedConv.from_data(pk.data, (20, 4, 7, 7), 0)
    out = np.full(shape, 7.0, np.float32)
    for bad in (x5,  # blocked input for a plain weight
                x4[:, :2].copy(),  # fewer channels than the weight's
                np.asfortranarray(x4), x4.astype(np.float64)):
        assert bf16.conv_nchwc(bad, pk, out, s, p, d) is False
    assert bf16.conv_nchwc(x4, pk, out[:, :, 1:].copy(), s, p, d) is False  # out of the wrong extent
    assert bf16.conv_nchwc(x4, bf16.PackedConv(wt, 1), out, s, p, d) is False  # plain input, blocked weight
    assert np.all(out == 7.0)
    # the C entry checks again: a plain weight's bits for another channel count
    mod = bf16._mod()
    geo = bf16._geometry((7, 7), s, d, p)
    with pytest.raises(ValueError):
        mod.bf_conv_plain(x4[:, :2].copy(), pk.data, out, bf16._NO_BIAS, 0, 0, 0.0, 0.0, 1, 0, 0, geo, None)
    with pytest.raises((ValueError, TypeError)):
        mod.bf_conv_plain(np.zeros((1, 17, 23, 21), np.float32), pk.data, out, bf16._NO_BIAS, 0, 0, 0.0, 0.0, 1, 0,
                          0, geo, None)
    assert np.all(out == 7.0)
