"""Feeds from outside: ``.npy`` files read safely (``ge run --input``), and random inputs for a
graph's declared input types (the CLI's ``ge run``, tests, benchmarks)."""

from __future__ import annotations

import os
import stat
import struct
import tokenize
from collections.abc import Mapping

import numpy as np

from .errors import GEError, InputError
from .ir.graph import Graph

#: The largest feed file read (data bytes), and the largest ``.npy`` header (NumPy's own default).
MAX_FEED_BYTES = 1 << 34
MAX_NPY_HEADER = 10000

_NPY_HINT = "save it with np.save(path, array) from a numeric or boolean array (no pickled objects)"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_feed_file(name: str, path: str) -> np.ndarray:
    """The array of one ``.npy`` feed file, or :class:`InputError` naming the input and the file.

    The file is opened without blocking (a FIFO cannot hang the reader) and must be a regular
    file (a link to ``/dev/zero``, a FIFO or a directory is refused before anything is read). The
    header is read with NumPy's parser (a literal, never code) and bounded; an object dtype (a
    pickle) is refused; the data must be exactly the bytes the header's shape and dtype need, and
    at most :data:`MAX_FEED_BYTES`: nothing is allocated for a truncated or lying file.
    """
    if "\0" in path:
        raise InputError(f"input '{name}': file {path!r} holds a NUL character", hint="check the path given to --input")
    what = f"input '{name}': file '{path}'"
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError(f"{what} does not exist", hint="check the path given to --input") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise InputError(f"{what} cannot be opened: {getattr(e, 'strerror', None) or e}") from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise InputError(f"{what} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"{what} is {_kind(st.st_mode)}, not a regular .npy file", hint=_NPY_HINT)
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            return _read_npy(f, st.st_size, what)
        except InputError:
            raise
        # tokenize.TokenError: NumPy's header parser tokenizes the dict text (an unclosed bracket)
        except (ValueError, EOFError, OSError, SyntaxError, TypeError, MemoryError, OverflowError,
                tokenize.TokenError) as e:
            raise InputError(f"{what} is not a readable .npy array ({type(e).__name__}: {e})", hint=_NPY_HINT) from None


def _read_exact(f, n: int, what: str) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise InputError(f"{what} is truncated (read {got} of {n} bytes)", hint=_NPY_HINT)
        got += k
    return buf


def _read_npy(f, size: int, what: str) -> np.ndarray:
    head = f.read(10)
    if head[:2] == b"PK":
        raise InputError(f"{what} is an .npz archive", hint="give one .npy file per input")
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        raise InputError(f"{what} is {'empty' if not head else 'not an .npy file'}", hint=_NPY_HINT)
    major = head[6]
    if major == 1:
        hlen, start = struct.unpack("<H", head[8:10])[0], 10
    elif major == 2:
        more = f.read(2)
        if len(more) < 2:
            raise InputError(f"{what} is truncated in its header", hint=_NPY_HINT)
        hlen, start = struct.unpack("<I", head[8:10] + more)[0], 12
    else:
        raise InputError(f"{what} has .npy format version {major}.{head[7]}, which is not read", hint=_NPY_HINT)
    if hlen > MAX_NPY_HEADER:
        raise InputError(f"{what} has a {hlen}-byte header (more than {MAX_NPY_HEADER})", hint=_NPY_HINT)
    if start + hlen > size:
        raise InputError(f"{what} is truncated in its header", hint=_NPY_HINT)
    f.seek(0)
    version = np.lib.format.read_magic(f)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = reader(f, max_header_size=MAX_NPY_HEADER)
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects (a pickle), which are never loaded", hint=_NPY_HINT)
    count = 1
    for d in shape:
        count *= int(d)
    nbytes = count * dtype.itemsize
    data = size - f.tell()
    if nbytes > MAX_FEED_BYTES:
        raise InputError(f"{what} claims shape {shape} of {dtype} ({nbytes} bytes, more than {MAX_FEED_BYTES})",
                         hint=_NPY_HINT)
    if data != nbytes:
        state = "is truncated" if data < nbytes else "has trailing bytes"
        raise InputError(f"{what} {state}: shape {shape} of {dtype} needs {nbytes} data bytes, the file has {data}",
                         hint=_NPY_HINT)
    buf = _read_exact(f, nbytes, what)
    arr = np.frombuffer(buf, dtype=dtype, count=count) if count else np.empty(0, dtype=dtype)
    return arr.reshape(shape, order="F" if fortran else "C")


def random_inputs(graph: Graph, seed: int = 0, dims: Mapping[str, int] | None = None, *, default_dim: int = 1,
                  strict: bool = False) -> dict[str, np.ndarray]:
    """Random feeds: floats standard normal, integers in [0, 4), booleans, strings ``"a"``.

    A symbolic dim takes ``dims[name]`` or ``default_dim``. ``strict`` refuses inputs of unknown
    rank or string dtype (a test wants to say so) instead of guessing a scalar or a string.
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.type.shape is None and strict:
            raise GEError(f"input '{v.name}' has an unknown rank; give feeds= explicitly")
        shape = tuple(d if isinstance(d, int) else (dims or {}).get(str(d), default_dim) for d in (v.type.shape or ()))
        dt = v.type.dtype or np.dtype("float32")
        if dt.kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            feeds[v.name] = rng.integers(0, 4, shape).astype(dt)
        elif dt.kind == "b":
            feeds[v.name] = rng.integers(0, 2, shape).astype(bool)
        elif strict:
            raise GEError(f"input '{v.name}' of dtype {dt} needs explicit feeds")
        else:
            feeds[v.name] = np.full(shape, "a", dtype=object)
    return feeds
