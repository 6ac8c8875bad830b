"""One table of activation math: each activation's C code and function, NumPy form and numba form.

:data:`TABLE` maps an activation's name (``"sigmoid"``, ``"gelu_tanh"`` ...) to an
:class:`Activation`: the ONNX op (and attributes) it stands for, its code in the GEMM and window
epilogues (``c_id``: ``act32(v, code)`` of ``csrc/activations.h`` and ``sg_act16``/``sg_act8`` of
``activations16.h``; None where the epilogues have none), its one-value C function
(``activations.h``'s ``act_*32`` or the prelude's), its NumPy form ``np(x, out=None, **attrs)``
(the fused elementwise programs' form, bit for bit) and the name of its numba form in
:mod:`ge_native.vmath` (None where vmath has none). :data:`C_IDS` is the codes' table
(``ge_native.sgemm.ACTIVATIONS``). This module imports neither numba nor a compiler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

#: Abramowitz and Stegun 7.1.26: erf(x) = 1 - t * poly(t) * exp(-x^2), t = 1 / (1 + p|x|)
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def np_relu(x: Any, out: Any = None) -> Any:
    return np.maximum(x, x.dtype.type(0), out=out)


def np_leaky(x: Any, out: Any = None, alpha: float = 0.01) -> Any:
    t = np.multiply(x, x.dtype.type(alpha))
    if math.isnan(alpha):  # neither max nor min: x where x >= 0, NaN elsewhere
        r = np.where(x >= 0, x, t)
        if out is None:
            return r
        np.copyto(out, r)
        return out
    return np.maximum(x, t, out=out) if alpha <= 1 else np.minimum(x, t, out=out)


def np_sigmoid(x: Any, out: Any = None) -> Any:
    t = np.negative(x, out=out)
    np.exp(t, out=t)
    t += 1
    return np.reciprocal(t, out=t)


def np_silu(x: Any, out: Any = None) -> Any:
    t = np_sigmoid(x)
    return np.multiply(x, t, out=out)


def np_hardsigmoid(x: Any, out: Any = None, alpha: float = 0.2, beta: float = 0.5) -> Any:
    t = np.multiply(x, x.dtype.type(alpha))
    t += x.dtype.type(beta)
    return np.clip(t, 0, 1, out=out)


def np_hardswish(x: Any, out: Any = None) -> Any:
    t = np_hardsigmoid(x, alpha=1 / 6, beta=0.5)
    return np.multiply(x, t, out=out)


def np_clip(x: Any, out: Any = None, min: float | None = None, max: float | None = None) -> Any:  # noqa: A002 - ONNX's names
    lo = -np.inf if min is None else min
    hi = np.inf if max is None else max
    return np.clip(x, x.dtype.type(lo), x.dtype.type(hi), out=out)


def np_erf(x: Any, out: Any = None) -> Any:
    dt = x.dtype.type
    a = np.abs(x)
    t = a * dt(ERF_P)
    t += 1
    np.reciprocal(t, out=t)
    a1, a2, a3, a4, a5 = (dt(c) for c in ERF_A)
    poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(dt(1), poly, out=poly)
    return np.copysign(poly, x, out=out)


def np_gelu(x: Any, out: Any = None, approximate: str = "none") -> Any:
    dt = x.dtype.type
    if approximate == "tanh":
        t = x * x
        t *= dt(0.044715)
        t += 1
        t *= x
        t *= dt(math.sqrt(2 / math.pi))
        np.tanh(t, out=t)
    else:
        t = np_erf(x * dt(1 / math.sqrt(2)))
    t += 1
    t *= dt(0.5)
    return np.multiply(x, t, out=out)


def np_gelu_tanh(x: Any, out: Any = None) -> Any:
    return np_gelu(x, out, approximate="tanh")


def np_elu(x: Any, out: Any = None, alpha: float = 1.0) -> Any:
    t = np.expm1(np.minimum(x, 0))
    t *= x.dtype.type(alpha)
    r = np.where(x > 0, x, t)
    if out is None:
        return r
    np.copyto(out, r)
    return out


def np_softplus(x: Any, out: Any = None) -> Any:
    return np.logaddexp(x, x.dtype.type(0), out=out)


def np_tanh(x: Any, out: Any = None) -> Any:
    return np.tanh(x, out=out)


@dataclass(frozen=True)
class Activation:
    """One activation: ``op`` (the ONNX op, with ``attrs`` fixed: GELU's tanh form), ``c_id`` (its
    epilogue code, or None), ``c_fn`` (its one-value float32 C function, or None), ``np`` (the
    NumPy form) and ``numba`` (its :mod:`ge_native.vmath` function's name, or None)."""

    name: str
    op: str
    np: Callable[..., Any]
    c_id: int | None = None
    c_fn: str | None = None
    numba: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


_ROWS = [
    Activation("sigmoid", "Sigmoid", np_sigmoid, 1, "act_sigmoid32", "sigmoid32"),
    Activation("silu", "Silu", np_silu, 2, "act_silu32", "silu32"),
    Activation("gelu", "Gelu", np_gelu, 3, "act_gelu32", "gelu32"),
    Activation("gelu_tanh", "Gelu", np_gelu_tanh, 4, "act_gelu_tanh32", "gelu_tanh32", {"approximate": "tanh"}),
    Activation("hardswish", "HardSwish", np_hardswish, 5, "act_hardswish32", "hardswish32"),
    Activation("relu", "Relu", np_relu),
    Activation("leakyrelu", "LeakyRelu", np_leaky),
    Activation("tanh", "Tanh", np_tanh, None, "tanh32", "tanh32"),
    Activation("hardsigmoid", "HardSigmoid", np_hardsigmoid),
    Activation("elu", "Elu", np_elu),
    Activation("softplus", "Softplus", np_softplus),
    Activation("clip", "Clip", np_clip),
]

#: name -> :class:`Activation`
TABLE: MappingProxyType[str, Activation] = MappingProxyType({a.name: a for a in _ROWS})

#: name -> code, for the activations the GEMM and window epilogues apply (``act32``'s codes)
C_IDS: dict[str, int] = {a.name: a.c_id for a in _ROWS if a.c_id is not None}


def get(name: str) -> Activation:
    """The activation ``name`` (KeyError when there is none)."""
    return TABLE[name]


def of_op(op: str, attrs: dict[str, Any] | None = None) -> Activation | None:
    """The activation ONNX op ``op`` with attributes ``attrs`` is (GELU's ``approximate="tanh"``
    is ``gelu_tanh``), or None."""
    given = dict(attrs or {})
    found = None
    for a in _ROWS:
        if a.op == op and all(given.get(k) == v for k, v in a.attrs.items()):
            if found is None or len(a.attrs) > len(found.attrs):
                found = a
    return found
