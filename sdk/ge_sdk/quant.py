"""The int8 handshake between the graph's quantisation pass and a backend's int8 kernels.

``ge_quant``'s ``qdq_regions`` pass reads a quantised model (QDQ, QOperator, dynamic) and leaves
a float32 graph whose quantised tensors carry values on their grid (a QuantizeLinear followed by
its DequantizeLinear becomes the elementwise *fake-quant* ``Mul(Clip(Round(Div(x, s))), s)``)
and whose quantised matrix ops (Conv, MatMul, Gemm) have float32 weights that are exactly the
dequantised int8 ones. For each such op it puts an :func:`entry` in the graph's table
(``graph.metadata[TABLE]``, keyed by the op's name): how its input is quantised (a scale and zero
point, or dynamically per run) and the weight's scales. The fusion and layout passes that follow
turn the op into fused or blocked forms; the rewrite driver records the source names in
``node.meta[ge.fused_from]``, so a backend's int8 pass finds the entry of what the op became
(:func:`lookup`). The backend recovers the int8 weight from the float one and the scales
(:func:`recover`, exact or refused), packs it, quantises the input while it packs it, sums in
int32 and writes float32; it records on the node what ran (:func:`done`): ``node.meta[META]``.
The compile report's ``int8`` section (``ge_quant``) is built from those records.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: graph.metadata key: {source node name: entry}
TABLE = "ge.int8"
#: node meta key: what the backend ran {"kernel", "why", "macs"}; "why" empty when it ran in int8
META = "ge.int8"
#: the node meta key the rewrite driver keeps the source names in (ge_sdk.rewrite.driver)
FUSED_FROM = "ge.fused_from"
#: integer ranges of the activation types
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
#: the fake-quant op: ``y = clip(rint(x / scale), qmin - zero_point, qmax - zero_point) * scale``
#: (float32; exactly QuantizeLinear then DequantizeLinear with that per-tensor scale and zero
#: point), elementwise: its attributes ``scale`` (float), ``zero_point``, ``qmin``, ``qmax`` (ints)
DOMAIN, FAKE_QUANT = "ge.quant", "FakeQuant"


def fake_quant_params(node: Any) -> tuple[float, int, int, int] | None:
    """``(scale, zero_point, qmin, qmax)`` of a FakeQuant node, or None when it is not one."""
    if node is None or node.op_type != FAKE_QUANT or node.domain != DOMAIN:
        return None
    a = node.attrs
    return float(np.float32(a["scale"])), int(a["zero_point"]), int(a["qmin"]), int(a["qmax"])


def fake_quant(x: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int) -> np.ndarray:
    """The fake-quant of float32 ``x`` (NumPy; the reference of every kernel of the op)."""
    s = np.float32(scale)
    y = np.divide(np.asarray(x, np.float32), s, dtype=np.float32)
    np.rint(y, out=y)
    np.clip(y, np.float32(qmin - zero_point), np.float32(qmax - zero_point), out=y)
    return np.multiply(y, s, out=y)


def entry(x_scale: float | None, x_zero_point: int = 0, x_dtype: str = "uint8", w_scale: Any = None,
          w_axis: int = 0) -> dict[str, Any]:
    """A table entry: the input's quantisation (``x_scale`` None: dynamic, per run, as
    DynamicQuantizeLinear) and the weight's per-output-channel scales along ``w_axis`` of the
    float weight (0 for a Conv's (M, C, KH, KW), 1 for a MatMul's (K, N)); weights are int8 with
    zero point 0 (what the kernels take)."""
    if x_dtype not in RANGES:
        raise ValueError(f"activation type {x_dtype} is not one of {', '.join(RANGES)}")
    x = {"dynamic": True} if x_scale is None else {"scale": float(np.float32(x_scale)),
                                                   "zero_point": int(x_zero_point), "dtype": x_dtype}
    ws = np.asarray(w_scale, np.float32).reshape(-1)
    return {"x": x, "w": {"scale": [float(v) for v in ws], "axis": int(w_axis)}}


def table(graph: Any) -> dict[str, dict[str, Any]]:
    """The graph's int8 table (created empty when absent); its parent's for a subgraph."""
    g = graph
    while getattr(g, "parent", None) is not None:
        g = g.parent
    t = g.metadata.get(TABLE)
    if not isinstance(t, dict):
        t = g.metadata[TABLE] = {}
    return t


def lookup(graph: Any, node: Any) -> dict[str, Any] | None:
    """The entry of ``node``: of the one source it was made from that has one (its
    ``ge.fused_from`` names: a fused node's own name may be another node's, suffixed), else of
    its own name; or None."""
    t = table(graph)
    sources = node.meta.get(FUSED_FROM)
    if sources:
        names = [n for n in sources if n in t]
        return t[names[0]] if len(names) == 1 else None
    return t.get(node.name)


def w_scales(e: dict[str, Any], channels: int) -> np.ndarray:
    """The weight's scales of an entry as float32 (channels,) (a per-tensor scale repeated)."""
    s = np.asarray(e["w"]["scale"], np.float32)
    if s.size == 1:
        return np.full(channels, s[0], np.float32)
    if s.size != channels:
        raise ValueError(f"{s.size} weight scales for {channels} output channels")
    return s


def recover(w: np.ndarray, scale: np.ndarray, axis: int, tol: float = 0.0) -> np.ndarray | None:
    """The int8 weight whose dequantised values are exactly the float32 ``w`` (per-channel
    ``scale`` along ``axis``), or None when ``w`` is not such a weight (a pass changed it).
    ``tol`` > 0: ``w`` came back from a transform that is exact only up to float rounding (a
    Winograd packing's): each ``w / scale`` within ``tol`` of its integer."""
    w = np.asarray(w, np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    s = np.asarray(scale, np.float32).reshape(shape)
    if np.any(s <= 0) or not np.all(np.isfinite(s)):
        return None
    q = np.rint(w / s)
    if np.any(q < -128) or np.any(q > 127):
        return None
    if tol > 0:
        if not np.all(np.abs(w / s - q) <= tol):
            return None
    elif not np.array_equal((q.astype(np.float32) * s).astype(np.float32), w):
        return None
    return q.astype(np.int8)


def done(node: Any, kernel: str, why: str = "", macs: int = 0) -> None:
    """Record on ``node`` what its int8 entry became: the kernel that runs it and, where it
    stays float32, why."""
    node.meta[META] = {"kernel": kernel, "why": why, "macs": int(macs)}
