"""Write a plugin with decorators instead of hook functions.

```python
from ge_sdk import PassInstrument, Plugin, same_as_input
plugin = Plugin("my_plugin")          # entry point: my_plugin = "my_package.plugin:plugin"

@plugin.op("Swish", domain="my.domain", infer=same_as_input())
def swish(x, beta=1.0):               # the CPU kernel: inputs and attributes -> output(s)
    return x / (1 + np.exp(-beta * x))

@plugin.graph_pass("drop_identity", stage="optimize", after=("fold_constants",))
def drop_identity(graph, ctx) -> bool: ...   # or a PassResult(changed, stats)

@plugin.pass_instrument
class Watch(PassInstrument): ...      # before_pass / after_pass around every pass
```

A :class:`Plugin` is an object with hook implementations that appear as soon as something is
registered through it, so ``ge plugins`` lists only the hooks it really uses. Register
everything at import time (module level), before the plugin host loads the object.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.backend import Backend
from ge_core.errors import GEError, PluginError
from ge_core.frontend import Frontend
from ge_core.hookspecs import hookimpl
from ge_core.kernel import KernelSpec
from ge_core.ops import InferFn, OpDef, OpKind
from ge_core.passes import FunctionPass, Pass, PassInstrument

from .bases import MemoryPlanner, OpMapper, StreamAllocator
from .rewrite import Op, OpRule, Rewriter, Rule, RuleLike, RuleSet

OBSERVER_HOOKS = ("ge_graph_loaded", "ge_before_pass", "ge_after_pass", "ge_model_built")


# ------------------------------------------------------------------------------------------------
# inference helpers
# ------------------------------------------------------------------------------------------------
def same_as_input(index: int = 0) -> InferFn:
    """Inference: every output has the type of input ``index``."""

    def infer(node, opset):
        return [node.inputs[index].type for _ in node.outputs]

    return infer


def broadcast_inputs() -> InferFn:
    """Inference: one output, the NumPy broadcast of the inputs' shapes, the first input's dtype."""
    from ge_core.ir.types import TensorType

    def infer(node, opset):
        types = [v.type for v in node.inputs if v is not None]
        if not types or any(t.shape is None for t in types):
            return [TensorType(types[0].dtype if types else None, None)]
        rank = max(len(t.shape) for t in types)
        dims: list = []
        for i in range(rank):
            ds = [t.shape[len(t.shape) - rank + i] for t in types if len(t.shape) - rank + i >= 0]
            known = {d for d in ds if isinstance(d, int) and d != 1}
            if len(known) > 1:
                raise GEError(f"{node.describe()}: shapes {[str(t) for t in types]} do not broadcast")
            if known:
                dims.append(known.pop())
            elif all(d == 1 for d in ds):
                dims.append(1)
            else:
                dims.append(next((d for d in ds if d != 1), None))
        return [TensorType(types[0].dtype, tuple(dims))]

    return infer


def simple_kernel(fn: Callable[..., Any], defaults: dict[str, Any] | None = None) -> Callable[[KernelSpec], Any]:
    """A kernel factory from ``fn(*inputs, **attrs) -> array or tuple of arrays``.

    Attributes the function does not accept are not passed; ``defaults`` fill absent ones;
    results are cast to the output dtypes the graph declares.
    """
    sig = inspect.signature(fn)
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    accepted = {n for n, p in sig.parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def factory(spec: KernelSpec):
        attrs = {**(defaults or {}), **spec.attrs}
        kw = attrs if takes_all else {k: v for k, v in attrs.items() if k in accepted}
        dtypes = [t.dtype for t in spec.outputs]

        def kernel(*inputs):
            out = fn(*inputs, **kw)
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            return tuple(
                np.asarray(o) if i >= len(dtypes) or dtypes[i] is None else np.asarray(o, dtype=dtypes[i])
                for i, o in enumerate(outs)
            )

        kernel.__name__ = f"{spec.op_type}_kernel"
        return kernel

    factory.__name__ = f"{getattr(fn, '__name__', 'kernel')}_factory"
    return factory


# ------------------------------------------------------------------------------------------------
# the plugin object
# ------------------------------------------------------------------------------------------------
class Plugin:
    """Collects what a plugin provides and implements the matching hooks."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._items: dict[str, list[tuple]] = {}
        self._observers: dict[str, list[Callable]] = {}

    # -- plumbing -------------------------------------------------------------------------------
    def _add(self, hook: str, *args: Any) -> None:
        first = hook not in self._items
        self._items.setdefault(hook, []).append(args)
        if first:
            items = self._items[hook]

            def impl(register: Callable[..., object]) -> None:
                for a in items:
                    register(*a)

            impl.__name__ = hook
            impl.__doc__ = f"{hook} of plugin {self.name or '?'} (made by ge_sdk.Plugin)"
            setattr(self, hook, hookimpl(impl))

    def __repr__(self) -> str:
        return f"<ge_sdk.Plugin {self.name or '?'}: {', '.join(sorted(self._items)) or 'nothing'}>"

    # -- passes ---------------------------------------------------------------------------------
    def register_pass(self, p: Pass | type[Pass]) -> Any:
        """Register a :class:`Pass` (class or instance); usable as a class decorator."""
        obj = p() if inspect.isclass(p) else p
        if not getattr(obj, "name", ""):
            raise PluginError(f"pass {obj!r} has no name")
        self._add("ge_register_passes", obj)
        return p

    def graph_pass(self, name: str, stage: str = "optimize", **attrs: Any) -> Callable[[Callable], FunctionPass]:
        """Decorator: ``fn(graph, ctx) -> PassResult | bool`` becomes a registered pass; ``attrs``
        are the :class:`Pass` attributes (``after``/``before``, ``opt_level``, ``params``...)."""

        def wrap(fn: Callable) -> FunctionPass:
            p = FunctionPass(fn, name=name, stage=stage, **attrs)
            self._add("ge_register_passes", p)
            return p

        return wrap

    def rewrite_pass(self, name: str, rules: RuleSet | Sequence[RuleLike], *, stage: str = "fuse", **attrs: Any):
        """Register a pass applying ``rules`` (a :class:`~ge_sdk.rewrite.RuleSet` or a list of
        declarative and imperative rules) to the graph and every subgraph in it (see
        :class:`ge_sdk.rewrite.RewritePass`)."""
        from .rewrite import RewritePass

        p = RewritePass(name, rules, stage=stage, **attrs)
        self._add("ge_register_passes", p)
        return p

    def pass_instrument(self, instrument: PassInstrument | type[PassInstrument]) -> Any:
        """Register a :class:`~ge_core.passes.PassInstrument`, run around every pass of every
        compile (a class: a fresh instance per compile; an instance: shared); usable as a class
        decorator."""
        if not getattr(instrument, "name", ""):
            raise PluginError(f"pass instrument {instrument!r} has no name")
        self._add("ge_register_pass_instruments", instrument)
        return instrument

    # -- fusion patterns ------------------------------------------------------------------------
    def fusion_pattern(self, rule: RuleLike) -> RuleLike:
        """Register a :class:`~ge_sdk.rewrite.Rule` or :class:`~ge_sdk.rewrite.OpRule` as a
        named fusion pattern (the fusion plugin applies it; the switch file turns it off by name)."""
        if not isinstance(rule, (Rule, OpRule)):
            raise PluginError(f"fusion_pattern takes a ge_sdk.rewrite.Rule or OpRule, not {type(rule).__name__}")
        self._add("ge_register_fusion_patterns", rule.name, rule)
        return rule

    def rewrite(self, name: str, pattern: Op | Sequence[Op], *, condition: Callable | None = None,
                register: bool = True) -> Callable[[Callable[[Rewriter, Any], Any]], Rule]:
        """Decorator: the function is the replacement of a new :class:`Rule`, which is returned
        (and registered as a fusion pattern unless ``register=False``)."""

        def wrap(fn: Callable) -> Rule:
            rule = Rule(name, pattern, fn, condition=condition)
            if register:
                self.fusion_pattern(rule)
            return rule

        return wrap

    def op_rewrite(self, name: str, op_type: str | Sequence[str] | None, *, domain: str | None = "",
                   register: bool = True) -> Callable[[Callable[[Any, Rewriter], bool]], OpRule]:
        """Decorator: ``fn(node, rw) -> bool`` becomes an imperative :class:`~ge_sdk.rewrite.OpRule`
        tried at nodes of ``op_type``, which is returned (and registered as a fusion pattern
        unless ``register=False``)."""

        def wrap(fn: Callable) -> OpRule:
            rule = OpRule(op_type, fn, name=name, domain=domain)
            if register:
                self.fusion_pattern(rule)
            return rule

        return wrap

    # -- ops and kernels ------------------------------------------------------------------------
    def op(self, op_type: str, domain: str = "", *, kind: OpKind = OpKind.OPAQUE, infer: InferFn | None = None,
           min_inputs: int = 1, max_inputs: int | None = None, num_outputs: int = 1,
           attrs: dict[str, Any] | None = None, backend: str = "cpu", factory: bool = False,
           deterministic: bool = True, doc: str = "") -> Callable[[Callable], Callable]:
        """Decorator: define an op and its kernel at once.

        The decorated function is the kernel, ``fn(*inputs, **attrs)`` returning an array or a
        tuple of arrays (or, with ``factory=True``, a kernel factory taking a KernelSpec).
        ``infer`` defaults to :func:`same_as_input`; ``max_inputs`` to the function's positional
        parameter count.
        """

        def wrap(fn: Callable) -> Callable:
            n_pos = sum(1 for p in inspect.signature(fn).parameters.values()
                        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)
            var = any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values())
            hi = max_inputs if max_inputs is not None else (2**31 - 1 if var or factory else max(n_pos, min_inputs))
            defaults = dict(attrs or {})
            if not factory:
                for pname, p in inspect.signature(fn).parameters.items():
                    if p.default is not p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
                        defaults.setdefault(pname, p.default)
            opdef = OpDef(op_type, domain=domain, min_inputs=min_inputs, max_inputs=hi, min_outputs=num_outputs,
                          max_outputs=num_outputs, kind=kind, infer=infer or same_as_input(),
                          deterministic=deterministic, attrs=defaults, doc=doc or (fn.__doc__ or "").strip())
            self._add("ge_register_ops", opdef)
            kf = fn if factory else simple_kernel(fn, defaults)
            self._add("ge_register_kernels", op_type, kf, domain, backend)
            return fn

        return wrap

    def opdef(self, opdef: OpDef) -> OpDef:
        """Register an :class:`OpDef` built by hand."""
        self._add("ge_register_ops", opdef)
        return opdef

    def kernel(self, op_type: str, domain: str = "", *, backend: str = "cpu", factory: bool = False):
        """Decorator: a kernel for an op defined elsewhere (``fn(*inputs, **attrs)`` or a factory)."""

        def wrap(fn: Callable) -> Callable:
            self._add("ge_register_kernels", op_type, fn if factory else simple_kernel(fn), domain, backend)
            return fn

        return wrap

    # -- frontends, mappers, backends -----------------------------------------------------------
    def frontend(self, fe: Frontend | type[Frontend]) -> Any:
        """Register a :class:`ge_core.frontend.Frontend` (class or instance; class decorator)."""
        self._add("ge_register_frontends", fe() if inspect.isclass(fe) else fe)
        return fe

    def op_mapper(self, framework: str | OpMapper, op_type: str | None = None):
        """Register a framework op mapper: ``@plugin.op_mapper("tensorflow", "MyOp")`` on a
        function, or ``plugin.op_mapper(MyMapper())`` with an :class:`OpMapper`."""
        if isinstance(framework, OpMapper):
            self._add("ge_register_op_mappers", framework.framework, framework.op_type, framework)
            return framework

        def wrap(fn: Callable) -> Callable:
            self._add("ge_register_op_mappers", framework, op_type, fn)
            return fn

        return wrap

    def backend(self, be: Backend | type[Backend]) -> Any:
        """Register a :class:`ge_core.backend.Backend` (class or instance)."""
        self._add("ge_register_backends", be() if inspect.isclass(be) else be)
        return be

    # -- scheduling and memory ------------------------------------------------------------------
    def stream_allocator(self, name: str | StreamAllocator | type[StreamAllocator]):
        """Register a stream allocator: ``@plugin.stream_allocator("mine")`` on
        ``fn(graph, options) -> StreamAssignment``, or a :class:`StreamAllocator`."""
        if not isinstance(name, str):
            obj = name() if inspect.isclass(name) else name
            self._add("ge_register_stream_allocators", obj.name, obj)
            return name

        def wrap(fn: Callable) -> Callable:
            self._add("ge_register_stream_allocators", name, fn)
            return fn

        return wrap

    def memory_planner(self, name: str | MemoryPlanner | type[MemoryPlanner]):
        """Register a memory planner: ``@plugin.memory_planner("mine")`` on
        ``fn(problem, options) -> MemoryPlan``, or a :class:`MemoryPlanner`."""
        if not isinstance(name, str):
            obj = name() if inspect.isclass(name) else name
            self._add("ge_register_memory_planners", obj.name, obj)
            return name

        def wrap(fn: Callable) -> Callable:
            self._add("ge_register_memory_planners", name, fn)
            return fn

        return wrap

    # -- options, commands, observers -----------------------------------------------------------
    def option(self, name: str, default: Any = None, help: str = "") -> None:
        """Register a compile option of this plugin."""
        self._add("ge_register_options", name, default, help)

    def command(self, name: str, help: str = "", configure: Callable | None = None):
        """Decorator: ``run(args) -> int`` becomes ``ge NAME``; ``configure(parser)`` adds arguments."""

        def wrap(fn: Callable) -> Callable:
            self._add("ge_register_cli_commands", name, help or (fn.__doc__ or "").strip().split("\n")[0],
                      configure or (lambda parser: None), fn)
            return fn

        return wrap

    def on(self, hook: str):
        """Decorator: observe ``ge_graph_loaded``, ``ge_before_pass``, ``ge_after_pass`` or
        ``ge_model_built``; the function takes any subset of the hook's arguments by name."""
        if hook not in OBSERVER_HOOKS:
            from ge_core.registry import close_matches

            raise PluginError(f"'{hook}' is not an observer hook{close_matches(hook, OBSERVER_HOOKS)}",
                              hint=f"observer hooks: {', '.join(OBSERVER_HOOKS)}")

        def wrap(fn: Callable) -> Callable:
            first = hook not in self._observers
            self._observers.setdefault(hook, []).append(fn)
            if first:
                fns = self._observers[hook]
                setattr(self, hook, hookimpl(_observer(hook, fns)))
            return fn

        return wrap


def _observer(hook: str, fns: list[Callable]) -> Callable:
    """A hook implementation with the spec's own parameters (pluggy reads them from the code)
    that calls each observer with the subset of arguments it names."""

    def call(**kwargs: Any) -> None:
        for f in fns:
            names = inspect.signature(f).parameters
            f(**{k: v for k, v in kwargs.items() if k in names})

    def graph_loaded(graph, source, framework):
        call(graph=graph, source=source, framework=framework)

    def before_pass(pass_name, stage, graph):
        call(pass_name=pass_name, stage=stage, graph=graph)

    def after_pass(pass_name, stage, graph, changed, seconds):
        call(pass_name=pass_name, stage=stage, graph=graph, changed=changed, seconds=seconds)

    def model_built(model):
        call(model=model)

    impls: dict[str, Callable[..., None]] = {"ge_graph_loaded": graph_loaded, "ge_before_pass": before_pass,
                                             "ge_after_pass": after_pass, "ge_model_built": model_built}
    impl = impls[hook]
    impl.__name__ = hook
    return impl
