"""ONNX element types and TypeProtos <-> the IR's dtypes and TensorTypes.

For plugins that speak ONNX protos (the op set's inference, the ONNX frontend and exporter);
plugins reach each other only through registries, so the conversions they share live here.
``onnx`` is imported only when a conversion needs it.
"""

from __future__ import annotations

import functools

import numpy as np

from ge_core.ir.types import TensorType


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
            dims.append(d.dim_param or None)
        else:
            dims.append(None)
    return TensorType(dtype, tuple(dims))
