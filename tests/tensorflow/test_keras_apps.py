"""Keras applications, frozen and as SavedModels, compiled and compared with TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import ge_core as ge

APPS = ["MobileNetV2", "ResNet50", "InceptionV3", "DenseNet121", "EfficientNetB0"]  # sizes: conftest.APPS

RTOL = ATOL = 1e-4
BIN = os.path.dirname(sys.executable)


def _check(model, x, ref):
    out = model.run({model.input_names[0]: x})
    (y,) = out.values()
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


API_CASES = [(n, f) for n in APPS for f in ("pb", "saved_model")
             if (n, f) not in (("MobileNetV2", "pb"), ("MobileNetV2", "saved_model"))]


@pytest.mark.parametrize("name,fmt", API_CASES, ids=[f"{n}-{f}" for n, f in API_CASES])
def test_app_api(keras_app, name, fmt):
    app = keras_app(name)
    model = ge.compile(app[fmt], {"framework": 3})
    # convolutions, on their own, fused with what follows them, or in the blocked layout
    assert sum(n for op, n in model.report["op_counts"].items() if op.split("::")[-1] in ("Conv", "FusedConv", "NchwcConv")) > 0
    _check(model, app["x"], app["ref"])


def test_app_pb_cli_ge_compile(keras_app, tmp_path):
    app = keras_app("MobileNetV2")
    om = tmp_path / "mnv2.om"
    r = subprocess.run([os.path.join(BIN, "ge"), "compile", app["pb"], "--framework", "3", "-o", str(om), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    _check(ge.load_om(om), app["x"], app["ref"])


def test_app_saved_model_cli_atc(keras_app, tmp_path):
    app = keras_app("MobileNetV2")
    out = tmp_path / "mnv2_sm"
    r = subprocess.run([os.path.join(BIN, "atc"), f"--model={app['saved_model']}", "--framework=3",
                        f"--output={out}", "--soc_version=cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    model = ge.load_om(str(out) + ".om")
    _check(model, app["x"], app["ref"])
    # the run command on the same .om
    res = tmp_path / "res"
    r = subprocess.run([os.path.join(BIN, "ge"), "run", str(out) + ".om", "--input",
                        f"{model.input_names[0]}={app['x_path']}", "--output-dir", str(res)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    y = np.load(res / f"{model.output_names[0]}.npy")
    np.testing.assert_allclose(y, app["ref"], rtol=RTOL, atol=ATOL)
