"""RMSNorm (T5LayerNorm, LlamaRMSNorm) and grouped-query attention (LLaMA's repeat_kv) fuse on
what the TorchScript exporter makes of tiny ``transformers`` models (random weights, no
downloads), match onnxruntime, and the fusion switch file turns each fusion off."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers as tf

import ge_core as ge
from ge_core.ir.types import TensorType
from ge_cpu.fused import rmsnorm
from ge_fusion.rules import RULES
from ge_sdk.rewrite import explain
from ge_sdk.testing import GraphBuilder, run_onnxruntime
from tests.fusion.common import compile_onnx, export_last_hidden

SEQ = 16


def _export(model, with_mask: bool) -> bytes:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norm weights start at ones, which the optimiser drops: make them real
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return export_last_hidden(model, SEQ, mask="ones" if with_mask else "none")


@pytest.fixture(scope="module")
def llama() -> bytes:
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, use_cache=False, attn_implementation="eager")
    return _export(tf.LlamaModel(cfg).eval(), with_mask=True)


@pytest.fixture(scope="module")
def t5() -> bytes:
    torch.manual_seed(0)
    cfg = tf.T5Config(d_model=64, d_ff=128, num_layers=1, num_heads=4, d_kv=16, vocab_size=100, use_cache=False,
                      attn_implementation="eager")
    return _export(tf.T5EncoderModel(cfg).eval(), with_mask=False)


def _feeds():
    return {"input_ids": np.random.default_rng(0).integers(0, 100, (1, SEQ)).astype(np.int64)}


def _check_matches_ort(model, blob: bytes):
    feeds = _feeds()
    got = model.run(feeds)["last_hidden_state"]
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_llama_fuses_rmsnorm_and_grouped_query_attention(llama, threads):
    model = compile_onnx(llama, threads=threads)
    ops = model.report["op_counts"]
    assert ops.get("ge.fused::RMSNorm") == 3, ops      # input, post-attention and final norm
    assert ops.get("ge.fused::Attention") == 1, ops
    assert ops.get("ge.fused::Rotary") == 2, ops       # the rotary embedding of Q and of K
    for gone in ("Expand", "Softmax", "ge.fused::Softmax", "Pow", "ReduceMean", "Sqrt", "Slice", "Neg", "Concat"):
        assert gone not in ops, ops
    _check_matches_ort(model, llama)


def test_switch_file_turns_rotary_off_and_explain_says_why_it_did_not_match(llama, tmp_path):
    model = compile_onnx(llama, tmp_path, off=["rotary_fusion"])
    ops = model.report["op_counts"]
    assert "ge.fused::Rotary" not in ops and ops.get("Slice") == 4, ops
    _check_matches_ort(model, llama)
    off = compile_onnx(llama, tmp_path, off=["ALL"])
    adds = [n for n in off.graph.nodes if n.op_type == "Add" and any(
        v.producer is not None and v.producer.op_type == "Mul" and any(
            u.producer is not None and u.producer.op_type == "Concat" for u in v.producer.inputs) for v in n.inputs)]
    assert len(adds) == 2 and all(explain(RULES["rotary_fusion"], n) for n in adds)
    why = explain(RULES["rotary_fusion"], next(n for n in off.graph.nodes if n.op_type == "Mul"))
    assert not why and str(why)


def test_rotary_kernel_matches_numpy_and_refuses_odd_or_mismatched_halves():
    from ge_core.errors import GEError
    from ge_core.kernel import KernelSpec
    from ge_cpu.fused.kernels import rotary_factory

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    cos, sin = rng.standard_normal((1, 1, 5, 8)).astype(np.float32), rng.standard_normal((1, 1, 5, 8)).astype(np.float32)
    spec = KernelSpec(op_type="Rotary", domain="ge.fused", attrs={}, inputs=[TensorType.of(a) for a in (x, cos, sin)],
                      outputs=[TensorType.of(x)], name="rotary")
    kernel = rotary_factory(spec)
    want = x * cos + np.concatenate([-x[..., 4:], x[..., :4]], axis=-1) * sin
    np.testing.assert_allclose(kernel(x, cos, sin)[0], want, rtol=1e-6, atol=1e-6)
    out = np.empty_like(x)
    assert kernel(x, cos, sin, out=(out,))[0] is out
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(GEError, match="even"):
        kernel(x[..., :7], cos[..., :7], sin[..., :7])


@pytest.mark.parametrize("x_shape,cache_shape", [((1, 6, 128, 64), (1, 1, 128, 64)), ((2, 3, 5, 8), (5, 8)),
                                                 ((2, 3, 5, 8), (2, 1, 5, 8)), ((3, 4, 16), (1, 1, 16))])
def test_rotary_row_kernel_matches_numpy_at_every_width(x_shape, cache_shape):
    """The compiled rows (caches of (positions, d) shared by every leading index, or one position)
    and NumPy's passes (a cache per batch entry) give the NumPy form's values, the same bits on
    one thread and two."""
    from ge_core.kernel import KernelSpec
    from ge_cpu.fused.kernels import rotary_factory
    from ge_native import parallel

    rng = np.random.default_rng(len(x_shape))
    x = rng.standard_normal(x_shape).astype(np.float32)
    cos, sin = (rng.standard_normal(cache_shape).astype(np.float32) for _ in range(2))
    h = x_shape[-1] // 2
    want = x * cos + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin
    spec = KernelSpec(op_type="Rotary", domain="ge.fused", attrs={}, inputs=[TensorType.of(a) for a in (x, cos, sin)],
                      outputs=[TensorType.of(want)], name="rotary")
    kernel = rotary_factory(spec)
    got = {}
    for width in (1, 2):
        with parallel.use_threads(width):
            out = np.full(want.shape, np.nan, np.float32)
            assert kernel(x, cos, sin, out=(out,))[0] is out
            got[width] = out
    np.testing.assert_allclose(got[1], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[2], got[1])
    same = x.copy()  # the output is the input: NumPy's passes (a row reads its first half after writing it)
    assert kernel(same, cos, sin, out=(same,))[0] is same
    np.testing.assert_allclose(same, want, rtol=1e-6, atol=1e-6)


def test_t5_encoder_fuses_rmsnorm_and_attention(t5):
    model = compile_onnx(t5)
    ops = model.report["op_counts"]
    assert ops.get("ge.fused::RMSNorm") == 3, ops
    assert ops.get("ge.fused::Attention") == 1, ops
    for gone in ("Pow", "ReduceMean", "Sqrt", "Softmax"):
        assert gone not in ops, ops
    _check_matches_ort(model, t5)


@pytest.mark.parametrize("which", ["llama", "t5"])
def test_switch_file_turns_rmsnorm_off(which, llama, t5, tmp_path):
    blob = llama if which == "llama" else t5
    model = compile_onnx(blob, tmp_path, off=["rmsnorm_fusion"])
    ops = model.report["op_counts"]
    assert "ge.fused::RMSNorm" not in ops and "ge.fused::Attention" in ops, ops
    _check_matches_ort(model, blob)


def test_switch_file_turns_grouped_attention_off(llama, tmp_path):
    model = compile_onnx(llama, tmp_path, off=["attention_fusion"])
    ops = model.report["op_counts"]
    assert "ge.fused::Attention" not in ops and "ge.fused::RMSNorm" in ops, ops
    assert "Expand" in ops, ops
    _check_matches_ort(model, llama)


def test_explain_the_new_patterns(llama, tmp_path):
    model = compile_onnx(llama, tmp_path, off=["ALL"])
    g = model.graph
    out = g.outputs[0].producer  # the final norm's Mul by its weight
    assert explain(RULES["rmsnorm_fusion"], out)
    pv = [n for n in g.nodes if n.op_type == "MatMul" and n.inputs[0].producer is not None
          and n.inputs[0].producer.op_type == "Softmax"]
    assert len(pv) == 1 and explain(RULES["attention_fusion"], pv[0])
    # a Mul that is no normalisation says why
    silu = next(n for n in g.nodes if n.op_type == "Mul" and any(
        v.producer is not None and v.producer.op_type == "Sigmoid" for v in n.inputs))
    why = explain(RULES["rmsnorm_fusion"], silu)
    assert not why and str(why)


# ------------------------------------------------------------------------------------------------
# grouped-query attention from primitive ops: batch 2, a per-batch mask, a per-head mask
# ------------------------------------------------------------------------------------------------
def _gqa_graph(mask_shape, b=2, kvh=2, g=2, m=8, d=16, grouped=True):
    gb = GraphBuilder("gqa", opset=17)
    q = gb.input("q", "float32", (b, kvh * g, m, d))
    k = gb.input("k", "float32", (b, kvh if grouped else kvh * g, m, d))
    v = gb.input("v", "float32", (b, kvh if grouped else kvh * g, m, d))
    mask = gb.input("mask", "float32", mask_shape)

    def repeat(x):
        if not grouped:
            return x
        e = gb.Expand(gb.Unsqueeze(x, np.array([2], np.int64)), np.array([b, kvh, g, m, d], np.int64))
        return gb.Reshape(e, np.array([b, kvh * g, m, d], np.int64))

    s = gb.Mul(gb.MatMul(q, gb.Transpose(repeat(k), perm=[0, 1, 3, 2])), np.float32(d ** -0.5))
    gb.output(gb.MatMul(gb.Softmax(gb.Add(s, mask), axis=-1), repeat(v)))
    return gb.build()


@pytest.mark.parametrize("mask_shape", [(2, 1, 8, 8), (1, 4, 8, 8), (8, 8)])
@pytest.mark.parametrize("fold", [True, False], ids=["kt_folded", "kt_transpose"])
@pytest.mark.parametrize("grouped", [True, False], ids=["gqa", "mha"])
def test_grouped_query_attention_graph(mask_shape, fold, grouped, tmp_path):
    g = _gqa_graph(mask_shape, grouped=grouped)
    rng = np.random.default_rng(1)
    feeds = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs}
    want = run_onnxruntime(g, feeds)
    opts = {"threads": 1}
    if not fold:  # Q·Kᵀ stays a MatMul of a Transpose instead of FusedMatMul(transB=1)
        p = tmp_path / "switch.json"
        p.write_text(json.dumps({"Switch": {"GraphFusion": {"transpose_matmul_fusion": "off"}}}))
        opts["fusion_switch_file"] = str(p)
    model = ge.compile(g, opts)
    ops = model.report["op_counts"]
    assert "ge.fused::Attention" in ops and "Expand" not in ops and "Softmax" not in ops, ops
    for name, w in want.items():
        np.testing.assert_allclose(model.run(feeds)[name], w, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# the RMSNorm kernel
# ------------------------------------------------------------------------------------------------
def _ref(x, gamma, eps):
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return (y if gamma is None else y * gamma).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("with_gamma", [True, False])
def test_rmsnorm_kernel_in_place_and_out_of_place(dtype, with_gamma):
    from ge_core.kernel import KernelSpec, caps

    shape, eps = (3, 37, 96), 1e-6
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3 + 0.5).astype(dtype)
    gamma = rng.standard_normal(shape[-1]).astype(dtype) if with_gamma else None
    want = _ref(x, gamma, eps)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    t = TensorType(np.dtype(dtype), shape)
    spec = KernelSpec(name="rms", op_type="RMSNorm", domain="ge.fused", attrs={"epsilon": eps},
                      inputs=[t] + ([TensorType(np.dtype(dtype), shape[-1:])] if with_gamma else []), outputs=[t])
    kernel = rmsnorm.rmsnorm_factory(spec)
    assert caps(kernel).accepts_out and caps(kernel).inplace_ok
    args = (x,) if gamma is None else (x, gamma)
    np.testing.assert_allclose(kernel(*args)[0], want, **tol)                    # a new array
    out = np.empty_like(x)
    assert kernel(*args, out=[out])[0] is out
    np.testing.assert_allclose(out, want, **tol)                                 # into a given one
    xi = x.copy()
    args = (xi,) if gamma is None else (xi, gamma)
    assert kernel(*args, out=[xi])[0] is xi
    np.testing.assert_allclose(xi, want, **tol)                                  # in place
    # the NumPy fallback, out of place and in place
    np.testing.assert_allclose(rmsnorm.rmsnorm_numpy(x, gamma, eps), want, **tol)
    xi = x.copy()
    assert rmsnorm.rmsnorm_numpy(xi, gamma, eps, out=xi) is xi
    np.testing.assert_allclose(xi, want, **tol)


def test_rmsnorm_row_kernel_reads_one_array_in_place():
    fn = rmsnorm.row_kernel("float32")
    assert fn is not None, "numba did not import (or GE_FUSION_JIT=0 is set): numba is a dependency"
    x = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
    g = np.linspace(0.5, 1.5, 256, dtype=np.float32)
    want = _ref(x, g, 1e-5)
    y = np.empty_like(x)
    fn(x, g, np.float32(1e-5), y)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    fn(x, g, np.float32(1e-5), x)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)
    assert rmsnorm.row_kernel("float32") is fn and rmsnorm.row_kernel("int32") is None
