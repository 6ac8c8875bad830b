"""BLAS threads: every run of every cpu executor executes at one definite BLAS thread count.

The count is the ``threads`` option, else the process's count outside runs. It is process-wide,
so runs that need different counts never overlap, and nothing inside a run (stream worker
threads, nested runs) changes it: a model gives the same bits whichever thread calls ``run``.
The policy is :class:`BlasThreads` (one instance, :data:`BLAS`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator
from typing import Any

from ge_core.kernel import check_deadline

#: A run waiting for runs at another BLAS count checks its deadline this often (seconds).
WAIT_SLICE_S = 0.05

#: The baseline count comes back this long after the last run ended (seconds), unless another
#: run starts first. Setting OpenBLAS back to several threads after every run woke its workers,
#: whose spinning then slowed GE's own pool in the next run by 15% (GPT-2, two cores).
LINGER_S = 0.2

#: The count a run executes at: one entry per BLAS library (None outside a run). A context
#: variable, so the worker threads of the stream executors (which run in a copy of the caller's
#: context) and nested runs see their run's count and never change it.
_run_blas: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar("ge_run_blas", default=None)


class BlasThreads:
    """The BLAS thread count every run executes at: the policy, in one object (:data:`BLAS`).

    A BLAS library keeps one thread count per process (OpenBLAS built with pthreads, as bundled
    with NumPy; MKL; BLIS), and how a GEMM splits its work over those threads changes the
    rounding of its result (1 and 2 threads differ by an ulp). So that a model gives the same
    bits whichever thread calls ``run``, alone or concurrently, and every executor (sequential,
    arena, sink, streams) agrees, each run executes at one definite count:

    * the model's ``threads`` option when it is set, else the *baseline*: what the libraries
      report while no run is active (``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``, the core
      count, or what the process set with threadpoolctl outside runs);
    * runs that need the same count overlap freely; a run that needs another count waits until
      the active runs have ended (runs queued behind it wait too, so it is not starved), then
      sets the count once, process-wide, under this object's lock, from whichever thread it was
      called on; the baseline comes back :data:`LINGER_S` after the last active run ended
      (at once with :meth:`BlasThreads.settle`), so back-to-back runs do not flip it each time;
    * nothing changes the count inside a run: a stream executor's worker threads, subgraph
      bodies and nested runs (a kernel that runs another model) execute at their run's count.
      A kernel that runs a model on a thread of its own runs it in a copy of its context
      (``contextvars.copy_context().run``), as the stream executors do; otherwise that run is a
      new one, and waits for the outer run to end if it needs another count.

    threadpoolctl (3.8+) ignores every thread but the first that set OpenBLAS's count; this
    object lifts that rule while it sets the count (``clear_controlling_thread``). Changing the
    count from outside while a run is active is outside this promise.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._libs: list[Any] | None = None  # threadpoolctl controllers of the BLAS libraries
        self._active = 0  # runs executing now
        self._counts: tuple[int, ...] = ()  # the count they execute at
        self._baseline: tuple[int, ...] = ()  # the count outside runs, read when the first one starts
        self._queued = 0  # runs waiting for another count
        self._applied: tuple[int, ...] | None = None  # counts set by this object and not yet restored
        self._restore_at: float | None = None  # when the baseline comes back (no run active)
        self._restorer: threading.Thread | None = None
        self._restorer_idle = False  # the restorer waits for a notify (no deadline set)

    # -- the libraries --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Look the loaded BLAS libraries up again (at build time: a library loaded since, such
        as SciPy's own OpenBLAS, is governed from then on). Deferred while runs are active."""
        with self._cond:
            if self._active == 0:
                self._libs = None

    def _controllers(self) -> list[Any]:
        if self._libs is None:
            try:
                from threadpoolctl import ThreadpoolController

                libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
            except Exception:  # noqa: BLE001 - no threadpoolctl, or no BLAS it knows: nothing to govern
                libs = []
            self._libs = libs
        return self._libs

    def _read(self, libs) -> tuple[int, ...]:
        out = []
        for lib in libs:
            try:
                n = int(lib.get_num_threads() or 0)
            except Exception:  # noqa: BLE001
                n = 0
            out.append(n)
        return tuple(out)

    def _apply(self, libs, counts: tuple[int, ...]) -> None:
        for lib, n in zip(libs, counts):
            if n <= 0:
                continue
            clear = getattr(type(lib), "clear_controlling_thread", None)
            try:
                if clear is not None:
                    clear(force=True)  # threadpoolctl: let this thread set the process-wide count
                lib.set_num_threads(n)
            except Exception:  # noqa: BLE001 - a library that refuses keeps its count (for every run alike)
                pass
            finally:
                if clear is not None:
                    clear(force=True)

    # -- runs ---------------------------------------------------------------------------------
    def current(self) -> tuple[int, ...] | None:
        """The counts the current run executes at (one per library), None outside a run."""
        return _run_blas.get()

    def baseline(self) -> tuple[int, ...]:
        """The libraries' counts as a run without ``threads`` would see them now."""
        with self._cond:
            return self._baseline if (self._active or self._applied is not None) else self._read(self._controllers())

    @contextlib.contextmanager
    def run(self, threads: int | None = None) -> Iterator[tuple[int, ...]]:
        """Execute the block as one run at ``threads`` BLAS threads (None: the baseline)."""
        inside = _run_blas.get()
        if inside is not None:  # nested run, or a worker thread of this run: keep its count
            yield inside
            return
        cond = self._cond
        with cond:
            libs = self._controllers()
            want = None if threads is None else tuple(int(threads) for _ in libs)
            queued = False
            try:
                while self._active and ((want or self._baseline) != self._counts or (self._queued and not queued)):
                    if not queued and (want or self._baseline) != self._counts:
                        queued = True
                        self._queued += 1
                    cond.wait(WAIT_SLICE_S)
                    check_deadline("(waiting for runs at another BLAS thread count)")  # run(timeout=) holds here too
            finally:
                if queued:
                    self._queued -= 1
            if self._active == 0:
                if self._applied is not None and self._read(libs) != self._applied:
                    self._applied = None  # changed from outside while it lingered: that is the baseline now
                if self._applied is None:
                    self._baseline = self._read(libs)
                self._restore_at = None  # a lingering count: the baseline read before it still holds
                self._counts = want or self._baseline
                if self._counts != (self._applied or self._baseline):
                    self._apply(libs, self._counts)
                self._applied = None if self._counts == self._baseline else self._counts
            self._active += 1
            counts = self._counts
        token = _run_blas.set(counts)
        try:
            yield counts
        finally:
            _run_blas.reset(token)
            with cond:
                self._active -= 1
                if self._active == 0:
                    if self._applied is not None:
                        self._restore_at = time.monotonic() + LINGER_S
                        self._start_restorer()
                    # wake only who waits: runs queued for another count, and the restorer when it
                    # waits without a deadline (waiting for an earlier one, it finds this one when
                    # it wakes). A wake-up at every run's end cost a decode step a thread switch:
                    # 4-6 ms on a busy machine.
                    if self._queued or self._restorer_idle:
                        cond.notify_all()

    def settle(self) -> None:
        """Restore the baseline count now if no run is active (instead of :data:`LINGER_S`
        after the last one)."""
        with self._cond:
            if self._active == 0 and self._applied is not None:
                if self._read(self._controllers()) == self._applied:
                    self._apply(self._controllers(), self._baseline)
                self._applied = None
                self._restore_at = None

    def _start_restorer(self) -> None:
        if self._restorer is None or not self._restorer.is_alive():
            self._restorer = threading.Thread(target=self._restore_loop, name="ge-blas-restore", daemon=True)
            self._restorer.start()

    def _restore_loop(self) -> None:
        cond = self._cond
        with cond:
            while True:
                if self._restore_at is None:
                    self._restorer_idle = True
                    try:
                        cond.wait()
                    finally:
                        self._restorer_idle = False
                    continue
                left = self._restore_at - time.monotonic()
                if left > 0:
                    cond.wait(left)
                    continue
                if self._active == 0 and self._applied is not None:
                    if self._read(self._controllers()) == self._applied:  # else changed from outside: keep it
                        self._apply(self._controllers(), self._baseline)
                    self._applied = None
                self._restore_at = None


#: The process's BLAS thread policy (see :class:`BlasThreads`).
BLAS = BlasThreads()


def blas_threads(threads: int | None = None):
    """``with blas_threads(n):`` runs the block as one run at ``n`` BLAS threads (see :data:`BLAS`)."""
    return BLAS.run(threads)


#: values of the ``parallel`` option, and its default. ``engine``: BLAS at one thread, GE's
#: pool (ge_native.parallel) ``threads`` wide: beside a busy process a 2-thread run stays at
#: 0.94x its 1-thread time where BLAS's threads fall to 0.27x (bench/transformer_models.py
#: --busy --ge-blas), and on an idle machine the two are within the bench's noise. ``blas``:
#: BLAS's own threads (this module's policy), no native kernels to compile on the first run.
PARALLEL = ("engine", "blas")
DEFAULT_PARALLEL = "engine"


def parallel_mode(options) -> str:
    """The ``parallel`` option's value, checked (an OptionError names it and its values)."""
    from ge_core.errors import OptionError

    mode = str(options.getoption("parallel", DEFAULT_PARALLEL) or DEFAULT_PARALLEL).lower()
    if mode not in PARALLEL:
        raise OptionError(f"option parallel: '{mode}' is not one of {', '.join(PARALLEL)}",
                          hint="parallel=engine (GE's thread pool, the default) or parallel=blas (BLAS's threads)")
    return mode


def engine_width(options) -> int:
    """How many threads GE's pool (:mod:`ge_native.parallel`) gives each run of a model compiled
    with ``options``: 1 with ``parallel=blas``; else the ``threads`` option, or without it as
    many as BLAS would use outside runs (the cores by default). Kernels read it at build time
    (``spec.options["parallel_width"]``) to decide whether to cut their work into tasks."""
    if parallel_mode(options) == "blas":
        return 1
    threads = options.getoption("threads")
    if threads:
        return max(1, int(threads))
    base = [n for n in BLAS.baseline() if n > 0]
    return base[0] if base else 1
