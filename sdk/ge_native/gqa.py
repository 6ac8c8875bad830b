"""Attention over a KV cache (``csrc/gqa.c``): onnxruntime's GroupQueryAttention, and the core of
its MultiHeadAttention and Attention. The new K and V rows of each batch row are written into the
present cache at that row's past length (rotated first when rotary caches are given); the past
rows are copied there first unless the past buffer *is* the present one (onnxruntime-genai's
``past_present_share_buffer``: nothing moves but the new rows); then each query row attends to
the cache rows ``[lo, hi)`` of its row: ``hi`` = past + s + 1 (causal) or the row's total
length, ``lo`` = ``hi - window`` with a local window (the last ``window`` keys). Scores are ``scale * q . k`` (q rotated),
then ``softcap * tanh(x / softcap)``, then the additive bias, then softmax (``smooth``: a zero
logit joins the denominator); a row with no key (padding) gives zeros.

Grouped-query attention never repeats K and V: a task is (batch row, kv head, block of query
rows) and multiplies the rows of every query head of the group against the group's cache rows,
so a decode step reads the cache once per group. Tasks split over (batch, head) only, so the bits
are the same at every thread count. Variants: ``avx512f`` (intrinsics) or ``portable`` (plain C
the compiler vectorises), whichever the build's ``-march`` gives; ``GE_NATIVE_GQA=0`` turns the
native path off (:func:`reference`, NumPy, computes the same thing)."""

from __future__ import annotations

import functools
import threading

import numpy as np

from . import native

_mod = native.lazy_module("GE_NATIVE_GQA", native.c_source("gqa.c"), ["gqa_run", "gqa_ok", "gqa_isa"], "gqa_ok")
#: query rows per task: a block's scores stay in the L2 cache
ROWS = 32
_scratch = threading.local()
_EMPTY = np.zeros(1, np.float32)
#: the stride entries of the C's parameters (it reads the strides from the views themselves)
_STRIDES = (0,) * 15


def available() -> bool:
    """True when the native module built here and its switch leaves it on."""
    return _mod() is not None


def isa() -> str | None:
    """The variant that runs (``avx512f`` or ``portable``), None when off."""
    mod = _mod()
    return None if mod is None else str(mod.gqa_isa())


def _scratch_for(n: int) -> np.ndarray:
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, 1024), np.float32)
        _scratch.buf = buf
    return buf


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, past_k: np.ndarray | None, past_v: np.ndarray | None,
           present_k: np.ndarray, present_v: np.ndarray, out: np.ndarray, past_lens: np.ndarray,
           total_lens: np.ndarray, scale: float, cos: np.ndarray | None = None, sin: np.ndarray | None = None,
           interleaved: bool = False, softcap: float = 0.0, window: int = -1, smooth: bool = False,
           causal: bool = True, bias: np.ndarray | None = None, width: int = 1) -> bool:
    """Write the new rows into ``present_k``/``present_v`` and the attention into ``out``.

    ``q`` ``(B, N, S, D)``, ``k``/``v`` ``(B, KV, S', D)`` (S' new cache rows) and ``out`` ``(B, N, S, D)``: float32
    views of any non-negative strides whose last is 1, inside the C-contiguous array holding
    their memory; ``present_*`` ``(B, KV, L, D)`` and ``past_*`` ``(B, KV, P, D)`` C-contiguous (``past_k is present_k``: share-buffer mode, nothing
    copied); ``past_lens``/``total_lens`` int64 ``(B,)``; ``cos``/``sin`` ``(max_pos, R/2)`` or
    None; ``bias`` ``(B, N, S, L)`` (strides 0 allowed) or None. False (nothing written) when the
    native path is off or an array does not fit (the C checks every size, stride, length and
    overlap: an output over an input, a copy-mode past over the present)."""
    mod = _mod()
    if mod is None:
        return False
    b, n, s, d = q.shape
    kv, cache = k.shape[1], present_k.shape[2]
    share = past_k is not None and past_k is present_k and past_v is present_v
    if not (present_k.flags.c_contiguous and present_v.flags.c_contiguous):
        return False  # (a reshape would copy: the writes would be lost)
    rot = cos is not None and sin is not None
    cs = cos if cos is not None and rot else _EMPTY
    sn = sin if sin is not None and rot else _EMPTY
    pk = past_k if past_k is not None else _EMPTY
    pv = past_v if past_v is not None else _EMPTY
    p = _params(b, s, n, kv, d, pk.shape[2] if past_k is not None else 0, cache,
                cs.shape[1] if rot else 0, cs.shape[0] if rot else 0, int(interleaved), int(rot), int(share),
                max(int(window), 0), int(smooth), max(1, int(width)), int(bias is not None), *_STRIDES,
                int(past_k is not None), int(causal), ROWS, k.shape[2])
    rows = min(ROWS, s)
    slot = (rows * (n // max(kv, 1)) * (d + cache) + 1) // 2 * 2 + 2 * rows * (n // max(kv, 1))
    scratch = _scratch_for(slot * max(1, int(width)))
    try:
        mod.gqa_run(q, k, v, pk.reshape(-1), pv.reshape(-1), present_k.reshape(-1), present_v.reshape(-1), out,
                    cs.reshape(-1), sn.reshape(-1),
                    bias if bias is not None else _EMPTY, past_lens, total_lens, p,
                    _floats(float(scale), float(softcap)), scratch)
    except (TypeError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _params(*ints: int) -> np.ndarray:
    """The C entry's int64 parameters, made once per setting and read-only (the C copies them):
    a decoder's node calls with the same ones every token."""
    p = np.array(ints, np.int64)
    p.setflags(write=False)
    return p


@functools.lru_cache(maxsize=64)
def _floats(*values: float) -> np.ndarray:
    """The C entry's float64 parameters (scale, softcap), made once per setting, read-only."""
    f = np.array(values, np.float64)
    f.setflags(write=False)
    return f


def _rotate(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """``x`` ``(B, H, S, D)`` rotated at positions ``pos`` ``(B, S)`` (the first ``2 * R/2`` lanes)."""
    rh = cos.shape[1]
    c, s = cos[pos][:, None], sin[pos][:, None]  # (B, 1, S, rh)
    y = x.copy()
    if interleaved:
        a, b = x[..., 0:2 * rh:2], x[..., 1:2 * rh:2]
        y[..., 0:2 * rh:2], y[..., 1:2 * rh:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :rh], x[..., rh:2 * rh]
        y[..., :rh], y[..., rh:2 * rh] = a * c - b * s, b * c + a * s
    return y


def reference(q, k, v, past_k, past_v, present_k, present_v, out, past_lens, total_lens, scale: float,
              cos=None, sin=None, interleaved: bool = False, softcap: float = 0.0, window: int = -1,
              smooth: bool = False, causal: bool = True, bias=None, width: int = 1) -> bool:
    """:func:`attend` in NumPy (the fallback, and the tests' oracle of the C): the same arguments."""
    b, n, s, d = q.shape
    kv, sk = k.shape[1], k.shape[2]
    share = past_k is not None and past_k is present_k
    pos = past_lens[:, None] + np.arange(s)[None, :]
    pos = np.where(pos < total_lens[:, None], pos, 1)
    rot = cos is not None and sin is not None
    kr = _rotate(k, pos, cos, sin, interleaved) if rot else k
    qr = _rotate(q, pos, cos, sin, interleaved) if rot else q
    for i in range(b):
        pl = int(past_lens[i])
        if not share:
            present_k[i], present_v[i] = 0, 0
            if past_k is not None:
                present_k[i, :, :pl], present_v[i, :, :pl] = past_k[i, :, :pl], past_v[i, :, :pl]
        present_k[i, :, pl:pl + sk], present_v[i, :, pl:pl + sk] = kr[i], v[i]
    r = n // kv
    for i in range(b):
        pl, tl = int(past_lens[i]), int(total_lens[i])
        for h in range(n):
            sc = (np.float32(scale) * qr[i, h]) @ present_k[i, h // r].T  # (S, L)
            for t in range(s):
                hi = min(pl + sk - s + t + 1 if causal else tl, tl)
                lo = max(hi - window, 0) if window > 0 else 0
                if hi <= lo:
                    out[i, h, t] = 0
                    continue
                x = sc[t, lo:hi].astype(np.float64)
                if softcap > 0:
                    x = softcap * np.tanh(x / softcap)
                if bias is not None:
                    x = x + bias[i, h, t, lo:hi]
                mx = max(x.max(), 0.0) if smooth else x.max()
                e = np.exp(x - mx)
                den = e.sum() + (np.exp(-mx) if smooth else 0.0)
                out[i, h, t] = ((e / den) @ present_v[i, h // r, lo:hi].astype(np.float64)).astype(np.float32)
    return True
