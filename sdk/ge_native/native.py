"""Native kernels: C that a generator wrote, compiled once per machine and kept in the user's cache.

A plugin's hot loops (ge_fusion's fused elementwise groups and row kernels, the column-block
GEMM driver, attention) are C source written by their generators from validated tokens only
(:func:`check_c`, like :mod:`ge_native.gensrc` for Python). :func:`build` turns such a source into
a CPython extension module: it compiles it with the machine's C compiler the first time and
loads it from the cache afterwards, so a new process starts without compiling anything (and
without importing numba). A call into such a module costs about 0.03 us, and every entry
checks its arrays (type, dtype, contiguity, writability, size against what the loop touches)
before it runs, so a wrong call raises instead of touching memory it does not own.

The cache is the user's own folder (:mod:`ge_core.cache`: ``$GE_CACHE_DIR``, else
``$XDG_CACHE_HOME/ge-python``, else ``~/.cache/ge-python``, mode 0700). An entry is
``ge_<key>.so`` with ``ge_<key>.sum`` (the SHA-256 of the ``.so``) and ``ge_<key>.c`` (its
source, for reading). The key hashes the source and the prelude compiled before it, the compiler (path, size, modification time), the flags,
the Python ABI, NumPy's version and the CPU's feature flags, so another compiler, interpreter or
CPU never loads an entry built for a different one. Before an entry is loaded its folder (and
every folder above it, checked again for every build) and files must be owned by this user and
writable by nobody else, and the ``.so`` must hash to its ``.sum``; an entry that fails any
check is ignored and rebuilt (a folder that fails them is not used at all: the process builds
into a private temporary folder). What is loaded is exactly the bytes that were checked (or
just built): read once through a descriptor and loaded from a sealed in-memory copy
(:func:`_load`), so a file swapped in after the check or the build is never what runs. A model
file never carries native code: only the user's own cache folder is trusted (docs/security.md).

``GE_NATIVE=0`` turns native kernels off (the callers' NumPy forms run); ``GE_CC`` (or ``CC``)
names the compiler.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from types import ModuleType
from typing import Any

from ge_core.cache import cache_dir, enabled, entry_ok, note_write, read_data, read_entry, read_private, write_data

#: bumped when the prelude or the calling convention changes (old entries are then unused)
ABI = 1
_lock = threading.RLock()
_modules: dict[str, ModuleType | None] = {}
_stats = {"compiled": 0, "cached": 0, "rebuilt": 0, "failed": 0, "compile_s": 0.0, "load_s": 0.0}
_state: dict[Any, Any] = {}


class NativeSourceError(ValueError):
    """Generated C contains a token its generator did not declare (never compiled)."""


def aligned(a: Any, alignment: int = 64) -> Any:
    """A C-contiguous copy of array ``a`` whose data starts on an ``alignment``-byte boundary (a
    cache line by default). NumPy aligns its buffers to 16 bytes only; a packed weight the vector
    kernels stream a register at a time then splits a load across two lines in half its reads
    (the AVX2 blocked convolution: 72-78 GFLOP/s off a line, 76-88 on one)."""
    import numpy as np

    a = np.asarray(a)
    raw = np.empty(a.nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def stats() -> dict[str, float]:
    """Modules compiled in this process, loaded from the cache, rebuilt because an entry failed
    its checks, failed to compile; seconds compiling and loading."""
    return dict(_stats)


def compiler() -> str | None:
    """The C compiler's path (``GE_CC``, ``CC``, else ``cc`` or ``gcc`` on PATH), or None."""
    want = os.environ.get("GE_CC") or os.environ.get("CC") or ""
    key = ("cc", want)
    if key not in _state:
        found = None
        for cand in ([want] if want else ["cc", "gcc"]):
            path = shutil.which(cand.split()[0]) if cand else None
            if path:
                found = os.path.realpath(path)
                break
        _state[key] = found
    return _state[key]


def available() -> bool:
    """True when native kernels may be built here: enabled, a C compiler and the Python and
    NumPy headers present."""
    return enabled() and compiler() is not None and _includes() is not None


def _includes() -> list[str] | None:
    if "inc" not in _state:
        import sysconfig

        import numpy as np

        paths = [sysconfig.get_paths().get("include") or "", np.get_include()]
        ok = all(os.path.isfile(os.path.join(p, h)) for p, h in zip(paths, ("Python.h", "numpy/ndarraytypes.h")))
        _state["inc"] = paths if ok else None
    return _state["inc"]


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as Linux lists them (``/proc/cpuinfo``'s ``flags``, or ``Features``
    on ARM: ``avx2``, ``fma``, ``avx512f``, ``avx512_vnni`` ...); None where there is no such file."""
    if "flags" not in _state:
        flags = None
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith(("flags", "Features")):
                        flags = frozenset(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        _state["flags"] = flags
    return _state["flags"]


def _cpu_flags() -> str:
    if "cpu" not in _state:
        import platform

        flags = " ".join(sorted(cpu_flags() or ()))
        _state["cpu"] = f"{platform.machine()}|{platform.processor()}|{flags}"
    return _state["cpu"]


def _compiler_id(cc: str) -> str:
    st = os.stat(cc)
    return f"{cc}|{st.st_size}|{st.st_mtime_ns}"


def _flags() -> list[str]:
    # OpenMP only for its simd pragmas: threads come from the native pool (below). No trapping
    # math: nothing here reads the floating-point exception flags, and without it GCC keeps a
    # branch for each select of a comparison that could raise one (the prelude's exp32/erf32/
    # tanh32 are all selects), so on AVX2, which has no masked ops to hide them, none of the
    # generated transcendental loops vectorised (the results are the same bits: IEEE semantics,
    # NaN and inf included, are kept; only speculation and if-conversion are allowed)
    flags = ["-O3", "-march=native", "-fPIC", "-shared", "-std=c11", "-fno-math-errno", "-fno-trapping-math",
             "-ffp-contract=off", "-fopenmp-simd", "-fvisibility=hidden"]
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]
    return flags


def key_for(source: str) -> str | None:
    """The cache key of ``source`` on this machine (None when native kernels are unavailable)."""
    if not available():
        return None
    cc = compiler()
    assert cc is not None
    import numpy as np

    # the prelude is compiled into every module: a change to it (an upgrade of this package)
    # must not load modules built from the old one
    parts = [str(ABI), PRELUDE, source, _compiler_id(cc), " ".join(_flags()), sys.implementation.cache_tag or "",
             sys.version, np.__version__, _cpu_flags()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def cached(source: str) -> bool:
    """Whether ``source``'s module is in the cache and passes the checks (nothing is built)."""
    key = key_for(source)
    if key is None:
        return False
    d = cache_dir()
    return entry_ok(os.path.join(d, f"ge_{key}.so"), os.path.join(d, f"ge_{key}.sum"))


# ------------------------------------------------------------------------------------------------
# building and loading
# ------------------------------------------------------------------------------------------------
_probe: contextvars.ContextVar[list[tuple[str, bool]] | None] = contextvars.ContextVar("ge_native_probe", default=None)


@contextlib.contextmanager
def probe() -> Iterator[list[tuple[str, bool]]]:
    """Within the block, :func:`build` compiles nothing: it records ``(key, in the cache)`` for
    every module asked for in the yielded list and returns the cached module or None (the
    caller's NumPy form). For telling what a model's kernels need (``ge inspect``); kernels
    built under a probe in this process keep their NumPy forms."""
    found: list[tuple[str, bool]] = []
    token = _probe.set(found)
    try:
        yield found
    finally:
        _probe.reset(token)


def build(source: str, functions: Sequence[str], *, count: bool = True) -> ModuleType | None:
    """The extension module of C ``source`` (after :data:`PRELUDE`) exporting ``functions``
    (each ``static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t n)``),
    loaded from the cache or compiled into it; None when native kernels are unavailable or the
    compiler refused the source (reported once as a warning; the caller's NumPy form runs)."""
    for f in functions:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", f):
            raise NativeSourceError(f"{f!r} is not a kernel function name")
    full = source + _module_table(functions)
    key = key_for(full)
    if key is None:
        return None
    probing = _probe.get()
    with _lock:
        if key in _modules:
            if probing is not None:
                probing.append((key, _modules[key] is not None))
            return _modules[key]
        if probing is not None:
            ok = cached(full)
            probing.append((key, ok))
            if not ok:
                return None
        mod = _load_or_build(key, full, _stats if count else dict(_stats))
        _modules[key] = mod
        return mod


#: the fixed C this package ships (``csrc/*.c``, ``csrc/*.h``): trusted code, installed like the
#: plugins' Python; generated C still goes through :func:`check_c`
CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_CSRC_NAME = re.compile(r"[a-z0-9_]{1,64}\.[ch]\Z")
_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([a-z0-9_]{1,64}\.h)"[ \t]*$', re.M)
_csrc_texts: dict[str, str] = {}


def _csrc_file(name: str) -> str:
    if not _CSRC_NAME.match(name):
        raise NativeSourceError(f"{name!r} is not a file name of ge_native's csrc/ (lower-case .c or .h)")
    text = _csrc_texts.get(name)
    if text is None:
        path = os.path.join(CSRC, name)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise NativeSourceError(f"cannot read the C source {path}: {e.strerror}; reinstall ge-python") from None
        _csrc_texts[name] = text
    return text


def c_source(*names: str) -> str:
    """The text of ge_native's C files ``names`` (``"sgemm.c"``, ...) in order, each local
    ``#include "x.h"`` replaced by that header's text where it first appears and dropped after,
    so what :func:`build` compiles, and what its cache key hashes, is the whole source. Every
    file also compiles alone (``-I csrc``), which the suite checks with ``-Wall -Werror``.
    ``prelude.h`` is what :func:`build` puts before every module: its include line is dropped."""
    seen: set[str] = {"prelude.h"}

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        return _LOCAL_INCLUDE.sub(lambda m: expand(m.group(1)), _csrc_file(name))

    return "".join(expand(n) for n in names)


def lazy_module(switch: str, source: str, functions: Sequence[str], ok: str) -> Any:
    """A function returning the module of ``source`` (built once, on the first call, by
    :func:`build`) when the environment switch ``switch`` leaves it on and its ``ok()`` entry
    returns 1 (the instruction set it was compiled for is there), else None: the kernels of
    :mod:`ge_native.sgemm` and :mod:`ge_native.nchwc`."""
    lock = threading.Lock()
    state: dict[str, Any] = {}

    def get() -> ModuleType | None:
        if "mod" not in state:
            with lock:
                if "mod" not in state:
                    from .jit import enabled as jit_enabled

                    mod = build(source, functions) if jit_enabled(switch) and available() else None
                    state["mod"] = mod if mod is not None and getattr(mod, ok)() == 1 else None
        return state["mod"]

    return get


def _module_table(functions: Sequence[str]) -> str:
    rows = "".join(f'    {{"{f}", (PyCFunction)(void (*)(void)){f}, METH_FASTCALL, 0}},\n' for f in functions)
    return ("\nstatic PyMethodDef ge_methods[] = {\n" + rows
            + '    {"setup", (PyCFunction)(void (*)(void))ge_setup, METH_FASTCALL, 0},\n    {0, 0, 0, 0}\n};\n')


def _init_src(modname: str) -> str:
    return (f"static struct PyModuleDef ge_module = {{PyModuleDef_HEAD_INIT, \"{modname}\", 0, -1, ge_methods}};\n"
            f"PyMODINIT_FUNC PyInit_{modname}(void) {{ return PyModule_Create(&ge_module); }}\n")


#: Called as ``hook(stage, so_path)`` just before a module is loaded: ``"built"`` after a fresh
#: build was renamed into the cache, ``"cached"`` after an entry's bytes were read and checked.
#: For tests (a file swapped at that moment must not be what is loaded); None otherwise.
before_load: Any = None

#: ``MFD_EXEC`` (Linux 6.3+; older kernels refuse the flag, and then it is not needed)
_MFD_EXEC = 0x10


def _fd_path(fd: int) -> str:
    """A path naming the open descriptor ``fd`` that no earlier load in this process used: the
    dynamic loader returns the library it loaded before under the same name (and descriptor
    numbers are reused), so the n-th load inserts n's bits as ``./`` (0) and ``.//`` (1)."""
    n = _state["loads"] = _state.get("loads", 0) + 1
    return "/proc/self/fd/" + "".join(".//" if n >> i & 1 else "./" for i in range(n.bit_length())) + str(fd)


def _memfd(modname: str, data: bytes) -> int | None:
    """A sealed in-memory file holding ``data`` (Linux), or None where there is none."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    fd = None
    for extra in (_MFD_EXEC, 0):
        try:
            fd = os.memfd_create(modname, flags | extra)
            break
        except OSError as e:
            if e.errno != errno.EINVAL:  # e.g. EACCES: executable memfds are forbidden here
                return None
    if fd is None:
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        try:
            import fcntl

            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                        | fcntl.F_SEAL_SEAL)
        except (ImportError, AttributeError, OSError):
            pass
        return fd
    except OSError:
        os.close(fd)
        return None


def _load(modname: str, so: str, data: bytes) -> ModuleType:
    """Load the extension module whose file's bytes are ``data`` (already checked against the
    sum, or just built): from a sealed in-memory copy of those bytes (``/proc/self/fd/N``), so
    what is loaded is exactly what was checked, whatever happens to ``so`` meanwhile; where
    there is no memfd, from a copy in a new private folder of this process. ``so`` is only the
    name the module reports (``__file__``)."""
    import numpy as np

    fd = _memfd(modname, data)
    private = None
    if fd is not None:
        path = _fd_path(fd)
    else:
        private = tempfile.mkdtemp(prefix="ge-load-")
        path = os.path.join(private, modname + (".so" if not so.endswith(".pyd") else ".pyd"))
        with open(path, "xb") as f:
            f.write(data)
    try:
        loader = importlib.machinery.ExtensionFileLoader(modname, path)
        spec = importlib.util.spec_from_file_location(modname, path, loader=loader)
        assert spec is not None
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    finally:
        if fd is not None:
            os.close(fd)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
    mod.__file__ = so
    mod.setup(np.ndarray, None if modname == _state.get("pool_name") else pool_capsule())
    return mod


def module_source(modname: str, source: str, functions: Sequence[str]) -> str:
    """The whole C text :func:`build` compiles for ``source`` exporting ``functions`` as the
    extension module ``modname`` (the prelude, the method table and the init function)."""
    return PRELUDE + source + _module_table(functions) + _init_src(modname)


def run_compiler(csrc: str, out: str) -> subprocess.CompletedProcess[str]:
    """Compile the C file ``csrc`` into the extension module ``out`` with :func:`build`'s
    compiler, flags and include folders (again without ``-march=native`` for a compiler that
    lacks it). The caller checks the return code."""
    cc = compiler()
    if cc is None:
        raise NativeSourceError("no C compiler: native kernels are unavailable here")
    cmd = [cc, *_flags(), *(f"-I{p}" for p in _includes() or []), csrc, "-o", out, "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0 and "-march=native" in cmd:  # a compiler without -march=native
        cmd.remove("-march=native")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    return r


def _load_or_build(key: str, full: str, stats: dict[str, Any]) -> ModuleType | None:
    d = cache_dir()  # checked again for every build: the folder and every folder above it
    modname = f"ge_{key}"
    so, total = os.path.join(d, modname + ".so"), os.path.join(d, modname + ".sum")
    t0 = time.perf_counter()
    if os.path.lexists(so) or os.path.lexists(total):
        data = read_entry(so, total)
        if data is not None:
            try:
                if before_load is not None:
                    before_load("cached", so)
                mod = _load(modname, so, data)
                stats["cached"] += 1
                stats["load_s"] += time.perf_counter() - t0
                return mod
            except (ImportError, OSError):  # not a module of this name, or no room for its copy
                pass
        stats["rebuilt"] += 1
        for p in (so, total):
            try:
                os.unlink(p)
            except OSError:
                pass
    src = PRELUDE + full + _init_src(modname)
    cc = compiler()
    assert cc is not None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{modname}.", suffix=".so", dir=d)
    except OSError:  # the folder went away (removed, moved) since it was checked: check it again
        d = cache_dir()
        so, total = os.path.join(d, modname + ".so"), os.path.join(d, modname + ".sum")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{modname}.", suffix=".so", dir=d)
        except OSError as e:
            stats["failed"] += 1
            _warn_once(f"ge: a native kernel could not be built ({type(e).__name__}: {e}); its NumPy form runs instead")
            return None
    os.close(fd)
    csrc = tmp[:-3] + ".c"
    try:
        with open(csrc, "w", encoding="ascii") as f:
            f.write(src)
        r = run_compiler(csrc, tmp)
        if r.returncode != 0:
            stats["failed"] += 1
            _warn_once(f"ge: a native kernel did not compile ({cc}); its NumPy form runs instead:\n"
                       + "\n".join(r.stderr.splitlines()[:12]))
            return None
        os.chmod(tmp, 0o600)
        os.chmod(csrc, 0o600)
        # the bytes the compiler wrote, read once (no link, a regular file of this process's
        # user): they are hashed for the sum and they are what is loaded below, whatever
        # happens to the files in the folder after the rename
        data = read_private(tmp, owner=os.geteuid())
        if data is None:
            raise OSError(f"the compiler's output '{tmp}' is not a private regular file")
        sha = hashlib.sha256(data).hexdigest()
        os.replace(tmp, so)
        os.replace(csrc, os.path.join(d, modname + ".c"))
        fd, tsum = tempfile.mkstemp(prefix=f".{modname}.", suffix=".sum", dir=d)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(sha + "\n")
        os.replace(tsum, total)
        if before_load is not None:
            before_load("built", so)
        mod = _load(modname, so, data)
    except (OSError, subprocess.SubprocessError, ImportError) as e:
        stats["failed"] += 1
        _warn_once(f"ge: a native kernel could not be built ({type(e).__name__}: {e}); its NumPy form runs instead")
        return None
    finally:
        for p in (tmp, csrc):
            try:
                if os.path.lexists(p):
                    os.unlink(p)
            except OSError:  # not a file any more (the folder changed under the build): left alone
                pass
    stats["compiled"] += 1
    stats["compile_s"] += time.perf_counter() - t0
    note_write(d, len(data) + len(src) + 65, keep=modname)
    return mod


# ------------------------------------------------------------------------------------------------
# the process's one native thread pool
# ------------------------------------------------------------------------------------------------
#: A job is claimed task by task by the caller and the workers (up to 4096 tasks each participant's
#: own range first, then the rest; larger jobs an atomic counter); the caller
#: then waits only for the tasks workers hold, never for a worker that has not woken: on a core
#: another process is using, a descheduled worker costs at most one task (an OpenMP region
#: instead waits at its closing barrier for every thread of its team). Workers look for the next
#: job for about 1 ms, yielding the core between looks, then sleep. One job runs at a time: a
#: second caller, or a task that starts a loop of its own, runs its loop inline.
_POOL_SRC = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define GE_MAX_WORKERS 63
/* how long an idle worker looks for the next job (yielding the core to anyone who wants it)
   before it sleeps: a run's parallel kernels come tens to hundreds of microseconds apart */
#define GE_SPIN_US 1000.0
static struct {
    ge_task_t fn; void *ctx; int64_t n; int64_t cap;
    atomic_llong next, done;
    atomic_int open, active, joined;
    atomic_uint seq;
} job;
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t sleep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cv = PTHREAD_COND_INITIALIZER;
static atomic_int sleepers;
static int nworkers;
static _Thread_local int in_task;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}


/* a job of up to GE_STATIC_MAX tasks is shared out in ranges: participant `slot` of `cap` runs
   tasks [slot * n / cap, (slot + 1) * n / cap) first, then claims whatever is left of the others'
   (each task's flag taken once), so a descheduled participant still costs at most the task it
   holds. Consecutive layers with the same split then find their inputs in the core's own cache:
   claimed in arrival order, the tasks landed on either thread at random, and a layer read about
   half its input from the other core's (ShuffleNet at 2 threads, vCPUs 190 ns apart: ge/ORT
   1.42-1.60 -> 1.32-1.36; SqueezeNet 1.04-1.12 -> 0.96-1.02) */
#define GE_STATIC_MAX 4096
static atomic_char claimed[GE_STATIC_MAX];
static void run_share(int slot) {
    int64_t n = job.n, cap = job.cap;
    if (n <= GE_STATIC_MAX) {
        int64_t lo = slot * n / cap, hi = (slot + 1) * n / cap;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t i = pass ? 0 : lo; i < (pass ? n : hi); i++)
                if (!atomic_exchange_explicit(&claimed[i], 1, memory_order_acq_rel)) {
                    job.fn(job.ctx, i, slot);
                    atomic_fetch_add_explicit(&job.done, 1, memory_order_release);
                }
        return;
    }
    for (;;) {
        int64_t i = atomic_fetch_add(&job.next, 1);
        if (i >= n) break;
        job.fn(job.ctx, i, slot);
        atomic_fetch_add_explicit(&job.done, 1, memory_order_release);
    }
}

static void *worker(void *arg) {
    (void)arg;
    unsigned seen = atomic_load(&job.seq);
    in_task = 1;
    for (;;) {
        double t0 = now_us();
        while (atomic_load_explicit(&job.seq, memory_order_acquire) == seen) {
            if (now_us() - t0 > GE_SPIN_US) {
                pthread_mutex_lock(&sleep_mu);
                atomic_fetch_add(&sleepers, 1);
                while (atomic_load(&job.seq) == seen) pthread_cond_wait(&sleep_cv, &sleep_mu);
                atomic_fetch_sub(&sleepers, 1);
                pthread_mutex_unlock(&sleep_mu);
                break;
            }
            sched_yield();
        }
        seen = atomic_load(&job.seq);
        atomic_fetch_add(&job.active, 1);
        if (atomic_load(&job.open)) {
            int slot = 1 + atomic_fetch_add(&job.joined, 1);
            if (slot < job.cap) run_share(slot);
        }
        atomic_fetch_sub(&job.active, 1);
    }
    return 0;
}

static void pool_parallel(ge_task_t fn, void *ctx, int64_t n, int64_t threads) {
    if (in_task || threads <= 1 || n <= 1 || pthread_mutex_trylock(&call_mu) != 0) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    int want = (int)(threads - 1 < GE_MAX_WORKERS ? threads - 1 : GE_MAX_WORKERS);
    while (nworkers < want) {
        pthread_t t;
        if (pthread_create(&t, 0, worker, 0) != 0) break;
        pthread_detach(t);
        nworkers++;
    }
    job.fn = fn; job.ctx = ctx; job.n = n; job.cap = threads;
    if (n <= GE_STATIC_MAX)
        for (int64_t i = 0; i < n; i++) atomic_store_explicit(&claimed[i], 0, memory_order_relaxed);
    atomic_store(&job.next, 0);
    atomic_store(&job.done, 0);
    atomic_store(&job.joined, 0);
    atomic_store(&job.open, 1);
    atomic_fetch_add_explicit(&job.seq, 1, memory_order_release);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&sleep_mu);
        pthread_cond_broadcast(&sleep_cv);
        pthread_mutex_unlock(&sleep_mu);
    }
    in_task = 1;
    run_share(0);
    in_task = 0;
    while (atomic_load_explicit(&job.done, memory_order_acquire) < n) sched_yield();  /* tasks workers hold */
    atomic_store(&job.open, 0);
    while (atomic_load(&job.active) > 0) sched_yield();  /* a worker between waking and its first look */
    pthread_mutex_unlock(&call_mu);
}

static ge_parallel_t pool_entry = pool_parallel;

/* a forked child has none of the workers: it starts from an empty pool */
static void child_reset(void) {
    nworkers = 0;
    in_task = 0;
    atomic_store(&job.open, 0);
    atomic_store(&job.active, 0);
    atomic_store(&sleepers, 0);
    pthread_mutex_init(&call_mu, 0);
    pthread_mutex_init(&sleep_mu, 0);
    pthread_cond_init(&sleep_cv, 0);
}

static PyObject *capsule(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    static int registered = 0;
    if (ge_nargs(n, 0)) return NULL;
    if (!registered) {
        pthread_atfork(0, 0, child_reset);
        registered = 1;
    }
    return PyCapsule_New((void *)&pool_entry, "ge_native_pool", 0);
}
"""


_cpus: list[int] = []


def cpu_count() -> int:
    """The machine's CPUs (``os.cpu_count()``, at least 1), read once: the call reads sysfs each
    time (6 us here), and the parallel kernels ask on every call."""
    if not _cpus:
        _cpus.append(max(1, os.cpu_count() or 1))
    return _cpus[0]


def pool_capsule() -> Any:
    """The capsule of the process's native pool (its module is built once, like a kernel), given
    to every native module at load; None when it cannot be built (modules then run inline)."""
    if "pool" not in _state:
        full = _POOL_SRC + _module_table(["capsule"])
        _state["pool_name"] = f"ge_{key_for(full)}"
        if _probe.get() is not None and not cached(full):
            return None  # a probe compiles nothing (and the pool is no model's kernel)
        token = _probe.set(None)
        try:
            mod = build(_POOL_SRC, ["capsule"], count=False)  # the runtime, not a kernel: stats() counts kernels
        finally:
            _probe.reset(token)
        _state["pool"] = mod.capsule() if mod is not None else None
    return _state["pool"]


# ------------------------------------------------------------------------------------------------
# derived data kept beside the kernels (ge_core.cache: the same folder, the same checks)
# ------------------------------------------------------------------------------------------------
def memo_json(kind: str, parts: Sequence[str], build: Any, check: Any) -> Any:
    """``build()`` (JSON-serialisable data derived from installed software, such as ONNX's
    schemas) kept for later processes under a key of ``kind`` and ``parts`` (versions, sources):
    read back when ``check(value)`` accepts what was stored, else built and stored."""
    key = kind + "_" + hashlib.sha256("\0".join([kind, *parts]).encode()).hexdigest()[:32]
    data = read_data(key)
    if data is not None:
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            value = None
        if value is not None and check(value):
            return value
    value = build()
    write_data(key, json.dumps(value).encode())
    return value


def _warn_once(msg: str) -> None:
    if msg not in _state.setdefault("warned", set()):
        _state["warned"].add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------------
# generated C: the token check
# ------------------------------------------------------------------------------------------------
_C_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:0[xX][0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?[pP][+-]?[0-9]+|[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|[0-9]+)[fFlL]?)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>->|\+\+|--|<<=|>>=|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%]=|[-+*/%<>=!&|^~?:;,.(){}\[\]])
""", re.VERBOSE)

_PRAGMA = re.compile(r"^[ \t]*#pragma omp simd(?: reduction\((?:\+|max):[a-z][a-z0-9]*\))?[ \t]*$", re.M)

#: C keywords and types a generated kernel may use
C_WORDS = frozenset({"typedef", "struct", "static", "inline", "const", "void", "int", "float", "double", "int64_t", "int32_t", "uint32_t",
                     "for", "if", "else", "return", "restrict", "sizeof", "PyObject", "Py_ssize_t", "NULL"})


def check_c(src: str, names: Iterable[str], patterns: Sequence[str] = ()) -> str:
    """``src`` when every token is a C keyword of :data:`C_WORDS`, one of ``names``, an
    identifier matching one of ``patterns``, a number or an operator; else NativeSourceError.
    No string or character literal, comment, preprocessor line or backslash can pass."""
    allowed = set(names) | C_WORDS
    pats = [re.compile(p + r"\Z") for p in patterns]
    src_checked = src
    # the one preprocessor form a kernel may hold: an OpenMP simd pragma (a reduction at most)
    src = _PRAGMA.sub(" ", src)
    pos = 0
    while pos < len(src):
        m = _C_TOKEN.match(src, pos)
        if m is None:
            raise NativeSourceError(f"generated C has an unexpected character {src[pos]!r} at {pos}")
        if m.lastgroup == "id":
            word = m.group()
            if word not in allowed and not any(p.match(word) for p in pats):
                raise NativeSourceError(f"generated C uses the undeclared name {word!r}")
        pos = m.end()
    return src_checked


# ------------------------------------------------------------------------------------------------
# the prelude: headers, argument checks, vectorisable float32 math
# ------------------------------------------------------------------------------------------------
PRELUDE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static PyTypeObject *ge_ndarray = 0;

/* a task of a parallel loop: fn(ctx, index, slot), slot < threads (a thread's scratch index) */
typedef void (*ge_task_t)(void *ctx, int64_t i, int slot);
typedef void (*ge_parallel_t)(ge_task_t fn, void *ctx, int64_t n, int64_t threads);
static ge_parallel_t ge_pool = 0;

/* run fn over [0, n) on up to `threads` threads of the process's one native pool (the caller
   takes part; tasks are claimed one at a time, so a descheduled worker costs at most the task
   it holds); inline without the pool */
static void ge_parallel(ge_task_t fn, void *ctx, int64_t n, int64_t threads) {
    if (ge_pool && threads > 1 && n > 1) {
        ge_pool(fn, ctx, n, threads);
        return;
    }
    for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
}

static PyObject *ge_setup(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2 || !PyType_Check(args[0])) { PyErr_SetString(PyExc_TypeError, "setup takes numpy.ndarray and the pool"); return 0; }
    Py_INCREF(args[0]);
    ge_ndarray = (PyTypeObject *)args[0];
    if (args[1] != Py_None) {
        ge_parallel_t *p = (ge_parallel_t *)PyCapsule_GetPointer(args[1], "ge_native_pool");
        if (!p) return 0;
        ge_pool = *p;
    }
    Py_RETURN_NONE;
}

/* The data of argument i: an aligned C-contiguous ndarray of dtype number `type` (writable when
   asked) holding at least `need` elements; else a Python exception and NULL. */
static void *ge_arr(PyObject *const *args, int i, int type, int writable, int64_t need) {
    PyObject *o = args[i];
    if (!ge_ndarray || !PyObject_TypeCheck(o, ge_ndarray)) {
        PyErr_Format(PyExc_TypeError, "native kernel argument %d: an ndarray is needed", i);
        return 0;
    }
    PyArrayObject *a = (PyArrayObject *)o;
    int fl = PyArray_FLAGS(a);
    if (PyArray_TYPE(a) != type || !(fl & NPY_ARRAY_C_CONTIGUOUS) || !(fl & NPY_ARRAY_ALIGNED)
        || (writable && !(fl & NPY_ARRAY_WRITEABLE))) {
        PyErr_Format(PyExc_TypeError, "native kernel argument %d: wrong dtype, layout or a read-only array", i);
        return 0;
    }
    int64_t size = 1;
    for (int d = 0; d < PyArray_NDIM(a); d++) size *= PyArray_DIMS(a)[d];
    if (need < 0 || size < need) {
        PyErr_Format(PyExc_ValueError, "native kernel argument %d: %lld elements, the loop reads %lld", i,
                     (long long)size, (long long)need);
        return 0;
    }
    return PyArray_DATA(a);
}

/* the data and the `nd` dims of argument i: an aligned C-contiguous ndarray of `nd` dimensions
   and dtype number `type` (writable when asked) */
static void *ge_nd(PyObject *const *args, int i, int type, int writable, int nd, int64_t *dims) {
    void *p = ge_arr(args, i, type, writable, 0);
    if (!p) return 0;
    PyArrayObject *a = (PyArrayObject *)args[i];
    if (PyArray_NDIM(a) != nd) {
        PyErr_Format(PyExc_TypeError, "native kernel argument %d: a %d-D array is needed", i, nd);
        return 0;
    }
    for (int d = 0; d < nd; d++) dims[d] = PyArray_DIMS(a)[d];
    return p;
}

/* a 1-D array and its length */
static void *ge_vec(PyObject *const *args, int i, int type, int writable, int64_t *count) {
    return ge_nd(args, i, type, writable, 1, count);
}

/* a 2-D array, its rows and columns */
static void *ge_mat(PyObject *const *args, int i, int type, int writable, int64_t *rows, int64_t *cols) {
    int64_t dims[2];
    void *p = ge_nd(args, i, type, writable, 2, dims);
    *rows = dims[0];
    *cols = dims[1];
    return p;
}

/* argument i as a C integer in [lo, hi] */
static int ge_int(PyObject *const *args, int i, int64_t lo, int64_t hi, int64_t *v) {
    long long x = PyLong_AsLongLong(args[i]);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "native kernel argument %d: %lld is out of range", i, x);
        return -1;
    }
    *v = (int64_t)x;
    return 0;
}

/* raise: the sizes or offsets a kernel was given do not fit its arrays */
static PyObject *ge_fail(void) {
    PyErr_SetString(PyExc_ValueError, "native kernel: the offsets it was given lie outside its arrays");
    return NULL;
}

static int ge_nargs(Py_ssize_t n, Py_ssize_t want) {
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "native kernel takes %zd arguments, got %zd", want, n);
        return -1;
    }
    return 0;
}

/* a * b * c * d, or -1 when that overflows (or a factor is negative) */
static int64_t ge_prod(int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t r;
    if (a < 0 || b < 0 || c < 0 || d < 0 || __builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r)
        || __builtin_mul_overflow(r, d, &r)) return -1;
    return r;
}

/* the last element index + 1 a loop nest touches (sum of (extent - 1) * stride, plus one); -1 on overflow */
static int64_t ge_span(int64_t d0, int64_t d1, int64_t d2, int64_t s0, int64_t s1, int64_t s2) {
    if (d0 <= 0 || d1 <= 0 || d2 <= 0) return 0;
    int64_t a, b, c, t;
    if (__builtin_mul_overflow(d0 - 1, s0, &a) || __builtin_mul_overflow(d1 - 1, s1, &b)
        || __builtin_mul_overflow(d2 - 1, s2, &c) || __builtin_add_overflow(a, b, &t)
        || __builtin_add_overflow(t, c, &t) || __builtin_add_overflow(t, 1, &t)) return -1;
    return t;
}

static inline float ge_bits_f32(int32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline int32_t ge_f32_bits(float f) { int32_t b; memcpy(&b, &f, 4); return b; }
static inline float ge_max32(float a, float b) { return (a >= b || a != a) ? a : b; }
static inline float ge_min32(float a, float b) { return (a <= b || a != a) ? a : b; }
static inline double ge_max64(double a, double b) { return (a >= b || a != a) ? a : b; }
static inline double ge_min64(double a, double b) { return (a <= b || a != a) ? a : b; }

/* Cephes single-precision math with arithmetic, selects and bit-casts only (ge_native.vmath's
   algorithms, constant for constant), so loops that inline them vectorise. */
/* the shared core of exp32 and expneg32: the polynomial of exp on the reduced argument of xc,
   and in *t the rounding sum whose low mantissa bits hold the power of two */
static inline float ge_exp_core(float xc, float *t) {
    *t = xc * 1.44269504088896341f + 12582912.0f;
    float fx = *t - 12582912.0f;
    float r = xc - fx * 0.693359375f - fx * -2.12194440e-4f;
    float z = r * r;
    return (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
             + 1.6666665459e-1f) * r + 5.0000001201e-1f) * z + r + 1.0f;
}

static inline float exp32(float x) {
    float xc = x < 88.8f ? x : 88.8f;
    xc = xc > -104.0f ? xc : -104.0f;
    float t;
    float y = ge_exp_core(xc, &t);
    int32_t n = ge_f32_bits(t) - 0x4B400000;
    int32_t n1 = n >> 1;
    int32_t n2 = n - n1;
    y = y * ge_bits_f32((n1 + 127) << 23) * ge_bits_f32((n2 + 127) << 23);
    return x == x ? y : x;
}

/* exp for x <= 0 (softmax's shifted logits): one scaling factor; below -87.3 the result is 0,
   never a denormal nor the smallest normal (a masked score's weight: every product a later
   GEMM makes from a value near 1e-38 is denormal, and each costs the CPU a microcode assist:
   GPT-2's causal attention ran 20x slower on them) */
static inline float expneg32(float x) {
    float xc = x > -87.3f ? x : -87.3f;
    float t;
    float y = ge_exp_core(xc, &t);
    y = y * ge_bits_f32((ge_f32_bits(t) - 0x4B400000 + 127) << 23);
    y = x >= -87.3f ? y : 0.0f;
    return x == x ? y : x;
}

static inline float log32(float x) {
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    int32_t bits = ge_f32_bits(xs);
    int32_t e = ((bits >> 23) & 0xFF) - 126;
    e = sub ? e - 23 : e;
    float m = ge_bits_f32((bits & 0x007FFFFF) | 0x3F000000);
    int low = m < 0.707106781186547524f;
    e = low ? e - 1 : e;
    m = low ? (m + m - 1.0f) : (m - 1.0f);
    float fe = (float)e;
    float z = m * m;
    float y = ((((((((7.0376836292e-2f * m + -1.1514610310e-1f) * m + 1.1676998740e-1f) * m + -1.2420140846e-1f) * m
                   + 1.4249322787e-1f) * m + -1.6668057665e-1f) * m + 2.0000714765e-1f) * m + -2.4999993993e-1f) * m
               + 3.3333331174e-1f) * m * z;
    y = y + -2.12194440e-4f * fe - 0.5f * z;
    float r = m + y + 0.693359375f * fe;
    r = x == 0.0f ? -INFINITY : r;
    r = x < 0.0f ? NAN : r;
    return (x == INFINITY || x != x) ? x : r;
}

static inline float log1p32(float u) {
    float w = u + 1.0f;
    float d = w - 1.0f;
    float r = d == 0.0f ? u : log32(w) * (u / d);
    return u == INFINITY ? u : r;
}

static inline float expm1_32(float x) {
    float small = x * (1.0f + x * (0.5f + x * ((float)(1.0 / 6.0) + x * ((float)(1.0 / 24.0) + x * (float)(1.0 / 120.0)))));
    return fabsf(x) < 0.0625f ? small : exp32(x) - 1.0f;
}

static inline float tanh32(float x) {
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z + -5.37397155531e-2f) * z + 1.33314422036e-1f) * z
                   + -3.33332819422e-1f) * z * x + x;
    float ax = fabsf(x);
    /* exp's argument stops at 40 (tanh is 1.0f from 9.1 on): 2 / (exp + 1) never goes below the
       normal range, whose denormals cost a microcode assist per use (NaN passes) */
    float big = 1.0f - 2.0f / (exp32(ax > 20.0f ? 40.0f : ax + ax) + 1.0f);
    big = x < 0.0f ? -big : big;
    return ax < 0.625f ? small : big;
}

/* erf32's rational c * P(t) / Q(t), t = c^2, in any lane width (the scalar erf32 below, GE's
   GEMM's 16- and 8-lane stores: one set of coefficients): FMA(a, b, c), MUL, DIV and C(v), a
   constant, of that width. A fit of erf(c) / c on [-3.92, 3.92] whose relative error is 5e-8 in
   exact arithmetic (its float32 evaluation: within 7 ulp, 4e-7 absolute; relative near 0). */
#define GE_ERF_RATIO(FMA, MUL, DIV, C, c, t)                                                        \
    DIV(MUL(c, FMA(FMA(FMA(FMA(FMA(FMA(C(1.992528e-08f), t, C(-1.9577806e-06f)), t, C(1.4182818e-04f)), \
                                   t, C(3.7006338e-03f)), t, C(5.0570205e-02f)), t, C(1.999013e-01f)),   \
                       t, C(1.1283791e+00f))),                                                        \
        FMA(FMA(FMA(FMA(C(9.558066e-04f), t, C(1.4351207e-02f)), t, C(1.1498877e-01f)), t, C(5.104896e-01f)), \
            t, C(1.0f)))
#define GE_S_FMA(a, b, c) ((a) * (b) + (c))
#define GE_S_MUL(a, b) ((a) * (b))
#define GE_S_DIV(a, b) ((a) / (b))
#define GE_S_C(v) (v)

static inline float erf32(float x) {
    /* GE_ERF_RATIO on c, x held in [-3.92, 3.92] (beyond, erf is 1.0f in float32), held in
       [-1, 1]; no exp and no branch: the Abramowitz-Stegun form it replaced computed two
       branches and an exp, and GELU at a GEMM's store ran at 2.5x its cost */
    float c = x > 3.92f ? 3.92f : (x < -3.92f ? -3.92f : x);
    float t = c * c;
    float r = GE_ERF_RATIO(GE_S_FMA, GE_S_MUL, GE_S_DIV, GE_S_C, c, t);
    r = r > 1.0f ? 1.0f : (r < -1.0f ? -1.0f : r);
    return x == x ? r : x;
}
"""

#: the prelude's names a generated kernel may call
PRELUDE_NAMES = frozenset({"ge_parallel", "ge_task_t", "ge_arr", "ge_vec", "ge_mat", "ge_prod", "ge_fail", "NPY_INT64", "ge_int", "ge_nargs", "ge_span", "ge_max32", "ge_min32", "ge_max64", "ge_min64",
                           "exp32", "expneg32", "log32", "log1p32", "expm1_32", "tanh32", "erf32", "sqrtf", "sqrt",
                           "fabsf", "fabs", "powf", "pow", "fmaf", "fma", "Py_RETURN_NONE", "Py_BEGIN_ALLOW_THREADS",
                           "Py_END_ALLOW_THREADS", "NPY_FLOAT", "NPY_DOUBLE", "self", "args", "n", "NAN", "INFINITY"})
