"""The generation loop (``ge_llm.generate``) on a tiny LLaMA-style decoder exported with its KV
cache (``ge_llm.export``): greedy tokens equal onnxruntime's (a reference loop here) and
transformers' own ``generate``; a seed repeats a sampled generation; the IO-binding path writes
every present into two buffers that stay put; ``ge generate`` prints the tokens. And a builder-made
model (onnxruntime-genai's format) against onnxruntime-genai's own loop."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers

import ge_core as ge
from ge_core.errors import GraphError, InputError
from ge_llm.export import cache_names, export_decoder
from ge_llm.generate import Generator, find_cache, pick, takes_outputs

from .models import builder_model

PROMPT = [5, 9, 17, 33, 3, 7]
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)


@pytest.fixture(scope="module")
def tiny():
    """``(transformers model, onnx bytes, compiled model)``; no eos, so nothing stops early."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**TINY, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   attn_implementation="eager")
    hf = transformers.LlamaForCausalLM(cfg).eval()
    blob = export_decoder(hf)
    return hf, blob, ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": 1})


def ort_greedy(blob: bytes, prompt: list[int], n: int) -> list[int]:
    """The reference: a greedy KV-cache loop over an onnxruntime session."""
    import onnxruntime as ort

    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    past_names, _ = cache_names(TINY["num_hidden_layers"])
    past = {k: np.zeros((1, TINY["num_key_value_heads"], 0, 16), np.float32) for k in past_names}
    cur, pos, out = np.array([prompt], np.int64), 0, []
    for _ in range(n):
        total = pos + cur.shape[1]
        res = sess.run(None, {"input_ids": cur, "attention_mask": np.ones((1, total), np.int64),
                              "position_ids": np.arange(pos, total)[None], **past})
        out.append(int(res[0][0, -1].argmax()))
        past, pos, cur = dict(zip(past_names, res[1:])), total, np.array([[out[-1]]], np.int64)
    return out


def test_greedy_equals_onnxruntime_and_transformers(tiny):
    hf, blob, model = tiny
    gen = Generator(model)
    assert [(c.past, c.present, c.heads, c.head_size) for c in gen.cache[:2]] == [
        ("past_key_values.0.key", "present.0.key", 2, 16), ("past_key_values.0.value", "present.0.value", 2, 16)]
    tokens = gen.generate(PROMPT, 16)
    assert tokens == ort_greedy(blob, PROMPT, 16)
    with torch.no_grad():
        want = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False)[0, len(PROMPT):].tolist()
    assert tokens == want
    t = gen.timings
    assert t.prompt_tokens == 6 and t.tokens == 16 and len(t.decode_s) == 15
    assert t.first_token_s > 0 and t.decode_ms > 0 and t.tokens_per_s > 0
    assert list(gen.stream(PROMPT, 4)) == tokens[:4]


def test_sampling_is_reproducible_by_seed(tiny):
    gen = Generator(tiny[2])
    opts = dict(greedy=False, temperature=0.8, top_k=20, top_p=0.9)
    a = gen.generate(PROMPT, 8, seed=3, **opts)
    assert a == gen.generate(PROMPT, 8, seed=3, **opts) and len(a) == 8
    assert all(0 <= t < TINY["vocab_size"] for t in a)
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 3.0, 1.0, 2.9], np.float32)
    assert pick(logits, None) == 1
    assert {pick(logits, rng, top_k=1) for _ in range(20)} == {1}
    assert {pick(logits, rng, top_p=0.01) for _ in range(20)} == {1}
    assert {pick(logits, rng, top_k=2, temperature=5.0) for _ in range(200)} == {1, 3}
    with pytest.raises(InputError, match="temperature"):
        gen.generate(PROMPT, 2, greedy=False, temperature=0.0)


def test_eos_max_length_and_errors(tiny):
    model = tiny[2]
    first = Generator(model).generate(PROMPT, 6)
    assert Generator(model, eos=first[2]).generate(PROMPT, 6) == first[:3]
    assert Generator(model, max_length=len(PROMPT) + 2).generate(PROMPT, 6) == first[:2]
    with pytest.raises(InputError, match="prompt"):
        Generator(model).generate([], 2)
    plain = ge.compile(_no_cache_model(), {"threads": 1})
    with pytest.raises(GraphError, match="no KV cache"):
        Generator(plain)


def _no_cache_model() -> ge.Graph:
    x = onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.FLOAT, [1, 4])
    y = onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 4])
    g = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["input_ids"], ["logits"])], "g", [x], [y])
    return ge.load(onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)]))


class Bound:
    """A model whose ``run`` fills caller-owned arrays (``outputs=``), as IO binding does."""

    def __init__(self, model) -> None:
        self.model, self.inputs, self.outputs = model, model.inputs, model.outputs
        self.addresses: list[set[int]] = []

    def run(self, feeds, outputs=None):
        res = self.model.run(feeds)
        for k, a in (outputs or {}).items():
            a[...] = res[k]
        self.addresses.append({a.__array_interface__["data"][0] for a in (outputs or {}).values()})
        return res


def test_io_binding_writes_presents_in_place(tiny):
    bound = Bound(tiny[2])
    gen = Generator(bound)
    assert gen.io_binding
    # the same tokens as the copy path, and as the compiled model's own outputs= where it has it
    copying = Generator(tiny[2], io_binding=False)
    assert gen.generate(PROMPT, 10) == copying.generate(PROMPT, 10) == Generator(tiny[2]).generate(PROMPT, 10)
    assert Generator(tiny[2]).io_binding == takes_outputs(tiny[2])
    # each present lands at the start of one of its cache's two buffers: 2 x 4 addresses in all
    assert len(set().union(*bound.addresses)) == 2 * len(gen.cache)
    assert bound.addresses[0] == bound.addresses[2] and bound.addresses[0].isdisjoint(bound.addresses[1])


def test_cli_prints_tokens(tiny, tmp_path, capsys):
    from ge_core.cli import main

    path = str(tmp_path / "tiny.om")
    tiny[2].save(path)
    want = Generator(tiny[2]).generate(PROMPT, 5)
    assert main(["generate", path, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "5",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"tokens: {','.join(map(str, want))}" in out and "time to first token" in out and "tokens/s" in out
    assert main(["generate", path, "--prompt-ids", "1,2", "--max-new-tokens", "3", "--bench", "--rounds", "1"]) == 0
    assert "ms/token" in capsys.readouterr().out
    assert main(["generate", path, "--prompt-ids", "1,2", "--max-new-tokens", "4", "--seed", "1",
                 "--temperature", "0.7"]) == 0


def test_builder_model_equals_onnxruntime_genai(tmp_path):
    """onnxruntime-genai's builder output (GroupQueryAttention, the norms): this engine's greedy
    tokens equal onnxruntime-genai's own loop. Fails at compile while a contrib op is missing."""
    import onnxruntime_genai as og

    path = builder_model(tmp_path, "llama", "fp32")
    folder = str(path.parent)
    og_model = og.Model(folder)
    params = og.GeneratorParams(og_model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + 12)
    loop = og.Generator(og_model, params)
    loop.append_tokens(PROMPT)
    while not loop.is_done():
        loop.generate_next_token()
    want = [int(t) for t in loop.get_sequence(0)][len(PROMPT):]
    model = ge.compile(str(path), {"threads": 1})
    # the head size is a symbol in the ONNX: read off the GroupQueryAttention node, or genai_config.json
    assert [(c.heads, c.head_size) for c in find_cache(model)[:1]] == [(2, 16)]
    model.source = str(path)
    assert [(c.heads, c.head_size) for c in find_cache(model)[:1]] == [(2, 16)]
    gen = Generator(model, eos=2, max_length=len(PROMPT) + 12)
    assert gen.share_buffer == gen.io_binding  # GroupQueryAttention: one buffer per cache, as onnxruntime-genai
    assert gen.generate(PROMPT, 12) == want
    assert Generator(model, eos=2, share_buffer=False).generate(PROMPT, 12) == want
    assert Generator(model, eos=2, io_binding=False).generate(PROMPT, 12) == want
