"""Weight-only quantisation: ``ge.quantize(graph, None, weights_only=4|8, block_size=...)``.

Each ONNX ``MatMul`` whose weight is a constant float32 ``(K, N)`` matrix (leading dims of 1
squeezed) becomes ``com.microsoft::MatMulNBits`` with the packing of onnxruntime's
``MatMulNBitsQuantizer`` (its default RTN algorithm, QOperator format), bit for bit: per column,
blocks of ``block_size`` rows of K (the last block's range from the rows there are; K not a
multiple of the block size is padded as onnxruntime pads it), asymmetric ``scale = (max(max, 0) -
min(min, 0)) / (2^bits - 1)``, ``zero_point = roundf(-min / scale)`` clamped, or symmetric ``scale
= (the larger magnitude of min and max, signed) / -2^(bits-1)`` with the default zero point; ``q =
clamp(roundf(w * (1 / scale) + zero_point))`` in float32, as MLAS computes it. Gather (embeddings) stays
float, as onnxruntime's default leaves it; the lm_head MatMul is quantised unless ``skip`` names
it. No calibration: decode is bound by the weight bytes, the activations stay float.

The report (``report=`` and ``graph.metadata["quantize_report"]``) gives each layer's relative
error of the dequantised weight and of its output on a random input, its bytes before and after,
and what was skipped and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ge_core.errors import OptionError
from ge_core.ir.graph import Graph, Node
from ge_core.ir.types import TensorType

DOMAIN = "com.microsoft"
REPORT_KEY = "quantize_report"
BLOCK_SIZES = (16, 32, 64, 128, 256)
#: rows of the random input each layer's output error is measured on
PROBE_ROWS = 8


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's ``roundf`` (half away from zero) of float32 ``x``, exactly (in float64)."""
    x64 = x.astype(np.float64)
    return (np.sign(x64) * np.floor(np.abs(x64) + 0.5)).astype(np.float32)


def _ranges(w: np.ndarray, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """Each block's (min, max) over the rows of K it holds: ``(k_blocks, N)`` float32 each."""
    k, n = w.shape
    kb = -(-k // bs)
    lo = np.full((kb * bs, n), np.inf, np.float32)
    hi = np.full((kb * bs, n), -np.inf, np.float32)
    lo[:k], hi[:k] = w, w
    return lo.reshape(kb, bs, n).min(axis=1), hi.reshape(kb, bs, n).max(axis=1)


def quantize_blockwise(w: np.ndarray, bits: int, bs: int, symmetric: bool):
    """onnxruntime's ``quantize_matmul_{4,8}bits`` of ``w`` ``(K, N)`` float32: ``B`` uint8
    ``(N, k_blocks, bs * bits / 8)``, scales float32 ``(N, k_blocks)``, zero points uint8 ``(N,
    ceil(k_blocks * bits / 8))`` (None when symmetric)."""
    f = np.float32
    k, n = w.shape
    kb, qmax, mid, pack = -(-k // bs), f((1 << bits) - 1), 1 << (bits - 1), 8 // bits
    mn, mx = _ranges(w, bs)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if symmetric:
            scale = (np.where(np.abs(mx) > np.abs(mn), mx, mn) / f(-mid)).astype(f)
            zp = np.full((kb, n), mid, np.uint8)
        else:
            mn0, mx0 = np.minimum(mn, f(0)), np.maximum(mx, f(0))
            scale = ((mx0 - mn0) / qmax).astype(f)
            zfp = np.where(scale != 0, f(0) - (mn0 / scale).astype(f), mn0).astype(f)
            zp = np.where(zfp < 0, f(0), np.where(zfp > qmax, qmax, _roundf(zfp))).astype(np.uint8)
        recip = np.where(scale != 0, (f(1) / scale).astype(f), f(0)).astype(f)
        rows = np.arange(k) // bs
        t = ((w * recip[rows]).astype(f) + zp[rows].astype(f)).astype(f)
        q = np.clip(_roundf(t), f(0), qmax).astype(np.uint8)
    full = np.zeros((kb * bs, n), np.uint8)
    full[:k] = q
    if k % pack:
        # MLAS packs the last partial byte from its reused register: the slots past K keep the
        # values of the byte before (0 where that byte starts a thread block of bs * pack rows)
        start = k - k % pack
        for s in range(k % pack, pack):
            if start % (bs * pack) and start - pack + s >= 0:
                full[start + s] = full[start - pack + s]
    b = np.zeros((n, kb * bs * bits // 8), np.uint8)
    cols = full.T.reshape(n, -1, pack).astype(np.uint8)
    for s in range(pack):
        b |= (cols[:, :, s] << (bits * s)).astype(np.uint8)
    zps = None
    if not symmetric:
        zfull = np.full((n, -(-kb // pack) * pack), mid, np.uint8)
        zfull[:, :kb] = zp.T
        zc = zfull.reshape(n, -1, pack)
        zps = np.zeros((n, zc.shape[1]), np.uint8)
        for s in range(pack):
            zps |= (zc[:, :, s] << (bits * s)).astype(np.uint8)
    return b.reshape(n, kb, bs * bits // 8), np.ascontiguousarray(scale.T), zps


def dequantized(b: np.ndarray, scales: np.ndarray, zps: np.ndarray | None, k: int, n: int, bits: int,
                bs: int) -> np.ndarray:
    """The float64 ``(K, N)`` weight that ``b``, ``scales``, ``zps`` stand for."""
    kb = -(-k // bs)
    pack = 8 // bits
    q = np.stack([(b.reshape(n, -1) >> (bits * s)) & ((1 << bits) - 1) for s in range(pack)], -1).reshape(n, -1)[:, :k]
    if zps is None:
        z = np.full((n, kb), float(1 << (bits - 1)))
    else:
        z = np.stack([(zps >> (bits * s)) & ((1 << bits) - 1) for s in range(pack)], -1).reshape(n, -1)[:, :kb]
    rows = np.arange(k) // bs
    return ((q.astype(np.float64) - z[:, rows]) * scales.astype(np.float64)[:, rows]).T


def _weight(n: Node) -> np.ndarray | None:
    """The constant 2-D float32 weight of MatMul ``n`` (leading dims of 1 squeezed), or None."""
    if n.op_type != "MatMul" or n.domain not in ("", "ai.onnx") or len(n.inputs) < 2:
        return None
    w = n.inputs[1]
    if w is None or w.const_value is None or n.inputs[0] is None:
        return None
    c = w.const_value
    if c.dtype != np.float32 or c.ndim < 2 or any(d != 1 for d in c.shape[:-2]):
        return None
    return c.reshape(c.shape[-2], c.shape[-1])


def _check(bits: Any, block_size: Any) -> None:
    if bits not in (4, 8):
        raise OptionError(f"quantize: weights_only={bits!r} is not 4 or 8",
                          hint="weights_only=4 (int4 blocks, onnxruntime-genai's int4) or 8")
    if block_size not in BLOCK_SIZES:
        raise OptionError(f"quantize: block_size={block_size!r} is not one of {', '.join(map(str, BLOCK_SIZES))}",
                          hint="32 (onnxruntime-genai's builder) or 128 (onnxruntime's quantizer default)")


def _errors(w: np.ndarray, wq: np.ndarray, seed: int) -> tuple[float, float]:
    """The relative (Frobenius) error of ``wq`` against ``w`` and of ``x @ wq`` against ``x @ w``
    for a standard normal ``x`` of :data:`PROBE_ROWS` rows."""
    w64 = w.astype(np.float64)
    nw = float(np.linalg.norm(w64))
    x = np.random.default_rng(seed).standard_normal((PROBE_ROWS, w.shape[0]))
    y, yq = x @ w64, x @ wq
    ny = float(np.linalg.norm(y))
    werr = float(np.linalg.norm(w64 - wq)) / nw if nw else 0.0
    return werr, (float(np.linalg.norm(y - yq)) / ny if ny else 0.0)


def _rewrite(g: Graph, n: Node, w: np.ndarray, bits: int, bs: int, symmetric: bool, accuracy_level: int | None,
             seed: int) -> dict[str, Any]:
    """Replace MatMul ``n`` by its MatMulNBits; its report row."""
    k, nn = w.shape
    b, scales, zps = quantize_blockwise(w, bits, bs, symmetric)
    wname = n.inputs[1].name  # type: ignore[union-attr]
    ins = [n.inputs[0], g.add_constant(b, f"{wname}_Q{bits}"), g.add_constant(scales, f"{wname}_scales")]
    if zps is not None:
        ins.append(g.add_constant(zps, f"{wname}_zero_points"))
    attrs: dict[str, Any] = {"K": k, "N": nn, "bits": bits, "block_size": bs}
    if accuracy_level:
        attrs["accuracy_level"] = int(accuracy_level)
    out = n.outputs[0]
    new = g.add_node("MatMulNBits", ins, attrs, domain=DOMAIN, name=f"{n.name}_Q{bits}", before=n,
                     output_types=[out.type if isinstance(out.type, TensorType) else None])
    old_w = n.inputs[1]
    out.replace_all_uses_with(new.outputs[0])
    g.remove_node(n)
    if old_w is not None and not old_w.has_uses() and not old_w.is_graph_output and old_w.name in g.constants:
        g.remove_constant(old_w)
    werr, yerr = _errors(w, dequantized(b, scales, zps, k, nn, bits, bs), seed)
    after = b.nbytes + scales.nbytes + (0 if zps is None else zps.nbytes)
    return {"name": n.name, "node": new.name, "K": k, "N": nn, "weight_rel_error": werr, "output_rel_error": yerr,
            "bytes_before": int(w.nbytes), "bytes_after": int(after)}


def quantize_weights(graph: Graph, bits: int = 4, block_size: int = 32, symmetric: bool = False,
                     skip: Iterable[str] = (), accuracy_level: int | None = None,
                     report: dict[str, Any] | None = None) -> Graph:
    """A copy of ``graph`` whose MatMul weights are ``bits``-bit blocks of ``block_size`` rows
    (MatMulNBits, module docstring); ``skip``: node (or weight) names kept float;
    ``accuracy_level`` the nodes' attribute (4: int8 activations; None: onnxruntime's default,
    not written). ``graph`` is not changed."""
    _check(bits, block_size)
    g = graph.copy()
    skipped = set(skip)
    rows, kept = [], {}
    for i, n in enumerate(g.node_list()):
        if n.op_type == "Gather":
            kept[n.name] = "Gather (an embedding) stays float, as onnxruntime's default leaves it"
            continue
        if n.op_type != "MatMul":
            continue
        w = _weight(n)
        if w is None:
            kept[n.name] = "the weight is not a constant float32 (K, N) matrix"
        elif n.name in skipped or (n.inputs[1] is not None and n.inputs[1].name in skipped):
            kept[n.name] = "named in skip"
        else:
            rows.append(_rewrite(g, n, w, bits, block_size, symmetric, accuracy_level, seed=i))
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    rep = {"mode": "weights_only", "bits": bits, "block_size": block_size, "symmetric": symmetric,
           "layers": rows, "kept_float": kept, "quantized": [r["name"] for r in rows],
           "bytes_before": before, "bytes_after": after,
           "max_output_rel_error": max((r["output_rel_error"] for r in rows), default=0.0)}
    g.metadata[REPORT_KEY] = rep
    if report is not None:
        report.update(rep)
    return g
