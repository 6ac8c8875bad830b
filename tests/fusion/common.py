"""Helpers the fusion tests share: the float64 attention reference, exporting a ``transformers``
model's last hidden state with the TorchScript exporter, and compiling an exported model with some
fusions switched off."""

import json

import numpy as np
import onnx

import ge_core as ge


def attention_reference(q, kt, v, mask, scale):
    """softmax(Q·Kᵀ·scale + mask)·V in float64."""
    s = np.matmul(q.astype(np.float64), kt.astype(np.float64)) * scale
    if mask is not None:
        s = s + mask
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(-1, keepdims=True)) @ v.astype(np.float64)


def compile_onnx(blob: bytes, tmp_path=None, off=(), threads=1):
    """``blob`` (ONNX bytes) compiled at ``threads``, the fusions named in ``off`` switched off
    through a fusion switch file written under ``tmp_path``."""
    opts = {"threads": threads}
    if off:
        p = tmp_path / "switch.json"
        p.write_text(json.dumps({"Switch": {"GraphFusion": {name: "off" for name in off}}}))
        opts["fusion_switch_file"] = str(p)
    return ge.compile(ge.load(onnx.load_from_string(blob)), opts)


def export_last_hidden(model, seq: int, mask: str = "none") -> bytes:
    """ONNX bytes of ``model``'s ``last_hidden_state`` for ``(1, seq)`` token ids (``input_ids``),
    from the TorchScript exporter at opset 17. ``mask``: "none"; "ones", an all-ones attention mask
    made inside the trace (it keeps transformers' packed-sequence check, aten::diff, which the
    exporter lacks, out of it); or "input", the mask as a second input ``attention_mask``."""
    import io
    import warnings

    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, *m):
            if mask == "none":
                return self.model(input_ids=x).last_hidden_state
            return self.model(input_ids=x, attention_mask=m[0] if m else torch.ones_like(x)).last_hidden_state

    ids = torch.zeros(1, seq, dtype=torch.int64)
    args = (ids, torch.ones(1, seq, dtype=torch.int64)) if mask == "input" else (ids,)
    names = ["input_ids", "attention_mask"] if mask == "input" else ["input_ids"]
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden().eval(), args, buf, input_names=names, output_names=["last_hidden_state"],
                          opset_version=17, dynamo=False)
    return buf.getvalue()
