"""The compile driver: options -> pipeline -> streams -> memory plan -> backend build -> report."""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from .errors import GEError, OptionError, reraise_interrupt
from .ir.graph import Graph, Value
from .memory import (
    DEFAULT_ALIGNMENT,
    MemoryPlan,
    MemoryProblem,
    build_problem,
    check_alignment,
    expand_plan,
    lower_bound,
    no_reuse_bytes,
    verify_plan,
)
from .model import CompiledModel
from .ops import unknown_ops_error
from .options import CompileOptions
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
    plan = _plan_memory(problem, options, regs)
    weights_bytes = sum(int(a.nbytes) for v in g.all_constants() if (a := v.const_value) is not None)
    report: dict[str, Any] = {
        "nodes_before": nodes_before,
        "nodes_after": len(g),
        "kernels": 0,
        "op_counts": dict(sorted(collections.Counter(n.qualified_op for n in order).items())),
        "passes": [r.as_dict() for r in records],
        "memory": {
            "arena_bytes": plan.arena_bytes if plan else 0,
            "lower_bound_bytes": lower_bound(problem),
            "no_reuse_bytes": no_reuse_bytes(problem),
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
    if pm.failures:
        report["pass_failures"] = pm.failures
    model = CompiledModel(g, options, streams=streams, memory_plan=plan, report=report, host=host)
    say("build")
    exe = model.executable
    report["kernels"] = int(getattr(exe, "kernel_count", len(order)))
    modes = getattr(exe, "kernel_modes", None)
    if modes:
        report["kernel_modes"] = dict(modes)
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
    """Override input shapes (ATC ``--input_shape``); unknown names raise OptionError."""
    if not shapes:
        return
    by_name = {v.name: v for v in g.inputs}
    for name, dims in shapes.items():
        v = by_name.get(name)
        if v is None:
            raise OptionError(
                f"input_shape names '{name}', which is not an input of the model{close_matches(name, by_name)}",
                hint=f"inputs: {', '.join(by_name)}",
            )
        if v.type.shape is not None and len(v.type.shape) != len(dims):
            raise OptionError(f"input_shape gives '{name}' rank {len(dims)}, the model says {v.type}")
        if v.type.shape is not None:
            for i, (old, new) in enumerate(zip(v.type.shape, dims)):
                if isinstance(old, int) and isinstance(new, int) and old != new:
                    raise OptionError(f"input_shape gives '{name}' dim {i} = {new}, the model fixes it to {old}")
        v.type = v.type.with_shape(dims)
        if v.type.shape is not None:
            # Values derived from this input get re-inferred by the prepare stage.
            _forget_shapes_from(v)


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


def _plan_memory(problem, options: CompileOptions, regs) -> MemoryPlan | None:
    if not _reuse_enabled(options):
        name = "none"
    else:
        name = options.memory_planner or "auto"
    if not len(regs.memory_planners):
        return None
    if name not in regs.memory_planners and options.memory_planner is None:
        name = next(iter(regs.memory_planners))
    planner = regs.memory_planners.require(name, OptionError, " (option memory_planner)")
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
