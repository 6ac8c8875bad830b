"""ge_native.vmath: vectorisable float32 math for numba kernels (the fused loops of ge_fusion and the
cpu backend's own loops inline it): accuracy in ulp against float64 NumPy, NaN and infinities."""

import math

import numpy as np
import pytest

#: (function, float64 reference, max ulp)
VMATH = [("exp32", np.exp, 2), ("log32", np.log, 2), ("log1p32", np.log1p, 3), ("expm1_32", np.expm1, 10),
         ("tanh32", np.tanh, 2), ("sigmoid32", lambda v: 1 / (1 + np.exp(-v)), 3),
         ("erf32", np.vectorize(math.erf, otypes=[np.float64]), 7)]


@pytest.mark.parametrize("name,ref,max_ulp", VMATH, ids=[v[0] for v in VMATH])
def test_vectorisable_math_is_accurate_and_keeps_specials(vmath_kernel, name, ref, max_ulp):
    rng = np.random.default_rng(11)
    x = np.concatenate([np.linspace(-100, 100, 20001), rng.standard_normal(4000) * 1e-3, rng.standard_normal(4000) * 3,
                        np.logspace(-45, 38, 800), -np.logspace(-45, 38, 800),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 1.17e-38, 88.72, 88.73, -87.5, -103.9]])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    vmath_kernel(name)(x, out)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
        w32 = want.astype(np.float32)
    for kind in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(kind(out), kind(w32), err_msg=f"{name}: {kind.__name__}")
    fin = np.isfinite(want) & np.isfinite(out) & (np.abs(want) > 1.2e-38)
    ulp = np.abs(out[fin].astype(np.float64) - want[fin]) / np.spacing(np.abs(w32[fin])).astype(np.float64)
    assert ulp.max() <= max_ulp, (name, float(ulp.max()), x[fin][np.argmax(ulp)])


def test_expneg32_for_shifted_logits(vmath_kernel):
    x = np.concatenate([np.linspace(-87.0, 0.0, 50001), -np.logspace(-30, 1.9, 2000), [0.0, -0.0, np.nan, -np.inf, -200.0]])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    vmath_kernel("expneg32")(x, out)
    want = np.exp(x.astype(np.float64))
    normal = want > 1.2e-38
    ulp = np.abs(out[normal] - want[normal]) / np.spacing(want[normal].astype(np.float32)).astype(np.float64)
    assert ulp.max() <= 2, float(ulp.max())
    assert np.all(out[~normal & ~np.isnan(x)] <= 1.3e-38)  # far below: 0 or ~1.2e-38, never above
    far = x < np.float32(-87.3)  # -200, -inf: exactly 0, never a denormal (slow in every later product)
    assert far.sum() == 2 and np.all(out[far] == 0.0)
    assert not np.any((out != 0) & (np.abs(out) < np.finfo(np.float32).tiny))
    assert np.isnan(out[np.isnan(x)]).all()
