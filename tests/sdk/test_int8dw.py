"""GE's int8 depthwise convolution over the NCHWc layout (ge_native.int8dw): every variant this
machine runs bit for bit against the NumPy reference (float32 and uint8 input and output, every
epilogue, zero points, saturation, odd shapes), across thread counts, its packed weight, its
refusals, its dispatch."""

from __future__ import annotations

import numpy as np
import pytest

from ge_native import int8dw, isa

from .switch import CPUINFO_SPR, probe

RUNS = int8dw.runnable()
#: (N, C, H, W, K, strides, dilations, pads (top, left, bottom, right)): C 1 / 15 / 16 / 17 / 40,
#: 3x3 and 5x5, strides 1 and 2, dilation 2, asymmetric pads, H and W of 1, 2, 7 and 15, batch 2
CASES = [
    (2, 17, 7, 15, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 40, 15, 7, 3, (2, 2), (1, 1), (1, 0, 1, 2)),
    (1, 16, 15, 15, 5, (1, 1), (1, 1), (2, 2, 2, 2)),
    (2, 15, 7, 7, 5, (2, 2), (1, 1), (2, 1, 2, 1)),
    (1, 1, 2, 1, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 17, 1, 2, 3, (1, 2), (1, 1), (1, 1, 1, 0)),
    (1, 40, 15, 15, 3, (1, 1), (2, 2), (2, 2, 2, 2)),
    (2, 16, 7, 15, 3, (2, 1), (2, 1), (0, 3, 2, 0)),
    # wide rows: the AVX-512 form's ring of rows (a task's rows past its 64 KB)
    (1, 17, 12, 230, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 16, 13, 190, 5, (2, 1), (2, 2), (4, 3, 4, 4)),
]
#: (x_scale, zero point, dtype) of the input's quantisation: zero points at both ends
QUANTS = [(0.05, 3, "uint8"), (0.02, -128, "int8"), (0.04, 255, "uint8"), (0.03, 127, "int8"), (0.05, 0, "uint8")]


def _case(n, c, h, w, k, strides, dilations, pads, seed=0):
    rng = np.random.default_rng(seed + 131 * c + 7 * h + k)
    cb = -(-c // 16)
    x5 = (rng.standard_normal((n, cb, h, w, 16)) * 4).astype(np.float32)
    x5[:, -1, :, :, c - (cb - 1) * 16:] = np.nan  # padded lanes: whatever is there must not leak
    wt = rng.integers(-128, 128, (c, 1, k, k)).astype(np.int8)
    oh = int8dw.conv_out_size(h, k, strides[0], dilations[0], pads[0], pads[2])
    ow = int8dw.conv_out_size(w, k, strides[1], dilations[1], pads[1], pads[3])
    return x5, wt, (n, cb, oh, ow, 16)


def _run(x5, pk, shape, variant, geo, q, width=1, dtype=np.float32, **kw) -> np.ndarray:
    out = np.full(shape, 77 if dtype == np.uint8 else np.nan, dtype)
    named = dict(zip(("strides", "pads", "dilations"), geo)) | dict(zip(("x_scale", "x_zero_point", "x_dtype"), q))
    assert int8dw.depthwise_nchwc(x5, pk, out, **named, width=width, variant=variant, **kw)
    return out


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if got.dtype == np.uint8:
        return got.dtype == want.dtype and np.array_equal(got, want)
    return bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))


def test_the_variants_this_machine_runs_are_those_its_features_promise():
    assert int8dw.available()
    f = isa.features()
    vnni = {"avx512_vnni", "avx512bw", "avx512vl"} <= f
    want = tuple(v for v, ok in (("avx512_vnni", vnni), ("avx2", {"avx2", "fma"} <= f), ("scalar", True)) if ok)
    assert RUNS == want
    assert int8dw.isa() == RUNS[0] == isa.variant_of("int8dw")
    fam = isa.family("int8dw")
    assert fam.names() == int8dw.VARIANTS and fam.switch == "GE_NATIVE_INT8DW"
    spr = isa.parse_cpuinfo(CPUINFO_SPR) | {"avx512_vnni"}
    assert fam.best(spr) == "avx512_vnni"
    assert fam.best(spr - {"avx512bw"}) == "avx2"
    assert fam.best(frozenset()) == "scalar"


_PROBE = """
import json, numpy as np
from ge_native import int8dw, isa
x = np.linspace(-3, 3, 2 * 9 * 11 * 16, dtype=np.float32).reshape(1, 2, 9, 11, 16)
w = (np.arange(20 * 9) % 251 - 125).astype(np.int8).reshape(20, 1, 3, 3)
out = np.zeros((1, 2, 9, 11, 16), np.float32)
ran = int8dw.depthwise_nchwc(x, int8dw.PackedDW8(w), out, (1, 1), (1, 1, 1, 1), (1, 1), 0.03, 5,
                             w_scale=np.full(1, 0.01, np.float32))
print(json.dumps({"isa": int8dw.isa(), "family": isa.variant_of("int8dw"), "ran": ran,
                  "bits": out.view(np.uint32).ravel().tolist()}))
"""


def test_the_switch_forces_each_variant_and_turns_the_path_off():
    x = np.linspace(-3, 3, 2 * 9 * 11 * 16, dtype=np.float32).reshape(1, 2, 9, 11, 16)
    pk = int8dw.PackedDW8((np.arange(20 * 9) % 251 - 125).astype(np.int8).reshape(20, 1, 3, 3))
    default = probe(_PROBE, None, "GE_NATIVE_INT8DW")
    assert default["isa"] == default["family"] == RUNS[0] and default["ran"]
    for v in RUNS:
        got = probe(_PROBE, v, "GE_NATIVE_INT8DW")
        assert got["isa"] == got["family"] == v and got["ran"]
        want = _run(x, pk, (1, 2, 9, 11, 16), v, ((1, 1), (1, 1, 1, 1), (1, 1)), (0.03, 5),
                    w_scale=np.full(1, 0.01, np.float32))
        assert got["bits"] == want.view(np.uint32).ravel().tolist()
    off = probe(_PROBE, "0", "GE_NATIVE_INT8DW")
    assert off["isa"] is None and off["family"] == "scalar" and off["ran"] is False
    assert probe(_PROBE, "sse9", "GE_NATIVE_INT8DW")["isa"] == RUNS[0]


@pytest.mark.parametrize("variant", RUNS)
def test_odd_shapes_match_the_reference_bit_for_bit(variant):
    for i, (n, c, h, w, k, s, d, p) in enumerate(CASES):
        x5, wt, shape = _case(n, c, h, w, k, s, d, p)
        pk = int8dw.PackedDW8(wt)
        ws = np.linspace(0.002, 0.01, c, dtype=np.float32) if i % 2 else np.full(1, 0.004, np.float32)
        q = QUANTS[i % len(QUANTS)]
        got = _run(x5, pk, shape, variant, (s, p, d), q, w_scale=ws)
        assert _same(got, int8dw.reference(x5, wt, s, p, d, *q, w_scale=ws)), (variant, i, q)
        # the same integers as uint8 input (an int8 quantisation has no uint8 form)
        if q[2] == "uint8":
            xu = np.clip(np.rint(np.nan_to_num(x5) / np.float32(q[0])) + q[1], 0, 255).astype(np.uint8)
            assert _same(_run(xu, pk, shape, variant, (s, p, d), q, w_scale=ws), got), (variant, i)


@pytest.mark.parametrize("variant", RUNS)
def test_every_epilogue_alone_and_together(variant):
    n, c, h, w, k, s, d, p = CASES[1]
    x5, wt, shape = _case(n, c, h, w, k, s, d, p, seed=5)
    pk = int8dw.PackedDW8(wt)
    rng = np.random.default_rng(9)
    ws = rng.uniform(0.001, 0.01, c).astype(np.float32)
    bias = rng.uniform(-3, 3, c).astype(np.float32)
    addend = rng.uniform(-2, 2, shape).astype(np.float32)
    q, geo = (0.05, 7, "uint8"), (s, p, d)
    oq = (0.04, 3, -20, 200)
    kws = [{}, {"bias": bias}, {"addend": addend}, {"clip": (-1.5, 2.0)}, {"act": "relu6"}, {"act": "relu"},
           {"out_quant": oq}, {"bias": bias, "addend": addend, "clip": (-4.0, 3.0), "act": "hardswish", "out_quant": oq},
           {"bias": bias, "clip": (0.0, 6.0), "out_quant": (0.03, -5, -128, 127)}, {"clip": (2.0, -1.0), "out_quant": oq}]
    kws += [{"bias": bias, "act": a} for a in int8dw.ACTIVATIONS]
    for kw in kws:
        want = int8dw.reference(x5, wt, s, p, d, *q, w_scale=ws, **kw)
        assert _same(_run(x5, pk, shape, variant, geo, q, w_scale=ws, **kw), want), (variant, list(kw))
    # uint8 output: the integers, the clip folded or not, every epilogue
    for kw in ({}, {"clip": (0.0, 6.0)}, {"bias": bias, "addend": addend, "act": "silu"}, {"act": "relu6", "bias": bias},
               {"clip": (5.0, 1.0)}):
        for oqu in ((0.05, 0, 0, 255), (0.02, 128, 10, 240), (0.1, -3, 0, 0)):
            want = int8dw.reference(x5, wt, s, p, d, *q, w_scale=ws, out_quant=oqu, out_dtype=np.uint8, **kw)
            got = _run(x5, pk, shape, variant, geo, q, dtype=np.uint8, w_scale=ws, out_quant=oqu, **kw)
            assert _same(got, want), (variant, list(kw), oqu)
    # the addend may be the output itself (read before the store writes it)
    out = addend.copy()
    assert int8dw.depthwise_nchwc(x5, pk, out, *geo, *q, w_scale=ws, addend=out, variant=variant)
    assert _same(out, int8dw.reference(x5, wt, s, p, d, *q, w_scale=ws, addend=addend))


@pytest.mark.parametrize("variant", RUNS)
def test_zero_points_and_saturation(variant):
    n, c, h, w, k, s, d, p = CASES[0]
    x5, wt, shape = _case(n, c, h, w, k, s, d, p, seed=2)
    x5 = x5 * np.float32(100)  # most values saturate
    x5[0, 0, 0, 0, :4] = [np.inf, -np.inf, 1e30, -1e30]
    wt[:3] = [[[[127] * 3] * 3], [[[-128] * 3] * 3], [[[-128, 127, -128]] * 3]]
    pk = int8dw.PackedDW8(wt)
    ws = np.full(1, 1e-3, np.float32)
    for q in QUANTS:
        want = int8dw.reference(x5, wt, s, p, d, *q, w_scale=ws)
        assert _same(_run(x5, pk, shape, variant, (s, p, d), q, w_scale=ws), want), (variant, q)
        # tiny output scales saturate the output quantisation both ways
        for out_quant in ((1e-6, 0, 0, 255), (1e-30, 10, -256, 255)):
            want = int8dw.reference(x5, wt, s, p, d, *q, w_scale=ws, out_quant=out_quant)
            assert _same(_run(x5, pk, shape, variant, (s, p, d), q, w_scale=ws, out_quant=out_quant), want)


@pytest.mark.parametrize("variant", RUNS)
def test_bits_are_the_same_at_every_width_and_in_every_variant(variant):
    n, c, h, w, k, s, d, p = CASES[6]
    x5, wt, shape = _case(2, c, h, w, k, s, d, p, seed=4)
    shape = (2, *shape[1:])
    pk = int8dw.PackedDW8(wt)
    kw = {"w_scale": np.full(c, 0.003, np.float32), "act": "gelu", "clip": (-2.0, 5.0)}
    one = _run(x5, pk, shape, variant, (s, p, d), QUANTS[0], **kw)
    for width in (2, 3):
        assert _same(_run(x5, pk, shape, variant, (s, p, d), QUANTS[0], width, **kw), one)
    assert _same(_run(x5, pk, shape, "scalar", (s, p, d), QUANTS[0], **kw), one)


def test_the_packed_weight():
    wt = np.arange(-60, 60, dtype=np.int8)[: 17 * 5 * 1].reshape(17, 1, 5, 1)
    pk = int8dw.PackedDW8(wt)
    assert pk.data.shape == (2, 5, 1, 64) and pk.data.ctypes.data % 64 == 0 and pk.shape == (17, 1, 5, 1)
    assert pk.data[0, 2, 0, 4 * 3] == wt[3, 0, 2, 0] and pk.data[1, 4, 0, 0] == wt[16, 0, 4, 0]
    assert not pk.data[1, :, :, 4:].any() and not pk.data.reshape(2, 5, 16, 4)[..., 1:].any()
    np.testing.assert_array_equal(pk.wsum[:17], wt.reshape(17, -1).sum(axis=1))
    again = int8dw.PackedDW8.from_data(pk.data, (17, 1, 5, 1))
    assert np.shares_memory(again.data, pk.data) and again.shape == pk.shape
    np.testing.assert_array_equal(again.wsum, pk.wsum)
    ro = pk.data.copy()
    ro.setflags(write=False)
    assert int8dw.PackedDW8.from_data(ro, (17, 1, 5, 1)).data is ro
    bad = pk.data.copy()
    bad[1, 0, 0, 63] = 1  # a weight past C
    for data, shape in ((pk.data, (17, 1, 5, 5)), (pk.data, (33, 1, 5, 1)), (pk.data.astype(np.uint8), (17, 1, 5, 1)),
                        (pk.data[:, :, :, ::-1], (17, 1, 5, 1)), (bad, (17, 1, 5, 1)), (pk.data, (17, 2, 5, 1)),
                        ("x", (17, 1, 5, 1)), (pk.data, "shape")):
        with pytest.raises(ValueError):
            int8dw.PackedDW8.from_data(data, shape)
    for w in (wt.astype(np.int16), wt[:, 0], np.zeros((2, 2, 3, 3), np.int8), np.zeros((0, 1, 3, 3), np.int8)):
        with pytest.raises(ValueError):
            int8dw.PackedDW8(w)


@pytest.mark.parametrize("shape", [(144, 1, 5, 5), (40, 1, 7, 7), (17, 1, 3, 5), (16, 1, 5, 9)])
def test_a_packing_of_several_tap_quads_round_trips_and_refuses_a_stray_weight(shape):
    """Kernels wider than 4 taps (EfficientNet's 5x5) span several quads: what the packer writes
    is what from_data takes, and one weight past C or KW (in any quad) is refused."""
    w = np.random.default_rng(1).integers(-128, 128, shape).astype(np.int8)
    pk = int8dw.PackedDW8(w)
    assert np.shares_memory(int8dw.PackedDW8.from_data(pk.data, shape).data, pk.data)
    c, _, kh, kw = shape
    cb, g = pk.data.shape[0], pk.data.shape[2]
    strays = [(cb - 1, kh - 1, g - 1, 4 * (int8dw.BLOCK - 1) + 3)] if c % int8dw.BLOCK or kw % 4 else []
    if kw % 4:
        strays.append((0, 0, g - 1, 3))  # channel 0, tap 4 (g - 1) + 3 >= kw
    for at in strays:
        bad = pk.data.copy()
        bad[at] = 1
        with pytest.raises(ValueError):
            int8dw.PackedDW8.from_data(bad, shape)


def test_refusals_return_false_and_write_nothing():
    n, c, h, w, k, s, d, p = CASES[0]
    x5, wt, shape = _case(n, c, h, w, k, s, d, p)
    pk = int8dw.PackedDW8(wt)
    out = np.full(shape, 5.0, np.float32)
    ou = np.full(shape, 5, np.uint8)
    geo = (s, p, d)

    def refused(*args, **kw) -> None:
        x, o = kw.pop("x", x5), kw.pop("out", out)
        assert int8dw.depthwise_nchwc(x, kw.pop("pk", pk), o, *args, **kw) is False, (args, kw)

    refused(*geo, 0.05, x=x5.astype(np.float64))
    refused(*geo, 0.05, x=x5[..., ::-1])
    refused(*geo, 0.05, x=x5[:, :, :-1])
    refused(*geo, 0.05, out=out[:, :, :-1])
    refused(*geo, 0.05, out=out.astype(np.float64))
    refused(*geo, 0.05, x=x5.view(np.uint8).reshape(*x5.shape[:-1], 64))
    refused(*geo, 0.05, -3, "int8", x=np.zeros(x5.shape, np.uint8))  # uint8 input is uint8 integers
    refused(*geo, 0.05, out=ou)  # a uint8 output needs out_quant
    refused(*geo, 0.05, out=ou, out_quant=(0.1, 0, -1, 255))
    refused(*geo, 0.05, x=out)  # the input is the output
    for bad in ({"w_scale": np.ones(3, np.float32)}, {"w_scale": np.ones(c, np.float64)}, {"bias": np.ones(c + 1, np.float32)},
                {"act": "softmax"}, {"clip": (float("nan"), 1.0)}, {"clip": (1.0,)}, {"out_quant": (0.0, 0, 0, 255)},
                {"out_quant": (0.1, 0, 10, 5)}, {"out_quant": (0.1, 0, 0, 300)}, {"addend": np.ones(shape, np.float64)},
                {"addend": np.ones((1, *shape[1:]), np.float32)}, {"width": 0}, {"variant": "avx1024"}):
        refused(*geo, 0.05, **bad)
    for args in (((0, 1), p, d, 0.05), (s, (1, 1, -1, 1), d, 0.05), (s, p, (1, 0), 0.05), (s, p, d, 0.0),
                 (s, p, d, float("nan")), (s, p, d, 0.05, 256), (s, p, d, 0.05, -129, "int8"), (s, p, d, 0.05, 0, "int4"),
                 ((1,), p, d, 0.05), (s, p, d, 0.05, 1.5)):
        refused(*args)
    refused(*geo, 0.05, pk=object())
    refused((1, 1), (0, 0, 0, 0), (1, 1), 0.05, pk=int8dw.PackedDW8(np.ones((c, 1, 3, 3), np.int8)))  # wrong OH/OW
    refused(*geo, 0.05, pk=int8dw.PackedDW8(np.ones((40, 1, 3, 3), np.int8)))  # 3 blocks, x has 2
    assert np.all(out == 5.0) and np.all(ou == 5)
    # an output that overlaps the input
    both = np.zeros((2, *x5.shape), np.float32)
    assert int8dw.depthwise_nchwc(both[0], pk, both[0], (1, 1), (1, 1, 1, 1), (1, 1), 0.05) is False


def test_the_c_entry_checks_its_arguments():
    mod = int8dw._mod()
    x5, wt, shape = _case(*CASES[0])
    pk = int8dw.PackedDW8(wt)
    out = np.zeros(shape, np.float32)
    fp = np.array([0.05, 3, 0, 0, 0, 0, 0, 0], np.float32)
    ip = np.array([0, 0, 0, 0, 1, 0, 17], np.int64)
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 1, 1], np.int64)
    mod.dw8_conv(x5, pk.data, out, pk.wsum, np.ones(1, np.float32), np.ones(1, np.float32), None, fp, ip, geo)
    bad_ip = [ip.copy() for _ in range(4)]
    bad_ip[0][6] = 40  # more channels than the blocks hold
    bad_ip[1][2] = 9  # no such activation
    bad_ip[2][3] = 1  # out-quant with scale 0
    bad_ip[3][4] = 0  # no threads
    for b in bad_ip:
        with pytest.raises(ValueError):
            mod.dw8_conv(x5, pk.data, out, pk.wsum, np.ones(1, np.float32), np.ones(1, np.float32), None, fp, b, geo)
    for g in ([3, 3, 1, 1, 1, 1, 0, 1, 1, 1], [3, 3, 0, 1, 1, 1, 1, 1, 1, 1], [3, 2, 1, 1, 1, 1, 1, 1, 1, 1]):
        with pytest.raises(ValueError):
            mod.dw8_conv(x5, pk.data, out, pk.wsum, np.ones(1, np.float32), np.ones(1, np.float32), None, fp, ip,
                         np.array(g, np.int64))
    with pytest.raises(ValueError):
        mod.dw8_conv(x5, pk.data, out, pk.wsum[:16], np.ones(1, np.float32), np.ones(1, np.float32), None, fp, ip, geo)
    with pytest.raises(TypeError):
        mod.dw8_conv(x5, pk.data, out, pk.wsum, np.ones(1, np.float32), np.ones(1, np.float32), None, fp, ip)
