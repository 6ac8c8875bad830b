"""Standard ONNX forms of compiled ops: what an ``OpDef.lower`` writes for ``ge export``.

A plugin that declares an op only its passes make (a fused op, a backend's blocked-layout op)
gives its OpDef a ``lower(node, opset)``: it builds the op's meaning in standard ONNX nodes with a
:class:`Builder` (inserted before the node, each op in the form ``opset`` defines: ``Clip``,
``Pad``, ``Slice`` and the reductions moved attributes to inputs over the opsets) and returns the
values that replace the node's outputs. :meth:`Builder.program` writes a fused elementwise
program (:mod:`ge_sdk.fused`'s format) the same way, and :meth:`Builder.block` /
:meth:`Builder.unblock` the blocked channel layout ``(N, C/16, H, W, 16)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.errors import GEError
from ge_core.ir.graph import Node, Value

from . import fused

#: the channels of a block of the blocked layout (ge_native.nchwc.BLOCK)
BLOCK = 16


def refuse(node: Node, why: str) -> GEError:
    """The error of a node that has no standard ONNX form (``ge export`` writes no file)."""
    return GEError(f"ge export: {node.describe()} has no standard ONNX form: {why}",
                   hint="pass --keep-compiled-ops to export the compiled op as it is (onnxruntime cannot run it)")


class Builder:
    """Standard ONNX nodes inserted before ``node`` in its graph, for default-domain ``opset``."""

    def __init__(self, node: Node, opset: int) -> None:
        if node.graph is None:  # pragma: no cover - a node being lowered is in a graph
            raise refuse(node, "it is not in a graph")
        self.node, self.graph, self.opset = node, node.graph, int(opset)

    def dtype(self, v: Value | None) -> np.dtype:
        """The element type of ``v`` (float32 where unknown)."""
        dt = None if v is None else v.type.dtype
        return np.dtype(dt) if dt is not None and np.dtype(dt).kind == "f" else np.dtype(np.float32)

    def const(self, value: Any, dtype: Any = None) -> Value:
        arr = np.asarray(value, dtype=dtype)
        return self.graph.add_constant(arr, self.graph.names.fresh(f"{self.node.name}_c"))

    def ints(self, values: Sequence[int]) -> Value:
        return self.const(np.asarray(list(values), np.int64))

    def op(self, op_type: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None,
           outputs: int = 1) -> Any:
        """One node; its output value (a list of them when ``outputs`` > 1)."""
        n = self.graph.add_node(op_type, list(inputs), {k: v for k, v in (attrs or {}).items() if v is not None},
                                name=f"{self.node.name}_{op_type.lower()}", num_outputs=outputs,
                                before=self.node)
        return n.outputs[0] if outputs == 1 else list(n.outputs)

    # -- ops whose form depends on the opset --------------------------------------------------------
    def clip(self, x: Value, lo: float | None, hi: float | None) -> Value:
        if lo is None and hi is None:
            return x
        if self.opset >= 11:
            dt = self.dtype(x)
            return self.op("Clip", [x, None if lo is None else self.const(lo, dt), None if hi is None else self.const(hi, dt)])
        return self.op("Clip", [x], {"min": None if lo is None else float(lo), "max": None if hi is None else float(hi)})

    def pad_axis(self, x: Value, rank: int, axis: int, after: int) -> Value:
        """``x`` with ``after`` zeros appended along ``axis``."""
        pads = [0] * (2 * rank)
        pads[rank + axis] = int(after)
        if self.opset >= 11:
            return self.op("Pad", [x, self.ints(pads)])
        return self.op("Pad", [x], {"pads": pads})

    def slice_axis(self, x: Value, axis: int, start: int, end: int) -> Value:
        if self.opset >= 10:
            return self.op("Slice", [x, self.ints([start]), self.ints([end]), self.ints([axis])])
        return self.op("Slice", [x], {"starts": [start], "ends": [end], "axes": [axis]})

    def reduce(self, op_type: str, x: Value, axes: Sequence[int], keepdims: int = 1) -> Value:
        """ReduceMean/ReduceSum/ReduceMax over ``axes`` (an input from opset 13 for ReduceSum, 18
        for the others; an attribute before)."""
        if self.opset >= (13 if op_type == "ReduceSum" else 18):
            return self.op(op_type, [x, self.ints(axes)], {"keepdims": keepdims})
        return self.op(op_type, [x], {"axes": list(axes), "keepdims": keepdims})

    def softmax(self, x: Value, axis: int, rank: int | None) -> Value:
        """Softmax along one axis (opset < 13 flattened the trailing axes: its op only for the last)."""
        last = axis == -1 or (rank is not None and axis == rank - 1)
        if self.opset >= 13 or last:
            return self.op("Softmax", [x], {"axis": -1 if last and self.opset < 13 else axis})
        e = self.op("Exp", [self.op("Sub", [x, self.reduce("ReduceMax", x, [axis])])])
        return self.op("Div", [e, self.reduce("ReduceSum", e, [axis])])

    def transpose_last2(self, x: Value) -> Value:
        rank = x.type.rank
        if rank is None:
            raise refuse(self.node, f"the rank of '{x.name}' is unknown (a transposed operand)")
        return self.op("Transpose", [x], {"perm": [*range(rank - 2), rank - 1, rank - 2]})

    # -- activations ----------------------------------------------------------------------------
    def gelu(self, x: Value, approximate: str = "none") -> Value:
        dt = self.dtype(x)
        if approximate == "tanh":
            inner = self.op("Mul", [self.op("Add", [x, self.op("Mul", [self.op("Mul", [self.op("Mul", [x, x]), x]),
                                                                       self.const(0.044715, dt)])]),
                                    self.const(math.sqrt(2.0 / math.pi), dt)])
            phi = self.op("Add", [self.op("Tanh", [inner]), self.const(1.0, dt)])
        else:
            phi = self.op("Add", [self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0), dt)])]), self.const(1.0, dt)])
        return self.op("Mul", [self.op("Mul", [x, phi]), self.const(0.5, dt)])

    def activation(self, x: Value, name: str) -> Value:
        """``x`` through an activation of ge_native's table by name (sigmoid, silu, gelu, gelu_tanh,
        hardswish; "" for none)."""
        if not name:
            return x
        if name == "sigmoid":
            return self.op("Sigmoid", [x])
        if name == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if name in ("gelu", "gelu_tanh"):
            return self.gelu(x, "tanh" if name == "gelu_tanh" else "none")
        if name == "hardswish":
            return self.op("Mul", [x, self.op("HardSigmoid", [x], {"alpha": 1.0 / 6.0, "beta": 0.5})])
        raise refuse(self.node, f"activation {name!r}")

    def fake_quant(self, x: Value, scale: float, lo: float, hi: float) -> Value:
        """``clip(rint(x / scale), lo, hi) * scale`` (a quantised model's fake-quant)."""
        dt = self.dtype(x)
        q = self.op("Round", [self.op("Div", [x, self.const(scale, dt)])])
        return self.op("Mul", [self.clip(q, lo, hi), self.const(scale, dt)])

    # -- fused programs -------------------------------------------------------------------------
    def program(self, text: Any, args: Sequence[Value | None], y: Value | None = None) -> Value:
        """A fused program (:mod:`ge_sdk.fused`) over ``args`` (``a<k>``) and the anchor's ``y``."""
        try:
            steps = fused.loads(text, n_inputs=len(args), anchor=y is not None)
        except ValueError as e:
            raise refuse(self.node, f"bad program: {e}") from None
        done: list[Value] = []

        def ref(r: str) -> Value:
            v = y if r == "y" else (args[int(r[1:])] if r[0] == "a" else done[int(r[1:])])
            if v is None:
                raise refuse(self.node, f"program operand {r} is absent")
            return v

        for op, refs, attrs in steps:
            done.append(self.step(op, [ref(r) for r in refs], attrs))
        return done[-1]

    def step(self, op: str, xs: list[Value], attrs: dict[str, Any]) -> Value:
        """One program step as standard ONNX."""
        x = xs[0]
        if op in ("Silu", "HardSwish"):
            return self.activation(x, op.lower())
        if op == "Gelu":
            return self.gelu(x, attrs.get("approximate", "none"))
        if op == "Clip":
            return self.clip(x, attrs.get("min"), attrs.get("max"))
        if op == fused.FAKE_QUANT_STEP:
            return self.fake_quant(x, attrs["scale"], attrs["lo"], attrs["hi"])
        defaults = {"LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}}
        return self.op(op, xs, {**defaults.get(op, {}), **{k: float(v) for k, v in attrs.items()}})

    # -- the blocked layout ---------------------------------------------------------------------
    def block(self, x4: Value, channels: int) -> Value:
        """NCHW ``x4`` of ``channels`` channels as ``(N, C/16, H, W, 16)`` (the lanes past C zeros)."""
        cb = -(-int(channels) // BLOCK)
        if cb * BLOCK != channels:
            x4 = self.pad_axis(x4, 4, 1, cb * BLOCK - channels)
        nhwc = self.op("Transpose", [x4], {"perm": [0, 2, 3, 1]})
        return self.op("Transpose", [self.op("Reshape", [nhwc, self.ints([0, 0, 0, cb, BLOCK])])], {"perm": [0, 3, 1, 2, 4]})

    def unblock(self, x5: Value, channels: int | None = None) -> Value:
        """Blocked ``x5`` as NCHW, its first ``channels`` channels (None: every lane)."""
        nhwc = self.op("Reshape", [self.op("Transpose", [x5], {"perm": [0, 2, 3, 1, 4]}), self.ints([0, 0, 0, -1])])
        x4 = self.op("Transpose", [nhwc], {"perm": [0, 3, 1, 2]})
        blocks = x5.type.shape[1] if x5.type.shape is not None and len(x5.type.shape) == 5 else None
        if channels is not None and not (isinstance(blocks, int) and blocks * BLOCK == channels):
            x4 = self.slice_axis(x4, 1, 0, int(channels))
        return x4
