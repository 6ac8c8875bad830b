"""Compiled loop kernels for large fused elementwise groups (native C).

A fused group over a large tensor is bound by how often it walks memory and by how well each
step vectorises. NumPy walks memory once per op (eight passes for an eight-op chain); a
generated loop computes the whole program per element in registers, reads each input once and
writes the output once, and LLVM vectorises it. This module writes such a loop from a fused
program (:mod:`ge_cpu.fused.codegen`) in C and builds it with :mod:`ge_native.native` (compiled once
per machine, loaded from the user's kernel cache by later processes).

Shapes are not part of the compiled code, so one compiled loop serves every layer whose group
has the same program, dtypes and broadcast pattern (BN+ReLU in every block of a ResNet compiles
once). The iteration space is the output's, with every operand's broadcast strides coalesced
into at most three dimensions; the innermost is contiguous in the output and either contiguous
or broadcast (stride 0, loaded once per row) in each operand.

The C is made of tokens this module made (operand names, numeric literals, the prelude's math
functions; each op's scalar C form is a row of :data:`ge_cpu.fused.forms.FORMS`) and is checked
token by token before it is compiled (:func:`ge_native.native.check_c`). The row kernels are fixed
C, ge_native's ``csrc/fused_rows.c``.
Set ``GE_FUSION_JIT=0`` to never use this path (generated NumPy code runs instead); no C
compiler (or ``GE_NATIVE=0``) has the same effect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.kernel import with_caps
from ge_native import native, parallel
from ge_native.jit import enabled as jit_enabled
from ge_sdk.fused import LOOPS_SWITCH

from .forms import CEmitter

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
    return jit_enabled(LOOPS_SWITCH) and native.available()


def stats() -> dict[str, float]:
    """Loop programs built in this process (compiled or loaded from the kernel cache), reuses of
    a built loop, seconds spent building, and how many in-place variants (an operand read
    through the output) the built loops hold."""
    return dict(_stats)


#: the names a generated loop is made of (besides the prelude's and C's own)
_LOOP_NAMES = frozenset({"kernel", "piece", "d0", "d1", "d2", "out", "os0", "os1", "i", "j", "k", "o", "T", "threads",
                         "kb", "ke", "per", "np_", "items", "grab", "c", "end", "t", "rr", "p", "J", "jb", "vc",
                         "slot", "task_piece", "kp", "ge_maxk32", "ge_mink32", "ge_maxk64", "ge_mink64"})
_LOOP_PATTERNS = (r"x[0-9]+", r"xs[0-9]+_[01]", r"v[0-9]+", r"r[0-9]+", r"t[0-9]+", r"p[0-9]+", r"piece_a[0-9]+",
                  r"task_piece_a[0-9]+")

#: Attribute values (a fake-quant's scale and range, a Clip's bounds...) are parameters of the
#: compiled loop, not literals in its C (:meth:`ge_cpu.fused.forms.CEmitter.a`): the loop's C and
#: its cache key are the program's *structure* (ops, dtypes, broadcast layout), so the many
#: fake-quant chains of a quantised model share a few compiled loops instead of one each. The
#: entry reads the values into locals before the loop, so the loop body is the literal form's
#: and gives the same bits. False: literals (the form before; kept for comparison in tests).
PARAMETRIC = True
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
    made = _compile(steps, names, dt, inner, alias_ok)
    if made is None:
        return None
    return _wrap(made[0], dims, strides, tuple(out_shape), dt, workers, made[1])


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
    made = _compile(steps, names, dt, inner, alias_ok)
    if made is None:
        return None
    built, kvals = made
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
                    fn = _wrap(built, got[0], got[1], tuple(full), dt, workers, kvals)
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


def _body(steps, names: list[str], dt: np.dtype,
          parametric: bool) -> tuple[list[str], CEmitter, np.ndarray | None] | None:
    """The loop body's C statements of ``steps`` (``T t<j> = ...;`` over operands ``v<i>``), the
    emitter that wrote them (its parameters, its scalar calls) and the parameters' values (a
    read-only array of dtype ``dt``; None without parameters); None: an op has no C form."""
    em = CEmitter(dt, parametric)
    body: list[str] = []
    env = dict(zip(names, (f"v{i}" for i in range(len(names)))))
    for j, (op, refs, attrs) in enumerate(steps):
        expr = em.expr(op, [env[r] for r in refs], attrs)
        if expr is None:
            return None
        body.append(f"T t{j} = {expr};")
        env[f"t{j}"] = f"t{j}"
    kvals = np.array(em.params, dt) if em.params else None
    if kvals is not None:
        kvals.flags.writeable = False  # (shared by every call of the wrappers that hold it)
    return body, em, kvals


def _compile(steps, names: list[str], dt: np.dtype, inner: tuple[int, ...], aliases: tuple[int, ...] = (),
             parametric: bool | None = None) -> tuple[_Built, np.ndarray | None] | None:
    """The built loop of ``steps`` (a :class:`_Built`) and its parameters' values (None: none),
    or None when there is no loop form. Its one entry ``kernel(d0, d1, d2, out, os0, os1, x0,
    xs0_0, xs0_1, ..., threads[, kp])`` checks its arrays, runs the variant that reads operand
    ``i`` through ``out`` when that operand *is* the output (each ``i`` in ``aliases``), and
    splits the work over ``threads`` threads of the native pool when it is large (every element's
    result is the same however it is split). ``kp``: the parameters' values (:data:`PARAMETRIC`).
    Loops are built and kept by their C: programs differing only in attribute values share one."""
    made = _body(steps, names, dt, PARAMETRIC if parametric is None else parametric)
    if made is None:
        return None
    body, em, kvals = made
    nk = len(em.params)
    # the structure: the parameters' names are in the body, their values are not
    key = (tuple(body), tuple(names), dt.name, inner, aliases)
    with _lock:
        if key in _compiled:
            fn = _compiled[key]
            if fn is None:
                return None
            _stats["reused"] += 1
            return fn, kvals
    if em.scalar_calls:
        # libm per element (sin, cos; every float64 transcendental) keeps the loop from
        # vectorising: NumPy's SIMD ufuncs in cache-sized blocks are faster
        with _lock:
            _compiled[key] = None
        return None
    n = len(names)
    # the parameters: one array the entry reads once into locals, passed on by value (registers)
    kparam = "".join(f", T p{q}" for q in range(nk))
    karg = "".join(f", p{q}" for q in range(nk))
    ctype, npy = ("float", "NPY_FLOAT") if dt == np.float32 else ("double", "NPY_DOUBLE")
    ptrs = "".join(f", const T *x{i}, int64_t xs{i}_0, int64_t xs{i}_1" for i in range(n))
    args = "".join(f", x{i}, xs{i}_0, xs{i}_1" for i in range(n))

    def piece(fname: str, alias: int) -> list[str]:
        """Elements [kb, ke) of output row (i, j); operand ``alias`` read through the output."""
        lines = [f"static inline void {fname}(int64_t i, int64_t j, int64_t kb, int64_t ke, T *out, "
                 f"int64_t os0, int64_t os1{ptrs}{kparam}) {{",
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

    fields = "".join(f" const T *x{i}; int64_t xs{i}_0, xs{i}_1;" for i in range(n)) + "".join(
        f" T p{q};" for q in range(nk))
    jargs = "".join(f", jb->x{i}, jb->xs{i}_0, jb->xs{i}_1" for i in range(n)) + "".join(
        f", jb->p{q}" for q in range(nk))

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
                *(f"{ind}    jb.p{q} = p{q};" for q in range(nk)),
                f"{ind}    jb.per = d2 < {PART_ELEMENTS // 4} ? d2 : {PART_ELEMENTS // 4};",
                f"{ind}    jb.np_ = (d2 + jb.per - 1) / jb.per;",
                f"{ind}    jb.items = d0 * d1 * jb.np_;",
                f"{ind}    jb.grab = jb.per >= {PART_ELEMENTS // 4} ? 1 : ({PART_ELEMENTS // 4} + jb.per - 1) / jb.per;",
                f"{ind}    ge_parallel(task_{fname}, &jb, (jb.items + jb.grab - 1) / jb.grab, threads);",
                f"{ind}}} else {{",
                f"{ind}    for (int64_t i = 0; i < d0; i++)",
                f"{ind}        for (int64_t j = 0; j < d1; j++) {fname}(i, j, 0, d2, out, os0, os1{args}{karg});",
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
              f"    if (ge_nargs(n, {7 + 3 * n + (1 if nk else 0)})) return NULL;",
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
    if nk:
        lines.append(f"    const T *kp = (const T *)ge_arr(args, {7 + 3 * n}, {npy}, 0, {nk});")
        lines.append("    if (!kp) return NULL;")
        lines += [f"    const T p{q} = kp[{q}];" for q in range(nk)]
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
    if nk:  # the max/min against a parameter (fixed C of ge_native: csrc/fused_bounds.h)
        src = native.c_source("fused_bounds.h") + src
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
    return built, kvals


class _Built:
    """A built loop module: ``kernel`` its entry, ``ge_source`` its C source, ``path`` the
    shared library."""

    def __init__(self, mod: Any, src: str) -> None:
        self.kernel = mod.kernel
        self.ge_source = src
        self.path = mod.__file__


def _wrap(built: _Built, dims: list[int], strides: list[list[int]], out_shape: tuple, dt: np.dtype,
          workers: int | None, kvals: np.ndarray | None = None) -> Callable[..., np.ndarray]:
    """The call of ``built`` for one layout; ``kvals`` the values of its parameters (passed last)."""
    d0, d1, d2 = dims
    extra = () if kvals is None else (kvals,)
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
        entry(d0, d1, d2, target, os0, os1, *args, min(most, parallel.threads()), *extra)
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
# (an OpenMP simd reduction); nothing else is. The C is ge_native's csrc/fused_rows.c.
def row_source(dtype: Any) -> str:
    """The fixed C of the row kernels for ``dtype`` (float32/float64): its typedefs
    (``fused_rows_f32.h`` / ``fused_rows_f64.h``), then ``fused_rows.c``."""
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise ValueError(f"no row kernels for {name}")
    return native.c_source(f"fused_rows_{name.replace('float', 'f')}.h", "fused_rows.c")


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
    mod = native.build(row_source(dt), list(ROW_KINDS))
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
