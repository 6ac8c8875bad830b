"""Every hook a plugin can implement, in one place.

Registration hooks receive a ``register`` callback and call it once per thing they provide;
their return value is ignored. Each call is attributed to the calling plugin, so two plugins
registering the same name is an error naming both. A plugin that raises inside a registration
hook is reported and none of what it registered in that hook is kept (unless
``GE_STRICT_PLUGINS=1``, which makes it fatal).

Observer hooks are called for their side effects; an exception in one is reported and the
compile goes on. An implementation may accept fewer arguments than the spec names.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("ge")
hookimpl = pluggy.HookimplMarker("ge")


# --------------------------------------------------------------------------------------------
# Registration hooks
# --------------------------------------------------------------------------------------------
@hookspec
def ge_register_ops(register):
    """Register op definitions.

    Call ``register(opdef)`` with a :class:`ge_core.ops.OpDef` (op type, domain, arity, type
    and shape inference, op kind for fusion) for every op the plugin defines. Called once when
    the registries are built. Returns nothing.
    """


@hookspec
def ge_register_kernels(register):
    """Register kernel factories for a backend.

    Call ``register(op_type, factory, domain="", backend="cpu")`` where ``factory`` takes a
    :class:`ge_core.kernel.KernelSpec` and returns the callable that runs the node. Called once
    when the registries are built. Returns nothing.
    """


@hookspec
def ge_register_frontends(register):
    """Register model frontends.

    Call ``register(frontend)`` with a :class:`ge_core.frontend.Frontend` that names the
    framework ids it answers to (ATC's numbers and names), the file suffixes it reads and a
    sniffer. Returns nothing.
    """


@hookspec
def ge_register_op_mappers(register):
    """Register framework op mappers (as GE's REGISTER_CUSTOM_OP).

    Call ``register(framework, op_type, mapper)``; ``framework`` is a frontend name such as
    ``"tensorflow"``; the mapper turns one framework op into IR nodes, with a signature the
    frontend documents. Returns nothing.
    """


@hookspec
def ge_register_passes(register):
    """Register graph passes.

    Call ``register(pass_)`` with a :class:`ge_core.passes.Pass` instance (or class) that has a
    unique name and a stage. Registered passes form the default pipeline. Returns nothing.
    """


@hookspec
def ge_register_fusion_patterns(register):
    """Register named fusion patterns.

    Call ``register(name, pattern)``; the fusion plugin applies them and the fusion switch file
    turns them off by name. Returns nothing.
    """


@hookspec
def ge_register_stream_allocators(register):
    """Register stream allocators.

    Call ``register(name, allocator)`` where ``allocator(graph, options)`` returns a
    :class:`ge_core.schedule.StreamAssignment`. Chosen with the ``stream_allocator`` option.
    Returns nothing.
    """


@hookspec
def ge_register_memory_planners(register):
    """Register memory planners.

    Call ``register(name, planner)`` where ``planner(problem, options)`` returns a
    :class:`ge_core.memory.MemoryPlan`. Chosen with the ``memory_planner`` option. Returns
    nothing.
    """


@hookspec
def ge_register_backends(register):
    """Register execution backends.

    Call ``register(backend)`` with a :class:`ge_core.backend.Backend`; ``soc_version`` chooses
    one by name or alias. Returns nothing.
    """


@hookspec
def ge_register_options(register):
    """Register plugin-specific compile options.

    Call ``register(name, default, help)``; such an option may then appear in option dicts,
    config files and ``--option name=value`` on the command line. ``read=fn`` (also for a
    built-in option a plugin reads, such as ``fusion_switch_file``): ``fn(value)`` validates
    the value when it is set and returns the options it derives (``{option: value}``), raising
    OptionError for a bad value. Returns nothing.
    """


@hookspec
def ge_register_cli_commands(register):
    """Add sub-commands to the ``ge`` command line.

    Call ``register(name, help, configure, run)``: ``configure(parser)`` adds arguments to an
    ``argparse`` sub-parser, ``run(args)`` executes and returns an exit status. Returns nothing.
    """


# --------------------------------------------------------------------------------------------
# Observer hooks
# --------------------------------------------------------------------------------------------
@hookspec
def ge_graph_loaded(graph, source, framework):
    """Called after a frontend produced ``graph`` from ``source`` (path or object).

    ``framework`` is the frontend's name. Return value ignored; may inspect or annotate the
    graph (``graph.metadata``) but should not rewrite it: use a pass for that.
    """


@hookspec
def ge_before_pass(pass_name, stage, graph):
    """Called before each pass runs, with the graph it will receive. Return value ignored."""


@hookspec
def ge_after_pass(pass_name, stage, graph, changed, seconds):
    """Called after each pass with whether it changed the graph and its time. Return ignored."""


@hookspec
def ge_model_built(model):
    """Called once a :class:`ge_core.model.CompiledModel` is built, before it is returned."""
