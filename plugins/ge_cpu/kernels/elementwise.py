"""Element-wise kernels: arithmetic, activations, comparisons, logic, Cast, Clip, Where, variadic."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np

from ge_core.kernel import KernelSpec, with_caps
from ge_native import native
from ge_native.jit import enabled as jit_enabled

from ._util import as_str, cast_like, in_dtype, is_float, kernel_table, onnx_dtype, out_dtype, unsupported

KERNELS, _reg = kernel_table()


# ---------------------------------------------------------------------------------------------
# erf (NumPy has none): Taylor series near 0, Numerical Recipes' erfc (rel. error < 1.2e-7) beyond.

_ERF_TAYLOR = (1.0, -1.0 / 3, 1.0 / 10, -1.0 / 42, 1.0 / 216, -1.0 / 1320, 1.0 / 9360, -1.0 / 75600)
_VEC_ERF = np.frompyfunc(math.erf, 1, 1)


_erf_loops: dict[str, Any] = {}

#: fixed source: out[i] = erf(x[i]) for float32 (the prelude's vectorised erf32, within 7 ulp)
#: and float64 (libm's erf)
_ERF_SRC = """
#define ERF_LOOP(NAME, T, NPY, F)                                                   \\
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {       \\
    int64_t count;                                                                  \\
    if (ge_nargs(n, 2)) return NULL;                                                \\
    const T *x = (const T *)ge_vec(args, 0, NPY, 0, &count);                        \\
    if (!x) return NULL;                                                            \\
    T *out = (T *)ge_arr(args, 1, NPY, 1, count);                                   \\
    if (!out) return NULL;                                                          \\
    Py_BEGIN_ALLOW_THREADS                                                          \\
    for (int64_t i = 0; i < count; i++) out[i] = F(x[i]);                           \\
    Py_END_ALLOW_THREADS                                                            \\
    Py_RETURN_NONE;                                                                 \\
}
ERF_LOOP(erf_f32, float, NPY_FLOAT, erf32)
ERF_LOOP(erf_f64, double, NPY_DOUBLE, erf)
"""


def _erf_loop(dtype: np.dtype) -> Any:
    """A compiled erf loop for float32 or float64, or None without native kernels / with
    GE_CPU_JIT=0."""
    if dtype.name not in ("float32", "float64") or not jit_enabled("GE_CPU_JIT"):
        return None
    if "mod" not in _erf_loops:
        _erf_loops["mod"] = native.build(_ERF_SRC, ["erf_f32", "erf_f64"])
    mod = _erf_loops["mod"]
    if mod is None:
        return None
    return mod.erf_f32 if dtype == np.float32 else mod.erf_f64


def erf(x: np.ndarray) -> np.ndarray:
    loop = _erf_loop(x.dtype) if x.size >= 64 else None
    if loop is not None:
        out = np.empty(x.shape, x.dtype)
        loop(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
        return out
    if x.dtype == np.float64:
        return _VEC_ERF(x).astype(np.float64)
    z = x.astype(np.float64)
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = 0.17087277
    for c in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368, -1.26551223):
        poly = c + t * poly
    erfc = t * np.exp(-a * a + poly)
    far = np.copysign(1.0 - erfc, z)
    z2 = z * z
    s = _ERF_TAYLOR[-1]
    for c in _ERF_TAYLOR[-2::-1]:
        s = c + z2 * s
    near = (2.0 / math.sqrt(math.pi)) * z * s
    return np.where(a < 0.5, near, far).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# binary arithmetic


def _legacy_broadcast(spec: KernelSpec) -> Callable | None:
    """Opset < 7 binary ops: ``broadcast=1`` with optional ``axis`` aligns B inside A."""
    if spec.opset >= 7 or not spec.attr("broadcast", 0):
        return None
    axis = spec.attr("axis", None)
    if axis is None:
        return None

    def align(a, b):
        ax = axis + a.ndim if axis < 0 else axis
        shape = (1,) * ax + b.shape + (1,) * (a.ndim - ax - b.ndim)
        return b.reshape(shape)

    return align


def _binary(fn: Callable) -> Callable:
    def factory(spec: KernelSpec):
        align = _legacy_broadcast(spec)
        if align is None:
            def kernel(a, b):
                r = fn(a, b)
                return (cast_like(r, a.dtype) if isinstance(r, np.ndarray) else np.asarray(r, a.dtype),)
        else:
            def kernel(a, b):
                return (cast_like(np.asarray(fn(a, align(a, b))), a.dtype),)
        return kernel

    return factory


def _binary_out(fn: Callable) -> Callable:
    """Add/Sub/Mul/Div on one floating dtype: a ufunc call that can write into ``out=``."""
    base = _binary(fn)

    def factory(spec: KernelSpec):
        if _legacy_broadcast(spec) is not None or not _float_io(spec):
            return base(spec)

        def kernel(a, b, out=None):
            if out is None:
                return (fn(a, b),)
            fn(a, b, out=out[0])
            return out

        with_caps(kernel, accepts_out=True, inplace_ok=True)
        return kernel

    return factory


KERNELS[("", "Add")] = _binary_out(np.add)
KERNELS[("", "Sub")] = _binary_out(np.subtract)
KERNELS[("", "Mul")] = _binary_out(np.multiply)


def _int_div(a, b):
    """C-style integer division (truncation toward zero), as ONNX Runtime does."""
    q = np.floor_divide(a, b)
    if np.issubdtype(a.dtype, np.signedinteger):
        fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        q = q + fix.astype(q.dtype)
    return q


@_reg("Div")
def div_factory(spec: KernelSpec):
    dt = in_dtype(spec, 0)
    if dt is not None and np.issubdtype(dt, np.integer):
        return _binary(_int_div)(spec)
    if dt is None:
        def anydiv(a, b):
            return _int_div(a, b) if np.issubdtype(a.dtype, np.integer) else np.divide(a, b)
        return _binary(anydiv)(spec)
    return _binary_out(np.divide)(spec)


@_reg("Pow")
def pow_factory(spec: KernelSpec):
    align = _legacy_broadcast(spec)

    def kernel(x, y):
        if align is not None:
            y = align(x, y)
        if np.issubdtype(x.dtype, np.floating):
            r = np.power(x, y.astype(x.dtype, copy=False))
        elif np.issubdtype(y.dtype, np.floating):
            r = np.power(x.astype(np.float64), y)
        else:
            r = np.power(x.astype(np.int64), y.astype(np.int64))
        return (cast_like(np.asarray(r), x.dtype),)

    return kernel


@_reg("Mod")
def mod_factory(spec: KernelSpec):
    fmod = int(spec.attr("fmod", 0))
    dt = in_dtype(spec, 0)
    if not fmod and dt is not None and is_float(dt):
        raise unsupported(spec, "fmod=0 with floating-point inputs (ONNX requires fmod=1)")
    fn = np.fmod if fmod else np.mod

    def kernel(a, b):
        return (cast_like(np.asarray(fn(a, b)), a.dtype),)

    return kernel


@_reg("BitShift")
def bitshift_factory(spec: KernelSpec):
    direction = as_str(spec.attr("direction"), "")
    if direction not in ("LEFT", "RIGHT"):
        raise unsupported(spec, f"direction={direction!r}")
    fn = np.left_shift if direction == "LEFT" else np.right_shift

    def kernel(a, b):
        return (cast_like(np.asarray(fn(a, b.astype(a.dtype, copy=False))), a.dtype),)

    return kernel


# comparisons and logic: bool output
def _cmp(fn):
    def factory(spec: KernelSpec):
        align = _legacy_broadcast(spec)

        def kernel(a, b):
            if align is not None:
                b = align(a, b)
            return (np.asarray(fn(a, b)),)

        return kernel

    return factory


for _name, _fn in (
    ("Equal", np.equal),
    ("Less", np.less),
    ("Greater", np.greater),
    ("LessOrEqual", np.less_equal),
    ("GreaterOrEqual", np.greater_equal),
    ("And", np.logical_and),
    ("Or", np.logical_or),
    ("Xor", np.logical_xor),
):
    KERNELS[("", _name)] = _cmp(_fn)


@_reg("Not")
def not_factory(spec: KernelSpec):
    return lambda x: (np.logical_not(x),)


# ---------------------------------------------------------------------------------------------
# unary


def _float_io(spec: KernelSpec) -> bool:
    """Every input and output has the same known floating dtype (so a ufunc can write ``out=``)."""
    dts = [t.dtype if t is not None else None for t in list(spec.inputs) + list(spec.outputs)]
    return bool(dts) and dts[0] is not None and dts[0].kind == "f" and dts[0].name != "bfloat16" \
        and all(d == dts[0] for d in dts)


def _unary(fn: Callable, keep_dtype: bool = True) -> Callable:
    def factory(spec: KernelSpec):
        if keep_dtype and isinstance(fn, np.ufunc) and _float_io(spec):
            def kernel_out(x, out=None):
                if out is None:
                    return (fn(x),)
                fn(x, out=out[0])
                return out

            with_caps(kernel_out, accepts_out=True, inplace_ok=True)
            return kernel_out
        if keep_dtype:
            def kernel(x):
                return (cast_like(np.asarray(fn(x)), x.dtype),)
        else:
            def kernel(x):
                return (np.asarray(fn(x)),)
        return kernel

    return factory


def _relu(x):
    return np.maximum(x, 0, dtype=x.dtype) if x.dtype != np.bool_ else x


@_reg("Relu")
def relu_factory(spec: KernelSpec):
    if not _float_io(spec):
        return _unary(_relu)(spec)

    def kernel(x, out=None):
        if out is None:
            return (np.maximum(x, x.dtype.type(0)),)
        np.maximum(x, x.dtype.type(0), out=out[0])
        return out

    with_caps(kernel, accepts_out=True, inplace_ok=True)
    return kernel


def _sigmoid(x):
    with np.errstate(over="ignore"):
        e = np.negative(x, out=np.empty_like(x))
        np.exp(e, out=e)
        e += 1
        return np.reciprocal(e, out=e)


def _reciprocal(x):
    with np.errstate(divide="ignore"):
        return np.reciprocal(x)


def _log(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def _sqrt(x):
    with np.errstate(invalid="ignore"):
        return np.sqrt(x)


def _softplus(x):
    return np.logaddexp(x.dtype.type(0), x)


def _softsign(x):
    return x / (1 + np.abs(x))


def _mish(x):
    return x * np.tanh(np.logaddexp(x.dtype.type(0), x))


def _hardswish(x):
    return x * np.clip(x * x.dtype.type(1 / 6) + x.dtype.type(0.5), 0, 1)


def _unsafe(fn):
    def wrapped(x):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return fn(x)

    return wrapped


for _name, _fn in (
    ("Abs", np.abs),
    ("Neg", np.negative),
    ("Reciprocal", _reciprocal),
    ("Floor", np.floor),
    ("Ceil", np.ceil),
    ("Round", np.round),
    ("Sign", np.sign),
    ("Sqrt", _sqrt),
    ("Exp", _unsafe(np.exp)),
    ("Log", _log),
    ("Sigmoid", _sigmoid),
    ("Tanh", np.tanh),
    ("Erf", erf),
    ("Softplus", _softplus),
    ("Softsign", _softsign),
    ("Mish", _mish),
    ("HardSwish", _hardswish),
    ("Sin", np.sin),
    ("Cos", np.cos),
    ("Tan", np.tan),
    ("Asin", _unsafe(np.arcsin)),
    ("Acos", _unsafe(np.arccos)),
    ("Atan", np.arctan),
    ("Sinh", _unsafe(np.sinh)),
    ("Cosh", _unsafe(np.cosh)),
    ("Asinh", np.arcsinh),
    ("Acosh", _unsafe(np.arccosh)),
    ("Atanh", _unsafe(np.arctanh)),
):
    KERNELS[("", _name)] = _unary(_fn)

KERNELS[("", "IsNaN")] = _unary(np.isnan, keep_dtype=False)


@_reg("IsInf")
def isinf_factory(spec: KernelSpec):
    neg = int(spec.attr("detect_negative", 1))
    pos = int(spec.attr("detect_positive", 1))

    def kernel(x):
        if neg and pos:
            return (np.isinf(x),)
        if neg:
            return (np.isneginf(x),)
        if pos:
            return (np.isposinf(x),)
        return (np.zeros(x.shape, np.bool_),)

    return kernel


# ---------------------------------------------------------------------------------------------
# parameterised activations


@_reg("LeakyRelu")
def leaky_relu_factory(spec: KernelSpec):
    alpha = float(spec.attr("alpha", 0.01))

    def kernel(x):
        return (np.where(x >= 0, x, x * x.dtype.type(alpha)),)

    return kernel


@_reg("Elu")
def elu_factory(spec: KernelSpec):
    alpha = float(spec.attr("alpha", 1.0))

    def kernel(x):
        with np.errstate(over="ignore"):
            neg = np.expm1(np.minimum(x, 0)) * x.dtype.type(alpha)
        return (np.where(x > 0, x, neg).astype(x.dtype, copy=False),)

    return kernel


@_reg("Celu")
def celu_factory(spec: KernelSpec):
    alpha = float(spec.attr("alpha", 1.0))

    def kernel(x):
        a = x.dtype.type(alpha)
        neg = a * np.expm1(np.minimum(x, 0) / a)
        return (np.maximum(x, 0) + np.minimum(neg, 0),)

    return kernel


@_reg("Selu")
def selu_factory(spec: KernelSpec):
    alpha = float(spec.attr("alpha", 1.67326319217681884765625))
    gamma = float(spec.attr("gamma", 1.05070102214813232421875))

    def kernel(x):
        t = x.dtype.type
        neg = t(alpha) * np.expm1(np.minimum(x, 0))
        return ((t(gamma) * np.where(x > 0, x, neg)).astype(x.dtype, copy=False),)

    return kernel


@_reg("ThresholdedRelu")
def thresholded_relu_factory(spec: KernelSpec):
    alpha = float(spec.attr("alpha", 1.0))

    def kernel(x):
        return (np.where(x > x.dtype.type(alpha), x, x.dtype.type(0)),)

    return kernel


@_reg("PRelu")
def prelu_factory(spec: KernelSpec):
    def kernel(x, slope):
        if spec.opset < 7 and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1]:
            slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
        return (np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False),)

    return kernel


@_reg("HardSigmoid")
def hard_sigmoid_factory(spec: KernelSpec):
    alpha = float(spec.attr("alpha", 0.2))
    beta = float(spec.attr("beta", 0.5))

    def kernel(x):
        t = x.dtype.type
        y = np.multiply(x, t(alpha), out=np.empty_like(x))
        y += t(beta)
        return (np.clip(y, 0, 1, out=y),)

    return kernel


@_reg("Shrink")
def shrink_factory(spec: KernelSpec):
    bias = float(spec.attr("bias", 0.0))
    lambd = float(spec.attr("lambd", 0.5))

    def kernel(x):
        t = x.dtype.type
        y = np.where(x < -lambd, x + t(bias), np.where(x > lambd, x - t(bias), t(0)))
        return (y.astype(x.dtype, copy=False),)

    return kernel


@_reg("Gelu")
def gelu_factory(spec: KernelSpec):
    approx = as_str(spec.attr("approximate"), "none")
    if approx not in ("none", "tanh"):
        raise unsupported(spec, f"approximate={approx!r}")
    if approx == "tanh":
        def kernel(x):
            t = x.dtype.type
            inner = t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)
            return ((t(0.5) * x * (1 + np.tanh(inner))).astype(x.dtype, copy=False),)
    else:
        def kernel(x):
            t = x.dtype.type
            return ((t(0.5) * x * (1 + erf(x * t(1 / math.sqrt(2))))).astype(x.dtype, copy=False),)
    return kernel


# ---------------------------------------------------------------------------------------------
# Clip, Where, Cast, variadic


@_reg("Clip")
def clip_factory(spec: KernelSpec):
    if spec.opset < 11:
        lo = spec.attr("min", None)
        hi = spec.attr("max", None)

        def kernel(x):
            y = x
            if lo is not None:
                y = np.maximum(y, x.dtype.type(lo))
            if hi is not None:
                y = np.minimum(y, x.dtype.type(hi))
            return (y if y is not x else x.copy(),)

        return kernel

    def kernel(x, lo=None, hi=None):
        y = x
        if lo is not None and lo.size:
            y = np.maximum(y, lo.reshape(()).astype(x.dtype))
        if hi is not None and hi.size:
            y = np.minimum(y, hi.reshape(()).astype(x.dtype))
        return (y if y is not x else x.copy(),)

    return kernel


@_reg("Where")
def where_factory(spec: KernelSpec):
    return lambda c, x, y: (np.where(c, x, y),)


@_reg("Cast")
def cast_factory(spec: KernelSpec):
    to = spec.attr("to")
    if to is None:
        raise unsupported(spec, "missing 'to' attribute")
    if isinstance(to, (str, bytes)):
        # opset 1 allowed the type name as a string
        names = {"FLOAT": 1, "UINT8": 2, "INT8": 3, "UINT16": 4, "INT16": 5, "INT32": 6, "INT64": 7,
                 "STRING": 8, "BOOL": 9, "FLOAT16": 10, "DOUBLE": 11, "UINT32": 12, "UINT64": 13}
        to = names.get(as_str(to).upper())
        if to is None:
            raise unsupported(spec, f"to={spec.attr('to')!r}")
    if int(to) in _REFERENCE_CAST_TYPES:
        raise unsupported(spec, f"casting to ONNX data type {to} (saturating/rounding rules of 8-, 4- and 2-bit types)")
    target = onnx_dtype(spec, to)
    return _make_cast(target)


#: FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, FLOAT4E2M1, FLOAT8E8M0, UINT2, INT2:
#: targets whose rounding and saturation NumPy's astype does not implement (the plugin hands
#: these nodes to the onnx.reference fallback).
_REFERENCE_CAST_TYPES = frozenset({17, 18, 19, 20, 23, 24, 25, 26})
_REFERENCE_CAST_NAMES = ("float8", "float4", "int2", "uint2")


def _float_str(v) -> str:
    """Shortest round-trip text of a float, spelled as onnxruntime does (NaN, INF, -2 not -2.0)."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    text = str(v)
    return text[:-2] if text.endswith(".0") else text


def _make_cast(target: np.dtype):
    if target == np.dtype(object):
        def kernel(x, *_):
            if x.dtype == np.dtype(object):
                return (x.copy(),)
            if np.issubdtype(x.dtype, np.floating):
                return (np.array([_float_str(v) for v in x.reshape(-1)], dtype=object).reshape(x.shape),)
            return (x.astype(str).astype(object),)
        return kernel

    def kernel(x, *_):
        if x.dtype == np.dtype(object):
            return (np.array([target.type(v) for v in x.reshape(-1)], dtype=target).reshape(x.shape)
                    if x.size else np.zeros(x.shape, target),)
        if x.dtype == target:
            return (x,)
        with np.errstate(invalid="ignore", over="ignore"):
            return (x.astype(target),)
    return kernel


@_reg("CastLike")
def castlike_factory(spec: KernelSpec):
    target = in_dtype(spec, 1) or out_dtype(spec, 0)
    if target is not None and target.name.startswith(_REFERENCE_CAST_NAMES):
        raise unsupported(spec, f"casting to {target.name} (saturating/rounding rules of 8-, 4- and 2-bit types)")
    if target is not None:
        cast = _make_cast(target)
        return lambda x, like: cast(x)

    def kernel(x, like):
        return _make_cast(like.dtype)(x)

    return kernel


def _variadic(fn: Callable, mean: bool = False):
    def factory(spec: KernelSpec):
        def kernel(*xs):
            xs = [x for x in xs if x is not None]
            dt = xs[0].dtype
            if len(xs) == 1:
                return (xs[0].copy(),)
            r = reduce(fn, xs)
            if mean:
                r = r / dt.type(len(xs))
            return (cast_like(np.asarray(r), dt),)
        return kernel

    return factory


KERNELS[("", "Sum")] = _variadic(np.add)
KERNELS[("", "Max")] = _variadic(np.maximum)
KERNELS[("", "Min")] = _variadic(np.minimum)
KERNELS[("", "Mean")] = _variadic(np.add, mean=True)

__all__ = ["KERNELS", "erf"]
