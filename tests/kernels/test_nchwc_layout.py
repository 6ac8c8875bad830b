"""The cpu backend's nchwc_layout pass on real exporter output (torch.onnx.export of small CNN
blocks: ResNet's bottleneck, MobileNet/EfficientNet's depthwise + SE, DenseNet's pre-activation
concat, Inception's branches), each against onnxruntime; the kernels' NumPy form; the ops in an
.om; and the checks an .om's blocked ops get."""

import io

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import ge_core as ge
from ge_core.errors import GraphError
from ge_native import nchwc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Bottleneck(nn.Module):
    def __init__(self, c, mid, stride=1):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(mid, c * 2, 1, bias=False), nn.BatchNorm2d(c * 2))
        self.skip = nn.Sequential(nn.Conv2d(c, c * 2, 1, stride, bias=False), nn.BatchNorm2d(c * 2))

    def forward(self, x):
        return torch.relu(self.c(self.b(self.a(x))) + self.skip(x))


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.blocks = nn.Sequential(Bottleneck(32, 16), Bottleneck(64, 32, 2))

    def forward(self, x):
        return self.blocks(self.stem(x))


class MBConv(nn.Module):
    """MobileNetV2/EfficientNet: expand, depthwise, squeeze-and-excite, project (+ residual)."""

    def __init__(self, c, e, k=3, stride=1, act=nn.SiLU):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), act())
        self.dw = nn.Sequential(nn.Conv2d(e, e, k, stride, k // 2, groups=e, bias=False), nn.BatchNorm2d(e), act())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(e, 16, 1), act(), nn.Conv2d(16, e, 1), nn.Sigmoid())
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))
        self.residual = stride == 1

    def forward(self, x):
        h = self.dw(self.expand(x))
        h = self.project(h * self.se(h))
        return h + x if self.residual else h


class MobileNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU6())
        self.blocks = nn.Sequential(MBConv(32, 96), MBConv(32, 96, 5, 2, nn.Hardswish), MBConv(32, 64, 3, 1, nn.ReLU6))

    def forward(self, x):
        return self.blocks(self.stem(x))


class DenseLayer(nn.Module):
    def __init__(self, c, growth=16):
        super().__init__()
        self.f = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, 32, 1, bias=False), nn.BatchNorm2d(32),
                               nn.ReLU(), nn.Conv2d(32, growth, 3, 1, 1, bias=False))

    def forward(self, x):
        return torch.cat([x, self.f(x)], 1)


class DenseNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, 1, 1)
        self.layers = nn.Sequential(DenseLayer(32), DenseLayer(48), DenseLayer(64))
        self.trans = nn.Sequential(nn.BatchNorm2d(80), nn.ReLU(), nn.Conv2d(80, 48, 1), nn.AvgPool2d(2, 2))

    def forward(self, x):
        return self.trans(self.layers(self.stem(x))).mean((2, 3))


class Inceptionish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU())
        self.b1 = nn.Conv2d(32, 16, 1)
        self.b2 = nn.Sequential(nn.Conv2d(32, 16, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 1, 1))
        self.b3 = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(32, 16, 1))
        self.b4 = nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False), nn.Conv2d(32, 16, 1, dilation=1))
        self.tail = nn.Conv2d(80, 32, 3, 1, 2, dilation=2)

    def forward(self, x):
        h = self.stem(x)
        return torch.relu(self.tail(torch.cat([self.b1(h), self.b2(h), self.b3(h), self.b4(h)], 1)))


class YBlock(nn.Module):
    """RegNetY's block: 1x1, a grouped 3x3 of group width gw, squeeze-and-excite, 1x1 (+ skip)."""

    def __init__(self, c, w, gw, stride=1):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, w, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(w, w, 3, stride, 1, groups=w // gw, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(w, c // 4, 1), nn.ReLU(), nn.Conv2d(c // 4, w, 1),
                                nn.Sigmoid())
        self.c = nn.Sequential(nn.Conv2d(w, w, 1, bias=False), nn.BatchNorm2d(w))
        self.skip = nn.Sequential(nn.Conv2d(c, w, 1, stride, bias=False), nn.BatchNorm2d(w)) if stride > 1 or c != w \
            else nn.Identity()

    def forward(self, x):
        h = self.b(self.a(x))
        return torch.relu(self.c(h * self.se(h)) + self.skip(x))


class RegNetish(nn.Module):
    """Grouped convolutions of 64 and 32 channels a group (the blocked kernels'), then one of 8
    (not whole blocks: it stays NCHW, after the layout is left)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = nn.Sequential(YBlock(32, 128, 64, 2), YBlock(128, 128, 64), YBlock(128, 96, 32, 2))
        self.tail = nn.Conv2d(96, 48, 3, 1, 1, groups=12)

    def forward(self, x):
        return self.tail(self.blocks(self.stem(x)))


class Paddedish(nn.Module):
    """Channel counts that are not whole blocks (MobileNetV2's 24, EfficientNet's 40, 20):
    zero-padded lanes through depthwise, SE, a sigmoid (0 -> 0.5 in the padding), a residual,
    a pre-activation BatchNorm and a Concat whose padded input comes last."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1), nn.BatchNorm2d(24), nn.ReLU6())
        self.b1 = MBConv(24, 72)
        self.b2 = MBConv(24, 72, 5, 2, nn.Hardswish)
        self.up = nn.Sequential(nn.Conv2d(24, 40, 1), nn.BatchNorm2d(40), nn.SiLU())
        self.gate = nn.Sequential(nn.Conv2d(40, 40, 1), nn.Sigmoid())
        self.side = nn.Sequential(nn.BatchNorm2d(40), nn.ReLU(), nn.Conv2d(40, 20, 3, 1, 1))
        self.wide = nn.Conv2d(40, 32, 1)
        self.tail = nn.Conv2d(52, 28, 3, 1, 1)

    def forward(self, x):
        h = self.up(self.b2(self.b1(self.stem(x))))
        h = self.gate(h) * h
        return self.tail(torch.cat([self.wide(h), self.side(h)], 1))


MODELS = {"resnet": (ResNetish, (2, 3, 40, 36)), "mobilenet": (MobileNetish, (1, 3, 34, 30)),
          "densenet": (DenseNetish, (1, 3, 20, 18)), "inception": (Inceptionish, (1, 3, 17, 23)),
          "regnet": (RegNetish, (2, 3, 30, 26)), "padded": (Paddedish, (2, 3, 27, 31))}


def export(name):
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    m = cls().eval()
    with torch.no_grad():  # BN statistics away from 0/1, so the folds are exercised
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.3, 0.3)
    x = torch.randn(shape)
    return to_onnx(m, x), x.numpy()


def to_onnx(m, x):
    """``m``'s export with input ``x`` and output ``y``."""
    buf = io.BytesIO()
    torch.onnx.export(m, (x,), buf, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    return buf.getvalue()


def ort_run(blob, x):
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def op_counts(model):
    out: dict[str, int] = {}
    for n in model.graph.node_list():
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def plane_reorders(model, op):
    """Reorders of whole planes (an SE block's (N, C, 1, 1) scale enters the layout too: 1 pixel)."""
    return sum(1 for n in model.graph.node_list()
               if n.op_type == op and tuple(n.inputs[0].type.shape[2:4]) != (1, 1))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_layout_matches_onnxruntime(name, threads):
    blob, x = export(name)
    model = ge.compile(ge.load(blob), {"threads": threads})
    want = ort_run(blob, x)
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    ops = op_counts(model)
    if nchwc.available():
        # every convolution but the 3-channel stem (and the SE block's 1x1 ones on a 1x1 plane)
        # runs blocked; the layout is entered and left once (densenet's mean: a reorder back)
        assert ops.get("NchwcConv", 0) >= {"resnet": 8, "mobilenet": 9, "densenet": 7, "inception": 6,
                                           "regnet": 13, "padded": 13}[name], ops
        assert plane_reorders(model, "NchwcReorderInput") <= 1, ops
        assert plane_reorders(model, "NchwcReorderOutput") <= 1, ops
        if name == "regnet":  # the three grouped 3x3 of whole-block groups run blocked, the last one not
            grouped = [n for n in model.graph.node_list() if n.op_type == "NchwcConv" and n.attrs.get("group", 1) > 1]
            assert len(grouped) == 3, ops
            left = [n.attrs.get("group", 1) for n in model.graph.node_list() if n.op_type in ("Conv", "FusedConv")]
            assert left == [12], left  # the tail (8 channels a group)
    else:  # the pass leaves the graph alone where the kernels do not run
        assert not any(op.startswith("Nchwc") for op in ops), ops


def test_thread_counts_give_the_same_result():
    blob, x = export("resnet")
    outs = [ge.compile(ge.load(blob), {"threads": t}).run({"x": x})["y"] for t in (1, 2, 3)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_the_pass_can_be_switched_off_by_name():
    blob, x = export("mobilenet")
    off = ge.compile(ge.load(blob), {"disabled_passes": ["nchwc_layout"]})
    assert not any(op.startswith("Nchwc") for op in op_counts(off))
    np.testing.assert_allclose(off.run({"x": x})["y"], ort_run(blob, x), rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels to compile the blocked ops")
@pytest.mark.parametrize("name", ["resnet", "mobilenet", "inception", "regnet", "padded"])
def test_numpy_form_of_the_blocked_ops_matches(name, monkeypatch):
    """An .om made where the vector kernels run, run where they do not: the NumPy forms."""
    blob, x = export(name)
    model = ge.compile(ge.load(blob))
    fast = model.run({"x": x})["y"]
    import ge_native.nchwc as mod

    monkeypatch.setattr(mod, "_mod", lambda: None)
    slow = ge.compile(ge.load(blob), {"disabled_passes": []})  # (compiled again: no blocked ops now)
    assert not any(op.startswith("Nchwc") for op in op_counts(slow))
    again = model.run({"x": x})["y"]  # the blocked ops, every kernel on its NumPy form
    np.testing.assert_allclose(again, fast, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels to compile the blocked ops")
def test_om_round_trip_and_its_blocked_ops_are_checked(tmp_path):
    blob, x = export("mobilenet")
    model = ge.compile(ge.load(blob))
    path = model.save(tmp_path / "m.om")
    loaded = ge.load_om(path)
    assert any(n.op_type == "NchwcConv" for n in loaded.graph.node_list())
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], model.run({"x": x})["y"])
    from ge_core.plugins import registries

    ops = registries().ops
    node = next(n for n in loaded.graph.node_list() if n.op_type == "NchwcConv")
    for attr, bad in (("activation", "exec"), ("strides", [0, 1]), ("pads", [1, 1, -1, 1]), ("clip_min", "0")):
        saved = node.attrs.get(attr)
        node.attrs[attr] = bad
        with pytest.raises(GraphError, match="NchwcConv"):
            ops.check_node(node)
        if saved is None:
            del node.attrs[attr]
        else:
            node.attrs[attr] = saved
    ops.check_node(node)


class SamePadded(nn.Module):
    """``padding="same"`` convolutions (HF EfficientNet's): exported with ``auto_pad=SAME_UPPER``."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, 2, 1)
        self.a = nn.Conv2d(32, 32, 3, padding="same")
        self.b = nn.Conv2d(32, 48, 4, padding="same", dilation=1)  # an even kernel: the odd pad at the end
        self.dw = nn.Conv2d(48, 48, 5, padding="same", groups=48)
        self.c = nn.Conv2d(48, 32, 1, padding="same")

    def forward(self, x):
        return self.c(torch.relu(self.dw(torch.relu(self.b(torch.relu(self.a(torch.relu(self.stem(x)))))))))


def _auto_pad_graph(mode: str):
    """Convolutions and a max pool with ``auto_pad`` ``mode``, stride 2 and an even kernel among them."""
    import onnx
    from onnx import helper as oh
    from onnx import numpy_helper

    rng = np.random.default_rng(3)
    inits, nodes, cur = [], [], "x"
    specs = [(3, 32, 3, 2), (32, 32, 4, 1), (32, 48, 3, 2), (48, 32, 2, 1)]
    for i, (c, m, k, s) in enumerate(specs):
        inits.append(numpy_helper.from_array((rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32), f"w{i}"))
        nodes.append(oh.make_node("Conv", [cur, f"w{i}"], [f"c{i}"], auto_pad=mode, strides=[s, s]))
        nodes.append(oh.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        cur = f"r{i}"
        if i == 1:
            nodes.append(oh.make_node("MaxPool", [cur], ["p"], auto_pad=mode, kernel_shape=[3, 3], strides=[2, 2]))
            cur = "p"
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 37, 42])],
                      [oh.make_tensor_value_info(cur, onnx.TensorProto.FLOAT, None)], inits)
    g.output[0].name = cur
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString(), cur


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_runs_blocked_and_matches_onnxruntime(mode):
    blob, out = _auto_pad_graph(mode)
    x = np.random.default_rng(4).standard_normal((1, 3, 37, 42)).astype(np.float32)
    model = ge.compile(ge.load(blob))
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(model.run({"x": x})[out], want, rtol=1e-3, atol=1e-4)
    ops = op_counts(model)
    if nchwc.available():  # the pads come from the shapes: every convolution and the pool blocked
        assert ops.get("NchwcConv", 0) == 4 and ops.get("NchwcMaxPool", 0) == 1, ops


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_same_padding_from_the_exporter_runs_blocked():
    torch.manual_seed(0)
    m = SamePadded().eval()
    x = torch.randn(1, 3, 29, 33)
    blob = to_onnx(m, x)
    model = ge.compile(ge.load(blob))
    np.testing.assert_allclose(model.run({"x": x.numpy()})["y"], ort_run(blob, x.numpy()), rtol=1e-3, atol=1e-4)
    if nchwc.available():
        assert op_counts(model).get("NchwcConv", 0) == 5, op_counts(model)


class Chain3x3(nn.Module):
    """3x3 convolutions on a 24x24 plane (then 12x12, then 6x6), a residual among them."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, 1, 1)
        self.a = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU())
        self.b = nn.Conv2d(32, 32, 3, 1, 1)
        self.down = nn.Sequential(nn.Conv2d(32, 48, 3, 2, 1), nn.ReLU(), nn.Conv2d(48, 48, 3, 1, 1), nn.ReLU())
        self.small = nn.Sequential(nn.Conv2d(48, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 64, 3, 1, 1))

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.b(self.a(h)) + h)
        return self.small(self.down(h))


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels")
@pytest.mark.parametrize("algorithm,modes", [
    ("auto", {"nchwc winograd2": 4}),          # 24x24 and 12x12 planes; 6x6 (9 tiles) too
    ("winograd", {"nchwc winograd2": 4}),
    ("winograd4", {"nchwc winograd4": 2, "nchwc winograd2": 2}),  # F(4x4) on the 24x24 plane only
    ("im2col", {}),
])
def test_conv_algorithm_chooses_the_blocked_winograd(algorithm, modes):
    torch.manual_seed(1)
    m = Chain3x3().eval()
    x = torch.randn(2, 3, 24, 24)
    blob = to_onnx(m, x)
    model = ge.compile(ge.load(blob), {"conv_algorithm": algorithm, "threads": 2})
    got = {k: v for k, v in model.report["kernel_modes"].items() if "winograd" in k}
    assert got == modes
    want = ort_run(blob, x.numpy())
    np.testing.assert_allclose(model.run({"x": x.numpy()})["y"], want, rtol=1e-3, atol=2e-4 if "4" in algorithm else 1e-4)


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels")
def test_se_gates_fold_into_the_next_convolution_per_image():
    """An SE block's Mul(x, gate) folds into the 1x1 projection after it as an input scale (the
    weight scaled per image), where the plane has more pixels than the projection has outputs;
    a batch of 2 has a gate per image."""
    torch.manual_seed(2)
    m = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), MBConv(32, 96), MBConv(32, 48, 3, 1, nn.ReLU6)).eval()
    x = torch.randn(2, 3, 18, 18)
    blob = to_onnx(m, x)
    model = ge.compile(ge.load(blob), {"threads": 2})
    ops = op_counts(model)
    assert ops.get("Mul", 0) == 0, ops  # (18 x 18 pixels, 32 outputs: both gates fold)
    scaled = [n for n in model.graph.node_list() if n.op_type == "NchwcConv" and len(n.inputs) == 5]
    assert len(scaled) == 2
    assert scaled[0].inputs[4].type.shape[0] == 2  # one gate per image
    np.testing.assert_allclose(model.run({"x": x.numpy()})["y"], ort_run(blob, x.numpy()), rtol=1e-3, atol=1e-4)
    # a small plane keeps its Mul: 4 x 4 pixels, 32 outputs (the weight copy would cost more)
    small = torch.randn(1, 3, 4, 4)
    blob = to_onnx(m, small)
    model = ge.compile(ge.load(blob))
    assert op_counts(model).get("Mul", 0) == 2
    np.testing.assert_allclose(model.run({"x": small.numpy()})["y"], ort_run(blob, small.numpy()), rtol=1e-3, atol=1e-4)


class BiTish(nn.Module):
    """ResNet-V2 (BiT): GroupNorm and ReLU before each convolution (pre-activation), a residual."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, 1, 1)
        self.n1, self.c1 = nn.GroupNorm(32, 64), nn.Conv2d(64, 32, 1)
        self.n2, self.c2 = nn.GroupNorm(8, 32), nn.Conv2d(32, 32, 3, 1, 1)
        self.n3, self.c3 = nn.GroupNorm(2, 32), nn.Conv2d(32, 64, 1)  # (16 channels a group: a block)

    def forward(self, x):
        h = self.stem(x)
        y = self.c1(torch.relu(self.n1(h)))
        y = self.c2(torch.relu(self.n2(y)))
        return self.c3(torch.relu(self.n3(y))) + h


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # (GroupNorm's size check in the trace)
def test_group_norm_runs_blocked_with_its_affine_and_relu(monkeypatch):
    torch.manual_seed(3)
    m = BiTish().eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.GroupNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.3, 0.3)
    x = torch.randn(2, 3, 12, 10)
    blob = to_onnx(m, x)
    model = ge.compile(ge.load(blob), {"threads": 2})
    ops = op_counts(model)
    assert ops.get("NchwcGroupNorm") == 3 and ops.get("NchwcConv") == 4, ops
    assert not {"InstanceNormalization", "Reshape", "Mul", "Relu", "FusedElemwise"} & set(ops), ops
    want = ort_run(blob, x.numpy())
    got = model.run({"x": x.numpy()})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    import ge_native.nchwc as mod

    monkeypatch.setattr(mod, "_mod", lambda: None)  # the blocked ops' NumPy forms
    np.testing.assert_allclose(model.run({"x": x.numpy()})["y"], got, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels")
@pytest.mark.parametrize("k,hw,stride", [(7, 14, 1), (5, 9, 2), (7, 30, 1)])
def test_a_lone_depthwise_conv_runs_on_the_blocked_kernel(k, hw, stride):
    """ConvNeXt's 7x7 depthwise layers stand between Transposes (no layout group): the NCHW kernel
    reorders them through the blocked depthwise kernel, its clip and activation applied there."""
    torch.manual_seed(4)
    m = nn.Sequential(nn.Conv2d(40, 40, k, stride, k // 2, groups=40), nn.Hardswish()).eval()
    x = torch.randn(2, 40, hw, hw + 1)
    blob = to_onnx(m, x)
    model = ge.compile(ge.load(blob), {"threads": 2})
    assert not any(op.startswith("Nchwc") for op in op_counts(model))  # (no layout group: one conv)
    got = model.run({"x": x.numpy()})["y"]
    np.testing.assert_allclose(got, ort_run(blob, x.numpy()), rtol=1e-3, atol=1e-4)
    import ge_native.nchwc as mod

    calls = []
    real = mod.depthwise
    try:
        mod.depthwise = lambda *a, **kw: calls.append(1) or real(*a, **kw)
        again = ge.compile(ge.load(blob)).run({"x": x.numpy()})["y"]
    finally:
        mod.depthwise = real
    assert calls and np.allclose(again, got, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels")
def test_weights_are_packed_at_compile_time_and_a_load_does_no_weight_work(tmp_path, monkeypatch):
    """The layout pass packs each blocked convolution's weight (Winograd-transformed where it
    chose Winograd) and the .om keeps that form: a load packs nothing, and the result is the
    same; the original weight is gone (one form in the file)."""
    blob, x = export("resnet")
    model = ge.compile(ge.load(blob))
    convs = [n for n in model.graph.node_list() if n.op_type == "NchwcConv"]
    packings = {n.attrs.get("weight_packing") for n in convs}
    assert {"plain", "blocked", "winograd2"} <= packings, packings
    assert all(n.inputs[1].const_value.ndim == 1 and len(n.attrs["weight_shape"]) == 4 for n in convs)
    assert not any(v.const_value is not None and v.const_value.ndim == 4 for v in model.graph.constants.values())
    want = model.run({"x": x})["y"]
    path = model.save(tmp_path / "m.om")
    import ge_native.nchwc as mod

    def refuse(*a, **kw):
        raise AssertionError("a load packed a weight")

    for name in ("pack_weights", "pack_plain", "pack_depthwise", "winograd_weights"):
        monkeypatch.setattr(mod, name, refuse)
    loaded = ge.load_om(path)
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], want)


@pytest.mark.skipif(not nchwc.available(), reason="needs the blocked kernels")
def test_a_packed_weight_that_does_not_fit_its_convolution_is_refused(tmp_path):
    from ge_core.errors import GEError

    blob, x = export("resnet")
    model = ge.compile(ge.load(blob))
    node = next(n for n in model.graph.node_list() if n.attrs.get("weight_packing") == "winograd2")
    w = node.inputs[1]
    node.set_input(1, model.graph.add_constant(w.const_value[:-16]))  # a block short
    with pytest.raises(GEError, match=r"winograd2 weight of \d+ floats"):
        model.save(tmp_path / "short.om")
        ge.load_om(tmp_path / "short.om")
    node.set_input(1, w)
    node.attrs["weight_packing"] = "depthwise"  # a packing of another convolution
    with pytest.raises(GEError, match="does not fit the convolution"):
        model.save(tmp_path / "other.om")
        ge.load_om(tmp_path / "other.om")
