"""GE's bf16 attention (ge_native.bf16attn): every variant this machine runs against float64
references of the bf16-rounded inputs (P rounded as the kernel rounds it), on odd sizes, strided
and broadcast views, masks with -inf; the same bits at every width; the variants against each
other; the refusals; the dispatch."""

from __future__ import annotations

import numpy as np
import pytest

from ge_native import bf16attn, isa

from .switch import check_family, expected_variants, probe

RUNS = bf16attn.runnable()
SIZES = (1, 3, 17, 33, 64, 65, 197)
#: (G, m, n, d, dv): every size in every position, and the ViT/BERT shapes
SHAPES = sorted({(2, s, 33, 17, 3) for s in SIZES} | {(1, 17, s, 33, 65) for s in SIZES}
                | {(2, 33, 17, s, 64) for s in SIZES} | {(1, 65, 3, 64, s) for s in SIZES}
                | {(3, 197, 197, 64, 64), (2, 128, 128, 64, 64), (1, 1, 1, 1, 1)})

def _data(g: int, m: int, n: int, d: int, dv: int, seed: int = 0, mask: bool = True):
    rng = np.random.default_rng(seed + 7919 * m + 31 * n + 7 * d + dv)
    q = rng.standard_normal((g, m, d)).astype(np.float32)
    kt = rng.standard_normal((g, d, n)).astype(np.float32)
    v = rng.standard_normal((g, n, dv)).astype(np.float32)
    mk = (2.0 * rng.standard_normal((g, m, n))).astype(np.float32) if mask else None
    return q, kt, v, mk


def _run(q, kt, v, mask, scale, variant, width=1, out=None) -> np.ndarray:
    if out is None:
        out = np.full((q.shape[0], q.shape[1], v.shape[2]), np.nan, np.float32)
    assert bf16attn.attention(q, kt, v, out, scale, mask, width=width, variant=variant)
    return out


def _check(got, q, kt, v, scale, mask, what) -> None:
    """Within one bf16 ulp of each element of P (2^-7 of it) and float32's sums of the reference."""
    want, size = bf16attn.reference(q, kt, v, scale, mask)
    tol = (2.0 ** -7 + (kt.shape[-1] + 2) * 2.0 ** -23) * size + 1e-6
    assert np.array_equal(np.isnan(got), np.isnan(want)), what
    err = np.abs(np.where(np.isnan(want), 0.0, got - want))
    assert np.all(err <= np.where(np.isnan(want), 0.0, tol)), (what, float(err.max()))


def test_the_variants_this_machine_runs_are_those_its_features_promise():
    assert bf16attn.available()
    assert RUNS == expected_variants()
    assert bf16attn.isa() == RUNS[0] == isa.variant_of("bf16attn")


def test_the_family_chooses_by_features():
    check_family("bf16attn", bf16attn.VARIANTS)


_PROBE = """
import json, numpy as np
from ge_native import bf16attn, isa
q = np.linspace(-2, 3, 2 * 9 * 20, dtype=np.float32).reshape(2, 9, 20)
kt = np.cos(np.arange(2 * 20 * 13, dtype=np.float32)).reshape(2, 20, 13)
v = np.sin(np.arange(2 * 13 * 7, dtype=np.float32)).reshape(2, 13, 7)
out = np.zeros((2, 9, 7), np.float32)
ran = bf16attn.attention(q, kt, v, out, 0.5)
print(json.dumps({"isa": bf16attn.isa(), "family": isa.variant_of("bf16attn"), "ran": ran,
                  "bits": out.view(np.uint32).reshape(-1).tolist()}))
"""


def _probe(value: str | None) -> dict:
    return probe(_PROBE, value)


def test_the_switch_forces_each_variant_and_turns_the_path_off():
    q = np.linspace(-2, 3, 2 * 9 * 20, dtype=np.float32).reshape(2, 9, 20)
    kt = np.cos(np.arange(2 * 20 * 13, dtype=np.float32)).reshape(2, 20, 13)
    v = np.sin(np.arange(2 * 13 * 7, dtype=np.float32)).reshape(2, 13, 7)
    default = _probe(None)
    assert default["isa"] == default["family"] == RUNS[0] and default["ran"]
    # what ran by default is the best variant: its bits
    assert default["bits"] == _run(q, kt, v, None, 0.5, RUNS[0]).view(np.uint32).reshape(-1).tolist()
    for name in RUNS:
        got = _probe(name)
        assert got["isa"] == got["family"] == name and got["ran"]
        assert got["bits"] == _run(q, kt, v, None, 0.5, name).view(np.uint32).reshape(-1).tolist()
    off = _probe("0")
    assert off["isa"] is None and off["family"] == "scalar" and off["ran"] is False
    assert _probe("sse9")["isa"] == RUNS[0]


@pytest.mark.parametrize("variant", RUNS)
def test_odd_sizes_match_the_float64_reference(variant):
    for i, (g, m, n, d, dv) in enumerate(SHAPES):
        q, kt, v, mask = _data(g, m, n, d, dv, mask=i % 2 == 0)
        scale = 1.0 / np.sqrt(d)
        _check(_run(q, kt, v, mask, scale, variant), q, kt, v, scale, mask, (variant, g, m, n, d, dv))


@pytest.mark.parametrize("variant", RUNS)
def test_strided_views_and_broadcast_heads(variant):
    g, m, n, d, dv = 3, 37, 45, 33, 17
    rng = np.random.default_rng(5)
    # an exporter's layouts: (s, heads, d) buffers seen as (heads, s, d); K given as (heads, n, d) -> kt a view
    q = rng.standard_normal((m, g, d)).astype(np.float32).transpose(1, 0, 2)
    kt = rng.standard_normal((g, n, d)).astype(np.float32).transpose(0, 2, 1)
    v = rng.standard_normal((n, g, 2 * dv)).astype(np.float32).transpose(1, 0, 2)[:, :, ::2]  # columns 2 apart
    mask = np.broadcast_to(rng.standard_normal((1, 1, n)).astype(np.float32), (g, m, n))  # strides 0, 0, 1
    buf = np.full((m, g, dv), np.nan, np.float32)
    out = buf.transpose(1, 0, 2)
    for args in ((q, kt, v, None), (q, kt, v, mask), (q[:, ::-1], kt, v, mask.T.T)):
        got = _run(*args, 0.2, variant, out=out)
        assert got is out
        _check(out, *args[:3], 0.2, args[3], variant)
        contiguous = _run(*(None if a is None else np.ascontiguousarray(a) for a in args), 0.2, variant)
        assert np.array_equal(contiguous.view(np.uint32), out.view(np.uint32))
    # one K and V for every head (stride 0), a column-major mask, out with a column stride
    k1 = np.broadcast_to(rng.standard_normal((1, d, n)).astype(np.float32), (g, d, n))
    v1 = np.broadcast_to(rng.standard_normal((1, n, dv)).astype(np.float32), (g, n, dv))
    mcol = np.asfortranarray(rng.standard_normal((g, m, n)).astype(np.float32))
    wide = np.full((g, m, 3 * dv), np.nan, np.float32)
    got = _run(q, k1, v1, mcol, 0.3, variant, out=wide[:, :, ::3])
    _check(got, q, k1, v1, 0.3, mcol, variant)
    assert np.isnan(wide[:, :, 1::3]).all()  # nothing written between its columns
    again = _run(np.ascontiguousarray(q), np.ascontiguousarray(k1), np.ascontiguousarray(v1),
                 np.ascontiguousarray(mcol), 0.3, variant)
    assert np.array_equal(again.view(np.uint32), np.ascontiguousarray(got).view(np.uint32))


@pytest.mark.parametrize("variant", RUNS)
def test_masks_with_minus_infinity(variant):
    g, m, n, d, dv = 2, 40, 70, 64, 33
    q, kt, v, _ = _data(g, m, n, d, dv, seed=3)
    causal = np.triu(np.full((m, n), -np.inf, np.float32), 1)
    mask = np.broadcast_to(causal, (g, m, n)).copy()
    mask[1, 5] = -np.inf  # a row with every score masked
    got = _run(q, kt, v, mask, 0.125, variant)
    _check(got, q, kt, v, 0.125, mask, variant)
    # a row of all -inf is NaN, as the float32 kernel gives it (its max is -inf: -inf - -inf is NaN)
    assert np.isnan(got[1, 5]).all() and not np.isnan(np.delete(got[1], 5, axis=0)).any()
    # row 0 sees only key 0: P is exactly 1 there
    assert np.array_equal(got[:, 0], np.asarray(bf16attn.round_bf16(v[:, 0]), np.float32))


@pytest.mark.parametrize("variant", RUNS)
def test_a_nan_score_makes_its_row_nan_and_only_its_row(variant):
    # the vector exp carries a NaN through its arithmetic (the scalar one returns it): rows 3 (a
    # NaN in q) and 20 (a NaN in the mask) of head 0 are NaN, as the reference's, and no other
    g, m, n, d, dv = 2, 40, 50, 64, 20
    q, kt, v, mask = _data(g, m, n, d, dv, seed=4)
    q[0, 3, 7] = np.nan
    mask[0, 20, 45] = np.nan
    got = _run(q, kt, v, mask, 0.125, variant)
    _check(got, q, kt, v, 0.125, mask, variant)
    assert np.isnan(got[0, [3, 20]]).all() and np.isnan(got).sum() == 2 * dv


@pytest.mark.parametrize("variant", RUNS)
def test_bits_are_the_same_at_every_width(variant):
    for g, m, n, d, dv in ((3, 197, 197, 64, 64), (1, 65, 33, 17, 3), (5, 33, 100, 64, 65)):
        q, kt, v, mask = _data(g, m, n, d, dv, seed=9)
        one = _run(q, kt, v, mask, 0.125, variant, width=1)
        for width in (2, 3):
            assert np.array_equal(_run(q, kt, v, mask, 0.125, variant, width=width).view(np.uint32),
                                  one.view(np.uint32)), (variant, width)


def test_the_variants_agree():
    q, kt, v, mask = _data(4, 100, 197, 64, 64, seed=5)
    want, size = bf16attn.reference(q, kt, v, 0.125, mask)
    scalar = _run(q, kt, v, mask, 0.125, "scalar")
    for name in RUNS:
        got = _run(q, kt, v, mask, 0.125, name)
        assert np.all(np.abs(got - scalar) <= 2.0 ** -6 * size + 1e-6), name
    if "avx512_bf16" in RUNS:
        # the same sums in the same order (VDPBF16PS's pairs, the softmax's 16 lanes): the same bits
        assert np.array_equal(_run(q, kt, v, mask, 0.125, "avx512_bf16").view(np.uint32), scalar.view(np.uint32))


@pytest.mark.parametrize("variant", RUNS)
def test_empty_extents(variant):
    q, kt, v, _ = _data(2, 5, 7, 3, 4)
    assert bf16attn.attention(q[:, :0], kt, v, np.empty((2, 0, 4), np.float32), 1.0, variant=variant)
    assert bf16attn.attention(q[:0], kt[:0], v[:0], np.empty((0, 5, 4), np.float32), 1.0, variant=variant)
    out = np.full((2, 5, 4), np.nan, np.float32)
    assert bf16attn.attention(q, kt[:, :, :0], v[:, :0], out, 1.0, variant=variant)
    assert np.array_equal(out, np.zeros_like(out))  # no keys: P @ V of an empty sum
    got = _run(q[:, :, :0], kt[:, :0], v, None, 1.0, variant)  # d = 0: equal scores, the mean of V
    _check(got, q[:, :, :0], kt[:, :0], v, 1.0, None, variant)


def test_what_does_not_fit_is_refused_and_nothing_is_written():
    q, kt, v, mask = _data(2, 9, 13, 20, 7)
    sentinel = np.full((2, 9, 7), 7.0, np.float32)
    big = np.zeros((2, 9, 20), np.float32)
    from numpy.lib.stride_tricks import as_strided
    calls = [
        lambda: bf16attn.attention(q.astype(np.float64), kt, v, sentinel, 1.0),
        lambda: bf16attn.attention(q, kt, v.astype(np.float16), sentinel, 1.0),
        lambda: bf16attn.attention(q, kt[:, :19], v, sentinel, 1.0),
        lambda: bf16attn.attention(q, kt, v[:, :12], sentinel, 1.0),
        lambda: bf16attn.attention(q, kt, v, sentinel[:, :, :6], 1.0),
        lambda: bf16attn.attention(q, kt, v, sentinel[:1], 1.0),
        lambda: bf16attn.attention(q[0], kt[0], v[0], sentinel[0], 1.0),
        lambda: bf16attn.attention(q, kt, v, sentinel, 1.0, mask[:, :, :12]),
        lambda: bf16attn.attention(q, kt, v, sentinel, 1.0, mask.astype(np.float64)),
        lambda: bf16attn.attention(q, kt, v, sentinel, 1.0, variant="sse9"),
        lambda: bf16attn.attention(q, kt, v, sentinel, 1.0, width="two"),
        lambda: bf16attn.attention(q, kt, v, sentinel.tolist(), 1.0),
        lambda: bf16attn.attention(q, kt, v, np.broadcast_to(sentinel[:, :1], (2, 9, 7)), 1.0),  # read-only
        lambda: bf16attn.attention(q, kt, v, as_strided(sentinel, (2, 9, 7), (28, 0, 4)), 1.0),  # rows alias
        lambda: bf16attn.attention(q, kt, v, as_strided(sentinel, (2, 9, 7), (252, 28, 400)), 1.0),  # past it
        lambda: bf16attn.attention(big, kt, v, big[:, :, :7], 1.0),  # out overlaps q
    ]
    for i, call in enumerate(calls):
        assert call() is False, i
    assert np.all(sentinel == 7.0) and np.all(big == 0.0)
    # a mask that is out itself
    m2 = np.zeros((2, 9, 13), np.float32)
    assert bf16attn.attention(q, kt, v[:, :, :7], m2[:, :, :7], 1.0, m2) is False and np.all(m2 == 0.0)


def test_the_c_entry_checks_every_array_itself():
    mod = bf16attn._mod()
    q, kt, v, mask = _data(2, 9, 13, 20, 7)
    out = np.zeros((2, 9, 7), np.float32)
    good = [q, kt, v, out, mask, 0.5, 1, 0]
    mod.ba_attention(*good)
    ro = out.copy()
    ro.setflags(write=False)
    bad = {
        0: [q.astype(np.float64), q[0], q[:, :8], "q"],
        1: [kt[:, :19], kt[:1], kt.astype(np.float16)],
        2: [v[:, :12], v[:1]],
        3: [out[:, :8], out[:, :, :6], ro, np.broadcast_to(out[:, :1], (2, 9, 7)), q[:, :, :7]],
        4: [mask[:, :8], mask[:, :, :12], mask.astype(np.float64), out],
        5: ["half"],
        6: [0, 5000],
        7: [3, -1],
    }
    for i, values in bad.items():
        for value in values:
            args = list(good)
            args[i] = value
            with pytest.raises((TypeError, ValueError)):
                mod.ba_attention(*args)
    with pytest.raises(TypeError):
        mod.ba_attention(*good[:7])
    unaligned = np.zeros(2 * 9 * 7 * 4 + 4, np.uint8)[2:-2].view(np.float32).reshape(2, 9, 7)
    with pytest.raises(TypeError):
        mod.ba_attention(q, kt, v, unaligned, *good[4:])
    for name in bf16attn.VARIANTS:
        if name not in RUNS:  # a variant this CPU lacks is refused, not run
            with pytest.raises(ValueError):
                mod.ba_attention(*good[:7], bf16attn._CODES[name])
            sentinel = np.full_like(out, 7.0)
            assert bf16attn.attention(q, kt, v, sentinel, 0.5, variant=name) is False and np.all(sentinel == 7.0)


def test_what_bf16_costs_against_float32():
    """The mode's price: on random data the error is about 1e-3 of the output's range."""
    q, kt, v, _ = _data(4, 128, 128, 64, 64, seed=11)
    s = (q.astype(np.float64) @ kt.astype(np.float64)) * 0.125
    e = np.exp(s - s.max(-1, keepdims=True))
    exact = (e / e.sum(-1, keepdims=True)) @ v.astype(np.float64)
    got = _run(q, kt, v, None, 0.125, RUNS[0])
    rel = float(np.abs(got - exact).max() / np.abs(exact).max())
    assert 1e-4 < rel < 2e-2, rel
