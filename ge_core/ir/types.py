"""Tensor types: an element dtype (a NumPy dtype) and a shape whose dims may be symbolic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from .symbolic import SymExpr, evaluate, norm

#: One dimension: a static size, a symbolic name such as ``"N"``, an expression of symbols
#: (:class:`~ge_core.ir.symbolic.SymExpr`, e.g. ``N*S*64``), or ``None`` (unknown).
Dim = Union[int, str, SymExpr, None]
#: A shape: a tuple of dims, or ``None`` when even the rank is unknown.
Shape = Union[tuple, None]


def as_dtype(dtype) -> np.dtype | None:
    """Normalise anything NumPy accepts as a dtype (or None) to ``np.dtype``."""
    if dtype is None:
        return None
    return np.dtype(dtype)


def dtype_name(dtype: np.dtype | None) -> str:
    """Stable short name of a dtype (``float32``, ``bfloat16``, ``object`` for strings)."""
    if dtype is None:
        return "?"
    if dtype == np.dtype(object):
        return "string"
    return str(dtype.name)


def parse_dtype(name: str) -> np.dtype:
    """Inverse of :func:`dtype_name`; raises ``TypeError`` for a name NumPy does not know."""
    if name == "string":
        return np.dtype(object)
    if name == "bfloat16" or name.startswith("float8") or name in ("int4", "uint4", "float4_e2m1"):
        import ml_dtypes  # shipped with onnx; only needed for these exotic types

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


@dataclass(frozen=True)
class TensorType:
    """The type of a tensor value: element dtype and (possibly partial) shape."""

    dtype: np.dtype | None = None
    shape: Shape = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(_norm_dim(d) for d in self.shape))

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when the rank and every dim are known integers."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int | None:
        """Element count for a static shape, else None."""
        if self.shape is None or not self.is_static:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        """Byte size for a static shape and fixed-size dtype, else None."""
        n = self.numel
        if n is None or self.dtype is None or self.dtype == np.dtype(object):
            return None
        return n * self.dtype.itemsize

    def with_shape(self, shape: Shape) -> TensorType:
        return TensorType(self.dtype, shape)

    @property
    def symbols(self) -> set[str]:
        """The symbol names the dims read (a symbolic dim, or inside an expression)."""
        out: set[str] = set()
        for d in self.shape or ():
            if isinstance(d, str):
                out.add(d)
            elif isinstance(d, SymExpr):
                out |= d.symbols()
        return out

    def bind(self, binding) -> TensorType:
        """The type with every symbolic dim evaluated under ``binding`` (symbol -> int);
        KeyError for a symbol it does not bind, TypeError for an unknown dim or rank."""
        if self.shape is None:
            raise TypeError("a type of unknown rank has no bound shape")
        return TensorType(self.dtype, tuple(evaluate(d, binding) for d in self.shape))

    def __str__(self) -> str:
        if self.shape is None:
            dims = "*"
        else:
            dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{dtype_name(self.dtype)}[{dims}]"

    @classmethod
    def of(cls, array: np.ndarray) -> TensorType:
        """The exact type of a concrete array."""
        return cls(array.dtype, tuple(int(d) for d in array.shape))


def _norm_dim(d):
    if d is None or isinstance(d, str):
        return d
    if isinstance(d, SymExpr):
        d = norm(d)
        if not isinstance(d, int):
            return d
    if isinstance(d, (int, np.integer)):
        d = int(d)
        if d < 0:
            return None
        return d
    raise TypeError(f"a dim must be int, str, SymExpr or None, not {type(d).__name__}")
