"""TensorFlow graph to IR conversion: the op-mapper contract and the driver.

An op mapper is registered with ``ge_register_op_mappers``::

    register("tensorflow", "MyOp", mapper)

and called as ``mapper(ctx)`` with a :class:`NodeContext` for one TensorFlow operation. It adds
IR nodes through ``ctx`` (``ctx.op``/``ctx.make``/``ctx.constant``) and returns the values of the
TF op's outputs: one :class:`Value`, a sequence (``None`` for an output nobody may read), or
``None`` for an op without outputs. A mapper may also return non-Value objects (the TensorList
handling does) that only other mappers understand.

The converter works on a ``tf.Graph`` (TensorFlow is imported only by the caller), so every
tensor has TensorFlow's own inferred dtype and shape; :meth:`NodeContext.in_type` and
:meth:`NodeContext.out_type` expose them. Only ops that the requested outputs depend on are
converted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.errors import ModelFileError, UnsupportedOpError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType

FRAMEWORK = "tensorflow"
#: Ops whose mapping lives in the frontend itself (never need a registered mapper).
_BUILTIN = {"Placeholder", "NoOp"}


class Unavailable:
    """Stands for a TF output a mapper did not produce; reading it is an error."""

    def __init__(self, op_name: str, index: int) -> None:
        self.op_name, self.index = op_name, index


def tf_type(tensor) -> TensorType:
    """TensorType of a TF tensor from TensorFlow's own shape inference."""
    dtype = None
    try:
        dt = tensor.dtype.base_dtype
        if dt.is_numpy_compatible and dt.name not in ("resource", "variant", "string"):
            dtype = np.dtype(dt.as_numpy_dtype)
        elif dt.name == "string":
            dtype = np.dtype(object)
    except Exception:
        dtype = None
    shape = None
    try:
        if tensor.shape.rank is not None:
            shape = tuple(tensor.shape.as_list())
    except Exception:
        shape = None
    return TensorType(dtype, shape)


def _find_mapper(op_type: str):
    from ge_core.plugins import registries

    return registries().op_mappers.get((FRAMEWORK, op_type))


def _func_attr_names(op) -> list[str]:
    names = []
    for a in op.node_def.attr.values():
        if a.HasField("func"):
            names.append(a.func.name)
        elif a.HasField("list") and len(a.list.func):
            names.extend(f.name for f in a.list.func)
    return names


class NodeContext:
    """What a mapper sees of one TF operation, and how it adds IR nodes."""

    def __init__(self, conv: Converter, op, graph: Graph, env: dict[str, Any]) -> None:
        self.converter = conv
        self.tf_op = op
        self.graph = graph
        self.env = env
        self.name: str = op.name
        self.op_type: str = op.type
        self.num_inputs = len(op.inputs)
        self.num_outputs = len(op.outputs)

    # -- attributes ----------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        """The op's attribute as a Python value (str, int, float, bool, list, dtype, shape)."""
        a = self.tf_op.node_def.attr.get(name)
        if a is None:
            return default
        try:
            return decode_attr(a)
        except (ValueError, TypeError) as e:  # a tensor NumPy cannot build, a dtype TensorFlow does not know
            self.invalid(f"has an unreadable attribute '{name}': {type(e).__name__}: {e}")
            raise AssertionError from None  # unreachable

    # -- inputs ----------------------------------------------------------------------------------
    def raw_input(self, i: int) -> Any:
        t = self.tf_op.inputs[i]
        try:
            return self.env[t.name]
        except KeyError:
            raise ModelFileError(f"TensorFlow node '{self.name}' ({self.op_type}) reads '{t.name}', which was not converted") from None

    def input(self, i: int) -> Value:
        v = self.raw_input(i)
        if isinstance(v, Value):
            return v
        if isinstance(v, Unavailable):
            self.fail(f"reads output {v.index} of '{v.op_name}', which its mapper does not produce")
        self.fail(f"input {i} ('{self.tf_op.inputs[i].name}') is a {type(v).__name__}, not a tensor this op can read")
        raise AssertionError  # unreachable

    def inputs(self) -> list[Value]:
        return [self.input(i) for i in range(self.num_inputs)]

    def const(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` when it is a constant, else None."""
        v = self.raw_input(i)
        if isinstance(v, Value) and v.const_value is not None:
            return v.const_value
        return None

    def require_const(self, i: int, what: str) -> np.ndarray:
        c = self.const(i)
        if c is None:
            self.fail(f"needs a constant {what} (input {i}, '{self.tf_op.inputs[i].name}')")
        assert c is not None
        return c

    def in_type(self, i: int) -> TensorType:
        """TensorFlow's dtype and shape of input ``i``."""
        v = self.raw_input(i)
        t = tf_type(self.tf_op.inputs[i])
        if isinstance(v, Value) and t.shape is None and v.type.shape is not None:
            return v.type
        return t

    def in_rank(self, i: int) -> int:
        r = self.in_type(i).rank
        if r is None:
            self.fail(f"needs the rank of input {i} ('{self.tf_op.inputs[i].name}'), which is unknown")
        assert r is not None
        return r

    def out_type(self, j: int = 0) -> TensorType:
        return tf_type(self.tf_op.outputs[j])

    # -- building ----------------------------------------------------------------------------------
    def make(self, op_type: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None, *,
             num_outputs: int = 1, domain: str = "") -> Node:
        """Add an IR node (named after the TF op) and return it."""
        return self.graph.add_node(op_type, list(inputs), attrs or {}, domain=domain, name=self.name,
                                   num_outputs=num_outputs)

    def op(self, op_type: str, *inputs: Value | None, **attrs: Any) -> Value:
        """Add a single-output IR node and return its output."""
        return self.make(op_type, inputs, attrs).output

    def constant(self, array: Any, dtype: Any = None) -> Value:
        arr = np.asarray(array, dtype=dtype)
        return self.graph.add_constant(arr, self.graph.names.fresh(f"{self.name}/const"))

    def fail(self, message: str) -> None:
        """Refuse a construct the mapper does not handle (UnsupportedOpError)."""
        raise UnsupportedOpError(
            f"{self.converter.source}: TensorFlow node '{self.name}' ({self.op_type}) {message}",
            hint="freeze/simplify the model or register a mapper for this case with ge_register_op_mappers",
        )

    def invalid(self, message: str) -> None:
        """Refuse a node that no valid TensorFlow graph holds (ModelFileError)."""
        raise ModelFileError(
            f"{self.converter.source}: TensorFlow node '{self.name}' ({self.op_type}) {message}",
            hint="the model is malformed; re-export it from TensorFlow",
        )


def decode_attr(a) -> Any:
    which = a.WhichOneof("value")
    if which == "s":
        try:
            return a.s.decode("utf-8")
        except UnicodeDecodeError:
            return a.s
    if which == "i":
        return int(a.i)
    if which == "f":
        return float(a.f)
    if which == "b":
        return bool(a.b)
    if which == "type":
        return _np_dtype(a.type)
    if which == "shape":
        return _shape(a.shape)
    if which == "tensor":
        import tensorflow as tf

        return tf.make_ndarray(a.tensor)
    if which == "func":
        return a.func.name
    if which == "list":
        lst = a.list
        if len(lst.s):
            return [x.decode("utf-8", "replace") for x in lst.s]
        if len(lst.i):
            return [int(x) for x in lst.i]
        if len(lst.f):
            return [float(x) for x in lst.f]
        if len(lst.b):
            return [bool(x) for x in lst.b]
        if len(lst.type):
            return [_np_dtype(x) for x in lst.type]
        if len(lst.shape):
            return [_shape(x) for x in lst.shape]
        if len(lst.func):
            return [f.name for f in lst.func]
        return []
    return None


def _np_dtype(enum: int) -> np.dtype | None:
    import tensorflow as tf

    dt = tf.dtypes.as_dtype(enum)
    if dt.name == "string":
        return np.dtype(object)
    if not dt.is_numpy_compatible or dt.name in ("resource", "variant"):
        return None
    return np.dtype(dt.as_numpy_dtype)


def _shape(sp) -> tuple | None:
    if sp.unknown_rank:
        return None
    return tuple(int(d.size) if d.size >= 0 else None for d in sp.dim)


class Converter:
    """Converts the ops of a ``tf.Graph`` (and the functions it calls) into IR."""

    def __init__(self, tf_graph, functions: dict[str, Any], source: str) -> None:
        self.tf_graph = tf_graph
        self.functions = functions  # name -> FunctionDef
        self.source = source
        self._func_graphs: dict[tuple, Any] = {}
        self._current: Any = None  # the TF op being converted (named by errors about its functions)

    def _where(self) -> str:
        op = self._current
        return f"TensorFlow node '{op.name}' ({op.type})" if op is not None else "the graph"

    # -- analysis -------------------------------------------------------------------------------
    @staticmethod
    def needed_ops(outputs: Sequence[Any]) -> list:
        """The ops the given TF tensors depend on (data edges only), in a topological order."""
        seen: set = set()
        order: list = []
        stack: list[tuple[Any, bool]] = [(t.op, False) for t in reversed(list(outputs))]
        while stack:
            op, done = stack.pop()
            if done:
                order.append(op)
                continue
            if op in seen:
                continue
            seen.add(op)
            stack.append((op, True))
            for t in reversed(list(op.inputs)):
                if t.op not in seen:
                    stack.append((t.op, False))
        return order

    def check_supported(self, ops: Sequence[Any]) -> None:
        """Raise one UnsupportedOpError listing every op type without a mapper (functions too)."""
        unknown: dict[str, list[str]] = {}
        seen_funcs: set[str] = set()

        def visit_nodes(nodes, where: str) -> None:
            for op_type, name, funcs in nodes:
                if op_type not in _BUILTIN and _find_mapper(op_type) is None:
                    unknown.setdefault(op_type, []).append(f"{where}{name}")
                for fn in funcs:
                    visit_func(fn)

        def visit_func(fname: str) -> None:
            if fname in seen_funcs:
                return
            seen_funcs.add(fname)
            fdef = self.functions.get(fname)
            if fdef is None:
                return
            nodes = []
            for nd in fdef.node_def:
                funcs = [a.func.name for a in nd.attr.values() if a.HasField("func")]
                nodes.append((nd.op, nd.name, funcs))
            visit_nodes(nodes, f"{fname}/")

        visit_nodes([(op.type, op.name, _func_attr_names(op)) for op in ops], "")
        if unknown:
            parts = []
            for op_type in sorted(unknown):
                names = unknown[op_type]
                shown = ", ".join(f"'{n}'" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                parts.append(f"{op_type} (node{'s' if len(names) > 1 else ''} {shown})")
            raise UnsupportedOpError(
                f"{self.source}: {len(unknown)} TensorFlow op type(s) have no mapper: " + "; ".join(parts),
                hint="register mappers with the ge_register_op_mappers hook "
                     "(register('tensorflow', op_type, mapper)), or choose out_nodes that avoid these ops",
            )

    # -- conversion -------------------------------------------------------------------------------
    def convert_ops(self, ops: Sequence[Any], graph: Graph, env: dict[str, Any]) -> None:
        """Convert ``ops`` (topologically ordered) into ``graph``; ``env`` maps TF tensor names."""
        for op in ops:
            if all(t.name in env for t in op.outputs) and op.outputs:
                continue  # bound already (inputs of the graph or a function)
            if op.type == "NoOp":
                continue
            if op.type == "Placeholder":
                raise ModelFileError(
                    f"{self.source}: placeholder '{op.name}' is not an input of the converted graph",
                    hint="give it as an input or choose other out_nodes",
                )
            mapper = _find_mapper(op.type)
            if mapper is None:  # check_supported ran before: only reachable for functions' ops
                raise UnsupportedOpError(f"{self.source}: no mapper for TensorFlow op {op.type} (node '{op.name}')")
            ctx = NodeContext(self, op, graph, env)
            outer, self._current = self._current, op
            try:
                result = mapper(ctx)
            finally:
                self._current = outer
            self._bind(op, result, graph, env)

    def _bind(self, op, result: Any, graph: Graph, env: dict[str, Any]) -> None:
        n = len(op.outputs)
        if n == 0:
            return
        if isinstance(result, (list, tuple)):
            outs = list(result)
        else:
            outs = [result]
        if len(outs) > n:
            raise UnsupportedOpError(f"mapper of {op.type} returned {len(outs)} outputs for node '{op.name}', which has {n}")
        outs += [None] * (n - len(outs))
        for j, (t, v) in enumerate(zip(op.outputs, outs)):
            if v is None:
                env[t.name] = Unavailable(op.name, j)
                continue
            if isinstance(v, Value):
                tt = tf_type(t)
                if v.producer is not None and v.graph is graph and v.type.dtype is None and tt.dtype is not None:
                    v.type = tt
                if (v.producer is not None and v.graph is graph and not v.meta.get("tf_name")
                        and not v.is_graph_output):
                    want = op.name if j == 0 else f"{op.name}:{j}"
                    v.meta["tf_name"] = t.name
                    if v.name != want and want not in graph.names:
                        graph.rename_value(v, want)
            env[t.name] = v

    # -- functions (control flow bodies) ------------------------------------------------------------
    def func_graph(self, fname: str, input_shapes: Sequence[Any]):
        """A ``FuncGraph`` of function ``fname`` with the given input shapes (cached)."""
        key = (fname, tuple(str(s) for s in input_shapes))
        fg = self._func_graphs.get(key)
        if fg is None:
            from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

            fdef = self._fdef(fname)
            if len(fdef.signature.input_arg) != len(input_shapes):
                raise ModelFileError(
                    f"{self.source}: {self._where()} calls function '{fname}' with {len(input_shapes)} arguments; "
                    f"it takes {len(fdef.signature.input_arg)}",
                    hint="the model is malformed; re-export it from TensorFlow",
                )
            try:
                with self.tf_graph.as_default():
                    fg = function_def_to_graph(fdef, input_shapes=list(input_shapes))
            except ValueError as e:  # a shape that contradicts the body, an input of the wrong type
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise ModelFileError(
                    f"{self.source}: {self._where()} calls function '{fname}', which TensorFlow cannot build "
                    f"with the caller's inputs: {first}",
                    hint="the model is malformed; re-export it from TensorFlow",
                ) from None
            self._func_graphs[key] = fg
        return fg

    def _fdef(self, fname: Any):
        fdef = self.functions.get(fname) if isinstance(fname, str) else None
        if fdef is None:
            raise ModelFileError(
                f"{self.source}: {self._where()} calls function '{fname}', which is not in the graph's function library",
                hint="the model is malformed; re-export it from TensorFlow",
            )
        return fdef

    def inline_function(self, fname: str, args: Sequence[Any], input_shapes: Sequence[Any], graph: Graph,
                        num_outputs: int | None = None) -> list[Any]:
        """Convert the body of ``fname`` into ``graph`` with its arguments bound to ``args``;
        returns the converted outputs (Values or other objects), ``num_outputs`` of them if given."""
        fdef = self._fdef(fname)
        n_out = len(fdef.signature.output_arg)
        if len(fdef.signature.input_arg) != len(args) or (num_outputs is not None and n_out != num_outputs):
            want = f" returning {num_outputs} value(s)" if num_outputs is not None else ""
            raise ModelFileError(
                f"{self.source}: {self._where()} calls function '{fname}' with {len(args)} argument(s){want}; "
                f"it takes {len(fdef.signature.input_arg)} and returns {n_out}",
                hint="the model is malformed; re-export it from TensorFlow",
            )
        fg = self.func_graph(fname, input_shapes)
        env: dict[str, Any] = {}
        for t, a in zip(fg.inputs, args):
            env[t.name] = a
        ops = self.needed_ops(fg.outputs)
        self.convert_ops(ops, graph, env)
        return [env[t.name] for t in fg.outputs]

    def subgraph(self, fname: str, args: Sequence[Any], input_shapes: Sequence[Any], parent: Graph, label: str,
                 extra_inputs: Sequence[tuple[str, TensorType]] = (),
                 num_outputs: int | None = None) -> tuple[Graph, list[Any], list[Value]]:
        """A new IR subgraph of ``parent`` holding the body of ``fname``.

        ``args`` bind the function's arguments (outer values are captured); ``extra_inputs``
        become the subgraph's own inputs first. Returns (graph, outputs, subgraph inputs).
        """
        g = Graph(label, parent=parent)
        own = [g.add_input(g.names.fresh(n), t) for n, t in extra_inputs]
        outs = self.inline_function(fname, args, input_shapes, g, num_outputs)
        return g, outs, own


def as_graph_output(graph: Graph, v: Value) -> Value:
    """``v`` itself if ``graph`` produces it, else an Identity of it (inputs, constants, captures)."""
    if v.producer is not None and v.graph is graph and not v.is_graph_output:
        return v
    return graph.add_node("Identity", [v], name="out").output
