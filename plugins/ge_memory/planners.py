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

from ge_core.memory import Buffer, MemoryPlan, MemoryProblem, SortedList, align_up

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


#: The most runs (byte ranges of the buffers alive with a buffer, merged where they meet) that
#: :func:`best_fit` goes through to find a buffer's gaps. Beyond (thousands of buffers alive with
#: it, scattered over the arena in the tree's lists), it takes the best of the gaps below the
#: lowest run it left out, else the top: that bounds a buffer's cost. The models of the test suite
#: stay far below it (a few hundred buffers in all), so their plans are those of the full search.
MAX_RUNS = 256


def best_fit(problem: MemoryProblem, order: Sequence[Buffer], name: str) -> MemoryPlan:
    """Place buffers in ``order``; each takes the smallest gap, among the buffers already
    placed that are alive at the same time, that holds it (else the top of those).

    The placed buffers' byte ranges are kept in a segment tree over the schedule's steps (the
    distinct starts: two lifetimes meet iff the later start lies in both), each node holding the
    union of the ranges as merged runs: ``own`` of the buffers whose lifetime covers the node
    (stored at the O(log n) nodes that tile it), ``sub`` of those stored at the node or below. The
    buffers alive with a new one are then the ``sub`` of the nodes tiling its lifetime and the
    ``own`` of their ancestors, and the gaps of its union are the gaps between the runs of these
    few lists: O(log^2 n) for a plan that packs the live buffers (a wide graph's thousands of
    branches) where going through every placed buffer was quadratic. Within :data:`MAX_RUNS` runs
    the gaps and the choice are those of comparing with every placed buffer; a buffer of size
    zero goes at offset 0 (it overlaps nothing there) and takes no part.
    """
    a = problem.alignment
    starts = sorted({b.start for b in problem.buffers})
    depth = max(1, (len(starts) - 1).bit_length())
    leaves = 1 << depth
    own: dict[int, tuple[list[int], list[int]]] = {}
    sub: dict[int, tuple[list[int], list[int]]] = {}
    offsets: dict[str, int] = {}
    arena = 0
    lo_of, hi_of = bisect.bisect_left, bisect.bisect_right
    add = _add_run
    for b in order:
        size = align_up(b.size, a)
        if size <= 0:
            offsets[b.name] = 0
            continue
        # the nodes tiling the steps [lo, hi) (bottom up), and their ancestors
        lo = l0 = lo_of(starts, b.start) + leaves
        hi = r0 = hi_of(starts, b.end) + leaves
        tiles: list[int] = []
        while lo < hi:
            if lo & 1:
                tiles.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                tiles.append(hi)
            lo >>= 1
            hi >>= 1
        above: list[int] = []
        for i in range(1, depth + 1):
            x = l0 >> i
            left = (x << i) != l0
            if left:
                above.append(x)
            y = (r0 - 1) >> i
            if (r0 >> i) << i != r0 and (y != x or not left):
                above.append(y)
        lists = [sub[x] for x in tiles if x in sub]
        lists += [own[x] for x in above if x in own]
        best_off, best_gap = -1, -1
        prev_end = 0
        pairs: Any = ()
        top = -1
        if len(lists) == 1 and len(lists[0][0]) <= MAX_RUNS:
            pairs = zip(*lists[0])
        elif lists and sum(len(runs[0]) for runs in lists) <= MAX_RUNS:
            pairs = sorted(p for runs in lists for p in zip(*runs))
        elif lists:
            # the lowest runs of each list: their gaps below the first run left out are the gaps
            # there; where none holds the buffer, it goes on top
            k = max(1, MAX_RUNS // len(lists))
            cut = min((runs[0][k] for runs in lists if len(runs[0]) > k), default=None)
            if cut is None:  # every run after all
                pairs = sorted(p for runs in lists for p in zip(*runs))
            else:
                pairs = sorted(p for runs in lists for p in zip(runs[0][:k], runs[1][:k]) if p[0] <= cut)
                pairs.append((cut, cut))
                top = max(runs[1][-1] for runs in lists)
        for off, end in pairs:
            gap = off - prev_end
            if gap >= size and (best_gap < 0 or gap < best_gap):
                best_off, best_gap = prev_end, gap
                if gap == size:  # nothing later fits tighter
                    break
            if end > prev_end:
                prev_end = end
        if best_off < 0:
            best_off = prev_end if top < 0 else top
        offsets[b.name] = best_off
        end = best_off + size
        for x in tiles:
            add(own, x, best_off, end)
            add(sub, x, best_off, end)
        for x in above:
            add(sub, x, best_off, end)
        if end > arena:
            arena = end
    return MemoryPlan(offsets, arena, name)


def _add_run(store: dict[int, tuple[list[int], list[int]]], node: int, start: int, end: int) -> None:
    """Add [start, end) to the node's union of byte ranges (sorted, disjoint, not touching runs)."""
    runs = store.get(node)
    if runs is None:
        store[node] = ([start], [end])
        return
    s, e = runs
    if e[-1] <= start:  # at or above the top run (the common case: packing upwards)
        if e[-1] == start:
            e[-1] = end
        else:
            s.append(start)
            e.append(end)
        return
    i = bisect.bisect_left(e, start)  # runs before i end below start
    j = bisect.bisect_right(s, end)  # runs from j start above end
    if i == j:
        s.insert(i, start)
        e.insert(i, end)
    else:
        if s[i] < start:
            start = s[i]
        if e[j - 1] > end:
            end = e[j - 1]
        s[i:j] = [start]
        e[i:j] = [end]


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
    (which grows to fit); the first freed among equals. Blocks are then laid out end to end, each
    as large as its largest buffer. ``classes=False`` lets any free block serve any buffer. The
    free blocks of a class are kept ordered by (size, when freed): O(log n) a buffer.
    """
    a = problem.alignment
    order = sorted(problem.buffers, key=lambda b: (b.start, -b.size, b.name))
    block_size: list[int] = []
    block_of: dict[str, int] = {}
    free: dict[int, SortedList] = {}  # per size class: (block size, when freed, block)
    freed = 0
    busy: list[tuple[int, int]] = []  # heap of (end, block)
    import heapq

    for b in order:
        while busy and busy[0][0] < b.start:
            _, blk = heapq.heappop(busy)
            c = _size_class(block_size[blk]) if classes else 0
            pool = free.get(c)
            if pool is None:
                pool = free[c] = SortedList()
            pool.add((block_size[blk], freed, blk))
            freed += 1
        size = align_up(b.size, a)
        pool = free.get(_size_class(size) if classes else 0)
        pick = -1
        if pool:
            key = pool.ceiling((size, -1, -1))  # the smallest that holds it
            if key is None:  # the largest
                key = pool.ceiling((pool.last()[0], -1, -1))
            pool.remove(key)
            pick = key[2]
        if pick < 0:
            pick = len(block_size)
            block_size.append(size)
        else:
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
    # the most over each lifetime from a sparse table (maxima over windows of 2^k steps), one
    # level at a time: O(n log n), where slicing each lifetime was quadratic in a wide graph
    lo = np.array([b.start for b in problem.buffers], dtype=np.int64)
    hi = np.array([b.end for b in problem.buffers], dtype=np.int64)
    level = np.floor(np.log2(hi - lo + 1)).astype(np.int64)
    most = np.empty(len(lo), dtype=live.dtype)
    table = live  # table[i]: the most over steps i .. i + 2^k - 1
    for k in range(int(level.max()) + 1):
        at = np.nonzero(level == k)[0]
        if len(at):
            most[at] = np.maximum(table[lo[at]], table[hi[at] - (1 << k) + 1])
        table = np.maximum(table[:-(1 << k)], table[1 << k:])
    return {b.name: int(m) for b, m in zip(problem.buffers, most)}


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
    level = "normal" if options is None else options.getoption("memory_optimize_level", "normal") or "normal"
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
