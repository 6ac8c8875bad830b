"""Helpers the fusion tests share: the float64 attention reference and compiling an exported
model with some fusions switched off."""

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
