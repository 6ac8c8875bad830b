"""ConvNeXt through the torch frontend (issue 47): timm's convnext_atto, whose AdaptiveAvgPool2d
exports as mean + ``aten.as_strided`` (a restride of the channels-last result of its blocks),
compiles with ge.load and runs under torch.compile(backend="ge") without falling back to eager.

timm is used when it is installed (with the torchvision op schemas defined first, as bench/
does); without it, the same network built here (convnext_atto's stages, depths and widths, its
channels-last block and head), which exports the same ops."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import ge_core as ge
from ge_core.errors import UnsupportedOpError

RTOL, ATOL = 1e-4, 1e-5


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of NCHW, through channels-last (timm's LayerNorm2d)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(nn.Module):
    """ConvNeXt block: depthwise 7x7, then LayerNorm, MLP and layer scale channels-last."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.norm(self.conv_dw(x).permute(0, 2, 3, 1))
        y = self.fc2(nn.functional.gelu(self.fc1(y))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtAtto(nn.Module):
    """convnext_atto's layout: depths (2, 2, 6, 2), widths (40, 80, 160, 320), 1000 classes."""

    def __init__(self, depths=(2, 2, 6, 2), dims=(40, 80, 160, 320), classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        stages, cin = [], dims[0]
        for i, (d, c) in enumerate(zip(depths, dims)):
            down = [] if i == 0 else [LayerNorm2d(cin, eps=1e-6), nn.Conv2d(cin, c, 2, 2)]
            stages.append(nn.Sequential(*down, *[Block(c) for _ in range(d)]))
            cin = c
        self.stages = nn.Sequential(*stages)
        self.pool, self.norm = nn.AdaptiveAvgPool2d(1), LayerNorm2d(cin, eps=1e-6)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.norm(self.pool(self.stages(self.stem(x)))), 1))


def _timm_convnext():
    """timm's convnext_atto (random weights), or None when timm cannot be imported."""
    for op, a, b in (("nms", "dets", "scores"), ("qnms", "qdets", "qscores")):
        try:  # torchvision's ops without its C library (a CPU torch): their schemas suffice for timm
            torch.library.define(f"torchvision::{op}", f"(Tensor {a}, Tensor {b}, float iou_threshold) -> Tensor")
        except Exception:  # noqa: BLE001 - defined already
            pass
    try:
        import timm
    except ImportError:
        return None
    return timm.create_model("convnext_atto", pretrained=False)


@pytest.fixture(scope="module")
def convnext():
    torch.manual_seed(0)
    model = (_timm_convnext() or ConvNeXtAtto()).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
    return model, x, ref


def test_convnext_compiles_through_ge_load_and_matches_eager(convnext):
    model, x, ref = convnext
    graph = ge.load(model, example_inputs=(x,))
    # the pool's aten.as_strided (what the frontend refused), mapped as the Reshape it amounts to
    assert [n.op_type for n in graph.nodes if n.name.startswith("as_strided")] == ["Reshape"]
    compiled = ge.compile(graph)
    (out,) = compiled.run({compiled.input_names[0]: x.numpy()}).values()
    np.testing.assert_allclose(out, ref.numpy(), rtol=RTOL, atol=ATOL)


def test_convnext_runs_under_torch_compile_without_fallback(convnext):
    from ge_torch import dynamo

    model, x, ref = convnext
    torch._dynamo.reset()
    seen = []
    real = dynamo.GeGraphCallable._compile

    def spy(self, a, key):
        entry = real(self, a, key)
        seen.append(entry)
        return entry

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the backend warns when it falls back to eager
        dynamo.GeGraphCallable._compile = spy
        try:
            out = torch.compile(model, backend="ge")(x)
        finally:
            dynamo.GeGraphCallable._compile = real
    torch.testing.assert_close(out, ref, rtol=RTOL, atol=ATOL)
    assert seen and all(e is not dynamo._FALLBACK for e in seen)
    assert sum(e.model.report["nodes_before"] for e in seen) >= 200  # the whole network, one graph


class _Strided(nn.Module):
    def __init__(self, size, stride, offset=0, transpose=False) -> None:
        super().__init__()
        self.size, self.stride, self.offset, self.transpose = size, stride, offset, transpose

    def forward(self, x):
        x = x * 2  # a computed value, not the caller's tensor
        if self.transpose:
            x = x.transpose(0, 1)
        return torch.as_strided(x, self.size, self.stride, self.offset) + 1


@pytest.mark.parametrize("size, stride, offset, transpose", [
    ((4, 6), (6, 1), 0, False),  # the input itself: a Reshape
    ((2, 3, 4), (12, 4, 1), 0, False),  # a reshape
    ((2, 3), (6, 2), 1, False),  # a strided slice with an offset
    ((3, 3, 2), (6, 1, 6), 0, False),  # overlapping windows: the Gather form
    ((4, 6), (1, 4), 0, True),  # a view of a transposed input: its own strides say where it lies
])
def test_as_strided_views(size, stride, offset, transpose):
    m = _Strided(size, stride, offset, transpose).eval()
    x = torch.randn(4, 6) if not transpose else torch.randn(6, 4)
    with torch.no_grad():
        ref = m(x)
    compiled = ge.compile(ge.load(m, example_inputs=(x,)))
    (out,) = compiled.run({compiled.input_names[0]: x.numpy()}).values()
    np.testing.assert_allclose(out, ref.numpy(), rtol=RTOL, atol=ATOL)


def test_as_strided_past_its_input_is_refused_naming_the_node():
    m = _Strided((4, 7), (6, 1)).eval()  # reads past the 24 elements of the input
    with pytest.raises(UnsupportedOpError, match="as_strided.*outside its input"):
        ge.load(m, example_inputs=(torch.randn(4, 6),))
