"""Epilogue rules: bias, residual and activation fused into Conv (FusedConv) and MatMul / Gemm
(FusedMatMul) as an epilogue program the kernel applies at its store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk import fused
from ge_sdk.fused import CONV_ATTRS, DOMAIN
from ge_sdk.rewrite import AnyOf, Match, Op, Optional, Rewriter, Rule, Var

from .activations import act_pattern, activation_steps
from .common import is_float


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
    steps: list[fused.Step] = []
    extras: list[Value] = []
    ref = "y"
    if m.get("res") is not None:
        extras.append(m["res"])
        steps.append(("Add", ["y", "a0"], {}))
        ref = "t0"
    if m.get("act") is not None:
        steps.extend(activation_steps(m["act"], ref))
    return fused.dumps(steps), extras


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


def conv_epilogue_rules() -> tuple[Rule, Rule]:
    conv = Op("Conv", Var("x"), Var("w"), ..., name="conv", pred=lambda n: is_float(n.outputs[0]))
    res = Op("Add|Sum", conv, Var("res"), commutative=True, name="add")
    act = Rule("conv_activation_fusion", act_pattern(Optional(res, conv)), _fuse_conv)
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
    return rw.op("FusedMatMul", *ins, domain=DOMAIN, name="fused_matmul", epilogue=fused.dumps(steps) if steps else "",
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
        return rw.op("FusedMatMul", *ins, domain=DOMAIN, name="fused_matmul", epilogue=fused.dumps(steps),
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
                     epilogue=fused.dumps([("Add", ["y", "a0"], {})]), output_types=[inner.type], **attrs)
    if "reshape" in m:
        return _through_reshape(rw, m, fuse)
    return fuse(g.outputs[0])


def matmul_rules() -> tuple[Rule, Rule, Rule]:
    mm = Op("MatMul|FusedMatMul", Var("a"), Var("b"), ..., domain=None, name="mm",
            pred=lambda n: is_float(n.outputs[0]) and n.domain in ("", "ai.onnx", DOMAIN))
    add = Op("Add", mm, Var("bias"), commutative=True, name="add")
    matmul = AnyOf("matmul_add_fusion", [Rule("matmul_add_act", act_pattern(add), _fuse_matmul),
                                          Rule("matmul_add", add, _fuse_matmul)],
                   "MatMul + Add(bias) (+ activation) → FusedMatMul")

    def gemm() -> Op:
        return Op("Gemm", Var("a"), Var("b"), ..., name="gemm", pred=lambda n: is_float(n.outputs[0]))

    def reshaped() -> Op:
        return Op("Reshape", gemm(), Var("shape"), name="reshape")
    gemm_act = AnyOf("gemm_activation_fusion", [
        Rule("gemm_act", act_pattern(gemm()), _fuse_matmul),
        Rule("gemm_reshape_act", act_pattern(reshaped()), _fuse_gemm_reshaped_act),
    ], "Gemm + activation (also through the Reshape of its rows) → FusedMatMul")
    gemm_res = AnyOf("gemm_residual_fusion", [
        Rule("gemm_add", Op("Add", gemm(), Var("res"), commutative=True, name="add"), _fuse_gemm_residual),
        Rule("gemm_reshape_add", Op("Add", reshaped(), Var("res"), commutative=True, name="add"), _fuse_gemm_residual),
    ], "Gemm + Add(residual) (also through the Reshape of its rows) → FusedMatMul adding it at the store")
    return matmul, gemm_act, gemm_res
