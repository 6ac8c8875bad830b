"""Layout folds: a constant Pad folded into the Conv or pooling window after it, and Transposes
folded into MatMul (FusedMatMul's transA/transB) and Gemm. They run in the fold phase with the
weight folds (:mod:`.weights`)."""

from __future__ import annotations

import numpy as np

from ge_core.ir.graph import Node
from ge_sdk.fused import DOMAIN
from ge_sdk.rewrite import Match, Op, Rewriter, Var, attr_of, const_of

from .common import swap_last_two


def _pads_of(pad: Node) -> tuple[list[int], float] | None:
    """(pads, value) of a constant-mode Pad over all axes, or None."""
    if attr_of(pad, "mode", "constant") != "constant":
        return None
    if "pads" in pad.attrs:
        pads = [int(p) for p in pad.attrs["pads"]]
        value = float(pad.attrs.get("value", 0.0))
    else:
        pc = const_of(pad.inputs[1]) if len(pad.inputs) > 1 else None
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
    auto = attr_of(node, "auto_pad", "NOTSET")
    if auto not in ("NOTSET", "", "VALID"):
        return None
    own = [0] * len(extra) if auto == "VALID" else [int(p) for p in node.attrs.get("pads") or [0] * len(extra)]
    return [a + b for a, b in zip(own, extra)] if len(own) == len(extra) else None


def _folded_conv_attrs(m: Match) -> dict | None:
    """The attributes of the match's Conv with its Pad's zeros (spatial axes) as its own padding."""
    pad, conv = m["pad"], m["conv"]
    got = _pads_of(pad)
    rank = m.value("x").type.rank
    if got is None or rank is None or got[1] != 0.0:
        return None
    sp = _spatial_pads(got[0], rank)
    pads = None if sp is None else _merged_pads(conv, sp)
    if pads is None:
        return None
    return {**{k: v for k, v in conv.attrs.items() if k != "auto_pad"}, "pads": pads}


def fold_pad_conv(rw: Rewriter, m: Match):
    """Pad (zeros, spatial axes) → Conv: the padding becomes the convolution's own."""
    attrs = _folded_conv_attrs(m)
    if attrs is None:
        return None
    return rw.op("Conv", m.value("x"), *m["conv"].inputs[1:], name=m["conv"].name, **attrs)


def fold_pad_fake_quant_conv(rw: Rewriter, m: Match):
    """Pad (zeros) → FakeQuant → Conv (a quantised model's): FakeQuant → Conv with the padding its
    own (a fake-quant maps 0 to 0, so padding before or after it is the same)."""
    attrs = _folded_conv_attrs(m)
    if attrs is None:
        return None
    fq = m["fq"]
    moved = rw.op(fq.op_type, m.value("x"), domain=fq.domain, name=fq.name, **fq.attrs)
    return rw.op("Conv", moved, *m["conv"].inputs[1:], name=m["conv"].name, **attrs)


def fold_pad_pool(rw: Rewriter, m: Match):
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

def fold_transpose_matmul(rw: Rewriter, m: Match):
    """MatMul(Transpose(A), Transpose(B)) → FusedMatMul with transA/transB."""
    mm = m["mm"]
    a, b = mm.inputs
    ta = tb = 0
    assert a is not None and b is not None
    if a.producer is not None and a.producer.op_type == "Transpose" and a.producer in m.nodes and \
            swap_last_two(a.producer.attrs.get("perm"), a.type.rank) and a.type.rank == b.type.rank:
        a, ta = a.producer.inputs[0], 1
    if b.producer is not None and b.producer.op_type == "Transpose" and b.producer in m.nodes and \
            swap_last_two(b.producer.attrs.get("perm"), b.type.rank) and (b.type.rank == 2 or b.type.rank == mm.inputs[0].type.rank):
        b, tb = b.producer.inputs[0], 1
    if not (ta or tb):
        return None
    return rw.op("FusedMatMul", a, b, domain=DOMAIN, name=mm.name, transA=ta, transB=tb,
                 output_types=[mm.outputs[0].type])


def fold_transpose_gemm(rw: Rewriter, m: Match):
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


def transpose(name: str) -> Op:
    """A Transpose of ``<name>_in`` (bound as ``<name>_t``)."""
    return Op("Transpose", Var(name + "_in"), name=name + "_t")
