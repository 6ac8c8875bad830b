"""A Linear whose rows an exporter flattens (GPT-2's Conv1D: Reshape, Gemm, Reshape back) keeps
its activation and its residual Add at the GEMM's store: ``gemm_activation_fusion`` and
``gemm_residual_fusion`` look through the Reshape after the Gemm. Checked on what the
TorchScript exporter makes of a tiny GPT-2 against onnxruntime at 1 and 2 threads, with the
switch file turning both off, and on hand-built graphs where the residual broadcasts (not fused)."""


import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers as tf

import ge_core as ge
from ge_fusion.rules import RULES
from ge_sdk.rewrite import explain
from ge_sdk.testing import GraphBuilder, run_onnxruntime
from tests.fusion.common import compile_onnx, export_last_hidden

SEQ = 20


@pytest.fixture(scope="module")
def gpt2() -> bytes:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
                        eos_token_id=0, use_cache=False, attn_implementation="eager")
    model = tf.GPT2Model(cfg).eval()

    return export_last_hidden(model, SEQ, mask="ones")


def _check(model, blob):
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 100, (1, SEQ)).astype(np.int64)}
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = model.run(feeds)["last_hidden_state"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    return got


def _epilogues(model):
    return sorted(n.attrs.get("epilogue", "") for n in model.graph.nodes if n.op_type == "FusedMatMul")


@pytest.mark.parametrize("threads", [1, 2])
def test_exported_gpt2_keeps_gelu_and_residuals_at_the_gemm_store(gpt2, threads):
    model = compile_onnx(gpt2, threads=threads)
    ops = model.report["op_counts"]
    assert "ge.fused::Gelu" not in ops and ops.get("Add") == 1, ops  # the embeddings' sum alone stays
    epi = _epilogues(model)
    assert sum('"Gelu"' in e and "tanh" in e for e in epi) == 2, epi  # one MLP per layer
    assert sum(e == '[["Add",["y","a0"],{}]]' for e in epi) == 4, epi  # attention and MLP residuals
    _check(model, gpt2)


def test_switch_file_keeps_them_apart_and_explain_says_why(gpt2, tmp_path):
    off = compile_onnx(gpt2, tmp_path, off=["gemm_activation_fusion", "gemm_residual_fusion"])
    ops = off.report["op_counts"]
    assert ops.get("ge.fused::Gelu") == 2 and ops.get("Add") == 5, ops
    got_off = _check(off, gpt2)
    on = compile_onnx(gpt2)
    got_on = _check(on, gpt2)
    np.testing.assert_allclose(got_on, got_off, rtol=1e-4, atol=1e-5)
    gelu = next(n for n in off.graph.nodes if n.op_type == "Gelu")
    assert explain(RULES["gemm_activation_fusion"], gelu)  # it would match: the switch kept it
    ln = next(n for n in off.graph.nodes if n.op_type == "LayerNorm")
    why = explain(RULES["gemm_residual_fusion"], ln)
    assert not why and "Add" in str(why)


@pytest.mark.parametrize("residual", [(2, 8, 16), (1, 16), (2, 1, 16)])
def test_a_residual_through_the_reshape_is_fused_only_when_it_has_the_sums_shape(residual):
    rng = np.random.default_rng(1)
    b = GraphBuilder("g")
    x = b.input("x", "float32", (16, 12))
    r = b.input("r", "float32", residual)
    y = b.Gemm(x, b.const(rng.standard_normal((12, 16)).astype(np.float32)),
               b.const(rng.standard_normal(16).astype(np.float32)))
    b.output(b.Add(b.Reshape(y, b.const(np.array([2, 8, 16], np.int64))), r))
    g = b.build()
    feeds = {"x": rng.standard_normal((16, 12)).astype(np.float32), "r": rng.standard_normal(residual).astype(np.float32)}
    model = ge.compile(g)
    fused = residual == (2, 8, 16)
    assert ("Add" in model.report["op_counts"]) != fused, model.report["op_counts"]
    want = run_onnxruntime(g, feeds)
    for k, v in model.run(feeds).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5)
