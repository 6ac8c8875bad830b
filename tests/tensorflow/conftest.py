"""Fixtures for the TensorFlow frontend tests.

The Keras applications are built once per test session (``weights=None``, fixed seed, small
inputs) and saved as a frozen GraphDef and a SavedModel, together with an input and
TensorFlow's own output for it, in a folder shared by all xdist workers: the first worker that
needs a model builds it under a file lock, the others read the files.
"""

from __future__ import annotations

import fcntl
import json
import os

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="TensorFlow tests need the [tensorflow] extra")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: name -> input size (the smallest sizes these applications accept, to keep the suite fast)
APPS = {
    "MobileNetV2": 64,
    "ResNet50": 64,
    "InceptionV3": 75,
    "DenseNet121": 64,
    "EfficientNetB0": 64,
}


def _build(name: str, size: int, folder: str) -> None:
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    keras.utils.set_random_seed(0)
    app = getattr(keras.applications, name)
    # logits, not probabilities: a stricter comparison than a softmax of random weights
    model = app(weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None)
    fn = tf.function(lambda x: model(x, training=False))
    cf = fn.get_concrete_function(tf.TensorSpec((1, size, size, 3), tf.float32, name="x"))
    frozen = convert_variables_to_constants_v2(cf)
    tf.io.write_graph(frozen.graph.as_graph_def(), folder, "frozen.pb", as_text=False)
    # A SavedModel holding the variables and the serving function (faster to write and read than
    # model.export, which also saves every layer's call functions).
    module = tf.Module()
    module.variables_ = [getattr(v, "value", v) for v in model.variables]
    module.serve = fn
    tf.saved_model.save(module, os.path.join(folder, "saved_model"), signatures={"serving_default": cf})
    x = np.random.default_rng(0).uniform(-1.0, 1.0, (1, size, size, 3)).astype(np.float32)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "ref.npy"), model(x, training=False).numpy())


@pytest.fixture(scope="session")
def tf_models_dir(tmp_path_factory, worker_id):
    base = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        base = base.parent  # shared by the xdist workers of this run
    d = base / "tf_models"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="session")
def keras_app(tf_models_dir):
    """``keras_app(name)`` -> dict with the paths of the frozen .pb, SavedModel, input and reference."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name in cache:
            return cache[name]
        folder = tf_models_dir / name
        with open(tf_models_dir / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not (folder / "done.json").exists():
                    folder.mkdir(exist_ok=True)
                    _build(name, APPS[name], str(folder))
                    (folder / "done.json").write_text(json.dumps({"size": APPS[name]}))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        info = {
            "pb": str(folder / "frozen.pb"),
            "saved_model": str(folder / "saved_model"),
            "x": np.load(folder / "x.npy"),
            "ref": np.load(folder / "ref.npy"),
            "x_path": str(folder / "x.npy"),
        }
        cache[name] = info
        return info

    return get
