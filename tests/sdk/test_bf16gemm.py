"""GE's bf16 GEMM (ge_native.bf16): every variant this machine runs against float64 references of
the bf16-rounded inputs, against each other, across thread counts, its epilogue, its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from ge_native import activations, bf16, isa

from .switch import check_family, expected_variants, probe

RUNS = bf16.runnable()
SIZES = (1, 3, 15, 16, 17, 31, 32, 33, 64, 100, 257)
#: every size in every position, and a few whole tiles
SHAPES = sorted({(s, 33, 17) for s in SIZES} | {(15, s, 31) for s in SIZES} | {(3, 100, s) for s in SIZES}
                | {(257, 257, 257), (64, 64, 64), (16, 32, 16), (33, 257, 100)})

def _data(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 7919 * m + 31 * k + n)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def _bound(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The float32 summation's error bound over k of the bf16-rounded inputs' product."""
    absdot = np.abs(bf16.round_bf16(a)).astype(np.float64) @ np.abs(bf16.round_bf16(w)).astype(np.float64)
    return 2.0 * (a.shape[1] + 2) * 2.0 ** -24 * absdot + 1e-30


def _run(a: np.ndarray, p: bf16.PackedB, variant: str, width: int = 1, **kw) -> np.ndarray:
    out = np.full((a.shape[0], p.n), np.nan, np.float32)
    assert bf16.matmul(a, p, out, width=width, variant=variant, **kw)
    return out


def test_the_variants_this_machine_runs_are_those_its_features_promise():
    assert bf16.available()
    assert RUNS == expected_variants()
    assert bf16.isa() == RUNS[0] == isa.variant_of("bf16gemm")


def test_the_family_chooses_by_features():
    check_family("bf16gemm", bf16.VARIANTS)


_PROBE = """
import json, numpy as np
from ge_native import bf16, isa
a = np.linspace(-2, 3, 17 * 40, dtype=np.float32).reshape(17, 40)
w = np.cos(np.arange(40 * 33, dtype=np.float32)).reshape(40, 33)
out = np.zeros((17, 33), np.float32)
ran = bf16.matmul(a, bf16.PackedB(w), out)
print(json.dumps({"isa": bf16.isa(), "family": isa.variant_of("bf16gemm"), "ran": ran,
                  "bits": out.view(np.uint32).tolist()}))
"""


def _probe(value: str | None) -> dict:
    return probe(_PROBE, value)


def test_the_switch_forces_each_variant_and_turns_the_path_off():
    a = np.linspace(-2, 3, 17 * 40, dtype=np.float32).reshape(17, 40)
    p = bf16.PackedB(np.cos(np.arange(40 * 33, dtype=np.float32)).reshape(40, 33))
    default = _probe(None)
    assert default["isa"] == default["family"] == RUNS[0] and default["ran"]
    for v in RUNS:
        got = _probe(v)
        assert got["isa"] == got["family"] == v and got["ran"]
        # the forced run has the bits of that variant called directly
        assert got["bits"] == _run(a, p, v).view(np.uint32).tolist()
    off = _probe("0")
    assert off["isa"] is None and off["family"] == "scalar" and off["ran"] is False
    unknown = _probe("sse9")
    assert unknown["isa"] == RUNS[0]


@pytest.mark.parametrize("variant", RUNS)
def test_odd_shapes_and_tails_match_the_float64_reference(variant):
    for m, k, n in SHAPES:
        a, w = _data(m, k, n)
        out = _run(a, bf16.PackedB(w), variant)
        err = np.abs(out - bf16.reference(a, w))
        assert np.all(err <= _bound(a, w)), (variant, m, k, n, float(err.max()))


@pytest.mark.parametrize("variant", RUNS)
@pytest.mark.parametrize("act", [None, *bf16.ACTIVATIONS])
def test_every_epilogue(variant, act):
    m, k, n = 37, 75, 45
    a, w = _data(m, k, n, seed=3)
    p = bf16.PackedB(w)
    bias = np.linspace(-1.5, 1.5, n, dtype=np.float32)
    tol = 2.0 * _bound(a, w)
    for use_bias, clip in ((False, None), (True, None), (True, (-1.0, 2.5)), (False, (0.0, 6.0))):
        y = bf16.reference(a, w) + (bias.astype(np.float64) if use_bias else 0.0)
        if clip is not None:
            y = np.clip(y, *clip)
        if act is not None:
            y = activations.TABLE[act].np(y)
        out = _run(a, p, variant, bias=bias if use_bias else None, clip=clip, act=act)
        err = np.abs(out - y)
        assert np.all(err <= tol + 2e-6 * np.maximum(1.0, np.abs(y))), (variant, act, use_bias, clip, float(err.max()))


def test_the_variants_agree():
    a, w = _data(100, 257, 257, seed=5)
    p = bf16.PackedB(w)
    scalar = _run(a, p, "scalar")
    for v in RUNS:
        got = _run(a, p, v)
        assert np.all(np.abs(got - scalar) <= 2.0 * _bound(a, w)), v
    if "avx512_bf16" in RUNS:
        # the scalar form sums each pair in VDPBF16PS's order: the same bits
        assert np.array_equal(_run(a, p, "avx512_bf16").view(np.uint32), scalar.view(np.uint32))


@pytest.mark.parametrize("variant", RUNS)
def test_bits_are_the_same_at_every_width(variant):
    for m, k, n in ((257, 64, 257), (100, 257, 33), (1, 33, 300)):
        a, w = _data(m, k, n, seed=9)
        p = bf16.PackedB(w)
        one = _run(a, p, variant, width=1, act="silu")
        for width in (2, 3):
            assert np.array_equal(_run(a, p, variant, width=width, act="silu").view(np.uint32), one.view(np.uint32))


@pytest.mark.parametrize("variant", RUNS)
def test_a_is_rounded_to_nearest_even(variant):
    halfway = np.array([[1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 1 + 2.0 ** -8 + 2.0 ** -20]], np.float32)
    w = np.eye(4, dtype=np.float32)
    out = _run(halfway, bf16.PackedB(w), variant)
    assert out.tolist() == [[1.0, 1 + 4 * 2.0 ** -8, -1.0, 1 + 2 * 2.0 ** -8]]
    assert bf16.to_bf16_bits(halfway).tolist() == [[0x3F80, 0x3F82, 0xBF80, 0x3F81]]


def test_the_packed_layout_holds_the_pairs():
    k, n = 37, 45
    _, w = _data(1, k, n)
    p = bf16.PackedB(w)
    assert p.shape == (k, n) and p.kp == 64 and p.data.dtype == np.uint16
    assert p.data.shape == (2, 32, 64) and p.data.ctypes.data % 64 == 0
    bits = bf16.to_bf16_bits(w)
    for kk, j in ((0, 0), (1, 0), (36, 44), (17, 31), (2, 32)):
        assert p.data[j // 32, kk // 2, 2 * (j % 32) + kk % 2] == bits[kk, j]
    # k's padding (pair-row 18 holds k 36 and a zero), n's (panel 1 past its 13 columns)
    assert p.data[:, 19:].max() == 0 and p.data[:, 18, 1::2].max() == 0 and p.data[1, :, 2 * 13:].max() == 0


@pytest.mark.parametrize("variant", RUNS)
def test_empty_extents(variant):
    a, w = _data(5, 7, 9)
    p = bf16.PackedB(w)
    assert bf16.matmul(a[:0], p, np.empty((0, 9), np.float32), variant=variant)
    pn = bf16.PackedB(w[:, :0])
    assert bf16.matmul(a, pn, np.empty((5, 0), np.float32), variant=variant)
    pk = bf16.PackedB(w[:0])
    bias = np.arange(9, dtype=np.float32) - 4
    out = _run(a[:, :0].copy(), pk, variant, bias=bias, clip=(-1.0, 3.0))
    assert np.array_equal(out, np.broadcast_to(np.clip(bias, -1, 3), (5, 9)))


def test_bad_arrays_are_refused_with_an_exception():
    mod = bf16._mod()
    a, w = _data(20, 40, 50)
    p = bf16.PackedB(w)
    out = np.zeros((20, 50), np.float32)
    bias = np.zeros(50, np.float32)
    good = [a, p.data, out, bias, 1, 0, 0.0, 0.0, 1, 0, 0, 40, None]
    mod.bf_matmul(*good)
    bad = {
        0: [a.astype(np.float64), a[:, ::2], a[:, :39].copy(), a.T.copy(), a[0], "a"],
        1: [p.data.astype(np.int16), p.data[:1], p.data[:, :-1].copy(), p.data.reshape(2, -1), p.data[..., ::2]],
        2: [out.astype(np.float64), out[:, :49].copy(), out[:19].copy(), np.zeros((50, 20), np.float32), out[:, ::2]],
        3: [bias[:49].copy(), bias.astype(np.float64)],
        4: [2, -1],
        8: [0],
        9: [6, -1],
        10: [3, -1],
        11: [39, 41, -1],
        12: [out[:19].copy(), out.astype(np.float64), out.reshape(-1), "a"],
    }
    for i, values in bad.items():
        for v in values:
            args = list(good)
            args[i] = v
            with pytest.raises((TypeError, ValueError)):
                mod.bf_matmul(*args)
    ro = out.copy()
    ro.setflags(write=False)
    with pytest.raises(TypeError):
        mod.bf_matmul(a, p.data, ro, *good[3:])
    with pytest.raises(TypeError):
        mod.bf_matmul(*good[:12])
    # the Python entry says False and writes nothing
    sentinel = np.full((20, 50), 7.0, np.float32)
    for call in (lambda: bf16.matmul(a.astype(np.float64), p, sentinel),
                 lambda: bf16.matmul(a[:, :39], p, sentinel),
                 lambda: bf16.matmul(a, p, sentinel[:, :49]),
                 lambda: bf16.matmul(a, p, sentinel, bias=bias[:3]),
                 lambda: bf16.matmul(a, p, sentinel, act="tanh"),
                 lambda: bf16.matmul(a[:, ::1].T.copy().T, p, sentinel),
                 lambda: bf16.matmul(a, p, sentinel, variant="sse9"),
                 lambda: bf16.matmul(a, p, sentinel, addend=np.zeros((20, 50))),
                 lambda: bf16.matmul(a, p, sentinel, addend=np.zeros((20, 49), np.float32)),
                 lambda: bf16.matmul(a, p, sentinel, addend=np.zeros((50, 40), np.float32)[:, ::2].T),
                 lambda: bf16.matmul(a, p, sentinel, addend=np.zeros((40, 20), np.float32).T),
                 lambda: bf16.matmul(a, p, sentinel[:, :49], addend=sentinel[:, 1:])):
        assert call() is False
    assert np.all(sentinel == 7.0)
    with pytest.raises(ValueError):
        bf16.PackedB(w.astype(np.float64))
    for v in bf16.VARIANTS:
        if v not in RUNS:  # a variant this CPU lacks is refused, not run
            with pytest.raises(ValueError):
                mod.bf_matmul(*good[:10], bf16._CODES[v], 40, None)


def test_what_bf16_costs_against_float32():
    """The mode's price, documented: on random data the bf16 product's error is about 1e-3 of the
    output's range (bf16 keeps 8 bits), far above float32's, well under 1e-2."""
    rng = np.random.default_rng(11)
    for m, k, n in ((64, 768, 256), (128, 64, 96)):
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        w = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        exact = a.astype(np.float64) @ w.astype(np.float64)
        fp32 = a @ w
        got = _run(a, bf16.PackedB(w), RUNS[0])
        span = float(np.abs(exact).max())
        rel = float(np.abs(got - exact).max()) / span
        rel32 = float(np.abs(fp32 - exact).max()) / span
        assert 1e-4 < rel < 1e-2, rel
        assert rel > 30 * rel32


@pytest.mark.parametrize("variant", RUNS)
def test_the_switch_is_read_at_each_call(monkeypatch, variant):
    a, w = _data(19, 70, 40, seed=13)
    p = bf16.PackedB(w)
    monkeypatch.setenv("GE_NATIVE_BF16", variant)
    assert bf16.isa() == variant
    out = np.zeros((19, 40), np.float32)
    assert bf16.matmul(a, p, out)
    assert np.array_equal(out.view(np.uint32), _run(a, p, variant).view(np.uint32))


@pytest.mark.parametrize("variant", RUNS)
def test_the_addend_is_added_after_the_bias_before_clip_and_activation(variant):
    m, k, n = 45, 70, 77
    a, w = _data(m, k, n, seed=21)
    p = bf16.PackedB(w)
    rng = np.random.default_rng(4)
    add = rng.standard_normal((m, n)).astype(np.float32)
    bias = np.linspace(-1.0, 1.0, n, dtype=np.float32)
    tol = 2.0 * _bound(a, w)
    for use_bias, clip, act in ((False, None, None), (True, None, None), (True, (-1.0, 2.0), None),
                                (False, None, "hardswish"), (True, (-3.0, 3.0), "silu"), (True, None, "gelu")):
        y = bf16.reference(a, w) + add + (bias.astype(np.float64) if use_bias else 0.0)
        if clip is not None:
            y = np.clip(y, *clip)
        if act is not None:
            y = activations.TABLE[act].np(y)
        out = _run(a, p, variant, bias=bias if use_bias else None, clip=clip, act=act, addend=add)
        err = np.abs(out - y)
        assert np.all(err <= tol + 2e-6 * np.maximum(1.0, np.abs(y))), (variant, use_bias, clip, act, float(err.max()))
        for width in (2, 3):
            again = _run(a, p, variant, width=width, bias=bias if use_bias else None, clip=clip, act=act, addend=add)
            assert np.array_equal(again.view(np.uint32), out.view(np.uint32))
    # out2 as its own addend: a residual added in place
    inplace = add.copy()
    assert bf16.matmul(a, p, inplace, addend=inplace, variant=variant)
    assert np.array_equal(inplace.view(np.uint32), _run(a, p, variant, addend=add).view(np.uint32))


def test_packed_bits_are_wrapped_again_without_a_copy():
    _, w = _data(1, 70, 45)
    p = bf16.PackedB(w)
    stored = p.data.copy()
    stored.setflags(write=False)  # as a read-only memory map gives it
    q = bf16.PackedB.from_data(stored, 70, 45)
    assert q.shape == (70, 45) and q.kp == p.kp and np.shares_memory(q.data, stored)
    assert np.array_equal(q.data, p.data)
    # bytes at an offset of a larger buffer (not 64-byte aligned)
    raw = np.zeros(stored.size + 3, np.uint16)
    raw[3:] = stored.reshape(-1)
    moved = bf16.PackedB.from_data(raw[3:].reshape(stored.shape), 70, 45)
    a = _data(33, 70, 45, seed=2)[0]
    want = _run(a, p, RUNS[0])
    for wrapped in (q, moved):
        assert np.array_equal(_run(a, wrapped, RUNS[0]).view(np.uint32), want.view(np.uint32))
    assert np.array_equal(stored, p.data)  # never written
    for data, k, n in ((stored, 64, 45), (stored, 70, 65), (stored, 97, 45), (stored.astype(np.int16), 70, 45),
                       (stored[..., ::2], 70, 45), (stored.reshape(2, -1), 70, 45), (list(stored), 70, 45)):
        with pytest.raises(ValueError):
            bf16.PackedB.from_data(data, k, n)


@pytest.mark.parametrize("variant", RUNS)
def test_many_row_blocks_and_panel_groups_at_every_width(variant):
    """AMX rounds A once for all tasks and splits rows by A's size (512 KiB a block: k = 1000
    gives blocks of 256 rows, so M = 700 is 3 or 4 blocks, the last one partial) and panels by
    the width; a GEMM under 2^22 multiply-adds runs on one thread: every split the same bits."""
    for m, k, n, act in ((700, 1000, 70, "gelu"), (130, 300, 530, None), (40, 64, 96, "silu")):
        a, w = _data(m, k, n, seed=11)
        p = bf16.PackedB(w)
        bias = np.linspace(-1.0, 1.0, n, dtype=np.float32)
        one = _run(a, p, variant, bias=bias, act=act)
        y = activations.TABLE[act].np(bf16.reference(a, w) + bias) if act else bf16.reference(a, w) + bias
        err = np.abs(one - y)
        assert np.all(err <= 2.0 * _bound(a, w) + 2e-6 * np.maximum(1.0, np.abs(y))), (variant, m, float(err.max()))
        for width in (2, 3, 4):
            assert np.array_equal(_run(a, p, variant, width=width, bias=bias, act=act).view(np.uint32),
                                  one.view(np.uint32)), (variant, m, width)


@pytest.mark.parametrize("variant", RUNS)
def test_a_row_has_the_same_bits_whatever_rows_share_its_block(variant):
    """Row r of C is the same sum whether its block of 32 rows is whole, holds 17 live rows, or
    up to 16 (where AMX computes only the upper tiles); with an epilogue (one block's run while
    the next block multiplies) and without (the tiles stored straight into C), over panels of
    every width."""
    a, w = _data(96, 200, 75, seed=13)
    p = bf16.PackedB(w)
    bias = np.linspace(-2.0, 2.0, 75, dtype=np.float32)
    for kw in ({}, {"bias": bias, "act": "gelu"}, {"act": "silu", "clip": (-1.0, 1.0)}):
        full = _run(a, p, variant, **kw)
        for m in (1, 5, 16, 17, 31, 33, 48, 49, 64, 80, 95):
            got = _run(np.ascontiguousarray(a[:m]), p, variant, **kw)
            assert np.array_equal(got.view(np.uint32), full[:m].view(np.uint32)), (variant, m, kw)


def test_gelu_at_the_store_keeps_nan_and_the_limits():
    a = np.array([[np.nan], [1.0], [-30.0], [30.0], [0.0], [-1e-3]], np.float32)  # bf16-exact but -1e-3
    p = bf16.PackedB(np.ones((1, 1), np.float32))
    x = float(bf16.round_bf16(np.float32(-1e-3)))
    for v in RUNS:
        out = _run(a, p, v, act="gelu")[:, 0]
        assert np.isnan(out[0]) and out[2] == 0.0 and out[3] == 30.0 and out[4] == 0.0, v
        assert abs(out[1] - 0.8413447460685429) <= 1e-6 and abs(out[5] - activations.TABLE["gelu"].np(np.array([x]))[0]) <= 1e-9, v
