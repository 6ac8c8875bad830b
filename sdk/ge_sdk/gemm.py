"""GEMMs on GE's thread pool without the GIL: BLAS at one thread, called from numba's threads.

:mod:`ge_sdk.parallel` owns the engine's threading; this module is its fast path for matrix
products. A Python thread pool pays tens of microseconds per job to wake a worker and to learn
that it finished (futexes; more in a VM), which is the whole time of a transformer's small
GEMMs. Here a split GEMM is one call into a numba ``parallel=True`` function whose ``prange``
iterations each call BLAS's own single-threaded ``sgemm``/``dgemm`` on one block of columns:

- numba's thread pool is its OpenMP (or TBB) layer: its workers spin briefly and then sleep,
  and with :func:`numba.set_parallel_chunksize` set to 1 the blocks are *claimed* one at a time,
  so a descheduled worker delays the product by one block, not by a share fixed in advance
  (OpenBLAS's own threads split every GEMM into equal fixed parts and wait for all);
- BLAS is the library NumPy uses (found through threadpoolctl), called through its CBLAS entry
  with pointers and sizes this module derives from NumPy arrays it has checked (dtype, C order,
  strides). Nothing from a model reaches it but array shapes;
- the split is by the shapes only, so a product has the same bits at every thread count.

Call it inside a run of ``parallel=engine`` (the cpu backend sets BLAS to one thread there) or
with BLAS at one thread: at more, every block's call would split again over BLAS's own threads.

:func:`available` says whether the path works here (numba with a thread-safe threading layer,
a CBLAS ``sgemm`` in NumPy's BLAS, and not in a process forked after the pool started: GNU
OpenMP is not fork-safe); without it callers use :mod:`ge_sdk.parallel`'s Python pool.
Set ``GE_NATIVE_GEMM=0`` to turn it off.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

from .jit import numba_if_enabled

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


def _cblas() -> tuple[Any, Any] | None:
    """NumPy's BLAS ``(sgemm, dgemm)`` as ctypes functions, or None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    paths = [i["filepath"] for i in threadpool_info() if i.get("user_api") == "blas"]
    paths.sort(key=lambda p: "numpy" not in p)  # NumPy's own first
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
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
            return s, d
    return None


def _blocks_kernel(fn: Any, scalar: Any, prange: Any):
    """The Python source of the column-block kernel for one CBLAS gemm (numba compiles it;
    ``fn``, the constants and ``prange`` are frozen into the compiled code)."""
    one, zero = scalar(1.0), scalar(0.0)
    item = np.dtype(scalar).itemsize
    row_major, no_trans = _ROW_MAJOR, _NO_TRANS

    def blocks(m, k, a_ptr, lda, b_ptrs, ldbs, widths, cols, out, ldc, bias, has_bias):
        # one task per column block: C[:, c:c+w] = A @ B_block (+ bias[c:c+w])
        for i in prange(b_ptrs.shape[0]):
            c = cols[i]
            w = widths[i]
            fn(row_major, no_trans, no_trans, m, w, k, one, a_ptr, lda, b_ptrs[i], ldbs[i], zero,
               out.ctypes.data + c * item, ldc)
            if has_bias:
                b = bias[c:c + w]
                for r in range(m):
                    out[r, c:c + w] += b

    return blocks


def _build() -> dict[str, Any] | None:
    numba = numba_if_enabled("GE_NATIVE_GEMM")
    if numba is None:
        return None
    funcs = _cblas()
    if funcs is None:
        return None
    try:
        if numba.config.THREADING_LAYER in ("default", "workqueue"):
            # workqueue aborts the process when two threads launch at once (stream executors do)
            numba.config.THREADING_LAYER = "threadsafe"
        from numba import njit, prange
    except Exception:  # noqa: BLE001
        return None
    st = {"numba": numba, "njit": njit, "prange": prange, "blocks": {}, "cblas": funcs, "pid": os.getpid()}
    # float32 now (it proves the threading layer works); float64 on its first product
    kern = _blocks_for(st, "float32")
    if kern is None:
        return None
    try:
        # one empty launch picks the layer; if this process already runs numba's workqueue
        # layer (chosen by other code before us), two threads launching at once would abort it
        z = np.zeros(0, np.int64)
        kern(0, 0, 0, 0, z, z, z, z, np.zeros((0, 0), np.float32), 0, np.zeros(1, np.float32), False)
        if numba.threading_layer() not in ("omp", "tbb"):
            return None
    except Exception:  # noqa: BLE001
        return None
    return st


def _blocks_for(st: dict[str, Any], name: str) -> Any:
    """The column-block kernel for dtype ``name`` (compiled once, under the lock's care of the
    caller or on first use), None when numba refuses it."""
    kern = st["blocks"].get(name)
    if kern is not None or name not in ("float32", "float64"):
        return kern
    numba = st["numba"]
    fn, scalar = (st["cblas"][0], np.float32) if name == "float32" else (st["cblas"][1], np.float64)
    arr2 = numba.types.Array(getattr(numba.types, name), 2, "C")
    arr1 = numba.types.Array(getattr(numba.types, name), 1, "C", readonly=True)
    i64, i64a = numba.types.int64, numba.types.Array(numba.types.int64, 1, "C", readonly=True)
    sig = numba.types.void(i64, i64, i64, i64, i64a, i64a, i64a, i64a, arr2, i64, arr1, numba.types.boolean)
    with _lock:
        kern = st["blocks"].get(name)
        if kern is None:
            try:
                kern = st["njit"](sig, parallel=True, nogil=True, error_model="numpy")(
                    _blocks_kernel(fn, scalar, st["prange"]))
            except Exception:  # noqa: BLE001 - no thread-safe layer (neither OpenMP nor TBB): the Python pool
                return None
            st["blocks"][name] = kern
    return kern


def _get() -> dict[str, Any] | None:
    st = _state.get("native", False)
    if st is False:
        with _lock:
            st = _state.get("native", False)
            if st is False:
                st = _build()
                _state["native"] = st
    if st is not None and st["pid"] != os.getpid():
        return None  # a forked child: GNU OpenMP's threads did not survive the fork
    return st


def available() -> bool:
    """True when split GEMMs run on numba's threads calling single-threaded BLAS."""
    return _get() is not None


def cblas(dtype: Any) -> Any:
    """NumPy's CBLAS ``sgemm``/``dgemm`` (a ctypes function numba kernels may call with
    ``(101 row-major, 111|112, 111|112, M, N, K, alpha, A ptr, lda, B ptr, ldb, beta, C ptr,
    ldc)``), or None."""
    st = _get()
    if st is None:
        return None
    return st["cblas"][0 if np.dtype(dtype) == np.float32 else 1]


def set_width(width: int) -> int:
    """Let numba's parallel kernels launched from this thread use ``width`` threads (at most
    numba's pool size), claiming their iterations one at a time; returns the width set
    (``numba.get_thread_id()`` in those kernels is below it)."""
    st = _get()
    if st is None:
        return 1
    numba = st["numba"]
    w = max(1, min(int(width), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(w)
    numba.set_parallel_chunksize(1)
    return w


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
    threads. Returns False (and does nothing) when this path cannot run these arrays."""
    st = _get()
    dt = prep.dtype
    kern = None if st is None else _blocks_for(st, dt.name)
    if kern is None:
        return False
    item = dt.itemsize
    m, k = a2.shape
    if (a2.dtype != dt or k != prep.k or a2.strides[1] != item or a2.strides[0] % item or a2.strides[0] < k * item
            or not out2.flags.c_contiguous or not out2.flags.writeable or out2.dtype != dt
            or out2.shape != (m, prep.n)
            or (bias is not None and (bias.dtype != dt or bias.shape != (prep.n,) or not bias.flags.c_contiguous))):
        return False
    if m < MIN_ROWS:
        return False
    set_width(width)
    kern(m, k, a2.ctypes.data, a2.strides[0] // item, prep.ptrs, prep.widths, prep.widths,
                          prep.cols, out2, prep.n, bias if bias is not None else prep.no_bias, bias is not None)
    return True


def run_cols(a2: np.ndarray, b2: np.ndarray, out2: np.ndarray, cuts: list[tuple[int, int]], width: int) -> bool:
    """``out2 = a2 @ b2`` with the columns cut at ``cuts``, one task per part, on ``width``
    threads (``b2`` is read in place: no packing). False when this path cannot run them."""
    st = _get()
    dt = a2.dtype
    kern = None if st is None else _blocks_for(st, dt.name)
    if kern is None or b2.dtype != dt or out2.dtype != dt:
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
    set_width(width)
    cols = np.array([lo for lo, _ in cuts], np.int64)
    widths = np.array([hi - lo for lo, hi in cuts], np.int64)
    ldb = b2.strides[0] // item
    ptrs = b2.ctypes.data + cols * item
    kern(m, k, a2.ctypes.data, a2.strides[0] // item, ptrs, np.full(len(cuts), ldb, np.int64),
                          widths, cols, out2, n, np.zeros(1, dt), False)
    return True

