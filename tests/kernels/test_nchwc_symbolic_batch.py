"""A symbolic batch keeps the blocked (NCHWc) layout: a CNN exported with a dynamic batch (or
compiled with an ``--input-shape`` batch range) gets the same blocked ops as its static build, and
one compiled model matches onnxruntime at every batch; a convolution the layout still declines (a
symbolic channel or plane) is named in the compile report with the reason (issue #47)."""

import io
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import ge_core as ge
from ge_native import nchwc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SIDE = 24


class Net(nn.Module):
    """Conv+BN+ReLU stem, a depthwise layer with a squeeze-excite gate, a residual pair, pooling,
    a global pool and a Gemm."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 8, 1), nn.ReLU(), nn.Conv2d(8, 16, 1),
                                nn.Sigmoid())
        self.pw = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32))
        self.res = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1))
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        h = self.dw(self.stem(x))
        y = self.pw(h * self.se(h))
        y = self.pool(torch.relu(y + self.res(y)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _export(net, dynamic: dict | None, batch: int = 2, channels: int = 3) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(batch, channels, SIDE, SIDE),), buf, input_names=["x"], output_names=["out"],
                          opset_version=17, dynamo=False, dynamic_axes=dynamic)
    return buf.getvalue()


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():  # (BN statistics away from the identity, so folding them is checked)
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
    return m


def _compile(blob: bytes, **opts):
    return ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": 1, **opts})


def _blocked(model) -> dict[str, int]:
    return {k: v for k, v in model.report["op_counts"].items() if k.startswith("ge.cpu::Nchwc")}


def _layout_stats(model) -> dict:
    return next(p for p in model.report["passes"] if p["name"] == "nchwc_layout").get("stats", {})


def _feeds(n: int, channels: int = 3) -> dict:
    return {"x": np.random.default_rng(n).standard_normal((n, channels, SIDE, SIDE)).astype(np.float32)}


def test_symbolic_batch_gets_the_static_builds_blocked_ops(net):
    static = _compile(_export(net, None, batch=1))
    dyn_blob = _export(net, {"x": {0: "n"}, "out": {0: "n"}})
    dynamic = _compile(dyn_blob)
    ranged = _compile(dyn_blob, input_shape=f"x:1~8,3,{SIDE},{SIDE}")  # the README's range flow
    if not nchwc.available():  # (no AVX2+FMA here: the pass says so instead)
        assert _layout_stats(dynamic) == {"skipped": "the blocked kernels need AVX-512F, or AVX2 with FMA"}
        return
    assert _blocked(static)["ge.cpu::NchwcConv"] == 7
    assert _blocked(dynamic) == _blocked(static) == _blocked(ranged)
    assert not any(k in dynamic.report["op_counts"] for k in ("Conv", "ge.fused::FusedConv", "MaxPool"))
    counts = {k: v for k, v in _layout_stats(static).items() if k != "declined"}
    assert {k: v for k, v in _layout_stats(dynamic).items() if k != "declined"} == counts
    assert counts.get("scales_folded") == 1  # (the SE gate into the 1x1 projection, at any batch)
    assert "declined" not in _layout_stats(dynamic)
    kernels = {n: k["algorithm"] for n, k in dynamic.report["node_kernels"].items() if k["op"] == "NchwcConv"}
    assert kernels == {n: k["algorithm"] for n, k in static.report["node_kernels"].items() if k["op"] == "NchwcConv"}
    sess = ort.InferenceSession(dyn_blob, providers=["CPUExecutionProvider"])
    for n in (1, 3, 8, 3):  # (one compiled model; batch 3 again after a larger one)
        feeds = _feeds(n)
        got = dynamic.run(feeds)["out"]
        want = sess.run(None, feeds)[0]
        assert got.shape == (n, 10)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ranged.run(feeds)["out"], want, rtol=1e-4, atol=1e-4)


def test_symbolic_batch_blocked_graph_output_and_om(tmp_path):
    """The blocked layout's reorder writes a graph output of a symbolic batch (no planned
    buffer: the kernel makes its array at the run's batch), also after a save and a load."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 1, 1), nn.ReLU(),
                        nn.Conv2d(32, 16, 1), nn.AvgPool2d(2)).eval()
    blob = _export(net, {"x": {0: "n"}, "out": {0: "n"}})
    model = _compile(blob)
    if nchwc.available():
        assert _blocked(model)["ge.cpu::NchwcConv"] == 3
    path = model.save(os.fspath(tmp_path / "m.om"))
    loaded = ge.load_om(path, threads=1)
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    for n in (1, 3, 8):
        feeds = _feeds(n)
        want = sess.run(None, feeds)[0]
        for m in (model, loaded):
            got = m.run(feeds)["out"]
            assert got.shape == (n, 16, SIDE // 2, SIDE // 2)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_declined_convolution_is_named_with_its_reason(net):
    """A symbolic channel dim keeps the stem in NCHW (the report says why); the rest of the net,
    whose channels the weights fix, still runs blocked."""
    blob = _export(net, {"x": {0: "n", 1: "c"}, "out": {0: "n"}})
    model = _compile(blob)
    if not nchwc.available():
        return
    declined = _layout_stats(model)["declined"]
    assert list(declined) == ["/stem/stem.0/Conv_1"]
    assert declined["/stem/stem.0/Conv_1"] == "the input's channel dim 'c' is not static (only the batch may be symbolic)"
    assert _blocked(model)["ge.cpu::NchwcConv"] == 6
    feeds = _feeds(3)
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(model.run(feeds)["out"], want, rtol=1e-4, atol=1e-4)


def test_a_lone_convolution_is_declined_for_its_reorders():
    torch.manual_seed(2)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * SIDE * SIDE, 4)).eval()
    model = _compile(_export(net, {"x": {0: "n"}, "out": {0: "n"}}))
    if not nchwc.available():
        return
    (name, why), = _layout_stats(model)["declined"].items()
    assert why.startswith("its connected group of 1 convolution(s) does not pay for its 1 reorder(s)")


@pytest.mark.parametrize("layer", [nn.Conv2d(32, 48, 1), nn.Conv2d(32, 32, 3, 1, 1, groups=32),
                                   nn.Conv2d(32, 16, 3, 2, 1)], ids=["pointwise", "depthwise", "strided"])
def test_a_lone_nchw_convolution_keeps_its_prepared_call_at_a_symbolic_batch(layer):
    """A convolution left in NCHW (a lone one) gets the static build's algorithm (the GEMM call
    or the direct depthwise kernel prepared once, run an image or a batch at a time)."""
    torch.manual_seed(3)
    net = nn.Sequential(layer, nn.ReLU()).eval()
    blob = _export(net, {"x": {0: "n"}, "out": {0: "n"}}, channels=32)
    dynamic, static = _compile(blob), _compile(_export(net, None, batch=1, channels=32))

    def algorithm(m):
        return [k["algorithm"] for k in m.report["node_kernels"].values() if k["op"] in ("Conv", "FusedConv")]

    assert len(algorithm(static)) == 1 and algorithm(dynamic) == algorithm(static)
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    for n in (1, 3, 2):
        feeds = _feeds(n, 32)
        np.testing.assert_allclose(dynamic.run(feeds)["out"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
