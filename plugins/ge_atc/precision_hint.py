"""The one line a float32 compile prints where the CPU has a bf16 unit (AMX, AVX512-BF16): what
``--precision_mode=allow_mix_precision_bf16`` would buy on this model (``report["precision_hint"]``).

The line gives the share of the model's multiply-adds in the ops the bf16 mode computes in bf16,
and this CPU's measured speed of its bf16 GEMM against its float32 one
(:func:`ge_native.bf16.measured_speedup`: once per machine, kept in the user's cache), so the expected gain is a figure of this machine, not of another one;
``ge bench MODEL --precision fp32,bf16`` measures the whole model and its output error.
"""

from __future__ import annotations

import math
from typing import Any

from ge_core.ir.graph import Graph, Node

#: the bf16 variants that are a matrix unit
UNITS = ("amx_bf16", "avx512_bf16")
#: the measured GEMM speed-up below which the line is not printed
MIN_RATIO = 1.2


def _macs(n: Node) -> int:
    """Multiply-adds of a matrix node of static shapes (0 when unknown)."""
    out = n.outputs[0].type.shape if n.outputs else None
    if out is None or not all(isinstance(d, int) for d in out):
        return 0
    w = n.inputs[1] if len(n.inputs) > 1 else None
    if n.op_type in ("MatMul", "Gemm", "FusedMatMul"):
        x = n.inputs[0]
        shape = x.type.shape if x is not None else None
        if not shape or not isinstance(shape[-1], int):
            return 0
        k = shape[0] if n.op_type != "MatMul" and int(n.attrs.get("transA", 0) or 0) else shape[-1]
        return math.prod(out) * int(k)
    if n.op_type in ("Conv", "FusedConv", "NchwcConv"):
        ws = n.attrs.get("weight_shape") or (w.type.shape if w is not None else None)
        if not ws or len(ws) != 4 or not all(isinstance(d, int) for d in ws):
            return 0
        m, cg, kh, kw = (int(d) for d in ws)
        pixels = math.prod(out[:1]) * math.prod(out[2:4])
        return pixels * m * cg * kh * kw
    return 0


def matrix_share(graph: Graph) -> tuple[int, int]:
    """``(matrix ops of static shapes, their multiply-adds)`` of ``graph``."""
    from .precision import MATRIX_OPS

    count = total = 0
    for n in graph.node_list():
        if n.op_type in MATRIX_OPS:
            m = _macs(n)
            count += 1 if m else 0
            total += m
    return count, total


def _amount(v: int) -> str:
    return f"{v / 1e9:.2f} G" if v >= 1e9 else f"{v / 1e6:.1f} M" if v >= 1e6 else f"{v:,}"


def hint(model: Any) -> str | None:
    """The line (None where the CPU has no bf16 unit or the model no matrix work)."""
    from ge_native import bf16

    unit = bf16.isa() if bf16.available() else None
    if unit not in UNITS:
        return None
    count, macs = matrix_share(model.graph)
    if not count or not macs:
        return None
    ratio = bf16.measured_speedup(unit)
    if ratio is not None and ratio < MIN_RATIO:
        return None  # (a bf16 unit no faster than this CPU's float32 GEMM: nothing to offer)
    speed = f"; this CPU's bf16 GEMM runs {ratio:.1f}x its float32 one (measured here)" if ratio else ""
    return (f"this CPU computes bf16 on {unit}: --precision_mode=allow_mix_precision_bf16 computes this model's "
            f"{count} matrix op(s) ({_amount(macs)} multiply-adds) in bf16 with float32 sums{speed}; "
            "`ge bench MODEL --precision fp32,bf16` measures its speed and output error")
