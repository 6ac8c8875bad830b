"""One table of the elementwise ops a fused program may contain: each op's NumPy, numexpr and C
spelling (:data:`FORMS`), read by the generators of :mod:`ge_cpu.fused.codegen` (NumPy code,
numexpr expressions) and :mod:`ge_cpu.fused.loopgen` (compiled C loops).

The program format itself (steps, refs, which ops with which attributes) is
:mod:`ge_sdk.fused`'s, shared with the fusion plugin that writes the programs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_native import activations as act
from ge_native import gensrc
from ge_sdk.fused import PROGRAM_OPS, ProgramOp

# ------------------------------------------------------------------------------------------------
# NumPy forms: ``fn(*operands, out=None, **attrs)``; the activations' are ge_native.activations' (one
# table of activation math for the C, NumPy and numba forms)
# ------------------------------------------------------------------------------------------------


def _np_identity(x, out=None):
    if out is None:
        return np.array(x, copy=True)
    np.copyto(out, x)
    return out


def _np_pow(a, b, out=None):
    if np.ndim(b) == 0 and float(b) == 2.0:
        return np.multiply(a, a, out=out)
    return np.power(a, b, out=out)


def _nary(ufunc):
    """The n-ary fold of a binary ufunc (Sum, Max, Min): one operand is itself, else the first
    two into ``out`` and each further one into that result."""

    def fold(*xs, out=None):
        if len(xs) == 1:
            return _np_identity(xs[0], out=out)
        r = ufunc(xs[0], xs[1], out=out)
        for x in xs[2:]:
            ufunc(r, x, out=r)
        return r

    return fold


_np_sum, _np_max, _np_min = _nary(np.add), _nary(np.maximum), _nary(np.minimum)


def _np_mean(*xs, out=None):
    r = _np_sum(*xs, out=out) if len(xs) > 1 else _np_identity(xs[0], out=out)
    return np.multiply(r, r.dtype.type(1.0 / len(xs)), out=r)


# numexpr forms: operand expressions are generator-made; numbers enter only through _lit
# (gensrc.literal: finite numbers; a NaN or infinite attribute makes the numexpr form refuse,
# and the program runs as NumPy code)
_lit = gensrc.literal


def _ne_erf(a: str) -> str:
    p, (a1, a2, a3, a4, a5) = act.ERF_P, act.ERF_A
    t = f"(1/(1+{_lit(p)}*abs({a})))"
    poly = f"({_lit(a5)})"
    for c in (a4, a3, a2, a1):
        poly = f"({poly}*{t}+({_lit(c)}))"
    poly = f"({poly}*{t})"
    return f"(where({a}<0,-1,1)*(1-{poly}*exp(-({a})*({a}))))"


def _ne_gelu(a: str, approximate: str = "none") -> str:
    if approximate == "tanh":
        return f"(0.5*{a}*(1+tanh({_lit(math.sqrt(2 / math.pi))}*({a}+0.044715*{a}*{a}*{a}))))"
    return f"(0.5*{a}*(1+{_ne_erf(f'({a}*{_lit(1 / math.sqrt(2))})')}))"


def _ne_clip(a: str, min=None, max=None) -> str:  # noqa: A002
    # no bound for None and for the infinity on its own side; NaN and the other infinity refuse
    if min is not None and min != -math.inf:
        a = f"where({a}<{_lit(float(min))},{_lit(float(min))},{a})"
    if max is not None and max != math.inf:
        a = f"where({a}>{_lit(float(max))},{_lit(float(max))},{a})"
    return a


def _ne_nary(op: str, *xs: str) -> str:
    return "(" + op.join(xs) + ")"


def _ne_chain(fn: Callable[[str, str], str], *xs: str) -> str:
    r = xs[0]
    for x in xs[1:]:
        r = fn(r, x)
    return r


# ------------------------------------------------------------------------------------------------
# C forms: scalar C expressions over generator-made operand names; every number an op needs is a
# numeric literal the emitter wrote (hex float: exact), or for an attribute's value a parameter of
# the loop (CEmitter.a: a generator-made name, its value passed at the call)
# ------------------------------------------------------------------------------------------------
#: math functions with a vectorisable float32 form in the native prelude
VMATH = {"exp": "exp32", "log": "log32", "log1p": "log1p32", "expm1": "expm1_32", "tanh": "tanh32",
         "erf": "erf32"}


class CEmitter:
    """What a C form writes with, for dtype float32 or float64: literals, the prelude's
    max/min, math functions (and which of them are scalar libm calls)."""

    def __init__(self, dtype: np.dtype, parametric: bool = False) -> None:
        self.dtype = dtype
        self.f32 = dtype == np.float32
        #: with ``parametric``, an attribute's value (:meth:`a`) is a parameter ``p<i>`` of the
        #: loop, its value ``params[i]``, not a literal: programs that differ only in such values
        #: (a model's fake-quants, each with its own scale) have one C source, compiled once
        self.parametric = parametric
        self.params: list[float] = []
        #: set when a step needs a libm call that keeps the loop from vectorising
        self.scalar_calls: list[str] = []
        self.max, self.min = ("ge_max32", "ge_min32") if self.f32 else ("ge_max64", "ge_min64")
        #: max/min against a parameter (finite: no NaN test of it, so the loop vectorises)
        self.maxk, self.mink = ("ge_maxk32", "ge_mink32") if self.f32 else ("ge_maxk64", "ge_mink64")

    def f(self, name: str) -> str:
        """The vectorisable float32 form of a math function (the native prelude's); libm's
        scalar one otherwise (noted: NumPy's SIMD ufuncs beat such a loop)."""
        if self.f32 and name in VMATH:
            return VMATH[name]
        self.scalar_calls.append(name)
        return name

    def libm(self, name: str) -> str:
        """libm's float32 (``name`` + f) or float64 function (these vectorise)."""
        return f"{name}f" if self.f32 else name

    def k(self, value: float) -> str:
        """A numeric literal of the loop's dtype (NaN and infinities as the math.h names)."""
        v = float(self.dtype.type(float(value)))
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = v.hex() + ("f" if self.f32 else "")
        return f"({text})" if text.startswith("-") else text

    def a(self, value: float) -> str:
        """An attribute's value: a parameter of the loop (``p<i>``, read into a local before the
        loop, the same value a literal would have) when :attr:`parametric` and finite in the
        loop's dtype, else a literal (:meth:`k`; NaN and infinities stay in the source)."""
        v = float(self.dtype.type(float(value)))
        if not self.parametric or not math.isfinite(v):
            return self.k(v)
        self.params.append(v)
        return gensrc.name("p", len(self.params) - 1)

    def clamp(self, x: str, lo: float | None, hi: float | None) -> str:
        """``x`` clamped to attribute values ``lo`` and/or ``hi`` (None: no bound) as the
        prelude's max/min give it (a NaN ``x`` passes through); a parameter bound takes the
        max/min without the bound's NaN test (the same results: a parameter is finite)."""
        for v, lit, par in ((lo, self.max, self.maxk), (hi, self.min, self.mink)):
            if v is not None:
                tok = self.a(v)
                x = f"{par if tok.startswith('p') else lit}({x}, {tok})"
        return x

    def expr(self, op: str, xs: list[str], attrs: dict[str, Any]) -> str | None:
        """The C expression of one step (None: the op has no C form)."""
        form = FORMS.get(op)
        return None if form is None or form.c is None else form.c(self, xs, attrs)


CForm = Callable[[CEmitter, list[str], dict[str, Any]], str]


def _chain(fn: str, xs: Sequence[str]) -> str:
    r = xs[0]
    for x in xs[1:]:
        r = f"{fn}({r}, {x})"
    return r


def _c_clip(e: CEmitter, xs: list[str], at: dict[str, Any]) -> str:
    r = xs[0]
    lo, hi = at.get("min"), at.get("max")
    lo = None if lo is None or (isinstance(lo, float) and math.isinf(lo) and lo < 0) else lo
    hi = None if hi is None or (isinstance(hi, float) and math.isinf(hi) and hi > 0) else hi
    return e.clamp(r, lo, hi)


def _c_gelu(e: CEmitter, xs: list[str], at: dict[str, Any]) -> str:
    a, k = xs[0], e.k
    if at.get("approximate", "none") == "tanh":
        return (f"({k(0.5)} * {a} * ({k(1)} + {e.f('tanh')}({k(math.sqrt(2 / math.pi))} * "
                f"({a} + {k(0.044715)} * {a} * {a} * {a}))))")
    return f"({k(0.5)} * {a} * ({k(1)} + {e.f('erf')}({a} * {k(1 / math.sqrt(2))})))"


def _c_binary(sym: str) -> CForm:
    return lambda e, xs, at: f"({xs[0]} {sym} {xs[1]})"


def _c_math(name: str) -> CForm:
    return lambda e, xs, at: f"{e.f(name)}({xs[0]})"


def _c_libm(name: str) -> CForm:
    return lambda e, xs, at: f"{e.libm(name)}({xs[0]})"


def _c_pow(e: CEmitter, xs: list[str], at: dict[str, Any]) -> str:
    return f"({xs[1]} == {e.k(2)} ? {xs[0]} * {xs[0]} : {e.libm('pow')}({xs[0]}, {xs[1]}))"


def _c_hardsigmoid(e: CEmitter, xs: list[str], at: dict[str, Any]) -> str:
    inner = f"({e.a(at.get('alpha', 0.2))} * {xs[0]} + {e.a(at.get('beta', 0.5))})"
    return f"{e.min}({e.max}({inner}, {e.k(0)}), {e.k(1)})"


def _c_hardswish(e: CEmitter, xs: list[str], at: dict[str, Any]) -> str:
    a, k = xs[0], e.k
    return f"({a} * {e.min}({e.max}({a} * {k(1 / 6)} + {k(0.5)}, {k(0)}), {k(1)}))"


def _c_softplus(e: CEmitter, xs: list[str], at: dict[str, Any]) -> str:
    a = xs[0]
    return f"({e.max}({a}, {e.k(0)}) + {e.f('log1p')}({e.f('exp')}(-{e.libm('fabs')}({a}))))"


class OpForm:
    """How one op type is generated: ``ne(*operand_exprs, **attrs)`` (numexpr; or None), ``np``
    (``fn(*operands, out=None, **attrs)``), ``c(emitter, operand_exprs, attrs)`` (a scalar C
    expression; or None), with the op's arity and attribute schema from :data:`ge_sdk.fused.PROGRAM_OPS`."""

    def __init__(self, op: str, ne: Callable[..., str] | None, np_fn: Callable[..., np.ndarray],
                 c: CForm | None) -> None:
        spec: ProgramOp = PROGRAM_OPS[op]
        self.ne, self.np, self.c = ne, np_fn, c
        self.arity = spec.arity
        self.attrs = spec.attrs
        self.check_attrs = spec.check_attrs


def _np_fake_quant(a, out=None, scale=1.0, lo=0.0, hi=255.0):
    """QuantizeLinear then DequantizeLinear (ge_sdk.quant's FakeQuant), in ``a``'s float type."""
    t = np.asarray(a).dtype.type
    y = np.divide(a, t(scale), out=out)
    np.rint(y, out=y)
    np.clip(y, t(lo), t(hi), out=y)
    return np.multiply(y, t(scale), out=y)


def _c_fake_quant(e: CEmitter, xs: list[str], at: dict[str, Any]) -> str:
    s = e.a(at.get("scale", 1.0))  # (one parameter, read twice)
    q = f"{e.libm('rint')}({xs[0]} / {s})"
    return f"({e.clamp(q, at.get('lo', 0.0), at.get('hi', 255.0))} * {s})"


def _u(name: str) -> Callable[..., str]:
    return lambda a: f"{name}({a})"


def _table() -> dict[str, OpForm]:
    k = CEmitter.k
    rows: list[tuple[str, Callable[..., str] | None, Callable[..., Any], CForm | None]] = [
        ("Add", lambda a, b: f"({a}+{b})", np.add, _c_binary("+")),
        ("Sub", lambda a, b: f"({a}-{b})", np.subtract, _c_binary("-")),
        ("Mul", lambda a, b: f"({a}*{b})", np.multiply, _c_binary("*")),
        ("Div", lambda a, b: f"({a}/{b})", np.true_divide, _c_binary("/")),
        ("Pow", lambda a, b: f"({a}**{b})", _np_pow, _c_pow),
        ("Sum", lambda *xs: _ne_nary("+", *xs), _np_sum, lambda e, xs, at: "(" + " + ".join(xs) + ")"),
        ("Mean", lambda *xs: f"({_ne_nary('+', *xs)}/{len(xs)}.0)", _np_mean,
         lambda e, xs, at: f"(({' + '.join(xs)}) * {k(e, 1.0 / len(xs))})"),
        ("Max", lambda *xs: _ne_chain(lambda a, b: f"maximum({a},{b})", *xs), _np_max,
         lambda e, xs, at: _chain(e.max, xs)),
        ("Min", lambda *xs: _ne_chain(lambda a, b: f"minimum({a},{b})", *xs), _np_min,
         lambda e, xs, at: _chain(e.min, xs)),
        ("Neg", lambda a: f"(-{a})", np.negative, lambda e, xs, at: f"(-{xs[0]})"),
        ("Abs", _u("abs"), np.abs, _c_libm("fabs")),
        ("Exp", _u("exp"), np.exp, _c_math("exp")),
        ("Log", _u("log"), np.log, _c_math("log")),
        ("Sqrt", _u("sqrt"), np.sqrt, _c_libm("sqrt")),
        ("Tanh", _u("tanh"), np.tanh, _c_math("tanh")),
        ("Sin", _u("sin"), np.sin, _c_math("sin")),
        ("Cos", _u("cos"), np.cos, _c_math("cos")),
        ("Reciprocal", lambda a: f"(1/{a})", np.reciprocal, lambda e, xs, at: f"({e.k(1)} / {xs[0]})"),
        ("Round", None, np.rint, _c_libm("rint")),  # half to even (the default rounding mode), as ONNX's
        ("Identity", lambda a: a, _np_identity, lambda e, xs, at: xs[0]),
        ("Relu", lambda a: f"maximum({a},0)", act.np_relu, lambda e, xs, at: f"{e.max}({xs[0]}, {e.k(0)})"),
        ("LeakyRelu", lambda a, alpha=0.01: f"where({a}>0,{a},{_lit(float(alpha))}*{a})", act.np_leaky,
         lambda e, xs, at: f"({xs[0]} >= {e.k(0)} ? {xs[0]} : {e.a(at.get('alpha', 0.01))} * {xs[0]})"),
        ("Sigmoid", lambda a: f"(1/(1+exp(-{a})))", act.np_sigmoid,
         lambda e, xs, at: f"({e.k(1)} / ({e.k(1)} + {e.f('exp')}(-{xs[0]})))"),
        ("Silu", lambda a: f"({a}/(1+exp(-{a})))", act.np_silu,
         lambda e, xs, at: f"({xs[0]} / ({e.k(1)} + {e.f('exp')}(-{xs[0]})))"),
        ("HardSigmoid", lambda a, alpha=0.2, beta=0.5:
         _ne_clip(f"({_lit(float(alpha))}*{a}+{_lit(float(beta))})", 0.0, 1.0), act.np_hardsigmoid, _c_hardsigmoid),
        ("HardSwish", lambda a: f"({a}*{_ne_clip(f'({a}/6.0+0.5)', 0.0, 1.0)})", act.np_hardswish, _c_hardswish),
        ("Clip", _ne_clip, act.np_clip, _c_clip),
        ("Erf", _ne_erf, act.np_erf, _c_math("erf")),
        ("Gelu", _ne_gelu, act.np_gelu, _c_gelu),
        ("Elu", lambda a, alpha=1.0: f"where({a}>0,{a},{_lit(float(alpha))}*(exp({a})-1))", act.np_elu,
         lambda e, xs, at: f"({xs[0]} > {e.k(0)} ? {xs[0]} : {e.a(at.get('alpha', 1.0))} * {e.f('expm1')}({xs[0]}))"),
        ("Softplus", lambda a: f"log(1+exp({a}))", act.np_softplus, _c_softplus),
        ("FakeQuant", None, _np_fake_quant, _c_fake_quant),
    ]
    return {op: OpForm(op, ne, fn, c) for op, ne, fn, c in rows}


#: Every op of :data:`ge_sdk.fused.PROGRAM_OPS` with its NumPy, numexpr and C spelling.
FORMS: dict[str, OpForm] = _table()
