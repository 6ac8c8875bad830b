"""FX graph (of a ``torch.export`` program, lowered to core ATen) to the GE IR.

The converter walks the FX graph once. For every ``call_function`` node it looks up the op
mapper registered as ``("torch", key)`` in ``ge_core.plugins.registries().op_mappers`` where
``key`` is :func:`target_key` of the node's target (``"aten.convolution.default"``,
``"operator.getitem"``, ``"higher_order.cond"``, ``"my_lib.my_op.default"``).

Mapper signature::

    def mapper(ctx: MapContext, node: torch.fx.Node) -> Value | Sequence[Value | None] | int | float | None

A mapper reads the node's arguments (``ctx.args(node)`` binds them to the op schema's names),
turns FX arguments into IR values with ``ctx.value(arg, dtype)`` / ``ctx.ints(list)``, adds
nodes with ``ctx.op(op_type, inputs, **attrs)`` and returns the value(s) the FX node produces:
one :class:`Value` for a tensor, a sequence for a tuple (``getitem`` picks from it; ``None``
for an output the mapper does not produce), a Python number for a size known at export time.

Before mapping anything the converter checks that every op (in control-flow bodies too) has a
mapper and raises one :class:`UnsupportedOpError` naming each missing op with the module path
it came from (``node.meta["nn_module_stack"]``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ge_core.errors import GEError, ModelFileError, UnsupportedOpError
from ge_core.ir.graph import Graph, Value
from ge_core.ir.types import TensorType

FRAMEWORK = "torch"
OPSET = 21

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


# ------------------------------------------------------------------------------------------
# keys and dtypes
# ------------------------------------------------------------------------------------------
def target_key(target: Any) -> str:
    """Registry key of an FX call target: ``aten.add.Tensor``, ``operator.mul``, ``higher_order.cond``."""
    name = getattr(target, "name", None)
    ns = getattr(target, "namespace", None)
    if callable(name) and type(target).__name__ == "OpOverload":
        return str(target)  # "aten.add.Tensor"
    if type(target).__name__ == "OpOverloadPacket":
        return f"{target}.default"
    mod = getattr(target, "__module__", "") or ""
    if mod.startswith("torch._higher_order_ops") or mod == "torch.ops.higher_order" or (
        ns is None and type(target).__name__.endswith("Op") and hasattr(target, "_name")
    ):
        return f"higher_order.{getattr(target, '_name', None) or getattr(target, '__name__', str(target))}"
    if mod in ("_operator", "operator"):
        return f"operator.{target.__name__}"
    if mod == "builtins" or mod == "math":
        return f"{'builtins' if mod == 'builtins' else 'math'}.{target.__name__}"
    qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    if mod.startswith("torch"):
        return f"torch.{qual}"
    return f"{mod}.{qual}" if mod else str(qual)


_DTYPES = {
    "float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8",
    "bool": "bool", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "complex64": "complex64", "complex128": "complex128",
}


def np_dtype(torch_dtype: Any) -> np.dtype:
    """NumPy dtype of a torch dtype (``torch.float32`` -> ``float32``)."""
    name = str(torch_dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise UnsupportedOpError(f"torch dtype {torch_dtype} has no GE equivalent")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_DTYPES[name])


def tensor_to_numpy(t: Any, *, copy: bool = True) -> np.ndarray:
    """A torch tensor's data as an ndarray (a read-only copy unless ``copy=False``)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy().view(np_dtype(torch.bfloat16))
    else:
        np_dtype(t.dtype)  # a dtype GE has no equivalent for (float8, quantized...) is named here
        arr = t.resolve_conj().resolve_neg().numpy()
    if not copy:
        return arr
    out = np.array(arr, copy=True)
    out.setflags(write=False)  # graph constants are never written
    return out


def module_path(node: Any) -> str:
    """``layers.0.self_attn (MultiheadAttention)`` from ``node.meta["nn_module_stack"]``."""
    stack = node.meta.get("nn_module_stack") if hasattr(node, "meta") else None
    if not stack:
        return ""
    path, typ = list(stack.values())[-1]
    typ = getattr(typ, "__name__", None) or str(typ).rsplit(".", 1)[-1].strip("'>")
    path = path.replace("L['self'].", "").replace("L__self__.", "")
    return f"{path or '<root>'} ({typ})"


def _describe(node: Any) -> str:
    where = module_path(node)
    return f"node '{node.name}'" + (f" in module {where}" if where else "")


# ------------------------------------------------------------------------------------------
# the mapper context
# ------------------------------------------------------------------------------------------
class MapContext:
    """What a mapper works with: the IR graph being built and helpers to read FX arguments."""

    def __init__(self, converter: Converter, graph: Graph, env: dict[Any, Any]) -> None:
        self.converter = converter
        self.graph = graph
        self.env = env
        self.node: Any = None  # the FX node being mapped

    # -- FX side --------------------------------------------------------------------------
    @staticmethod
    def args(node: Any) -> dict[str, Any]:
        """The node's arguments bound to its schema's names, defaults filled in."""
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            out = {f"arg{i}": a for i, a in enumerate(node.args)}
            out.update(node.kwargs)
            return out
        out = {}
        args = list(node.args)
        for i, a in enumerate(schema.arguments):
            if i < len(args) and not a.kwarg_only:
                out[a.name] = args[i]
            elif a.name in node.kwargs:
                out[a.name] = node.kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            else:
                out[a.name] = None
        return out

    @staticmethod
    def meta(arg: Any) -> Any:
        """The example value of an FX node (a FakeTensor, SymInt, ...) or ``arg`` itself."""
        if _is_fx_node(arg):
            return arg.meta.get("val", arg.meta.get("example_value"))
        return arg

    def dtype(self, arg: Any) -> np.dtype | None:
        """NumPy dtype of a tensor argument (None for a Python scalar)."""
        m = self.meta(arg)
        dt = getattr(m, "dtype", None)
        if dt is None:
            v = self.env.get(arg) if _is_fx_node(arg) else None
            if isinstance(v, Value):
                return v.type.dtype
            return None
        return np_dtype(dt)

    def out_dtype(self, node: Any | None = None) -> np.dtype:
        node = node if node is not None else self.node
        m = self.meta(node)
        if isinstance(m, (list, tuple)):
            m = m[0]
        return np_dtype(m.dtype)

    def shape(self, arg: Any) -> tuple:
        """Shape of a tensor argument: ints, symbol names (str) for dynamic dims."""
        m = self.meta(arg)
        if m is None or not hasattr(m, "shape"):
            v = self.env.get(arg) if _is_fx_node(arg) else None
            if isinstance(v, Value) and v.type.shape is not None:
                return tuple(v.type.shape)
            raise UnsupportedOpError(f"{_describe(self.node)}: the shape of '{arg}' is not known")
        return tuple(self.converter.dim(d) for d in m.shape)

    def rank(self, arg: Any) -> int:
        return len(self.shape(arg))

    def static_int(self, arg: Any) -> int | None:
        """An int argument known at export time (None when it is symbolic)."""
        if isinstance(arg, (bool, int, np.integer)):
            return int(arg)
        if _is_fx_node(arg):
            v = self.env.get(arg)
            if isinstance(v, (int, np.integer)):
                return int(v)
            m = self.meta(arg)
            if isinstance(m, int):
                return m
            try:
                import torch

                if isinstance(m, torch.SymInt):
                    expr = m.node.expr
                    if getattr(expr, "is_number", False):
                        return int(expr)
            except Exception:
                return None
            return None
        try:
            import torch

            if isinstance(arg, torch.SymInt):
                expr = arg.node.expr
                if getattr(expr, "is_number", False):
                    return int(expr)
        except Exception:
            return None
        return None

    def result_type(self, *args: Any) -> np.dtype:
        """torch's type promotion over tensor and scalar arguments."""
        import torch

        vals = []
        for a in args:
            m = self.meta(a)
            if isinstance(m, torch.Tensor) or isinstance(m, (bool, int, float)):
                vals.append(m)
            elif isinstance(m, torch.SymInt):
                vals.append(1)
            elif isinstance(m, torch.SymFloat):
                vals.append(1.0)
            elif isinstance(m, torch.SymBool):
                vals.append(True)
        if not vals:
            return np.dtype("float32")
        if len(vals) == 1:
            v = vals[0]
            return np_dtype(v.dtype) if isinstance(v, torch.Tensor) else np.asarray(v).dtype
        dt = torch.result_type(vals[0], vals[1])
        for v in vals[2:]:
            dt = torch.promote_types(dt, v.dtype if isinstance(v, torch.Tensor) else torch.result_type(torch.empty((), dtype=dt), v))
        return np_dtype(dt)

    # -- IR side --------------------------------------------------------------------------
    def const(self, array: Any, dtype: Any = None, name: str | None = None) -> Value:
        arr = np.asarray(array, dtype=dtype)
        return self.graph.add_constant(arr, self.graph.names.fresh(name or "const"))

    def value(self, arg: Any, dtype: Any = None) -> Value:
        """An IR value for an FX argument (node, Python scalar, list of ints), cast to ``dtype``."""
        dt = np.dtype(dtype) if dtype is not None else None
        if _is_fx_node(arg):
            v = self.env.get(arg, _MISSING)
            if v is _MISSING:
                raise GEError(f"{_describe(self.node)} reads '{arg.name}' before it is defined")
            if isinstance(v, (list, tuple)):
                raise UnsupportedOpError(f"{_describe(self.node)}: '{arg.name}' is a tuple, not a tensor")
            if v is None:
                raise UnsupportedOpError(f"{_describe(self.node)}: '{arg.name}' is an output no mapper produced")
            if not isinstance(v, Value):  # a Python number known at export time
                return self.const(v, dt if dt is not None else _scalar_dtype(v))
            have = self.dtype(arg) or v.type.dtype
            if dt is not None and have is not None and have != dt:
                return self.op("Cast", [v], to=dt)
            return v
        if isinstance(arg, Value):
            if dt is not None and arg.type.dtype is not None and arg.type.dtype != dt:
                return self.op("Cast", [arg], to=dt)
            return arg
        if isinstance(arg, (list, tuple)):
            return self.ints(arg)
        if arg is None:
            raise UnsupportedOpError(f"{_describe(self.node)}: a required argument is None")
        try:
            import torch

            if isinstance(arg, torch.Tensor):
                return self.const(tensor_to_numpy(arg), dt)
        except ImportError:  # pragma: no cover
            pass
        return self.const(arg, dt if dt is not None else _scalar_dtype(arg))

    def ints(self, items: Any) -> Value:
        """A 1-D int64 value from a list of ints and symbolic sizes (FX nodes)."""
        if _is_fx_node(items):
            return self.value(items, np.int64)
        statics = [self.static_int(i) for i in items]
        if all(s is not None for s in statics):
            return self.const(np.asarray(statics, dtype=np.int64).reshape(len(statics)))
        parts = []
        for item, s in zip(items, statics):
            if s is not None:
                parts.append(self.const(np.asarray([s], dtype=np.int64)))
            else:
                v = self.value(item, np.int64)
                parts.append(self.op("Reshape", [v, self.const(np.asarray([1], dtype=np.int64))]))
        return self.op("Concat", parts, axis=0)

    def op(self, op_type: str, inputs: Sequence[Value | None], *, num_outputs: int = 1, domain: str = "",
           **attrs: Any) -> Any:
        """Add an IR node; returns its output (a list when ``num_outputs`` > 1)."""
        fx = self.node
        base = fx.name if fx is not None else op_type.lower()
        n = self.graph.add_node(op_type, list(inputs), {k: v for k, v in attrs.items() if v is not None},
                                domain=domain, name=base, num_outputs=num_outputs)
        if fx is not None:
            n.meta["torch_node"] = fx.name
            where = module_path(fx)
            if where:
                n.meta["torch_module"] = where
        return n.outputs if num_outputs != 1 else n.outputs[0]

    def cast(self, v: Value, dtype: Any) -> Value:
        dt = np.dtype(dtype)
        if v.type.dtype == dt:
            return v
        return self.op("Cast", [v], to=dt)

    def subgraph(self, gm: Any, inputs: Sequence[Any], label: str) -> Graph:
        """Convert the FX GraphModule ``gm`` of a control-flow branch into an IR body graph.

        ``inputs`` are the outer values its placeholders stand for (captured, as ONNX If
        bodies do); the body's outputs are its FX outputs.
        """
        return self.converter.convert_body(gm, inputs, self.graph, label)


class _Missing:
    pass


_MISSING = _Missing()


def _scalar_dtype(v: Any) -> np.dtype:
    if isinstance(v, bool):
        return np.dtype(bool)
    if isinstance(v, (int, np.integer)):
        return np.dtype(np.int64)
    if isinstance(v, (float, np.floating)):
        return np.dtype(np.float32)
    return np.asarray(v).dtype


def _is_fx_node(x: Any) -> bool:
    return type(x).__name__ == "Node" and hasattr(x, "op") and hasattr(x, "target") and hasattr(x, "meta")


# ------------------------------------------------------------------------------------------
# the converter
# ------------------------------------------------------------------------------------------
class Converter:
    """Builds a :class:`Graph` from an FX graph with the registered ``torch`` op mappers."""

    def __init__(self, mappers: Mapping[str, Callable], *, source: str = "<torch>",
                 dim_names: Mapping[str, str] | None = None) -> None:
        self.mappers = mappers
        self.source = source
        self.dim_names = dict(dim_names or {})

    # -- dims -----------------------------------------------------------------------------
    def dim(self, d: Any) -> int | str:
        if isinstance(d, (int, np.integer)):
            return int(d)
        expr = getattr(getattr(d, "node", None), "expr", None)
        if expr is not None and getattr(expr, "is_number", False):
            return int(expr)
        text = str(expr if expr is not None else d)
        return self.dim_names.get(text, text)

    # -- checks ---------------------------------------------------------------------------
    def check_supported(self, gm: Any) -> None:
        missing: dict[str, list[str]] = {}
        for node, _ in _walk(gm):
            if node.op != "call_function":
                continue
            key = target_key(node.target)
            if key not in self.mappers and key != "operator.getitem":
                missing.setdefault(key, []).append(_describe(node))
        if missing:
            parts = []
            for key, where in missing.items():
                more = f" and {len(where) - 1} more" if len(where) > 1 else ""
                parts.append(f"{key} ({where[0]}{more})")
            raise UnsupportedOpError(
                f"{self.source}: no op mapper for {len(missing)} PyTorch op(s): " + "; ".join(parts),
                hint='a plugin can add one with ge_register_op_mappers: register("torch", "<op>", mapper)',
            )

    # -- programs -------------------------------------------------------------------------
    def convert_program(self, ep: Any, *, name: str = "torch_model",
                        const_user_inputs: Mapping[int, Any] | None = None,
                        input_names: Sequence[str] | None = None) -> tuple[Graph, list[Any]]:
        """Convert an ExportedProgram. Returns the graph and the output plan.

        ``const_user_inputs`` maps user-input positions to tensors baked in as constants.
        The output plan has one entry per user output: an IR :class:`Value` (a graph output)
        or a Python constant.
        """
        from torch.export.graph_signature import InputKind, OutputKind

        gm = ep.graph_module
        self.check_supported(gm)
        g = Graph(name)
        g.opset_imports[""] = OPSET
        env: dict[Any, Any] = {}
        sig = ep.graph_signature
        specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        const_user_inputs = dict(const_user_inputs or {})
        state = ep.state_dict
        constants = getattr(ep, "constants", {}) or {}
        user_i = 0
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            if kind == InputKind.USER_INPUT:
                i = user_i
                user_i += 1
                m: Any = node.meta.get("val")
                if i in const_user_inputs:
                    env[node] = g.add_constant(tensor_to_numpy(const_user_inputs[i]), g.names.fresh(_clean(node.name)))
                    continue
                if not _is_tensor(m):
                    env[node] = m if isinstance(m, (int, float, bool)) else None
                    continue
                want = input_names[i] if input_names is not None and i < len(input_names) else node.name
                t = TensorType(np_dtype(m.dtype), tuple(self.dim(d) for d in m.shape))
                env[node] = g.add_input(g.names.fresh(_clean(want)), t)
            elif kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                assert spec is not None
                tgt = spec.target
                tensor = state.get(tgt) if tgt in state else constants.get(tgt)
                if tensor is None:
                    raise ModelFileError(f"{self.source}: the exported program has no tensor for '{tgt}'")
                env[node] = g.add_constant(tensor_to_numpy(tensor), g.names.fresh(_clean(tgt)))
            else:
                raise UnsupportedOpError(f"{self.source}: exported input '{node.name}' of kind {kind.name} is not supported")
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        self.map_nodes(gm, g, env)
        flat = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        plan: list[Any] = []
        outs: list[Value] = []
        for spec, arg in zip(sig.output_specs, flat):
            if spec.kind != OutputKind.USER_OUTPUT:
                raise UnsupportedOpError(
                    f"{self.source}: the program mutates '{getattr(spec, 'target', None) or spec.arg}' "
                    f"({spec.kind.name}); GE runs inference graphs without state",
                    hint="export the model in eval() mode, or return the new state as an output",
                )
            v = env.get(arg, arg) if _is_fx_node(arg) else arg
            if isinstance(v, Value):
                if v.is_graph_input or v.is_constant or v in outs:
                    v = g.add_node("Identity", [v], name=g.names.fresh("output")).output
                m = arg.meta.get("val") if _is_fx_node(arg) else None
                if _is_tensor(m):  # declared output type, symbolic dims named as the inputs'
                    v.type = TensorType(np_dtype(m.dtype), tuple(self.dim(d) for d in m.shape))
                outs.append(v)
                plan.append(v)
            else:
                plan.append(v)
        g.set_outputs(outs)
        # user-facing output names
        for i, v in enumerate(outs):
            want = "output" if len(outs) == 1 else f"output_{i}"
            if v.name != want and want not in g.names:
                g.rename_value(v, want)
        return g, plan

    def convert_body(self, gm: Any, inputs: Sequence[Any], parent: Graph, label: str) -> Graph:
        body = Graph(label, parent=parent)
        env: dict[Any, Any] = {}
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(phs) != len(inputs):
            raise UnsupportedOpError(f"{self.source}: branch '{label}' takes {len(phs)} inputs, got {len(inputs)}")
        for ph, v in zip(phs, inputs):
            env[ph] = v
        self.map_nodes(gm, body, env)
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        flat = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        outs = []
        for arg in flat:
            v = env.get(arg) if _is_fx_node(arg) else arg
            if not isinstance(v, Value):
                v = body.add_constant(np.asarray(v), body.names.fresh("branch_const"))
            if v.graph is not body or v.is_constant or v in outs:
                v = body.add_node("Identity", [v], name=body.names.fresh(f"{label}_out")).output
            outs.append(v)
        body.set_outputs(outs)
        return body

    def map_nodes(self, gm: Any, g: Graph, env: dict[Any, Any]) -> None:
        """Map the call nodes of FX graph ``gm`` into ``g``, reading and extending ``env``
        (FX node -> Value); mappers inlining a submodule call it too."""
        ctx = MapContext(self, g, env)
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            if node.op == "get_attr":
                env[node] = _get_attr(gm, node.target)
                continue
            if node.op != "call_function":
                raise UnsupportedOpError(f"{self.source}: {_describe(node)}: FX '{node.op}' nodes are not supported")
            key = target_key(node.target)
            if key == "operator.getitem" and "operator.getitem" not in self.mappers:
                env[node] = _getitem(env, node)
                continue
            mapper = self.mappers[key]
            ctx.node = node
            try:
                env[node] = mapper(ctx, node)
            except GEError as e:
                if _describe(node) in str(e) or self.source in str(e):
                    raise
                raise type(e)(f"{self.source}: {key} at {_describe(node)}: {e.detail}", hint=e.hint) from e
            except Exception as e:
                raise UnsupportedOpError(
                    f"{self.source}: the mapper of {key} failed at {_describe(node)}: {type(e).__name__}: {e}",
                    hint="the op is used in a way its mapper does not handle; report it with the model",
                ) from e
            finally:
                ctx.node = None


def _getitem(env: dict[Any, Any], node: Any) -> Any:
    src, idx = node.args[0], node.args[1]
    v = env.get(src)
    if isinstance(v, (list, tuple)):
        return v[idx]
    raise UnsupportedOpError(f"{_describe(node)}: getitem on '{src}' which is not a tuple")


def _get_attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _walk(gm: Any):
    """Every FX node of ``gm`` and of the GraphModules it holds (control-flow branches)."""
    yield from ((n, gm) for n in gm.graph.nodes)
    for _name, sub in gm.named_children():
        if hasattr(sub, "graph") and hasattr(sub.graph, "nodes"):
            yield from _walk(sub)


def _is_tensor(x: Any) -> bool:
    try:
        import torch

        return isinstance(x, torch.Tensor)
    except ImportError:  # pragma: no cover
        return False


def _clean(name: str) -> str:
    out = "".join(c if c.isalnum() or c in "_." else "_" for c in str(name))
    return out or "v"


# re-exported for mappers of the operator module
OPERATORS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "truediv": operator.truediv, "mod": operator.mod, "pow": operator.pow,
}
