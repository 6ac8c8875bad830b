"""Attention rules: softmax(Q·Kᵀ·scale + mask)·V recognised (grouped-query attention without
repeat_kv's copies; in a quantised model through the fake-quants of its scores and probabilities,
which become the op's ``*_quant`` attributes), then the Transposes around the heads folded into the
Attention op's layout attributes (a fake-quant between moved before them) and the output's
fake-quant into ``out_quant``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_core.ir.types import TensorType
from ge_sdk.fused import ATTENTION_PERMS, ATTENTION_QUANTS, DOMAIN, attention_perm, attention_quant
from ge_sdk.quant import DOMAIN as QUANT_DOMAIN
from ge_sdk.quant import FAKE_QUANT, fake_quant_params
from ge_sdk.rewrite import Alt, AnyOf, Const, Match, Op, Optional, Rewriter, Rule, Var

from .common import is_float, softmax_last, swap_last_two


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
    expand = Op("Expand", Var(name + "_kv", pred=is_float), Const(), name=name + "_expand", pred=_expands_groups)
    return Op("Reshape", expand, Const(), pred=_merges_groups, name=name + "_repeat")


def _swaps_last_two(node: Node) -> bool:
    return swap_last_two(node.attrs.get("perm"), node.inputs[0].type.rank if node.inputs[0] is not None else None)


def _plain_trans_b(node: Node) -> bool:
    """A FusedMatMul that is only A·Bᵀ (the transpose fold's, no alpha, bias or epilogue)."""
    a = node.attrs
    return (int(a.get("transB", 0)) == 1 and int(a.get("transA", 0)) == 0 and float(a.get("alpha", 1.0)) == 1.0
            and not a.get("epilogue") and (len(node.inputs) == 2 or all(v is None for v in node.inputs[2:])))


def _fake_quant(x: Any, name: str) -> Alt:
    """``x`` or a quantised model's fake-quant of it (bound to ``name``: an Attention attribute)."""
    return Optional(Op(FAKE_QUANT, x, domain=QUANT_DOMAIN, name=name), x)


def _quant_attr(node: Node | None) -> list[float] | None:
    """A FakeQuant node as the Attention op's ``[scale, lo, hi]`` (None: not one)."""
    p = fake_quant_params(node)
    return None if p is None else [p[0], float(p[2] - p[1]), float(p[3] - p[1])]


def _quant_attrs(m: Match) -> dict[str, Any]:
    """The fake-quants the match took inside the attention, as its attributes."""
    return {name: q for name in ATTENTION_QUANTS[:4] if (q := _quant_attr(m.get(name))) is not None}


def attention_rule() -> Rule:
    q = Var("q", pred=is_float)
    scores = _fake_quant(Alt(
        Op("MatMul", q, Op("Transpose", _repeat_kv("k"), pred=_swaps_last_two), name="qk"),
        Op("MatMul", q, Var("kt"), name="qk"),
        # the transpose fold (phase "fold") made Q·Kᵀ a FusedMatMul(transB=1)
        Op("FusedMatMul", q, Alt(_repeat_kv("k"), Var("k")), domain=DOMAIN, pred=_plain_trans_b, name="qk")),
        "scores_quant")
    scaled = _fake_quant(Alt(Op("Div", scores, Const("s", scalar=True)),
                             Op("Mul", scores, Const("s", scalar=True), commutative=True), scores, name="scale_kind"),
                         "scaled_quant")
    masked = Optional(_fake_quant(Op("Add", scaled, Var("mask"), commutative=True), "masked_quant"), scaled)
    probs = _fake_quant(Op("Softmax", masked, domain=None,
                           pred=lambda n: n.domain in ("", "ai.onnx", DOMAIN) and softmax_last(n)), "probs_quant")
    pattern = Op("MatMul", probs, Alt(_repeat_kv("v"), Var("v")), name="pv")

    def replace(rw: Rewriter, m: Match):
        """softmax(Q·Kᵀ·scale + mask)·V → Attention (grouped-query: over (b, kv_heads, groups, m, d)); a
        quantised model's fake-quants of the scores and probabilities become its *_quant attributes"""
        kind = m["scale_kind"]
        s = 1.0 if kind == 2 else float(m.const("s").reshape(-1)[0])
        scale = 1.0 / s if kind == 0 else s
        q = m.value("q")
        quants = _quant_attrs(m)
        if kind == 0 and ("scaled_quant" in quants or "masked_quant" in quants) and not _exact_reciprocal(s):
            return None  # x / s rounds otherwise than x · (1/s): the fake-quant after it could differ
        if "k_kv" in m or "v_kv" in m:
            return _grouped_attention(rw, m, q, scale, quants)
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
                     output_types=[m.root.type], **quants)

    return Rule("attention_fusion", pattern, replace)


def _exact_reciprocal(s: float) -> bool:
    """``x / s == x · (1/s)`` in float32 for every x: s a power of two."""
    return s != 0 and np.isfinite(s) and np.frexp(np.float32(s))[0] in (0.5, -0.5)


def _grouped_attention(rw: Rewriter, m: Match, q: Value, scale: float, quants: dict[str, Any]) -> Value | None:
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
                output_types=[TensorType(qt.dtype, None if qt.shape is None else tuple(qt.shape[:-1]) + (dv,))],
                **quants)
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


def _attention_copy(rw: Rewriter, att: Node, ins: list[Value | None], perms: dict[str, list[int]], out_type,
                    **extra: Any) -> Value:
    attrs = {k: v for k, v in att.attrs.items() if k not in (*ATTENTION_PERMS, "perm_out")}
    for name, p in perms.items():
        if p != list(range(len(p))):
            attrs[name] = p
    return rw.op("Attention", *ins, domain=DOMAIN, name=att.name, output_types=[out_type], **{**attrs, **extra})


def _covers(outer: Sequence[float] | None, inner: Sequence[float] | None) -> bool:
    """A fake-quant ``outer`` leaves every value of ``inner``'s grid as it is (same scale, a range
    at least as wide): x already on the grid divides back to an integer within 255·2⁻²³."""
    return outer is not None and inner is not None and float(np.float32(outer[0])) == float(np.float32(inner[0])) \
        and outer[1] <= inner[1] and inner[2] <= outer[2]


def _transposed_fake_quant(v: Value | None) -> Node | None:
    """The FakeQuant making ``v`` from a Transpose's output (None when ``v`` is not one)."""
    node = v.producer if v is not None else None
    if fake_quant_params(node) is None or node is None or _transpose_perm(node.inputs[0]) is None:
        return None
    return node


def _fake_quant_before(rw: Rewriter, fq: Node, x: Value) -> Value:
    """``fq`` applied to ``x`` (a Transpose's input: the fake-quant is elementwise, so it moves
    before the Transpose), or ``x`` itself when ``x`` already is a fake-quant that ``fq`` keeps."""
    if _covers(_quant_attr(fq), _quant_attr(x.producer)):
        return x
    return rw.op(FAKE_QUANT, x, domain=QUANT_DOMAIN, name=fq.name, output_types=[x.type], **fq.attrs)


def _fold_attention_inputs(rw: Rewriter, m: Match):
    """Attention(Transpose(X), ...) → Attention(X, ...) reading X's strided view (perm_q/kt/v); a
    quantised model's FakeQuant(Transpose(X)) → FakeQuant(X) (none when X is one it keeps)."""
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
        fq = _transposed_fake_quant(x) if t is None else None
        if fq is not None:
            x = fq.inputs[0]
            t = _transpose_perm(x)
        if t is not None and x is not None and x.producer is not None:
            ins[i] = x.producer.inputs[0] if fq is None else _fake_quant_before(rw, fq, x.producer.inputs[0])
            p = [t[j] for j in p]  # transpose(transpose(X, t), p) = transpose(X, t∘p)
            folded = True
        perms[name] = p
    if not folded:
        return None
    out = att.outputs[0]
    perms["perm_out"] = _perm_attr(att, "perm_out", out.type.rank or 0)
    return _attention_copy(rw, att, ins, perms, out.type)


def _has_transposed_input(node: Node) -> bool:
    return any(_transpose_perm(x) is not None or _transposed_fake_quant(x) is not None for x in node.inputs[:3])


def _absorb_out_quant(rw: Rewriter, m: Match):
    """FakeQuant(Attention(...)) → Attention(..., out_quant), the Attention its only reader (a
    FakeQuant the one it has keeps: the same node again)."""
    att, q = m["att"], _quant_attr(m["fq"])
    try:
        have = attention_quant(att, "out_quant")
    except ValueError:
        return None
    if have is not None and not _covers(q, have):
        return None
    out = att.outputs[0]
    perms = {name: _perm_attr(att, name, x.type.rank or 0) for name, x in zip(ATTENTION_PERMS, att.inputs)
             if x is not None}
    perms["perm_out"] = _perm_attr(att, "perm_out", out.type.rank or 0)
    return _attention_copy(rw, att, list(att.inputs), perms, out.type, out_quant=list(have or q or ()))


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
    transposed = Op("Transpose", Var(name + "_x"), name=name + "_t", shared=True)
    return Alt(transposed, Op(FAKE_QUANT, transposed, domain=QUANT_DOMAIN, name=name + "_fq", shared=True), Var(name))


def attention_layout_rule() -> AnyOf:
    att = Op("Attention", domain=DOMAIN, name="att")
    operands = Op("Attention", _maybe_transposed("q"), _maybe_transposed("kt"), _maybe_transposed("v"), ...,
                  domain=DOMAIN, name="att", pred=_has_transposed_input)
    return AnyOf("attention_layout_fusion", [
        Rule("attention_out", Op("Transpose", att, name="t"), _fold_attention_output),
        Rule("attention_out_quant", Op(FAKE_QUANT, att, domain=QUANT_DOMAIN, name="fq"), _absorb_out_quant),
        Rule("attention_in", operands, _fold_attention_inputs),
    ], "Transposes around the heads (Q, Kᵀ, V in, the output back) → Attention reading and writing strided views; "
       "a quantised model's fake-quant of the output → its out_quant")
