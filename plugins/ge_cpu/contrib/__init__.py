"""Kernels of the contrib ops ``ge_llm`` declares (domain ``com.microsoft``): ``norms``
(layer norms with skip and bias, activations, rotary, embeddings), ``attention`` (Attention,
MultiHeadAttention, GroupQueryAttention with its KV cache), ``nbits`` (MatMulNBits). ``KERNELS``
maps ``(domain, op_type)`` to a kernel factory, as :data:`ge_cpu.kernels.KERNELS` does."""

from __future__ import annotations

from ge_core.kernel import KernelFactory

from . import attention, nbits, norms

KERNELS: dict[tuple[str, str], KernelFactory] = {**norms.KERNELS, **attention.KERNELS, **nbits.KERNELS}
