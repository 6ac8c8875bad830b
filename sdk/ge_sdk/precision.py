"""The precision contract between the pass that chooses a node's precision and the backend
that computes it.

ATC's precision pass (``ge_atc``) decides per node, from ``--precision_mode``, the mixed-precision
lists, ``--keep_dtype`` and ``--modify_mixlist``, the precision a matrix op *wants*; a backend's
pass (``ge_cpu``'s ``reduced_precision``) then rewrites the nodes it has kernels for, with their
weights packed in that precision, and says what it did. Plugins never import each other, so the
handshake lives here: the pass puts one :func:`entry` dict in ``node.meta[META]`` and in its
report table; the backend fills in the entry in place (:func:`done`), so the table shows per node
what was stored and what was computed, and why not where the backend kept float32.
"""

from __future__ import annotations

from typing import Any

#: ``node.meta`` key of a node's precision entry
META = "precision"

#: the reduced precisions a node may want
REDUCED = ("bfloat16", "float16")


def entry(op: str, wanted: str) -> dict[str, Any]:
    """A node's entry before the backend acts: it wants ``wanted``; weights and compute float32."""
    if wanted not in REDUCED:
        raise ValueError(f"a reduced precision is one of {', '.join(REDUCED)}, not {wanted!r}")
    return {"op": op, "wanted": wanted, "weights": "float32", "compute": "float32", "kernel": ""}


def wanted(node: Any) -> str | None:
    """The reduced precision ``node`` wants, or None."""
    e = node.meta.get(META)
    return e.get("wanted") if isinstance(e, dict) and e.get("wanted") in REDUCED else None


def done(node: Any, weights: str, compute: str, kernel: str, why: str = "", saved: int = 0) -> None:
    """Record on ``node``'s entry what the backend stores and computes (``why``: the reason it
    kept float32 where it did; ``saved``: bytes of weights saved)."""
    e = node.meta.get(META)
    if isinstance(e, dict):
        e.update(weights=weights, compute=compute, kernel=kernel, bytes_saved=int(saved))
        if why:
            e["why"] = why
        else:
            e.pop("why", None)


def move(old: Any, new: Any) -> None:
    """Carry ``old``'s entry to ``new``, the node that replaces it."""
    if META in old.meta:
        new.meta[META] = old.meta[META]


#: the mode a float32 compile's hint measures, and the most seconds a float32 compile may have
#: taken for the hint to compile the model again in it (else the hint gives the GEMM ratio only)
HINT_MODE = "allow_mix_precision_bf16"
HINT_BUDGET_S = 5.0


def measure_mode(source: Any, opts: dict[str, Any], model: Any, mode: str = HINT_MODE, runs: int = 5) -> dict[str, Any]:
    """``model`` (a float32 build of ``source`` with ``opts``) against a build in ``mode`` on the
    same random inputs (seed 0): the float32 / ``mode`` ratio of the best of ``runs`` warm runs
    each, interleaved, and the largest error over the float32 output's range and the cosine
    (the worst output)."""
    import time

    import numpy as np

    import ge_core as ge
    from ge_sdk.inputs import random_inputs

    other = ge.compile(source, {**opts, "precision_mode": mode})
    feeds = {k: v for k, v in random_inputs(model.graph, 0).items() if k in model.input_names}
    best = {"fp32": float("inf"), mode: float("inf")}
    outs: dict[str, Any] = {}
    for _ in range(max(1, runs) + 1):  # (the first run of each is a warm-up)
        for key, m in (("fp32", model), (mode, other)):
            t0 = time.perf_counter()
            outs[key] = m.run(feeds)
            best[key] = min(best[key], time.perf_counter() - t0)
    worst, cos = 0.0, 1.0
    for name, ref in outs["fp32"].items():
        a, b = np.asarray(outs[mode].get(name), np.float64), np.asarray(ref, np.float64)
        if a.shape != b.shape or b.dtype.kind != "f" or not b.size or not np.isfinite(b).all():
            continue
        span = float(b.max() - b.min()) or float(np.abs(b).max()) or 1.0
        worst = max(worst, float(np.abs(a - b).max()) / span)
        na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
        cos = min(cos, float(np.dot(a.ravel(), b.ravel()) / (na * nb)) if na and nb else 1.0)
    return {"mode": mode, "speedup": best["fp32"] / best[mode] if best[mode] > 0 else 0.0,
            "max_abs_over_range": worst, "cosine": cos}


def hint_line(hint: str, trial: dict[str, Any] | None) -> str:
    """The float32 compile's note: the report's ``precision_hint``, with ``trial``
    (:func:`measure_mode`) measured on this model where there is one."""
    if not trial:
        return hint
    sp = trial["speedup"]
    speed = f"ran this model {sp:.1f}x as fast here" if sp >= 1.1 else \
        f"would not speed this model up here ({sp:.2f}x: too little matrix work for the unit to pay)"
    return (f"{hint.split(':')[0]}: --precision_mode={trial['mode']} {speed} (best of 5 runs on random inputs), its "
            f"output within {trial['max_abs_over_range']:.1e} of the float32 output's range (cosine "
            f"{trial['cosine']:.6f}); `ge bench MODEL --precision fp32,bf16` compares them further")
