"""Small helpers shared by the pass families: constants, splats, type checks, safe replacement."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_sdk.rewrite import can_replace as can_replace  # the rewrite engine's, for the pass families
from ge_sdk.rewrite import walk_graphs as walk_graphs
from ge_sdk.rewrite.nodes import axes_of as axes_of  # the one meaning: [] absent, None unknown


def default_domain(node: Node) -> bool:
    """True for ops of ONNX's default domain (the only ones whose semantics the rules know)."""
    return node.domain in ("", "ai.onnx")


def const(v: Value | None) -> np.ndarray | None:
    """The constant array of ``v``, or None when ``v`` is absent or not constant."""
    return None if v is None else v.const_value


def is_splat(a: np.ndarray) -> bool:
    """True when every element of ``a`` is stored once (size <= 1 or all strides 0)."""
    return a.size <= 1 or all(s == 0 for s in a.strides)


def splat(value: Any, shape: Sequence[int], dtype: Any = None) -> np.ndarray:
    """A read-only array of ``shape`` filled with ``value`` that stores a single element."""
    one = np.array(value, dtype=dtype).reshape(())
    if int(np.prod(shape, dtype=np.int64)) <= 1:
        return np.full(tuple(shape), one, dtype=one.dtype)
    return np.broadcast_to(one, tuple(int(d) for d in shape))


def first_element(a: np.ndarray) -> np.ndarray:
    """The first element of a non-empty array as a 0-d array."""
    return a.reshape(-1)[:1].reshape(()) if is_splat(a) else np.asarray(a.flat[0])


def stored_nbytes(a: np.ndarray) -> int:
    """Bytes a constant really occupies: a splat counts one element, a view its visible data."""
    if a.dtype == np.dtype(object):
        return int(a.size) * 8
    if a.size == 0:
        return 0
    n = 1
    for d, s in zip(a.shape, a.strides):
        if s != 0:
            n *= d
    return n * a.dtype.itemsize


def all_equal_to(a: np.ndarray, value: float) -> bool:
    """True when ``a`` is non-empty and every element equals ``value`` (a splat is checked once)."""
    if a.size == 0 or a.dtype == np.dtype(object):
        return False
    if is_splat(a):
        return bool(first_element(a) == value)
    return bool(np.all(a == value))


def const_key(a: np.ndarray) -> tuple:
    """A hashable key equal for constants with the same dtype, shape and bytes."""
    if a.dtype == np.dtype(object):
        return ("str", a.shape, tuple(a.reshape(-1).tolist()))
    if is_splat(a) and a.size > 1:
        return ("splat", a.dtype.str, a.shape, first_element(a).tobytes())
    data = np.ascontiguousarray(a)
    buf = data.tobytes() if data.ndim == 0 else memoryview(data).cast("B")  # type: ignore[arg-type]
    digest = hashlib.blake2b(buf, digest_size=16).digest()
    return ("dense", a.dtype.str, a.shape, digest)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality of two constants (NaN equals NaN, -0.0 differs from 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == np.dtype(object):
        return bool(np.array_equal(a, b))
    if is_splat(a) and is_splat(b):
        return first_element(a).tobytes() == first_element(b).tobytes() if a.size else True
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def attr_key(a: Any) -> Any:
    """A hashable, exact key of an attribute value (arrays by value, floats by bits)."""
    if isinstance(a, np.ndarray):
        return ("array",) + const_key(a)
    if isinstance(a, (bool, np.bool_)):
        return ("b", bool(a))
    if isinstance(a, (int, np.integer)):
        return ("i", int(a))
    if isinstance(a, (float, np.floating)):
        return ("f", float(a).hex())
    if isinstance(a, (list, tuple)):
        return ("l",) + tuple(attr_key(x) for x in a)
    if isinstance(a, (str, bytes)):
        return ("s", a)
    if a is None:
        return ("none",)
    if isinstance(a, Graph):
        raise TypeError("subgraph attribute")
    return ("o", repr(a))


def shapes_match(a: TensorType, b: TensorType) -> bool:
    """True when two types are certainly equal: same dtype, same rank, every dim the same known
    integer or the same symbol."""
    if a.dtype is None or a.dtype != b.dtype or a.shape is None or b.shape is None:
        return False
    if len(a.shape) != len(b.shape):
        return False
    return all(x is not None and x == y for x, y in zip(a.shape, b.shape))


def static_shape(t: TensorType) -> tuple[int, ...] | None:
    """The shape of ``t`` as ints when fully static, else None."""
    return tuple(t.shape) if t.is_static and t.shape is not None else None  # type: ignore[arg-type]


def int_list(a: np.ndarray | None) -> list[int] | None:
    """A constant integer tensor as a Python list (None if absent or not integer)."""
    if a is None or a.dtype.kind not in "iu":
        return None
    return [int(x) for x in np.asarray(a).reshape(-1)]


def opset_of(node: Node) -> int:
    """Opset version of the node's domain in its (root) graph."""
    g = node.graph
    while g is not None and g.parent is not None:
        g = g.parent
    imports = g.opset_imports if g is not None else {}
    dom = "" if node.domain in ("", "ai.onnx") else node.domain
    return int(imports.get(dom, imports.get(node.domain, 0)) or 0)


def shape_elements(v: Value | None, depth: int = 8) -> list[Any] | None:
    """The elements of a 1-D int64 shape tensor as far as they are known statically.

    Each element is an int, ``("sym", name)`` for a symbolic dim, or ``("dim", value, i)`` for dim
    ``i`` of ``value`` (read through Shape); None when the tensor is not a shape expression made
    of constants, Shape, Gather, Slice, Unsqueeze, Squeeze and Concat.
    """
    if v is None or depth < 0:
        return None
    c = v.const_value
    if c is not None:
        return [int(x) for x in c.reshape(-1)] if c.dtype.kind in "iu" and c.ndim <= 1 else None
    p = v.producer
    if p is None or not default_domain(p):
        return None
    op = p.op_type
    if op == "Shape":
        x = p.inputs[0]
        if x is None or x.type.shape is None:
            return None
        dims = [d if isinstance(d, int) else ("sym", d) if isinstance(d, str) else ("dim", x, i)
                for i, d in enumerate(x.type.shape)]
        r = len(dims)
        start = int(p.attrs.get("start", 0))
        end = p.attrs.get("end")
        start = max(0, min(r, start + r if start < 0 else start))
        e = r if end is None else int(end)
        e = max(0, min(r, e + r if e < 0 else e))
        return dims[start:e]
    if op in ("Unsqueeze", "Squeeze", "Identity"):
        inner = shape_elements(p.inputs[0], depth - 1)
        return inner if inner is not None and len(inner) == 1 else None
    if op == "Concat":
        out: list[Any] = []
        for x in p.inputs:
            part = shape_elements(x, depth - 1)
            if part is None:
                return None
            out.extend(part)
        return out
    if op == "Gather" and len(p.inputs) == 2 and int(p.attrs.get("axis", 0)) in (0, -1):
        data, idx = shape_elements(p.inputs[0], depth - 1), const(p.inputs[1])
        if data is None or idx is None or idx.dtype.kind not in "iu" or idx.ndim > 1:
            return None
        flat = [int(i) for i in idx.reshape(-1)]
        if any(not -len(data) <= i < len(data) for i in flat):
            return None
        return [data[i] for i in flat]
    return None
