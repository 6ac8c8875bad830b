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
    from .kernels.reference_fallback import fallback_op_types, reference_factory

    for (domain, op_type), factory in KERNELS.items():
        register(op_type, factory, domain=domain, backend="cpu")
    # The long tail of the ONNX domain runs through onnx.reference behind the same interface.
    for op_type in fallback_op_types():
        register(op_type, reference_factory, domain="", backend="cpu")
