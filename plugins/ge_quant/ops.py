"""The op the ``qdq_regions`` pass writes: ``ge.quant::FakeQuant`` (see :mod:`ge_sdk.quant`)."""

from __future__ import annotations

import math

import numpy as np

from ge_core.errors import GraphError
from ge_core.ir.graph import Node
from ge_core.ir.types import TensorType
from ge_core.ops import OpDef, OpKind
from ge_sdk import quant


def _infer(node: Node, opset: int) -> list[TensorType]:
    x = node.inputs[0]
    return [TensorType(np.dtype(np.float32), x.type.shape if x is not None and x.type is not None else None)]


def check_node(node: Node) -> None:
    """Validate a FakeQuant's attributes (a damaged or hand-made .om raises, naming the node)."""
    a = node.attrs
    try:
        s, z, lo, hi = (float(a["scale"]), int(a["zero_point"]), int(a["qmin"]), int(a["qmax"]))
        ok = math.isfinite(s) and s > 0 and -(2 ** 16) <= lo <= z <= hi <= 2 ** 16
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise GraphError(f"node '{node.name}' ({quant.DOMAIN}::{quant.FAKE_QUANT}): attributes scale (finite, > 0), "
                         "qmin <= zero_point <= qmax (16-bit range at most) are required",
                         hint="the .om is damaged or was not written by this compiler: compile the model again")


def lower(node: Node, opset: int) -> list:
    """The standard ONNX form (``ge export``): the formula in Div, Round, Clip and Mul."""
    from ge_sdk.lowering import Builder

    a, x = node.attrs, node.inputs[0]
    assert x is not None
    z = int(a.get("zero_point", 0))
    return [Builder(node, opset).fake_quant(x, float(a["scale"]), int(a.get("qmin", 0)) - z, int(a.get("qmax", 255)) - z)]


OPDEFS = [
    OpDef(quant.FAKE_QUANT, quant.DOMAIN, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE, infer=_infer,
          internal=True, check=check_node, alias="inplace", lower=lower,
          attrs={"scale": None, "zero_point": 0, "qmin": 0, "qmax": 255},
          doc="y = clip(rint(x / scale), qmin - zero_point, qmax - zero_point) * scale: QuantizeLinear then "
              "DequantizeLinear with a per-tensor scale and zero point, in float32"),
]
