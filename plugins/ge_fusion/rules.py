"""The built-in fusion patterns, declarative rules of the SDK's rewrite engine (:mod:`ge_sdk.rewrite`).

Each rule has a name the fusion switch file can turn off. They run in phases (see
:data:`PHASES`): weight folds first (so the epilogue fusions see bare convolutions), then the
recognition of decomposed activations and normalisations, attention, the Transposes around
attention's heads folded into it, and last the epilogues (bias, residual, activation) fused into
Conv and MatMul/Gemm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_core.ir.types import TensorType
from ge_sdk.rewrite import Alt, AnyOf, Const, Match, Op, Optional, Rewriter, Rule, RuleSet, Var

from . import codegen
from .ops import ATTENTION_PERMS, CONV_ATTRS, DOMAIN, attention_perm


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _near(target: float, tol: float = 1e-3):
    def pred(a: np.ndarray) -> bool:
        return a.size == 1 and abs(float(a.reshape(-1)[0]) - target) <= tol * max(1.0, abs(target))

    pred.__name__ = f"≈{target:g}"
    return pred


def _is_float(v: Value) -> bool:
    return v.type.dtype is not None and v.type.dtype.kind == "f"


def _attr(node: Node, name: str, default: Any = None) -> Any:
    v = node.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _const_of(v: Value | None) -> np.ndarray | None:
    return None if v is None else v.const_value


def _axes_of(node: Node) -> list[int] | None:
    """Reduction axes from the attribute or (opset 13/18) the second input; None if unknown."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        c = node.inputs[1].const_value
        return None if c is None else [int(a) for a in c.reshape(-1)]
    return None


def _last_axis_only(node: Node) -> bool:
    axes = _axes_of(node)
    rank = node.inputs[0].type.rank if node.inputs[0] is not None else None
    if axes is None or len(axes) != 1 or rank is None:
        return False
    return axes[0] in (-1, rank - 1) and int(_attr(node, "keepdims", 1)) == 1


def _softmax_last(node: Node) -> bool:
    x = node.inputs[0]
    rank = x.type.rank if x is not None else None
    axis = int(_attr(node, "axis", -1 if node.domain == DOMAIN else 1))
    return rank is not None and axis in (-1, rank - 1)


#: Activations an epilogue takes (op types; Silu and Gelu are this plugin's recognised ops).
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", "HardSigmoid", "Tanh", "Silu", "Gelu")


def _activation_ok(node: Node) -> bool:
    if node.op_type in ("Silu", "Gelu"):
        return node.domain == DOMAIN
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Clip":
        return all(v is None or v.const_value is not None for v in node.inputs[1:])
    return True


def activation_steps(node: Node, ref: str) -> list[codegen.Step]:
    """The program step(s) of an activation node applied to ``ref``."""
    op = node.op_type
    attrs: dict[str, Any] = {}
    if op == "Clip":
        lo: Any = None
        hi: Any = None
        if len(node.inputs) > 1:
            lo_c = _const_of(node.inputs[1])
            hi_c = _const_of(node.inputs[2]) if len(node.inputs) > 2 else None
            lo = None if lo_c is None else float(lo_c.reshape(-1)[0])
            hi = None if hi_c is None else float(hi_c.reshape(-1)[0])
        else:
            lo, hi = node.attrs.get("min"), node.attrs.get("max")
        attrs = {"min": lo, "max": hi}
    elif op == "LeakyRelu":
        attrs = {"alpha": float(node.attrs.get("alpha", 0.01))}
    elif op == "HardSigmoid":
        attrs = {"alpha": float(node.attrs.get("alpha", 0.2)), "beta": float(node.attrs.get("beta", 0.5))}
    elif op == "Gelu":
        attrs = {"approximate": _attr(node, "approximate", "none")}
    return [(op, [ref], attrs)]


def _act_pattern(inner) -> Op:
    return Op(list(ACTIVATIONS), inner, ..., domain=None, pred=_activation_ok, name="act")


# ------------------------------------------------------------------------------------------------
# folds into weights
# ------------------------------------------------------------------------------------------------
def _conv_pattern(name: str = "conv") -> Op:
    return Op("Conv", Var("x"), Const("w"), ..., name=name, pred=lambda n: _is_float(n.outputs[0]))


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
    return Op("Gemm", Var("a"), Const("b"), ..., name="gemm", pred=lambda n: _is_float(n.outputs[0]))


def _gemm_parts(gemm: Node, n_out: int):
    """(B as K×N, C as a length-N vector or None, alpha, beta) or None when not foldable."""
    b = _const_of(gemm.inputs[1])
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


def _pads_of(pad: Node) -> tuple[list[int], float] | None:
    """(pads, value) of a constant-mode Pad over all axes, or None."""
    if _attr(pad, "mode", "constant") != "constant":
        return None
    if "pads" in pad.attrs:
        pads = [int(p) for p in pad.attrs["pads"]]
        value = float(pad.attrs.get("value", 0.0))
    else:
        pc = _const_of(pad.inputs[1]) if len(pad.inputs) > 1 else None
        if pc is None:
            return None
        pads = [int(p) for p in pc.reshape(-1)]
        value = 0.0
        if len(pad.inputs) > 2 and pad.inputs[2] is not None:
            cv = pad.inputs[2].const_value
            if cv is None or cv.size != 1:
                return None
            value = float(cv.reshape(-1)[0])
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:
            return None  # explicit axes: not worth the bookkeeping
    return pads, value


def _spatial_pads(pads: list[int], rank: int) -> list[int] | None:
    if len(pads) != 2 * rank or any(p < 0 for p in pads):
        return None
    begin, end = pads[:rank], pads[rank:]
    if begin[0] or begin[1] or end[0] or end[1]:
        return None
    return begin[2:] + end[2:]


def _merged_pads(node: Node, extra: list[int]) -> list[int] | None:
    """The node's own pads plus ``extra`` (``auto_pad=VALID`` pads nothing: its own are zeros);
    None for SAME_* padding, whose amount depends on the input size."""
    auto = _attr(node, "auto_pad", "NOTSET")
    if auto not in ("NOTSET", "", "VALID"):
        return None
    own = [0] * len(extra) if auto == "VALID" else [int(p) for p in node.attrs.get("pads") or [0] * len(extra)]
    return [a + b for a, b in zip(own, extra)] if len(own) == len(extra) else None


def _fold_pad_conv(rw: Rewriter, m: Match):
    """Pad (zeros, spatial axes) → Conv: the padding becomes the convolution's own."""
    pad, conv = m["pad"], m["conv"]
    got = _pads_of(pad)
    rank = m.value("x").type.rank
    if got is None or rank is None or got[1] != 0.0:
        return None
    sp = _spatial_pads(got[0], rank)
    pads = None if sp is None else _merged_pads(conv, sp)
    if pads is None:
        return None
    attrs = {**{k: v for k, v in conv.attrs.items() if k != "auto_pad"}, "pads": pads}
    return rw.op("Conv", m.value("x"), *conv.inputs[1:], name=conv.name, **attrs)


def _fold_pad_pool(rw: Rewriter, m: Match):
    """Pad → MaxPool (pad value -inf) or AveragePool (zeros, padding counted)."""
    pad, pool = m["pad"], m["pool"]
    got = _pads_of(pad)
    rank = m.value("x").type.rank
    if got is None or rank is None:
        return None
    pads_list, value = got
    sp = _spatial_pads(pads_list, rank)
    pads = None if sp is None else _merged_pads(pool, sp)
    if pads is None or int(pool.attrs.get("ceil_mode", 0)):
        return None
    attrs = {**{k: v for k, v in pool.attrs.items() if k != "auto_pad"}, "pads": pads}
    if pool.op_type == "MaxPool":
        if not (value == -np.inf or value <= float(np.finfo(np.float32).min)) or len(pool.outputs) != 1:
            return None
    else:
        own = any(int(p) for p in pool.attrs.get("pads") or [])
        if value != 0.0 or (own and not int(pool.attrs.get("count_include_pad", 0))):
            return None
        attrs["count_include_pad"] = 1
    return rw.op(pool.op_type, m.value("x"), name=pool.name, **attrs)


def _swap_last_two(perm: Any, rank: int | None) -> bool:
    if perm is None or rank is None or rank < 2:
        return False
    perm = [int(p) for p in perm]
    want = list(range(rank - 2)) + [rank - 1, rank - 2]
    return perm == want


def _fold_transpose_matmul(rw: Rewriter, m: Match):
    """MatMul(Transpose(A), Transpose(B)) → FusedMatMul with transA/transB."""
    mm = m["mm"]
    a, b = mm.inputs
    ta = tb = 0
    assert a is not None and b is not None
    if a.producer is not None and a.producer.op_type == "Transpose" and a.producer in m.nodes and \
            _swap_last_two(a.producer.attrs.get("perm"), a.type.rank) and a.type.rank == b.type.rank:
        a, ta = a.producer.inputs[0], 1
    if b.producer is not None and b.producer.op_type == "Transpose" and b.producer in m.nodes and \
            _swap_last_two(b.producer.attrs.get("perm"), b.type.rank) and (b.type.rank == 2 or b.type.rank == mm.inputs[0].type.rank):
        b, tb = b.producer.inputs[0], 1
    if not (ta or tb):
        return None
    return rw.op("FusedMatMul", a, b, domain=DOMAIN, name=mm.name, transA=ta, transB=tb,
                 output_types=[mm.outputs[0].type])


def _fold_transpose_gemm(rw: Rewriter, m: Match):
    """Gemm(Transpose(A)) / Gemm(A, Transpose(B)) → Gemm with transA/transB flipped."""
    gemm = m["gemm"]
    ins = list(gemm.inputs)
    attrs = dict(gemm.attrs)
    changed = False
    for i, key in ((0, "transA"), (1, "transB")):
        v = ins[i]
        p = v.producer if v is not None else None
        if p is not None and p.op_type == "Transpose" and p in m.nodes and v.type.rank == 2 and \
                [int(x) for x in p.attrs.get("perm", [1, 0])] == [1, 0]:
            ins[i] = p.inputs[0]
            attrs[key] = 1 - int(attrs.get(key, 0))
            changed = True
    if not changed:
        return None
    return rw.op("Gemm", *ins, name=gemm.name, **attrs)


def _transpose(name: str) -> Op:
    return Op("Transpose", Var(name + "_in"), name=name + "_t")


# ------------------------------------------------------------------------------------------------
# recognised decompositions
# ------------------------------------------------------------------------------------------------
def _gelu_rules() -> tuple[AnyOf, AnyOf]:
    def outer(name: str, part) -> list[Rule]:
        half = Const(pred=_near(0.5))
        x = Var("x", pred=_is_float)
        forms = [
            Op("Mul", Op("Mul", x, part, commutative=True), half, commutative=True),
            Op("Mul", Op("Mul", x, half, commutative=True), part, commutative=True),
            Op("Mul", x, Op("Mul", part, half, commutative=True), commutative=True),
            Op("Div", Op("Mul", x, part, commutative=True), Const(pred=_near(2.0))),
        ]
        return [Rule(f"{name}_{i}", f, None) for i, f in enumerate(forms)]

    x = Var("x")
    scaled = Alt(Op("Div", x, Const(pred=_near(math.sqrt(2)))), Op("Mul", x, Const(pred=_near(1 / math.sqrt(2))), commutative=True))
    erf_part = Op("Add", Op("Erf", scaled), Const(pred=_near(1.0)), commutative=True)
    cube = Alt(Op("Pow", x, Const(pred=_near(3.0))), Op("Mul", Op("Mul", x, x), x, commutative=True),
               Op("Mul", x, Op("Mul", x, x), commutative=True))
    inner = Op("Add", x, Op("Mul", cube, Const(pred=_near(0.044715)), commutative=True), commutative=True)
    tanh_part = Op("Add", Op("Tanh", Op("Mul", inner, Const(pred=_near(math.sqrt(2 / math.pi))), commutative=True)),
                   Const(pred=_near(1.0)), commutative=True)

    def make(approx: str):
        def replace(rw: Rewriter, m: Match):
            return rw.op("Gelu", m.value("x"), domain=DOMAIN, name="gelu", approximate=approx)

        return replace

    erf_alts = [Rule(r.name, r.roots, make("none")) for r in outer("gelu", erf_part)]
    tanh_alts = [Rule(r.name, r.roots, make("tanh")) for r in outer("gelu_tanh", tanh_part)]
    return (AnyOf("gelu_fusion", erf_alts, "0.5·x·(1+erf(x/√2)) → Gelu"),
            AnyOf("gelu_tanh_fusion", tanh_alts, "0.5·x·(1+tanh(√(2/π)(x+0.044715x³))) → Gelu(tanh)"))


def _silu_rule() -> Rule:
    x = Var("x", pred=_is_float)
    pattern = Op("Mul", x, Op("Sigmoid", x), commutative=True)

    def replace(rw: Rewriter, m: Match):
        """x·sigmoid(x) → Silu"""
        return rw.op("Silu", m.value("x"), domain=DOMAIN, name="silu")

    return Rule("silu_fusion", pattern, replace)


def _layernorm_rule() -> AnyOf:
    x = Var("x", pred=_is_float)
    mean = Op("ReduceMean", x, ..., pred=_last_axis_only)
    d = Op("Sub", x, mean, name="sub")
    sq = Alt(Op("Pow", d, Const(pred=_near(2.0))), Op("Mul", d, d))
    var = Op("ReduceMean", sq, ..., pred=_last_axis_only)
    den = Op("Sqrt", Op("Add", var, Const("eps", scalar=True), commutative=True))
    norm = Op("Div", d, den)
    gamma = Op("Mul", norm, Const("gamma"), commutative=True)

    def replace(rw: Rewriter, m: Match):
        """(x-mean)/sqrt(var+eps)·gamma+beta → LayerNorm"""
        xv = m.value("x")
        n = xv.type.shape[-1] if xv.type.shape else None
        args: list[Value | None] = [xv]
        for key in ("gamma", "beta"):
            if key in m:
                c = m.const(key)
                if not isinstance(n, int) or c.size not in (1, n) or (c.ndim > 1 and c.shape[-1] != c.size):
                    return None
                args.append(rw.const(np.broadcast_to(c.reshape(-1), (n,)).astype(xv.type.dtype), key))
            elif key == "beta":
                pass
            else:
                args.append(rw.const(np.ones(n, xv.type.dtype), "gamma") if isinstance(n, int) else None)
        if args[1] is None:
            return None
        eps = float(m.const("eps").reshape(-1)[0])
        return rw.op("LayerNorm", *args, domain=DOMAIN, name="layernorm", epsilon=eps)

    alts = [Rule("layernorm_affine", Op("Add", gamma, Const("beta"), commutative=True), replace),
            Rule("layernorm_scale", gamma, replace), Rule("layernorm_plain", norm, replace)]
    return AnyOf("layernorm_fusion", alts, "decomposed layer normalisation → LayerNorm")


def _same_float_cast(node: Node) -> bool:
    """A Cast that keeps its input's float dtype (the exporter's no-op ``.to(input_dtype)``)."""
    x, y = node.inputs[0], node.outputs[0]
    return x is not None and _is_float(x) and y.type.dtype == x.type.dtype


def _rmsnorm_rule() -> AnyOf:
    x = Var("x", pred=_is_float)
    sq = Alt(Op("Pow", x, Const(pred=_near(2.0))), Op("Mul", x, x))
    ms = Op("ReduceMean", sq, ..., pred=_last_axis_only)
    den = Op("Sqrt", Op("Add", ms, Const("eps", scalar=True), commutative=True))
    inv = Alt(Op("Div", Const(pred=_near(1.0)), den), Op("Reciprocal", den))
    by_inv, by_div = Op("Mul", x, inv, commutative=True), Op("Div", x, den)
    norm = Alt(by_inv, by_div)
    cast = Op("Cast", norm, pred=_same_float_cast)
    gamma = Op("Mul", Alt(cast, norm), Const("gamma"), commutative=True)

    def replace(rw: Rewriter, m: Match):
        """x·(1/sqrt(mean(x²)+eps))·gamma → RMSNorm"""
        xv = m.value("x")
        n = xv.type.shape[-1] if xv.type.shape else None
        args: list[Value] = [xv]
        if "gamma" in m:
            c = m.const("gamma")
            if not isinstance(n, int) or c.size not in (1, n) or (c.ndim > 1 and c.shape[-1] != c.size) \
                    or c.ndim > (xv.type.rank or 0):
                return None
            args.append(rw.const(np.broadcast_to(c.reshape(-1), (n,)).astype(xv.type.dtype), "gamma"))
        eps = float(m.const("eps").reshape(-1)[0])
        if not eps >= 0.0:
            return None
        return rw.op("RMSNorm", *args, domain=DOMAIN, name="rmsnorm", epsilon=eps, output_types=[m.root.type])

    alts = [Rule("rmsnorm_scale", gamma, replace), Rule("rmsnorm_cast", cast, replace),
            Rule("rmsnorm_plain", by_inv, replace), Rule("rmsnorm_plain_div", by_div, replace)]
    return AnyOf("rmsnorm_fusion", alts, "root-mean-square normalisation (T5, LLaMA) → RMSNorm")


def _slice_last(node: Node) -> tuple[int, int] | None:
    """(start, end) of a Slice of the last axis with step 1 (constant starts, ends, axes), or None."""
    ins = [_const_of(v) for v in node.inputs[1:]]
    if len(ins) < 2 or any(c is None for c in ins) or any(c.size != 1 for c in ins):  # type: ignore[union-attr]
        return None
    start, end = int(ins[0].reshape(-1)[0]), int(ins[1].reshape(-1)[0])  # type: ignore[union-attr]
    rank = node.inputs[0].type.rank if node.inputs[0] is not None else None
    axis = int(ins[2].reshape(-1)[0]) if len(ins) > 2 else 0  # type: ignore[union-attr]
    if rank is None or axis not in (-1, rank - 1) or (len(ins) > 3 and int(ins[3].reshape(-1)[0]) != 1):  # type: ignore[union-attr]
        return None
    return start, end


def _rotary_rule() -> Rule:
    x = Var("x", pred=_is_float)
    lo = Op("Slice", x, ..., name="lo")
    hi = Op("Slice", x, ..., name="hi")
    rot = Op("Concat", Op("Neg", hi), lo, name="cat")
    pattern = Op("Add", Op("Mul", x, Const("cos"), commutative=True), Op("Mul", rot, Const("sin"), commutative=True),
                 commutative=True)

    def replace(rw: Rewriter, m: Match):
        """x·cos + concat(-x[..., d/2:], x[..., :d/2])·sin → Rotary"""
        xv = m.value("x")
        shape = xv.type.shape
        if not shape or not isinstance(shape[-1], int) or shape[-1] % 2:
            return None
        d = shape[-1]
        h = d // 2
        lo_se, hi_se = _slice_last(m["lo"]), _slice_last(m["hi"])
        cat = m["cat"]
        if lo_se is None or hi_se is None or lo_se[0] != 0 or lo_se[1] != h or hi_se[0] != h or hi_se[1] < d:
            return None
        if int(cat.attrs.get("axis", 0)) not in (-1, len(shape) - 1):
            return None
        cos, sin = m.const("cos"), m.const("sin")
        if cos.shape[-1:] != (d,) or sin.shape[-1:] != (d,) or cos.dtype != xv.type.dtype or sin.dtype != xv.type.dtype:
            return None
        try:
            if np.broadcast_shapes(tuple(shape), cos.shape, sin.shape) != tuple(shape):
                return None
        except (ValueError, TypeError):
            return None
        return rw.op("Rotary", xv, rw.const(cos, "cos"), rw.const(sin, "sin"), domain=DOMAIN, name="rotary",
                     output_types=[m.root.type])

    return Rule("rotary_fusion", pattern, replace)


def _softmax_rule() -> Rule:
    x = Var("x", pred=_is_float)
    shifted = Alt(Op("Sub", x, Op("ReduceMax", x, ..., pred=_last_axis_only)), x)
    e = Op("Exp", shifted, name="exp")
    pattern = Op("Div", e, Op("ReduceSum", e, ..., pred=_last_axis_only))

    def replace(rw: Rewriter, m: Match):
        """exp(x-max)/sum(exp(x-max)) → Softmax"""
        return rw.op("Softmax", m.value("x"), domain=DOMAIN, name="softmax", axis=-1)

    return Rule("softmax_fusion", pattern, replace)


def _static_dims(shape: Sequence | None) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _expands_groups(node: Node) -> bool:
    """Expand of (b, kv_heads, 1, n, d) along axis 2 only: (b, kv_heads, groups, n, d)."""
    x, y = node.inputs[0], node.outputs[0]
    si, so = (x.type.shape if x is not None else None), y.type.shape
    if si is None or so is None or len(si) != 5 or len(so) != 5 or si[2] != 1 or not isinstance(so[2], int):
        return False
    return all(si[i] == so[i] and si[i] is not None for i in (0, 1, 3, 4))


def _merges_groups(node: Node) -> bool:
    """Reshape of (b, kv_heads, groups, n, d) to (b, kv_heads·groups, n, d): repeat_kv's last step."""
    x, y = node.inputs[0], node.outputs[0]
    si, so = (x.type.shape if x is not None else None), y.type.shape
    if si is None or so is None or len(si) != 5 or len(so) != 4 or not isinstance(si[1], int) or \
            not isinstance(si[2], int):
        return False
    return so[1] == si[1] * si[2] and all(so[i] == si[j] and so[i] is not None for i, j in ((0, 0), (2, 3), (3, 4)))


def _repeat_kv(name: str) -> Op:
    """transformers' repeat_kv of grouped-query attention, exported as Unsqueeze(2) → Expand →
    Reshape: every key/value head repeated for the query heads of its group. ``<name>_kv`` binds
    the (b, kv_heads, 1, n, d) that Expand repeats (an Unsqueeze's, or a Reshape's where the
    optimiser merged one key/value head's Transpose and Unsqueeze into it); it stays."""
    expand = Op("Expand", Var(name + "_kv", pred=_is_float), Const(), name=name + "_expand", pred=_expands_groups)
    return Op("Reshape", expand, Const(), pred=_merges_groups, name=name + "_repeat")


def _swaps_last_two(node: Node) -> bool:
    return _swap_last_two(node.attrs.get("perm"), node.inputs[0].type.rank if node.inputs[0] is not None else None)


def _plain_trans_b(node: Node) -> bool:
    """A FusedMatMul that is only A·Bᵀ (the transpose fold's, no alpha, bias or epilogue)."""
    a = node.attrs
    return (int(a.get("transB", 0)) == 1 and int(a.get("transA", 0)) == 0 and float(a.get("alpha", 1.0)) == 1.0
            and not a.get("epilogue") and (len(node.inputs) == 2 or all(v is None for v in node.inputs[2:])))


def _attention_rule() -> Rule:
    q = Var("q", pred=_is_float)
    scores = Alt(
        Op("MatMul", q, Op("Transpose", _repeat_kv("k"), pred=_swaps_last_two), name="qk"),
        Op("MatMul", q, Var("kt"), name="qk"),
        # the transpose fold (phase "fold") made Q·Kᵀ a FusedMatMul(transB=1)
        Op("FusedMatMul", q, Alt(_repeat_kv("k"), Var("k")), domain=DOMAIN, pred=_plain_trans_b, name="qk"))
    scaled = Alt(Op("Div", scores, Const("s", scalar=True)), Op("Mul", scores, Const("s", scalar=True), commutative=True),
                 scores, name="scale_kind")
    masked = Optional(Op("Add", scaled, Var("mask"), commutative=True), scaled)
    probs = Op("Softmax", masked, domain=None, pred=lambda n: n.domain in ("", "ai.onnx", DOMAIN) and _softmax_last(n))
    pattern = Op("MatMul", probs, Alt(_repeat_kv("v"), Var("v")), name="pv")

    def replace(rw: Rewriter, m: Match):
        """softmax(Q·Kᵀ·scale + mask)·V → Attention (grouped-query: over (b, kv_heads, groups, m, d))"""
        kind = m["scale_kind"]
        s = 1.0 if kind == 2 else float(m.const("s").reshape(-1)[0])
        scale = 1.0 / s if kind == 0 else s
        q = m.value("q")
        if "k_kv" in m or "v_kv" in m:
            return _grouped_attention(rw, m, q, scale)
        if "kt" in m:
            kt = m.value("kt")
        else:
            k = m.value("k")
            if k.type.rank is None or k.type.rank < 2:
                return None
            perm = list(range(k.type.rank - 2)) + [k.type.rank - 1, k.type.rank - 2]
            kt = rw.op("Transpose", k, name="attention_kt", perm=perm)
        v = m.value("v")
        if q.type.rank is None or q.type.rank < 2 or kt.type.rank != q.type.rank or v.type.rank != q.type.rank:
            return None
        ins = [q, kt, v] + ([m.value("mask")] if "mask" in m else [])
        return rw.op("Attention", *ins, domain=DOMAIN, name="attention", scale=scale,
                     output_types=[m.root.type])

    return Rule("attention_fusion", pattern, replace)


def _grouped_attention(rw: Rewriter, m: Match, q: Value, scale: float) -> Value | None:
    """Grouped-query attention without repeat_kv's copies: Q as (b, kv_heads, groups, m, d)
    against K and V as (b, kv_heads, 1, n, d), which the Attention kernel broadcasts."""
    groups = {(int(m[f"{t}_expand"].outputs[0].type.shape[1]), int(m[f"{t}_expand"].outputs[0].type.shape[2]))
              for t in ("k", "v") if f"{t}_kv" in m}
    if len(groups) != 1:
        return None
    (kvh, g), = groups
    h = kvh * g
    qs, out = q.type.shape, m.root.type
    if qs is None or len(qs) != 4 or qs[1] != h or not isinstance(qs[3], int) or out.shape is None \
            or len(out.shape) != 4 or not isinstance(out.shape[3], int):
        return None
    d, dv = qs[3], out.shape[3]

    def reshape(x: Value, shape: list[int], name: str) -> Value:
        return rw.op("Reshape", x, rw.const(np.array(shape, np.int64), name + "_shape"), name=name)

    q5 = reshape(q, [0, kvh, g, -1, d], "attention_q")
    if "k_kv" in m:
        kt5 = rw.op("Transpose", m.value("k_kv"), name="attention_kt", perm=[0, 1, 2, 4, 3])
    elif "kt" in m:
        kt5 = reshape(m.value("kt"), [0, kvh, g, d, -1], "attention_kt")
    else:
        k5 = reshape(m.value("k"), [0, kvh, g, -1, d], "attention_k")
        kt5 = rw.op("Transpose", k5, name="attention_kt", perm=[0, 1, 2, 4, 3])
    if "v_kv" in m:
        v5 = m.value("v_kv")
    else:
        v5 = reshape(m.value("v"), [0, kvh, g, -1, dv], "attention_v")
    ins = [q5, kt5, v5]
    if "mask" in m:
        mask = m.value("mask")
        ms = mask.type.shape
        if ms is None or len(ms) > 4:
            return None
        if len(ms) >= 3 and not all(e == 1 for e in ms[:-2]):  # the heads axis splits into (kv_heads, groups)
            if not _static_dims(ms) or ms[-3] not in (1, h):
                return None
            shape = list(ms[:-3]) + ([kvh, g] if ms[-3] == h else [1, 1]) + list(ms[-2:])
            c = mask.const_value
            mask = rw.const(c.reshape(shape), "attention_mask") if c is not None else \
                reshape(mask, shape, "attention_mask")
        ins.append(mask)
    for x in (kt5, v5):
        if x.type.rank != 5:
            return None
    qt = q5.type
    att = rw.op("Attention", *ins, domain=DOMAIN, name="attention", scale=scale,
                output_types=[TensorType(qt.dtype, None if qt.shape is None else tuple(qt.shape[:-1]) + (dv,))])
    return rw.op("Reshape", att, rw.const(np.array([0, h, -1, dv], np.int64), "attention_out_shape"),
                 name="attention_heads", output_types=[out])


def _perm_attr(node: Node, name: str, rank: int) -> list[int]:
    """An Attention node's permutation ``name`` as a full list (the identity when absent)."""
    try:
        p = attention_perm(node, name, rank)
    except ValueError:
        return list(range(rank))
    return list(range(rank)) if p is None else p


def _transpose_perm(v: Value | None) -> list[int] | None:
    """The perm of the Transpose that makes ``v`` (None when ``v`` is not a Transpose's output or
    its perm is not a full permutation)."""
    node = v.producer if v is not None else None
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    x = node.inputs[0]
    rank = x.type.rank if x is not None else None
    if rank is None:
        return None
    perm = node.attrs.get("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    return perm if sorted(perm) == list(range(rank)) else None


def _attention_copy(rw: Rewriter, att: Node, ins: list[Value | None], perms: dict[str, list[int]], out_type) -> Value:
    attrs = {k: v for k, v in att.attrs.items() if k not in (*ATTENTION_PERMS, "perm_out")}
    for name, p in perms.items():
        if p != list(range(len(p))):
            attrs[name] = p
    return rw.op("Attention", *ins, domain=DOMAIN, name=att.name, output_types=[out_type], **attrs)


def _fold_attention_inputs(rw: Rewriter, m: Match):
    """Attention(Transpose(X), ...) → Attention(X, ...) reading X's strided view (perm_q/kt/v)."""
    att = m["att"]
    ins = list(att.inputs)
    perms: dict[str, list[int]] = {}
    folded = False
    for i, name in enumerate(ATTENTION_PERMS):
        x = ins[i]
        rank = x.type.rank if x is not None else None
        if rank is None:
            return None
        p = _perm_attr(att, name, rank)
        t = _transpose_perm(x)
        if t is not None and x is not None and x.producer is not None:
            ins[i] = x.producer.inputs[0]
            p = [t[j] for j in p]  # transpose(transpose(X, t), p) = transpose(X, t∘p)
            folded = True
        perms[name] = p
    if not folded:
        return None
    out = att.outputs[0]
    perms["perm_out"] = _perm_attr(att, "perm_out", out.type.rank or 0)
    return _attention_copy(rw, att, ins, perms, out.type)


def _has_transposed_input(node: Node) -> bool:
    return any(_transpose_perm(x) is not None for x in node.inputs[:3])


def _fold_attention_output(rw: Rewriter, m: Match):
    """Transpose(Attention(...)) → Attention(..., perm_out): the kernel writes the transposed
    result straight into its output (through a strided view)."""
    att, t = m["att"], m["t"]
    out = att.outputs[0]
    rank = out.type.rank
    perm = _transpose_perm(t.outputs[0])
    if rank is None or perm is None:
        return None
    po = _perm_attr(att, "perm_out", rank)
    perms = {name: _perm_attr(att, name, x.type.rank or 0) for name, x in zip(ATTENTION_PERMS, att.inputs)
             if x is not None}
    perms["perm_out"] = [po[j] for j in perm]
    return _attention_copy(rw, att, list(att.inputs), perms, t.outputs[0].type)


def _maybe_transposed(name: str) -> Alt:
    """An Attention operand, through a Transpose where there is one (in the match, so it goes
    when the Attention was its only reader)."""
    return Alt(Op("Transpose", Var(name + "_x"), name=name + "_t", shared=True), Var(name))


def _attention_layout_rule() -> AnyOf:
    att = Op("Attention", domain=DOMAIN, name="att")
    operands = Op("Attention", _maybe_transposed("q"), _maybe_transposed("kt"), _maybe_transposed("v"), ...,
                  domain=DOMAIN, name="att", pred=_has_transposed_input)
    return AnyOf("attention_layout_fusion", [
        Rule("attention_out", Op("Transpose", att, name="t"), _fold_attention_output),
        Rule("attention_in", operands, _fold_attention_inputs),
    ], "Transposes around the heads (Q, Kᵀ, V in, the output back) → Attention reading and writing strided views")


# ------------------------------------------------------------------------------------------------
# ONNX ops that this plugin's kernels run faster (one compiled pass per row)
# ------------------------------------------------------------------------------------------------
def _float32_or_64(v: Value) -> bool:
    return v.type.dtype is not None and v.type.dtype.name in ("float32", "float64")


def _onnx_softmax_rule() -> Rule:
    x = Var("x", pred=_float32_or_64)

    def replace(rw: Rewriter, m: Match):
        """Softmax over the last axis → this plugin's Softmax (a compiled row kernel)"""
        return rw.op("Softmax", m.value("x"), domain=DOMAIN, name="softmax", axis=-1)

    return Rule("softmax_kernel", Op("Softmax", x, pred=_softmax_last), replace)


def _layernorm_last(node: Node) -> bool:
    x, g = node.inputs[0], node.graph
    if x is None or g is None or x.type.rank is None:
        return False
    if int(_attr(node, "axis", -1)) not in (-1, x.type.rank - 1) or int(_attr(node, "stash_type", 1)) != 1:
        return False
    # Mean and InvStdDev, when asked for, are not computed by the fused kernel
    if any(o is not None and (o.has_uses() or o in g.outputs) for o in node.outputs[1:]):
        return False
    d = x.type.shape[-1] if x.type.shape else None
    for p in node.inputs[1:3]:
        if p is None:
            continue
        sh = p.type.shape
        if sh is None or p.type.dtype != x.type.dtype or not isinstance(d, int) \
                or not all(isinstance(k, int) for k in sh) or math.prod(sh) != d or (len(sh) and sh[-1] != d):  # type: ignore[arg-type]
            return False
    return True


def _onnx_layernorm_rule() -> Rule:
    x = Var("x", pred=_float32_or_64)
    pattern = Op("LayerNormalization", x, ..., name="ln", pred=_layernorm_last)

    def replace(rw: Rewriter, m: Match):
        """LayerNormalization over the last axis → this plugin's LayerNorm (a compiled row kernel)"""
        node = m["ln"]
        ins = [v for v in node.inputs[:3]]
        while ins and ins[-1] is None:
            ins.pop()
        return rw.op("LayerNorm", *ins, domain=DOMAIN, name="layernorm",
                     epsilon=float(_attr(node, "epsilon", 1e-5)), output_types=[node.outputs[0].type])

    return Rule("layernorm_kernel", pattern, replace)


# ------------------------------------------------------------------------------------------------
# epilogues: bias, residual and activation fused into Conv / MatMul / Gemm
# ------------------------------------------------------------------------------------------------
def _residual_ok(m: Match, anchor: str) -> bool:
    res = m.get("res")
    node = m[anchor]
    if res is None:
        return True
    if res.producer is node:
        return False
    out = node.outputs[0].type
    return res.type.shape is not None and out.shape is not None and _broadcasts_into(res.type.shape, out.shape) \
        and res.type.dtype == out.dtype


def _broadcasts_into(small: Sequence, big: Sequence) -> bool:
    if len(small) > len(big):
        return False
    for a, b in zip(reversed(list(small)), reversed(list(big))):
        if not (a == 1 or a == b):
            return False
    return True


def _epilogue(m: Match) -> tuple[str, list[Value]]:
    steps: list[codegen.Step] = []
    extras: list[Value] = []
    ref = "y"
    if m.get("res") is not None:
        extras.append(m["res"])
        steps.append(("Add", ["y", "a0"], {}))
        ref = "t0"
    if m.get("act") is not None:
        steps.extend(activation_steps(m["act"], ref))
    return codegen.dumps(steps), extras


def _fuse_conv(rw: Rewriter, m: Match):
    """Conv (+ residual Add) (+ activation) → FusedConv"""
    if not _residual_ok(m, "conv"):
        return None
    conv = m["conv"]
    program, extras = _epilogue(m)
    ins = list(conv.inputs) + [None] * (3 - len(conv.inputs))
    attrs = {k: v for k, v in conv.attrs.items() if k in CONV_ATTRS}
    return rw.op("FusedConv", *ins, *extras, domain=DOMAIN, name=conv.name, epilogue=program,
                 output_types=[m.root.type], **attrs)


def _conv_epilogue_rules() -> tuple[Rule, Rule]:
    conv = Op("Conv", Var("x"), Var("w"), ..., name="conv", pred=lambda n: _is_float(n.outputs[0]))
    res = Op("Add|Sum", conv, Var("res"), commutative=True, name="add")
    act = Rule("conv_activation_fusion", _act_pattern(Optional(res, conv)), _fuse_conv)
    add = Rule("conv_residual_fusion", res, _fuse_conv)
    return act, add


def _gemm_operands(g: Node) -> tuple[list[Value | None], dict[str, Any]]:
    """A Gemm's A, B and C (None where absent) and the attributes FusedMatMul takes from it."""
    ins = (list(g.inputs) + [None] * 3)[:3]
    return ins, {k: g.attrs[k] for k in ("transA", "transB", "alpha", "beta") if k in g.attrs}


def _fuse_matmul(rw: Rewriter, m: Match):
    """MatMul + Add(bias) (+ activation), Gemm + activation → FusedMatMul"""
    if "gemm" in m:
        g = m["gemm"]
        if g.inputs[0].type.rank != 2:
            return None
        ins, attrs = _gemm_operands(g)
    else:
        mm = m["mm"]
        out = mm.outputs[0].type
        bias = m.value("bias")
        if bias.type.shape is None or out.shape is None or not _broadcasts_into(bias.type.shape, out.shape) or \
                bias.type.dtype != out.dtype or bias.producer is mm:
            return None
        ins = [mm.inputs[0], mm.inputs[1], bias]
        attrs = {k: mm.attrs[k] for k in ("transA", "transB") if k in mm.attrs} if mm.domain == DOMAIN else {}
        if mm.domain == DOMAIN and (mm.attrs.get("epilogue") or len(mm.inputs) > 2):
            return None
    steps = activation_steps(m["act"], "y") if m.get("act") is not None else []
    return rw.op("FusedMatMul", *ins, domain=DOMAIN, name="fused_matmul", epilogue=codegen.dumps(steps) if steps else "",
                 output_types=[m.root.type], **attrs)


def _through_reshape(rw: Rewriter, m: Match, fuse) -> Value | None:
    """``fuse``'s FusedMatMul for the 2-D product under the match's Reshape, reshaped back: the
    activation or residual an exporter writes after flattening a Linear's rows (GPT-2's Conv1D:
    Gemm, Reshape, then Gelu or the residual Add) goes to the GEMM's store all the same."""
    r = m["reshape"]
    inner = r.inputs[0]
    out = r.outputs[0].type
    if inner is None or inner.type.shape is None or out.shape is None or not inner.type.is_static or not out.is_static:
        return None
    y = fuse(inner)
    if y is None:
        return None
    return rw.op("Reshape", y, r.inputs[1], name=r.name, output_types=[out])


def _fuse_gemm_reshaped_act(rw: Rewriter, m: Match):
    """Activation(Reshape(Gemm)) → Reshape(FusedMatMul with the activation at its store)"""
    g = m["gemm"]
    if g.inputs[0].type.rank != 2:
        return None

    def fuse(inner: Value) -> Value:
        ins, attrs = _gemm_operands(g)
        steps = activation_steps(m["act"], "y")
        return rw.op("FusedMatMul", *ins, domain=DOMAIN, name="fused_matmul", epilogue=codegen.dumps(steps),
                     output_types=[inner.type], **attrs)
    return _through_reshape(rw, m, fuse)


def _fuse_gemm_residual(rw: Rewriter, m: Match):
    """Add(Gemm, R) and Add(Reshape(Gemm), R) (R of the sum's own shape: a residual) →
    FusedMatMul adding R at its store (R seen in the product's 2-D shape, a view)"""
    g, add = m["gemm"], m["add"]
    res = m.value("res")
    total = add.outputs[0].type
    if g.inputs[0].type.rank != 2 or res.type.shape is None or total.shape is None or not total.is_static \
            or tuple(res.type.shape) != tuple(total.shape) or res.type.dtype != total.dtype:
        return None

    def fuse(inner: Value) -> Value:
        shape = tuple(inner.type.shape or ())  # (static: checked by the caller)
        r2 = res if tuple(res.type.shape or ()) == shape else \
            rw.op("Reshape", res, rw.const(np.array(shape, np.int64), "residual_shape"), name="residual_2d")
        ins, attrs = _gemm_operands(g)
        return rw.op("FusedMatMul", *ins, r2, domain=DOMAIN, name="fused_matmul",
                     epilogue=codegen.dumps([("Add", ["y", "a0"], {})]), output_types=[inner.type], **attrs)
    if "reshape" in m:
        return _through_reshape(rw, m, fuse)
    return fuse(g.outputs[0])


def _matmul_rules() -> tuple[Rule, Rule, Rule]:
    mm = Op("MatMul|FusedMatMul", Var("a"), Var("b"), ..., domain=None, name="mm",
            pred=lambda n: _is_float(n.outputs[0]) and n.domain in ("", "ai.onnx", DOMAIN))
    add = Op("Add", mm, Var("bias"), commutative=True, name="add")
    matmul = AnyOf("matmul_add_fusion", [Rule("matmul_add_act", _act_pattern(add), _fuse_matmul),
                                          Rule("matmul_add", add, _fuse_matmul)],
                   "MatMul + Add(bias) (+ activation) → FusedMatMul")

    def gemm() -> Op:
        return Op("Gemm", Var("a"), Var("b"), ..., name="gemm", pred=lambda n: _is_float(n.outputs[0]))

    def reshaped() -> Op:
        return Op("Reshape", gemm(), Var("shape"), name="reshape")
    gemm_act = AnyOf("gemm_activation_fusion", [
        Rule("gemm_act", _act_pattern(gemm()), _fuse_matmul),
        Rule("gemm_reshape_act", _act_pattern(reshaped()), _fuse_gemm_reshaped_act),
    ], "Gemm + activation (also through the Reshape of its rows) → FusedMatMul")
    gemm_res = AnyOf("gemm_residual_fusion", [
        Rule("gemm_add", Op("Add", gemm(), Var("res"), commutative=True, name="add"), _fuse_gemm_residual),
        Rule("gemm_reshape_add", Op("Add", reshaped(), Var("res"), commutative=True, name="add"), _fuse_gemm_residual),
    ], "Gemm + Add(residual) (also through the Reshape of its rows) → FusedMatMul adding it at the store")
    return matmul, gemm_act, gemm_res


# ------------------------------------------------------------------------------------------------
def _build() -> list[tuple[str, list[Rule]]]:
    conv = _conv_pattern()
    bn_in = Op("BatchNormalization", conv, Const("scale"), Const("bias"), Const("mean"), Const("var"), name="bn")
    gemm = _gemm_pattern()
    bn_gemm = Op("BatchNormalization", gemm, Const("scale"), Const("bias"), Const("mean"), Const("var"), name="bn")
    pad = Op("Pad", Var("x"), ..., name="pad")
    folds = [
        Rule("pad_conv_fusion", Op("Conv", pad, ..., name="conv"), _fold_pad_conv),
        Rule("pad_pool_fusion", Op("MaxPool|AveragePool", pad, name="pool"), _fold_pad_pool),
        Rule("batchnorm_conv_fusion", bn_in, _fold_bn_conv),
        Rule("mul_conv_fusion", Op("Mul", conv, Const("c"), commutative=True), _fold_mul_conv),
        Rule("add_conv_fusion", Op("Add", conv, Const("c"), commutative=True), _fold_add_conv),
        Rule("batchnorm_gemm_fusion", bn_gemm, _fold_bn_gemm),
        Rule("mul_gemm_fusion", Op("Mul", gemm, Const("c"), commutative=True), _fold_mul_gemm),
        Rule("add_gemm_fusion", Op("Add", gemm, Const("c"), commutative=True), _fold_add_gemm),
        AnyOf("transpose_matmul_fusion", [
            Rule("t_ab", Op("MatMul", _transpose("a"), _transpose("b"), name="mm"), _fold_transpose_matmul),
            Rule("t_a", Op("MatMul", _transpose("a"), Var("b"), name="mm"), _fold_transpose_matmul),
            Rule("t_b", Op("MatMul", Var("a"), _transpose("b"), name="mm"), _fold_transpose_matmul),
        ], "MatMul(Transpose(A), Transpose(B)) → FusedMatMul(transA, transB)"),
        AnyOf("transpose_gemm_fusion", [
            Rule("t_ab", Op("Gemm", _transpose("a"), _transpose("b"), ..., name="gemm"), _fold_transpose_gemm),
            Rule("t_a", Op("Gemm", _transpose("a"), ..., name="gemm"), _fold_transpose_gemm),
            Rule("t_b", Op("Gemm", Var("a"), _transpose("b"), ..., name="gemm"), _fold_transpose_gemm),
        ], "Gemm(Transpose(A), Transpose(B)) → Gemm with transA/transB flipped"),
    ]
    gelu, gelu_tanh = _gelu_rules()
    recognise = [gelu, gelu_tanh, _silu_rule(), _layernorm_rule(), _rmsnorm_rule(), _softmax_rule(), _rotary_rule()]
    conv_act, conv_res = _conv_epilogue_rules()
    matmul, gemm_act, gemm_res = _matmul_rules()
    return [("fold", folds), ("recognise", recognise), ("attention", [_attention_rule()]),
            ("layout", [_attention_layout_rule()]),
            ("epilogue", [conv_act, conv_res, matmul, gemm_act, gemm_res]),
            ("kernels", [_onnx_softmax_rule(), _onnx_layernorm_rule()])]


#: (phase, rules) in the order they run.
PHASES: list[tuple[str, list[Rule]]] = _build()

#: The phases as rule sets (rule priority within a phase), applied one after the other by the
#: driver to the graph and every If/Loop/Scan body in it.
RULE_SETS: list[RuleSet] = [RuleSet(rules, name=phase) for phase, rules in PHASES]

#: Every built-in rule by name.
RULES: dict[str, Rule] = {r.name: r for _, rules in PHASES for r in rules}
