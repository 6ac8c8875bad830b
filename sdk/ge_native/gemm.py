"""GEMMs on GE's thread pool without the GIL: BLAS at one thread, called from native threads.

:mod:`ge_native.parallel` owns the engine's threading; this module is its fast path for matrix
products. A Python thread pool pays tens of microseconds per job to wake a worker and to learn
that it finished (futexes; more in a VM), which is the whole time of a transformer's small
GEMMs. Here a split GEMM is one call into a native kernel (:mod:`ge_native.native`) whose tasks
call BLAS's own single-threaded ``sgemm``/``dgemm`` on one block of columns (or rows) each:

- the tasks run on the process's one native pool: its workers look for work for about a
  millisecond and then sleep, and the blocks are *claimed* one at a time, so a descheduled
  worker delays the product by at most the block it holds, never by a share fixed in advance
  (OpenBLAS's own threads split every GEMM into equal fixed parts and wait for all);
- BLAS is the library NumPy uses (found through threadpoolctl), called through its CBLAS entry
  with pointers and sizes this module derives from NumPy arrays it has checked (dtype, C order,
  strides). Nothing from a model reaches it but array shapes;
- the split is by the shapes only, so a product has the same bits at every thread count.

Call it inside a run of ``parallel=engine`` (the cpu backend sets BLAS to one thread there) or
with BLAS at one thread: at more, every block's call would split again over BLAS's own threads.

:func:`available` says whether the path works here (native kernels build, a CBLAS ``sgemm`` in
NumPy's BLAS, and not in a process forked after the pool started: its threads do not survive
a fork); without it callers use :mod:`ge_native.parallel`'s Python pool. Set
``GE_NATIVE_GEMM=0`` to turn it off.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

from . import native
from .jit import enabled as jit_enabled

_lock = threading.RLock()
_state: dict[str, Any] = {}

#: CBLAS entry points tried in NumPy's BLAS: (symbol of sgemm, of dgemm, integer type)
_SYMBOLS = (
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", ctypes.c_int64),  # NumPy 2 wheels (scipy-openblas, ILP64)
    ("cblas_sgemm64_", "cblas_dgemm64_", ctypes.c_int64),  # openblas64_ builds
    ("cblas_sgemm", "cblas_dgemm", ctypes.c_int),  # LP64 OpenBLAS, MKL, BLIS
)
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

#: Fewer rows than this: NumPy's call (a GEMV for one row; OpenBLAS's sgemm with M=1 runs 9x
#: slower than its sgemv)
MIN_ROWS = 8


def _cblas() -> tuple[Any, Any, Any] | None:
    """NumPy's BLAS ``(sgemm, dgemm, integer type)`` as ctypes functions, or None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    paths = [i["filepath"] for i in threadpool_info() if i.get("user_api") == "blas"]
    paths.sort(key=lambda p: "numpy" not in p)  # NumPy's own first
    for path in paths:
        try:
            # only a library already loaded in this process (NumPy's, which threadpoolctl just
            # listed): RTLD_NOLOAD maps nothing new, so a file put at that path since is never run
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
        except OSError:
            continue
        for s_name, d_name, integer in _SYMBOLS:
            s, d = getattr(lib, s_name, None), getattr(lib, d_name, None)
            if s is None or d is None:
                continue
            for fn, real in ((s, ctypes.c_float), (d, ctypes.c_double)):
                # order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc; pointers
                # travel as 64-bit integers (the same registers as pointers on every 64-bit ABI)
                fn.argtypes = [integer] * 6 + [real, ctypes.c_int64, integer, ctypes.c_int64, integer, real,
                                                 ctypes.c_int64, integer]
                fn.restype = None
            return s, d, integer
    return None


#: the declarations of BLAS's gemm for native kernels; BLASINT is the CBLAS integer type
def blas_decls(integer: Any) -> str:
    """C declarations of the CBLAS gemm function types for NumPy's BLAS (``integer``: its
    ctypes integer type): ``gemm_f32_t``/``gemm_f64_t`` and ``blasint``."""
    bits = "int64_t" if integer is ctypes.c_int64 else "int"
    return (f"#define GE_BLAS_DECLS 1\ntypedef {bits} blasint;\n"
            "typedef void (*gemm_f32_t)(blasint, blasint, blasint, blasint, blasint, blasint, float, const float *,"
            " blasint, const float *, blasint, float, float *, blasint);\n"
            "typedef void (*gemm_f64_t)(blasint, blasint, blasint, blasint, blasint, blasint, double, const double *,"
            " blasint, const double *, blasint, double, double *, blasint);\n")


#: one task per column block: C[:, c:c+w] = A @ B_block (+ bias[c:c+w]); the arguments are
#: (gemm address, A, k, block addresses, ldbs, widths, cols, C, bias, has_bias, threads) with A
#: and C C-contiguous 2-D arrays (checked here: dtype, layout, rows, columns); the block
#: addresses come from matrices the caller checked (:class:`Blocks`)
_BLOCKS_SRC = native.c_source("gemm.c")


def _build() -> dict[str, Any] | None:
    if not jit_enabled("GE_NATIVE_GEMM"):
        return None
    funcs = _cblas()
    if funcs is None:
        return None
    s, d, integer = funcs
    mod = native.build(blas_decls(integer) + _BLOCKS_SRC, ["blocks_f32", "blocks_f64", "rows_f32", "rows_f64",
                                                            "batch_f32", "batch_f64"])
    if mod is None:
        return None
    addr = {"float32": ctypes.cast(s, ctypes.c_void_p).value, "float64": ctypes.cast(d, ctypes.c_void_p).value}
    return {"blocks": {"float32": mod.blocks_f32, "float64": mod.blocks_f64},
            "rows": {"float32": mod.rows_f32, "float64": mod.rows_f64},
            "batch": {"float32": mod.batch_f32, "float64": mod.batch_f64}, "cblas": (s, d), "addr": addr,
            "integer": integer, "pid": os.getpid()}


def _get() -> dict[str, Any] | None:
    st = _state.get("native", False)
    if st is False:
        with _lock:
            st = _state.get("native", False)
            if st is False:
                st = _build()
                _state["native"] = st
    if st is not None and st["pid"] != os.getpid():
        return None  # a forked child: the native pool's threads did not survive the fork
    return st


def available() -> bool:
    """True when split GEMMs run on native threads calling single-threaded BLAS."""
    return _get() is not None


def cblas(dtype: Any) -> Any:
    """NumPy's CBLAS ``sgemm``/``dgemm`` as a ctypes function (``(101 row-major, 111|112,
    111|112, M, N, K, alpha, A ptr, lda, B ptr, ldb, beta, C ptr, ldc)``), or None."""
    st = _get()
    if st is None:
        return None
    return st["cblas"][0 if np.dtype(dtype) == np.float32 else 1]


def cblas_native(dtype: Any) -> tuple[int, Any] | None:
    """For native kernels: (address of NumPy's CBLAS gemm for ``dtype``, its ctypes integer
    type, for :func:`blas_decls`), or None."""
    st = _get()
    if st is None:
        return None
    return st["addr"][np.dtype(dtype).name], st["integer"]


def set_width(width: int) -> int:
    """The number of threads a native parallel loop may use for a run ``width`` wide (at least
    one, at most the machine's CPUs)."""
    return max(1, min(int(width), native.cpu_count()))


class Blocks:
    """Column blocks of a constant ``(k, n)`` matrix, checked once, with the pointer table the
    native kernel reads (the blocks are kept alive by this object)."""

    def __init__(self, blocks: list[np.ndarray], cols: list[int]) -> None:
        dt = blocks[0].dtype
        k = blocks[0].shape[0]
        n = 0
        for b, c in zip(blocks, cols):
            if b.dtype != dt or b.ndim != 2 or not b.flags.c_contiguous or b.shape[0] != k or c != n:
                raise ValueError("blocks must be C-contiguous (k, w) matrices of one dtype, in column order")
            n += b.shape[1]
        self.dtype, self.k, self.n = dt, k, n
        self.blocks = blocks
        self.ptrs = np.array([b.ctypes.data for b in blocks], np.int64)
        self.widths = np.array([b.shape[1] for b in blocks], np.int64)
        self.cols = np.array(cols, np.int64)
        self.no_bias = np.zeros(1, dt)


def run_blocks(prep: Blocks, a2: np.ndarray, out2: np.ndarray, bias: np.ndarray | None, width: int) -> bool:
    """``out2[:, c:c+w] = a2 @ block (+ bias[c:c+w])`` for every block of ``prep``, on ``width``
    threads. Returns False (and does nothing) when this path cannot run these arrays (the
    kernel checks their dtype, C order, rows and columns itself)."""
    st = _get()
    if st is None or a2.shape[0] < MIN_ROWS:
        return False
    kern = st["blocks"].get(prep.dtype.name)
    if kern is None:
        return False
    try:
        kern(st["addr"][prep.dtype.name], a2, prep.k, prep.ptrs, prep.widths, prep.widths, prep.cols, out2,
             bias if bias is not None else prep.no_bias, int(bias is not None), set_width(width))
    except (TypeError, ValueError):
        return False  # not C-contiguous, another dtype or shape: the caller's NumPy path
    return True


def run_cols(a2: np.ndarray, b2: np.ndarray, out2: np.ndarray, cuts: list[tuple[int, int]], width: int) -> bool:
    """``out2 = a2 @ b2`` with the columns cut at ``cuts``, one task per part, on ``width``
    threads (``b2`` is read in place: no packing). False when this path cannot run them."""
    st = _get()
    dt = a2.dtype
    kern = None if st is None else st["blocks"].get(dt.name)
    if st is None or kern is None or b2.dtype != dt or out2.dtype != dt:
        return False
    item = dt.itemsize
    m, k = a2.shape
    n = b2.shape[1]
    if (b2.shape[0] != k or out2.shape != (m, n) or m < MIN_ROWS or not out2.flags.c_contiguous
            or not out2.flags.writeable):
        return False
    for x in (a2, b2):
        if x.strides[1] != item or x.strides[0] % item or x.strides[0] < x.shape[1] * item:
            return False
    if not cuts or cuts[0][0] != 0 or cuts[-1][1] != n or any(lo >= hi for lo, hi in cuts) \
            or any(p[1] != q[0] for p, q in zip(cuts, cuts[1:])):
        return False
    if not (a2.flags.c_contiguous and out2.flags.c_contiguous):
        return False
    cols = np.array([lo for lo, _ in cuts], np.int64)
    widths = np.array([hi - lo for lo, hi in cuts], np.int64)
    ldb = b2.strides[0] // item
    ptrs = b2.ctypes.data + cols * item
    try:
        kern(st["addr"][dt.name], a2, k, ptrs, np.full(len(cuts), ldb, np.int64), widths, cols, out2, np.zeros(1, dt), 0,
             set_width(width))
    except (TypeError, ValueError):
        return False
    return True



def run_rows(a2: np.ndarray, b2: np.ndarray, out2: np.ndarray, cuts: list[tuple[int, int]], width: int,
             bias: np.ndarray | None = None) -> bool:
    """``out2 = a2 @ b2 (+ bias)`` with the rows cut at ``cuts``, one task per part, on ``width``
    threads (``b2`` read whole by every task; the kernel checks the three C-contiguous matrices
    and the cuts). False when this path cannot run them."""
    st = _get()
    kern = None if st is None else st["rows"].get(a2.dtype.name)
    if st is None or kern is None:
        return False
    if not cuts or cuts[0][0] != 0 or cuts[-1][1] != a2.shape[0] or any(p[1] != q[0] for p, q in zip(cuts, cuts[1:])):
        return False
    starts = np.array([lo for lo, _ in cuts], np.int64)
    counts = np.array([hi - lo for lo, hi in cuts], np.int64)
    try:
        kern(st["addr"][a2.dtype.name], a2, b2, out2, bias if bias is not None else np.zeros(1, a2.dtype),
             int(bias is not None), starts, counts, set_width(width))
    except (TypeError, ValueError):
        return False  # not C-contiguous, another dtype, or shapes that disagree: the caller's NumPy path
    return True


def run_batched(a3: np.ndarray, b3: np.ndarray, o3: np.ndarray, width: int) -> bool:
    """``o3[i] = a3[i] @ b3[i]`` for every batch entry, one task each, on ``width`` threads
    (C-contiguous 3-D arrays of one dtype; the kernel checks them). False when this path cannot
    run them."""
    st = _get()
    kern = None if st is None else st["batch"].get(a3.dtype.name)
    if st is None or kern is None:
        return False
    try:
        kern(st["addr"][a3.dtype.name], a3, b3, o3, set_width(width))
    except (TypeError, ValueError):
        return False
    return True
