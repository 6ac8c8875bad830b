"""Hook implementations of the ``ge_torch`` plugin. Importing this module does not import torch."""

from __future__ import annotations

from ge_core.hookspecs import RegisterFrontend, RegisterOpMapper, RegisterOption, hookimpl


@hookimpl
def ge_register_frontends(register: RegisterFrontend) -> None:
    from .frontend import TorchFrontend

    register(TorchFrontend())


@hookimpl
def ge_register_op_mappers(register: RegisterOpMapper) -> None:
    from .mappers import MAPPERS

    for key, mapper in MAPPERS.items():
        register("torch", key, mapper)


@hookimpl
def ge_register_options(register: RegisterOption) -> None:
    register("example_inputs", None, "torch: positional example inputs of an nn.Module to export")
    register("example_kwargs", None, "torch: keyword example inputs of an nn.Module to export")
    register("dynamic_shapes", None, "torch: dynamic_shapes for torch.export.export (torch.export.Dim)")
    register("torch_decompose", True, "torch: lower the exported program to core ATen before mapping")
