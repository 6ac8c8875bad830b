"""Every hook a plugin can implement, in one place.

Registration hooks receive a ``register`` callback and call it once per thing they provide;
their return value is ignored. Each call is attributed to the calling plugin, so two plugins
registering the same name is an error naming both. A plugin that raises inside a registration
hook is reported and none of what it registered in that hook is kept (unless
``GE_STRICT_PLUGINS=1``, which makes it fatal).

Observer hooks are called for their side effects; an exception in one is reported and the
compile goes on. An implementation may accept fewer arguments than the spec names.

Every parameter is typed (as pytest's hookspecs are): a registration hook's ``register`` is
one of the callback protocols below (``RegisterOp``, ``RegisterPass``, ...), whose signature
says what it takes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from .ir.graph import Graph

if TYPE_CHECKING:
    from .backend import Backend
    from .frontend import Frontend
    from .kernel import KernelSpec
    from .memory import MemoryPlan, MemoryProblem, SymbolicPlan
    from .model import CompiledModel
    from .om_container import OmKind
    from .ops import OpDef
    from .options import CompileOptions
    from .passes import Pass, PassInstrument
    from .schedule import StreamAssignment

hookspec = pluggy.HookspecMarker("ge")
hookimpl = pluggy.HookimplMarker("ge")


# --------------------------------------------------------------------------------------------
# The register callbacks the registration hooks receive
# --------------------------------------------------------------------------------------------
class RegisterOp(Protocol):
    def __call__(self, opdef: OpDef, /) -> None: ...


class RegisterKernel(Protocol):
    def __call__(self, op_type: str, factory: Callable[[KernelSpec], Callable[..., Any]], domain: str = "",
                 backend: str = "cpu") -> None: ...


class RegisterFrontend(Protocol):
    def __call__(self, frontend: Frontend | type[Frontend], /) -> None: ...


class RegisterOpMapper(Protocol):
    def __call__(self, framework: str, op_type: str, mapper: Callable[..., Any], /) -> None: ...


class RegisterPass(Protocol):
    def __call__(self, pass_: Pass | type[Pass], /) -> None: ...


class RegisterPassInstrument(Protocol):
    def __call__(self, instrument: PassInstrument | type[PassInstrument], /) -> None: ...


class RegisterFusionPattern(Protocol):
    def __call__(self, name: str, pattern: Any, /) -> None: ...


class RegisterStreamAllocator(Protocol):
    def __call__(self, name: str, allocator: Callable[[Graph, CompileOptions], StreamAssignment], /) -> None: ...


class RegisterMemoryPlanner(Protocol):
    # a planner returns a concrete plan, or a symbolic one (ge_memory's plan_symbolic)
    def __call__(self, name: str, planner: Callable[[MemoryProblem, CompileOptions], MemoryPlan | SymbolicPlan],
                 /) -> None: ...


class RegisterBackend(Protocol):
    def __call__(self, backend: Backend | type[Backend], /) -> None: ...


class RegisterOption(Protocol):
    def __call__(self, name: str, default: Any = None, help: str = "",
                 read: Callable[[Any], Mapping[str, Any]] | None = None) -> None: ...


class RegisterOmKind(Protocol):
    def __call__(self, partition: str, kind: OmKind, /) -> None: ...


class RegisterCliCommand(Protocol):
    def __call__(self, name: str, help: str, configure: Callable[[argparse.ArgumentParser], None],
                 run: Callable[[argparse.Namespace], int], /) -> None: ...


# --------------------------------------------------------------------------------------------
# Registration hooks
# --------------------------------------------------------------------------------------------
@hookspec
def ge_register_ops(register: RegisterOp) -> None:
    """Register op definitions.

    Call ``register(opdef)`` with a :class:`ge_core.ops.OpDef` (op type, domain, arity, type
    and shape inference, op kind for fusion) for every op the plugin defines. Called once when
    the registries are built. Returns nothing.
    """


@hookspec
def ge_register_kernels(register: RegisterKernel) -> None:
    """Register kernel factories for a backend.

    Call ``register(op_type, factory, domain="", backend="cpu")`` where ``factory`` takes a
    :class:`ge_core.kernel.KernelSpec` and returns the callable that runs the node. Called once
    when the registries are built. Returns nothing.
    """


@hookspec
def ge_register_frontends(register: RegisterFrontend) -> None:
    """Register model frontends.

    Call ``register(frontend)`` with a :class:`ge_core.frontend.Frontend` that names the
    framework ids it answers to (ATC's numbers and names), the file suffixes it reads and a
    sniffer. Returns nothing.
    """


@hookspec
def ge_register_op_mappers(register: RegisterOpMapper) -> None:
    """Register framework op mappers (as GE's REGISTER_CUSTOM_OP).

    Call ``register(framework, op_type, mapper)``; ``framework`` is a frontend name such as
    ``"tensorflow"``; the mapper turns one framework op into IR nodes, with a signature the
    frontend documents. Returns nothing.
    """


@hookspec
def ge_register_passes(register: RegisterPass) -> None:
    """Register graph passes.

    Call ``register(pass_)`` with a :class:`ge_core.passes.Pass` instance (or class) that has a
    unique name and a stage. Registered passes form the default pipeline, each stage ordered
    by the passes' ``after``/``before`` declarations. A pass's ``run(graph, ctx)`` gets a
    :class:`ge_core.passes.PassContext` and returns a :class:`ge_core.passes.PassResult` (or a
    bool: whether it changed the graph). Returns nothing.
    """


@hookspec
def ge_register_pass_instruments(register: RegisterPassInstrument) -> None:
    """Register pass instruments: code run around every pass of every compile.

    Call ``register(instrument)`` with a :class:`ge_core.passes.PassInstrument` (a class, to
    get a fresh instance per compile, or an instance to share) that has a unique ``name``. Its
    ``before_pass(pass_, graph, ctx)`` and ``after_pass(pass_, graph, ctx, result)`` see every
    run of every pass (``result`` a :class:`ge_core.passes.PassResult`); a GEError it raises
    fails the pass. Returns nothing.
    """


@hookspec
def ge_register_fusion_patterns(register: RegisterFusionPattern) -> None:
    """Register named fusion patterns.

    Call ``register(name, pattern)``; the fusion plugin applies them and the fusion switch file
    turns them off by name. Returns nothing.
    """


@hookspec
def ge_register_stream_allocators(register: RegisterStreamAllocator) -> None:
    """Register stream allocators.

    Call ``register(name, allocator)`` where ``allocator(graph, options)`` returns a
    :class:`ge_core.schedule.StreamAssignment`. Chosen with the ``stream_allocator`` option.
    Returns nothing.
    """


@hookspec
def ge_register_memory_planners(register: RegisterMemoryPlanner) -> None:
    """Register memory planners.

    Call ``register(name, planner)`` where ``planner(problem, options)`` returns a
    :class:`ge_core.memory.MemoryPlan`. Chosen with the ``memory_planner`` option. The planner
    named :data:`ge_core.memory.SYMBOLIC_PLANNER` plans a problem with symbolic sizes and returns
    a :class:`ge_core.memory.SymbolicPlan`. Returns nothing.
    """


@hookspec
def ge_register_backends(register: RegisterBackend) -> None:
    """Register execution backends.

    Call ``register(backend)`` with a :class:`ge_core.backend.Backend`; ``soc_version`` chooses
    one by name or alias. Returns nothing. The contract: ``backend.build(model, kernels, context)``
    gets a :class:`ge_core.backend.BuildContext` (``context.options``, ``context.registries``), not
    the options themselves as before, and returns an :class:`~ge_core.backend.Executable`.
    """


@hookspec
def ge_register_options(register: RegisterOption) -> None:
    """Register plugin-specific compile options.

    Call ``register(name, default, help)``; such an option may then appear in option dicts,
    config files and ``--option name=value`` on the command line. ``read=fn`` (also for a
    built-in option a plugin reads, such as ``fusion_switch_file``): ``fn(value)`` validates
    the value when a compile starts (``ge_core.compile``, with its host's readers) and returns the options it derives (``{option: value}``), raising
    OptionError for a bad value. Returns nothing.
    """


@hookspec
def ge_register_om_kinds(register: RegisterOmKind) -> None:
    """Register kinds of .om file that the core does not interpret itself.

    Call ``register(partition, kind)``: an .om whose container holds the partition
    ``partition`` (a kind name other than ``model`` and ``weights``) is read by ``kind``, a
    :class:`ge_core.om_container.OmKind` (``load``, ``inspect``, ``definition``), after the core checked
    the container. ``ge_atc`` registers its gear models (partition ``gears``) this way. Returns
    nothing.
    """


@hookspec
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    """Add sub-commands to the ``ge`` command line.

    Call ``register(name, help, configure, run)``: ``configure(parser)`` adds arguments to an
    ``argparse`` sub-parser, ``run(args)`` executes and returns an exit status. Returns nothing.
    """


# --------------------------------------------------------------------------------------------
# Observer hooks
# --------------------------------------------------------------------------------------------
@hookspec
def ge_graph_loaded(graph: Graph, source: Any, framework: str) -> None:
    """Called after a frontend produced ``graph`` from ``source`` (path or object).

    ``framework`` is the frontend's name. Return value ignored; may inspect or annotate the
    graph (``graph.metadata``) but should not rewrite it: use a pass for that.
    """


@hookspec
def ge_before_pass(pass_name: str, stage: str, graph: Graph) -> None:
    """Called before each pass runs, with the pass's name, its stage and the graph it will
    receive. Return value ignored (a pass instrument, ``ge_register_pass_instruments``, also
    gets the pass object and its context)."""


@hookspec
def ge_after_pass(pass_name: str, stage: str, graph: Graph, changed: bool, seconds: float) -> None:
    """Called after each pass that did not fail, with whether it changed the graph and its time
    in seconds. Return value ignored."""


@hookspec
def ge_model_built(model: CompiledModel) -> None:
    """Called once a :class:`ge_core.model.CompiledModel` is built, before it is returned.
    Return value ignored; may add keys to ``model.report``."""
