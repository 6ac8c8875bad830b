"""Segmentation heads that resize back to the input size (issue 20, shape inference completeness).

``F.interpolate(y, size=x.shape[-2:])`` exports to a ``Resize`` whose ``sizes`` come from a
computed ``Shape -> Slice -> Concat`` chain: every torchvision and transformers segmentation
model ends that way. The models here are built in code with random weights in torchvision's own
layout (torchvision is not a dependency of this project): an FCN (a strided conv backbone, an
FCN head, the resize to the input size) and a DeepLabV3 head (ASPP with its image-pooling
branch resized to the feature map). Each is exported by torch's ONNX exporter (TorchScript
path, opset 17) with static shapes and with dynamic axes, compiled, and compared with
onnxruntime.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ge_core as ge


def _cbr(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class Backbone(nn.Module):
    """Output stride 8, as torchvision's segmentation backbones (dilated last stage)."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.Sequential(_cbr(3, 8, 2), _cbr(8, 16, 2), _cbr(16, 24, 2), _cbr(24, 32, dilation=2))

    def forward(self, x):
        return self.stages(x)


class FCN(nn.Module):
    """torchvision.models.segmentation.FCN in small: backbone, FCNHead, resize to the input."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.classifier = nn.Sequential(_cbr(32, 8), nn.Dropout(0.1), nn.Conv2d(8, num_classes, 1))

    def forward(self, x):
        input_shape = x.shape[-2:]
        y = self.classifier(self.backbone(x))
        return F.interpolate(y, size=input_shape, mode="bilinear", align_corners=False)


class ASPPPooling(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x):
        size = x.shape[-2:]
        for mod in self:
            x = mod(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class DeepLabV3(nn.Module):
    """torchvision's DeepLabV3 head in small: ASPP (1x1, two dilated 3x3, image pooling)."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.aspp = nn.ModuleList([nn.Sequential(nn.Conv2d(32, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU()),
                                   _cbr(32, 8, dilation=2), _cbr(32, 8, dilation=3), ASPPPooling(32, 8)])
        self.project = nn.Sequential(nn.Conv2d(32, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Sequential(_cbr(8, 8), nn.Conv2d(8, num_classes, 1))

    def forward(self, x):
        input_shape = x.shape[-2:]
        f = self.backbone(x)
        y = self.project(torch.cat([m(f) for m in self.aspp], dim=1))
        return F.interpolate(self.head(y), size=input_shape, mode="bilinear", align_corners=False)


def _model(cls) -> nn.Module:
    torch.manual_seed(0)
    m = cls().eval()
    for mod in m.modules():  # non-trivial batch norm statistics
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m


def _export(model: nn.Module, dynamic: dict | None) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 3, 64, 64),), f, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["out"], dynamic_axes={"x": dynamic} if dynamic else None)
    return onnx.load_from_string(f.getvalue())


def _ort(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


SHAPES = {
    "static": (None, [(1, 3, 64, 64)]),
    "dynamic-batch": ({0: "batch"}, [(1, 3, 64, 64), (2, 3, 64, 64)]),
    "dynamic-batch-and-size": ({0: "batch", 2: "height", 3: "width"}, [(1, 3, 64, 64), (2, 3, 48, 80)]),
}


@pytest.mark.parametrize("axes", sorted(SHAPES))
@pytest.mark.parametrize("cls", [FCN, DeepLabV3], ids=lambda c: c.__name__)
def test_segmentation_model_resizes_to_its_input(cls, axes):
    model = _model(cls)
    dynamic, shapes = SHAPES[axes]
    m = _export(model, dynamic)
    resize = [n for n in m.graph.node if n.op_type == "Resize"]
    assert resize and all(len(n.input) == 4 and n.input[3] for n in resize)  # sizes, computed
    inits = {i.name for i in m.graph.initializer}
    assert not any(n.input[3] in inits for n in resize)
    compiled = ge.compile(ge.load(m))
    for i, shape in enumerate(shapes):
        x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        got = compiled.run({"x": x})["out"]
        want = _ort(m, x)
        assert got.shape == want.shape == (shape[0], 3, *shape[2:])
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        with torch.no_grad():
            np.testing.assert_allclose(got, model(torch.from_numpy(x)).numpy(), rtol=1e-3, atol=1e-4)
