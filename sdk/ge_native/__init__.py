"""The native runtime that kernels share: C sources shipped as package data (``csrc/``), the
compile-once build cache (:mod:`ge_native.native`), the thread pool (:mod:`ge_native.parallel`),
the instruction-set dispatch layer (:mod:`ge_native.isa`), the one activation table
(:mod:`ge_native.activations`), the GEMM and NCHWc kernel families, validated code generation
(:mod:`ge_native.gensrc`) and the numba helpers (:mod:`ge_native.jit`, :mod:`ge_native.vmath`).
Builds only on :mod:`ge_core`; docs/native.md describes it.
"""
