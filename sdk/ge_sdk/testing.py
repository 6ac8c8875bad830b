"""Test helpers for plugin authors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ge_core.ir import Graph, TensorType, Value
from ge_core.plugins import get_host


@contextlib.contextmanager
def temporary_plugin(plugin: Any, name: str | None = None) -> Iterator[str]:
    """Register ``plugin`` (module, class or object with hookimpls) in-process for a block."""
    host = get_host()
    pname = host.register_plugin(plugin, name)
    try:
        yield pname
    finally:
        host.unregister_plugin(pname)


class GraphBuilder:
    """Small fluent builder: ``b = GraphBuilder(); x = b.input("x", "float32", (1, 4));
    y = b.op("Relu", x); b.output(y); g = b.graph``."""

    def __init__(self, name: str = "g", opset: int = 17) -> None:
        self.graph = Graph(name)
        self.graph.opset_imports[""] = opset

    def input(self, name: str, dtype: Any = "float32", shape: tuple | None = None) -> Value:
        return self.graph.add_input(name, TensorType(dtype, shape))

    def const(self, array: Any, name: str | None = None) -> Value:
        return self.graph.add_constant(np.asarray(array), name)

    def op(self, op_type: str, *inputs: Value | None, num_outputs: int = 1, domain: str = "", **attrs: Any):
        node = self.graph.add_node(op_type, list(inputs), attrs, domain=domain, num_outputs=num_outputs)
        return node.outputs[0] if num_outputs == 1 else tuple(node.outputs)

    def output(self, *values: Value) -> None:
        for v in values:
            self.graph.add_output(v)
