"""Transpose sinking on the Keras applications: the frontend's NHWC<->NCHW Transposes cancel.

Each model is compiled with and without ``sink_transposes``; without it the layout Transposes stay
(one pair around nearly every convolution), with it a single one is left (the input's) and the
outputs still match TensorFlow's at the tolerances of test_keras_apps.
"""

from __future__ import annotations

import numpy as np
import pytest

import ge_core as ge

from .test_keras_apps import ATOL, RTOL

#: name -> (Transposes without the pass at least, Transposes with it at most)
APPS = {
    "MobileNetV2": (90, 2),
    "ResNet50": (100, 2),
    "InceptionV3": (150, 2),
    "DenseNet121": (240, 2),
    "EfficientNetB0": (150, 2),
}


@pytest.mark.parametrize("name", list(APPS))
def test_layout_transposes_cancel(keras_app, name):
    app = keras_app(name)
    least_before, most_after = APPS[name]
    before = ge.compile(app["pb"], {"framework": 3, "disabled_passes": ["sink_transposes"]})
    after = ge.compile(app["pb"], {"framework": 3})
    n_before = before.report["op_counts"].get("Transpose", 0)
    n_after = after.report["op_counts"].get("Transpose", 0)
    assert n_before >= least_before
    assert n_after <= most_after, (n_before, n_after)
    assert after.report["kernels"] < before.report["kernels"]
    sunk = [r for r in after.report["passes"] if r["name"] == "sink_transposes"]
    assert sunk and sunk[0]["changed"]
    for model in (before, after):
        (y,) = model.run({model.input_names[0]: app["x"]}).values()
        assert y.shape == app["ref"].shape
        np.testing.assert_allclose(y, app["ref"], rtol=RTOL, atol=ATOL)
