"""Compiled loop kernels for large fused elementwise groups (native C).

A fused group over a large tensor is bound by how often it walks memory and by how well each
step vectorises. NumPy walks memory once per op (eight passes for an eight-op chain); a
generated loop computes the whole program per element in registers, reads each input once and
writes the output once, and LLVM vectorises it. This module writes such a loop from a fused
program (:mod:`ge_fusion.codegen`) in C and builds it with :mod:`ge_native.native` (compiled once
per machine, loaded from the user's kernel cache by later processes).

Shapes are not part of the compiled code, so one compiled loop serves every layer whose group
has the same program, dtypes and broadcast pattern (BN+ReLU in every block of a ResNet compiles
once). The iteration space is the output's, with every operand's broadcast strides coalesced
into at most three dimensions; the innermost is contiguous in the output and either contiguous
or broadcast (stride 0, loaded once per row) in each operand.

The C is made of tokens this module made (operand names, numeric literals, the prelude's math
functions) and is checked token by token before it is compiled (:func:`ge_native.native.check_c`).
Set ``GE_FUSION_JIT=0`` to never use this path (generated NumPy code runs instead); no C
compiler (or ``GE_NATIVE=0``) has the same effect.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.kernel import with_caps
from ge_native import native, parallel, sgemm
from ge_native.jit import enabled as jit_enabled

#: dtypes the loops are generated for (every operand and the output share one of them)
DTYPES = ("float32", "float64")

#: A loop over this many output elements or more is split over the run's threads (OpenMP, in
#: pieces claimed one at a time) when the run is more than one thread wide.
PART_ELEMENTS = 1 << 16

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}
_stats = {"compiled": 0, "reused": 0, "compile_s": 0.0, "inplace_variants": 0}


def available() -> bool:
    """True when native kernels can be built (:func:`ge_native.native.available`) and
    ``GE_FUSION_JIT`` does not turn the loops off."""
    return jit_enabled("GE_FUSION_JIT") and native.available()


def stats() -> dict[str, float]:
    """Loop programs built in this process (compiled or loaded from the kernel cache), reuses of
    a built loop, seconds spent building, and how many in-place variants (an operand read
    through the output) the built loops hold."""
    return dict(_stats)


# ------------------------------------------------------------------------------------------------
# scalar forms of the program's ops: C expressions over generator-made operand names; every number
# an op needs (its attributes included) is a numeric literal this module wrote (hex float: exact)
# ------------------------------------------------------------------------------------------------
def _chain(fn: str, xs: Sequence[str]) -> str:
    r = xs[0]
    for x in xs[1:]:
        r = f"{fn}({r}, {x})"
    return r


class _Emitter:
    """Writes one step's scalar C expression for dtype float32 or float64."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.f32 = dtype == np.float32
        #: set when a step needs a libm call that keeps the loop from vectorising
        self.scalar_calls: list[str] = []
        self.max, self.min = ("ge_max32", "ge_min32") if self.f32 else ("ge_max64", "ge_min64")

    def f(self, name: str) -> str:
        """The vectorisable float32 form of a math function (the native prelude's); libm's
        scalar one otherwise (noted: NumPy's SIMD ufuncs beat such a loop)."""
        if self.f32 and name in _VMATH:
            return _VMATH[name]
        self.scalar_calls.append(name)
        return name

    def k(self, value: float) -> str:
        """A numeric literal of the loop's dtype (NaN and infinities as the math.h names)."""
        v = float(self.dtype.type(float(value)))
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = v.hex() + ("f" if self.f32 else "")
        return f"({text})" if text.startswith("-") else text

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
            return f"({xs[1]} == {k(2)} ? {xs[0]} * {xs[0]} : {'powf' if self.f32 else 'pow'}({xs[0]}, {xs[1]}))"
        if op == "Sum":
            return "(" + " + ".join(xs) + ")"
        if op == "Mean":
            return f"(({' + '.join(xs)}) * {k(1.0 / len(xs))})"
        if op == "Max":
            return _chain(self.max, xs)
        if op == "Min":
            return _chain(self.min, xs)
        if op == "Neg":
            return f"(-{a})"
        if op == "Abs":
            return f"{'fabsf' if self.f32 else 'fabs'}({a})"
        if op == "Sqrt":
            return f"{'sqrtf' if self.f32 else 'sqrt'}({a})"
        if op in ("Exp", "Log", "Tanh", "Sin", "Cos", "Erf"):
            return f"{self.f(op.lower())}({a})"
        if op == "Reciprocal":
            return f"({k(1)} / {a})"
        if op == "Identity":
            return a
        if op == "Relu":
            return f"{self.max}({a}, {k(0)})"
        if op == "LeakyRelu":
            return f"({a} >= {k(0)} ? {a} : {k(attrs.get('alpha', 0.01))} * {a})"
        if op == "Sigmoid":
            return f"({k(1)} / ({k(1)} + {self.f('exp')}(-{a})))"
        if op == "Silu":
            return f"({a} / ({k(1)} + {self.f('exp')}(-{a})))"
        if op == "HardSigmoid":
            inner = f"({k(attrs.get('alpha', 0.2))} * {a} + {k(attrs.get('beta', 0.5))})"
            return f"{self.min}({self.max}({inner}, {k(0)}), {k(1)})"
        if op == "HardSwish":
            return f"({a} * {self.min}({self.max}({a} * {k(1 / 6)} + {k(0.5)}, {k(0)}), {k(1)}))"
        if op == "Clip":
            r = a
            lo, hi = attrs.get("min"), attrs.get("max")
            if lo is not None and not (isinstance(lo, float) and math.isinf(lo) and lo < 0):
                r = f"{self.max}({r}, {k(lo)})"
            if hi is not None and not (isinstance(hi, float) and math.isinf(hi) and hi > 0):
                r = f"{self.min}({r}, {k(hi)})"
            return r
        if op == "Gelu":
            if attrs.get("approximate", "none") == "tanh":
                return (f"({k(0.5)} * {a} * ({k(1)} + {self.f('tanh')}({k(math.sqrt(2 / math.pi))} * "
                        f"({a} + {k(0.044715)} * {a} * {a} * {a}))))")
            return f"({k(0.5)} * {a} * ({k(1)} + {self.f('erf')}({a} * {k(1 / math.sqrt(2))})))"
        if op == "Elu":
            return f"({a} > {k(0)} ? {a} : {k(attrs.get('alpha', 1.0))} * {self.f('expm1')}({a}))"
        if op == "Softplus":
            return f"({self.max}({a}, {k(0)}) + {self.f('log1p')}({self.f('exp')}(-{'fabsf' if self.f32 else 'fabs'}({a}))))"
        return None


#: math functions with a vectorisable float32 form in the native prelude
_VMATH = {"exp": "exp32", "log": "log32", "log1p": "log1p32", "expm1": "expm1_32", "tanh": "tanh32",
          "erf": "erf32"}

#: the names a generated loop is made of (besides the prelude's and C's own)
_LOOP_NAMES = frozenset({"kernel", "piece", "d0", "d1", "d2", "out", "os0", "os1", "i", "j", "k", "o", "T", "threads",
                         "kb", "ke", "per", "np_", "items", "grab", "c", "end", "t", "rr", "p", "J", "jb", "vc",
                         "slot", "task_piece"})
_LOOP_PATTERNS = (r"x[0-9]+", r"xs[0-9]+_[01]", r"v[0-9]+", r"r[0-9]+", r"t[0-9]+", r"piece_a[0-9]+",
                  r"task_piece_a[0-9]+")
#: the largest extent or stride a loop accepts (spans are checked for overflow besides)
_BIG = (1 << 62) - 1


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
    this program/layout has no loop form (the caller then generates NumPy code). A loop of
    :data:`PART_ELEMENTS` elements or more in a run wider than one thread is split over that
    many OpenMP threads (at most ``workers``); each element's result is the same however it is
    split."""
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
    # An operand laid out exactly like the output may be the output buffer itself (an in-place
    # epilogue, a fused op the memory plan runs in place). Two pointers that may alias make the
    # compiler guard its vector loop with a run-time overlap check, which an exact alias fails:
    # that loop then runs scalar, 10-25x slower. A variant reads that operand through the output
    # (one pointer, same index), which vectorises; the wrapper picks it when they alias. The
    # variants are built with the loop (one module, one compile).
    alias_ok = tuple(i for i, s in enumerate(strides[1:]) if s == strides[0])
    built = _compile(steps, names, dt, inner, alias_ok)
    if built is None:
        return None
    return _wrap(built, dims, strides, tuple(out_shape), dt, workers)


#: Values a symbolic dim takes to choose a dynamic loop's layout class (distinct, none 1).
_REPRESENTATIVE = (7, 11, 13, 17, 19, 23, 29, 31)
#: Concrete shapes a dynamic loop keeps its call setup for.
_DYNAMIC_KEEP = 16


def loop_kernel_dynamic(steps, names: list[str], in_dtypes: Sequence[Any], in_shapes: Sequence[tuple],
                        out_dtype: Any, out_shape: tuple, workers: int | None = None,
                        fallback: Callable[..., np.ndarray] | None = None) -> Callable[..., np.ndarray] | None:
    """:func:`loop_kernel` for shapes with symbolic dims (names or expressions, no unknowns): the
    loop is compiled once for the layout class the shapes have when every symbol is large (which
    operands are full, broadcast along rows, or scalars); a call computes its concrete layout and
    runs the loop when it has that class, else ``fallback`` (the generated NumPy code)."""
    from ge_core.ir import symbolic

    if not available() or any(d is None for sh in [out_shape, *in_shapes] for d in sh):
        return None
    syms = sorted({x for sh in [out_shape, *in_shapes] for d in sh for x in symbolic.symbols_of(d)})
    if not syms or len(syms) > len(_REPRESENTATIVE):
        return None
    rep = dict(zip(syms, _REPRESENTATIVE))
    try:
        rep_in = [tuple(symbolic.evaluate(d, rep) for d in sh) for sh in in_shapes]
        rep_out = tuple(symbolic.evaluate(d, rep) for d in out_shape)
    except (KeyError, TypeError):
        return None
    dt = np.dtype(out_dtype)
    if dt.name not in DTYPES or any(np.dtype(d) != dt for d in in_dtypes):
        return None
    lay = _layout(rep_in, rep_out)
    if lay is None:
        return None
    inner = tuple(st[2] for st in lay[1][1:])
    alias_ok = tuple(i for i, st in enumerate(lay[1][1:]) if st == lay[1][0])
    built = _compile(steps, names, dt, inner, alias_ok)
    if built is None:
        return None
    calls: dict[tuple, Callable[..., np.ndarray] | None] = {}
    ranks = [len(sh) for sh in in_shapes]
    out_rank = len(out_shape)

    def kernel(*operands, out=None):
        shapes = tuple(np.shape(x) for x in operands)
        fn = calls.get(shapes)
        if fn is None and shapes not in calls:
            fn = None
            try:
                full = np.broadcast_shapes(*shapes) if shapes else ()
            except ValueError:
                full = None
            if full is not None and len(full) == out_rank and [len(x) for x in shapes] == ranks:
                got = _layout(list(shapes), tuple(full))
                if got is not None and tuple(st[2] for st in got[1][1:]) == inner \
                        and tuple(i for i, st in enumerate(got[1][1:]) if st == got[1][0]) == alias_ok:
                    fn = _wrap(built, got[0], got[1], tuple(full), dt, workers)
            if len(calls) >= _DYNAMIC_KEEP:
                calls.pop(next(iter(calls)))
            calls[shapes] = fn
        if fn is None:
            if fallback is None:
                raise ValueError(f"fused loop: operand shapes {list(shapes)} do not have the layout it was built for")
            return fallback(*operands, out=out)
        return fn(*operands, out=out)

    with_caps(kernel, mode="loop")
    kernel.source = built.ge_source  # type: ignore[attr-defined]
    kernel.library = built.path  # type: ignore[attr-defined]
    return kernel


def _compile(steps, names: list[str], dt: np.dtype, inner: tuple[int, ...], aliases: tuple[int, ...] = ()):
    """The built loop of ``steps`` (a :class:`_Built`), or None when there is no loop form. Its
    one entry ``kernel(d0, d1, d2, out, os0, os1, x0, xs0_0, xs0_1, ..., threads)`` checks its
    arrays, runs the variant that reads operand ``i`` through ``out`` when that operand *is* the
    output (for each ``i`` in ``aliases``), and splits the work over ``threads`` threads of the
    native pool when it is large (claimed piece by piece; every element's result is the same
    however it is split)."""
    key = (repr(steps), tuple(names), dt.name, inner, aliases)
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
        body.append(f"T t{j} = {expr};")
        env[f"t{j}"] = f"t{j}"
    if em.scalar_calls:
        # libm per element (sin, cos; every float64 transcendental) keeps the loop from
        # vectorising: NumPy's SIMD ufuncs in cache-sized blocks are faster
        with _lock:
            _compiled[key] = None
        return None
    n = len(names)
    ctype, npy = ("float", "NPY_FLOAT") if dt == np.float32 else ("double", "NPY_DOUBLE")
    ptrs = "".join(f", const T *x{i}, int64_t xs{i}_0, int64_t xs{i}_1" for i in range(n))
    args = "".join(f", x{i}, xs{i}_0, xs{i}_1" for i in range(n))

    def piece(fname: str, alias: int) -> list[str]:
        """Elements [kb, ke) of output row (i, j); operand ``alias`` read through the output."""
        lines = [f"static inline void {fname}(int64_t i, int64_t j, int64_t kb, int64_t ke, T *out, "
                 f"int64_t os0, int64_t os1{ptrs}) {{",
                 "    T *o = out + i * os0 + j * os1;"]
        for i in range(n):
            if i == alias:
                lines.append(f"    const T *r{i} = o;")
            elif inner[i] == 0:
                lines.append(f"    const T v{i} = x{i}[i * xs{i}_0 + j * xs{i}_1];")
            else:
                lines.append(f"    const T *r{i} = x{i} + i * xs{i}_0 + j * xs{i}_1;")
        lines.append("    for (int64_t k = kb; k < ke; k++) {")
        for i in range(n):
            if inner[i] == 1 or i == alias:
                lines.append(f"        const T v{i} = r{i}[k];")
        lines += [f"        {s}" for s in body]
        lines += [f"        o[k] = t{len(steps) - 1};", "    }", "}", ""]
        return lines

    fields = "".join(f" const T *x{i}; int64_t xs{i}_0, xs{i}_1;" for i in range(n))
    jargs = "".join(f", jb->x{i}, jb->xs{i}_0, jb->xs{i}_1" for i in range(n))

    def task(fname: str) -> list[str]:
        """One claim of the split loop over ``fname``: ``grab`` pieces of at most ``per`` elements."""
        return [f"static void task_{fname}(void *vc, int64_t c, int slot) {{",
                "    J *jb = (J *)vc;",
                "    (void)slot;",
                "    int64_t end = (c + 1) * jb->grab < jb->items ? (c + 1) * jb->grab : jb->items;",
                "    for (int64_t t = c * jb->grab; t < end; t++) {",
                "        int64_t rr = t / jb->np_, p = t % jb->np_;",
                "        int64_t kb = p * jb->per, ke = kb + jb->per < jb->d2 ? kb + jb->per : jb->d2;",
                f"        {fname}(rr / jb->d1, rr % jb->d1, kb, ke, jb->out, jb->os0, jb->os1{jargs});",
                "    }",
                "}",
                ""]

    def run(fname: str, ind: str) -> list[str]:
        """The loop nest over ``fname``: in one piece per row, or split over the native pool."""
        return [f"{ind}if (threads > 1 && d0 * d1 * d2 >= {PART_ELEMENTS}) {{",
                # pieces of at most PART/4 elements; a claim is at least PART/4 elements of rows
                f"{ind}    J jb;",
                f"{ind}    jb.d0 = d0; jb.d1 = d1; jb.d2 = d2; jb.out = out; jb.os0 = os0; jb.os1 = os1;",
                *(f"{ind}    jb.x{i} = x{i}; jb.xs{i}_0 = xs{i}_0; jb.xs{i}_1 = xs{i}_1;" for i in range(n)),
                f"{ind}    jb.per = d2 < {PART_ELEMENTS // 4} ? d2 : {PART_ELEMENTS // 4};",
                f"{ind}    jb.np_ = (d2 + jb.per - 1) / jb.per;",
                f"{ind}    jb.items = d0 * d1 * jb.np_;",
                f"{ind}    jb.grab = jb.per >= {PART_ELEMENTS // 4} ? 1 : ({PART_ELEMENTS // 4} + jb.per - 1) / jb.per;",
                f"{ind}    ge_parallel(task_{fname}, &jb, (jb.items + jb.grab - 1) / jb.grab, threads);",
                f"{ind}}} else {{",
                f"{ind}    for (int64_t i = 0; i < d0; i++)",
                f"{ind}        for (int64_t j = 0; j < d1; j++) {fname}(i, j, 0, d2, out, os0, os1{args});",
                f"{ind}}}"]

    ints = ["d0", "d1", "d2", "os0", "os1", "threads"] + [f"xs{i}_{a}" for i in range(n) for a in (0, 1)]
    lines = [f"typedef {ctype} T;",
             f"typedef struct {{ int64_t d0, d1, d2, os0, os1, per, np_, items, grab; T *out;{fields} }} J;", ""]
    lines += piece("piece", -1)
    lines += task("piece")
    for a in aliases:
        lines += piece(f"piece_a{a}", a)
        lines += task(f"piece_a{a}")
    lines += ["static PyObject *kernel(PyObject *self, PyObject *const *args, Py_ssize_t n) {",
              f"    int64_t {', '.join(ints)};",
              f"    if (ge_nargs(n, {7 + 3 * n})) return NULL;",
              f"    if (ge_int(args, 0, 0, {_BIG}, &d0) || ge_int(args, 1, 0, {_BIG}, &d1) || "
              f"ge_int(args, 2, 0, {_BIG}, &d2)) return NULL;",
              f"    if (ge_int(args, 4, 0, {_BIG}, &os0) || ge_int(args, 5, 0, {_BIG}, &os1) || "
              f"ge_int(args, {6 + 3 * n}, 1, 4096, &threads)) return NULL;"]
    for i in range(n):
        lines.append(f"    if (ge_int(args, {7 + 3 * i}, 0, {_BIG}, &xs{i}_0) || "
                     f"ge_int(args, {8 + 3 * i}, 0, {_BIG}, &xs{i}_1)) return NULL;")
    lines.append(f"    T *out = (T *)ge_arr(args, 3, {npy}, 1, ge_span(d0, d1, d2, os0, os1, 1));")
    lines.append("    if (!out) return NULL;")
    for i in range(n):
        lines.append(f"    const T *x{i} = (const T *)ge_arr(args, {6 + 3 * i}, {npy}, 0, "
                     f"ge_span(d0, d1, d2, xs{i}_0, xs{i}_1, {inner[i]}));")
        lines.append(f"    if (!x{i}) return NULL;")
    lines.append("    if (d0 == 0 || d1 == 0 || d2 == 0) Py_RETURN_NONE;")  # an empty extent: nothing to do
    lines.append("    Py_BEGIN_ALLOW_THREADS")
    # an operand laid out like the output that *is* the output: its variant (one pointer)
    for a in aliases:
        lines.append(f"    if ((const void *)x{a} == (const void *)out) {{")
        lines += run(f"piece_a{a}", "        ")
        lines.append("    } else")
    lines.append("    {")
    lines += run("piece", "        ")
    lines += ["    }", "    Py_END_ALLOW_THREADS", "    Py_RETURN_NONE;", "}", ""]
    src = native.check_c("\n".join(lines), _LOOP_NAMES | native.PRELUDE_NAMES, _LOOP_PATTERNS)
    t0 = time.perf_counter()
    mod = native.build(src, ["kernel"])
    if mod is None:
        with _lock:
            _compiled[key] = None
        return None
    built = _Built(mod, src)
    with _lock:
        _stats["compiled"] += 1
        _stats["inplace_variants"] += len(aliases)
        _stats["compile_s"] += time.perf_counter() - t0
        _compiled[key] = built
    return built


class _Built:
    """A built loop module: ``kernel`` its entry, ``ge_source`` its C source, ``path`` the
    shared library."""

    def __init__(self, mod: Any, src: str) -> None:
        self.kernel = mod.kernel
        self.ge_source = src
        self.path = mod.__file__


def _wrap(built: _Built, dims: list[int], strides: list[list[int]], out_shape: tuple, dt: np.dtype,
          workers: int | None) -> Callable[..., np.ndarray]:
    d0, d1, d2 = dims
    os0, os1 = strides[0][0], strides[0][1]
    xs = [(s[0], s[1]) for s in strides[1:]]
    n_in = len(xs)
    most = 4096 if workers is None else max(1, int(workers))
    entry = built.kernel

    def flat(a):
        if type(a) is np.ndarray and a.dtype == dt and a.flags.c_contiguous and a.flags.aligned:
            return a  # the entry reads it as flat memory (it checks dtype, layout and size itself)
        return np.require(a, dt, ["C_CONTIGUOUS", "ALIGNED"])  # a strided or unaligned view is copied

    def kernel(*operands, out=None):
        if len(operands) != n_in:
            raise TypeError(f"fused loop takes {n_in} operands, got {len(operands)}")
        target = out if (out is not None and out.shape == out_shape and out.dtype == dt and out.flags.c_contiguous
                         and out.flags.aligned and out.flags.writeable) else np.empty(out_shape, dt)
        if target.size == 0:  # an empty extent first: the empty result (the entry would refuse it)
            return target if out is None or target is out else out
        args: list[Any] = []
        for (s0, s1), x in zip(xs, operands):
            args += [flat(x), s0, s1]
        entry(d0, d1, d2, target, os0, os1, *args, min(most, parallel.threads()))
        if out is not None and target is not out:
            np.copyto(out, target.reshape(out.shape) if out.shape != out_shape else target)
            return out
        return target

    with_caps(kernel, mode="loop")
    kernel.source = built.ge_source  # type: ignore[attr-defined]
    kernel.library = built.path  # type: ignore[attr-defined]
    return kernel


# ------------------------------------------------------------------------------------------------
# row kernels: LayerNorm, RMSNorm and Softmax over the last axis, one pass per row in registers
# ------------------------------------------------------------------------------------------------
# Each kind's row is written once (``*_row(r, o, ...)``, inlined) and called by two entries: one
# reading ``x`` and writing ``out``, one in place that passes the same row twice. Two pointers
# that alias exactly fail the compiler's run-time overlap check and the loop runs scalar; one
# pointer passed twice is visibly the same, and the loop vectorises. Sums are reassociated
# (an OpenMP simd reduction); nothing else is.
_ROW_SRC = """
static inline void ln_row(const T *r, T *o, const T *gamma, const T *beta, T eps, T inv, int64_t d) {
    T s = 0;
#pragma omp simd reduction(+:s)
    for (int64_t k = 0; k < d; k++) s += r[k];
    T m = s * inv;
    T v = 0;
#pragma omp simd reduction(+:v)
    for (int64_t k = 0; k < d; k++) { T t = r[k] - m; v += t * t; }
    T rs = ONE / SQRT(v * inv + eps);
    for (int64_t k = 0; k < d; k++) o[k] = (r[k] - m) * rs * gamma[k] + beta[k];
}

static inline void rms_row(const T *r, T *o, const T *gamma, T eps, T inv, int64_t d) {
    /* the order of the exported graph: x * (1 / sqrt(mean(x^2) + eps)), then * gamma */
    T s = 0;
#pragma omp simd reduction(+:s)
    for (int64_t k = 0; k < d; k++) s += r[k] * r[k];
    T rs = ONE / SQRT(s * inv + eps);
    for (int64_t k = 0; k < d; k++) o[k] = r[k] * rs * gamma[k];
}

#if defined(__AVX512F__)
/* a float32 row's softmax 16 lanes at a time in registers (ge_native.sgemm.ACTIVATION_C16's
   sg_softmax_row16, as the Attention kernel's rows): the loops below reach 1.5 G elements/s,
   this 4+. A NaN (or an inf, whose difference from the max is NaN) enters the sum, so the whole
   row is NaN, as in NumPy. */
static inline void sm_row32(const float *r, float *o, int64_t d) {
    sg_softmax_row16(r, NULL, o, d, 1.0f);
}
#define SM_SCALED_VEC 1
#define SM_VEC 1
#elif defined(__AVX2__) && defined(__FMA__)
/* the same on AVX2, 8 lanes (sg_exp8): the max and the sum reduced 8 lanes wide, the tail a
   masked load whose lanes past d are zeroed after the exp */
static inline float sm_hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
static inline float sm_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
static inline void sm_row32(const float *r, float *o, int64_t d) {
    int64_t k = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; k + 8 <= d; k += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(r + k));
    float mi = sm_hmax8(mv);
    for (; k < d; k++) mi = r[k] > mi ? r[k] : mi;
    __m256 mm = _mm256_set1_ps(mi), sv = _mm256_setzero_ps();
    __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(d % 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (k = 0; k + 8 <= d; k += 8) {
        __m256 e = sg_exp8(_mm256_sub_ps(_mm256_loadu_ps(r + k), mm));
        _mm256_storeu_ps(o + k, e);
        sv = _mm256_add_ps(sv, e);
    }
    __m256 et = _mm256_setzero_ps();
    if (d % 8) {
        et = _mm256_and_ps(_mm256_castsi256_ps(tail), sg_exp8(_mm256_sub_ps(_mm256_maskload_ps(r + k, tail), mm)));
        sv = _mm256_add_ps(sv, et);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sm_hsum8(sv));
    for (k = 0; k + 8 <= d; k += 8) _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_loadu_ps(o + k), inv));
    if (d % 8) _mm256_maskstore_ps(o + k, tail, _mm256_mul_ps(et, inv));
}
#define SM_VEC 1
#endif

static inline void sm_row(const T *r, T *o, int64_t d) {
#if defined(SM_VEC)
    if (sizeof(T) == 4) {
        sm_row32((const float *)r, (float *)o, d);
        return;
    }
#endif
    /* a NaN in the row makes every element NaN (its exp enters the sum), as in NumPy */
    T mi = r[0];
#pragma omp simd reduction(max:mi)
    for (int64_t k = 0; k < d; k++) mi = r[k] > mi ? r[k] : mi;
    /* (simd: o is r itself or another row, element k depends on element k alone) */
#pragma omp simd
    for (int64_t k = 0; k < d; k++) o[k] = EXP(r[k] - mi);
    T s = 0;
#pragma omp simd reduction(+:s)
    for (int64_t k = 0; k < d; k++) s += o[k];
    T inv = ONE / s;
#pragma omp simd
    for (int64_t k = 0; k < d; k++) o[k] *= inv;
}

/* rows, cols and the arrays of one call: x (rows x cols), the vectors, out (x itself in place) */
/* (the sizes below are checked products: rows and cols up to 2^40 each overflow int64) */
static int rows_args(PyObject *const *args, Py_ssize_t n, int nvec, int64_t *rows, int64_t *cols,
                     int64_t *threads, const T **x, T **out, const T **vec, T *eps) {
    int base = 1 + nvec + (eps ? 1 : 0);
    if (ge_nargs(n, base + 4)) return -1;
    if (ge_int(args, base + 1, 0, 1LL << 40, rows) || ge_int(args, base + 2, 0, 1LL << 40, cols)
        || ge_int(args, base + 3, 1, 4096, threads)) return -1;
    *out = (T *)ge_arr(args, base, NPY_T, 1, ge_prod(*rows, *cols, 1, 1));
    *x = (const T *)ge_arr(args, 0, NPY_T, 0, ge_prod(*rows, *cols, 1, 1));
    if (!*out || !*x) return -1;
    for (int i = 0; i < nvec; i++) {
        vec[i] = (const T *)ge_arr(args, 1 + i, NPY_T, 0, *cols);
        if (!vec[i]) return -1;
    }
    if (eps) {
        double e = PyFloat_AsDouble(args[1 + nvec]);
        if (e == -1.0 && PyErr_Occurred()) return -1;
        *eps = (T)e;
    }
    return 0;
}

typedef struct { const T *x; T *out; const T *v[2]; T eps, inv; int64_t rows, cols, parts; } R;

/* the even parts of `rows` rows of `cols` a row kernel runs as tasks: about 16K elements each,
   a multiple of *threads of them (participant s then starts on rows [s * rows / threads, ...),
   those GE's GEMM gives it too), one thread under 32K elements (a 128 x 384 one took 28 us alone) */
static int64_t row_parts(int64_t rows, int64_t cols, int64_t *threads) {
    if (rows * cols < 32768) *threads = 1;
    int64_t blocks = (rows * cols + 16383) / 16384;
    if (*threads > 1) blocks = (blocks + *threads - 1) / *threads * *threads;
    if (blocks > rows) blocks = rows;
    return blocks < 1 ? 1 : blocks;
}

/* the rows in row_parts' even parts (their count into *parts, the task context's field) on the
   native pool */
static PyObject *run_parts(ge_task_t task, void *q, int64_t *parts, int64_t rows, int64_t cols, int64_t threads) {
    if (rows == 0 || cols == 0) Py_RETURN_NONE;  /* an empty extent first: no row to run */
    *parts = row_parts(rows, cols, &threads);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(task, q, *parts, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* the rows of one task: each row's `CALL` with r the input row and o the output row (the same
   pointer in place, so the compiler sees they alias exactly and vectorises) */
#define TASK(NAME, INPLACE, CALL)                                                                      \
static void task_##NAME(void *vc, int64_t b, int slot) {                                              \
    R *q = (R *)vc;                                                                                   \
    const T *x = q->x; T *out = q->out; const T *const *v = q->v; T eps = q->eps, inv = q->inv;       \
    int64_t cols = q->cols, end = (b + 1) * q->rows / q->parts;                                        \
    (void)slot; (void)x; (void)v; (void)eps; (void)inv;                                               \
    for (int64_t i = b * q->rows / q->parts; i < end; i++) {                                          \
        T *o = out + i * cols;                                                                        \
        const T *r = INPLACE ? o : x + i * cols;                                                      \
        (void)r;                                                                                      \
        CALL;                                                                                         \
    }                                                                                                 \
}

/* one entry (x, vectors, eps, out, rows, cols, threads): the in-place task when out is x; the rows
   in row_parts' even parts on the native pool, so the next layer reads them on the core that
   wrote them */
#define ENTRY(NAME, NVEC, HAS_EPS)                                                                     \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) {                          \
    int64_t rows, cols, threads; R q = {0};                                                           \
    if (rows_args(args, n, NVEC, &rows, &cols, &threads, &q.x, &q.out, q.v, HAS_EPS ? &q.eps : NULL)) \
        return NULL;                                                                                  \
    q.inv = ONE / (T)cols; q.rows = rows; q.cols = cols;                                              \
    ge_task_t task = (const void *)q.x == (const void *)q.out ? task_##NAME##_ip : task_##NAME;       \
    return run_parts(task, &q, &q.parts, rows, cols, threads);                                        \
}

TASK(layernorm, 0, ln_row(r, o, v[0], v[1], eps, inv, cols))
TASK(layernorm_ip, 1, ln_row(o, o, v[0], v[1], eps, inv, cols))
TASK(rmsnorm, 0, rms_row(r, o, v[0], eps, inv, cols))
TASK(rmsnorm_ip, 1, rms_row(o, o, v[0], eps, inv, cols))
TASK(softmax, 0, sm_row(r, o, cols))
TASK(softmax_ip, 1, sm_row(o, o, cols))
ENTRY(layernorm, 2, 1)
ENTRY(rmsnorm, 1, 1)
ENTRY(softmax, 0, 0)

/* softmax(x * alpha + mask row i % P) of row i (P = 0: no mask): attention's scores scaled and
   masked as they are read, no pass of their own */
static inline void sm_row_scaled(const T *r, const T *mk, T *o, T alpha, int64_t d) {
#if defined(SM_SCALED_VEC)
    if (sizeof(T) == 4) {
        sg_softmax_row16((const float *)r, (const float *)mk, (float *)o, d, (float)alpha);
        return;
    }
#endif
    for (int64_t k = 0; k < d; k++) o[k] = mk ? r[k] * alpha + mk[k] : r[k] * alpha;
    sm_row(o, o, d);
}
typedef struct { const T *x, *mk; T *out; T alpha; int64_t rows, cols, parts, P; } RS;
static void task_softmax_scaled(void *vc, int64_t b, int slot) {
    const RS *q = (const RS *)vc;
    int64_t d = q->cols, end = (b + 1) * q->rows / q->parts;
    (void)slot;
    for (int64_t i = b * q->rows / q->parts; i < end; i++)
        sm_row_scaled(q->x + i * d, q->P ? q->mk + (i % q->P) * d : NULL, q->out + i * d, q->alpha, d);
}

/* softmax_scaled(x, alpha, mask, P, out, rows, cols, threads): out may be x; mask (P x cols) apart
   from out; rows a multiple of P (P = 0: no mask, the mask argument unread) */
static PyObject *softmax_scaled(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t P, rows, cols, threads;
    if (ge_nargs(n, 8)) return NULL;
    if (ge_int(args, 3, 0, 1LL << 40, &P) || ge_int(args, 5, 0, 1LL << 40, &rows)
        || ge_int(args, 6, 0, 1LL << 40, &cols) || ge_int(args, 7, 1, 4096, &threads)) return NULL;
    if (P && rows % P) return ge_fail();
    double alpha = PyFloat_AsDouble(args[1]);
    if (alpha == -1.0 && PyErr_Occurred()) return NULL;
    RS q = {0};
    q.x = (const T *)ge_arr(args, 0, NPY_T, 0, ge_prod(rows, cols, 1, 1));
    q.mk = q.x ? (const T *)ge_arr(args, 2, NPY_T, 0, ge_prod(P, cols, 1, 1)) : NULL;
    q.out = q.mk ? (T *)ge_arr(args, 4, NPY_T, 1, ge_prod(rows, cols, 1, 1)) : NULL;
    if (!q.out) return NULL;
    if (P && q.out < q.mk + P * cols && q.mk < q.out + rows * cols) return ge_fail();
    q.alpha = (T)alpha; q.rows = rows; q.cols = cols; q.P = P;
    return run_parts(task_softmax_scaled, &q, &q.parts, rows, cols, threads);
}

/* rotary embedding: row i of x (cols = d, even) against row i % P of cos and sin,
   o = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] for the halves x1, x2 */
typedef struct { const T *x, *c, *s; T *out; int64_t rows, cols, parts, P; } RQ;
static void task_rotary(void *vc, int64_t b, int slot) {
    const RQ *q = (const RQ *)vc;
    int64_t d = q->cols, h = d / 2, end = (b + 1) * q->rows / q->parts;
    (void)slot;
    for (int64_t i = b * q->rows / q->parts; i < end; i++) {
        const T *xr = q->x + i * d, *cr = q->c + (i % q->P) * d, *sr = q->s + (i % q->P) * d;
        T *o = q->out + i * d;
#pragma omp simd
        for (int64_t j = 0; j < h; j++) o[j] = xr[j] * cr[j] - xr[j + h] * sr[j];
#pragma omp simd
        for (int64_t j = 0; j < h; j++) o[j + h] = xr[j + h] * cr[j + h] + xr[j] * sr[j + h];
    }
}

/* rotary(x, cos, sin, P, out, rows, cols, threads): x and out (rows x cols) apart (out is not x),
   cos and sin (P x cols), rows a multiple of P; the rows in even parts as the row kernels' */
static PyObject *rotary(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t P, rows, cols, threads;
    if (ge_nargs(n, 8)) return NULL;
    if (ge_int(args, 3, 1, 1LL << 40, &P) || ge_int(args, 5, 0, 1LL << 40, &rows)
        || ge_int(args, 6, 0, 1LL << 40, &cols) || ge_int(args, 7, 1, 4096, &threads)) return NULL;
    if (cols % 2 || rows % P) return ge_fail();
    RQ q = {0};
    q.x = (const T *)ge_arr(args, 0, NPY_T, 0, ge_prod(rows, cols, 1, 1));
    q.c = q.x ? (const T *)ge_arr(args, 1, NPY_T, 0, ge_prod(P, cols, 1, 1)) : NULL;
    q.s = q.c ? (const T *)ge_arr(args, 2, NPY_T, 0, ge_prod(P, cols, 1, 1)) : NULL;
    q.out = q.s ? (T *)ge_arr(args, 4, NPY_T, 1, ge_prod(rows, cols, 1, 1)) : NULL;
    if (!q.out) return NULL;
    if (q.out < q.x + rows * cols && q.x < q.out + rows * cols) return ge_fail();  /* (a row reads its first half after writing it) */
    q.rows = rows; q.cols = cols; q.P = P;
    return run_parts(task_rotary, &q, &q.parts, rows, cols, threads);
}
"""

#: per dtype: the typedefs the row source is built with
_ROW_TYPES = {"float32": "typedef float T;\n#define NPY_T NPY_FLOAT\n#define ONE 1.0f\n#define SQRT sqrtf\n#define EXP expneg32\n",
              "float64": "typedef double T;\n#define NPY_T NPY_DOUBLE\n#define ONE 1.0\n#define SQRT sqrt\n#define EXP exp\n"}

#: the row kernels' parameters after x (and before out)
ROW_KINDS = {"layernorm": "gamma, beta, eps", "rmsnorm": "gamma, eps", "softmax": "", "rotary": "cos, sin, P",
             "softmax_scaled": "alpha, mask, P"}

_rows: dict[tuple[str, str], Any] = {}


def row_kernel(kind: str, dtype: Any) -> Any:
    """The compiled ``fn(x2d, *params, out2d)`` of ``kind`` (:data:`ROW_KINDS`: layernorm takes
    ``gamma, beta, eps``, rmsnorm ``gamma, eps``, softmax nothing, rotary ``cos2d, sin2d, P``
    (``P`` rows each, row i of x against row i % P; ``out`` apart from ``x``), softmax_scaled
    ``alpha, mask2d, P`` (softmax of row i * alpha + mask row i % P; ``P`` 0: no mask); else
    ``out`` may be ``x``) for
    ``dtype`` (float32/float64), or None without native kernels. Sums are reassociated
    (vectorised)."""
    if kind not in ROW_KINDS:
        raise ValueError(f"no row kernel {kind!r}")
    dt = np.dtype(dtype)
    if not available() or dt.name not in DTYPES:
        return None
    key = (kind, dt.name)
    with _lock:
        if key in _rows:
            return _rows[key]
    t0 = time.perf_counter()
    # fixed text of this module (no token from a model): built as it is
    mod = native.build(_ROW_TYPES[dt.name] + sgemm.ACTIVATION_C16 + _ROW_SRC, list(ROW_KINDS))
    if mod is None:
        return None
    entry = getattr(mod, kind)

    def fn(x, *args):
        # out may be x: the entry sees the same pointer and runs the in-place rows
        entry(x, *args, x.shape[0], x.shape[1], parallel.threads())

    with _lock:
        _stats["compiled"] += 1
        _stats["compile_s"] += time.perf_counter() - t0
        _rows[key] = fn
    return fn


def by_rows(fn: Any, x2: np.ndarray, y2: np.ndarray, *params: Any) -> None:
    """``fn(x2, *params, y2)`` (a :func:`row_kernel`): its rows are split over the run's threads
    inside the kernel (OpenMP, blocks of rows claimed one at a time; the rows' results do not
    depend on the split)."""
    fn(x2, *params, y2)
