"""Hook implementations of the ``ge_cpu`` plugin: the cpu backend and its NumPy kernels."""

from __future__ import annotations

from ge_core.hookspecs import hookimpl


@hookimpl
def ge_register_backends(register):
    from .executor import CpuBackend

    register(CpuBackend())


@hookimpl
def ge_register_kernels(register):
    from .kernels import KERNELS

    for (domain, op_type), factory in KERNELS.items():
        register(op_type, factory, domain=domain, backend="cpu")
