"""The user's cache folder: the one place outside the installed code that ge trusts.

Compiled native kernels (:mod:`ge_native.native`), derived tables, generated code and the
verdicts of earlier .om verifications are kept here, each entry with a ``.sum`` (its SHA-256)
beside it; a model file never reaches it as code. The folder (``$GE_CACHE_DIR``, else
``$XDG_CACHE_HOME/ge-python``, else ``~/.cache/ge-python``), the checks made every time it is
used, the private fallback folder and the ``GE_CACHE_MAX_BYTES`` cap (least recently used entries
evicted, :func:`evict`) are described in ``docs/security.md`` ("The user's cache folder").
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import warnings
from typing import Any

#: the layout of the folder (a change starts a new one)
FORMAT = 1
_OFF = ("0", "false", "off", "no")
_NAME = re.compile(r"[a-z0-9_]{1,80}")
_lock = threading.RLock()
_state: dict[str, Any] = {}
#: the most bytes one entry may have (a larger file is not read: treated as absent)
MAX_ENTRY_BYTES = 1 << 28
#: the cap on the folder's size when ``GE_CACHE_MAX_BYTES`` is not set
DEFAULT_MAX_BYTES = 1 << 30
#: writes between two scans of the folder's size (a write that takes the running estimate past
#: the cap scans at once)
SCAN_EVERY = 64
#: a cap's scan removes entries until the folder is this share of the cap (so that the next
#: writes do not scan again at once)
LOW_WATER = 0.75
#: the prefix of the private temporary folders used when the cache folder fails its checks
FALLBACK_PREFIX = "ge-cache-"
#: a temporary file of a write (``.name.xxxx.suffix``) older than this was left by a process
#: that died: a scan removes it; a private fallback folder of a dead process untouched for
#: STALE_FALLBACK_S is removed too
STALE_TEMP_S = 3600.0
STALE_FALLBACK_S = 86400.0


def enabled() -> bool:
    """False when ``GE_NATIVE`` is 0/false/off/no (no native kernels and no cache use)."""
    return os.environ.get("GE_NATIVE", "1").strip().lower() not in _OFF


def cache_root() -> str:
    """The cache folder of this user (not created here)."""
    root = os.environ.get("GE_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "ge-python")
    return os.path.join(os.path.abspath(root), f"v{FORMAT}")


def current_uid() -> int:
    """The user whose files the cache trusts (this process's effective user)."""
    return os.geteuid()


def private(st: os.stat_result, kind: int) -> bool:
    """Owned by this user, of the right kind (a folder or a file, not a link), writable by
    nobody else."""
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == current_uid() and not st.st_mode & 0o022


def _own_group(gid: int) -> bool:
    """Whether group ``gid`` is this user's private group (the convention of distributions whose
    users' files are group-writable by default: a group of the user's name with no other
    member), so a folder writable by it is writable by this user only."""
    known = _state.setdefault("own_groups", {})
    if gid not in known:
        try:
            import grp
            import pwd

            name = pwd.getpwuid(current_uid()).pw_name
            g = grp.getgrgid(gid)
            known[gid] = g.gr_name == name and set(g.gr_mem) <= {name} and gid == os.getegid()
        except (ImportError, KeyError, OSError):
            known[gid] = False
    return bool(known[gid])


def folder_problem(st: os.stat_result, path: str, *, ancestor: bool) -> str | None:
    """Why the folder ``path`` (its ``lstat``) lets another user replace what is in it, or None.
    An ancestor may belong to root or to this user and may be writable by others with the
    sticky bit only (then nobody else can rename or remove what this user put there); the cache
    folder itself must be this user's and writable by nobody else."""
    uid = current_uid()
    if not stat.S_ISDIR(st.st_mode):
        return f"'{path}' is not a folder"
    if ancestor:
        if st.st_uid not in (0, uid):
            return f"the folder '{path}' above it belongs to another user (uid {st.st_uid})"
        if st.st_mode & stat.S_ISVTX:
            return None
        if st.st_mode & 0o002:
            return f"the folder '{path}' above it is writable by every user (and has no sticky bit)"
        if st.st_mode & 0o020 and not _own_group(st.st_gid):
            return f"the folder '{path}' above it is writable by its group (and has no sticky bit)"
        return None
    if st.st_uid != uid:
        return f"'{path}' belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"'{path}' is writable by other users"
    return None


def _checked_folder(root: str) -> str:
    """The real path of the cache folder ``root`` after checking it and every folder above it
    (creating the missing ones 0700); raises OSError (with the reason) when one fails. Links
    on the way are resolved once, here: the checks and every later use are of the real path."""
    path = os.path.normpath(os.path.abspath(root))
    checked = _check_path(path, links=False)
    return checked if checked is not None else str(_check_path(os.path.realpath(path), links=True))


def _check_path(real: str, *, links: bool) -> str | None:
    """:func:`_checked_folder` of a path; None when a link is on the way and ``links`` is off."""
    parts = [p for p in real.split(os.sep) if p]
    path = os.sep
    st = os.lstat(path)
    problem = folder_problem(st, path, ancestor=True)
    for i, part in enumerate(parts):
        if problem:
            raise PermissionError(problem)
        path = os.path.join(path, part)
        last = i == len(parts) - 1
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) and not links:
            return None
        if last and stat.S_ISDIR(st.st_mode) and st.st_uid == current_uid() and st.st_mode & 0o077:
            os.chmod(path, 0o700)  # ours, but open to others: make it private
            st = os.lstat(path)
        problem = folder_problem(st, path, ancestor=not last)
    if problem:
        raise PermissionError(problem)
    return real


def cache_dir() -> str:
    """The folder entries are read from and written to: the user's cache folder when it passes
    the checks (created 0700 when missing; checked again on every call, so a folder that was
    fine at the start of a process and is not now is no longer used), else a private temporary
    folder of this process (removed at exit)."""
    with _lock:
        d = cache_root()
        try:
            return _checked_folder(d)
        except OSError as e:
            if _state.get("warned_for") != (d, str(e)):
                _state["warned_for"] = (d, str(e))
                warnings.warn(f"ge: the cache '{d}' is not used ({e}); kernels are built for this process only. "
                              "Use a folder of your own that only you can write, under folders that only you "
                              "or root can write (or that have the sticky bit, like /tmp), or set GE_CACHE_DIR.",
                              stacklevel=2)
        return _fallback()


def _fallback() -> str:
    """This process's private temporary folder (made once; again if it went away)."""
    d = _state.get("fallback")
    if d and _state.get("fallback_pid") == os.getpid():
        try:
            st = os.lstat(d)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                return str(d)
        except OSError:
            pass
    d = tempfile.mkdtemp(prefix=f"{FALLBACK_PREFIX}{os.getpid()}-")
    _state["fallback"], _state["fallback_pid"] = d, os.getpid()
    if not _state.get("atexit"):
        _state["atexit"] = True
        atexit.register(remove_fallback)
    remove_stale_fallbacks()
    return d


def remove_fallback() -> None:
    """Remove this process's private temporary folder (at exit; a forked child leaves its
    parent's alone)."""
    with _lock:
        d = _state.get("fallback")
        if d and _state.get("fallback_pid") == os.getpid():
            _state.pop("fallback", None)
            _remove_own_folder(d)


def _remove_own_folder(d: str) -> None:
    try:
        st = os.lstat(d)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        shutil.rmtree(d, ignore_errors=True)


def remove_stale_fallbacks(now: float | None = None) -> int:
    """Remove the private temporary folders (``ge-cache-*``) of this user that earlier processes
    left (killed before their exit ran): untouched for a day and, where the name says which
    process made it, that process is gone. Once per process; returns how many were removed."""
    if _state.get("stale_done") == os.getpid() and now is None:
        return 0
    _state["stale_done"] = os.getpid()
    now = time.time() if now is None else now
    tmp = tempfile.gettempdir()
    removed = 0
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(FALLBACK_PREFIX)]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(tmp, name)
        if path == _state.get("fallback"):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < STALE_FALLBACK_S:
            continue
        pid = name[len(FALLBACK_PREFIX):].partition("-")[0]
        if pid.isdigit() and "-" in name[len(FALLBACK_PREFIX):] and _alive(int(pid)):
            continue
        _remove_own_folder(path)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def digest(path: str) -> str:
    """The SHA-256 (hex) of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def read_private(path: str, limit: int = MAX_ENTRY_BYTES, *, owner: int | None = None) -> bytes | None:
    """The bytes of ``path`` read through one descriptor opened without following a link (and
    without blocking on a FIFO), or None unless it is a regular file of ``owner`` (this user)
    that nobody else can write, of at most ``limit`` bytes."""
    try:
        fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        uid = current_uid() if owner is None else owner
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022) or st.st_size > limit:
            return None
        chunks, n = [], 0
        while True:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
            if n > limit:
                return None
        data = b"".join(chunks)
        _touch(fd, path)
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def _touch(fd: int, path: str) -> None:
    """Mark an entry used (its mtime: what eviction orders by), once per process and entry."""
    touched = _state.setdefault("touched", set())
    if path in touched or not path.endswith((".so", ".dat")):
        return
    touched.add(path)
    try:
        os.utime(fd if os.utime in os.supports_fd else path)
    except OSError:
        pass


def read_sum(total: str) -> str | None:
    """The SHA-256 (hex) a ``.sum`` file holds, when it passes the checks."""
    data = read_private(total, 200)
    if data is None:
        return None
    want = data.strip()
    return want.decode() if re.fullmatch(rb"[0-9a-f]{64}", want) else None


def read_entry(path: str, total: str, limit: int = MAX_ENTRY_BYTES) -> bytes | None:
    """The bytes of the entry ``path`` when it and its sum file ``total`` pass the checks
    (owner, permissions, no link, hash): the bytes returned are exactly the bytes hashed, read
    through one descriptor, so a file swapped after the check is never what the caller uses."""
    want = read_sum(total)
    if want is None:
        return None
    data = read_private(path, limit)
    if data is None or hashlib.sha256(data).hexdigest() != want:
        return None
    return data


def entry_ok(path: str, total: str) -> bool:
    """Whether ``path`` and its sum file ``total`` pass the checks (owner, permissions, hash).
    Only an answer: a caller that then uses the entry reads it with :func:`read_entry`."""
    return read_entry(path, total) is not None


def read_data(name: str) -> bytes | None:
    """The bytes stored under ``name`` by :func:`write_data`, or None when there are none or the
    entry fails the checks. The caller still validates what it reads as data from a stranger."""
    if not enabled() or not _NAME.fullmatch(name):
        return None
    d = cache_dir()
    return read_entry(os.path.join(d, name + ".dat"), os.path.join(d, name + ".sum"))


def write_data(name: str, data: bytes) -> None:
    """Keep ``data`` under ``name`` (lower-case letters, digits, ``_``) for later processes;
    written through temporary files (a reader never sees half an entry)."""
    if not enabled() or not _NAME.fullmatch(name):
        return
    d = cache_dir()
    try:
        for suffix, body in ((".dat", data), (".sum", (hashlib.sha256(data).hexdigest() + "\n").encode())):
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=suffix, dir=d)
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, os.path.join(d, name + suffix))
    except OSError:
        return
    note_write(d, len(data) + 65, keep=name)


# ------------------------------------------------------------------------------------------------
# the size cap: least recently used entries go first
# ------------------------------------------------------------------------------------------------
_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(i?b)?")


def max_bytes() -> int | None:
    """The cap on the cache folder's size: ``GE_CACHE_MAX_BYTES`` (bytes, or with a K/M/G/T
    suffix: ``512M``, ``2GiB``; ``0``/``off``/``none`` for no cap), else 1 GiB."""
    raw = os.environ.get("GE_CACHE_MAX_BYTES", "").strip().lower()
    if not raw:
        return DEFAULT_MAX_BYTES
    if raw in (*_OFF, "none", "unlimited"):
        return None
    m = _SIZE.fullmatch(raw)
    if not m:
        if _state.get("bad_cap") != raw:
            _state["bad_cap"] = raw
            warnings.warn(f"ge: GE_CACHE_MAX_BYTES={raw!r} is not a size (such as 1073741824, 512M or 2G); "
                          "the cache keeps the default cap of 1 GiB", stacklevel=2)
        return DEFAULT_MAX_BYTES
    return int(m.group(1)) << (10 * " kmgt".index(m.group(2) or " "))


def note_write(d: str, nbytes: int, keep: str = "") -> None:
    """Count ``nbytes`` just written to the folder ``d`` (the entry ``keep``): scans the folder
    (:func:`evict`) on a process's first write, every :data:`SCAN_EVERY` writes, and when the
    running estimate of its size passes the cap -- not on every write, never on a read."""
    cap = max_bytes()
    if cap is None:
        return
    with _lock:
        s = _state.setdefault("evict", {"dir": None, "estimate": None, "writes": 0})
        if s["dir"] != d:
            s.update(dir=d, estimate=None, writes=0)
        s["writes"] += 1
        if s["estimate"] is not None:
            s["estimate"] += nbytes
        if s["estimate"] is None or s["estimate"] > cap or s["writes"] % SCAN_EVERY == 0:
            s["estimate"] = evict(d, cap, keep=(keep,))
            remove_stale_fallbacks()


def evict(d: str, cap: int, keep: tuple[str, ...] = (), now: float | None = None) -> int:
    """Remove the least recently used entries of the folder ``d`` (by the mtime of the entry
    file, which a read refreshes) until it holds at most :data:`LOW_WATER` of ``cap`` bytes,
    when it holds more than ``cap``; returns the bytes left. An entry goes with its siblings
    (``.sum`` first, so that a reader sees it absent at once, then ``.so``/``.dat`` and ``.c``);
    a reader in another process holding the file open keeps its bytes (an unlinked file stays
    readable; a loaded kernel was copied before it was loaded). A ``.sum``/``.c`` without its
    entry goes first; ``keep`` (entry names) stay; so do other files than ge's own."""
    now = time.time() if now is None else now
    groups: dict[str, list[Any]] = {}
    total = 0
    try:
        it = list(os.scandir(d))
    except OSError:
        return 0
    for e in it:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        name = e.name
        stem, _, suffix = name.rpartition(".")
        if name.startswith("."):  # a write in progress, or left by a process that died
            if now - st.st_mtime > STALE_TEMP_S and st.st_uid == current_uid():
                try:
                    os.unlink(e.path)
                    continue
                except OSError:
                    pass
            total += st.st_size
            continue
        if suffix not in ("so", "sum", "c", "dat") or not stem:
            continue
        g = groups.setdefault(stem, [0, 0.0, []])
        g[0] += st.st_size
        g[2].append(name)
        if suffix in ("so", "dat"):
            g[1] = max(g[1], st.st_mtime)
        total += st.st_size
    if total <= cap:
        return total
    low = int(cap * LOW_WATER)
    for stem, (size, _, names) in sorted(groups.items(), key=lambda kv: (kv[1][1], kv[0])):
        if total <= low:
            break
        if stem in keep:
            continue
        for name in sorted(names, key=lambda n: (not n.endswith(".sum"), n.endswith(".c"))):
            try:
                os.unlink(os.path.join(d, name))
            except FileNotFoundError:
                pass
            except OSError:
                continue
        total -= size
    return total
