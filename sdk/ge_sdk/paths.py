"""Containment of the files a model brings with it (external data, SavedModel folders, assets).

A model file from outside may name other files (ONNX external data, a SavedModel's
``variables/`` and ``assets/``); a frontend reads them only if they stay inside the model's
folder once ``..`` and symbolic links are resolved, and are regular files (a FIFO would block
the reader, a device such as ``/dev/zero`` never ends). Both helpers raise
:class:`~ge_core.errors.SecurityError` (a path leads outside) or
:class:`~ge_core.errors.ModelFileError` (missing, or not a regular file), naming the file.
"""

from __future__ import annotations

import os
import stat

from ge_core.errors import ModelFileError, SecurityError

_INSIDE_HINT = "a model's files must be in the model's folder (or below it); copy them there"


def _inside(base_real: str, path: str) -> bool:
    return os.path.commonpath([base_real, path]) == base_real


def contained_file(base_dir: str, location: str, what: str, kind: str = "file") -> str:
    """The resolved path of the file ``location`` names relative to ``base_dir``.

    ``location`` must be relative (no drive, no leading ``/``, no NUL), stay inside ``base_dir``
    after ``..`` is applied and after links are resolved, exist and be a regular file. ``what``
    names the referring thing in messages (``"tensor 'w' of m.onnx"``), ``kind`` the file's role
    (``"external data"``, ``"asset"``).
    """
    if not location:
        raise ModelFileError(f"{what}: no {kind} location is given")
    if "\x00" in location:
        raise SecurityError(f"{what}: {kind} location {location!r} contains a NUL byte")
    norm = location.replace("\\", "/")
    if os.path.isabs(location) or norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise SecurityError(f"{what}: {kind} location '{location}' is an absolute path", hint=_INSIDE_HINT)
    base_real = os.path.realpath(base_dir)
    joined = os.path.normpath(os.path.join(base_real, *[p for p in norm.split("/") if p]))
    if not _inside(base_real, joined):
        raise SecurityError(f"{what}: {kind} location '{location}' escapes the model's folder {base_dir}",
                            hint=_INSIDE_HINT)
    real = os.path.realpath(joined)
    if not _inside(base_real, real):
        raise SecurityError(f"{what}: {kind} location '{location}' is a link that resolves outside the model's "
                            f"folder ({real})", hint=_INSIDE_HINT)
    if not os.path.exists(real):
        raise ModelFileError(f"{what}: {kind} file '{location}' does not exist in {base_dir}",
                             hint="copy the file next to the model (the location is relative to the model)")
    if not os.path.isfile(real):
        raise ModelFileError(f"{what}: {kind} location '{location}' is not a regular file")
    return real


def check_folder_contained(folder: str, what: str, *, max_entries: int = 1_000_000) -> None:
    """Refuse a model folder with an entry that leads outside it or is not a file or folder.

    Every entry below ``folder`` (links are not followed while walking, but each is resolved) must
    resolve inside ``folder``, and be a regular file or a folder: a link to ``/etc``, to a file
    outside, to ``/dev/zero``, or a FIFO is refused before any reader opens it.
    """
    base_real = os.path.realpath(folder)
    count = 0
    for top, dirs, files in os.walk(base_real, followlinks=False):
        for name in dirs + files:
            count += 1
            if count > max_entries:
                raise ModelFileError(f"{what}: folder {folder} has more than {max_entries} entries")
            path = os.path.join(top, name)
            rel = os.path.relpath(path, base_real)
            real = os.path.realpath(path)
            if not _inside(base_real, real):
                raise SecurityError(f"{what}: '{rel}' is a link that resolves outside the model's folder ({real})",
                                    hint=_INSIDE_HINT)
            try:
                mode = os.stat(real).st_mode
            except OSError as e:
                raise ModelFileError(f"{what}: '{rel}' cannot be read: {e.strerror or e}") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ModelFileError(f"{what}: '{rel}' is not a regular file (a FIFO, device or socket)",
                                     hint="a model folder holds only files and folders")
