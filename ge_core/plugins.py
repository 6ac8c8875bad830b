"""The plugin manager: entry-point discovery, error isolation and the registries built from hooks.

Plugins are found through the entry-point group ``ge.plugins`` (built-ins included). Each is
loaded and each registration hook is called separately, so one broken plugin is reported and
the others keep working. Environment:

* ``GE_DISABLE_PLUGINS=a,b`` does not load the named plugins (``*`` disables all entry points);
* ``GE_STRICT_PLUGINS=1`` turns any plugin failure into a :class:`PluginError`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .errors import DuplicateRegistrationError, GEError, OptionError, PluginError, reraise_interrupt
from .om_container import CORE_PARTITIONS, OmKind
from .ops import OpDef, OpRegistry
from .options import CompileOptions
from .registry import Registry

log = logging.getLogger("ge.plugins")

ENTRY_POINT_GROUP = "ge.plugins"


@dataclass
class PluginInfo:
    """What is known of one plugin: where it came from and what went wrong."""

    name: str
    distribution: str | None = None
    version: str | None = None
    source: str = "entry point"  # or "in-process"
    hooks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    disabled: bool = False
    loaded: bool = False

    def as_dict(self) -> dict[str, Any]:
        keys = ("name", "distribution", "version", "source", "hooks", "loaded", "disabled", "errors")
        return {**{k: getattr(self, k) for k in keys}, "hooks": sorted(self.hooks), "errors": list(self.errors)}


def _strict() -> bool:
    return os.environ.get("GE_STRICT_PLUGINS", "").strip().lower() in ("1", "true", "yes", "on")


def _failure_text(e: BaseException) -> str:
    return traceback.format_exception_only(type(e), e)[-1].strip() or type(e).__name__


def _disabled() -> set[str]:
    raw = os.environ.get("GE_DISABLE_PLUGINS", "")
    return {p.strip() for p in raw.replace(";", ",").split(",") if p.strip()}


@dataclass
class CliCommand:
    name: str
    help: str
    configure: Callable
    run: Callable


#: Each registry (an attribute of :class:`Registries`) and what its errors call an entry.
_LABELS = {"ops": "op", "kernels": "kernel", "frontends": "frontend", "op_mappers": "op mapper", "passes": "pass",
           "pass_instruments": "pass instrument", "fusion_patterns": "fusion pattern",
           "stream_allocators": "stream allocator", "memory_planners": "memory planner", "backends": "backend",
           "options": "option", "option_readers": "option reader", "om_kinds": "om kind", "cli_commands": "command"}
#: Each registry and the registration hook that fills it (the option readers: ``ge_register_options``).
_KIND_HOOK = {k: "ge_register_" + ("options" if k == "option_readers" else k) for k in _LABELS}
#: Each registration hook and the registries it fills, in the order hooks are called.
HOOK_KINDS = {h: tuple(k for k in _LABELS if _KIND_HOOK[k] == h) for h in _KIND_HOOK.values()}


def _empty(hook: str) -> dict[str, Any]:
    """Fresh, empty registries of the kinds ``hook`` fills, by attribute name."""
    return {k: OpRegistry() if k == "ops" else {} if k == "kernels" else Registry(_LABELS[k]) for k in HOOK_KINDS[hook]}


class Registries:
    """Everything plugins registered, each entry attributed to its plugin.

    A host's registries are filled one hook at a time, on first use of one of its kinds
    (``fill(registries, hook)``): loading and running an .om calls the op, kernel, backend,
    option and om-kind hooks, never the pass, fusion or frontend ones (nor imports their
    modules). :meth:`complete` fills every kind (``ge plugins``, strict mode).
    """

    ops: OpRegistry
    kernels: dict[str, Registry]  # backend -> (domain, op_type) -> factory
    frontends: Registry
    op_mappers: Registry
    passes: Registry
    #: Name -> a PassInstrument class (one instance per compile) or instance.
    pass_instruments: Registry
    fusion_patterns: Registry
    stream_allocators: Registry
    memory_planners: Registry
    backends: Registry
    options: Registry
    #: Option name -> ``read(value) -> {option: value}`` (``register(name, read=...)``).
    option_readers: Registry
    cli_commands: Registry
    #: Partition name -> the :class:`ge_core.om_container.OmKind` that reads an .om holding it.
    om_kinds: Registry

    def __init__(self, fill: Callable[[Registries, str], None] | None = None) -> None:
        self._fill = fill
        if fill is None:  # a stand-alone, empty set of registries
            for hook in HOOK_KINDS:
                self.__dict__.update(_empty(hook))

    def __getattr__(self, name: str) -> Any:
        hook = _KIND_HOOK.get(name)
        fill = self.__dict__.get("_fill")
        if hook is None or fill is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        fill(self, hook)
        return self.__dict__[name]

    def filled(self, hook: str) -> bool:
        """Whether the registries of ``hook`` are filled."""
        return all(kind in self.__dict__ for kind in HOOK_KINDS[hook])

    def complete(self) -> Registries:
        """Fill every kind (every registration hook called once); returns ``self``."""
        for kinds in HOOK_KINDS.values():
            getattr(self, kinds[0])
        return self

    def kernels_for(self, backend: str) -> Registry:
        return self.kernels.setdefault(backend, Registry(f"{backend} kernel"))

    def backend(self, name: str):
        """The backend registered as ``name`` or under an alias (case-insensitive)."""
        b = self.backends.get(name)
        if b is not None:
            return b
        low = name.lower()
        for bname, be in self.backends.items():
            if bname.lower() == low or low in (a.lower() for a in getattr(be, "aliases", ())):
                return be
        return self.backends.require(name, OptionError, " (option soc_version)")


class PluginHost:
    """Owns the pluggy manager, the plugin table and the lazily built registries."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager("ge")
        self.pm.add_hookspecs(hookspecs)
        self.info: dict[str, PluginInfo] = {}
        self._registries: Registries | None = None
        self._lock = threading.RLock()
        if load_entry_points:
            self._load_entry_points()

    # -- loading ---------------------------------------------------------------------------
    def _fail(self, info: PluginInfo, message: str, exc: BaseException | None = None) -> None:
        info.errors.append(message)
        log.warning("plugin '%s': %s", info.name, message)
        if _strict():
            raise PluginError(f"plugin '{info.name}' (distribution {info.distribution or '?'}): {message}",
                              hint="fix or uninstall the plugin, or unset GE_STRICT_PLUGINS to skip it") from exc

    def _load_entry_points(self) -> None:
        import importlib.metadata as md  # (here: `import ge_core` alone does not pay for it)

        disabled = _disabled()
        try:
            eps = md.entry_points(group=ENTRY_POINT_GROUP)
        except Exception as e:  # broken metadata of some installed distribution
            log.warning("cannot read entry points: %s", e)
            return
        # (name, version) of each distribution: its metadata parsed once, not twice per entry point (~25 ms)
        dist_of = functools.cache(lambda d: (getattr(d, "name", None), getattr(d, "version", None)))
        for ep in sorted(eps, key=lambda e: e.name):
            info = PluginInfo(ep.name, *dist_of(getattr(ep, "dist", None)))
            if ep.name in self.info:
                other = self.info[ep.name]
                self._fail(info, f"name already used by distribution {other.distribution}; second one ignored")
                continue
            self.info[ep.name] = info
            if ep.name in disabled or "*" in disabled:
                info.disabled = True
                continue
            try:
                obj = ep.load()
            except BaseException as e:  # noqa: BLE001 - SystemExit at import must not end the host
                reraise_interrupt(e)
                self._fail(info, f"failed to import '{ep.value}': {_failure_text(e)}", e)
                continue
            self._register_obj(obj, info)

    def _register_obj(self, obj: Any, info: PluginInfo) -> None:
        if inspect.isclass(obj):
            try:
                obj = obj()
            except BaseException as e:  # noqa: BLE001
                reraise_interrupt(e)
                self._fail(info, f"cannot instantiate plugin class: {_failure_text(e)}", e)
                return
        try:
            self.pm.register(obj, name=info.name)
        except (pluggy.PluginValidationError, ValueError) as e:
            self._fail(info, f"invalid plugin: {e}", e)
            return
        except BaseException as e:  # noqa: BLE001 - an attribute of the plugin raised while pluggy looked
            reraise_interrupt(e)
            self._fail(info, f"invalid plugin: {_failure_text(e)}", e)
            return
        info.loaded = True
        info.hooks = sorted(h.name for h in self.pm.get_hookcallers(obj) or [] if h.name.startswith("ge_"))
        try:
            unknown = [n for n in dir(obj)
                       if n.startswith("ge_") and callable(getattr(obj, n, None)) and not hasattr(self.pm.hook, n)]
        except BaseException as e:  # noqa: BLE001 - a property of the plugin raised
            reraise_interrupt(e)
            unknown = []
        if unknown:
            self._fail(info, f"implements unknown hook(s) {', '.join(unknown)} (typo or newer ge?)")

    def register_plugin(self, obj: Any, name: str | None = None) -> str:
        """Register an in-process plugin (module, class or instance) and rebuild registries."""
        with self._lock:
            name = name or getattr(obj, "__name__", None) or type(obj).__name__
            if name in self.info and self.info[name].loaded:
                raise PluginError(f"a plugin named '{name}' is already registered", hint="choose another name")
            info = PluginInfo(name=name, source="in-process")
            self.info[name] = info
            self._register_obj(obj, info)
            self._registries = None
            return name

    def unregister_plugin(self, name: str) -> None:
        with self._lock:
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                self.pm.unregister(plugin)
            self.info.pop(name, None)
            self._registries = None

    # -- registries --------------------------------------------------------------------------
    @property
    def registries(self) -> Registries:
        """The registries, each kind filled on first use. In strict mode every hook is called at
        once (a failure is fatal here); a plugin registered in-process has its hooks called at
        once too, so that its errors show as soon as the registries are asked for."""
        with self._lock:
            if self._registries is None:
                r = Registries(self._fill)
                inproc = {n for n, i in self.info.items() if i.source == "in-process" and i.loaded}
                for hook in HOOK_KINDS:
                    if _strict() or any(impl.plugin_name in inproc
                                        for impl in getattr(self.pm.hook, hook).get_hookimpls()):
                        self._fill(r, hook)
                self._registries = r
            return self._registries

    def _fill(self, r: Registries, hook_name: str) -> None:
        """Call every plugin's registration hook ``hook_name`` and put what it registers in ``r``
        (once per hook; a failing plugin is reported and the rest are kept)."""
        with self._lock:
            if r.filled(hook_name):
                return
            fresh, adder = _empty(hook_name), self._adders()[hook_name]
            # pluggy returns impls last-registered first; keep a stable, name-sorted order.
            for impl in sorted(getattr(self.pm.hook, hook_name).get_hookimpls(), key=lambda i: i.plugin_name):
                plugin = impl.plugin_name
                info = self.info.setdefault(plugin, PluginInfo(name=plugin, source="in-process"))
                pending: list[tuple] = []

                def register(*args, _adder=adder, _pending=pending, **kw):
                    entry = _adder(*args, **kw)
                    _pending.extend(entry if isinstance(entry, list) else [entry])

                try:
                    impl.function(register=register) if "register" in impl.argnames else impl.function()
                    for kind, key, obj in pending:
                        reg = (fresh["kernels"].setdefault(kind[1], Registry(f"{kind[1]} kernel"))
                               if isinstance(kind, tuple) else fresh[kind])
                        reg.add(key, obj, plugin)
                except DuplicateRegistrationError as e:
                    if _strict():
                        raise
                    # keep what was added before the clash; the duplicate itself is dropped
                    self._fail(info, f"{hook_name}: {e.detail}", e)
                except GEError as e:
                    self._fail(info, f"{hook_name}: {e}", e)
                except BaseException as e:  # noqa: BLE001 - SystemExit in a hook must not end the host
                    reraise_interrupt(e)
                    self._fail(info, f"{hook_name} raised {_failure_text(e)}", e)
            r.__dict__.update(fresh)

    @staticmethod
    def _adders() -> dict[str, Callable]:
        """Per registration hook, what its ``register`` callback checks and makes of its
        arguments: the (kind, key, object) entries to add."""

        def add_op(opdef: OpDef, *more):
            if not isinstance(opdef, OpDef):
                raise PluginError(f"register() of ge_register_ops takes an OpDef, not {type(opdef).__name__}")
            return ("ops", opdef.key, opdef)

        def add_kernel(op_type: str, factory, domain: str = "", backend: str = "cpu"):
            if not callable(factory):
                raise PluginError(f"kernel for '{op_type}' is not callable")
            return (("kernels", backend), (OpRegistry.norm_domain(domain), op_type), factory)

        def named(kind: str, attr_name: str | None = None, check: Callable | None = None):
            def add(*args):
                if attr_name is not None:
                    (obj,) = args
                    if inspect.isclass(obj):
                        obj = obj()
                    key = getattr(obj, attr_name, None)
                    if not key:
                        raise PluginError(f"{kind} object {obj!r} has no {attr_name}")
                    return (kind, key, obj)
                key, obj = args[0], args[1] if len(args) == 2 else args[1:]
                if check:
                    check(key, obj)
                return (kind, key, obj)

            return add

        def add_instrument(instrument):
            name = getattr(instrument, "name", "")
            if not name or not isinstance(name, str):
                raise PluginError(f"pass instrument {instrument!r} has no name")
            missing = [m for m in ("before_pass", "after_pass") if not callable(getattr(instrument, m, None))]
            if missing:
                raise PluginError(f"pass instrument '{name}' has no {' or '.join(missing)}",
                                  hint="subclass ge_core.passes.PassInstrument")
            return ("pass_instruments", name, instrument)

        def add_mapper(framework: str, op_type: str, mapper):
            return ("op_mappers", (framework, op_type), mapper)

        def add_option(name: str, default=None, help: str = "", read: Callable | None = None):
            if read is not None and not callable(read):
                raise PluginError(f"reader of option '{name}' is not callable")
            reader = [("option_readers", name, read)] if read is not None else []
            if read is not None and name in {f.name for f in dataclasses.fields(CompileOptions)}:
                return reader  # a built-in option this plugin reads
            return [("options", name, (default, help)), *reader]

        def add_om_kind(partition: str, kind):
            if not isinstance(partition, str) or not partition or partition in CORE_PARTITIONS:
                raise PluginError(f"om kind partition {partition!r:.40} is not a partition name of its own",
                                  hint=f"name a partition other than {' and '.join(CORE_PARTITIONS)}")
            if not isinstance(kind, OmKind):
                raise PluginError(f"om kind '{partition}' ({type(kind).__name__}) has no load, inspect and "
                                  "definition methods", hint="see ge_core.om.OmKind")
            return ("om_kinds", partition, kind)

        def add_cli_command(name: str, help: str, configure, run):
            return ("cli_commands", name, CliCommand(name, help, configure, run))

        return {"ge_register_ops": add_op, "ge_register_kernels": add_kernel,
                "ge_register_frontends": named("frontends", "name"), "ge_register_op_mappers": add_mapper,
                "ge_register_passes": named("passes", "name"), "ge_register_pass_instruments": add_instrument,
                "ge_register_fusion_patterns": named("fusion_patterns"),
                "ge_register_stream_allocators": named("stream_allocators"),
                "ge_register_memory_planners": named("memory_planners"),
                "ge_register_backends": named("backends", "name"), "ge_register_options": add_option,
                "ge_register_om_kinds": add_om_kind, "ge_register_cli_commands": add_cli_command}

    # -- observers ---------------------------------------------------------------------------
    def notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call an observer hook on every plugin; a failing observer is reported, not fatal."""
        caller = getattr(self.pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            try:
                impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})
            except BaseException as e:  # noqa: BLE001
                reraise_interrupt(e)
                info = self.info.setdefault(impl.plugin_name, PluginInfo(name=impl.plugin_name))
                self._fail(info, f"{hook_name} raised {type(e).__name__}: {e}", e)

    def describe(self) -> list[dict[str, Any]]:
        """Every plugin's row, with the errors of all its hooks (every registry is filled)."""
        self.registries.complete()
        return [self.info[k].as_dict() for k in sorted(self.info)]


_host: PluginHost | None = None
_host_lock = threading.Lock()


def get_host() -> PluginHost:
    """The process-wide plugin host, created on first use."""
    global _host
    with _host_lock:
        if _host is None:
            _host = PluginHost()
        return _host


def reset_host(host: PluginHost | None = None) -> PluginHost | None:
    """Replace the process-wide host (tests); returns the previous one."""
    global _host
    with _host_lock:
        old, _host = _host, host
        return old


def registries() -> Registries:
    return get_host().registries
