"""Tiny decoder LLMs built by onnxruntime-genai's model builder, for the contrib-op tests:
random weights written by ``transformers``' ``save_pretrained``, then
``python -m onnxruntime_genai.models.builder -i <folder> -o <out> -p <precision> -e cpu``.
Each (arch, precision, config) is built once per test session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

#: the default tiny config of each architecture (hidden 64, 2 layers, 4 heads / 2 KV heads)
TINY: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=256),
    "qwen2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=256),
    "mistral": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=128, max_position_embeddings=256),
    "phi3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=256),
}

_CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig", "phi3": "Phi3Config"}
_MODELS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
           "phi3": "Phi3ForCausalLM"}

_built: dict[tuple, Path] = {}


def _tokenizer(vocab: int) -> Any:
    """A word-level tokenizer of ``vocab`` tokens ("t0", "t1"...; the first three special), made
    here (no hub): the builder reads the folder's tokenizer for its special token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2")


def builder_model(tmp_path: Path, arch: str = "llama", precision: str = "fp32", **config: Any) -> Path:
    """The path of ``model.onnx`` that onnxruntime-genai's builder makes (``-p precision -e cpu``)
    from a tiny ``arch`` model (:data:`TINY`'s config, ``config`` overriding it) with random
    weights (seed 0); built under ``tmp_path`` once per session for each set of arguments (a
    later call with other ``tmp_path`` gets the first one's file)."""
    import torch
    import transformers

    key = (arch, precision, tuple(sorted(config.items())))
    if key in _built and _built[key].exists():
        return _built[key]
    cfg = {**TINY[arch], **config}
    root = Path(tmp_path) / f"builder_{arch}_{precision}_{len(_built)}"
    hf, out = root / "hf", root / "onnx"
    torch.manual_seed(0)
    model = getattr(transformers, _MODELS[arch])(getattr(transformers, _CONFIGS[arch])(**cfg))
    model.save_pretrained(hf)
    _tokenizer(int(cfg["vocab_size"])).save_pretrained(hf)  # (the builder reads one)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(root / "cache")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    path = out / "model.onnx"
    if done.returncode or not path.exists():
        raise RuntimeError(f"onnxruntime-genai's builder failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    _built[key] = path
    return path
