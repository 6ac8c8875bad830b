"""The PyTorch frontend: ``nn.Module`` + example inputs, ``ExportedProgram`` or ``.pt2`` to a Graph.

Sources it reads (``ge.load(source, ...)``):

* an ``nn.Module`` with ``example_inputs=(x, ...)`` (and optionally ``example_kwargs={...}``,
  ``dynamic_shapes=...`` as :func:`torch.export.export` takes them), or the tuple
  ``(module, example_inputs)`` / ``(module, example_inputs, example_kwargs)``;
* a ``torch.export.ExportedProgram``;
* a ``.pt2`` file written by :func:`torch.export.save`, read without unpickling anything
  (:mod:`ge_torch.pt2`; ``torch.export.load`` would unpickle parts of it).

The program is lowered to core ATen (``run_decompositions``), keeping whole the composite ops
a mapper maps better than their decomposition (linear, layer_norm, matmul, ...), then every op
is mapped by the op mapper registered as ``("torch", op)`` (see :mod:`ge_torch.convert`).
Parameters, buffers and tensor constants become graph constants (copies: the module may go on
changing). Dimensions declared dynamic with ``torch.export.Dim`` stay symbolic: the graph's
input types carry the Dim's name (``"batch"``) where it can be told, else torch's symbol.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from ge_core.errors import GEError, ModelFileError, OptionError, UnsupportedOpError
from ge_core.frontend import Frontend
from ge_core.ir.graph import Graph

from .convert import FRAMEWORK, Converter

#: Composite ATen ops kept whole when a mapper for them is registered.
KEEP_WHOLE = (
    "aten.linear.default", "aten.layer_norm.default", "aten.matmul.default", "aten.silu.default",
    "aten.hardswish.default", "aten.hardsigmoid.default", "aten.gelu.default",
)


def torch_mappers(regs=None) -> dict[str, Any]:
    """The op mappers registered for framework ``"torch"``: ``{op key: mapper}``."""
    from ge_core.plugins import registries

    regs = regs or registries()
    return {op: m for (fw, op), m in regs.op_mappers.items() if fw == FRAMEWORK}


def _torch():
    try:
        import torch
    except ImportError:
        raise ModelFileError("PyTorch is not installed", hint="pip install 'ge-python[torch]'") from None
    return torch


class TorchFrontend(Frontend):
    name = "torch"
    suffixes = (".pt2",)

    def accepts_object(self, obj: Any) -> bool:
        if "torch" not in sys.modules:  # nothing of torch's can exist without it imported
            return False
        import torch

        if isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram)):
            return True
        return (isinstance(obj, tuple) and len(obj) in (2, 3) and isinstance(obj[0], torch.nn.Module)
                and isinstance(obj[1], (tuple, list, torch.Tensor)))

    def sniff(self, path: str, head: bytes) -> bool:
        return os.path.splitext(path)[1].lower() in self.suffixes

    def load(self, source: Any, options) -> Graph:
        ep, label, dim_names = export_program(
            source, options.getoption("example_inputs"), options.getoption("example_kwargs"),
            options.getoption("dynamic_shapes"),
        )
        ep = lower(ep, torch_mappers(), decompose=options.getoption("torch_decompose", True))
        conv = Converter(torch_mappers(), source=label, dim_names=dim_names)
        graph, plan = conv.convert_program(ep, name=_graph_name(source))
        if any(not hasattr(p, "type") for p in plan):
            raise UnsupportedOpError(
                f"{label}: some outputs are Python constants, not tensors",
                hint="return only tensors from forward()",
            )
        if options is not None and options.getoption("input_shape"):
            _apply_input_shape(graph, options.getoption("input_shape"), label)
        ranges = _dim_ranges(ep, dim_names, graph)
        if ranges:
            graph.metadata["ge.dim_ranges"] = ranges  # the compiler checks and keeps them (ge_core.memory.dim_ranges)
        graph.metadata["producer"] = f"torch {_torch().__version__}"
        return graph


def _finite_int(x: Any) -> int | None:
    if not getattr(x, "is_finite", True):
        return None
    try:
        return int(x)
    except Exception:  # noqa: BLE001 - a sympy value that is no integer: no bound
        return None


def _dim_ranges(ep: Any, dim_names: Mapping[str, str], graph: Graph) -> dict[str, list]:
    """The ranges ``torch.export`` keeps for the input symbols (``Dim("seq", max=64)``), by the
    graph's names for them. A lower bound up to 2 becomes 1: torch's 0 or 2 (its 0/1
    specialisation) is not the model's, and a run with a dim below 1 is not planned anyway."""
    used = {d for v in graph.inputs for d in (v.type.shape or ()) if isinstance(d, str)}
    out: dict[str, list] = {}
    for sym, vr in (getattr(ep, "range_constraints", None) or {}).items():
        name = dim_names.get(str(sym), str(sym))
        if name not in used:
            continue
        lo = _finite_int(vr.lower)
        hi = _finite_int(vr.upper)  # sympy's oo: no upper bound
        if hi is not None and hi >= 1 << 62:
            hi = None
        lo = 1 if lo is None or lo <= 2 else lo
        if hi is None and lo <= 1:
            continue
        out[name] = [lo, hi if hi is None or hi >= lo else lo]
    return out


def _graph_name(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.path.splitext(os.path.basename(os.fspath(source)))[0] or "torch_model"
    mod = source[0] if isinstance(source, tuple) else source
    name = type(mod).__name__
    return "torch_model" if name in ("ExportedProgram", "GraphModule") else name


def _apply_input_shape(graph: Graph, shapes: Mapping[str, tuple], label: str) -> None:
    from ge_core.ir.types import TensorType
    from ge_sdk.shapes import frontend_dims

    names = {v.name: v for v in graph.inputs}
    for k, dims in shapes.items():
        if k not in names:
            raise OptionError(f"input_shape names '{k}', which is not an input of {label}",
                              hint=f"the model's inputs: {', '.join(names) or 'none'}")
        v = names[k]
        v.type = TensorType(v.type.dtype, frontend_dims(v.type.shape, tuple(dims), k))


# ------------------------------------------------------------------------------------------
# export and lowering
# ------------------------------------------------------------------------------------------
def export_program(source: Any, example_inputs: Any = None, example_kwargs: Any = None,
                   dynamic_shapes: Any = None) -> tuple[Any, str, dict[str, str]]:
    """``(ExportedProgram, label, {torch symbol: Dim name})`` for any source the frontend reads."""
    torch = _torch()
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelFileError(f"model file '{path}' does not exist", hint="check the path")
        from .pt2 import load_exported_program  # never torch.export.load: it unpickles

        return load_exported_program(path), path, {}
    if isinstance(source, torch.export.ExportedProgram):
        return source, "<ExportedProgram>", {}
    if isinstance(source, tuple):
        module = source[0]
        example_inputs = source[1]
        if len(source) == 3:
            example_kwargs = source[2]
    else:
        module = source
    if not isinstance(module, torch.nn.Module):
        raise ModelFileError(f"the torch frontend cannot read a {type(source).__name__}",
                             hint="give an nn.Module with example_inputs, an ExportedProgram or a .pt2 path")
    label = f"<{type(module).__name__}>"
    if example_inputs is None:
        raise OptionError(
            f"{label}: exporting an nn.Module needs example inputs",
            hint="ge.load(module, example_inputs=(x,)) or ge.load((module, (x,)))",
        )
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    if module.training:
        warnings.warn(f"{label} is in training mode; GE compiles inference graphs: call model.eval() first",
                      stacklevel=4)
    try:
        ep = torch.export.export(module, args, kwargs or None, dynamic_shapes=dynamic_shapes, strict=False)
    except GEError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise ModelFileError(
            f"{label}: torch.export failed: {type(e).__name__}: {msg[0] if msg else ''}",
            hint="the model must be exportable with torch.export.export(model, example_inputs)",
        ) from e
    return ep, label, _dim_names(module, ep, args, kwargs, dynamic_shapes)


def lower(ep: Any, mappers: Mapping[str, Any], *, decompose: bool = True) -> Any:
    """Lower ``ep`` to core ATen, keeping whole the ops of :data:`KEEP_WHOLE` that have mappers."""
    if not decompose:
        return ep
    torch = _torch()
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if str(op) in KEEP_WHOLE and str(op) in mappers:
            del table[op]
    try:
        return ep.run_decompositions(table)
    except Exception as e:
        raise UnsupportedOpError(f"lowering the exported program to core ATen failed: {type(e).__name__}: {e}") from e


def _dim_names(module: Any, ep: Any, args: tuple, kwargs: dict, dynamic_shapes: Any) -> dict[str, str]:
    """Map torch's shape symbols (``s77``) to the names of the ``Dim`` objects that made them."""
    if not dynamic_shapes:
        return {}
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    per_input: list[Any] = []
    if isinstance(dynamic_shapes, Mapping):
        names = params[: len(args)] + [k for k in params if k in kwargs]
        per_input = [dynamic_shapes.get(n) for n in names]
    elif isinstance(dynamic_shapes, (list, tuple)):
        per_input = list(dynamic_shapes)
    from torch.export.graph_signature import InputKind

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    phs = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    out: dict[str, str] = {}
    for name, spec in zip(users, per_input):
        node = phs.get(name)
        val = node.meta.get("val") if node is not None else None
        if spec is None or val is None or not hasattr(val, "shape"):
            continue
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        for axis, dim in items:
            dname = getattr(dim, "__name__", None)
            if dname is None or not isinstance(axis, int) or axis >= len(val.shape):
                continue
            expr = getattr(getattr(val.shape[axis], "node", None), "expr", None)
            if expr is not None and getattr(expr, "is_Symbol", False):
                out[str(expr)] = dname
    return out
