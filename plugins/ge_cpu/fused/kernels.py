"""CPU kernels of the fused ops (domain ``ge.fused``, declared by ge_fusion; backend ``cpu``).

FusedConv runs the cpu backend's own Conv kernel (found through the kernel registry) into the
output buffer and applies its epilogue there, in place. FusedMatMul,
Attention, LayerNorm and Softmax are NumPy/BLAS code writing into preallocated outputs; the
elementwise ops run generated kernels (:mod:`ge_cpu.fused.codegen`).

:mod:`.elementwise` (FusedElemwise, Gelu, Silu, and the shared spec helpers), :mod:`.epilogues`
(FusedConv, FusedMatMul), :mod:`.attention_kernel` (Attention), :mod:`.norms` (LayerNorm,
Softmax, Rotary) and :mod:`.rmsnorm` (RMSNorm) hold the factories; :data:`KERNELS` maps each op to its own.
"""

from __future__ import annotations

from ge_sdk import fused

from .attention_kernel import attention_factory
from .elementwise import elemwise_factory, gelu_factory, silu_factory
from .epilogues import conv_factory, matmul_factory
from .norms import layernorm_factory, rotary_factory, softmax_factory
from .rmsnorm import rmsnorm_factory

__all__ = ["KERNELS", "attention_factory", "conv_factory", "elemwise_factory", "gelu_factory", "layernorm_factory",
           "matmul_factory", "rmsnorm_factory", "rotary_factory", "silu_factory", "softmax_factory"]


#: The cpu kernel factory of every fused op (ge_cpu's ge_register_kernels registers them for domain ge.fused).
KERNELS = {
    fused.ROTARY: rotary_factory,
    fused.FUSED_CONV: conv_factory,
    fused.FUSED_MATMUL: matmul_factory,
    fused.FUSED_ELEMWISE: elemwise_factory,
    fused.ATTENTION: attention_factory,
    fused.LAYER_NORM: layernorm_factory,
    fused.RMS_NORM: rmsnorm_factory,
    fused.SOFTMAX: softmax_factory,
    fused.GELU: gelu_factory,
    fused.SILU: silu_factory,
}
