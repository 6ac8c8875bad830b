"""The one activation table (ge_native.activations): its NumPy forms, its C forms (activations.h's
one-value functions and the GEMM epilogue's vector forms) and its numba forms agree with float64."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest

from ge_native import activations, native, sgemm

X = np.concatenate([np.linspace(-9, 9, 3001), [-1e-3, 0.0, 1e-3, 0.5, -0.5, 3.0, -3.0]]).astype(np.float32)
_ERF = np.vectorize(math.erf)


def _ref(name: str, x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    sig = 1 / (1 + np.exp(-x))
    return {
        "sigmoid": sig, "silu": x * sig, "gelu": 0.5 * x * (1 + _ERF(x / math.sqrt(2))),
        "gelu_tanh": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
        "hardswish": x * np.clip(x / 6 + 0.5, 0, 1), "relu": np.maximum(x, 0), "leakyrelu": np.where(x >= 0, x, 0.01 * x),
        "tanh": np.tanh(x), "hardsigmoid": np.clip(0.2 * x + 0.5, 0, 1), "elu": np.where(x > 0, x, np.expm1(x)),
        "softplus": np.logaddexp(x, 0), "clip": x,
    }[name]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    # the tolerance the GEMM epilogue's test gives the vector math (4e-6 relative, plus as much absolute)
    tol = 4e-6 * (1 + np.abs(want))
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= tol), float(np.max(err - tol))


def test_the_table_is_the_epilogue_codes():
    assert sgemm.ACTIVATIONS == {"sigmoid": 1, "silu": 2, "gelu": 3, "gelu_tanh": 4, "hardswish": 5}
    assert sgemm.ACTIVATIONS is activations.C_IDS
    for name in ("sigmoid", "silu", "gelu", "gelu_tanh", "hardswish", "relu", "leakyrelu", "tanh", "hardsigmoid",
                 "elu", "softplus", "clip"):
        assert activations.get(name).name == name
    text = native.c_source("activations.h")
    for a in activations.TABLE.values():
        if a.c_id is not None:
            assert f"{a.c_fn}(float v)" in text and f"if (act == {a.c_id}) return {a.c_fn}(v);" in text
    assert activations.of_op("Gelu").name == "gelu"
    assert activations.of_op("Gelu", {"approximate": "tanh"}).name == "gelu_tanh"
    assert activations.of_op("HardSwish").name == "hardswish" and activations.of_op("MatMul") is None


@pytest.mark.parametrize("name", sorted(activations.TABLE))
def test_numpy_forms_match_float64(name):
    a = activations.get(name)
    got = a.np(X.copy())
    assert got.dtype == np.float32
    _close(got, _ref(name, X))
    out = np.empty_like(X)
    assert a.np(X.copy(), out=out) is out
    np.testing.assert_array_equal(out, got)


#: the test's entry: each activation applied to a vector, by code (``/* CASES */`` is replaced
#: by one line per function of the table)
_ENTRY = (pathlib.Path(__file__).with_name("act_apply.c")).read_text(encoding="ascii")


def _c_module():
    rows = [a for a in activations.TABLE.values() if a.c_fn is not None]
    cases = "\n".join(f"        if (code == {100 + i}) v = {a.c_fn}(v);" for i, a in enumerate(rows))
    cases += "\n        if (code < 100) v = act32(v, code);"
    mod = native.build(native.c_source("activations.h") + _ENTRY.replace("/* CASES */", cases), ["act_apply"])
    return mod, {a.name: 100 + i for i, a in enumerate(rows)}


def test_c_forms_match_float64_and_the_numpy_forms():
    assert native.available()  # (gcc and the Python headers are on every machine this project builds on)
    mod, fn_codes = _c_module()
    assert mod is not None
    assert set(fn_codes) >= set(activations.C_IDS) | {"tanh"}
    for name, code in fn_codes.items():
        got = np.empty_like(X)
        mod.act_apply(X, got, code)
        _close(got, _ref(name, X))
        _close(got, activations.get(name).np(X.copy()).astype(np.float64))
        cid = activations.get(name).c_id
        if cid is not None:  # act32(v, code) is the named function, bit for bit
            by_code = np.empty_like(X)
            mod.act_apply(X, by_code, cid)
            np.testing.assert_array_equal(by_code, got)
    same = np.empty_like(X)
    mod.act_apply(X, same, 0)
    np.testing.assert_array_equal(same, X)


@pytest.mark.parametrize("name", sorted(activations.C_IDS))
def test_the_gemm_epilogue_form_matches(name):
    # x @ [[1]]: the product is x exactly, then the activation at the store (sg_act16 / sg_act8)
    out = np.empty((X.size, 1), np.float32)
    if not sgemm.available():  # (a CPU without AVX2: no GEMM of GE's own, its call declines)
        assert not sgemm.matmul_packed(X.reshape(-1, 1).copy(), object(), out, None, None, 1, None, name)
        return
    assert sgemm.matmul_packed(X.reshape(-1, 1).copy(), sgemm.Panels(np.ones((1, 1), np.float32)), out, None, None,
                               1, None, name)
    _close(out.ravel(), _ref(name, X))
    _close(out.ravel(), activations.get(name).np(X.copy()).astype(np.float64))


def test_numba_forms_match():
    numba = pytest.importorskip("numba")
    from ge_native import vmath

    for a in activations.TABLE.values():
        if a.numba is None:
            continue
        fn = getattr(vmath, a.numba)

        @numba.njit
        def apply(x, y, fn=fn):
            for i in range(x.size):
                y[i] = fn(x[i])

        got = np.empty_like(X)
        apply(X, got)
        _close(got, _ref(a.name, X))
        _close(got, a.np(X.copy()).astype(np.float64))
    assert {a.name for a in activations.TABLE.values() if a.numba} >= set(activations.C_IDS) | {"tanh"}
