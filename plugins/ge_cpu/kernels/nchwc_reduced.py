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
from .nchwc import out_shape

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
        stem = plain and packing == "plain" and w_shape[1] <= bf16.PLAIN_MAX_CHANNELS
        if group != 1 or not (stem or (not plain and packing in ("blocked", "winograd2", "winograd4"))):
            return "a grouped or depthwise convolution has no bf16 kernel: it stays float32"
        cb = 0 if plain else int(n.inputs[0].type.shape[1])
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
    m, c, kh, kw = (int(v) for v in w_shape)
    kp = -(-(kh * kw * (int(in_blocks) * BLOCK or c)) // bf16.KB) * bf16.KB  # (0 blocks: a plain input)
    return (-(-m // bf16.NR), kp // 2, 2 * bf16.NR)


def stored_size(w_shape, in_blocks: int) -> int:
    """The uint16 values of a bf16-packed weight of ``w_shape`` for ``in_blocks`` input blocks."""
    p, half, width = stored_shape(w_shape, in_blocks)
    return p * half * width


def widened(data: np.ndarray, w_shape, in_blocks: int) -> np.ndarray:
    """The ``(M, C, KH, KW)`` float32 values of a bf16-packed weight (the NumPy form's)."""
    m, c, kh, kw = (int(v) for v in w_shape)
    lanes = in_blocks * BLOCK or c  # (0 blocks: a plain input, its channels only)
    full = unpack_bf16(data, kh * kw * lanes, m).reshape(kh, kw, lanes, m)
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

    # no bf16 unit here (an .om from a machine with one): the widened weight repacked once for the
    # float32 blocked kernels, the same products at their speed
    fp32 = None
    if unit is None and nchwc.available():
        fp32 = (nchwc.conv_plain, nchwc.pack_plain(weight())) if cb == 0 else \
            (nchwc.conv, nchwc.pack_weights(weight(), in_blocks=cb))

    def kernel(x, w_in=None, b_in=None, z=None, sc=None, out=None):
        y = out[0] if out is not None else np.empty(out_shape(spec, x), np.float32)  # (the batch may be a symbol)
        bv = bias if bias is not None else (None if not has_b or b_in is None else np.asarray(b_in, np.float32).reshape(-1))
        if bv is not None and bv.shape != (m,):
            raise ValueError(f"{spec.describe()}: a bias of shape {bv.shape} for {m} channels")
        if sc is not None:
            x = x * sc
        width = parallel.native_width()
        if unit is not None:
            done = bf16.conv_nchwc(x, packed, y, tuple(s), tuple(pads), tuple(d), bias=bv, clip=clip,
                                   act=act or None, addend=z, width=width, variant=unit)
        elif fp32 is not None:
            x = np.ascontiguousarray(x, np.float32) if cb == 0 else x
            done = fp32[0](x, fp32[1], y, k, s, d, pads[:2], nchwc.pad_bias(bv, m) if bv is not None else None, clip,
                           width, z, act or None)
        else:
            done = False
        if not done:
            numpy_conv(x, weight(), bv, z, y)
        return (y,)

    return with_caps(kernel, accepts_out=True, mode="nchwc bf16", algorithm="nchwc_bf16",
                     variant=unit or ("float32 " + ("nchwc" if fp32 is not None else "numpy")))


def rewrite_lone(g: Graph, n: Node, want: str) -> str:
    """A Conv/FusedConv the layout pass left in NCHW (a lone one, ViT's patch embedding) as a bf16
    NchwcConv between reorders: its input read as NCHW where it has at most a block of channels
    (:data:`ge_native.bf16.PLAIN_MAX_CHANNELS`), else reordered in; its output reordered out. The
    reason it did not, or ''."""
    from ge_core.ir.types import TensorType

    from ..blocked import blocked_type, conv_plan
    from .nchwc import DOMAIN

    if want != "bfloat16":
        return "a convolution outside the blocked layout has no float16 kernel: float32 weights"
    if bf16_unit() is None:
        return "this CPU has no bf16 unit faster than its float32 GEMM"
    w = n.inputs[1].const_value if len(n.inputs) > 1 and n.inputs[1] is not None else None
    p = conv_plan(n)
    if w is None or np.asarray(w).dtype != np.float32 or np.asarray(w).ndim != 4 or p is None:
        return "not a 2-D convolution with a constant float32 weight the blocked kernels take"
    attrs = dict(p["attrs"])
    if attrs.get("group", 1) != 1 or p["addend"]:
        return "a grouped convolution, or one with a residual, stays float32 outside the blocked layout"
    w = np.ascontiguousarray(w, np.float32)
    m, c = int(w.shape[0]), int(w.shape[1])
    x, y = n.inputs[0], n.outputs[0]
    plain = c <= bf16.PLAIN_MAX_CHANNELS
    if plain:
        x_in, cb = x, 0
        attrs["plain_input"] = 1
    else:
        cb = nchwc.blocks(c)
        attrs.pop("plain_input", None)
        x_in = g.add_node("NchwcReorderInput", [x], domain=DOMAIN, name=f"{n.name}_in", before=n,
                          output_types=[blocked_type(tuple(x.type.shape))]).outputs[0]
    attrs.update(weight_packing=BF16, weight_shape=[int(v) for v in w.shape])
    stored = np.ascontiguousarray(bf16.PackedConv(w, cb).data).reshape(-1)
    ins = [x_in, g.add_constant(stored, g.names.fresh(f"{n.name}_w_bf16")), n.inputs[2] if len(n.inputs) > 2 else None]
    conv = g.add_node("NchwcConv", ins, attrs, domain=DOMAIN, name=f"{n.name}_bf16", before=n,
                      output_types=[blocked_type(tuple(y.type.shape))])
    back = g.add_node("NchwcReorderOutput", [conv.outputs[0]], {"channels": m}, domain=DOMAIN, before=n,
                      output_types=[TensorType(np.dtype(np.float32), y.type.shape)])
    precision.move(n, conv)
    name, old_w = y.name, n.inputs[1]
    y.replace_all_uses_with(back.outputs[0])
    g.remove_node(n)
    if old_w is not None and old_w.const_value is not None and not old_w.has_uses() and not old_w.is_graph_output:
        g.remove_constant(old_w)
    if name not in g.names:
        g.rename_value(back.outputs[0], name)
    unit = bf16_unit()
    precision.done(conv, want, "bfloat16", f"nchwc_bf16_{unit}", "", w.nbytes - stored.nbytes)
    return ""
