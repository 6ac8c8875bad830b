"""TensorFlow and Keras files from outside run no code and read nothing outside their folder (issue 15).

* a SavedModel whose ``variables/``, a variables file or an asset is a link leading outside its
  folder (or a FIFO) is refused, naming the entry; an asset name with ``..`` too;
* a graph with an op that reads or writes files or runs Python is refused before TensorFlow
  loads it (SavedModel initializers run at load, grappler evaluates while folding);
* a Keras file with a Lambda layer (marshalled bytecode) or a class from outside Keras is refused
  by GE's own check of the config, and HDF5 weights stored in other files are refused;
* the same models without those parts load and match TensorFlow.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import ModelFileError, SecurityError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8.0


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A SavedModel with variables and a vocabulary asset, and TensorFlow's output for X."""
    root = tmp_path_factory.mktemp("sm")
    module = tf.Module()
    module.w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))

    @tf.function(input_signature=[tf.TensorSpec((2, 4), tf.float32, name="x")])
    def serve(x):
        return {"y": tf.nn.relu(tf.matmul(x, module.w))}

    module.serve = serve
    path = root / "model"
    tf.saved_model.save(module, os.fspath(path), signatures={"serving_default": serve})
    (path / "assets").mkdir(exist_ok=True)
    return path, serve(tf.constant(X))["y"].numpy()


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_contained_saved_model_loads_and_matches(saved_model):
    path, ref = saved_model
    out = ge.compile(ge.load(os.fspath(path))).run({"x": X})
    np.testing.assert_allclose(out["y"], ref, rtol=1e-6)


def test_variables_folder_linking_outside_is_refused(saved_model, tmp_path):
    path, _ = saved_model
    m = _copy(path, tmp_path / "m")
    shutil.move(m / "variables", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", m / "variables")
    with pytest.raises(SecurityError) as err:
        ge.load(os.fspath(m))
    assert "'variables'" in str(err.value) and "outside" in str(err.value)


def test_variables_file_linking_outside_is_refused(saved_model, tmp_path):
    path, _ = saved_model
    m = _copy(path, tmp_path / "m")
    data = next(p for p in (m / "variables").iterdir() if p.name.startswith("variables.data"))
    shutil.move(data, tmp_path / "secret.bin")
    os.symlink(tmp_path / "secret.bin", data)
    with pytest.raises(SecurityError, match=data.name):
        ge.load(os.fspath(m))


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_asset_that_is_not_a_regular_file_is_refused_without_blocking(saved_model, tmp_path, kind):
    path, _ = saved_model
    m = _copy(path, tmp_path / "m")
    if kind == "fifo":
        os.mkfifo(m / "assets" / "vocab.txt")
    else:
        os.symlink("/dev/zero", m / "assets" / "vocab.txt")
    with pytest.raises((ModelFileError, SecurityError), match="vocab.txt"):
        ge.load(os.fspath(m))


def test_asset_name_leaving_the_folder_is_refused(saved_model, tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    path, _ = saved_model
    m = _copy(path, tmp_path / "m")
    (tmp_path / "secret.txt").write_text("secret\n")
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((m / "saved_model.pb").read_bytes())
    asset = sm.meta_graphs[0].asset_file_def.add()
    asset.tensor_info.name = "vocab:0"
    asset.filename = "../../secret.txt"
    (m / "saved_model.pb").write_bytes(sm.SerializeToString())
    with pytest.raises(SecurityError, match=r"\.\./\.\./secret.txt"):
        ge.load(os.fspath(m))


def test_saved_model_with_a_file_writing_op_is_refused(saved_model, tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    path, _ = saved_model
    m = _copy(path, tmp_path / "m")
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((m / "saved_model.pb").read_bytes())
    fn = sm.meta_graphs[0].graph_def.library.function[0]
    node = fn.node_def.add()
    node.name, node.op = "evil", "WriteFile"
    (m / "saved_model.pb").write_bytes(sm.SerializeToString())
    with pytest.raises(ModelFileError, match="'evil' \\(WriteFile\\)"):
        ge.load(os.fspath(m))
    assert not any(p.name == "canary" for p in tmp_path.rglob("*"))


def test_frozen_graph_reading_a_file_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        n = tf.strings.length(tf.io.read_file(tf.constant(os.fspath(secret))))
        tf.identity(x * tf.cast(n, tf.float32), name="y")
    p = tmp_path / "rf.pb"
    p.write_bytes(g.as_graph_def().SerializeToString())
    with pytest.raises(ModelFileError, match="ReadFile"):
        ge.load(os.fspath(p), out_nodes=["y"])


def test_fifo_model_file_is_refused_without_blocking(tmp_path):
    p = tmp_path / "m.pb"
    os.mkfifo(p)
    with pytest.raises(ModelFileError, match="not a regular file"):
        ge.load(os.fspath(p))


def _dense_model(with_lambda: bool, canary=None):
    keras.utils.set_random_seed(0)
    i = keras.Input((4,), name="x")
    y = keras.layers.Dense(3, name="dense")(i)
    if with_lambda:
        canary_path = os.fspath(canary)

        def f(t, canary=canary_path):
            open(canary, "w").close()  # runs whenever the layer is called: at build, or when loaded
            return t * 2.0
        y = keras.layers.Lambda(f, name="evil_lambda")(y)
    return keras.Model(i, y)


def test_plain_keras_files_load_and_match(tmp_path):
    model = _dense_model(False)
    ref = model(X).numpy()
    for suffix in (".keras", ".h5"):
        p = os.fspath(tmp_path / f"m{suffix}")
        model.save(p)
        out = ge.compile(ge.load(p)).run({"x": X})
        np.testing.assert_allclose(next(iter(out.values())), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_keras_lambda_layer_is_refused_and_never_runs(tmp_path, suffix):
    canary = tmp_path / "canary"
    model = _dense_model(True, canary)
    p = os.fspath(tmp_path / f"lam{suffix}")
    model.save(p)
    canary.unlink()
    with pytest.raises(ModelFileError, match="evil_lambda.*Python code") as err:
        ge.load(p)
    assert "lam" in str(err.value) and err.value.hint
    assert not canary.exists()


def test_keras_class_from_outside_keras_is_refused(tmp_path):
    p = tmp_path / "m.keras"
    _dense_model(False).save(p)
    with zipfile.ZipFile(p) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    cfg = json.loads(entries["config.json"])
    layer = cfg["config"]["layers"][-1]
    layer["module"], layer["class_name"] = "os", "system"
    entries["config.json"] = json.dumps(cfg).encode()
    bad = tmp_path / "bad.keras"
    with zipfile.ZipFile(bad, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)
    with pytest.raises(ModelFileError, match="module 'os'"):
        ge.load(os.fspath(bad))


def test_h5_weights_stored_in_another_file_are_refused(tmp_path):
    import h5py

    p = tmp_path / "m.h5"
    _dense_model(False).save(p)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(np.ones(12, np.float32).tobytes())
    with h5py.File(p, "a") as h5:
        h5.create_dataset("stolen", shape=(12,), dtype="<f4", external=[(os.fspath(outside), 0, 48)])
    with pytest.raises(ModelFileError, match="'stolen' stores its data in other files"):
        ge.load(os.fspath(p))
