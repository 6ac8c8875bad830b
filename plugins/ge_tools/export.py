"""``ge export MODEL.om -o out.onnx``: the compiled graph as ONNX, for Netron or onnxruntime.

Standard ops stay standard ONNX. By default every op only the compiler makes (the fused ops of
``ge.fused``, the cpu backend's blocked-layout ops and ``PackedMatMul`` of ``ge.cpu``, a quantised
model's ``ge.quant::FakeQuant``) is written as the standard ops it stands for (its OpDef's
``lower``, :mod:`ge_sdk.lowering`): the file runs in onnxruntime with the .om's outputs. An op
with no such form (an int8 kernel's) is refused by name: no file is written. With
``keep_compiled`` (``--keep-compiled-ops``) they keep their compiler domains with their attributes,
each node's ``doc_string`` saying what it computes (the op's registered description): for viewing,
onnxruntime cannot run them. Every domain a node names is declared in the opset imports.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ge_core.errors import GEError, ModelFileError

from .common import export_graph, file_arg

_TWO_GIB = 2**31 - 2**20


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a compiled .om")
    p.add_argument("-o", "--output", required=True, help="the ONNX file to write")
    p.add_argument("--no-check", action="store_true", help="do not run onnx.checker on the result")
    p.add_argument("--keep-compiled-ops", action="store_true",
                   help="keep the compiler's ops (domains ge.fused, ge.cpu, ge.quant) as they are instead of their "
                        "standard ONNX forms (for viewing: onnxruntime cannot run them)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")


def export_om(model, path: str | None = None, *, check: bool = True, keep_compiled: bool = False) -> Any:
    """The compiled model's graph as an ``onnx.ModelProto``, checked, and written to ``path``
    when given (by the ``onnx`` frontend's exporter, found by registry): the compiler's ops in
    their standard ONNX forms, or with ``keep_compiled`` as they are (documented)."""
    from ge_core.plugins import get_host

    graph = model.graph.copy()
    ops = get_host().registries.ops
    internal = ops.internal_domains()
    lowered = {} if keep_compiled else lower_compiled(graph, ops, internal)
    used: dict[str, int] = {}
    for node in graph.walk():
        if node.domain in internal:
            d = ops.lookup(node.domain, node.op_type)
            if d is not None and d.doc and not node.meta.get("doc_string"):
                node.meta["doc_string"] = f"{node.qualified_op}: {d.doc}"
            used[node.qualified_op] = used.get(node.qualified_op, 0) + 1
    # every domain a node names is declared (the compiler's at version 1), no compiler domain else
    named = {ops.norm_domain(node.domain) for node in graph.walk()}
    for dom in list(graph.opset_imports):
        if dom in internal and dom not in named:
            del graph.opset_imports[dom]
    for dom in named:
        graph.opset_imports.setdefault(dom, 1)
    md = graph.metadata
    props = dict(md.get("metadata_props") or {})
    if used:
        props["ge.fused_ops"] = ", ".join(f"{k} x{v}" for k, v in sorted(used.items()))
        props["ge.note"] = ("compiled by ge-python; the ops of its domains (" + ", ".join(sorted(
            {k.split("::")[0] for k in used})) + ") are the engine's compiled kernels, documented in each node's "
            "doc_string; onnxruntime cannot run them (export without --keep-compiled-ops for standard ONNX)")
    if lowered:
        props["ge.lowered_ops"] = ", ".join(f"{k} x{v}" for k, v in sorted(lowered.items()))
    if props:
        md["metadata_props"] = props
    md["doc_string"] = (str(md["doc_string"]) + "\n" if md.get("doc_string") else "") + \
        f"compiled graph of {model.source or 'a model'}"
    proto = export_graph(graph, path)
    if check:
        checker(proto if proto.ByteSize() < _TWO_GIB else path)
    return proto


def lower_compiled(graph, ops, internal: set[str]) -> dict[str, int]:
    """Replace every node of ``internal`` domains (in ``graph`` and its subgraphs) by its OpDef's
    standard ONNX form; counts by op. Raises a GEError naming the first op that has none."""
    opset = int(graph.opset_imports.get("", 0) or graph.opset_imports.get("ai.onnx", 0) or 0)
    if not opset:
        import onnx

        opset = onnx.defs.onnx_opset_version()
    done: dict[str, int] = {}
    for node in list(graph.walk()):
        if ops.norm_domain(node.domain) not in internal:
            continue
        d = ops.lookup(node.domain, node.op_type)
        if d is None or d.lower is None:
            raise GEError(f"ge export: {node.describe()} has no standard ONNX form",
                          hint="pass --keep-compiled-ops to export it as it is (onnxruntime cannot run it)")
        g = node.graph
        outs = list(d.lower(node, opset))
        for old, new in zip(node.outputs, outs):
            if new.type.dtype is None and new.type.shape is None:
                new.type = old.type  # (the same value: what a later lowering reads of it)
            old.replace_all_uses_with(new)
        consts = [v for v in node.inputs if v is not None and v.is_constant]
        for i in range(len(node.inputs)):
            node.set_input(i, None)
        g.remove_node(node)
        for v in consts:  # a packed weight nothing reads any more
            if not v.has_uses() and not v.is_graph_output and v.graph is g and g.constants.get(v.name) is v:
                g.remove_constant(v)
        done[node.qualified_op] = done.get(node.qualified_op, 0) + 1
    return done


def checker(model: Any) -> None:
    """``onnx.checker`` on a ModelProto or a path; its complaint as a GEError."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise GEError(f"the exported graph fails onnx.checker: {str(e).splitlines()[0][:300]}",
                      hint="this is a bug in the exporter; report it with the model (or pass --no-check)") from None


def run(args: argparse.Namespace) -> int:
    import ge_core as ge

    from .common import is_om

    if not is_om(args.model):
        raise ModelFileError(f"'{args.model}' is not a compiled .om",
                             hint="compile it first: ge compile MODEL -o MODEL.om")
    from ge_core.writes import check_target, write_bytes_atomic

    from .common import command_inputs

    inputs = command_inputs(args)
    out = check_target(inputs.check(file_arg(args.output, "the ONNX file"), "-o/--output"), "the ONNX file")
    inputs.check(out + ".data", "-o/--output (its external data file)")
    model = ge.load_om(args.model)
    keep = bool(args.keep_compiled_ops)
    proto = export_om(model, None, check=False, keep_compiled=keep)
    if proto.ByteSize() < _TWO_GIB:  # one file, written through a temporary file beside it
        if not args.no_check:
            checker(proto)
        write_bytes_atomic(out, proto.SerializeToString(), "the ONNX file", inputs=inputs, flag="-o/--output")
    else:  # weights as external data beside it (OUT.data)
        proto = export_om(model, out, check=not args.no_check, keep_compiled=keep)
    if not args.quiet:
        props = {p.key: p.value for p in proto.metadata_props}
        what = f"compiled ops kept: {props.get('ge.fused_ops', 'none')}" if keep else \
            f"compiled ops lowered to standard ONNX: {props.get('ge.lowered_ops', 'none')}"
        print(f"wrote {out}: {len(proto.graph.node)} nodes, {what}", file=sys.stderr)
    return 0
