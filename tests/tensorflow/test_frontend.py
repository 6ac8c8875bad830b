"""TensorFlow frontend: errors, options, custom op mappers, lazy import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ge_core as ge
from ge_core import hookimpl
from ge_core.errors import GEError, ModelFileError, OptionError, UnsupportedOpError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _freeze(fn, folder, name="m.pb"):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(fn.get_concrete_function(), lower_control_flow=False)
    tf.io.write_graph(frozen.graph.as_graph_def(), str(folder), name, as_text=False)
    return str(folder / name)


def test_plugin_import_does_not_import_tensorflow():
    code = ("import sys, json, io, contextlib\n"
            "from ge_core.cli import main\n"
            "buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            "    main(['plugins', '--json'])\n"
            "assert 'ge_tensorflow' in buf.getvalue()\n"
            "from ge_core.plugins import registries\n"
            "r = registries()\n"
            "assert ('tensorflow', 'Conv2D') in r.op_mappers and 'tensorflow' in r.frontends\n"
            "print('TF' if 'tensorflow' in sys.modules else 'NO_TF')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("NO_TF")


def test_unknown_ops_one_error_lists_all(tmp_path):
    @tf.function(input_signature=[tf.TensorSpec((3, 3), tf.float32, name="x")])
    def f(x):
        return tf.linalg.det(x) + tf.reduce_sum(tf.math.lgamma(x)) + tf.reduce_sum(tf.math.lgamma(x + 1.0))

    path = _freeze(f, tmp_path)
    with pytest.raises(UnsupportedOpError) as ei:
        ge.compile(path, {"framework": 3})
    msg = str(ei.value)
    assert isinstance(ei.value, GEError)
    assert "MatrixDeterminant" in msg and "Lgamma" in msg
    assert "2 TensorFlow op type(s)" in msg
    assert path in msg


def test_custom_op_mapper_plugin(tmp_path, fresh_host):
    @tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x")])
    def f(x):
        return tf.math.xdivy(x, x + 3.0)

    path = _freeze(f, tmp_path)
    with pytest.raises(UnsupportedOpError, match="Xdivy"):
        ge.load(path, framework=3)

    class XdivyPlugin:
        @hookimpl
        def ge_register_op_mappers(self, register):
            def xdivy(ctx):  # x / y, 0 where x == 0
                x, y = ctx.input(0), ctx.input(1)
                zero = ctx.constant(np.zeros((), np.float32))
                return ctx.op("Where", ctx.op("Equal", x, zero), zero, ctx.op("Div", x, y))

            register("tensorflow", "Xdivy", xdivy)

    fresh_host.register_plugin(XdivyPlugin(), name="xdivy_plugin")
    model = ge.compile(path, {"framework": 3})
    x = np.array([[0.0, 1.0, 2.0], [3.0, -1.0, 0.5]], np.float32)
    (y,) = model.run({"x": x}).values()
    np.testing.assert_allclose(y, f(x).numpy(), rtol=1e-6)


def test_bad_pb_file(tmp_path):
    p = tmp_path / "garbage.pb"
    p.write_bytes(b"\xff\xfe this is not a graph \x00\x01" * 10)
    with pytest.raises(ModelFileError, match="garbage.pb"):
        ge.load(str(p), framework=3)
    e = tmp_path / "empty.pb"
    e.write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty.pb"):
        ge.load(str(e))


def test_bad_saved_model_and_keras_file(tmp_path):
    d = tmp_path / "not_a_model"
    d.mkdir()
    with pytest.raises(ModelFileError, match="not_a_model"):
        ge.load(str(d), framework=3)
    sm = tmp_path / "broken_sm"
    sm.mkdir()
    (sm / "saved_model.pb").write_bytes(b"junk")
    with pytest.raises(ModelFileError, match="broken_sm"):
        ge.load(str(sm))
    k = tmp_path / "broken.keras"
    k.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ModelFileError, match="broken.keras"):
        ge.load(str(k))


def _small_keras():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3), name="img")
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU(6.0, name="relu6")(h)
    h = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", name="dw")(h)
    h = keras.layers.Conv2DTranspose(3, 3, strides=2, padding="same", name="deconv")(h)
    h = keras.layers.MaxPooling2D(2, name="pool")(h)
    h = keras.layers.UpSampling2D(2, interpolation="bilinear", name="up")(h)
    h = keras.layers.ZeroPadding2D(1, name="pad")(h)
    h = keras.layers.AveragePooling2D(3, strides=1, padding="same", name="avg")(h)
    h = keras.layers.Flatten(name="flat")(h)
    out = keras.layers.Dense(5, activation="softmax", name="dense")(h)
    return keras.Model(inp, out)


def test_keras_object_layers_and_input_shape():
    m = _small_keras()
    x = np.random.default_rng(0).standard_normal((3, 8, 8, 3)).astype(np.float32)
    g = ge.load(m, framework=3, input_shape={"img": (3, 8, 8, 3)})
    assert g.inputs[0].type.shape == (3, 8, 8, 3)
    model = ge.compile(g)
    (y,) = model.run({"img": x}).values()
    np.testing.assert_allclose(y, m(x).numpy(), rtol=1e-4, atol=1e-5)


def test_saved_model_input_shape_and_out_nodes(tmp_path):
    m = _small_keras()
    m.export(str(tmp_path / "sm"), verbose=False)
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)
    g = ge.load(str(tmp_path / "sm"))
    assert g.metadata["framework"] == "tensorflow"
    name = g.inputs[0].name
    model = ge.compile(str(tmp_path / "sm"), {"framework": "tensorflow", "input_shape": f"{name}:2,8,8,3"})
    (y,) = model.run({name: x}).values()
    np.testing.assert_allclose(y, m(x).numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(OptionError, match="nosuch"):
        ge.load(str(tmp_path / "sm"), framework=3, input_shape={"nosuch": (1, 8, 8, 3)})


def test_out_nodes_selects_inner_tensor(tmp_path):
    @tf.function(input_signature=[tf.TensorSpec((2, 4), tf.float32, name="x")])
    def f(x):
        a = tf.nn.relu(x, name="inner")
        return tf.reduce_sum(a * 2.0, axis=1)

    path = _freeze(f, tmp_path)
    model = ge.compile(path, {"framework": 3, "out_nodes": "inner:0"})
    assert model.output_names == ["inner:0"]
    x = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
    (y,) = model.run({"x": x}).values()
    np.testing.assert_allclose(y, np.maximum(x, 0))
    with pytest.raises(OptionError, match="out_nodes"):
        ge.load(path, framework=3, out_nodes="no_such_node")


def test_shape_ops_and_slicing():
    @tf.function(input_signature=[tf.TensorSpec((2, 6, 4), tf.float32, name="x")])
    def f(x):
        a = x[:, 1:5:2, ::-1]
        b = x[..., tf.newaxis, 0]
        c = tf.concat([tf.reshape(a, [2, -1]), tf.reshape(b, [2, -1])], axis=1)
        d = tf.stack([tf.reduce_max(x, axis=[1, 2]), tf.reduce_mean(x, axis=[1, 2])], axis=1)
        e = tf.transpose(tf.expand_dims(tf.squeeze(x[:, :1, :], axis=1), -1), [0, 2, 1])
        s1, s2 = tf.split(x, [2, 4], axis=1)
        g = tf.gather(x, [3, 0], axis=1)
        p = tf.pad(x, [[0, 0], [1, 2], [0, 1]], mode="REFLECT")
        return (tf.reduce_sum(c, axis=1) + tf.reduce_sum(d, axis=1) + tf.reduce_sum(e, axis=[1, 2])
                + tf.reduce_sum(s2 - tf.tile(s1, [1, 2, 1]), axis=[1, 2]) + tf.reduce_sum(tf.nn.softmax(g), axis=[1, 2])
                + tf.reduce_sum(tf.math.squared_difference(p, 1.0), axis=[1, 2]) + tf.cast(tf.argmax(x[:, 0, :], axis=1), tf.float32))

    x = np.random.default_rng(6).standard_normal((2, 6, 4)).astype(np.float32)
    model = ge.compile(f, {"framework": 3})
    (y,) = model.run({"x": x}).values()
    np.testing.assert_allclose(y, f(x).numpy(), rtol=1e-4, atol=1e-4)
