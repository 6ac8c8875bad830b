"""Planners on random problems: valid plans, within bounds; auto keeps the smallest; alignment."""

import random

import pytest

from ge_core import GEError
from ge_core.memory import Buffer, MemoryPlan, MemoryProblem, expand_plan, lower_bound, no_reuse_bytes, verify_plan
from ge_core.options import CompileOptions
from ge_core.plugins import get_host

PLANNERS = ["none", "greedy_by_size", "greedy_by_lifetime", "ge_block_reuse", "auto"]


def random_problem(rng, n=80, alignment=64):
    bufs = []
    for i in range(n):
        s = rng.randrange(0, 60)
        bufs.append(Buffer(f"b{i}", rng.choice([rng.randrange(1, 5000), rng.randrange(1, 2_000_000)]), s, s + rng.randrange(0, 12)))
    return MemoryProblem(bufs, alignment)


def planner(name):
    return get_host().registries.memory_planners.get(name)


@pytest.mark.parametrize("name", PLANNERS)
@pytest.mark.parametrize("alignment", [64, 512])
def test_planners_give_valid_plans_within_bounds(name, alignment):
    rng = random.Random(7)
    for _ in range(25):
        prob = random_problem(rng, alignment=alignment)
        plan = planner(name)(prob, None)
        verify_plan(prob, plan)
        assert all(off % alignment == 0 for off in plan.offsets.values())
        assert lower_bound(prob) <= plan.arena_bytes <= no_reuse_bytes(prob)


def test_no_reuse_is_the_sum_and_reusers_reuse():
    prob = MemoryProblem([Buffer("a", 1000, 0, 1), Buffer("b", 1000, 2, 3), Buffer("c", 1000, 4, 5)])
    assert planner("none")(prob, None).arena_bytes == 3 * 1024
    for name in PLANNERS[1:]:
        assert planner(name)(prob, None).arena_bytes == 1024, name


def test_auto_keeps_the_smallest_candidate_and_high_tries_more():
    rng = random.Random(11)
    prob = random_problem(rng, n=120)
    normal = planner("auto")(prob, None)
    cands = normal.stats["candidates"]
    assert normal.arena_bytes == min(cands.values()) and set(cands) >= {"greedy_by_size", "greedy_by_lifetime", "ge_block_reuse"}
    assert normal.planner == f"auto:{normal.stats['chosen']}"

    high = planner("auto")(prob, CompileOptions(memory_optimize_level="high"))
    assert len(high.stats["candidates"]) > len(cands) and high.arena_bytes <= normal.arena_bytes


def test_ge_block_reuse_keeps_size_classes_apart():
    from ge_memory.planners import plan_ge_block_reuse

    # a small tensor freed before a huge one starts: with classes the huge one gets its own block
    prob = MemoryProblem([Buffer("small", 1024, 0, 0), Buffer("huge", 64 << 20, 1, 1), Buffer("small2", 1024, 2, 2)])
    with_classes = plan_ge_block_reuse(prob)
    assert with_classes.offsets["small"] == with_classes.offsets["small2"] != with_classes.offsets["huge"]
    anyc = plan_ge_block_reuse(prob, classes=False)
    assert anyc.arena_bytes == 64 << 20


def test_verify_plan_checks_shared_values():
    prob = MemoryProblem([Buffer("c", 256, 0, 3)], aliases={"x": ("c", 128, 128)})
    plan = expand_plan(prob, MemoryPlan({"c": 0}, 256))
    assert plan.offsets["x"] == 128
    verify_plan(prob, plan)
    plan.offsets["x"] = 64
    with pytest.raises(GEError, match="apart from 'c'"):
        verify_plan(prob, plan)
    bad = MemoryProblem([Buffer("c", 256, 0, 3)], aliases={"x": ("c", 200, 128)})
    with pytest.raises(GEError, match="leaves its buffer"):
        verify_plan(bad, MemoryPlan({"c": 0}, 256))
