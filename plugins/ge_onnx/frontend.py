"""The ONNX frontend: a model file, ``ModelProto`` or bytes to a :class:`Graph`.

* every failure to read the model is a :class:`ModelFileError` naming the file (no protobuf
  error escapes); external data is resolved safely (see :mod:`ge_onnx.external`);
* initializers are constants; a graph input that is also an initializer is a constant in IR < 4
  (those models list every weight as an input) and, from IR 4 as in onnxruntime, an input that
  may be fed, with the initializer as its default (``Value.default``), never folded;
* model-local functions are inlined, after their inlined size is bounded
  (:data:`MAX_INLINED_NODES`, counted without inlining; recursive functions are refused);
* every graph, subgraphs included, is in SSA form: a name defined twice, or a subgraph name that
  shadows a value of an enclosing graph, is a :class:`ModelFileError` naming graph, node and name;
* ``Constant``/``ConstantOfShape`` nodes stay nodes (passes fold them);
* attributes become Python values (str, int, float, lists, ndarray, Graph, list[Graph]);
* ``input_shape`` overrides input shapes, ``out_nodes`` selects outputs (tensor names or ATC's
  ``node_name:index``);
* unknown ops (in any subgraph too) raise one :class:`UnsupportedOpError` listing them all, as
  do ops removed before the imported opset; nodes that break their op's schema (input/output
  counts, a required input left empty) raise :class:`ModelFileError` naming them;
* the ModelProto given is never modified.
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ge_core.errors import GEError, GraphError, ModelFileError, OptionError, UnsupportedOpError
from ge_core.frontend import Frontend
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.registry import close_matches
from ge_sdk.onnx_types import type_from_proto as _type_from_proto
from ge_sdk.shapes import frontend_dims

from .external import SparseBudget, sparse_to_array, tensor_to_array

#: Suffixes of other frameworks' files, never claimed by content sniffing.
_OTHER_FORMATS = (".pb", ".pbtxt", ".h5", ".hdf5", ".keras", ".om", ".tflite", ".caffemodel", ".prototxt",
                  ".mindir", ".json", ".toml")

#: Largest model file read into memory (protobuf's own limit is 2 GiB).
MAX_MODEL_BYTES = 2**31


def _norm_domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


# ------------------------------------------------------------------------------------------
# types
# ------------------------------------------------------------------------------------------
def type_from_proto(tp) -> TensorType:
    """TensorType of a TypeProto (unknown for sequences, maps, optionals)."""
    return _type_from_proto(tp) or TensorType()


# ------------------------------------------------------------------------------------------
# reading the model
# ------------------------------------------------------------------------------------------
def read_model(source: Any) -> tuple[Any, str, str | None]:
    """``(ModelProto, display name, base folder or None)`` for a path, ModelProto or bytes."""
    import onnx

    if isinstance(source, onnx.ModelProto):
        return source, "<ModelProto>", None
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), "<bytes>"), "<bytes>", None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not os.path.exists(path):
            raise ModelFileError(f"model file '{path}' does not exist", hint="check the path")
        if os.path.isdir(path):
            raise ModelFileError(
                f"'{path}' is a directory, not an ONNX model file",
                hint="give the path of the .onnx file (a folder is a TensorFlow SavedModel: use --framework=3)",
            )
        try:
            size = os.path.getsize(path)
            if size > MAX_MODEL_BYTES:
                raise ModelFileError(
                    f"model file '{path}' is {size} bytes, more than protobuf's 2 GiB limit",
                    hint="save the weights as external data (onnx.save_model(..., save_as_external_data=True))",
                )
            with open(path, "rb") as f:
                data = f.read()
        except GEError:
            raise
        except OSError as e:
            raise ModelFileError(f"cannot read model file '{path}': {e.strerror or e}") from None
        return _parse(data, path), path, os.path.dirname(os.path.abspath(path))
    raise ModelFileError(
        f"the ONNX frontend cannot read a {type(source).__name__}",
        hint="give a .onnx path, an onnx.ModelProto or the serialized bytes",
    )


def _parse(data: bytes, name: str):
    import onnx

    if not data:
        raise ModelFileError(f"model file '{name}' is empty", hint="re-export the model")
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise ModelFileError(
            f"'{name}' is not a valid ONNX model (protobuf parse failed: {type(e).__name__}: {e})",
            hint="check that the file is a complete .onnx model, not truncated or another format",
        ) from None
    if not m.HasField("graph") or m.ir_version <= 0:
        raise ModelFileError(
            f"'{name}' does not look like an ONNX model (no graph or ir_version)",
            hint="check that the file is an .onnx model",
        )
    return m


# ------------------------------------------------------------------------------------------
# building the IR
# ------------------------------------------------------------------------------------------
class _Builder:
    def __init__(self, model, name: str, base_dir: str | None) -> None:
        self.model = model
        self.name = name
        self.base_dir = base_dir
        #: ONNX node name -> IR node of the main graph (for out_nodes "name:index").
        self.onnx_node_names: dict[str, Node] = {}
        #: values of subgraphs by name (renamed when the main graph defines the name later).
        self.sub_values: dict[str, Value] = {}
        self.sparse_budget = SparseBudget()

    # -- attributes ----------------------------------------------------------------------------
    def attr_value(self, a, graph: Graph, scope: dict[str, Value], node_name: str) -> Any:
        from onnx import AttributeProto as A

        t = a.type
        if t == A.UNDEFINED:
            # very old models leave type unset: guess from the filled field
            for field, tt in (("f", A.FLOAT), ("i", A.INT), ("s", A.STRING), ("t", A.TENSOR), ("g", A.GRAPH)):
                if a.HasField(field):
                    t = tt
                    break
            else:
                for field, tt in (("floats", A.FLOATS), ("ints", A.INTS), ("strings", A.STRINGS),
                                  ("tensors", A.TENSORS), ("graphs", A.GRAPHS)):
                    if len(getattr(a, field)):
                        t = tt
                        break
        if t == A.FLOAT:
            return float(str(np.float32(a.f)))
        if t == A.INT:
            return int(a.i)
        if t == A.STRING:
            return _decode(a.s)
        if t == A.FLOATS:
            return [float(str(np.float32(x))) for x in a.floats]
        if t == A.INTS:
            return [int(x) for x in a.ints]
        if t == A.STRINGS:
            return [_decode(x) for x in a.strings]
        if t == A.TENSOR:
            return tensor_to_array(a.t, self.base_dir, self.name)
        if t == A.TENSORS:
            return [tensor_to_array(x, self.base_dir, self.name) for x in a.tensors]
        if t == A.SPARSE_TENSOR:
            return sparse_to_array(a.sparse_tensor, self.base_dir, self.name, self.sparse_budget)
        if t == A.SPARSE_TENSORS:
            return [sparse_to_array(x, self.base_dir, self.name, self.sparse_budget) for x in a.sparse_tensors]
        if t == A.GRAPH:
            return self.build_graph(a.g, parent=graph, outer=scope, label=f"{node_name}.{a.name}")
        if t == A.GRAPHS:
            return [self.build_graph(g, parent=graph, outer=scope, label=f"{node_name}.{a.name}[{i}]")
                    for i, g in enumerate(a.graphs)]
        return None  # TYPE_PROTO(S): not represented

    # -- graphs ----------------------------------------------------------------------------------
    def _name(self, graph: Graph, want: str, main: bool) -> str:
        """``want`` if free; in a subgraph a clash gets a fresh name (bodies are positional).

        In the main graph names are kept (they are the model's interface): a subgraph value that
        took the name first is renamed. (Duplicates the model itself defines were refused by
        :meth:`_Scope.claim` before.)
        """
        if main:
            if want in graph.names:
                sub = self.sub_values.pop(want, None)
                if sub is not None and sub.graph is not None:
                    sub.graph.rename_value(sub, graph.names.fresh(want))
            return want
        return graph.names.fresh(want or "v")

    def _track(self, v: Value, main: bool) -> Value:
        if not main:
            self.sub_values[v.name] = v
        return v

    def build_graph(self, gp, parent: Graph | None, outer: dict[str, Value] | None, label: str,
                    input_shape: dict[str, tuple] | None = None) -> Graph:
        main = parent is None
        g = Graph(gp.name or ("graph" if main else label), parent=parent)
        sc = _Scope(self.name, f"graph '{g.name}'" if main else f"subgraph '{gp.name or label}' (attribute {label})",
                    outer)
        scope = sc.values

        # initializers: constants; in IR >= 4 one that is also a graph input is that input's default
        overridable = int(self.model.ir_version) >= 4
        input_names = {i.name for i in gp.input}
        defaults: dict[str, np.ndarray] = {}
        init_names = set()
        inits = [(t.name, t, False) for t in gp.initializer] + [(sp.values.name, sp, True) for sp in gp.sparse_initializer]
        for nm, t, sparse in inits:
            sc.claim(nm, "initializer")
            arr = (sparse_to_array(t, self.base_dir, self.name, self.sparse_budget) if sparse
                   else tensor_to_array(t, self.base_dir, self.name))
            init_names.add(nm)
            if overridable and nm in input_names:
                defaults[nm] = arr
                continue
            v = self._track(g.add_constant(arr, self._name(g, nm, main)), main)
            sc.define(nm, v)

        # real inputs
        if main and input_shape:
            real = [i.name for i in gp.input if i.name not in init_names or i.name in defaults]
            for k in input_shape:
                if k not in real:
                    raise OptionError(
                        f"input_shape names '{k}', which is not an input of {self.name}{close_matches(k, real)}",
                        hint=f"the model's inputs: {', '.join(real) or 'none'}",
                    )
        listed: set[str] = set()
        for i in gp.input:
            if i.name in listed:
                raise ModelFileError(f"{self.name}: {sc.where} lists graph input '{i.name}' twice",
                                     hint="the model is malformed (run onnx.checker.check_model)")
            listed.add(i.name)
            default = defaults.pop(i.name, None)
            if default is None and i.name in init_names:
                continue  # IR < 4: weights listed as inputs are constants
            if default is None:
                sc.claim(i.name, "graph input")
            t = type_from_proto(i.type if i.HasField("type") else None)
            if main and input_shape and i.name in input_shape:
                t = TensorType(t.dtype, frontend_dims(t.shape, tuple(input_shape[i.name]), i.name))
            if default is not None:
                t = _default_type(self.name, i.name, t, default)
            v = self._track(g.add_input(self._name(g, i.name, main), t, default=default), main)
            sc.define(i.name, v)

        # declared types of intermediate values and outputs
        declared: dict[str, TensorType] = {}
        for vi in list(gp.value_info) + list(gp.output):
            if vi.HasField("type"):
                declared[vi.name] = type_from_proto(vi.type)

        for np_ in self._ordered_nodes(gp, scope):
            self.add_node(g, np_, sc, declared, main)

        outs = []
        for o in gp.output:
            out = scope.get(o.name)
            if out is None:
                raise ModelFileError(
                    f"{self.name}: graph output '{o.name}' of graph '{g.name}' is not produced by any node, input "
                    "or initializer",
                    hint="the model is malformed (run onnx.checker.check_model)",
                )
            outs.append(out)
        g.set_outputs(outs)
        return g

    def _ordered_nodes(self, gp, scope: dict[str, Value]) -> list:
        """Nodes in a topological order (ONNX requires it; some exporters do not respect it)."""
        nodes = list(gp.node)
        known = set(scope)
        ok = True
        for n in nodes:
            for i in n.input:
                if i and i not in known:
                    ok = False
                    break
            if not ok:
                break
            known.update(o for o in n.output if o)
        if ok:
            return nodes
        # Kahn's algorithm over the names each node reads (subgraph captures included)
        producer: dict[str, int] = {}
        for idx, n in enumerate(nodes):
            for o in n.output:
                if o:
                    producer[o] = idx
        deps: list[set[int]] = []
        for idx, n in enumerate(nodes):
            d = set()
            for name in list(n.input) + _captured_names(n):
                if name and name not in scope and name in producer and producer[name] != idx:
                    d.add(producer[name])
            deps.append(d)
        users: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
        indeg = [len(d) for d in deps]
        for i, d in enumerate(deps):
            for p in d:
                users[p].append(i)
        import heapq

        ready = [i for i in range(len(nodes)) if indeg[i] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for u in users[i]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    heapq.heappush(ready, u)
        if len(order) != len(nodes):
            stuck = nodes[next(i for i in range(len(nodes)) if indeg[i] > 0)]
            raise ModelFileError(f"{self.name}: the graph has a cycle through node '{stuck.name or stuck.op_type}'")
        return [nodes[i] for i in order]

    def add_node(self, g: Graph, n, sc: _Scope, declared: dict[str, TensorType], main: bool) -> None:
        scope = sc.values
        label = n.name or n.op_type
        inputs: list[Value | None] = []
        for name in n.input:
            if not name:
                inputs.append(None)
                continue
            v = scope.get(name)
            if v is None:
                raise ModelFileError(
                    f"{self.name}: node '{label}' ({n.op_type}) reads '{name}', which no node, input or "
                    "initializer defines",
                    hint="the model is malformed (run onnx.checker.check_model)",
                )
            inputs.append(v)
        out_names = list(n.output)
        while out_names and not out_names[-1]:
            out_names.pop()  # trailing absent optional outputs
        for o in out_names:
            if o:
                sc.claim(o, "tensor", f"node '{label}' ({n.op_type})")
        # keep the node name unique here, so that the IR name equals the ONNX name where possible
        attrs: dict[str, Any] = {}
        node_scope = scope  # subgraphs see every value defined so far
        for a in n.attribute:
            if a.ref_attr_name:
                raise ModelFileError(f"{self.name}: node '{label}' uses attribute references outside a function")
            val = self.attr_value(a, g, node_scope, label)
            if val is not None:
                attrs[a.name] = val
        names = []
        absent = []
        for i, o in enumerate(out_names):
            if o:
                names.append(self._name(g, o, main))
            else:
                names.append(self._name(g, f"{label}_absent{i}", False))
                absent.append(i)
        node = g.add_node(
            n.op_type,
            inputs,
            attrs,
            domain=_norm_domain(n.domain),
            name=n.name or None,
            num_outputs=len(names),
            output_names=names,
        )
        if n.name:
            node.meta["onnx_name"] = n.name
        if main and n.name and n.name not in self.onnx_node_names:
            self.onnx_node_names[n.name] = node
        for i in absent:
            node.outputs[i].meta["onnx_absent"] = True
        if n.doc_string:
            node.meta["doc_string"] = n.doc_string
        for i, o in enumerate(out_names):
            v = node.outputs[i]
            if not main:
                self.sub_values[v.name] = v
            if not o:
                continue
            t = declared.get(o)
            if t is not None:
                v.type = t
            sc.define(o, v)


class _Scope:
    """The ONNX names visible in one graph being built: its own and its enclosing graphs'.

    Every name a graph defines (initializer, input, node output) goes through :meth:`claim`, in
    the main graph and in every subgraph alike: ONNX graphs are in SSA form, and a subgraph may
    not redefine a name visible from an enclosing graph (no shadowing).
    """

    def __init__(self, source: str, where: str, outer: dict[str, Value] | None) -> None:
        self.source = source
        self.where = where
        self.outer = outer or {}
        self.values: dict[str, Value] = dict(self.outer)
        self.local: set[str] = set()

    def claim(self, name: str, what: str, node: str | None = None) -> None:
        """Reserve ``name`` for this graph; refuse it if this graph defines it already or an
        enclosing graph does."""
        by = f", {node}," if node else ""
        if name in self.local:
            raise ModelFileError(
                f"{self.source}: {self.where}{by} defines {what} '{name}', which this graph already defines",
                hint="every value name of an ONNX graph is defined once (run onnx.checker.check_model)",
            )
        if name in self.outer:
            raise ModelFileError(
                f"{self.source}: {self.where}{by} defines {what} '{name}', which shadows a value of an enclosing graph",
                hint="ONNX forbids a subgraph to redefine a name visible from outside it; rename it in the subgraph "
                     "(run onnx.checker.check_model)",
            )
        self.local.add(name)

    def define(self, name: str, v: Value) -> None:
        self.values[name] = v
        self.local.add(name)


def _default_type(source: str, name: str, declared: TensorType, default: np.ndarray) -> TensorType:
    """The type of an input whose initializer is its default: the declared type (or the
    initializer's own), which the initializer must fit."""
    if declared.dtype is None and declared.shape is None:
        return TensorType.of(default)
    t = TensorType(declared.dtype if declared.dtype is not None else default.dtype, declared.shape)
    fits = t.dtype == default.dtype and (t.shape is None or (
        default.ndim == len(t.shape) and all(not isinstance(w, int) or w == d for w, d in zip(t.shape, default.shape))))
    if not fits:
        raise ModelFileError(
            f"{source}: graph input '{name}' is declared {declared}, but its initializer (the default) is "
            f"{default.dtype}{list(default.shape)}",
            hint="the model is malformed: the input's type and its initializer must agree",
        )
    return t


def _check_text_fields(msg, source: str, path: str = "model") -> None:
    """Refuse a model with a ``string`` field that is not valid UTF-8 (protobuf then hands back
    bytes, which would become names of the IR and break everything downstream)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    for fd, value in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == F.LABEL_REPEATED
        if fd.type == F.TYPE_STRING:
            values = value if repeated else (value,)
            for v in values:
                if not isinstance(v, str):
                    raise ModelFileError(f"{source}: {path}.{fd.name} is not valid UTF-8 ({bytes(v)[:40]!r})",
                                         hint="the model file is corrupt")
        elif fd.type == F.TYPE_MESSAGE:
            if repeated:
                for i, m in enumerate(value):
                    _check_text_fields(m, source, f"{path}.{fd.name}[{i}]")
            else:
                _check_text_fields(value, source, f"{path}.{fd.name}")


def _captured_names(n) -> list[str]:
    """Names read inside the subgraphs of node ``n`` (implicit inputs)."""
    out: list[str] = []
    for a in n.attribute:
        gs = [a.g] if a.HasField("g") else list(a.graphs)
        for sg in gs:
            for sn in sg.node:
                out.extend(sn.input)
                out.extend(_captured_names(sn))
    return out


def _decode(b: bytes | str) -> str | bytes:
    if isinstance(b, str):
        return b
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def check_ops(graph: Graph, registry, source: str) -> None:
    """Raise one UnsupportedOpError for every op no plugin provides (or too new for the opset)."""
    from ge_core.ops import unknown_ops_error

    unknown = []
    too_new: list[tuple[Node, int, int]] = []
    opset = graph.opset_imports.get("")
    for n in graph.walk():
        d = registry.lookup(n.domain, n.op_type)
        if d is None:
            unknown.append(n)
        elif not n.domain and opset and d.since_version > opset:
            too_new.append((n, d.since_version, opset))
    if unknown:
        raise unknown_ops_error(unknown, registry, source=source)
    if too_new:
        parts = [f"{n.describe()} needs opset {need} or later" for n, need, _ in too_new[:5]]
        more = f" and {len(too_new) - 5} more" if len(too_new) > 5 else ""
        raise UnsupportedOpError(
            f"{source} imports ai.onnx opset {opset}, but " + "; ".join(parts) + more,
            hint="re-export the model with a newer opset (or convert it with onnx.version_converter)",
        )
    check_node_specs(graph, registry, source)


def _onnx_schema(domain: str, op_type: str, opset: int):
    """The schema ``opset`` of ``domain`` selects for ``op_type`` (the newest for ``opset`` 0);
    None when ONNX has none (a plugin's own op, an op newer than the opset)."""
    return _schema_cached(domain, op_type, opset)


@functools.lru_cache(maxsize=4096)
def _schema_cached(domain: str, op_type: str, opset: int):
    import onnx.defs

    try:
        if opset > 0:
            return onnx.defs.get_schema(op_type, opset, domain)
        return onnx.defs.get_schema(op_type, domain)
    except Exception:  # noqa: BLE001 - no such op in ONNX, or it did not exist yet at that opset
        return None


def _arity(lo: int, hi: int) -> str:
    if lo == hi:
        return f"exactly {lo}"
    return f"at least {lo}" if hi >= 2**31 - 1 else f"{lo} to {hi}"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_float(v: Any) -> bool:
    return isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, bool)


def _is_seq(item) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (list, tuple, np.ndarray)) and all(item(x) for x in np.asarray(v, dtype=object).ravel())


def _describe_attr(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        kinds = sorted({type(x).__name__ for x in v})
        return f"a list of {'/'.join(kinds) or 'nothing'}"
    return f"a {type(v).__name__}"


@functools.cache
def _attr_kinds() -> dict[Any, tuple[str, Callable[[Any], bool]]]:
    """The attribute checks by ONNX attribute type (built on first use: registering the frontend
    must not import onnx, so that loading an .om does not)."""
    from onnx.defs import OpSchema

    t = OpSchema.AttrType
    return {
        t.INT: ("an int", _is_int),
        t.FLOAT: ("a float", _is_float),
        t.STRING: ("a string", lambda v: isinstance(v, (str, bytes))),
        t.INTS: ("a list of ints", _is_seq(_is_int)),
        t.FLOATS: ("a list of floats", _is_seq(_is_float)),
        t.STRINGS: ("a list of strings", _is_seq(lambda x: isinstance(x, (str, bytes)))),
    }


def check_node_specs(graph: Graph, registry, source: str) -> None:
    """Refuse nodes that break their op's schema in the version the model's opset selects (what
    ``onnx.checker`` calls a bad node spec): too few or too many inputs or outputs, a required
    input given as '' (absent), an attribute of the wrong type, an op removed before the imported
    opset.

    Such a node cannot be inferred, optimised or run; without this check it would only fail
    inside the compile's passes. Ops ONNX has no schema for are held to the arity of their OpDef.
    """
    from onnx.defs import OpSchema

    imports = graph.opset_imports
    bad: list[str] = []
    removed: list[str] = []
    for n in graph.walk():
        dom = _norm_domain(n.domain)
        opset = imports.get(dom) or 0
        if not 0 <= opset < 2**31:
            opset = 0  # no such opset: hold the node to the newest schema
        schema = _onnx_schema(dom, n.op_type, opset)
        n_in, n_out = len(n.inputs), len(n.outputs)
        if schema is None:
            d = registry.lookup(n.domain, n.op_type)
            if d is not None and not d.min_inputs <= n_in <= d.max_inputs:
                bad.append(f"{n.describe()} has {n_in} input(s); {n.op_type} takes {_arity(d.min_inputs, d.max_inputs)}")
            continue
        what = f"{n.op_type}-{schema.since_version} (the version {dom or 'ai.onnx'} opset {opset or 'latest'} selects)"
        if schema.deprecated:
            removed.append(f"{n.describe()} uses {n.op_type}, which ONNX removed in {dom or 'ai.onnx'} opset "
                           f"{schema.since_version} (the model imports opset {opset or 'latest'})")
        elif not schema.min_input <= n_in <= schema.max_input:
            bad.append(f"{n.describe()} has {n_in} input(s); {what} takes {_arity(schema.min_input, schema.max_input)}")
        elif not schema.min_output <= n_out <= schema.max_output:
            bad.append(f"{n.describe()} has {n_out} output(s); {what} gives {_arity(schema.min_output, schema.max_output)}")
        else:
            for i, (v, p) in enumerate(zip(n.inputs, schema.inputs)):
                if v is None and p.option == OpSchema.FormalParameterOption.Single:
                    bad.append(f"{n.describe()} leaves input {i} ('{p.name}') empty; it is required by {what}")
                    break
            else:
                for name, value in n.attrs.items():
                    spec = schema.attributes.get(name)
                    want = _attr_kinds().get(spec.type) if spec is not None else None
                    if want is not None and not want[1](value):
                        bad.append(f"{n.describe()} has attribute '{name}' of the wrong type: {what} takes {want[0]}, "
                                   f"got {_describe_attr(value)}")
                        break
    if removed:
        more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
        raise UnsupportedOpError(
            f"{source}: " + "; ".join(removed[:5]) + more,
            hint="re-export the model with the op's replacement, or for an opset before the op was removed",
        )
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ModelFileError(
            f"{source}: " + "; ".join(bad[:5]) + more,
            hint="the model is malformed: fix or re-export it (onnx.checker.check_model reports the same)",
        )


def select_outputs(graph: Graph, out_nodes: list[str], onnx_nodes: dict[str, Node], source: str) -> None:
    """Make the values named by ``out_nodes`` the graph outputs (ATC's --out_nodes)."""
    vmap = graph.value_map()
    chosen: list[Value] = []
    for spec in out_nodes:
        spec = str(spec).strip()
        v = vmap.get(spec)
        if v is None:
            name, sep, idx = spec.rpartition(":")
            node = None
            index = 0
            if sep and idx.strip().isdigit():
                node = onnx_nodes.get(name) or graph.find_node(name)
                index = int(idx)
            else:
                node = onnx_nodes.get(spec) or graph.find_node(spec)
            if node is not None:
                if index >= len(node.outputs):
                    raise OptionError(
                        f"out_nodes '{spec}': node '{node.name}' ({node.op_type}) has only {len(node.outputs)} output(s)"
                    )
                v = node.outputs[index]
        if v is None:
            candidates = list(vmap) + list(onnx_nodes)
            raise OptionError(
                f"out_nodes '{spec}' names no tensor or node of {source}{close_matches(spec, candidates)}",
                hint="use a tensor name or ATC's node_name:output_index",
            )
        chosen.append(v)
    graph.set_outputs(chosen)


#: Most nodes the model-local functions of one model may inline into (over the whole graph,
#: every subgraph included). A few KB of functions that call each other twice per level expand into
#: billions of nodes, which would exhaust memory inside onnx.inliner.
MAX_INLINED_NODES = 1_000_000


def inlined_node_count(model, name: str, limit: int = MAX_INLINED_NODES) -> int:
    """The number of nodes ``model`` has once its local functions are inlined, computed without
    inlining: per function, bottom-up over the call graph, each function counted once. Raises a
    ModelFileError naming the function and its count when the model passes ``limit``, and when
    functions call each other in a cycle (no finite inlining exists)."""
    funcs = {_function_key(f): f for f in model.functions}

    def tally(nodes) -> tuple[int, collections.Counter]:
        """(nodes that stay nodes, calls of local functions by key) of a node list and its subgraphs."""
        own, calls = 0, collections.Counter[tuple]()
        stack = [nodes]
        while stack:
            for nd in stack.pop():
                key = (nd.domain, nd.op_type, getattr(nd, "overload", ""))
                if key in funcs:
                    calls[key] += 1
                else:
                    own += 1
                for a in nd.attribute:
                    stack.extend(g.node for g in ([a.g] if a.HasField("g") else []) + list(a.graphs))
        return own, calls

    parts = {key: tally(f.node) for key, f in funcs.items()}
    sizes: dict[tuple, int] = {}
    for root in parts:  # iterative post-order over the call graph, with cycle detection
        if root in sizes:
            continue
        path, on_path = [(root, iter(parts[root][1]))], {root}
        while path:
            key, callees = path[-1]
            nxt = next((c for c in callees if c not in sizes), None)
            if nxt is None:
                own, calls = parts[key]
                sizes[key] = own + sum(k * sizes[c] for c, k in calls.items())
                path.pop()
                on_path.discard(key)
            elif nxt in on_path:
                cycle = [k for k, _ in path][[k for k, _ in path].index(nxt):] + [nxt]
                raise ModelFileError(
                    f"{name}: local function {_function_label(nxt)} calls itself "
                    f"({' -> '.join(_function_label(k) for k in cycle)})",
                    hint="recursive functions cannot be inlined into a finite graph; fix the model",
                )
            else:
                path.append((nxt, iter(parts[nxt][1])))
                on_path.add(nxt)
    own, calls = tally(model.graph.node)
    added = sum(k * sizes[c] for c, k in calls.items())
    total = own + added
    if added > limit:
        worst = max(calls, key=lambda c: calls[c] * sizes[c])
        raise ModelFileError(
            f"{name}: inlining its local functions would make {total:,} nodes ({added:,} from the functions, "
            f"the limit is {limit:,}); "
            f"local function {_function_label(worst)} alone expands into {sizes[worst]:,} nodes"
            + (f" and is called {calls[worst]} times" if calls[worst] > 1 else ""),
            hint="the model would not fit in memory: inline or simplify its functions before compiling",
        )
    return total


def _function_key(f) -> tuple[str, str, str]:
    return (f.domain, f.name, getattr(f, "overload", ""))


def _function_label(key: tuple[str, str, str]) -> str:
    dom, fname, overload = key
    return f"'{dom + '::' if dom else ''}{fname}{':' + overload if overload else ''}'"


def _inline_functions(model, name: str):
    """A copy of ``model`` with its model-local functions inlined (the original is untouched).

    The inlined size is bounded first (:func:`inlined_node_count`): ``onnx.inliner`` itself
    would try to build every node of an exponentially expanding model.
    """
    inlined_node_count(model, name)
    try:
        from onnx import inliner

        return inliner.inline_local_functions(model)
    except Exception as e:
        raise ModelFileError(
            f"cannot inline the local functions of {name}: {type(e).__name__}: {e}",
            hint="inline them before compiling (onnx.inliner.inline_local_functions)",
        ) from None


class OnnxFrontend(Frontend):
    """Reads ONNX models (``.onnx`` files, ``onnx.ModelProto`` objects or serialized bytes)."""

    name = "onnx"
    framework_ids = (5,)
    suffixes = (".onnx",)

    def accepts_object(self, obj: Any) -> bool:
        try:
            import onnx
        except ImportError:
            return False
        return isinstance(obj, onnx.ModelProto)

    def sniff(self, path: str, head: bytes) -> bool:
        ext = os.path.splitext(path)[1].lower()
        if ext in self.suffixes:
            return True
        if ext in _OTHER_FORMATS:
            return False
        # A ModelProto starts with field 1 (ir_version, varint: 0x08) holding 3..20, then
        # producer_name (0x12), producer_version (0x1a), domain (0x22), model_version (0x28),
        # doc_string (0x32), graph (0x3a) or opset_import (0x42).
        return (len(head) >= 4 and head[0] == 0x08 and 3 <= head[1] <= 20
                and head[2] in (0x12, 0x1a, 0x22, 0x28, 0x32, 0x3a, 0x42))

    def load(self, source: Any, options=None) -> Graph:
        model, name, base_dir = read_model(source)
        input_shape = dict(options.getoption("input_shape", {}) if options is not None else {})
        out_nodes = list(options.getoption("out_nodes", []) if options is not None else [])
        try:
            graph = self._build(model, name, base_dir, input_shape, out_nodes)
        except GraphError as e:
            # the IR refused what the file describes (duplicate value names, a cycle...)
            raise ModelFileError(f"{name}: {e.detail}",
                                 hint="the model is malformed; onnx.checker.check_model may say more") from e
        except GEError:
            raise
        except Exception as e:
            raise ModelFileError(
                f"cannot build a graph from {name}: {type(e).__name__}: {e}",
                hint="the model is malformed; onnx.checker.check_model may say more",
            ) from e
        from ge_core.plugins import registries

        check_ops(graph, registries().ops, name)
        return graph

    def _build(self, model, name: str, base_dir: str | None, input_shape, out_nodes) -> Graph:
        _check_text_fields(model, name)
        functions = [f"{f.domain}::{f.name}" for f in model.functions]
        if functions:
            model = _inline_functions(model, name)
        b = _Builder(model, name, base_dir)
        graph = b.build_graph(model.graph, None, None, "graph", input_shape=input_shape)
        ops: dict[str, int] = {}
        for o in model.opset_import:
            ops[_norm_domain(o.domain)] = int(o.version)
        graph.opset_imports.clear()
        graph.opset_imports.update(ops)
        graph.metadata.update(
            {
                "source": name,
                "framework": "onnx",
                "ir_version": int(model.ir_version),
                "producer_name": model.producer_name,
                "producer_version": model.producer_version,
                "model_domain": model.domain,
                "model_version": int(model.model_version),
                "doc_string": model.doc_string,
                "metadata_props": {p.key: p.value for p in model.metadata_props},
            }
        )
        if functions:
            graph.metadata["inlined_functions"] = functions
        if out_nodes:
            select_outputs(graph, out_nodes, b.onnx_node_names, name)
        return graph

    def export(self, graph: Graph, path: str | None = None) -> Any:
        from .exporter import export_onnx, save_onnx

        model = export_onnx(graph)
        if path is not None:
            save_onnx(model, path)
        return model
