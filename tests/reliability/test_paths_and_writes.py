"""Paths: external data never leaves the model's folder; nothing is written next to the input
model unless asked; .om and report files are written atomically."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.cli import main as ge_main
from ge_core.errors import GEError, ModelFileError, SecurityError

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
W = np.arange(12, dtype=np.float32).reshape(4, 3)


def _ext_tensor(name, arr, location, offset=0):
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(arr.shape))
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(arr.nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _mlp(w_tensor=None, *, const_attr=None, sparse=None):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    inits = []
    if const_attr is not None:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=const_attr))
    elif w_tensor is not None:
        inits.append(w_tensor)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], initializer=inits,
                          sparse_initializer=[sparse] if sparse is not None else None)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture
def layout(tmp_path):
    """model/ (with weights.bin, sub/, links, a FIFO) and outside/secret.bin next to it."""
    mdir, out = tmp_path / "model", tmp_path / "outside"
    (mdir / "sub").mkdir(parents=True)
    out.mkdir()
    (mdir / "weights.bin").write_bytes(W.tobytes())
    (out / "secret.bin").write_bytes(W.tobytes())
    os.symlink(out / "secret.bin", mdir / "link_out")
    os.symlink(out, mdir / "linkdir")
    os.symlink("weights.bin", mdir / "link_in")
    os.mkfifo(mdir / "pipe")
    return mdir, out


def _save(m, mdir):
    p = os.path.join(mdir, "m.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return p


@pytest.mark.parametrize("location", ["weights.bin", "./weights.bin", "sub/../weights.bin", "link_in"])
def test_external_data_inside_the_folder_is_read(layout, location):
    mdir, _ = layout
    g = ge.load(_save(_mlp(_ext_tensor("w", W, location)), mdir))
    np.testing.assert_array_equal(g.constants["w"].const_value, W)


@pytest.mark.parametrize("location", [
    "../outside/secret.bin", "sub/../../outside/secret.bin", "..\\outside\\secret.bin", "link_out",
    "linkdir/secret.bin", "/etc/passwd", "C:\\secret.bin", "//server/share/x",
])
@pytest.mark.parametrize("where", ["initializer", "constant_attr", "sparse_values"])
def test_external_data_leaving_the_folder_is_refused(layout, location, where):
    mdir, _ = layout
    t = _ext_tensor("w", W, location)
    if where == "initializer":
        m = _mlp(t)
    elif where == "constant_attr":
        m = _mlp(const_attr=t)
    else:
        vals = _ext_tensor("w", W.reshape(-1), location)
        idx = numpy_helper.from_array(np.arange(12, dtype=np.int64), "w_idx")
        m = _mlp(sparse=helper.make_sparse_tensor(vals, idx, [4, 3]))
    with pytest.raises(SecurityError) as ei:
        ge.load(_save(m, mdir))
    assert "tensor 'w'" in str(ei.value) and "m.onnx" in str(ei.value)


def test_absolute_path_into_another_folder_is_refused(layout):
    mdir, out = layout
    with pytest.raises(SecurityError, match="absolute"):
        ge.load(_save(_mlp(_ext_tensor("w", W, str(out / "secret.bin"))), mdir))


@pytest.mark.parametrize("location", ["pipe", "sub", "missing.bin", "a\x00b"])
def test_external_data_that_is_not_a_regular_file_is_refused_without_blocking(layout, location):
    mdir, _ = layout
    with pytest.raises(GEError):  # a FIFO would block a naive reader forever
        ge.load(_save(_mlp(_ext_tensor("w", W, location)), mdir))


def test_external_data_location_that_is_not_utf8_is_refused(layout):
    mdir, _ = layout
    m = _mlp(_ext_tensor("w", W, "weights.bin"))
    data = m.SerializeToString().replace(b"weights.bin", b"weights\xff\xfein")
    p = os.path.join(mdir, "m.onnx")
    with open(p, "wb") as f:
        f.write(data)
    with pytest.raises(ModelFileError):
        ge.load(p)


def test_huge_sparse_tensor_is_refused_before_allocating():
    vals = numpy_helper.from_array(np.array([1.0], np.float32), "w")
    idx = numpy_helper.from_array(np.array([5], np.int64), "w_idx")
    m = _mlp(sparse=helper.make_sparse_tensor(vals, idx, [2**20, 2**20]))
    with pytest.raises(SecurityError, match="refusing to allocate"):
        ge.load(m)


# ------------------------------------------------------------------------------------------------
# nothing written next to the input model
# ------------------------------------------------------------------------------------------------
def _listing(d):
    return sorted((os.path.relpath(os.path.join(r, f), d), os.stat(os.path.join(r, f)).st_mtime_ns)
                  for r, _, fs in os.walk(d) for f in fs)


def test_compile_writes_nothing_next_to_the_model(tmp_path, monkeypatch):
    src = tmp_path / "models"
    src.mkdir()
    model = src / "zf.onnx"
    model.write_bytes(open(os.path.join(LIGHT_DIR, "light_zfnet512.onnx"), "rb").read())
    work = tmp_path / "work"
    work.mkdir()
    before = _listing(src)
    os.chmod(src, 0o555)  # read-only (root ignores it: the listing check is what counts)
    try:
        monkeypatch.chdir(work)
        assert ge_main(["compile", str(model), "--report", "report.json", "-q"]) == 0
        g = ge.load(str(model))
        ge.compile(g)
    finally:
        os.chmod(src, 0o755)
    assert _listing(src) == before
    assert sorted(os.listdir(work)) == ["report.json", "zf.om"]  # the default output goes to the cwd
    assert ge.load_om(str(work / "zf.om")).output_names


def test_failed_compile_leaves_no_output(tmp_path, monkeypatch):
    bad = _mlp(numpy_helper.from_array(W, "w"))
    bad.graph.node[0].op_type = "NoSuchOp"
    p = tmp_path / "bad.onnx"
    p.write_bytes(bad.SerializeToString())
    monkeypatch.chdir(tmp_path)
    assert ge_main(["compile", str(p), "-o", "out.om", "-q"]) != 0
    assert sorted(os.listdir(tmp_path)) == ["bad.onnx"]


# ------------------------------------------------------------------------------------------------
# atomic writes
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zf_model():
    return ge.compile(os.path.join(LIGHT_DIR, "light_zfnet512.onnx"))


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_failure_mid_write_keeps_the_old_file(tmp_path, monkeypatch, zf_model, exc):
    import ge_core.om_container as oc

    out = tmp_path / "m.om"
    out.write_bytes(b"old contents")
    real = oc._chunks

    def failing(data, kind):
        for i, c in enumerate(real(data, kind)):
            if kind == "weights" and i >= 1:
                raise exc
            yield c

    monkeypatch.setattr(oc, "_chunks", failing)
    with pytest.raises((ModelFileError, KeyboardInterrupt)):
        zf_model.save(str(out))
    assert out.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["m.om"]  # the temporary file is gone too


def test_killed_compile_never_leaves_a_broken_om(tmp_path):
    """Kill `ge compile` while it writes (slowed down in the middle of the weights): the
    requested name holds the previous file, never a partial one."""
    out = tmp_path / "m.om"
    out.write_bytes(b"previous")
    marker = tmp_path / "writing"
    script = textwrap.dedent(f"""
        import os, time, sys
        import ge_core.om_container as oc
        real = oc._chunks
        def slow(data, kind):
            for i, c in enumerate(real(data, kind)):
                if kind == "weights" and i == 1:
                    open({str(marker)!r}, "w").close()
                    time.sleep(60)
                yield c
        oc._chunks = slow
        from ge_core.cli import main
        sys.exit(main(["compile", {os.path.join(LIGHT_DIR, "light_zfnet512.onnx")!r}, "-o", {str(out)!r}, "-q"]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert proc.poll() is None, "ge compile ended before writing"
            assert time.time() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.read_bytes() == b"previous"
    leftovers = [f for f in os.listdir(tmp_path) if f not in ("m.om", "writing")]
    assert all(f.startswith(".m.om.") and f.endswith(".tmp") for f in leftovers), leftovers
    # and a normal run replaces it with a complete file
    assert ge_main(["compile", os.path.join(LIGHT_DIR, "light_zfnet512.onnx"), "-o", str(out), "-q"]) == 0
    assert ge.load_om(str(out)).output_names
