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
