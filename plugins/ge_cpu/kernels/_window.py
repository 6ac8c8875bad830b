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
   the columns in between too (measured cheaper than strided or gathered loads, which do not
   vectorise here, and than an even/odd column split in the copy-in);
3. **copy out**: ``out[oh, ow] = tmp[oh * Wp + ow * sw]`` (divided by the window count for an
   average pool).

The fixed C (copy-in, copy-out, epilogue, tap-by-tap loops, the checked entry) is ge_native's
``csrc/window.h``; the generated part is the compute step with its taps unrolled (one loop per
kind, tap count and dtype; shapes, strides, pads and dilations are run-time values, so every
depthwise 3x3 layer shares one loop); above :data:`MAX_UNROLL` taps the tap-by-tap form runs.
Built by :mod:`ge_native.native` (once per machine, kept in the kernel cache), the loops run
without the GIL and check every offset against their arrays before they read or write.

A float32 depthwise convolution of stride 1 or 2 runs on a direct AVX-512 kernel instead
(``csrc/depthwise.c``; the same bits; ``GE_CPU_DW_DIRECT=0`` turns it off). ``GE_CPU_JIT=0``
(or no C compiler) leaves the NumPy kernels of :mod:`.nn`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_native import gensrc, isa, native, sgemm
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
#: taps per pass of the generic depthwise loop (WIN_GROUP of csrc/window.h)
GROUP = 8

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}
_stats = {"compiled": 0, "compile_s": 0.0}
#: the instruction set the loops were compiled for (their module's ``win_isa()``), once one is built
_loop_isa: dict[str, str] = {}


def available() -> bool:
    """True when native kernels can be built (:func:`ge_native.native.available`) and
    ``GE_CPU_JIT`` does not turn the loops off."""
    return jit_enabled("GE_CPU_JIT") and native.available()


def stats() -> dict[str, float]:
    """Loops built in this process (compiled or loaded from the kernel cache) and seconds spent."""
    return dict(_stats)


# ------------------------------------------------------------------------------------------------
# code generation


#: what the generated part of a window loop is made of: the names of csrc/window.h it calls and
#: its own locals; per-tap names are made from the tap's index
_NAMES = frozenset({"kernel", "win_compute", "win_entry", "win_ctx", "WIN_AI", "win_conv_taps", "win_avg_taps",
                    "win_max_taps", "q", "buf", "tmp", "m", "nan", "offs", "wt", "b", "bv", "L", "j", "v", "e",
                    "S", "FMA"})
_PATTERNS = (r"s[0-9]+", r"w[0-9]+")

#: the activations a depthwise convolution applies as it writes its output (float32 loops),
#: after the bias and a clip to [lo, hi]: GE's GEMM's table and C (one home, ge_native.sgemm)
ACTS = sgemm.ACTIVATIONS

#: per dtype: the header holding the scalar type, its NumPy number, its multiply-add (one
#: rounding), the epilogue (float32: clip and activation; float64: clip only) and the fixed
#: part of the loops (csrc/window.h)
_HEADERS = {"float32": "window_f32.h", "float64": "window_f64.h"}


def _unrolled_conv(taps: int) -> list[str]:
    """``tmp[j] = bias + sum of the taps``: one chain of multiply-adds in tap order from the
    bias, every tap's row and weight in a register."""
    expr = "bv"
    for t in range(taps):
        expr = f"FMA(w{t}, s{t}[j], {expr})"
    return ["    const S *wt = q->wt;",
            *[f"    const S w{t} = wt[m * {taps} + {t}];" for t in range(taps)],
            "    const S bv = q->b[m];",
            f"    for (int64_t j = 0; j < L; j++) tmp[j] = {expr};"]


def _unrolled_avg(taps: int) -> list[str]:
    """``tmp[j] = sum of the taps`` in tap order (the copy-out divides by the window count)."""
    expr = " + ".join(f"s{t}[j]" for t in range(taps))
    return [f"    for (int64_t j = 0; j < L; j++) tmp[j] = {expr};"]


def _unrolled_max(taps: int) -> list[str]:
    """``tmp[j] = max of the taps``; planes holding a NaN take the tap-by-tap loop with NumPy's
    NaN rule (win_max_taps)."""
    lines = ["    if (!nan) {",
             "        for (int64_t j = 0; j < L; j++) {",
             "            S v = s0[j];"]
    if taps > 1:
        lines.append("            S e;")
    for t in range(1, taps):
        lines += [f"            e = s{t}[j];",
                  "            v = v > e ? v : e;"]
    return lines + ["            tmp[j] = v;",
                    "        }",
                    "    } else {",
                    "        win_max_taps(q, buf, tmp);",
                    "    }"]


def _compute(kind: str, taps: int | None) -> list[str]:
    """The body of ``win_compute`` (see csrc/window.h): the taps unrolled, or (``taps`` None)
    a call of the tap-by-tap form."""
    if taps is None:
        return [{"conv": "    win_conv_taps(q, buf, tmp, m);",
                 "avg": "    win_avg_taps(q, buf, tmp);",
                 "max": "    win_max_taps(q, buf, tmp);"}[kind]]
    body = {"conv": _unrolled_conv, "avg": _unrolled_avg, "max": _unrolled_max}[kind](taps)
    return ["    const int64_t *offs = q->offs;",
            "    int64_t L = q->L;",
            *[f"    const S *s{t} = buf + offs[{t}];" for t in range(taps)],
            *body]


def _source(kind: str, taps: int | None) -> str:
    """The generated part of one loop (the rest is csrc/window.h); ``taps`` None is the generic
    (tap-by-tap) form. Its only inputs are ``kind`` (one of :data:`KINDS`) and the tap count (an
    int), checked here before any text is made."""
    gensrc.ident(kind, KINDS)
    if taps is not None:
        gensrc.index(taps)
    return "\n".join([
        "WIN_AI void win_compute(const win_ctx *q, const S *buf, S *tmp, int64_t m, int nan) {",
        *_compute(kind, taps),
        "}",
        "",
        "static PyObject *kernel(PyObject *self, PyObject *const *args, Py_ssize_t n) {",
        f"    return win_entry(args, n, {KINDS.index(kind)}, {-1 if taps is None else taps});",
        "}",
    ]) + "\n"


def checked_source(kind: str, taps: int | None) -> str:
    """The C of one loop after the token check (:func:`ge_native.native.check_c`)."""
    return native.check_c(_source(kind, taps), _NAMES | native.PRELUDE_NAMES, _PATTERNS)


def full_source(kind: str, taps: int | None, dtype: str) -> str:
    """What :func:`loop` builds for ``kind``, ``taps`` and ``dtype`` (a name of :data:`DTYPES`):
    the fixed header (csrc/window_f32.h or window_f64.h, with window.h) and the checked part."""
    return native.c_source(_HEADERS[dtype]) + checked_source(kind, taps)


def loop(kind: str, taps: int, dtype: np.dtype, contiguous: bool = True):
    """The built loop for ``kind`` over ``taps`` taps, or None (no native kernels here)."""
    unrolled = taps if taps <= MAX_UNROLL else None
    key = (kind, unrolled, dtype)
    fn = _compiled.get(key)
    if fn is not None:
        return fn or None
    if not available() or kind not in KINDS or dtype not in NP_DTYPES or type(taps) is not int:
        return None
    src = full_source(kind, unrolled, dtype.name)
    t0 = time.perf_counter()
    mod = native.build(src, ["kernel", "win_isa"])
    fn = False if mod is None else mod.kernel
    with _lock:
        _compiled[key] = fn
        if fn:
            _loop_isa.setdefault("isa", str(mod.win_isa()))
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

#: The direct kernel (C in csrc/depthwise.c): a depthwise convolution (NCHW, float32) 16 output columns of a row a vector. Each plane is
#: copied into the thread's bordered plane (its padding zeros, rows a multiple of 16 apart), so
#: every tap is an unmasked load and a multiply-add. A 3x3 kernel at stride 1 or 2 keeps its nine
#: weights in registers and computes 8 output rows a pass: each input row is two or three aligned
#: loads, its three taps made by lane shifts (stride 1) or even/odd permutes (stride 2), feeding
#: the 8 sums it belongs to. Other kernels (up to 64 wide; stride 1 or 2 across) run a row at a
#: time. Each output vector is one chain of multiply-adds in tap order from the bias, the
#: padding's taps included (as zeros), as in the window loop: both give the same bits (an
#: infinite weight on the padding is NaN in both), at every thread count. Fixed C, no generated
#: part; built for AVX-512F only (``dw_ok`` is 0 elsewhere and the window loop runs). The module
#: is built on first use (None without AVX-512F, or with ``GE_CPU_DW_DIRECT=0``: the window loop
#: runs those layers then).
_direct = native.lazy_module("GE_CPU_DW_DIRECT", native.c_source("depthwise.c"), ["dw_ok", "dw_conv"], "dw_ok")


def direct_available() -> bool:
    """True when the direct depthwise kernel runs here (AVX-512F and the native kernels build)."""
    return _direct() is not None


def variant(direct: bool = True) -> str:
    """The variant of the ``depthwise`` family a kernel on these loops runs here: ``"avx512f"``
    for the direct kernel (``direct`` True and :func:`direct_available`), else the instruction set
    the window loops were compiled for (``"avx512f"``, ``"avx2"`` or ``"scalar"``), else
    ``"numpy"`` (no loops: the NumPy kernels run). For ``with_caps(kernel, variant=...)``."""
    if direct and direct_available():
        return "avx512f"
    if available() and loop("conv", 9, np.dtype(np.float32)) is not None:
        return _loop_isa.get("isa", "scalar")
    return "numpy"


def _probe() -> str | None:
    got = variant()
    return None if got == "numpy" else got


#: depthwise convolution's (and the pooling loops') variants: the direct AVX-512F kernel, else the
#: window loops compiled for the machine's widest vectors, else NumPy
FAMILY = isa.register(isa.Family("depthwise", [isa.Variant("avx512f", frozenset({"avx512f"})),
                                               isa.Variant("avx2", frozenset({"avx2", "fma"})),
                                               isa.Variant("scalar"), isa.Variant("numpy")], probe=_probe))


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
    runs on the direct kernel (csrc/depthwise.c) where it is built, unless ``direct`` is
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
