"""Predicates the fusion rule families share. (The node readers every plugin shares, ``axes_of``,
``attr_of`` and ``const_of``, are :mod:`ge_sdk.rewrite`'s.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.ir.graph import Node, Value
from ge_sdk.fused import DOMAIN
from ge_sdk.rewrite import attr_of, axes_of


def near(target: float, tol: float = 1e-3):
    """A constant predicate: one element within ``tol`` (relative) of ``target``."""
    def pred(a: np.ndarray) -> bool:
        return a.size == 1 and abs(float(a.reshape(-1)[0]) - target) <= tol * max(1.0, abs(target))

    pred.__name__ = f"≈{target:g}"
    return pred

def is_float(v: Value) -> bool:
    """``v`` has a floating-point dtype."""
    return v.type.dtype is not None and v.type.dtype.kind == "f"

def last_axis_only(node: Node) -> bool:
    """A reduction over the last axis alone, keeping it."""
    axes = axes_of(node)
    rank = node.inputs[0].type.rank if node.inputs[0] is not None else None
    if axes is None or len(axes) != 1 or rank is None:
        return False
    return axes[0] in (-1, rank - 1) and int(attr_of(node, "keepdims", 1)) == 1


def softmax_last(node: Node) -> bool:
    """A Softmax over the last axis."""
    x = node.inputs[0]
    rank = x.type.rank if x is not None else None
    axis = int(attr_of(node, "axis", -1 if node.domain == DOMAIN else 1))
    return rank is not None and axis in (-1, rank - 1)

def swap_last_two(perm: Any, rank: int | None) -> bool:
    """``perm`` swaps the last two of ``rank`` axes and keeps the others."""
    if perm is None or rank is None or rank < 2:
        return False
    perm = [int(p) for p in perm]
    want = list(range(rank - 2)) + [rank - 1, rank - 2]
    return perm == want

def float32_or_64(v: Value) -> bool:
    """``v`` is float32 or float64 (the row kernels' dtypes)."""
    return v.type.dtype is not None and v.type.dtype.name in ("float32", "float64")
