"""Passes, pipelines and the pass manager.

A :class:`Pass` has a unique name, a stage, a default on/off, an optimisation level and
optional ordering constraints: ``after``/``before`` name other passes, and these declarations
are the one source of a pass's place in its stage (:func:`order_passes` resolves them, through
passes that are not in the pipeline too). ``run(graph, ctx)`` gets a typed
:class:`PassContext` and returns a :class:`PassResult`, or a bare bool that the pass manager
converts in one place (:meth:`PassResult.of`).

The pass manager runs stages in order and repeats a stage to a fixed point where asked. What
happens around each pass is done by *instruments* (:class:`PassInstrument`, as TVM's
PassInstrument and MLIR's pass instrumentation): progress, transactions (snapshot and roll
back), the ``ge_before_pass``/``ge_after_pass`` observer hooks, IR dumps, verification and
timing are each one, and a plugin adds its own with ``ge_register_pass_instruments``. A failing
pass is named with its plugin and the passes before it.
"""

from __future__ import annotations

import dataclasses
import heapq
import inspect
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

from .errors import GEError, OptionError, PassError, PluginError, ShapeInferenceError, reraise_interrupt
from .ir.graph import Graph
from .ir.verify import verify_graph
from .options import CompileOptions
from .registry import Registry, close_matches
from .writes import InputFiles, make_folder, write_bytes_atomic

if TYPE_CHECKING:
    from .ops import OpRegistry
    from .plugins import PluginHost, Registries

log = logging.getLogger("ge.passes")

#: Stages whose passes rewrite the graph, in order. Stream allocation, memory planning and the
#: build follow them (chosen plugins, not passes).
STAGES = ("prepare", "optimize", "fuse", "schedule")


@dataclass
class PassResult:
    """What one run of a pass did.

    ``changed``: whether the graph changed. ``rerun``: when it changed, the passes of its stage
    that should run again. ``None`` (the default) asks for every pass of a fixed-point stage and
    for none in another; a tuple names passes (``()``: none, the pass reached its own fixed
    point). A pass asked for runs later in the same round when it comes after the asking pass,
    else in the next round (so a pass runs again only when the graph changed since its last run);
    a name the pipeline leaves out is skipped. ``stats``: counts for the compile report's record of the run
    (``report["passes"][i]["stats"]``, zero counts left out). The pass manager fills
    ``seconds`` (the timing instrument) and, for a pass that failed and was rolled back,
    ``error``. A result is true when the graph changed, as the bool it replaces.
    """

    changed: bool = False
    stats: dict[str, Any] = field(default_factory=dict)
    rerun: tuple[str, ...] | None = None
    seconds: float = 0.0
    error: str | None = None

    def __bool__(self) -> bool:
        return self.changed

    @classmethod
    def of(cls, value: object) -> PassResult:
        """The one conversion of what ``Pass.run`` returned: a :class:`PassResult` as it is; a
        bool (or None, or an int, as older passes return) as ``changed``. Anything else raises
        TypeError."""
        if isinstance(value, PassResult):
            return value
        if value is None or isinstance(value, (bool, int)):
            return cls(bool(value))
        raise TypeError(f"returned {type(value).__name__}, not bool or PassResult")


class Pass:
    """Base class of a graph pass. Subclass and set the class attributes, implement ``run``.

    ``after``/``before`` place the pass in its stage: it runs after every pass named in
    ``after`` and before every pass named in ``before`` that the pipeline runs, and a chain of
    such declarations holds through passes the pipeline leaves out. Passes no declaration
    orders run by name.
    """

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

    def run(self, graph: Graph, ctx: PassContext) -> PassResult | bool:  # pragma: no cover - interface
        """Rewrite ``graph`` in place; return a :class:`PassResult` (or whether it changed)."""
        raise NotImplementedError


PassFunction = Callable[["Graph", "PassContext"], "PassResult | bool"]


class FunctionPass(Pass):
    """A pass made from a function ``fn(graph, ctx) -> PassResult | bool`` (see :func:`graph_pass`)."""

    def __init__(self, fn: PassFunction, **attrs: Any) -> None:
        self._fn = fn
        attrs.setdefault("description", (fn.__doc__ or "").strip().split("\n")[0])
        for k, v in attrs.items():
            setattr(self, k, v)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult | bool:
        return self._fn(graph, ctx)


def graph_pass(name: str, stage: str = "optimize", **attrs: Any) -> Callable[[PassFunction], FunctionPass]:
    """Decorator: turn ``fn(graph, ctx) -> PassResult | bool`` into a registered-ready pass."""

    def wrap(fn: PassFunction) -> FunctionPass:
        return FunctionPass(fn, name=name, stage=stage, **attrs)

    return wrap


@dataclass
class PassContext:
    """What a pass receives besides the graph.

    ``options``: the compile's :class:`~ge_core.options.CompileOptions` (every field is there:
    read ``ctx.options.constant_folding``, plugin options in ``ctx.options.extra``);
    ``registries``: what the plugins registered (``ctx.ops`` is the op registry), None in a
    bare test; ``params``: this pass's parameters (its defaults with the config's
    ``[passes.NAME]`` over them); ``stats``: a dict shared by the passes of one compile;
    ``host``: the plugin host; ``pass_name``, ``plugin``, ``stage`` and ``iteration`` (the
    round of a fixed-point stage, from 0): which run of which pass this is.
    """

    options: CompileOptions
    registries: Registries | None = None
    params: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    host: PluginHost | None = None
    pass_name: str = ""
    plugin: str | None = None
    stage: str = ""
    iteration: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.options, CompileOptions):  # a dict or config path: checked once, here
            self.options = CompileOptions.from_any(self.options)

    @property
    def ops(self) -> OpRegistry | None:
        """The op registry (None without registries)."""
        return self.registries.ops if self.registries is not None else None

    def switch_enabled(self, name: str) -> bool:
        """Whether the switches of option ``fusion_switches`` (name -> on/off, ``"ALL"`` the
        default; ge_fusion fills them from ``fusion_switch_file``) leave pattern or pass ``name`` on."""
        switches = self.options.getoption("fusion_switches") or {}
        return bool(switches.get(name, switches.get("ALL", True)))

    @property
    def who(self) -> str:
        """``pass 'NAME' of plugin 'PLUGIN'``, as messages name the pass."""
        return f"pass '{self.pass_name}'" + (f" of plugin '{self.plugin}'" if self.plugin else "")


@dataclass
class StagePlan:
    name: str
    passes: list[Pass]
    fixed_point: bool = False
    max_iterations: int = 10


@dataclass
class PassRecord:
    """One run of a pass, as the compile report's ``passes`` list shows it."""

    name: str
    stage: str
    seconds: float
    changed: bool
    nodes_after: int
    iteration: int = 0
    error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)

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
        stats = {k: v for k, v in self.stats.items() if v}  # what the pass counted, zeros left out
        if stats:
            d["stats"] = stats
        return d


def resolve_pipeline(registry: Registry[Pass], options: CompileOptions) -> list[StagePlan]:
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
                p = registry.require(name, OptionError)
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
            ordered = order_passes(chosen, among=[p for p in registry.values() if p.stage == stage])
        ordered = _insert_relative(ordered, spec, stage, registry, check)
        fixed = spec.get("fixed_point", any(p.fixed_point for p in ordered))
        plans.append(StagePlan(stage, ordered, bool(fixed), int(spec.get("max_iterations", 10))))
    return plans


def _insert_relative(ordered: list[Pass], spec: dict[str, Any], stage: str, registry: Registry[Pass],
                     check: Callable[[str, str], None]) -> list[Pass]:
    """Apply a stage's ``insert_after`` / ``insert_before`` tables: ``{pass: anchor}`` puts the
    pass (moved if already there, added even if off by default) just after / before ``anchor``."""
    out = list(ordered)
    for key, after in (("insert_after", True), ("insert_before", False)):
        for name, anchor in (spec.get(key) or {}).items():
            where = f"[pipeline.{stage}].{key}"
            check(name, where)
            check(anchor, where)
            p = registry.require(name, OptionError)
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


def order_passes(passes: Sequence[Pass], among: Iterable[Pass] = ()) -> list[Pass]:
    """Topological order of ``passes`` by their after/before constraints, ties by name.

    ``among`` (the stage's registered passes) lets a chain of constraints hold through passes
    that are not in the list: ``c`` after ``b`` after ``a`` keeps ``c`` after ``a`` when ``b`` is
    disabled or above the optimisation level. Contradicting constraints raise OptionError.
    """
    chosen = {p.name: p for p in passes}
    known = {p.name: p for p in among}
    known.update(chosen)
    succ: dict[str, set[str]] = {n: set() for n in known}
    for p in known.values():
        for a in p.after:
            if a in known:
                succ[a].add(p.name)
        for b in p.before:
            if b in known:
                succ[p.name].add(b)
    preds: dict[str, set[str]] = {n: set() for n in chosen}
    for m in chosen:  # m precedes every chosen pass reachable from it
        stack, seen = list(succ[m]), set()
        while stack:
            x = stack.pop()
            if x not in seen:
                seen.add(x)
                if x in chosen:
                    preds[x].add(m)
                stack.extend(succ[x])
    ready = [n for n, s in preds.items() if not s]
    heapq.heapify(ready)
    out: list[Pass] = []
    while ready:
        n = heapq.heappop(ready)
        out.append(chosen[n])
        for m, s in preds.items():
            if n in s:
                s.discard(n)
                if not s:
                    heapq.heappush(ready, m)
    if len(out) != len(chosen):
        cyc = sorted(n for n, s in preds.items() if s)
        raise OptionError(f"pass ordering constraints form a cycle among: {', '.join(cyc)}")
    return out


class PassInstrument:
    """Code run around every pass, as TVM's PassInstrument (``ge_register_pass_instruments``).

    For each run of a pass the manager calls :meth:`before_pass` of each instrument in order,
    runs the pass, then :meth:`after_pass` in reverse order, so an instrument wraps those
    listed after it: the built-in ones are, outermost first, progress, transactions, observer
    hooks, IR dumps, the plugins' instruments, verification and timing (so an instrument sees
    a verified graph and ``result.seconds``). ``ctx`` is the pass's :class:`PassContext`
    (``ctx.pass_name``, ``ctx.stage``, ``ctx.iteration``, ``ctx.params``).

    Raising a :class:`GEError` in ``before_pass``/``after_pass`` fails the pass as if it had
    raised (``verdict`` says how the message puts it). A pass that failed and was rolled back
    reaches the ``after_pass`` of the instruments that had not finished with it with
    ``result.error`` set and the graph from before it. A plugin's instrument that raises
    anything else is reported (a warning naming it) and the compile goes on. Register a class
    to get a fresh instance for every compile, an instance to share one.
    """

    name: ClassVar[str] = ""
    #: How a failure this instrument raises is told: "pass 'x' (stage s) <verdict>: <error>".
    verdict: ClassVar[str] = ""

    def before_pipeline(self, graph: Graph, ctx: PassContext) -> None:
        """Called once before the first pass, with the graph the pipeline gets."""

    def before_pass(self, pass_: Pass, graph: Graph, ctx: PassContext) -> None:
        """Called before each run of a pass, with the graph it will get."""

    def after_pass(self, pass_: Pass, graph: Graph, ctx: PassContext, result: PassResult) -> None:
        """Called after each run of a pass, with the graph it left and its result."""

    def after_pipeline(self, graph: Graph, ctx: PassContext) -> None:
        """Called once after the last pass, with the resulting graph."""


class Progress(PassInstrument):
    """Tells ``progress(message)`` each pass as it starts."""

    name = "progress"

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress

    def before_pass(self, pass_: Pass, graph: Graph, ctx: PassContext) -> None:
        self.progress(f"{ctx.stage}: {pass_.name}" + (f" (round {ctx.iteration + 1})" if ctx.iteration else ""))


class Transactions(PassInstrument):
    """Guarded passes run in a transaction: the graph is copied before the pass, and if the pass
    fails (raises, returns garbage, leaves an invalid graph) the copy is kept and the failure
    recorded (``failures``, a warning), unless ``strict``. ``guard(pass)`` says which passes
    are guarded; a required pass never is."""

    name = "transactions"

    def __init__(self, guard: Callable[[Pass], bool], strict: bool) -> None:
        self.guard = guard
        self.strict = strict
        self.failures: list[dict[str, str]] = []
        self._snapshot: Graph | None = None

    def guards(self, p: Pass) -> bool:
        """Whether ``p`` runs in a transaction (and so is verified after it)."""
        return not getattr(p, "required", False) and self.guard(p)

    def recovers(self, p: Pass) -> bool:
        """Whether a failure of ``p`` is rolled back instead of stopping the compile."""
        return not self.strict and self.guards(p)

    def before_pass(self, pass_: Pass, graph: Graph, ctx: PassContext) -> None:
        self._snapshot = graph.copy() if self.recovers(pass_) else None

    def after_pass(self, pass_: Pass, graph: Graph, ctx: PassContext, result: PassResult) -> None:
        self._snapshot = None

    def rollback(self, p: Pass, ctx: PassContext, error: PassError) -> Graph | None:
        """The graph from before ``p`` when its failure is to be rolled back, else None."""
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            return None
        log.warning("%s; the pass is skipped and the graph from before it kept", error)
        self.failures.append({"pass": p.name, "stage": ctx.stage, "error": str(error)})
        return snapshot


class ObserverHooks(PassInstrument):
    """Calls the ``ge_before_pass`` / ``ge_after_pass`` observer hooks of every plugin (not
    after a pass that failed)."""

    name = "observer_hooks"

    def __init__(self, host: PluginHost) -> None:
        self.host = host

    def before_pass(self, pass_: Pass, graph: Graph, ctx: PassContext) -> None:
        self.host.notify("ge_before_pass", pass_name=pass_.name, stage=ctx.stage, graph=graph)

    def after_pass(self, pass_: Pass, graph: Graph, ctx: PassContext, result: PassResult) -> None:
        if result.error is None:
            self.host.notify("ge_after_pass", pass_name=pass_.name, stage=ctx.stage, graph=graph,
                             changed=result.changed, seconds=result.seconds)


class DumpIR(PassInstrument):
    """Writes the graph as text to ``dump_dir``: the input, then after each pass that changed it
    (``NNN_STAGE.PASS.txt``)."""

    name = "dump_ir"

    def __init__(self, dump_dir: str) -> None:
        self.dump_dir = dump_dir
        self.index = 0
        self.inputs: Any = None

    def before_pipeline(self, graph: Graph, ctx: PassContext) -> None:
        self.inputs = InputFiles(graph.metadata.get("source"))  # never written over (by inode)
        make_folder(self.dump_dir, "the IR dump folder (dump_ir)", inputs=self.inputs, flag="dump_ir")
        self.dump(graph, "input")

    def after_pass(self, pass_: Pass, graph: Graph, ctx: PassContext, result: PassResult) -> None:
        if result.changed:
            self.dump(graph, f"{ctx.stage}.{pass_.name}")

    def dump(self, graph: Graph, label: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)
        path = os.path.join(self.dump_dir, f"{self.index:03d}_{safe}.txt")
        self.index += 1
        write_bytes_atomic(path, str(graph) + "\n", "the IR dump", inputs=self.inputs, flag="dump_ir")


class Verify(PassInstrument):
    """Verifies the graph after each pass ``when(pass)`` says (``verify_each_pass``, guarded
    passes): the IR's own checks and, with registries, the op registry's."""

    name = "verify"
    verdict = "left an invalid graph"

    def __init__(self, when: Callable[[Pass], bool]) -> None:
        self.when = when

    def after_pass(self, pass_: Pass, graph: Graph, ctx: PassContext, result: PassResult) -> None:
        if result.error is None and self.when(pass_):
            graph.verify()
            if ctx.registries is not None:
                verify_graph(graph, op_registry=ctx.registries.ops)


class Timing(PassInstrument):
    """Sets ``result.seconds``: the pass's own time."""

    name = "timing"

    def before_pass(self, pass_: Pass, graph: Graph, ctx: PassContext) -> None:
        self._t0 = time.perf_counter()

    def after_pass(self, pass_: Pass, graph: Graph, ctx: PassContext, result: PassResult) -> None:
        result.seconds = time.perf_counter() - self._t0


class PassManager:
    """Runs a resolved pipeline over a graph and records what each pass did (``records``).

    Guarded passes are transactional (:class:`Transactions`): ``guard(pass)`` says which (by
    default none here; the compiler guards those not shipped with ge itself); a guarded pass
    that fails is rolled back and reported (``failures``) unless ``strict``, and unguarded
    passes always stop the compile on failure with a :class:`PassError`. Required passes
    (``Pass.required``) are never skipped. A :class:`ShapeInferenceError` raised before any pass
    changed the graph is the input's fault, not the pass's: it stops the compile as a
    ShapeInferenceError naming the pass that found it, not as a PassError.

    ``instruments`` run around every pass after the built-in ones (see :class:`PassInstrument`),
    with those the plugins registered (``ctx.registries.pass_instruments``).
    """

    def __init__(self, stages: list[StagePlan], *, verify_each: bool = False, dump_dir: str | None = None,
                 host: PluginHost | None = None, strict: bool = True, guard: Callable[[Pass], bool] | None = None,
                 progress: Callable[[str], None] | None = None, instruments: Sequence[PassInstrument] = ()) -> None:
        self.stages = stages
        self.host = host
        self.strict = strict
        self.records: list[PassRecord] = []
        self.transactions = Transactions(guard or (lambda p: False), strict)
        outer: list[PassInstrument] = [Progress(progress)] if progress is not None else []
        outer.append(self.transactions)
        if host is not None:
            outer.append(ObserverHooks(host))
        if dump_dir:
            outer.append(DumpIR(dump_dir))
        self._outer = outer
        self._inner = [Verify(lambda p: verify_each or self.transactions.guards(p)), Timing()]
        self._builtin = {id(i) for i in (*self._outer, *self._inner)}
        self._extra = list(instruments)
        self._plugin_of: dict[int, str | None] = {}

    @property
    def failures(self) -> list[dict[str, str]]:
        """The guarded passes that failed and were rolled back: ``{"pass", "stage", "error"}``."""
        return self.transactions.failures

    def instruments(self, ctx: PassContext) -> list[PassInstrument]:
        """Every instrument of a run, outermost first: the built-in ones with the given and the
        registered ones (a registered class is instantiated for the run) inside them."""
        extra = list(self._extra)
        if ctx.registries is not None:
            reg = ctx.registries.pass_instruments
            for name, ins in reg.items():
                obj = cast(PassInstrument, ins() if inspect.isclass(ins) else ins)
                self._plugin_of[id(obj)] = reg.origin(name)
                extra.append(obj)
        return [*self._outer, *extra, *self._inner]

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        """Run every stage; returns the resulting graph (a rolled-back pass swaps in its snapshot)."""
        if ctx.host is None and self.host is not None:
            ctx = dataclasses.replace(ctx, host=self.host)
        instruments = self.instruments(ctx)
        for ins in instruments:
            self._call(ins, "before_pipeline", graph, ctx)
        for stage in self.stages:
            graph = self._run_stage(stage, graph, ctx, instruments)
        for ins in reversed(instruments):
            self._call(ins, "after_pipeline", graph, ctx)
        return graph

    def _run_stage(self, stage: StagePlan, graph: Graph, ctx: PassContext, instruments: list[PassInstrument]) -> Graph:
        """The first round runs every pass of the stage, a later one the passes asked for in the
        round before (:attr:`PassResult.rerun`), in stage order; at most ``max_iterations`` rounds."""
        index = {p.name: i for i, p in enumerate(stage.passes)}
        every = set(range(len(stage.passes)))
        now = set(every)
        for it in range(stage.max_iterations):
            later: set[int] = set()
            for i, p in enumerate(stage.passes):
                if i not in now:
                    continue
                graph, result = self._run_one(p, stage.name, graph, ctx, it, instruments)
                if not result.changed:
                    continue
                if result.rerun is None:
                    asked = every if stage.fixed_point else set()
                else:
                    asked = {index[n] for n in result.rerun if n in index}
                now |= {j for j in asked if j > i}
                later |= {j for j in asked if j <= i}
            if not later:
                break
            now = later
        return graph

    def _run_one(self, p: Pass, stage: str, graph: Graph, ctx: PassContext, iteration: int,
                 instruments: list[PassInstrument]) -> tuple[Graph, PassResult]:
        pctx = self._context(p, stage, ctx, iteration)
        entered: list[PassInstrument] = []
        result: PassResult | None = None
        try:
            for ins in instruments:
                self._call(ins, "before_pass", p, graph, pctx)
                entered.append(ins)
            result = self._run_pass(p, graph, pctx)
            while entered:
                self._call(entered.pop(), "after_pass", p, graph, pctx, result)
        except PassError as e:
            restored = self.transactions.rollback(p, pctx, e)
            if restored is None:
                raise
            graph = restored
            result = result or PassResult()
            result.changed, result.error = False, str(e)
            while entered:
                self._call(entered.pop(), "after_pass", p, graph, pctx, result)
        self.records.append(PassRecord(p.name, stage, result.seconds, result.changed, len(graph), iteration,
                                       result.error, dict(result.stats)))
        return graph, result

    def _context(self, p: Pass, stage: str, ctx: PassContext, iteration: int) -> PassContext:
        """The pass's own context: its parameters (checked against those it has) and which run it is."""
        params = dict(getattr(p, "params", {}) or {})
        user = ctx.options.pass_params.get(p.name, {})
        for k in user:
            if k not in params:
                raise OptionError(f"pass '{p.name}' has no parameter '{k}'{close_matches(k, params)}",
                                  hint=f"its parameters: {', '.join(sorted(params)) or 'none'}")
        params.update(user)
        origin = ctx.registries.passes.origin(p.name) if ctx.registries is not None else None
        return dataclasses.replace(ctx, params=params, pass_name=p.name, plugin=origin, stage=stage,
                                   iteration=iteration)

    def _run_pass(self, p: Pass, graph: Graph, ctx: PassContext) -> PassResult:
        """Run ``p`` and convert what it returned; every failure becomes a PassError naming it."""
        who, stage = ctx.who, ctx.stage
        try:
            value = p.run(graph, ctx)
        except ShapeInferenceError as e:
            if not self._input_untouched() or self.transactions.recovers(p):
                raise PassError(f"{who} (stage {stage}) failed: {e}{self._history()}") from e
            # No pass has changed the graph yet: the inconsistency is the input's, not a pass's.
            src = graph.metadata.get("source")
            raise ShapeInferenceError(
                f"{e.detail} (in {f'{src!r}' if src else 'the graph'} as given: {who} found it before any "
                "pass changed the graph)",
                hint="fix the model at that node (or the input_shape / out_nodes options, if they changed "
                     "its inputs)",
            ) from e
        except OptionError:  # the user's option (input_shape, out_nodes...): reported as it is
            raise
        except GEError as e:
            raise PassError(f"{who} (stage {stage}) failed: {e}{self._history()}") from e
        except BaseException as e:  # noqa: BLE001 - SystemExit in a pass must not end the host
            reraise_interrupt(e)
            raise PassError(
                f"{who} (stage {stage}) raised {type(e).__name__}: {e}{self._history()}",
                hint="this is a bug in the pass; disable it with disabled_passes to go on",
            ) from e
        try:
            result = PassResult.of(value)
        except TypeError as e:
            raise PassError(f"{who} (stage {stage}) {e}{self._history()}",
                            hint="a pass returns a PassResult or whether it changed the graph") from None
        if result.rerun is not None:
            rerun = result.rerun
            known = ctx.registries.passes if ctx.registries is not None else None
            if not isinstance(rerun, (tuple, list)) or not all(isinstance(n, str) for n in rerun):
                raise PassError(f"{who} (stage {stage}) asks to re-run {rerun!r}, not a tuple of pass names")
            unknown = [n for n in rerun if known is not None and n not in known]
            if unknown:
                raise PassError(f"{who} (stage {stage}) asks to re-run unknown pass '{unknown[0]}'"
                                f"{close_matches(unknown[0], list(known or ()))}",
                                hint="PassResult.rerun names registered passes")
            result.rerun = tuple(rerun)
        return result

    def _call(self, ins: PassInstrument, method: str, *args: Any) -> None:
        """One instrument call. A GEError fails the pass it is about; anything else a plugin's
        instrument raises is reported and the compile goes on (fatal when ``strict``)."""
        builtin = id(ins) in self._builtin
        fn = getattr(ins, method, None)
        if fn is None:  # an instrument written without the base class may leave hooks out
            return
        try:
            fn(*args)
        except PassError:
            raise
        except GEError as e:
            if not method.endswith("_pass"):
                raise
            ctx = args[2]
            verdict = ins.verdict or f"was refused by pass instrument '{ins.name or type(ins).__name__}'"
            raise PassError(f"{ctx.who} (stage {ctx.stage}) {verdict}: {e}{self._history()}") from e
        except BaseException as e:  # noqa: BLE001 - a plugin's instrument must not end the compile
            reraise_interrupt(e)
            if builtin:
                raise
            plugin = self._plugin_of.get(id(ins))
            msg = (f"pass instrument '{ins.name or type(ins).__name__}'" + (f" of plugin '{plugin}'" if plugin else "")
                   + f" raised {type(e).__name__} in {method}: {e}")
            if self.strict:
                raise PluginError(msg, hint="fix or remove the instrument's plugin") from e
            log.warning("%s; the compile goes on", msg)

    def _input_untouched(self) -> bool:
        """True while no pass has changed the graph: it is still the one the compile was given."""
        return not any(r.changed for r in self.records)

    def _history(self) -> str:
        if not self.records:
            return " (it was the first pass)"
        names = [r.name for r in self.records[-8:]]
        more = "..., " if len(self.records) > 8 else ""
        return f" (passes before it: {more}{', '.join(names)})"
