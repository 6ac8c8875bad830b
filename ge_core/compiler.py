"""The compile driver: options -> pipeline -> streams -> memory plan -> backend build -> report."""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from .errors import GEError, OptionError, reraise_interrupt
from .ir.graph import Graph
from .memory import (
    SYMBOLIC_PLANNER,
    MemoryPlan,
    MemoryProblem,
    SymbolicPlan,
    dim_ranges,
    expand_plan,
    lower_bound,
    memory_problem,
    no_reuse_bytes,
    reuse_enabled,
    verify_plan,
)
from .model import CompiledModel
from .ops import unknown_ops_error
from .options import CompileOptions
from .passes import PassContext, PassManager, resolve_pipeline
from .plugins import PluginHost
from .schedule import StreamAssignment, verify_streams

log = logging.getLogger("ge.compile")


def compile_graph(graph: Graph, options: CompileOptions, host: PluginHost, progress: Callable[[str], None] | None = None,
                  *, owned: bool = False) -> CompiledModel:
    """Compile a copy of ``graph`` (the caller's graph is never modified); ``owned``: compile
    ``graph`` itself, one nobody else holds (:func:`ge_core.api.compile` of a file: the weights a
    pass replaces, e.g. packed, are freed instead of kept alive by the loaded graph).

    ``progress(message)`` is told each stage and pass as it starts (for a progress display).
    """
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    regs = host.registries
    options.check_extra(regs.options)
    _set_log_level(options.log)
    g = graph if owned else graph.copy()  # input_shape / out_nodes: the op set's prepare pass (ge_opset's input_shapes)
    del graph
    nodes_before = len(g)
    unknown = [n for n in g.walk() if regs.ops.lookup(n.domain, n.op_type) is None]
    if unknown:
        raise unknown_ops_error(unknown, regs.ops, source=g.metadata.get("source", ""))

    stages = resolve_pipeline(regs.passes, options)
    strict = options.strict_passes or os.environ.get("GE_STRICT_PLUGINS", "").strip().lower() in ("1", "true", "yes", "on")
    pm = PassManager(stages, verify_each=options.verify_each_pass, dump_dir=options.dump_ir, host=host,
                     strict=strict, guard=_pass_guard(options.pass_transactions, regs, host), progress=say)
    ctx = PassContext(options, regs)
    g = pm.run(g, ctx)
    records = pm.records
    g.verify()

    order = g.node_list()
    say("streams")
    streams = _allocate_streams(g, options, regs)
    say("memory plan")
    problem = memory_problem(g, order, streams, options, regs)
    plan = _plan_memory(problem, options, regs, dim_ranges(g))
    weights_bytes = sum(int(a.nbytes) for v in g.all_constants() if (a := v.const_value) is not None)
    # a symbolic problem's bounds are shown at the largest reference binding
    shown = problem.bind(plan.references[0]) if isinstance(plan, SymbolicPlan) and plan.references else problem
    if shown.symbolic:  # no reference binding: bounds not shown
        shown = MemoryProblem([], problem.alignment)
    report: dict[str, Any] = {
        "nodes_before": nodes_before,
        "nodes_after": len(g),
        "kernels": 0,
        "op_counts": dict(sorted(collections.Counter(n.qualified_op for n in order).items())),
        "passes": [r.as_dict() for r in records],
        "memory": {
            "arena_bytes": plan.arena_bytes if plan else 0,
            "lower_bound_bytes": lower_bound(shown) if not shown.symbolic else None,
            "no_reuse_bytes": no_reuse_bytes(shown) if not shown.symbolic else None,
            "weights_bytes": weights_bytes,
            "planner": plan.planner if plan else None,
            "alignment": problem.alignment,
            "dynamic_buffers": len(problem.dynamic),
            "shared_values": {k: list(problem.alias_kinds.values()).count(k) for k in ("view", "inplace", "concat")},
            "planner_candidates": (plan.stats.get("candidates") if plan else None) or {},
        },
        "streams": {"count": streams.count, "events": len(streams.events)},
        "backend": None,
        "compile_seconds": 0.0,
    }
    if isinstance(plan, SymbolicPlan):
        report["memory"]["symbolic"] = {
            "symbols": {k: list(dim_ranges(g).get(k, (1, None))) for k in sorted(problem.symbols())},
            "planned_buffers": len(problem.buffers), "orders": len(plan.orders),
            "at_references": plan.stats.get("at_references", []),
            "strategy": "one symbolic plan: placement orders fixed at compile time, offsets evaluated per "
                        "distinct shape and verified before use",
        }
    if pm.failures:
        report["pass_failures"] = pm.failures
    model = CompiledModel(g, options, streams=streams, memory_plan=plan, report=report, host=host)
    say("build")
    exe = model.executable
    report["kernels"] = int(getattr(exe, "kernel_count", len(order)))
    modes = getattr(exe, "kernel_modes", None)
    if modes:
        report["kernel_modes"] = dict(modes)
    chosen = getattr(exe, "node_kernels", None)
    if chosen:  # which algorithm and instruction-set variant each such node runs
        report["node_kernels"] = {k: dict(v) for k, v in chosen.items()}
    native = getattr(exe, "native_kernels", None)
    if native:  # compiled kernels (part of compile_seconds): how many were compiled, how many came from the cache
        report["native_kernels"] = dict(native)
    report["backend"] = regs.backend(options.soc_version).name
    report["compile_seconds"] = round(time.perf_counter() - t0, 4)
    host.notify("ge_model_built", model=model)
    return model


def _pass_guard(mode: str, regs, host):
    """Which passes run in a transaction: by default those from outside this distribution."""
    if mode == "all":
        return lambda p: True
    if mode == "none":
        return lambda p: False

    def untrusted(p) -> bool:
        plugin = regs.passes.origin(p.name)
        info = host.info.get(plugin) if plugin else None
        return info is None or info.distribution != _DISTRIBUTION

    return untrusted


_DISTRIBUTION = "ge-python"


def _set_log_level(level: str) -> None:
    lv = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "null": logging.CRITICAL + 1}[level]
    logging.getLogger("ge").setLevel(lv)


def _allocate_streams(g: Graph, options: CompileOptions, regs) -> StreamAssignment:
    n = len(g)
    name = "single" if options.enable_single_stream else options.stream_allocator
    if name is None:
        if not len(regs.stream_allocators):
            return StreamAssignment.single(n)
        name = "default" if "default" in regs.stream_allocators else ("single" if "single" in regs.stream_allocators else next(iter(regs.stream_allocators)))
    if name == "single" and "single" not in regs.stream_allocators:
        return StreamAssignment.single(n)
    alloc = regs.stream_allocators.require(name, OptionError, " (option stream_allocator)")
    try:
        sa = alloc(g, options)
    except GEError:
        raise
    except BaseException as e:  # noqa: BLE001 - plugin code: SystemExit must not end the host
        reraise_interrupt(e)
        raise GEError(f"stream allocator '{name}' (plugin {regs.stream_allocators.origin(name)}) raised {type(e).__name__}: {e}") from e
    if not isinstance(sa, StreamAssignment) or len(sa.streams) != n:
        raise GEError(f"stream allocator '{name}' (plugin {regs.stream_allocators.origin(name)}) returned an invalid assignment",
                      hint="it must return a StreamAssignment with one stream per node")
    try:
        verify_streams(g.node_list(), sa, name)
    except GEError as e:
        raise GEError(f"{e.detail} (plugin {regs.stream_allocators.origin(name)})", hint=e.hint) from None
    return sa


def _plan_memory(problem, options: CompileOptions, regs, ranges: dict | None = None) -> MemoryPlan | SymbolicPlan | None:
    if not reuse_enabled(options):
        name = "none"
    else:
        name = options.memory_planner or "auto"
    if not len(regs.memory_planners):
        return None
    if name not in regs.memory_planners and options.memory_planner is None:
        name = next(iter(regs.memory_planners))
    planner = regs.memory_planners.require(name, OptionError, " (option memory_planner)")
    if problem.symbolic:
        strategy = regs.memory_planners.require(SYMBOLIC_PLANNER, GEError, " (it plans symbolic shapes)")
        return strategy(problem, options, lambda p: _plan_concrete(p, options, regs, name, planner), name, ranges or {})
    return _plan_concrete(problem, options, regs, name, planner)


def _plan_concrete(problem, options, regs, name: str, planner) -> MemoryPlan:
    try:
        plan = planner(problem, options)
    except GEError:
        raise
    except BaseException as e:  # noqa: BLE001 - plugin code: SystemExit must not end the host
        reraise_interrupt(e)
        raise GEError(f"memory planner '{name}' (plugin {regs.memory_planners.origin(name)}) raised {type(e).__name__}: {e}") from e
    if not isinstance(plan, MemoryPlan):
        raise GEError(f"memory planner '{name}' (plugin {regs.memory_planners.origin(name)}) did not return a MemoryPlan")
    plan.planner = plan.planner or name
    expand_plan(problem, plan)
    verify_plan(problem, plan)
    return plan
