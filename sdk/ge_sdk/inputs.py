"""Feeds from outside: ``.npy`` files read safely (``ge run --input``), and random inputs for a
graph's declared input types (the CLI's ``ge run``, tests, benchmarks)."""

from __future__ import annotations

import os
import stat
import struct
import tokenize
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ge_core.errors import GEError, InputError, OptionError
from ge_core.ir.graph import Graph

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


def _dims_text(shape: tuple | None) -> str:
    return "[*] (unknown rank)" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def input_shapes(graph: Graph, shapes: Mapping[str, Sequence[Any]] | None = None,
                 dims: Mapping[str, int] | None = None, *, default_dim: int | None = 1,
                 known: Mapping[str, Any] | None = None, option: str = "shapes") -> dict[str, tuple[int, ...]]:
    """A concrete shape for every input of ``graph`` (what random feeds for it take).

    ``shapes`` gives whole shapes by input name (``ge run --input-shape``): each must name an input,
    have the input's rank and agree with its static dims (:class:`InputError` otherwise). A
    symbolic dim takes one value wherever it appears: what ``dims`` gives it, what a given shape
    holds at its place, or (softly, never an error: the run checks feeds) the shape of a ``known``
    feed there; two different values for one symbol are an InputError naming both inputs. A known
    feed keeps its own shape. What is left (a symbol nothing sized, an unknown dim, an unknown
    rank) takes ``default_dim`` (unknown rank: a scalar), or, with ``default_dim=None``, is an
    InputError that names each such input and its dims and says to give its shape with ``option``.
    """
    by_name = {v.name: v for v in graph.inputs}
    given: dict[str, tuple[int, ...]] = {}
    for name, shape in (shapes or {}).items():
        if name not in by_name:
            from ge_core.registry import close_matches

            raise InputError(f"{option} names '{name}', which is not an input of the model{close_matches(name, by_name)}",
                             hint="inputs: " + ", ".join(f"{v.name} {_dims_text(v.type.shape)}" for v in graph.inputs))
        if not isinstance(shape, (list, tuple)) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise OptionError(f"{option} gives input '{name}' the dims {list(shape) if isinstance(shape, (list, tuple)) else shape!r}: "
                              "a run needs a size (an integer, at least 0) for every dim",
                              hint=f'for example {option} "{name}:{_example(by_name[name].type.shape)}"')
        given[name] = tuple(int(d) for d in shape)
    binding: dict[str, int] = {}
    where: dict[str, str] = {}
    for k, n in (dims or {}).items():
        binding[str(k)], where[str(k)] = int(n), "the given dims"
    for name, shape in given.items():
        model = by_name[name].type.shape
        if model is None:
            continue
        if len(model) != len(shape):
            raise InputError(f"{option} gives input '{name}' {len(shape)} dim(s) {list(shape)}; the model's input has "
                             f"{len(model)}: {_dims_text(model)}",
                             hint=f'give all its dims, e.g. {option} "{name}:{_example(model, shape)}"')
        for i, (m, d) in enumerate(zip(model, shape)):
            if isinstance(m, int) and m != d:
                raise InputError(f"{option} gives input '{name}' dim {i} = {d}; the model's input has {m} there "
                                 f"({_dims_text(model)})", hint=f'for example {option} "{name}:{_example(model, shape)}"')
            if isinstance(m, str):
                if m in binding and binding[m] != d:
                    raise InputError(f"symbolic dim '{m}' is {binding[m]} in {where[m]} but {d} in input '{name}' "
                                     f"({option}): one symbol takes one size", hint=f"give '{m}' the same size everywhere")
                binding[m], where[m] = d, f"input '{name}'"
    for name, arr in (known or {}).items():
        model = by_name[name].type.shape if name in by_name else None
        got = np.shape(arr)
        if model is not None and len(model) == len(got):
            for m, d in zip(model, got):
                if isinstance(m, str):
                    binding.setdefault(m, int(d))
    out: dict[str, tuple[int, ...]] = {}
    missing: list[Any] = []  # the inputs nothing sized (with default_dim None)
    for v in graph.inputs:
        if v.name in given:
            out[v.name] = given[v.name]
            continue
        if v.name in (known or {}):  # fed already: its own shape
            out[v.name] = tuple(int(d) for d in np.shape((known or {})[v.name]))
            continue
        model = v.type.shape
        if model is None:
            if default_dim is None:
                missing.append(v)
            out[v.name] = ()
            continue
        shape = []
        for d in model:
            if isinstance(d, int):
                shape.append(d)
            elif isinstance(d, str) and d in binding:
                shape.append(binding[d])
            elif default_dim is not None:
                shape.append(default_dim)
            else:
                missing.append(v)
                break
        out[v.name] = tuple(shape)
    if missing:
        many = len(missing) > 1
        raise InputError(f"random inputs need a size for every dim: input{'s' if many else ''} "
                         + ", ".join(f"'{v.name}' {_dims_text(v.type.shape)}" for v in missing)
                         + f" {'have' if many else 'has'} symbolic or unknown dims that nothing sized",
                         hint=f"pass {option} with {'their' if many else 'its'} shape, e.g. {option} \""
                              + ";".join(f"{v.name}:{_example(v.type.shape)}" for v in missing) + '"'
                              + (" (a symbol shared by several inputs takes the size given for one of them)"
                                 if many else ""))
    return out


def _example(model: tuple | None, shape: Sequence[int] | None = None) -> str:
    """``2,3,224,224``-style text of a shape: the model's static dims, given sizes, else 1."""
    if model is None:
        return ",".join(str(d) for d in shape) if shape else "1"
    given = list(shape) if shape is not None and len(shape) == len(model) else None
    return ",".join(str(d) if isinstance(d, int) else str(given[i]) if given else "1" for i, d in enumerate(model))


def random_inputs(graph: Graph, seed: int = 0, dims: Mapping[str, int] | None = None, *, default_dim: int | None = 1,
                  strict: bool = False, shapes: Mapping[str, Sequence[Any]] | None = None,
                  known: Mapping[str, Any] | None = None, option: str = "shapes") -> dict[str, np.ndarray]:
    """Random feeds: floats standard normal, integers in [0, 4), booleans, strings ``"a"``.

    Their shapes are :func:`input_shapes`'s (``shapes`` by input, ``dims`` by symbol, sizes of
    ``known`` feeds; else ``default_dim``, or an InputError naming the input when that is None).
    ``strict`` refuses inputs of unknown rank or string dtype (a test wants to say so) instead
    of guessing a scalar or a string.
    """
    if strict:
        for v in graph.inputs:
            if v.type.shape is None and v.name not in (shapes or {}):
                raise GEError(f"input '{v.name}' has an unknown rank; give feeds= explicitly")
    sized = input_shapes(graph, shapes, dims, default_dim=default_dim, known=known, option=option)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        shape = sized[v.name]
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
