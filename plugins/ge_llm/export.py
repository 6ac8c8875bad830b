"""Export a ``transformers`` causal LM to ONNX with its KV cache, in the names Optimum and
onnxruntime-genai use: inputs ``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.N.key/value`` (BNSH, a dynamic past length: 0 for the prefill) and outputs
``logits``, ``present.N.key/value``. What :class:`ge_llm.generate.Generator` runs; torch and
transformers are imported only here."""

from __future__ import annotations

import io
import os
import warnings
from typing import Any

from ge_core.errors import ModelFileError

#: the trace's past and new lengths: a non-empty past, so the cache's concat is traced (a 0-length
#: one would be folded away by transformers' "empty cache" test)
_TRACE_PAST, _TRACE_NEW = 3, 2


def cache_names(layers: int) -> tuple[list[str], list[str]]:
    """``(past input names, present output names)`` of a decoder with ``layers`` layers."""
    past = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    return past, [n.replace("past_key_values", "present") for n in past]


def kv_dims(config: Any) -> tuple[int, int, int]:
    """``(layers, kv heads, head size)`` of a transformers decoder config."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv, head_size


def export_decoder(model: Any, path: str | os.PathLike | None = None, *, opset: int = 17) -> bytes:
    """The ONNX bytes of ``model`` (a transformers ``*ForCausalLM`` in eval mode, eager attention)
    exported with its KV cache by the TorchScript exporter; also written to ``path`` if given."""
    import torch
    from transformers import DynamicCache

    config = model.config
    layers, kv, head_size = kv_dims(config)
    past_names, present_names = cache_names(layers)

    class WithCache(torch.nn.Module):
        """input_ids, attention_mask, position_ids, the past tuple -> logits, the presents."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=config)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            return (out.logits, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)))

    total = _TRACE_PAST + _TRACE_NEW
    args = (torch.ones((1, _TRACE_NEW), dtype=torch.long), torch.ones((1, total), dtype=torch.long),
            torch.arange(_TRACE_PAST, total)[None],
            *(torch.zeros((1, kv, _TRACE_PAST, head_size)) for _ in past_names))
    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch", 1: "sequence"},
                                       "attention_mask": {0: "batch", 1: "total_sequence"},
                                       "position_ids": {0: "batch", 1: "sequence"},
                                       "logits": {0: "batch", 1: "sequence"}}
    axes.update({n: {0: "batch", 2: "past_sequence"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in present_names})
    f: Any = io.BytesIO()  # (torch's stubs name paths only; the exporter writes to files too)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on transformers' Python branches
            torch.onnx.export(WithCache().eval(), args, f, input_names=["input_ids", "attention_mask", "position_ids",
                                                                        *past_names],
                              output_names=["logits", *present_names], dynamic_axes=axes, opset_version=opset,
                              dynamo=False)
    except Exception as e:  # noqa: BLE001 - the exporter's many error types, one message
        raise ModelFileError(f"exporting {type(model).__name__} with its KV cache failed: {e}",
                             hint="use eager attention (attn_implementation='eager') and a decoder-only model") from e
    blob = f.getvalue()
    if path is not None:
        with open(path, "wb") as out:
            out.write(blob)
    return blob
