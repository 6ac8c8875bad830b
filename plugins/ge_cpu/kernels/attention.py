"""Transformer kernels: Attention (opsets 23-25) and RotaryEmbedding.

Attention follows the operator's definition (and onnx.reference where the text leaves room):
3-D inputs are split into heads; ``Q`` and ``K`` are each scaled by ``sqrt(scale)``; the KV cache
is concatenated; one additive bias of shape broadcastable to ``(batch, q_heads, q_seq, kv_seq)``
carries the attention mask (boolean: ``-inf`` where False; float: added; a short mask padded),
the offset-aware causal mask, the sliding window (opset 25) and the ``nonpad_kv_seqlen`` padding
mask; softcap precedes the bias; softmax runs in ``softmax_precision`` when given; a query row
whose bias is ``-inf`` everywhere gives zeros (for ``Y`` and the mode-3 ``qk_matmul_output``).
Grouped-query attention (``q_heads = r * kv_heads``) runs as batched matmuls over a
``(kv_heads, r)`` view of the query heads, so K and V are never repeated in memory. float16 and
bfloat16 compute in float32 through BLAS, rounding to the input type after each step of the
definition (scores, softcap, bias, each softmax stage, ``P``), which reproduces the results of
the low-precision arithmetic.
"""

from __future__ import annotations

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.kernel import KernelSpec

from ._util import in_dtype, in_rank, kernel_table, onnx_dtype, unsupported

KERNELS, _reg = kernel_table()

_FLOATS = ("float16", "float32", "float64", "bfloat16")


def _cdt(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dt.name in ("float16", "bfloat16") else dt


def _to_heads(x: np.ndarray, heads: int, spec: KernelSpec, what: str) -> np.ndarray:
    b, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise ExecutionError(f"{spec.describe()}: {what} hidden size {hidden} does not split into {heads} heads",
                             hint="check q_num_heads / kv_num_heads")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _rounder(low: np.dtype | None):
    """In-place rounding of a float32 array to ``low`` (float16/bfloat16) after each step, so
    the low-precision arithmetic of the definition is reproduced; a no-op without ``low``."""
    if low is None:
        return lambda a: a

    def rnd(a: np.ndarray) -> np.ndarray:
        a[...] = a.astype(low)
        return a

    return rnd


def _softmax_rows(s: np.ndarray, rnd) -> np.ndarray:
    """Softmax over the last axis, in place; an all ``-inf`` row gives zeros (no NaN)."""
    m = np.max(s, axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0
    s -= m
    rnd(s)
    np.exp(s, out=s)
    rnd(s)
    tot = rnd(np.sum(s, axis=-1, keepdims=True))
    tot[tot == 0] = 1
    s /= tot
    return rnd(s)


@_reg("Attention")
def attention_factory(spec: KernelSpec):
    for i in (0, 1, 2):
        dt = in_dtype(spec, i)
        if dt is not None and dt.name not in _FLOATS:
            raise unsupported(spec, f"input {i} dtype {dt.name}")
    q_heads_attr = spec.attr("q_num_heads")
    kv_heads_attr = spec.attr("kv_num_heads")
    if in_rank(spec, 0) == 3 and (q_heads_attr is None or kv_heads_attr is None):
        raise unsupported(spec, "3-D inputs without q_num_heads and kv_num_heads")
    scale_attr = spec.attr("scale")
    is_causal = bool(int(spec.attr("is_causal", 0) or 0))
    softcap_attr = spec.attr("softcap")
    softcap = float(softcap_attr) if softcap_attr is not None else 0.0
    mode = int(spec.attr("qk_matmul_output_mode", 0) or 0)
    if mode not in (0, 1, 2, 3):
        raise unsupported(spec, f"qk_matmul_output_mode={mode}")
    sp_attr = spec.attr("softmax_precision")
    sp_dt = onnx_dtype(spec, int(sp_attr)) if sp_attr is not None else None
    if sp_dt is not None and sp_dt.name not in _FLOATS:
        raise unsupported(spec, f"softmax_precision {sp_dt.name}")
    left = int(spec.attr("left_window_size", -1)) if spec.opset >= 25 else -1
    right = int(spec.attr("right_window_size", -1)) if spec.opset >= 25 else -1
    if left < -1 or right < -1:
        raise unsupported(spec, f"left_window_size={left}, right_window_size={right} (-1 or >= 0)")
    n_out = spec.num_outputs
    want_qk = n_out > 3 and spec.outputs[3] is not None

    def kernel(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        if (past_key is None) != (past_value is None):
            raise ExecutionError(f"{spec.describe()}: past_key and past_value must be given together",
                                 hint="feed both caches or neither")
        if nonpad_kv_seqlen is not None and past_key is not None:
            raise ExecutionError(f"{spec.describe()}: nonpad_kv_seqlen cannot be combined with past_key/past_value",
                                 hint="use one kind of KV cache")
        if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
            raise ExecutionError(f"{spec.describe()}: Q, K, V must all be 3-D or all 4-D, got ranks "
                                 f"{q.ndim}, {k.ndim}, {v.ndim}", hint="check the inputs")
        three_d = q.ndim == 3
        out_dt = q.dtype
        if three_d:
            q = _to_heads(q, int(q_heads_attr), spec, "Q")
            k = _to_heads(k, int(kv_heads_attr), spec, "K")
            v = _to_heads(v, int(kv_heads_attr), spec, "V")
        batch, hq, sq, dq = q.shape
        cdt = _cdt(out_dt)
        rnd = _rounder(out_dt if cdt != out_dt else None)
        scale = float(scale_attr) if scale_attr is not None else 1.0 / np.sqrt(dq)
        # sqrt(scale) on Q and on K, rounded to the input type (as the definition's function body)
        root = out_dt.type(np.sqrt(scale))
        qs = (q * root).astype(cdt, copy=False)
        ks = (k * root).astype(cdt, copy=False)
        if past_key is not None:
            present_k = np.concatenate((past_key, k), axis=2)
            present_v = np.concatenate((past_value, v), axis=2)
            ks = np.concatenate((past_key * root, k * root), axis=2).astype(cdt, copy=False)
        else:
            present_k, present_v = k, v
        vv = present_v
        hkv, skv = ks.shape[1], ks.shape[2]
        if hq != hkv and (hkv == 0 or hq % hkv):
            raise ExecutionError(f"{spec.describe()}: {hq} query heads are not a multiple of {hkv} KV heads",
                                 hint="check q_num_heads / kv_num_heads")
        rep = hq // hkv
        # scores (batch, hq, sq, skv): query heads grouped per KV head, no copy of K
        qg = qs.reshape(batch, hkv, rep, sq, dq)
        scores = rnd(np.matmul(qg, ks[:, :, None].swapaxes(-1, -2)).reshape(batch, hq, sq, skv))
        if softcap > 0:
            scores /= cdt.type(softcap)
            np.tanh(rnd(scores), out=scores)
            scores *= cdt.type(softcap)
            rnd(scores)
        past_len = past_key.shape[2] if past_key is not None else 0
        bias = _bias(spec, attn_mask, is_causal, left, right, past_key is not None, past_len, nonpad_kv_seqlen,
                     batch, sq, skv, cdt)
        qk_out = None
        if want_qk and mode in (0, 1):
            qk_out = scores.astype(out_dt)  # after softcap, as onnx.reference
        if bias is not None:
            scores += bias
            rnd(scores)
        if want_qk and mode == 2:
            qk_out = scores.astype(out_dt)
        # softmax in softmax_precision when given, else in the input type
        smdt = sp_dt if sp_dt is not None else out_dt
        smc = _cdt(smdt)
        probs = _softmax_rows(scores.astype(smdt).astype(smc) if smc != smdt else scores.astype(smc, copy=False),
                              _rounder(smdt if smc != smdt else None))
        if bias is not None:
            dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
            if dead.any():
                probs = np.where(dead, probs.dtype.type(0), probs)
        if want_qk and mode == 3:
            qk_out = probs.astype(out_dt)
        p = probs.astype(out_dt, copy=False).astype(cdt, copy=False)
        dv = vv.shape[3]
        y = np.matmul(p.reshape(batch, hkv, rep, sq, skv), vv.astype(cdt, copy=False)[:, :, None])
        y = y.reshape(batch, hq, sq, dv)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(batch, sq, hq * dv)
        outs = [np.ascontiguousarray(y, dtype=out_dt), present_k, present_v, qk_out]
        return tuple(outs[:n_out])

    return kernel


def _bias(spec: KernelSpec, mask, is_causal: bool, left: int, right: int, has_past: bool, past_len: int,
          nonpad, batch: int, sq: int, skv: int, cdt: np.dtype) -> np.ndarray | None:
    """The additive bias, broadcastable to (batch, heads, sq, skv); None when there is none."""
    ninf = cdt.type(-np.inf)
    zero = cdt.type(0)
    bias: np.ndarray | None = None
    if mask is not None:
        m = np.asarray(mask)
        pad = skv - m.shape[-1]
        if pad > 0:
            widths = [(0, 0)] * (m.ndim - 1) + [(0, pad)]
            m = np.pad(m, widths, constant_values=False if m.dtype == np.bool_ else -np.inf)
        elif pad < 0:
            raise ExecutionError(f"{spec.describe()}: attn_mask has {m.shape[-1]} key positions, more than the "
                                 f"{skv} keys", hint="check the mask against past + new keys")
        bias = np.where(m, zero, ninf) if m.dtype == np.bool_ else m.astype(cdt)
    # the frontier offset: cached keys before the query block (per batch for an external cache)
    if has_past:
        offset: np.ndarray | int = past_len
    elif nonpad is not None:
        offset = np.asarray(nonpad).reshape(-1).astype(np.int64) - sq
    else:
        offset = 0
    i_idx = np.arange(sq).reshape(sq, 1)
    j_idx = np.arange(skv).reshape(1, skv)
    per_batch = np.ndim(offset) > 0
    pos = i_idx + (np.reshape(offset, (-1, 1, 1)) if per_batch else offset)  # absolute query positions
    allowed = None
    if is_causal:
        allowed = j_idx <= pos
    if left >= 0:
        ok = (pos - j_idx) <= left
        allowed = ok if allowed is None else allowed & ok
    if right >= 0:
        ok = (j_idx - pos) <= right
        allowed = ok if allowed is None else allowed & ok
    if allowed is not None:
        extra = np.where(allowed, zero, ninf)
        if per_batch:
            extra = extra.reshape(extra.shape[0], 1, sq, skv)
        bias = extra if bias is None else bias + extra
    if nonpad is not None:
        lens = np.asarray(nonpad).reshape(-1)
        padm = np.where(np.arange(skv)[None, :] < lens[:, None], zero, ninf).reshape(batch, 1, 1, skv)
        bias = padm if bias is None else bias + padm
    return bias


# ------------------------------------------------------------------------------------------------
# RotaryEmbedding


@_reg("RotaryEmbedding")
def rotary_factory(spec: KernelSpec):
    dt = in_dtype(spec, 0)
    if dt is not None and dt.name not in _FLOATS:
        raise unsupported(spec, f"input dtype {dt.name}")
    interleaved = bool(int(spec.attr("interleaved", 0) or 0))
    rot_attr = int(spec.attr("rotary_embedding_dim", 0) or 0)
    heads_attr = spec.attr("num_heads")
    if in_rank(spec, 0) == 3 and not heads_attr:
        raise unsupported(spec, "a 3-D input without num_heads")

    def kernel(x, cos_cache, sin_cache, position_ids=None):
        if x.ndim == 4:
            xh = x.transpose(0, 2, 1, 3)  # (batch, seq, heads, head)
        elif x.ndim == 3:
            b, s, hidden = x.shape
            heads = int(heads_attr)
            if hidden % heads:
                raise ExecutionError(f"{spec.describe()}: hidden size {hidden} does not split into {heads} heads",
                                     hint="check num_heads")
            xh = x.reshape(b, s, heads, hidden // heads)
        else:
            raise ExecutionError(f"{spec.describe()}: input must be 3-D or 4-D, got shape {list(x.shape)}",
                                 hint="feed (batch, heads, seq, head) or (batch, seq, hidden)")
        head = xh.shape[3]
        rot = rot_attr or head
        half = rot // 2
        if position_ids is not None:
            cos = cos_cache[position_ids]
            sin = sin_cache[position_ids]
        else:
            cos, sin = cos_cache, sin_cache
        if cos.shape[-1] != half or sin.shape[-1] != half:
            raise ExecutionError(f"{spec.describe()}: the cos/sin caches have {cos.shape[-1]}/{sin.shape[-1]} "
                                 f"columns, rotary_embedding_dim / 2 is {half}", hint="check the caches")
        cdt = _cdt(x.dtype)
        cos = cos.astype(cdt, copy=False)[:, :, None, :]
        sin = sin.astype(cdt, copy=False)[:, :, None, :]
        xr = xh[..., :rot].astype(cdt, copy=False)
        if interleaved:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
        else:
            x1, x2 = xr[..., :half], xr[..., half:]
        out_full = np.empty(x.shape, x.dtype)
        # out: the result in (batch, seq, heads, head) order, a view of the output's memory
        out = out_full.transpose(0, 2, 1, 3) if x.ndim == 4 else out_full.reshape(xh.shape)
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        if interleaved:
            out[..., 0:rot:2] = real
            out[..., 1:rot:2] = imag
        else:
            out[..., :half] = real
            out[..., half:rot] = imag
        if rot < head:
            out[..., rot:] = xh[..., rot:]
        return (out_full,)

    return kernel
