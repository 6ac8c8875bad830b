"""Every other convolution: pad once, im2col through ``sliding_window_view`` (one copy into the
column matrix) and a single matmul for all groups and the whole batch (GE's own GEMM for an
ungrouped float32 one), in blocks of output rows where the column matrix would be large."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ge_native import parallel

from .gemm import gemm_variant, pointwise_sgemm
from .geometry import pad_spatial
from .plan import ConvPlan

NAME = "im2col"

#: Element count (64 MiB of float32) above which the im2col matrix is built and multiplied in
#: blocks of output rows: a memory guard; blocking does not make the GEMM faster here.
COLS_BLOCK = 1 << 24


def applies(plan: ConvPlan) -> bool:
    return not plan.pointwise and not plan.depthwise


def run(plan: ConvPlan, x, w, b, out, epi, pb, pe, out_sp, k):
    """``(outputs, None)`` when GE's GEMM delivered them, else ``(None, y)`` for the caller to
    finish. (One input channel and one group, wav2vec2's first conv: a K=taps GEMM, not 128 passes.)"""
    nd, group, strides, dilations = plan.nd, plan.group, plan.strides, plan.dilations
    n, c = x.shape[:2]
    m, cg = w.shape[0], c // group
    p = math.prod(out_sp)
    wk = plan.weight(w)
    xp = pad_spatial(x, pb, pe)
    eff = [(k[i] - 1) * dilations[i] + 1 for i in range(nd)]
    v = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
    v = v[(slice(None), slice(None))
          + tuple(slice(0, (out_sp[i] - 1) * strides[i] + 1, strides[i]) for i in range(nd))
          + tuple(slice(None, None, di) for di in dilations)]
    perm = (0, 1) + tuple(range(2 + nd, 2 + 2 * nd)) + tuple(range(2, 2 + nd))
    kdim = cg * math.prod(k)
    rows = out_sp[0]
    row_p = p // rows if rows else 0
    # Tile over the first output axis when the column matrix would be large, so the
    # im2col copy and the GEMM work on bounded blocks (peak memory stays low).
    step = max(1, COLS_BLOCK // max(1, n * c * math.prod(k) * row_p))
    if step >= rows:
        cols = v.transpose(perm).reshape(n, group, kdim, p)
        done = pointwise_sgemm(wk, cols[:, 0], b, out, (n, m) + tuple(out_sp), epi) if group == 1 else None
        if done is not None:
            return done, None
        if group > 1 and n == 1:
            return None, parallel.matmul(wk, cols[0])[None]  # a task per group on the run's threads
        if group > 1:
            return None, np.matmul(wk, cols)
        if out is not None:
            return None, parallel.matmul(wk[0], cols[:, 0], out=out[0].reshape(n, m, p))
        return None, parallel.matmul(wk[0], cols[:, 0])
    y = np.empty((n, group, m // group, rows, row_p), x.dtype)
    vt = v.transpose(perm)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        blk = vt[(Ellipsis, slice(r0, r1)) + (slice(None),) * (nd - 1)]
        cols = blk.reshape(n, group, kdim, (r1 - r0) * row_p)
        part = np.matmul(wk, cols) if group > 1 else parallel.matmul(wk[0], cols[:, 0])[:, None]
        y[:, :, :, r0:r1] = part.reshape(n, group, m // group, r1 - r0, row_p)
    return None, y


def variant(plan: ConvPlan) -> str:
    """GE's GEMM's variant (family ``sgemm``) for an ungrouped float32 one, else the BLAS matmul's
    (family ``gemm``)."""
    return gemm_variant(plan)


def build(plan: ConvPlan, forced: bool = False):
    """The Conv kernel that runs this algorithm (:func:`.chain.build`)."""
    from .chain import build as build_chain  # (the chain runs every algorithm: imported when built)

    return build_chain(plan, NAME, forced)
