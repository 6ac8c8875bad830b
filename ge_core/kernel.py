"""The kernel interface shared by backends and by plugins that add ops.

A *kernel factory* is registered per (backend, domain, op type) through ``ge_register_kernels``.
At build time it receives a :class:`KernelSpec` describing one node (attributes already
resolved, input/output types, constant inputs) and returns a callable that runs the node:
``kernel(*inputs) -> sequence of arrays`` (one per output). All attribute parsing and
specialisation happen in the factory, so the returned callable does only the arithmetic.

Preallocated outputs. A kernel that can write into memory the executor planned sets
``kernel.accepts_out = True``; the executor may then call ``kernel(*inputs, out=(a0, a1, ...))``
with one C-contiguous array per output (exact dtype and shape). Such a kernel writes its results
there and returns those same arrays. ``kernel.inplace_ok = True`` additionally allows an ``out``
array to be the memory of an input that dies at this node (elementwise ops). Kernels without
these attributes return fresh arrays (or views of their inputs), which the executor copies into
its plan where it needs to. Kernels never write into their inputs otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .ir.types import TensorType

Kernel = Callable[..., Sequence[np.ndarray]]


def accepts_out(kernel: Kernel) -> bool:
    """True if ``kernel`` takes preallocated outputs through ``out=``."""
    return bool(getattr(kernel, "accepts_out", False))
KernelFactory = Callable[["KernelSpec"], Kernel]


@dataclass
class KernelSpec:
    """Everything a kernel factory may know about the node it builds for."""

    name: str
    op_type: str
    domain: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    #: Type of each input; None where an optional input is absent.
    inputs: list[TensorType | None] = field(default_factory=list)
    outputs: list[TensorType] = field(default_factory=list)
    #: Value of each input that is a constant at build time (e.g. Reshape's shape), else None.
    const_inputs: list[np.ndarray | None] = field(default_factory=list)
    #: Opset version of the node's domain in the model.
    opset: int = 0
    #: Backend options (threads etc.).
    options: dict[str, Any] = field(default_factory=dict)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def describe(self) -> str:
        dom = f"{self.domain}::" if self.domain else ""
        return f"node '{self.name}' ({dom}{self.op_type})"

    @classmethod
    def from_node(cls, node, options=None, **backend_options: Any) -> KernelSpec:
        """Describe a graph node for a kernel factory (used by backends and folding passes)."""
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        root = node.graph
        while root is not None and root.parent is not None:
            root = root.parent
        imports = root.opset_imports if root is not None else {}
        opts: dict[str, Any] = {"threads": getattr(options, "threads", None)}
        opts.update(backend_options)
        return cls(
            name=node.name,
            op_type=node.op_type,
            domain=dom,
            attrs=dict(node.attrs),
            inputs=[None if v is None else v.type for v in node.inputs],
            outputs=[v.type for v in node.outputs],
            const_inputs=[None if v is None else v.const_value for v in node.inputs],
            opset=imports.get(dom, imports.get(node.domain, 0)),
            options=opts,
        )
