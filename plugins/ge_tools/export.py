"""``ge export MODEL.om -o out.onnx``: the compiled graph as ONNX, for Netron or onnxruntime.

Standard ops stay standard ONNX; fused ops keep their compiler domain (``ge.fused``, declared in
the model's opset imports) with their attributes, and each such node's ``doc_string`` says what
it computes (the op's registered description). ``onnx.checker`` accepts the file; onnxruntime
runs it only when it holds no fused op (it has no kernels for ``ge.fused``). The file is data for
viewing and checking: this engine does not load compiled ops back from ONNX.
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
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")


def export_om(model, path: str | None = None, *, check: bool = True) -> Any:
    """The compiled model's graph as an ``onnx.ModelProto`` (fused ops documented), checked, and
    written to ``path`` when given (by the ``onnx`` frontend's exporter, found by registry)."""
    from ge_core.plugins import get_host

    graph = model.graph.copy()
    ops = get_host().registries.ops
    internal = ops.internal_domains()
    used: dict[str, int] = {}
    for node in graph.walk():
        if node.domain in internal:
            d = ops.lookup(node.domain, node.op_type)
            if d is not None and d.doc and not node.meta.get("doc_string"):
                node.meta["doc_string"] = f"{node.qualified_op}: {d.doc}"
            used[node.qualified_op] = used.get(node.qualified_op, 0) + 1
    md = graph.metadata
    if used:
        props = dict(md.get("metadata_props") or {})
        props["ge.fused_ops"] = ", ".join(f"{k} x{v}" for k, v in sorted(used.items()))
        props["ge.note"] = ("compiled by ge-python; ops of domain ge.fused are the engine's fused kernels, "
                            "documented in each node's doc_string; onnxruntime cannot run them")
        md["metadata_props"] = props
    md["doc_string"] = (str(md["doc_string"]) + "\n" if md.get("doc_string") else "") + \
        f"compiled graph of {model.source or 'a model'}"
    proto = export_graph(graph, path)
    if check:
        checker(proto if proto.ByteSize() < _TWO_GIB else path)
    return proto


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
    proto = export_om(model, None, check=False)
    if proto.ByteSize() < _TWO_GIB:  # one file, written through a temporary file beside it
        if not args.no_check:
            checker(proto)
        write_bytes_atomic(out, proto.SerializeToString(), "the ONNX file", inputs=inputs, flag="-o/--output")
    else:  # weights as external data beside it (OUT.data)
        proto = export_om(model, out, check=not args.no_check)
    if not args.quiet:
        fused = next((p.value for p in proto.metadata_props if p.key == "ge.fused_ops"), "none")
        print(f"wrote {out}: {len(proto.graph.node)} nodes, fused ops: {fused}", file=sys.stderr)
    return 0
