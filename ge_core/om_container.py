"""The binary container of an offline model (``.om``) file: header, partition table, partitions.

This module knows nothing about graphs or weights; it stores named byte *partitions* (``"model"``,
``"weights"``, ...) in one file that can be validated before any use. The layout (a 96-byte
header, a table of 48-byte entries, aligned partitions, every byte covered by a CRC or required
to be zero) is described in ``docs/om-format.md``.

Writing is atomic (a temporary file in the target directory, fsynced, renamed over the target).
Reading takes a *snapshot*: the file is read once into private anonymous memory and validated
on the bytes read; :meth:`Container.partition` gives zero-copy read-only views of it, so nothing
later done to the file reaches an open container. Any byte content gives an
:class:`OmFormatError`; a missing, unreadable or non-regular file a :class:`ModelFileError`.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol, Union, runtime_checkable

import numpy as np

from .errors import ModelFileError, OmFormatError
from .writes import discard, fsync_directory, temp_beside

if TYPE_CHECKING:
    from .plugins import PluginHost

__all__ = [
    "FORMAT_VERSION",
    "Container",
    "PartitionInfo",
    "anonymous_buffer",
    "read_container",
    "read_file_into",
    "read_partition",
    "write_file_atomic",
    "write_container",
]

MAGIC = b"GEOM"
SIGNATURE = b"\r\n\x1a\n"
FORMAT_VERSION = (1, 0)

HEADER_STRUCT = struct.Struct("<4s4sHHI32sIIQIIQ12sI")
HEADER_SIZE = HEADER_STRUCT.size  # 96
HEADER_CRC_OFFSET = HEADER_SIZE - 4
ENTRY_STRUCT = struct.Struct("<16sQQIIII")
ENTRY_SIZE = ENTRY_STRUCT.size  # 48

PRODUCER_SIZE = 32
KIND_SIZE = 16
MAX_PARTITIONS = 64
MAX_ALIGNMENT = 1 << 21
MAX_HEADER_SIZE = 4096
MAX_ENTRY_SIZE = 1024

_RECREATE = "re-create it with `ge compile`"
_COMPILE = "compile it with `ge compile`"

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]
PartitionData = Union[Buffer, Iterable[Buffer]]

assert HEADER_SIZE == 96 and ENTRY_SIZE == 48


@dataclass(frozen=True)
class PartitionInfo:
    """One entry of the partition table."""

    kind: str
    offset: int
    size: int
    alignment: int
    crc32: int
    flags: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "offset": self.offset,
            "size": self.size,
            "alignment": self.alignment,
            "crc32": f"{self.crc32:08x}",
            "flags": self.flags,
        }


# --------------------------------------------------------------------------- packing


def _pack_header(
    *,
    producer: bytes,
    partition_count: int,
    table_offset: int,
    table_crc32: int,
    file_size: int,
    version: tuple[int, int] = FORMAT_VERSION,
    flags: int = 0,
    table_entry_size: int = ENTRY_SIZE,
    header_size: int = HEADER_SIZE,
    extra: bytes = b"",
) -> bytes:
    """The header bytes (``header_size`` of them, ``extra`` after the 96 known ones), CRC set."""
    body = HEADER_STRUCT.pack(
        MAGIC, SIGNATURE, version[0], version[1], header_size, producer, flags,
        partition_count, table_offset, table_entry_size, table_crc32, file_size,
        b"\0" * 12, 0,
    ) + extra.ljust(header_size - HEADER_SIZE, b"\0")
    crc = zlib.crc32(body)
    return body[:HEADER_CRC_OFFSET] + struct.pack("<I", crc) + body[HEADER_SIZE:]


def _pack_entry(info: PartitionInfo) -> bytes:
    return ENTRY_STRUCT.pack(
        info.kind.encode("ascii"), info.offset, info.size, info.alignment, info.crc32,
        info.flags, 0,
    )


def _encode_producer(producer: str) -> bytes:
    raw = str(producer).replace("\0", "").encode("utf-8")
    if len(raw) > PRODUCER_SIZE:  # cut at a character boundary
        raw = raw[:PRODUCER_SIZE].decode("utf-8", errors="ignore").encode("utf-8")
    return raw


def _valid_kind(kind: str) -> bool:
    return 1 <= len(kind) <= KIND_SIZE and all(0x21 <= ord(c) <= 0x7E for c in kind)


def _valid_alignment(alignment: int) -> bool:
    return 1 <= alignment <= MAX_ALIGNMENT and alignment & (alignment - 1) == 0


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# --------------------------------------------------------------------------- writing


def _as_bytes_view(obj: Any, kind: str) -> memoryview:
    """A flat, contiguous, unsigned-byte memoryview of ``obj`` (no copy when possible)."""
    if isinstance(obj, np.ndarray):
        try:
            flat = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
        except (TypeError, ValueError) as e:
            raise OmFormatError(
                f"cannot store an array of dtype {obj.dtype} in partition {kind!r}: {e}",
                hint="store numeric arrays only",
            ) from None
        return memoryview(flat)  # type: ignore[arg-type]  # ndarray is a buffer
    view = memoryview(obj)
    if view.format in ("B", "b", "c") and view.ndim == 1 and view.contiguous:
        return view.cast("B") if view.format != "B" else view
    if view.c_contiguous:
        try:
            return view.cast("B")
        except TypeError:
            pass
    return memoryview(view.tobytes())


def _chunks(data: Any, kind: str) -> Iterable[memoryview]:
    """The chunks of one partition's data, each as a byte view."""
    if isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
        yield _as_bytes_view(data, kind)
        return
    try:
        memoryview(data).release()  # any other object with the buffer protocol
    except TypeError:
        pass
    else:
        yield _as_bytes_view(data, kind)
        return
    if isinstance(data, (str, dict)) or not hasattr(data, "__iter__"):
        raise OmFormatError(
            f"partition {kind!r}: data of type {type(data).__name__} is not a buffer "
            "or a sequence of buffers",
            hint="pass bytes, a NumPy array, or a list of them",
        )
    for chunk in data:
        try:
            yield _as_bytes_view(chunk, kind)
        except TypeError:
            raise OmFormatError(
                f"partition {kind!r}: a chunk of type {type(chunk).__name__} is not a buffer",
                hint="pass bytes, a NumPy array, or a list of them",
            ) from None


def _check_partitions(partitions: Any) -> list[tuple[str, Any, int]]:
    checked = []
    seen: set[str] = set()
    items = list(partitions)
    if len(items) > MAX_PARTITIONS:
        raise OmFormatError(
            f"{len(items)} partitions given, at most {MAX_PARTITIONS} fit in an .om file"
        )
    for item in items:
        try:
            kind, data, alignment = item
        except (TypeError, ValueError):
            raise OmFormatError(
                f"partition {item!r:.60} is not a (kind, data, alignment) tuple"
            ) from None
        if not isinstance(kind, str) or not _valid_kind(kind):
            raise OmFormatError(
                f"partition kind {kind!r} is invalid",
                hint=f"use 1 to {KIND_SIZE} printable ascii characters without spaces",
            )
        if kind in seen:
            raise OmFormatError(f"partition kind {kind!r} is given twice")
        seen.add(kind)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or not _valid_alignment(
            alignment
        ):
            raise OmFormatError(
                f"partition {kind!r}: alignment {alignment!r} is invalid",
                hint=f"use a power of two from 1 to {MAX_ALIGNMENT}",
            )
        checked.append((kind, data, alignment))
    return checked


def _replace_atomically(path: str, write: Callable[[IO[bytes]], Any], hint: str) -> Any:
    """Run ``write(f)`` on a temporary file beside ``path``, flush and fsync it and rename it over
    ``path``; returns what ``write`` returned. Failing to write is a :class:`ModelFileError`
    (with ``hint``); no temporary file remains after any failure."""
    tmp = None
    try:
        f, tmp = temp_beside(path)
        with f:
            out = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        return out
    except OSError as e:
        raise ModelFileError(f"cannot write {path}: {e.strerror or e}", hint=hint) from e
    finally:
        discard(tmp)


def write_container(
    path: str | os.PathLike[str],
    partitions: Iterable[tuple[str, PartitionData, int]],
    producer: str,
) -> None:
    """Write an .om container with ``partitions`` to ``path``, atomically.

    Each partition is ``(kind, data, alignment)``: ``data`` is a buffer (bytes, bytearray,
    memoryview, NumPy array, any buffer-protocol object) or an iterable of buffers written one
    after another; ``alignment`` is a power of two (4096 for weights). Invalid arguments raise
    :class:`OmFormatError`; failing to write raises :class:`ModelFileError`. On any failure the
    previous file at ``path`` (if any) is left untouched and no temporary file remains.
    """
    path = os.fsdecode(os.fspath(path))
    if "\0" in path:
        raise ModelFileError(f"cannot write {path!r}: the path holds a NUL character", hint="pass a file name")
    checked = _check_partitions(partitions)
    producer_raw = _encode_producer(producer)
    table_offset = HEADER_SIZE
    table_end = table_offset + ENTRY_SIZE * len(checked)

    def write(f: IO[bytes]) -> None:
        f.write(b"\0" * table_end)  # header and table are written last
        pos = table_end
        infos = []
        for kind, data, alignment in checked:
            start = _align(pos, alignment)
            if start > pos:
                f.write(b"\0" * (start - pos))
            size = 0
            crc = 0
            for chunk in _chunks(data, kind):
                f.write(chunk)
                crc = zlib.crc32(chunk, crc)
                size += chunk.nbytes
            pos = start + size
            infos.append(PartitionInfo(kind, start, size, alignment, crc))
        table = b"".join(_pack_entry(info) for info in infos)
        header = _pack_header(
            producer=producer_raw,
            partition_count=len(infos),
            table_offset=table_offset,
            table_crc32=zlib.crc32(table),
            file_size=pos,
        )
        f.seek(0)
        f.write(header + table)

    _replace_atomically(path, write, "check that the directory exists and is writable and that the path is not a directory")
    fsync_directory(os.path.dirname(path))


# --------------------------------------------------------------------------- reading


def _sniff(head: bytes) -> str | None:
    """What a file that does not start with the .om magic looks like, if recognisable."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"):
        return "a zip archive (e.g. a PyTorch or Keras model)"
    if head.startswith(b"\x89HDF"):
        return "an HDF5 file (e.g. a Keras .h5 model)"
    if len(head) >= 8 and head[4:8] == b"TFL3":
        return "a TensorFlow Lite model"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle"
    if head[:1] in (b"\x08", b"\x0a"):
        return "a protobuf file (e.g. an ONNX model or a TensorFlow graph)"
    if head[:1] in (b"{", b"["):
        return "a JSON file"
    if head and all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        return "a text file"
    return None


class _Reader:
    """Validates the raw bytes of an .om file; raises OmFormatError on the first problem."""

    def __init__(self, path: str, buf: memoryview) -> None:
        self.path = path
        self.buf = buf
        self.size = len(buf)

    def fail(self, what: str, hint: str = _RECREATE) -> OmFormatError:
        return OmFormatError(f"{self.path}: {what}", hint=hint)

    def truncated(self, expected: int, where: str) -> OmFormatError:
        return self.fail(
            f"the file is truncated: expected {'at least ' if where else ''}{expected} bytes"
            f"{where}, found {self.size}"
        )

    def check_signature(self) -> None:
        head = bytes(self.buf[: len(MAGIC) + len(SIGNATURE)])
        n = len(head)
        if head[:4] == MAGIC[: min(n, 4)]:
            if n < 8 and head == (MAGIC + SIGNATURE)[:n]:
                raise self.truncated(HEADER_SIZE, " for the header")
            if head[4:] != SIGNATURE[: n - 4]:
                raise self.fail(
                    "the file signature is damaged; it looks like it was copied in text mode "
                    "(line endings converted)",
                    hint="copy it in binary mode or " + _RECREATE,
                )
            return
        what = _sniff(bytes(self.buf[:64]))
        looks = f" (it looks like {what})" if what else ""
        raise self.fail(f"this is not an .om file{looks}", hint=_COMPILE)

    def parse(self) -> tuple[dict[str, Any], list[PartitionInfo]]:
        self.check_signature()
        if self.size < HEADER_SIZE:
            raise self.truncated(HEADER_SIZE, " for the header")
        (_, _, major, minor, header_size, producer, flags, count, table_offset, entry_size,
         table_crc, file_size, _, header_crc) = HEADER_STRUCT.unpack_from(self.buf, 0)
        if major != FORMAT_VERSION[0]:
            raise self.fail(
                f"format version {major}.{minor} is not supported; this reader reads "
                f"version {FORMAT_VERSION[0]}.x",
                hint="load it with the GE version that wrote it, or " + _RECREATE,
            )
        if not (HEADER_SIZE <= header_size <= MAX_HEADER_SIZE and header_size % 8 == 0):
            raise self.fail(f"the header is corrupted (header size {header_size} is invalid)")
        if self.size < header_size:
            raise self.fail(
                f"the file is truncated or its header is corrupted: expected at least "
                f"{header_size} bytes for the header, found {self.size}"
            )
        crc = zlib.crc32(self.buf[:HEADER_CRC_OFFSET])
        crc = zlib.crc32(b"\0\0\0\0", crc)
        crc = zlib.crc32(self.buf[HEADER_SIZE:header_size], crc)
        if crc != header_crc:
            raise self.fail("the header is corrupted (checksum mismatch)")
        if self.size < file_size:
            raise self.truncated(file_size, "")
        if self.size > file_size:
            raise self.fail(
                f"the file has {self.size - file_size} unexpected bytes after its recorded "
                f"end ({file_size} bytes)"
            )
        if count > MAX_PARTITIONS:
            raise self.fail(f"the header is corrupted ({count} partitions, at most {MAX_PARTITIONS})")
        if not (ENTRY_SIZE <= entry_size <= MAX_ENTRY_SIZE and entry_size % 8 == 0):
            raise self.fail(f"the header is corrupted (table entry size {entry_size} is invalid)")
        table_end = table_offset + count * entry_size
        if table_offset < header_size or table_offset % 8 or table_end > file_size:
            raise self.fail(
                f"the header is corrupted (partition table at {table_offset}..{table_end} "
                f"is outside {header_size}..{file_size})"
            )
        if zlib.crc32(self.buf[table_offset:table_end]) != table_crc:
            raise self.fail("the partition table is corrupted (checksum mismatch)")

        entries = [self.parse_entry(i, table_offset + i * entry_size, table_end) for i in range(count)]
        self.check_layout(entries, header_size, table_offset, table_end)
        nul = producer.find(b"\0")
        header = {
            "format_version": (major, minor),
            "producer": (producer if nul < 0 else producer[:nul]).decode("utf-8", "replace"),
            "flags": flags,
            "header_size": header_size,
            "partition_count": count,
            "table_offset": table_offset,
            "table_entry_size": entry_size,
            "file_size": file_size,
            "header_crc32": header_crc,
            "table_crc32": table_crc,
        }
        return header, entries

    def parse_entry(self, index: int, at: int, table_end: int) -> PartitionInfo:
        raw_kind, offset, size, alignment, crc, flags, _ = ENTRY_STRUCT.unpack_from(self.buf, at)
        name = raw_kind.rstrip(b"\0")
        if not name or b"\0" in name or not all(0x21 <= b <= 0x7E for b in name):
            raise self.fail(f"partition #{index} has an invalid kind name {raw_kind!r}")
        kind = name.decode("ascii")
        if not _valid_alignment(alignment):
            raise self.fail(f"partition {kind!r} has an invalid alignment {alignment}")
        if offset % alignment:
            raise self.fail(f"partition {kind!r} at offset {offset} is not aligned to {alignment}")
        if offset < table_end or offset + size > self.size:
            raise self.fail(
                f"partition {kind!r} at {offset}..{offset + size} is outside the data area "
                f"{table_end}..{self.size}"
            )
        return PartitionInfo(kind, offset, size, alignment, crc, flags)

    def check_layout(
        self, entries: list[PartitionInfo], header_size: int, table_offset: int, table_end: int
    ) -> None:
        kinds: set[str] = set()
        for e in entries:
            if e.kind in kinds:
                raise self.fail(f"partition kind {e.kind!r} appears twice in the table")
            kinds.add(e.kind)
        gaps = [(header_size, table_offset)]
        cursor = table_end
        previous = None
        for e in sorted(entries, key=lambda e: (e.offset, e.size)):
            if e.offset < cursor:
                raise self.fail(f"partitions {previous!r} and {e.kind!r} overlap")
            gaps.append((cursor, e.offset))
            cursor = e.offset + e.size
            previous = e.kind
        gaps.append((cursor, self.size))
        for start, end in gaps:
            if end > start and self.nonzero(start, end):
                raise self.fail(f"the file is corrupted (unexpected data in padding at {start}..{end})")

    def nonzero(self, start: int, end: int) -> bool:
        arr = np.frombuffer(self.buf, dtype=np.uint8, count=end - start, offset=start)
        try:
            return bool(arr.any())
        finally:
            del arr

    def verify(self, entries: list[PartitionInfo]) -> None:
        for e in entries:
            if zlib.crc32(self.buf[e.offset : e.offset + e.size]) != e.crc32:
                raise self.fail(f"partition {e.kind!r} is corrupted (checksum mismatch)")


_READ_HINT = "check the path and its permissions"
#: Bytes per ``read`` call when taking a snapshot (a bounded syscall; the loop fills the buffer).
READ_CHUNK = 1 << 24
_HUGE_PAGE = 1 << 21


def anonymous_buffer(size: int, path: str = "") -> mmap.mmap:
    """A zero-filled, writable, page-aligned buffer of ``size`` (> 0) bytes in process-private
    anonymous memory (``MAP_PRIVATE | MAP_ANONYMOUS`` where the platform has it): no file backs it,
    so nothing done to any file can take its pages away. Out of memory is a ModelFileError."""
    try:
        private = getattr(mmap, "MAP_PRIVATE", None)
        if private is None:
            return mmap.mmap(-1, size)
        buf = mmap.mmap(-1, size, flags=private, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        huge = getattr(mmap, "MADV_HUGEPAGE", None)
        if huge is not None and size >= _HUGE_PAGE:
            try:  # a few 2 MiB faults instead of one per 4 KiB page: the read runs at memcpy speed
                buf.madvise(huge)
            except OSError:
                pass
        return buf
    except (OSError, OverflowError, ValueError, MemoryError) as e:
        detail = getattr(e, "strerror", None) or e
        raise ModelFileError(f"{path or 'a model file'}: cannot allocate {size} bytes to load it: {detail}",
                             hint="free memory, or load it on a machine with more") from None


def _nonblocking(file: str, flags: int) -> int:
    return os.open(file, flags | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)


def _open_regular(path: str, what: str = ".om file") -> tuple[Any, int]:
    """``(file, size)`` of the regular file at ``path``, opened unbuffered for reading
    (non-blocking, so a FIFO swapped in after the check cannot hang the open); ModelFileError for a
    missing, unreadable, directory or non-regular path."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file", hint=_READ_HINT) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise ModelFileError(f"{path!r}: cannot read: {getattr(e, 'strerror', None) or e}", hint=_READ_HINT) from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(f"{path}: is a directory, not {'an' if what[0] in '.aeiou' else 'a'} {what}",
                             hint=f"pass the {what}")
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"{path}: is not a regular file", hint=f"pass the {what}")
    try:
        f = open(path, "rb", buffering=0, opener=_nonblocking)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file (it was removed while being opened)", hint=_READ_HINT) from None
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}", hint=_READ_HINT) from None
    try:
        st = os.fstat(f.fileno())
    except OSError as e:
        f.close()
        raise ModelFileError(f"{path}: cannot read: {e.strerror or e}", hint=_READ_HINT) from None
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise ModelFileError(f"{path}: is not a regular file", hint=f"pass the {what}")
    return f, st.st_size


def _fill(f: Any, view: memoryview, path: str) -> int:
    """Read from ``fd`` into ``view`` until it is full or the file ends; the bytes read. One
    more byte is then asked for: a file longer than ``view`` counts as ``len(view) + 1``."""
    pos, n = 0, len(view)
    try:
        while pos < n:
            got = f.readinto(view[pos:min(n, pos + READ_CHUNK)])
            if not got:
                return pos
            pos += got
        return n + 1 if f.read(1) else n
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read: {e.strerror or e}", hint=_READ_HINT) from None


def _changed(path: str, expected: int, got: int) -> ModelFileError:
    now = "more" if got > expected else f"only {got}"
    return ModelFileError(
        f"{path}: the file changed while it was being read (it had {expected} bytes, then {now})",
        hint="another program is writing it: load it again once the writing is done")


def _read_snapshot(path: str) -> mmap.mmap | None:
    """The bytes of the regular file at ``path`` in private anonymous memory (None for an empty
    file). Raises ModelFileError for I/O problems and for a file that changes size while read."""
    f, size = _open_regular(path)
    try:
        if size == 0:
            return None
        buf = anonymous_buffer(size, path)
        view = memoryview(buf)
        try:
            got = _fill(f, view, path)
        finally:
            view.release()
        if got != size:
            buf.close()
            raise _changed(path, size, got)
        return buf
    finally:
        f.close()


def read_file_into(path: str, view: memoryview) -> int:
    """Fill ``view`` with the bytes of the regular file at ``path``, which must be exactly
    ``len(view)`` bytes long; returns the file's size. A file of another size is not read (its
    size is returned: the caller says what it expected); one that changes size while read, a
    missing, unreadable or non-regular file is a :class:`ModelFileError`. Used for the external
    weight files of an .om, so they too are a snapshot in private memory."""
    f, size = _open_regular(path, "weight file")
    try:
        if size != len(view):
            return size
        got = _fill(f, view, path)
        if got != size:
            raise _changed(path, size, got)
        return size
    finally:
        f.close()


class Container:
    """An open, validated .om container; partitions are zero-copy read-only views of a snapshot
    of the file in private memory (the file itself is not held open or mapped).

    Use as a context manager or call :meth:`close`. Views (and NumPy arrays made from them with
    ``np.frombuffer``) keep the snapshot alive: :meth:`close` frees it at once when none are left,
    otherwise it is freed when the last of them is garbage-collected.
    """

    def __init__(
        self, path: str, mapping: mmap.mmap, header: dict[str, Any], entries: list[PartitionInfo]
    ) -> None:
        self.path = path
        self.format_version: tuple[int, int] = header["format_version"]
        self.producer: str = header["producer"]
        self.flags: int = header["flags"]
        self.file_size: int = header["file_size"]
        self._header = header
        self._entries = {e.kind: e for e in entries}
        self._mmap: mmap.mmap | None = mapping  # the snapshot: anonymous memory, not the file
        self._view: memoryview | None = memoryview(mapping).toreadonly()

    @property
    def header(self) -> dict[str, Any]:
        """The checked header: format_version, producer, flags, sizes, table offset, CRCs."""
        return dict(self._header)

    def kinds(self) -> list[str]:
        """The partition kinds, in table order."""
        return list(self._entries)

    def __contains__(self, kind: object) -> bool:
        return kind in self._entries

    def info(self, kind: str) -> PartitionInfo:
        """The table entry of partition ``kind``."""
        try:
            return self._entries[kind]
        except KeyError:
            raise OmFormatError(
                f"{self.path}: has no {kind!r} partition (it has: {', '.join(self._entries) or 'none'})",
                hint=_RECREATE,
            ) from None

    def partition(self, kind: str) -> memoryview:
        """A read-only, zero-copy view of partition ``kind``'s bytes (in the snapshot)."""
        e = self.info(kind)
        if self._view is None:
            raise ValueError(f"{self.path}: container is closed")
        return self._view[e.offset : e.offset + e.size]

    @property
    def closed(self) -> bool:
        return self._view is None

    def close(self) -> None:
        """Free the snapshot (deferred while views of it are still alive). Idempotent."""
        view, mapping = self._view, self._mmap
        self._view = self._mmap = None
        if view is not None:
            view.release()
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # views still exported; freed when the last one is collected

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Container {self.path!r} v{self.format_version[0]}.{self.format_version[1]} {self.kinds()} {state}>"


def _load(path: str | os.PathLike[str], verify_checksums: bool) -> tuple[
    str, mmap.mmap, dict[str, Any], list[PartitionInfo]
]:
    path = os.fsdecode(os.fspath(path))
    mapping = _read_snapshot(path)
    if mapping is None:
        raise OmFormatError(
            f"{path}: the file is empty (0 bytes); it is truncated or this is not an .om file",
            hint=_RECREATE,
        )
    view = memoryview(mapping)
    try:
        reader = _Reader(path, view)
        header, entries = reader.parse()
        if verify_checksums:
            reader.verify(entries)
    except BaseException:
        try:
            view.release()
            mapping.close()
        except BufferError:  # a traceback still references a view; the GC unmaps later
            pass
        raise
    view.release()
    return path, mapping, header, entries


def read_container(path: str | os.PathLike[str], *, verify_checksums: bool = True) -> Container:
    """Open and validate the .om container at ``path``.

    The file is read once into private memory and everything is checked on the bytes read,
    before use: signature, version, header and table checksums, sizes, bounds, alignment,
    overlaps, padding, and (with ``verify_checksums``) every partition's CRC32. Later changes to
    the file do not reach the container. Raises :class:`OmFormatError` for bad content, :class:`ModelFileError` for I/O problems.
    """
    return Container(*_load(path, verify_checksums))


def read_partition(path: str | os.PathLike[str], kind: str, *, max_size: int) -> bytes | None:
    """The bytes of partition ``kind`` of the .om at ``path``, reading only the header, the
    partition table and that partition (header, table and partition CRCs checked); None when the
    file is not an .om, has no such partition or it is larger than ``max_size``. Never raises for
    bad content; a missing or unreadable file is a :class:`ModelFileError`. For a writer that
    wants to know what the file it replaces names (never for loading a model)."""
    path = os.fsdecode(os.fspath(path))
    f, size = _open_regular(path)

    def pread(n: int, at: int) -> bytes:
        f.seek(at)
        buf = bytearray(n)
        got = _fill(f, memoryview(buf), path)
        return bytes(buf[:got])

    try:
        head = pread(HEADER_SIZE, 0)
        if len(head) < HEADER_SIZE or head[:8] != MAGIC + SIGNATURE:
            return None
        (_, _, major, _, header_size, _, _, count, table_offset, entry_size, table_crc, file_size, _,
         header_crc) = HEADER_STRUCT.unpack_from(head, 0)
        if (major != FORMAT_VERSION[0] or not HEADER_SIZE <= header_size <= MAX_HEADER_SIZE
                or count > MAX_PARTITIONS or not ENTRY_SIZE <= entry_size <= MAX_ENTRY_SIZE
                or file_size != size):
            return None
        head = pread(header_size, 0)
        if len(head) != header_size or zlib.crc32(
                head[HEADER_SIZE:], zlib.crc32(b"\0\0\0\0", zlib.crc32(head[:HEADER_CRC_OFFSET]))) != header_crc:
            return None
        table = pread(count * entry_size, table_offset)
        if len(table) != count * entry_size or zlib.crc32(table) != table_crc:
            return None
        for i in range(count):
            raw_kind, offset, psize, _, crc, _, _ = ENTRY_STRUCT.unpack_from(table, i * entry_size)
            if raw_kind.rstrip(b"\0") != kind.encode("ascii", "replace"):
                continue
            if psize > max_size or offset + psize > size:
                return None
            data = pread(psize, offset) if psize else b""
            return data if len(data) == psize and zlib.crc32(data) == crc else None
        return None
    except (OSError, struct.error, ModelFileError):
        return None
    finally:
        f.close()


def write_file_atomic(path: str, chunks: Iterable[Buffer]) -> tuple[int, int]:
    """Write ``chunks`` to ``path`` as :func:`write_container` writes (temporary file beside it,
    fsync, rename); returns (size, crc32). A failure is a :class:`ModelFileError` and leaves no
    temporary file."""
    def write(f: IO[bytes]) -> tuple[int, int]:
        size = crc = 0
        for chunk in chunks:
            view = _as_bytes_view(chunk, "file")
            f.write(view)
            crc = zlib.crc32(view, crc)
            size += view.nbytes
        return size, crc

    return _replace_atomically(path, write, "check that the folder exists and is writable")


#: The partitions the core reads; an .om holding another one that a plugin registered
#: (``ge_register_om_kinds``) is that plugin's kind of .om.
CORE_PARTITIONS = ("model", "weights")


@runtime_checkable
class OmKind(Protocol):
    """A kind of .om a plugin defines (``ge_register_om_kinds``): it reads the files whose
    container holds its partition. Each method gets the path and the open container, whose
    header, partition table and checksums the core has checked; everything else in it is data
    from a stranger, checked by the kind as ``ge_core.om.load_om`` checks a model (the public functions
    of :mod:`ge_core.om` do the core's part: ``read_model_definition``, ``weight_buffers``,
    ``model_from_definition``; ``ge_sdk.omdesc.definition_summary``)."""

    def load(self, path: str, container: Container, host: PluginHost, verify_checksums: bool,
             run_options: dict[str, Any] | None) -> Any:
        """The loaded model: an object with :class:`CompiledModel`'s interface (``run``,
        ``input_names``/``output_names``, ``inputs``/``outputs``, ``report``, ``timings``, ``save``)."""

    def inspect(self, path: str, container: Container) -> dict[str, Any]:
        """``ge_sdk.omdesc.inspect_om``'s ``model``, ``report`` and ``streams`` (and the kind's own keys)."""

    def definition(self, path: str, container: Container) -> dict[str, Any]:
        """The checked model definition that stands for the file (``ge_core.om.stored_definition``)."""
