"""Reading a ``.pt2`` archive (``torch.export.save``) without unpickling anything in it.

``torch.export.load`` is not safe on a file from outside: it unpickles the sample inputs (falling
back to ``weights_only=False``), pickled weights and constants, custom and opaque objects; and the
program's JSON reaches code that evaluates it (``sympy.sympify`` of shape expressions, FX code
generation from node names, op targets resolved by ``getattr`` from the ``torch`` module, so
``torch.os.system`` is a "target"). This module reads the archive itself:

* the archive is a zip read with :mod:`zipfile`, sizes bounded before anything is read;
* tensors (weights, buffers, tensor constants) are built from their raw bytes and the JSON
  ``tensor_meta`` (dtype, sizes, strides, offset checked against the bytes); a payload marked
  ``use_pickle``, a custom or opaque object, or a legacy ``.pt`` weights file is refused;
* the sample inputs (a pickle) are never read: GE does not need them;
* the program JSON is checked before torch's deserializer sees it: every name is an identifier,
  every op target is an ATen/prims operator overload or higher-order op (or one of a few
  ``operator``/``math``/``torch.sym_*`` functions), every shape expression uses only numbers,
  arithmetic and known function names; node metadata other than ``nn_module_stack`` and the
  guards code are dropped.

Anything refused raises :class:`ModelFileError` with how to export the model safely.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import stat
import zipfile
from typing import Any

from ge_core.errors import GEError, ModelFileError

#: Bounds on what is read from an archive.
MAX_JSON_BYTES = 256 << 20
MAX_TENSOR_BYTES = 1 << 34  # 16 GiB, as for ONNX tensors
MAX_TOTAL_BYTES = 1 << 36
MAX_STRING = 4096
MAX_DEPTH = 200

_HINT = ("export with torch.export.save(torch.export.export(model.eval(), args), path) from plain "
         "tensors and parameters (no tensor subclasses, custom or opaque objects), or give GE the "
         "nn.Module itself: ge.load(module, example_inputs=(x,))")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*\Z")
_PATH_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")

#: Call targets outside ``torch.ops`` that a program may name (what torch's serializer writes).
_OPERATOR_FUNCS = frozenset({
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq",
    "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift",
})
_MATH_FUNCS = frozenset({"floor", "ceil", "trunc", "sqrt"})
_TORCH_FUNCS = frozenset({"sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite",
                          "sym_sqrt", "sym_sum", "sym_fresh_size"})
#: ``torch.ops`` namespaces read; other ones are custom ops (refused: GE has no mapper for them).
_OP_NAMESPACES = frozenset({"aten", "prims"})
#: Operators with effects outside the tensors they return (file I/O, printing).
_DENIED_OPS = frozenset({"from_file", "save", "_print", "warn", "_test_warn_in_autograd"})
_HIGHER_ORDER = frozenset({"cond", "while_loop", "map_impl", "scan", "wrap_with_set_grad_enabled",
                           "wrap_with_autocast", "invoke_subgraph", "auto_functionalized",
                           "auto_functionalized_v2"})

#: Names a shape expression may call: torch's sympy functions and sympy's ``srepr`` names.
_SYM_FUNCS = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
    "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt",
    "RoundDecimal", "ToFloat", "Identity", "Max", "Min", "floor", "ceiling", "Abs", "sqrt", "Eq",
    "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan",
    "Equality", "Unequality", "And", "Or", "Not", "True", "False", "oo", "int_oo", "Piecewise",
    "ExprCondPair", "BooleanTrue", "BooleanFalse", "Symbol", "Integer", "Rational", "Float", "Mul",
    "Add", "Pow", "Infinity", "NegativeInfinity", "IntInfinity", "NegativeIntInfinity", "Half",
    "One", "Zero", "NegativeOne",
})
#: The only keyword arguments (``Symbol('s0', positive=True)``, ``Float('1.5', precision=53)``).
_SYM_KWARGS = frozenset({"positive", "negative", "integer", "real", "nonnegative", "nonpositive",
                         "finite", "infinite", "zero", "nonzero", "even", "odd", "precision"})
_SYM_POW = frozenset({"PowByNatural", "FloatPow", "Pow", "**"})
_SYM_SYMBOL = re.compile(r"[a-z]{1,4}[0-9]{1,9}\Z")
_SYM_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{1,3})?\Z")
_SYM_TOKEN = re.compile(
    r"\s*(?:(?P<num>[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{1,3})?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<str>'[A-Za-z0-9_.+-]{0,64}')|(?P<op>\*\*|//|==|!=|<=|>=|[-+*/%(),<>&|~=]))"
)


class _Refused(Exception):
    """A part of the archive that is refused (message only; the path is added by the caller)."""


# ------------------------------------------------------------------------------------------
# the program JSON
# ------------------------------------------------------------------------------------------
def check_sym_expr(expr: str) -> None:
    """Refuse a shape expression that is more than numbers, arithmetic, symbols and known functions.

    ``sympy.sympify`` evaluates the string as Python. Here a quoted string may only be the name
    of ``Symbol(...)`` or the digits of ``Float(...)``, a keyword only an assumption, a name only
    a shape symbol or a function of :data:`_SYM_FUNCS`: no dots, brackets or other names, so
    nothing but arithmetic can happen; powers are bounded so that no number explodes.
    """
    if not isinstance(expr, str) or len(expr) > 4000:
        raise _Refused("a shape expression longer than 4000 characters")
    what = f"shape expression {expr[:80]!r}"
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _SYM_TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            if expr[pos:].strip() == "":
                break
            raise _Refused(f"{what} has a character {expr[pos:pos + 1]!r} that is not arithmetic")
        pos = m.end()
        kind = m.lastgroup or "op"
        toks.append((kind, m.group(kind)))
    pows, nums = 0, []
    for i, (kind, tok) in enumerate(toks):
        prev = [t for _, t in toks[max(i - 2, 0):i]]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "num":
            nums.append(tok)
            if len(tok) > 24:
                raise _Refused(f"{what} has a number of more than 24 digits")
        elif kind == "str":
            body = tok[1:-1]
            ok = (prev == ["Symbol", "("] and _SYM_SYMBOL.match(body)) or (
                prev == ["Float", "("] and _SYM_NUMBER.match(body) and len(body) <= 40)
            if not ok:
                raise _Refused(f"{what} has a quoted string {tok[:40]!r} that is not a symbol name")
            if prev[0] == "Float":
                nums.append(body.lstrip("-"))
        elif kind == "name":
            if nxt == "=":
                after = toks[i + 2][1] if i + 2 < len(toks) else ""
                if tok not in _SYM_KWARGS or not prev or prev[-1] != "," or not (
                        after in ("True", "False") or after.isdigit()):
                    raise _Refused(f"{what} passes an unexpected keyword {tok!r}")
            elif tok not in _SYM_FUNCS and not _SYM_SYMBOL.match(tok):
                raise _Refused(f"{what} names {tok!r}, which is neither a shape symbol nor a known function")
        elif tok == "=" and (i == 0 or toks[i - 1][0] != "name"):
            raise _Refused(f"{what} has an assignment")
        if tok in _SYM_POW:
            pows += 1
    if pows and (pows > 1 or any(len(n) > 3 for n in nums)):
        raise _Refused(f"{what} raises to a power with large numbers")


def check_target(target: Any) -> None:
    """Refuse a call target that is not an operator GE reads (resolving it only inside torch.ops)."""
    import torch

    if not isinstance(target, str) or not _DOTTED.match(target) or "__" in target:
        raise _Refused(f"call target {str(target)[:80]!r} is not a dotted name")
    parts = target.split(".")
    if parts[0] == "_operator" and len(parts) == 2 and parts[1] in _OPERATOR_FUNCS:
        return
    if parts[0] == "math" and len(parts) == 2 and parts[1] in _MATH_FUNCS:
        return
    if parts[0] == "torch" and len(parts) == 2 and parts[1] in _TORCH_FUNCS:
        return
    if parts[:3] == ["torch", "ops", "higher_order"] and len(parts) == 4 and parts[3] in _HIGHER_ORDER:
        if isinstance(getattr(torch.ops.higher_order, parts[3], None), torch._ops.HigherOrderOperator):
            return
    if parts[:2] == ["torch", "ops"] and len(parts) == 5 and parts[2] in _OP_NAMESPACES:
        if parts[3] in _DENIED_OPS:
            raise _Refused(f"operator '{target}' has effects outside the model (files, printing)")
        ns = getattr(torch.ops, parts[2])
        packet = getattr(ns, parts[3], None) if hasattr(ns, parts[3]) else None
        op = getattr(packet, parts[4], None) if packet is not None and hasattr(packet, parts[4]) else None
        if isinstance(op, torch._ops.OpOverload):
            return
        raise _Refused(f"operator '{target}' does not exist in this PyTorch")
    raise _Refused(f"call target '{target}' is not an ATen/prims operator or a known higher-order op")


def _check_name(s: Any, what: str) -> None:
    if s is None or s == "":
        return
    if (not isinstance(s, str) or len(s) > MAX_STRING or not _DOTTED.match(s) or s.startswith("__")
            or any(keyword.iskeyword(p) for p in s.split("."))):
        raise _Refused(f"{what} {str(s)[:80]!r} is not an identifier")


def _check_key(k: Any) -> None:
    if not isinstance(k, str) or len(k) > MAX_STRING or not (k == "" or _DOTTED.match(k)) or k.startswith("__"):
        raise _Refused(f"key {str(k)[:80]!r} is not an identifier")


_META_KEEP = frozenset({"nn_module_stack"})
_MODULE_STACK = re.compile(r"[A-Za-z0-9_.,;\[\]()'\" -]*\Z")


def _clean_metadata(meta: Any) -> dict:
    if not isinstance(meta, dict):
        raise _Refused("node metadata is not a mapping")
    out = {}
    for k in _META_KEEP:
        v = meta.get(k)
        if isinstance(v, str) and len(v) <= 16 * MAX_STRING and _MODULE_STACK.match(v):
            out[k] = v
    return out


def check_program(obj: Any, key: str = "", depth: int = 0) -> Any:
    """The program JSON checked and cleaned (a new object); :class:`_Refused` if it is refused."""
    if depth > MAX_DEPTH:
        raise _Refused(f"the program is nested more than {MAX_DEPTH} levels deep")
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            _check_key(k)
            if k in ("as_custom_obj", "custom_obj") or (k == "custom_obj_values" and v):
                raise _Refused("the program uses custom (TorchScript) objects, which are stored as pickles")
            if k == "metadata":  # a node's (stack traces, ...) or the graph module's (custom JSON)
                out[k] = _clean_metadata(v) if key == "node" else {}
                continue
            if k == "guards_code":
                out[k] = []  # Python source; GE checks shapes itself
                continue
            if k == "nodes" and isinstance(v, list):
                out[k] = [check_program(n, "node", depth + 1) for n in v]
                continue
            out[k] = check_program(v, k, depth + 1)
        return out
    if isinstance(obj, list):
        return [check_program(v, key, depth + 1) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, float):
        return obj
    if isinstance(obj, int):
        if abs(obj) >= 1 << 63:
            raise _Refused(f"integer {str(obj)[:40]} in '{key}' does not fit 64 bits")
        return obj
    if isinstance(obj, str):
        if key in ("as_string", "as_strings"):  # op arguments: repr'd by FX, never evaluated
            if len(obj) > MAX_STRING:
                raise _Refused(f"a string argument of {len(obj)} characters")
            return obj
        if obj in ("Infinity", "-Infinity", "NaN"):  # how torch writes non-finite floats
            return obj
        if key == "expr_str":
            check_sym_expr(obj)
        elif key in ("target", "as_operator"):
            check_target(obj)
        elif key in ("in_spec", "out_spec"):  # pytree specs: types resolved from torch's registry
            if len(obj) > 1 << 20:
                raise _Refused("a pytree spec longer than 1 MiB")
        elif key in ("torch_version",):
            if len(obj) > 100:
                raise _Refused("torch_version is too long")
        elif key == "type":  # a device type
            _check_name(obj, "device type")
        else:
            _check_name(obj, f"'{key}'")
        return obj
    raise _Refused(f"unexpected value of type {type(obj).__name__} in '{key}'")


# ------------------------------------------------------------------------------------------
# the archive
# ------------------------------------------------------------------------------------------
class _Archive:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            st = os.stat(path)
        except OSError as e:
            raise ModelFileError(f"cannot read model file '{path}': {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(f"model file '{path}' is not a regular file", hint="give a .pt2 file")
        self.size = st.st_size
        try:
            self.zf = zipfile.ZipFile(path)
            infos = self.zf.infolist()
        # NotImplementedError: a record of an unknown zip version
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
            raise ModelFileError(f"'{path}' is not a .pt2 archive (not a zip file: {e})", hint=_HINT) from None
        names = [i.filename for i in infos]
        if not names:
            raise ModelFileError(f"'{path}' is an empty zip, not a .pt2 archive", hint=_HINT)
        if len(set(names)) != len(names):
            raise ModelFileError(f"'{path}' has two zip entries of the same name", hint="the file is corrupt or hostile")
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1 or any("/" not in n for n in names):
            raise ModelFileError(f"'{path}' is not a .pt2 archive (entries are not under one folder)", hint=_HINT)
        self.root = roots.pop() + "/"
        self.infos = {i.filename[len(self.root):]: i for i in infos}
        if sum(i.file_size for i in infos) > MAX_TOTAL_BYTES:
            raise ModelFileError(f"'{path}' would expand to more than {MAX_TOTAL_BYTES} bytes", hint="the file is hostile")

    def has(self, name: str) -> bool:
        return name in self.infos

    def read(self, name: str, limit: int) -> bytes:
        info = self.infos.get(name)
        if info is None:
            raise ModelFileError(f"'{self.path}' has no entry '{name}'", hint=_HINT)
        if info.file_size > limit:
            raise ModelFileError(f"'{self.path}': entry '{name}' has {info.file_size} bytes, more than {limit}",
                                 hint="the file is corrupt or hostile")
        # zipfile reads as many stored bytes as the entry declares in one call: a declared size
        # beyond the archive would allocate it before finding the end of the file
        if info.compress_size > self.size:
            raise ModelFileError(f"'{self.path}': entry '{name}' declares {info.compress_size} stored bytes, more "
                                 f"than the archive's {self.size}", hint="the file is corrupt or hostile")
        try:
            with self.zf.open(info) as f:
                data = f.read(info.file_size + 1)  # one more than declared: a longer entry is refused
        # RuntimeError: an entry flagged as encrypted
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as e:
            raise ModelFileError(f"'{self.path}': entry '{name}' cannot be read ({e})", hint="the file is corrupt") from None
        if len(data) != info.file_size:
            raise ModelFileError(f"'{self.path}': entry '{name}' is not the size its header says",
                                 hint="the file is corrupt")
        return data

    def json(self, name: str) -> Any:
        raw = self.read(name, MAX_JSON_BYTES)
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError, UnicodeDecodeError) as e:
            raise ModelFileError(f"'{self.path}': '{name}' is not valid JSON ({type(e).__name__})",
                                 hint="the file is corrupt") from None


def _as_int(sym: Any, what: str) -> int:
    if not isinstance(sym, dict) or set(sym) != {"as_int"} or type(sym["as_int"]) is not int:
        raise _Refused(f"{what} is not a plain integer (symbolic sizes are not stored tensors)")
    v = sym["as_int"]
    if v < 0 or v >= 1 << 62:
        raise _Refused(f"{what} {v} is out of range")
    return v


def _tensors(ar: _Archive, config_name: str, folder: str, kind: str) -> Any:
    """The tensors a payload config describes, built from raw bytes (never unpickled)."""
    import torch
    from torch._export.serde import schema
    from torch._export.serde.serialize import deserialize_scalar_type

    if not ar.has(config_name):
        raise ModelFileError(f"'{ar.path}' has no {config_name}", hint=_HINT)
    cfg = ar.json(config_name)
    entries = cfg.get("config") if isinstance(cfg, dict) else None
    if not isinstance(entries, dict):
        raise ModelFileError(f"'{ar.path}': {config_name} has no 'config' mapping", hint="the file is corrupt")
    flat: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for fqn, meta in entries.items():
        what = f"{kind} '{fqn}' of '{ar.path}'"
        try:
            _check_name(fqn, kind)
            if not isinstance(meta, dict):
                raise _Refused("its entry is not a mapping")
            pname = meta.get("path_name")
            if not isinstance(pname, str) or not _PATH_NAME.match(pname):
                raise _Refused(f"its file name {str(pname)[:60]!r} is not a plain name")
            if meta.get("use_pickle") is not False or pname.startswith(("custom_obj_", "opaque_obj_")):
                raise _Refused("it is stored as a pickle (a tensor subclass, custom or opaque object)")
            if folder == "data/constants/" and not pname.startswith("tensor_"):
                raise _Refused(f"constant file '{pname}' is not a tensor")
            tm = meta.get("tensor_meta")
            if not isinstance(tm, dict):
                raise _Refused("it has no tensor_meta")
            if tm.get("layout", 7) != schema.Layout.Strided:
                raise _Refused("it is not a dense (strided) tensor")
            try:
                dtype = deserialize_scalar_type(schema.ScalarType(int(tm.get("dtype"))))  # type: ignore[arg-type]
            except (ValueError, KeyError, TypeError):
                raise _Refused(f"its dtype {tm.get('dtype')!r} is unknown") from None
            if not isinstance(tm.get("sizes") or [], list) or not isinstance(tm.get("strides") or [], list):
                raise _Refused("its sizes or strides are not lists")
            sizes = [_as_int(s, "a size") for s in tm.get("sizes") or []]
            strides = [_as_int(s, "a stride") for s in tm.get("strides") or []]
            offset = _as_int(tm.get("storage_offset", {"as_int": 0}), "the storage offset")
            if len(sizes) != len(strides) or len(sizes) > 64:
                raise _Refused("its sizes and strides do not match")
            itemsize = torch.empty((), dtype=dtype).element_size()
            numel = 1
            for s in sizes:
                numel *= s
            if numel * itemsize > MAX_TENSOR_BYTES:
                raise _Refused(f"it would take {numel * itemsize} bytes")
            if pname not in flat:
                raw = ar.read(folder + pname, MAX_TENSOR_BYTES)
                if len(raw) % itemsize:
                    raise _Refused(f"its file has {len(raw)} bytes, not a multiple of {itemsize}")
                flat[pname] = (torch.frombuffer(bytearray(raw), dtype=dtype) if raw
                               else torch.zeros(0, dtype=dtype), len(raw) == 0)
            base, empty = flat[pname]
            if base.dtype != dtype:
                raise _Refused("two tensors of different dtypes share its file")
            if empty:  # torch stores fake or empty tensors without bytes: they load as zeros
                t = torch.zeros(sizes, dtype=dtype)
            else:
                span = offset + sum((s - 1) * st for s, st in zip(sizes, strides)) + 1 if numel else 0
                if span > base.numel():
                    raise _Refused(f"sizes {sizes}, strides {strides} and offset {offset} reach past the "
                                   f"{base.numel()} elements of its file")
                t = torch.as_strided(base, sizes, strides, offset)
            if meta.get("is_param"):
                grad = bool(tm.get("requires_grad"))
                if grad and not (dtype.is_floating_point or dtype.is_complex):
                    raise _Refused(f"it is a parameter of {dtype} that requires gradients, which torch cannot make")
                t = torch.nn.Parameter(t, requires_grad=grad)
            out[fqn] = t
        except _Refused as e:
            raise ModelFileError(f"{what}: {e}; GE never unpickles a model file", hint=_HINT) from None
    return out


def load_exported_program(path: str) -> Any:
    """The ``ExportedProgram`` stored in ``path``, read without pickle (see the module docstring)."""
    from torch._export.serde import serialize

    ar = _Archive(path)
    fmt = ar.read("archive_format", 64) if ar.has("archive_format") else b""
    if fmt.strip() != b"pt2":
        raise ModelFileError(f"'{path}' is not a torch.export archive (archive_format is {fmt[:20]!r})", hint=_HINT)
    if ar.has("byteorder") and ar.read("byteorder", 64).strip() not in (b"little",):
        raise ModelFileError(f"'{path}' stores big-endian tensors, which GE does not read", hint=_HINT)
    for legacy in ("data/weights/model.pt", "data/constants/model.pt"):
        if ar.has(legacy):
            raise ModelFileError(f"'{path}' stores its tensors in the legacy pickled format ({legacy})", hint=_HINT)
    if not ar.has("models/model.json"):
        others = sorted(n for n in ar.infos if n.startswith("models/"))
        raise ModelFileError(f"'{path}' has no program 'models/model.json' (it has {others or 'none'})", hint=_HINT)
    program = ar.json("models/model.json")
    try:
        if not isinstance(program, dict):
            raise _Refused("the program is not a JSON object")
        program = check_program(program)
    except _Refused as e:
        raise ModelFileError(f"'{path}' is refused: {e}", hint=_HINT) from None
    state_dict = _tensors(ar, "data/weights/model_weights_config.json", "data/weights/", "weight")
    constants = _tensors(ar, "data/constants/model_constants_config.json", "data/constants/", "constant")
    artifact = serialize.SerializedArtifact(
        json.dumps(program).encode("utf-8"), state_dict, constants, b"",  # sample inputs: a pickle, unread
    )
    try:
        return serialize.deserialize(artifact)
    except GEError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise ModelFileError(
            f"'{path}' is not a readable torch.export program ({type(e).__name__}: {msg[0][:300] if msg else ''})",
            hint=_HINT,
        ) from None
