"""GE's float32 LSTM / GRU / RNN recurrence: every step of every direction in one native call,
after the caller's input projection (one GEMM over all steps, with the biases).

The gates of a step are laid out in blocks padded to 32 columns (:func:`layout`): LSTM's
``(i, o, f, c)`` at ``k * H`` of one block, RNN's at 0, GRU's ``z, r`` at 0 and ``H`` and its
``h`` at ``zp``, a block of its own. ``xw`` ``(nd, steps, batch, W)`` holds each step's ``x W^T``
plus biases in that layout (each direction in the order it reads ``X``; :func:`pad_columns`
places the ONNX gate columns), ``rp`` ``(nd, W / 16, H, 16)`` ``R^T`` in panels of 16 columns
(:func:`pack`, once per weight). A step is ``G = h R^T + xw_t`` (register tiles that stream
``R`` once) and then the gates row by row: clip, the ONNX activations with their alpha / beta,
peepholes, ``input_forget``, GRU's ``linear_before_reset``; a batch entry past its
``sequence_lens`` keeps its state. ``hs`` ``(steps, nd, batch, H)`` gets ``h_t``, ``c`` LSTM's
cell state (in place).

Variants (the ``recurrent`` family of :mod:`ge_native.isa`): ``avx512f`` (8 x 32 FMA tiles),
``avx2`` (6 x 16) and ``scalar``; they differ in the GEMM (the gates are plain C the build
vectorises). ``GE_NATIVE_RECURRENT=0`` turns the path off; ``GE_NATIVE_RECURRENT=<variant>``
forces a variant this CPU runs. A task is one direction (all its steps); with more threads than
directions and steps of ``batch * W * H >= 16384``, each step is split instead (its products
into column chunks, its gates into batch rows): the same bits at every thread count either way.
The C is ``csrc/recurrent.c``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import isa as _isa
from . import native

VARIANTS = ("avx512f", "avx2", "scalar")
_CODES = {"scalar": 0, "avx2": 1, "avx512f": 2}
#: the ops, by code in the C entry
OPS = {"RNN": 0, "GRU": 1, "LSTM": 2}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
#: the ONNX activations the gates apply, by code in the C entry
ACTIVATIONS = {"Relu": 0, "Tanh": 1, "Sigmoid": 2, "Affine": 3, "LeakyRelu": 4, "ThresholdedRelu": 5,
               "ScaledTanh": 6, "HardSigmoid": 7, "Elu": 8, "Softsign": 9, "Softplus": 10}
_LIM = 1 << 24

_SRC = native.c_source("recurrent.c")
_mod = native.lazy_module("GE_NATIVE_RECURRENT", _SRC, ["rn_ok", "rn_caps", "rn_isa", "rn_run"], "rn_ok")
_VARIANTS = native.Variants(_mod, VARIANTS, _CODES, "rn_caps", "rn_isa")
#: whether the module built here and its switch leaves it on; the variants this CPU runs, best
#: first; the one that runs (None: off or not built)
available, runnable, isa = _VARIANTS.available, _VARIANTS.runnable, _VARIANTS.isa


def _pad32(n: int) -> int:
    return -(-n // 32) * 32


def layout(op: str, hidden: int) -> tuple[int, int]:
    """``(W, zp)``: the padded width of a step's gate columns and where GRU's ``h`` block starts
    (``W`` for LSTM and RNN)."""
    if op == "GRU":
        zp = _pad32(2 * hidden)
        return zp + _pad32(hidden), zp
    w = _pad32(_GATES[op] * hidden)
    return w, w


def gate_columns(op: str, hidden: int) -> np.ndarray:
    """The padded column of each of the ``gates * H`` ONNX gate rows (int64)."""
    cols = np.arange(_GATES[op] * hidden, dtype=np.int64)
    if op == "GRU":
        cols[2 * hidden:] += layout(op, hidden)[1] - 2 * hidden
    return cols


def pad_columns(op: str, m: np.ndarray, hidden: int) -> np.ndarray:
    """``m`` (..., gates * H) with its last axis spread over the padded layout (zeros between)."""
    w, _ = layout(op, hidden)
    out = np.zeros(m.shape[:-1] + (w,), m.dtype)
    out[..., gate_columns(op, hidden)] = m
    return out


def pack(op: str, r: np.ndarray) -> np.ndarray:
    """``R`` ``(nd, gates * H, H)`` (ONNX layout) as float32 panels ``(nd, W / 16, H, 16)``:
    element ``(d, p, k, l)`` is ``R[d, n, k]`` for the gate row ``n`` in padded column ``16 p + l``
    (zero in padding); 64-byte aligned."""
    nd, gh, hidden = (int(s) for s in r.shape)
    if gh != _GATES[op] * hidden:
        raise ValueError(f"{op}'s R is (nd, {_GATES[op]} * H, H), not {tuple(r.shape)}")
    rt = pad_columns(op, np.asarray(r, np.float32).transpose(0, 2, 1), hidden)  # (nd, H, W)
    w = rt.shape[2]
    return native.aligned(np.ascontiguousarray(rt.reshape(nd, hidden, w // 16, 16).transpose(0, 2, 1, 3)))


def _act_params(acts: Sequence[Sequence[tuple[str, float, float]]]) -> tuple[list[int], list[float]] | None:
    codes: list[int] = []
    ab: list[float] = []
    for d in range(2):
        row = list(acts[min(d, len(acts) - 1)]) + [("Tanh", 0.0, 0.0)] * 3
        for name, alpha, beta in row[:3]:
            if name not in ACTIVATIONS:
                return None
            codes.append(ACTIVATIONS[name])
            ab += [float(alpha), float(beta)]
    return codes, ab


def _f32(a: object, shape: tuple[int, ...], writable: bool = False) -> bool:
    return (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == shape and a.flags.c_contiguous
            and a.flags.aligned and (not writable or a.flags.writeable))


def run(op: str, xw: np.ndarray, rp: np.ndarray, hs: np.ndarray, hinit: np.ndarray, c: np.ndarray,
        lens: np.ndarray, peep: np.ndarray, rbh: np.ndarray, run_steps: int, clip: float | None,
        input_forget: bool, lbr: bool, acts: Sequence[Sequence[tuple[str, float, float]]],
        has_peep: bool = False, width: int = 1, variant: str | None = None) -> bool:
    """The recurrence of ``run_steps`` steps (module docstring) on ``width`` threads: ``xw``
    ``(nd, steps, batch, W)``, ``rp`` from :func:`pack`, ``hs`` ``(max(run_steps, 1), nd, batch,
    H)`` and ``c`` ``(nd, batch, H)`` written, ``hinit`` ``(nd, batch, H)``, ``lens`` int64
    ``(batch,)`` in ``[0, steps]``, ``peep`` ``(nd, 3, H)`` (LSTM's ``(i, o, f)``, read when
    ``has_peep``), ``rbh`` ``(nd, H)`` (GRU's ``Rb_h`` with ``lbr``), float32 C-contiguous arrays;
    ``clip`` the cell clip or None; ``acts`` each direction's activations as ``(name, alpha,
    beta)`` (names of :data:`ACTIVATIONS`); ``variant``: one of :func:`runnable`, default
    :func:`isa`. False (nothing written) when the path is off or an argument does not fit; the
    C entry checks them all again."""
    mod = _mod()
    name = variant or isa()
    if mod is None or name not in _CODES or op not in OPS or not isinstance(xw, np.ndarray) or xw.ndim != 4:
        return False
    nd, steps, batch, w = (int(s) for s in xw.shape)
    if not isinstance(hinit, np.ndarray) or hinit.ndim != 3:
        return False
    hidden = int(hinit.shape[2])
    if hidden < 1 or hidden > _LIM or batch < 1 or not 0 <= int(run_steps) <= steps or w != layout(op, hidden)[0]:
        return False
    if not (_f32(xw, (nd, steps, batch, w)) and _f32(rp, (nd, w // 16, hidden, 16))
            and _f32(hs, (max(int(run_steps), 1), nd, batch, hidden), True) and _f32(hinit, (nd, batch, hidden))
            and _f32(c, (nd, batch, hidden), True) and _f32(peep, (nd, 3, hidden)) and _f32(rbh, (nd, hidden))):
        return False
    if (not isinstance(lens, np.ndarray) or lens.dtype != np.int64 or lens.shape != (batch,)
            or not lens.flags.c_contiguous):
        return False
    if np.may_share_memory(hs, c) or any(np.may_share_memory(o, i) for o in (hs, c) for i in (xw, rp, hinit)):
        return False
    ap = _act_params(acts)
    if ap is None or (clip is not None and not float(clip) > 0):
        return False
    codes, ab = ap
    fp = np.array([1.0 if clip is None else float(clip), *ab], np.float32)
    ip = np.array([OPS[op], int(run_steps), clip is not None, bool(input_forget), bool(lbr), bool(has_peep),
                   layout(op, hidden)[1], *codes, max(1, min(int(width), 4096)), _CODES[name]], np.int64)
    try:
        mod.rn_run(xw, rp, hs, hinit, c, lens, peep, rbh, fp, ip)
    except (TypeError, ValueError):
        return False
    return True


#: its kernel family in :mod:`ge_native.isa`'s registry; ``numpy`` (the fallback) is the cpu
#: backend's NumPy form, which runs when the switch is off or the module did not build
FAMILY = _isa.register(_isa.Family("recurrent", [_isa.Variant("avx512f", frozenset({"avx512f"})),
                                                 _isa.Variant("avx2", frozenset({"avx2", "fma"})),
                                                 _isa.Variant("scalar"), _isa.Variant("numpy")],
                                   switch="GE_NATIVE_RECURRENT", probe=isa))
