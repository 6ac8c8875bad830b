"""Normalisation rules: decomposed LayerNorm, RMSNorm and Softmax recognised, and ONNX's own
Softmax and LayerNormalization over the last axis handed to the fused ops (one compiled pass per
row in the cpu backend)."""

from __future__ import annotations

import math

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk.fused import DOMAIN
from ge_sdk.rewrite import Alt, AnyOf, Const, Match, Op, Rewriter, Rule, Var, attr_of

from .common import float32_or_64, is_float, last_axis_only, near, softmax_last


def layernorm_rule() -> AnyOf:
    x = Var("x", pred=is_float)
    mean = Op("ReduceMean", x, ..., pred=last_axis_only)
    d = Op("Sub", x, mean, name="sub")
    sq = Alt(Op("Pow", d, Const(pred=near(2.0))), Op("Mul", d, d))
    var = Op("ReduceMean", sq, ..., pred=last_axis_only)
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
    return x is not None and is_float(x) and y.type.dtype == x.type.dtype


def rmsnorm_rule() -> AnyOf:
    x = Var("x", pred=is_float)
    sq = Alt(Op("Pow", x, Const(pred=near(2.0))), Op("Mul", x, x))
    ms = Op("ReduceMean", sq, ..., pred=last_axis_only)
    den = Op("Sqrt", Op("Add", ms, Const("eps", scalar=True), commutative=True))
    inv = Alt(Op("Div", Const(pred=near(1.0)), den), Op("Reciprocal", den))
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

def softmax_rule() -> Rule:
    x = Var("x", pred=is_float)
    shifted = Alt(Op("Sub", x, Op("ReduceMax", x, ..., pred=last_axis_only)), x)
    e = Op("Exp", shifted, name="exp")
    pattern = Op("Div", e, Op("ReduceSum", e, ..., pred=last_axis_only))

    def replace(rw: Rewriter, m: Match):
        """exp(x-max)/sum(exp(x-max)) → Softmax"""
        return rw.op("Softmax", m.value("x"), domain=DOMAIN, name="softmax", axis=-1)

    return Rule("softmax_fusion", pattern, replace)

def onnx_softmax_rule() -> Rule:
    x = Var("x", pred=float32_or_64)

    def replace(rw: Rewriter, m: Match):
        """Softmax over the last axis → this plugin's Softmax (a compiled row kernel)"""
        return rw.op("Softmax", m.value("x"), domain=DOMAIN, name="softmax", axis=-1)

    return Rule("softmax_kernel", Op("Softmax", x, pred=softmax_last), replace)


def _layernorm_last(node: Node) -> bool:
    x, g = node.inputs[0], node.graph
    if x is None or g is None or x.type.rank is None:
        return False
    if int(attr_of(node, "axis", -1)) not in (-1, x.type.rank - 1) or int(attr_of(node, "stash_type", 1)) != 1:
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


def onnx_layernorm_rule() -> Rule:
    x = Var("x", pred=float32_or_64)
    pattern = Op("LayerNormalization", x, ..., name="ln", pred=_layernorm_last)

    def replace(rw: Rewriter, m: Match):
        """LayerNormalization over the last axis → this plugin's LayerNorm (a compiled row kernel)"""
        node = m["ln"]
        ins = [v for v in node.inputs[:3]]
        while ins and ins[-1] is None:
            ins.pop()
        return rw.op("LayerNorm", *ins, domain=DOMAIN, name="layernorm",
                     epsilon=float(attr_of(node, "epsilon", 1e-5)), output_types=[node.outputs[0].type])

    return Rule("layernorm_kernel", pattern, replace)
