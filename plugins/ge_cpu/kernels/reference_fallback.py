"""Fallback kernels through ``onnx.reference``: any ONNX op without a native kernel still runs.

``reference_factory(spec)`` builds a one-node ONNX model from the spec (attributes, input and
output types, opset) and evaluates it with :class:`onnx.reference.ReferenceEvaluator`. It is
slow (pure Python per call) and needs the ``onnx`` package, which is imported lazily here only.
``fallback_op_types()`` lists the ONNX default-domain ops that would use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.kernel import KernelSpec, with_caps
from ge_native import native
from ge_sdk.onnx_types import dtype_to_elem

from ._util import unsupported


def _make_attribute(helper, onnx, name: str, value: Any):
    if isinstance(value, np.ndarray):
        from onnx import numpy_helper

        arr = value
        if arr.dtype == np.dtype(object):
            arr = arr.astype(str)
        return helper.make_attribute(name, numpy_helper.from_array(arr))
    if isinstance(value, (np.integer,)):
        value = int(value)
    elif isinstance(value, (np.floating,)):
        value = float(value)
    if isinstance(value, (list, tuple)):
        if len(value) == 0:
            return helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS)
        if isinstance(value[0], np.ndarray):
            from onnx import numpy_helper

            return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
        value = [int(v) if isinstance(v, np.integer) else float(v) if isinstance(v, np.floating) else v
                 for v in value]
    return helper.make_attribute(name, value)


def _elem_type(dtype) -> int:
    """ONNX element type of ``dtype`` (UNDEFINED, 0, for None or a type ONNX lacks)."""
    try:
        return dtype_to_elem(dtype)
    except (KeyError, TypeError, ValueError):
        return 0


def reference_factory(spec: KernelSpec):
    """A kernel that runs ``spec``'s node with onnx.reference.ReferenceEvaluator."""
    try:
        import onnx
        from onnx import helper
        from onnx.reference import ReferenceEvaluator
    except ImportError as exc:
        raise unsupported(spec, "this op (no native kernel, and the onnx package for the "
                                "reference fallback is not installed)") from exc

    in_names = []
    graph_inputs = []
    for i, t in enumerate(spec.inputs):
        if t is None:
            in_names.append("")
            continue
        name = f"i{i}"
        in_names.append(name)
        graph_inputs.append(helper.make_tensor_value_info(name, _elem_type(t.dtype), None))
    out_names = [f"o{j}" for j in range(len(spec.outputs))]
    graph_outputs = [helper.make_tensor_value_info(n, _elem_type(t.dtype if t else None), None)
                     for n, t in zip(out_names, spec.outputs)]
    node = helper.make_node(spec.op_type, in_names, out_names, name=spec.name or spec.op_type,
                            domain=spec.domain)
    try:
        for k, v in spec.attrs.items():
            node.attribute.append(_make_attribute(helper, onnx, k, v))
    except Exception as exc:  # noqa: BLE001 - any attribute ONNX cannot encode
        raise unsupported(spec, f"an attribute the reference fallback cannot encode ({exc})") from exc
    graph = helper.make_graph([node], "ge_fallback", graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid(spec.domain, spec.opset or onnx.defs.onnx_opset_version())]
    if spec.domain:
        opsets.append(helper.make_opsetid("", onnx.defs.onnx_opset_version()))
    model = helper.make_model(graph, opset_imports=opsets)
    try:
        evaluator = ReferenceEvaluator(model)
    except Exception as exc:  # noqa: BLE001 - onnx.reference lacks the op/version
        raise unsupported(spec, f"this op (onnx.reference cannot run it: {exc})") from exc
    feed_names = [(i, n) for i, n in enumerate(in_names) if n]
    out_dtypes = [t.dtype if t is not None else None for t in spec.outputs]

    def kernel(*inputs):
        feeds = {n: inputs[i] for i, n in feed_names if i < len(inputs) and inputs[i] is not None}
        results = evaluator.run(None, feeds)
        return tuple(_convert(r, dt) for r, dt in zip(results, out_dtypes))

    return with_caps(kernel, variant="numpy")  # onnx.reference's evaluator: NumPy


def _convert(r, dt):
    if r is None:
        return None
    if isinstance(r, (list, tuple)):
        return [_convert(x, None) for x in r]
    r = np.asarray(r)
    if r.dtype.kind == "U":
        r = r.astype(object)
    elif dt is not None and dt != np.dtype(object) and r.dtype != dt:
        r = r.astype(dt)
    return r


#: Domains besides ONNX's default one whose ops the fallback offers.
FALLBACK_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview")


def fallback_ops(domains: tuple[str, ...] = FALLBACK_DOMAINS) -> list[tuple[str, str]]:
    """``(domain, op_type)`` of the ONNX ops with no native ge_cpu kernel (they use the fallback).
    The names of ONNX's ops are kept in the user's cache per onnx version (reading them needs
    onnx imported: ~60 ms a process otherwise)."""
    from importlib import metadata

    from . import KERNELS

    try:
        version = metadata.version("onnx")
    except metadata.PackageNotFoundError:
        version = "?"
    rows = native.memo_json("onnx_op_names", [version], _schema_names, _names_ok)
    return sorted({(d, n) for d, n in rows if d in domains and (d, n) not in KERNELS})


def _schema_names() -> list[list[str]]:
    import onnx

    names = {(s.domain if s.domain != "ai.onnx" else "", s.name) for s in onnx.defs.get_all_schemas_with_history()}
    return [list(k) for k in sorted(names)]


def _names_ok(rows) -> bool:
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) and x.isascii() for x in r) for r in rows)


def fallback_op_types() -> list[str]:
    """ONNX default-domain ops with no native ge_cpu kernel (they would use the fallback)."""
    return [n for d, n in fallback_ops(("",))]
