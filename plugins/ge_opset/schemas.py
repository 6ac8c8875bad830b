"""OpDefs of the default ONNX domain, built from ONNX's schema history."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ge_core.ops import OpDef
from ge_native import native

from .kinds import COPY_OP, RANDOM_OPS, op_alias, op_kind
from .symbolic import infer as symbolic_infer

#: The ONNX domains whose ops this op set defines ("" is the default domain).
ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview")

#: Upper bound used for variadic inputs/outputs.
VARIADIC = 2**31 - 1


def _attr_default(attr) -> Any:
    from onnx import AttributeProto, helper

    dv = attr.default_value
    if dv is None or dv.type == AttributeProto.UNDEFINED:
        return None
    try:
        v = helper.get_attribute_value(dv)
    except Exception:
        return None
    if dv.type == AttributeProto.FLOAT:
        v = float(str(np.float32(v)))  # 0.009999999776 -> 0.01
    elif dv.type == AttributeProto.FLOATS:
        v = [float(str(np.float32(x))) for x in v]
    elif dv.type == AttributeProto.STRING and isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    elif dv.type == AttributeProto.STRINGS:
        v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
    elif dv.type == AttributeProto.TENSOR:
        from onnx import numpy_helper

        v = numpy_helper.to_array(v)
    elif dv.type in (AttributeProto.INTS,):
        v = list(v)
    return v


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    text = doc.strip().split("\n\n")[0]
    return " ".join(text.split())[:500]


def build_opdefs(domains: tuple[str, ...] = ("",)) -> list[OpDef]:
    """Fresh OpDefs (see :func:`_build_opdefs`); the schema walk itself is cached."""
    return [dataclasses.replace(d, attrs=dict(d.attrs)) for d in _build_opdefs(tuple(domains))]


@functools.cache
def _build_opdefs(domains: tuple[str, ...]) -> tuple[OpDef, ...]:
    """One OpDef per op type of ``domains`` (default: the ONNX default domain).

    Arity is the union over every schema version, so nodes of older opsets (Slice-1 with one
    input, BatchNormalization-6 with five outputs) pass the registry's arity check.
    ``since_version`` is the first version; ``deprecated_after`` the last version before the
    op was deprecated (None if it never was).

    The walk over ONNX's schemas (and the import of onnx it needs) takes ~60 ms; its result is
    kept in the user's kernel cache (:func:`ge_native.native.memo_json`, keyed by onnx's version
    and this module's source), so a later process (``ge run``, loading an .om) reads it instead.
    What is read back is checked field by field; anything else is rebuilt from the schemas.
    """
    rows = native.memo_json("opdefs", _cache_parts(domains), lambda: _schema_rows(domains), _rows_ok)
    return tuple(_opdef(r) for r in rows)


_ROW_KEYS: dict[str, Any] = {"op_type": str, "domain": str, "min_inputs": int, "max_inputs": int, "min_outputs": int,
             "max_outputs": int, "since_version": int, "deprecated_after": (int, type(None)), "attrs": dict, "doc": str}


def _cache_parts(domains: tuple[str, ...]) -> list[str]:
    """What the derived rows depend on: onnx's version, the domains, this module's source."""
    import hashlib
    from importlib import metadata

    try:
        version = metadata.version("onnx")
        with open(__file__, "rb") as f:
            me = hashlib.sha256(f.read()).hexdigest()
    except (OSError, metadata.PackageNotFoundError):
        version, me = "?", "?"
    return [version, "|".join(domains), me]


def _rows_ok(rows: Any) -> bool:
    """Every row has its fields with their types (attribute defaults: numbers, strings, lists
    of those, or a tensor as ``{"ndarray": [dtype, shape, values]}``)."""
    if not isinstance(rows, list) or not rows:
        return False
    for r in rows:
        if not isinstance(r, dict) or set(r) != set(_ROW_KEYS):
            return False
        for k, t in _ROW_KEYS.items():
            if not isinstance(r[k], t) or (t is int and isinstance(r[k], bool)):
                return False
        if not all(isinstance(a, str) and _plain_default(v) for a, v in r["attrs"].items()):
            return False
    return True


def _plain_default(v: Any) -> bool:
    if isinstance(v, (str, int, float)):
        return True
    if isinstance(v, list):
        return all(isinstance(x, (str, int, float)) for x in v)
    if isinstance(v, dict) and set(v) == {"ndarray"} and isinstance(v["ndarray"], list) and len(v["ndarray"]) == 3:
        dt, shape, values = v["ndarray"]
        return (dt in ("float32", "float64", "int64", "int32") and isinstance(shape, list)
                and all(isinstance(d, int) and 0 <= d < 1 << 20 for d in shape) and isinstance(values, list)
                and len(values) == int(np.prod(shape)) and all(isinstance(x, (int, float)) for x in values))
    return False


def _encode_default(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return {"ndarray": [v.dtype.name, list(v.shape), v.reshape(-1).tolist()]}
    return v


def _decode_default(v: Any) -> Any:
    if isinstance(v, dict):
        dt, shape, values = v["ndarray"]
        return np.array(values, dtype=dt).reshape(shape)
    return list(v) if isinstance(v, list) else v


def _opdef(r: dict) -> OpDef:
    name, dom = r["op_type"], r["domain"]
    return OpDef(op_type=name, domain=dom, min_inputs=r["min_inputs"], max_inputs=r["max_inputs"],
                 min_outputs=r["min_outputs"], max_outputs=r["max_outputs"], kind=op_kind(name),
                 alias=op_alias(name) if dom == "" else None, infer=symbolic_infer, since_version=r["since_version"],
                 deprecated_after=r["deprecated_after"], deterministic=name not in RANDOM_OPS,
                 attrs={k: _decode_default(v) for k, v in r["attrs"].items()}, doc=r["doc"],
                 copy=name == COPY_OP and dom == "")


def _schema_rows(domains: tuple[str, ...]) -> list[dict]:
    import onnx.defs

    history: dict[tuple[str, str], list] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        dom = "" if s.domain in ("", "ai.onnx") else s.domain
        if dom not in domains:
            continue
        history.setdefault((dom, s.name), []).append(s)
    defs = []
    for (dom, name), schemas in sorted(history.items()):
        schemas.sort(key=lambda s: s.since_version)
        live = [s for s in schemas if not s.deprecated] or schemas
        latest = live[-1]
        deprecated_after = None
        if schemas[-1].deprecated:
            deprecated_after = schemas[-1].since_version - 1
        attrs = {}
        for aname, a in latest.attributes.items():
            dv = _attr_default(a)
            if dv is not None:
                attrs[aname] = _encode_default(dv)
        defs.append({"op_type": name, "domain": dom, "min_inputs": min(s.min_input for s in schemas),
                     "max_inputs": min(VARIADIC, max(s.max_input for s in schemas)),
                     "min_outputs": min(s.min_output for s in schemas),
                     "max_outputs": min(VARIADIC, max(s.max_output for s in schemas)),
                     "since_version": schemas[0].since_version, "deprecated_after": deprecated_after,
                     "attrs": attrs, "doc": _first_paragraph(latest.doc)})
    return defs
