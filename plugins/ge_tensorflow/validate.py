"""Checks of a GraphDef before TensorFlow's importer and grappler see it.

TensorFlow trusts the GraphDefs it reads: some corrupt ones abort the process (``CHECK``
failures in shape functions and grappler), crash it (a segfault in the importer) or make it
allocate terabytes (a constant that claims a huge shape and holds one value, which TensorFlow
repeats). The frontend refuses those first, with a :class:`ModelFileError` that names the file,
the node and its op:

* :func:`check_graph_def` (on the protobuf, main graph and function library): a tensor
  reference whose output index does not fit TensorFlow's int32 (the importer wraps it to a
  negative index and segfaults); a ``Const`` whose value's dtype is not its ``dtype`` attribute
  (shape functions that read the value abort); tensors of an invalid or reference dtype, of an
  unknown or negative shape, larger than :data:`MAX_CONST_BYTES`, or whose values or
  ``tensor_content`` do not fit their shape (``tf.make_ndarray`` fails); shapes in attributes,
  and constant shape operands, of more than :data:`MAX_SHAPE_ELEMENTS` elements or
  :data:`MAX_RANK` dims (shape inference multiplies dims unchecked and aborts); a Range of
  constants longer than a constant may be (shape inference evaluates it);
* :func:`check_unsupported_attrs`: what the mappers refuse anyway and a shape function aborts on
  (GatherV2's ``batch_dims``), before TensorFlow sees it;
* :func:`check_functions`: every function of the library must build (TensorFlow checks the
  bodies only when it runs them; grappler trusts them and aborts on a node without a required
  attribute);
* :func:`check_static_sizes` (on the imported ``tf.Graph``, before grappler): a tensor whose
  static shape needs more than :data:`MAX_TENSOR_BYTES` (grappler's element counts overflow and
  abort), or a tensor computed from constants and static shapes only -- one that grappler
  evaluates while it folds constants -- larger than :data:`MAX_CONST_BYTES`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ge_core.errors import ModelFileError
from ge_core.memory import MAX_ARENA_BYTES

#: Largest constant, or tensor computed from constants only, the frontend accepts (1 GiB):
#: TensorFlow's grappler and the frontend materialize them while a model loads. A frozen
#: GraphDef is a protobuf (under 2 GiB), so only a one-value "splat" can claim more.
MAX_CONST_BYTES = 1 << 30
#: Largest tensor a static shape may describe: no memory arena can hold more (256 TiB).
MAX_TENSOR_BYTES = MAX_ARENA_BYTES
#: Output indices in tensor references are int32 in TensorFlow.
MAX_OUTPUT_INDEX = 2**31 - 1
#: Most elements a shape given by an attribute or a constant shape operand may describe (4 Ti):
#: TensorFlow's shape inference multiplies such dims unchecked and aborts on an overflow.
MAX_SHAPE_ELEMENTS = 1 << 40
#: TensorFlow's largest rank (TensorShape aborts beyond it).
MAX_RANK = 254
#: Input names (in TensorFlow's op definitions) of operands whose values become dims.
_SHAPE_ARGS = {"shape", "dims", "element_shape", "size", "sizes", "input_sizes", "filter_sizes", "dense_shape",
               "output_shape", "new_shape", "multiples", "paddings", "block_shape", "num_elements",
               "max_num_elements", "num_segments", "depth"}
#: Ops whose value depends only on the static shape of their input (grappler folds them).
_SHAPE_ONLY = {"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike"}
#: Ops that never fold, whatever their inputs.
_NEVER_FOLDED = {"Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "Variable"}
#: Sub-byte types whose tensor_content TensorFlow may pack (not checked against the shape).
_PACKED = {"int4", "uint4", "int2", "uint2", "float4_e2m1fn"}
_CONST_OPS = {"Const", "HostConst"}
#: dtype name -> (the TensorProto field holding its values, entries per element)
_VALUE_FIELDS = {
    "float32": ("float_val", 1), "float64": ("double_val", 1), "int64": ("int64_val", 1), "bool": ("bool_val", 1),
    "string": ("string_val", 1), "float16": ("half_val", 1), "bfloat16": ("half_val", 1),
    "complex64": ("scomplex_val", 2), "complex128": ("dcomplex_val", 2), "uint32": ("uint32_val", 1),
    "uint64": ("uint64_val", 1), **{k: ("int_val", 1) for k in ("int32", "int16", "int8", "uint8", "uint16", "qint8",
                                                                 "quint8", "qint16", "quint16", "qint32")},
}


def _fail(source: str, where: str, node, message: str, hint: str) -> None:
    raise ModelFileError(f"{source}: {where}node '{node.name}' ({node.op or 'no op'}) {message}", hint=hint)


_CORRUPT = "the GraphDef is corrupt; re-export the frozen graph from the original model"


def graph_nodes(gd) -> Iterator[tuple[str, Any]]:
    """``(where, node)`` for every node of ``gd``'s main graph (``where`` is ``""``) and of its
    function library (``where`` is ``"function 'f': "``, to prefix messages)."""
    for n in gd.node:
        yield "", n
    for f in gd.library.function:
        for n in f.node_def:
            yield f"function '{f.signature.name}': ", n


def _dtype(enum: int):
    """The tf.DType of a DataType enum value, or None when it is invalid or a reference type."""
    from tensorflow.python.framework import dtypes

    if enum <= 0 or enum >= 100:
        return None
    try:
        return dtypes.as_dtype(enum)
    except TypeError:
        return None


def check_graph_def(gd, source: str) -> None:
    """Refuse (ModelFileError) what makes TensorFlow's importer or grappler crash or blow up."""
    for where, n in graph_nodes(gd):
        for ref in n.input:
            _check_reference(source, where, n, ref)
        for key in sorted(n.attr):
            a = n.attr[key]
            which = a.WhichOneof("value")
            if which == "tensor":
                _check_tensor(source, where, n, key, a.tensor)
            elif which == "shape":
                _check_shape_attr(source, where, n, key, a.shape)
            elif which == "list":
                for t in a.list.tensor:
                    _check_tensor(source, where, n, key, t)
                for sp in a.list.shape:
                    _check_shape_attr(source, where, n, key, sp)
        if n.op in _CONST_OPS and "value" in n.attr and "dtype" in n.attr:
            value, dtype = n.attr["value"], n.attr["dtype"]
            if value.HasField("tensor") and dtype.WhichOneof("value") == "type" and value.tensor.dtype != dtype.type:
                _fail(source, where, n, f"holds a value of dtype {_name(value.tensor.dtype)} but declares dtype "
                      f"{_name(dtype.type)}", _CORRUPT)
    for f in gd.library.function:
        for key in sorted(f.ret):
            _check_index(source, f"function '{f.signature.name}' returns '{key}' as '{f.ret[key]}'", f.ret[key])
    _check_shape_operands(source, "", gd.node)
    for f in gd.library.function:
        _check_shape_operands(source, f"function '{f.signature.name}': ", f.node_def)


def _span(dims) -> int:
    """Elements a shape describes; unknown (-1) and zero dims count as 1 (they must not hide others)."""
    span = 1
    for d in dims:
        span *= max(int(d), 1)
    return span


def _check_shape_attr(source: str, where: str, n, key: str, sp) -> None:
    if len(sp.dim) > MAX_RANK:
        _fail(source, where, n, f"attribute '{key}' gives a shape of rank {len(sp.dim)}: more than the {MAX_RANK} "
              "dims TensorFlow allows", "the model is corrupt or hostile")
    if not sp.unknown_rank and _span(d.size for d in sp.dim) > MAX_SHAPE_ELEMENTS:
        _fail(source, where, n, f"attribute '{key}' gives the shape {[int(d.size) for d in sp.dim]}: more than "
              f"{MAX_SHAPE_ELEMENTS} elements", "the model is corrupt or hostile")


def _input_args(n) -> list[str] | None:
    """The op-definition name of each data input of ``n`` (None where the op or a count is unknown)."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(n.op)
    if op_def is None:
        return None
    names: list[str] = []
    for arg in op_def.input_arg:
        if arg.number_attr:
            a = n.attr.get(arg.number_attr)
            if a is None or a.WhichOneof("value") != "i" or not 0 <= a.i <= 1 << 16:
                return names
            names += [arg.name] * int(a.i)
        elif arg.type_list_attr:
            a = n.attr.get(arg.type_list_attr)
            if a is None:
                return names
            names += [arg.name] * len(a.list.type)
        else:
            names.append(arg.name)
    return names


def _const_operand(by_name: dict, ref: str):
    """The Const node that the input reference ``ref`` reads (through Identity chains), or None."""
    src = by_name.get(ref.split(":")[0])
    for _ in range(8):
        if src is None or src.op not in ("Identity", "Snapshot") or not src.input:
            break
        src = by_name.get(src.input[0].split(":")[0])
    if src is None or src.op not in _CONST_OPS or not src.attr["value"].HasField("tensor"):
        return None
    return src


def _values(t, at_most: int) -> list | None:
    """The values of a small numeric TensorProto (checked by :func:`_check_tensor` already)."""
    import numpy as np
    from tensorflow.python.framework import tensor_util

    if _span(d.size for d in t.tensor_shape.dim) > at_most:
        return None
    try:
        arr = np.asarray(tensor_util.MakeNdarray(t)).reshape(-1)
    except Exception:  # noqa: BLE001 - TensorFlow's importer reports a malformed tensor itself
        return None
    return arr.tolist() if arr.dtype.kind in "iuf" else None


def _check_shape_operands(source: str, where: str, nodes) -> None:
    """Constant operands that TensorFlow's shape functions read as dims must describe a sane shape,
    and a Range of constants (which its shape inference evaluates) must be of a sane length."""
    by_name = {n.name: n for n in nodes}
    for n in nodes:
        data = [ref for ref in n.input if not ref.startswith("^")]
        if not data:
            continue
        if n.op == "Range" and len(data) == 3:
            _check_range(source, where, n, [_const_operand(by_name, ref) for ref in data])
            continue
        args = _input_args(n)
        if not args:
            continue
        for ref, arg in zip(data, args):
            if arg not in _SHAPE_ARGS:
                continue
            src = _const_operand(by_name, ref)
            if src is None or src.attr["value"].tensor.dtype not in (3, 9):  # int32, int64
                continue
            t = src.attr["value"].tensor
            rank = _span(d.size for d in t.tensor_shape.dim) // (2 if arg == "paddings" else 1)
            if rank > MAX_RANK:
                _fail(source, where, n, f"reads its '{arg}' from constant '{src.name}', a shape of rank {rank}: more "
                      f"than the {MAX_RANK} dims TensorFlow allows", "the model is corrupt or hostile")
            values = _values(t, 2 * MAX_RANK)
            if values is not None and _span(values) > MAX_SHAPE_ELEMENTS:
                _fail(source, where, n, f"reads its '{arg}' from constant '{src.name}' = {values}: a "
                      f"shape of more than {MAX_SHAPE_ELEMENTS} elements", "the model is corrupt or hostile")


def _check_range(source: str, where: str, n, consts: list) -> None:
    import math

    if any(c is None for c in consts):
        return
    vals = [_values(c.attr["value"].tensor, 1) for c in consts]
    if any(not v for v in vals):
        return
    start, limit, delta = (v[0] for v in vals)  # type: ignore[index]
    if not delta or not all(math.isfinite(x) for x in (start, limit, delta)):
        return  # TensorFlow's shape function refuses these itself
    size = max(math.ceil((limit - start) / delta), 0)
    dt = _dtype(n.attr["Tidx"].type) if "Tidx" in n.attr else None
    itemsize = max(int(dt.size), 1) if dt is not None else 4
    if size * itemsize > MAX_CONST_BYTES:
        _fail(source, where, n, f"computes a tensor of {size} elements from constants only (start {start}, limit "
              f"{limit}, delta {delta}): more than the {MAX_CONST_BYTES} bytes a constant may have",
              "the model is corrupt or hostile")


def check_unsupported_attrs(gd, source: str) -> None:
    """Refuse, before TensorFlow imports the graph, what the mappers refuse anyway and TensorFlow's
    shape functions abort on: a ``batch_dims`` of GatherV2 beyond the ranks of its operands
    (a negative rank reaches a CHECK). The mapper supports ``batch_dims`` = 0 only."""
    from ge_core.errors import UnsupportedOpError

    for where, n in graph_nodes(gd):
        if n.op in ("GatherV2", "ResourceGather") and "batch_dims" in n.attr:
            bd = n.attr["batch_dims"]
            if bd.WhichOneof("value") == "i" and bd.i != 0:
                raise UnsupportedOpError(
                    f"{source}: {where}TensorFlow node '{n.name}' ({n.op}) uses batch_dims={bd.i}, which is not supported",
                    hint="freeze/simplify the model or register a mapper for this case with ge_register_op_mappers",
                )


def check_functions(gd, source: str) -> None:
    """Build every function of the library, as TensorFlow's importer checks the main graph.

    TensorFlow imports the bodies of functions unchecked; grappler then trusts them (a body node
    without a required attribute aborts its shape inference). Run with the imported main graph
    as the default graph (so that calls of one library function by another resolve).
    """
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    for f in gd.library.function:
        try:
            function_def_to_graph(f)
        except RecursionError:
            raise ModelFileError(f"{source}: function '{f.signature.name}' is nested too deeply") from None
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ModelFileError(
                f"{source}: function '{f.signature.name}' of the graph's library is invalid: {type(e).__name__}: {first}",
                hint=_CORRUPT,
            ) from None


def _name(enum: int) -> str:
    from tensorflow.core.framework import types_pb2

    try:
        return types_pb2.DataType.Name(enum)
    except ValueError:
        return f"#{enum}"


def _check_reference(source: str, where: str, n, ref: str) -> None:
    last = ref.rsplit(":", 1)[-1] if ":" in ref else ""
    if last.isdigit() and int(last) > MAX_OUTPUT_INDEX:
        _fail(source, where, n, f"reads '{ref}': output index {last} is out of range (at most {MAX_OUTPUT_INDEX})",
              _CORRUPT)


def _check_index(source: str, what: str, ref: str) -> None:
    last = ref.rsplit(":", 1)[-1] if ":" in ref else ""
    if last.isdigit() and int(last) > MAX_OUTPUT_INDEX:
        raise ModelFileError(f"{source}: {what}: output index {last} is out of range", hint=_CORRUPT)


def _check_tensor(source: str, where: str, n, key: str, t) -> None:
    what = f"attribute '{key}'"
    dt = _dtype(t.dtype)
    if dt is None:
        _fail(source, where, n, f"{what} holds a tensor of invalid dtype {_name(t.dtype)}", _CORRUPT)
    sp = t.tensor_shape
    if sp.unknown_rank:
        _fail(source, where, n, f"{what} holds a tensor of unknown rank", _CORRUPT)
    dims = [int(d.size) for d in sp.dim]
    if any(d < 0 for d in dims):
        _fail(source, where, n, f"{what} holds a tensor with a negative dim (shape {dims})", _CORRUPT)
    numel = 1
    for d in dims:
        numel *= d
    span = _span(dims)  # a zero dim must not hide absurd others (TensorFlow multiplies them first)
    itemsize = max(int(dt.size), 1)
    if span * itemsize > MAX_CONST_BYTES:
        _fail(source, where, n,
              f"{what} holds a tensor of shape {dims} ({dt.name}): {span * itemsize} bytes, more than the "
              f"{MAX_CONST_BYTES} bytes a constant may have", "the model is corrupt or hostile")
    field = _VALUE_FIELDS.get(dt.name)
    if field is not None and not t.tensor_content:
        count = len(getattr(t, field[0])) // field[1]
        if count > numel:
            _fail(source, where, n, f"{what} holds {count} values for a tensor of shape {dims} ({dt.name}, "
                  f"{numel} elements)", _CORRUPT)
    content = t.tensor_content
    if content and dt.size and dt.name not in _PACKED and len(content) != numel * dt.size:
        _fail(source, where, n, f"{what} holds {len(content)} bytes for a tensor of shape {dims} ({dt.name}, "
              f"{numel * dt.size} bytes)", _CORRUPT)


def check_static_sizes(g, source: str) -> None:
    """Refuse tensors of the imported ``tf.Graph`` ``g`` too large to fold or to hold.

    Runs before grappler, which evaluates the tensors computed from constants and static shapes
    (and aborts when an element count overflows).
    """
    foldable: dict[Any, bool] = {}
    for op in g.get_operations():
        if op.type in _NEVER_FOLDED:
            fold = False
        elif op.type in _CONST_OPS or op.type in _SHAPE_ONLY:
            fold = True
        else:
            fold = bool(op.inputs) and all(foldable.get(t.op, False) for t in op.inputs)
        foldable[op] = fold
        for t in op.outputs:
            try:
                dims = t.shape.as_list() if t.shape.rank is not None else None
                itemsize = max(int(t.dtype.size), 1)
            except (ValueError, TypeError):
                continue
            if not dims:
                continue
            known = 1
            for d in dims:
                known *= max(d, 1) if d is not None else 1
            nbytes = known * itemsize
            if nbytes > MAX_TENSOR_BYTES:
                raise ModelFileError(
                    f"{source}: node '{op.name}' ({op.type}) makes a tensor of shape {dims} ({t.dtype.name}): "
                    f"at least {nbytes} bytes, more than any memory arena holds ({MAX_TENSOR_BYTES})",
                    hint="the model is corrupt or hostile, or input_shape gives absurd sizes",
                )
            if fold and None not in dims and nbytes > MAX_CONST_BYTES:
                raise ModelFileError(
                    f"{source}: node '{op.name}' ({op.type}) computes a tensor of shape {dims} ({t.dtype.name}) "
                    f"from constants only: {nbytes} bytes, more than the {MAX_CONST_BYTES} bytes a constant may have",
                    hint="the model is corrupt or hostile; compute such tensors from a model input instead",
                )
