"""ONNX element types and TypeProtos <-> the IR's dtypes and TensorTypes.

For plugins that speak ONNX protos (the op set's inference, the ONNX frontend and exporter);
plugins reach each other only through registries, so the conversions they share live here.
``onnx`` is imported only when a conversion needs it.
"""

from __future__ import annotations

import functools
import secrets
import threading

import numpy as np

from ge_core.ir.symbolic import SymExpr
from ge_core.ir.types import TensorType

#: A symbolic dim expression travels through ONNX's inference as an opaque ``dim_param``: this
#: process's random prefix plus a serial number, so no name in a model can be taken for one.
_TOKEN_PREFIX = "\u00a7" + secrets.token_hex(6) + ":"
_tokens: dict[str, SymExpr] = {}
_token_of: dict[SymExpr, str] = {}
_token_lock = threading.Lock()


def dim_param(d: str | SymExpr) -> str:
    """The ``dim_param`` that stands for a symbolic dim (a name is itself)."""
    if isinstance(d, str):
        return d
    t = _token_of.get(d)
    if t is None:
        with _token_lock:
            t = _token_of.setdefault(d, f"{_TOKEN_PREFIX}{len(_token_of)}")
            _tokens[t] = d
    return t


def from_dim_param(s: str) -> str | SymExpr | None:
    """The dim a ``dim_param`` stands for (an expression's token, else the name; "" is unknown)."""
    if not s:
        return None
    if s.startswith(_TOKEN_PREFIX):
        return _tokens.get(s)
    return s

#: ONNX ``TensorProto`` element types -> NumPy dtype names, as ONNX names them (8 is "string";
#: the float8/int4/float4 ones need ml_dtypes). The one table: no onnx import needed.
ELEM_TYPE_NAMES: dict[int, str] = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
    16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
    21: "uint4", 22: "int4", 23: "float4_e2m1",
}
#: NumPy dtype name -> ONNX element type (an object array is STRING, 8): Cast's ``to``.
ELEM_TYPES: dict[str, int] = {**{n: c for c, n in ELEM_TYPE_NAMES.items() if c != 8}, "object": 8}


def elem_to_dtype(elem_type: int) -> np.dtype | None:
    """NumPy dtype of an ONNX element type (None for UNDEFINED or a type NumPy lacks)."""
    from onnx import TensorProto, helper

    if elem_type == TensorProto.UNDEFINED:
        return None
    if elem_type == TensorProto.STRING:
        return np.dtype(object)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return None


@functools.cache
def dtype_to_elem(dtype: np.dtype | None) -> int:
    """ONNX element type of a NumPy dtype (UNDEFINED for None, STRING for object)."""
    from onnx import TensorProto, helper

    if dtype is None:
        return TensorProto.UNDEFINED
    if dtype == np.dtype(object):
        return TensorProto.STRING
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def type_from_proto(tp) -> TensorType | None:
    """TensorType of a ``TypeProto``; None for sequences, maps and optionals."""
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    tt = tp.tensor_type
    dtype = elem_to_dtype(tt.elem_type)
    if not tt.HasField("shape"):
        return TensorType(dtype, None)
    dims: list = []
    for d in tt.shape.dim:
        which = d.WhichOneof("value")
        if which == "dim_value":
            dims.append(int(d.dim_value) if d.dim_value >= 0 else None)
        elif which == "dim_param":
            dims.append(from_dim_param(d.dim_param))
        else:
            dims.append(None)
    return TensorType(dtype, tuple(dims))
