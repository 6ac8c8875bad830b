"""The shared float32 math never makes a denormal on the way to a result that is a normal number.

A denormal operand or result costs a microcode assist on x86 (about a hundred cycles each): the
erf GELU at the GEMM's store ran at twice the GEMM's own time because erf's exp(-x*x) underflowed
for every |x| above 9, and a masked softmax's weights did the same to attention (see
test_vmath's expneg32 test). These tests read the floating-point environment's sticky underflow
flag (C99 ``fetestexcept(FE_UNDERFLOW)``: MXCSR on x86, FPSR on ARM), on the thread that ran the
math, around each function on arguments across its whole range: a regression shows as a raised
flag, with no timing involved.
"""

import numpy as np
import pytest

from ge_native import native, sgemm

FLAGS_SRC = r"""
#include <fenv.h>
/* clear the sticky underflow flag */
static PyObject *fe_clear(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    feclearexcept(FE_UNDERFLOW);
    Py_RETURN_NONE;
}
/* 1 when the underflow flag is raised */
static PyObject *fe_underflow(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLong(fetestexcept(FE_UNDERFLOW) != 0);
}
/* out = f(x) for the prelude's f (0 erf32, 1 tanh32), the flag cleared before: 1 when the
   function raised it */
static PyObject *fe_prelude(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t count, which;
    if (ge_nargs(n, 3) || ge_int(args, 2, 0, 1, &which)) return NULL;
    const float *x = (const float *)ge_vec(args, 0, NPY_FLOAT, 0, &count);
    float *out = x ? (float *)ge_arr(args, 1, NPY_FLOAT, 1, count) : NULL;
    if (!out) return NULL;
    feclearexcept(FE_UNDERFLOW);
    /* one loop per function, as a generated loop calls it (one loop choosing between the two per
       element vectorises into computing both on every lane, which is not what is measured) */
    if (which) for (int64_t i = 0; i < count; i++) out[i] = tanh32(x[i]);
    else for (int64_t i = 0; i < count; i++) out[i] = erf32(x[i]);
    return PyLong_FromLong(fetestexcept(FE_UNDERFLOW) != 0);
}
"""


@pytest.fixture(scope="module")
def fe():
    mod = native.build(FLAGS_SRC, ["fe_clear", "fe_underflow", "fe_prelude"])
    assert mod is not None, "the native kernels do not build here"
    return mod


def _arguments() -> np.ndarray:
    """Both signs, from 0.5 to 1e30 (erf and tanh at 1.0 long before), and the specials."""
    mag = np.concatenate([np.linspace(0.5, 120.0, 20001), np.logspace(2, 30, 500)])
    return np.concatenate([mag, -mag, [0.0, -0.0, np.inf, -np.inf, np.nan]]).astype(np.float32)


@pytest.mark.parametrize("which,name", [(0, "erf32"), (1, "tanh32")])
def test_the_prelude_math_raises_no_underflow(fe, which, name):
    x = _arguments()
    out = np.empty_like(x)
    assert fe.fe_prelude(x, out, which) == 0, f"{name} underflowed"
    big = np.abs(x) >= 10
    assert np.all(out[big & np.isfinite(x)] == np.sign(x[big & np.isfinite(x)]))  # exactly +-1 out there
    assert np.isnan(out[np.isnan(x)]).all()


@pytest.mark.parametrize("name", ["erf32", "tanh32"])
def test_the_numba_twins_raise_no_underflow(fe, vmath_kernel, name):
    kernel = vmath_kernel(name)
    x = _arguments()
    out = np.empty_like(x)
    fe.fe_clear()
    kernel(x, out)
    assert fe.fe_underflow() == 0, f"vmath.{name} underflowed"


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_the_gemm_store_activations_raise_no_underflow(fe, act):
    x = _arguments()
    out = np.full((1, x.size), -7.0, np.float32)
    one = np.ones((1, 1), np.float32)
    b = x.reshape(1, -1)
    if not sgemm.available():
        # (no AVX-512: the kernel refuses, leaving the output alone, and callers keep their BLAS path)
        assert not sgemm.matmul_rows(one, b, out, act=act, width=1)
        assert np.all(out == -7.0)
        return
    fe.fe_clear()
    assert sgemm.matmul_rows(one, b, out, act=act, width=1)  # width 1: on this thread
    assert fe.fe_underflow() == 0, f"the {act} store underflowed"
