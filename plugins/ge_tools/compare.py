"""``ge compare MODEL``: this engine's outputs against a reference on the same inputs.

Exit status: 0 when every output is within ``atol + rtol * |reference|``, 1 when one is not,
2 for a usage error (a bad flag, a missing file).

``--per-node`` runs both sides with their intermediate tensors exposed: the compiled graph is
run again with every value that still has its source name as an extra output (same kernels, no
passes, no memory reuse), and the source ONNX with those names added as graph outputs (for
onnxruntime with its graph optimisations off, so its values are the source graph's). The first
node in schedule (topological) order whose output is outside the tolerance is named.

``--bisect-passes`` compiles the source model again with the pipeline's optional passes switched
off from some point on (the pass manager's order: stages in order, each stage's resolved order)
and binary-searches the first pass after which the outputs diverge. The graph just before that
pass (the passes before it applied) is written as ONNX through the ``onnx`` frontend's exporter:
a repro to attach to a bug report.

``--origin FLOAT_MODEL`` measures a quantised model (run here in int8) against the float model
it was quantised from (run by the reference on the same feeds): max error, error over the
range, SQNR and cosine per output, and with ``--per-node`` per tensor of the float model with
the int8 kernel that computed it and the first layer under ``--sqnr-threshold``. Exit status 0,
or 1 when ``--max-error`` is given and exceeded.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from ge_core.errors import GEError, InputError, ModelFileError, OptionError
from ge_sdk.quant import FUSED_FROM
from ge_sdk.rewrite.driver import REPLACES_META

from .common import (
    REFERENCES,
    Diff,
    add_model_flags,
    check_tolerances,
    compile_options,
    diff,
    emit,
    export_graph,
    is_om,
    make_feeds,
    onnx_node_outputs,
    open_model,
    quant_error,
    ran_with,
    ran_with_text,
    run_reference,
    source_onnx,
    unblock,
    with_outputs,
)
from .frameworks import FRAMEWORK_REFERENCES, run_framework

#: Diverging intermediate values listed after the first (per-node).
MORE = 5


def configure(p: argparse.ArgumentParser) -> None:
    add_model_flags(p)
    p.add_argument("--reference", choices=REFERENCES + FRAMEWORK_REFERENCES, default="onnxruntime",
                   help="what computes the expected outputs: onnxruntime or onnx.reference on the source as ONNX "
                        "(default onnxruntime), or the source's own framework: tensorflow (.pb, SavedModel, "
                        "Keras file) or torch (.pt2)")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (default 1e-3)")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4)")
    p.add_argument("--threads", type=int, metavar="T", help="threads per run for both sides")
    p.add_argument("--per-node", action="store_true",
                   help="compare the intermediate tensors too and name the first node whose output diverges")
    p.add_argument("--bisect-passes", action="store_true",
                   help="find the first pass after which the outputs diverge and write the graph before it")
    p.add_argument("--repro", metavar="FILE.onnx",
                   help="where --bisect-passes writes the graph before the diverging pass "
                        "(default: ge_repro_before_PASS.onnx here)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--origin", metavar="FLOAT_MODEL",
                   help="compare MODEL (a quantised model) with the float model it was quantised from, run by "
                        "--reference on the same inputs: max error, error over the range, SQNR and cosine per output "
                        "(and per layer with --per-node) instead of a tolerance")
    p.add_argument("--max-error", dest="max_error", type=float, metavar="E",
                   help="with --origin: exit 1 when an output's max |diff| over the reference's range exceeds E")
    p.add_argument("--sqnr-threshold", dest="sqnr_threshold", type=float, default=20.0, metavar="DB",
                   help="with --origin --per-node: a layer whose SQNR is under DB diverges (default 20)")


# ------------------------------------------------------------------------------------------------
def compare_outputs(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], rtol: float, atol: float) -> list[Diff]:
    out = []
    for name, a in got.items():
        if name not in ref:
            out.append(Diff(name, False, float("inf"), float("inf"), "the reference has no output of this name"))
            continue
        out.append(diff(name, a, ref[name], rtol, atol))
    return out


def source_names(node, names: set[str], outputs_of: dict[str, list[str]]) -> list[str | None]:
    """For each output of a compiled ``node``: the source model's tensor it stands for, or None.

    A value that kept its source name is itself. A node a pattern fusion made (FusedConv,
    FusedMatMul, LayerNorm, Attention, ...) stands for the output of the last node it replaced,
    which the rewrite driver records in ``node.meta[REPLACES_META]``; a group the automatic fusion
    made lists its members in ``node.meta["fusion_group"]`` (its last member, before the anchor
    conv or matmul, is the group's root). The meta comes from an .om too: checked, not trusted."""
    out: list[str | None] = []
    replaced = node.meta.get(REPLACES_META)
    if not (isinstance(replaced, list) and len(replaced) == len(node.outputs)):
        replaced = [None] * len(node.outputs)
    root = None
    group = node.meta.get("fusion_group")
    if isinstance(group, list) and group and all(isinstance(g, str) for g in group) and len(node.outputs) == 1:
        members = group if node.op_type == "FusedElemwise" else group[:-1]  # the anchor comes last
        root_outs = outputs_of.get(members[-1], []) if members else []
        root = root_outs[0] if root_outs else None
    for i, o in enumerate(node.outputs):
        cand = [o.name, replaced[i], root if i == 0 else None]
        out.append(next((c for c in cand if isinstance(c, str) and c in names), None))
    return out


def per_node(model, src: bytes, feeds: dict[str, np.ndarray], kind: str, rtol: float, atol: float,
             threads: int | None) -> dict[str, Any]:
    """Intermediate tensors of both sides; the first node (schedule order) whose output diverges."""

    outputs_of = onnx_node_outputs(src)
    names = {o for outs in outputs_of.values() for o in outs}
    shown = set(model.output_names)
    pairs: dict[str, str] = {}  # compiled value -> source tensor
    for n in model.graph.node_list():
        for o, s in zip(n.outputs, source_names(n, names, outputs_of)):
            if s is not None and o.type.dtype is not None:
                pairs[o.name] = s
    extra = [c for c in pairs if c not in shown]
    run_opts: dict[str, Any] = {"executor": "sequential"}
    if threads:
        run_opts["threads"] = threads
    try:
        exposed = model.with_outputs(extra, **run_opts)
    except GEError as e:
        raise GEError(f"--per-node: the compiled graph cannot be run with its intermediate values exposed: {e}") from None
    g = exposed.graph
    got = exposed.run(feeds)
    ref = run_reference(kind, with_outputs(src, list(dict.fromkeys(pairs.values()))), feeds, threads, optimize=False)
    diverged: list[dict[str, Any]] = []
    agreed: set[str] = set()
    first_node = None
    compared = fused = 0
    for node in g.node_list():
        for o in node.outputs:
            s = pairs.get(o.name)
            if s is None or s not in ref or o.name not in got:
                continue
            compared += 1
            fused += s != o.name
            d = diff(o.name, got[o.name], ref[s], rtol, atol)
            if d.ok:
                agreed.add(o.name)
            else:
                first_node = first_node or node
                seen = {"value": o.name} if s != o.name else {}
                diverged.append({"node": node.name, "op": node.qualified_op, **d.as_dict(), "output": s, **seen})
    first = diverged[0] if diverged else None
    if first is not None and first_node is not None:
        first["suspects"] = [f"{n.name} ({n.qualified_op})" for n in suspects(g, first_node, agreed)]
    return {"compared": compared, "renamed": fused, "first": first, "diverged": len(diverged),
            "next": diverged[1:1 + MORE]}


def suspects(graph, node, agreed: set[str]) -> list:
    """The nodes that computed ``node``'s output from values that agree with the reference (or
    from inputs and constants): ``node`` and its ancestors up to the agreeing values, in schedule
    order. One of them is wrong. With fused kernels (whose inner values have no source name) this
    is more than the node itself."""
    seen: set = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for v in n.inputs:
            if v is not None and v.producer is not None and v.name not in agreed:
                stack.append(v.producer)
    return [n for n in graph.node_list() if n in seen]


def _base_options(args: argparse.Namespace, model) -> dict[str, Any]:
    """The compile options to bisect under: the .om's own, or those the flags give."""
    if is_om(args.model):
        d = model.options.as_dict()
        for k in ("dump_ir", "config", "fusion_switch_file"):
            d.pop(k, None)
        return d
    return compile_options(args)


def bisect_passes(args: argparse.Namespace, opened, feeds: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                  rtol: float, atol: float) -> dict[str, Any]:
    import ge_core as ge
    from ge_core.options import CompileOptions
    from ge_core.passes import resolve_pipeline
    from ge_core.plugins import get_host

    if opened.source is None:
        raise OptionError("--bisect-passes compiles the source model again, and it is not known here",
                          hint="give it with --source MODEL.onnx")
    regs = get_host().registries
    base = _base_options(args, opened.model)
    if args.threads:
        base["threads"] = args.threads
    opts = CompileOptions.from_any(base)
    order: list[str] = []
    stage_of: dict[str, str] = {}
    for plan in resolve_pipeline(regs.passes, opts):
        for p in plan.passes:
            if not getattr(p, "required", False) and p.name not in stage_of:
                order.append(p.name)
                stage_of[p.name] = plan.name
    graph = ge.load(opened.source, framework=base.get("framework"))
    user_disabled = list(opts.disabled_passes)
    tried: dict[int, tuple[bool, Any]] = {}

    def attempt(k: int) -> tuple[bool, Any]:
        """(diverges, compiled model or error text) with only the first ``k`` optional passes on."""
        if k not in tried:
            o = dict(base)
            o["disabled_passes"] = user_disabled + order[k:]
            try:
                m = ge.compile(graph, o)
                bad = any(not d.ok for d in compare_outputs(m.run(feeds), ref, rtol, atol))
                tried[k] = (bad, m)
            except GEError as e:
                tried[k] = (True, f"does not compile: {e}")
        return tried[k]

    result: dict[str, Any] = {"passes": order, "compiles": 0}
    full_bad, _ = attempt(len(order))
    none_bad, none_m = attempt(0)
    if not full_bad:
        result.update(pass_=None, verdict="the outputs agree with every pass on: nothing to bisect")
    elif none_bad:
        why = none_m if isinstance(none_m, str) else "they diverge"
        result.update(pass_=None, verdict=f"with every optional pass off the outputs still diverge ({why}): the "
                                          "kernels or the required passes differ; use --per-node to find the node")
    else:
        lo, hi = 0, len(order)  # lo agrees, hi diverges
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(mid)[0]:
                hi = mid
            else:
                lo = mid
        culprit = order[hi - 1]
        result.update(pass_=culprit, stage=stage_of[culprit], plugin=regs.passes.origin(culprit), index=hi,
                      verdict=f"the outputs agree with the first {hi - 1} optional passes on and diverge once "
                              f"'{culprit}' runs too")
        before = attempt(hi - 1)[1]
        after = attempt(hi)[1]
        if not isinstance(after, str):
            result["diffs_after"] = [d.as_dict() for d in compare_outputs(after.run(feeds), ref, rtol, atol)]
        else:
            result["note"] = f"with '{culprit}' on the model {after}"
        path = args.repro or f"ge_repro_before_{''.join(c if c.isalnum() or c in '._-' else '_' for c in culprit)}.onnx"
        result["repro"] = _write_repro(before.graph, path, getattr(args, "command_inputs", None))
        result["repro_fused_ops"] = sorted({n.qualified_op for n in before.graph.walk()
                                            if n.domain in regs.ops.internal_domains()})
    result["compiles"] = len(tried)
    result["pass"] = result.pop("pass_")
    return result


def _write_repro(graph, path: str, inputs: Any = None) -> str:
    """The graph as ONNX at ``path``, written through a temporary file (never over an input)."""
    from ge_core.writes import check_target, write_bytes_atomic

    if inputs is not None:
        inputs.check(path, "--repro")
    check_target(path, "the repro model")
    proto = export_graph(graph.copy())
    if proto.ByteSize() < 2**31 - 2**20:
        write_bytes_atomic(path, proto.SerializeToString(), "the repro model", inputs=inputs, flag="--repro")
    else:  # over protobuf's 2 GiB: the exporter writes the weights as external data beside it
        export_graph(graph.copy(), path)
    return path


# ------------------------------------------------------------------------------------------------
# --origin: a quantised model against the float model it was quantised from


def origin_onnx(path: str) -> bytes:
    """The float origin as serialized ONNX (a model of another framework written by the exporter)."""
    import ge_core as ge

    if not os.path.isfile(path):
        raise ModelFileError(f"--origin: the float model '{path}' does not exist",
                             hint="give the float model that MODEL was quantised from")
    if not path.lower().endswith(".onnx"):
        return export_graph(ge.load(path)).SerializeToString()
    import onnx

    with open(path, "rb") as f:
        data = f.read()
    try:
        onnx.load_from_string(data)
    except Exception as e:  # (protobuf's DecodeError and friends)
        raise ModelFileError(f"the float origin '{path}' is not an ONNX model: {type(e).__name__}: {str(e)[:200]}",
                             hint="give with --origin the float .onnx model that MODEL was quantised from") from None
    return data


def _check_origin_inputs(fsrc: bytes, feeds: dict[str, np.ndarray], qpath: str, fpath: str) -> None:
    """The float origin takes the inputs fed to the quantised model: the same names, and the
    same sizes where the origin fixes them. Else a GEError naming both files."""
    import onnx

    g = onnx.load_from_string(fsrc).graph
    inits = {t.name for t in g.initializer}
    want = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
            for i in g.input if i.name not in inits}
    problems = []
    if set(want) != set(feeds):
        problems.append(f"'{qpath}' takes {sorted(feeds)}, '{fpath}' takes {sorted(want)}")
    for name in sorted(set(want) & set(feeds)):
        shape, dims = list(np.shape(feeds[name])), want[name]
        if len(dims) != len(shape) or any(d is not None and d != s for d, s in zip(dims, shape)):
            problems.append(f"input '{name}' is {shape} for '{qpath}' but {['?' if d is None else d for d in dims]} "
                            f"in '{fpath}'")
    if problems:
        raise GEError(f"the quantised model '{qpath}' and its origin '{fpath}' take different inputs: "
                      + "; ".join(problems), hint="give with --origin the float model this model was quantised from")


def _run_origin(kind: str, fsrc: bytes, feeds: dict[str, np.ndarray], threads: int | None, fpath: str,
                *, optimize: bool = True) -> dict[str, np.ndarray]:
    try:
        return run_reference(kind, fsrc, feeds, threads, optimize=optimize)
    except GEError as e:
        raise GEError(f"the float origin '{fpath}' does not run: {e}",
                      hint="check that --origin names the float ONNX model this model was quantised from") from None


def _strip_suffix(name: str) -> list[str]:
    """``name`` and what it is with its fresh-name suffixes (``_1``, ``_2``...) taken off one by one."""
    out = [name]
    while True:
        head, sep, tail = out[-1].rpartition("_")
        if not (sep and head and tail.isdigit()):
            return out
        out.append(head)


def origin_pairs(graph, qgraph, float_names: set[str]) -> dict[str, tuple[str, str]]:
    """``{compiled value: (float origin tensor, how)}``: which tensor of the float model each value
    of the compiled quantised ``graph`` stands for. ``qgraph`` is the quantised model as read
    (its node names are the ones the compiled nodes' meta records). A value stands for a tensor of
    the quantised model (:func:`source_names`; else the output of the latest of the source nodes it
    was made from: its ``ge.fused_from``/``fusion_group`` members, else its own node's name; a
    fake-quant ``<Q>_fq`` made of QuantizeLinear ``<Q>`` stands for the DequantizeLinear output
    after it). That tensor is the float model's tensor of the same name (how ``value``); for the
    output of a DequantizeLinear of a QuantizeLinear of tensor T, T (how ``fake-quant``: the
    quantised value of T). QOperator's ``T_quantized`` is not matched to T: onnxruntime names a
    QLinearConv's output after the Conv's even where it folded the Relu after it in."""
    nodes = {n.name: n for n in qgraph.node_list()}
    order = {name: i for i, name in enumerate(nodes)}
    producer = {o.name: n for n in nodes.values() for o in n.outputs}
    outputs_of = {name: [o.name for o in n.outputs] for name, n in nodes.items()}
    qnames = set(producer)

    def resolve(t: str | None) -> tuple[str, str] | None:
        if t is None:
            return None
        if t in float_names:
            return t, "value"
        dq = producer.get(t)
        q = dq.inputs[0].producer if dq is not None and dq.op_type == "DequantizeLinear" and dq.inputs else None
        if q is not None and q.op_type == "QuantizeLinear" and q.inputs[0] is not None \
                and q.inputs[0].name in float_names:
            return q.inputs[0].name, "fake-quant"
        return None

    def latest(n, o) -> str | None:
        members = [m for k in (FUSED_FROM, "fusion_group") for m in (n.meta.get(k) or ()) if isinstance(m, str)]
        best: tuple[float, str] | None = None
        for m in [*(members or [n.name]), o.name]:
            for s in _strip_suffix(m):
                if s in nodes and len(outputs_of[s]) == 1 and m != o.name:
                    got = (float(order[s]), outputs_of[s][0])
                elif s.endswith("_fq") and s[:-3] in nodes and nodes[s[:-3]].op_type == "QuantizeLinear":
                    q = nodes[s[:-3]]
                    dqs = [u for u in q.outputs[0].users if u.op_type == "DequantizeLinear"]
                    if not dqs:
                        continue
                    got = (order[s[:-3]] + 0.5, dqs[0].outputs[0].name)
                else:
                    continue
                best = got if best is None or got[0] > best[0] else best
                break
        return None if best is None else best[1]

    pairs: dict[str, tuple[str, str]] = {}
    for n in graph.node_list():
        named = source_names(n, qnames, outputs_of)
        for i, o in enumerate(n.outputs):
            if o.type.dtype is None or (np.dtype(o.type.dtype).kind != "f" and _stored_quantised(n) is None):
                continue
            got = resolve(named[i]) or (resolve(latest(n, o)) if len(n.outputs) == 1 else None)
            if got is not None:
                pairs[o.name] = got
    return pairs


def _stored_quantised(n) -> tuple[float, int] | None:
    """``(scale, zero point)`` of an int8 op's output the compiler stores as the uint8 integers
    (``out_dtype`` uint8), or None."""
    a = n.attrs
    if a.get("out_dtype") not in ("uint8", b"uint8") or a.get("out_scale") is None:
        return None
    return float(np.float32(a["out_scale"])), int(a.get("out_zero_point", 0))


def _dequantised(n, value: np.ndarray) -> np.ndarray:
    """A compiled value as float32: a stored uint8 one dequantised with its producer's scale."""
    q = _stored_quantised(n)
    if q is None or np.asarray(value).dtype != np.uint8:
        return value
    return ((np.asarray(value).astype(np.float32) - np.float32(q[1])) * np.float32(q[0])).astype(np.float32)


def _int8_records(model) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The report's int8 rows by compiled node name, and ``{source node name: compiled node}``
    through each such node's ``ge.fused_from``."""
    rows = ((model.report.get("int8") or {}).get("nodes") or {})
    by_source: dict[str, str] = {}
    for n in model.graph.node_list():
        if n.name in rows:
            for s in n.meta.get(FUSED_FROM) or ():
                if isinstance(s, str):
                    by_source.setdefault(s, n.name)
    return rows, by_source


def _kernel(rec: dict[str, Any] | None) -> str | None:
    if not isinstance(rec, dict):
        return None
    return f"float32: {rec.get('why')}" if rec.get("why") else str(rec.get("kernel") or "")


def per_node_origin(model, qsrc: bytes, fsrc: bytes, feeds: dict[str, np.ndarray], kind: str, threads: int | None,
                    threshold: float, fpath: str) -> dict[str, Any]:
    """Every tensor of the float origin that the compiled quantised model computes too, in the
    origin's (topological) order: SQNR and cosine of this engine's value against the origin's,
    the int8 kernel of the node that computed it; the first layer under ``threshold`` dB, the
    worst few."""
    import onnx

    import ge_core as ge

    fnodes = [n for n in onnx.load_from_string(fsrc).graph.node]
    made_by = {o: (n.op_type, n.name) for n in fnodes for o in n.output if o}
    qgraph = ge.load(onnx.load_from_string(qsrc))
    pairs = origin_pairs(model.graph, qgraph, set(made_by))
    best: dict[str, str] = {}  # float tensor -> compiled value (its own value before a fake-quant of it)
    for v, (t, how) in pairs.items():
        if t not in best or (how == "value" and pairs[best[t]][1] != "value"):
            best[t] = v
    shown = set(model.output_names)
    run_opts: dict[str, Any] = {"executor": "sequential"}
    if threads:
        run_opts["threads"] = threads
    try:
        exposed = model.with_outputs([v for v in best.values() if v not in shown], **run_opts)
    except GEError as e:
        raise GEError(f"--per-node: the compiled graph cannot be run with its intermediate values exposed: {e}") from None
    got = exposed.run(feeds)
    ref = _run_origin(kind, with_outputs(fsrc, list(best)), feeds, threads, fpath, optimize=False)
    records, by_source = _int8_records(model)
    node_of = {o.name: n for n in exposed.graph.node_list() for o in n.outputs}
    layers: list[dict[str, Any]] = []
    seen_int8: set[str] = set()
    for t in dict.fromkeys(o for n in fnodes for o in n.output if o in best):
        v = best[t]
        if t not in ref or v not in got:
            continue
        r = np.asarray(ref[t])
        n = node_of[v]
        rec_name = n.name if n.name in records else next(
            (by_source[s] for s in n.meta.get(FUSED_FROM) or () if isinstance(s, str) and s in by_source), None)
        if rec_name is not None:
            seen_int8.add(rec_name)
        op, origin_node = made_by[t]
        layers.append({"tensor": t, "op": op, "origin_node": origin_node, "node": n.name,
                       "compiled_op": n.qualified_op, "value": v, "how": pairs[v][1],
                       "kernel": _kernel(records.get(rec_name) if rec_name else None),
                       **quant_error(unblock(_dequantised(n, got[v]), r.shape), r)})
    first = next((x for x in layers if not x["sqnr_db"] >= threshold), None)
    worst = sorted(layers, key=lambda x: x["sqnr_db"])[:MORE]
    return {"compared": len(layers), "of": len(made_by), "sqnr_threshold": threshold, "layers": layers,
            "first_divergence": first, "worst": [x["tensor"] for x in worst],
            "int8_unmatched": sorted(set(records) - seen_int8)}


def compare_origin(args: argparse.Namespace) -> dict[str, Any]:
    """``--origin``: outputs (and with ``--per-node`` layers) of this engine on the quantised
    ``args.model`` against the float origin's run by ``--reference`` on the same inputs."""
    for flag, v in (("--max-error", args.max_error), ("--sqnr-threshold", args.sqnr_threshold)):
        if v is not None and (not np.isfinite(v) or (flag == "--max-error" and v < 0)):
            raise OptionError(f"{flag} {v}: give a finite number" + (" of at least 0" if flag == "--max-error" else ""))
    if args.threads is not None and args.threads < 1:
        raise OptionError(f"--threads {args.threads}: give a positive number")
    if args.reference in FRAMEWORK_REFERENCES or args.bisect_passes:
        raise OptionError("--origin runs the float model as ONNX and compares tensors by name",
                          hint="use --reference onnxruntime or onnx.reference, without --bisect-passes")
    fpath = os.fspath(args.origin)
    fsrc = origin_onnx(fpath)
    opened = open_model(args, threads=args.threads)
    model = opened.model
    feeds = make_feeds(model, args)
    _check_origin_inputs(fsrc, feeds, opened.path, fpath)
    try:
        got = model.run(feeds)
    except InputError:
        raise
    except GEError as e:
        raise GEError(f"the quantised model '{opened.path}' does not run: {e}") from None
    ref = _run_origin(args.reference, fsrc, feeds, args.threads, fpath)
    outputs = []
    for name, a in got.items():
        if name in ref:
            outputs.append({"name": name, **quant_error(a, ref[name])})
        else:
            outputs.append({"name": name, "max_abs": float("inf"), "max_rel_range": float("inf"),
                            "sqnr_db": float("-inf"), "cosine": 0.0, "note": "the origin has no output of this name"})
    result: dict[str, Any] = {
        "model": opened.path, "origin": fpath, "reference": args.reference, "max_error": args.max_error,
        **ran_with(model, feeds),  # inputs, threads, gear: said on the first line
        "outputs": outputs,
        "ok": args.max_error is None or all(o["max_rel_range"] <= args.max_error for o in outputs),
    }
    if "int8" in model.report:
        i8 = model.report["int8"]
        result["int8"] = {k: i8.get(k) for k in ("ops", "ops_int8", "macs_int8_share")}
    if args.per_node:
        result["per_node"] = per_node_origin(model, source_onnx(opened), fsrc, feeds, args.reference, args.threads,
                                             args.sqnr_threshold, fpath)
    return result


def _db(x: float) -> str:
    return f"{x:.1f}" if np.isfinite(x) else ("inf" if x > 0 else "-inf")


def _table(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    w = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip() for x in rows]


def format_origin(r: dict[str, Any]) -> str:
    lines = [f"{r['model']} against its float origin {r['origin']} ({r['reference']}); {ran_with_text(r)}"]
    if r.get("int8"):
        i8 = r["int8"]
        lines.append(f"int8: {i8['ops_int8']} of {i8['ops']} matrix ops, {i8['macs_int8_share']:.0%} of the MACs")
    rows = [("output", "max abs err", "err/range", "SQNR dB", "cosine")]
    for o in r["outputs"]:
        rows.append((o["name"], f"{o['max_abs']:.3g}", f"{o['max_rel_range']:.3g}", _db(o["sqnr_db"]),
                     f"{o['cosine']:.6f}" + (f" ({o['note']})" if o.get("note") else "")))
    lines += _table(rows)
    pn = r.get("per_node")
    if pn is not None:
        rows = [("tensor (origin op)", "node", "kernel", "SQNR dB", "cosine")]
        for x in pn["layers"]:
            rows.append((f"{x['tensor']} ({x['op']})", x["node"] + (" (fake-quant)" if x["how"] != "value" else ""),
                         x["kernel"] or "-", _db(x["sqnr_db"]), f"{x['cosine']:.6f}"))
        lines += _table(rows)
    if pn is not None:
        lines.append(f"per node: {pn['compared']} of the origin's {pn['of']} tensors compared")
        f = pn["first_divergence"]
        if f is None:
            lines.append(f"no layer under {pn['sqnr_threshold']:g} dB SQNR")
        else:
            lines.append(f"first layer that diverges (SQNR under {pn['sqnr_threshold']:g} dB): '{f['tensor']}' "
                         f"({f['op']}), node '{f['node']}' ({f['kernel'] or f['compiled_op']}): {_db(f['sqnr_db'])} dB")
        lines.append("worst: " + ", ".join(pn["worst"]))
        if pn["int8_unmatched"]:
            lines.append("int8 ops whose output has no tensor of the origin: " + ", ".join(pn["int8_unmatched"]))
    if r["max_error"] is not None:
        lines.append(f"PASS: every output within {r['max_error']:g} of its range" if r["ok"] else
                     f"FAIL: an output's error exceeds {r['max_error']:g} of its range")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
def compare(args: argparse.Namespace) -> dict[str, Any]:
    if args.origin is not None:
        return compare_origin(args)
    if args.max_error is not None:
        raise OptionError("--max-error measures a quantised model against its float origin",
                          hint="give the float model with --origin FLOAT_MODEL")
    check_tolerances(args.rtol, args.atol)
    if args.threads is not None and args.threads < 1:
        raise OptionError(f"--threads {args.threads}: give a positive number")
    from ge_core.writes import check_target

    from .common import command_inputs

    args.command_inputs = command_inputs(args)  # --repro never writes over one of them
    if args.repro and args.bisect_passes:
        check_target(args.command_inputs.check(args.repro, "--repro"), "the repro model")
    if args.reference in FRAMEWORK_REFERENCES and args.per_node:
        raise OptionError(f"--per-node compares intermediate tensors by their ONNX names, which --reference "
                          f"{args.reference} does not give", hint="use --reference onnxruntime with --per-node")
    opened = open_model(args, threads=args.threads)
    model = opened.model
    # the source first: a missing one is said before the inputs are sized
    src = b"" if args.reference in FRAMEWORK_REFERENCES else source_onnx(opened)
    feeds = make_feeds(model, args)
    got = model.run(feeds)  # first: its feed checks name a wrong input better than the reference would
    if args.reference in FRAMEWORK_REFERENCES:
        ref = run_framework(args.reference, opened.source, model, feeds,
                            signature=compile_options(args).get("signature"))
    else:
        ref = run_reference(args.reference, src, feeds, args.threads)
    diffs = compare_outputs(got, ref, args.rtol, args.atol)
    result: dict[str, Any] = {
        "model": opened.path, "source": opened.source, "reference": args.reference,
        "rtol": args.rtol, "atol": args.atol,
        **ran_with(model, feeds),  # inputs, threads, gear: said on the first line
        "outputs": [d.as_dict() for d in diffs],
        "ok": all(d.ok for d in diffs),
    }
    if args.per_node:
        result["per_node"] = per_node(model, src, feeds, args.reference, args.rtol, args.atol, args.threads)
    if args.bisect_passes:
        result["bisect"] = bisect_passes(args, opened, feeds, ref, args.rtol, args.atol)
    return result


def format_text(r: dict[str, Any]) -> str:
    lines = [f"{r['model']} against {r['reference']} (rtol {r['rtol']:g}, atol {r['atol']:g}); {ran_with_text(r)}"]
    rows = [("output", "max abs err", "max rel err", "result")]
    for d in r["outputs"]:
        rows.append((d["name"], f"{d['max_abs']:.3g}", f"{d['max_rel']:.3g}",
                     ("ok" if d["ok"] else "MISMATCH") + (f" ({d['note']})" if d.get("note") else "")))
    w = [max(len(x[i]) for x in rows) for i in range(4)]
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip() for x in rows]
    pn = r.get("per_node")
    if pn is not None:
        f = pn["first"]
        counted = f"per node: {pn['compared']} intermediate values compared"
        if pn.get("renamed"):
            counted += f" ({pn['renamed']} of them fused nodes' outputs, matched to the source tensor each replaced)"
        if f is None:
            lines.append(f"{counted}, all within tolerance")
        else:
            lines.append(f"{counted}, {pn['diverged']} diverge; the first is node '{f['node']}' ({f['op']}), output "
                         f"'{f['output']}'" + (f" (compiled as '{f['value']}')" if f.get("value") else "")
                         + f": max abs err {f['max_abs']:.3g}, max rel err {f['max_rel']:.3g}")
            if len(f.get("suspects", [])) > 1:
                shown = ", ".join(f["suspects"][:8]) + (f" and {len(f['suspects']) - 8} more" if len(f["suspects"]) > 8 else "")
                lines.append(f"  computed from agreeing values by: {shown}")
            for n in pn["next"]:
                lines.append(f"  then '{n['node']}' ({n['op']}) max abs err {n['max_abs']:.3g}")
    b = r.get("bisect")
    if b is not None:
        lines.append(f"bisect: {len(b['passes'])} optional passes, {b['compiles']} compiles: {b['verdict']}")
        if b.get("pass"):
            lines.append(f"first diverging pass: '{b['pass']}' (stage {b['stage']}, plugin {b['plugin']})")
            fused = f"; it holds compiled ops ({', '.join(b['repro_fused_ops'])})" if b.get("repro_fused_ops") else ""
            lines.append(f"repro (the graph before '{b['pass']}'): {b['repro']}{fused}")
            if b.get("note"):
                lines.append(b["note"])
    lines.append("PASS" if r["ok"] else "FAIL: outputs differ beyond the tolerance")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    r = compare(args)
    emit(r, args, format_origin if "origin" in r else format_text)
    return 0 if r["ok"] else 1
