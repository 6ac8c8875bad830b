"""The convolution's calls of GE's own GEMM (:mod:`ge_native.sgemm`): a 1-D/2-D convolution per
image (the column matrix packed straight into the GEMM's panels) and ``W @ X`` per image (a 1x1
convolution or an im2col column matrix), the bias and the caller's epilogue at the store."""

from __future__ import annotations

import numpy as np

from ge_native import isa, parallel, sgemm

from .geometry import delivered, out_target


def conv2d_sgemm(x, wk, b, out, shape, group, k, strides, dilations, pb, epi, rows=None):
    """A 2-D convolution per image on GE's own GEMM (:func:`ge_native.sgemm.conv2d`: the column
    matrix packed straight into its panels, the bias and the caller's epilogue ``epi`` at the
    store), written into the planned output; None when that path does not run these arrays. A
    1-D convolution (wav2vec2's feature extractor and its grouped positional conv) runs as a
    2-D one of height 1. ``rows``: the constant weight as :class:`ge_native.sgemm.RowPanels`, or
    None (then ``wk`` is read in place)."""
    if x.dtype != np.float32 or wk.dtype != np.float32 or x.ndim not in (3, 4) or not sgemm.available():
        return None
    out_hw = tuple(shape[2:])
    if x.ndim == 3:
        x = x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])
        k, strides, dilations, pb, out_hw = (1, k[0]), (1, strides[0]), (1, dilations[0]), (0, pb[0]), (1,) + out_hw
    x = np.ascontiguousarray(x)
    n, m = shape[:2]
    bias, clip, z3, act = epilogue_args(b, shape, epi)
    if bias is False:
        return None
    w2 = wk.reshape(m, -1) if rows is None else rows
    width = parallel.native_width()
    geo = (group, tuple(k), tuple(strides), tuple(dilations), (pb[0], pb[1]), out_hw)
    return per_image(shape, out, z3, epi, lambda i, t2, z2: sgemm.conv2d(x[i], w2, t2, *geo, bias, clip, width, z2, act))


def per_image(shape, out, z3, epi, run_one):
    """Run ``run_one(i, output (M, P), addend (M, P) or None) -> bool`` for each image into the
    planned output (or a new array); the outputs, or None when it refused the first image (the
    caller's BLAS form runs; the arrays are alike, so a refusal comes at the first or never)."""
    n, m = shape[:2]
    target = out_target(out, shape, np.float32)
    if z3 is not None and np.may_share_memory(target, z3):
        target = np.empty(shape, np.float32)
    t3 = target.reshape(n, m, -1)
    for i in range(n):
        if not run_one(i, t3[i], None if z3 is None else z3[i]):
            return None
    if epi is not None:
        epi["applied"] = True
    return delivered(target, out)


def epilogue_args(b, shape, epi):
    """``(bias, clip, addend per image, act)`` for a GEMM path from a conv's bias and epilogue;
    ``bias`` False when they do not fit it."""
    n, m = shape[:2]
    bias = None
    if b is not None:
        bias = np.asarray(b)
        if bias.dtype != np.float32 or bias.size != m:
            return False, None, None, None
        bias = np.ascontiguousarray(bias.reshape(-1))
    if epi is None:
        return bias, None, None, None
    z = epi["addend"]
    if z is not None and (z.dtype != np.float32 or z.shape != shape or not z.flags.c_contiguous):
        return False, None, None, None
    return bias, epi["clip"], None if z is None else z.reshape(n, m, -1), epi["act"]


def pointwise_sgemm(wk, xs, b, out, shape, epi=None, rows=None):
    """A 1x1 convolution (or an im2col column matrix) as ``W @ X`` per image on GE's own GEMM
    (:mod:`ge_native.sgemm`: the activation packed by the call; the bias and the caller's epilogue
    ``epi`` -- an addend, a clip, an activation: :class:`ge_core.kernel.KernelCaps` -- applied
    at the store), written into the planned output; None when that path does not run these
    arrays (the caller's BLAS form runs). ``rows``: the constant weight as
    :class:`ge_native.sgemm.RowPanels`, or None."""
    if xs.dtype != np.float32 or wk.dtype != np.float32 or not xs.flags.c_contiguous or not sgemm.available():
        return None
    n, m = shape[:2]
    bias, clip, z3, act = epilogue_args(b, shape, epi)
    if bias is False:
        return None
    width = parallel.native_width()
    a = wk[0] if rows is None else rows
    return per_image(shape, out, z3, epi, lambda i, t2, z2: sgemm.matmul_rows(a, xs[i], t2, bias, clip, width, z2, act))


def gemm_variant(plan) -> str:
    """The variant of the GEMM a pointwise or im2col convolution multiplies with: GE's own
    (family ``sgemm``) for an ungrouped float32 one where it runs, else the BLAS matmul's (``gemm``)."""
    if plan.group == 1 and plan.dtype == np.float32 and sgemm.available():
        return isa.variant_of("sgemm")
    return isa.variant_of("gemm")
