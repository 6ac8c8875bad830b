"""Mutations of what an .om stores beyond the graph (memory plan, stream assignment, options,
report, metadata) and the oracle that goes with them, for the ``om`` fuzz target.

:func:`mutate_stored` edits a model definition in place: plans that overlap, leave the arena or
place graph inputs/outputs in it; stream assignments without the events that order them; options
nested, unknown or ill typed; numbers JSON should not hold (NaN, infinities, integers beyond 64
bits, deep nesting). :func:`check_loaded` is the oracle for a mutated definition that loads: the
model must compute what the same graph computes interpreted without any stored plan or streams,
so a stored plan or assignment that passes the loader's checks can never give wrong values.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

from fuzz_engine import OracleViolation

#: what a hostile writer puts where a number or a name belongs
HOSTILE_VALUES: list[Any] = [
    math.nan, math.inf, -math.inf, 2**63, -(2**63) - 1, 2**64, 10**30, 10**400, -0.0, 1e308, True, None,
    "0", "", "x" * 5000, [], {}, [[[[0]]]], {"i": 1},
]

EXECUTORS = ["auto", "sink", "arena", "streams", "sequential", "turbo", "", 5, None]


def _paths(d: Any, path: tuple = (), out: list | None = None, limit: int = 2000) -> list[tuple]:
    out = [] if out is None else out
    stack = [(d, path)]
    while stack and len(out) < limit:
        x, p = stack.pop()
        out.append(p)
        if isinstance(x, dict):
            stack.extend((v, p + (k,)) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, p + (i,)) for i, v in enumerate(x[:50]))
    return out


def _set(d: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def _deep(n: int) -> Any:
    v: Any = 0
    for _ in range(n):
        v = [v]
    return v


def _mutate_plan(plan: dict, graph: dict, rng: random.Random) -> str:
    offs = plan.get("offsets")
    if not isinstance(offs, dict) or not offs:
        plan["offsets"] = {"x": 0}
        return "plan:invent"
    names = list(offs)
    k = rng.choice(names)
    r = rng.randrange(9)
    if r == 0:
        plan["offsets"] = {n: 0 for n in names}
        return "plan:zero"
    if r == 1:
        offs[k] = offs[rng.choice(names)]
        return "plan:collide"
    if r == 2 and isinstance(offs[k], int):
        offs[k] += rng.choice([1, -1, 64, -64, 4096])
        return "plan:shift"
    if r == 3:
        ends = [v.get("name") for v in graph.get("inputs", []) if isinstance(v, dict)] + list(graph.get("outputs", []))
        if ends:
            offs[str(rng.choice(ends))] = 0
        return "plan:graph-value"
    if r == 4:
        del offs[k]
        return "plan:drop"
    if r == 5 and isinstance(plan.get("arena_bytes"), int):
        plan["arena_bytes"] = rng.choice([plan["arena_bytes"] // 2, plan["arena_bytes"] * 2, 2**47, 0])
        return "plan:arena"
    if r == 6:
        plan["offsets"] = dict(zip(names, rng.sample(list(offs.values()), len(names))))
        return "plan:permute"
    if r == 7:
        plan["offsets"] = {n: i * 64 for i, n in enumerate(names)}  # valid, no reuse, arena may be short
        return "plan:spread"
    offs[k] = rng.choice(HOSTILE_VALUES)
    return "plan:value"


def _mutate_streams(st: dict, rng: random.Random) -> str:
    ids, events = st.get("streams"), st.get("events")
    if not isinstance(ids, list) or not ids:
        st["streams"] = rng.choice(HOSTILE_VALUES)
        return "streams:value"
    r = rng.randrange(6)
    if r == 0:
        st["events"] = []
        return "streams:no-events"
    if r == 1 and isinstance(events, list) and events:
        events.pop(rng.randrange(len(events)))
        return "streams:drop-event"
    if r == 2:
        i = rng.randrange(len(ids))
        ids[i] = rng.choice([0, 1, 2, max((s for s in ids if isinstance(s, int)), default=0) + 1, 1023, 1024, -1])
        return "streams:move-node"
    if r == 3:
        st["streams"] = [rng.randrange(3) for _ in ids]
        return "streams:shuffle"
    if r == 4 and isinstance(events, list) and events:
        e = rng.choice(events)
        if isinstance(e, list) and len(e) == 2:
            e[rng.randrange(2)] = rng.choice([0, len(ids) - 1, len(ids), -1, True])
        return "streams:event-end"
    st["events"] = [[0, len(ids) - 1]] * rng.choice([1, 1000])
    return "streams:extra-events"


def _mutate_options(opts: dict, rng: random.Random) -> str:
    r = rng.randrange(8)
    extra = opts.get("extra") if isinstance(opts.get("extra"), dict) else {}
    if r == 0:
        opts["extra"] = {"extra": copy.deepcopy(extra) or {"executor": "sink"}}  # the old extra.extra
        return "options:nested-extra"
    if r == 1:
        opts[rng.choice(["zz_unknown", "executor", "Extra"])] = 1
        return "options:unknown"
    if r == 2:
        opts["extra"] = dict(extra, executor=rng.choice(EXECUTORS))
        return "options:executor"
    if r == 3:
        opts["extra"] = dict(extra, memory_alignment=rng.choice([16, 128, 512, 100, "64", 0, 2**40]))
        return "options:alignment"
    if r == 4:
        key = rng.choice(["disable_reuse_memory", "enable_single_stream", "memory_optimize_level", "opt_level"])
        opts[key] = rng.choice([True, False, "off", "high", 0, 3, "x"])
        return "options:" + key
    if r == 5:
        opts[rng.choice(list(opts) or ["log"])] = rng.choice(HOSTILE_VALUES)
        return "options:value"
    if r == 6:
        opts["extra"] = dict(extra, max_streams=rng.choice([1, 2, "2", -1]))
        return "options:max_streams"
    opts["extra"] = rng.choice(HOSTILE_VALUES)
    return "options:extra-value"


def mutate_stored(d: dict, rng: random.Random) -> str:
    """Mutate what a model definition stores besides the graph, in place; returns a label."""
    r = rng.random()
    graph = d.get("graph") if isinstance(d.get("graph"), dict) else {}
    if r < 0.3 and isinstance(d.get("memory_plan"), dict):
        return _mutate_plan(d["memory_plan"], graph, rng)
    if r < 0.5 and isinstance(d.get("streams"), dict):
        return _mutate_streams(d["streams"], rng)
    if r < 0.7 and isinstance(d.get("options"), dict):
        return _mutate_options(d["options"], rng)
    if r < 0.8:
        rep = d.get("report") if isinstance(d.get("report"), dict) else {}
        key = rng.choice(["nodes_before", "kernels", "op_counts", "memory", "streams", "passes", "zz"])
        rep[key] = rng.choice(HOSTILE_VALUES + [{"arena_bytes": "x"}, {"Conv": "many"}, [1]])
        d["report"] = rep
        return "report:" + key
    if r < 0.85:
        meta = graph.get("metadata") if isinstance(graph.get("metadata"), dict) else {}
        meta[rng.choice(["_depth", "source", "zz"])] = rng.choice(HOSTILE_VALUES)
        return "metadata"
    paths = [p for p in _paths(d) if p]
    if not paths:
        return "none"
    p = rng.choice(paths)
    v = _deep(rng.choice([200, 300, 5000])) if rng.random() < 0.2 else rng.choice(HOSTILE_VALUES)
    try:
        _set(d, p, v)
    except (KeyError, IndexError, TypeError):
        return "number:skip"
    return "number"


def check_loaded(model: Any, ctx: dict[str, Any]) -> None:
    """Oracle for a case whose mutation was :func:`mutate_stored`'s: the loaded model computes
    what its own graph computes interpreted, with no stored plan and one stream."""
    if not str(ctx.get("mutation", "")).startswith(("stored:plan", "stored:streams", "stored:options")):
        return
    import numpy as np

    import ge_core as ge
    from ge_core.errors import GEError
    from ge_core.model import CompiledModel
    from ge_core.schedule import StreamAssignment
    from ge_sdk.inputs import random_inputs

    feeds = random_inputs(model.graph, 0)
    opts = ge.CompileOptions.from_any({"soc_version": model.options.soc_version, "executor": "sequential"})
    ref = CompiledModel(model.graph, opts, streams=StreamAssignment.single(len(model.graph)), memory_plan=None,
                        report={}, host=model.host)
    try:
        want = ref.run(feeds)
    except GEError:
        return  # the graph itself fails on these inputs: nothing to compare
    got = model.run(feeds)
    for k, w in want.items():
        g = got[k]
        if not isinstance(w, np.ndarray) or w.dtype.kind not in "fiub":
            continue
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True):
            raise OracleViolation(f"a stored {ctx['mutation']} loaded and output '{k}' differs from the graph's "
                                  "own result: the loader trusted a plan, assignment or option it should have refused")
