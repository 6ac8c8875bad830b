"""Compiled (numba) sliding-window loops over NCHW planes: depthwise convolution and pooling.

Every (image, channel) plane is handled the same way, with long contiguous inner loops that
LLVM vectorises:

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

The taps are unrolled (one compiled loop per kind, tap count, dtype and input layout; shapes,
strides, pads and dilations are run-time values, so every depthwise 3x3 layer of a network
shares one compiled loop); above :data:`MAX_UNROLL` taps one generic loop per kind and dtype
accumulates tap by tap. Operands are read-only in the signatures, so mmap'ed weights of a loaded
.om pass; loops are compiled without the GIL and cached in memory only (numba's on-disk cache
is a pickle, and this project never reads pickles).

Set ``GE_CPU_JIT=0`` to never use these loops (the NumPy kernels of :mod:`.nn` run instead);
numba not being importable has the same effect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_sdk import gensrc
from ge_sdk.jit import numba_if_enabled

#: dtypes the loops are compiled for (input, weights, bias and output share one of them)
DTYPES = ("float32", "float64")
#: the same as NumPy dtypes (``dtype.name`` is a slow Python property; comparisons are not)
NP_DTYPES = tuple(np.dtype(d) for d in DTYPES)
#: kinds of window reduction: weighted sum + bias (depthwise conv), max, sum / count (average)
KINDS = ("conv", "max", "avg")
#: taps above which the generic (tap-by-tap) loop runs instead of an unrolled one
MAX_UNROLL = 64

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}
_stats = {"compiled": 0, "compile_s": 0.0}
_numba: Any = None


def available() -> bool:
    """True when numba imports and ``GE_CPU_JIT`` does not turn the loops off."""
    global _numba
    _numba = numba_if_enabled("GE_CPU_JIT")
    return _numba is not None


def stats() -> dict[str, float]:
    """Loops compiled in this process and seconds spent compiling them."""
    return dict(_stats)


# ------------------------------------------------------------------------------------------------
# code generation


#: what a window loop is made of: fixed names, and per-tap names made from the tap's index
_VOCAB = gensrc.Vocabulary(
    names=frozenset({"np", "kernel", "x", "wt", "b", "dv", "out", "Wp", "sw", "mult", "rows", "offs", "buf", "tmp",
                     "usw", "N", "C", "H", "W", "OH", "OW", "L", "T", "uW", "uOW", "uWp", "n", "c", "xp", "nan",
                     "i", "d", "xr", "q", "e", "k", "m", "bv", "j", "v", "t", "st", "wv", "o", "oh", "so", "do", "ow",
                     "range"}),
    patterns=(r"o[0-9]+", r"s[0-9]+", r"w[0-9]+"),
    attributes=frozenset({"uint64", "shape", "reshape"}),
    modules=frozenset({"numpy"}))


def _source(kind: str, taps: int | None) -> str:
    """Python source of one loop; ``taps`` None is the generic (tap-by-tap) form. Its only
    inputs are ``kind`` (one of :data:`KINDS`) and the tap count (an int)."""
    gensrc.ident(kind, KINDS)
    if taps is not None:
        gensrc.index(taps)
    lines = [
        "import numpy as np",
        "",
        "",
        "def kernel(x, wt, b, dv, out, Wp, sw, mult, rows, offs, buf, tmp):",
        # unsigned indices: numba tests signed ones for negative wraparound, which stops LLVM
        # from vectorising the loops
        "    usw = np.uint64(sw)",
        "    N, C, H, W = x.shape",
        "    OH, OW = out.shape[2], out.shape[3]",
    ]
    if taps is not None:
        lines += [f"    o{t} = offs[{t}]" for t in range(taps)]
    lines += ["    L = tmp.shape[0]",
              "    T = offs.shape[0]"]
    if taps is not None:
        # a slice per tap: indexing it by the loop counter needs no wraparound test either
        lines += [f"    s{t} = buf[o{t}:o{t} + L]" for t in range(taps)]
    lines += [
        "    uW = np.uint64(W)",
        "    uOW = np.uint64(OW)",
        "    uWp = np.uint64(Wp)",
        "    for n in range(N):",
        "        for c in range(C):",
        "            xp = x[n, c]",
        # NumPy's maximum makes a NaN in the window the result; that test costs more than the
        # max itself, so it only runs on planes that hold a NaN
        *(["            nan = False"] if kind == "max" else []),
        "            for i in range(H):",
        "                d = np.uint64(rows[i])",
        "                xr = xp[i]",
    ]
    track = ["nan |= e != e"] if kind == "max" else []
    lines += ["                for q in range(uW):",
              "                    e = xr[q]",
              "                    buf[d + q] = e",
              *[f"                    {t}" for t in track]]
    lines += [
        "            for k in range(mult):",
        "                m = c * mult + k",
    ]
    ind = " " * 16
    if taps is not None:
        if kind == "conv":
            lines += [f"{ind}w{t} = wt[m, {t}]" for t in range(taps)]
            lines.append(f"{ind}bv = b[m]")
            expr = "bv + " + " + ".join(f"w{t} * s{t}[j]" for t in range(taps))
            lines += [f"{ind}for j in range(L):",
                      f"{ind}    tmp[j] = {expr}"]
        elif kind == "avg":
            expr = " + ".join(f"s{t}[j]" for t in range(taps))
            lines += [f"{ind}for j in range(L):",
                      f"{ind}    tmp[j] = {expr}"]
        else:
            # planes holding a NaN take the tap-by-tap loop below with NumPy's NaN rule
            lines += [f"{ind}if not nan:",
                      f"{ind}    for j in range(L):",
                      f"{ind}        v = s0[j]"]
            for t in range(1, taps):
                lines += [f"{ind}        e = s{t}[j]",
                          f"{ind}        v = v if v > e else e"]
            lines += [f"{ind}        tmp[j] = v"]
    if taps is None or kind == "max":
        if taps is not None:
            lines.append(f"{ind}else:")
            ind = " " * 20
        init = {"conv": "b[m]", "avg": "0", "max": "buf[offs[0] + j]"}[kind]
        lines += [f"{ind}for j in range(L):",
                  f"{ind}    tmp[j] = {init}",
                  f"{ind}for t in range({'1' if kind == 'max' else '0'}, T):",
                  f"{ind}    st = buf[offs[t]:offs[t] + L]"]
        if kind == "conv":
            lines += [f"{ind}    wv = wt[m, t]",
                      f"{ind}    for j in range(L):",
                      f"{ind}        tmp[j] += wv * st[j]"]
        elif kind == "avg":
            lines += [f"{ind}    for j in range(L):",
                      f"{ind}        tmp[j] += st[j]"]
        else:
            lines += [f"{ind}    for j in range(L):",
                      f"{ind}        v = tmp[j]",
                      f"{ind}        e = st[j]",
                      # NumPy's maximum: a NaN in the window is the result
                      f"{ind}        tmp[j] = v if (v >= e or v != v) else e"]
    ind = " " * 16
    lines += [
        f"{ind}o = out[n, m].reshape(-1)",
        f"{ind}for oh in range(np.uint64(OH)):",
        f"{ind}    so = oh * uWp",
        f"{ind}    do = oh * uOW",
        f"{ind}    for ow in range(uOW):",
    ]
    if kind == "avg":
        lines.append(f"{ind}        o[do + ow] = tmp[so + ow * usw] / dv[do + ow]")
    else:
        lines.append(f"{ind}        o[do + ow] = tmp[so + ow * usw]")
    return "\n".join(lines) + "\n"


def loop(kind: str, taps: int, dtype: np.dtype, contiguous: bool):
    """The compiled loop for ``kind`` over ``taps`` taps, or None (numba missing or refusing)."""
    unrolled = taps if taps <= MAX_UNROLL else None
    key = (kind, unrolled, dtype, contiguous)
    fn = _compiled.get(key)
    if fn is not None:
        return fn or None
    if not available() or kind not in KINDS or dtype not in NP_DTYPES or type(taps) is not int:
        return None
    src = _source(kind, unrolled)
    code = gensrc.compile_checked(src, f"<ge_cpu {kind} window loop>", _VOCAB)
    numba = _numba
    nt = numba.types
    i64, scalar = nt.int64, getattr(nt, dtype.name)

    def ro(nd: int, layout: str = "C"):
        return nt.Array(scalar, nd, layout, readonly=True)

    # x may be a strided view (layout "A"); everything else is made contiguous by the caller
    sig = nt.void(ro(4, "C" if contiguous else "A"), ro(2), ro(1), ro(1), nt.Array(scalar, 4, "C"),
                  i64, i64, i64, *([nt.Array(i64, 1, "C", readonly=True)] * 2),
                  nt.Array(scalar, 1, "C"), nt.Array(scalar, 1, "C"))
    t0 = time.perf_counter()
    ns: dict[str, Any] = {}
    try:
        exec(code, ns)  # noqa: S102 - checked generated code (gensrc)
        # contract: multiply-adds become FMAs (one rounding instead of two); nothing else relaxed
        fn = numba.njit(sig, nogil=True, error_model="numpy", fastmath={"contract"})(ns["kernel"])
    except Exception:  # noqa: BLE001 - a loop numba refuses: the caller runs the NumPy kernel
        fn = False
    with _lock:
        _compiled[key] = fn
        if fn:
            fn.ge_source = src
            _stats["compiled"] += 1
            _stats["compile_s"] += time.perf_counter() - t0
    return fn or None


# ------------------------------------------------------------------------------------------------
# plans (per input shape) and the call


class WindowPlan:
    """Buffer layout of one 2-D window op for one input plane size (see the module docstring)."""

    __slots__ = ("in_hw", "out_hw", "Wp", "sw", "rows", "offs", "nbuf", "L", "ok")

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


def run(kind: str, plan: WindowPlan, x: np.ndarray, out: np.ndarray, wt: np.ndarray | None = None,
        b: np.ndarray | None = None, dv: np.ndarray | None = None) -> bool:
    """Run the window loop on 4-D ``x`` into C-contiguous ``out`` (shapes already checked by the
    caller). ``wt``: (M, taps) weights and ``b``: (M,) bias of a depthwise conv (M = C * mult);
    ``dv``: (OH * OW,) window counts of an average pool. False when no compiled loop exists."""
    if not plan.ok or x.shape[2:] != plan.in_hw or out.shape[2:] != plan.out_hw or out.shape[0] != x.shape[0]:
        return False
    dt = x.dtype
    taps = plan.offs.shape[0]
    fn = loop(kind, taps, dt, bool(x.flags.c_contiguous))
    if fn is None:
        return False
    if out.size == 0:
        return True
    buf = np.full(plan.nbuf, -np.inf, dt) if kind == "max" else np.zeros(plan.nbuf, dt)
    tmp = np.empty(plan.L, dt)
    one, one2 = _dummy(dt)
    mult = out.shape[1] // x.shape[1] if x.shape[1] else 1
    fn(x, one2 if wt is None else wt, one if b is None else b, one if dv is None else dv, out,
       plan.Wp, plan.sw, mult, plan.rows, plan.offs, buf, tmp)
    return True
