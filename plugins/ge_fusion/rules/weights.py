"""Weight folds: BatchNormalization, Mul and Add by constants folded into Conv and Gemm weights;
:func:`fold_rules` is the fold phase (with :mod:`.layout`'s Pad and Transpose folds). They run
first, so the epilogue rules see bare convolutions."""

from __future__ import annotations

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk import quant
from ge_sdk.rewrite import AnyOf, Const, Match, Op, Rewriter, Rule, Var, const_of

from .common import is_float
from .layout import (
    fold_pad_conv,
    fold_pad_fake_quant_conv,
    fold_pad_pool,
    fold_transpose_gemm,
    fold_transpose_matmul,
    transpose,
)


def _conv_pattern(name: str = "conv") -> Op:
    return Op("Conv", Var("x"), Const("w"), ..., name=name, pred=lambda n: is_float(n.outputs[0]))


def _conv_bias(conv: Node) -> np.ndarray | None | bool:
    """The conv's bias array, None if absent, False if present but not a constant."""
    if len(conv.inputs) < 3 or conv.inputs[2] is None:
        return None
    c = conv.inputs[2].const_value
    return False if c is None else c


def _new_conv(rw: Rewriter, conv: Node, x: Value, w: np.ndarray, b: np.ndarray) -> Value:
    return rw.op("Conv", x, rw.const(w, "fused_w"), rw.const(b, "fused_b"), name=conv.name, **conv.attrs)


def _fold_bn_conv(rw: Rewriter, m: Match):
    """Conv + BatchNormalization (constant statistics) → Conv with scaled weights and bias."""
    conv, bn = m["conv"], m["bn"]
    b = _conv_bias(conv)
    if b is False or len(bn.outputs) != 1:
        return None
    w = m.const("w")
    eps = float(bn.attrs.get("epsilon", 1e-5))
    s = m.const("scale").astype(np.float64) / np.sqrt(m.const("var").astype(np.float64) + eps)
    if s.ndim != 1 or s.shape[0] != w.shape[0]:
        return None
    bias = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    nw = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    nb = ((bias - m.const("mean")) * s + m.const("bias")).astype(w.dtype)
    return _new_conv(rw, conv, m.value("x"), nw, nb)


def _channel_vector(c: np.ndarray, out_rank: int, channels: int) -> np.ndarray | None:
    """``c`` as one value per output channel (axis 1 of an ``out_rank`` tensor), if it is that."""
    if c.ndim > out_rank:
        return None
    if c.size == 1:
        return np.full(channels, float(c.reshape(-1)[0]))
    shape = (1,) * (out_rank - c.ndim) + c.shape
    if shape[1] == channels and all(d == 1 for i, d in enumerate(shape) if i != 1):
        return c.reshape(-1).astype(np.float64)
    return None


def _conv_and_channel_constant(m: Match):
    """(conv, weights, float64 bias, float64 per-channel vector) of a Conv ∘ constant match, or None."""
    conv = m["conv"]
    b = _conv_bias(conv)
    w = m.const("w")
    rank = conv.outputs[0].type.rank
    if b is False or rank is None:
        return None
    s = _channel_vector(m.const("c"), rank, w.shape[0])
    if s is None:
        return None
    return conv, w, (np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)), s


def _fold_mul_conv(rw: Rewriter, m: Match):
    """Conv × per-channel constant → Conv with scaled weights."""
    got = _conv_and_channel_constant(m)
    if got is None:
        return None
    conv, w, bias, s = got
    nw = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    return _new_conv(rw, conv, m.value("x"), nw, (bias * s).astype(w.dtype))


def _fold_add_conv(rw: Rewriter, m: Match):
    """Conv + per-channel constant → Conv with a shifted bias."""
    got = _conv_and_channel_constant(m)
    if got is None:
        return None
    conv, w, bias, s = got
    return _new_conv(rw, conv, m.value("x"), w, (bias + s).astype(w.dtype))


def _gemm_pattern() -> Op:
    return Op("Gemm", Var("a"), Const("b"), ..., name="gemm", pred=lambda n: is_float(n.outputs[0]))


def _gemm_parts(gemm: Node, n_out: int):
    """(B as K×N, C as a length-N vector or None, alpha, beta) or None when not foldable."""
    b = const_of(gemm.inputs[1])
    assert b is not None
    if int(gemm.attrs.get("transB", 0)):
        b = b.T
    if b.ndim != 2 or b.shape[1] != n_out:
        return None
    c = None
    if len(gemm.inputs) > 2 and gemm.inputs[2] is not None:
        cv = gemm.inputs[2].const_value
        if cv is None:
            return None
        if cv.size == 1:
            c = np.full(n_out, float(cv.reshape(-1)[0]))
        elif cv.ndim <= 2 and cv.shape[-1] == n_out and cv.size == n_out:
            c = cv.reshape(-1).astype(np.float64)
        else:
            return None
    return b, c, float(gemm.attrs.get("alpha", 1.0)), float(gemm.attrs.get("beta", 1.0))


def _new_gemm(rw: Rewriter, gemm: Node, a: Value, b: np.ndarray, c: np.ndarray, alpha: float, dtype) -> Value:
    attrs = {k: v for k, v in gemm.attrs.items() if k not in ("transB", "beta", "alpha")}
    return rw.op("Gemm", a, rw.const(np.ascontiguousarray(b.T).astype(dtype), "fused_b"), rw.const(c.astype(dtype), "fused_c"),
                 name=gemm.name, transB=1, alpha=alpha, beta=1.0, **attrs)


def _fold_scale_gemm(rw: Rewriter, m: Match, scale: np.ndarray, shift: np.ndarray):
    gemm = m["gemm"]
    b0 = m.const("b")
    n_out = b0.shape[0] if int(gemm.attrs.get("transB", 0)) else b0.shape[-1]
    parts = _gemm_parts(gemm, n_out)
    if parts is None or scale.shape != (n_out,) or shift.shape != (n_out,):
        return None
    b, c, alpha, beta = parts
    c = np.zeros(n_out) if c is None else c * beta
    return _new_gemm(rw, gemm, m.value("a"), b * scale[None, :], c * scale + shift, alpha, b0.dtype)


def _gemm_width(m: Match) -> int:
    gemm, b = m["gemm"], m.const("b")
    return int(b.shape[0] if int(gemm.attrs.get("transB", 0)) else b.shape[-1])


def _fold_bn_gemm(rw: Rewriter, m: Match):
    """Gemm + BatchNormalization (constant statistics) → Gemm with scaled weights and bias."""
    bn = m["bn"]
    if len(bn.outputs) != 1:
        return None
    eps = float(bn.attrs.get("epsilon", 1e-5))
    s = m.const("scale").astype(np.float64) / np.sqrt(m.const("var").astype(np.float64) + eps)
    shift = m.const("bias") - m.const("mean") * s
    return _fold_scale_gemm(rw, m, s.reshape(-1), np.asarray(shift, np.float64).reshape(-1))


def _fold_mul_gemm(rw: Rewriter, m: Match):
    """Gemm × per-column constant → Gemm with scaled weights."""
    n = _gemm_width(m)
    s = _column_vector(m.const("c"), n)
    if s is None:
        return None
    return _fold_scale_gemm(rw, m, s, np.zeros(n))


def _column_vector(c: np.ndarray, n: int) -> np.ndarray | None:
    if c.size == 1:
        return np.full(n, float(c.reshape(-1)[0]))
    if c.ndim <= 2 and c.shape[-1] == n and c.size == n:
        return c.reshape(-1).astype(np.float64)
    return None


def _fold_add_gemm(rw: Rewriter, m: Match):
    """Gemm + per-column constant → Gemm with a shifted bias."""
    n = _gemm_width(m)
    s = _column_vector(m.const("c"), n)
    if s is None:
        return None
    return _fold_scale_gemm(rw, m, np.ones(n), s)


def fold_rules() -> list[Rule]:
    """The fold phase's rules, in priority order."""
    conv = _conv_pattern()
    bn_in = Op("BatchNormalization", conv, Const("scale"), Const("bias"), Const("mean"), Const("var"), name="bn")
    gemm = _gemm_pattern()
    bn_gemm = Op("BatchNormalization", gemm, Const("scale"), Const("bias"), Const("mean"), Const("var"), name="bn")
    pad = Op("Pad", Var("x"), ..., name="pad")
    return [
        Rule("pad_conv_fusion", Op("Conv", pad, ..., name="conv"), fold_pad_conv),
        Rule("pad_fake_quant_conv_fusion",
             Op("Conv", Op(quant.FAKE_QUANT, pad, domain=quant.DOMAIN, name="fq"), ..., name="conv"),
             fold_pad_fake_quant_conv),
        Rule("pad_pool_fusion", Op("MaxPool|AveragePool", pad, name="pool"), fold_pad_pool),
        Rule("batchnorm_conv_fusion", bn_in, _fold_bn_conv),
        Rule("mul_conv_fusion", Op("Mul", conv, Const("c"), commutative=True), _fold_mul_conv),
        Rule("add_conv_fusion", Op("Add", conv, Const("c"), commutative=True), _fold_add_conv),
        Rule("batchnorm_gemm_fusion", bn_gemm, _fold_bn_gemm),
        Rule("mul_gemm_fusion", Op("Mul", gemm, Const("c"), commutative=True), _fold_mul_gemm),
        Rule("add_gemm_fusion", Op("Add", gemm, Const("c"), commutative=True), _fold_add_gemm),
        AnyOf("transpose_matmul_fusion", [
            Rule("t_ab", Op("MatMul", transpose("a"), transpose("b"), name="mm"), fold_transpose_matmul),
            Rule("t_a", Op("MatMul", transpose("a"), Var("b"), name="mm"), fold_transpose_matmul),
            Rule("t_b", Op("MatMul", Var("a"), transpose("b"), name="mm"), fold_transpose_matmul),
        ], "MatMul(Transpose(A), Transpose(B)) → FusedMatMul(transA, transB)"),
        AnyOf("transpose_gemm_fusion", [
            Rule("t_ab", Op("Gemm", transpose("a"), transpose("b"), ..., name="gemm"), fold_transpose_gemm),
            Rule("t_a", Op("Gemm", transpose("a"), ..., name="gemm"), fold_transpose_gemm),
            Rule("t_b", Op("Gemm", Var("a"), transpose("b"), ..., name="gemm"), fold_transpose_gemm),
        ], "Gemm(Transpose(A), Transpose(B)) → Gemm with transA/transB flipped"),
    ]
