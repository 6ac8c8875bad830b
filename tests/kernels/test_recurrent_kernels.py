"""LSTM / GRU / RNN kernels (plugins/ge_cpu/kernels/recurrent.py) against onnxruntime.

onnxruntime runs these ops in float32 (and LSTM in float16) with ``layout=0`` only: ``layout=1``
is checked against onnxruntime on the transposed layout-0 model, float64 against onnxruntime's
float32 result (loose) and onnx.reference's float64 one (tight, default attributes only, since
onnx.reference ignores activations, clip and sequence_lens).
"""

from __future__ import annotations

import numpy as np
import pytest

from ge_core.errors import UnsupportedOpError
from ge_core.kernel import caps

from ._onnx_ref import build_kernel, check, make_model, run_kernel, run_ort

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
N_OUT = {"LSTM": 3, "GRU": 2, "RNN": 2}
T, B, IN, H = 6, 3, 5, 4
SEQ_LENS = {"none": None, "full": np.array([T, T, T], np.int32), "mixed": np.array([6, 2, 4], np.int32),
            "zero": np.array([3, 0, 6], np.int32)}


def _inputs(op, nd, *, seq="none", init=True, peep=False, bias=True, dtype=np.float32, seed=0, batch=B, hidden=H):
    r = np.random.default_rng(seed)
    g = GATES[op]

    def u(*s, scale=1.0):
        return (r.uniform(-1, 1, s) * scale).astype(dtype)

    lens = SEQ_LENS[seq]
    if lens is not None and batch != B:
        lens = np.resize(lens, batch).astype(np.int32)
    ins = [u(T, batch, IN), u(nd, g * hidden, IN, scale=0.7), u(nd, g * hidden, hidden, scale=0.7),
           u(nd, 2 * g * hidden, scale=0.5) if bias else None, lens, u(nd, batch, hidden) if init else None]
    if op == "LSTM":
        ins += [u(nd, batch, hidden) if init else None, u(nd, 3 * hidden, scale=0.5) if peep else None]
    return ins


def _nd(direction):
    return 2 if direction == "bidirectional" else 1


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seq", ["none", "mixed", "zero"])
@pytest.mark.parametrize("init", [False, True])
def test_directions_lengths_states(op, direction, seq, init):
    nd = _nd(direction)
    ins = _inputs(op, nd, seq=seq, init=init)
    check(op, ins, {"hidden_size": H, "direction": direction}, opset=14, n_outputs=N_OUT[op], const=(1, 2, 3))


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1), ("RNN", 0)])
@pytest.mark.parametrize("batch,hidden", [(4, 8), (6, 5), (9, 3), (1, 7)])
def test_batch_and_hidden_sizes(op, lbr, batch, hidden):
    """The step GEMM's 4 x 4 tiles and its leftover rows / gate units."""
    ins = _inputs(op, 2, seq="mixed", batch=batch, hidden=hidden, peep=op == "LSTM")
    attrs = {"hidden_size": hidden, "direction": "bidirectional"}
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    check(op, ins, attrs, opset=14, n_outputs=N_OUT[op], const=(1, 2, 3))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("const", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_weights_dynamic_and_no_bias(op, const, bias):
    ins = _inputs(op, 2, bias=bias, seq="full")
    check(op, ins, {"hidden_size": H, "direction": "bidirectional"}, opset=14, n_outputs=N_OUT[op],
          const=(1, 2, 3) if const else ())


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seq", ["none", "mixed"])
@pytest.mark.parametrize("input_forget", [0, 1])
@pytest.mark.parametrize("peep", [False, True])
def test_lstm_peepholes_input_forget(direction, seq, input_forget, peep):
    ins = _inputs("LSTM", _nd(direction), seq=seq, peep=peep)
    check("LSTM", ins, {"hidden_size": H, "direction": direction, "input_forget": input_forget}, opset=14,
          n_outputs=3, const=(1, 2, 3, 7))


@pytest.mark.parametrize("op,peep", [("LSTM", False), ("LSTM", True), ("GRU", False), ("RNN", False)])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("clip", [0.3, 1.5])
def test_clip(op, peep, direction, clip):
    ins = _inputs(op, _nd(direction), peep=peep, seq="mixed")
    for a in ins[:3]:
        a *= 3  # push pre-activations past the clip bound
    check(op, ins, {"hidden_size": H, "direction": direction, "clip": clip}, opset=14, n_outputs=N_OUT[op])


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seq", ["none", "mixed"])
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(direction, seq, lbr):
    ins = _inputs("GRU", _nd(direction), seq=seq)
    check("GRU", ins, {"hidden_size": H, "direction": direction, "linear_before_reset": lbr}, opset=14,
          n_outputs=2, const=(1, 2, 3))


# (activations of one direction, alpha, beta): every activation function the spec lists, with the
# alpha/beta they consume given explicitly (onnxruntime's defaults differ from ONNX's for some)
ACTS = {
    "LSTM": [
        (["Sigmoid", "Tanh", "Tanh"], None, None),
        (["HardSigmoid", "Tanh", "Softsign"], [0.3], [0.6]),
        (["Sigmoid", "Relu", "Affine"], [0.8], [0.1]),
        (["Sigmoid", "LeakyRelu", "ScaledTanh"], [0.05, 1.3], [0.7]),
        (["Sigmoid", "Elu", "Softplus"], [0.9], None),
        (["Sigmoid", "ThresholdedRelu", "Sigmoid"], [0.2], None),
        (["Tanh", "Sigmoid", "Tanh"], None, None),
    ],
    "GRU": [
        (["HardSigmoid", "Softsign"], [0.25], [0.45]),
        (["Sigmoid", "Relu"], None, None),
        (["Sigmoid", "Elu"], [0.6], None),
        (["Softsign", "ScaledTanh"], [1.2], [0.8]),
        (["Sigmoid", "Softplus"], None, None),
        (["Sigmoid", "Affine"], [0.5], [0.2]),
    ],
    "RNN": [
        (["Relu"], None, None), (["Sigmoid"], None, None), (["LeakyRelu"], [0.1], None),
        (["ThresholdedRelu"], [0.15], None), (["Elu"], [0.7], None), (["Softsign"], None, None),
        (["Softplus"], None, None), (["Affine"], [1.5], [-0.2]), (["ScaledTanh"], [0.9], [1.1]),
        (["HardSigmoid"], [0.3], [0.4]),
    ],
}
ACT_CASES = [(op, i) for op in ACTS for i in range(len(ACTS[op]))]


@pytest.mark.parametrize("op,k", ACT_CASES, ids=[f"{op}-{'-'.join(ACTS[op][k][0])}" for op, k in ACT_CASES])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_activations(op, k, direction):
    names, alpha, beta = ACTS[op][k]
    nd = _nd(direction)
    attrs: dict = {"hidden_size": H, "direction": direction, "activations": names * nd}
    if alpha:
        attrs["activation_alpha"] = alpha * nd
    if beta:
        attrs["activation_beta"] = beta * nd
    ins = _inputs(op, nd, seq="mixed", peep=op == "LSTM")
    check(op, ins, attrs, opset=14, n_outputs=N_OUT[op], rtol=2e-4, atol=2e-5)


def test_bidirectional_different_activations_per_direction():
    ins = _inputs("GRU", 2)
    check("GRU", ins, {"hidden_size": H, "direction": "bidirectional",
                       "activations": ["Sigmoid", "Tanh", "HardSigmoid", "Relu"],
                       "activation_alpha": [0.3], "activation_beta": [0.4]}, opset=14, n_outputs=2)
    ins = _inputs("LSTM", 2, peep=True)
    check("LSTM", ins, {"hidden_size": H, "direction": "bidirectional",
                        "activations": ["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Softsign"]},
          opset=14, n_outputs=3)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("seq", ["none", "mixed"])
def test_layout_1(op, direction, seq):
    """layout=1 (batch first) equals layout 0 on the transposed tensors (onnxruntime)."""
    nd = _nd(direction)
    ins = _inputs(op, nd, seq=seq, peep=op == "LSTM")
    attrs = {"hidden_size": H, "direction": direction}
    n = N_OUT[op]
    model, feeds = make_model(op, ins, attrs, 14, [f"o{j}" for j in range(n)])
    ref = run_ort(model, feeds)
    ins1 = list(ins)
    ins1[0] = np.ascontiguousarray(ins[0].transpose(1, 0, 2))
    ins1[5] = np.ascontiguousarray(ins[5].transpose(1, 0, 2))
    if op == "LSTM":
        ins1[6] = np.ascontiguousarray(ins[6].transpose(1, 0, 2))
    exp = [ref[0].transpose(2, 0, 1, 3)] + [r.transpose(1, 0, 2) for r in ref[1:]]
    check(op, ins1, {**attrs, "layout": 1}, opset=14, n_outputs=n, expected=exp)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_float64(op, direction):
    nd = _nd(direction)
    ins64 = _inputs(op, nd, dtype=np.float64)
    attrs = {"hidden_size": H, "direction": direction}
    n = N_OUT[op]
    # tight: onnx.reference computes float64 (default activations, no sequence_lens)
    check(op, ins64, attrs, opset=14, n_outputs=n, ref="onnx", rtol=1e-12, atol=1e-12)
    # and onnxruntime's float32 result within float32 accuracy, with lengths
    ins64 = _inputs(op, nd, dtype=np.float64, seq="mixed")
    ins32 = [None if a is None else (a.astype(np.float32) if a.dtype == np.float64 else a) for a in ins64]
    model, feeds = make_model(op, ins32, attrs, 14, [f"o{j}" for j in range(n)])
    exp = [r.astype(np.float64) for r in run_ort(model, feeds)]
    check(op, ins64, attrs, opset=14, n_outputs=n, expected=exp, rtol=1e-4, atol=1e-5)


def test_float16_lstm():
    ins = _inputs("LSTM", 2, dtype=np.float16, peep=True, seq="mixed")
    check("LSTM", ins, {"hidden_size": H, "direction": "bidirectional"}, opset=14, n_outputs=3,
          rtol=5e-3, atol=3e-3)


@pytest.mark.parametrize("op", ["GRU", "RNN"])
def test_float16_gru_rnn(op):
    """float16 computes in float32: compare with onnxruntime's float32 run."""
    ins = _inputs(op, 2, dtype=np.float16, seq="mixed")
    attrs = {"hidden_size": H, "direction": "bidirectional"}
    ins32 = [None if a is None else (a.astype(np.float32) if a.dtype == np.float16 else a) for a in ins]
    model, feeds = make_model(op, ins32, attrs, 14, ["o0", "o1"])
    exp = [r.astype(np.float16) for r in run_ort(model, feeds)]
    check(op, ins, attrs, opset=14, n_outputs=2, expected=exp, rtol=5e-3, atol=2e-3)


OPTIONAL_OUTPUTS = [(op, o) for op in ("LSTM", "GRU", "RNN")
                    for o in (["", "yh"], ["y"], ["", "", "yc"], ["", "yh", "yc"]) if op == "LSTM" or len(o) < 3]


@pytest.mark.parametrize("op,outputs", OPTIONAL_OUTPUTS)
def test_optional_outputs(op, outputs):
    ins = _inputs(op, 2, seq="mixed")
    check(op, ins, {"hidden_size": H, "direction": "bidirectional"}, opset=14, outputs=outputs)


@pytest.mark.parametrize("opset", [7, 22])
def test_other_opsets(opset):
    ins = _inputs("LSTM", 1, peep=True)
    check("LSTM", ins, {"hidden_size": H}, opset=opset, n_outputs=3)
    check("GRU", _inputs("GRU", 1), {"hidden_size": H, "linear_before_reset": 1}, opset=opset, n_outputs=2)


def test_hidden_size_inferred_and_defaults():
    ins = _inputs("RNN", 1)
    check("RNN", ins[:3], {}, opset=14, n_outputs=2, ref="onnx", rtol=1e-5)


@pytest.mark.parametrize("op,extra", [("LSTM", {}), ("LSTM", {"input_forget": 1}), ("GRU", {}),
                                      ("GRU", {"linear_before_reset": 1}), ("RNN", {})])
def test_fused_and_numpy_paths_agree(monkeypatch, op, extra):
    """The native recurrence and the NumPy path (GE_NATIVE_RECURRENT=0) give the same results."""
    from ge_core.ir.types import TensorType

    ins = _inputs(op, 2, seq="mixed", batch=6, hidden=7)
    attrs = {"hidden_size": 7, "direction": "bidirectional", "clip": 0.9, **extra}
    outs = [TensorType(np.float32, None)] * N_OUT[op]
    jit = run_kernel(op, ins, attrs, 14, outs, const=(1, 2, 3))
    monkeypatch.setenv("GE_NATIVE_RECURRENT", "0")
    plain = run_kernel(op, ins, attrs, 14, outs, const=(1, 2, 3))
    assert len(jit) == len(plain) == N_OUT[op]
    for a, b in zip(jit, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_accepts_out():
    ins = _inputs("LSTM", 2, seq="mixed")
    attrs = {"hidden_size": H, "direction": "bidirectional"}
    model, feeds = make_model("LSTM", ins, attrs, 14, ["a", "b", "c"])
    ref = run_ort(model, feeds)
    from ge_core.ir.types import TensorType

    kernel = build_kernel("LSTM", ins, attrs, 14, [TensorType.of(r) for r in ref], const=(1, 2, 3))
    assert caps(kernel).accepts_out
    outs = tuple(np.empty_like(r) for r in ref)
    res = kernel(*ins, out=outs)
    for o, r, e in zip(outs, res, ref):
        assert r is o
        np.testing.assert_allclose(o, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,what", [
    ({"direction": "sideways"}, "direction"),
    ({"activations": ["Sigmoid", "Tanh", "Gelu"]}, "activation"),
    ({"activations": ["Sigmoid", "Tanh"]}, "activations"),
    ({"layout": 2}, "layout"),
    ({"clip": -1.0}, "clip"),
])
def test_unsupported_attributes(attrs, what):
    ins = _inputs("LSTM", 1)
    with pytest.raises(UnsupportedOpError, match=what) as e:
        build_kernel("LSTM", ins, {"hidden_size": H, **attrs}, 14, [None, None, None])
    assert "test_LSTM" in str(e.value)


def test_unsupported_dtype():
    ins = _inputs("RNN", 1)
    ins[0] = ins[0].astype(np.int32)
    with pytest.raises(UnsupportedOpError, match="dtype"):
        build_kernel("RNN", ins, {"hidden_size": H}, 14, [None, None])


def test_bad_sequence_lens_is_a_ge_error():
    from ge_core.errors import GEError

    ins = _inputs("GRU", 1)
    ins[4] = np.array([1, 9, 2], np.int32)
    with pytest.raises(GEError, match="sequence_lens"):
        run_kernel("GRU", ins, {"hidden_size": H}, 14, [None, None])


def test_native_in_ge_ops():
    from ge_cpu.plugin import NATIVE, op_table

    kinds = {r["op"]: r["kernel"] for r in op_table() if r["domain"] == "ai.onnx"}
    for op in ("LSTM", "GRU", "RNN"):
        assert kinds[op] == NATIVE


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_kernels_name_their_variant(monkeypatch, op):
    """The report's variant: the native recurrence's, or NumPy with GE_NATIVE_RECURRENT=0."""
    from ge_core.ir.types import TensorType
    from ge_native import recurrent

    ins = _inputs(op, 1)
    outs = [TensorType(np.float32, None)] * N_OUT[op]
    kernel = build_kernel(op, ins, {"hidden_size": H}, 14, outs, const=(1, 2, 3))
    assert caps(kernel).variant == (recurrent.isa() or "numpy")
    monkeypatch.setenv("GE_NATIVE_RECURRENT", "0")
    assert caps(build_kernel(op, ins, {"hidden_size": H}, 14, outs, const=(1, 2, 3))).variant == "numpy"
