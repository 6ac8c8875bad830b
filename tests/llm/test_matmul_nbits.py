"""com.microsoft::MatMulNBits (ge_llm.nbits, ge_cpu.contrib.nbits, ge_native.nbits): against
onnxruntime and an exact float64 dequantise-and-multiply reference for bits 2/4/8, every block
size, zero points absent, packed uint8 and float, a bias, K not a multiple of the block size, odd
N, M = 1, 3, 64 (decode and prefill paths), accuracy_level 0 and 4; every variant this CPU runs,
forced, at 1 and 2 threads; bad attributes and sizes raise a GEError naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ge_core as ge
from ge_core.errors import GEError
from ge_native import nbits

N_ODD = 37
#: relative tolerances (of the output's largest magnitude): float32 sums; int8 activations
TOL_F32, TOL_I8 = 1e-5, 3e-2


def _case(bits: int, bs: int, zp_kind: str, k: int, n: int = N_ODD, seed: int = 0):
    """ORT-format inputs of a random ``(k, n)`` weight: B, scales, zero points (None, packed
    uint8 or float32), a bias."""
    rng = np.random.default_rng(seed)
    kb = -(-k // bs)
    b = rng.integers(0, 256, (n, kb, bs * bits // 8), dtype=np.uint8)
    s = (rng.random(n * kb, dtype=np.float32) * 0.1 + 0.01).astype(np.float32)
    zp = None
    if zp_kind == "u8":
        zp = rng.integers(0, 256, n * -(-kb * bits // 8), dtype=np.uint8)
    elif zp_kind == "f":
        zp = (rng.random(n * kb, dtype=np.float32) * ((1 << bits) - 1)).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    return b, s, zp, bias


def _model(b, s, zp, bias, k, n, bits, bs, acc, g_idx=None, name="mm0", **attrs) -> onnx.ModelProto:
    inits = [onnx.numpy_helper.from_array(b, "B"), onnx.numpy_helper.from_array(s, "S")]
    ins = ["A", "B", "S", "", "", ""]
    for i, (arr, nm) in enumerate(((zp, "Z"), (g_idx, "G"), (bias, "bias"))):
        if arr is not None:
            inits.append(onnx.numpy_helper.from_array(arr, nm))
            ins[3 + i] = nm
    while ins[-1] == "":
        ins.pop()
    all_attrs = {"K": k, "N": n, "bits": bits, "block_size": bs, "accuracy_level": acc, **attrs}
    node = helper.make_node("MatMulNBits", ins, ["Y"], name=name, domain="com.microsoft", **all_attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _ge(model: onnx.ModelProto, tmp_path, **options):
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    return ge.compile(ge.load(path), **options)


def _run(compiled, a: np.ndarray) -> np.ndarray:
    got = compiled.run({"A": a})
    return np.asarray(got["Y"] if isinstance(got, dict) else got[0])


def _ort(model: onnx.ModelProto, a: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]


def _ref(a, b, s, zp, bias, k, n, bits, bs, g_idx=None) -> np.ndarray:
    y = a.astype(np.float64) @ nbits.dequantize(b, s, zp, k, n, bits, bs, g_idx)
    return y if bias is None else y + bias


def _close(got, want, tol) -> None:
    scale = float(np.abs(want).max()) or 1.0
    assert float(np.abs(np.asarray(got, np.float64) - want).max()) <= tol * scale


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
def test_against_onnxruntime_and_the_reference(bits, bs, tmp_path):
    k = 2 * bs + 7  # K not a multiple of the block size
    rng = np.random.default_rng(bs + bits)
    for zp_kind in ("none", "u8", "f"):
        b, s, zp, bias = _case(bits, bs, zp_kind, k, seed=bs * bits)
        for acc in (0, 4):
            model = _model(b, s, zp, bias, k, N_ODD, bits, bs, acc)
            compiled = _ge(model, tmp_path)
            for m in (1, 3, 64):
                a = rng.standard_normal((m, k), dtype=np.float32)
                got, want = _run(compiled, a), _ref(a, b, s, zp, bias, k, N_ODD, bits, bs)
                int8_sums = acc == 4 and zp_kind != "f"  # (float zero points: float32 sums, as onnxruntime)
                _close(got, want, TOL_I8 if int8_sums else TOL_F32)
                if bits == 8 and zp_kind == "f":
                    continue  # onnxruntime's CPU kernel refuses 8-bit weights with float zero points
                # accuracy_level 4 quantises A per block as onnxruntime does: its decode's results
                # (its prefill at block 128 quantises A otherwise)
                _close(got, _ort(model, a), TOL_F32 if not int8_sums or m < 64 or bs != 128 else TOL_I8)


def test_two_bits_and_no_bias_against_onnxruntime(tmp_path):
    k, bits, bs = 50, 2, 16
    b, s, zp, _ = _case(bits, bs, "u8", k)
    model = _model(b, s, zp, None, k, N_ODD, bits, bs, 0)
    a = np.random.default_rng(1).standard_normal((3, k), dtype=np.float32)
    got = _run(_ge(model, tmp_path), a)
    _close(got, _ref(a, b, s, zp, None, k, N_ODD, bits, bs), TOL_F32)
    _close(got, _ort(model, a), TOL_F32)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp_kind", ["none", "u8", "f"])
def test_every_variant_at_one_and_two_threads(bits, zp_kind):
    assert nbits.available() and nbits.runnable()[-1] == "scalar"
    k, n, bs = 200, 150, 32
    b, s, zp, bias = _case(bits, bs, zp_kind, k, n, seed=3)
    packed = nbits.PackedNBits(b, s, zp, k, n, bits, bs)
    rng = np.random.default_rng(4)
    for m in (1, 3, 64):
        a = rng.standard_normal((m, k), dtype=np.float32)
        want = _ref(a, b, s, zp, bias, k, n, bits, bs)
        int8_bits = None
        for variant in nbits.runnable():
            for acc in (0, 4):
                outs = []
                for width in (1, 2):
                    out = np.empty((m, n), np.float32)
                    assert nbits.matmul(a, packed, out, bias, acc, width, variant)
                    outs.append(out)
                assert outs[0].tobytes() == outs[1].tobytes(), (variant, acc, m)
                _close(outs[0], want, TOL_I8 if acc == 4 else TOL_F32)
                if acc == 4:  # exact integer sums, one epilogue: every variant has the same bits
                    int8_bits = int8_bits or outs[0].tobytes()
                    assert outs[0].tobytes() == int8_bits, variant


def test_forced_variant_runs_in_a_model_and_unrunnable_ones_fall_back(tmp_path, monkeypatch):
    k, bits, bs = 96, 4, 32
    b, s, zp, bias = _case(bits, bs, "u8", k)
    compiled = _ge(_model(b, s, zp, bias, k, N_ODD, bits, bs, 0), tmp_path)
    a = np.random.default_rng(5).standard_normal((2, k), dtype=np.float32)
    want = _ref(a, b, s, zp, bias, k, N_ODD, bits, bs)
    for variant in nbits.runnable():
        monkeypatch.setenv("GE_NATIVE_NBITS", variant)
        assert nbits.isa() == variant
        _close(_run(compiled, a), want, TOL_F32)
    best = nbits.runnable()[0]
    for variant in [v for v in nbits.VARIANTS if v not in nbits.runnable()] + ["amx_int8"]:
        monkeypatch.setenv("GE_NATIVE_NBITS", variant)
        assert nbits.isa() == best  # a variant this CPU cannot run: the best one it can
    monkeypatch.delenv("GE_NATIVE_NBITS")
    assert compiled.report["node_kernels"]["mm0"]["variant"] == best


def test_g_idx(tmp_path):
    k, bits, bs = 64, 4, 16
    b, s, zp, bias = _case(bits, bs, "u8", k)
    a = np.random.default_rng(6).standard_normal((3, k), dtype=np.float32)
    trivial = (np.arange(k) // bs).astype(np.int32)
    permuted = np.random.default_rng(7).permutation(trivial).astype(np.int32)
    for g_idx in (trivial, permuted):
        got = _run(_ge(_model(b, s, zp, bias, k, N_ODD, bits, bs, 0, g_idx=g_idx), tmp_path), a)
        _close(got, _ref(a, b, s, zp, bias, k, N_ODD, bits, bs, g_idx), TOL_F32)


@pytest.mark.parametrize("change, words", [
    ({"bits": 3}, "bits"), ({"block_size": 24}, "block_size"), ({"accuracy_level": 7}, "accuracy_level"),
    ({"K": 100}, "B holds"), ({"N": 30}, "B holds")])
def test_bad_attributes_and_sizes_raise_naming_the_node(change, words, tmp_path):
    k, bits, bs = 64, 4, 32
    b, s, zp, bias = _case(bits, bs, "u8", k)
    attrs = {"K": k, "N": N_ODD, "bits": bits, "block_size": bs, "accuracy_level": 0, **change}
    model = _model(b, s, zp, None, attrs.pop("K"), attrs.pop("N"), attrs.pop("bits"), attrs.pop("block_size"),
                   attrs.pop("accuracy_level"), name="bad_node")
    with pytest.raises(GEError, match="bad_node") as info:
        _ge(model, tmp_path)
    assert words in str(info.value)


def test_bad_sizes_of_b_scales_and_zero_points_raise(tmp_path):
    k, bits, bs = 64, 4, 32
    b, s, zp, _ = _case(bits, bs, "u8", k)
    for bb, ss, zz, words in ((b[:-1], s, zp, "B holds"), (b, s[:-1], zp, "scales"), (b, s, zp[:-1], "zero_points")):
        with pytest.raises(GEError, match="mm0") as info:
            _ge(_model(bb, ss, zz, None, k, N_ODD, bits, bs, 0), tmp_path)
        assert words in str(info.value)
    with pytest.raises(ValueError):
        nbits.PackedNBits(b, s, zp, k, N_ODD, 4, 24)
    out = np.empty((1, N_ODD), np.float32)
    packed = nbits.PackedNBits(b, s, zp, k, N_ODD, bits, bs)
    assert not nbits.matmul(np.zeros((1, k + 1), np.float32), packed, out)  # a misfit: nothing runs
