"""The compile driver: options -> pipeline -> streams -> memory plan -> backend build -> report."""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from .errors import GEError, GraphError, OptionError, reraise_interrupt
from .ir.graph import Graph, Value
from .memory import (
    DEFAULT_ALIGNMENT,
    MemoryPlan,
    MemoryProblem,
    SymbolicPlan,
    build_problem,
    check_alignment,
    expand_plan,
    lower_bound,
    no_reuse_bytes,
    order_of,
    reference_bindings,
    verify_plan,
    verify_symbolic_plan,
)
from .model import CompiledModel
from .ops import unknown_ops_error
from .options import CompileOptions, DimRange
from .passes import PassContext, PassManager, resolve_pipeline
from .registry import close_matches
from .schedule import StreamAssignment, verify_streams

log = logging.getLogger("ge.compile")


def compile_graph(graph: Graph, options: CompileOptions, host, progress: Callable[[str], None] | None = None) -> CompiledModel:
    """Compile a copy of ``graph`` (the caller's graph is never modified).

    ``progress(message)`` is told each stage and pass as it starts (for a progress display).
    """
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    regs = host.registries
    options.check_extra(regs.options)
    _set_log_level(options.log)
    g = graph.copy()
    apply_input_shapes(g, options.input_shape)
    apply_out_nodes(g, options.out_nodes)
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


def apply_input_shapes(g: Graph, shapes: dict[str, tuple]) -> None:
    """Override input shapes (ATC ``--input_shape``) and name every unknown input dim.

    Unknown names, ranks and static dims that conflict with the model raise OptionError. A range
    (``lo~hi``) or an unknown dim (``-1``) makes the dim a symbol: the model's name for it when it
    has one, else ``<input>_<axis>``; the ranges go to ``graph.metadata`` (:func:`dim_ranges`)."""
    by_name = {v.name: v for v in g.inputs}
    try:  # a compiled graph compiled again keeps its ranges (a malformed table is not ours: dropped)
        ranges: dict[str, list] = {k: list(r) for k, r in dim_ranges(g).items()}
    except GEError:
        ranges = {}
    for name, dims in (shapes or {}).items():
        v = by_name.get(name)
        if v is None:
            raise OptionError(
                f"input_shape names '{name}', which is not an input of the model{close_matches(name, by_name)}",
                hint=f"inputs: {', '.join(by_name)}",
            )
        if v.type.shape is not None and len(v.type.shape) != len(dims):
            raise OptionError(f"input_shape gives '{name}' rank {len(dims)}, the model says {v.type}",
                              hint=f"give {len(v.type.shape)} dims for '{name}'")
        new = []
        for i, d in enumerate(dims):
            old = v.type.shape[i] if v.type.shape is not None else None
            if isinstance(old, int) and d is not None and (isinstance(d, DimRange) or (isinstance(d, int) and d != old)):
                raise OptionError(f"input_shape gives '{name}' dim {i} = {d}, the model fixes it to {old}",
                                  hint=f"give {old} (or leave the dim out of a range)")
            if isinstance(d, DimRange) or d is None:
                sym = old if isinstance(old, str) else None
                if sym is None:
                    sym = _fresh_symbol(g, name, i)
                if isinstance(d, DimRange):
                    if sym in ranges and tuple(ranges[sym]) != (d.lo, d.hi):
                        raise OptionError(f"input_shape gives dim '{sym}' two ranges, {ranges[sym][0]}~"
                                          f"{ranges[sym][1] or -1} and {d}", hint="give a shared dim one range")
                    ranges[sym] = [d.lo, d.hi]
                new.append(sym)
            else:
                new.append(d)
        if tuple(new) != v.type.shape:
            v.type = v.type.with_shape(tuple(new))
            _forget_shapes_from(v)  # values derived from this input get re-inferred by the prepare stage
    for v in g.inputs:  # every other unknown dim of an input is a symbol of its own
        if v.type.shape is not None and None in v.type.shape:
            v.type = v.type.with_shape(tuple(_fresh_symbol(g, v.name, i) if d is None else d
                                             for i, d in enumerate(v.type.shape)))
            _forget_shapes_from(v)
    g.metadata.pop(DIM_RANGES, None)
    if ranges:
        g.metadata[DIM_RANGES] = ranges


#: ``graph.metadata`` key of the input symbols' ranges (``{symbol: [lo, hi or None]}``).
DIM_RANGES = "ge.dim_ranges"


def dim_ranges(g: Graph) -> dict[str, tuple[int, int | None]]:
    """The ranges of the input symbols (:func:`apply_input_shapes`), checked as data from outside:
    GraphError for anything but ``{symbol: [lo >= 0, hi >= lo or None]}`` of the graph's symbols."""
    raw = g.metadata.get(DIM_RANGES)
    if raw is None:
        return {}
    ok = isinstance(raw, dict) and len(raw) <= 1024
    out: dict[str, tuple[int, int | None]] = {}
    for k, r in (raw.items() if ok else ()):
        good = (isinstance(k, str) and isinstance(r, (list, tuple)) and len(r) == 2
                and all(x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in r)
                and isinstance(r[0], int) and r[0] >= 0 and (r[1] is None or r[1] >= r[0]))
        if not good:
            ok = False
            break
        out[k] = (r[0], r[1])
    if not ok:
        raise GraphError(f"graph '{g.name}': metadata '{DIM_RANGES}' is not a table of dim ranges",
                         hint="recompile the model; ranges come from --input_shape (x:1~8,...)")
    return out


def _fresh_symbol(g: Graph, name: str, axis: int) -> str:
    taken = {d for v in g.inputs for d in (v.type.shape or ()) if isinstance(d, str)}
    base = f"{name[:64]}_{axis}"
    sym, k = base, 1
    while sym in taken:
        k += 1
        sym = f"{base}_{k}"
    return sym


def _forget_shapes_from(v: Value) -> None:
    stack = [v]
    seen = set()
    while stack:
        x = stack.pop()
        for node in x.users:
            if node in seen:
                continue
            seen.add(node)
            for o in node.outputs:
                if o.type.shape is not None:
                    o.type = o.type.with_shape(None)
                stack.append(o)


def apply_out_nodes(g: Graph, out_nodes: list[str]) -> None:
    """Select outputs by value name or ATC's ``node_name:index``."""
    if not out_nodes:
        return
    if [v.name for v in g.outputs] == list(out_nodes):
        return
    values = g.value_map()
    nodes = {n.name: n for n in g.nodes}
    chosen = []
    for spec in out_nodes:
        if spec in values:
            chosen.append(values[spec])
            continue
        name, sep, idx = spec.rpartition(":")
        if sep and name in nodes and idx.isdigit() and int(idx) < len(nodes[name].outputs):
            chosen.append(nodes[name].outputs[int(idx)])
            continue
        raise OptionError(
            f"out_nodes names '{spec}', which is no tensor or node:index of the model"
            f"{close_matches(spec, list(values) + [f'{n}:0' for n in nodes])}"
        )
    g.set_outputs(chosen)


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


def _reuse_enabled(options: CompileOptions) -> bool:
    return not (options.disable_reuse_memory or options.memory_optimize_level == "off")


def memory_problem(g: Graph, order, streams: StreamAssignment, options: CompileOptions, regs) -> MemoryProblem:
    """Lifetimes over the schedule; with reuse on, views, in-place outputs and concat inputs share bytes.

    The one way the memory problem of a compiled graph is built: the compiler plans it, and
    :func:`ge_core.om.load_om` rebuilds it from the loaded graph to verify the stored plan."""
    raw = options.extra.get("memory_alignment", DEFAULT_ALIGNMENT)
    try:
        alignment = check_alignment(raw)
    except GEError as e:
        raise OptionError(f"option memory_alignment: {e}", hint="64 is the default; GE uses 512") from None

    def alias(node):
        d = regs.ops.lookup(node.domain, node.op_type)
        return d.aliasing if d is not None else ""

    return build_problem(g, order, alignment, streams=streams, alias=alias, share=_reuse_enabled(options))


def _plan_memory(problem, options: CompileOptions, regs, ranges: dict | None = None) -> MemoryPlan | SymbolicPlan | None:
    if not _reuse_enabled(options):
        name = "none"
    else:
        name = options.memory_planner or "auto"
    if not len(regs.memory_planners):
        return None
    if name not in regs.memory_planners and options.memory_planner is None:
        name = next(iter(regs.memory_planners))
    planner = regs.memory_planners.require(name, OptionError, " (option memory_planner)")
    if problem.symbolic:
        return _plan_symbolic(problem, options, regs, name, planner, ranges or {})
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


def _plan_symbolic(problem: MemoryProblem, options, regs, name: str, planner, ranges: dict) -> SymbolicPlan:
    """The planner run at reference values of the symbols; its plans become placement orders
    (:class:`ge_core.memory.SymbolicPlan`), valid at every value. A reference at which the model
    has no valid shapes (a size below 0: an audio model's convolutions need a longer input) is
    skipped, larger ones are tried; with none, the schedule order serves (valid too)."""
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
        plan = _plan_concrete(concrete, options, regs, name, planner)
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
