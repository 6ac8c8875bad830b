"""Quantised models from the framework frontends run in int8: TensorFlow's fake-quant ops
(quantisation-aware training) and PyTorch's PT2E (``convert_pt2e``'s ``quantized_decomposed``
quantize/dequantize nodes) read as QuantizeLinear -> DequantizeLinear, then into int8 regions
by ge_quant's ``qdq_regions`` pass: outputs against the framework's own run, the int8 report."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import UnsupportedOpError
from ge_native import int8
from ge_sdk import quant

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")

#: the integer units the int8 kernels run on (elsewhere the same graph runs float32 on the grid)
INTEGER_UNITS = ("amx_int8", "avx512_vnni", "avx2")


def _run(model, feed: dict) -> np.ndarray:
    got = model.run(feed)
    return np.asarray(list(got.values())[0] if isinstance(got, dict) else got[0])


def _check_int8(model, ops: int) -> None:
    """``ops`` matrix ops found their int8 entry; they ran in int8 where the machine has an
    integer unit, else each says why it stayed float32."""
    report = model.report["int8"]
    assert report["ops"] == ops and not report["not_reached"] and report["boundaries"] == []
    assert len(model.graph.metadata[quant.TABLE]) == ops
    if int8.isa() in INTEGER_UNITS:
        assert report["ops_int8"] == ops and report["macs_int8_share"] == 1.0, report["float32"]
    else:
        assert report["ops_int8"] == 0 and len(report["float32"]) == ops


# ------------------------------------------------------------------------------------------------
# TensorFlow


def _tf_cnn(seed: int = 0):
    """Four 3x3 convs (NHWC) with TF's per-channel symmetric narrow-range weight fake-quant
    (zero point 128) and per-tensor activation fake-quant: what QAT models hold."""
    rng = np.random.default_rng(seed)
    chans = [3, 16, 32, 32, 16]
    ws = [(rng.standard_normal((3, 3, a, b)) * (1.5 / np.sqrt(9 * a))).astype(np.float32)
          for a, b in zip(chans, chans[1:])]

    def fq_weight(w):
        m = np.abs(w).reshape(-1, w.shape[-1]).max(0)
        return tf.quantization.fake_quant_with_min_max_vars_per_channel(tf.constant(w), -m, m, narrow_range=True)

    @tf.function(input_signature=[tf.TensorSpec((1, 16, 16, 3), tf.float32, name="x")])
    def f(x):
        y = tf.quantization.fake_quant_with_min_max_vars(x, -3.0, 3.0)
        for i, w in enumerate(ws):
            y = tf.nn.conv2d(y, fq_weight(w), 1, "SAME")
            if i < len(ws) - 1:
                y = tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu(y), 0.0, 4.0)
        return tf.quantization.fake_quant_with_min_max_vars(y, -8.0, 8.0)

    return f


def test_a_tensorflow_fake_quant_cnn_runs_in_int8_and_matches_tensorflow():
    f = _tf_cnn()
    model = ge.compile(ge.load(f))
    _check_int8(model, 4)
    assert not any("QuantizeLinear" in k or "DequantizeLinear" in k for k in model.report["op_counts"])
    # the weights' uint8 zero point 128 is read as int8 with zero point 0
    assert sorted(len(e["w"]["scale"]) for e in model.graph.metadata[quant.TABLE].values()) == [16, 16, 32, 32]
    step = np.float32(16.0 / 255)  # (the output fake-quant's step)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((1, 16, 16, 3)).astype(np.float32)
        want, got = f(x).numpy(), _run(model, {"x": x})
        # TF's floor(x / s + 0.5) and ONNX's half-to-even rounding differ at ties: one step
        assert np.abs(got - want).max() <= step * 1.001, np.abs(got - want).max()
        assert np.mean(np.abs(got - want) > 1e-4) < 0.01


def _fq_case(kind: str, bits: int, narrow: bool, lo, hi):
    if kind == "args":
        return lambda v: tf.quantization.fake_quant_with_min_max_args(v, lo, hi, num_bits=bits, narrow_range=narrow)
    if kind == "vars":
        return lambda v: tf.quantization.fake_quant_with_min_max_vars(v, lo, hi, num_bits=bits, narrow_range=narrow)
    return lambda v: tf.quantization.fake_quant_with_min_max_vars_per_channel(v, np.asarray(lo, np.float32),
                                                                              np.asarray(hi, np.float32),
                                                                              num_bits=bits, narrow_range=narrow)


@pytest.mark.parametrize("kind,bits,narrow,lo,hi", [
    ("vars", 8, False, -1.0, 3.0), ("vars", 8, True, -2.5, 2.5), ("vars", 4, False, -1.3, 2.0),
    ("vars", 16, False, -1.0, 3.0), ("vars", 12, True, -0.7, 5.0), ("args", 8, False, -6.0, 6.0),
    ("args", 5, True, 0.0, 3.0), ("args", 8, False, 0.5, 3.0), ("args", 2, False, -1.0, 1.0),
    ("channel", 8, True, [-1.0, -2.0, -0.5], [1.0, 2.5, 3.0]),
    ("channel", 3, False, [-1.0, 0.0, -4.0], [1.0, 2.5, 0.5]),
])
@pytest.mark.parametrize("rank", [2, 4])
def test_each_tensorflow_fake_quant_matches_tensorflow(kind, bits, narrow, lo, hi, rank):
    """TF's nudged scale and zero point, 2 to 16 bits, narrow range, per channel (last axis), a
    range not holding 0: the same grid as TensorFlow, one step apart at most (at ties)."""
    from ge_tensorflow.mappers import nudge

    shape = (2, 5, 5, 3) if rank == 4 else (7, 3)
    x = (np.random.default_rng(bits).standard_normal(shape) * 2).astype(np.float32)
    x.reshape(-1)[:4] = [0.0, 100.0, -100.0, float(np.float32(lo if np.ndim(lo) == 0 else lo[0]))]
    f = tf.function(_fq_case(kind, bits, narrow, lo, hi), input_signature=[tf.TensorSpec(shape, tf.float32, name="x")])
    want = f(x).numpy()
    got = _run(ge.compile(ge.load(f)), {"x": x})
    scale = nudge(np.asarray(lo, np.float32), np.asarray(hi, np.float32), bits, narrow)[0]
    assert np.all(np.abs(got - want) <= np.max(scale) * 1.001)
    assert np.mean(np.abs(got - want) > 1e-6) < 0.05


def test_a_tensorflow_fake_quant_with_trained_ranges_is_refused_by_name():
    @tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x"), tf.TensorSpec((), tf.float32, name="lo"),
                                  tf.TensorSpec((), tf.float32, name="hi")])
    def f(x, lo, hi):
        return tf.quantization.fake_quant_with_min_max_vars(x, lo, hi)

    with pytest.raises(UnsupportedOpError, match="FakeQuantWithMinMaxVars.*not constants"):
        ge.load(f)


# ------------------------------------------------------------------------------------------------
# PyTorch PT2E


def _decomposed():
    """torch.ops.quantized_decomposed (registered by torch.ao's fx._decomposed, or torchao)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    return torch.ops.quantized_decomposed


class _PT2ENet(torch.nn.Module):  # type: ignore[name-defined]
    """What ``convert_pt2e`` makes of four conv + ReLU layers, a mean and a Linear (torch 2.13
    moved ``prepare_pt2e``/``convert_pt2e`` to torchao, which this environment does not ship; the
    graph below is the one torchao 0.18 produces, node for node): int8 weights per output channel
    (zero point 0) through ``dequantize_per_channel``, activations through
    ``quantize_per_tensor`` -> ``dequantize_per_tensor``. ``act`` int8: XNNPACKQuantizer's
    symmetric config (weights in [-127, 127], output quantised); uint8: X86InductorQuantizer's."""

    def __init__(self, act: str, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        chans = [3, 16, 32, 32, 32]
        self.act = act
        self.float_convs = [(torch.randn(b, a, 3, 3, generator=g) / (3 * a ** 0.5), torch.randn(b, generator=g) * 0.1)
                            for a, b in zip(chans, chans[1:])]
        self.float_fc = (torch.randn(10, 32, generator=g) / 32 ** 0.5, torch.randn(10, generator=g) * 0.1)
        wmin = -127 if act == "int8" else -128
        for i, (w, b) in enumerate([*self.float_convs, self.float_fc]):
            s = (w.reshape(w.shape[0], -1).abs().amax(1) / 127).float()
            q = torch.clamp(torch.round(w / s.reshape(-1, *[1] * (w.ndim - 1))), wmin, 127).to(torch.int8)
            self.register_buffer(f"w{i}", q)
            self.register_buffer(f"s{i}", s)
            self.register_buffer(f"z{i}", torch.zeros(w.shape[0], dtype=torch.int64))
            self.register_buffer(f"b{i}", b)
        self.wmin = wmin
        self.qparams: list[tuple[float, int]] = []

    def _q(self, x, i: int):
        qd = _decomposed()
        s, z = self.qparams[i]
        lo, hi, dt = (-128, 127, torch.int8) if self.act == "int8" else (0, 255, torch.uint8)
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(x, s, z, lo, hi, dt), s, z, lo, hi, dt)

    def _w(self, i: int):
        w, s, z = (getattr(self, f"{k}{i}") for k in "wsz")
        return _decomposed().dequantize_per_channel(w, s, z, 0, self.wmin, 127, torch.int8)

    def forward(self, x):
        y = self._q(x, 0)
        for i in range(4):
            y = torch.relu(torch.nn.functional.conv2d(y, self._w(i), getattr(self, f"b{i}"), padding=1))
            y = self._q(y, i + 1)
        y = torch.nn.functional.linear(self._q(y.mean((2, 3)), 5), self._w(4), self.b4)
        return self._q(y, 6) if self.act == "int8" else y

    def calibrate(self, x) -> None:
        """Per-tensor min/max ranges of the float model (what the observers record)."""
        lo, hi = (-128, 127) if self.act == "int8" else (0, 255)
        seen = [x]
        y = x
        for w, b in self.float_convs:
            y = torch.relu(torch.nn.functional.conv2d(y, w, b, padding=1))
            seen.append(y)
        seen.append(y.mean((2, 3)))
        seen.append(torch.nn.functional.linear(seen[-1], *self.float_fc))
        for t in seen:
            mn, mx = min(float(t.min()), 0.0), max(float(t.max()), 0.0)
            s = (mx - mn) / (hi - lo)
            self.qparams.append((s, int(np.clip(round(lo - mn / s), lo, hi))))


@pytest.mark.parametrize("act", ["int8", "uint8"])
def test_a_pt2e_quantised_cnn_runs_in_int8_and_matches_torch(act):
    net = _PT2ENet(act).eval()
    net.calibrate(torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)))
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    model = ge.compile(ge.load((net, (x,))))
    _check_int8(model, 5)
    assert not any("QuantizeLinear" in k or "DequantizeLinear" in k or k == "Cast" for k in model.report["op_counts"])
    for seed in (3, 4):
        xi = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = net(xi).numpy()
        got = _run(model, {model.graph.inputs[0].name: xi.numpy()})
        # torch rounds x * (1 / s), ONNX x / s: one output step apart at most (the int8 output's
        # step; the uint8 model's float output: its int32 sums rounded differently)
        step = net.qparams[6][0] if act == "int8" else 1e-3 * float(np.ptp(want))
        assert np.abs(got - want).max() <= step * 1.001, (np.abs(got - want).max(), step)


def test_a_pt2e_weight_left_unfolded_is_quantised_at_load():
    """``convert_pt2e(fold_quantize=False)`` keeps ``quantize_per_channel`` of the float weight:
    the mapper quantises the constant as torch does, so the conv still finds its int8 weight."""
    qd = _decomposed()
    w = torch.randn(8, 3, 3, 3, generator=torch.Generator().manual_seed(5))
    s = (w.reshape(8, -1).abs().amax(1) / 127).float()
    z = torch.zeros(8, dtype=torch.int64)

    class Net(torch.nn.Module):
        def forward(self, x):
            xq = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.03, 3, -128, 127, torch.int8), 0.03, 3, -128, 127,
                                          torch.int8)
            wq = qd.quantize_per_channel(w, s, z, 0, -127, 127, torch.int8)
            wq = qd.dequantize_per_channel(wq, s, z, 0, -127, 127, torch.int8)
            return torch.nn.functional.conv2d(xq, wq, padding=1)

    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    g = ge.load((Net().eval(), (x,)))
    assert sum(n.op_type == "QuantizeLinear" for n in g.node_list()) == 1  # (the weight's is folded)
    model = ge.compile(g)
    assert model.report["int8"]["ops"] == 1
    with torch.no_grad():
        want = Net().eval()(x).numpy()
    got = _run(model, {model.graph.inputs[0].name: x.numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
