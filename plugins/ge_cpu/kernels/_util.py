"""Helpers shared by the NumPy kernel modules (build-time only; nothing here runs per call)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.errors import UnsupportedOpError
from ge_core.kernel import KernelSpec
from ge_sdk.onnx_types import ELEM_TYPE_NAMES


def onnx_dtype(spec: KernelSpec, code: int) -> np.dtype:
    """NumPy dtype of an ONNX TensorProto data type code."""
    name = ELEM_TYPE_NAMES.get(int(code))
    if name is None:
        raise unsupported(spec, f"ONNX data type {code}")
    if name == "string":
        return np.dtype(object)
    if name in ("bfloat16", "uint4", "int4", "float4_e2m1") or name.startswith("float8"):
        try:
            import ml_dtypes
        except ImportError as exc:  # pragma: no cover - ml_dtypes ships with onnx
            raise unsupported(spec, f"data type {name} (ml_dtypes is not installed)") from exc
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def unsupported(spec: KernelSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"{spec.describe()}: {what} is not supported by the ge_cpu NumPy kernel",
        hint="change the model, or register a kernel plugin that supports it",
    )


def n_inputs(spec: KernelSpec) -> int:
    return len(spec.inputs)


def has_input(spec: KernelSpec, i: int) -> bool:
    return i < len(spec.inputs) and spec.inputs[i] is not None


def const_input(spec: KernelSpec, i: int) -> np.ndarray | None:
    if i < len(spec.const_inputs):
        return spec.const_inputs[i]
    return None


def in_dtype(spec: KernelSpec, i: int = 0) -> np.dtype | None:
    if i < len(spec.inputs) and spec.inputs[i] is not None:
        return spec.inputs[i].dtype
    return None


def out_dtype(spec: KernelSpec, i: int = 0) -> np.dtype | None:
    if i < len(spec.outputs) and spec.outputs[i] is not None:
        return spec.outputs[i].dtype
    return None


def in_rank(spec: KernelSpec, i: int = 0) -> int | None:
    if i < len(spec.inputs) and spec.inputs[i] is not None:
        return spec.inputs[i].rank
    return None


def in_shape(spec: KernelSpec, i: int = 0):
    if i < len(spec.inputs) and spec.inputs[i] is not None:
        return spec.inputs[i].shape
    return None


def ints(value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return [int(v) for v in value.reshape(-1)]
    if isinstance(value, (int, np.integer)):
        return [int(value)]
    return [int(v) for v in value]


def as_str(value: Any, default: str | None = None) -> str | None:
    if value is None:
        return default
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    return tuple(a + rank if a < 0 else a for a in axes)


def is_float(dtype: np.dtype | None) -> bool:
    return dtype is not None and np.issubdtype(dtype, np.floating)


def cast_like(result: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast ``result`` to ``dtype`` without copying when it already has it."""
    if result.dtype != dtype:
        return result.astype(dtype, copy=False)
    return result


def kernel_table():
    """A module's kernel table and the decorator that fills it: ``@reg("Add", "Sub")``
    registers a factory under ``("", op)`` for each name."""
    table: dict = {}

    def reg(*names: str):
        def deco(fn):
            for n in names:
                table[("", n)] = fn
            return fn

        return deco

    return table, reg
