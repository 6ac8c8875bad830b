"""GE's int8 GEMM (ge_native.int8): every variant this machine runs bit for bit against the NumPy
reference (int64 sums, the float32 epilogue in the kernel's order), across thread counts, its
quantisation (rounding, saturation, zero points, dynamic), its epilogue, its refusals, its
dispatch."""

from __future__ import annotations

import numpy as np
import pytest

from ge_native import int8, isa

from .switch import CPUINFO_SPR, probe

RUNS = int8.runnable()
SIZES = (1, 3, 15, 16, 17, 63, 64, 65, 100, 257)
#: every size in every position
SHAPES = sorted({(s, 65, 17) for s in SIZES} | {(15, s, 33) for s in SIZES} | {(3, 100, s) for s in SIZES}
                | {(257, 257, 257), (64, 64, 64)})
ONE = np.ones(1, np.float32)


def _data(m: int, k: int, n: int, seed: int = 0, spread: float = 3.0):
    rng = np.random.default_rng(seed + 7919 * m + 31 * k + n)
    a = (rng.standard_normal((m, k)) * spread).astype(np.float32)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    ws = rng.uniform(1e-3, 2e-2, n).astype(np.float32)
    return a, w, ws


def _run(a, p, variant, x_scale=0.05, zp=3, dtype="uint8", width=1, **kw) -> np.ndarray:
    out = np.full((a.shape[0], p.n), np.nan, np.float32)
    assert int8.matmul(a, p, out, x_scale, zp, dtype, width=width, variant=variant, **kw)
    return out


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    return x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))


def test_the_variants_this_machine_runs_are_those_its_features_promise():
    assert int8.available()
    f = isa.features()
    vnni = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= f
    want = tuple(v for v, ok in (("amx_int8", vnni and {"amx_int8", "amx_tile"} <= f), ("avx512_vnni", vnni),
                                 ("avx2", "avx2" in f), ("scalar", True)) if ok)
    assert RUNS == want
    assert int8.isa() == RUNS[0] == isa.variant_of("int8gemm")


def test_the_family_chooses_by_features():
    fam = isa.family("int8gemm")
    assert fam.names() == int8.VARIANTS and fam.switch == "GE_NATIVE_INT8"
    spr = isa.parse_cpuinfo(CPUINFO_SPR) | {"avx512_vnni"}
    assert fam.best(spr) == "amx_int8"
    assert fam.best(spr - {"amx_int8"}) == "avx512_vnni"  # Zen 4
    assert fam.best(spr - {"amx_int8", "avx512_vnni"}) == "avx2"
    assert fam.best(frozenset({"sse2"})) == "scalar"


_PROBE = """
import json, numpy as np
from ge_native import int8, isa
a = np.linspace(-2, 3, 17 * 70, dtype=np.float32).reshape(17, 70)
w = (np.arange(70 * 33) % 251 - 125).astype(np.int8).reshape(70, 33)
out = np.zeros((17, 33), np.float32)
ran = int8.matmul(a, int8.PackedB8(w), out, 0.03, 5, w_scale=np.full(1, 0.01, np.float32))
print(json.dumps({"isa": int8.isa(), "family": isa.variant_of("int8gemm"), "ran": ran,
                  "bits": out.view(np.uint32).tolist()}))
"""


def test_the_switch_forces_each_variant_and_turns_the_path_off():
    a = np.linspace(-2, 3, 17 * 70, dtype=np.float32).reshape(17, 70)
    p = int8.PackedB8((np.arange(70 * 33) % 251 - 125).astype(np.int8).reshape(70, 33))
    default = probe(_PROBE, None, "GE_NATIVE_INT8")
    assert default["isa"] == default["family"] == RUNS[0] and default["ran"]
    for v in RUNS:
        got = probe(_PROBE, v, "GE_NATIVE_INT8")
        assert got["isa"] == got["family"] == v and got["ran"]
        want = _run(a, p, v, 0.03, 5, w_scale=np.full(1, 0.01, np.float32))
        assert got["bits"] == want.view(np.uint32).tolist()
    off = probe(_PROBE, "0", "GE_NATIVE_INT8")
    assert off["isa"] is None and off["family"] == "scalar" and off["ran"] is False
    assert probe(_PROBE, "sse9", "GE_NATIVE_INT8")["isa"] == RUNS[0]


@pytest.mark.parametrize("variant", RUNS)
def test_odd_shapes_match_the_reference_bit_for_bit(variant):
    for i, (m, k, n) in enumerate(SHAPES):
        a, w, ws = _data(m, k, n)
        p = int8.PackedB8(w)
        q = (0.04, 7, "uint8") if i % 2 else (0.03, -9, "int8")
        scale = ws if i % 3 else ws[:1].copy()
        got = _run(a, p, variant, *q, w_scale=scale)
        assert _same(got, int8.reference(a, w, *q, w_scale=scale)), (variant, m, k, n, q)


@pytest.mark.parametrize("variant", RUNS)
def test_quantisation_rounds_half_to_even_and_saturates(variant):
    s = np.float32(0.25)
    # a / s: 0.5, 1.5, 2.5, -0.5, -1.5, huge, -huge, inf, -inf, 1 ulp past 2.5
    a = np.array([[0.125, 0.375, 0.625, -0.125, -0.375, 1e30, -1e30, np.inf, -np.inf,
                   np.nextafter(np.float32(0.625), np.float32(1))]], np.float32)
    w = np.eye(10, dtype=np.int8)
    p = int8.PackedB8(w)
    for dtype, zp, want in (("uint8", 10, [0, 2, 2, 0, -2, 245, -10, 245, -10, 3]),
                            ("int8", -3, [0, 2, 2, 0, -2, 130, -125, 130, -125, 3]),
                            ("uint8", 0, [0, 2, 2, 0, 0, 255, 0, 255, 0, 3])):
        got = _run(a, p, variant, float(s), zp, dtype)
        assert got[0].tolist() == [v * 0.25 for v in want], (variant, dtype, zp, got)
    # far outside the grid at both ends, a whole product
    a, w, ws = _data(40, 130, 50, seed=3, spread=1e3)
    for q in ((0.05, 250, "uint8"), (0.05, 0, "uint8"), (0.02, 127, "int8"), (0.02, -128, "int8")):
        assert _same(_run(a, int8.PackedB8(w), variant, *q, w_scale=ws), int8.reference(a, w, *q, w_scale=ws)), q


@pytest.mark.parametrize("variant", RUNS)
def test_dynamic_quantisation(variant):
    a, w, ws = _data(37, 150, 70, seed=5)
    p = int8.PackedB8(w)
    for x in (a, np.zeros_like(a), -np.abs(a) - 1, np.abs(a) + 1, a * np.float32(1e-30), a[:1, :1].copy()):
        x = np.ascontiguousarray(x)
        pp = p if x.shape[1] == 150 else int8.PackedB8(w[:1])
        got = _run(x, pp, variant, None, 0, w_scale=ws)
        assert _same(got, int8.reference(x, w[: x.shape[1]], None, w_scale=ws)), variant
    f = np.float32
    assert int8.dynamic_params(np.zeros(5, f)) == (f(1), 0)
    s, z = int8.dynamic_params(np.array([-2.0, -1.0], f))
    assert s == f(2) / f(255) and z == 255
    s, z = int8.dynamic_params(np.array([-1.0, 3.0], f))
    assert s == f(4) / f(255) and z == 64  # rint(63.75)
    out = np.zeros((37, 70), np.float32)
    assert int8.matmul(a, p, out, None, 0, "int8", variant=variant) is False  # dynamic is uint8


def _epilogues(n: int, m: int):
    rng = np.random.default_rng(9)
    bias = rng.standard_normal(n).astype(np.float32)
    add = rng.standard_normal((m, n)).astype(np.float32)
    oq = (0.05, 7, 0, 255)
    return [dict(bias=bias), dict(addend=add), dict(clip=(-0.5, 1.5)), dict(out_quant=oq),
            dict(out_quant=(0.02, -3, -128, 127)), dict(bias=bias, addend=add, clip=(-2.0, 2.0), out_quant=oq)]


def _close(got: np.ndarray, want: np.ndarray, out_quant) -> bool:
    """An activation's result within a few ulps (the vector forms' math differs from NumPy's in
    the last bits), or one step of the output grid where an output fake-quant follows."""
    tol = 4e-6 * np.maximum(1.0, np.abs(want))
    if out_quant is not None:
        tol = tol + np.float32(out_quant[0]) * 1.0001
    return bool(np.all(np.abs(got - want) <= tol))


@pytest.mark.parametrize("variant", RUNS)
def test_every_epilogue_alone_and_together(variant):
    m, k, n = 37, 200, 45
    a, w, ws = _data(m, k, n, seed=7)
    p = int8.PackedB8(w)
    for kw in _epilogues(n, m):
        got = _run(a, p, variant, w_scale=ws, **kw)
        assert _same(got, int8.reference(a, w, 0.05, 3, w_scale=ws, **kw)), (variant, list(kw))
        for act in int8.ACTIVATIONS:
            got = _run(a, p, variant, w_scale=ws, act=act, **kw)
            want = int8.reference(a, w, 0.05, 3, w_scale=ws, act=act, **kw)
            assert _close(got, want, kw.get("out_quant")), (variant, act, list(kw))
    # the output's fake-quant lands on its grid
    oq = (0.05, 7, 0, 255)
    got = _run(a, p, variant, w_scale=ws, out_quant=oq)
    steps = got / np.float32(0.05) + 7
    assert np.all(np.abs(steps - np.rint(steps)) < 1e-3) and steps.min() >= -1e-3 and steps.max() <= 255.001
    # out2 as its own addend: a residual added in place
    add = _epilogues(n, m)[1]["addend"]
    inplace = add.copy()
    assert int8.matmul(a, p, inplace, 0.05, 3, w_scale=ws, addend=inplace, variant=variant)
    assert _same(inplace, _run(a, p, variant, w_scale=ws, addend=add))


def test_the_variants_agree_and_bits_are_the_same_at_every_width():
    for m, k, n in ((257, 64, 257), (100, 257, 33), (1, 33, 300), (700, 1000, 70)):
        a, w, ws = _data(m, k, n, seed=11)
        p = int8.PackedB8(w)
        want = int8.reference(a, w, 0.05, 3, w_scale=ws)
        for v in RUNS:
            assert _same(_run(a, p, v, w_scale=ws), want), (v, m, k, n)
            one = _run(a, p, v, w_scale=ws, act="gelu", bias=ws)
            for width in (2, 3):
                assert _same(_run(a, p, v, width=width, w_scale=ws, act="gelu", bias=ws), one), (v, width)


@pytest.mark.parametrize("variant", RUNS)
def test_a_row_has_the_same_bits_whatever_rows_share_its_block(variant):
    a, w, ws = _data(96, 200, 75, seed=13)
    p = int8.PackedB8(w)
    full = _run(a, p, variant, w_scale=ws, act="silu")
    for m in (1, 5, 16, 17, 31, 33, 48, 49, 64, 80, 95):
        assert _same(_run(np.ascontiguousarray(a[:m]), p, variant, w_scale=ws, act="silu"), full[:m]), (variant, m)


def test_the_packed_layout_holds_the_quads_and_the_column_sums():
    _, w, _ = _data(1, 70, 45)
    p = int8.PackedB8(w)
    assert p.shape == (70, 45) and p.kp == 128 and p.data.dtype == np.int8
    assert p.data.shape == (2, 32, 128) and p.data.ctypes.data % 64 == 0
    for kk, j in ((0, 0), (1, 0), (69, 44), (17, 31), (2, 32), (64, 5)):
        assert p.data[j // 32, kk // 4, 4 * (j % 32) + kk % 4] == w[kk, j]
    assert p.data[:, 18:].max() == 0 and p.data[:, 17, 2::4].max() == 0 and p.data[1, :, 4 * 13:].max() == 0
    assert p.colsum.dtype == np.int32 and np.array_equal(p.colsum, w.astype(np.int64).sum(0))
    with pytest.raises(ValueError):
        int8.PackedB8(w.astype(np.int16))
    with pytest.raises(ValueError):
        int8.PackedB8(w.reshape(-1))


def test_packed_bits_are_wrapped_again_without_a_copy():
    a, w, ws = _data(33, 70, 45, seed=2)
    p = int8.PackedB8(w)
    stored = p.data.copy()
    stored.setflags(write=False)  # as a read-only memory map gives it
    q = int8.PackedB8.from_data(stored, 70, 45)
    assert q.shape == (70, 45) and np.shares_memory(q.data, stored) and np.array_equal(q.colsum, p.colsum)
    assert _same(_run(a, q, RUNS[0], w_scale=ws), _run(a, p, RUNS[0], w_scale=ws))
    assert np.array_equal(stored, p.data)
    for data, k, n in ((stored, 64, 45), (stored, 70, 65), (stored, 129, 45), (stored.astype(np.int16), 70, 45),
                       (stored[..., ::2], 70, 45), (stored.reshape(2, -1), 70, 45), (list(stored), 70, 45)):
        with pytest.raises(ValueError):
            int8.PackedB8.from_data(data, k, n)


@pytest.mark.parametrize("variant", RUNS)
def test_empty_extents(variant):
    a, w, ws = _data(5, 7, 9)
    p = int8.PackedB8(w)
    assert int8.matmul(a[:0], p, np.empty((0, 9), np.float32), 0.1, variant=variant)
    assert int8.matmul(a, int8.PackedB8(w[:, :0]), np.empty((5, 0), np.float32), 0.1, variant=variant)
    bias = np.arange(9, dtype=np.float32) - 4
    out = _run(a[:, :0].copy(), int8.PackedB8(w[:0]), variant, bias=bias, clip=(-1.0, 3.0))
    assert np.array_equal(out, np.broadcast_to(np.clip(bias, -1, 3), (5, 9)))


def test_bad_arguments_are_refused_without_a_write():
    a, w, ws = _data(19, 70, 40, seed=13)
    p = int8.PackedB8(w)
    out = np.full((19, 40), 7.0, np.float32)
    wide = np.zeros((19, 80), np.float32)
    calls = [
        lambda: int8.matmul(a.astype(np.float64), p, out, 0.1),
        lambda: int8.matmul(a[:, :69].copy(), p, out, 0.1),
        lambda: int8.matmul(np.asfortranarray(a), p, out, 0.1),
        lambda: int8.matmul(a, p, wide[:, :40], 0.1),
        lambda: int8.matmul(a, p, out[:18], 0.1),
        lambda: int8.matmul(a, w, out, 0.1),
        lambda: int8.matmul(a, p, out, 0.0),
        lambda: int8.matmul(a, p, out, -0.1),
        lambda: int8.matmul(a, p, out, float("nan")),
        lambda: int8.matmul(a, p, out, float("inf")),
        lambda: int8.matmul(a, p, out, 1e39),
        lambda: int8.matmul(a, p, out, 0.1, 256),
        lambda: int8.matmul(a, p, out, 0.1, 128, "int8"),
        lambda: int8.matmul(a, p, out, 0.1, 0, "int16"),
        lambda: int8.matmul(a, p, out, 0.1, w_scale=ws[:39].copy()),
        lambda: int8.matmul(a, p, out, 0.1, w_scale=ws.astype(np.float64)),
        lambda: int8.matmul(a, p, out, 0.1, bias=np.zeros(41, np.float32)),
        lambda: int8.matmul(a, p, out, 0.1, bias=np.zeros(40)),
        lambda: int8.matmul(a, p, out, 0.1, addend=np.zeros((19, 40))),
        lambda: int8.matmul(a, p, out, 0.1, addend=wide[:, :40]),
        lambda: int8.matmul(a, p, out, 0.1, act="tanh"),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.0, 0, 0, 255)),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.1, 0)),
        lambda: int8.matmul(a, p, out, 0.1, variant="sse9"),
    ]
    for i, call in enumerate(calls):
        assert call() is False, i
    assert np.all(out == 7.0)
    room = np.zeros(19 * 70 + 19 * 40, np.float32)  # the output overlapping A
    assert int8.matmul(room[:19 * 70].reshape(19, 70), p, room[19 * 30:19 * 70].reshape(19, 40), 0.1) is False
    # the C entry checks again: it raises, it does not crash
    mod = int8._mod()
    fp, ip = np.array([0.1, 3, 0, 0, 0, 0, 0, 0], np.float32), np.array([0, 0, 0, 0, 1, 0], np.int64)
    good = [a, p.data, out, p.colsum_padded, ws, int8._NO_BIAS, None, fp, ip, 70]
    bad = {0: [a[:, :69].copy()], 1: [p.data[:1].copy(), p.data.astype(np.uint8)], 2: [out[:18].copy()],
           3: [p.colsum_padded[:40].copy()], 4: [ws[:3].copy()],
           6: [np.zeros((19, 41), np.float32)], 7: [fp[:7].copy(), np.array([-1, 3, 0, 0, 0, 0, 0, 0], np.float32),
                                                    np.array([0.1, 3.5, 0, 0, 0, 0, 0, 0], np.float32)],
           8: [np.array([0, 0, 9, 0, 1, 0], np.int64), np.array([0, 0, 0, 0, 1, 7], np.int64),
               np.array([1, 0, 0, 0, 1, 0], np.int64)], 9: [71, -1]}
    for i, values in bad.items():
        for v in values:
            args = list(good)
            args[i] = v
            with pytest.raises((TypeError, ValueError)):
                mod.i8_matmul(*args)
    assert np.all(out == 7.0)


def test_a_variant_this_cpu_cannot_run_is_refused_and_the_switch_falls_back():
    a, w, ws = _data(5, 70, 9)
    p = int8.PackedB8(w)
    out = np.full((5, 9), 7.0, np.float32)
    for v in int8.VARIANTS:
        if v in RUNS:
            continue
        assert int8.matmul(a, p, out, 0.1, variant=v) is False and np.all(out == 7.0), v
        assert probe(_PROBE, v, "GE_NATIVE_INT8")["isa"] == RUNS[0], v
    # the C entry refuses a variant code outside the mask without touching memory
    assert set(RUNS) <= set(int8.VARIANTS) and RUNS[-1] == "scalar"


#: a uint8 output's (scale, zero point, qlo, qhi): wide, saturating at both ends, narrowed
OUT8 = [(0.05, 3, 0, 255), (0.004, 128, 0, 255), (0.05, 100, 17, 201)]


def _u8(m: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 13 * m + k).integers(0, 256, (m, k), dtype=np.uint8)


def _run8(a, p, variant, x_scale, zp, oq, width=1, **kw) -> np.ndarray:
    """matmul into a uint8 output (``oq``) or, ``oq`` None, a float32 one."""
    out = np.full((a.shape[0], p.n), 7, np.uint8) if oq is not None else np.full((a.shape[0], p.n), np.nan, np.float32)
    assert int8.matmul(a, p, out, x_scale, zp, width=width, variant=variant, out_quant=oq, **kw)
    return out


def _bits(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("variant", RUNS)
def test_uint8_activations_in_and_out_match_the_reference(variant):
    for i, (m, k, n) in enumerate(SHAPES[::2]):
        _, w, ws = _data(m, k, n)
        a, p = _u8(m, k, i), int8.PackedB8(w)
        for zp in (0, 128, 255):
            for oq in (None, OUT8[i % 3]):
                got = _run8(a, p, variant, 0.03, zp, oq, w_scale=ws)
                want = int8.reference(a, w, 0.03, zp, w_scale=ws, out_quant=oq, out_dtype="float32" if oq is None else "uint8")
                assert _bits(got, want), (variant, m, k, n, zp, oq)
    # a float32 A (static and dynamic) into a uint8 output
    a, w, ws = _data(37, 150, 70, seed=5)
    for xs in (0.05, None):
        got = _run8(a, int8.PackedB8(w), variant, xs, 3, OUT8[1], w_scale=ws)
        assert _bits(got, int8.reference(a, w, xs, 3, w_scale=ws, out_quant=OUT8[1], out_dtype="uint8")), (variant, xs)


@pytest.mark.parametrize("variant", RUNS)
def test_a_uint8_output_after_every_epilogue_saturates_at_both_ends(variant):
    m, k, n = 37, 200, 45
    _, w, ws = _data(m, k, n, seed=7)
    a, p = _u8(m, k, 7), int8.PackedB8(w)
    seen = set()
    for oq in OUT8:
        for kw in _epilogues(n, m)[:3] + [dict(clip=(0.0, 6.0)), dict(clip=(-1e30, 1e30), bias=ws)]:
            kw.pop("out_quant", None)
            got = _run8(a, p, variant, 0.05, 3, oq, w_scale=ws, **kw)
            assert _bits(got, int8.reference(a, w, 0.05, 3, w_scale=ws, out_quant=oq, out_dtype="uint8", **kw)), (variant, oq, list(kw))
            seen |= {int(got.min()), int(got.max())}
            for act in int8.ACTIVATIONS:
                got = _run8(a, p, variant, 0.05, 3, oq, w_scale=ws, act=act, **kw)
                want = int8.reference(a, w, 0.05, 3, w_scale=ws, act=act, out_quant=oq, out_dtype="uint8", **kw)
                assert np.abs(got.astype(np.int32) - want).max() <= 1, (variant, act, list(kw))
    assert {0, 255, 17, 201} <= seen
    # an output scale whose reciprocal is not a normal float32's 2^-100..2^100: the division itself
    for oq in ((1e-32, 0, 0, 255), (3e-31, 9, 5, 250), (1e31, 5, 0, 255)):
        kw = dict(addend=_epilogues(n, m)[1]["addend"] * np.float32(oq[0] * 50), w_scale=ws * np.float32(oq[0]))
        got = _run8(a, p, variant, 0.05, 3, oq, **kw)
        assert _bits(got, int8.reference(a, w, 0.05, 3, out_quant=oq, out_dtype="uint8", **kw)), (variant, oq)
        assert 5 < len(np.unique(got)) and got.min() == oq[2] and got.max() == oq[3]
    # the quotient's edges: ties to even, infinities, NaN (qlo), far past the grid
    s = np.float32(0.25)
    add = np.array([[0.125, 0.375, -0.125, 1e30, -1e30, np.inf, -np.inf, np.nan, 31.875, 32.375]], np.float32)
    got = _run8(np.zeros((1, 1), np.uint8), int8.PackedB8(np.zeros((1, 10), np.int8)), variant, 0.5, 0,
                (float(s), 100, 0, 255), addend=add)
    assert got[0].tolist() == [100, 102, 100, 255, 0, 255, 0, 0, 228, 230], (variant, got)


def test_uint8_bits_are_the_same_in_every_variant_and_at_every_width():
    for m, k, n in ((257, 64, 257), (100, 257, 33), (700, 1000, 70)):
        _, w, ws = _data(m, k, n, seed=11)
        a, p = _u8(m, k, 11), int8.PackedB8(w)
        want = int8.reference(a, w, 0.01, 77, w_scale=ws, bias=ws, out_quant=OUT8[0], out_dtype="uint8")
        for v in RUNS:
            assert _bits(_run8(a, p, v, 0.01, 77, OUT8[0], w_scale=ws, bias=ws), want), (v, m, k, n)
            one = _run8(a, p, v, 0.01, 77, OUT8[0], w_scale=ws, act="gelu")
            for width in (2, 3):
                assert _bits(_run8(a, p, v, 0.01, 77, OUT8[0], width, w_scale=ws, bias=ws), want), (v, width)
                assert _bits(_run8(a, p, v, 0.01, 77, OUT8[0], width, w_scale=ws, act="gelu"), one), (v, width)


def test_uint8_arrays_that_do_not_fit_are_refused_without_a_write():
    a, w, ws = _data(19, 70, 40, seed=13)
    a8, p = _u8(19, 70), int8.PackedB8(w)
    out, out32 = np.full((19, 40), 7, np.uint8), np.full((19, 40), 7.0, np.float32)
    oq = OUT8[0]
    calls = [
        lambda: int8.matmul(a, p, out, 0.1),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.05, 3, 0, 256)),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.05, 3, -1, 255)),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.05, 3, 200, 100)),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.05, 3.5, 0, 255)),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.05, 3, 0, float("inf"))),
        lambda: int8.matmul(a, p, out, 0.1, out_quant=(0.05, 3, 0)),
        lambda: int8.matmul(a8, p, out32, 0.1, 0, "int8"),
        lambda: int8.matmul(a8, p, out32, None),
        lambda: int8.matmul(a8, p, out32, 0.1, -1),
        lambda: int8.matmul(a8[:, :69].copy(), p, out, 0.1, out_quant=oq),
        lambda: int8.matmul(a8.astype(np.int8), p, out, 0.1, out_quant=oq),
        lambda: int8.matmul(np.asfortranarray(a8), p, out, 0.1, out_quant=oq),
        lambda: int8.matmul(a8, p, out[:18], 0.1, out_quant=oq),
        lambda: int8.matmul(a8, p, out.astype(np.uint16), 0.1, out_quant=oq),
        lambda: int8.matmul(a8, p, out, 0.1, out_quant=oq, addend=np.zeros((19, 40), np.uint8)),
    ]
    for i, call in enumerate(calls):
        assert call() is False, i
    assert np.all(out == 7) and np.all(out32 == 7.0)
    room = np.zeros(19 * 40 * 4, np.float32)  # an addend overlapping the uint8 output
    assert int8.matmul(a8, p, room.view(np.uint8)[: 19 * 40].reshape(19, 40), 0.1, out_quant=oq,
                       addend=room[: 19 * 40].reshape(19, 40)) is False
    mod = int8._mod()
    fp, ip = np.array([0.1, 3, 0, 0, 0.05, 3, 0, 255], np.float32), np.array([0, 0, 0, 1, 1, 0], np.int64)
    good = [a8, p.data, out, p.colsum_padded, ws, int8._NO_BIAS, None, fp, ip, 70]
    mod.i8_matmul(*good)
    assert not np.all(out == 7)
    out[:] = 7
    bad = {7: [np.array([0.1, 3, 0, 0, 0.05, 3, 0, 256], np.float32), np.array([0, 3, 0, 0, 0.05, 3, 0, 255], np.float32),
               np.array([0.1, 3, 0, 0, 0.05, 3.5, 0, 255], np.float32)],
           8: [np.array([0, 0, 0, 0, 1, 0], np.int64)], 0: [a8[:, :69].copy(), a8.astype(np.int8)],
           2: [out.astype(np.int8)]}
    for i, values in bad.items():
        for v in values:
            args = list(good)
            args[i] = v
            with pytest.raises((TypeError, ValueError)):
                mod.i8_matmul(*args)
    assert np.all(out == 7)


#: mid fake-quants (scale, zero point, lo, hi): u8's grid, int8's, a 16-bit one, the widest, and
#: one that saturates at both ends on nearly every value
MIDS = [(0.05, 128, 0, 255), (0.02, -3, -128, 127), (3e-4, -700, -32768, 32767), (0.01, 0, -65536, 65536),
        (0.4, 2, -1, 4)]


def _mid_data(m: int, k: int, n: int, seed: int):
    a, w, ws = _data(m, k, n, seed)
    rng = np.random.default_rng(seed + 5)
    a8 = rng.integers(0, 256, (m, k), dtype=np.uint8)
    return a, a8, w, ws, rng.standard_normal(n).astype(np.float32), (rng.standard_normal((m, n)) * 2).astype(np.float32)


@pytest.mark.parametrize("variant", RUNS)
def test_a_mid_fake_quant_matches_the_reference_bit_for_bit(variant):
    for m, k, n in ((17, 65, 40), (64, 64, 64), (3, 257, 33)):
        a, a8, w, ws, bias, add = _mid_data(m, k, n, 1)
        p = int8.PackedB8(w)
        for mq in MIDS:
            for xs in (0.05, None):
                got = _run(a, p, variant, xs, 0 if xs is None else 3, w_scale=ws, bias=bias, mid_quant=mq)
                want = int8.reference(a, w, xs, 0 if xs is None else 3, w_scale=ws, bias=bias, mid_quant=mq)
                assert _same(got, want), (variant, m, k, n, mq, xs)
            # a residual block's end: + shortcut, relu, the output's fake-quant (float32 and uint8)
            kw = dict(w_scale=ws, bias=bias, mid_quant=mq, addend=add, clip=(0.0, np.inf))
            got = _run(a, p, variant, out_quant=(0.04, 100, 17, 201), **kw)
            want = int8.reference(a, w, 0.05, 3, out_quant=(0.04, 100, 17, 201), **kw)
            assert _same(got, want), (variant, m, mq)
            for oq in ((0.05, 3, 0, 255), (0.04, 100, 17, 201)):
                out = np.full((m, n), 7, np.uint8)
                assert int8.matmul(a8, p, out, 0.03, 17, variant=variant, out_quant=oq, **kw)
                assert np.array_equal(out, int8.reference(a8, w, 0.03, 17, out_quant=oq, out_dtype="uint8", **kw))


@pytest.mark.parametrize("variant", RUNS)
def test_the_mid_fake_quant_rounds_ties_to_even_and_saturates(variant):
    a, a8, w, ws, bias, add = _mid_data(19, 70, 40, 2)
    p = int8.PackedB8(w)
    # y = acc * 3/8 exactly, ms 3/4: y / ms = acc / 2, a tie at every odd sum
    for ms, mz, lo, hi in ((0.75, 0, -65536, 65536), (0.75, 5, -40, 60)):
        got = _run(a8, p, variant, 0.5, 9, w_scale=np.full(1, 0.75, np.float32), mid_quant=(ms, mz, lo, hi))
        want = int8.reference(a8, w, 0.5, 9, w_scale=np.full(1, 0.75, np.float32), mid_quant=(ms, mz, lo, hi))
        assert _same(got, want)
    assert got.min() == np.float32(-45 * 0.75) and got.max() == np.float32(55 * 0.75)
    acc = (a8.astype(np.int64) - 9) @ w.astype(np.int64)
    assert np.array_equal(_run(a8, p, variant, 0.5, 9, w_scale=np.full(1, 0.75, np.float32),
                               mid_quant=(0.75, 0, -65536, 65536)),
                          np.clip(np.rint(acc / 2), -65536, 65536).astype(np.float32) * np.float32(0.75))
    assert (acc % 2).any() and (np.abs(acc) > 2 ** 17).any()
    # a scale whose reciprocal is past 2^100 (the vector forms divide), the sums scaled to meet it
    tiny = (ws * np.float32(1e-30)).astype(np.float32)
    for mq in ((1e-31, 3, -200, 250), (1e-31, 0, -5, 5)):
        assert _same(_run(a, p, variant, w_scale=tiny, mid_quant=mq), int8.reference(a, w, 0.05, 3, w_scale=tiny, mid_quant=mq))
    # NaN gives mlo, +-inf their ends
    odd = bias.copy()
    odd[:3] = [np.nan, np.inf, -np.inf]
    got = _run(a, p, variant, w_scale=ws, bias=odd, mid_quant=MIDS[1])
    assert _same(got, int8.reference(a, w, 0.05, 3, w_scale=ws, bias=odd, mid_quant=MIDS[1]))
    assert np.all(got[:, :3] == np.float32([-125 * 0.02, 130 * 0.02, -125 * 0.02]))


def test_mid_fake_quant_bits_are_the_same_at_widths_1_and_2():
    a, a8, w, ws, bias, add = _mid_data(257, 257, 100, 3)
    p = int8.PackedB8(w)
    kw = dict(w_scale=ws, bias=bias, mid_quant=MIDS[0], addend=add, clip=(0.0, np.inf))
    want = int8.reference(a8, w, 0.03, 17, out_quant=(0.05, 3, 0, 255), out_dtype="uint8", **kw)
    want32 = int8.reference(a, w, 0.05, 3, **kw)
    for v in RUNS:
        for width in (1, 2):
            out = np.full(want.shape, 7, np.uint8)
            assert int8.matmul(a8, p, out, 0.03, 17, width=width, variant=v, out_quant=(0.05, 3, 0, 255), **kw)
            assert np.array_equal(out, want) and _same(_run(a, p, v, width=width, **kw), want32), (v, width)


def test_a_mid_fake_quant_that_does_not_fit_is_refused_without_a_write():
    a, a8, w, ws, bias, add = _mid_data(19, 70, 40, 4)
    p = int8.PackedB8(w)
    out = np.full((19, 40), 7.0, np.float32)
    for mq in ((0.0, 0, 0, 255), (-0.1, 0, 0, 255), (np.inf, 0, 0, 255), (np.nan, 0, 0, 255), (1e39, 0, 0, 255),
               (0.1, 0, 10, 5), (0.1, 300, 0, 255), (0.1, 0.5, 0, 255), (0.1, 0, 0, 65537), (0.1, 0, -65537, 0),
               (0.1, 0, 0), "abcd", 0.1):
        assert int8.matmul(a, p, out, 0.1, mid_quant=mq) is False, mq
    assert np.all(out == 7.0)
    mod = int8._mod()
    ip = np.array([0, 0, 0, 0, 1, 0], np.int64)
    good = [a, p.data, out, p.colsum_padded, ws, int8._NO_BIAS, None,
            np.array([0.1, 3, 0, 0, 0, 0, 0, 0, 0.05, 3, 0, 255], np.float32), ip, 70]
    for mid in ((0, 3, 0, 255), (0.05, 3, 4, 255), (0.05, 3.5, 0, 255), (0.05, 3, -65537, 255), (np.nan, 3, 0, 255)):
        args = list(good)
        args[7] = np.array([0.1, 3, 0, 0, 0, 0, 0, 0, *mid], np.float32)
        with pytest.raises((TypeError, ValueError)):
            mod.i8_matmul(*args)
    assert np.all(out == 7.0)
    mod.i8_matmul(*good)
    assert not np.all(out == 7.0)
