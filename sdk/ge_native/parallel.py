"""The engine's thread pool: one per process, shared by every kernel that splits its work.

OpenBLAS splits each GEMM into as many equal parts as it has threads, waits for all of them and
spins between calls, so a descheduled worker stalls the whole GEMM. During a run BLAS therefore
executes at one thread and the kernels split their own work here:

- :func:`parallel_for` runs ``fn(i)`` for ``i in range(n)``; the caller and the pool workers
  *claim* tasks one at a time, so a late worker delays the run by at most the task it holds;
- :func:`chunks` cuts a dimension into tasks by its size alone, and :func:`matmul` and
  :class:`PackedWeight` split a GEMM that way: a result has the same bits at every width above
  one (a one-thread run makes NumPy's single call);
- :mod:`ge_native.gemm` runs split GEMMs on the native pool without the GIL; this module's
  Python pool serves everything else and is the fallback;
- :func:`use_threads` sets the width of the current run (a context variable); outside a run
  the width is 1 and everything runs inline.

A task runs on a pool thread: kernels that split work must release the GIL inside each task, or
the split gains nothing. A task that calls :func:`parallel_for` itself runs its inner tasks
inline. Plugin authors' kernels may use all of this; docs/native.md says more.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import native

#: Most threads a run may use (also bounds GE's pool).
MAX_THREADS = 64

_width: contextvars.ContextVar[int] = contextvars.ContextVar("ge_parallel_width", default=1)
_local = threading.local()


def threads() -> int:
    """The number of threads the current run may use (1 outside a run)."""
    return _width.get()


def native_width() -> int:
    """The threads a native kernel may split its work over now: the run's width, 1 on a pool
    thread (a task of a split job runs inline)."""
    return 1 if _in_forked_or_pool() else _width.get()


def planned_width(spec: Any) -> int:
    """The pool width a kernel built from ``spec`` (a KernelSpec) will run at: the backend
    puts it in ``spec.options["parallel_width"]`` (1 when absent). Kernels that cut their
    operands at build time (:class:`PackedWeight`) do so only when it is above one. Above one,
    the native GEMM driver (:mod:`ge_native.gemm`) is built now (once per process; from the kernel
    cache after the first time on this machine), so a model's first run compiles nothing."""
    try:
        width = max(1, int((getattr(spec, "options", None) or {}).get("parallel_width", 1) or 1))
    except (TypeError, ValueError):
        return 1
    if width > 1:
        prepare_native()
    return width


def prepare_native() -> None:
    """Build the native split-GEMM driver (:mod:`ge_native.gemm`) now, for a model built to run
    wider than one thread (once per process; from the kernel cache after the first time)."""
    if not _in_forked_or_pool():
        from . import gemm

        gemm.available()


@contextlib.contextmanager
def use_threads(n: int | None) -> Iterator[int]:
    """Run the block with ``n`` threads (None or < 1: 1; more than the cores: the cores)."""
    width = max(1, min(int(n or 1), MAX_THREADS, native.cpu_count()))
    token = _width.set(width)
    try:
        yield width
    finally:
        _width.reset(token)


class _Job:
    __slots__ = ("fn", "n", "claim", "left", "done", "error", "lock")

    def __init__(self, fn: Callable[[int], Any], n: int) -> None:
        self.fn = fn
        self.n = n
        self.claim = itertools.count()  # next() is atomic under the GIL
        self.left = n
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        while True:
            i = next(self.claim)
            if i >= self.n:
                return
            try:
                if self.error is None:
                    self.fn(i)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
                self.error = self.error or e
            finally:
                with self.lock:
                    self.left -= 1
                    if self.left == 0:
                        self.done.set()


class _Pool:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _ensure(self, n: int) -> None:
        if self._pid != os.getpid():  # a forked child has none of the parent's threads
            self.__init__()  # type: ignore[misc]
        if len(self._workers) >= n:
            return
        with self._lock:
            while len(self._workers) < n:
                t = threading.Thread(target=self._serve, name=f"ge-pool-{len(self._workers)}", daemon=True)
                t.start()
                self._workers.append(t)

    def _serve(self) -> None:
        _local.in_pool = True
        while True:
            self._jobs.get().work()

    def run(self, n: int, fn: Callable[[int], Any], width: int) -> None:
        helpers = min(width - 1, n - 1)
        self._ensure(helpers)
        job = _Job(fn, n)
        for _ in range(helpers):
            self._jobs.put(job)
        _local.in_pool = True  # tasks the caller runs do not split again
        try:
            job.work()
        finally:
            _local.in_pool = False
        job.done.wait()
        if job.error is not None:
            raise job.error


_POOL = _Pool()


def _in_forked_or_pool() -> bool:
    """True on a pool thread (a task of a split job: run inline)."""
    return bool(getattr(_local, "in_pool", False))


def parallel_for(n: int, fn: Callable[[int], Any]) -> None:
    """Call ``fn(i)`` for every ``i in range(n)``, on up to :func:`threads` threads (the caller
    is one of them). Returns when all have returned; the first exception is raised here (the
    remaining tasks are skipped)."""
    width = _width.get()
    if n <= 1 or width <= 1 or getattr(_local, "in_pool", False):
        for i in range(n):
            fn(i)
        return
    _POOL.run(n, fn, width)


def chunks(size: int, cost_per_item: float, *, min_cost: float = 2.0e5, align: int = 1,
           most: int = 32, even: bool = False) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` cutting ``range(size)`` into parts of about ``min_cost`` or more
    (``cost_per_item`` each; any unit, the same as ``min_cost``), each a multiple of ``align``
    but the last, at most ``most`` of them; ``even``: an even number of parts where there are
    several (two threads then share them equally). Depends on the sizes only, never on the
    thread count, so a split computation has the same bits at every thread count."""
    if size <= 0:
        return []
    limit = -(-size // max(align, 1))
    parts = int(min(most, max(1, (size * cost_per_item) // max(min_cost, 1e-9)), limit))
    if even and parts > 1 and parts % 2 and parts + 1 <= min(most, limit):
        parts += 1
    if parts <= 1:
        return [(0, size)]
    step = -(-size // parts)
    step = -(-step // align) * align
    return [(lo, min(size, lo + step)) for lo in range(0, size, step)]


#: A GEMM task is at least this many multiply-adds (a few tens of microseconds at one core's
#: speed, so the per-task cost of a few microseconds stays small).
GEMM_TASK_MACS = 3_000_000


@functools.lru_cache(maxsize=1024)
def gemm_parts(m: int, k: int, n: int) -> tuple[str, list[tuple[int, int]]]:
    """How :func:`matmul` splits an ``(m, k) @ (k, n)`` GEMM: ``("n", column ranges)``,
    ``("m", row ranges)`` or ``("", [])`` (one call). Sizes only: the same at every width."""
    macs = m * k * n
    if macs < 2 * GEMM_TASK_MACS:
        return "", []
    if n >= m:
        return "n", chunks(n, m * k, min_cost=GEMM_TASK_MACS, align=32, most=8, even=True)
    return "m", chunks(m, n * k, min_cost=GEMM_TASK_MACS, align=8, most=8, even=True)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)``, split over the pool when the run is wider than one thread
    (the same way at every width above one: one thread runs NumPy's single call).

    ``(..., m, k) @ (k, n)`` with ``a`` contiguous is one ``(prod(...) * m, k)`` GEMM cut by
    :func:`gemm_parts`, ``(m, k) @ (batch, k, n)`` one such GEMM per batch entry;
    ``(b, m, k) @ (b, k, n)`` (equal batch dims) runs its matrices as tasks
    when each is large enough; anything else is plain ``np.matmul``. ``out`` must not overlap
    ``a`` or ``b``."""
    if _width.get() <= 1 or a.dtype != b.dtype or a.dtype.kind != "f" or a.ndim < 2 or b.ndim < 2:
        if b.ndim == 2 and a.ndim > 2 and a.shape[-1] == b.shape[0] and a.dtype == b.dtype and a.dtype.kind == "f":
            # (..., m, k) @ (k, n) as ONE (rows, k) GEMM: NumPy would loop over the leading dims, and
            # on a strided view (a transposed activation) leave BLAS for its own slow loops (5x)
            shape = a.shape[:-1] + (b.shape[1],)
            a2 = a.reshape(-1, a.shape[-1])  # a copy when a is a strided view: one pass
            if out is not None and out.shape == shape and out.flags.c_contiguous:
                np.matmul(a2, b, out=out.reshape(-1, b.shape[1]))
                return out
            if out is None:
                return np.matmul(a2, b).reshape(shape)
        return np.matmul(a, b, out=out)
    if b.ndim == 2:
        k, n = b.shape
        if a.ndim > 2:
            if not a.flags.c_contiguous or a.shape[-1] != k:
                return np.matmul(a, b, out=out)
            shape = a.shape[:-1] + (n,)
            if out is not None and (out.shape != shape or not out.flags.c_contiguous):
                return np.matmul(a, b, out=out)
            res = out if out is not None else np.empty(shape, a.dtype)
            _gemm(a.reshape(-1, k), b, res.reshape(-1, n))
            return res
        if a.shape[1] != k:
            return np.matmul(a, b, out=out)
        res = out if out is not None else np.empty((a.shape[0], n), a.dtype)
        if res.shape != (a.shape[0], n):
            return np.matmul(a, b, out=out)
        _gemm(a, b, res)
        return res
    if a.ndim == 2 and b.ndim == 3 and a.shape[1] == b.shape[1]:
        # (m, k) @ (batch, k, n): a convolution's weights times its column matrices
        shape = (b.shape[0], a.shape[0], b.shape[2])
        res = out if out is not None else np.empty(shape, a.dtype)
        if res.shape != shape:
            return np.matmul(a, b, out=out)
        for i in range(shape[0]):
            _gemm(a, b[i], res[i])
        return res
    if a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        return np.matmul(a, b, out=out)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = int(np.prod(a.shape[:-2]))
    if batch < 2 or m * k * n < GEMM_TASK_MACS // 4:
        return np.matmul(a, b, out=out)
    shape = a.shape[:-1] + (n,)
    res = out if out is not None else np.empty(shape, a.dtype)
    if res.shape != shape or not res.flags.c_contiguous:
        return np.matmul(a, b, out=out)
    a3, b3, o3 = a.reshape(batch, m, k), b.reshape(batch, k, n), res.reshape(batch, m, n)
    if not _in_forked_or_pool() and a3.dtype.kind == "f":
        from . import gemm

        if gemm.available() and gemm.run_batched(a3, b3, o3, _width.get()):
            return res
    parallel_for(batch, lambda i: np.matmul(a3[i], b3[i], out=o3[i]))
    return res


def _gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    m, k = a.shape
    n = b.shape[1]
    width = _width.get()
    axis, parts = gemm_parts(m, k, n) if width > 1 else ("", [])
    if len(parts) <= 1 or _in_forked_or_pool():
        np.matmul(a, b, out=out)
        return
    from . import gemm

    if gemm.available() and (gemm.run_cols(a, b, out, parts, width) if axis == "n"
                             else gemm.run_rows(a, b, out, parts, width)):
        return
    if axis == "n":
        parallel_for(len(parts), lambda i: np.matmul(a, b[:, parts[i][0]:parts[i][1]],
                                                     out=out[:, parts[i][0]:parts[i][1]]))
    else:
        parallel_for(len(parts), lambda i: np.matmul(a[parts[i][0]:parts[i][1]], b,
                                                     out=out[parts[i][0]:parts[i][1]]))


class PackedWeight:
    """A constant ``(k, n)`` GEMM operand prepared at build time for split products: cut into
    contiguous column blocks, one task each (each block's output columns written in place and
    its bias added while they are in cache), or, when the product has many more rows than
    columns, kept whole with the rows of ``a`` split into tasks. The cuts depend on the shapes
    only (``rows``: the rows of ``a`` expected, for sizing; row cuts follow the actual rows), so
    results have the same bits at every thread count above one."""

    #: multiply-adds per task (with ``rows`` rows of ``a``) the cut aims at, and the most tasks:
    #: four contiguous blocks run as fast as the whole matrix on one thread and let two to four
    #: threads share the product, claiming tasks as they come free (an even count of them)
    BLOCK_MACS = 2_000_000
    MOST_BLOCKS = 4

    def __init__(self, w: np.ndarray, rows: int | None = None) -> None:
        if w.ndim != 2:
            raise ValueError(f"PackedWeight takes a 2-D matrix, not shape {w.shape}")
        self.k, self.n = w.shape
        self.dtype = w.dtype
        m = rows if rows and rows > 0 else 128
        #: "rows": the matrix is one block and the rows of ``a`` are split (tall products)
        self.split = "rows" if m >= 2 * self.n else "cols"
        if self.split == "rows":
            self.cuts = [(0, self.n)]
        else:
            self.cuts = chunks(self.n, m * self.k, min_cost=self.BLOCK_MACS, align=16, most=self.MOST_BLOCKS,
                               even=True)
            if len(self.cuts) <= 1:
                self.cuts = [(0, self.n)]
        # the blocks replace the matrix (no second copy is kept)
        self.blocks = [np.ascontiguousarray(w[:, lo:hi]) for lo, hi in self.cuts]
        self._native: Any = None  # ge_native.gemm.Blocks, made on first use

    def row_cuts(self, m: int) -> list[tuple[int, int]]:
        """The row tasks of a product with ``m`` rows (the "rows" split)."""
        return _row_cuts(m, self.n * self.k, self.BLOCK_MACS, self.MOST_BLOCKS)

    @property
    def whole(self) -> np.ndarray:
        """The matrix itself (one block: that block; else assembled, a new array)."""
        return self.blocks[0] if len(self.blocks) == 1 else np.concatenate(self.blocks, axis=1)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)

    def matmul(self, a: np.ndarray, out: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
        """``a @ W (+ bias)`` for ``a`` of shape ``(..., k)``; ``bias`` broadcasts along the rows
        (shape ``(n,)``, or None). ``out``: ``(..., n)`` and C-contiguous, or None."""
        shape = a.shape[:-1] + (self.n,)
        if a.dtype != self.dtype or a.shape[-1] != self.k or (bias is not None and bias.shape != (self.n,)):
            raise ValueError(f"PackedWeight {self.shape} {self.dtype}: operand {a.shape} {a.dtype}"
                             f"{'' if bias is None else f', bias {bias.shape}'} does not fit")
        res = out if out is not None and out.shape == shape and out.flags.c_contiguous else np.empty(shape, a.dtype)
        a2 = a.reshape(-1, self.k)
        o2 = res.reshape(-1, self.n)
        cuts, blocks = self.cuts, self.blocks
        native: Callable[[Any], bool]
        if self.split == "rows":
            parts = self.row_cuts(a2.shape[0])

            def native(g: Any) -> bool:
                return len(parts) > 1 and g.run_rows(a2, blocks[0], o2, parts, _width.get(), bias)

            def task(i: int) -> None:
                lo, hi = parts[i]
                np.matmul(a2[lo:hi], blocks[0], out=o2[lo:hi])
                if bias is not None:
                    o2[lo:hi] += bias
        else:
            parts = cuts

            def native(g: Any) -> bool:
                if self._native is None:
                    self._native = g.Blocks(blocks, [lo for lo, _ in cuts])
                return g.run_blocks(self._native, a2, o2, bias, _width.get())

            def task(i: int) -> None:
                lo, hi = cuts[i]
                o = o2[:, lo:hi] if len(cuts) > 1 else o2
                np.matmul(a2, blocks[i], out=o)
                if bias is not None:
                    o += bias[lo:hi]

        ran = False
        if self.dtype.kind == "f" and not _in_forked_or_pool():
            from . import gemm

            ran = gemm.available() and native(gemm)
        if not ran:
            parallel_for(len(parts), task)
        if out is not None and res is not out:
            np.copyto(out, res)
            return out
        return res


@functools.lru_cache(maxsize=1024)
def _row_cuts(m: int, cost: int, min_cost: int, most: int) -> list[tuple[int, int]]:
    return chunks(m, cost, min_cost=min_cost, align=8, most=most, even=True)


def pack_for(spec: Any, w: np.ndarray | None, c: np.ndarray | None = None) -> tuple[PackedWeight | None, np.ndarray | None]:
    """For a GEMM kernel built from ``spec`` (a KernelSpec whose input 0 is ``a``) with constant
    weight ``w`` (already transposed and scaled to ``(k, n)``) and constant addend ``c``: the
    packed weight, None when the kernel will run one thread wide (:func:`planned_width`) or
    ``w`` is not a 2-D float matrix; and ``c`` as a bias row of ``n`` when it is one, else None
    (a packed GEMM adds only a bias row)."""
    if w is None or w.ndim != 2 or w.dtype.kind != "f" or planned_width(spec) <= 1:
        return None, None
    t = spec.inputs[0] if getattr(spec, "inputs", None) else None
    shape = getattr(t, "shape", None)
    rows = None
    if shape and all(isinstance(d, int) for d in shape):
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    packed = PackedWeight(w, rows=rows)
    bias = None
    if c is not None and c.dtype == packed.dtype and c.size == packed.n and c.ndim >= 1 and c.shape[-1] == packed.n:
        bias = np.ascontiguousarray(c.reshape(packed.n))
    return packed, bias

