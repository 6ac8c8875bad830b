"""Graph <-> JSON-able dict plus a list of weight arrays; strict validation when reading.

The dict never holds tensor bytes: constants and tensor attributes refer to entries of a
weights table (index, dtype, shape, offset, nbytes) whose bytes live in one blob, so the .om
loader can map them without copying. Reading checks every field before anything is built:
a hostile file gets :class:`OmFormatError`, never a crash.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from .errors import GEError, GraphError, OmFormatError
from .ir.graph import Graph, Value
from .ir.symbolic import SymExpr, from_json, to_json
from .ir.types import TensorType, dtype_name, parse_dtype
from .memory import MAX_ARENA_BYTES
from .om_container import MAX_PARTITIONS

FORMAT_VERSION = 1
WEIGHT_ALIGNMENT = 64


@dataclass(frozen=True)
class OmLimits:
    """What an .om may hold. One table for both ends: the writer refuses a model beyond a limit
    (a :class:`GraphError` naming it), the reader refuses a file beyond it (:class:`OmFormatError`),
    so no file the writer produces is refused by the reader."""

    #: Subgraphs inside subgraphs (If/Loop bodies): the top graph is depth 0.
    subgraph_depth: int = 32
    #: Nesting of the JSON model definition (objects and arrays); 32 subgraph levels need ~200.
    json_depth: int = 256
    #: Every JSON integer is an int64.
    int_min: int = -(2**63)
    int_max: int = 2**63 - 1
    #: Names of values, nodes, ops and graphs (characters).
    name_length: int = 4096
    rank: int = 64
    #: A static dim; a symbolic dim is a name of 1..symbol_length characters.
    dim: int = 2**62
    symbol_length: int = 256
    opset_version: int = 10**6
    #: Stream ids are 0 .. streams - 1.
    streams: int = 1024
    #: The model definition partition (UTF-8 JSON), bytes.
    model_json_bytes: int = 1 << 30
    #: Largest single constant, in stored bytes (a splat, one value broadcast to a shape,
    #: stores one element).
    weight_bytes: int = 1 << 34
    #: Largest element count a constant may claim (a broadcast view from folding can claim
    #: terabytes). Zero dims count as 1, so that they cannot hide absurd other dims.
    weight_elements: int = 1 << 40
    #: Arena of the memory plan, bytes (exclusive).
    arena_bytes: int = MAX_ARENA_BYTES
    #: Partitions of the container (see :mod:`ge_core.om_container`).
    partitions: int = MAX_PARTITIONS


LIMITS = OmLimits()
_METADATA_LIMITS = OmLimits(json_depth=LIMITS.json_depth - 8)

MAX_RANK = LIMITS.rank
MAX_NAME = LIMITS.name_length
MAX_WEIGHT_BYTES = LIMITS.weight_bytes
MAX_WEIGHT_ELEMENTS = LIMITS.weight_elements


def weight_span(shape) -> int:
    """The element count :data:`MAX_WEIGHT_ELEMENTS` limits: the product of the dims, 0 as 1."""
    span = 1
    for d in shape:
        span *= max(int(d), 1)
    return span


class _JsonLimit(ValueError):
    """A number in the JSON text that an .om never holds (raised from the parser's hooks)."""


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > 19:  # before int(): a 10**6-digit literal costs seconds
        raise _JsonLimit(f"an integer of {len(s)} digits is outside int64")
    v = int(s)
    if not LIMITS.int_min <= v <= LIMITS.int_max:
        raise _JsonLimit(f"integer {s} is outside int64")
    return v


def _parse_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise _JsonLimit(f"number {s[:40]} is out of range")
    return v


def _parse_constant(s: str) -> NoReturn:
    raise _JsonLimit(f"{s} is not a JSON number")


def _json_path(where: Any) -> str:
    keys = []
    while where is not None:
        where, k = where
        keys.append(f"[{k}]" if isinstance(k, int) else f".{k}")
    return "$" + "".join(reversed(keys))


def json_problem(obj: Any, limits: OmLimits = LIMITS) -> str | None:
    """How ``obj`` (a model definition to write, or one just read) breaks the JSON limits of an
    .om, as ``"$.path: what"``, or None. Iterative, so any nesting is measured, not recursed."""
    stack: list[tuple[Any, int, Any]] = [(obj, 1, None)]
    while stack:
        x, depth, where = stack.pop()
        if x is None or isinstance(x, (bool, np.bool_, str)):
            continue
        if isinstance(x, (int, np.integer)):
            if not limits.int_min <= int(x) <= limits.int_max:
                return (f"{_json_path(where)}: an integer of {int(x).bit_length()} bits is outside int64 "
                        "(limits int_min, int_max)")
            continue
        if isinstance(x, (float, np.floating)):
            if not math.isfinite(x):
                return f"{_json_path(where)}: {x} is not a finite number (JSON has no NaN or infinity)"
            continue
        if isinstance(x, (dict, list, tuple, set)):
            if depth > limits.json_depth:
                return f"{_json_path(where)}: nested more than {limits.json_depth} deep (limit json_depth)"
            if isinstance(x, dict):
                for k, v in x.items():
                    if not isinstance(k, str):
                        return f"{_json_path(where)}: key {str(k)[:40]!r} is not a string"
                    stack.append((v, depth + 1, (where, k)))
            else:
                for i, v in enumerate(x):
                    stack.append((v, depth + 1, (where, i)))
            continue
        return f"{_json_path(where)}: a {type(x).__name__} is not a JSON value"
    return None


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


def dump_definition(d: Any, where: str) -> bytes:
    """The UTF-8 JSON of a model definition; GraphError (naming the limit) for what the reader
    of :func:`load_definition` would refuse."""
    problem = json_problem(d)
    if problem:
        raise GraphError(f"cannot save {where}: {problem}",
                         hint="a node attribute, metadata entry or option holds a value an .om cannot store")
    try:
        blob = json.dumps(d, separators=(",", ":"), allow_nan=False, default=_json_default).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:
        raise GraphError(f"cannot serialise the model for {where}: {e}",
                         hint="a node attribute, metadata entry or option holds a value an .om cannot store") from e
    if len(blob) > LIMITS.model_json_bytes:
        raise GraphError(f"cannot save {where}: the model definition is {len(blob)} bytes of JSON, more than the "
                         f"{LIMITS.model_json_bytes} an .om holds (limit model_json_bytes)",
                         hint="large tensors belong in constants (stored as weights), not in attributes or metadata")
    return blob


def load_definition(raw: bytes | memoryview, where: str) -> Any:
    """Parse the JSON of a model definition; anything beyond the limits is an OmFormatError."""
    hint = "the file is corrupted or was not written by ge; re-create it with `ge compile`"
    if len(raw) > LIMITS.model_json_bytes:
        raise OmFormatError(f"{where}: the model definition is larger than {LIMITS.model_json_bytes} bytes "
                            f"(limit model_json_bytes)", hint=hint)
    try:
        d = json.loads(bytes(raw).decode("utf-8"), parse_int=_parse_int, parse_float=_parse_float,
                       parse_constant=_parse_constant)
    except _JsonLimit as e:
        raise OmFormatError(f"{where}: the model definition holds a value no .om holds: {e}", hint=hint) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise OmFormatError(f"{where}: the model definition is not valid JSON ({type(e).__name__})", hint=hint) from None
    problem = json_problem(d)
    if problem:
        raise OmFormatError(f"{where}: the model definition is invalid: {problem}", hint=hint)
    return d


_ALLOWED_DTYPES = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "bfloat16", "string",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "int4", "uint4",
}


class WeightWriter:
    """Collects arrays and assigns each an aligned offset in one blob."""

    def __init__(self, alignment: int = WEIGHT_ALIGNMENT) -> None:
        self.alignment = alignment
        self.arrays: list[np.ndarray] = []
        self.table: list[dict[str, Any]] = []
        self.size = 0
        self._ids: dict[int, int] = {}

    def add(self, a: np.ndarray, what: str = "a constant") -> int:
        key = id(a)
        if key in self._ids and self.arrays[self._ids[key]] is a:
            return self._ids[key]
        idx = len(self.table)
        if a.ndim > LIMITS.rank:
            raise GraphError(f"{what} has rank {a.ndim}; an .om holds tensors of rank up to {LIMITS.rank} (limit rank)")
        entry: dict[str, Any] = {"dtype": dtype_name(a.dtype), "shape": [int(d) for d in a.shape]}
        if a.dtype != np.dtype(object):
            is_splat = a.ndim > 0 and a.size > 1 and all(st == 0 for st in a.strides)
            stored = a.dtype.itemsize if is_splat else a.nbytes
            if stored > MAX_WEIGHT_BYTES or weight_span(a.shape) > MAX_WEIGHT_ELEMENTS:
                raise GraphError(
                    f"{what} of shape {list(a.shape)} ({dtype_name(a.dtype)}) is too large for an .om: "
                    f"{stored} bytes stored (at most {MAX_WEIGHT_BYTES}), {weight_span(a.shape)} elements "
                    f"(at most {MAX_WEIGHT_ELEMENTS}; limits weight_bytes, weight_elements)",
                    hint="fix the model: no constant this large can be stored (constant folding never makes one)",
                )
        if a.dtype == np.dtype(object):
            entry["strings"] = [_str(x) for x in a.reshape(-1).tolist()]
            self.arrays.append(a)
        else:
            if a.ndim and a.size > 1 and all(st == 0 for st in a.strides):
                # one value broadcast to a shape (folded ConstantOfShape...): store the value once
                entry["splat"] = True
                a = a.reshape(-1)[:1]
            a = np.ascontiguousarray(a)
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            off = (self.size + self.alignment - 1) // self.alignment * self.alignment
            entry["offset"], entry["nbytes"] = off, int(a.nbytes)
            self.size = off + a.nbytes
            self.arrays.append(a)
        self.table.append(entry)
        self._ids[key] = idx
        return idx

    def chunks(self):
        """Buffer chunks of the blob (padding included), for streaming to a file."""
        pos = 0
        for entry, a in zip(self.table, self.arrays):
            if "offset" not in entry:
                continue
            if entry["offset"] > pos:
                yield bytes(entry["offset"] - pos)
            if a.nbytes:
                # the bytes themselves: memoryview cannot export ml_dtypes' types (bfloat16, float8)
                yield memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) if a.ndim else a.tobytes()
            pos = entry["offset"] + a.nbytes


def _str(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------
def graph_to_dict(graph: Graph, weights: WeightWriter, depth: int = 0) -> dict[str, Any]:
    """The JSON-able form of ``graph``; GraphError, naming the limit, for what no .om holds
    (see :class:`OmLimits`: the reader refuses exactly that)."""
    if depth > LIMITS.subgraph_depth:
        raise GraphError(
            f"subgraph '{graph.name}' is nested {depth} levels deep; an .om holds at most "
            f"{LIMITS.subgraph_depth} levels of nested subgraphs (limit subgraph_depth)",
            hint="flatten the nested control flow (If/Loop inside If/Loop) of the model",
        )
    where = f"graph '{graph.name[:80]}'"

    def vtype(t: TensorType, what: str) -> dict[str, Any]:
        if t.shape is not None:
            _check_shape(t.shape, what)
        return {"dtype": None if t.dtype is None else dtype_name(t.dtype),
                "shape": None if t.shape is None else [to_json(d) if isinstance(d, SymExpr) else d for d in t.shape]}

    def value(v) -> dict[str, Any]:
        return {"name": _check_name(v.name, f"value '{v.name[:80]}' of {where}"), **vtype(v.type, f"value '{v.name[:80]}'")}

    if len(graph.name) > LIMITS.name_length:
        _check_name(graph.name, where)
    d: dict[str, Any] = {
        "name": graph.name,
        "inputs": [value(v) if v.default is None else  # an input that may be left unfed keeps its default
                   {**value(v), "default": weights.add(v.default, f"default of input '{v.name}'")}
                   for v in graph.inputs],
        "constants": [{"name": _check_name(v.name, f"constant of {where}"),
                       "weight": weights.add(_const(v), f"constant '{v.name}'")}
                      for v in graph.constants.values()],
        "nodes": [],
        "outputs": [v.name for v in graph.outputs],
    }
    if graph.parent is None:
        for dom, ver in graph.opset_imports.items():
            if isinstance(ver, bool) or not isinstance(ver, (int, np.integer)) or not 0 <= ver <= LIMITS.opset_version:
                raise GraphError(f"{where} imports opset {dom!r} version {ver!r}; an .om holds versions 0.."
                                 f"{LIMITS.opset_version} (limit opset_version)")
        d["opset_imports"] = {str(k): int(v) for k, v in graph.opset_imports.items()}
        d["metadata"] = {k: v for k, v in graph.metadata.items() if isinstance(k, str) and _jsonable(v)}
    for n in graph.nodes:
        what = f"node '{n.name[:80]}' of {where}"
        nd: dict[str, Any] = {"op": _check_name(n.op_type, f"op of {what}"), "name": _check_name(n.name, what),
                              "inputs": [None if v is None else v.name for v in n.inputs],
                              "outputs": [value(v) for v in n.outputs]}
        if n.domain:
            nd["domain"] = n.domain
        if n.attrs:
            nd["attrs"] = {k: _enc_attr(a, weights, n, k, depth) for k, a in n.attrs.items()}
        meta = {k: v for k, v in n.meta.items() if isinstance(k, str) and _jsonable(v)}
        if meta:
            nd["meta"] = meta
        d["nodes"].append(nd)
    return d


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name or len(name) > LIMITS.name_length:
        n = len(name) if isinstance(name, str) else 0
        raise GraphError(f"{what}: a name of {n} characters cannot be stored; an .om holds names of 1 to "
                         f"{LIMITS.name_length} characters (limit name_length)", hint="rename it")
    return name


def _check_shape(shape: tuple, what: str) -> None:
    if len(shape) > LIMITS.rank:
        raise GraphError(f"{what} has rank {len(shape)}; an .om holds tensors of rank up to {LIMITS.rank} (limit rank)")
    for dim in shape:
        if dim is None:
            continue
        if isinstance(dim, SymExpr):
            if any(len(x) > LIMITS.symbol_length for x in dim.symbols()):
                raise GraphError(f"{what} has a symbolic dim naming a symbol of more than {LIMITS.symbol_length} "
                                 "characters (limit symbol_length)")
            try:
                from_json(to_json(dim))
            except ValueError as e:
                raise GraphError(f"{what} has a dim expression an .om cannot hold: {e}") from None
        elif isinstance(dim, str):
            if not 0 < len(dim) <= LIMITS.symbol_length:
                raise GraphError(f"{what} has a symbolic dim of {len(dim)} characters; an .om holds names of 1 to "
                                 f"{LIMITS.symbol_length} (limit symbol_length)")
        elif isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 0 <= dim <= LIMITS.dim:
            raise GraphError(f"{what} has dim {str(dim)[:40]}; an .om holds dims 0..{LIMITS.dim} (limit dim)")


def _const(v) -> np.ndarray:
    if v.const_value is None:
        raise GraphError(f"constant '{v.name}' has no value", hint="a pass left the constant empty; report it")
    return v.const_value


def _jsonable(v: Any) -> bool:
    """Metadata an .om keeps (plain JSON within :class:`OmLimits`; the rest is dropped)."""
    if v is None or isinstance(v, (bool, str)):
        return True
    if isinstance(v, (int, float, list, tuple, dict)):
        # depth counted from the metadata entry: the whole definition adds at most 8 levels
        return json_problem(v, _METADATA_LIMITS) is None and _plain(v)
    return False


def _plain(v: Any) -> bool:
    """Only Python's own JSON types (no NumPy scalars, sets), without recursion."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif not (x is None or type(x) in (bool, int, float, str)):
            return False
    return True


def _enc_attr(a: Any, w: WeightWriter, node: Any = None, key: str = "", depth: int = 0) -> dict[str, Any]:
    if isinstance(a, bool):
        return {"bool": a}
    if isinstance(a, (int, np.integer)):
        return {"i": int(a)}
    if isinstance(a, (float, np.floating)):
        return {"f": _enc_float(float(a))}
    if isinstance(a, str):
        return {"s": a}
    if isinstance(a, bytes):
        return {"b": base64.b64encode(a).decode("ascii")}
    if isinstance(a, np.ndarray):
        return {"t": w.add(a, f"attribute '{key}' of {node.describe()}" if node is not None else "a tensor attribute")}
    if isinstance(a, Graph):
        return {"g": graph_to_dict(a, w, depth + 1)}
    if a is None:
        return {"none": True}
    if isinstance(a, (list, tuple)):
        if a and all(isinstance(x, Graph) for x in a):
            return {"gs": [graph_to_dict(x, w, depth + 1) for x in a]}
        return {"list": [_enc_attr(x, w, node, key, depth) for x in a]}
    where = f"attribute '{key}' of {node.describe()}" if node is not None else "an attribute"
    raise GraphError(f"{where} holds a {type(a).__name__}, which an .om cannot store",
                     hint="the plugin that set it should store numbers, strings, arrays or graphs")


def _enc_float(f: float) -> float | str:
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
class GraphReader:
    """Rebuilds graphs from a model definition, validating every field."""

    def __init__(self, table: Any, blob: memoryview | bytes | list, where: str) -> None:
        self.where = where
        #: The weights' bytes: one buffer, or one per part (external weight files, chosen by an
        #: entry's ``"part"``).
        self.parts = list(blob) if isinstance(blob, list) else [blob]
        self.blob = self.parts[0] if self.parts else b""
        if not isinstance(table, list):
            self.fail("weights table is not a list")
        self.table = table
        self._cache: dict[int, np.ndarray] = {}

    def fail(self, msg: str) -> NoReturn:
        raise OmFormatError(f"{self.where}: {msg}", hint="the file is corrupted or was not written by ge; re-create it with `ge compile`")

    # -- helpers --------------------------------------------------------------------------
    def _obj(self, x: Any, what: str) -> dict:
        if not isinstance(x, dict):
            self.fail(f"{what} is not an object")
        return x

    def _list(self, x: Any, what: str) -> list:
        if not isinstance(x, list):
            self.fail(f"{what} is not a list")
        return x

    def _name(self, x: Any, what: str) -> str:
        if not isinstance(x, str) or not x or len(x) > LIMITS.name_length:
            self.fail(f"{what} is not a valid name (1 to {LIMITS.name_length} characters)")
        return x

    def _int(self, x: Any, what: str, lo: int = 0, hi: int = 2**62) -> int:
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            self.fail(f"{what} is not an integer in [{lo}, {hi}]")
        return x

    def dtype(self, x: Any, what: str) -> np.dtype | None:
        if x is None:
            return None
        if not isinstance(x, str) or x not in _ALLOWED_DTYPES:
            self.fail(f"{what} has unknown dtype {str(x)[:40]!r}")
        try:
            return parse_dtype(x)
        except (TypeError, ImportError, AttributeError):
            self.fail(f"{what}: dtype {x} is not available here")

    def shape(self, x: Any, what: str) -> tuple | None:
        if x is None:
            return None
        x = self._list(x, what)
        if len(x) > LIMITS.rank:
            self.fail(f"{what} has rank {len(x)} (more than {LIMITS.rank})")
        out: list[Any] = []
        for d in x:
            if d is None or (isinstance(d, str) and 0 < len(d) <= LIMITS.symbol_length):
                out.append(d)
            elif isinstance(d, dict):
                try:
                    e = from_json(d)
                except ValueError as err:
                    self.fail(f"{what} has an invalid dim expression: {err}")
                if any(len(s) > LIMITS.symbol_length for s in e.symbols()):
                    self.fail(f"{what} has a dim expression naming a symbol longer than {LIMITS.symbol_length}")
                out.append(e)
            else:
                out.append(self._int(d, what, 0, LIMITS.dim))
        return tuple(out)

    def vtype(self, d: dict, what: str) -> TensorType:
        return TensorType(self.dtype(d.get("dtype"), what), self.shape(d.get("shape"), what))

    def weight(self, idx: Any, what: str) -> np.ndarray:
        i = self._int(idx, f"{what} weight index", 0, len(self.table) - 1) if self.table else self.fail(f"{what} refers to a weight but the table is empty")
        if i in self._cache:
            return self._cache[i]
        e = self._obj(self.table[i], f"weight {i}")
        dt = self.dtype(e.get("dtype"), f"weight {i}")
        if dt is None:
            self.fail(f"weight {i} has no dtype")
        shape = self.shape(e.get("shape"), f"weight {i} shape")
        if shape is None or any(not isinstance(s, int) for s in shape):
            self.fail(f"weight {i} has no static shape")
        count = span = 1
        for s in shape:
            count *= s
            span *= max(s, 1)  # a 0 dim must not hide absurd other dims (NumPy refuses those)
            if span > MAX_WEIGHT_ELEMENTS:
                self.fail(f"weight {i} claims an absurd element count")
        if dt == np.dtype(object):
            strings = self._list(e.get("strings"), f"weight {i} strings")
            if len(strings) != count or not all(isinstance(s, str) for s in strings):
                self.fail(f"weight {i}: string data does not match its shape")
            arr = np.array(strings, dtype=object).reshape(shape)
        else:
            part = e.get("part", 0)
            if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < len(self.parts):
                self.fail(f"weight {i}: part {part!r:.20} is not one of the {len(self.parts)} weight buffers")
            self.blob = self.parts[part]
            off = self._int(e.get("offset"), f"weight {i} offset")
            nbytes = self._int(e.get("nbytes"), f"weight {i} nbytes")
            splat = e.get("splat", False)
            if not isinstance(splat, bool):
                self.fail(f"weight {i}: 'splat' must be true or false")
            if splat:
                if nbytes != dt.itemsize or off + nbytes > len(self.blob) or (dt.itemsize and off % dt.itemsize):
                    self.fail(f"weight {i}: a splat weight must hold exactly one aligned {dtype_name(dt)} in the partition")
                one = np.frombuffer(self.blob, dtype=dt, count=1, offset=off)
                arr = np.broadcast_to(one.reshape((1,) * len(shape)), shape)
                self._cache[i] = arr
                return arr
            if nbytes != count * dt.itemsize:
                self.fail(f"weight {i}: {nbytes} bytes do not match shape {list(shape)} of {dtype_name(dt)}")
            if off + nbytes > len(self.blob):
                self.fail(f"weight {i} at {off}+{nbytes} lies outside the weights partition ({len(self.blob)} bytes)")
            if dt.itemsize and off % dt.itemsize:
                self.fail(f"weight {i} offset {off} is not aligned for {dtype_name(dt)}")
            arr = np.frombuffer(self.blob, dtype=dt, count=count, offset=off).reshape(shape)
        self._cache[i] = arr
        return arr

    def attr(self, a: Any, graph: Graph, scope: dict, what: str, depth: int = 0) -> Any:
        a = self._obj(a, what)
        if len(a) != 1:
            self.fail(f"{what} is not a tagged attribute")
        (tag, v), = a.items()
        if tag == "bool":
            if not isinstance(v, bool):
                self.fail(f"{what} is not a bool")
            return v
        if tag == "i":
            return self._int(v, what, LIMITS.int_min, LIMITS.int_max)
        if tag == "f":
            if isinstance(v, str) and v in ("nan", "inf", "-inf"):
                return float(v)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                self.fail(f"{what} is not a float")
            return float(v)
        if tag == "s":
            if not isinstance(v, str):
                self.fail(f"{what} is not a string")
            return v
        if tag == "b":
            try:
                return base64.b64decode(v, validate=True)
            except Exception:
                self.fail(f"{what} is not base64")
        if tag == "t":
            return self.weight(v, what)
        if tag == "none":
            return None
        if tag == "list":
            return [self.attr(x, graph, scope, what, depth) for x in self._list(v, what)]
        if tag == "g":
            return self.graph(v, parent=graph, scope=scope, depth=depth + 1)
        if tag == "gs":
            return [self.graph(x, parent=graph, scope=scope, depth=depth + 1) for x in self._list(v, what)]
        self.fail(f"{what} has unknown tag {str(tag)[:20]!r}")

    def graph(self, d: Any, parent: Graph | None = None, scope: dict | None = None, depth: int = 0) -> Graph:
        d = self._obj(d, "graph")
        if depth > LIMITS.subgraph_depth:
            self.fail(f"subgraphs are nested more than {LIMITS.subgraph_depth} levels deep (limit subgraph_depth)")
        name = d.get("name", "graph")
        if not isinstance(name, str) or len(name) > LIMITS.name_length:
            self.fail(f"a graph name is not a string of at most {LIMITS.name_length} characters")
        g = Graph(name, parent=parent)
        scope = dict(scope or {})
        try:
            if parent is None:
                ops = self._obj(d.get("opset_imports", {}), "opset_imports")
                g.opset_imports = {str(k): self._int(v, "opset version", 0, LIMITS.opset_version) for k, v in ops.items()}
                g.metadata.update(self._obj(d.get("metadata", {}), "graph metadata"))
            for i, vd in enumerate(self._list(d.get("inputs", []), "inputs")):
                vd = self._obj(vd, f"input {i}")
                default = self.weight(vd["default"], f"default of input {i}") if "default" in vd else None
                v = g.add_input(self._name(vd.get("name"), f"input {i}"), self.vtype(vd, f"input {i}"), default=default)
                scope[v.name] = v
            for i, cd in enumerate(self._list(d.get("constants", []), "constants")):
                cd = self._obj(cd, f"constant {i}")
                name = self._name(cd.get("name"), f"constant {i}")
                v = g.add_constant(self.weight(cd.get("weight"), f"constant '{name}'"), name)
                scope[name] = v
            for i, nd in enumerate(self._list(d.get("nodes", []), "nodes")):
                nd = self._obj(nd, f"node {i}")
                nname = self._name(nd.get("name"), f"node {i}")
                op = self._name(nd.get("op"), f"node '{nname}' op")
                dom = nd.get("domain", "")
                if not isinstance(dom, str):
                    self.fail(f"node '{nname}' domain is not a string")
                ins: list[Value | None] = []
                for x in self._list(nd.get("inputs", []), f"node '{nname}' inputs"):
                    if x is None:
                        ins.append(None)
                    elif not isinstance(x, str) or x not in scope:
                        self.fail(f"node '{nname}' reads undefined value {str(x)[:80]!r}")
                    else:
                        ins.append(scope[x])
                outs = [self._obj(o, f"node '{nname}' output") for o in self._list(nd.get("outputs", []), f"node '{nname}' outputs")]
                attrs = {}
                for k, a in self._obj(nd.get("attrs", {}), f"node '{nname}' attrs").items():
                    attrs[k] = self.attr(a, g, scope, f"node '{nname}' attribute '{k}'", depth)
                node = g.add_node(
                    op, ins, attrs, domain=dom, name=nname,
                    output_names=[self._name(o.get("name"), f"node '{nname}' output") for o in outs],
                    output_types=[self.vtype(o, f"node '{nname}' output") for o in outs],
                )
                if node.name != nname:
                    self.fail(f"two nodes are named '{nname}'")
                node.meta.update(self._obj(nd.get("meta", {}), f"node '{nname}' meta"))
                for v in node.outputs:
                    scope[v.name] = v
            graph_outs: list[Value] = []
            for x in self._list(d.get("outputs", []), "outputs"):
                if not isinstance(x, str) or x not in scope:
                    self.fail(f"graph output {str(x)[:80]!r} is not defined")
                graph_outs.append(scope[x])
            g.restore_outputs(graph_outs)
        except OmFormatError:
            raise
        except GEError as e:  # e.g. duplicate names from the IR
            self.fail(str(e))
        return g


def read_graph(d: Any, table: Any, blob, where: str) -> Graph:
    """Rebuild and verify a top-level graph; any inconsistency raises OmFormatError."""
    r = GraphReader(table, blob, where)
    try:
        g = r.graph(d)
        g.verify()
    except OmFormatError:
        raise
    except GEError as e:
        raise OmFormatError(f"{where}: the stored graph is invalid: {e}", hint="re-create it with `ge compile`") from None
    except RecursionError:
        raise OmFormatError(f"{where}: the stored graph is nested too deeply") from None
    return g

