"""Planners: no reuse, greedy by size (best fit), and ``auto`` which keeps the smallest plan."""

from __future__ import annotations

import bisect

from ge_core.memory import Buffer, MemoryPlan, MemoryProblem, align_up


def plan_no_reuse(problem: MemoryProblem, options=None) -> MemoryPlan:
    """Every buffer gets its own range: the arena is the sum of all sizes."""
    off = 0
    offsets = {}
    for b in problem.buffers:
        offsets[b.name] = off
        off += align_up(b.size, problem.alignment)
    return MemoryPlan(offsets, off, "none")


def plan_greedy_by_size(problem: MemoryProblem, options=None) -> MemoryPlan:
    """Largest buffers first; each takes the best-fitting gap among buffers alive at the same time
    (the heuristic of TFLite's and XLA's greedy-by-size planners)."""
    a = problem.alignment
    order = sorted(problem.buffers, key=lambda b: (-b.size, b.start, b.name))
    placed: list[tuple[int, int, Buffer]] = []  # (offset, end_offset, buffer) sorted by offset
    offsets: dict[str, int] = {}
    arena = 0
    for b in order:
        size = align_up(b.size, a)
        best_off, best_gap = None, None
        prev_end = 0
        for off, end, other in placed:
            if not (other.end < b.start or b.end < other.start):
                gap = off - prev_end
                if gap >= size and (best_gap is None or gap < best_gap):
                    best_off, best_gap = prev_end, gap
                prev_end = max(prev_end, end)
        if best_off is None:
            best_off = prev_end
        offsets[b.name] = best_off
        bisect.insort(placed, (best_off, best_off + size, b), key=lambda t: (t[0], t[1]))
        arena = max(arena, best_off + size)
    return MemoryPlan(offsets, arena, "greedy_by_size")


def plan_auto(problem: MemoryProblem, options=None) -> MemoryPlan:
    """Run every reusing planner and keep the smallest arena."""
    plans = [plan_greedy_by_size(problem, options)]
    best = min(plans, key=lambda p: p.arena_bytes)
    return best
