"""Vectorisable float32 math for the compiled loops (numba).

numba calls libm for ``math.exp``/``tanh``/``log``, one element at a time, which keeps LLVM
from vectorising a loop (a fused Tanh ran 40x slower than NumPy's SIMD ufunc). These are the
Cephes single-precision algorithms, written with arithmetic, selects and two bit-casts only, so
the loops that inline them vectorise (AVX2/AVX-512) like the rest of the program:

- ``exp32``: range reduction by ln 2, degree-6 polynomial, 2^n built from its bits (split in two
  factors so denormal results and the top of the range are right): within 2 ulp of exp;
- ``expneg32``: exp for x <= 0 with one scaling factor (softmax);
- ``log32`` (denormals included), ``log1p32``, ``expm1_32``, ``tanh32``, ``sigmoid32``;
- ``erf32``: a rational fit on [-3.92, 3.92] (within 7 ulp, 4e-7 absolute with fused
  multiply-adds, 5e-7 without; relative near 0).

NaN and infinities come out as NumPy's do. Plugin authors' numba kernels may use these too:
call them from ``@numba.njit`` code (they are ``inline="always"`` so the caller's loop
vectorises; do not give that loop fast-math, whose reassociation would fold exp32's rounding
trick away). This module imports numba: import it only where numba is installed.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

F = np.float32
I32 = np.int32


@intrinsic
def bits_to_f32(typingctx, x):  # type: ignore[no-untyped-def]
    """The float32 whose IEEE bits are the low 32 bits of integer ``x``."""
    sig = types.float32(x)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """The IEEE bits of float32 ``x`` as an int32."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


_LOG2E = F(1.44269504088896341)
_LN2_HI = F(0.693359375)
_LN2_LO = F(-2.12194440e-4)
_MAGIC = F(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer kept in the low mantissa bits
_E0, _E1, _E2 = F(1.9875691500e-4), F(1.3981999507e-3), F(8.3334519073e-3)
_E3, _E4, _E5 = F(4.1665795894e-2), F(1.6666665459e-1), F(5.0000001201e-1)
_ONE, _TWO, _HALF, _ZERO = F(1.0), F(2.0), F(0.5), F(0.0)


@numba.njit(inline="always")
def exp32(x):  # type: ignore[no-untyped-def]
    xc = x if x < F(88.8) else F(88.8)
    xc = xc if xc > F(-104.0) else F(-104.0)
    t = xc * _LOG2E + _MAGIC
    fx = t - _MAGIC
    r = xc - fx * _LN2_HI - fx * _LN2_LO
    z = r * r
    y = (((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5) * z + r + _ONE
    n = f32_to_bits(t) - I32(0x4B400000)
    n1 = n >> I32(1)
    n2 = n - n1
    y = y * bits_to_f32((n1 + I32(127)) << I32(23)) * bits_to_f32((n2 + I32(127)) << I32(23))
    return y if x == x else x


@numba.njit(inline="always")
def expneg32(x):  # type: ignore[no-untyped-def]
    """exp for x <= 0 (softmax's shifted logits), faster than exp32: one scaling factor, and
    below -87.3 the result is 0, never a denormal (products of denormals are slow)."""
    xc = x if x > F(-87.3) else F(-87.3)
    t = xc * _LOG2E + _MAGIC
    fx = t - _MAGIC
    r = xc - fx * _LN2_HI - fx * _LN2_LO
    z = r * r
    y = (((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5) * z + r + _ONE
    y = y * bits_to_f32((f32_to_bits(t) - I32(0x4B400000) + I32(127)) << I32(23))
    y = y if x >= F(-87.3) else F(0.0)
    return y if x == x else x


_SQRTHF = F(0.707106781186547524)
_L = (F(7.0376836292e-2), F(-1.1514610310e-1), F(1.1676998740e-1), F(-1.2420140846e-1), F(1.4249322787e-1),
      F(-1.6668057665e-1), F(2.0000714765e-1), F(-2.4999993993e-1), F(3.3333331174e-1))
_L0, _L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8 = _L
_TINY = F(1.17549435e-38)
_NINF, _INF, _NAN = F(-np.inf), F(np.inf), F(np.nan)
_TWO23 = F(8388608.0)


@numba.njit(inline="always")
def log32(x):  # type: ignore[no-untyped-def]
    sub = x < _TINY
    xs = x * _TWO23 if sub else x  # denormals: scale into the normal range first
    bits = f32_to_bits(xs)
    e = ((bits >> I32(23)) & I32(0xFF)) - I32(126)
    e = e - I32(23) if sub else e
    m = bits_to_f32((bits & I32(0x007FFFFF)) | I32(0x3F000000))  # mantissa in [0.5, 1)
    low = m < _SQRTHF
    e = e - I32(1) if low else e
    m = (m + m - _ONE) if low else (m - _ONE)
    fe = F(e)
    z = m * m
    y = ((((((((_L0 * m + _L1) * m + _L2) * m + _L3) * m + _L4) * m + _L5) * m + _L6) * m + _L7) * m + _L8) * m * z
    y = y + _LN2_LO * fe - _HALF * z
    r = m + y + _LN2_HI * fe
    r = _NINF if x == _ZERO else r
    r = _NAN if x < _ZERO else r
    return x if (x == _INF or x != x) else r


@numba.njit(inline="always")
def log1p32(u):  # type: ignore[no-untyped-def]
    w = u + _ONE
    d = w - _ONE
    # log(w) * u / (w - 1) cancels the rounding of 1 + u; where 1 + u rounds to 1, log1p(u) = u
    r = u if d == _ZERO else log32(w) * (u / d)
    return u if u == _INF else r


@numba.njit(inline="always")
def expm1_32(x):  # type: ignore[no-untyped-def]
    small = x * (_ONE + x * (_HALF + x * (F(1.0 / 6.0) + x * (F(1.0 / 24.0) + x * F(1.0 / 120.0)))))
    return small if abs(x) < F(0.0625) else exp32(x) - _ONE


_T0, _T1, _T2 = F(-5.70498872745e-3), F(2.06390887954e-2), F(-5.37397155531e-2)
_T3, _T4 = F(1.33314422036e-1), F(-3.33332819422e-1)


@numba.njit(inline="always")
def tanh32(x):  # type: ignore[no-untyped-def]
    z = x * x
    small = ((((_T0 * z + _T1) * z + _T2) * z + _T3) * z + _T4) * z * x + x
    ax = abs(x)
    # exp's argument stops at 40 (tanh is 1.0 from 9.1 on): no denormal 2 / (exp + 1), each of
    # which costs a microcode assist (NaN passes: it is not > 20)
    big = _ONE - _TWO / (exp32(F(40.0) if ax > F(20.0) else ax + ax) + _ONE)
    big = -big if x < _ZERO else big
    return small if ax < F(0.625) else big


@numba.njit(inline="always")
def sigmoid32(x):  # type: ignore[no-untyped-def]
    return _ONE / (_ONE + exp32(-x))


#: erf32's rational fit of erf(x) / x in x^2 on [-3.92, 3.92]: numerator and denominator, highest first
_EP = (F(1.992528e-08), F(-1.9577806e-06), F(1.4182818e-04), F(3.7006338e-03), F(5.0570205e-02), F(1.999013e-01), F(1.1283791))
_EQ = (F(9.558066e-04), F(1.4351207e-02), F(1.1498877e-01), F(5.104896e-01))
_ERF_CLAMP = F(3.92)


@numba.njit(inline="always")
def erf32(x):  # type: ignore[no-untyped-def]
    # c * P(c^2) / Q(c^2) on x held in [-3.92, 3.92] (erf is 1.0 in float32 beyond), held in
    # [-1, 1]: no exp and no branch to choose (the prelude's erf32, term for term)
    c = _ERF_CLAMP if x > _ERF_CLAMP else (-_ERF_CLAMP if x < -_ERF_CLAMP else x)
    t = c * c
    p = (((((_EP[0] * t + _EP[1]) * t + _EP[2]) * t + _EP[3]) * t + _EP[4]) * t + _EP[5]) * t + _EP[6]
    q = (((_EQ[0] * t + _EQ[1]) * t + _EQ[2]) * t + _EQ[3]) * t + _ONE
    r = c * p / q
    r = _ONE if r > _ONE else (-_ONE if r < -_ONE else r)
    return r if x == x else x


#: name in generated code -> function, for the loops' namespace
FUNCTIONS = {"exp32": exp32, "expneg32": expneg32, "log32": log32, "log1p32": log1p32, "expm1_32": expm1_32, "tanh32": tanh32,
             "sigmoid32": sigmoid32, "erf32": erf32}


#: the activations of :mod:`ge_native.activations` (activations.h's act_*32, term for term)
_GELU_S = F(0.70710678118654752)
_GT_A, _GT_B = F(1.5957691216057308), F(0.0713548162726)
_SIXTH = F(1.0 / 6.0)


@numba.njit(inline="always")
def silu32(x):  # type: ignore[no-untyped-def]
    return x / (_ONE + exp32(-x))


@numba.njit(inline="always")
def gelu32(x):  # type: ignore[no-untyped-def]
    return _HALF * x * (_ONE + erf32(x * _GELU_S))


@numba.njit(inline="always")
def gelu_tanh32(x):  # type: ignore[no-untyped-def]
    return x / (_ONE + exp32(-(x * (_GT_A + _GT_B * x * x))))


@numba.njit(inline="always")
def hardswish32(x):  # type: ignore[no-untyped-def]
    g = x * _SIXTH + _HALF
    g = g if g > _ZERO else _ZERO
    g = g if g < _ONE else _ONE
    return x * g
