"""Compiled (native C) sliding-window loops over NCHW planes: depthwise convolution and pooling.

Every (image, channel) plane is handled the same way, with long contiguous inner loops that
the C compiler vectorises:

1. **copy in**: the plane's rows are copied into a zero (or -inf) bordered buffer. With a
   vertical stride ``sh`` the padded rows are split into ``sh`` row phases (padded row ``r``
   goes to phase ``r % sh``, row ``r // sh``), so the rows one output row reads from one phase
   are adjacent;
2. **compute**: the output is computed on the buffer's row pitch ``Wp`` at horizontal stride 1,
   as one flat run ``tmp[j] = f(buf[off_0 + j], ..., buf[off_T-1 + j])`` over
   ``j < (OH - 1) * Wp + (OW - 1) * sw + 1``, where ``off_t`` is the tap's fixed offset. The
   columns between output rows are computed and thrown away; a horizontal stride > 1 computes
   the columns in between too (cheaper than strided or gathered loads, which LLVM does not
   vectorise here, and than splitting even and odd columns in the copy-in, measured slower);
3. **copy out**: ``out[oh, ow] = tmp[oh * Wp + ow * sw]`` (divided by the window count for an
   average pool).

The taps are unrolled (one compiled loop per kind, tap count and dtype; shapes, strides, pads
and dilations are run-time values, so every depthwise 3x3 layer of a network shares one
compiled loop); above :data:`MAX_UNROLL` taps one generic loop per kind and dtype accumulates
tap by tap. The loops are C built by :mod:`ge_sdk.native` (compiled once per machine, kept in
the user's kernel cache), run without the GIL, and check every offset against the arrays they
are given before they read or write.

Set ``GE_CPU_JIT=0`` to never use these loops (the NumPy kernels of :mod:`.nn` run instead);
no C compiler has the same effect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_sdk import gensrc, native, sgemm
from ge_sdk.jit import enabled as jit_enabled

#: dtypes the loops are compiled for (input, weights, bias and output share one of them)
DTYPES = ("float32", "float64")
#: the same as NumPy dtypes (``dtype.name`` is a slow Python property; comparisons are not)
NP_DTYPES = tuple(np.dtype(d) for d in DTYPES)
#: kinds of window reduction: weighted sum + bias (depthwise conv), max, sum / count (average)
KINDS = ("conv", "max", "avg")
#: taps above which the generic (tap-by-tap) loop runs instead of an unrolled one: an unrolled
#: loop keeps every tap's weight and row in registers, which spill beyond this (a 7x7 depthwise conv
#: unrolled is 8x slower than tap by tap, 5x5 4x; 3x3 unrolled is 1.5x faster)
MAX_UNROLL = 16
#: taps per pass of the generic depthwise loop
GROUP = 8

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}
_stats = {"compiled": 0, "compile_s": 0.0}
_sources: dict[tuple, str] = {}


def available() -> bool:
    """True when native kernels can be built (:func:`ge_sdk.native.available`) and
    ``GE_CPU_JIT`` does not turn the loops off."""
    return jit_enabled("GE_CPU_JIT") and native.available()


def stats() -> dict[str, float]:
    """Loops built in this process (compiled or loaded from the kernel cache) and seconds spent."""
    return dict(_stats)


# ------------------------------------------------------------------------------------------------
# code generation


#: what a window loop is made of: fixed names, and per-tap names made from the tap's index
_NAMES = frozenset({"kernel", "bad", "x", "wt", "b", "dv", "out", "Wp", "sw", "mult", "rows", "offs", "buf", "tmp", "N", "C",
                    "H", "W", "OH", "OW", "L", "T", "nr", "no", "nbuf", "n", "c", "xp", "nan", "i", "d", "xr", "q",
                    "e", "k", "m", "bv", "j", "v", "t", "st", "wv", "o", "oh", "ow", "M", "FMA", "S", "NPY_S",
                    "task", "vc", "slot", "ctx", "pc", "per", "threads", "act", "lo", "hi", "nt", "p0", "p1", "z",
                    "lov", "hiv", "EPI", "EPI_PLANE", "PyFloat_AsDouble", "PyErr_Occurred"})
_PATTERNS = (r"s[0-9]+", r"w[0-9]+")

#: the activations a depthwise convolution applies as it writes its output (float32 loops),
#: after the bias and a clip to [lo, hi]: GE's GEMM's table and C (one home, ge_sdk.sgemm)
ACTS = sgemm.ACTIVATIONS

#: the float32 epilogue on the output plane: EPI(v) clips, then applies activation ``act``;
#: EPI_PLANE(o, count, ..) does it to a plane after the copy-out, 16 lanes at a time in AVX-512
#: registers (8 in AVX2 ones) where the compiler targets it (GE's GEMM's C of the activations, one home)
_EPI32 = sgemm.ACTIVATION_C + sgemm.ACTIVATION_C16 + """
static inline __attribute__((always_inline)) float EPI(float v, int64_t act, float lo, float hi) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return act32(v, act);
}

static void EPI_PLANE(float *o, int64_t count, int64_t act, float lo, float hi) {
#if defined(__AVX512F__)
    /* (max and min return their second operand when either is NaN: a NaN stays NaN, as in EPI) */
    __m512 lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
    int64_t j = 0;
    for (; j + 16 <= count; j += 16) {
        __m512 v = _mm512_min_ps(hiv, _mm512_max_ps(lov, _mm512_loadu_ps(o + j)));
        _mm512_storeu_ps(o + j, act ? sg_act16(v, act) : v);
    }
    if (j < count) {
        float t[16] __attribute__((aligned(64))) = {0};
        memcpy(t, o + j, (size_t)(count - j) * sizeof(float));
        __m512 v = _mm512_min_ps(hiv, _mm512_max_ps(lov, _mm512_load_ps(t)));
        _mm512_store_ps(t, act ? sg_act16(v, act) : v);
        memcpy(o + j, t, (size_t)(count - j) * sizeof(float));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    /* (the same on 8 lanes: sg_act8) */
    __m256 lov = _mm256_set1_ps(lo), hiv = _mm256_set1_ps(hi);
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) {
        __m256 v = _mm256_min_ps(hiv, _mm256_max_ps(lov, _mm256_loadu_ps(o + j)));
        _mm256_storeu_ps(o + j, act ? sg_act8(v, act) : v);
    }
    if (j < count) {
        float t[8] __attribute__((aligned(32))) = {0};
        memcpy(t, o + j, (size_t)(count - j) * sizeof(float));
        __m256 v = _mm256_min_ps(hiv, _mm256_max_ps(lov, _mm256_load_ps(t)));
        _mm256_store_ps(t, act ? sg_act8(v, act) : v);
        memcpy(o + j, t, (size_t)(count - j) * sizeof(float));
    }
#else
    for (int64_t j = 0; j < count; j++) o[j] = EPI(o[j], act, lo, hi);
#endif
}
"""
#: float64 loops clip only (the activations run as the caller's epilogue)
_EPI64 = """
static inline __attribute__((always_inline)) double EPI(double v, int64_t act, double lo, double hi) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return act == 0 ? v : v;
}

static void EPI_PLANE(double *o, int64_t count, int64_t act, double lo, double hi) {
    for (int64_t j = 0; j < count; j++) o[j] = EPI(o[j], act, lo, hi);
}
"""


def _source(kind: str, taps: int | None) -> str:
    """C source of one loop; ``taps`` None is the generic (tap-by-tap) form. Its only inputs
    are ``kind`` (one of :data:`KINDS`) and the tap count (an int). The planes are tasks on the
    native pool (``threads`` wide), each thread with its own rows of ``buf`` and ``tmp``."""
    gensrc.ident(kind, KINDS)
    if taps is not None:
        gensrc.index(taps)
    conv, avg, mx = kind == "conv", kind == "avg", kind == "max"
    lines = [
        "typedef struct {",
        "    const S *x; const S *wt; const S *b; const S *dv; S *out; const int64_t *rows; const int64_t *offs;",
        "    S *buf; S *tmp; int64_t N, C, H, W, OH, OW, Wp, sw, mult, M, T, nbuf, L, per, act; S lo, hi;",
        "} ctx;",
        "",
        "static void task(void *vc, int64_t i, int slot) {",
        "    const ctx *q = (const ctx *)vc;",
        "    const S *x = q->x; const S *wt = q->wt; const S *b = q->b; const S *dv = q->dv; S *out = q->out;",
        "    const int64_t *rows = q->rows; const int64_t *offs = q->offs;",
        "    int64_t C = q->C, H = q->H, W = q->W, OH = q->OH, OW = q->OW, Wp = q->Wp, sw = q->sw;",
        "    int64_t mult = q->mult, M = q->M, T = q->T, L = q->L, act = q->act;",
        "    S lo = q->lo, hi = q->hi;",
        "    S *buf = q->buf + slot * q->nbuf;",
        "    S *tmp = q->tmp + slot * q->L;",
        "    int64_t p0 = i * q->per, p1 = p0 + q->per < q->N * C ? p0 + q->per : q->N * C;",
        "    (void)wt; (void)b; (void)dv; (void)T; (void)act; (void)lo; (void)hi; (void)M;",
    ]
    if taps is not None:
        lines += [f"    const S *s{t} = buf + offs[{t}];" for t in range(taps)]
    lines += [
        "    for (int64_t pc = p0; pc < p1; pc++) {",
        "        int64_t n = pc / C, c = pc % C;",
        "        {",
        "            const S *xp = x + (n * C + c) * H * W;",
        "            int nan = 0;",
        "            for (int64_t i = 0; i < H; i++) {",
        "                S *d = buf + rows[i];",
        "                const S *xr = xp + i * W;",
        "                for (int64_t q = 0; q < W; q++) {",
        "                    S e = xr[q];",
        "                    d[q] = e;",
        # NumPy's maximum makes a NaN in the window the result; that test costs more than the
        # max itself, so the NaN rule only runs on planes that hold a NaN
        *(["                    nan |= e != e;"] if mx else []),
        "                }",
        "            }",
        "            (void)nan;",
        "            for (int64_t k = 0; k < mult; k++) {",
        "                int64_t m = c * mult + k;",
    ]
    ind = " " * 16
    generic = taps is None
    if taps is not None:
        if conv:
            lines += [f"{ind}const S w{t} = wt[m * {taps} + {t}];" for t in range(taps)]
            lines.append(f"{ind}const S bv = b[m];")
            expr = "bv"
            for t in range(taps):
                expr = f"FMA(w{t}, s{t}[j], {expr})"
            lines += [f"{ind}for (int64_t j = 0; j < L; j++) tmp[j] = {expr};"]
        elif avg:
            expr = " + ".join(f"s{t}[j]" for t in range(taps))
            lines += [f"{ind}for (int64_t j = 0; j < L; j++) tmp[j] = {expr};"]
        else:
            # planes holding a NaN take the tap-by-tap loop below with NumPy's NaN rule
            lines += [f"{ind}if (!nan) {{",
                      f"{ind}    for (int64_t j = 0; j < L; j++) {{",
                      f"{ind}        S v = s0[j];",
                      f"{ind}        S e;"]
            for t in range(1, taps):
                lines += [f"{ind}        e = s{t}[j];",
                          f"{ind}        v = v > e ? v : e;"]
            lines += [f"{ind}        tmp[j] = v;", f"{ind}    }}", f"{ind}}} else {{"]
            generic = True
            ind = " " * 20
    if generic:
        init = {"conv": "b[m]", "avg": "0", "max": "buf[offs[0] + j]"}[kind]
        lines += [f"{ind}for (int64_t j = 0; j < L; j++) tmp[j] = {init};"]
        if conv:
            # taps in groups of GROUP per pass over tmp: eight rows and weights stay in registers,
            # and a small plane makes T / GROUP passes instead of T
            g = GROUP
            expr = "tmp[j]"
            for u in range(g):
                expr = f"FMA(w{u}, s{u}[j], {expr})"
            lines += [f"{ind}int64_t t = 0;",
                      f"{ind}for (; t + {g} <= T; t += {g}) {{",
                      *[f"{ind}    const S *s{u} = buf + offs[t + {u}];" for u in range(g)],
                      *[f"{ind}    const S w{u} = wt[m * T + t + {u}];" for u in range(g)],
                      f"{ind}    for (int64_t j = 0; j < L; j++) tmp[j] = {expr};",
                      f"{ind}}}"]
        if conv:
            lines += [f"{ind}for (; t < T; t++) {{"]  # the taps left over
        else:
            lines += [f"{ind}for (int64_t t = {'1' if mx else '0'}; t < T; t++) {{"]
        lines += [f"{ind}    const S *st = buf + offs[t];"]
        if conv:
            lines += [f"{ind}    const S wv = wt[m * T + t];",
                      f"{ind}    for (int64_t j = 0; j < L; j++) tmp[j] = FMA(wv, st[j], tmp[j]);"]
        elif avg:
            lines += [f"{ind}    for (int64_t j = 0; j < L; j++) tmp[j] += st[j];"]
        else:
            lines += [f"{ind}    for (int64_t j = 0; j < L; j++) {{",
                      f"{ind}        S v = tmp[j];",
                      f"{ind}        S e = st[j];",
                      f"{ind}        tmp[j] = (v >= e || v != v) ? v : e;",
                      f"{ind}    }}"]
        lines.append(f"{ind}}}")
        if mx and taps is not None:
            lines.append(" " * 16 + "}")
    ind = " " * 16
    lines += [f"{ind}S *o = out + (n * M + m) * OH * OW;"]
    lines += [
        f"{ind}for (int64_t oh = 0; oh < OH; oh++)",
        f"{ind}    for (int64_t ow = 0; ow < OW; ow++)",
        f"{ind}        o[oh * OW + ow] = tmp[oh * Wp + ow * sw]{' / dv[oh * OW + ow]' if avg else ''};",
    ]
    if conv:  # the epilogue on the output plane while it is in cache (its pixels only)
        lines += [f"{ind}if (act != 0 || lo > -INFINITY || hi < INFINITY) EPI_PLANE(o, OH * OW, act, lo, hi);"]
    lines += [
        "            }",
        "        }",
        "    }",
        "}",
        "",
        "static PyObject *kernel(PyObject *self, PyObject *const *args, Py_ssize_t n) {",
        "    int64_t N, C, H, W, OH, OW, Wp, sw, mult, nr, no, nbuf, L, threads, act;",
        "    if (ge_nargs(n, 22)) return NULL;",
        "    if (ge_int(args, 0, 0, 1LL << 40, &N) || ge_int(args, 1, 0, 1LL << 40, &C) || "
        "ge_int(args, 2, 0, 1LL << 40, &H) || ge_int(args, 3, 0, 1LL << 40, &W)) return NULL;",
        "    if (ge_int(args, 4, 0, 1LL << 40, &OH) || ge_int(args, 5, 0, 1LL << 40, &OW) || "
        "ge_int(args, 6, 0, 1LL << 40, &Wp) || ge_int(args, 7, 1, 1LL << 40, &sw) || "
        "ge_int(args, 8, 1, 1LL << 20, &mult)) return NULL;",
        "    if (ge_int(args, 18, 1, 4096, &threads) || ge_int(args, 19, 0, 5, &act)) return NULL;",
        "    double lov = PyFloat_AsDouble(args[20]), hiv = PyFloat_AsDouble(args[21]);",
        "    if (PyErr_Occurred()) return NULL;",
        "    int64_t M = C * mult;",
        "    const S *x = (const S *)ge_arr(args, 9, NPY_S, 0, ge_prod(N, C, H, W));",
        "    const int64_t *rows = (const int64_t *)ge_vec(args, 14, NPY_INT64, 0, &nr);",
        "    const int64_t *offs = (const int64_t *)ge_vec(args, 15, NPY_INT64, 0, &no);",
        "    S *buf = (S *)ge_vec(args, 16, NPY_S, 1, &nbuf);",
        "    S *tmp = (S *)ge_vec(args, 17, NPY_S, 1, &L);",
        "    if (!x || !rows || !offs || !buf || !tmp) return NULL;",
        "    int64_t T = no;",
        f"    const S *wt = (const S *)ge_arr(args, 10, NPY_S, 0, {'ge_prod(M, T, 1, 1)' if conv else '0'});",
        f"    const S *b = (const S *)ge_arr(args, 11, NPY_S, 0, {'M' if conv else '0'});",
        f"    const S *dv = (const S *)ge_arr(args, 12, NPY_S, 0, {'ge_prod(OH, OW, 1, 1)' if avg else '0'});",
        "    S *out = (S *)ge_arr(args, 13, NPY_S, 1, ge_prod(N, M, OH, OW));",
        "    if (!wt || !b || !dv || !out) return NULL;",
        # buf and tmp hold one plane's rows per thread
        "    int bad = nbuf % threads || L % threads;",
        "    nbuf = nbuf / threads;",
        "    L = L / threads;",
        # every read and write of the loops below stays inside its array (checked, not assumed)
        "    bad = bad || nr < H || T < 1 || (OH > 0 && OW > 0 && L < ge_span(OH, OW, 1, Wp, sw, 0));",
    ]
    if taps is not None:
        lines.append(f"    bad = bad || T != {taps};")
    lines += [
        "    for (int64_t t = 0; t < T && !bad; t++) bad = offs[t] < 0 || offs[t] > nbuf - L;",
        "    for (int64_t i = 0; i < H && !bad; i++) bad = rows[i] < 0 || rows[i] > nbuf - W;",
        "    if (bad) return ge_fail();",
        "    int64_t nt = N * C < 4 * threads ? N * C : 4 * threads;",
        "    int64_t per = nt > 0 ? (N * C + nt - 1) / nt : 1;",
        "    nt = per > 0 ? (N * C + per - 1) / per : 0;",
        "    ctx q = {x, wt, b, dv, out, rows, offs, buf, tmp, N, C, H, W, OH, OW, Wp, sw, mult, M, T, nbuf, L, per, act,",
        "             (S)lov, (S)hiv};",
        "    Py_BEGIN_ALLOW_THREADS",
        "    ge_parallel(task, &q, nt, threads);",
        "    Py_END_ALLOW_THREADS",
        "    Py_RETURN_NONE;",
        "}",
    ]
    return "\n".join(lines) + "\n"


def checked_source(kind: str, taps: int | None) -> str:
    """The C of one loop after the token check (:func:`ge_sdk.native.check_c`)."""
    return native.check_c(_source(kind, taps), _NAMES | native.PRELUDE_NAMES, _PATTERNS)


#: per dtype: the scalar type and its NumPy number, and the multiply-add (one rounding)
_TYPES = {"float32": "typedef float S;\n#define NPY_S NPY_FLOAT\n#define FMA fmaf\n" + _EPI32,
          "float64": "typedef double S;\n#define NPY_S NPY_DOUBLE\n#define FMA fma\n" + _EPI64}


def loop(kind: str, taps: int, dtype: np.dtype, contiguous: bool = True):
    """The built loop for ``kind`` over ``taps`` taps, or None (no native kernels here)."""
    unrolled = taps if taps <= MAX_UNROLL else None
    key = (kind, unrolled, dtype)
    fn = _compiled.get(key)
    if fn is not None:
        return fn or None
    if not available() or kind not in KINDS or dtype not in NP_DTYPES or type(taps) is not int:
        return None
    src = checked_source(kind, unrolled)
    t0 = time.perf_counter()
    mod = native.build(_TYPES[dtype.name] + src, ["kernel"])
    fn = False if mod is None else mod.kernel
    with _lock:
        _compiled[key] = fn
        if fn:
            _sources[key] = src
            _stats["compiled"] += 1
            _stats["compile_s"] += time.perf_counter() - t0
    return fn or None


def prepare(kind: str, taps: int, dtype: Any) -> None:
    """Build the loop a kernel will run (at model build, so the first run compiles nothing);
    nothing for a dtype or kind the loops do not take."""
    try:
        dt = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        return
    if dt in NP_DTYPES and kind in KINDS and type(taps) is int and taps > 0:
        loop(kind, taps, dt)


# ------------------------------------------------------------------------------------------------
# plans (per input shape) and the call


class WindowPlan:
    """Buffer layout of one 2-D window op for one input plane size (see the module docstring)."""

    __slots__ = ("in_hw", "out_hw", "Wp", "sw", "rows", "offs", "nbuf", "L", "ok", "bufs")

    def __init__(self, in_hw: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int],
                 pb: Sequence[int], out_hw: Sequence[int]) -> None:
        h, w = in_hw
        oh, ow = out_hw
        sh, sw = s
        # padded extent that every output window (including ceil_mode's last one) fits in
        hp = max(pb[0] + h, (oh - 1) * sh + (k[0] - 1) * d[0] + 1)
        wp = max(pb[1] + w, (ow - 1) * sw + (k[1] - 1) * d[1] + 1)
        hq = -(-hp // sh)
        plane = hq * wp
        self.in_hw = (h, w)
        self.out_hw = (oh, ow)
        #: (calling thread, kind, dtype, threads) -> its (buf, tmp): :func:`buffers`
        self.bufs: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.Wp = wp
        self.sw = sw
        # where each input row starts in the buffer: row phase, row in the phase, left padding
        self.rows = np.array([((i + pb[0]) % sh) * plane + ((i + pb[0]) // sh) * wp + pb[1] for i in range(h)],
                             np.int64)
        # where each tap's flat run starts
        self.offs = np.array([((a * d[0]) % sh) * plane + (a * d[0] // sh) * wp + bb * d[1]
                              for a in range(k[0]) for bb in range(k[1])], np.int64)
        self.nbuf = plane * sh
        self.L = (oh - 1) * wp + (ow - 1) * sw + 1
        # every read of the compute step stays inside the buffer (the loops do not check
        # bounds); a plan that would not is never run, the NumPy kernel runs instead
        self.ok = self.L > 0 and int(self.offs.min()) >= 0 and int(self.offs.max()) + self.L <= self.nbuf


_ONE: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {}


def _dummy(dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Read-only 1-element (1-D, 2-D) stand-ins for the operands a kind does not use."""
    a = _ONE.get(dt)
    if a is None:
        one = np.zeros(1, dt)
        one.setflags(write=False)
        a = _ONE[dt] = (one, one.reshape(1, 1))
    return a


def buffers(plan: WindowPlan, kind: str, dt: np.dtype, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """The calling thread's ``(buf, tmp)`` for ``plan``: one plane's bordered buffer rows and flat
    run per pool thread, made once and kept with the plan. The loops write a plane's own pixels
    only, so the borders (zero, or -inf for max) stay as made; a plan is one geometry, so a
    kept buffer always fits the run that gets it. Two runs on two threads get two sets."""
    key = (threading.get_ident(), kind, dt, threads)
    got = plan.bufs.get(key)
    if got is None:
        if len(plan.bufs) >= 8:  # (threads come and go: a bounded memo)
            plan.bufs.clear()
        buf = np.full(plan.nbuf * threads, -np.inf, dt) if kind == "max" else np.zeros(plan.nbuf * threads, dt)
        got = plan.bufs[key] = (buf, np.empty(plan.L * threads, dt))
    return got


def run(kind: str, plan: WindowPlan, x: np.ndarray, out: np.ndarray, wt: np.ndarray | None = None,
        b: np.ndarray | None = None, dv: np.ndarray | None = None, *, threads: int = 1,
        clip: tuple[float, float] | None = None, act: str | None = None) -> bool:
    """Run the window loop on 4-D ``x`` into C-contiguous ``out`` (shapes already checked by the
    caller), its planes split over ``threads`` threads of the native pool. ``wt``: (M, taps)
    weights and ``b``: (M,) bias of a depthwise conv (M = C * mult), which applies ``clip``
    (``(lo, hi)``) and then ``act`` (a name of :data:`ACTS`, float32 only) as it writes;
    ``dv``: (OH * OW,) window counts of an average pool. False when no compiled loop exists
    or the epilogue is not one the loop applies (nothing is written then)."""
    if (clip is not None or act is not None) and kind != "conv":
        return False
    if act is not None and (act not in ACTS or x.dtype != np.float32):
        return False
    if not plan.ok or x.shape[2:] != plan.in_hw or out.shape[2:] != plan.out_hw or out.shape[0] != x.shape[0]:
        return False
    dt = x.dtype
    taps = plan.offs.shape[0]
    fn = loop(kind, taps, dt)
    if fn is None:
        return False
    if out.size == 0:
        return True
    x = np.require(x, dt, ["C_CONTIGUOUS", "ALIGNED"])  # a strided view is copied once
    n, c, h, w = x.shape
    threads = max(1, min(int(threads), n * c))
    buf, tmp = buffers(plan, kind, dt, threads)
    one, one2 = _dummy(dt)
    mult = out.shape[1] // x.shape[1] if x.shape[1] else 1
    oh, ow = out.shape[2:]
    lo, hi = (-np.inf, np.inf) if clip is None else (float(clip[0]), float(clip[1]))
    fn(n, c, h, w, oh, ow, plan.Wp, plan.sw, mult, x, one2 if wt is None else np.require(wt, dt, ["C", "A"]),
       one if b is None else np.require(b, dt, ["C", "A"]), one if dv is None else np.require(dv, dt, ["C", "A"]),
       out, plan.rows, plan.offs, buf, tmp, threads, ACTS.get(act or "", 0), lo, hi)
    return True
