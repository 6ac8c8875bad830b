"""The user's cache folder: the one place outside the installed code that ge trusts.

Compiled native kernels (:mod:`ge_sdk.native`), derived tables (ONNX's schemas), generated
code and the verdicts of earlier .om verifications are kept here so a new process does not
redo that work. A model file never reaches this folder as code: every entry is written by ge
itself from what it computed.

The folder is ``$GE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ge-python``, else
``~/.cache/ge-python``, with a ``v<FORMAT>`` folder inside (mode 0700). An entry is a file with a
``.sum`` beside it holding its SHA-256. Before anything is read, the folder and both files must
be owned by this user and writable by nobody else, and the file must hash to its sum; an entry
that fails a check is treated as absent (and so rebuilt by its writer). A folder that fails the
checks is not used at all: the process keeps its entries in a private temporary folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
import threading
import warnings

#: the layout of the folder (a change starts a new one)
FORMAT = 1
_OFF = ("0", "false", "off", "no")
_NAME = re.compile(r"[a-z0-9_]{1,80}")
_lock = threading.RLock()
_state: dict[str, str] = {}


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


def cache_dir() -> str:
    """The folder entries are read from and written to: the user's cache folder when it passes
    the checks (created 0700 when missing), else a private temporary folder for this process."""
    with _lock:
        d = cache_root()
        if _state.get("dir_for") == d and os.path.isdir(_state["dir"]):
            return _state["dir"]
        _state["dir_for"] = d
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == current_uid() and st.st_mode & 0o077:
                os.chmod(d, 0o700)  # ours, but open to others: make it private
                st = os.lstat(d)
            if not private(st, stat.S_IFDIR):
                raise PermissionError(f"'{d}' is not a folder of this user that only this user can write")
        except OSError as e:
            warnings.warn(f"ge: the cache '{d}' is not used ({e}); kernels are built for this process only. "
                          "Fix its owner and permissions (chmod 700) or set GE_CACHE_DIR.", stacklevel=2)
            d = tempfile.mkdtemp(prefix="ge-cache-")
        _state["dir"] = d
        return d


def digest(path: str) -> str:
    """The SHA-256 (hex) of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def entry_ok(path: str, total: str) -> bool:
    """Whether ``path`` and its sum file ``total`` pass the checks (owner, permissions, hash)."""
    try:
        if not (private(os.lstat(path), stat.S_IFREG) and private(os.lstat(total), stat.S_IFREG)):
            return False
        with open(total, encoding="ascii") as f:
            want = f.read(200).strip()
        return bool(re.fullmatch(r"[0-9a-f]{64}", want)) and digest(path) == want
    except (OSError, UnicodeDecodeError):
        return False


def read_data(name: str) -> bytes | None:
    """The bytes stored under ``name`` by :func:`write_data`, or None when there are none or the
    entry fails the checks. The caller still validates what it reads as data from a stranger."""
    if not enabled() or not _NAME.fullmatch(name):
        return None
    d = cache_dir()
    path = os.path.join(d, name + ".dat")
    if not entry_ok(path, os.path.join(d, name + ".sum")):
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


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
        pass
