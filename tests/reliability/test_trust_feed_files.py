"""Feed files from outside (``ge run --input name=file.npy``): never a raw exception, a hang or a pickle.

Each defect class: an empty, truncated or lying ``.npy``, a pickled object array, a FIFO, a link
to ``/dev/zero``, a directory, an oversized header, an ``.npz``. The reader must raise an
InputError that names the input and the file, and must not block on a FIFO.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

from ge_core.errors import InputError
from ge_sdk.inputs import read_feed_file


def _npy(path, arr) -> str:
    np.save(path, arr, allow_pickle=False)
    return os.fspath(path)


def test_plain_arrays_round_trip(tmp_path):
    for i, a in enumerate([np.arange(12, dtype=np.float32).reshape(3, 4), np.asfortranarray(np.ones((2, 3))),
                           np.array(5, np.int64), np.zeros((0, 3), np.float16), np.array([True, False])]):
        got = read_feed_file("x", _npy(tmp_path / f"a{i}.npy", a))
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
        assert got.flags.writeable


def _expect(name, path, *needles):
    with pytest.raises(InputError) as err:
        read_feed_file(name, os.fspath(path))
    msg = str(err.value)
    assert f"'{name}'" in msg and os.fspath(path) in msg, msg
    for n in needles:
        assert n in msg, msg
    return err.value


def test_empty_and_truncated_files(tmp_path):
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    _expect("x", empty, "empty")
    good = _npy(tmp_path / "good.npy", np.ones((64, 64), np.float32))
    raw = open(good, "rb").read()
    for cut, needle in ((5, "not an .npy"), (40, "truncated"), (len(raw) - 3, "truncated")):
        p = tmp_path / f"cut{cut}.npy"
        p.write_bytes(raw[:cut])
        _expect("x", p, needle)
    p = tmp_path / "extra.npy"
    p.write_bytes(raw + b"\0" * 8)
    _expect("x", p, "trailing")


def test_header_claiming_a_huge_array_allocates_nothing(tmp_path):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000, 100000), }"
    header = header.ljust(118) + "\n"
    p = tmp_path / "huge.npy"
    p.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 16)
    _expect("x", p, "bytes")


def test_oversized_header_is_refused_before_reading_it(tmp_path):
    p = tmp_path / "bighead.npy"
    p.write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 31) + b" " * 64)
    _expect("x", p, "header")


def test_pickled_object_array_is_refused_and_not_unpickled(tmp_path):
    canary = tmp_path / "canary"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))

    p = tmp_path / "obj.npy"
    np.save(p, np.array([Payload()], dtype=object), allow_pickle=True)
    _expect("x", p, "pickle")
    assert not canary.exists()


def test_npz_is_refused(tmp_path):
    p = tmp_path / "a.npz"
    np.savez(p, a=np.ones(3))
    _expect("x", p, ".npz")


def test_directory_fifo_and_device_link_are_refused(tmp_path):
    d = tmp_path / "dir.npy"
    d.mkdir()
    _expect("x", d, "directory")
    link = tmp_path / "zero.npy"
    os.symlink("/dev/zero", link)
    _expect("x", link, "device")
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    done: list = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(InputError, read_feed_file, "x", os.fspath(fifo))))
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader so the test process can end, then fail
        open(fifo, "wb").close()  # a writer's open lets the reader's open return
        t.join(5)
        pytest.fail("reading a FIFO feed blocked")
    assert done and "FIFO" in str(done[0].value)


def test_missing_file_names_input_and_path(tmp_path):
    _expect("data_0", tmp_path / "nope.npy", "does not exist")


def _tiny_om(tmp_path) -> str:
    from onnx import TensorProto, helper

    import ge_core as ge

    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    p = tmp_path / "m.onnx"
    p.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    om = os.fspath(tmp_path / "m.om")
    ge.compile(os.fspath(p)).save(om)
    return om


def test_ge_run_refuses_fifo_and_dev_zero_without_hanging(tmp_path):
    om = _tiny_om(tmp_path)
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.npy"
    os.symlink("/dev/zero", zero)
    for feed, needle in ((fifo, "FIFO"), (zero, "device")):
        r = subprocess.run([sys.executable, "-m", "ge_core.cli", "run", om, "--input", f"x={feed}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and "'x'" in r.stderr and needle in r.stderr, r.stderr


def test_header_with_an_unclosed_bracket_is_an_input_error(tmp_path):
    """NumPy's header parser tokenizes the dict text: an unclosed bracket raised a raw
    tokenize.TokenError (found by the ``feeds`` fuzz target)."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, }".ljust(117) + "\n"
    p = tmp_path / "unclosed.npy"
    p.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 24)
    _expect("x", p, "not a readable .npy")
