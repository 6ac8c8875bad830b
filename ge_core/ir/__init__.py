"""The graph IR."""

from .graph import Graph, Node, Value
from .types import Dim, Shape, TensorType, dtype_name, parse_dtype

__all__ = ["Graph", "Node", "Value", "TensorType", "Dim", "Shape", "dtype_name", "parse_dtype"]
