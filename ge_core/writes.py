"""The files a command writes: never one of its own inputs, never half a file.

Every writer option of the ``ge`` and ``atc`` commands (``-o``, ``--report``, ``--trace``,
``--dump-ir``, ``--memory-plot``, ``--output-dir``, atc's ``--output`` and ``--json``, ...) goes
through :class:`InputFiles`: the files the command reads (its model, an .om's external weight
files, an ONNX model's external data, feed files, configs) are recorded by device and inode
before anything is written, and an output path that is one of them (the same name, a symbolic
link to it, a hard link) is a :class:`~ge_core.errors.ModelFileError` naming both paths.

:func:`write_atomic` and :func:`write_all_atomic` write through a temporary file in the target's
folder, flushed, synced and checked for its size before it is renamed over the target: a full
disk (``ENOSPC``), a quota or a file-size limit fails with the path and leaves neither a
truncated file nor a temporary one.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from typing import IO, Any

from .errors import ModelFileError

#: Entries of a model folder (a SavedModel) recorded as inputs, at most.
MAX_FOLDER_FILES = 10_000
#: Bytes of a source model scanned for external data locations, at most.
#: file suffix -> ``companions(path) -> [paths]``: the files a model file of that kind names (an
#: .om's external weights, an ONNX model's external data), given by what knows the format (ge_core.om,
#: the ONNX plugin); this module is below them
COMPANIONS: dict[str, Callable[[str], list[str]]] = {}


def file_id(path: Any) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file ``path`` names (links followed), None when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError, TypeError):
        return None
    return st.st_dev, st.st_ino


class InputFiles:
    """The files a command reads, by device and inode; :meth:`check` refuses an output path that
    is one of them. ``add`` the model (its companion files come with it: an .om's external
    weights, an ONNX model's external data, every file of a model folder) and every other file
    the command reads (feeds, configs)."""

    def __init__(self, *paths: Any) -> None:
        self.files: dict[tuple[int, int], str] = {}
        self.outputs: dict[tuple[int, int] | str, tuple[str, str]] = {}
        for p in paths:
            self.add(p)

    def add(self, path: Any, *, companions: bool = True) -> InputFiles:
        """Record ``path`` (a str or PathLike; None and missing files are skipped) and, with
        ``companions``, the files it names."""
        if path is None or isinstance(path, bool):
            return self
        try:
            path = os.fsdecode(os.fspath(path))
        except TypeError:
            return self
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return self
        if stat.S_ISDIR(st.st_mode):
            if companions:
                self._add_folder(path)
            return self
        if not stat.S_ISREG(st.st_mode):  # a device or FIFO: never opened here (it could block), and
            return self  # an output there is written into, not renamed over
        self.files.setdefault((st.st_dev, st.st_ino), path)
        if companions:
            low = path.lower()
            find = COMPANIONS.get(".om" if low.endswith(".om") or _head(path) == b"GEOM" else os.path.splitext(low)[1])
            for p in find(path) if find else ():
                self.add(p, companions=False)
        return self

    def _add_folder(self, folder: str) -> None:
        n = 0
        for dirpath, _dirs, files in os.walk(folder):
            for f in files:
                self.add(os.path.join(dirpath, f), companions=False)
                n += 1
                if n >= MAX_FOLDER_FILES:
                    return

    def input_of(self, path: Any) -> str | None:
        """The input ``path`` is (by inode), or None."""
        ident = file_id(path)
        return None if ident is None else self.files.get(ident)

    def check(self, path: Any, flag: str, *, exclusive: bool = True) -> str:
        """``path`` (returned) when writing it leaves every input as it is; else a
        ModelFileError naming ``flag``, the path and the input it is. With ``exclusive``, an
        output path another option of the command named already is refused too (folders, and the
        files written into them, are shared: ``--output-dir D --dump-tensors D``)."""
        shown = os.fsdecode(os.fspath(path))
        if _special(shown):  # /dev/null, /dev/stdout: several outputs may go there
            return shown
        inp = self.input_of(shown)
        if inp is not None:
            same = "" if os.path.abspath(inp) == os.path.abspath(shown) else f" (the same file as the input '{inp}')"
            raise ModelFileError(f"{flag} '{shown}' is an input of this command{same}: writing it would "
                                 f"overwrite the input '{inp}'",
                                 hint="choose another output path; the input is left as it is")
        key: tuple[int, int] | str = file_id(shown) or os.path.normcase(os.path.abspath(shown))
        other = self.outputs.get(key)
        if exclusive and other is not None and other[0] != flag:
            raise ModelFileError(f"{flag} '{shown}' and {other[0]} '{other[1]}' name the same file",
                                 hint="give each output its own path")
        if exclusive:
            self.outputs[key] = (flag, shown)
        return shown


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError:
        return b""


def _reason(e: OSError) -> str:
    why = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        why += " (free some space or choose another folder)"
    return why


def temp_beside(path: str) -> tuple[IO[bytes], str]:
    """A new temporary file (open for writing) in the folder of ``path``, and its name."""
    directory, base = os.path.split(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{base[:200]}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        return os.fdopen(fd, "wb"), tmp
    raise FileExistsError(errno.EEXIST, f"could not create a temporary file next to {path}")


def discard(tmp: str | None) -> None:
    """Remove a temporary file a failed write left (if any)."""
    if tmp is not None:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _file_above(path: str) -> str | None:
    """The nearest existing ancestor of ``path`` (or ``path``) when it is not a folder."""
    up = os.path.abspath(path)
    while not os.path.lexists(up) and os.path.dirname(up) != up:
        up = os.path.dirname(up)
    return up if os.path.lexists(up) and not os.path.isdir(up) else None


def make_folder(path: Any, what: str, *, inputs: InputFiles | None = None, flag: str | None = None) -> str:
    """Create the folder ``path`` (and its parents) unless it exists; a ModelFileError naming
    it says why not (a file in the way, no permission, a full disk). With ``inputs``, a folder
    path that is one of the command's input files is refused."""
    shown = os.fsdecode(os.fspath(path))
    if inputs is not None:
        inputs.check(shown, flag or what, exclusive=False)
    if "\0" in shown or not shown:
        raise ModelFileError(f"cannot create {what} {shown!r}: not a folder path")
    bad = _file_above(shown)
    if bad is not None:
        same = "it is" if os.path.abspath(bad) == os.path.abspath(shown) else f"'{bad}' is"
        raise ModelFileError(f"cannot create {what} '{shown}': {same} a file, not a folder",
                             hint="give a folder path that can be created")
    try:
        os.makedirs(shown, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"cannot create {what} '{shown}': {_reason(e)}",
                             hint="give a folder path that can be created") from None
    return shown


def check_target(path: Any, what: str) -> str:
    """``path`` when a file can be written there (its folder exists, it is no folder); else a
    ModelFileError naming it: say so before the work whose result goes there."""
    _where_fails(path, what)
    return os.fsdecode(os.fspath(path))


def _where_fails(path: Any, what: str) -> None:
    """A clear error for a target that cannot be written at all (missing folder, a folder)."""
    shown = os.fsdecode(os.fspath(path))
    if "\0" in shown:
        raise ModelFileError(f"cannot write {what} {shown!r}: the path holds a NUL character")
    d = os.path.dirname(os.path.abspath(shown))
    if not os.path.isdir(d):
        up = _file_above(d)
        if up is not None:
            raise ModelFileError(f"cannot write {what} '{shown}': '{up}' is a file, not a folder",
                                 hint="choose a path inside a folder")
        raise ModelFileError(f"cannot write {what} '{shown}': folder '{d}' does not exist",
                             hint="create the folder first or choose another path")
    if os.path.isdir(shown):
        raise ModelFileError(f"cannot write {what} '{shown}': it is a folder", hint="give a file name")


def _write_temp(path: str, write: Callable[[IO[bytes]], Any], what: str) -> str:
    tmp = None
    try:
        f, tmp = temp_beside(path)
        with f:
            write(f)
            f.flush()
            written = f.tell()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        if size != written:
            raise OSError(errno.EIO, f"only {size} of {written} bytes reached the disk")
        done, tmp = tmp, None
        return done
    except OSError as e:
        raise ModelFileError(f"cannot write {what} '{path}': {_reason(e)}",
                             hint="nothing was written; check the folder and the free space") from None
    finally:
        discard(tmp)


def _special(path: str) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a folder (a device, a FIFO, a
    socket): a rename would replace the device node itself."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _write_into(path: str, write: Callable[[IO[bytes]], Any], what: str) -> None:
    try:
        with open(path, "wb") as f:
            write(f)
    except OSError as e:
        raise ModelFileError(f"cannot write {what} '{path}': {_reason(e)}", hint="check the path") from None


def fsync_directory(directory: str) -> None:
    """fsync a folder (so a rename in it is durable); errors are ignored (not every file system
    supports it)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_all_atomic(items: Iterable[tuple[Any, Callable[[IO[bytes]], Any]]], what: str, *,
                     inputs: InputFiles | None = None, flag: str | None = None) -> list[str]:
    """Write every ``(path, write)`` (``write(f)`` writes the file's bytes to the binary file
    ``f``): first each to a temporary file beside its target (synced, its size checked), then
    all renamed over their targets. Any failure is a ModelFileError naming the path; a failure
    to write leaves no new file and no temporary file (the targets keep what they held). With ``inputs``, a
    target that is one of the command's inputs is refused (``flag`` names the option)."""
    todo = [(os.fsdecode(os.fspath(p)), w) for p, w in items]
    for p, _ in todo:
        if inputs is not None:
            inputs.check(p, flag or what, exclusive=False)  # (exclusive outputs are checked before the work)
        _where_fails(p, what)
    special = [(p, w) for p, w in todo if _special(p)]
    todo = [(p, w) for p, w in todo if not _special(p)]
    for p, w in special:  # /dev/null, /dev/stdout, a FIFO: written into, never renamed over
        _write_into(p, w, what)
    temps: list[tuple[str, str]] = []
    replaced = 0
    try:
        for p, w in todo:
            temps.append((_write_temp(p, w, what), p))
        for tmp, p in temps:
            try:
                os.replace(tmp, p)
            except OSError as e:
                raise ModelFileError(f"cannot write {what} '{p}': {_reason(e)}", hint="check the folder") from None
            replaced += 1
        for d in {os.path.dirname(os.path.abspath(p)) for p, _ in todo}:
            fsync_directory(d)
    finally:
        for tmp, _ in temps[replaced:]:
            discard(tmp)
    return [p for p, _ in special + todo]


def write_atomic(path: Any, write: Callable[[IO[bytes]], Any], what: str, *, inputs: InputFiles | None = None,
                 flag: str | None = None) -> str:
    """Write one file as :func:`write_all_atomic` does; its path."""
    return write_all_atomic([(path, write)], what, inputs=inputs, flag=flag)[0]


def write_json_atomic(path: Any, data: Any, what: str, *, inputs: InputFiles | None = None,
                      flag: str | None = None) -> str:
    """``data`` as indented JSON (values JSON lacks as text) written as :func:`write_atomic` does."""
    import json

    return write_bytes_atomic(path, json.dumps(data, indent=2, default=str) + "\n", what, inputs=inputs, flag=flag)


def write_bytes_atomic(path: Any, data: bytes | str, what: str, *, inputs: InputFiles | None = None,
                       flag: str | None = None) -> str:
    """Write ``data`` (text as UTF-8) as :func:`write_atomic` does."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_atomic(path, lambda f: f.write(raw), what, inputs=inputs, flag=flag)
