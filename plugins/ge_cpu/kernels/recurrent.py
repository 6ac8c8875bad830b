"""Recurrent kernels: LSTM, GRU, RNN (every attribute of opsets 1-22).

Strategy (per call, all directions at once):

1. **input projection up front**: ``X`` of every time step (per direction, in the order that
   direction reads it) times ``W^T`` plus the folded biases is one batched GEMM over all
   ``seq_length * batch`` rows; a column of ones appended to ``X`` carries the bias row of the
   packed weights, so the GEMM adds the biases for free;
2. **the recurrence**: for float32, every step of every direction in one native call
   (:mod:`ge_native.recurrent`: per step a small GEMM ``H_{t-1} R^T`` plus the step's input
   projection, on ``R`` packed once into panels, fused with the gates: activations, clip,
   peepholes, ``input_forget``, ``linear_before_reset``; a task is one direction, so the bits do
   not depend on the thread count). Otherwise (float64, or ``GE_NATIVE_RECURRENT=0``) the NumPy
   form: ``np.matmul`` per step and in-place ufuncs over the ``(num_directions, batch, gates *
   hidden)`` block, with sigmoid gates evaluated as ``0.5 * tanh(x / 2) + 0.5`` (the ``1/2``
   folded into the packed weights, biases, peepholes and clip bounds at build time).

The reverse direction reads ``X`` reversed within each
batch entry's ``sequence_lens`` (a gather done once, on the small input), so both directions
run the same forward recurrence; a batch entry whose sequence has ended keeps its state
(``Y`` is zero there, as onnxruntime does; a zero-length sequence gives zero final states).

``float16``/``bfloat16`` models compute in float32; ``float32`` and ``float64`` compute in their
own type. Packed weights are prepared once when ``W``/``R``/``B``/``P`` are constants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.kernel import KernelSpec, with_caps
from ge_native import parallel, sgemm
from ge_native import recurrent as native_rec
from ge_native.jit import enabled as switch_on

from ._util import as_str, const_input, has_input, in_dtype, kernel_table, unsupported

KERNELS, _reg = kernel_table()

#: gates per op, and the activations each direction takes (defaults)
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}

#: activation name (lower case) -> (canonical name, uses alpha, uses beta, default alpha, default beta);
#: defaults are those of the ONNX operators of the same name.
_ACTS: dict[str, tuple[str, bool, bool, float, float]] = {
    "relu": ("Relu", False, False, 0.0, 0.0),
    "tanh": ("Tanh", False, False, 0.0, 0.0),
    "sigmoid": ("Sigmoid", False, False, 0.0, 0.0),
    "affine": ("Affine", True, True, 1.0, 0.0),
    "leakyrelu": ("LeakyRelu", True, False, 0.01, 0.0),
    "thresholdedrelu": ("ThresholdedRelu", True, False, 1.0, 0.0),
    "scaledtanh": ("ScaledTanh", True, True, 1.0, 1.0),
    "hardsigmoid": ("HardSigmoid", True, True, 0.2, 0.5),
    "elu": ("Elu", True, False, 1.0, 0.0),
    "softsign": ("Softsign", False, False, 0.0, 0.0),
    "softplus": ("Softplus", False, False, 0.0, 0.0),
}

_DIRECTIONS = ("forward", "reverse", "bidirectional")


class _Act:
    """One activation of one direction, applied in place to a gate block (a view).

    ``pre`` is the factor folded into everything that feeds the activation's input (0.5 for
    Sigmoid, computed as ``0.5 * tanh(x) + 0.5`` on the halved input; 1 otherwise).
    """

    __slots__ = ("name", "alpha", "beta", "pre")

    def __init__(self, name: str, alpha: float, beta: float) -> None:
        self.name = name
        self.alpha = alpha
        self.beta = beta
        self.pre = 0.5 if name == "Sigmoid" else 1.0

    def key(self) -> tuple:
        return (self.name, self.alpha, self.beta)

    def __call__(self, x: np.ndarray, prescaled: bool = True) -> None:
        """Apply in place; ``prescaled=False`` when the input did not get the ``pre`` factor
        (LSTM's ``h`` applied to the cell state)."""
        n = self.name
        t = x.dtype.type
        if n == "Sigmoid":
            if not prescaled:
                x *= t(0.5)
            np.tanh(x, out=x)
            x *= t(0.5)
            x += t(0.5)
        elif n == "Tanh":
            np.tanh(x, out=x)
        elif n == "Relu":
            np.maximum(x, t(0), out=x)
        elif n == "Affine":
            x *= t(self.alpha)
            x += t(self.beta)
        elif n == "LeakyRelu":
            np.multiply(x, np.where(x >= 0, t(1), t(self.alpha)), out=x)
        elif n == "ThresholdedRelu":
            x *= x > t(self.alpha)
        elif n == "ScaledTanh":
            x *= t(self.beta)
            np.tanh(x, out=x)
            x *= t(self.alpha)
        elif n == "HardSigmoid":
            x *= t(self.alpha)
            x += t(self.beta)
            np.clip(x, t(0), t(1), out=x)
        elif n == "Elu":
            neg = x < 0
            e = np.expm1(np.minimum(x, t(0)))
            e *= t(self.alpha)
            np.copyto(x, e, where=neg)
        elif n == "Softsign":
            d = np.abs(x)
            d += t(1)
            x /= d
        elif n == "Softplus":
            # log(1 + e^x) = max(x, 0) + log1p(e^-|x|), stable for large |x|
            a = np.abs(x)
            np.negative(a, out=a)
            np.exp(a, out=a)
            np.log1p(a, out=a)
            np.maximum(x, t(0), out=x)
            x += a
        else:  # pragma: no cover - names are validated at build time
            raise AssertionError(n)


def _parse_acts(spec: KernelSpec, op: str, nd: int) -> list[list[_Act]]:
    """The activations of each direction, with their alpha/beta (consumed in list order)."""
    per = len(_DEFAULT_ACTS[op])
    raw = spec.attr("activations")
    names = [as_str(a) or "" for a in raw] if raw is not None else list(_DEFAULT_ACTS[op]) * nd
    if len(names) == per and nd == 2:
        names = names * 2  # one set given for a bidirectional node: both directions use it
    if len(names) != per * nd:
        raise unsupported(spec, f"activations={names} (expected {per * nd} names for {nd} direction(s))")
    alphas = [float(a) for a in (spec.attr("activation_alpha") or [])]
    betas = [float(b) for b in (spec.attr("activation_beta") or [])]
    ai = bi = 0
    acts: list[_Act] = []
    for nm in names:
        entry = _ACTS.get(nm.lower())
        if entry is None:
            raise unsupported(spec, f"activation {nm!r} (expected one of {sorted(v[0] for v in _ACTS.values())})")
        canon, use_a, use_b, da, db = entry
        a, b = da, db
        if use_a:
            if ai < len(alphas):
                a = alphas[ai]
                ai += 1
        if use_b:
            if bi < len(betas):
                b = betas[bi]
                bi += 1
        acts.append(_Act(canon, a, b))
    return [acts[d * per:(d + 1) * per] for d in range(nd)]


def _compute_dtype(spec: KernelSpec) -> tuple[np.dtype, np.dtype]:
    """(dtype the recurrence runs in, dtype of the outputs)."""
    dt = in_dtype(spec, 0)
    if dt is None:
        dt = spec.outputs[0].dtype if spec.outputs and spec.outputs[0] is not None else None
    if dt is None:
        return np.dtype(np.float32), np.dtype(np.float32)
    if dt == np.float64:
        return dt, dt
    if dt == np.float32:
        return dt, dt
    if dt == np.float16 or dt.name == "bfloat16":
        return np.dtype(np.float32), dt
    raise unsupported(spec, f"input dtype {dt}")


class _Groups:
    """Direction groups that share activations: a single slice over all directions when every
    direction uses the same activations (the common case), else one slice per direction."""

    def __init__(self, acts: list[list[_Act]]) -> None:
        nd = len(acts)
        if nd == 1 or all(tuple(a.key() for a in acts[d]) == tuple(a.key() for a in acts[0]) for d in range(nd)):
            self.parts: list[tuple[slice, list[_Act]]] = [(slice(None), acts[0])]
        else:
            self.parts = [(slice(d, d + 1), acts[d]) for d in range(nd)]

    def apply(self, k: int, block: np.ndarray, prescaled: bool = True) -> None:
        """Apply activation ``k`` of each group to ``block`` (leading axis: direction)."""
        for sl, acts in self.parts:
            acts[k](block[sl], prescaled)


def _pre_vector(acts: list[list[_Act]], gate_acts: Sequence[int], hidden: int, dt) -> np.ndarray:
    """(nd, gates * hidden) factors folded into the inputs of each gate's activation."""
    nd = len(acts)
    v = np.ones((nd, len(gate_acts) * hidden), dt)
    for d in range(nd):
        for g, k in enumerate(gate_acts):
            v[d, g * hidden:(g + 1) * hidden] = acts[d][k].pre
    return v


class _Rec:
    """One recurrent weight block of the NumPy form: ``R^T`` (nd, H, N) for np.matmul."""

    __slots__ = ("w",)

    def __init__(self, rows: np.ndarray) -> None:
        self.w = np.ascontiguousarray(rows.transpose(0, 2, 1))

    def __call__(self, h: np.ndarray, xw: np.ndarray, s: int, xoff: int, add: bool, out: np.ndarray) -> None:
        """out = h R^T (+ xw[:, s, :, xoff:xoff + N] when ``add``)."""
        np.matmul(h, self.w, out=out)
        if add:
            out += xw[:, s, :, xoff:xoff + out.shape[2]]


class _Prepared:
    """Packed weights of one call: ``wx`` (nd, I+1, G*H) with the bias row last, the recurrent
    blocks (GRU: the z/r block and the h block apart), peepholes and GRU's Rbh. The native form
    (``rp`` set) has ``wx``'s columns in :func:`ge_native.recurrent.layout`'s padded order, ``rp``
    the packed ``R`` panels, ``peep`` (nd, 3, H) and ``rbh`` (nd, H) unscaled, always set."""

    __slots__ = ("wx", "rec", "rec_h", "rbh", "peep", "hidden", "input_size", "rp", "has_peep", "wpanels", "wbias")

    def __init__(self) -> None:
        self.wx: np.ndarray
        self.rec: _Rec | None = None
        self.rp: np.ndarray | None = None
        self.has_peep = False
        self.wpanels: list[sgemm.Panels] | None = None  # W^T per direction for GE's GEMM (native form)
        self.wbias: np.ndarray
        self.rec_h: _Rec | None = None
        self.rbh: np.ndarray | None = None
        self.peep: np.ndarray | None = None
        self.hidden = 0
        self.input_size = 0


def _lengths(seq_lens, batch: int, steps: int, spec: KernelSpec) -> np.ndarray | None:
    """Validated per-batch lengths, or None when every sequence spans all steps."""
    if seq_lens is None:
        return None
    lens = np.asarray(seq_lens).reshape(-1).astype(np.int64)
    if lens.shape[0] != batch:
        raise ExecutionError(f"{spec.describe()}: sequence_lens has {lens.shape[0]} entries for batch {batch}",
                             hint="give one length per batch entry")
    if lens.size and (lens.min() < 0 or lens.max() > steps):
        raise ExecutionError(f"{spec.describe()}: sequence_lens values must be in [0, {steps}], got {lens.tolist()}",
                             hint="fix the sequence lengths")
    if lens.size == 0 or lens.min() == steps:
        return None
    return lens


def _reverse_index(lens: np.ndarray | None, steps: int, batch: int) -> np.ndarray | None:
    """idx[t, b]: the time index the reverse direction reads at its step t (None: plain flip)."""
    if lens is None:
        return None
    t = np.arange(steps)[:, None]
    idx = lens[None, :] - 1 - t
    return np.where(idx >= 0, idx, t)


class _Config:
    """A node's attributes, read and checked once when its kernel is built."""

    __slots__ = ("op", "spec", "n_gates", "direction", "nd", "layout", "clip", "input_forget", "lbr", "hidden_attr",
                 "acts", "groups", "cdt", "odt", "n_out", "want", "gate_acts", "fast_lstm", "clip_cache", "native")

    def __init__(self, op: str, spec: KernelSpec) -> None:
        self.op = op
        self.spec = spec
        self.n_gates = _GATES[op]
        direction = as_str(spec.attr("direction"), "forward") or "forward"
        if direction == "foward":  # the opset-1 schemas' default, misspelt
            direction = "forward"
        if direction not in _DIRECTIONS:
            raise unsupported(spec, f"direction={direction!r} (expected forward, reverse or bidirectional)")
        self.direction = direction
        self.nd = 2 if direction == "bidirectional" else 1
        self.layout = int(spec.attr("layout", 0) or 0)
        if self.layout not in (0, 1):
            raise unsupported(spec, f"layout={self.layout}")
        clip_attr = spec.attr("clip")
        self.clip = None if clip_attr is None else float(clip_attr)
        if self.clip is not None and not self.clip > 0:
            raise unsupported(spec, f"clip={self.clip} (the cell clip threshold must be positive)")
        self.input_forget = bool(int(spec.attr("input_forget", 0) or 0)) if op == "LSTM" else False
        self.lbr = bool(int(spec.attr("linear_before_reset", 0) or 0)) if op == "GRU" else False
        self.hidden_attr = spec.attr("hidden_size")
        self.acts = _parse_acts(spec, op, self.nd)
        self.groups = _Groups(self.acts)
        self.cdt, self.odt = _compute_dtype(spec)
        # GE_NATIVE_RECURRENT=0 (read per node: the module, once built, stays loaded) -> NumPy
        self.native = self.cdt == np.float32 and switch_on("GE_NATIVE_RECURRENT") and native_rec.available()
        self.n_out = spec.num_outputs
        if self.n_out > (3 if op == "LSTM" else 2):
            raise unsupported(spec, f"{self.n_out} outputs")
        self.want = [i < self.n_out and spec.outputs[i] is not None for i in range(3)]
        # which activation feeds each gate's pre-activation
        self.gate_acts = {"LSTM": (0, 0, 0, 1), "GRU": (0, 0, 1), "RNN": (0,)}[op]
        self.fast_lstm = op == "LSTM" and all(
            a[0].name == "Sigmoid" and a[1].name == "Tanh" and a[2].name == "Tanh" for _, a in self.groups.parts)
        # clip bounds per gate (scaled like the pre-activations); built lazily per hidden size
        self.clip_cache: dict[int, np.ndarray] = {}

    def clip_bounds(self, hidden: int) -> np.ndarray | None:
        """(nd, 1, gates * hidden) clip bounds scaled like the pre-activations (None: no clip)."""
        if self.clip is None:
            return None
        cb = self.clip_cache.get(hidden)
        if cb is None:
            cb = (self.clip * _pre_vector(self.acts, self.gate_acts, hidden, self.cdt)).reshape(
                self.nd, 1, self.n_gates * hidden)
            self.clip_cache[hidden] = cb
        return cb


def _check_weights(cfg: _Config, w: np.ndarray, r: np.ndarray) -> int:
    """The hidden size of ``W`` / ``R`` after checking them against the node."""
    spec, nd = cfg.spec, cfg.nd
    if w.ndim != 3 or r.ndim != 3 or w.shape[0] != nd or r.shape[0] != nd:
        raise ExecutionError(f"{spec.describe()}: W {list(w.shape)} / R {list(r.shape)} do not match "
                             f"{nd} direction(s)", hint="check the weights against direction")
    hidden = r.shape[2]
    if cfg.hidden_attr is not None and int(cfg.hidden_attr) != hidden:
        raise ExecutionError(f"{spec.describe()}: hidden_size={cfg.hidden_attr} but R has hidden size {hidden}",
                             hint="fix hidden_size or R")
    gh = cfg.n_gates * hidden
    if w.shape[1] != gh or r.shape[1] != gh:
        raise ExecutionError(f"{spec.describe()}: W {list(w.shape)} / R {list(r.shape)} must have "
                             f"{gh} rows ({cfg.n_gates} gates x hidden {hidden})", hint="check the weights")
    return int(hidden)


def _peepholes(cfg: _Config, p, pre: np.ndarray, hidden: int) -> np.ndarray | None:
    """LSTM's peepholes (3, nd, 1, hidden), each scaled like the gate it feeds; None when all zero."""
    nd, cdt = cfg.nd, cfg.cdt
    pa = np.asarray(p).astype(cdt)
    if pa.shape != (nd, 3 * hidden):
        raise ExecutionError(f"{cfg.spec.describe()}: P has shape {list(pa.shape)}, expected "
                             f"{[nd, 3 * hidden]}", hint="check the peepholes")
    if not np.any(pa):
        return None
    # P order is (i, o, f); each is scaled like the gate it feeds
    pi = pa[:, :hidden] * pre[:, :hidden]
    po = pa[:, hidden:2 * hidden] * pre[:, hidden:2 * hidden]
    pf = pa[:, 2 * hidden:] * pre[:, 2 * hidden:3 * hidden]
    return np.stack([pi, po, pf]).reshape(3, nd, 1, hidden)


def _prepare(cfg: _Config, w, r, b, p) -> _Prepared:
    """The packed weights of ``W``, ``R``, ``B`` and ``P`` (see :class:`_Prepared`)."""
    w = np.asarray(w)
    r = np.asarray(r)
    hidden = _check_weights(cfg, w, r)
    nd, cdt, op = cfg.nd, cfg.cdt, cfg.op
    gh = cfg.n_gates * hidden
    isz = w.shape[2]
    if cfg.native:
        return _prepare_native(cfg, w, r, b, p, hidden)
    pre = _pre_vector(cfg.acts, cfg.gate_acts, hidden, cdt)  # (nd, gh)
    pp = _Prepared()
    pp.hidden, pp.input_size = hidden, isz
    wb = np.zeros((nd, gh), cdt) if b is None else np.asarray(b)[:, :gh].astype(cdt)
    rb = np.zeros((nd, gh), cdt) if b is None else np.asarray(b)[:, gh:2 * gh].astype(cdt)
    if b is not None and np.asarray(b).shape != (nd, 2 * gh):
        raise ExecutionError(f"{cfg.spec.describe()}: B has shape {list(np.asarray(b).shape)}, expected "
                             f"{[nd, 2 * gh]}", hint="check the bias")
    wx = np.empty((nd, isz + 1, gh), cdt)
    wx[:, :isz, :] = w.transpose(0, 2, 1)
    bias = wb + rb
    if op == "GRU" and cfg.lbr:
        bias[:, 2 * hidden:] = wb[:, 2 * hidden:]  # Rbh stays inside r * (H R_h^T + Rbh)
        rbh = rb[:, 2 * hidden:] * pre[:, 2 * hidden:]
        pp.rbh = rbh.reshape(nd, 1, hidden) if np.any(rbh) else None
    wx[:, isz, :] = bias
    wx *= pre[:, None, :]
    rows = r.astype(cdt) * pre[:, :, None]  # (nd, gh, hidden), ONNX layout
    if op == "GRU":
        pp.rec = _Rec(rows[:, :2 * hidden])
        pp.rec_h = _Rec(rows[:, 2 * hidden:])
    else:
        pp.rec = _Rec(rows)
    pp.wx = wx
    if op == "LSTM" and p is not None:
        pp.peep = _peepholes(cfg, p, pre, hidden)
    return pp


def _prepare_native(cfg: _Config, w: np.ndarray, r: np.ndarray, b, p, hidden: int) -> _Prepared:
    """:func:`_prepare` for :mod:`ge_native.recurrent`: nothing prescaled, the gate columns in its
    padded layout, ``R`` packed into its panels."""
    nd, op, gh, isz = cfg.nd, cfg.op, cfg.n_gates * hidden, w.shape[2]
    f32 = np.float32
    pp = _Prepared()
    pp.hidden, pp.input_size = hidden, isz
    if b is not None and np.asarray(b).shape != (nd, 2 * gh):
        raise ExecutionError(f"{cfg.spec.describe()}: B has shape {list(np.asarray(b).shape)}, expected "
                             f"{[nd, 2 * gh]}", hint="check the bias")
    ba = np.zeros((nd, 2 * gh), f32) if b is None else np.asarray(b).astype(f32)
    bias = ba[:, :gh] + ba[:, gh:]
    pp.rbh = np.zeros((nd, hidden), f32)
    if op == "GRU" and cfg.lbr:
        bias[:, 2 * hidden:] = ba[:, 2 * hidden:gh]  # Rb_h stays inside r * (H R_h^T + Rb_h)
        pp.rbh = np.ascontiguousarray(ba[:, gh + 2 * hidden:])
    wx = np.empty((nd, isz + 1, gh), f32)
    wx[:, :isz, :] = w.transpose(0, 2, 1)
    wx[:, isz, :] = bias
    pp.wx = native_rec.pad_columns(op, wx, hidden)
    pp.rp = native_rec.pack(op, r)
    if sgemm.available():
        pp.wpanels = [sgemm.Panels(np.ascontiguousarray(pp.wx[d, :isz])) for d in range(nd)]
        pp.wbias = np.ascontiguousarray(pp.wx[:, isz])
    pp.peep = np.zeros((nd, 3, hidden), f32)
    if op == "LSTM" and p is not None:
        pa = np.asarray(p).astype(f32)
        if pa.shape != (nd, 3 * hidden):
            raise ExecutionError(f"{cfg.spec.describe()}: P has shape {list(pa.shape)}, expected "
                                 f"{[nd, 3 * hidden]}", hint="check the peepholes")
        pp.peep = np.ascontiguousarray(pa.reshape(nd, 3, hidden))  # (i, o, f), as the C reads them
        pp.has_peep = bool(np.any(pa))
    return pp


def _read_order(cfg: _Config, xs: np.ndarray, lens: np.ndarray | None, d: int) -> np.ndarray:
    """``X`` (steps, batch, input) in the order direction ``d`` reads it (a view or a gather)."""
    if not (cfg.direction == "reverse" or d == 1):
        return xs
    if lens is None:
        return xs[::-1]
    steps, batch, _ = xs.shape
    return xs[_reverse_index(lens, steps, batch), np.arange(batch)[None, :]]


def _project(cfg: _Config, xs: np.ndarray, lens: np.ndarray | None, pp: _Prepared) -> np.ndarray:
    """Step 1: the input projection of every step, both directions (each in the order it reads
    ``X``), with the biases: one batched GEMM (GE's packed GEMM per direction, the biases added
    at its store, where the native form has it); (nd, steps, batch, gates * hidden)."""
    nd = cfg.nd
    steps, batch, isz = xs.shape
    gh = pp.wx.shape[2]
    if pp.wpanels is not None:
        xw = np.empty((nd, steps * batch, gh), np.float32)
        for d in range(nd):
            a = np.ascontiguousarray(_read_order(cfg, xs, lens, d), np.float32).reshape(steps * batch, isz)
            if not sgemm.matmul_packed(a, pp.wpanels[d], xw[d], bias=pp.wbias[d], width=parallel.native_width()):
                np.add(np.matmul(a, pp.wx[d, :isz]), pp.wx[d, isz], out=xw[d])
        return xw.reshape(nd, steps, batch, gh)
    xa = np.empty((nd, steps, batch, isz + 1), cfg.cdt)
    xa[..., isz] = 1
    for d in range(nd):
        xa[d, :, :, :isz] = _read_order(cfg, xs, lens, d)
    return parallel.matmul(xa.reshape(nd, steps * batch, isz + 1), pp.wx).reshape(nd, steps, batch, gh)


def _outputs(cfg: _Config, out, hs: np.ndarray, hinit: np.ndarray, c_final: np.ndarray | None, run_steps: int,
             lens: np.ndarray | None, steps: int, batch: int) -> tuple:
    """Step 3: ``Y``, ``Y_h`` (and LSTM's ``Y_c``) of the node's outputs, None where unused."""
    nd, layout, odt, want, n_out = cfg.nd, cfg.layout, cfg.odt, cfg.want, cfg.n_out
    hidden = hs.shape[-1]
    outs: list[np.ndarray | None] = []
    if want[0]:
        y_shape = (batch, steps, nd, hidden) if layout == 1 else (steps, nd, batch, hidden)
        y = _target(out, 0, y_shape, odt)
        yv = y.transpose(1, 2, 0, 3) if layout == 1 else y  # (steps, nd, batch, hidden) view
        _assemble_y(yv, hs, run_steps, lens, cfg.direction, nd)
        outs.append(y)
    else:
        outs.append(None)
    last = hs[run_steps - 1] if run_steps > 0 else hinit
    if want[1]:
        outs.append(_final(out, 1, last, lens, layout, odt))
    elif n_out > 1:
        outs.append(None)
    if cfg.op == "LSTM" and want[2]:
        assert c_final is not None
        outs.append(_final(out, 2, c_final, lens, layout, odt))
    elif n_out > 2:
        outs.append(None)
    return tuple(outs[:n_out])


def _run(cfg: _Config, pp: _Prepared, x, seq_lens, h0, c0, out) -> tuple:
    """One call of the node: the projection, the recurrence and the outputs."""
    spec, layout, nd, cdt = cfg.spec, cfg.layout, cfg.nd, cfg.cdt
    hidden = pp.hidden
    if x.ndim != 3:
        raise ExecutionError(f"{spec.describe()}: X must be 3-D, got shape {list(x.shape)}",
                             hint="feed [seq, batch, input] (layout 0) or [batch, seq, input] (layout 1)")
    xs = x.transpose(1, 0, 2) if layout == 1 else x
    steps, batch, isz = xs.shape
    if isz != pp.input_size:
        raise ExecutionError(f"{spec.describe()}: X has input size {isz}, W expects {pp.input_size}",
                             hint="check the input against W")
    lens = _lengths(seq_lens, batch, steps, spec)
    run_steps = steps if lens is None else int(lens.max())
    xw = _project(cfg, xs, lens, pp)
    # 2. the recurrence
    hs = np.empty((max(run_steps, 1), nd, batch, hidden), cdt)  # h after each step, step order
    hinit = np.zeros((nd, batch, hidden), cdt)
    if h0 is not None:
        hinit[...] = h0.transpose(1, 0, 2) if layout == 1 else h0
    valid = None if lens is None else (np.arange(steps)[:, None] < lens[None, :])  # (steps, batch)
    min_len = steps if lens is None else int(lens.min())
    c_final = None
    if pp.rp is not None:
        c_final = _run_native(cfg, pp, xw, hs, hinit, c0, lens, run_steps, batch)
        return _outputs(cfg, out, hs, hinit, c_final, run_steps, lens, steps, batch)
    cb = cfg.clip_bounds(hidden)
    if cfg.op == "LSTM":
        c_final = _run_lstm(xw, pp, hs, hinit, c0, layout, run_steps, valid, min_len, cb, cfg.groups,
                            cfg.fast_lstm, cfg.input_forget, cdt)
    elif cfg.op == "GRU":
        _run_gru(xw, pp, hs, hinit, run_steps, valid, min_len, cb, cfg.groups, cfg.lbr, cdt)
    else:
        _run_rnn(xw, pp, hs, hinit, run_steps, valid, min_len, cb, cfg.groups, cdt)
    return _outputs(cfg, out, hs, hinit, c_final, run_steps, lens, steps, batch)


def _run_native(cfg: _Config, pp: _Prepared, xw: np.ndarray, hs: np.ndarray, hinit: np.ndarray, c0, lens,
                run_steps: int, batch: int) -> np.ndarray | None:
    """Step 2 in :mod:`ge_native.recurrent`; LSTM's final cell state (else None)."""
    nd, hidden = cfg.nd, pp.hidden
    c = np.zeros((nd, batch, hidden), np.float32)
    if c0 is not None and cfg.op == "LSTM":
        c[...] = c0.transpose(1, 0, 2) if cfg.layout == 1 else c0
    steps = xw.shape[1]
    if batch == 0 or hidden == 0 or run_steps == 0:
        return c if cfg.op == "LSTM" else None  # nothing to run (the C entry refuses empty sizes)
    ln = np.full(batch, steps, np.int64) if lens is None else np.ascontiguousarray(lens, np.int64)
    acts = [[(a.name, a.alpha, a.beta) for a in d] for d in cfg.acts]
    if not native_rec.run(cfg.op, xw, pp.rp, hs, hinit, c, ln, pp.peep, pp.rbh, run_steps, cfg.clip,
                          cfg.input_forget, cfg.lbr, acts, has_peep=pp.has_peep, width=parallel.native_width()):
        raise ExecutionError(f"{cfg.spec.describe()}: the native recurrence refused its arguments",
                             hint="set GE_NATIVE_RECURRENT=0 to run the NumPy form, and report this")
    return c if cfg.op == "LSTM" else None


def _make_factory(op: str) -> Callable[[KernelSpec], Any]:
    def factory(spec: KernelSpec):
        cfg = _Config(op, spec)
        consts = [const_input(spec, i) for i in (1, 2, 3)]
        p_const = const_input(spec, 7) if op == "LSTM" else None
        static_ok = consts[0] is not None and consts[1] is not None and (consts[2] is not None or not has_input(spec, 3)) \
            and (op != "LSTM" or p_const is not None or not has_input(spec, 7))
        prepared = _prepare(cfg, consts[0], consts[1], consts[2], p_const) if static_ok else None

        def kernel(x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None, out=None):
            pp = prepared if prepared is not None else _prepare(cfg, w, r, b, p if op == "LSTM" else None)
            return _run(cfg, pp, x, seq_lens, h0, c0, out)

        # the native recurrence (float32; its instruction-set variant), else the NumPy form
        variant = (native_rec.isa() or "numpy") if cfg.native else "numpy"
        with_caps(kernel, variant=variant)
        if cfg.odt == cfg.cdt and all(cfg.want[i] for i in range(cfg.n_out)):
            with_caps(kernel, accepts_out=True)
        return kernel

    return factory


def _target(out, i: int, shape, dt) -> np.ndarray:
    o = out[i] if out is not None and i < len(out) else None
    if o is not None and o.shape == tuple(shape) and o.dtype == dt:
        return o
    return np.empty(shape, dt)


def _final(out, i: int, state: np.ndarray, lens, layout: int, dt) -> np.ndarray:
    """A final state output (nd, batch, hidden) or (batch, nd, hidden) for layout 1; entries of
    zero-length sequences are zero."""
    nd, batch, hidden = state.shape
    shape = (batch, nd, hidden) if layout == 1 else (nd, batch, hidden)
    o = _target(out, i, shape, dt)
    ov = o.transpose(1, 0, 2) if layout == 1 else o
    ov[...] = state
    if lens is not None and np.any(lens == 0):
        ov[:, lens == 0, :] = 0
    return o


def _assemble_y(yv: np.ndarray, hs: np.ndarray, run_steps: int, lens, direction: str, nd: int) -> None:
    """Y (steps, nd, batch, hidden) from the per-step states (step order); zero past each
    sequence's end."""
    steps, _, batch, hidden = yv.shape
    if run_steps < steps:
        yv[run_steps:] = 0
    if run_steps == 0:
        return
    for d in range(nd):
        rev = direction == "reverse" or d == 1
        if lens is None:
            yv[:, d] = hs[::-1, d] if rev else hs[:, d]
            continue
        if not rev:
            yv[:run_steps, d] = hs[:run_steps, d]
        else:
            t = np.arange(run_steps)[:, None]
            src = lens[None, :] - 1 - t
            src = np.where(src >= 0, src, 0)
            yv[:run_steps, d] = hs[src, d, np.arange(batch)[None, :]]
        valid = np.arange(run_steps)[:, None] < lens[None, :]
        if not valid.all():
            yv[:run_steps, d] *= valid[:, :, None]


def _mask_rows(new: np.ndarray, old: np.ndarray, keep: np.ndarray) -> None:
    """Rows (batch entries) whose sequence has ended keep their old state."""
    new[:, keep] = old[:, keep]


def _run_lstm(xw, pp: _Prepared, hs, hinit, c0, layout, run_steps, valid, min_len, cb, groups: _Groups,
              fast: bool, input_forget: bool, cdt) -> np.ndarray:
    nd, _, batch, gh = xw.shape
    hidden = gh // 4
    rec = pp.rec
    c = np.zeros((nd, batch, hidden), cdt)
    if c0 is not None:
        c[...] = c0.transpose(1, 0, 2) if layout == 1 else c0
    c_prev = np.empty_like(c) if valid is not None else None
    g = np.empty((nd, batch, gh), cdt)
    tmp = np.empty((nd, batch, hidden), cdt)
    peep = pp.peep
    gi, go, gf, gc = (g[..., k * hidden:(k + 1) * hidden] for k in range(4))
    cbv = None if cb is None else [cb[..., k * hidden:(k + 1) * hidden] for k in range(4)]
    h = hinit
    for s in range(run_steps):
        rec(h, xw, s, 0, True, g)
        if c_prev is not None and s >= min_len:
            np.copyto(c_prev, c)
        if peep is None:
            if cbv is not None:
                np.clip(g, -cb, cb, out=g)
            if fast:
                np.tanh(g, out=g)
                sg = g[..., :3 * hidden]
                sg *= cdt.type(0.5)
                sg += cdt.type(0.5)
            else:
                groups.apply(0, g[..., :3 * hidden])
                groups.apply(1, gc)
        else:
            np.multiply(c, peep[0], out=tmp)
            gi += tmp
            if not input_forget:
                np.multiply(c, peep[2], out=tmp)
                gf += tmp
            if cbv is not None:
                np.clip(gi, -cbv[0], cbv[0], out=gi)
                np.clip(gf, -cbv[2], cbv[2], out=gf)
                np.clip(gc, -cbv[3], cbv[3], out=gc)
            groups.apply(0, gi)
            if not input_forget:
                groups.apply(0, gf)
            groups.apply(1, gc)
        if input_forget:
            np.subtract(cdt.type(1), gi, out=gf)
        # C_t = f * C_{t-1} + i * c
        c *= gf
        np.multiply(gi, gc, out=tmp)
        c += tmp
        if peep is not None:
            np.multiply(c, peep[1], out=tmp)
            go += tmp
            if cbv is not None:
                np.clip(go, -cbv[1], cbv[1], out=go)
            groups.apply(0, go)
        # H_t = o * h(C_t)
        if fast:
            np.tanh(c, out=tmp)
        else:
            np.copyto(tmp, c)
            groups.apply(2, tmp, prescaled=False)
        hn = hs[s]
        np.multiply(go, tmp, out=hn)
        if valid is not None and s >= min_len:
            keep = ~valid[s]
            _mask_rows(hn, h, keep)
            assert c_prev is not None
            _mask_rows(c, c_prev, keep)
        h = hn
    return c


def _run_gru(xw, pp: _Prepared, hs, hinit, run_steps, valid, min_len, cb, groups: _Groups, lbr: bool,
             cdt) -> None:
    nd, _, batch, gh = xw.shape
    hidden = gh // 3
    tmp = np.empty((nd, batch, hidden), cdt)
    cb_zr = None if cb is None else cb[..., :2 * hidden]
    cb_h = None if cb is None else cb[..., 2 * hidden:]
    rec, rec_h = pp.rec, pp.rec_h
    assert rec_h is not None
    zr = np.empty((nd, batch, 2 * hidden), cdt)
    gz, gr = zr[..., :hidden], zr[..., hidden:]
    ghh = np.empty((nd, batch, hidden), cdt)
    rh = np.empty((nd, batch, hidden), cdt) if not lbr else None
    h = hinit
    for s in range(run_steps):
        rec(h, xw, s, 0, True, zr)
        if cb_zr is not None:
            np.clip(zr, -cb_zr, cb_zr, out=zr)
        groups.apply(0, zr)
        if lbr:
            # h~ = g(x W_h + r * (H R_h^T + Rb_h) + Wb_h)
            rec_h(h, xw, s, 0, False, ghh)
            if pp.rbh is not None:
                ghh += pp.rbh
            ghh *= gr
            ghh += xw[:, s, :, 2 * hidden:]
        else:
            # h~ = g(x W_h + (r * H) R_h^T + Rb_h + Wb_h)
            assert rh is not None
            np.multiply(gr, h, out=rh)
            rec_h(rh, xw, s, 2 * hidden, True, ghh)
        if cb_h is not None:
            np.clip(ghh, -cb_h, cb_h, out=ghh)
        groups.apply(1, ghh)
        _gru_combine(hs[s], h, gz, ghh, tmp)
        if valid is not None and s >= min_len:
            _mask_rows(hs[s], h, ~valid[s])
        h = hs[s]


def _gru_combine(hn: np.ndarray, h: np.ndarray, z: np.ndarray, hh: np.ndarray, tmp: np.ndarray) -> None:
    """H_t = (1 - z) * hh + z * H_{t-1} = hh + z * (H_{t-1} - hh)."""
    np.subtract(h, hh, out=tmp)
    tmp *= z
    np.add(tmp, hh, out=hn)


def _run_rnn(xw, pp: _Prepared, hs, hinit, run_steps, valid, min_len, cb, groups: _Groups, cdt) -> None:
    rec = pp.rec
    h = hinit
    for s in range(run_steps):
        hn = hs[s]
        rec(h, xw, s, 0, True, hn)
        if cb is not None:
            np.clip(hn, -cb, cb, out=hn)
        groups.apply(0, hn)
        if valid is not None and s >= min_len:
            _mask_rows(hn, h, ~valid[s])
        h = hn


for _op in ("LSTM", "GRU", "RNN"):
    KERNELS[("", _op)] = _make_factory(_op)
