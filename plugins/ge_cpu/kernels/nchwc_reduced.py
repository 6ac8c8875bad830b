"""An NchwcConv in a reduced precision (the ``reduced_precision`` pass's rewrite and its kernel).

- ``bfloat16``: an ungrouped convolution on a blocked input gets ``weight_packing`` ``bf16``: its
  weight rounded to bf16 and packed at compile time by :class:`ge_native.bf16.PackedConv` (stored
  1-D, uint16), computed by :func:`ge_native.bf16.conv_nchwc` (implicit GEMM on AMX tiles or
  VDPBF16PS, float32 sums, bias, residual, clip and activation at the store);
- ``float16``: the float32 packing the layout pass chose (blocked, Winograd, depthwise, a stem's)
  is stored float16 and widened once when the kernel is built: the same kernels, half the bytes.
"""

from __future__ import annotations

import numpy as np

from ge_core.ir.graph import Graph, Node
from ge_core.kernel import KernelSpec, with_caps
from ge_native import bf16, nchwc, parallel
from ge_sdk import precision

from ..reduced import bf16_unit, unpack_bf16, widened_why

BLOCK = nchwc.BLOCK

#: the packing name of a bf16 weight
BF16 = "bf16"


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def rewrite(g: Graph, n: Node, want: str) -> str:
    """Store NchwcConv ``n``'s weight in ``want`` (in place); the reason it did not, or ''."""
    from .nchwc import unpack

    a = n.attrs
    packing = _text(a.get("weight_packing", ""))
    w_in = n.inputs[1] if len(n.inputs) > 1 else None
    wpk = None if w_in is None or w_in.const_value is None else np.asarray(w_in.const_value)
    if not packing or wpk is None or wpk.dtype != np.float32:
        return "its weight is not a constant the layout pass packed"
    w_shape = tuple(int(v) for v in a["weight_shape"])
    group = int(a.get("group", 1) or 1)
    plain = bool(int(a.get("plain_input", 0) or 0))
    if want == "float16":
        stored = np.ascontiguousarray(wpk.astype(np.float16))
        kernel = f"nchwc_{packing}"
        compute = "float32"
    else:
        if plain or group != 1 or packing not in ("blocked", "winograd2", "winograd4"):
            return ("a stem reading NCHW" if plain else "a grouped or depthwise convolution") + \
                " has no bf16 kernel: it stays float32"
        cb = int(n.inputs[0].type.shape[1])
        w = unpack(packing, wpk, w_shape, cb, group)
        stored = np.ascontiguousarray(bf16.PackedConv(np.ascontiguousarray(w, np.float32), cb).data).reshape(-1)
        a["weight_packing"] = BF16
        unit = bf16_unit()
        kernel, compute = f"nchwc_bf16_{unit or 'float32'}", ("bfloat16" if unit else "float32")
    n.set_input(1, g.add_constant(stored, g.names.fresh(f"{n.name}_w_{want}")))
    if not w_in.has_uses() and not w_in.is_graph_output:
        g.remove_constant(w_in)
    why = "" if compute == "bfloat16" else widened_why(want)
    precision.done(n, want, compute, kernel, why, wpk.nbytes - stored.nbytes)
    return ""


def stored_shape(w_shape, in_blocks: int) -> tuple[int, int, int]:
    """The shape of :class:`ge_native.bf16.PackedConv`'s bits for a weight of ``w_shape`` and
    ``in_blocks`` input blocks: the :class:`~ge_native.bf16.PackedB` of the ``(k, M)`` matrix,
    ``k = KH * KW * in_blocks * 16``."""
    m, _, kh, kw = (int(v) for v in w_shape)
    kp = -(-(kh * kw * int(in_blocks) * BLOCK) // bf16.KB) * bf16.KB
    return (-(-m // bf16.NR), kp // 2, 2 * bf16.NR)


def stored_size(w_shape, in_blocks: int) -> int:
    """The uint16 values of a bf16-packed weight of ``w_shape`` for ``in_blocks`` input blocks."""
    p, half, width = stored_shape(w_shape, in_blocks)
    return p * half * width


def widened(data: np.ndarray, w_shape, in_blocks: int) -> np.ndarray:
    """The ``(M, C, KH, KW)`` float32 values of a bf16-packed weight (the NumPy form's)."""
    m, c, kh, kw = (int(v) for v in w_shape)
    full = unpack_bf16(data, kh * kw * in_blocks * BLOCK, m).reshape(kh, kw, in_blocks * BLOCK, m)
    return np.ascontiguousarray(full.transpose(3, 2, 0, 1)[:, :c])


def bf16_conv_kernel(spec: KernelSpec, wpk, w_shape, cb: int, geometry, bias, has_b: bool, clip, act: str,
                     numpy_conv):
    """The kernel of an NchwcConv whose weight is packed in bf16 (``wpk``: the stored uint16
    values); ``numpy_conv(x5, w, b, z, y)`` is the NumPy form, run where the bf16 kernel does not
    (no bf16 unit here: with the bf16 values widened, the same products)."""
    k, s, d, pads = geometry
    m = w_shape[0]
    unit = bf16_unit()
    data = np.asarray(wpk, np.uint16).reshape(-1)
    if data.size != stored_size(w_shape, cb):
        raise ValueError(f"{spec.describe()}: a bf16 weight of {data.size} values, {stored_size(w_shape, cb)} expected")
    data = data.reshape(stored_shape(w_shape, cb))
    packed = bf16.PackedConv.from_data(data, tuple(w_shape), cb)
    dense: list = []  # the widened weight, for the NumPy form (made when first needed)

    def weight():
        if not dense:
            dense.append(widened(data, w_shape, cb))
        return dense[0]

    def kernel(x, w_in=None, b_in=None, z=None, sc=None, out=None):
        y = out[0] if out is not None else np.empty(spec.outputs[0].shape, np.float32)
        bv = bias if bias is not None else (None if not has_b or b_in is None else np.asarray(b_in, np.float32).reshape(-1))
        if bv is not None and bv.shape != (m,):
            raise ValueError(f"{spec.describe()}: a bias of shape {bv.shape} for {m} channels")
        if sc is not None:
            x = x * sc
        if unit is None or not bf16.conv_nchwc(x, packed, y, tuple(s), tuple(pads), tuple(d), bias=bv, clip=clip,
                                               act=act or None, addend=z, width=parallel.native_width(), variant=unit):
            numpy_conv(x, weight(), bv, z, y)
        return (y,)

    return with_caps(kernel, accepts_out=True, mode="nchwc bf16", algorithm="nchwc_bf16",
                     variant=unit or "float32 numpy")

