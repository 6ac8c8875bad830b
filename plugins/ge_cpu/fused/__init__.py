"""The cpu backend's kernels of the fused ops (domain ``ge.fused``: declared by ge_fusion, the
names and the program format shared through :mod:`ge_sdk.fused`) and their code generation:
:mod:`.kernels` (:data:`.kernels.KERNELS`; the factories by op family in :mod:`.elementwise`,
:mod:`.epilogues`, :mod:`.attention_kernel`, :mod:`.norms`), :mod:`.forms` (each elementwise op's
NumPy, numexpr and C spelling), :mod:`.codegen` (generated NumPy / numexpr kernels),
:mod:`.loopgen` (compiled C loops and row kernels), :mod:`.attention` and :mod:`.rmsnorm`."""
