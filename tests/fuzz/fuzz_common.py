"""Values and paths the fuzz targets share: the light ONNX model zoo, odd integers, floats and
strings, and the random edits of a JSON document."""

from __future__ import annotations

import copy
import os
import random
from typing import Any

from fuzz_engine import INTERESTING_INTS

LIGHT = ("bvlc_alexnet", "zfnet512", "vgg19", "squeezenet")


def _light_dir() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _weird_int(rng: random.Random) -> int:
    v = rng.choice(INTERESTING_INTS + [3, 5, 224])
    return -v if rng.random() < 0.2 else v


def _weird_float(rng: random.Random) -> float:
    return rng.choice([0.0, -0.0, 1.0, -1.0, 1e-45, 3.4e38, 1e308, float("inf"), float("-inf"), float("nan")])


def _weird_str(rng: random.Random, names: list[str] = ()) -> str:  # type: ignore[assignment]
    pool = ["", "x", "../x", "/abs", "a" * 5000, "\u00e9\u4e2d", "con", "input", "0", "-1", "\x00", " ", "NaN"]
    pool += list(names)[:50]
    return rng.choice(pool)


def _json_paths(x: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if len(path) > 12:  # deep nests made by _random_json are leaves for the mutator
        return out
    if isinstance(x, dict):
        for k, v in x.items():
            out.extend(_json_paths(v, path + (k,)))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out.extend(_json_paths(v, path + (i,)))
    return out


def _random_json(rng: random.Random, names: list[str]) -> Any:
    r = rng.randrange(12)
    if r == 0:
        return None
    if r == 1:
        return rng.choice([True, False])
    if r == 2:
        return _weird_int(rng)
    if r == 3:
        return rng.choice([2**64, -(2**63) - 1, 10**30, 1.5, -0.0, 1e308])
    if r == 4:
        return _weird_str(rng, names)
    if r == 5:
        return rng.choice(["float32", "int64", "string", "bool", "object", "float64", "bfloat16", "V8", "<f4"])
    if r == 6:
        return [_weird_int(rng) for _ in range(rng.randint(0, 4))]
    if r == 7:
        return {}
    if r == 8:
        return []
    if r == 9:
        d: Any = 0
        for _ in range(rng.choice([10, 100, 5000])):
            d = [d]
        return d
    if r == 10:
        return {"i": _weird_int(rng)} if rng.random() < 0.5 else {rng.choice(["t", "g", "gs", "list", "b", "zz"]): rng.choice([0, "", [], {}, -1, "AAAA"])}
    return rng.choice(names) if names else "x"


def _json_mutate(d: Any, rng: random.Random) -> str:
    paths = [p for p in _json_paths(d) if p]
    names = [v for p in paths for v in [p[-1]] if isinstance(v, str)]
    kinds = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        p = rng.choice(paths)
        parent = d
        for k in p[:-1]:
            parent = parent[k]
        last = p[-1]
        r = rng.random()
        try:
            if r < 0.6:
                parent[last] = _random_json(rng, names)
                kinds.append("set")
            elif r < 0.75:
                del parent[last]
                kinds.append("del")
            elif r < 0.85 and isinstance(parent, list):
                parent.insert(last, copy.deepcopy(parent[last]))
                kinds.append("dup")
            elif isinstance(parent, dict):
                parent[rng.choice(["zz", "format", "version", "graph", "weights", "nodes", "inputs", "outputs"])] = parent[last]
                kinds.append("key")
            else:
                parent.reverse()
                kinds.append("rev")
        except (KeyError, IndexError, TypeError, RecursionError):
            kinds.append("skip")
        paths = [q for q in _json_paths(d) if q]
        if not paths:
            break
    return "+".join(kinds)
