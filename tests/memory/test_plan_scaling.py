"""Planning and checking a plan scale with the buffers alive at once (issue 42, "Time and space").

The plan check sweeps over time with the live buffers in offset order (each new buffer compared with
its neighbours), the best-fit planner keeps the placed buffers' byte ranges in a segment tree over
the schedule, and a symbolic plan's orders keep only the buffers each one must lie above: none of
them goes through every pair of buffers alive at once any more. The tests compare each with the
pairwise forms they replaced (kept here, brute force, as oracles) on random problems, valid and
invalid plans alike, and bound the growth of their time from n to 4n buffers alive at once well
below the 16x of a quadratic algorithm (ratios, not seconds, so a slow or busy machine passes).
"""

from __future__ import annotations

import bisect
import heapq
import random
import time

import numpy as np
import pytest

import ge_core as ge
import ge_memory.planners as planners
from ge_core import GEError
from ge_core.ir import symbolic as S
from ge_core.memory import (
    Buffer,
    MemoryPlan,
    MemoryProblem,
    SortedList,
    SymbolicPlan,
    _below_lists,
    align_up,
    place_in_order,
    verify_plan,
    verify_symbolic_plan,
)
from ge_memory.symbolic import order_of


# ------------------------------------------------------------------------------------------------
# brute-force oracles: the pairwise forms the sweep and the interval structures replaced
# ------------------------------------------------------------------------------------------------
def pairwise_overlap(problem: MemoryProblem, plan: MemoryPlan) -> str | None:
    """The message of the first overlap, comparing each buffer with every buffer alive when it starts."""
    bufs = sorted(problem.buffers, key=lambda b: b.start)
    alive: list = []
    for i, b in enumerate(bufs):
        while alive and alive[0][0] < b.start:
            heapq.heappop(alive)
        ob = plan.offsets[b.name]
        for _, _, a in alive:
            oa = plan.offsets[a.name]
            if ob < oa + a.size and oa < ob + b.size:
                return (f"memory plan by '{plan.planner}' overlaps '{a.name}' [{oa}, {oa + a.size}) and "
                        f"'{b.name}' [{ob}, {ob + b.size}) while both are alive")
        heapq.heappush(alive, (b.end, i, b))
    return None


def brute_force_check(problem: MemoryProblem, plan: MemoryPlan) -> str | None:
    """None for a valid plan, else the kind of fault: every pair of buffers, every bound."""
    for b in problem.buffers:
        off = plan.offsets[b.name]
        if off < 0 or off % problem.alignment or off + b.size > plan.arena_bytes:
            return "bounds"
    return pairwise_overlap(problem, plan)


def pairwise_best_fit(problem: MemoryProblem, order, name: str) -> MemoryPlan:
    """Best fit going through every placed buffer (the planner before issue 42)."""
    a = problem.alignment
    placed: list = []
    offsets = {}
    arena = 0
    for b in order:
        size = align_up(b.size, a)
        best_off, best_gap, prev_end = -1, -1, 0
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


def pairwise_below(buffers, order):
    by = {b.name: b for b in buffers}
    spans = [(by[n].start, by[n].end) for n in order]
    return [[j for j in range(i) if spans[j][0] <= e and s <= spans[j][1]] for i, (s, e) in enumerate(spans)]


def random_problem(rng: random.Random, n: int, steps: int, alignment: int = 64, zero: bool = True) -> MemoryProblem:
    bufs = []
    for i in range(n):
        s = rng.randrange(steps)
        size = rng.choice([rng.randrange(1, 300), rng.randrange(1, 5000), 64, 128] + ([0] if zero else []))
        bufs.append(Buffer(f"b{i}", size, s, s + rng.randrange(rng.choice([1, 3, 15, steps]))))
    return MemoryProblem(bufs, alignment)


def wide_problem(n: int) -> MemoryProblem:
    """A wide graph's buffers: n branches alive at once, then summed one by one."""
    bufs = [Buffer(f"m{i}", 16, 1 + i, n + max(i, 1)) for i in range(n)]
    bufs += [Buffer(f"s{i}", 16, n + 1 + i, n + 2 + i) for i in range(n - 2)]
    return MemoryProblem(bufs, 64)


def best_time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def growth(fn, n: int, repeat: int = 3) -> float:
    """Time at 4n over time at n (min of ``repeat``): about 4 for n log n, 16 for n^2."""
    small, large = fn(n), fn(4 * n)
    return best_time(large, repeat) / best_time(small, repeat)


# ------------------------------------------------------------------------------------------------
# the sweep finds every fault the pairwise check finds, with the same message
# ------------------------------------------------------------------------------------------------
def test_sorted_list_against_a_plain_sorted_list(monkeypatch):
    monkeypatch.setattr(SortedList, "DEFAULT_LOAD_FACTOR", 4)  # many sublists: splits and emptied ones
    rng = random.Random(0)
    for _ in range(60):
        sl, ref = SortedList(rng.sample(range(100), rng.randrange(20))), []
        ref = sorted(sl)
        for _ in range(200):
            op, x = rng.random(), rng.randrange(100)
            if op < 0.5:
                sl.add(x)
                bisect.insort(ref, x)
            elif op < 0.7 and ref:
                y = rng.choice(ref)
                sl.remove(y)
                ref.remove(y)
            elif op < 0.8:
                hi = x + rng.randrange(20)
                assert sl.pop_range(x, hi) == [v for v in ref if x <= v <= hi]
                ref = [v for v in ref if not x <= v <= hi]
            assert list(sl) == ref and len(sl) == len(ref)
            assert sl.floor(x) == max((v for v in ref if v <= x), default=None)
            assert sl.lower(x) == max((v for v in ref if v < x), default=None)
            assert sl.ceiling(x) == min((v for v in ref if v >= x), default=None)
            assert sl.higher(x) == min((v for v in ref if v > x), default=None)
            assert sl.last() == (ref[-1] if ref else None)
        with pytest.raises(ValueError):
            sl.remove(1000)


@pytest.mark.parametrize("seed", range(4))
def test_verify_sweep_agrees_with_the_pairwise_check_on_random_plans(seed):
    """Random plans, mostly invalid (overlapping in time and bytes, out of the arena, misaligned,
    zero-size buffers strictly inside others): verify_plan refuses exactly those the brute-force
    check refuses, and names the same pair."""
    rng = random.Random(seed)
    faults = {"ok": 0, "bounds": 0, "overlap": 0}
    for _ in range(400):
        prob = random_problem(rng, rng.randrange(1, 40), rng.choice([3, 10, 40]), rng.choice([16, 64]))
        a = prob.alignment
        if rng.random() < 0.5:  # a valid plan, then perhaps one buffer moved
            plan = planners.plan_greedy_by_size(prob)
            if rng.random() < 0.7:
                b = rng.choice(prob.buffers)
                plan.offsets[b.name] = rng.choice([plan.offsets[b.name] + rng.choice([-a, a, 1]),
                                                   rng.randrange(0, max(a, plan.arena_bytes), a)])
        else:  # offsets at random on a small grid: many overlaps, some misaligned
            offs = {b.name: rng.randrange(0, 12) * rng.choice([a, a, a // 2 or 1]) for b in prob.buffers}
            arena = max(o + b.size for b in prob.buffers for o in [offs[b.name]])
            plan = MemoryPlan(offs, arena + rng.choice([0, 0, -1, a]), "random")
        plan.arena_bytes = min(max(plan.arena_bytes, 0), sum(align_up(b.size, a) for b in prob.buffers))
        want = brute_force_check(prob, plan)
        if want is None:
            verify_plan(prob, plan)
            faults["ok"] += 1
            continue
        with pytest.raises(GEError) as e:
            verify_plan(prob, plan)
        if want == "bounds":
            assert "misaligned or outside the arena" in str(e.value)
            faults["bounds"] += 1
        else:
            assert str(e.value) == want
            faults["overlap"] += 1
    assert min(faults.values()) >= 20, faults  # every kind came up


def test_zero_size_buffers_overlap_only_strictly_inside():
    prob = MemoryProblem([Buffer("a", 128, 0, 5), Buffer("z", 0, 1, 2), Buffer("b", 64, 2, 3)], 64)
    for z in (0, 128):  # at either end of 'a': no overlap
        verify_plan(prob, MemoryPlan({"a": 0, "z": z, "b": 128}, 192))
    with pytest.raises(GEError, match="overlaps 'a' \\[0, 128\\) and 'z' \\[64, 64\\)"):
        verify_plan(prob, MemoryPlan({"a": 0, "z": 64, "b": 128}, 192))
    prob = MemoryProblem([Buffer("z", 0, 0, 5), Buffer("b", 128, 2, 3)], 64)
    verify_plan(prob, MemoryPlan({"z": 128, "b": 0}, 128))
    with pytest.raises(GEError, match="overlaps 'z' \\[64, 64\\) and 'b' \\[0, 128\\)"):
        verify_plan(prob, MemoryPlan({"z": 64, "b": 0}, 128))


# ------------------------------------------------------------------------------------------------
# the planners place as the pairwise forms did
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_best_fit_places_as_the_pairwise_search(seed):
    rng = random.Random(seed)
    for _ in range(300):
        prob = random_problem(rng, rng.randrange(1, 60), rng.choice([5, 30, 100]), rng.choice([16, 64]), zero=False)
        order = list(prob.buffers)
        rng.shuffle(order)
        if rng.random() < 0.3:
            order.sort(key=lambda b: -b.size)
        want = pairwise_best_fit(prob, order, "x")
        got = planners.best_fit(prob, order, "x")
        assert got.offsets == want.offsets and got.arena_bytes == want.arena_bytes


def test_best_fit_past_its_search_bound_stays_valid(monkeypatch):
    """Beyond MAX_RUNS runs a buffer takes the best gap below the first run left out, else the top:
    still a valid plan, on random problems and the wide graph's."""
    monkeypatch.setattr(planners, "MAX_RUNS", 3)
    rng = random.Random(5)
    for _ in range(200):
        prob = random_problem(rng, rng.randrange(1, 80), rng.choice([5, 30]), 64)
        order = list(prob.buffers)
        rng.shuffle(order)
        verify_plan(prob, planners.best_fit(prob, order, "x"))
    prob = wide_problem(300)
    for key in (lambda b: b.name, lambda b: rng.random()):
        plan = planners.best_fit(prob, sorted(prob.buffers, key=key), "x")
        verify_plan(prob, plan)


def test_block_reuse_and_pressure_as_before():
    """GE's block reuse with its free blocks ordered (first freed among equal sizes), and the
    sparse-table live pressure, against their linear scans."""
    rng = random.Random(9)

    def linear_block_reuse(problem, classes):
        a = problem.alignment
        block_size, block_of, free, busy = [], {}, [], []
        for b in sorted(problem.buffers, key=lambda b: (b.start, -b.size, b.name)):
            while busy and busy[0][0] < b.start:
                free.append(heapq.heappop(busy)[1])
            size = align_up(b.size, a)
            cls = planners._size_class(size)
            fits = [k for k in free if not classes or planners._size_class(block_size[k]) == cls]
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
        return block_of, block_size

    for _ in range(200):
        prob = random_problem(rng, rng.randrange(1, 80), rng.choice([5, 30]), 64)
        for b in prob.buffers[::3]:
            b.size = rng.choice([300 << 10, 2 << 20, 64, 128])
        for classes in (True, False):
            block_of, block_size = linear_block_reuse(prob, classes)
            base = np.concatenate([[0], np.cumsum(block_size)]).tolist()
            plan = planners.plan_ge_block_reuse(prob, classes=classes)
            assert plan.offsets == {n: base[k] for n, k in block_of.items()}
        live = [sum(align_up(b.size, 64) for b in prob.buffers if b.start <= t <= b.end)
                for t in range(max(b.end for b in prob.buffers) + 1)]
        assert planners.live_pressure(prob) == {b.name: max(live[b.start:b.end + 1]) for b in prob.buffers}


@pytest.mark.parametrize("seed", range(3))
def test_placement_orders_keep_only_the_buffers_that_count(seed):
    """place_in_order with the reduced below lists gives the offsets of all the earlier buffers
    alive at the same time, and the lists hold at most 3n positions."""
    rng = random.Random(seed)
    for _ in range(300):
        prob = random_problem(rng, rng.randrange(1, 50), rng.choice([5, 30]), rng.choice([16, 64]))
        order = [b.name for b in prob.buffers]
        rng.shuffle(order)
        below = _below_lists(prob.buffers, order)
        assert sum(map(len, below)) <= 3 * len(order)
        want = place_in_order(prob, order, pairwise_below(prob.buffers, order))
        got = place_in_order(prob, order, below)
        assert got.offsets == want.offsets and got.arena_bytes == want.arena_bytes
        verify_plan(prob, got)


# ------------------------------------------------------------------------------------------------
# growth from n to 4n buffers alive at once: near 4, never the 16 of a quadratic algorithm
# ------------------------------------------------------------------------------------------------
def test_verify_scales_with_buffers_alive_at_once():
    def case(n):
        prob = wide_problem(n)
        plan = planners.plan_ge_block_reuse(prob)
        return lambda: verify_plan(prob, plan)

    assert growth(case, 10_000) < 8


def test_planning_scales_with_buffers_alive_at_once():
    def case(n):
        prob = wide_problem(n)
        return lambda: planners.plan_auto(prob)

    assert growth(case, 2_500, repeat=2) < 8


def test_random_orders_scale_and_pack_the_wide_graph():
    """A random placement order scatters the branches over the arena (the worst case of the tree's
    lists): still no quadratic growth, and within 5% of the lower bound."""
    def case(n):
        prob = wide_problem(n)
        rng = random.Random(n)
        order = sorted(prob.buffers, key=lambda b: rng.random())

        def run():
            plan = planners.best_fit(prob, order, "random")
            assert plan.arena_bytes <= 1.05 * 64 * (n + 1)
        return run

    assert growth(case, 2_500, repeat=2) < 8


def test_symbolic_plans_scale_with_buffers_alive_at_once():
    def case(n):
        k = S.mul("n", 16)
        prob = wide_problem(n)
        prob = MemoryProblem([Buffer(b.name, k, b.start, b.end) for b in prob.buffers], 64)
        ref = {"n": 4}
        order = order_of(planners.plan_greedy_by_size(prob.bind(ref)), prob.bind(ref))

        def run():
            sp = SymbolicPlan([order, order[::-1]], "x", [ref, {"n": 1}])
            verify_symbolic_plan(prob, sp)
            assert sp.at({"n": 3}).arena_bytes == 64 * (n + 1)
        return run

    assert growth(case, 5_000, repeat=2) < 8


# ------------------------------------------------------------------------------------------------
# end to end: a wide graph's .om
# ------------------------------------------------------------------------------------------------
def _bench_module():
    """bench/wide_load.py, loaded by path: its wide graph is the one these tests and the bench share."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "wide_load.py")
    spec = importlib.util.spec_from_file_location("ge_bench_wide_load", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: y = Relu(x) read by n branches Mul(y, c_i), summed one by one: n buffers alive at once
wide_graph = _bench_module().wide_graph


def test_a_wide_graph_om_saves_and_loads_with_its_plan_checked_in_linear_time(tmp_path, monkeypatch):
    """10k parallel branches: the plan packs them (arena = the lower bound), the .om loads, and its
    plan check is a small part of the load (it was most of it, growing as n^2: 20 s of a 2 MB
    file's load)."""
    import ge_core.om as om

    n = 10_000
    model = ge.compile(wide_graph(n), {"opt_level": 0})  # no fusion: every branch its buffer
    mem = model.report["memory"]
    assert mem["arena_bytes"] == mem["lower_bound_bytes"]
    path = str(tmp_path / "wide.om")
    model.save(path)
    spent = []
    real = om.verify_plan

    def timed(*a, **k):
        t = time.perf_counter()
        real(*a, **k)
        spent.append(time.perf_counter() - t)

    monkeypatch.setattr(om, "verify_plan", timed)
    t = time.perf_counter()
    loaded = ge.load_om(path)
    total = time.perf_counter() - t
    assert len(spent) == 1 and spent[0] < 0.25 * total, (spent, total)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    want = np.maximum(x, 0) * sum(i + 1.5 for i in range(n))
    np.testing.assert_allclose(next(iter(loaded.run({"x": x}).values())), want, rtol=1e-4)


def test_the_generated_executor_of_a_wide_graph_compiles_in_linear_time():
    """The sink executor's run function reads the planned views as globals of its context, not as
    closure cells: CPython's compile is quadratic in a function's cells (16k planned buffers took 9 s
    to compile, 4k 1 s; a 100k-buffer .om's first load 300 s)."""
    def source(n):
        return ge.compile(wide_graph(n), {"opt_level": 0}).executable.source

    def code_objects(code):
        for c in code.co_consts:
            if hasattr(c, "co_freevars"):
                yield c
                yield from code_objects(c)

    small, big = source(1000), source(4000)
    nested = list(code_objects(compile(small, "<sink>", "exec")))
    assert nested and all(c.co_freevars == () and c.co_cellvars == () for c in nested)
    ratio = best_time(lambda: compile(big, "<sink>", "exec")) / best_time(lambda: compile(small, "<sink>", "exec"))
    assert ratio < 8, f"4x the buffers took {ratio:.1f}x the time to compile (quadratic: 16x)"
