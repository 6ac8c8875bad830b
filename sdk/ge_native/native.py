"""Native kernels: C compiled once per machine and kept in the user's cache.

:func:`build` turns a C source into a CPython extension module: it compiles it with the
machine's C compiler the first time and loads it from the cache afterwards, so a new process
starts without compiling anything (and without importing numba). A call into such a module costs
about 0.03 us, and every entry checks its arrays (type, dtype, contiguity, writability, size
against what the loop touches) before it runs. The fixed C is package data (``csrc/``, read
with :func:`c_source`); C a generator writes (ge_fusion's fused loops) is made of validated
tokens only (:func:`check_c`, like :mod:`ge_native.gensrc` for Python).

The cache is the user's own folder (:mod:`ge_core.cache`); an entry's key hashes the source and
the prelude, the compiler, the flags, the Python ABI, NumPy's version and the CPU's features,
and an entry is loaded only when its folder and files are this user's alone and the ``.so``
matches its SHA-256 (what is loaded is exactly the bytes checked). A model file never carries
native code. docs/native.md says more; docs/security.md the trust rules.

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
                flags = parse_cpu_flags(f)
        except OSError:
            pass
        _state["flags"] = flags
    return _state["flags"]


def parse_cpu_flags(lines: Iterable[str]) -> frozenset[str] | None:
    """The feature flags of the first ``flags`` (x86) or ``Features`` (ARM) line of ``lines``, a
    ``/proc/cpuinfo`` text's lines; None when there is none."""
    for line in lines:
        if line.startswith(("flags", "Features")) and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return None


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


def build_flags() -> list[str]:
    """The compiler flags every native module is built with (a copy)."""
    return list(_flags())


def include_dirs() -> list[str]:
    """The header folders a build passes with ``-I``: Python's and NumPy's (empty when either
    lacks its headers, and native kernels are then unavailable)."""
    return list(_includes() or [])


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
    include of a header (``x.h`` in quotes) replaced by its text where it first appears and
    dropped after, so what :func:`build` compiles, and what its cache key hashes, is the whole source. Every
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


class Variants:
    """The variant queries of a family whose module (a :func:`lazy_module` getter) exports a mask
    of the variants this CPU and process run (``caps``) and the name of the one it runs (``isa``):
    ``available()``, ``runnable()`` (best first) and ``isa()`` (None when the module is off or
    did not build), as the bf16 and int8 families' modules offer them."""

    def __init__(self, module: Any, variants: Sequence[str], codes: dict[str, int], caps: str, isa: str) -> None:
        self.module, self.variants, self.codes, self.caps_fn, self.isa_fn = module, tuple(variants), codes, caps, isa

    def available(self) -> bool:
        """True when the native module built here and its environment switch leaves it on."""
        return self.module() is not None

    def runnable(self) -> tuple[str, ...]:
        """The variants this CPU (and this process: AMX needs the kernel's grant) runs, best first."""
        mod = self.module()
        if mod is None:
            return ()
        mask = int(getattr(mod, self.caps_fn)())
        return tuple(v for v in self.variants if mask >> self.codes[v] & 1)

    def isa(self) -> str | None:
        """The variant that runs: the one the switch names where this CPU runs it, else the best
        this CPU runs; None when the path is off or did not build."""
        mod = self.module()
        return None if mod is None else str(getattr(mod, self.isa_fn)())


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
_POOL_SRC = c_source("pool.c")


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
PRELUDE = _csrc_file("prelude.h")

#: the prelude's names a generated kernel may call
PRELUDE_NAMES = frozenset({"ge_parallel", "ge_task_t", "ge_arr", "ge_vec", "ge_mat", "ge_prod", "ge_fail", "NPY_INT64", "ge_int", "ge_nargs", "ge_span", "ge_max32", "ge_min32", "ge_max64", "ge_min64",
                           "exp32", "expneg32", "log32", "log1p32", "expm1_32", "tanh32", "erf32", "sqrtf", "sqrt",
                           "fabsf", "fabs", "powf", "pow", "fmaf", "fma", "rintf", "rint", "Py_RETURN_NONE", "Py_BEGIN_ALLOW_THREADS",
                           "Py_END_ALLOW_THREADS", "NPY_FLOAT", "NPY_DOUBLE", "self", "args", "n", "NAN", "INFINITY"})
