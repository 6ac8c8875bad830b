"""The float32 row kernels of onnxruntime's contrib ops (``csrc/contrib_rows.c``), which
``ge_cpu.contrib.norms`` runs: :func:`norm` (the layer norms with a skip input, a bias and their
optional outputs), :func:`rotary` (com.microsoft's RotaryEmbedding) and :func:`act` (Gelu, BiasGelu,
FastGelu, QuickGelu with a bias). Rows are split over the run's threads on the native pool; each
row is computed alone, so the results do not depend on their number. ``GE_NATIVE_CONTRIB=0``
turns the module off (the callers' NumPy forms run)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import native, parallel

_mod = native.lazy_module("GE_NATIVE_CONTRIB", native.c_source("contrib_rows.c"),
                          ["cr_norm", "cr_rotary", "cr_act", "cr_ok"], "cr_ok")

#: :func:`norm`'s flags (``csrc/contrib_rows.c``'s): which optional arrays it reads or writes
SKIP, BIAS, BETA, SUM, MEAN, INV, SIMPLIFIED, TWO_PASS = 1, 2, 4, 8, 16, 32, 64, 128
#: :func:`act`'s kinds
GELU, GELU_TANH, QUICK_GELU = 0, 1, 2

_NONE = np.zeros(1, np.float32)


def available() -> bool:
    """True when the native module built here and ``GE_NATIVE_CONTRIB`` leaves it on."""
    return _mod() is not None


def fits(*arrays: Any) -> bool:
    """True when every array (None skipped) is one the entries read as is: float32, C-contiguous, aligned."""
    return all(a is None or (type(a) is np.ndarray and a.dtype == np.float32 and a.flags.c_contiguous
                             and a.flags.aligned) for a in arrays)


def norm(x2: np.ndarray, out2: np.ndarray, gamma: np.ndarray, eps: float, *, skip2: np.ndarray | None = None,
         bias: np.ndarray | None = None, beta: np.ndarray | None = None, sum2: np.ndarray | None = None,
         mean: np.ndarray | None = None, inv: np.ndarray | None = None, simplified: bool = False,
         two_pass: bool = False) -> None:
    """``out2`` = the layer norm of the rows of ``x2`` (+ ``skip2`` row i % its rows, + ``bias``):
    ``(s - mean) * inv * gamma + beta`` or, ``simplified``, ``s * inv * gamma``; the sum ``s`` into
    ``sum2``, each row's mean and ``inv`` (1 / sqrt(variance + eps)) into ``mean`` and ``inv``
    where given. The variance is ``mean(s²) - mean²`` (onnxruntime's), ``two_pass``:
    ``mean((s - mean)²)``. ``out2`` and ``sum2`` may be ``x2`` or ``skip2`` itself. Call only when
    :func:`available` and every array :func:`fits`."""
    mod = _mod()
    assert mod is not None
    rows, cols = x2.shape
    flags = ((SKIP if skip2 is not None else 0) | (BIAS if bias is not None else 0) | (BETA if beta is not None else 0)
             | (SUM if sum2 is not None else 0) | (MEAN if mean is not None else 0) | (INV if inv is not None else 0)
             | (SIMPLIFIED if simplified else 0) | (TWO_PASS if two_pass else 0))
    skip_rows = skip2.shape[0] if skip2 is not None and skip2.ndim == 2 else 1
    mod.cr_norm(x2, _NONE if skip2 is None else skip2, _NONE if bias is None else bias, gamma,
                _NONE if beta is None else beta, out2, _NONE if sum2 is None else sum2, _NONE if mean is None else mean,
                _NONE if inv is None else inv, flags, float(eps), rows, cols, max(1, skip_rows),
                parallel.native_width())


def rotary(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray, dims: tuple[int, int, int, int],
           rot: int, transposed: bool, interleaved: bool, per_token: bool) -> None:
    """``out`` = ``x`` ((B, S, N, H) rows, or (B, N, S, H) ``transposed``; ``dims`` = (B, S, N,
    H)) with the first ``rot`` elements of each head rotated by its position's ``cos``/``sin``
    rows ((positions, rot / 2) float32): position ``pos[b, s]`` (``per_token``) or ``pos[0] + s``
    (int64); the halves, or the pairs when ``interleaved``. ``out`` may be ``x``. IndexError on a
    position outside the cache."""
    mod = _mod()
    assert mod is not None
    b, s, n, h = dims
    mod.cr_rotary(x, pos, cos, sin, out, b, s, n, h, rot, int(transposed), int(interleaved), int(per_token),
                  parallel.native_width())


def act(x2: np.ndarray, out2: np.ndarray, kind: int, bias: np.ndarray | None = None, alpha: float = 1.0) -> None:
    """``out2`` = the activation ``kind`` (:data:`GELU`, :data:`GELU_TANH`, :data:`QUICK_GELU`
    with ``alpha``) of ``x2`` + ``bias`` (one per column); ``out2`` may be ``x2``."""
    mod = _mod()
    assert mod is not None
    rows, cols = x2.shape
    mod.cr_act(x2, _NONE if bias is None else bias, out2, kind, float(alpha), rows, cols, int(bias is not None),
               parallel.native_width())
