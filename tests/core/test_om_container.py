"""Tests of the .om binary container: layout, zero-copy reads, validation, atomic writes."""

from __future__ import annotations

import gc
import json
import os
import random
import struct
import zlib

import numpy as np
import pytest

from ge_core import om_container as om
from ge_core.errors import GEError, ModelFileError, OmFormatError
from ge_core.om_container import Container, read_container, write_container
from ge_sdk.omdesc import describe


def small_partitions():
    return [
        ("model", b'{"graph": "g"}', 8),
        ("weights", [np.arange(5, dtype=np.float32), b"\x01\x02\x03", bytearray(b"xyz")], 64),
        ("extra", memoryview(b"tail-bytes"), 1),
        ("empty", b"", 16),
    ]


def small_expected():
    return {
        "model": b'{"graph": "g"}',
        "weights": np.arange(5, dtype=np.float32).tobytes() + b"\x01\x02\x03xyz",
        "extra": b"tail-bytes",
        "empty": b"",
    }


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "small.om"
    write_container(path, small_partitions(), producer="ge-test 1.0")
    return path


def contents(path, **kw):
    with read_container(path, **kw) as c:
        return {k: bytes(c.partition(k)) for k in c.kinds()}


def rewrite_header(data: bytes, **changes) -> bytes:
    """``data`` with header fields changed and the header CRC recomputed."""
    fields = list(om.HEADER_STRUCT.unpack_from(data, 0))
    names = ["magic", "signature", "major", "minor", "header_size", "producer", "flags",
             "count", "table_offset", "entry_size", "table_crc", "file_size", "reserved", "crc"]
    for name, value in changes.items():
        fields[names.index(name)] = value
    fields[-1] = 0
    header_size = fields[4]
    body = bytearray(om.HEADER_STRUCT.pack(*fields) + data[om.HEADER_SIZE:header_size])
    struct.pack_into("<I", body, om.HEADER_CRC_OFFSET, zlib.crc32(bytes(body)))
    return bytes(body) + data[header_size:]


# --------------------------------------------------------------------------- round trip


def test_roundtrip_contents_and_metadata(small_file):
    with read_container(small_file) as c:
        assert isinstance(c, Container)
        assert c.kinds() == ["model", "weights", "extra", "empty"]
        assert c.format_version == om.FORMAT_VERSION
        assert c.producer == "ge-test 1.0"
        assert c.path == str(small_file)
        for kind, expected in small_expected().items():
            assert bytes(c.partition(kind)) == expected
        assert os.path.getsize(small_file) == c.file_size


def test_partitions_are_aligned_and_laid_out_after_table(tmp_path):
    path = tmp_path / "aligned.om"
    parts = [("a", b"x" * 3, 1), ("b", b"y" * 5, 8), ("weights", [b"z" * 7, b"w"], 4096),
             ("c", b"q", 64), ("d", b"", 2048)]
    write_container(path, parts, producer="p")
    info = describe(path)
    table_end = info["table_offset"] + len(parts) * info["table_entry_size"]
    prev_end = table_end
    for entry, (kind, _, alignment) in zip(info["partitions"], parts):
        assert entry["kind"] == kind
        assert entry["alignment"] == alignment
        assert entry["offset"] % alignment == 0
        assert entry["offset"] >= prev_end
        prev_end = entry["offset"] + entry["size"]
    assert info["partitions"][2]["offset"] == 4096
    assert info["partitions"][2]["size"] == 8


def test_numpy_arrays_any_layout(tmp_path):
    path = tmp_path / "np.om"
    f = np.arange(24, dtype=np.float64).reshape(4, 6)
    arrays = [f, f.T, f[:, ::2], np.float32(3.5) * np.ones(()), np.arange(3, dtype=">i4"),
              np.array([True, False]), np.zeros((0, 3), np.int8)]
    write_container(path, [("weights", arrays, 4096)], producer="p")
    expected = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    assert contents(path)["weights"] == expected


def test_zero_copy_view_backed_by_mapping(tmp_path):
    path = tmp_path / "w.om"
    weights = np.arange(1000, dtype=np.float32)
    write_container(path, [("model", b"m", 8), ("weights", weights, 4096)], producer="p")
    c = read_container(path)
    view = c.partition("weights")
    assert view.readonly
    assert type(view.obj).__name__ == "mmap"
    arr = np.frombuffer(view, dtype=np.float32)
    np.testing.assert_array_equal(arr, weights)
    assert not arr.flags.writeable
    assert not arr.flags.owndata
    assert arr.ctypes.data % 4096 == 0  # the mapping is page aligned, the partition at 4096
    # two views of the same partition share memory: no copy was made
    arr2 = np.frombuffer(c.partition("weights"), dtype=np.float32)
    assert np.shares_memory(arr, arr2)
    # arrays outlive close(); the mapping is released when they go
    c.close()
    assert c.closed
    np.testing.assert_array_equal(arr, weights)
    del view, arr, arr2
    gc.collect()
    c.close()  # idempotent


def test_closed_container_refuses_views(small_file):
    c = read_container(small_file)
    c.close()
    with pytest.raises(ValueError):
        c.partition("model")


def test_missing_kind_named(small_file):
    with read_container(small_file) as c:
        assert "model" in c and "nope" not in c
        with pytest.raises(OmFormatError, match="'nope'.*model, weights"):
            c.partition("nope")


def test_generator_chunks_and_empty_container(tmp_path):
    path = tmp_path / "gen.om"
    write_container(path, [("w", (bytes([i]) * i for i in range(10)), 64)], producer="p")
    assert contents(path)["w"] == b"".join(bytes([i]) * i for i in range(10))
    empty = tmp_path / "none.om"
    write_container(empty, [], producer="p")
    assert contents(empty) == {}


def test_describe_is_json_able(small_file):
    info = describe(small_file)
    json.dumps(info)
    assert info["format_version"] == "1.0"
    assert info["producer"] == "ge-test 1.0"
    assert [p["kind"] for p in info["partitions"]] == ["model", "weights", "extra", "empty"]
    assert describe(small_file, verify_checksums=True)["checksums_verified"] is True


def test_long_unicode_producer_truncated_at_char_boundary(tmp_path):
    path = tmp_path / "p.om"
    write_container(path, [], producer="é" * 40)
    with read_container(path) as c:
        assert c.producer == "é" * 16


@pytest.mark.parametrize(
    "parts",
    [
        [("", b"x", 1)],
        [("has space", b"x", 1)],
        [("x" * 17, b"x", 1)],
        [("näme", b"x", 1)],
        [("a", b"x", 3)],
        [("a", b"x", 0)],
        [("a", b"x", 1 << 22)],
        [("a", b"x", 1), ("a", b"y", 1)],
        [("a", "text", 1)],
        [("a", [b"ok", 5], 1)],
        [("a", np.array([object()]), 1)],
        [(f"p{i}", b"", 1) for i in range(65)],
    ],
)
def test_invalid_arguments_rejected_without_file(tmp_path, parts):
    path = tmp_path / "bad.om"
    with pytest.raises(OmFormatError):
        write_container(path, parts, producer="p")
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- hostile bytes


def test_truncation_at_every_prefix(small_file, tmp_path):
    data = small_file.read_bytes()
    cut = tmp_path / "cut.om"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        with pytest.raises(OmFormatError) as exc:
            read_container(cut)
        msg = str(exc.value)
        assert "truncated" in msg or "not an .om file" in msg, (n, msg)
        assert str(cut) in msg
        if n >= om.HEADER_SIZE:
            assert f"expected {len(data)} bytes, found {n}" in msg


def test_truncated_large_weights_file(tmp_path):
    path = tmp_path / "big.om"
    write_container(path, [("model", b"m", 8), ("weights", np.ones(5000, np.float32), 4096)], "p")
    data = path.read_bytes()
    for n in (4095, 4096, 4097, len(data) - 1):
        path.write_bytes(data[:n])
        with pytest.raises(OmFormatError, match=f"truncated: expected {len(data)} bytes, found {n}"):
            read_container(path)


def test_appended_bytes_rejected(small_file):
    with open(small_file, "ab") as f:
        f.write(b"\0")
    with pytest.raises(OmFormatError, match="unexpected bytes after"):
        read_container(small_file)


def test_random_mutations_always_detected(small_file, tmp_path):
    data = small_file.read_bytes()
    expected = contents(small_file)
    rng = random.Random(20240611)
    bad = tmp_path / "mut.om"
    for i in range(2500):
        buf = bytearray(data)
        for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
            pos = rng.randrange(len(buf))
            buf[pos] ^= rng.choice((1 << rng.randrange(8), rng.randrange(1, 256)))
        if rng.random() < 0.1:  # contiguous garbage run
            pos = rng.randrange(len(buf))
            buf[pos : pos + 4] = rng.randbytes(4)
        bad.write_bytes(bytes(buf))
        try:
            got = contents(bad)
        except OmFormatError as e:
            assert str(bad) in str(e)
            continue
        # only possible if the mutation happened to restore the original bytes
        assert bytes(buf) == data and got == expected, i


def test_mutations_without_checksum_verification_never_crash(small_file, tmp_path):
    data = small_file.read_bytes()
    rng = random.Random(7)
    bad = tmp_path / "mut.om"
    rejected = 0
    for _ in range(300):
        buf = bytearray(data)
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(buf))
        try:
            contents(bad, verify_checksums=False)
        except OmFormatError as e:  # the one way a mutation may fail: a format error naming the file
            assert str(bad) in str(e)
            rejected += 1
    assert rejected > 0  # flips in the header and tables are caught even without checksums


def test_structural_corruption_with_valid_checksums(small_file):
    """Hostile files whose CRCs are right but whose structure is not."""
    data = small_file.read_bytes()
    table_offset = om.HEADER_SIZE
    n = 4
    table = bytearray(data[table_offset : table_offset + n * om.ENTRY_SIZE])

    def with_table(tab, **header):
        return rewrite_header(
            data[:table_offset] + bytes(tab) + data[table_offset + len(tab):],
            table_crc=zlib.crc32(bytes(tab)), **header,
        )

    def entry_field(tab, index, fmt, at, value):
        struct.pack_into(fmt, tab, index * om.ENTRY_SIZE + at, value)
        return tab

    def offset_of(index):
        return struct.unpack_from("<Q", table, index * om.ENTRY_SIZE + 16)[0]

    cases = {  # name: (table, expected message)
        "overlap": (entry_field(bytearray(table), 2, "<Q", 16, offset_of(1) + 1), "overlap"),
        "outside": (entry_field(bytearray(table), 2, "<Q", 24, 1 << 62), "outside"),
        "misaligned": (entry_field(bytearray(table), 1, "<Q", 16, offset_of(1) + 8),
                       "not aligned"),
        "bad alignment": (entry_field(bytearray(table), 0, "<I", 32, 3), "invalid alignment"),
        "duplicate": (entry_field(bytearray(table), 1, "16s", 0, b"model"), "twice"),
        "bad kind": (entry_field(bytearray(table), 0, "16s", 0, b"mo\x00del"), "kind name"),
        "nonascii kind": (entry_field(bytearray(table), 0, "16s", 0, b"mod\xffl"), "kind name"),
        "space kind": (entry_field(bytearray(table), 0, "16s", 0, b"mo del"), "kind name"),
        "before table": (entry_field(bytearray(table), 0, "<Q", 16, 8), "outside"),
    }
    path = small_file.with_name("case.om")
    for _name, (tab, expected) in cases.items():
        path.write_bytes(with_table(tab))
        with pytest.raises(OmFormatError, match=expected):
            read_container(path, verify_checksums=False)
    for header in [dict(count=65), dict(count=5), dict(entry_size=40), dict(entry_size=52),
                   dict(table_offset=1 << 40), dict(table_offset=8), dict(header_size=97),
                   dict(header_size=1 << 20), dict(file_size=len(data) + 1),
                   dict(file_size=len(data) - 1)]:
        path.write_bytes(rewrite_header(data, **header))
        with pytest.raises(OmFormatError):
            read_container(path)


def test_nonzero_padding_rejected(tmp_path):
    path = tmp_path / "pad.om"
    write_container(path, [("a", b"x", 1), ("b", b"y", 64)], producer="p")
    data = bytearray(path.read_bytes())
    b_offset = describe(path)["partitions"][1]["offset"]
    data[b_offset - 1] = 1
    path.write_bytes(bytes(data))
    with pytest.raises(OmFormatError, match="padding"):
        read_container(path, verify_checksums=False)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.om"
    path.write_bytes(b"")
    with pytest.raises(OmFormatError, match="empty"):
        read_container(path)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="directory"):
        read_container(tmp_path)
    missing = tmp_path / "missing.om"
    with pytest.raises(ModelFileError, match="no such file") as exc:
        read_container(missing)
    assert str(missing) in str(exc.value)


def test_unreadable_file(small_file, monkeypatch):
    # chmod 0 does not stop root, so make the open itself fail as it does for other users
    import builtins

    real_open = builtins.open

    def deny(path, *a, **kw):
        if os.fspath(path) == os.fspath(small_file):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", deny)
    with pytest.raises(ModelFileError, match="cannot read: Permission denied"):
        read_container(small_file)


@pytest.mark.parametrize(
    "content, looks_like",
    [
        (b"\x08\x07\x12\x07pytorch\x1a\x052.1.0:\x9a\x01\n" + b"\0" * 200, "ONNX"),
        (b"PK\x03\x04\x14\x00\x00\x00" + b"\0" * 200, "zip"),
        (b"\x89HDF\r\n\x1a\n" + b"\0" * 200, "HDF5"),
        (b"\x80\x04\x95" + b"\0" * 200, "pickle"),
        (b"hello world, this is text\n" * 10, "text"),
        (b"\xfe\xed", None),
    ],
)
def test_foreign_files_named(tmp_path, content, looks_like):
    path = tmp_path / "model.om"
    path.write_bytes(content)
    with pytest.raises(OmFormatError, match="not an .om file") as exc:
        read_container(path)
    msg = str(exc.value)
    assert "ge compile" in msg and str(path) in msg
    if looks_like:
        assert looks_like in msg


def test_random_bytes(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "r.om"
    for n in (1, 7, 95, 96, 97, 500, 5000):
        path.write_bytes(rng.randbytes(n))
        with pytest.raises(OmFormatError):
            read_container(path)
        path.write_bytes(om.MAGIC + om.SIGNATURE + rng.randbytes(n))
        with pytest.raises(OmFormatError):
            read_container(path)


def test_text_mode_corruption_diagnosed(small_file):
    data = small_file.read_bytes()
    small_file.write_bytes(data.replace(b"\r\n", b"\n", 1))
    with pytest.raises(OmFormatError, match="text mode"):
        read_container(small_file)


# --------------------------------------------------------------------------- versions


def test_unknown_major_rejected(small_file):
    data = small_file.read_bytes()
    for major in (0, 2, 65535):
        small_file.write_bytes(rewrite_header(data, major=major))
        with pytest.raises(OmFormatError, match=f"version {major}.0 is not supported"):
            read_container(small_file)


def test_higher_minor_accepted_with_larger_header_and_entries(tmp_path, small_file):
    data = small_file.read_bytes()
    small_file.write_bytes(rewrite_header(data, minor=7))
    with read_container(small_file) as c:
        assert c.format_version == (1, 7)
    # a later minor that grows the header and the table entries: build it by hand
    payload = b"payload!"
    header_size, entry_size = 128, 64
    table_offset = header_size
    offset = om._align(table_offset + entry_size, 64)
    entry = om._pack_entry(om.PartitionInfo("model", offset, len(payload), 64,
                                            zlib.crc32(payload))) + b"\x55" * 16
    header = om._pack_header(producer=b"future", partition_count=1, table_offset=table_offset,
                             table_crc32=zlib.crc32(entry), file_size=offset + len(payload),
                             version=(1, 3), table_entry_size=entry_size,
                             header_size=header_size, extra=b"\x77" * 32, flags=0x10)
    body = header + entry
    path = tmp_path / "future.om"
    path.write_bytes(body + b"\0" * (offset - len(body)) + payload)
    with read_container(path) as c:
        assert c.format_version == (1, 3)
        assert c.producer == "future"
        assert bytes(c.partition("model")) == payload


# --------------------------------------------------------------------------- atomic write


def test_failure_mid_write_keeps_previous_file(small_file):
    before = small_file.read_bytes()

    def chunks():
        yield b"a" * 1000
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_container(small_file, [("model", b"m", 8), ("weights", chunks(), 4096)], "p")
    assert small_file.read_bytes() == before
    assert os.listdir(small_file.parent) == [small_file.name]


def test_bad_chunk_mid_write_keeps_previous_file(small_file):
    before = small_file.read_bytes()
    with pytest.raises(OmFormatError, match="chunk of type int"):
        write_container(small_file, [("weights", [b"ok", 42], 64)], "p")
    assert small_file.read_bytes() == before
    assert os.listdir(small_file.parent) == [small_file.name]


def test_replace_failure_keeps_previous_file(small_file, monkeypatch):
    before = small_file.read_bytes()

    def fail(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(om.os, "replace", fail)
    with pytest.raises(ModelFileError) as exc:
        write_container(small_file, [("model", b"new", 8)], "p")
    assert str(small_file) in str(exc.value)
    monkeypatch.undo()
    assert small_file.read_bytes() == before
    assert os.listdir(small_file.parent) == [small_file.name]


def test_write_errors_name_the_path(tmp_path):
    missing_dir = tmp_path / "nope" / "m.om"
    with pytest.raises(ModelFileError, match="cannot write") as exc:
        write_container(missing_dir, [("model", b"m", 8)], "p")
    assert str(missing_dir) in str(exc.value)
    with pytest.raises(ModelFileError):
        write_container(tmp_path, [("model", b"m", 8)], "p")  # a directory
    assert os.listdir(tmp_path) == []


def test_overwrite_replaces_content(small_file):
    write_container(small_file, [("model", b"v2", 8)], "p")
    assert contents(small_file) == {"model": b"v2"}


def test_only_ge_errors_for_content():
    assert issubclass(OmFormatError, GEError) and issubclass(ModelFileError, GEError)
