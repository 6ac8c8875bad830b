"""Random inputs for a graph's declared input types (the CLI's ``ge run``, tests, benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .errors import GEError
from .ir.graph import Graph


def random_inputs(graph: Graph, seed: int = 0, dims: Mapping[str, int] | None = None, *, default_dim: int = 1,
                  strict: bool = False) -> dict[str, np.ndarray]:
    """Random feeds: floats standard normal, integers in [0, 4), booleans, strings ``"a"``.

    A symbolic dim takes ``dims[name]`` or ``default_dim``. ``strict`` refuses inputs of unknown
    rank or string dtype (a test wants to say so) instead of guessing a scalar or a string.
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.type.shape is None and strict:
            raise GEError(f"input '{v.name}' has an unknown rank; give feeds= explicitly")
        shape = tuple(d if isinstance(d, int) else (dims or {}).get(str(d), default_dim) for d in (v.type.shape or ()))
        dt = v.type.dtype or np.dtype("float32")
        if dt.kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            feeds[v.name] = rng.integers(0, 4, shape).astype(dt)
        elif dt.kind == "b":
            feeds[v.name] = rng.integers(0, 2, shape).astype(bool)
        elif strict:
            raise GEError(f"input '{v.name}' of dtype {dt} needs explicit feeds")
        else:
            feeds[v.name] = np.full(shape, "a", dtype=object)
    return feeds
