"""The shared float32 math never makes a denormal on the way to a result that is a normal number.

A denormal operand or result costs a microcode assist on x86 (about a hundred cycles each): the
erf GELU at the GEMM's store ran at twice the GEMM's own time because erf's exp(-x*x) underflowed
for every |x| above 9, and a masked softmax's weights did the same to attention (see
test_vmath's expneg32 test). These tests read the CPU's sticky floating-point flags (MXCSR's
underflow and denormal-operand bits), on the thread that ran the math, around each function on
arguments across its whole range: a regression shows as a set flag, with no timing involved.
"""

import platform

import numpy as np
import pytest

from ge_sdk import native

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="reads x86's MXCSR register (no such flags elsewhere)")

#: MXCSR's sticky flags: denormal operand (bit 1) and underflow (bit 4)
DENORMAL_FLAGS = 0x02 | 0x10

FLAGS_SRC = r"""
#include <xmmintrin.h>
/* clear MXCSR's sticky exception flags (the low 6 bits) */
static PyObject *mx_clear(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    _mm_setcsr(_mm_getcsr() & ~0x3fu);
    Py_RETURN_NONE;
}
/* MXCSR's sticky exception flags */
static PyObject *mx_flags(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLong((long)(_mm_getcsr() & 0x3fu));
}
/* out = f(x) for the prelude's f (0 erf32, 1 tanh32), MXCSR's flags cleared before and read
   after: the flags the function raised */
static PyObject *mx_prelude(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t count, which;
    if (ge_nargs(n, 3) || ge_int(args, 2, 0, 1, &which)) return NULL;
    const float *x = (const float *)ge_vec(args, 0, NPY_FLOAT, 0, &count);
    float *out = x ? (float *)ge_arr(args, 1, NPY_FLOAT, 1, count) : NULL;
    if (!out) return NULL;
    _mm_setcsr(_mm_getcsr() & ~0x3fu);
    for (int64_t i = 0; i < count; i++) out[i] = which ? tanh32(x[i]) : erf32(x[i]);
    return PyLong_FromLong((long)(_mm_getcsr() & 0x3fu));
}
"""


@pytest.fixture(scope="module")
def mx():
    mod = native.build(FLAGS_SRC, ["mx_clear", "mx_flags", "mx_prelude"])
    assert mod is not None, "the native kernels do not build here"
    return mod


def _arguments() -> np.ndarray:
    """Both signs, from 0.5 to 1e30 (erf and tanh at 1.0 long before), and the specials."""
    mag = np.concatenate([np.linspace(0.5, 120.0, 20001), np.logspace(2, 30, 500)])
    return np.concatenate([mag, -mag, [0.0, -0.0, np.inf, -np.inf, np.nan]]).astype(np.float32)


@pytest.mark.parametrize("which,name", [(0, "erf32"), (1, "tanh32")])
def test_the_prelude_math_raises_no_underflow(mx, which, name):
    x = _arguments()
    out = np.empty_like(x)
    flags = mx.mx_prelude(x, out, which)
    assert flags & DENORMAL_FLAGS == 0, f"{name} raised MXCSR flags {flags:#x}"
    big = np.abs(x) >= 10
    assert np.all(out[big & np.isfinite(x)] == np.sign(x[big & np.isfinite(x)]))  # exactly +-1 out there
    assert np.isnan(out[np.isnan(x)]).all()


@pytest.mark.parametrize("name", ["erf32", "tanh32"])
def test_the_numba_twins_raise_no_underflow(mx, name):
    numba = pytest.importorskip("numba")
    from ge_sdk import vmath

    f = vmath.FUNCTIONS[name]

    @numba.njit
    def kernel(x, out):
        for i in range(x.shape[0]):
            out[i] = f(x[i])

    x = _arguments()
    out = np.empty_like(x)
    kernel(x, out)  # compiled before the flags are cleared
    mx.mx_clear()
    kernel(x, out)
    flags = mx.mx_flags()
    assert flags & DENORMAL_FLAGS == 0, f"vmath.{name} raised MXCSR flags {flags:#x}"


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_the_gemm_store_activations_raise_no_underflow(mx, act):
    from ge_sdk import sgemm

    if not sgemm.available():
        pytest.skip("GE's GEMM needs AVX-512 (the callers keep their BLAS path elsewhere)")
    x = _arguments()
    out = np.empty((1, x.size), np.float32)
    one = np.ones((1, 1), np.float32)
    b = x.reshape(1, -1)
    assert sgemm.matmul_rows(one, b, out, act=act, width=1)
    mx.mx_clear()
    assert sgemm.matmul_rows(one, b, out, act=act, width=1)  # width 1: on this thread
    flags = mx.mx_flags()
    assert flags & DENORMAL_FLAGS == 0, f"the {act} store raised MXCSR flags {flags:#x}"
