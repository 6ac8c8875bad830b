"""Compiled loop kernels for large fused elementwise groups (numba).

A fused group over a large tensor is bound by how often it walks memory and by how well each
step vectorises. NumPy walks memory once per op (eight passes for an eight-op chain); a
generated loop computes the whole program per element in registers, reads each input once and
writes the output once, and LLVM vectorises it. This module writes such a loop from a fused
program (:mod:`ge_fusion.codegen`) and compiles it with numba.

Shapes are not part of the compiled code, so one compiled loop serves every layer whose group
has the same program, dtypes and broadcast pattern (BN+ReLU in every block of a ResNet compiles
once). The iteration space is the output's, with every operand's broadcast strides coalesced
into at most three dimensions; the innermost is contiguous in the output and either contiguous
or broadcast (stride 0, loaded once per row) in each operand.

Compiled loops are cached in memory only: numba's on-disk cache is a pickle, and nothing here
reads pickles. Set ``GE_FUSION_JIT=0`` to never use this path (generated NumPy code runs
instead); numba not being importable has the same effect.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_sdk import gensrc, parallel
from ge_sdk.jit import numba_if_enabled

#: dtypes the loops are generated for (every operand and the output share one of them)
DTYPES = ("float32", "float64")

#: A loop over this many output elements or more is split into parts for a run that is more
#: than one thread wide (one part per this many, at most 8).
PART_ELEMENTS = 1 << 18

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}
_stats = {"compiled": 0, "reused": 0, "compile_s": 0.0, "inplace_variants": 0}
_numba: Any = None


def available() -> bool:
    """True when numba imports and ``GE_FUSION_JIT`` does not turn the loops off."""
    global _numba
    _numba = numba_if_enabled("GE_FUSION_JIT")
    return _numba is not None


def stats() -> dict[str, float]:
    """Loops compiled in this process, reuses of a compiled loop, seconds spent compiling, and
    how many of the compiled loops are in-place variants (an operand read through the output)."""
    return dict(_stats)


# ------------------------------------------------------------------------------------------------
# scalar forms of the program's ops: expressions over generator-made operand names; every number
# an op needs (its attributes included) is a typed constant K<n> bound in the namespace the loop
# is compiled in, never a literal in the source
# ------------------------------------------------------------------------------------------------
def _chain(fn: str, xs: Sequence[str]) -> str:
    r = xs[0]
    for x in xs[1:]:
        r = f"{fn}({r}, {x})"
    return r


class _Emitter:
    """Writes one step's scalar expression; constants are collected as typed globals."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.consts: dict[str, Any] = {}
        self._by_value: dict[str, str] = {}
        #: set when a step needs a libm call that keeps the loop from vectorising
        self.scalar_calls: list[str] = []

    def f(self, name: str) -> str:
        """The vectorisable float32 form of a math function (:mod:`ge_sdk.vmath`); libm's
        scalar one otherwise (noted: NumPy's SIMD ufuncs beat such a loop)."""
        if self.dtype == np.float32 and name in _VMATH:
            return _VMATH[name]
        self.scalar_calls.append(name)
        return f"math.{name}"

    def k(self, value: float) -> str:
        v = float(value)
        key = repr(v)  # -0.0 and 0.0 are two constants; every NaN is one
        name = self._by_value.get(key)
        if name is None:
            name = gensrc.name("K", len(self._by_value))
            self._by_value[key] = name
            self.consts[name] = self.dtype.type(v)
        return name

    def __call__(self, op: str, xs: list[str], attrs: dict[str, Any]) -> str | None:
        k = self.k
        a = xs[0] if xs else ""
        if op == "Add":
            return f"({xs[0]} + {xs[1]})"
        if op == "Sub":
            return f"({xs[0]} - {xs[1]})"
        if op == "Mul":
            return f"({xs[0]} * {xs[1]})"
        if op == "Div":
            return f"({xs[0]} / {xs[1]})"
        if op == "Pow":
            return f"_pow({xs[0]}, {xs[1]})"
        if op == "Sum":
            return "(" + " + ".join(xs) + ")"
        if op == "Mean":
            return f"(({' + '.join(xs)}) * {k(1.0 / len(xs))})"
        if op == "Max":
            return _chain("_max", xs)
        if op == "Min":
            return _chain("_min", xs)
        if op == "Neg":
            return f"(-{a})"
        if op == "Abs":
            return f"abs({a})"
        if op == "Sqrt":
            return f"math.sqrt({a})"
        if op in ("Exp", "Log", "Tanh", "Sin", "Cos", "Erf"):
            return f"{self.f(op.lower())}({a})"
        if op == "Reciprocal":
            return f"({k(1)} / {a})"
        if op == "Identity":
            return a
        if op == "Relu":
            return f"_max({a}, {k(0)})"
        if op == "LeakyRelu":
            return f"({a} if {a} >= {k(0)} else {k(attrs.get('alpha', 0.01))} * {a})"
        if op == "Sigmoid":
            return f"({k(1)} / ({k(1)} + {self.f('exp')}(-{a})))"
        if op == "Silu":
            return f"({a} / ({k(1)} + {self.f('exp')}(-{a})))"
        if op == "HardSigmoid":
            inner = f"({k(attrs.get('alpha', 0.2))} * {a} + {k(attrs.get('beta', 0.5))})"
            return f"_min(_max({inner}, {k(0)}), {k(1)})"
        if op == "HardSwish":
            return f"({a} * _min(_max({a} * {k(1 / 6)} + {k(0.5)}, {k(0)}), {k(1)}))"
        if op == "Clip":
            r = a
            lo, hi = attrs.get("min"), attrs.get("max")
            if lo is not None and not (isinstance(lo, float) and math.isinf(lo) and lo < 0):
                r = f"_max({r}, {k(lo)})"
            if hi is not None and not (isinstance(hi, float) and math.isinf(hi) and hi > 0):
                r = f"_min({r}, {k(hi)})"
            return r
        if op == "Gelu":
            if attrs.get("approximate", "none") == "tanh":
                return (f"({k(0.5)} * {a} * ({k(1)} + {self.f('tanh')}({k(math.sqrt(2 / math.pi))} * "
                        f"({a} + {k(0.044715)} * {a} * {a} * {a}))))")
            return f"({k(0.5)} * {a} * ({k(1)} + {self.f('erf')}({a} * {k(1 / math.sqrt(2))})))"
        if op == "Elu":
            return f"({a} if {a} > {k(0)} else {k(attrs.get('alpha', 1.0))} * {self.f('expm1')}({a}))"
        if op == "Softplus":
            return f"(_max({a}, {k(0)}) + {self.f('log1p')}({self.f('exp')}(-abs({a}))))"
        return None


#: math functions with a vectorisable float32 form in :mod:`ge_sdk.vmath`
_VMATH = {"exp": "exp32", "log": "log32", "log1p": "log1p32", "expm1": "expm1_32", "tanh": "tanh32",
          "erf": "erf32"}

_PRELUDE = '''
import math
import numba


@numba.njit(inline="always")
def _max(a, b):
    # NumPy's maximum: a NaN in either operand is the result
    return a if (a >= b or a != a) else b


@numba.njit(inline="always")
def _min(a, b):
    return a if (a <= b or a != a) else b


@numba.njit(inline="always")
def _pow(a, b):
    return a * a if b == 2 else a ** b
'''


#: what a generated loop is made of (the prelude, the loop nest, the scalar forms above)
_LOOP_VOCAB = gensrc.Vocabulary(
    names=frozenset({"math", "numba", "np", "_max", "_min", "_pow", "a", "b", "kernel", "abs", "range",
                     "d0", "d1", "d2", "out", "os0", "os1", "i", "j", "k", "ob", "o", *_VMATH.values()}),
    patterns=(r"x[0-9]+", r"xs[0-9]+_[01]", r"b[0-9]+", r"v[0-9]+", r"r[0-9]+", r"t[0-9]+", r"K[0-9]+"),
    attributes=frozenset({"njit", "sqrt", "exp", "log", "tanh", "sin", "cos", "erf", "expm1", "log1p"}),
    keywords=frozenset({"inline"}),
    strings=frozenset({"always"}),
    modules=frozenset({"math", "numba", "numpy"}))


# ------------------------------------------------------------------------------------------------
# layout: broadcast strides over the output, coalesced to <= 3 dims
# ------------------------------------------------------------------------------------------------
def _layout(in_shapes: Sequence[tuple], out_shape: tuple) -> tuple[list[int], list[list[int]]] | None:
    """Dims (outer to inner) and per-array element strides (output first) of the iteration
    space, padded to three dims; None when it does not coalesce to three."""
    rank = len(out_shape)
    arrays: list[list[int]] = []
    for sh in [out_shape, *in_shapes]:
        if len(sh) > rank:
            return None
        full = (1,) * (rank - len(sh)) + tuple(sh)
        strides, acc = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            if full[d] == out_shape[d]:
                strides[d] = acc if out_shape[d] != 1 else 0
            elif full[d] == 1:
                strides[d] = 0
            else:
                return None
            acc *= full[d]
        arrays.append(strides)
    dims: list[int] = []
    groups: list[list[int]] = [[] for _ in arrays]
    for d in range(rank):
        if out_shape[d] == 1:
            continue
        if dims and all(g[-1] == s[d] * out_shape[d] for g, s in zip(groups, arrays)):
            dims[-1] *= out_shape[d]
            for g, s in zip(groups, arrays):
                g[-1] = s[d]
            continue
        dims.append(out_shape[d])
        for g, s in zip(groups, arrays):
            g.append(s[d])
    if len(dims) > 3:
        return None
    pad = 3 - len(dims)
    dims = [1] * pad + dims
    padded = [[0] * pad + g for g in groups]
    if padded[0][2] != 1 and dims[2] != 1:
        return None
    if any(s[2] not in (0, 1) for s in padded[1:]):
        return None
    return dims, padded


# ------------------------------------------------------------------------------------------------
def loop_kernel(steps: list[tuple[str, list[str], dict[str, Any]]], names: list[str], in_dtypes: Sequence[Any],
                in_shapes: Sequence[tuple | None], out_dtype: Any, out_shape: tuple | None,
                workers: int | None = None) -> Callable[..., np.ndarray] | None:
    """A callable ``fn(*operands, out=None)`` running ``steps`` as one compiled loop, or None when
    this program/layout has no loop form (the caller then generates NumPy code). ``workers``:
    the parts a run more than one thread wide splits it into (None: by its size, one part per
    :data:`PART_ELEMENTS`, at most 8); each element's result is the same however it is split."""
    if not available() or out_shape is None or any(sh is None for sh in in_shapes):
        return None
    dt = np.dtype(out_dtype)
    if dt.name not in DTYPES or any(np.dtype(d) != dt for d in in_dtypes):
        return None
    lay = _layout([tuple(s) for s in in_shapes if s is not None], tuple(out_shape))
    if lay is None:
        return None
    dims, strides = lay
    inner = tuple(s[2] for s in strides[1:])
    compiled = _compile(steps, names, dt, inner)
    if compiled is None:
        return None
    # An operand laid out exactly like the output may be the output buffer itself (an in-place
    # epilogue, a fused op the memory plan runs in place). Two array arguments that may alias
    # make LLVM guard its vector loop with a run-time overlap check, which an exact alias fails:
    # that loop then runs scalar, 10-25x slower. Its variant reads that operand through the
    # output (one array, same index), which vectorises; the wrapper picks it when they alias.
    # The variant compiles on the first call that aliases (once per program in the process).
    alias_ok = [i for i, s in enumerate(strides[1:]) if s == strides[0]]

    def variant(i: int):
        v = _compile(steps, names, dt, inner, alias=i)
        return compiled if v is None else v

    return _wrap(compiled, dims, strides, tuple(out_shape), dt, workers, source=compiled.ge_source,
                 alias_ok=alias_ok, variant=variant)


def _compile(steps, names: list[str], dt: np.dtype, inner: tuple[int, ...], alias: int = -1):
    """The compiled loop of ``steps``; ``alias`` >= 0: the variant for operand ``alias`` being
    the output buffer (read through ``out``; the operand argument is passed but not read)."""
    key = (repr(steps), tuple(names), dt.name, inner, alias)
    with _lock:
        if key in _compiled:
            fn = _compiled[key]
            if fn is not None:
                _stats["reused"] += 1
            return fn
    em = _Emitter(dt)
    body: list[str] = []
    env = dict(zip(names, (f"v{i}" for i in range(len(names)))))
    for j, (op, refs, attrs) in enumerate(steps):
        expr = em(op, [env[r] for r in refs], attrs)
        if expr is None:
            return None
        body.append(f"t{j} = {expr}")
        env[f"t{j}"] = f"t{j}"
    if em.scalar_calls:
        # libm per element (sin, cos; every float64 transcendental) keeps LLVM from vectorising:
        # NumPy's SIMD ufuncs in cache-sized blocks are faster
        with _lock:
            _compiled[key] = None
        return None
    params = ["d0", "d1", "d2", "out", "os0", "os1"]
    for i in range(len(names)):
        params += [f"x{i}", f"xs{i}_0", f"xs{i}_1"]
    lines = [f"def kernel({', '.join(params)}):",
             "    for i in range(d0):",
             "        for j in range(d1):",
             "            ob = i * os0 + j * os1",
             # rows as slices: indexing them by the loop counter needs no wraparound test, so
             # LLVM vectorises the inner loop
             "            o = out[ob:ob + d2]"]
    for i in range(len(names)):
        lines.append(f"            b{i} = i * xs{i}_0 + j * xs{i}_1")
        if i == alias:
            lines.append(f"            r{i} = o")
        elif inner[i] == 0:
            lines.append(f"            v{i} = x{i}[b{i}]")
        else:
            lines.append(f"            r{i} = x{i}[b{i}:b{i} + d2]")
    lines.append("            for k in range(d2):")
    for i in range(len(names)):
        if inner[i] == 1:
            lines.append(f"                v{i} = r{i}[k]")
    lines += [f"                {s}" for s in body]
    lines.append(f"                o[k] = t{len(steps) - 1}")
    src = _PRELUDE + "import numpy as np\n\n\n" + "\n".join(lines) + "\n"
    code = gensrc.compile_checked(src, "<ge_fusion loop>", _LOOP_VOCAB)
    import time

    numba = _numba
    nt = numba.types
    i64, scalar = nt.int64, getattr(nt, dt.name)
    # operands are read-only in the signature, so mmap'ed weights of a loaded .om pass too
    rw, ro = nt.Array(scalar, 1, "C"), nt.Array(scalar, 1, "C", readonly=True)
    sig = nt.void(i64, i64, i64, rw, i64, i64, *([ro, i64, i64] * len(names)))
    t0 = time.perf_counter()
    from ge_sdk import vmath

    ns: dict[str, Any] = dict(vmath.FUNCTIONS)
    ns.update(em.consts)  # typed constants: numba freezes globals into the compiled loop
    try:
        exec(code, ns)  # noqa: S102 - checked generated code (gensrc)
        fn = numba.njit(sig, nogil=True, error_model="numpy")(ns["kernel"])
    except Exception:  # noqa: BLE001 - a loop numba refuses: the caller generates NumPy code
        return None
    fn.ge_source = src
    with _lock:
        _stats["compiled"] += 1
        _stats["inplace_variants"] += alias >= 0
        _stats["compile_s"] += time.perf_counter() - t0
        _compiled[key] = fn
    return fn


def _wrap(compiled, dims: list[int], strides: list[list[int]], out_shape: tuple, dt: np.dtype, workers: int | None,
          source: str, alias_ok: Sequence[int] = (),
          variant: Callable[[int], Any] | None = None) -> Callable[..., np.ndarray]:
    d0, d1, d2 = dims
    os0, os1 = strides[0][0], strides[0][1]
    xs = [(s[0], s[1]) for s in strides[1:]]
    n_in = len(xs)
    size = math.prod(out_shape)
    if workers is None:
        workers = int(min(8, size // PART_ELEMENTS))
    # parts for the pool (ge_sdk.parallel): split the outermost dim that has enough rows; a flat
    # loop (d0 == d1 == 1) is cut into contiguous pieces of the inner dim
    parts: list[tuple[int, int, int, int, list[int]]] = []  # (d0, d1, d2, out offset, input offsets)
    if workers > 1:
        if d0 >= workers or d1 >= workers:
            ax = 0 if d0 >= workers else 1
            n = d0 if ax == 0 else d1
            per = -(-n // workers)
            for lo in range(0, n, per):
                cnt = min(per, n - lo)
                so = (os0 if ax == 0 else os1) * lo
                offs = [(x[0] if ax == 0 else x[1]) * lo for x in xs]
                parts.append((cnt if ax == 0 else d0, d1 if ax == 0 else cnt, d2, so, offs))
        elif d0 == 1 and d1 == 1:
            per = -(-d2 // workers)
            for lo in range(0, d2, per):
                cnt = min(per, d2 - lo)
                parts.append((1, 1, cnt, lo, [lo if s[2] == 1 else 0 for s in strides[1:]]))
    casts = dt

    def flat(a):
        a = a if isinstance(a, np.ndarray) and a.dtype == casts else np.asarray(a, dtype=casts)
        return a.reshape(-1) if a.flags.c_contiguous and a.flags.aligned else np.ascontiguousarray(a).reshape(-1)

    variants: dict[int, Any] = {}

    def run_part(fn, p, o, ins):
        p0, p1, p2, so, offs = p
        args: list[Any] = []
        for (s0, s1), x, off in zip(xs, ins, offs):
            args += [x[off:] if off else x, s0, s1]
        fn(p0, p1, p2, o[so:] if so else o, os0, os1, *args)

    def kernel(*operands, out=None):
        if len(operands) != n_in:
            raise TypeError(f"fused loop takes {n_in} operands, got {len(operands)}")
        ins = [flat(a) for a in operands]
        target = out if (out is not None and out.flags.c_contiguous and out.flags.aligned and out.flags.writeable
                         and out.dtype == dt and out.shape == out_shape) else np.empty(out_shape, dt)
        o = target.reshape(-1)
        fn = compiled
        if alias_ok and variant is not None:
            base = o.ctypes.data
            for i in alias_ok:
                if ins[i].ctypes.data == base:  # laid out like the output: the same elements
                    fn = variants.get(i)
                    if fn is None:
                        fn = variants[i] = variant(i)
                    break
        if len(parts) < 2 or parallel.threads() < 2:
            args: list[Any] = []
            for (s0, s1), x in zip(xs, ins):
                args += [x, s0, s1]
            fn(d0, d1, d2, o, os0, os1, *args)
        else:
            parallel.parallel_for(len(parts), lambda i: run_part(fn, parts[i], o, ins))
        if out is not None and target is not out:
            np.copyto(out, target.reshape(out.shape) if out.shape != out_shape else target)
            return out
        return target

    kernel.mode = "loop"  # type: ignore[attr-defined]
    kernel.source = source  # type: ignore[attr-defined]
    return kernel


# ------------------------------------------------------------------------------------------------
# row kernels: LayerNorm, RMSNorm and Softmax over the last axis, one pass per row in registers
# ------------------------------------------------------------------------------------------------
# Each kind's row is written once (``*_row(r, o, ...)``, inlined) and called by two entries: one
# reading ``x`` and writing ``out``, one in place that passes the same row twice. Two array
# arguments that alias exactly fail LLVM's run-time overlap check and the loop runs scalar; one
# array passed twice is visibly the same pointer, and the loop vectorises.
_ROW_SRC = '''
def ln_row(r, o, gamma, beta, eps, inv):
    s = ZERO
    for k in range(r.shape[0]):
        s += r[k]
    m = s * inv
    v = ZERO
    for k in range(r.shape[0]):
        t = r[k] - m
        v += t * t
    rs = ONE / math.sqrt(v * inv + eps)
    for k in range(r.shape[0]):
        o[k] = (r[k] - m) * rs * gamma[k] + beta[k]


def rms_row(r, o, gamma, eps, inv):
    # the order of the exported graph: x * (1 / sqrt(mean(x^2) + eps)), then * gamma
    s = ZERO
    for k in range(r.shape[0]):
        s += r[k] * r[k]
    rs = ONE / math.sqrt(s * inv + eps)
    for k in range(r.shape[0]):
        o[k] = r[k] * rs * gamma[k]


def sm_row(r, o, mi):
    # no fast-math here: it would fold exp's rounding trick away; the row sum has it
    for k in range(r.shape[0]):
        o[k] = EXP(r[k] - mi)
    inv = ONE / ROWSUM(o)
    for k in range(r.shape[0]):
        o[k] *= inv


def layernorm(x, gamma, beta, eps, out):
    inv = ONE / x.shape[1]
    for i in range(x.shape[0]):
        LN_ROW(x[i], out[i], gamma, beta, eps, inv)


def layernorm_ip(x, gamma, beta, eps):
    inv = ONE / x.shape[1]
    for i in range(x.shape[0]):
        r = x[i]
        LN_ROW(r, r, gamma, beta, eps, inv)


def rmsnorm(x, gamma, eps, out):
    inv = ONE / x.shape[1]
    for i in range(x.shape[0]):
        RMS_ROW(x[i], out[i], gamma, eps, inv)


def rmsnorm_ip(x, gamma, eps):
    inv = ONE / x.shape[1]
    for i in range(x.shape[0]):
        r = x[i]
        RMS_ROW(r, r, gamma, eps, inv)


def softmax(x, m, out):
    for i in range(x.shape[0]):
        SM_ROW(x[i], out[i], m[i])


def softmax_ip(x, m):
    for i in range(x.shape[0]):
        r = x[i]
        SM_ROW(r, r, m[i])


def rowsum(r):
    s = ZERO
    for k in range(r.shape[0]):
        s += r[k]
    return s
'''

#: the row kernels' source is fixed text; it is checked like generated code all the same
_ROW_VOCAB = gensrc.Vocabulary(
    names=frozenset({"ln_row", "rms_row", "sm_row", "layernorm", "layernorm_ip", "rmsnorm", "rmsnorm_ip", "softmax",
                     "softmax_ip", "rowsum", "LN_ROW", "RMS_ROW", "SM_ROW", "EXP", "ROWSUM", "ONE", "ZERO", "math",
                     "range", "x", "r", "o", "gamma", "beta", "eps", "inv", "out", "m", "mi", "i", "k", "s", "v",
                     "t", "rs"}),
    attributes=frozenset({"shape", "sqrt"}))

#: the row kernels' parameters after x (and before out)
ROW_KINDS = {"layernorm": "gamma, beta, eps", "rmsnorm": "gamma, eps", "softmax": ""}

_rows: dict[tuple[str, str], Any] = {}


def _pick(apart, inplace):
    """One entry ``fn(x, *params, out)``: the in-place loop when ``out`` is ``x``."""
    def fn(x, *args):
        *params, out = args
        if out.ctypes.data == x.ctypes.data:
            inplace(out, *params)
        else:
            apart(x, *params, out)
    return fn


def row_kernel(kind: str, dtype: Any) -> Any:
    """The compiled ``fn(x2d, *params, out2d)`` of ``kind`` (:data:`ROW_KINDS`: layernorm takes
    ``gamma, beta, eps``, rmsnorm ``gamma, eps``, softmax nothing; ``out`` may be ``x``) for
    ``dtype`` (float32/float64), or None without numba. Sums are reassociated (vectorised)."""
    if kind not in ROW_KINDS:
        raise ValueError(f"no row kernel {kind!r}")
    dt = np.dtype(dtype)
    if not available() or dt.name not in DTYPES:
        return None
    key = (kind, dt.name)
    with _lock:
        if key in _rows:
            return _rows[key]
    import time

    from ge_sdk import vmath

    numba = _numba
    nt = numba.types
    scalar = getattr(nt, dt.name)
    rw2, ro2 = nt.Array(scalar, 2, "C"), nt.Array(scalar, 2, "C", readonly=True)
    ro1 = nt.Array(scalar, 1, "C", readonly=True)
    ns: dict[str, Any] = {"math": math, "ONE": dt.type(1), "ZERO": dt.type(0),
                          "EXP": vmath.expneg32 if dt == np.float32 else numba.njit(inline="always")(lambda v: math.exp(v))}
    t0 = time.perf_counter()
    exec(gensrc.compile_checked(_ROW_SRC, "<ge_fusion rows>", _ROW_VOCAB), ns)  # noqa: S102 - our own code, checked
    flags = {"reassoc", "nsz"}
    for row, name in (("LN_ROW", "ln_row"), ("RMS_ROW", "rms_row"), ("SM_ROW", "sm_row")):
        ns[row] = numba.njit(inline="always")(ns[name])  # takes the flags of the entry it is inlined into
    ns["ROWSUM"] = numba.njit(scalar(nt.Array(scalar, 1, "C")), fastmath=flags)(ns["rowsum"])
    params = {"layernorm": (ro1, ro1, scalar), "rmsnorm": (ro1, scalar), "softmax": (ro1,)}[kind]
    fast = flags if kind != "softmax" else False
    apart = numba.njit(nt.void(ro2, *params, rw2), nogil=True, error_model="numpy", fastmath=fast)(ns[kind])
    inplace = numba.njit(nt.void(rw2, *params), nogil=True, error_model="numpy", fastmath=fast)(ns[kind + "_ip"])
    fn = _pick(apart, inplace)
    if kind == "softmax":
        def fn(x, out, _f=fn):  # type: ignore[misc]
            # NumPy's SIMD row max (numba's max reduction does not vectorise); a NaN makes the row NaN
            _f(x, np.max(x, axis=1), out)
    with _lock:
        _stats["compiled"] += 1
        _stats["compile_s"] += time.perf_counter() - t0
        _rows[key] = fn
    return fn


def by_rows(fn: Any, x2: np.ndarray, y2: np.ndarray, *params: Any) -> None:
    """``fn(x2, *params, y2)`` (a :func:`row_kernel`) over row blocks on GE's pool when the run is
    wider than one thread (blocks of at least 256K elements; the rows' results do not depend on
    the split), else in one call."""
    parts = parallel.chunks(x2.shape[0], x2.shape[1], min_cost=1 << 18, most=8) if parallel.threads() > 1 else []
    if len(parts) < 2:
        fn(x2, *params, y2)
        return
    parallel.parallel_for(len(parts), lambda i: fn(x2[parts[i][0]:parts[i][1]], *params, y2[parts[i][0]:parts[i][1]]))
