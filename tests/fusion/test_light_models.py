"""Kernel launches on the nine light models are at most onnxruntime's optimised node counts,
with outputs matching onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest

import ge_core as ge
from tests.conftest import LIGHT_MODELS, assert_light_outputs_match, light_model_path

#: Nodes in onnxruntime's own optimised graph (the smaller of ORT_ENABLE_EXTENDED / ALL).
ORT_NODES = {"bvlc_alexnet": 15, "densenet121": 432, "inception_v1": 83, "inception_v2": 110, "resnet50": 59,
             "shufflenet": 137, "squeezenet": 39, "vgg19": 26, "zfnet512": 15}


def test_every_light_model_has_a_target():
    assert sorted(ORT_NODES) == LIGHT_MODELS


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_kernels_at_most_onnxruntime_nodes_and_outputs_match(name):
    path = light_model_path(name)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
             for i in sess.get_inputs()}
    want = sess.run(None, feeds)
    model = ge.compile(ge.load(path))
    rep = model.report
    assert rep["kernels"] <= ORT_NODES[name], rep["op_counts"]
    # fused kernels, or the cpu backend's blocked convolutions (which take the fused ones over)
    assert any(k.startswith(("ge.fused::", "ge.cpu::Nchwc")) for k in rep["op_counts"])
    got = model.run(feeds)
    assert_light_outputs_match(name, path, feeds, got, want, rtol=1e-3, atol=1e-4)
