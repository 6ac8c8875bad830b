"""Attention, RotaryEmbedding, GroupNormalization, RMSNormalization, LpNormalization, Swish and
SwiGLU kernels against onnxruntime (onnx.reference where onnxruntime lacks the op, type or
attribute, or departs from the ONNX definition)."""

from __future__ import annotations

import numpy as np
import pytest

from ge_core.errors import UnsupportedOpError

from ._onnx_ref import build_kernel, check

R = np.random.default_rng(11)


def u(*shape, lo=-1.0, hi=1.0, dtype=np.float32):
    return R.uniform(lo, hi, shape).astype(dtype)


# ------------------------------------------------------------------------------------------------
# GroupNormalization / RMSNormalization / LpNormalization


@pytest.mark.parametrize("groups", [1, 2, 3, 6])
@pytest.mark.parametrize("shape", [(2, 6, 4, 5), (3, 6, 7), (1, 6, 2, 3, 2)])
@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(groups, shape, opset):
    n = shape[1] if opset >= 21 else groups
    x = u(*shape, lo=-2, hi=3)
    check("GroupNormalization", [x, u(n, lo=0.5, hi=1.5), u(n)], {"num_groups": groups, "epsilon": 1e-3},
          opset=opset, ref="both" if opset >= 21 else "onnx", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-6), (np.float16, 2e-3)])
def test_group_normalization_dtypes(dtype, rtol):
    x = u(2, 4, 3, 3, dtype=dtype)
    check("GroupNormalization", [x, u(4, dtype=dtype), u(4, dtype=dtype)], {"num_groups": 2}, opset=21,
          ref="onnx", rtol=rtol, atol=rtol)


def test_group_normalization_stash_double():
    x = u(2, 4, 6, dtype=np.float64)
    check("GroupNormalization", [x, u(4, dtype=np.float64), u(4, dtype=np.float64)],
          {"num_groups": 4, "stash_type": 11}, opset=21, ref="onnx", rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,axis", [((2, 3, 8), -1), ((2, 3, 8), 1), ((2, 3, 8), 0), ((4, 5, 2, 6), -2),
                                        ((6,), 0)])
@pytest.mark.parametrize("scale_full", [False, True])
def test_rms_normalization(shape, axis, scale_full):
    x = u(*shape, lo=-3, hi=3)
    ax = axis % len(shape)
    sshape = shape[ax:] if scale_full else shape[-1:]
    check("RMSNormalization", [x, u(*sshape)], {"axis": axis, "epsilon": 1e-4}, opset=23, ref="both")


@pytest.mark.parametrize("dtype,rtol", [(np.float16, 2e-3), (np.float64, 1e-6)])
def test_rms_normalization_dtypes(dtype, rtol):
    check("RMSNormalization", [u(3, 16, dtype=dtype), u(16, dtype=dtype)], {}, opset=23, ref="both",
          rtol=rtol, atol=rtol)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lp_normalization(p, axis, dtype):
    x = u(3, 4, 5, dtype=dtype)
    x[1, :, :] = 0  # zero norms along every axis choice somewhere
    x[:, 2, :] = 0
    x[:, :, 3] = 0
    check("LpNormalization", [x], {"p": p, "axis": axis}, opset=22, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Attention


def _qkv(b, hq, hkv, sq, skv, d, dv=None, three_d=False, dtype=np.float32):
    dv = dv or d
    q, k, v = u(b, hq, sq, d, dtype=dtype), u(b, hkv, skv, d, dtype=dtype), u(b, hkv, skv, dv, dtype=dtype)
    if three_d:
        q = np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(b, sq, hq * d))
        k = np.ascontiguousarray(k.transpose(0, 2, 1, 3).reshape(b, skv, hkv * d))
        v = np.ascontiguousarray(v.transpose(0, 2, 1, 3).reshape(b, skv, hkv * dv))
    return [q, k, v]


ATTN = [
    # (hq, hkv, sq, skv, d, dv, extra attrs)
    (2, 2, 4, 4, 8, 8, {}),
    (2, 2, 3, 6, 8, 5, {}),
    (4, 2, 5, 5, 8, 8, {}),          # GQA
    (4, 1, 3, 7, 4, 4, {}),          # MQA
    (2, 2, 5, 5, 8, 8, {"is_causal": 1}),
    (4, 2, 4, 6, 8, 8, {"is_causal": 1}),
    (2, 2, 4, 4, 8, 8, {"scale": 0.3}),
    (2, 2, 4, 4, 8, 8, {"softcap": 0.5}),
]


@pytest.mark.parametrize("hq,hkv,sq,skv,d,dv,attrs", ATTN)
@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("opset", [23, 24])
def test_attention(hq, hkv, sq, skv, d, dv, attrs, three_d, opset):
    ins = _qkv(2, hq, hkv, sq, skv, d, dv, three_d)
    a = dict(attrs)
    if three_d:
        a.update(q_num_heads=hq, kv_num_heads=hkv)
    check("Attention", ins, a, opset=opset, ref="both", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 4, 6), (2, 2, 4, 6), (1, 1, 4, 6), (4, 4)])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks(mask_shape, kind, causal):
    ins = _qkv(2, 2, 2, 4, 6, 8)
    if kind == "bool":
        mask = R.random(mask_shape) < 0.7
        mask[..., 0] = True
    else:
        mask = u(*mask_shape, lo=-2, hi=0.5)
    # a mask shorter than the keys is padded (False / -inf)
    ref = "onnx" if mask_shape[-1] < 6 else "both"
    check("Attention", ins + [mask], {"is_causal": causal}, opset=24, ref=ref, rtol=1e-4, atol=1e-5)


def test_attention_fully_masked_rows_give_zeros():
    ins = _qkv(1, 2, 2, 3, 4, 8)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    got = check("Attention", ins + [mask], {"qk_matmul_output_mode": 3}, opset=24, ref="onnx",
                outputs=["y", "", "", "qk"])
    assert np.all(got[0][:, :, 1] == 0) and not np.isnan(got[0]).any()


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("gqa", [False, True])
def test_attention_kv_cache(three_d, causal, gqa):
    hq, hkv = (4, 2) if gqa else (2, 2)
    ins = _qkv(2, hq, hkv, 3, 3, 8, three_d=three_d)
    past_k, past_v = u(2, hkv, 5, 8), u(2, hkv, 5, 8)
    attrs = {"is_causal": causal}
    if three_d:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    check("Attention", ins + [None, past_k, past_v], attrs, opset=23, n_outputs=3, ref="both", rtol=1e-4,
          atol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("softcap", [0.0, 0.8])
def test_attention_qk_matmul_output(mode, softcap):
    ins = _qkv(2, 2, 2, 4, 5, 8)
    mask = u(4, 5, lo=-1, hi=0)
    attrs = {"qk_matmul_output_mode": mode, "is_causal": 1}
    if softcap:
        attrs["softcap"] = softcap
    check("Attention", ins + [mask], attrs, opset=23, outputs=["y", "", "", "qk"], ref="onnx", rtol=1e-4,
          atol=1e-5)


@pytest.mark.parametrize("precision", [1, 11])
def test_attention_softmax_precision(precision):
    ins = _qkv(1, 2, 2, 4, 4, 8, dtype=np.float16)
    check("Attention", ins, {"softmax_precision": precision}, opset=23, ref="onnx", rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("dtype,rtol", [(np.float16, 2e-3), (np.float64, 1e-9)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_dtypes(dtype, rtol, causal):
    ins = _qkv(2, 4, 2, 5, 5, 8, dtype=dtype)
    check("Attention", ins, {"is_causal": causal}, opset=23, ref="onnx", rtol=rtol, atol=rtol)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_nonpad_kv_seqlen(causal):
    ins = _qkv(3, 2, 2, 2, 6, 8)
    nonpad = np.array([6, 3, 4], np.int64)
    check("Attention", ins + [None, None, None, nonpad], {"is_causal": causal}, opset=24, ref="onnx",
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("left,right,causal", [(2, 0, 0), (2, 1, 0), (1, -1, 1), (-1, 1, 0), (0, 0, 0)])
def test_attention_sliding_window(left, right, causal):
    ins = _qkv(2, 2, 2, 5, 6, 8)
    attrs = {"left_window_size": left, "right_window_size": right, "is_causal": causal}
    check("Attention", ins, attrs, opset=25, ref="onnx", rtol=1e-4, atol=1e-5)
    past = [None, u(2, 2, 3, 8), u(2, 2, 3, 8)]
    check("Attention", ins + past, attrs, opset=25, ref="onnx", n_outputs=3, rtol=1e-4, atol=1e-5)


def test_attention_refusals():
    ins = _qkv(1, 2, 2, 3, 3, 4, three_d=True)
    with pytest.raises(UnsupportedOpError, match="q_num_heads") as e:
        build_kernel("Attention", ins, {}, 23, [None])
    assert "test_Attention" in str(e.value)
    with pytest.raises(UnsupportedOpError, match="qk_matmul_output_mode"):
        build_kernel("Attention", _qkv(1, 2, 2, 3, 3, 4), {"qk_matmul_output_mode": 7}, 23, [None])


# ------------------------------------------------------------------------------------------------
# RotaryEmbedding


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
@pytest.mark.parametrize("positions", [True, False])
@pytest.mark.parametrize("three_d", [False, True])
def test_rotary_embedding(interleaved, rot_dim, positions, three_d):
    b, h, s, d = 2, 3, 5, 8
    half = (rot_dim or d) // 2
    x = u(b, h, s, d)
    attrs: dict = {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}
    if three_d:
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, s, h * d))
        attrs["num_heads"] = h
    if positions:
        cos, sin = u(16, half), u(16, half)
        ins = [x, cos, sin, R.integers(0, 16, (b, s)).astype(np.int64)]
    else:
        ins = [x, u(b, s, half), u(b, s, half)]
    check("RotaryEmbedding", ins, attrs, opset=23, ref="both", rtol=1e-5, atol=1e-6)


def test_rotary_embedding_float16():
    x = u(1, 2, 4, 8, dtype=np.float16)
    ins = [x, u(6, 4, dtype=np.float16), u(6, 4, dtype=np.float16), np.array([[0, 2, 3, 5]], np.int64)]
    check("RotaryEmbedding", ins, {}, opset=23, ref="both", rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------------------------------------
# Swish / SwiGLU


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, 2.5])
@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-5), (np.float64, 1e-12), (np.float16, 2e-3)])
def test_swish(alpha, dtype, rtol):
    x = u(4, 33, lo=-30, hi=30, dtype=dtype)
    attrs = {} if alpha is None else {"alpha": alpha}
    check("Swish", [x], attrs, opset=24, ref="onnx", rtol=rtol, atol=rtol)
    if dtype == np.float32:
        # onnxruntime flushes the far negative tail (|swish| < ~2e-6) to zero
        check("Swish", [x], attrs, opset=24, ref="ort", rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("alpha", [None, 1.703125])  # exact in float32, as the attribute is
@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-5), (np.float64, 1e-12), (np.float16, 2e-3)])
def test_swiglu(alpha, dtype, rtol):
    a, b = u(3, 16, lo=-8, hi=8, dtype=dtype), u(3, 16, dtype=dtype)
    attrs = {} if alpha is None else {"alpha": alpha}
    check("SwiGLU", [a, b], attrs, opset=28, ref="onnx", rtol=rtol, atol=rtol)


def test_native_in_ge_ops():
    from ge_cpu.plugin import NATIVE, op_table

    kinds = {r["op"]: r["kernel"] for r in op_table() if r["domain"] == "ai.onnx"}
    for op in ("Attention", "RotaryEmbedding", "GroupNormalization", "RMSNormalization", "LpNormalization",
               "Swish", "SwiGLU"):
        assert kinds[op] == NATIVE
