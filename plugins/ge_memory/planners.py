"""Planners: place every buffer of a :class:`MemoryProblem` at an offset in one arena.

* ``none``: every buffer gets its own range (no reuse);
* ``greedy_by_size``: largest buffers first, each in the best-fitting gap among the buffers
  alive at the same time (TFLite's and XLA's heap simulator heuristic);
* ``greedy_by_lifetime``: by start time (longest first among equals), best fit, a linear scan
  over the schedule (TFLite's greedy by breadth, XLA's by-lifetime heuristic);
* ``ge_block_reuse``: GE's block assigner: buffers in schedule order take a freed block of
  their size class (best fit, growing a block where needed), then blocks are laid end to end;
* ``auto``: runs best fit in several orders (by size, start, size x lifetime, the peak bytes
  alive during a buffer's lifetime as XLA does, ...) and GE's block reuse, and keeps the smallest
  arena (``memory_optimize_level = high`` adds more orders and perturbed restarts).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from ge_core.memory import Buffer, MemoryPlan, MemoryProblem, align_up

#: GE's size classes (bytes): a freed block is reused by a buffer of the same class.
SIZE_CLASSES = (0, 256 << 10, 1 << 20, 8 << 20, 32 << 20, 1 << 62)


def plan_no_reuse(problem: MemoryProblem, options: Any = None) -> MemoryPlan:
    """Every buffer gets its own range: the arena is the sum of all sizes."""
    off = 0
    offsets = {}
    for b in problem.buffers:
        offsets[b.name] = off
        off += align_up(b.size, problem.alignment)
    return MemoryPlan(offsets, off, "none")


def best_fit(problem: MemoryProblem, order: Sequence[Buffer], name: str) -> MemoryPlan:
    """Place buffers in ``order``; each takes the smallest gap, among the buffers already
    placed that are alive at the same time, that holds it (else the top of those)."""
    a = problem.alignment
    placed: list[tuple[int, int, Buffer]] = []  # (offset, end offset, buffer), sorted by offset
    offsets: dict[str, int] = {}
    arena = 0
    for b in order:
        size = align_up(b.size, a)
        best_off, best_gap = -1, -1
        prev_end = 0
        for off, end, other in placed:
            if other.end < b.start or b.end < other.start:
                continue
            gap = off - prev_end
            if gap >= size and (best_gap < 0 or gap < best_gap):
                best_off, best_gap = prev_end, gap
            prev_end = max(prev_end, end)
        if best_off < 0:
            best_off = prev_end
        offsets[b.name] = best_off
        bisect.insort(placed, (best_off, best_off + size, b), key=lambda t: (t[0], t[1]))
        arena = max(arena, best_off + size)
    return MemoryPlan(offsets, arena, name)


def plan_greedy_by_size(problem: MemoryProblem, options: Any = None) -> MemoryPlan:
    """Largest buffers first, best fit (the heuristic of TFLite's and XLA's greedy planners)."""
    order = sorted(problem.buffers, key=lambda b: (-b.size, b.start, b.name))
    return best_fit(problem, order, "greedy_by_size")


def plan_greedy_by_lifetime(problem: MemoryProblem, options: Any = None) -> MemoryPlan:
    """By start time, longer-lived and larger first among equals, best fit."""
    order = sorted(problem.buffers, key=lambda b: (b.start, -(b.end - b.start), -b.size, b.name))
    return best_fit(problem, order, "greedy_by_lifetime")


def _size_class(n: int) -> int:
    return bisect.bisect_right(SIZE_CLASSES, n) - 1


def plan_ge_block_reuse(problem: MemoryProblem, options: Any = None, *, classes: bool = True) -> MemoryPlan:
    """GE's block reuse: in schedule order, a buffer takes a block freed before it starts.

    Among free blocks of the buffer's size class, the smallest that holds it; else the largest
    (which grows to fit). Blocks are then laid out end to end, each as large as its largest
    buffer. ``classes=False`` lets any free block serve any buffer.
    """
    a = problem.alignment
    order = sorted(problem.buffers, key=lambda b: (b.start, -b.size, b.name))
    block_size: list[int] = []
    block_of: dict[str, int] = {}
    free: list[int] = []  # free block ids
    busy: list[tuple[int, int]] = []  # heap of (end, block)
    import heapq

    for b in order:
        while busy and busy[0][0] < b.start:
            _, blk = heapq.heappop(busy)
            free.append(blk)
        size = align_up(b.size, a)
        cls = _size_class(size)
        fits = [k for k in free if (not classes or _size_class(block_size[k]) == cls)]
        pick = -1
        if fits:
            holding = [k for k in fits if block_size[k] >= size]
            pick = min(holding, key=lambda k: block_size[k]) if holding else max(fits, key=lambda k: block_size[k])
        if pick < 0:
            pick = len(block_size)
            block_size.append(size)
        else:
            free.remove(pick)
            block_size[pick] = max(block_size[pick], size)
        block_of[b.name] = pick
        heapq.heappush(busy, (b.end, pick))
    base = []
    off = 0
    for s in block_size:
        base.append(off)
        off += s
    return MemoryPlan({name: base[k] for name, k in block_of.items()}, off, "ge_block_reuse")


def live_pressure(problem: MemoryProblem) -> dict[str, int]:
    """Per buffer, the most bytes alive at one step of its lifetime (XLA's spatial heuristic)."""
    import numpy as np

    if not problem.buffers:
        return {}
    a = problem.alignment
    n = max(b.end for b in problem.buffers) + 2
    sizes = [align_up(b.size, a) for b in problem.buffers]
    # int64 sums are exact only while the total fits; beyond that, exact Python ints (object)
    delta = np.zeros(n, dtype=np.int64 if sum(sizes) < 2**62 else object)
    for b, s in zip(problem.buffers, sizes):
        delta[b.start] += s
        delta[b.end + 1] -= s
    live = np.cumsum(delta)
    return {b.name: int(live[b.start:b.end + 1].max()) for b in problem.buffers}


def _candidates(problem: MemoryProblem, level: str) -> list[tuple[str, Callable[[], MemoryPlan]]]:
    bufs = problem.buffers
    pressure = live_pressure(problem)

    def by(name: str, key: Callable[[Buffer], Any]) -> tuple[str, Callable[[], MemoryPlan]]:
        return name, lambda: best_fit(problem, sorted(bufs, key=key), name)

    c: list[tuple[str, Callable[[], MemoryPlan]]] = [
        by("greedy_by_size", lambda b: (-b.size, b.start, b.name)),
        by("greedy_by_lifetime", lambda b: (b.start, -(b.end - b.start), -b.size, b.name)),
        by("greedy_by_area", lambda b: (-b.size * (b.end - b.start + 1), b.start, b.name)),
        by("greedy_by_pressure", lambda b: (-pressure[b.name], -b.size, b.start, b.name)),
        by("greedy_by_size_longest_first", lambda b: (-b.size, -(b.end - b.start), b.name)),
        ("ge_block_reuse", lambda: plan_ge_block_reuse(problem)),
    ]
    if level == "high":
        c += [
            by("greedy_by_size_late_first", lambda b: (-b.size, -b.end, b.name)),
            by("greedy_by_length", lambda b: (-(b.end - b.start), -b.size, b.name)),
            by("greedy_by_pressure_area", lambda b: (-pressure[b.name], -b.size * (b.end - b.start + 1), b.name)),
            ("ge_block_reuse_any_class", lambda: plan_ge_block_reuse(problem, classes=False)),
        ]
        import random

        def perturbed(seed: int) -> Callable[[Buffer], Any]:
            rng = random.Random(seed)
            noise = {b.name: rng.uniform(0.9, 1.1) for b in bufs}
            return lambda b: (-b.size * noise[b.name], b.start, b.name)

        for seed in range(4):  # size order perturbed by up to 10%: restarts that escape ties
            c.append(by(f"greedy_by_size_perturbed_{seed}", perturbed(seed)))
    return c


def plan_auto(problem: MemoryProblem, options: Any = None) -> MemoryPlan:
    """Run the reusing planners and keep the smallest arena (the first on ties)."""
    level = getattr(options, "memory_optimize_level", "normal") or "normal"
    best: MemoryPlan | None = None
    tried: dict[str, int] = {}
    for name, run in _candidates(problem, level):
        plan = run()
        plan.planner = name
        tried[name] = plan.arena_bytes
        if best is None or plan.arena_bytes < best.arena_bytes:
            best = plan
    assert best is not None
    best.stats = {"candidates": tried, "chosen": best.planner}
    best.planner = f"auto:{best.planner}"
    return best
