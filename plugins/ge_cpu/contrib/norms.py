"""Kernels of ``ge_llm.norms``'s contrib ops (onnxruntime's definitions): the layer norms with a
skip and a bias (SkipLayerNormalization, SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization, EmbedLayerNormalization) with their optional outputs,
RotaryEmbedding, the GELU family (Gelu, BiasGelu, FastGelu, QuickGelu) and BiasAdd.

float32 runs ge_native's row kernels (``ge_native.contrib_rows``: one pass per row, rows split
over the run's threads, each row alone so the bits do not depend on their number), writing into
the planned outputs (``accepts_out``); float16 computes in float32 and rounds once at the end, as
onnxruntime's CPU kernels do; float64, or without native kernels, a NumPy form of the same
arithmetic runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.errors import ExecutionError, UnsupportedOpError
from ge_core.kernel import KernelFactory, KernelSpec, with_caps
from ge_native import activations
from ge_native import contrib_rows as cr

DOMAIN = "com.microsoft"
_FLOATS = ("float16", "float32", "float64")


def _check_dtype(spec: KernelSpec, *indices: int) -> np.dtype:
    """The dtype of input ``indices[0]`` (float16/32/64), the same as every other given one."""
    dts = [t.dtype for t in (spec.inputs[i] if i < len(spec.inputs) else None for i in indices) if t is not None]
    dt = next((d for d in dts if d is not None), np.dtype(np.float32))
    if dt.name not in _FLOATS or any(d is not None and d != dt for d in dts):
        raise UnsupportedOpError(f"{spec.describe()}: input types {[d.name if d else None for d in dts]} are not "
                                 "supported (float16, float32 or float64, all the same)",
                                 hint="cast the inputs to one float type")
    return dt


def _variant(dt: np.dtype) -> str:
    """What runs a kernel of inputs ``dt``: the native rows (float32, float16 through float32), or NumPy."""
    return "native" if dt != np.float64 and cr.available() else "numpy"


def _fail(spec: KernelSpec, what: str, hint: str = "check the model's input shapes against the op's definition"):
    return ExecutionError(f"{spec.describe()}: {what}", hint=hint)


def _target(out: Sequence[np.ndarray] | None, i: int, shape: tuple, dt: np.dtype) -> np.ndarray:
    """The planned output ``i`` where it is one the native entries write (exact type, C order),
    else a new array."""
    if out is not None and i < len(out) and out[i] is not None:
        o = out[i]
        if o.shape == shape and o.dtype == dt and o.flags.c_contiguous and o.flags.aligned and o.flags.writeable:
            return o
    return np.empty(shape, dt)


def _deliver(out: Sequence[np.ndarray] | None, results: list[np.ndarray]) -> tuple:
    """The results, copied into the planned outputs where they are other arrays."""
    if out is None:
        return tuple(results)
    done = []
    for i, r in enumerate(results):
        if i < len(out) and out[i] is not None and out[i] is not r:
            np.copyto(out[i], r.reshape(out[i].shape))
            r = out[i]
        done.append(r)
    return tuple(done)


def _c32(a: np.ndarray) -> np.ndarray:
    """``a`` as an array the native entries read (float32, C order), copied only when needed."""
    return a if cr.fits(a) else np.ascontiguousarray(a, np.float32)


def _f32(a: np.ndarray | None) -> np.ndarray | None:
    """:func:`_c32` of an optional input."""
    return None if a is None else _c32(a)


# ------------------------------------------------------------------------------------------------
# the layer norms
# ------------------------------------------------------------------------------------------------
def _norm_numpy(x2: np.ndarray, gamma: np.ndarray, eps: float, skip2: np.ndarray | None, bias: np.ndarray | None,
                beta: np.ndarray | None, simplified: bool, two_pass: bool) -> tuple[np.ndarray, ...]:
    """(y, s, mean, inv) of the rows of ``x2`` in its dtype (float32 or float64): the native form's arithmetic."""
    s = x2.copy()
    if skip2 is not None:
        s = (s.reshape(-1, *skip2.shape) + skip2).reshape(x2.shape)
    if bias is not None:
        s += bias
    mean = s.mean(axis=1)
    if simplified:
        var = np.mean(s * s, axis=1)
    elif two_pass:
        var = np.mean(np.square(s - mean[:, None]), axis=1)
    else:
        var = np.mean(s * s, axis=1) - mean * mean
    inv = 1 / np.sqrt(var + s.dtype.type(eps))
    y = (s if simplified else s - mean[:, None]) * inv[:, None] * gamma
    if beta is not None:
        y += beta
    return y, s, mean, inv


def _run_norm(x2: np.ndarray, gamma: np.ndarray, eps: float, outs: list[np.ndarray | None], *,
              skip2: np.ndarray | None = None, bias: np.ndarray | None = None, beta: np.ndarray | None = None,
              simplified: bool = False, two_pass: bool = False) -> None:
    """The norm of the rows of ``x2`` into ``outs`` = [y, sum, mean, inv] (2-D, 2-D, 1-D, 1-D; None:
    not wanted; y required): native in float32, else NumPy (float16 through float32)."""
    y, s, m, v = outs
    assert y is not None
    if x2.shape[0] == 0:
        return
    if x2.dtype == np.float32 and cr.available() and cr.fits(y, s, m, v):
        cr.norm(_c32(x2), y, _c32(gamma), eps, skip2=_f32(skip2), bias=_f32(bias), beta=_f32(beta), sum2=s,
                mean=m, inv=v, simplified=simplified, two_pass=two_pass)
        return
    if x2.dtype == np.float16:
        y32, s32 = np.empty(y.shape, np.float32), None if s is None else np.empty(s.shape, np.float32)
        _run_norm(_c32(x2), _c32(gamma), eps, [y32, s32, m, v], skip2=_f32(skip2), bias=_f32(bias), beta=_f32(beta),
                  simplified=simplified, two_pass=two_pass)
        np.copyto(y, y32, casting="unsafe")
        if s is not None and s32 is not None:
            np.copyto(s, s32, casting="unsafe")
        return
    r = _norm_numpy(x2, gamma, eps, skip2, bias, beta, simplified, two_pass)
    for o, a in zip(outs, r):
        if o is not None:
            np.copyto(o, a, casting="unsafe")


def _skip_fits(skip: tuple, x: tuple) -> bool:
    """A skip of shape ``skip`` is ``x``'s or its trailing dims behind leading 1s (onnxruntime reads
    it again for each run of its size)."""
    core = list(skip)
    while len(core) > 1 and core[0] == 1:
        core.pop(0)
    return len(skip) <= len(x) and tuple(core) == x[len(x) - len(core):] and (math.prod(core) > 0 or math.prod(x) == 0)


def _rows_of(shape: tuple, axis: int) -> tuple[int, int]:
    ax = axis + len(shape) if axis < 0 else axis
    return math.prod(shape[:ax]), math.prod(shape[ax:])


def simplified_factory(spec: KernelSpec):
    """SimplifiedLayerNormalization (X, scale): outputs Y and inv_std_var."""
    dt = _check_dtype(spec, 0, 1)
    axis, eps, n_out = int(spec.attr("axis", -1)), float(spec.attr("epsilon", 1e-5)), spec.num_outputs

    def kernel(x, scale, out=None):
        if not -x.ndim <= axis < max(x.ndim, 1):
            raise _fail(spec, f"axis {axis} is outside the input's {x.ndim} dims")
        rows, cols = _rows_of(x.shape, axis)
        if scale.size != cols:
            raise _fail(spec, f"scale has {scale.size} elements, the normalised extent {cols}")
        ax = axis % x.ndim
        stat_shape = tuple(d if i < ax else 1 for i, d in enumerate(x.shape))
        y = _target(out, 0, x.shape, x.dtype)
        inv = _target(out, 1, stat_shape, np.dtype(np.float32)) if n_out > 1 else None
        _run_norm(x.reshape(rows, cols), scale.reshape(cols), eps,
                  [y.reshape(rows, cols), None, None, None if inv is None else inv.reshape(rows)], simplified=True)
        return _deliver(out, [y] + ([inv] if inv is not None else []))

    return with_caps(kernel, accepts_out=True, inplace_ok=True, variant=_variant(dt))


def _check_skip(spec: KernelSpec, x: np.ndarray, skip: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None,
                bias: np.ndarray | None) -> None:
    """The shapes a Skip(Simplified)LayerNormalization takes (an ExecutionError naming the node otherwise)."""
    if x.ndim < 2 or x.shape[-1] == 0:
        raise _fail(spec, f"input of shape {x.shape}: (batch, seq, hidden) or (rows, hidden) is needed")
    d = x.shape[-1]
    if not _skip_fits(skip.shape, x.shape):
        raise _fail(spec, f"skip of shape {skip.shape} does not broadcast to the input's {x.shape} "
                          "((batch, seq, hidden), (1, seq, hidden) or (seq, hidden))")
    for name, v in (("gamma", gamma), ("beta", beta), ("bias", bias)):
        if v is not None and v.size != d:
            raise _fail(spec, f"{name} has {v.size} elements, the hidden size is {d}")


def _skip_factory(simplified: bool):
    def factory(spec: KernelSpec):
        """(Skip)(Simplified)LayerNormalization: input, skip, gamma, [beta,] [bias] -> output, mean,
        inv_std_var, input_skip_bias_sum."""
        dt = _check_dtype(spec, 0, 1, 2)
        eps, n_out = float(spec.attr("epsilon", 1e-12)), spec.num_outputs
        checked: dict[tuple, None] = {}  # the shapes found valid (a decoder's steps repeat one)

        def kernel(x, skip, gamma, *rest, out=None):
            beta, bias = (None, rest[0] if rest else None) if simplified else \
                ((rest + (None, None))[0], (rest + (None, None))[1])
            key = (x.shape, skip.shape, gamma.size, None if beta is None else beta.size,
                   None if bias is None else bias.size)
            if key not in checked:
                _check_skip(spec, x, skip, gamma, beta, bias)
                if len(checked) < 64:
                    checked[key] = None
            d = x.shape[-1]
            rows = x.size // d
            stats = (*x.shape[:-1], 1)
            y = _target(out, 0, x.shape, x.dtype)
            m = _target(out, 1, stats, np.dtype(np.float32)) if n_out > 1 else None
            v = _target(out, 2, stats, np.dtype(np.float32)) if n_out > 2 else None
            s = _target(out, 3, x.shape, x.dtype) if n_out > 3 else None
            _run_norm(x.reshape(rows, d), gamma.reshape(d), eps,
                      [y.reshape(rows, d), None if s is None else s.reshape(rows, d),
                       None if m is None else m.reshape(rows), None if v is None else v.reshape(rows)],
                      skip2=skip.reshape(-1, d), bias=None if bias is None else bias.reshape(d),
                      beta=None if beta is None else beta.reshape(d), simplified=simplified)
            return _deliver(out, [a for a in (y, m, v, s) if a is not None])

        return with_caps(kernel, accepts_out=True, inplace_ok=True, variant=_variant(dt))

    return factory


# ------------------------------------------------------------------------------------------------
# EmbedLayerNormalization
# ------------------------------------------------------------------------------------------------
def _gather(spec: KernelSpec, table: np.ndarray, ids: np.ndarray, what: str) -> np.ndarray:
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise _fail(spec, f"{what} has an index outside its embedding's {table.shape[0]} rows",
                    hint="check the ids fed to the model")
    return np.take(table, ids, axis=0)


def embed_factory(spec: KernelSpec):
    """EmbedLayerNormalization: input_ids, segment_ids, word/position/segment embeddings, gamma,
    beta, mask, position_ids -> output, mask_index, embedding_sum."""
    _check_dtype(spec, 2, 3, 5, 6)
    eps, n_out = float(spec.attr("epsilon", 1e-12)), spec.num_outputs

    def kernel(ids, seg_ids, word, pos_emb, seg_emb, gamma, beta, mask=None, pos_ids=None, out=None):
        if ids.ndim != 2 or word.ndim != 2 or pos_emb.ndim != 2 or pos_emb.shape[1] != word.shape[1]:
            raise _fail(spec, f"input_ids {ids.shape}, word_embedding {word.shape}, position_embedding "
                              f"{pos_emb.shape}: (batch, seq) ids and (rows, hidden) embeddings are needed")
        b, s = ids.shape
        d = word.shape[1]
        if pos_ids is None:
            pos_ids = np.arange(s, dtype=np.int64)[None, :]
        if pos_ids.ndim != 2 or pos_ids.shape[1] != s or pos_ids.shape[0] not in (1, b):
            raise _fail(spec, f"position_ids of shape {pos_ids.shape}: (1, seq) or (batch, seq) is needed")
        emb = _gather(spec, word, ids, "input_ids")
        emb += _gather(spec, pos_emb, pos_ids, "position_ids")
        if seg_ids is not None and seg_emb is not None:
            emb += _gather(spec, seg_emb, seg_ids, "segment_ids")
        if gamma.size != d or beta.size != d:
            raise _fail(spec, f"gamma and beta must have the hidden size {d} elements")
        y = _target(out, 0, (b, s, d), emb.dtype)
        _run_norm(emb.reshape(b * s, d), gamma.reshape(d), eps, [y.reshape(b * s, d), None, None, None],
                  beta=beta.reshape(d), two_pass=True)
        mask_index = (np.count_nonzero(mask.reshape(b, -1) == 1, axis=1) if mask is not None
                      else np.zeros(b)).astype(np.int32)
        return _deliver(out, [y, mask_index, emb][:n_out])

    return with_caps(kernel, accepts_out=True)


# ------------------------------------------------------------------------------------------------
# RotaryEmbedding
# ------------------------------------------------------------------------------------------------
def _rotary_numpy(x4: np.ndarray, cos: np.ndarray, sin: np.ndarray, rot: int, interleaved: bool) -> np.ndarray:
    """x4 (B, S, N, H) rotated by cos/sin (B, S, R/2) broadcast over heads."""
    y = x4.copy()
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if interleaved:
        a, e = x4[..., 0:rot:2], x4[..., 1:rot:2]
        y[..., 0:rot:2], y[..., 1:rot:2] = a * c - e * s, e * c + a * s
    else:
        h = rot // 2
        a, e = x4[..., :h], x4[..., h:rot]
        y[..., :h], y[..., h:rot] = a * c - e * s, e * c + a * s
    return y


def rotary_factory(spec: KernelSpec):
    """com.microsoft RotaryEmbedding: input, position_ids, cos_cache, sin_cache."""
    dt = _check_dtype(spec, 0, 2, 3)
    interleaved = bool(int(spec.attr("interleaved", 0)))
    rot_attr, heads_attr = int(spec.attr("rotary_embedding_dim", 0)), int(spec.attr("num_heads", 0))
    if rot_attr > 0 and heads_attr <= 0:
        raise UnsupportedOpError(f"{spec.describe()}: rotary_embedding_dim needs num_heads",
                                 hint="set num_heads on the node (onnxruntime requires it too)")

    def geometry(x, pos, cos):
        if x.ndim not in (3, 4) or cos.ndim != 2:
            raise _fail(spec, f"input {x.shape} and cos_cache {cos.shape}: a 3-D or 4-D input and a 2-D cache are needed")
        transposed = x.ndim == 4
        b, s = x.shape[0], x.shape[2] if transposed else x.shape[1]
        hidden = x.shape[1] * x.shape[3] if transposed else x.shape[2]
        head = cos.shape[1] * 2 if rot_attr == 0 else (hidden // heads_attr if heads_attr else 0)
        if head <= 0 or hidden % head:
            raise _fail(spec, f"hidden size {hidden} does not split into heads of {head}")
        n = heads_attr if heads_attr > 0 else hidden // head
        if n * head != hidden:
            raise _fail(spec, f"{n} heads of {head} do not make the hidden size {hidden}")
        if transposed and (x.shape[1], x.shape[3]) != (n, head):
            raise _fail(spec, f"4-D input {x.shape}: (batch, {n} heads, seq, {head}) is needed")
        rot = rot_attr if rot_attr > 0 else head
        if rot > head or rot % 2 or cos.shape[1] != rot // 2:
            raise _fail(spec, f"rotary dim {rot} with head size {head} and a cos cache of {cos.shape[1]} columns: "
                              "the cache has rotary_embedding_dim / 2 columns, at most head size / 2")
        per_token = pos.size != 1 or pos.ndim == 2 and pos.shape == (b, s)
        if per_token and pos.shape != (b, s):
            raise _fail(spec, f"position_ids of shape {pos.shape}: one offset or (batch {b}, seq {s}) is needed")
        return transposed, (b, s, n, head), rot, per_token

    def kernel(x, pos, cos, sin, out=None):
        if cos.shape != sin.shape:
            raise _fail(spec, f"cos_cache {cos.shape} and sin_cache {sin.shape} differ")
        transposed, dims, rot, per_token = geometry(x, pos, cos)
        y = _target(out, 0, x.shape, x.dtype)
        p = np.ascontiguousarray(pos, np.int64).reshape(-1)
        if dt != np.float64 and cr.available():
            # float16 in float32, rounded once at the end (onnxruntime's CPU kernel computes so too)
            y32 = y if cr.fits(y) else np.empty(x.shape, np.float32)
            try:
                cr.rotary(_c32(x), p, _c32(cos), _c32(sin), y32, dims, rot, transposed, interleaved, per_token)
            except IndexError as e:
                raise _fail(spec, str(e), hint="check position_ids against the cos/sin cache length") from None
            if y32 is not y:
                np.copyto(y, y32, casting="unsafe")
            return _deliver(out, [y])
        b, s, n, h = dims
        idx = p.reshape(b, s) if per_token else p[0] + np.arange(s)[None, :]
        if idx.size and (idx.min() < 0 or idx.max() >= cos.shape[0]):
            raise _fail(spec, f"a position is outside the cos/sin cache of {cos.shape[0]} positions",
                        hint="check position_ids against the cos/sin cache length")
        wide = np.float64 if dt == np.float64 else np.float32
        x4 = (x.transpose(0, 2, 1, 3) if transposed else x.reshape(b, s, n, h)).astype(wide)
        r = _rotary_numpy(x4, cos.astype(wide)[idx], sin.astype(wide)[idx], rot, interleaved)
        np.copyto(y, r.transpose(0, 2, 1, 3) if transposed else r.reshape(x.shape), casting="unsafe")
        return _deliver(out, [y])

    return with_caps(kernel, accepts_out=True, variant=_variant(dt))


# ------------------------------------------------------------------------------------------------
# the GELU family and BiasAdd
# ------------------------------------------------------------------------------------------------
def _act_numpy(v: np.ndarray, kind: int, alpha: float) -> np.ndarray:
    if kind == cr.GELU:
        return activations.np_gelu(v)
    if kind == cr.GELU_TANH:
        return activations.np_gelu_tanh(v)
    return v / (1 + np.exp(-alpha * v))


def _act_factory(kind: int, with_bias: str):
    """``with_bias``: "" (none), "optional" (FastGelu) or "required" (BiasGelu)."""
    def factory(spec: KernelSpec):
        dt = _check_dtype(spec, 0, 1) if with_bias else _check_dtype(spec, 0)
        alpha = float(spec.attr("alpha", 1.702))

        def kernel(x, bias=None, out=None):
            d = x.shape[-1] if x.ndim else 1
            if bias is not None and (bias.size != d or bias.ndim != 1):
                raise _fail(spec, f"bias of shape {bias.shape}: one value per element of the last axis ({d}) is needed")
            y = _target(out, 0, x.shape, x.dtype)
            if dt != np.float64 and cr.available() and d > 0:
                y32 = y if cr.fits(y) else np.empty(x.shape, np.float32)  # (float16: rounded once at the end)
                cr.act(_c32(x).reshape(-1, d), y32.reshape(-1, d), kind, _f32(bias), alpha)
                if y32 is not y:
                    np.copyto(y, y32, casting="unsafe")
                return _deliver(out, [y])
            wide = np.float64 if dt == np.float64 else np.float32
            v = x.astype(wide) if bias is None else x.astype(wide) + bias.astype(wide)
            np.copyto(y, _act_numpy(v, kind, alpha), casting="unsafe")
            return _deliver(out, [y])

        return with_caps(kernel, accepts_out=True, inplace_ok=True, variant=_variant(dt))

    return factory


def bias_add_factory(spec: KernelSpec):
    """BiasAdd: X (batch, seq, C) + bias (C) + skip (batch, seq, C)."""
    _check_dtype(spec, 0, 1, 2)

    def kernel(x, bias, skip, out=None):
        if x.shape != skip.shape or bias.ndim != 1 or x.ndim < 1 or bias.shape[0] != x.shape[-1]:
            raise _fail(spec, f"X {x.shape}, bias {bias.shape}, skip {skip.shape}: X and skip of one shape, bias "
                              "of X's last dim are needed")
        y = _target(out, 0, x.shape, x.dtype)
        np.add(x, bias, out=y)
        y += skip
        return _deliver(out, [y])

    return with_caps(kernel, accepts_out=True, inplace_ok=True, variant="numpy")


KERNELS: dict[tuple[str, str], KernelFactory] = {
    ("", "SimplifiedLayerNormalization"): simplified_factory,
    (DOMAIN, "SkipLayerNormalization"): _skip_factory(False),
    (DOMAIN, "SkipSimplifiedLayerNormalization"): _skip_factory(True),
    (DOMAIN, "EmbedLayerNormalization"): embed_factory,
    (DOMAIN, "RotaryEmbedding"): rotary_factory,
    (DOMAIN, "Gelu"): _act_factory(cr.GELU, ""),
    (DOMAIN, "BiasGelu"): _act_factory(cr.GELU, "required"),
    (DOMAIN, "FastGelu"): _act_factory(cr.GELU_TANH, "optional"),
    (DOMAIN, "QuickGelu"): _act_factory(cr.QUICK_GELU, ""),
    (DOMAIN, "BiasAdd"): bias_add_factory,
}

__all__: list[Any] = ["KERNELS"]
