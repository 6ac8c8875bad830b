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
tap by tap. The loops are C built by :mod:`ge_native.native` (compiled once per machine, kept in
the user's kernel cache), run without the GIL, and check every offset against the arrays they
are given before they read or write.

A float32 depthwise convolution of stride 1 or 2 runs on a direct AVX-512 kernel instead (see
:data:`_DIRECT_SRC`; the same bits; ``GE_CPU_DW_DIRECT=0`` turns it off).

Set ``GE_CPU_JIT=0`` to never use these loops (the NumPy kernels of :mod:`.nn` run instead);
no C compiler has the same effect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_native import gensrc, native, sgemm
from ge_native.jit import enabled as jit_enabled

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
    """True when native kernels can be built (:func:`ge_native.native.available`) and
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
#: after the bias and a clip to [lo, hi]: GE's GEMM's table and C (one home, ge_native.sgemm)
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
    """The C of one loop after the token check (:func:`ge_native.native.check_c`)."""
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
# the direct depthwise kernel (float32, AVX-512)

#: A depthwise convolution (NCHW, float32) 16 output columns of a row a vector. Each plane is
#: copied into the thread's bordered plane (its padding zeros, rows a multiple of 16 apart), so
#: every tap is an unmasked load and a multiply-add. A 3x3 kernel at stride 1 or 2 keeps its nine
#: weights in registers and computes 8 output rows a pass: each input row is two or three aligned
#: loads, its three taps made by lane shifts (stride 1) or even/odd permutes (stride 2), feeding
#: the 8 sums it belongs to. Other kernels (up to 64 wide; stride 1 or 2 across) run a row at a
#: time. Each output vector is one chain of multiply-adds in tap order from the bias, the
#: padding's taps included (as zeros), as in the window loop: both give the same bits (an
#: infinite weight on the padding is NaN in both), at every thread count. Fixed C, no generated
#: part; built for AVX-512F only (``dw_ok`` is 0 elsewhere and the window loop runs).
_DIRECT_SRC = sgemm.ACTIVATION_C + sgemm.ACTIVATION_C16 + r"""
#include <immintrin.h>
#include <stdlib.h>
#define DW_AI static inline __attribute__((always_inline))

typedef struct {
    const float *x; const float *wt; const float *b; float *out; float *buf;
    int64_t N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, M, per, act, Hb, Wb;
    float lo, hi;
} dw_ctx;

#if defined(__AVX512F__)
DW_AI __m512 dw_shift(__m512 a, __m512 b, const int k) {  /* lanes k .. k + 15 of the pair (a, b) */
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(b), _mm512_castps_si512(a), k));
}

/* R output rows from oh, 16 columns from ow0, of a 3x3 kernel at stride S both ways (dilation 1),
   from the bordered plane `buf` (row pitch Wb, a multiple of 16: every load is aligned). Each
   input row is loaded once and feeds the R sums it belongs to: R independent chains keep the
   multiply-adds in flight (one chain waits on their latency). Rows from OH on are computed into
   the border and not stored */
DW_AI void dw_block3(const float *buf, int64_t Wb, int64_t oh, int64_t OH, int64_t OW, int64_t ow0, const __m512 *w9,
                     __m512 bias, __mmask16 om, float *o, const int R, const int S) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = bias;
#pragma GCC unroll 17
    for (int j = 0; j < (R - 1) * S + 3; j++) {
        const float *row = buf + (oh * S + j) * Wb + ow0 * S;
        __m512 v[3];
        __m512 a0 = _mm512_load_ps(row), a1 = _mm512_load_ps(row + 16);
        if (S == 1) {
            v[0] = a0;
            v[1] = dw_shift(a0, a1, 1);
            v[2] = dw_shift(a0, a1, 2);
        } else {
            __m512 a2 = _mm512_load_ps(row + 32);
            v[0] = _mm512_permutex2var_ps(a0, even, a1);
            v[1] = _mm512_permutex2var_ps(a0, odd, a1);
            v[2] = _mm512_permutex2var_ps(dw_shift(a0, a1, 2), even, dw_shift(a1, a2, 2));
        }
#pragma GCC unroll 3
        for (int qq = 0; qq < 3; qq++)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                int r = j - i * S;
                if (r >= 0 && r <= 2) acc[i] = _mm512_fmadd_ps(v[qq], w9[r * 3 + qq], acc[i]);
            }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        if (oh + i < OH) _mm512_mask_storeu_ps(o + (oh + i) * OW + ow0, om, acc[i]);
}

/* one output plane of a 3x3 kernel at stride S (1 or 2) both ways, dilation 1 */
DW_AI void dw_plane3(const dw_ctx *q, const float *buf, const float *wm, float bv, float *o, const int S) {
    const int64_t OH = q->OH, OW = q->OW, Wb = q->Wb;
    const __m512 bias = _mm512_set1_ps(bv);
    __m512 w9[9];
    for (int t = 0; t < 9; t++) w9[t] = _mm512_set1_ps(wm[t]);
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
        int64_t nout = OW - ow0 < 16 ? OW - ow0 : 16;
        __mmask16 om = (__mmask16)((1u << nout) - 1u);
        int64_t oh = 0;
        for (; oh + 8 <= OH; oh += 8) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 8, S);
        int64_t rest = OH - oh;
        if (rest >= 5) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 8, S);
        else if (rest >= 3) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 4, S);
        else if (rest == 2) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 2, S);
        else if (rest == 1) dw_block3(buf, Wb, oh, OH, OW, ow0, w9, bias, om, o, 1, S);
    }
}

/* one output plane of any kernel at stride 1 or 2 across, one output row at a time */
static void dw_plane(const dw_ctx *q, const float *buf, const float *wm, float bv, float *o) {
    const int64_t OH = q->OH, OW = q->OW, SH = q->SH, SW = q->SW, KH = q->KH, KW = q->KW, DH = q->DH, DW = q->DW;
    const int64_t Wb = q->Wb;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
        int64_t nout = OW - ow0 < 16 ? OW - ow0 : 16;
        __mmask16 om = (__mmask16)((1u << nout) - 1u);
        for (int64_t oh = 0; oh < OH; oh++) {
            __m512 acc = _mm512_set1_ps(bv);
            for (int64_t r = 0; r < KH; r++) {
                const float *row = buf + (oh * SH + r * DH) * Wb + ow0 * SW;
                for (int64_t qq = 0; qq < KW; qq++) {
                    const float *p = row + qq * DW;
                    __m512 v = SW == 1 ? _mm512_loadu_ps(p)
                                       : _mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_loadu_ps(p + 16));
                    acc = _mm512_fmadd_ps(v, _mm512_set1_ps(wm[r * KW + qq]), acc);
                }
            }
            _mm512_mask_storeu_ps(o + oh * OW + ow0, om, acc);
        }
    }
}

/* the clip and activation over an output plane just written (in L1), out of the multiply-add
   loops so that they keep their registers */
static void dw_epi_plane(float *o, int64_t count, float lo, float hi, int64_t act) {
    const __m512 lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
    for (int64_t j = 0; j < count; j += 16) {
        __mmask16 m = (__mmask16)(count - j >= 16 ? 0xFFFFu : (1u << (count - j)) - 1u);
        __m512 v = _mm512_min_ps(hiv, _mm512_max_ps(lov, _mm512_maskz_loadu_ps(m, o + j)));
        _mm512_mask_storeu_ps(o + j, m, act ? sg_act16(v, act) : v);
    }
}

/* planes p0 .. p1 - 1 of the task: each copied into the thread's bordered plane (zeroed once per
   call: the copies write its interior only), then computed from there */
static void dw_task(void *vc, int64_t i, int slot) {
    const dw_ctx *q = (const dw_ctx *)vc;
    (void)slot;
    int64_t P = q->N * q->M, p0 = i * q->per, p1 = p0 + q->per < P ? p0 + q->per : P;
    int64_t H = q->H, W = q->W, Wb = q->Wb;
    float *buf = q->buf + slot * q->Hb * Wb;
    int k3 = q->KH == 3 && q->KW == 3 && q->DH == 1 && q->DW == 1 && q->SH == q->SW;
    int64_t last = -1;
    for (int64_t pc = p0; pc < p1; pc++) {
        int64_t n = pc / q->M, m = pc % q->M, c = m / q->mult;
        if (n * q->C + c != last) {
            const float *xp = q->x + (n * q->C + c) * H * W;
            for (int64_t r = 0; r < H; r++) {
                const float *src = xp + r * W;
                float *dst = buf + (r + q->PT) * Wb + q->PL;
                for (int64_t j = 0; j < W; j += 16) {
                    __mmask16 mk = (__mmask16)(W - j >= 16 ? 0xFFFFu : (1u << (W - j)) - 1u);
                    _mm512_mask_storeu_ps(dst + j, mk, _mm512_maskz_loadu_ps(mk, src + j));
                }
            }
            last = n * q->C + c;
        }
        const float *wm = q->wt + m * q->KH * q->KW;
        float *o = q->out + pc * q->OH * q->OW;
        if (k3 && q->SH == 1) dw_plane3(q, buf, wm, q->b[m], o, 1);
        else if (k3 && q->SH == 2) dw_plane3(q, buf, wm, q->b[m], o, 2);
        else dw_plane(q, buf, wm, q->b[m], o);
        if (q->act || q->lo > -INFINITY || q->hi < INFINITY) dw_epi_plane(o, q->OH * q->OW, q->lo, q->hi, q->act);
    }
}

/* ---- small planes: 16 channels to a vector ----
   A plane narrower than a vector (a 7x7 or 14x14 one) leaves most lanes of a row idle, and a
   stride-2 row needs permutes. Here a task takes 16 channels of one image: their planes are
   transposed (16 x 16 tiles in registers) into a bordered buffer of pixels of 16 channels, each
   output pixel is one vector (a chain of multiply-adds in tap order from the bias, the padding's
   taps included as zeros: the bits of the plane path), and the result is transposed back. */

/* r[0..15] (16 rows of 16) transposed in place */
DW_AI void dw_tr16(__m512 *r) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    /* u[4i + j], 128-bit lane L: rows 4i .. 4i + 3 of column 4L + j */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512 vlo = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), vhi = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
        __m512 wlo = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88), whi = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_f32x4(vlo, wlo, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(vlo, wlo, 0xdd);
        r[4 + j] = _mm512_shuffle_f32x4(vhi, whi, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(vhi, whi, 0xdd);
    }
}

typedef struct {
    const dw_ctx *q;
    float *scratch;                  /* per thread: the bordered pixel buffer (Hp x Wp x 16), then OH*OW x 16 */
    int64_t Hp, Wp, groups, per_thread;
} dwc_ctx;

static void dwc_task(void *vc, int64_t i, int slot) {
    const dwc_ctx *g = (const dwc_ctx *)vc;
    const dw_ctx *q = g->q;
    const int64_t H = q->H, W = q->W, OH = q->OH, OW = q->OW, KH = q->KH, KW = q->KW, taps = KH * KW;
    const int64_t SH = q->SH, SW = q->SW, DH = q->DH, DW = q->DW, Wp = g->Wp;
    const int64_t n = i / g->groups, c0 = (i % g->groups) * 16, nc = q->C - c0 < 16 ? q->C - c0 : 16;
    const int64_t HW = H * W, OHW = OH * OW;
    float *bb = g->scratch + (int64_t)slot * g->per_thread, *ob = bb + g->Hp * Wp * 16;
    /* the planes in: 16 pixels of the 16 channels at a time, transposed, each pixel's vector to
       its place in the buffer (the border was zeroed once and is never written) */
    const float *xs = q->x + (n * q->C + c0) * HW;
    int64_t h = 0, w = 0;  /* the pixel p0 + k's row and column, counted (not divided) */
    for (int64_t p0 = 0; p0 < HW; p0 += 16) {
        int64_t np_ = HW - p0 < 16 ? HW - p0 : 16;
        __mmask16 pm = (__mmask16)(np_ == 16 ? 0xFFFFu : (1u << np_) - 1u);
        __m512 r[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) r[c] = c < nc ? _mm512_maskz_loadu_ps(pm, xs + c * HW + p0) : _mm512_setzero_ps();
        dw_tr16(r);
        float *dst = bb + ((h + q->PT) * Wp + w + q->PL) * 16;
        for (int64_t k = 0; k < np_; k++) {
            _mm512_store_ps(dst, r[k]);
            dst += 16;
            if (++w == W) { w = 0; h++; dst += (Wp - W) * 16; }
        }
    }
    /* the taps' weights and the bias as vectors of the 16 channels (0 past the last one) */
    float wv[64 * 16] __attribute__((aligned(64)));
    float bv[16] __attribute__((aligned(64)));
    for (int64_t c = 0; c < 16; c++) {
        bv[c] = c < nc ? q->b[c0 + c] : 0.0f;
        for (int64_t t = 0; t < taps; t++) wv[t * 16 + c] = c < nc ? q->wt[(c0 + c) * taps + t] : 0.0f;
    }
    const __m512 bias = _mm512_load_ps(bv), lo = _mm512_set1_ps(q->lo), hi = _mm512_set1_ps(q->hi);
    const int epi = q->act || q->lo > -INFINITY || q->hi < INFINITY;
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *row = bb + oh * SH * Wp * 16;
        int64_t ow = 0;
        for (; ow + 4 <= OW; ow += 4) {  /* four pixels: four independent chains */
            __m512 a0 = bias, a1 = bias, a2 = bias, a3 = bias;
            for (int64_t r = 0; r < KH; r++)
                for (int64_t s = 0; s < KW; s++) {
                    const float *p = row + (r * DH * Wp + ow * SW + s * DW) * 16;
                    __m512 w = _mm512_load_ps(wv + (r * KW + s) * 16);
                    a0 = _mm512_fmadd_ps(_mm512_load_ps(p), w, a0);
                    a1 = _mm512_fmadd_ps(_mm512_load_ps(p + SW * 16), w, a1);
                    a2 = _mm512_fmadd_ps(_mm512_load_ps(p + 2 * SW * 16), w, a2);
                    a3 = _mm512_fmadd_ps(_mm512_load_ps(p + 3 * SW * 16), w, a3);
                }
            if (epi) {
                a0 = _mm512_min_ps(hi, _mm512_max_ps(lo, a0)); a1 = _mm512_min_ps(hi, _mm512_max_ps(lo, a1));
                a2 = _mm512_min_ps(hi, _mm512_max_ps(lo, a2)); a3 = _mm512_min_ps(hi, _mm512_max_ps(lo, a3));
                if (q->act) { a0 = sg_act16(a0, q->act); a1 = sg_act16(a1, q->act); a2 = sg_act16(a2, q->act); a3 = sg_act16(a3, q->act); }
            }
            float *o = ob + (oh * OW + ow) * 16;
            _mm512_store_ps(o, a0); _mm512_store_ps(o + 16, a1); _mm512_store_ps(o + 32, a2); _mm512_store_ps(o + 48, a3);
        }
        for (; ow < OW; ow++) {
            __m512 a0 = bias;
            for (int64_t r = 0; r < KH; r++)
                for (int64_t s = 0; s < KW; s++)
                    a0 = _mm512_fmadd_ps(_mm512_load_ps(row + (r * DH * Wp + ow * SW + s * DW) * 16),
                                         _mm512_load_ps(wv + (r * KW + s) * 16), a0);
            if (epi) {
                a0 = _mm512_min_ps(hi, _mm512_max_ps(lo, a0));
                if (q->act) a0 = sg_act16(a0, q->act);
            }
            _mm512_store_ps(ob + (oh * OW + ow) * 16, a0);
        }
    }
    /* the planes out: 16 pixels of the 16 channels at a time, transposed back */
    float *os = q->out + (n * q->C + c0) * OHW;
    for (int64_t p0 = 0; p0 < OHW; p0 += 16) {
        int64_t np_ = OHW - p0 < 16 ? OHW - p0 : 16;
        __mmask16 pm = (__mmask16)(np_ == 16 ? 0xFFFFu : (1u << np_) - 1u);
        __m512 r[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) r[k] = k < np_ ? _mm512_load_ps(ob + (p0 + k) * 16) : _mm512_setzero_ps();
        dw_tr16(r);
        for (int64_t c = 0; c < nc; c++) _mm512_mask_storeu_ps(os + c * OHW + p0, pm, r[c]);
    }
}

/* the small-plane form of dw_conv when it takes the geometry (1: ran; 0: not taken; -1: no memory) */
static int dwc_run(const dw_ctx *q, int64_t threads) {
    const int64_t taps = q->KH * q->KW;
    if (q->mult != 1 || taps > 64) return 0;
    int64_t Hp = q->PT + q->H, Wp = q->PL + q->W;
    int64_t eh = (q->OH - 1) * q->SH + (q->KH - 1) * q->DH + 1, ew = (q->OW - 1) * q->SW + (q->KW - 1) * q->DW + 1;
    if (eh > Hp) Hp = eh;
    if (ew > Wp) Wp = ew;
    /* where it pays (against the plane path, one thread / two): kernels over 3x3 (7x7 on 7x7 to
       28x28 planes: 233 -> 95, 447 -> 230 us), stride 2 (56x56 -> 28x28: 100 -> 75 us), planes up to
       8 wide (544 channels of 7x7: 27 -> 21 us); a 3x3 stride-1 kernel on a wider plane keeps the
       plane path (its row vectors are full; the transposes here would cost more than the taps:
       136 x 28x28, 47 against 59 us); planes up to 32 wide, a thread's buffers in L2 */
    int64_t per = (Hp * Wp + q->OH * q->OW) * 16;
    if (q->OW > 32 || per > (1 << 16)) return 0;
    if (taps <= 9 && q->SH == 1 && q->SW == 1 && q->OW > 8) return 0;
    int64_t groups = (q->C + 15) / 16, nt = q->N * groups;
    if (threads > nt) threads = nt;
    if (threads < 1) threads = 1;
    size_t bytes = (size_t)(threads * per) * sizeof(float);
    float *scratch = (float *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!scratch) return -1;
    /* each thread's border of zeros (the tasks write the interior only) */
    for (int64_t t = 0; t < threads; t++) {
        float *bb = scratch + t * per;
        for (int64_t r = 0; r < Hp; r++) {
            float *row = bb + r * Wp * 16;
            if (r < q->PT || r >= q->PT + q->H) memset(row, 0, (size_t)Wp * 16 * sizeof(float));
            else {
                memset(row, 0, (size_t)q->PL * 16 * sizeof(float));
                memset(row + (q->PL + q->W) * 16, 0, (size_t)(Wp - q->PL - q->W) * 16 * sizeof(float));
            }
        }
    }
    dwc_ctx g = {q, scratch, Hp, Wp, groups, per};
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(dwc_task, &g, nt, threads);
    Py_END_ALLOW_THREADS
    free(scratch);
    return 1;
}
#endif

static PyObject *dw_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
#if defined(__AVX512F__)
    return PyLong_FromLongLong(1);
#else
    return PyLong_FromLongLong(0);
#endif
}

/* dw_conv(N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, x, wt, b, out, threads, act, lo, hi):
   every read is of a row 0 <= ih < H and a column 0 <= col < W of its plane (the rest masked off),
   every write of a column < OW of an output row < OH: any geometry stays inside the arrays */
static PyObject *dw_conv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t v[15], threads, act;
    if (ge_nargs(n, 23)) return NULL;
    for (int i = 0; i < 15; i++)
        if (ge_int(args, i, 0, 1LL << 40, &v[i])) return NULL;
    if (ge_int(args, 19, 1, 4096, &threads) || ge_int(args, 20, 0, 5, &act)) return NULL;
    double lov = PyFloat_AsDouble(args[21]), hiv = PyFloat_AsDouble(args[22]);
    if (PyErr_Occurred()) return NULL;
    int64_t N = v[0], C = v[1], H = v[2], W = v[3], OH = v[4], OW = v[5], KH = v[6], KW = v[7];
    int64_t SH = v[8], SW = v[9], PT = v[10], PL = v[11], DH = v[12], DW = v[13], mult = v[14];
    if (KH < 1 || KW < 1 || SH < 1 || SH > 2 || SW < 1 || SW > 2 || DH < 1 || DW < 1 || mult < 1 ||
        KH > 64 || KW > 64 || DH > 64 || DW > 64 || PT > 64 || PL > 64)
        return ge_fail();
    /* the bordered plane: every row and column the compute reads, the input at (PT, PL), zeros
       around it (a block of 8 rows reads up to (OH rounded up to 8) * SH + (KH - 1) * DH rows;
       16 columns at ow0 read up to 48 past ow0 * SW) */
    int64_t OHr = (OH + 7) / 8 * 8, OWr = (OW + 15) / 16 * 16;
    int64_t Hb = PT + H, Wb = PL + W;
    if (OHr * SH + (KH - 1) * DH + 1 > Hb) Hb = OHr * SH + (KH - 1) * DH + 1;
    if (OWr * SW + (KW - 1) * DW + 48 > Wb) Wb = OWr * SW + (KW - 1) * DW + 48;
    Wb = (Wb + 15) / 16 * 16;
    if (Hb > (1LL << 20) || Wb > (1LL << 20) || Hb * Wb > (1LL << 28)) return ge_fail();
    int64_t M = ge_prod(C, mult, 1, 1);  /* (checked: C and mult up to 2^40 each) */
    if (M < 0) return ge_fail();
    const float *x = (const float *)ge_arr(args, 15, NPY_FLOAT, 0, ge_prod(N, C, H, W));
    const float *wt = (const float *)ge_arr(args, 16, NPY_FLOAT, 0, ge_prod(M, KH, KW, 1));
    const float *b = (const float *)ge_arr(args, 17, NPY_FLOAT, 0, M);
    float *out = (float *)ge_arr(args, 18, NPY_FLOAT, 1, ge_prod(N, M, OH, OW));
    if (!x || !wt || !b || !out) return NULL;
    if (N == 0 || M == 0 || OH == 0 || OW == 0) Py_RETURN_NONE;  /* an empty extent first: no output */
#if defined(__AVX512F__)
    {
        dw_ctx q1 = {x, wt, b, out, NULL, N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, M, 0, act, 0, 0,
                     (float)lov, (float)hiv};
        int rc = dwc_run(&q1, threads);  /* small planes, large kernels, stride 2: 16 channels a vector */
        if (rc < 0) return PyErr_NoMemory();
        if (rc > 0) Py_RETURN_NONE;
    }
    int64_t P = N * M;
    int64_t nt = P < 4 * threads ? P : 4 * threads;
    int64_t per = nt > 0 ? (P + nt - 1) / nt : 1;
    nt = per > 0 ? (P + per - 1) / per : 0;
    if (nt < threads) threads = nt > 0 ? nt : 1;
    size_t bytes = (size_t)(threads * Hb * Wb) * sizeof(float);
    float *buf = (float *)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!buf) return PyErr_NoMemory();
    memset(buf, 0, bytes);
    dw_ctx q = {x, wt, b, out, buf, N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, mult, M, per, act, Hb, Wb,
                (float)lov, (float)hiv};
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(dw_task, &q, nt, threads);
    Py_END_ALLOW_THREADS
    free(buf);
    Py_RETURN_NONE;
#else
    return ge_fail();
#endif
}
"""

#: the module of _DIRECT_SRC, built on first use (None without AVX-512F, or with
#: ``GE_CPU_DW_DIRECT=0``: the window loop runs those layers then)
_direct = native.lazy_module("GE_CPU_DW_DIRECT", _DIRECT_SRC, ["dw_ok", "dw_conv"], "dw_ok")


def direct_available() -> bool:
    """True when the direct depthwise kernel runs here (AVX-512F and the native kernels build)."""
    return _direct() is not None


class DirectConv:
    """One float32 depthwise layer on the direct kernel with its geometry, weights and bias
    prepared once for one input shape (:func:`run` re-derives and re-checks them on every call:
    10 us of a ShuffleNet layer's 32 went there). ``wt``: (M, taps), ``b``: (M,)."""

    __slots__ = ("dims", "wt", "b")

    def __init__(self, plan: WindowPlan, x_shape: Sequence[int], out_shape: Sequence[int], wt: np.ndarray,
                 b: np.ndarray) -> None:
        n, c, h, w = (int(v) for v in x_shape)
        oh, ow = (int(v) for v in out_shape[2:])
        if not plan.direct or plan.in_hw != (h, w) or plan.out_hw != (oh, ow) or out_shape[0] != n or not c:
            raise ValueError("DirectConv: a plan and shapes that do not fit the direct kernel")
        kh, kw, sh, sw, dh, dw, pt, pl = plan.geom
        self.dims = (n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, int(out_shape[1]) // c)
        self.wt = np.require(wt, np.float32, ["C", "A"])
        self.b = np.require(b, np.float32, ["C", "A"])

    def run(self, x: np.ndarray, out: np.ndarray, threads: int = 1, clip: tuple[float, float] | None = None,
            act: str | None = None) -> bool:
        """``out = act(clip(depthwise(x) + b))`` (C-contiguous float32 arrays of the prepared
        shapes; the kernel checks their sizes); False (nothing done) when it cannot run them."""
        mod = _direct()
        if mod is None or (act is not None and act not in ACTS):
            return False
        lo, hi = (-np.inf, np.inf) if clip is None else (float(clip[0]), float(clip[1]))
        try:
            mod.dw_conv(*self.dims, x, self.wt, self.b, out, max(1, int(threads)), ACTS.get(act or "", 0), lo, hi)
        except (TypeError, ValueError):
            return False
        return True


# ------------------------------------------------------------------------------------------------
# plans (per input shape) and the call


class WindowPlan:
    """Buffer layout of one 2-D window op for one input plane size (see the module docstring)."""

    __slots__ = ("in_hw", "out_hw", "Wp", "sw", "rows", "offs", "nbuf", "L", "ok", "bufs", "geom", "direct")

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
        #: the direct kernel's geometry: kernel, strides, dilations, top and left padding; and
        #: whether it takes it (strides 1 or 2, kernel, dilation and padding up to 64)
        self.geom = (int(k[0]), int(k[1]), int(sh), int(sw), int(d[0]), int(d[1]), int(pb[0]), int(pb[1]))
        self.direct = (sh <= 2 and sw <= 2 and max(k) <= 64 and max(d) <= 64 and min(pb) >= 0 and max(pb) <= 64)
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
        clip: tuple[float, float] | None = None, act: str | None = None, direct: bool = True) -> bool:
    """Run the window loop on 4-D ``x`` into C-contiguous ``out`` (shapes already checked by the
    caller), its planes split over ``threads`` threads of the native pool. ``wt``: (M, taps)
    weights and ``b``: (M,) bias of a depthwise conv (M = C * mult), which applies ``clip``
    (``(lo, hi)``) and then ``act`` (a name of :data:`ACTS`, float32 only) as it writes;
    ``dv``: (OH * OW,) window counts of an average pool. A float32 depthwise conv of stride 1 or 2
    runs on the direct kernel (:data:`_DIRECT_SRC`) where it is built, unless ``direct`` is
    False; the same bits either way. False when no compiled loop exists or the epilogue is not
    one the loop applies (nothing is written then)."""
    if (clip is not None or act is not None) and kind != "conv":
        return False
    if act is not None and (act not in ACTS or x.dtype != np.float32):
        return False
    if x.shape[2:] != plan.in_hw or out.shape[2:] != plan.out_hw or out.shape[0] != x.shape[0]:
        return False
    if (direct and kind == "conv" and x.dtype == np.float32 and wt is not None and b is not None
            and plan.direct and out.flags.c_contiguous):
        mod = _direct()
        if mod is not None:
            if out.size == 0:
                return True
            x = np.require(x, np.float32, ["C_CONTIGUOUS", "ALIGNED"])
            n, c, h, w = x.shape
            kh, kw, sh, sw, dh, dw, pt, pl = plan.geom
            lo, hi = (-np.inf, np.inf) if clip is None else (float(clip[0]), float(clip[1]))
            mod.dw_conv(n, c, h, w, out.shape[2], out.shape[3], kh, kw, sh, sw, pt, pl, dh, dw,
                        out.shape[1] // c if c else 1, x, np.require(wt, np.float32, ["C", "A"]),
                        np.require(b, np.float32, ["C", "A"]), out, max(1, int(threads)), ACTS.get(act or "", 0),
                        lo, hi)
            return True
    if not plan.ok:
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
