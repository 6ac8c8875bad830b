"""Kernels of onnxruntime's attention ops (``com.microsoft``): GroupQueryAttention,
MultiHeadAttention and Attention, on :mod:`ge_native.gqa` (the cache written in place, GQA without
repeating K/V, rotary in the kernel; :func:`ge_native.gqa.reference` where the native path is off).

The KV cache: the kernels take ``out=`` (the executor's planned outputs, or a caller's bound
arrays). When GroupQueryAttention's ``present_key``/``present_value`` output *is* the memory of
``past_key``/``past_value`` (onnxruntime-genai's ``past_present_share_buffer``: the caller binds one
buffer of the largest length as both), only the new rows are written; otherwise the past rows are
copied into the present first. Masks of Attention and MultiHeadAttention are added as
``mask_filter_value`` (-10000) at the masked keys, as onnxruntime adds them."""

from __future__ import annotations

import math

import numpy as np

from ge_core.errors import ExecutionError, UnsupportedOpError
from ge_core.kernel import KernelFactory, KernelSpec, with_caps
from ge_native import gqa, parallel


def _attend(*args, **kw) -> None:
    if not gqa.attend(*args, **kw):
        gqa.reference(*args, **kw)


def _caps(kernel, algorithm: str, inplace: bool = False):
    return with_caps(kernel, accepts_out=True, inplace_ok=inplace, algorithm=algorithm,
                     variant=gqa.isa() or "numpy")


def _out(out, i: int, shape: tuple, like: np.ndarray | None = None) -> np.ndarray:
    """Output ``i``: the given ``out`` array when it fits, else a new one."""
    o = out[i] if out is not None and len(out) > i else None
    if o is not None and o.shape == shape and o.dtype == np.float32 and o.flags.c_contiguous and o.flags.writeable:
        return o
    return np.empty(shape, np.float32)


def _same(a: np.ndarray | None, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are the same memory (share-buffer mode; the address is read only
    when their bounds overlap)."""
    return a is not None and (a is b or (np.may_share_memory(a, b) and a.shape == b.shape and a.flags.c_contiguous
                                         and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]))


def _apart(x: np.ndarray, inputs: list) -> np.ndarray:
    """``x``, or a new array of its shape when it shares memory with one of ``inputs``."""
    return np.empty_like(x) if any(np.may_share_memory(x, y) for y in inputs) else x


def _fail(spec: KernelSpec, what: str, hint: str) -> ExecutionError:
    return ExecutionError(f"{spec.describe()}: {what}", hint=hint)


def _f32(spec: KernelSpec, x: np.ndarray, what: str) -> np.ndarray:
    if x.dtype != np.float32:
        raise _fail(spec, f"{what} is {x.dtype}; this kernel computes float32", "export the model in float32")
    return x


def _heads(spec: KernelSpec, name: str) -> int:
    n = int(spec.attr(name, 0) or 0)
    if n < 1:
        raise UnsupportedOpError(f"{spec.describe()}: attribute {name} must be a positive integer",
                                 hint="export the model again")
    return n


def _lengths(spec: KernelSpec, seqlens: np.ndarray, total_len: int, b: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Per batch row: the past length and the total length, as onnxruntime reads seqlens_k."""
    total = seqlens.reshape(-1).astype(np.int64) + 1
    if total.shape[0] != b:
        raise _fail(spec, f"seqlens_k has {total.shape[0]} rows, the query {b}", "give one length per batch row")
    if s == total_len:  # the first prompt: no past
        return np.zeros(b, np.int64), total
    if s > 1 and b != 1:
        raise _fail(spec, "a prompt after a past (sequence length > 1) needs batch size 1", "run rows one at a time")
    return total - s, total


def gqa_factory(spec: KernelSpec):
    n, kv = _heads(spec, "num_heads"), _heads(spec, "kv_num_heads")
    if n % kv:
        raise UnsupportedOpError(f"{spec.describe()}: num_heads {n} is not a multiple of kv_num_heads {kv}",
                                 hint="export the model again with matching head counts")
    extra = [i for i in range(9, len(spec.inputs)) if spec.inputs[i] is not None]
    if extra:
        raise UnsupportedOpError(f"{spec.describe()}: inputs {extra} (position_ids, attention_bias, head_sink, "
                                 "quantised caches) are not supported", hint="export without them")
    scale_attr, cap = float(spec.attr("scale", 0.0) or 0.0), float(spec.attr("softcap", 0.0) or 0.0)
    rotary, inter = bool(spec.attr("do_rotary", 0)), bool(spec.attr("rotary_interleaved", 0))
    window, smooth = int(spec.attr("local_window_size", -1)), bool(spec.attr("smooth_softmax", 0))

    def kernel(q, k=None, v=None, past_k=None, past_v=None, seqlens=None, total_len=None, cos=None, sin=None,
               *rest, out=None):
        _f32(spec, q, "the query")
        b, s, hidden = q.shape
        packed = k is None
        d = hidden // (n + 2 * kv) if packed else hidden // n
        if d * (n + 2 * kv if packed else n) != hidden:
            raise _fail(spec, f"query hidden size {hidden} does not split into heads of equal size",
                        "check num_heads / kv_num_heads")
        if packed:
            x = q.reshape(b, s, n + 2 * kv, d).transpose(0, 2, 1, 3)
            q4, k4, v4 = x[:, :n], x[:, n:n + kv], x[:, n + kv:]
        else:
            q4 = q.reshape(b, s, n, d).transpose(0, 2, 1, 3)
            k4 = _f32(spec, k, "the key").reshape(b, s, kv, d).transpose(0, 2, 1, 3)
            v4 = _f32(spec, v, "the value").reshape(b, s, kv, d).transpose(0, 2, 1, 3)
        tl = int(total_len.reshape(-1)[0]) if isinstance(total_len, np.ndarray) else int(total_len)
        past, total = _lengths(spec, seqlens, tl, b, s)
        plen = past_k.shape[2] if past_k is not None else 0
        cache = max(tl, plen)
        ck, cv = _out(out, 1, (b, kv, cache, d)), _out(out, 2, (b, kv, cache, d))
        share = _same(past_k, ck) and _same(past_v, cv)
        o = _out(out, 0, (b, s, n * d))
        if out is not None:  # an executor's array over another input (inplace_ok): computed apart, copied
            ins = (q, k, v, past_k, past_v)
            o, ck, cv = (_apart(x, [y for y in ins if y is not None and not (share and y is keep)])
                         for x, keep in ((o, None), (ck, past_k), (cv, past_v)))
        args = (q4, k4, v4, ck if share else past_k, cv if share else past_v, ck, cv,
                o.reshape(b, s, n, d).transpose(0, 2, 1, 3), past, total, scale_attr or 1.0 / math.sqrt(d),
                cos if rotary else None, sin if rotary else None, inter, cap, window, smooth, True, None)
        if not gqa.attend(*args, width=parallel.native_width()):  # (the C checked everything: find what)
            if (past < 0).any() or (past + s > cache).any() or (past_k is None and (past > 0).any()) \
                    or (past > plen).any():
                raise _fail(spec, f"seqlens_k {(total - 1).tolist()} do not fit the past of {plen} rows and "
                                  f"total_sequence_length {tl}", "give seqlens_k = total length - 1 per row")
            if rotary and (cos is None or sin is None or 2 * cos.shape[1] > d or (total > cos.shape[0]).any()):
                raise _fail(spec, "do_rotary needs cos_cache/sin_cache (max positions, rotary dim / 2) covering "
                                  "every position", "give caches as long as the longest sequence")
            gqa.reference(*args)
        if out is not None:  # what was computed apart goes into the executor's arrays now
            res = []
            for i, x in enumerate((o, ck, cv)):
                t = out[i] if len(out) > i else None
                if t is not None and t is not x and t.shape == x.shape:
                    np.copyto(t, x)
                    x = t
                res.append(x)
            o, ck, cv = res
        return (o, ck, cv)[:spec.num_outputs]

    return _caps(kernel, "gqa_cache", inplace=True)


def _first(out, i: int):
    return out[i] if out is not None and len(out) > i else None


def _key_mask(spec: KernelSpec, mask: np.ndarray | None, b: int, s: int, total: int, past: int,
              filt: float) -> np.ndarray | None:
    """The additive mask ``(B, 1, S or 1, total)`` of a mask_index / key_padding_mask form."""
    if mask is None:
        return None
    m = np.asarray(mask)
    keys = np.arange(total)
    if m.ndim == 1 and m.shape[0] in (b, 2 * b):
        end = m[:b].astype(np.int64)[:, None]
        bad = keys[None, :] >= end
        if m.shape[0] == 2 * b:
            bad |= keys[None, :] < m[b:].astype(np.int64)[:, None]
        return np.where(bad, np.float32(filt), np.float32(0))[:, None, None, :]
    if m.ndim == 2 and m.shape == (b, total):
        return np.where(m == 0, np.float32(filt), np.float32(0))[:, None, None, :]
    if m.ndim == 3 and m.shape == (b, s, total):
        return np.where(m == 0, np.float32(filt), np.float32(0))[:, None, :, :]
    raise UnsupportedOpError(f"{spec.describe()}: a mask of shape {m.shape} is not one of the supported forms "
                             f"((B,), (2B,), (B, {total}), (B, S, {total}))", hint="give a 2-D key padding mask")


def _bias4(masks: list, b: int, n: int, s: int, total: int) -> np.ndarray | None:
    acc = None
    for m in masks:
        if m is not None:
            acc = m.astype(np.float32) if acc is None else acc + m
    return None if acc is None else np.broadcast_to(acc, (b, n, s, total))


def mha_factory(spec: KernelSpec):
    n = _heads(spec, "num_heads")
    scale_attr, causal = float(spec.attr("scale", 0.0) or 0.0), bool(spec.attr("unidirectional", 0))
    filt = float(spec.attr("mask_filter_value", -10000.0))
    if any(spec.inputs[i] is not None for i in range(8, len(spec.inputs))):
        raise UnsupportedOpError(f"{spec.describe()}: past_sequence_length / cache_indirection are not supported",
                                 hint="export without a shared past buffer or beam search")

    def kernel(q, k=None, v=None, bias=None, kpm=None, abias=None, past_k=None, past_v=None, *rest, out=None):
        _f32(spec, q, "the query")
        b, s = q.shape[0], q.shape[1]
        if q.ndim == 5:  # packed QKV (B, S, N, 3, D)
            d = q.shape[4]
            q4, k4, v4 = (q[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        else:
            d = q.shape[2] // n
            if bias is not None:
                q = q + bias[:n * d]
            q4 = q.reshape(b, s, n, d).transpose(0, 2, 1, 3)
            if k is not None and k.ndim == 5:  # packed KV (B, L, N, 2, D)
                k4, v4 = (k[:, :, :, i].transpose(0, 2, 1, 3) for i in range(2))
            elif k is not None and k.ndim == 4:  # BNSH: the cross attention's cache, as given
                k4, v4 = k, v
            elif k is not None and v is not None:
                kb = k + bias[n * d:2 * n * d] if bias is not None else k
                vb = v + bias[2 * n * d:] if bias is not None else v
                if vb.shape[2] != n * d:
                    raise UnsupportedOpError(f"{spec.describe()}: a value head size other than the key's",
                                             hint="use equal head sizes")
                k4 = kb.reshape(b, -1, n, d).transpose(0, 2, 1, 3)
                v4 = vb.reshape(b, -1, n, d).transpose(0, 2, 1, 3)
            else:
                raise _fail(spec, "key and value are both needed (or a packed query)", "give key and value")
        plen = past_k.shape[2] if past_k is not None else 0
        total = plen + k4.shape[2]
        ck, cv = _out(out, 1, (b, n, total, d)), _out(out, 2, (b, n, total, d))
        lens = np.full(b, plen, np.int64)
        mask = _bias4([_key_mask(spec, kpm, b, s, total, plen, filt), abias], b, n, s, total)
        o = _out(out, 0, (b, s, n * d))
        _attend(q4, k4, v4, past_k, past_v, ck, cv, o.reshape(b, s, n, d).transpose(0, 2, 1, 3), lens,
                lens + k4.shape[2], scale_attr or 1.0 / math.sqrt(d), None, None, False, 0.0, -1, False, causal,
                mask, width=parallel.native_width())
        return (o, ck, cv)[:spec.num_outputs]

    return _caps(kernel, "mha_cache")


def attention_factory(spec: KernelSpec):
    n = _heads(spec, "num_heads")
    scale_attr, causal = float(spec.attr("scale", 0.0) or 0.0), bool(spec.attr("unidirectional", 0))
    filt = float(spec.attr("mask_filter_value", -10000.0))
    sizes = [int(x) for x in spec.attr("qkv_hidden_sizes", []) or []]
    if (sizes and len({*sizes}) != 1) or spec.attr("do_rotary", 0) or spec.attr("past_present_share_buffer", 0) \
            or any(spec.inputs[i] is not None for i in range(6, len(spec.inputs))):
        raise UnsupportedOpError(f"{spec.describe()}: unequal qkv_hidden_sizes, do_rotary, a shared past buffer and "
                                 "past_sequence_length are not supported", hint="export without them")

    def kernel(x, w, bias=None, mask=None, past=None, abias=None, *rest, out=None):
        _f32(spec, x, "the input")
        b, s, _ = x.shape
        h = w.shape[1] // 3
        d = h // n
        qkv = np.matmul(x, w)
        if bias is not None:
            qkv += bias
        q4, k4, v4 = (qkv[:, :, i * h:(i + 1) * h].reshape(b, s, n, d).transpose(0, 2, 1, 3) for i in range(3))
        plen = past.shape[3] if past is not None else 0
        total = plen + s
        pres = _out(out, 1, (2, b, n, total, d))
        lens = np.full(b, plen, np.int64)
        o = _out(out, 0, (b, s, h))
        m = _bias4([_key_mask(spec, mask, b, s, total, plen, filt), abias], b, n, s, total)
        _attend(q4, k4, v4, None if past is None else np.ascontiguousarray(past[0]),
                None if past is None else np.ascontiguousarray(past[1]), pres[0], pres[1],
                o.reshape(b, s, n, d).transpose(0, 2, 1, 3), lens, lens + s, scale_attr or 1.0 / math.sqrt(d),
                None, None, False, 0.0, -1, False, causal, m, width=parallel.native_width())
        return (o, pres)[:spec.num_outputs]

    return _caps(kernel, "attention_cache")


KERNELS: dict[tuple[str, str], KernelFactory] = {
    ("com.microsoft", "GroupQueryAttention"): gqa_factory,
    ("com.microsoft", "MultiHeadAttention"): mha_factory,
    ("com.microsoft", "Attention"): attention_factory,
}
