"""Compiled models saved as .om: roundtrip, zero-copy weights, validation of hostile files."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import ge_core as ge
from ge_core import OmFormatError, TensorType
from ge_core.om import model_definition


def conv_model():
    rng = np.random.default_rng(0)
    g = ge.Graph("convnet")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType("float32", ("N", 3, 8, 8)))
    w = g.add_constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = g.add_constant(rng.standard_normal(4).astype(np.float32), "b")
    c = g.add_node("Conv", [x, w, b], {"pads": [1, 1, 1, 1]}, name="conv")
    r = g.add_node("Relu", [c.output], name="relu")
    shape = g.add_constant(np.array([0, -1], np.int64), "shape")
    f = g.add_node("Reshape", [r.output, shape], name="flat")
    s = g.add_node("Softmax", [f.output], {"axis": 1}, name="prob")
    g.set_outputs([s.output, r.output])
    return g


def test_roundtrip_identical_outputs(tmp_path):
    model = ge.compile(conv_model())
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = model.run({"x": x})
    path = model.save(tmp_path / "m.om")
    loaded = ge.load_om(path)
    got = loaded.run({"x": x})
    assert list(got) == list(want) == ["prob", "relu"]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert loaded.report == json.loads(json.dumps(model.report))
    assert loaded.input_names == ["x"]
    # weights are views of the mapped file, not copies
    w = loaded.graph.constants["w"].const_value
    assert not w.flags.owndata and not w.flags.writeable
    assert w.ctypes.data % 64 == 0


def test_roundtrip_in_fresh_process(tmp_path):
    model = ge.compile(conv_model())
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    model.save(tmp_path / "m.om")
    out_dir = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "ge_core.cli", "run", str(tmp_path / "m.om"), "--input", f"x={tmp_path / 'x.npy'}",
                    "--output-dir", str(out_dir)], check=True, capture_output=True)
    want = model.run({"x": x})
    for k, v in want.items():
        np.testing.assert_array_equal(np.load(out_dir / f"{k}.npy"), v)


def test_model_definition_is_plain_json(tmp_path):
    d, weights = model_definition(ge.compile(conv_model(), {"opt_level": 0}))
    text = json.dumps(d)
    assert "pickle" not in text
    assert d["graph"]["nodes"][0]["op"] == "Conv"
    assert all("offset" in e and e["offset"] % 64 == 0 for e in d["weights"])


def _mutate(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        b[i] = rng.randrange(256)
    return bytes(b)


def test_corrupted_om_files_raise_omformaterror(tmp_path):
    path = ge.compile(conv_model()).save(tmp_path / "m.om")
    raw = open(path, "rb").read()
    rng = random.Random(7)
    bad = tmp_path / "bad.om"
    for i in range(300):
        bad.write_bytes(_mutate(raw, rng))
        try:
            ge.load_om(bad)
        except OmFormatError:
            continue
        # only a mutation that changed nothing may load
        assert bad.read_bytes() == raw, f"mutation {i} loaded"
    for cut in (0, 10, 95, 200, len(raw) // 2, len(raw) - 1):
        bad.write_bytes(raw[:cut])
        with pytest.raises(OmFormatError):
            ge.load_om(bad)


def test_hostile_model_definition_with_valid_checksums(tmp_path):
    """A well-formed container whose JSON lies (bad offsets, dtypes, names) is refused."""
    from ge_core.om_container import write_container

    model = ge.compile(conv_model())
    d, weights = model_definition(model)
    blob = b"".join(bytes(c) for c in weights.chunks())

    def write(defn, wblob=blob):
        p = tmp_path / "h.om"
        write_container(p, [("model", json.dumps(defn).encode(), 8), ("weights", wblob, 4096)], producer="test")
        return p

    cases = []
    e = json.loads(json.dumps(d)); e["weights"][0]["offset"] = 10**12; cases.append(("outside", e))
    e = json.loads(json.dumps(d)); e["weights"][0]["nbytes"] = 4; cases.append(("match", e))
    e = json.loads(json.dumps(d)); e["weights"][0]["dtype"] = "object"; cases.append(("dtype", e))
    e = json.loads(json.dumps(d)); e["weights"][0]["shape"] = [2**40, 2**40]; cases.append(("absurd", e))
    e = json.loads(json.dumps(d)); e["graph"]["nodes"][1]["inputs"] = ["nope"]; cases.append(("undefined", e))
    e = json.loads(json.dumps(d)); e["graph"]["outputs"] = ["ghost"]; cases.append(("not defined", e))
    e = json.loads(json.dumps(d)); e["version"] = 99; cases.append(("version", e))
    e = json.loads(json.dumps(d)); e["streams"]["streams"] = [0]; cases.append(("stream", e))
    e = json.loads(json.dumps(d)); e["graph"]["nodes"][0]["attrs"]["pads"] = {"x": 1}; cases.append(("unknown tag", e))
    e = json.loads(json.dumps(d)); e["graph"]["nodes"] = "zzz"; cases.append(("not a list", e))
    for match, defn in cases:
        with pytest.raises(OmFormatError, match=match):
            ge.load_om(write(defn))
    p = tmp_path / "deep.om"
    nested = ("[" * 100000 + "]" * 100000).encode()  # JSON nested beyond the parser's recursion limit
    write_container(p, [("model", nested, 8), ("weights", b"", 4096)], producer="t")
    with pytest.raises(OmFormatError):
        ge.load_om(p)


def test_onnx_file_given_to_load_om(tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(b"\x08\x07\x12\x04test" + bytes(100))
    with pytest.raises(OmFormatError, match="not an .om"):
        ge.load_om(p)


def test_broadcast_constants_are_stored_once(tmp_path):
    g = ge.Graph("splat")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType("float32", (512, 512)))
    big = np.broadcast_to(np.float32(0.5), (512, 512))  # what folding a ConstantOfShape gives
    c = g.add_constant(big, "half")
    g.set_outputs([g.add_node("Mul", [x, c], name="mul").output])
    model = ge.compile(g, {"opt_level": 0})
    path = model.save(tmp_path / "s.om")
    assert os.path.getsize(path) < 64 * 1024  # not 1 MiB of repeated 0.5
    loaded = ge.load_om(path)
    w = loaded.graph.constants["half"].const_value
    assert w.shape == (512, 512) and not w.flags.writeable and w.strides == (0, 0)
    xv = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run({"x": xv})["mul"], xv * 0.5)
