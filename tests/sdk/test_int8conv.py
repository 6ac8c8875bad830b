"""GE's int8 convolution over the NCHWc layout (ge_native.int8.conv_nchwc): every variant this
machine runs bit for bit against the NumPy reference, across thread counts and batches, its
plain stem, its epilogue, its packed weight, its refusals, its dispatch."""

from __future__ import annotations

import numpy as np
import pytest

from ge_native import int8

from .switch import probe

RUNS = int8.runnable()
#: (N, C, H, W, M, KH, KW, strides, dilations, pads (top, left, bottom, right)): C 3 / 17 / 40 /
#: 64, 1x1 / 3x3 / 7x7, strides 1 and 2, dilation 2, asymmetric pads, OW and M off 16, batch 2
CASES = [
    (1, 3, 15, 17, 20, 7, 7, (2, 2), (1, 1), (3, 3, 2, 3)),
    (2, 17, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 40, 10, 13, 33, 3, 3, (2, 2), (2, 2), (2, 1, 0, 2)),
    (1, 64, 8, 9, 64, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0)),
    (2, 64, 7, 5, 17, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0)),
    (2, 17, 7, 35, 17, 1, 1, (2, 1), (1, 1), (0, 0, 0, 0)),
    (1, 40, 12, 12, 16, 3, 3, (1, 2), (1, 1), (0, 2, 1, 0)),
    (1, 64, 6, 37, 96, 3, 1, (1, 1), (2, 1), (2, 0, 2, 0)),
]
#: (x_scale, zero point, dtype) of each run; None: dynamic
QUANTS = [(0.03, 7, "uint8"), (0.02, -5, "int8"), (None, 0, "uint8")]


def _blocked(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    cb = -(-c // 16)
    full = np.zeros((n, cb * 16, h, w), np.float32)
    full[:, :c] = x
    return np.ascontiguousarray(full.reshape(n, cb, 16, h, w).transpose(0, 1, 3, 4, 2))


def _case(n, c, h, w, m, kh, kw, strides, dilations, pads, seed=0):
    rng = np.random.default_rng(seed + 131 * c + 7 * m + kh)
    x = (rng.standard_normal((n, c, h, w)) * 2).astype(np.float32)
    wt = rng.integers(-128, 128, (m, c, kh, kw)).astype(np.int8)
    ws = rng.uniform(1e-3, 2e-2, m).astype(np.float32)
    oh = int8.conv_out_size(h, kh, strides[0], dilations[0], pads[0], pads[2])
    ow = int8.conv_out_size(w, kw, strides[1], dilations[1], pads[1], pads[3])
    return x, _blocked(x), wt, ws, (n, -(-m // 16), oh, ow, 16)


def _run(x, pk, shape, variant, geo, q, width=1, **kw) -> np.ndarray:
    (s, p, d), (xs, zp, dtype) = geo, (*q, "uint8")[:3]
    out = np.full(shape, np.nan, np.float32)
    assert int8.conv_nchwc(x, pk, out, s, p, d, xs, zp, dtype, width=width, variant=variant, **kw)
    return out


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    return x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("variant", RUNS)
def test_geometries_match_the_reference_bit_for_bit(variant):
    for i, (n, c, h, w, m, kh, kw, s, d, p) in enumerate(CASES):
        x, x5, wt, ws, shape = _case(n, c, h, w, m, kh, kw, s, d, p)
        pk = int8.PackedConv8(wt, x5.shape[1])
        for q in QUANTS:
            scale = ws if i % 2 else ws[:1].copy()
            got = _run(x5, pk, shape, variant, (s, p, d), q, w_scale=scale)
            want = int8.conv_reference(x5, wt, s, p, d, *q, w_scale=scale)
            assert _same(got, want), (variant, i, q)
            assert np.isfinite(got).all()


@pytest.mark.parametrize("variant", RUNS)
def test_a_plain_nchw_stem_matches_the_reference(variant):
    for n, c, h, w, m, kh, kw, s, d, p in (CASES[0], (2, 16, 9, 10, 24, 3, 3, (2, 2), (1, 1), (1, 0, 1, 1)),
                                          (1, 1, 8, 19, 8, 3, 5, (1, 1), (2, 1), (0, 2, 2, 1))):
        x, _, wt, ws, shape = _case(n, c, h, w, m, kh, kw, s, d, p, seed=3)
        pk = int8.PackedConv8(wt, 0)
        for q in QUANTS:
            got = _run(x, pk, shape, variant, (s, p, d), q, w_scale=ws, bias=ws, act=None)
            want = int8.conv_reference(x, wt, s, p, d, *q, w_scale=ws, bias=ws, plain=True)
            assert _same(got, want), (variant, c, q)


@pytest.mark.parametrize("variant", RUNS)
def test_every_epilogue_and_the_lanes_past_m(variant):
    n, c, h, w, m, kh, kw, s, d, p = CASES[2]
    x, x5, wt, ws, shape = _case(n, c, h, w, m, kh, kw, s, d, p, seed=5)
    pk = int8.PackedConv8(wt, x5.shape[1])
    rng = np.random.default_rng(2)
    bias = rng.standard_normal(m).astype(np.float32)
    add = rng.standard_normal(shape).astype(np.float32)
    oq = (0.04, 3, 0, 255)
    q = QUANTS[0]
    for kw_ in (dict(bias=bias), dict(addend=add), dict(clip=(-0.5, 1.0)), dict(out_quant=oq),
                dict(bias=bias, addend=add, clip=(-1.0, 1.0), out_quant=oq)):
        got = _run(x5, pk, shape, variant, (s, p, d), q, w_scale=ws, **kw_)
        assert _same(got, int8.conv_reference(x5, wt, s, p, d, *q, w_scale=ws, **kw_)), (variant, list(kw_))
        for act in int8.ACTIVATIONS:
            got = _run(x5, pk, shape, variant, (s, p, d), q, w_scale=ws, act=act, **kw_)
            want = int8.conv_reference(x5, wt, s, p, d, *q, w_scale=ws, act=act, **kw_)
            tol = 4e-6 * np.maximum(1.0, np.abs(want)) + (0.04 * 1.0001 if "out_quant" in kw_ else 0.0)
            assert np.all(np.abs(got - want) <= tol), (variant, act, list(kw_))
    # the lanes past M (33 of 48): act(clip(0 + addend))
    got = _run(x5, pk, shape, variant, (s, p, d), q, w_scale=ws, bias=bias, addend=add, clip=(-1.0, 1.0))
    assert np.array_equal(got[:, 2, ..., 1:], np.clip(add[:, 2, ..., 1:], -1.0, 1.0))


def test_bits_are_the_same_in_every_variant_and_at_every_width():
    for n, c, h, w, m, kh, kw, s, d, p in (CASES[1], CASES[4], (1, 64, 20, 20, 64, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1))):
        x, x5, wt, ws, shape = _case(n, c, h, w, m, kh, kw, s, d, p, seed=9)
        pk = int8.PackedConv8(wt, x5.shape[1])
        want = int8.conv_reference(x5, wt, s, p, d, *QUANTS[0], w_scale=ws, bias=ws)
        for v in RUNS:
            one = _run(x5, pk, shape, v, (s, p, d), QUANTS[0], w_scale=ws, bias=ws)
            assert _same(one, want), v
            act = _run(x5, pk, shape, v, (s, p, d), QUANTS[2], w_scale=ws, act="silu")
            for width in (2, 3):
                assert _same(_run(x5, pk, shape, v, (s, p, d), QUANTS[0], width, w_scale=ws, bias=ws), one)
                assert _same(_run(x5, pk, shape, v, (s, p, d), QUANTS[2], width, w_scale=ws, act="silu"), act)


def test_the_packed_weight_is_a_packed_matrix_and_wraps_again_without_a_copy():
    x, x5, wt, ws, shape = _case(*CASES[1])
    pk = int8.PackedConv8(wt, 2)
    k = 3 * 3 * 32
    assert pk.data.shape == (2, -(-k // 64) * 16, 128) and pk.shape == wt.shape and pk.in_blocks == 2
    full = np.zeros((3, 3, 32, 40), np.int8)
    full[:, :, :17] = wt.transpose(2, 3, 1, 0)
    assert np.array_equal(pk.data, int8.PackedB8(full.reshape(k, 40)).data)
    assert np.array_equal(pk.colsum, wt.astype(np.int64).sum(axis=(1, 2, 3)))
    stored = pk.data.copy()
    stored.setflags(write=False)
    again = int8.PackedConv8.from_data(stored, wt.shape, 2)
    assert np.shares_memory(again.data, stored)
    geo = (CASES[1][7], CASES[1][9], CASES[1][8])
    assert _same(_run(x5, again, shape, RUNS[0], geo, QUANTS[0], w_scale=ws), _run(x5, pk, shape, RUNS[0], geo, QUANTS[0], w_scale=ws))
    for shp, ib in ((wt.shape, 3), ((40, 17, 3, 1), 2), ((65, 17, 3, 3), 2), ((40, 33, 3, 3), 2), ((40, 17, 3, 3), 0)):
        with pytest.raises(ValueError):
            int8.PackedConv8.from_data(stored, shp, ib)
    with pytest.raises(ValueError):
        int8.PackedConv8(wt, 1)
    with pytest.raises(ValueError):
        int8.PackedConv8(wt.astype(np.float32), 2)
    stem = int8.PackedConv8(wt[:, :3].copy(), 0)
    assert int8.PackedConv8.from_data(stem.data, (40, 3, 3, 3), 0).packed.k == 27


def test_bad_arrays_are_refused_without_a_write():
    x, x5, wt, ws, shape = _case(*CASES[1])
    n, c, h, w, m, kh, kw, s, d, p = CASES[1]
    pk = int8.PackedConv8(wt, 2)
    out = np.full(shape, 7.0, np.float32)
    wide = np.zeros(shape[:-1] + (32,), np.float32)
    calls = [
        lambda: int8.conv_nchwc(x5.astype(np.float64), pk, out, s, p, d, 0.1),
        lambda: int8.conv_nchwc(x5[:, :1].copy(), pk, out, s, p, d, 0.1),
        lambda: int8.conv_nchwc(x5[:, :, :, ::2], pk, out, s, p, d, 0.1),
        lambda: int8.conv_nchwc(x, pk, out, s, p, d, 0.1),
        lambda: int8.conv_nchwc(x5, pk, out[:, :, 1:], s, p, d, 0.1),
        lambda: int8.conv_nchwc(x5, pk, wide[..., :16], s, p, d, 0.1),
        lambda: int8.conv_nchwc(x5, pk, out, (2, 2), p, d, 0.1),
        lambda: int8.conv_nchwc(x5, pk, out, (0, 1), p, d, 0.1),
        lambda: int8.conv_nchwc(x5, pk, out, s, (1, 1, -1, 3), d, 0.1),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, (1, 0), 0.1),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.0),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, 300),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, w_scale=ws[:7].copy()),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, bias=np.zeros(41, np.float32)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, addend=np.zeros(shape)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, act="tanh"),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, out_quant=(-1.0, 0, 0, 255)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, variant="sse9"),
        lambda: int8.conv_nchwc(x5, int8.PackedB8(np.ones((16, 40), np.int8)), out, s, p, d, 0.1),
        lambda: int8.conv_nchwc(x5, int8.PackedConv8(wt, 3), out, s, p, d, 0.1),
    ]
    for i, call in enumerate(calls):
        assert call() is False, i
    assert np.all(out == 7.0)
    mod = int8._mod()
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 1, 1], np.int64)
    fp, ip = np.array([0.1, 3, 0, 0, 0, 0, 0, 0], np.float32), np.array([0, 0, 0, 0, 1, 0], np.int64)
    good = [x5, pk.data, out, pk.packed.colsum_padded, ws, int8._NO_BIAS, None, fp, ip, geo, 0]
    bad = {0: [x5[:, :, :, :10].copy()], 1: [pk.data[:1].copy()], 2: [out[:, :, :-1].copy()],
           9: [geo[:9].copy(), np.array([3, 3, 0, 1, 1, 1, 1, 1, 1, 1]), np.array([5, 3, 1, 1, 1, 1, 1, 1, 1, 1])],
           10: [1, 2]}
    for i, values in bad.items():
        for v in values:
            args = list(good)
            args[i] = v
            with pytest.raises((TypeError, ValueError)):
                mod.i8_conv(*args)
    assert np.all(out == 7.0)


_PROBE = """
import json, numpy as np
from ge_native import int8
x5 = np.cos(np.arange(2 * 9 * 11 * 16, dtype=np.float32)).reshape(1, 2, 9, 11, 16)
w = (np.arange(40 * 32 * 9) % 255 - 127).astype(np.int8).reshape(40, 32, 3, 3)
out = np.zeros((1, 3, 9, 11, 16), np.float32)
ran = int8.conv_nchwc(x5, int8.PackedConv8(w, 2), out, (1, 1), (1, 1, 1, 1), (1, 1), 0.02, 4)
print(json.dumps({"isa": int8.isa(), "ran": ran, "bits": out.view(np.uint32).reshape(-1).tolist()}))
"""


def test_the_dispatch_runs_the_variant_the_switch_names():
    x5 = np.cos(np.arange(2 * 9 * 11 * 16, dtype=np.float32)).reshape(1, 2, 9, 11, 16)
    pk = int8.PackedConv8((np.arange(40 * 32 * 9) % 255 - 127).astype(np.int8).reshape(40, 32, 3, 3), 2)
    for v in RUNS:
        got = probe(_PROBE, v, "GE_NATIVE_INT8")
        assert got["isa"] == v and got["ran"]
        want = _run(x5, pk, (1, 3, 9, 11, 16), v, ((1, 1), (1, 1, 1, 1), (1, 1)), (0.02, 4))
        assert got["bits"] == want.view(np.uint32).reshape(-1).tolist()
    assert probe(_PROBE, "0", "GE_NATIVE_INT8")["ran"] is False


@pytest.mark.parametrize("variant", RUNS)
def test_empty_extents(variant):
    x, x5, wt, ws, shape = _case(*CASES[1])
    pk = int8.PackedConv8(wt, 2)
    assert int8.conv_nchwc(x5[:0].copy(), pk, np.empty((0, *shape[1:]), np.float32), (1, 1), (1, 1, 1, 1), (1, 1),
                           0.1, variant=variant)


#: a uint8 output's (scale, zero point, qlo, qhi): wide, saturating at both ends, narrowed
OUT8 = [(0.05, 3, 0, 255), (0.002, 128, 0, 255), (0.04, 100, 17, 201)]


def _u8_case(n, c, h, w, m, kh, kw, strides, dilations, pads, seed=0, plain=False):
    """A uint8 input (lanes past C: any bytes) and the rest of :func:`_case`."""
    _, _, wt, ws, shape = _case(n, c, h, w, m, kh, kw, strides, dilations, pads, seed)
    rng = np.random.default_rng(seed + 17 * c + m)
    x = rng.integers(0, 256, (n, c, h, w) if plain else (n, -(-c // 16), h, w, 16), dtype=np.uint8)
    return x, wt, ws, shape


def _bits(x: np.ndarray, y: np.ndarray) -> bool:
    """The same dtype, shape and bytes (a float32's NaN included)."""
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8))


def _run8(x, pk, shape, variant, geo, q, oq, width=1, **kw) -> np.ndarray:
    """conv_nchwc into a uint8 output (``oq``) or, ``oq`` None, a float32 one."""
    out = np.full(shape, 7, np.uint8) if oq is not None else np.full(shape, np.nan, np.float32)
    (s, p, d), (xs, zp, dtype) = geo, (*q, "uint8")[:3]
    assert int8.conv_nchwc(x, pk, out, s, p, d, xs, zp, dtype, width=width, variant=variant, out_quant=oq, **kw)
    return out


@pytest.mark.parametrize("variant", RUNS)
def test_uint8_activations_in_and_out_match_the_reference(variant):
    for i, (n, c, h, w, m, kh, kw, s, d, p) in enumerate(CASES):
        x, wt, ws, shape = _u8_case(n, c, h, w, m, kh, kw, s, d, p, seed=i)
        pk = int8.PackedConv8(wt, x.shape[1])
        for zp in (0, 128, 255):
            q = (0.03, zp, "uint8")
            for oq in (None, OUT8[i % 3]):
                got = _run8(x, pk, shape, variant, (s, p, d), q, oq, w_scale=ws)
                want = int8.conv_reference(x, wt, s, p, d, *q, w_scale=ws, out_quant=oq,
                                           out_dtype="float32" if oq is None else "uint8")
                assert _bits(got, want), (variant, i, zp, oq)
        # a float32 input into a uint8 output
        xf, x5, *_ = _case(n, c, h, w, m, kh, kw, s, d, p, seed=i)
        got = _run8(x5, pk, shape, variant, (s, p, d), QUANTS[1], OUT8[1], w_scale=ws)
        want = int8.conv_reference(x5, wt, s, p, d, *QUANTS[1], w_scale=ws, out_quant=OUT8[1], out_dtype="uint8")
        assert np.array_equal(got, want), (variant, i)


@pytest.mark.parametrize("variant", RUNS)
def test_a_uint8_output_after_every_epilogue_saturates_at_both_ends(variant):
    n, c, h, w, m, kh, kw, s, d, p = CASES[2]
    x, wt, ws, shape = _u8_case(n, c, h, w, m, kh, kw, s, d, p, seed=5)
    pk = int8.PackedConv8(wt, x.shape[1])
    rng = np.random.default_rng(4)
    bias = rng.standard_normal(m).astype(np.float32)
    add = rng.standard_normal(shape).astype(np.float32)
    q = (0.03, 9, "uint8")
    seen = set()
    for oq in OUT8:
        for kw_ in (dict(bias=bias), dict(addend=add), dict(clip=(-0.5, 1.0)), dict(clip=(0.0, 6.0), bias=bias),
                    dict(bias=bias, addend=add, clip=(-1.0, 1.0)), dict(clip=(-1e30, 1e30))):
            got = _run8(x, pk, shape, variant, (s, p, d), q, oq, w_scale=ws, **kw_)
            want = int8.conv_reference(x, wt, s, p, d, *q, w_scale=ws, out_quant=oq, out_dtype="uint8", **kw_)
            assert np.array_equal(got, want), (variant, oq, list(kw_))
            seen |= {int(got[..., :m % 16].min()), int(got.max())}
            for act in int8.ACTIVATIONS:
                got = _run8(x, pk, shape, variant, (s, p, d), q, oq, w_scale=ws, act=act, **kw_)
                want = int8.conv_reference(x, wt, s, p, d, *q, w_scale=ws, act=act, out_quant=oq, out_dtype="uint8", **kw_)
                # the activations are ulps from NumPy's: one step of the output's grid at most
                assert np.abs(got.astype(np.int32) - want).max() <= 1, (variant, act, list(kw_))
    assert {0, 255, 17, 201} <= seen


@pytest.mark.parametrize("variant", RUNS)
def test_a_plain_uint8_stem_matches_the_reference(variant):
    for n, c, h, w, m, kh, kw, s, d, p in (CASES[0], (2, 16, 9, 10, 24, 3, 3, (2, 2), (1, 1), (1, 0, 1, 1))):
        x, wt, ws, shape = _u8_case(n, c, h, w, m, kh, kw, s, d, p, seed=3, plain=True)
        pk = int8.PackedConv8(wt, 0)
        for zp, oq in ((0, None), (255, OUT8[0]), (128, OUT8[2])):
            got = _run8(x, pk, shape, variant, (s, p, d), (0.02, zp), oq, w_scale=ws, bias=ws)
            want = int8.conv_reference(x, wt, s, p, d, 0.02, zp, w_scale=ws, bias=ws, out_quant=oq, plain=True,
                                       out_dtype="float32" if oq is None else "uint8")
            assert _bits(got, want), (variant, c, zp, oq)


def test_uint8_bits_are_the_same_in_every_variant_and_at_every_width():
    for n, c, h, w, m, kh, kw, s, d, p in (CASES[1], CASES[4], (1, 64, 20, 20, 64, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
                                          (2, 144, 7, 9, 24, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))):
        x, wt, ws, shape = _u8_case(n, c, h, w, m, kh, kw, s, d, p, seed=9)
        pk = int8.PackedConv8(wt, x.shape[1])
        q, oq = (0.02, 200), OUT8[0]
        want = int8.conv_reference(x, wt, s, p, d, *q, w_scale=ws, bias=ws, out_quant=oq, out_dtype="uint8")
        for v in RUNS:
            assert np.array_equal(_run8(x, pk, shape, v, (s, p, d), q, oq, w_scale=ws, bias=ws), want), v
            act = _run8(x, pk, shape, v, (s, p, d), q, oq, w_scale=ws, act="silu")
            for width in (2, 3):
                assert np.array_equal(_run8(x, pk, shape, v, (s, p, d), q, oq, width, w_scale=ws, bias=ws), want)
                assert np.array_equal(_run8(x, pk, shape, v, (s, p, d), q, oq, width, w_scale=ws, act="silu"), act)


def test_uint8_arrays_that_do_not_fit_are_refused_without_a_write():
    n, c, h, w, m, kh, kw, s, d, p = CASES[1]
    x, wt, ws, shape = _u8_case(n, c, h, w, m, kh, kw, s, d, p)
    _, x5, *_ = _case(n, c, h, w, m, kh, kw, s, d, p)
    pk = int8.PackedConv8(wt, 2)
    out = np.full(shape, 7, np.uint8)
    out32 = np.full(shape, 7.0, np.float32)
    oq = OUT8[0]
    calls = [
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1),  # a uint8 output without out_quant
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, out_quant=(0.05, 3, 0, 256)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, out_quant=(0.05, 3, -1, 255)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, out_quant=(0.05, 3, 9, 8)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, out_quant=(0.05, 3, 0.5, 255)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, out_quant=(0.05, 2.5, 0, 255)),
        lambda: int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, out_quant=(0.05, 3, 0, float("nan"))),
        lambda: int8.conv_nchwc(x, pk, out32, s, p, d, 0.1, 0, "int8"),  # a uint8 input is uint8's integers
        lambda: int8.conv_nchwc(x, pk, out32, s, p, d, None),  # ... quantised already: no dynamic scale
        lambda: int8.conv_nchwc(x, pk, out32, s, p, d, 0.1, 256),
        lambda: int8.conv_nchwc(x[:, :1].copy(), pk, out, s, p, d, 0.1, out_quant=oq),
        lambda: int8.conv_nchwc(x.astype(np.int8), pk, out, s, p, d, 0.1, out_quant=oq),
        lambda: int8.conv_nchwc(x[..., :8].copy(), pk, out, s, p, d, 0.1, out_quant=oq),
        lambda: int8.conv_nchwc(x, pk, out[:, :, 1:], s, p, d, 0.1, out_quant=oq),
        lambda: int8.conv_nchwc(x, pk, out.astype(np.int8), s, p, d, 0.1, out_quant=oq),
        lambda: int8.conv_nchwc(x, pk, out, s, p, d, 0.1, out_quant=oq, addend=out.astype(np.float32)[:, :1]),
    ]
    for i, call in enumerate(calls):
        assert call() is False, i
    assert np.all(out == 7) and np.all(out32 == 7.0)
    # an addend that overlaps the uint8 output is refused, one apart from it is read
    room = np.zeros(out.nbytes * 5, np.uint8)
    o8, a32 = room[: out.size].reshape(shape), room[: out.size * 4].view(np.float32).reshape(shape)
    assert int8.conv_nchwc(x, pk, o8, s, p, d, 0.1, out_quant=oq, addend=a32) is False
    # the C entry checks again: it raises, it does not crash
    mod = int8._mod()
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 1, 1], np.int64)
    fp = np.array([0.1, 3, 0, 0, 0.05, 3, 0, 255], np.float32)
    ip = np.array([0, 0, 0, 1, 1, 0], np.int64)
    good = [x, pk.data, out, pk.packed.colsum_padded, ws[:1].copy(), int8._NO_BIAS, None, fp, ip, geo, 0]
    mod.i8_conv(*good)
    assert not np.all(out == 7)
    out[:] = 7
    bad = {7: [np.array([0.1, 3, 0, 0, 0.05, 3, 0, 256], np.float32), np.array([0, 3, 0, 0, 0.05, 3, 0, 255], np.float32),
               np.array([0.1, 3, 0, 0, 0.05, 3, 0.5, 255], np.float32)],
           8: [np.array([0, 0, 0, 0, 1, 0], np.int64)], 0: [x[..., :8].copy(), x.astype(np.int8)]}
    for i, values in bad.items():
        for v in values:
            args = list(good)
            args[i] = v
            with pytest.raises((TypeError, ValueError)):
                mod.i8_conv(*args)
    assert np.all(out == 7)


#: mid fake-quants (scale, zero point, lo, hi): u8's grid, int8's, a 16-bit one, the widest, and
#: one that saturates at both ends on nearly every value
MIDS = [(0.05, 128, 0, 255), (0.02, -3, -128, 127), (3e-4, -700, -32768, 32767), (0.01, 0, -65536, 65536),
        (0.4, 2, -1, 4)]
#: the cases the mid fake-quant runs on: a 3x3 over a batch of 2, 1x1 at M 64 (AMX packs its
#: uint8 stores) and M 17 (masked columns), a plain stem
MID_CASES = [CASES[1], CASES[3], CASES[4]]


def _mid_setup(case, seed):
    n, c, h, w, m, kh, kw, s, d, p = case
    x, x5, wt, ws, shape = _case(n, c, h, w, m, kh, kw, s, d, p, seed=seed)
    x8, *_ = _u8_case(n, c, h, w, m, kh, kw, s, d, p, seed=seed)
    rng = np.random.default_rng(seed + 11)
    bias = rng.standard_normal(m).astype(np.float32)
    add = (rng.standard_normal(shape) * 2).astype(np.float32)
    return x5, x8, int8.PackedConv8(wt, x5.shape[1]), wt, ws, bias, add, shape, (s, p, d)


@pytest.mark.parametrize("variant", RUNS)
def test_a_mid_fake_quant_matches_the_reference_bit_for_bit(variant):
    for i, case in enumerate(MID_CASES):
        x5, x8, pk, wt, ws, bias, add, shape, geo = _mid_setup(case, i)
        s, p, d = geo
        for mq in MIDS:
            # alone, on a float32 input and a dynamic one
            for q in (QUANTS[0], QUANTS[2]):
                got = _run(x5, pk, shape, variant, geo, q, w_scale=ws, bias=bias, mid_quant=mq)
                want = int8.conv_reference(x5, wt, s, p, d, *q, w_scale=ws, bias=bias, mid_quant=mq)
                assert _same(got, want), (variant, i, mq, q)
            # a residual block's end: + shortcut, relu, the output's fake-quant (float32 and uint8)
            kw = dict(w_scale=ws, bias=bias, mid_quant=mq, addend=add, clip=(0.0, np.inf))
            got = _run(x5, pk, shape, variant, geo, QUANTS[1], out_quant=OUT8[0], **kw)
            want = int8.conv_reference(x5, wt, s, p, d, *QUANTS[1], out_quant=OUT8[0], **kw)
            assert _same(got, want), (variant, i, mq)
            for oq in OUT8:
                got = _run8(x8, pk, shape, variant, geo, (0.03, 17), oq, **kw)
                want = int8.conv_reference(x8, wt, s, p, d, 0.03, 17, out_quant=oq, out_dtype="uint8", **kw)
                assert np.array_equal(got, want), (variant, i, mq, oq)
            got = _run8(x8, pk, shape, variant, geo, (0.03, 17), None, **kw)
            want = int8.conv_reference(x8, wt, s, p, d, 0.03, 17, **kw)
            assert _same(got, want), (variant, i, mq)


@pytest.mark.parametrize("variant", RUNS)
def test_the_mid_fake_quant_saturates_at_both_ends(variant):
    x5, x8, pk, wt, ws, bias, add, shape, (s, p, d) = _mid_setup(CASES[1], 7)
    m = wt.shape[0]
    for mq in (MIDS[4], (0.02, 5, -40, 60)):
        ms, mz, lo, hi = mq
        got = _run(x5, pk, shape, variant, (s, p, d), QUANTS[0], w_scale=ws, bias=bias, mid_quant=mq)
        want = int8.conv_reference(x5, wt, s, p, d, *QUANTS[0], w_scale=ws, bias=bias, mid_quant=mq)
        assert _same(got, want)
        live = got.reshape(-1, 48)[:, :m]
        assert live.min() == np.float32(lo - mz) * np.float32(ms) and live.max() == np.float32(hi - mz) * np.float32(ms)
    # a scale whose reciprocal is past 2^100 (the vector forms divide), the sums scaled to meet it
    tiny = (ws * np.float32(1e-30)).astype(np.float32)
    for mq in ((1e-31, 3, -200, 250), (1e-31, 0, -5, 5)):
        got = _run(x5, pk, shape, variant, (s, p, d), QUANTS[0], w_scale=tiny, mid_quant=mq)
        want = int8.conv_reference(x5, wt, s, p, d, *QUANTS[0], w_scale=tiny, mid_quant=mq)
        assert _same(got, want), mq
    assert len(np.unique(got)) == 11
    # a NaN or infinite bias: NaN gives mlo, +-inf their ends
    odd = bias.copy()
    odd[:3] = [np.nan, np.inf, -np.inf]
    got = _run(x5, pk, shape, variant, (s, p, d), QUANTS[0], w_scale=ws, bias=odd, mid_quant=MIDS[1])
    want = int8.conv_reference(x5, wt, s, p, d, *QUANTS[0], w_scale=ws, bias=odd, mid_quant=MIDS[1])
    assert _same(got, want) and np.isfinite(got).all()


def test_mid_fake_quant_bits_are_the_same_at_widths_1_and_2():
    for case in (CASES[1], CASES[3], (1, 64, 20, 20, 64, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1))):
        x5, x8, pk, wt, ws, bias, add, shape, geo = _mid_setup(case, 3)
        s, p, d = geo
        kw = dict(w_scale=ws, bias=bias, mid_quant=MIDS[0], addend=add, clip=(0.0, np.inf))
        want = int8.conv_reference(x8, wt, s, p, d, 0.03, 17, out_quant=OUT8[2], out_dtype="uint8", **kw)
        want32 = int8.conv_reference(x5, wt, s, p, d, *QUANTS[0], **kw)
        for v in RUNS:
            for width in (1, 2):
                assert np.array_equal(_run8(x8, pk, shape, v, geo, (0.03, 17), OUT8[2], width, **kw), want), (v, width)
                assert _same(_run(x5, pk, shape, v, geo, QUANTS[0], width, **kw), want32), (v, width)


def test_a_mid_fake_quant_that_does_not_fit_is_refused_without_a_write():
    x5, x8, pk, wt, ws, bias, add, shape, (s, p, d) = _mid_setup(CASES[1], 0)
    out = np.full(shape, 7.0, np.float32)
    out8 = np.full(shape, 7, np.uint8)
    for mq in ((0.0, 0, 0, 255), (-0.1, 0, 0, 255), (np.inf, 0, 0, 255), (np.nan, 0, 0, 255), (1e39, 0, 0, 255),
               (0.1, 0, 10, 5), (0.1, 300, 0, 255), (0.1, -1, 0, 255), (0.1, 0.5, 0, 255), (0.1, 0, -0.5, 255),
               (0.1, 0, 0, 255.5), (0.1, 0, -65537, 0), (0.1, 0, 0, 65537), (0.1, 0, 0, np.nan), (0.1, 0, 0),
               (0.1, 0, 0, 255, 1), "abcd", 0.1, (0.1, "z", 0, 255)):
        assert int8.conv_nchwc(x5, pk, out, s, p, d, 0.1, mid_quant=mq) is False, mq
        assert int8.conv_nchwc(x8, pk, out8, s, p, d, 0.1, out_quant=OUT8[0], mid_quant=mq) is False, mq
    assert np.all(out == 7.0) and np.all(out8 == 7)
    # the C entry checks the 12 float parameters again: it raises, it does not crash
    mod = int8._mod()
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 1, 1], np.int64)
    ip = np.array([0, 0, 0, 0, 1, 0], np.int64)
    good = [x5, pk.data, out, pk.packed.colsum_padded, ws[:1].copy(), int8._NO_BIAS, None,
            np.array([0.1, 3, 0, 0, 0, 0, 0, 0, 0.05, 3, 0, 255], np.float32), ip, geo, 0]
    for mid in ((0, 3, 0, 255), (0.05, 3, 4, 255), (0.05, 3.5, 0, 255), (0.05, 3, 0, 65537), (np.nan, 3, 0, 255),
                (0.05, 3, 0.5, 255), (np.inf, 3, 0, 255)):
        args = list(good)
        args[7] = np.array([0.1, 3, 0, 0, 0, 0, 0, 0, *mid], np.float32)
        with pytest.raises((TypeError, ValueError)):
            mod.i8_conv(*args)
    assert np.all(out == 7.0)
    args = list(good)
    args[7] = good[7][:11].copy()
    with pytest.raises((TypeError, ValueError)):
        mod.i8_conv(*args)
    mod.i8_conv(*good)
    assert not np.all(out == 7.0)
