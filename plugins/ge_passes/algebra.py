"""Algebraic simplification: identity elements, double negation, merging arithmetic by constants.

Every rewrite keeps the output's dtype and shape: an identity element is dropped only when the
constant broadcasts into the other operand without changing it. Exact rewrites (x*1, x/1, x-0,
x**1, --x) live in ``simplify_algebra``; merging constants (x*a*b -> x*(a*b)) rounds once instead
of twice, so results may differ in the last bit; ``distribute_constants`` (O3) reassociates
further. ``x + 0`` turns -0.0 into +0.0 where x is -0.0, as in every graph optimiser.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk.rewrite import Rewriter, RulePass

from ._util import all_equal_to, const, default_domain, first_element, is_splat, shapes_match, splat


def _fits_into(c: np.ndarray, x: Value, out: Value) -> bool:
    """True when ``x (op) c`` has x's dtype and shape for any broadcasting op."""
    if x.type.dtype is not None and c.dtype != x.type.dtype:
        return False
    if x.type.rank is not None and c.ndim <= x.type.rank and all(d == 1 for d in c.shape):
        return True
    return shapes_match(x.type, out.type)


def _split_const(node: Node, allow_first: bool) -> tuple[Value, np.ndarray] | None:
    """(the non-constant operand, the constant) of a binary node."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    a, b = node.inputs
    assert a is not None and b is not None
    cb = const(b)
    if cb is not None and const(a) is None:
        return a, cb
    ca = const(a)
    if allow_first and ca is not None and cb is None:
        return b, ca
    return None


_IDENTITY = {"Mul": (1, True), "Add": (0, True), "Sub": (0, False), "Div": (1, False), "Pow": (1, False),
             "And": (True, True), "Or": (False, True), "BitwiseOr": (0, True), "BitwiseXor": (0, True)}


def drop_identity_element(node: Node, rw: Rewriter) -> bool:
    """x*1, 1*x, x+0, 0+x, x-0, x/1, x**1, x and true, x or false -> x."""
    value, commutes = _IDENTITY[node.op_type]
    split = _split_const(node, commutes)
    if split is None:
        return False
    x, c = split
    if not all_equal_to(c, value) or not _fits_into(c, x, node.output):
        return False
    if node.op_type == "Pow" and node.output.type.dtype != x.type.dtype:
        return False
    return rw.replace_node(node, [x])


def double_negation(node: Node, rw: Rewriter) -> bool:
    """Neg(Neg(x)) -> x, Not(Not(x)) -> x."""
    src = node.inputs[0]
    inner = src.producer if src is not None else None
    if inner is None or inner.op_type != node.op_type or not default_domain(inner) or inner.inputs[0] is None:
        return False
    return rw.replace_node(node, [inner.inputs[0]])


class SimplifyAlgebra(RulePass):
    """Exact algebraic identities."""

    name = "simplify_algebra"
    after = ("eliminate_noops",)
    stage = "optimize"
    opt_level = 2
    fixed_point = True
    description = "drop identity elements (x*1, x+0, x-0, x/1, x**1, x&true, x|false) and double Neg/Not"
    rules = {
        **{op: (drop_identity_element,) for op in _IDENTITY},
        "Neg": (double_negation,),
        "Not": (double_negation,),
    }


# ------------------------------------------------------------------------------------------------
def combine(f: Callable, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``f(a, b)`` broadcast, computed once when both are splats; None when the result would be
    larger than the bigger operand or change dtype."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    size = int(np.prod(shape, dtype=np.int64))
    if size > max(a.size, b.size):
        return None
    with np.errstate(all="ignore"):
        if is_splat(a) and is_splat(b) and size > 1:
            r = splat(f(first_element(a), first_element(b)), shape, a.dtype)
        else:
            r = np.asarray(f(a, b))
    if r.dtype != a.dtype:
        return None
    return r


#: (outer op, inner op) -> (new op, how to combine inner constant c1 with outer constant c2)
_MERGES: dict[tuple[str, str], tuple[str, Callable]] = {
    ("Mul", "Mul"): ("Mul", lambda c1, c2: operator.mul(c1, c2)),
    ("Div", "Mul"): ("Mul", lambda c1, c2: operator.truediv(c1, c2)),
    ("Mul", "Div"): ("Mul", lambda c1, c2: operator.truediv(c2, c1)),
    ("Div", "Div"): ("Div", lambda c1, c2: operator.mul(c1, c2)),
    ("Add", "Add"): ("Add", lambda c1, c2: operator.add(c1, c2)),
    ("Sub", "Add"): ("Add", lambda c1, c2: operator.sub(c1, c2)),
    ("Add", "Sub"): ("Add", lambda c1, c2: operator.sub(c2, c1)),
    ("Sub", "Sub"): ("Sub", lambda c1, c2: operator.add(c1, c2)),
}


def _commutes(op: str) -> bool:
    return op in ("Mul", "Add")


def merge_constant_chain(node: Node, rw: Rewriter) -> bool:
    """(x op1 c1) op2 c2 -> x op (c1 ∘ c2) for op1, op2 in {Mul, Div} or {Add, Sub}."""
    outer = _split_const(node, _commutes(node.op_type))
    if outer is None:
        return False
    y, c2 = outer
    inner = y.producer
    if inner is None or not default_domain(inner) or (node.op_type, inner.op_type) not in _MERGES:
        return False
    if len(y.uses()) != 1 or y.is_graph_output:
        return False
    split = _split_const(inner, _commutes(inner.op_type))
    if split is None:
        return False
    x, c1 = split
    if c1.dtype != c2.dtype or c1.dtype.kind not in "fiu":
        return False
    op, f = _MERGES[(node.op_type, inner.op_type)]
    if c1.dtype.kind != "f" and "Div" in (node.op_type, inner.op_type):
        return False  # integer division does not compose exactly
    c = combine(f, c1, c2)
    if c is None:
        return False
    new = rw.add_node(op, [x, rw.constant(c, like=node.output)], before=node, like=node.output,
                      output_type=node.output.type)
    return rw.replace_node(node, [new.output])


class MergeConstantArithmetic(RulePass):
    """Merge chains of Mul/Div and of Add/Sub by constants into one node."""

    name = "merge_constant_arithmetic"
    after = ("fold_constants", "simplify_algebra")
    stage = "optimize"
    opt_level = 2
    fixed_point = True
    description = ("merge (x*a)*b, (x*a)/b, (x/a)/b, (x+a)+b, (x+a)-b, ... into one Mul/Div/Add/Sub by a "
                   "folded constant (no constant grows; rounding may differ in the last bit)")
    rules = {op: (merge_constant_chain,) for op in ("Mul", "Div", "Add", "Sub")}


# ------------------------------------------------------------------------------------------------
def _per_channel(c: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """``c`` as a vector of ``channels`` when it broadcasts along axis 1 of a rank-``rank`` tensor only."""
    if c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    if is_splat(c):
        return splat(first_element(c), (channels,), c.dtype)
    return np.broadcast_to(c.reshape(-1), (channels,))


_AFFINE = {
    "Mul": (operator.mul, operator.mul),  # (scale op, bias op)
    "Div": (operator.truediv, operator.truediv),
    "Add": (None, operator.add),
    "Sub": (None, operator.sub),
}


def fold_affine(node: Node, rw: Rewriter) -> bool:
    """BatchNormalization(x) * c + d, per channel -> BatchNormalization with scaled scale/bias."""
    split = _split_const(node, _commutes(node.op_type))
    if split is None:
        return False
    y, c = split
    bn = y.producer
    if bn is None or bn.op_type != "BatchNormalization" or not default_domain(bn) or len(bn.outputs) != 1:
        return False
    if int(bn.attrs.get("training_mode", 0)) or int(bn.attrs.get("spatial", 1)) != 1:
        return False
    if len(y.uses()) != 1 or y.is_graph_output or len(bn.inputs) < 5:
        return False
    scale, bias = const(bn.inputs[1]), const(bn.inputs[2])
    rank = y.type.rank
    if scale is None or bias is None or rank is None or rank < 2 or scale.ndim != 1 or bias.shape != scale.shape:
        return False
    if c.dtype != scale.dtype or c.dtype.kind != "f" or y.type.dtype != c.dtype:
        return False
    vec = _per_channel(c, rank, scale.shape[0])
    if vec is None:
        return False
    scale_op, bias_op = _AFFINE[node.op_type]
    new_scale = combine(scale_op, scale, vec) if scale_op is not None else scale
    new_bias = combine(bias_op, bias, vec)
    if new_scale is None or new_bias is None:
        return False
    if not rw.replace_node(node, [y]):
        return False
    if new_scale is not scale:
        bn.set_input(1, rw.constant(new_scale, like=bn.inputs[1]))
    bn.set_input(2, rw.constant(new_bias, like=bn.inputs[2]))
    rw.push(bn)
    for o in bn.outputs:
        rw.push_users(o)
    return True


class FoldAffineIntoBatchNorm(RulePass):
    """Absorb per-channel Mul/Div/Add/Sub by constants after a BatchNormalization into it."""

    name = "fold_affine_into_batchnorm"
    after = ("fold_constants", "merge_constant_arithmetic")
    stage = "optimize"
    opt_level = 2
    fixed_point = True
    description = ("absorb a per-channel Mul/Div/Add/Sub by a constant that follows an inference "
                   "BatchNormalization into its scale and bias (Caffe's BatchNorm + Scale)")
    rules = {op: (fold_affine,) for op in _AFFINE}


# ------------------------------------------------------------------------------------------------
def distribute(node: Node, rw: Rewriter) -> bool:
    """(x + a) * b -> x * b + a * b, so that affine chains collapse to one Mul and one Add."""
    outer = _split_const(node, True)
    if outer is None:
        return False
    y, b = outer
    inner = y.producer
    if inner is None or inner.op_type not in ("Add", "Sub") or not default_domain(inner):
        return False
    if len(y.uses()) != 1 or y.is_graph_output or b.dtype.kind != "f":
        return False
    split = _split_const(inner, inner.op_type == "Add")
    if split is None or split[1].dtype != b.dtype:
        return False
    x, a = split
    ab = combine(operator.mul if node.op_type == "Mul" else operator.truediv, a, b)
    if ab is None:
        return False
    b_value = next(v for v in node.inputs if v is not None and v.const_value is b)
    scaled = rw.add_node(node.op_type, [x, b_value], before=node, like=node.output)
    new = rw.add_node(inner.op_type, [scaled.output, rw.constant(ab, like=node.output)], before=node,
                      like=node.output, output_type=node.output.type)
    return rw.replace_node(node, [new.output])


class DistributeConstants(RulePass):
    """Move additions of constants past multiplications by constants."""

    name = "distribute_constants"
    after = ("simplify_algebra",)
    stage = "optimize"
    opt_level = 3
    fixed_point = True
    before = ("merge_constant_arithmetic",)
    description = ("rewrite (x + a) * b as x * b + a * b (and / likewise) so merge_constant_arithmetic can "
                   "collapse affine chains; changes rounding more than O2 does")
    rules = {"Mul": (distribute,), "Div": (distribute,)}
