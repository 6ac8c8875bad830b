"""Kernel results are checked against the node's declared types, on every executor."""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.ir.graph import Node
from ge_core.ir.types import TensorType
from ge_core.kernel import copy_caps

from .values import describe_value


def checked_kernel(fn: Any, node: Node, who: Any) -> Any:
    """``fn`` wrapped so that its results are what ``node`` declares, on every executor.

    A kernel returns a sequence with one value per output of its node; an output whose declared
    type has a dtype or a shape must be an ``np.ndarray`` of that dtype, rank and static dims (a
    NumPy scalar of the right dtype is taken as a 0-d array). Anything else (another dtype or
    shape, a list, None, a bare array instead of a sequence) is an :class:`ExecutionError` that
    names the node, its op, the kernel's plugin (``who()``), and what was expected and returned:
    the bug is the kernel's, not the next op's. Outputs of unknown type (sequences, optionals)
    are not checked. The cost is O(1) per output: a type, shape and dtype comparison when the
    declared type is static.
    """
    if not callable(fn):
        return fn  # the executor reports it when the run calls it
    outs = node.outputs
    n = len(outs)
    # per output: None (anything), (dtype, shape) for a static type (fast check), (dtype, rank,
    # ((axis, size), ...)) for a known rank with symbolic or unknown dims (fast check of the
    # static ones: what the slow path checks too), False (partial: the slow path)
    fast: list[Any] = []
    for v in outs:
        t = v.type
        if t is None or (t.dtype is None and t.shape is None):
            fast.append(None)
        elif t.dtype is not None and t.dtype != np.dtype(object) and t.shape is not None and t.is_static:
            fast.append((t.dtype, tuple(t.shape)))
        elif t.dtype is not None and t.dtype != np.dtype(object) and t.shape is not None:
            fast.append((t.dtype, len(t.shape), tuple((i, d) for i, d in enumerate(t.shape) if isinstance(d, int))))
        else:
            fast.append(False)
    nd = np.ndarray

    def kernel(*args, **kw):
        res = fn(*args, **kw)
        if (type(res) is tuple or type(res) is list) and len(res) == n:
            for r, f in zip(res, fast):
                if f is None:
                    continue
                if f is False or type(r) is not nd or r.dtype != f[0]:
                    break
                if len(f) == 2:
                    if r.shape != f[1]:
                        break
                elif r.ndim != f[1] or any(r.shape[i] != d for i, d in f[2]):
                    break
            else:
                return res
        return _conform(res, node, who)

    copy_caps(kernel, fn)  # the out= protocol, the report's kernel modes
    kernel.__wrapped__ = fn  # type: ignore[attr-defined]
    return kernel


def _conform(res: Any, node: Node, who: Any) -> list[Any]:
    """The slow path of :func:`checked_kernel`: results converted where harmless, else the error."""
    n = len(node.outputs)
    hint = ("a kernel returns a sequence (tuple or list) with one value per output of its node, each an "
            "ndarray of the type and shape the node declares (ge_core.kernel); report the bug to the kernel's author")
    if isinstance(res, np.ndarray) or not isinstance(res, (tuple, list)):
        got = f"one {describe_value(res)} array" if isinstance(res, np.ndarray) else ("None" if res is None else f"a {type(res).__name__}")
        raise ExecutionError(f"{who()}: the kernel returned {got} instead of a sequence of {n} output(s)", hint=hint)
    if len(res) != n:
        raise ExecutionError(f"{who()}: the kernel returned {len(res)} outputs, expected {n}", hint=hint)
    fixed = list(res)
    for j, (r, v) in enumerate(zip(res, node.outputs)):
        t = v.type
        if t is None or (t.dtype is None and t.shape is None):
            continue
        if isinstance(r, np.generic):
            r = fixed[j] = np.asarray(r)
        problem = _mismatch(r, t)
        if problem:
            raise ExecutionError(f"{who()}: output {j} ('{v.name}') of the kernel is {problem}, the node declares {t}",
                                 hint=hint)
    return fixed


def _mismatch(r: Any, t: Any) -> str:
    """What is wrong with ``r`` as a value of declared type ``t`` ('' when nothing is)."""
    if not isinstance(r, np.ndarray):
        if r is None:
            return "None"
        if isinstance(r, (list, tuple)):
            return f"a {type(r).__name__} of {len(r)} item(s)"
        return f"a {type(r).__name__}"
    if t.dtype is not None and r.dtype != t.dtype and not (t.dtype == np.dtype(object) and r.dtype.kind in "OUS"):
        return str(TensorType.of(r))
    if t.shape is not None and (r.ndim != len(t.shape)
                                or any(isinstance(d, int) and d != s for d, s in zip(t.shape, r.shape))):
        return str(TensorType.of(r))
    return ""

