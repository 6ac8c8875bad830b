"""The symbolic planning strategy: one memory plan for every value of the input symbols.

A problem whose sizes are expressions of the input symbols (dynamic batch, sequence length) is
planned by a concrete planner at a few *reference bindings* of the symbols; each plan becomes a
placement order (:class:`ge_core.memory.SymbolicPlan`), valid at every binding. Registered as the
memory planner :data:`ge_core.memory.SYMBOLIC_PLANNER`, which the compiler asks for a symbolic
problem (with the concrete planner the ``memory_planner`` option chose).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ge_core.errors import GEError, OptionError
from ge_core.memory import MAX_ORDERS, SYMBOLIC_PLANNER, MemoryPlan, MemoryProblem, SymbolicPlan, verify_symbolic_plan

#: The largest value a reference binding gives an unbounded symbol.
UNBOUNDED_REFERENCE = 256


def order_of(plan: MemoryPlan, problem: MemoryProblem) -> list[str]:
    """The placement order a concrete plan implies: its buffers by offset (then by start)."""
    return [b.name for b in sorted(problem.buffers, key=lambda b: (plan.offsets[b.name], b.start, b.name))]


def reference_bindings(symbols: Sequence[str], ranges: dict[str, tuple[int, int | None]]) -> list[dict[str, int]]:
    """Bindings a symbolic problem is planned at: every symbol at its least, largest and middle
    value, and for several symbols each one large with the others small (at most
    :data:`ge_core.memory.MAX_ORDERS`). An unbounded symbol's largest is :data:`UNBOUNDED_REFERENCE`."""
    lo: dict[str, int] = {}
    hi: dict[str, int] = {}
    for s in symbols:
        a, b = ranges.get(s, (1, None))
        lo[s] = max(1, a)
        hi[s] = max(lo[s], b if b is not None else max(UNBOUNDED_REFERENCE, lo[s]))
    mid = {s: max(lo[s], round(math.sqrt(lo[s] * hi[s]))) for s in symbols}
    out = [dict(hi), dict(mid), dict(lo)]
    if len(symbols) > 1:
        for s in symbols:
            out.append({t: hi[t] if t == s else lo[t] for t in symbols})
            out.append({t: lo[t] if t == s else hi[t] for t in symbols})
    seen: list[dict[str, int]] = []
    for ref in out:
        if ref not in seen:
            seen.append(ref)
    return seen[:MAX_ORDERS]


def plan_symbolic(problem: MemoryProblem, options: Any = None, plan_at: Callable[[MemoryProblem], MemoryPlan] | None = None,
                  name: str = "", ranges: dict[str, tuple[int, int | None]] | None = None) -> SymbolicPlan:
    """The concrete planner ``plan_at`` (``name``; it returns a verified plan) run at reference
    values of the symbols (``ranges``: the input symbols' ranges); its plans become placement
    orders, valid at every value. A reference at which the model has no valid shapes (a size
    below 0: an audio model's convolutions need a longer input) is skipped, larger ones are
    tried; with none, the schedule order serves (valid too)."""
    if plan_at is None:
        raise OptionError(f"memory planner '{SYMBOLIC_PLANNER}' is the strategy for symbolic shapes, not a planner to choose",
                          hint="choose auto, greedy_by_size, greedy_by_lifetime, ge_block_reuse or none (option memory_planner)")
    ranges = ranges or {}
    symbols = sorted(problem.symbols())
    refs: list[dict[str, int]] = []
    for scale in (1, 16, 256):
        widened = {s: (max(ranges.get(s, (1, None))[0], scale), ranges.get(s, (1, None))[1]) for s in symbols}
        if any(hi is not None and lo > hi for lo, hi in widened.values()):
            break
        refs = [b for b in reference_bindings(symbols, widened) if _valid_binding(problem, b)]
        if refs:
            break
    orders: list[list[str]] = []
    planned: list[int] = []
    for b in refs:
        concrete = problem.bind(b)
        plan = plan_at(concrete)
        planned.append(plan.arena_bytes)
        order = order_of(plan, concrete)
        if order not in orders:
            orders.append(order)
    if not orders:
        orders = [[b.name for b in sorted(problem.buffers, key=lambda b: (b.start, b.name))]]
    sp = SymbolicPlan(orders, name, refs)
    verify_symbolic_plan(problem, sp)
    at = [sp.at(b).arena_bytes for b in refs]
    sp.stats = {"arena_at_largest": at[0] if at else 0,
                "at_references": [{"binding": b, "arena_bytes": a, "planner_bytes": p}
                                  for b, a, p in zip(refs, at, planned)]}
    return sp


def _valid_binding(problem: MemoryProblem, binding: dict[str, int]) -> bool:
    try:
        problem.bind(binding)
    except GEError:
        return False
    return True
