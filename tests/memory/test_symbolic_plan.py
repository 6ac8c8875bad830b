"""Symbolic memory plans (ge_core.memory.SymbolicPlan): placement orders planned once at reference
bindings, valid at every binding (checked by verify_plan at many), never worse than their planner
at the bindings they were planned at; stored orders are checked at load."""

import random

import numpy as np
import pytest

from ge_core.errors import GEError
from ge_core.ir import symbolic as S
from ge_core.memory import (
    Buffer,
    MemoryPlan,
    MemoryProblem,
    SymbolicPlan,
    lower_bound,
    place_in_order,
    verify_plan,
    verify_symbolic_plan,
)
from ge_memory.planners import plan_auto
from ge_memory.symbolic import order_of, reference_bindings


def _problem(seed: int, n: int = 60) -> MemoryProblem:
    rng = random.Random(seed)
    bufs = []
    for i in range(n):
        start = rng.randrange(0, 3 * n // 2)
        end = start + rng.choice([0, 1, 2, 5, 20])
        kind = rng.random()
        c = rng.choice([4, 64, 256, 3072])
        if kind < 0.15:
            size = c * rng.randrange(1, 50)  # static
        elif kind < 0.6:
            size = S.mul(S.mul("batch", "seq"), c)
        elif kind < 0.8:
            size = S.mul(S.mul(S.mul("batch", "seq"), "seq"), 4)  # attention scores
        else:
            size = S.mul("batch", c)
        bufs.append(Buffer(f"b{i}", size, start, end))
    return MemoryProblem(bufs, 64)


def _symbolic_plan(problem: MemoryProblem, ranges) -> SymbolicPlan:
    refs = reference_bindings(sorted(problem.symbols()), ranges)
    orders, planned = [], []
    for b in refs:
        concrete = problem.bind(b)
        p = plan_auto(concrete)
        verify_plan(concrete, p)
        planned.append(p.arena_bytes)
        o = order_of(p, concrete)
        if o not in orders:
            orders.append(o)
    sp = SymbolicPlan(orders, "auto", refs)
    verify_symbolic_plan(problem, sp)
    sp.stats["planned"] = planned
    return sp


@pytest.mark.parametrize("seed", range(6))
def test_valid_at_every_binding_and_never_worse_at_its_references(seed):
    problem = _problem(seed)
    assert problem.symbolic and problem.symbols() == {"batch", "seq"}
    sp = _symbolic_plan(problem, {"batch": (1, 8), "seq": (1, 512)})
    for b, planned in zip(sp.references, sp.stats["planned"]):
        assert sp.at(b).arena_bytes <= planned
    rng = np.random.default_rng(seed)
    for _ in range(25):
        b = {"batch": int(rng.integers(1, 9)), "seq": int(rng.integers(1, 513))}
        plan = sp.at(b)  # at() verifies: no two live buffers overlap, every buffer inside the arena
        concrete = problem.bind(b)
        verify_plan(concrete, plan)
        assert lower_bound(concrete) <= plan.arena_bytes


def test_reference_bindings_cover_the_ranges():
    refs = reference_bindings(["batch", "seq"], {"batch": (1, 8), "seq": (16, 512)})
    assert {"batch": 8, "seq": 512} in refs and {"batch": 1, "seq": 16} in refs
    assert {"batch": 8, "seq": 16} in refs and {"batch": 1, "seq": 512} in refs
    assert all(1 <= r["batch"] <= 8 and 16 <= r["seq"] <= 512 for r in refs)
    unbounded = reference_bindings(["n"], {})
    assert {"n": 1} in unbounded and max(r["n"] for r in unbounded) >= 64


def test_place_in_order_keeps_live_buffers_apart_whatever_the_sizes():
    problem = _problem(11, 30)
    order = [b.name for b in problem.buffers][::-1]
    for b in ({"batch": 1, "seq": 1}, {"batch": 7, "seq": 300}):
        concrete = problem.bind(b)
        verify_plan(concrete, place_in_order(concrete, order))


def test_orders_that_are_no_permutation_are_refused():
    problem = _problem(3, 20)
    names = [b.name for b in problem.buffers]
    refs = reference_bindings(["batch", "seq"], {})
    for bad in ([names[:-1]], [names + [names[0]]], [names[:-1] + ["intruder"]], [], [names] * 9):
        with pytest.raises(GEError):
            verify_symbolic_plan(problem, SymbolicPlan(bad, "x", refs))
    with pytest.raises(GEError, match="symbols"):
        verify_symbolic_plan(problem, SymbolicPlan([names], "x", [{"batch": 2}]))


def test_a_fixed_plan_for_a_symbolic_problem_is_refused():
    problem = _problem(4, 10)
    with pytest.raises(GEError, match="symbolic"):
        verify_plan(problem, MemoryPlan({b.name: 0 for b in problem.buffers}, 0, "x"))


def test_a_binding_that_makes_a_size_negative_is_refused():
    problem = MemoryProblem([Buffer("a", S.mul(S.sub("seq", 4), 4), 0, 1)], 64)
    with pytest.raises(GEError, match="bytes"):
        problem.bind({"seq": 2})
