"""Small readers of a node's attributes and constant inputs, shared by the rule families of every
plugin (ge_fusion's patterns, ge_passes' algebraic and layout passes), so each has one meaning."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.ir.graph import Node, Value


def const_of(v: Value | None) -> np.ndarray | None:
    """The constant array of ``v``, or None when ``v`` is absent or not constant."""
    return None if v is None else v.const_value


def attr_of(node: Node, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of ``node`` (``default`` when absent), a bytes value decoded as text."""
    v = node.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def ints_of(a: np.ndarray | None) -> list[int] | None:
    """A constant integer tensor as a Python list (None if absent or not integer)."""
    if a is None or a.dtype.kind not in "iu":
        return None
    return [int(x) for x in np.asarray(a).reshape(-1)]


def axes_of(node: Node, input_index: int = 1) -> list[int] | None:
    """Axes of Squeeze/Unsqueeze/Reduce*: the ``axes`` attribute (old opsets) or the constant
    integer input ``input_index`` (opset 13/18).

    Returns [] when neither is given (ONNX: the op's default axes) and None when the input is not
    a constant integer tensor (the axes are unknown)."""
    if "axes" in node.attrs:
        return [int(x) for x in node.attrs["axes"]]
    if len(node.inputs) > input_index and node.inputs[input_index] is not None:
        return ints_of(const_of(node.inputs[input_index]))
    return []
