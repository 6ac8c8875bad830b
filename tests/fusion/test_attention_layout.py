"""The Transposes an exporter writes around attention's heads (Q, K and V to (b, heads, s, d) and
the result back to (b, s, heads, d)) fold into the Attention op (``attention_layout_fusion``):
its kernel reads and writes strided views, on one thread and on the per-head native path, and
matches onnxruntime on what the TorchScript exporter makes of a tiny BERT; the switch file turns
the fold off; an .om whose permutations are not permutations is refused at load."""

import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
import threadpoolctl
import torch
import transformers as tf

import ge_core as ge
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec
from ge_cpu.fused import attention
from ge_cpu.fused.kernels import attention_factory
from ge_fusion.rules import RULES
from ge_native import parallel
from ge_sdk.rewrite import explain
from tests.fusion.common import attention_reference, compile_onnx, export_last_hidden

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz"))
from fuzz_targets import internal_nodes, read_om, write_om  # noqa: E402

SEQ = 24
HEADS_PERM = [0, 2, 1, 3]


@pytest.fixture(scope="module")
def bert() -> bytes:
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=100, max_position_embeddings=64, attn_implementation="eager")
    model = tf.BertModel(cfg, add_pooling_layer=False).eval()

    return export_last_hidden(model, SEQ, mask="input")


def _feeds():
    rng = np.random.default_rng(0)
    mask = np.ones((1, SEQ), np.int64)
    mask[0, -5:] = 0  # padding: the additive mask reaches the fused kernel
    return {"input_ids": rng.integers(0, 100, (1, SEQ)).astype(np.int64), "attention_mask": mask}


def _check(model, blob):
    feeds = _feeds()
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(model.run(feeds)["last_hidden_state"], want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_exported_bert_attention_reads_and_writes_the_heads_in_place(bert, threads):
    model = compile_onnx(bert, threads=threads)
    ops = model.report["op_counts"]
    assert ops.get("ge.fused::Attention") == 2, ops
    assert "Transpose" not in ops, ops  # 4 per layer before: Q, K (to Kᵀ), V and the result
    for n in model.graph.nodes:
        if n.op_type == "Attention":
            assert n.attrs["perm_q"] == HEADS_PERM and n.attrs["perm_v"] == HEADS_PERM, n.attrs
            assert n.attrs["perm_kt"] == [0, 2, 3, 1] and n.attrs["perm_out"] == HEADS_PERM, n.attrs
            assert all(x.producer is not None and x.producer.op_type == "Reshape" for x in n.inputs[:3])
    _check(model, bert)


def test_switch_file_keeps_the_transposes_and_explain_says_why(bert, tmp_path):
    model = compile_onnx(bert, tmp_path, off=["attention_layout_fusion"])
    ops = model.report["op_counts"]
    assert ops.get("Transpose") == 8 and ops.get("ge.fused::Attention") == 2, ops
    assert all("perm_q" not in n.attrs for n in model.graph.nodes if n.op_type == "Attention")
    _check(model, bert)
    att = next(n for n in model.graph.nodes if n.op_type == "Attention")
    assert explain(RULES["attention_layout_fusion"], att)  # it would match: the switch kept it
    ln = next(n for n in model.graph.nodes if n.op_type == "LayerNorm")
    why = explain(RULES["attention_layout_fusion"], ln)
    assert not why and "Attention" in str(why)


def _blas_one():
    """As inside a run: BLAS at one thread (the bits then do not depend on how it splits)."""
    return threadpoolctl.threadpool_limits(1, user_api="blas")


@pytest.mark.parametrize("heads,tokens", [(2, 8), (6, 128)])  # NumPy's form on one thread; the per-head path
@pytest.mark.parametrize("width", [1, 2])
def test_the_kernel_takes_the_heads_layout_and_writes_into_the_output_buffer(heads, tokens, width, monkeypatch):
    calls = []
    real = attention.run
    monkeypatch.setattr(attention, "run", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    b, d = 2, 64
    rng = np.random.default_rng(heads)
    q, k, v = (rng.standard_normal((b, tokens, heads, d)).astype(np.float32) for _ in range(3))
    mask = np.where(rng.random((b, 1, 1, tokens)) < 0.2, -1e4, 0).astype(np.float32)
    attrs = {"scale": 0.125, "perm_q": HEADS_PERM, "perm_kt": [0, 2, 3, 1], "perm_v": HEADS_PERM,
             "perm_out": HEADS_PERM}
    spec = KernelSpec(name="att", op_type="Attention", domain="ge.fused", attrs=attrs,
                      inputs=[TensorType.of(x) for x in (q, k, v, mask)],
                      outputs=[TensorType("float32", (b, tokens, heads, d))], const_inputs=[None] * 4,
                      options={"parallel_width": width})
    want = attention_reference(q.transpose(HEADS_PERM), k.transpose(0, 2, 3, 1), v.transpose(HEADS_PERM), mask, 0.125)
    want = want.transpose(HEADS_PERM)  # the output in (b, tokens, heads, d)
    kernel = attention_factory(spec)
    with parallel.use_threads(width), _blas_one():
        out = np.full((b, tokens, heads, d), np.nan, np.float32)
        got = kernel(q, k, v, mask, out=(out,))[0]
        fresh = kernel(q, k, v, mask)[0]
    assert got is out
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(fresh, want, rtol=2e-5, atol=2e-6)
    native = width > 1 and heads * tokens * tokens * 2 * d >= attention.SERIAL_WORK
    assert len(calls) == (2 if native else 0)
    if native:  # the per-head path wrote straight into the buffer, through its transposed view
        assert calls[0] is not None and calls[0].base is out and not calls[0].flags.c_contiguous


def test_an_output_view_without_contiguous_rows_is_written_through_a_copy():
    rng = np.random.default_rng(2)
    q, v = (rng.standard_normal((1, 4, 128, 64)).astype(np.float32) for _ in range(2))
    kt = rng.standard_normal((1, 4, 64, 128)).astype(np.float32)
    buf = np.full((1, 4, 64, 128), np.nan, np.float32)
    out = buf.transpose(0, 1, 3, 2)  # head matrices stored column by column
    with _blas_one():
        assert attention.run(q, kt, v, None, 0.125, out, 2) is out
    np.testing.assert_allclose(out, attention_reference(q, kt, v, None, 0.125), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("attr,value", [("perm_q", [0, 1, 1, 3]), ("perm_kt", [0, 2, 3]), ("perm_out", [0, 2, 1, 9]),
                                        ("perm_v", [0.5, 1, 2, 3])])
def test_an_om_whose_attention_permutation_is_not_one_is_refused_at_load(bert, attr, value, tmp_path):
    path = str(tmp_path / "bert.om")
    compile_onnx(bert).save(path)
    d, blob = read_om(path)
    node = next(n for n in internal_nodes(d) if n["op"] == "Attention")
    node["attrs"][attr] = {"list": [{"f" if isinstance(x, float) else "i": x} for x in value]}
    write_om(path, d, blob)
    with pytest.raises(ge.OmFormatError, match=f"{attr}"):
        ge.load_om(path)
