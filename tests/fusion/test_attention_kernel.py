"""The fused Attention kernel's per-head parallel form (ge_cpu.fused.attention) against NumPy's
softmax(Q K^T * scale + mask) V, on strided views like the exporters' Transposes make."""

import numpy as np
import pytest
import threadpoolctl

from ge_cpu.fused import attention
from ge_native import parallel
from tests.fusion.common import attention_reference


@pytest.fixture(autouse=True)
def _blas_at_one_thread():
    """As inside a run (parallel=engine): BLAS at one thread, so each block's product is one
    single-threaded call and the bits do not depend on how BLAS would split it."""
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        yield


CASES = {
    "bert-padding-mask": ((1, 4, 128, 64), lambda rng, b, h, s: rng.standard_normal((b, 1, 1, s))),
    "causal": ((2, 3, 17, 8), lambda rng, b, h, s: np.triu(np.full((s, s), -1e9), 1)),
    "full-mask": ((3, 2, 5, 16), lambda rng, b, h, s: rng.standard_normal((b, h, s, s))),
    "no-mask-vit": ((1, 6, 197, 64), None),
    "few-heads-deit": ((1, 3, 197, 64), None),  # (2 threads: each head's rows in 2 blocks)
    "row-mask": ((1, 1, 7, 3), lambda rng, b, h, s: rng.standard_normal((1, s))),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_per_head_attention_matches_theattention_reference(case, dtype):
    (b, h, s, d), make_mask = CASES[case]
    rng = np.random.default_rng(len(case))
    q = rng.standard_normal((b, h, s, d)).astype(dtype)
    kt = rng.standard_normal((b, s, h, d)).astype(dtype).transpose(0, 2, 3, 1)  # a view, as exported
    v = rng.standard_normal((b, s, h, d)).astype(dtype).transpose(0, 2, 1, 3)
    mask = None if make_mask is None else make_mask(rng, b, h, s).astype(dtype)
    want = attention_reference(q, kt, v, mask, 0.125)
    for width in (1, 2):
        got = attention.run(q, kt, v, mask, 0.125, None, width)
        assert got is not None, "the per-head path refused arrays it is meant to take"
        np.testing.assert_allclose(got, want, rtol=2e-5 if dtype == "float32" else 1e-10, atol=2e-6)
    out = np.empty((b, h, s, d), dtype)
    assert attention.run(q, kt, v, mask, 0.125, out, 2) is out
    np.testing.assert_array_equal(out, attention.run(q, kt, v, mask, 0.125, None, 1))  # same bits


def test_rows_that_are_nan_or_fully_masked_come_out_nan_like_numpy():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    kt = rng.standard_normal((1, 2, 8, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    q[0, 0, 1, 3] = np.nan
    mask = np.zeros((1, 1, 4, 4), np.float32)
    mask[0, 0, 2] = -np.inf
    got = attention.run(q, kt, v, mask, 1.0, None, 2)
    assert np.isnan(got[0, 0, 1]).all() and np.isnan(got[:, :, 2]).all()
    others = [(0, 0, 0), (0, 0, 3), (0, 1, 0), (0, 1, 1), (0, 1, 3)]
    want = attention_reference(np.nan_to_num(q), kt, v, np.where(np.isinf(mask), 0, mask), 1.0)
    for idx in others:
        np.testing.assert_allclose(got[idx], want[idx], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fill", [-100.0, -1e9, float(np.finfo(np.float32).min), -np.inf])
def test_masked_scores_weigh_exactly_zero_never_a_denormal(fill):
    """A causal mask's weights are 0, not exp(-87.3) scaled below the normal range: every
    product P @ V then makes from a denormal costs a microcode assist (GPT-2's attention ran
    20x slower). With V the identity the output is P itself."""
    rng = np.random.default_rng(3)
    s = 64
    q = rng.standard_normal((1, 2, s, 16)).astype(np.float32)
    kt = rng.standard_normal((1, 2, 16, s)).astype(np.float32)
    v = np.broadcast_to(np.eye(s, dtype=np.float32), (1, 2, s, s)).copy()
    mask = np.triu(np.full((s, s), fill, np.float32), 1)[None, None]
    p = attention.run(q, kt, v, mask, 0.25, None, 2)
    assert p is not None
    tiny = np.finfo(np.float32).tiny
    assert not np.any((p != 0) & (np.abs(p) < tiny))
    assert np.all(p[..., np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]] == 0)
    np.testing.assert_allclose(p, attention_reference(q, kt, v, np.nan_to_num(mask, neginf=-1e30), 0.25), rtol=1e-5, atol=1e-6)


def test_arrays_it_cannot_take_are_left_to_the_numpy_form():
    q = np.ones((1, 2, 4, 8), np.float32)
    kt = np.ones((1, 2, 8, 4), np.float32)
    v = np.ones((1, 2, 4, 8), np.float32)
    assert attention.run(q.astype(np.int32), kt, v, None, 1.0, None, 2) is None
    assert attention.run(q, kt[..., ::2], v[:, :, ::2], None, 1.0, None, 2) is None  # column stride 2
    assert attention.run(q, kt, v, np.ones((1, 2, 3, 4), np.float32), 1.0, None, 2) is None  # mask rows 3 of 4
    assert attention.run(q, kt, v, np.ones((1, 2, 4, 4), np.float16), 1.0, None, 2) is None
    assert attention.run(q, kt, v, np.array(0.5, np.float32), 1.0, None, 2) is None  # a 0-d mask


@pytest.mark.parametrize("heads,tokens,native", [(4, 32, False), (12, 128, True)])
def test_the_fused_kernel_uses_it_when_built_for_several_threads_and_the_work_pays(monkeypatch, heads, tokens, native):
    """On several threads the per-head kernel runs, unless the heads are so small that NumPy's
    batched products on the calling thread are faster (wav2vec2's 4 heads of 49 tokens)."""
    from ge_core.ir.types import TensorType
    from ge_core.kernel import KernelSpec
    from ge_cpu.fused.kernels import attention_factory

    calls = []
    real = attention.run
    monkeypatch.setattr(attention, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    rng = np.random.default_rng(5)
    shapes = [(1, heads, tokens, 64), (1, heads, 64, tokens), (1, heads, tokens, 64)]
    q, kt, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    assert (heads * tokens * tokens * 128 >= attention.SERIAL_WORK) == native
    spec = KernelSpec(name="att", op_type="Attention", domain="ge.fused", attrs={"scale": 0.125},
                      inputs=[TensorType.of(x) for x in (q, kt, v)], outputs=[TensorType("float32", shapes[0])],
                      const_inputs=[None] * 3, options={"parallel_width": 2})
    with parallel.use_threads(2):
        got = attention_factory(spec)(q, kt, v)[0]
    assert len(calls) == int(native)
    np.testing.assert_allclose(got, attention_reference(q, kt, v, None, 0.125), rtol=2e-5, atol=2e-6)
