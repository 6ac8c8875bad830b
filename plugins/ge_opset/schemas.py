"""OpDefs of the default ONNX domain, built from ONNX's schema history."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ge_core.ops import OpDef

from .infer import onnx_infer
from .kinds import RANDOM_OPS, op_alias, op_kind

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
    """
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
                attrs[aname] = dv
        defs.append(
            OpDef(
                op_type=name,
                domain=dom,
                min_inputs=min(s.min_input for s in schemas),
                max_inputs=min(VARIADIC, max(s.max_input for s in schemas)),
                min_outputs=min(s.min_output for s in schemas),
                max_outputs=min(VARIADIC, max(s.max_output for s in schemas)),
                kind=op_kind(name),
                alias=op_alias(name) if dom == "" else None,
                infer=onnx_infer,
                since_version=schemas[0].since_version,
                deprecated_after=deprecated_after,
                deterministic=name not in RANDOM_OPS,
                attrs=attrs,
                doc=_first_paragraph(latest.doc),
            )
        )
    return tuple(defs)
