"""The kernels generated from elementwise programs (the program format is :mod:`ge_sdk.fused`'s).

:func:`compile_program` turns a program plus input dtypes/shapes into a callable, cached by
signature:

- with static shapes, a program of several steps (or one step over :data:`LOOP_MIN_ELEMENTS`
  elements or more): one compiled loop (:mod:`ge_cpu.fused.loopgen`, native C), the whole program
  per element, one pass over memory, vectorised;
- without native loops, a long chain on a small tensor: one numexpr expression (one call instead of
  one per op);
- otherwise, and wherever neither applies, generated NumPy code that works in place (each step
  a ufunc call writing into a buffer whose value died at that step, the last one into ``out``),
  run in cache-sized blocks on large tensors.

Each op's NumPy, numexpr and C spelling is one row of :data:`ge_cpu.fused.forms.FORMS`.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.kernel import with_caps
from ge_native import gensrc, parallel
from ge_sdk.fused import LOOP_MIN_ELEMENTS as LOOP_MIN_ELEMENTS
from ge_sdk.fused import MAX_PROGRAM_CHARS as MAX_PROGRAM_CHARS
from ge_sdk.fused import MAX_REFS as MAX_REFS
from ge_sdk.fused import MAX_STEPS as MAX_STEPS
from ge_sdk.fused import Step as Step
from ge_sdk.fused import dumps as dumps
from ge_sdk.fused import loads as loads
from ge_sdk.fused import supported as supported

from .forms import FORMS

#: Every op a program may contain, with its forms, arity and attribute schema.
OPS = FORMS

#: Below this many output elements one pass of whole-array ufuncs is as good as any.
NUMEXPR_MIN_ELEMENTS = 32768
#: Below NUMEXPR_MIN_ELEMENTS, a group of at least this many ops runs as one numexpr call.
NUMEXPR_MIN_OPS_SMALL = 8
#: Elements per block of a blocked kernel (about 256 KB of float32: cache-resident).
CHUNK_ELEMENTS = 65536


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


def _loop_form() -> str | None:
    """Which loops :func:`compile_program` builds now: None (no compiled loops), ``"parametric"``
    or ``"literal"`` (:data:`ge_cpu.fused.loopgen.PARAMETRIC`); part of the cache key."""
    from . import loopgen

    return ("parametric" if loopgen.PARAMETRIC else "literal") if loopgen.available() else None


def compile_program(program: str, in_dtypes: Sequence[Any], in_shapes: Sequence[tuple | None], out_dtype: Any,
                    out_shape: tuple | None, *, anchor: bool = False, mode: str = "auto",
                    symbolic: tuple[Sequence[tuple | None], tuple | None] | None = None) -> Callable[..., np.ndarray]:
    """A callable ``fn(*operands, out=None) -> array`` for ``program``, cached by signature.

    ``operands`` are the values of ``y`` (first, when ``anchor``) and ``a0, a1, ...``; scalars
    among them may be passed as 0-d arrays. ``mode``: ``"loop"`` (a compiled loop, see
    :mod:`ge_cpu.fused.loopgen`; generated NumPy code where there is none), ``"numexpr"``,
    ``"numpy"`` or ``"auto"``. ``symbolic`` (input shapes, output shape) with symbolic dims, where
    the static shapes are unknown: the loop is built for their layout class
    (:func:`ge_cpu.fused.loopgen.loop_kernel_dynamic`), the NumPy code serves the other calls.
    """
    key = (program, tuple(str(np.dtype(d)) for d in in_dtypes), tuple(in_shapes), str(np.dtype(out_dtype)), out_shape,
           anchor, mode, _loop_form() if mode in ("auto", "loop") else None,
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
    code = gensrc.compile_checked(src, "<ge_cpu.fused generated>", _NP_VOCAB)
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
