"""The native LSTM / GRU / RNN recurrence (ge_native.recurrent, csrc/recurrent.c) in every
variant this CPU runs, forced by ``GE_NATIVE_RECURRENT=<variant>``: against onnx.reference on
what it implements (directions, layouts, initial states, peepholes, linear_before_reset) and
against onnxruntime on what onnx.reference ignores (activations with alpha / beta, clip,
input_forget, sequence_lens); the same bits at 1 and 2 threads; bad sizes refused without a
crash; and an LSTM model that runs without importing numba."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ge_core.errors import GEError
from ge_core.ir.types import TensorType
from ge_core.kernel import caps
from ge_native import parallel
from ge_native import recurrent as nr

from ._onnx_ref import build_kernel, check, run_kernel

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
N_OUT = {"LSTM": 3, "GRU": 2, "RNN": 2}
T, B, IN, H = 5, 3, 6, 20  # H past one 16-lane panel, W past one 32-column block
LENS = np.array([5, 2, 0], np.int32)

@pytest.fixture(params=nr.VARIANTS)
def variant(request, monkeypatch):
    """Each variant, forced: the one that runs (a variant this CPU cannot run: the dispatch falls
    back to the best it runs, asserted, and the test runs that)."""
    monkeypatch.setenv("GE_NATIVE_RECURRENT", request.param)
    want = request.param if request.param in nr.runnable() else nr.runnable()[0]
    assert nr.isa() == want
    return want


def _inputs(op, nd, *, seq=None, init=True, peep=False, batch=B, hidden=H, seed=0):
    r = np.random.default_rng(seed)
    g = GATES[op]

    def u(*s, scale=1.0):
        return (r.uniform(-1, 1, s) * scale).astype(np.float32)

    ins = [u(T, batch, IN), u(nd, g * hidden, IN, scale=0.5), u(nd, g * hidden, hidden, scale=0.4),
           u(nd, 2 * g * hidden, scale=0.5), seq, u(nd, batch, hidden) if init else None]
    if op == "LSTM":
        ins += [u(nd, batch, hidden) if init else None, u(nd, 3 * hidden, scale=0.5) if peep else None]
    return ins


def _nd(direction):
    return 2 if direction == "bidirectional" else 1


def _layout1(ins):
    """The same inputs for layout=1 (batch first)."""
    out = list(ins)
    out[0] = np.ascontiguousarray(ins[0].transpose(1, 0, 2))
    for i in (5, 6):
        if i < len(out) and out[i] is not None:
            out[i] = np.ascontiguousarray(out[i].transpose(1, 0, 2))
    return out


def _native(kernel, variant):
    assert caps(kernel).variant == variant


@pytest.mark.parametrize("op,extra", [("LSTM", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}), ("RNN", {})])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_against_onnx_reference(variant, op, extra, direction, layout):
    nd = _nd(direction)
    ins = _inputs(op, nd, peep=op == "LSTM")
    if layout:
        ins = _layout1(ins)
    attrs = {"hidden_size": H, "direction": direction, "layout": layout, **extra}
    outs = [TensorType(np.float32, None)] * N_OUT[op]
    _native(build_kernel(op, ins, attrs, 14, outs, const=(1, 2, 3)), variant)
    check(op, ins, attrs, opset=14, n_outputs=N_OUT[op], const=(1, 2, 3), ref="onnx", rtol=2e-5, atol=2e-6)


_ACTS = {
    "LSTM": (["HardSigmoid", "ScaledTanh", "Softsign", "Sigmoid", "Elu", "Affine"], [0.3, 0.8, 0.9, 1.5], [0.4, 1.2]),
    "GRU": (["LeakyRelu", "Softplus", "ThresholdedRelu", "Tanh"], [0.1, 0.2], []),
    "RNN": (["Relu", "ScaledTanh"], [1.3], [0.7]),
}


@pytest.mark.parametrize("op,extra", [("LSTM", {}), ("LSTM", {"input_forget": 1}), ("GRU", {}),
                                      ("GRU", {"linear_before_reset": 1}), ("RNN", {})])
@pytest.mark.parametrize("what", ["activations", "clip", "sequence_lens"])
def test_attributes_onnx_reference_ignores(variant, op, extra, what):
    """onnxruntime implements them (onnx.reference does not)."""
    ins = _inputs(op, 2, seq=LENS if what == "sequence_lens" else None, peep=op == "LSTM")
    attrs = {"hidden_size": H, "direction": "bidirectional", **extra}
    if what == "clip":
        attrs["clip"] = 0.6
    if what == "activations":
        names, alphas, betas = _ACTS[op]
        attrs.update(activations=names, activation_alpha=alphas)
        if betas:
            attrs["activation_beta"] = betas
    outs = [TensorType(np.float32, None)] * N_OUT[op]
    _native(build_kernel(op, ins, attrs, 14, outs, const=(1, 2, 3)), variant)
    check(op, ins, attrs, opset=14, n_outputs=N_OUT[op], const=(1, 2, 3), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("op,extra", [("LSTM", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}), ("RNN", {})])
@pytest.mark.parametrize("direction,hidden", [("bidirectional", 37), ("forward", 64), ("reverse", 40)])
def test_same_bits_at_1_2_and_3_threads(variant, op, extra, direction, hidden):
    """A task a direction (bidirectional at 2 threads), or each step split into column chunks and
    batch rows (more threads than directions, steps of batch * W * H >= 16384): the same bits."""
    nd = _nd(direction)
    ins = _inputs(op, nd, seq=np.array([5, 3, 4, 5, 1, 2, 5, 4, 3], np.int32), peep=op == "LSTM", batch=9,
                  hidden=hidden)
    attrs = {"hidden_size": hidden, "direction": direction, "clip": 2.0, **extra}
    outs = [TensorType(np.float32, None)] * N_OUT[op]
    got = []
    for width in (1, 2, 3):
        with parallel.use_threads(width):
            got.append(run_kernel(op, ins, attrs, 14, outs, const=(1, 2, 3)))
    for one, two, three in zip(*got):
        assert one.tobytes() == two.tobytes() == three.tobytes()
    with parallel.use_threads(2):
        check(op, ins, attrs, opset=14, n_outputs=N_OUT[op], const=(1, 2, 3), rtol=1e-4, atol=2e-5)


def test_dynamic_weights_and_no_bias(variant):
    ins = _inputs("GRU", 1)
    ins[3] = None
    check("GRU", ins, {"hidden_size": H, "linear_before_reset": 1}, opset=14, n_outputs=2, ref="onnx", rtol=2e-5,
          atol=2e-6)


def test_bad_sizes_raise_a_ge_error():
    ins = _inputs("LSTM", 1)
    outs = [TensorType(np.float32, None)] * 3
    kernel = build_kernel("LSTM", ins, {"hidden_size": H}, 14, outs, const=(1, 2, 3))
    with pytest.raises(GEError, match="input size"):
        kernel(ins[0][:, :, :4], *ins[1:])
    with pytest.raises(GEError, match="3-D"):
        kernel(ins[0][0], *ins[1:])
    bad = list(ins)
    bad[4] = np.array([9, 1, 1], np.int32)
    with pytest.raises(GEError, match="sequence_lens"):
        kernel(*bad)
    with pytest.raises(GEError, match="W"):
        run_kernel("LSTM", [ins[0], ins[1][:, :-1], *ins[2:]], {"hidden_size": H}, 14, outs)


def _native_args(op="LSTM", nd=1, steps=3, batch=2, hidden=5):
    w, _ = nr.layout(op, hidden)
    f32 = np.float32
    return dict(op=op, xw=np.zeros((nd, steps, batch, w), f32),
                rp=nr.pack(op, np.zeros((nd, GATES[op] * hidden, hidden), f32)),
                hs=np.zeros((steps, nd, batch, hidden), f32), hinit=np.zeros((nd, batch, hidden), f32),
                c=np.zeros((nd, batch, hidden), f32), lens=np.full(batch, steps, np.int64),
                peep=np.zeros((nd, 3, hidden), f32), rbh=np.zeros((nd, hidden), f32), run_steps=steps, clip=None,
                input_forget=False, lbr=False, acts=[[("Sigmoid", 0, 0), ("Tanh", 0, 0), ("Tanh", 0, 0)]])


@pytest.mark.parametrize("change", ["xw", "rp", "hs", "c", "lens", "peep", "run_steps", "len_value", "act", "clip"])
def test_native_entry_refuses_what_does_not_fit(change):
    """run() says False, and the C entry itself raises (never reads past an array) on each misfit."""
    a = _native_args()
    assert nr.run(**a)
    bad = dict(a)
    if change in ("xw", "rp", "hs", "c", "peep"):
        bad[change] = a[change][..., :-1].copy()
    elif change == "lens":
        bad["lens"] = a["lens"][:1].copy()
    elif change == "run_steps":
        bad["run_steps"] = 4
    elif change == "len_value":
        bad["lens"] = np.array([3, 7], np.int64)
    elif change == "act":
        bad["acts"] = [[("Gelu", 0, 0)] * 3]
    else:
        bad["clip"] = -1.0
    if change != "len_value":
        assert not nr.run(**bad)
    mod = nr._mod()
    fp = np.zeros(13, np.float32)
    ip = np.array([2, 3, 0, 0, 0, 0, 32, 2, 1, 1, 2, 1, 1, 1, 0], np.int64)
    args = [bad[k] for k in ("xw", "rp", "hs", "hinit", "c", "lens", "peep", "rbh")]
    if change == "run_steps":
        ip[1] = 4
    elif change == "act":
        ip[7] = 99
    elif change == "clip":
        ip[2], fp[0] = 1, -1.0
    with pytest.raises((TypeError, ValueError)):
        mod.rn_run(*args, fp, ip)
    with pytest.raises((TypeError, ValueError)):
        mod.rn_run(*args[:-1], fp, ip)


def test_the_isa_family_names_what_runs(monkeypatch):
    from ge_native import isa

    fam = isa.family("recurrent")
    assert fam.names() == (*nr.VARIANTS, "numpy") and fam.switch == "GE_NATIVE_RECURRENT"
    assert isa.variant_of("recurrent") == nr.isa() == nr.runnable()[0]
    for v in nr.runnable():
        monkeypatch.setenv("GE_NATIVE_RECURRENT", v)
        assert isa.variant_of("recurrent") == v
    monkeypatch.setenv("GE_NATIVE_RECURRENT", "0")
    assert isa.variant_of("recurrent") == "numpy"


def test_a_bogus_variant_name_falls_back(monkeypatch):
    monkeypatch.setenv("GE_NATIVE_RECURRENT", "avx9000")
    assert nr.isa() == nr.runnable()[0]
    a = _native_args()
    assert nr.run(**a, variant=None)
    assert not nr.run(**a, variant="avx9000")


def test_an_lstm_model_runs_without_numba(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        import onnx
        from onnx import helper, numpy_helper
        import ge_core as ge
        r = np.random.default_rng(0)
        w = numpy_helper.from_array(r.uniform(-.3, .3, (1, 32, 4)).astype(np.float32), "W")
        rr = numpy_helper.from_array(r.uniform(-.3, .3, (1, 32, 8)).astype(np.float32), "R")
        node = helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=8)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [3, 2, 4])],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], [w, rr])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
        m.ir_version = 8
        onnx.save(m, {str(tmp_path / "lstm.onnx")!r})
        out = ge.compile({str(tmp_path / "lstm.onnx")!r}).run({{"X": np.ones((3, 2, 4), np.float32)}})
        assert next(iter(out.values())).shape == (3, 1, 2, 8)
        print("numba" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("shape", [(0, B, IN), (T, 0, IN)])
def test_empty_sequence_or_batch_as_the_numpy_form(monkeypatch, op, shape):
    ins = _inputs(op, 2, init=False)
    ins[0] = np.zeros(shape, np.float32)
    attrs = {"hidden_size": H, "direction": "bidirectional"}
    outs = [TensorType(np.float32, None)] * N_OUT[op]
    got = run_kernel(op, ins, attrs, 14, outs, const=(1, 2, 3))
    monkeypatch.setenv("GE_NATIVE_RECURRENT", "0")
    want = run_kernel(op, ins, attrs, 14, outs, const=(1, 2, 3))
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
