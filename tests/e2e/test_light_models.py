"""The nine model-zoo architectures the onnx package ships, end to end, against onnxruntime.

Each compiles with `ge compile` to an .om, runs with `ge run`, and matches onnxruntime on the
same random inputs (rtol 1e-3, atol 1e-4); the same through the Python API and ge_onnx.backend.
"""

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ge_core as ge
from tests.conftest import LIGHT_MODELS, assert_light_outputs_match, light_model_path

RTOL, ATOL = 1e-3, 1e-4


def reference(path, seed=0):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
             for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    return feeds, dict(zip(names, sess.run(None, feeds)))


def test_all_nine_models_are_present():
    assert LIGHT_MODELS == ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                            "shufflenet", "squeezenet", "vgg19", "zfnet512"]


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_cli_compile_run_matches_onnxruntime(name, tmp_path):
    path = light_model_path(name)
    feeds, want = reference(path)
    om = tmp_path / f"{name}.om"
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "ge_core.cli", "compile", path, "-o", str(om), "--report", str(report), "-q"],
                   check=True, capture_output=True, text=True)
    args = [sys.executable, "-m", "ge_core.cli", "run", str(om), "--output-dir", str(tmp_path / "out")]
    for k, v in feeds.items():
        np.save(tmp_path / "in.npy", v)
        args += ["--input", f"{k}={tmp_path / 'in.npy'}"]
    subprocess.run(args, check=True, capture_output=True, text=True)
    import json

    rep = json.loads(report.read_text())
    assert rep["nodes_before"] == len(onnx.load(path).graph.node)
    assert rep["kernels"] > 0 and rep["memory"]["arena_bytes"] >= rep["memory"]["lower_bound_bytes"]
    got = {k: np.load(tmp_path / "out" / ("".join(c if c.isalnum() or c in "._-" else "_" for c in k) + ".npy"))
           for k in want}
    assert_light_outputs_match(name, path, feeds, got, list(want.values()), RTOL, ATOL)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_python_api_and_backend_match_onnxruntime(name):
    path = light_model_path(name)
    feeds, want = reference(path, seed=1)
    model = ge.compile(ge.load(path))
    got = model.run(feeds)
    assert list(got) == list(want)
    # squeezenet's constant weights make logits of ~1e10 equal to 1e-7: its softmax is compared
    # at the logits (tests/conftest.py ill_conditioned), the others at their outputs
    assert_light_outputs_match(name, path, feeds, got, list(want.values()), RTOL, ATOL)
    import ge_onnx.backend as backend

    rep = backend.prepare(onnx.load(path), device="CPU")
    outs = rep.run([feeds[k] for k in model.input_names])
    assert_light_outputs_match(name, path, feeds, dict(zip(want, outs)), list(want.values()), RTOL, ATOL)
