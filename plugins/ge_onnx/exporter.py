"""IR -> ONNX: ``export_onnx(graph)`` returns a ``ModelProto``.

Constants become initializers, known value types become ``value_info``, subgraphs become
GRAPH/GRAPHS attributes, attribute values go back to their ONNX types (the schema's attribute
type is used where the Python value is ambiguous, e.g. an empty list or an int for a float).
Outputs the frontend created for absent optional outputs (``meta["onnx_absent"]``) are written
back as ``""`` when nothing reads them.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ge_core.errors import GEError, ModelFileError
from ge_core.ir.graph import Graph, Node
from ge_core.ir.types import TensorType
from ge_sdk.onnx_types import dtype_to_elem as _elem_type

_PRODUCER = "ge"


def value_info(name: str, t: TensorType, *, force: bool = False):
    """A ValueInfoProto for a value of type ``t`` (None when nothing is known and not forced)."""
    from onnx import ValueInfoProto

    if t.dtype is None and t.shape is None and not force:
        return None
    vi = ValueInfoProto()
    vi.name = name
    tt = vi.type.tensor_type
    tt.elem_type = _elem_type(t.dtype)
    if t.shape is not None:
        tt.shape.SetInParent()
        for d in t.shape:
            dim = tt.shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
    return vi


def array_to_tensor(arr: np.ndarray, name: str = ""):
    from onnx import numpy_helper

    arr = np.asarray(arr)
    if arr.dtype == np.dtype(object):
        arr = np.vectorize(lambda x: x.encode("utf-8") if isinstance(x, str) else x, otypes=[object])(arr) \
            if arr.size else arr
    return numpy_helper.from_array(arr, name)


def _schema_attr_types(op_type: str, domain: str, opset: int) -> dict[str, int]:
    try:
        import onnx.defs

        s = onnx.defs.get_schema(op_type, opset, domain) if opset > 0 else onnx.defs.get_schema(op_type, domain=domain)
    except Exception:
        return {}
    out = {}
    for name, a in s.attributes.items():
        try:
            out[name] = int(a.type.value)  # type: ignore[attr-defined]
        except Exception:
            pass
    return out


class _Exporter:
    def __init__(self, root: Graph) -> None:
        self.root = root
        self._attr_cache: dict[tuple[str, str], dict[str, int]] = {}

    def attr_types(self, node: Node) -> dict[str, int]:
        key = (node.domain, node.op_type)
        t = self._attr_cache.get(key)
        if t is None:
            dom = "" if node.domain in ("", "ai.onnx") else node.domain
            t = _schema_attr_types(node.op_type, dom, self.root.opset_imports.get(dom, 0))
            self._attr_cache[key] = t
        return t

    def attribute(self, name: str, value: Any, attr_type: int | None):
        from onnx import AttributeProto as A
        from onnx import helper

        if isinstance(value, Graph):
            return helper.make_attribute(name, self.graph(value))
        if isinstance(value, (list, tuple)) and value and all(isinstance(x, Graph) for x in value):
            a = A(name=name, type=A.GRAPHS)
            a.graphs.extend(self.graph(x) for x in value)
            return a
        if isinstance(value, np.ndarray):
            if attr_type == A.SPARSE_TENSOR:
                from onnx import helper as h

                flat = value.reshape(-1)
                idx = np.nonzero(flat)[0].astype(np.int64)
                sp = h.make_sparse_tensor(array_to_tensor(flat[idx]), array_to_tensor(idx), list(value.shape))
                return helper.make_attribute(name, sp)
            return helper.make_attribute(name, array_to_tensor(value))
        if isinstance(value, (list, tuple)):
            if not value:
                a = A(name=name)
                a.type = attr_type if attr_type else A.INTS  # type: ignore[assignment]
                return a
            if all(isinstance(x, np.ndarray) for x in value):
                return helper.make_attribute(name, [array_to_tensor(x) for x in value])
            value = [x.item() if isinstance(x, np.generic) else x for x in value]
        elif isinstance(value, np.generic):
            value = value.item()
        try:
            if attr_type == A.FLOAT:
                return helper.make_attribute(name, float(value), attr_type=A.FLOAT)
            if attr_type == A.INT:
                return helper.make_attribute(name, int(value), attr_type=A.INT)
            if attr_type == A.FLOATS:
                return helper.make_attribute(name, [float(x) for x in value], attr_type=A.FLOATS)
            if attr_type == A.INTS:
                return helper.make_attribute(name, [int(x) for x in value], attr_type=A.INTS)
            if attr_type == A.STRING:
                return helper.make_attribute(name, value, attr_type=A.STRING)
            if attr_type == A.STRINGS:
                return helper.make_attribute(name, list(value), attr_type=A.STRINGS)
        except (TypeError, ValueError):
            pass
        return helper.make_attribute(name, value)

    def node(self, n: Node):
        from onnx import NodeProto

        p = NodeProto()
        p.op_type = n.op_type
        if n.domain:
            p.domain = n.domain
        p.name = n.name
        p.input.extend("" if v is None else v.name for v in n.inputs)
        outs = [
            "" if (v.meta.get("onnx_absent") and not v.has_uses() and not v.is_graph_output) else v.name
            for v in n.outputs
        ]
        while outs and not outs[-1]:
            outs.pop()
        p.output.extend(outs)
        types = self.attr_types(n)
        for k, v in n.attrs.items():
            if v is None or k.startswith("_"):
                continue
            p.attribute.append(self.attribute(k, v, types.get(k)))
        doc = n.meta.get("doc_string")
        if isinstance(doc, str) and doc:
            p.doc_string = doc
        return p

    def graph(self, g: Graph):
        from onnx import GraphProto

        gp = GraphProto()
        gp.name = g.name
        for v in g.inputs:
            gp.input.append(value_info(v.name, v.type, force=True))
        for v in g.constants.values():
            gp.initializer.append(array_to_tensor(v.const_value, v.name))  # type: ignore[arg-type]  # constants have values
        out_set = set(id(v) for v in g.outputs)
        for n in g.nodes:
            gp.node.append(self.node(n))
            for v in n.outputs:
                if id(v) in out_set or (v.meta.get("onnx_absent") and not v.has_uses()):
                    continue
                vi = value_info(v.name, v.type)
                if vi is not None:
                    gp.value_info.append(vi)
        for v in g.outputs:
            gp.output.append(value_info(v.name, v.type, force=True))
        return gp


def export_onnx(graph: Graph, *, ir_version: int | None = None, producer_name: str = _PRODUCER) -> Any:
    """The graph as an ``onnx.ModelProto`` (the graph is not modified)."""
    import onnx
    from onnx import helper

    try:
        gp = _Exporter(graph).graph(graph)
    except GEError:
        raise
    except Exception as e:
        raise ModelFileError(f"cannot export graph '{graph.name}' to ONNX: {type(e).__name__}: {e}") from e
    opsets = dict(graph.opset_imports)
    if "" not in opsets:
        opsets[""] = onnx.defs.onnx_opset_version()
    opset_ids = [helper.make_opsetid(d, v) for d, v in sorted(opsets.items())]
    if ir_version is None:
        try:
            need = helper.find_min_ir_version_for(opset_ids, ignore_unknown=True)
        except TypeError:  # older onnx without ignore_unknown
            need = helper.find_min_ir_version_for([o for o in opset_ids if o.domain in ("", "ai.onnx.ml")])
        except Exception:
            need = 7
        orig = graph.metadata.get("ir_version")
        # IR >= 4 lets initializers stay out of the graph inputs.
        ir_version = max(int(need), 4, int(orig) if isinstance(orig, int) else 0)
    model = helper.make_model(gp, opset_imports=opset_ids, producer_name=producer_name)
    model.ir_version = int(ir_version)
    md = graph.metadata
    if md.get("model_version"):
        model.model_version = int(md["model_version"])
    if md.get("model_domain"):
        model.domain = str(md["model_domain"])
    if md.get("doc_string"):
        model.doc_string = str(md["doc_string"])
    props = md.get("metadata_props")
    if isinstance(props, dict) and props:
        helper.set_model_props(model, {str(k): str(v) for k, v in props.items()})
    return model


def save_onnx(model, path: str | os.PathLike) -> None:
    """Write ``model``; weights go to external data when the file would pass 2 GiB."""
    import onnx

    path = os.fspath(path)
    try:
        if model.ByteSize() >= 2**31 - 2**20:
            onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=os.path.basename(path) + ".data")
        else:
            onnx.save_model(model, path)
    except OSError as e:
        raise ModelFileError(f"cannot write ONNX model to '{path}': {e.strerror or e}") from None
