"""Elementwise programs and the kernels generated from them.

A *program* is the body of a fused elementwise group, stored on the fused node as a JSON string
attribute (so a compiled ``.om`` carries it): a list of steps ``[op_type, [refs], {attrs}]``
evaluated in order. A ref is ``"a<k>"`` (kernel input ``k`` of the group), ``"y"`` (the result of
the anchor op, for an epilogue fused into a Conv or MatMul) or ``"t<j>"`` (the result of step
``j``); the last step's result is the program's result.

:func:`compile_program` turns a program plus input dtypes/shapes into a callable, cached by
signature:

- with static shapes, a program of several steps (or one step over :data:`LOOP_MIN_ELEMENTS`
  elements or more): one compiled loop (:mod:`ge_fusion.loopgen`, native C), the whole program per
  element, one pass over memory, vectorised;
- without native loops, a long chain on a small tensor: one numexpr expression (one call instead of
  one per op);
- otherwise, and wherever neither applies, generated NumPy code that works in place (each step
  a ufunc call writing into a buffer whose value died at that step, the last one into ``out``),
  run in cache-sized blocks on large tensors.
"""

from __future__ import annotations

import functools
import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.kernel import with_caps
from ge_native import gensrc, parallel

Step = tuple[str, list[str], dict[str, Any]]

#: Below this many output elements one pass of whole-array ufuncs is as good as any.
NUMEXPR_MIN_ELEMENTS = 32768
#: Below NUMEXPR_MIN_ELEMENTS, a group of at least this many ops runs as one numexpr call.
NUMEXPR_MIN_OPS_SMALL = 8
#: With native loops, a program of two or more steps always runs as one compiled loop (well under
#: 1 us a call against NumPy's 1-2 us per op); a single op from this many output elements.
LOOP_MIN_ELEMENTS = 1024
#: Elements per block of a blocked kernel (about 256 KB of float32: cache-resident).
CHUNK_ELEMENTS = 65536

#: Erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7): NumPy and numexpr have none.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def dumps(steps: Sequence[Step]) -> str:
    """The attribute form of a program."""
    return json.dumps([[op, list(refs), dict(attrs)] for op, refs, attrs in steps], separators=(",", ":"))


#: Bounds of a program read back from a model: steps, refs per step, characters of text.
MAX_STEPS = 4096
MAX_REFS = 1024
MAX_PROGRAM_CHARS = 1 << 20

_REF = re.compile(r"([at])(0|[1-9][0-9]{0,8})\Z", re.ASCII)


def loads(text: str, n_inputs: int | None = None, anchor: bool = False) -> list[Step]:
    """Parse and validate a program attribute; raises ValueError on a malformed one.

    Every step names an op of :data:`OPS` with its arity, refs ``a<k>`` (``k < n_inputs`` when
    given), ``t<j>`` (``j`` < the step's own index) or ``y`` (only with ``anchor``), and attributes
    from the op's own schema with values of the schema's types (returned normalised). Nothing
    else reaches a generator."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("the program is not UTF-8 text") from None
    if not isinstance(text, str):
        raise ValueError(f"a fused program is a JSON string, not {type(text).__name__}")
    if len(text) > MAX_PROGRAM_CHARS:
        raise ValueError(f"the program is longer than {MAX_PROGRAM_CHARS} characters")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"the program is not valid JSON ({type(e).__name__})") from None
    if not isinstance(raw, list):
        raise ValueError("a fused program is a list of steps")
    if not raw:
        raise ValueError("a fused program needs at least one step")
    if len(raw) > MAX_STEPS:
        raise ValueError(f"the program has {len(raw)} steps; at most {MAX_STEPS} are allowed")
    out: list[Step] = []
    for i, st in enumerate(raw):
        if not (isinstance(st, list) and len(st) == 3 and isinstance(st[0], str) and isinstance(st[1], list)
                and isinstance(st[2], dict)):
            raise ValueError(f"step {i} is not [op, [refs], {{attrs}}]")
        op, refs, attrs = st
        form = OPS.get(op)
        if form is None:
            raise ValueError(f"step {i}: op {op[:40]!r} has no generated form")
        if len(refs) > MAX_REFS:
            raise ValueError(f"step {i} ({op}) has {len(refs)} operands; at most {MAX_REFS} are allowed")
        if form.arity is not None and len(refs) != form.arity:
            raise ValueError(f"step {i} ({op}) has {len(refs)} operands; it takes {form.arity}")
        if not refs:
            raise ValueError(f"step {i} ({op}) has no operands")
        for r in refs:
            _check_ref(r, i, n_inputs, anchor)
        out.append((op, list(refs), form.check_attrs(attrs, f"step {i} ({op})")))
    return out


def _check_ref(r: Any, i: int, n_inputs: int | None, anchor: bool) -> None:
    if r == "y":
        if not anchor:
            raise ValueError(f"step {i} reads y, but this program has no anchor op")
        return
    m = _REF.match(r) if isinstance(r, str) else None
    if m is None:
        shown = r[:40] if isinstance(r, str) else r
        raise ValueError(f"step {i} has a bad ref {shown!r} (refs are a<k>, t<j> or y)")
    k = int(m.group(2))
    if m.group(1) == "t" and k >= i:
        raise ValueError(f"step {i} reads {r}, which is not computed yet")
    if m.group(1) == "a" and n_inputs is not None and k >= n_inputs:
        raise ValueError(f"step {i} reads {r}, but the kernel has {n_inputs} input(s)")


# attribute types of the schema: each normalises a value or raises ValueError
def _a_float(v: Any) -> float:
    if type(v) not in (int, float):
        raise ValueError(f"{type(v).__name__} {str(v)[:40]!r} is not a number")
    try:
        return float(v)
    except OverflowError:
        raise ValueError("the number is out of range") from None


def _a_float_or_none(v: Any) -> float | None:
    return None if v is None else _a_float(v)


def _a_choice(*allowed: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        if not isinstance(v, str) or v not in allowed:
            raise ValueError(f"{str(v)[:40]!r} is not one of {', '.join(allowed)}")
        return v

    return check


# ------------------------------------------------------------------------------------------------
# the op table: numexpr form (format string over operand expressions; None = none) and a NumPy
# function ``fn(*operands, out=None, **attrs)``
# ------------------------------------------------------------------------------------------------
def _np_relu(x, out=None):
    return np.maximum(x, x.dtype.type(0), out=out)


def _np_leaky(x, out=None, alpha=0.01):
    t = np.multiply(x, x.dtype.type(alpha))
    if math.isnan(alpha):  # neither max nor min: x where x >= 0, NaN elsewhere
        r = np.where(x >= 0, x, t)
        return r if out is None else np.copyto(out, r) or out
    return np.maximum(x, t, out=out) if alpha <= 1 else np.minimum(x, t, out=out)


def _np_sigmoid(x, out=None):
    t = np.negative(x, out=out)
    np.exp(t, out=t)
    t += 1
    return np.reciprocal(t, out=t)


def _np_silu(x, out=None):
    t = _np_sigmoid(x)
    return np.multiply(x, t, out=out)


def _np_hardsigmoid(x, out=None, alpha=0.2, beta=0.5):
    t = np.multiply(x, x.dtype.type(alpha))
    t += x.dtype.type(beta)
    return np.clip(t, 0, 1, out=out)


def _np_hardswish(x, out=None):
    t = _np_hardsigmoid(x, alpha=1 / 6, beta=0.5)
    return np.multiply(x, t, out=out)


def _np_clip(x, out=None, min=None, max=None):  # noqa: A002 - ONNX's names
    lo = -np.inf if min is None else min
    hi = np.inf if max is None else max
    return np.clip(x, x.dtype.type(lo), x.dtype.type(hi), out=out)


def _np_erf(x, out=None):
    dt = x.dtype.type
    a = np.abs(x)
    t = a * dt(_ERF_P)
    t += 1
    np.reciprocal(t, out=t)
    a1, a2, a3, a4, a5 = (dt(c) for c in _ERF_A)
    poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(dt(1), poly, out=poly)
    return np.copysign(poly, x, out=out)


def _np_gelu(x, out=None, approximate="none"):
    dt = x.dtype.type
    if approximate == "tanh":
        t = x * x
        t *= dt(0.044715)
        t += 1
        t *= x
        t *= dt(math.sqrt(2 / math.pi))
        np.tanh(t, out=t)
    else:
        t = _np_erf(x * dt(1 / math.sqrt(2)))
    t += 1
    t *= dt(0.5)
    return np.multiply(x, t, out=out)


def _np_elu(x, out=None, alpha=1.0):
    t = np.expm1(np.minimum(x, 0))
    t *= x.dtype.type(alpha)
    r = np.where(x > 0, x, t)
    if out is None:
        return r
    np.copyto(out, r)
    return out


def _np_softplus(x, out=None):
    return np.logaddexp(x, x.dtype.type(0), out=out)


def _np_identity(x, out=None):
    if out is None:
        return np.array(x, copy=True)
    np.copyto(out, x)
    return out


def _np_pow(a, b, out=None):
    if np.ndim(b) == 0 and float(b) == 2.0:
        return np.multiply(a, a, out=out)
    return np.power(a, b, out=out)


def _np_sum(*xs, out=None):
    if len(xs) == 1:
        return _np_identity(xs[0], out=out)
    r = np.add(xs[0], xs[1], out=out)
    for x in xs[2:]:
        np.add(r, x, out=r)
    return r


def _np_mean(*xs, out=None):
    r = _np_sum(*xs, out=out) if len(xs) > 1 else _np_identity(xs[0], out=out)
    return np.multiply(r, r.dtype.type(1.0 / len(xs)), out=r)


def _np_max(*xs, out=None):
    if len(xs) == 1:
        return _np_identity(xs[0], out=out)
    r = np.maximum(xs[0], xs[1], out=out)
    for x in xs[2:]:
        np.maximum(r, x, out=r)
    return r


def _np_min(*xs, out=None):
    if len(xs) == 1:
        return _np_identity(xs[0], out=out)
    r = np.minimum(xs[0], xs[1], out=out)
    for x in xs[2:]:
        np.minimum(r, x, out=r)
    return r


# numexpr forms: operand expressions are generator-made; numbers enter only through _lit
# (gensrc.literal: finite numbers; a NaN or infinite attribute makes the numexpr form refuse,
# and the program runs as NumPy code)
_lit = gensrc.literal


def _ne_erf(a: str) -> str:
    p, (a1, a2, a3, a4, a5) = _ERF_P, _ERF_A
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


class OpForm:
    """How one op type is generated: ``ne(*operand_exprs, **attrs)`` (or None), ``np``, the
    number of operands (None: one or more) and the attribute schema: name -> a type check that
    returns the normalised value or raises ValueError. A step's attributes are exactly those
    the schema names (each optional: the forms have defaults)."""

    def __init__(self, ne: Callable[..., str] | None, np_fn: Callable[..., np.ndarray], arity: int | None = 1,
                 attrs: dict[str, Callable[[Any], Any]] | None = None) -> None:
        self.ne, self.np, self.arity = ne, np_fn, arity
        self.attrs: dict[str, Callable[[Any], Any]] = dict(attrs or {})

    def check_attrs(self, attrs: dict[str, Any], where: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in attrs.items():
            check = self.attrs.get(k) if isinstance(k, str) else None
            if check is None:
                shown = k[:40] if isinstance(k, str) else k
                raise ValueError(f"{where} has attribute {shown!r}; it takes "
                                 f"{', '.join(sorted(self.attrs)) or 'none'}")
            try:
                out[k] = check(v)
            except ValueError as e:
                raise ValueError(f"{where}, attribute {k}: {e}") from None
        return out


def _u(name: str) -> Callable[..., str]:
    return lambda a: f"{name}({a})"


OPS: dict[str, OpForm] = {
    "Add": OpForm(lambda a, b: f"({a}+{b})", np.add, 2),
    "Sub": OpForm(lambda a, b: f"({a}-{b})", np.subtract, 2),
    "Mul": OpForm(lambda a, b: f"({a}*{b})", np.multiply, 2),
    "Div": OpForm(lambda a, b: f"({a}/{b})", np.true_divide, 2),
    "Pow": OpForm(lambda a, b: f"({a}**{b})", _np_pow, 2),
    "Sum": OpForm(lambda *xs: _ne_nary("+", *xs), _np_sum, None),
    "Mean": OpForm(lambda *xs: f"({_ne_nary('+', *xs)}/{len(xs)}.0)", _np_mean, None),
    "Max": OpForm(lambda *xs: _ne_chain(lambda a, b: f"maximum({a},{b})", *xs), _np_max, None),
    "Min": OpForm(lambda *xs: _ne_chain(lambda a, b: f"minimum({a},{b})", *xs), _np_min, None),
    "Neg": OpForm(lambda a: f"(-{a})", np.negative),
    "Abs": OpForm(_u("abs"), np.abs),
    "Exp": OpForm(_u("exp"), np.exp),
    "Log": OpForm(_u("log"), np.log),
    "Sqrt": OpForm(_u("sqrt"), np.sqrt),
    "Tanh": OpForm(_u("tanh"), np.tanh),
    "Sin": OpForm(_u("sin"), np.sin),
    "Cos": OpForm(_u("cos"), np.cos),
    "Reciprocal": OpForm(lambda a: f"(1/{a})", np.reciprocal),
    "Identity": OpForm(lambda a: a, _np_identity),
    "Relu": OpForm(lambda a: f"maximum({a},0)", _np_relu),
    "LeakyRelu": OpForm(lambda a, alpha=0.01: f"where({a}>0,{a},{_lit(float(alpha))}*{a})", _np_leaky,
                        attrs={"alpha": _a_float}),
    "Sigmoid": OpForm(lambda a: f"(1/(1+exp(-{a})))", _np_sigmoid),
    "Silu": OpForm(lambda a: f"({a}/(1+exp(-{a})))", _np_silu),
    "HardSigmoid": OpForm(lambda a, alpha=0.2, beta=0.5:
                          _ne_clip(f"({_lit(float(alpha))}*{a}+{_lit(float(beta))})", 0.0, 1.0), _np_hardsigmoid,
                          attrs={"alpha": _a_float, "beta": _a_float}),
    "HardSwish": OpForm(lambda a: f"({a}*{_ne_clip(f'({a}/6.0+0.5)', 0.0, 1.0)})", _np_hardswish),
    "Clip": OpForm(_ne_clip, _np_clip, attrs={"min": _a_float_or_none, "max": _a_float_or_none}),
    "Erf": OpForm(_ne_erf, _np_erf),
    "Gelu": OpForm(_ne_gelu, _np_gelu, attrs={"approximate": _a_choice("none", "tanh")}),
    "Elu": OpForm(lambda a, alpha=1.0: f"where({a}>0,{a},{_lit(float(alpha))}*(exp({a})-1))", _np_elu,
                  attrs={"alpha": _a_float}),
    "Softplus": OpForm(lambda a: f"log(1+exp({a}))", _np_softplus),
}


def supported(op_type: str) -> bool:
    return op_type in OPS


# ------------------------------------------------------------------------------------------------
# compilation
# ------------------------------------------------------------------------------------------------
_cache: dict[tuple, Callable[..., np.ndarray]] = {}
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def cache_info() -> dict[str, int]:
    """Hits and misses of the generated-kernel cache, and its size."""
    return {**_stats, "size": len(_cache)}


def _loops_on() -> bool:
    from . import loopgen

    return loopgen.available()


def compile_program(program: str, in_dtypes: Sequence[Any], in_shapes: Sequence[tuple | None], out_dtype: Any,
                    out_shape: tuple | None, *, anchor: bool = False, mode: str = "auto",
                    symbolic: tuple[Sequence[tuple | None], tuple | None] | None = None) -> Callable[..., np.ndarray]:
    """A callable ``fn(*operands, out=None) -> array`` for ``program``, cached by signature.

    ``operands`` are the values of ``y`` (first, when ``anchor``) and ``a0, a1, ...``; scalars
    among them may be passed as 0-d arrays. ``mode``: ``"loop"`` (a compiled loop, see
    :mod:`ge_fusion.loopgen`; generated NumPy code where there is none), ``"numexpr"``,
    ``"numpy"`` or ``"auto"``. ``symbolic`` (input shapes, output shape) with symbolic dims, where
    the static shapes are unknown: the loop is built for their layout class
    (:func:`ge_fusion.loopgen.loop_kernel_dynamic`), the NumPy code serves the other calls.
    """
    key = (program, tuple(str(np.dtype(d)) for d in in_dtypes), tuple(in_shapes), str(np.dtype(out_dtype)), out_shape,
           anchor, mode, mode in ("auto", "loop") and _loops_on(),
           None if symbolic is None else (tuple(symbolic[0]), symbolic[1]))
    with _cache_lock:
        fn = _cache.get(key)
        if fn is not None:
            _stats["hits"] += 1
            return fn
    _stats["misses"] += 1
    n_in = len(in_dtypes) - (1 if anchor else 0)
    steps = loads(program, n_inputs=n_in, anchor=anchor)
    names = (["y"] if anchor else []) + [gensrc.name("a", i) for i in range(n_in)]
    size = math.prod(out_shape) if out_shape is not None and all(isinstance(d, int) for d in out_shape) else None
    use_ne = mode == "numexpr" or (mode == "auto" and (size is None or size >= NUMEXPR_MIN_ELEMENTS))
    fn = None
    # Large tensors: one compiled loop (native C), one pass over memory, vectorised.
    if mode == "loop" or (mode == "auto" and size is not None and (size >= LOOP_MIN_ELEMENTS or len(steps) > 1)):
        from . import loopgen

        fn = loopgen.loop_kernel(steps, names, in_dtypes, in_shapes, out_dtype, out_shape)
    # Small tensors: NumPy pays ~0.5 us of dispatch per op, one numexpr call ~3 us for a whole
    # chain, so a long enough chain runs as one numexpr expression.
    small_chain = (mode == "auto" and size is not None and size < NUMEXPR_MIN_ELEMENTS
                   and len(steps) >= NUMEXPR_MIN_OPS_SMALL and np.dtype(out_dtype).kind == "f")
    if fn is None and (mode == "numexpr" or small_chain) and all(OPS[op].ne is not None for op, _, _ in steps):
        fn = _numexpr_kernel(steps, names, in_dtypes, np.dtype(out_dtype))
    if fn is None:
        fn = _numpy_kernel(steps, names, np.dtype(out_dtype), dict(zip(names, in_shapes)))
        if use_ne and mode != "numpy" and out_shape is not None and size is not None and size >= CHUNK_ELEMENTS * 2:
            fn = _chunked(fn, in_shapes, out_shape, np.dtype(out_dtype))
        sym_in, sym_out = symbolic if symbolic is not None else ((), None)
        if (size is None and mode in ("auto", "loop") and sym_out is not None and _loops_on()
                and all(sh is not None for sh in sym_in) and len(sym_in) == len(in_dtypes)):
            from . import loopgen

            fn = loopgen.loop_kernel_dynamic(steps, names, in_dtypes, [tuple(sh) for sh in sym_in if sh is not None],
                                             out_dtype, tuple(sym_out), fallback=fn) or fn
    with _cache_lock:
        _cache[key] = fn
    return fn


#: Ops whose numexpr form repeats an operand: a compound operand is computed once first.
_REPEATS = frozenset({"Erf", "Gelu", "HardSwish", "HardSigmoid", "Silu", "LeakyRelu", "Clip",
                      "Elu"})


def _numexpr_kernel(steps: list[Step], names: list[str], dtypes: Sequence[Any], out_dtype: np.dtype):
    """One numexpr expression per stage: a compound value read more than once (directly or
    through an op that repeats its operand) is a stage of its own, so nothing is computed twice."""
    try:
        import numexpr
        from numexpr.necompiler import getExprNames, getType
    except ImportError:  # pragma: no cover - numexpr is a dependency
        return None
    if out_dtype.kind != "f":
        return None

    uses: dict[str, int] = {}
    for op, refs, _ in steps:
        for r in refs:
            uses[r] = uses.get(r, 0) + (2 if op in _REPEATS else 1)
    exprs: dict[str, str] = {n: n for n in names}
    stages: list[tuple[str, str]] = []  # (temp name, expression)
    for j, (op, refs, attrs) in enumerate(steps):
        form = OPS[op]
        assert form.ne is not None
        try:
            exprs[f"t{j}"] = form.ne(*[exprs[r] for r in refs], **attrs)
        except gensrc.SourceTokenError:  # a NaN / infinite attribute has no literal: NumPy code
            return None
        if j < len(steps) - 1 and uses.get(f"t{j}", 0) > 1 and not re.fullmatch(r"\w+", exprs[f"t{j}"]):
            stages.append((f"s{len(stages)}", exprs[f"t{j}"]))
            exprs[f"t{j}"] = stages[-1][0]
    stages.append(("", exprs[f"t{len(steps) - 1}"]))
    if sum(len(e) for _, e in stages) > 20000:
        return None

    def kind(d: Any) -> Any:
        return getType(np.empty(0, np.dtype(d)))

    all_names = list(names) + [t for t, _ in stages[:-1]]
    all_types = list(dtypes) + [out_dtype] * (len(stages) - 1)
    compiled_stages = []
    for _, text in stages:
        # numexpr computes in double where a literal meets float32: literals become float32 variables
        text, consts = _hoist_literals(text, out_dtype)
        gensrc.check_source(text, _NE_VOCAB, mode="eval", what="a generated numexpr expression")
        used = set(re.findall(r"\b(y|a\d+|s\d+|k\d+)\b", text))
        pick = [i for i, n in enumerate(all_names) if n in used]
        kused = [c for c in consts if c in used]
        try:
            sig = [(all_names[i], kind(all_types[i])) for i in pick] + [(c, kind(out_dtype)) for c in kused]
            raw = numexpr.NumExpr(text, signature=sig)
            vml = bool(getExprNames(text, {})[1])
        except Exception:  # noqa: BLE001 - an expression numexpr refuses: use NumPy code
            return None
        compiled = functools.partial(raw, ex_uses_vml=vml)
        compiled_stages.append((compiled, pick, [np.asarray(consts[c], dtype=out_dtype) for c in kused], text))
    casts = [np.dtype(d) for d in dtypes]
    n_in = len(names)
    last = len(compiled_stages) - 1

    def kernel(*args, out=None):
        env = [a if isinstance(a, np.ndarray) and a.dtype == c else np.asarray(a, dtype=c) for a, c in zip(args, casts)]
        for k, (compiled, pick, cvals, _) in enumerate(compiled_stages):
            arrs = [env[i] for i in pick]
            if k < last:
                env.append(compiled(*arrs, *cvals, casting="unsafe"))
            elif out is None:
                r = compiled(*arrs, *cvals, casting="unsafe")
                return r if r.dtype == out_dtype else r.astype(out_dtype)
            else:
                compiled(*arrs, *cvals, out=out, casting="unsafe")
                return out
        raise AssertionError(n_in)  # pragma: no cover

    with_caps(kernel, mode="numexpr")
    kernel.source = "; ".join(f"{t or 'out'} = {e}" for _, _, _, e in compiled_stages for t in [""])  # type: ignore[attr-defined]
    kernel.stages = len(compiled_stages)  # type: ignore[attr-defined]
    return kernel


#: what a numexpr expression of :data:`OPS` is made of
_NE_VOCAB = gensrc.Vocabulary(
    names=frozenset({"y", "where", "abs", "exp", "log", "sqrt", "tanh", "sin", "cos", "maximum", "minimum"}),
    patterns=(r"a[0-9]+", r"s[0-9]+", r"k[0-9]+"))

#: what generated NumPy code is made of: generator-made refs and step functions, nothing else
_NP_VOCAB = gensrc.Vocabulary(
    names=frozenset({"kernel", "out", "np", "_dt", "_t", "r", "y"}),
    patterns=(r"a[0-9]+", r"t[0-9]+", r"f[0-9]+"),
    attributes=frozenset({"dtype", "shape", "astype", "broadcast_shapes"}),
    keywords=frozenset({"out"}))


def _tok(ref: str) -> str:
    """A ref of a validated program as a source token (``y``, ``a<k>``, ``t<j>``), re-made by the
    generator from its parts."""
    if ref == "y":
        return "y"
    tok = gensrc.name(ref[:1], int(ref[1:]))
    if tok != ref:
        raise gensrc.SourceTokenError(f"{ref!r} is not a canonical ref")
    return tok


def _hoist_literals(text: str, dtype: np.dtype) -> tuple[str, dict[str, float]]:
    consts: dict[str, float] = {}
    by_value: dict[str, str] = {}

    def sub(m: re.Match) -> str:
        lit = m.group(0)
        if lit not in by_value:
            by_value[lit] = f"k{len(by_value)}"
            consts[by_value[lit]] = float(lit)
        return by_value[lit]

    # numbers not part of a name (a0, t3, k1...)
    pattern = r"(?<![A-Za-z_0-9.])(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
    if dtype == np.float64:
        return text, {}
    return re.sub(pattern, sub, text), consts


def _static_shape(ref: str, shapes: dict[str, tuple | None]) -> tuple | None:
    if ref in shapes:
        sh = shapes[ref]
        return tuple(sh) if sh is not None and all(isinstance(d, int) for d in sh) else None
    try:
        float(ref)
        return ()
    except ValueError:
        return None


def _numpy_kernel(steps: list[Step], names: list[str], out_dtype: np.dtype,
                  in_shapes: dict[str, tuple | None] | None = None):
    """Generate straight-line NumPy code; temporaries are reused once their value is dead.

    With static input shapes the shape of every temporary is known when the code is written, so
    a dead temporary is chosen for a result at generation time, with no shape test per call."""
    shapes: dict[str, tuple | None] = dict(in_shapes or {})
    last_use: dict[str, int] = {}
    for j, (_, refs, _) in enumerate(steps):
        for r in refs:
            last_use[r] = j
    n = len(steps)
    lines = [f"def kernel({', '.join(_tok(n) for n in names)}, out=None):"]
    free: list[str] = []  # temporaries (generated, never inputs) whose value is dead
    env: dict[str, Any] = {"np": np}
    for j, (op, refs, attrs) in enumerate(steps):
        # the step's function, its (schema-checked) attributes bound as objects: no attribute
        # key or value is ever part of the source
        fname = gensrc.name("f", j)
        fn = OPS[op].np
        env[fname] = functools.partial(fn, **attrs) if attrs else fn
        args = ", ".join(_tok(r) for r in refs)
        # a temporary that dies here may take the result when it has the result's shape
        dying = [r for r in refs if r[0] == "t" and last_use.get(r) == j]
        target = "out" if j == n - 1 else None
        if target is None:
            for r in dying:
                if r not in free:
                    free.append(r)
            ref_shapes = [_static_shape(r, shapes) for r in refs]
            result = None
            if all(sh is not None for sh in ref_shapes):
                try:
                    result = tuple(np.broadcast_shapes(*ref_shapes))  # type: ignore[arg-type]
                except ValueError:
                    result = None
            shapes[f"t{j}"] = result
            cand = [r for r in free]
            static = [r for r in cand if result is not None and result != () and shapes.get(r) == result]
            if static:
                t = static[0]
                lines.append(f"    t{j} = {fname}({args}, out={t} if {t}.dtype == _dt else None)")
                free.remove(t)
            elif cand and result is None:
                t = cand[0]
                lines.append(f"    _t = {t} if {t}.shape == np.broadcast_shapes({', '.join(_shape(_tok(r)) for r in refs)}) "
                             f"and {t}.dtype == _dt else None")
                lines.append(f"    t{j} = {fname}({args}, out=_t)")
                free.remove(t)
            else:
                lines.append(f"    t{j} = {fname}({args})")
        else:
            lines.append(f"    t{j} = {fname}({args}, out=out)")
    lines.append(f"    r = t{n - 1}")
    lines.append("    return r if r.dtype == _dt else r.astype(_dt)")
    env["_dt"] = out_dtype
    src = "\n".join(lines)
    code = gensrc.compile_checked(src, "<ge_fusion generated>", _NP_VOCAB)
    exec(code, env)  # noqa: S102 - checked generated code (gensrc)
    kernel = env["kernel"]
    with_caps(kernel, mode="numpy")
    kernel.source = src
    return kernel


def _chunked(body, in_shapes: Sequence[tuple | None], out_shape: tuple, out_dtype: np.dtype):
    """Run ``body`` block by block along the first non-unit axis, so the whole chain of ufuncs
    works on cache-resident blocks (NumPy's SIMD loops, one pass over memory)."""
    rank = len(out_shape)
    ax = next((i for i, d in enumerate(out_shape) if d > 1), None)
    if ax is None or any(sh is None for sh in in_shapes):
        return body
    inner = math.prod(out_shape[ax + 1:])
    rows = max(1, CHUNK_ELEMENTS // max(1, inner))
    n = out_shape[ax]
    if rows >= n:
        return body
    # per input: the position of the chunked axis in its own dims, or None (broadcast along it)
    where: list[int | None] = []
    for sh in in_shapes:
        assert sh is not None
        k = ax - (rank - len(sh))
        where.append(k if k >= 0 and sh[k] == n else None)
    starts = list(range(0, n, rows))

    def run_block(i, args, out):
        sl = slice(starts[i], starts[i] + rows)
        part = [a if k is None else a[(slice(None),) * k + (sl,)] for a, k in zip(args, where)]
        body(*part, out=out[(slice(None),) * ax + (sl,)])

    def kernel(*args, out=None):
        if out is None:
            out = np.empty(out_shape, out_dtype)
        # blocks over GE's pool when the run is wider than one thread (NumPy releases the GIL
        # inside each ufunc); each element's result is the same either way
        parallel.parallel_for(len(starts), lambda i: run_block(i, args, out))
        return out

    with_caps(kernel, mode="numpy-blocked")
    kernel.source = getattr(body, "source", "")  # type: ignore[attr-defined]
    return kernel


def _shape(ref: str) -> str:
    return f"np.shape({ref})"
