"""Recurrent layers (While loops with TensorLists) and tf.cond / tf.while_loop."""

from __future__ import annotations

import numpy as np
import pytest

import ge_core as ge

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _run(model, x):
    out = model.run({model.input_names[0]: x})
    return list(out.values())


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
@pytest.mark.parametrize("sequences", [False, True])
def test_rnn(layer, sequences):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 4), batch_size=2)
    m = keras.Model(inp, getattr(keras.layers, layer)(5, return_sequences=sequences)(inp))
    x = np.random.default_rng(1).standard_normal((2, 6, 4)).astype(np.float32)
    model = ge.compile(m, {"framework": 3})
    assert "Loop" in model.report["op_counts"]
    (y,) = _run(model, x)
    np.testing.assert_allclose(y, m(x).numpy(), rtol=1e-4, atol=1e-4)


def test_lstm_keras_file(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 4), batch_size=1)
    h = keras.layers.LSTM(8, return_sequences=True)(inp)
    out = keras.layers.Dense(3)(keras.layers.GRU(4)(h))
    m = keras.Model(inp, out)
    path = tmp_path / "rnn.keras"
    m.save(path)
    x = np.random.default_rng(2).standard_normal((1, 6, 4)).astype(np.float32)
    model = ge.compile(str(path), {"framework": 3})
    (y,) = _run(model, x)
    np.testing.assert_allclose(y, m(x).numpy(), rtol=1e-4, atol=1e-4)


@tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x")])
def _cond_fn(x):
    return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.nn.relu(x) * 2.0, lambda: x - 1.0)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond(sign):
    x = (sign * np.abs(np.random.default_rng(3).standard_normal((2, 3)))).astype(np.float32)
    model = ge.compile(_cond_fn, {"framework": 3})
    assert "If" in model.report["op_counts"] or "Where" in str(model.report["op_counts"])
    (y,) = _run(model, x)
    np.testing.assert_allclose(y, _cond_fn(x).numpy(), rtol=1e-5, atol=1e-6)


def test_cond_in_keras_model_frozen_pb(tmp_path):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    keras.utils.set_random_seed(0)
    dense = keras.layers.Dense(4)
    dense.build((None, 3))

    @tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x")])
    def f(x):
        y = dense(x)
        return tf.cond(tf.reduce_mean(y) > 0.0, lambda: tf.nn.sigmoid(y), lambda: tf.tanh(y) + 1.0)

    frozen = convert_variables_to_constants_v2(f.get_concrete_function(), lower_control_flow=False)
    tf.io.write_graph(frozen.graph.as_graph_def(), str(tmp_path), "cond.pb", as_text=False)
    model = ge.compile(str(tmp_path / "cond.pb"), {"framework": 3})
    for seed in (0, 1, 2, 3):
        x = np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32) * 3
        (y,) = _run(model, x)
        np.testing.assert_allclose(y, f(x).numpy(), rtol=1e-5, atol=1e-5)


def test_while_loop_concrete_function():
    @tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x")])
    def f(x):
        i = tf.constant(0)
        return tf.while_loop(lambda i, y: i < 4, lambda i, y: (i + 1, y * 0.5 + tf.cast(i, tf.float32)), (i, x))[1]

    x = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    model = ge.compile(f.get_concrete_function(), {"framework": 3})
    (y,) = _run(model, x)
    np.testing.assert_allclose(y, f(x).numpy(), rtol=1e-5, atol=1e-5)
