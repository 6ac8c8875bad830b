"""Fixtures the sdk tests share."""

import pytest


def _make_vmath_kernel(name):
    import numba
    from numba import types as nt

    from ge_native import vmath

    f = vmath.FUNCTIONS[name]
    arr = nt.Array(nt.float32, 1, "C")

    @numba.njit(nt.void(arr, arr))
    def k(x, out):
        for i in range(x.shape[0]):
            out[i] = f(x[i])

    return k


@pytest.fixture
def vmath_kernel():
    """``vmath_kernel(name)``: a numba kernel ``(x, out)`` writing ``ge_native.vmath``'s function
    ``name`` of each float32 of ``x`` into ``out`` (compiled eagerly, for 1-D C arrays)."""
    return _make_vmath_kernel
