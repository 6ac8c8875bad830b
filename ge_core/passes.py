"""Passes, pipelines and the pass manager.

A :class:`Pass` has a unique name, a stage, a default on/off, an optimisation level and
optional ordering constraints (``after``/``before`` other pass names). ``run`` returns whether
it changed the graph. The pass manager runs stages in order, each stage's passes in an order
that honours the constraints, repeats a stage to a fixed point where asked, times every pass,
can verify and dump the IR after each one, and names the failing pass and those before it.
"""

from __future__ import annotations

import heapq
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import GEError, OptionError, PassError, ShapeInferenceError, reraise_interrupt
from .ir.graph import Graph
from .registry import close_matches

log = logging.getLogger("ge.passes")

#: Stages whose passes rewrite the graph, in order. Stream allocation, memory planning and the
#: build follow them (chosen plugins, not passes).
STAGES = ("prepare", "optimize", "fuse", "schedule")


class Pass:
    """Base class of a graph pass. Subclass and set the class attributes, implement ``run``."""

    name: ClassVar[str] = ""
    stage: ClassVar[str] = "optimize"
    default_enabled: ClassVar[bool] = True
    #: Lowest optimisation level (0..3) at which the pass runs by default.
    opt_level: ClassVar[int] = 1
    #: Names of passes this one must run after / before (when both are in the stage).
    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()
    #: Parameters with their defaults; overridden by config ``[passes.NAME]``.
    params: ClassVar[dict[str, Any]] = {}
    #: Repeat the stage until no pass of it changes the graph, when this pass is in it.
    fixed_point: ClassVar[bool] = False
    #: A required pass is never skipped: its failure always stops the compile.
    required: ClassVar[bool] = False
    description: ClassVar[str] = ""

    def run(self, graph: Graph, ctx: PassContext) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


class FunctionPass(Pass):
    """A pass made from a function ``fn(graph, ctx) -> bool`` (see :func:`graph_pass`)."""

    def __init__(self, fn: Callable[[Graph, PassContext], bool], **attrs: Any) -> None:
        self._fn = fn
        attrs.setdefault("description", (fn.__doc__ or "").strip().split("\n")[0])
        for k, v in attrs.items():
            setattr(self, k, v)

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        return bool(self._fn(graph, ctx))


def graph_pass(name: str, stage: str = "optimize", **attrs: Any) -> Callable[[Callable], FunctionPass]:
    """Decorator: turn ``fn(graph, ctx) -> bool`` into a registered-ready pass."""

    def wrap(fn: Callable) -> FunctionPass:
        return FunctionPass(fn, name=name, stage=stage, **attrs)

    return wrap


@dataclass
class PassContext:
    """What a pass receives besides the graph."""

    options: Any
    registries: Any
    params: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ops(self):
        return self.registries.ops


@dataclass
class StagePlan:
    name: str
    passes: list[Pass]
    fixed_point: bool = False
    max_iterations: int = 10


@dataclass
class PassRecord:
    name: str
    stage: str
    seconds: float
    changed: bool
    nodes_after: int
    iteration: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "stage": self.stage,
            "seconds": round(self.seconds, 6),
            "changed": self.changed,
            "nodes_after": self.nodes_after,
        }
        if self.error:
            d["error"] = self.error
        return d


def resolve_pipeline(registry, options) -> list[StagePlan]:
    """The ordered stages and passes for ``options`` from the registered passes.

    Default: every registered pass whose ``default_enabled`` is true and ``opt_level`` is at
    most ``options.opt_level``, ordered by constraints. A config's ``[pipeline.STAGE].passes``
    replaces a stage's list (in that order); ``disable`` lists and ``disabled_passes`` remove;
    ``insert_after`` / ``insert_before`` (``{pass: anchor}``) place a pass next to a named one.
    Unknown names raise :class:`OptionError` listing close matches.
    """
    all_names = list(registry.keys())

    def check(name: str, where: str) -> None:
        if name not in registry:
            raise OptionError(f"unknown pass '{name}' in {where}{close_matches(name, all_names)}",
                              hint="`ge passes` lists the registered passes")

    for stage in options.pipeline:
        if stage not in STAGES:
            raise OptionError(f"unknown stage '{stage}' in the pipeline{close_matches(stage, STAGES)}",
                              hint=f"stages are {', '.join(STAGES)}")
    for name in options.disabled_passes:
        check(name, "disabled_passes")
    for name in options.pass_params:
        check(name, "[passes] parameters")
    plans = []
    for stage in STAGES:
        spec = options.pipeline.get(stage, {})
        disable = set(spec.get("disable", [])) | set(options.disabled_passes)
        for name in spec.get("disable", []):
            check(name, f"[pipeline.{stage}].disable")
        if "passes" in spec:
            chosen = []
            for name in spec["passes"]:
                check(name, f"[pipeline.{stage}].passes")
                p = registry.get(name)
                if p.stage != stage:
                    raise OptionError(f"pass '{name}' belongs to stage '{p.stage}', not '{stage}'")
                if name not in disable:
                    chosen.append(p)
            ordered = chosen  # an explicit list is run in the order given
        else:
            chosen = [
                p for n, p in registry.items()
                if p.stage == stage and p.default_enabled and p.opt_level <= options.opt_level and n not in disable
            ]
            ordered = order_passes(chosen)
        ordered = _insert_relative(ordered, spec, stage, registry, check)
        fixed = spec.get("fixed_point", any(p.fixed_point for p in ordered))
        plans.append(StagePlan(stage, ordered, bool(fixed), int(spec.get("max_iterations", 10))))
    return plans


def _insert_relative(ordered: list[Pass], spec: dict[str, Any], stage: str, registry,
                     check: Callable[[str, str], None]) -> list[Pass]:
    """Apply a stage's ``insert_after`` / ``insert_before`` tables: ``{pass: anchor}`` puts the
    pass (moved if already there, added even if off by default) just after / before ``anchor``."""
    out = list(ordered)
    for key, after in (("insert_after", True), ("insert_before", False)):
        for name, anchor in (spec.get(key) or {}).items():
            where = f"[pipeline.{stage}].{key}"
            check(name, where)
            check(anchor, where)
            p = registry.get(name)
            if p.stage != stage:
                raise OptionError(f"pass '{name}' belongs to stage '{p.stage}', not '{stage}' ({where})")
            out = [q for q in out if q.name != name]
            names = [q.name for q in out]
            if anchor not in names:
                raise OptionError(f"{where}: anchor pass '{anchor}' is not in stage '{stage}' of this pipeline"
                                  f"{close_matches(anchor, names)}",
                                  hint=f"stage '{stage}' runs: {', '.join(names) or 'nothing'}")
            i = names.index(anchor) + (1 if after else 0)
            out.insert(i, p)
    return out


def order_passes(passes: list[Pass]) -> list[Pass]:
    """Topological order of passes by their after/before constraints, stable by name."""
    by_name = {p.name: p for p in passes}
    preds: dict[str, set[str]] = {n: set() for n in by_name}
    for p in passes:
        for a in p.after:
            if a in by_name:
                preds[p.name].add(a)
        for b in p.before:
            if b in by_name:
                preds[b].add(p.name)
    ready = [n for n, s in preds.items() if not s]
    heapq.heapify(ready)
    out = []
    while ready:
        n = heapq.heappop(ready)
        out.append(by_name[n])
        for m, s in preds.items():
            if n in s:
                s.discard(n)
                if not s and m not in {x.name for x in out} and m not in ready:
                    heapq.heappush(ready, m)
    if len(out) != len(passes):
        cyc = sorted(n for n, s in preds.items() if s)
        raise OptionError(f"pass ordering constraints form a cycle among: {', '.join(cyc)}")
    return out


class PassManager:
    """Runs a resolved pipeline over a graph and records what each pass did.

    Guarded passes are transactional: the graph is snapshotted before each one and verified
    after it; if the pass raises, returns garbage or leaves an invalid graph, the snapshot is
    kept and the pass is reported as failed (a warning), unless ``strict``, which stops the
    compile with a :class:`PassError`. ``guard(pass)`` says which passes are guarded (by
    default those not shipped with ge itself); unguarded passes always stop the compile on
    failure. Required passes (``Pass.required``) are never skipped. A :class:`ShapeInferenceError`
    raised before any pass changed the graph is the input's fault, not the pass's: it stops the
    compile as a ShapeInferenceError naming the pass that found it, not as a PassError.
    """

    def __init__(self, stages: list[StagePlan], *, verify_each: bool = False, dump_dir: str | None = None,
                 host=None, strict: bool = True, guard: Callable[[Pass], bool] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.stages = stages
        self.verify_each = verify_each
        self.dump_dir = dump_dir
        self.host = host
        self.strict = strict
        self.guard = guard or (lambda p: False)
        self.progress = progress
        self.records: list[PassRecord] = []
        self.failures: list[dict[str, str]] = []
        self._dump_index = 0

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        """Run every stage; returns the resulting graph (a rolled-back pass swaps in its snapshot)."""
        if self.dump_dir:
            os.makedirs(self.dump_dir, exist_ok=True)
            self._dump(graph, "input")
        for stage in self.stages:
            if not stage.passes:
                continue
            iterations = stage.max_iterations if stage.fixed_point else 1
            for it in range(iterations):
                changed_any = False
                for p in stage.passes:
                    graph, changed = self._run_one(p, stage.name, graph, ctx, it)
                    changed_any |= changed
                if not changed_any:
                    break
        return graph

    def _run_one(self, p: Pass, stage: str, graph: Graph, ctx: PassContext, iteration: int) -> tuple[Graph, bool]:
        params = dict(getattr(p, "params", {}) or {})
        user = ctx.options.pass_params.get(p.name, {})
        for k in user:
            if k not in params:
                raise OptionError(f"pass '{p.name}' has no parameter '{k}'{close_matches(k, params)}",
                                  hint=f"its parameters: {', '.join(sorted(params)) or 'none'}")
        params.update(user)
        pctx = PassContext(ctx.options, ctx.registries, params, ctx.stats)
        guarded = not getattr(p, "required", False) and self.guard(p)
        origin = ctx.registries.passes.origin(p.name) if ctx.registries is not None else None
        who = f"pass '{p.name}'" + (f" of plugin '{origin}'" if origin else "")
        if self.progress is not None:
            self.progress(f"{stage}: {p.name}" + (f" (round {iteration + 1})" if iteration else ""))
        snapshot = graph.copy() if guarded else None
        if self.host is not None:
            self.host.notify("ge_before_pass", pass_name=p.name, stage=stage, graph=graph)
        t0 = time.perf_counter()
        try:
            try:
                changed = p.run(graph, pctx)
            except ShapeInferenceError as e:
                if not self._input_untouched() or (snapshot is not None and not self.strict):
                    raise PassError(f"{who} (stage {stage}) failed: {e}{self._history()}") from e
                # No pass has changed the graph yet: the inconsistency is the input's, not a pass's.
                src = graph.metadata.get("source")
                raise ShapeInferenceError(
                    f"{e.detail} (in {f'{src!r}' if src else 'the graph'} as given: {who} found it before any "
                    "pass changed the graph)",
                    hint="fix the model at that node (or the input_shape / out_nodes options, if they changed "
                         "its inputs)",
                ) from e
            except GEError as e:
                raise PassError(f"{who} (stage {stage}) failed: {e}{self._history()}") from e
            except BaseException as e:  # noqa: BLE001 - SystemExit in a pass must not end the host
                reraise_interrupt(e)
                raise PassError(
                    f"{who} (stage {stage}) raised {type(e).__name__}: {e}{self._history()}",
                    hint="this is a bug in the pass; disable it with disabled_passes to go on",
                ) from e
            if not isinstance(changed, bool):
                if changed is None or isinstance(changed, int):
                    changed = bool(changed)
                else:
                    raise PassError(f"{who} (stage {stage}) returned {type(changed).__name__}, not bool"
                                    f"{self._history()}", hint="a pass returns whether it changed the graph")
            if self.verify_each or guarded:
                try:
                    graph.verify()
                    if ctx.registries is not None:
                        from .ir.verify import verify_graph

                        verify_graph(graph, op_registry=ctx.registries.ops)
                except GEError as e:
                    raise PassError(f"{who} (stage {stage}) left an invalid graph: {e}{self._history()}") from e
        except PassError as e:
            if snapshot is None or self.strict:
                raise
            log.warning("%s; the pass is skipped and the graph from before it kept", e)
            self.failures.append({"pass": p.name, "stage": stage, "error": str(e)})
            self.records.append(PassRecord(p.name, stage, time.perf_counter() - t0, False, len(snapshot), iteration,
                                           error=str(e)))
            return snapshot, False
        dt = time.perf_counter() - t0
        self.records.append(PassRecord(p.name, stage, dt, changed, len(graph), iteration))
        if self.dump_dir and changed:
            self._dump(graph, f"{stage}.{p.name}")
        if self.host is not None:
            self.host.notify("ge_after_pass", pass_name=p.name, stage=stage, graph=graph, changed=changed, seconds=dt)
        return graph, changed

    def _input_untouched(self) -> bool:
        """True while no pass has changed the graph: it is still the one the compile was given."""
        return not any(r.changed for r in self.records)

    def _history(self, skip_last: int = 0) -> str:
        records = self.records[: len(self.records) - skip_last]
        if not records:
            return " (it was the first pass)"
        names = [r.name for r in records[-8:]]
        more = "..., " if len(records) > 8 else ""
        return f" (passes before it: {more}{', '.join(names)})"

    def _dump(self, graph: Graph, label: str) -> None:
        assert self.dump_dir is not None
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)
        path = os.path.join(self.dump_dir, f"{self._dump_index:03d}_{safe}.txt")
        self._dump_index += 1
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(graph) + "\n")
