"""NumPy CPU kernels of the default ``ge_cpu`` backend.

``KERNELS`` maps ``(domain, op_type)`` (domain ``""`` is ONNX's default domain) to a kernel
factory: ``factory(spec: KernelSpec) -> kernel``; ``kernel(*inputs)`` returns a tuple with one
``np.ndarray`` per output (never a NumPy scalar, even for 0-d results). Kernels never write into
their inputs but may return views of them (Reshape, Squeeze, Slice, Transpose, Identity, ...).

Modules: ``elementwise`` (arithmetic, activations, logic, Cast, Clip, Where, variadic),
``matmul`` (MatMul, Gemm, Einsum), ``nn`` (Conv, ConvTranspose, pooling, LRN, normalisations,
Softmax family, Dropout), ``reduce`` (Reduce*, ArgMax/ArgMin), ``resize`` (Resize, Upsample),
``tensor`` (shape and data movement), ``control`` (If, Loop, Scan, SequenceMap, sequence and
optional ops; sequences are lists of arrays, an empty optional is ``None``), ``recurrent`` (LSTM,
GRU, RNN), ``quant`` (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
QLinearMatMul, ConvInteger, QLinearConv), ``normalization`` (GroupNormalization,
RMSNormalization, LpNormalization), ``attention`` (Attention, RotaryEmbedding), ``activations``
(Swish, SwiGLU), ``tensor_extra`` (CumProd, ReverseSequence, Compress, EyeLike, ReduceLogSum).
``reference_fallback`` runs any other ONNX op through ``onnx.reference`` and is not part of
``KERNELS``. The Conv kernel's algorithms are the ``conv`` subpackage's table; ``_util`` (the
kernels' spec helpers) and ``_window`` (the compiled window loop) are private to the package
and its subpackages.
"""

from __future__ import annotations

import functools

import numpy as np

from ge_core.kernel import KernelFactory, KernelSpec, caps, copy_caps

from . import (
    activations,
    attention,
    control,
    elementwise,
    matmul,
    nn,
    normalization,
    quant,
    recurrent,
    reduce,
    resize,
    tensor,
    tensor_extra,
)


def _arrays_out(factory: KernelFactory) -> KernelFactory:
    """Wrap a factory so its kernel always returns a tuple of ndarrays (0-d ufunc results are
    NumPy scalars otherwise)."""

    @functools.wraps(factory)
    def build(spec: KernelSpec):
        kernel = factory(spec)
        if caps(kernel).accepts_out:
            def run_out(*inputs, out=None, **epilogue):
                if epilogue:  # KernelCaps.epilogue: the kernel returns (outputs, applied)
                    return kernel(*inputs, out=out, **epilogue)
                if out is not None:
                    return kernel(*inputs, out=out)
                return tuple(o if type(o) is np.ndarray or type(o) is list or o is None else np.asarray(o)
                             for o in kernel(*inputs))

            copy_caps(run_out, kernel)
            run_out.__wrapped__ = kernel  # type: ignore[attr-defined]
            run_out.__name__ = f"{spec.op_type}_kernel"
            return run_out

        def run(*inputs, **epilogue):
            if epilogue:
                return kernel(*inputs, **epilogue)
            outs = kernel(*inputs)
            return tuple(o if type(o) is np.ndarray or type(o) is list or o is None else np.asarray(o)
                         for o in outs)

        copy_caps(run, kernel)
        run.__wrapped__ = kernel  # type: ignore[attr-defined]
        run.__name__ = f"{spec.op_type}_kernel"
        return run

    return build


KERNELS: dict[tuple[str, str], KernelFactory] = {}
for _mod in (control, elementwise, matmul, nn, reduce, resize, tensor, recurrent, quant, normalization, attention,
             activations, tensor_extra):
    for _key, _factory in _mod.KERNELS.items():
        if _key in KERNELS:  # pragma: no cover - a programming error caught by the tests
            raise RuntimeError(f"kernel {_key} defined twice")
        KERNELS[_key] = _arrays_out(_factory)

__all__ = ["KERNELS", "util", "window"]
