"""Activation rules: the activations an epilogue takes (and their program steps), and the
recognition of decomposed GELU (erf and tanh forms), SiLU and rotary position embeddings."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ge_core.ir.graph import Node
from ge_sdk import fused
from ge_sdk.fused import DOMAIN
from ge_sdk.rewrite import Alt, AnyOf, Const, Match, Op, Rewriter, Rule, Var, attr_of, const_of

from .common import is_float, near

#: Activations an epilogue takes (op types; Silu and Gelu are this plugin's recognised ops).
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", "HardSigmoid", "Tanh", "Silu", "Gelu")


def activation_ok(node: Node) -> bool:
    """An activation an epilogue program can spell (constant Clip bounds)."""
    if node.op_type in ("Silu", "Gelu"):
        return node.domain == DOMAIN
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Clip":
        return all(v is None or v.const_value is not None for v in node.inputs[1:])
    return True


def activation_steps(node: Node, ref: str) -> list[fused.Step]:
    """The program step(s) of an activation node applied to ``ref``."""
    op = node.op_type
    attrs: dict[str, Any] = {}
    if op == "Clip":
        lo: Any = None
        hi: Any = None
        if len(node.inputs) > 1:
            lo_c = const_of(node.inputs[1])
            hi_c = const_of(node.inputs[2]) if len(node.inputs) > 2 else None
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
        attrs = {"approximate": attr_of(node, "approximate", "none")}
    return [(op, [ref], attrs)]


def act_pattern(inner) -> Op:
    """Any activation of :data:`ACTIVATIONS` over ``inner`` (bound as ``act``)."""
    return Op(list(ACTIVATIONS), inner, ..., domain=None, pred=activation_ok, name="act")

def gelu_rules() -> tuple[AnyOf, AnyOf]:
    def outer(name: str, part) -> list[Rule]:
        half = Const(pred=near(0.5))
        x = Var("x", pred=is_float)
        forms = [
            Op("Mul", Op("Mul", x, part, commutative=True), half, commutative=True),
            Op("Mul", Op("Mul", x, half, commutative=True), part, commutative=True),
            Op("Mul", x, Op("Mul", part, half, commutative=True), commutative=True),
            Op("Div", Op("Mul", x, part, commutative=True), Const(pred=near(2.0))),
        ]
        return [Rule(f"{name}_{i}", f, None) for i, f in enumerate(forms)]

    x = Var("x")
    scaled = Alt(Op("Div", x, Const(pred=near(math.sqrt(2)))), Op("Mul", x, Const(pred=near(1 / math.sqrt(2))), commutative=True))
    erf_part = Op("Add", Op("Erf", scaled), Const(pred=near(1.0)), commutative=True)
    cube = Alt(Op("Pow", x, Const(pred=near(3.0))), Op("Mul", Op("Mul", x, x), x, commutative=True),
               Op("Mul", x, Op("Mul", x, x), commutative=True))
    inner = Op("Add", x, Op("Mul", cube, Const(pred=near(0.044715)), commutative=True), commutative=True)
    tanh_part = Op("Add", Op("Tanh", Op("Mul", inner, Const(pred=near(math.sqrt(2 / math.pi))), commutative=True)),
                   Const(pred=near(1.0)), commutative=True)

    def make(approx: str):
        def replace(rw: Rewriter, m: Match):
            return rw.op("Gelu", m.value("x"), domain=DOMAIN, name="gelu", approximate=approx)

        return replace

    erf_alts = [Rule(r.name, r.roots, make("none")) for r in outer("gelu", erf_part)]
    tanh_alts = [Rule(r.name, r.roots, make("tanh")) for r in outer("gelu_tanh", tanh_part)]
    return (AnyOf("gelu_fusion", erf_alts, "0.5·x·(1+erf(x/√2)) → Gelu"),
            AnyOf("gelu_tanh_fusion", tanh_alts, "0.5·x·(1+tanh(√(2/π)(x+0.044715x³))) → Gelu(tanh)"))


def silu_rule() -> Rule:
    x = Var("x", pred=is_float)
    pattern = Op("Mul", x, Op("Sigmoid", x), commutative=True)

    def replace(rw: Rewriter, m: Match):
        """x·sigmoid(x) → Silu"""
        return rw.op("Silu", m.value("x"), domain=DOMAIN, name="silu")

    return Rule("silu_fusion", pattern, replace)

def _slice_last(node: Node) -> tuple[int, int] | None:
    """(start, end) of a Slice of the last axis with step 1 (constant starts, ends, axes), or None."""
    ins = [const_of(v) for v in node.inputs[1:]]
    if len(ins) < 2 or any(c is None for c in ins) or any(c.size != 1 for c in ins):  # type: ignore[union-attr]
        return None
    start, end = int(ins[0].reshape(-1)[0]), int(ins[1].reshape(-1)[0])  # type: ignore[union-attr]
    rank = node.inputs[0].type.rank if node.inputs[0] is not None else None
    axis = int(ins[2].reshape(-1)[0]) if len(ins) > 2 else 0  # type: ignore[union-attr]
    if rank is None or axis not in (-1, rank - 1) or (len(ins) > 3 and int(ins[3].reshape(-1)[0]) != 1):  # type: ignore[union-attr]
        return None
    return start, end


def rotary_rule() -> Rule:
    x = Var("x", pred=is_float)
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
