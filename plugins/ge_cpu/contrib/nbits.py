"""The kernel of ``com.microsoft::MatMulNBits`` (``ge_llm.nbits`` defines it): onnxruntime's
packed ``B``, scales and zero points repacked once, when the kernel is built, into the layout
:mod:`ge_native.nbits` reads (every size checked against K, N, bits and block_size first, a
misfit a GraphError naming the node); decode reads the 4/8-bit weights and dequantises them in
registers, prefill dequantises a panel at a time, ``accuracy_level`` 4 sums int8 activations in
int32 (with float zero points float32, as onnxruntime's CPU kernel does). A non-constant ``B`` is repacked each call; a ``g_idx`` that is not ``row // block_size``,
or no native module, computes with the float32 weight dequantised once (NumPy)."""

from __future__ import annotations

import math

import numpy as np

from ge_core.errors import GraphError
from ge_core.kernel import KernelSpec, with_caps
from ge_native import isa, nbits, parallel

DOMAIN = "com.microsoft"


def has_input(spec: KernelSpec, i: int) -> bool:
    return i < len(spec.inputs) and spec.inputs[i] is not None


def const_input(spec: KernelSpec, i: int) -> np.ndarray | None:
    return spec.const_inputs[i] if i < len(spec.const_inputs) else None


def _attrs(spec: KernelSpec) -> tuple[int, int, int, int, int]:
    try:
        k, n = int(spec.attr("K")), int(spec.attr("N"))
        bits, bs = int(spec.attr("bits", 4)), int(spec.attr("block_size"))
        acc = int(spec.attr("accuracy_level", 0))
    except (TypeError, ValueError):
        raise GraphError(f"{spec.describe()}: attributes K, N, bits, block_size (integers) are required",
                         hint="the model's quantiser writes them: re-export it") from None
    if bits not in nbits.BITS or bs < 16 or bs & (bs - 1) or bs > 4096 or not 0 <= acc <= 4 or k < 1 or n < 1:
        raise GraphError(f"{spec.describe()}: K={k}, N={n}, bits={bits}, block_size={bs}, accuracy_level={acc} "
                         "are not MatMulNBits attributes", hint="bits 2, 4 or 8; block_size a power of two >= 16")
    return k, n, bits, bs, acc


def _pack(spec: KernelSpec, b, scales, zp, k: int, n: int, bits: int, bs: int) -> nbits.PackedNBits:
    try:
        return nbits.PackedNBits(b, scales, zp, k, n, bits, bs)
    except ValueError as e:
        raise GraphError(f"{spec.describe()}: {e}", hint="B, scales and zero_points must be the quantiser's "
                                                            "output for these K, N, bits and block_size") from None


def _trivial(g_idx: np.ndarray | None, k: int, bs: int) -> bool:
    return g_idx is None or (g_idx.size == k and bool(np.array_equal(g_idx.reshape(-1), np.arange(k) // bs)))


def matmul_nbits_factory(spec: KernelSpec):
    k, n, bits, bs, acc = _attrs(spec)
    b, scales = const_input(spec, 1), const_input(spec, 2)
    zp = const_input(spec, 3) if has_input(spec, 3) else None
    g_idx = const_input(spec, 4) if has_input(spec, 4) else None
    bias_c = const_input(spec, 5) if has_input(spec, 5) else None
    if has_input(spec, 4) and (g_idx is None or g_idx.size != k or g_idx.min(initial=0) < 0
                               or g_idx.max(initial=0) >= -(-k // bs)):
        raise GraphError(f"{spec.describe()}: g_idx must be a constant of K = {k} block indices below k_blocks",
                         hint="re-export the model with its g_idx as an initializer")
    consts = b is not None and scales is not None and (zp is not None or not has_input(spec, 3))
    zt = spec.inputs[3].dtype if has_input(spec, 3) else None  # type: ignore[union-attr]
    if acc == 4 and zt is not None and np.dtype(zt).kind == "f":
        acc = 0  # float zero points: float32 sums, as onnxruntime's CPU kernel computes them
    native = nbits.available() and _trivial(g_idx, k, bs)
    packed = _pack(spec, b, scales, zp, k, n, bits, bs) if consts else None
    dense: list[np.ndarray] = []
    if b is not None and scales is not None and consts and not native:
        dense.append(nbits.dequantize(b, scales, zp, k, n, bits, bs, g_idx).astype(np.float32))
    bias_f = None if bias_c is None else np.ascontiguousarray(bias_c.reshape(-1).astype(np.float32))
    # the constant weight's call with everything but the operands fixed (a decode step makes 5 a layer)
    fast = nbits.prepared(packed, bias_f, acc) if native and packed is not None else None

    def kernel(a, b_in=None, s_in=None, z_in=None, g_in=None, bias_in=None, out=None):
        if a.ndim < 1 or a.shape[-1] != k:
            raise ValueError(f"{spec.describe()}: A {a.shape} does not end in K = {k}")
        shape = a.shape[:-1] + (n,)
        rows = math.prod(a.shape[:-1])
        a2 = np.ascontiguousarray(a.reshape(rows, k), np.float32)
        bias = bias_f if bias_f is not None or bias_in is None else np.ascontiguousarray(bias_in.reshape(-1), np.float32)
        if bias is not None and bias.shape != (n,):
            raise ValueError(f"{spec.describe()}: bias {bias.shape} is not (N,) = ({n},)")
        o = None if out is None else out[0]
        y = o if o is not None and o.shape == shape and o.dtype == np.float32 and o.flags.c_contiguous \
            and o.flags.writeable and not np.may_share_memory(o, a) else np.empty(shape, np.float32)
        y2 = y.reshape(rows, n)
        if fast is not None and bias is bias_f and fast(a2, y2, parallel.native_width()):
            return (y if y.dtype == a.dtype else y.astype(a.dtype),)
        p = packed
        if native and p is None:
            p = _pack(spec, b_in, s_in, z_in, k, n, bits, bs)
        if not native or p is None or not nbits.matmul(a2, p, y2, bias, acc, parallel.native_width()):
            if dense:
                w = dense[0]
            else:
                _pack(spec, b_in, s_in, z_in, k, n, bits, bs)  # (checks the sizes)
                w = nbits.dequantize(b_in, s_in, z_in, k, n, bits, bs, g_in).astype(np.float32)
            np.matmul(a2, w, out=y2)
            if bias is not None:
                y2 += bias
        return (y if y.dtype == a.dtype else y.astype(a.dtype),)

    with_caps(kernel, accepts_out=True)
    if native:
        with_caps(kernel, variant=isa.variant_of("nbits"), algorithm="nbits_accuracy4" if acc == 4 else "nbits")
    return kernel


KERNELS = {(DOMAIN, "MatMulNBits"): matmul_nbits_factory}
