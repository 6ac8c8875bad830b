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
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from ge_core.errors import GEError, OptionError
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
    run_reference,
    source_onnx,
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
def compare(args: argparse.Namespace) -> dict[str, Any]:
    check_tolerances(args.rtol, args.atol)
    if args.threads is not None and args.threads < 1:
        raise OptionError(f"--threads {args.threads}: give a positive number")
    from ge_core.writes import check_target

    from .common import command_inputs

    args.command_inputs = command_inputs(args)  # --repro never writes over one of them
    if args.repro and args.bisect_passes:
        check_target(args.command_inputs.check(args.repro, "--repro"), "the repro model")
    opened = open_model(args, threads=args.threads)
    model = opened.model
    feeds = make_feeds(model, args)
    got = model.run(feeds)  # first: its feed checks name a wrong input better than the reference would
    src = b""
    if args.reference in FRAMEWORK_REFERENCES:
        if args.per_node:
            raise OptionError(f"--per-node compares intermediate tensors by their ONNX names, which --reference "
                              f"{args.reference} does not give", hint="use --reference onnxruntime with --per-node")
        ref = run_framework(args.reference, opened.source, model, feeds,
                            signature=compile_options(args).get("signature"))
    else:
        src = source_onnx(opened)
        ref = run_reference(args.reference, src, feeds, args.threads)
    diffs = compare_outputs(got, ref, args.rtol, args.atol)
    result: dict[str, Any] = {
        "model": opened.path, "source": opened.source, "reference": args.reference,
        "rtol": args.rtol, "atol": args.atol,
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(np.shape(v))} for k, v in feeds.items()},
        "outputs": [d.as_dict() for d in diffs],
        "ok": all(d.ok for d in diffs),
    }
    if args.per_node:
        result["per_node"] = per_node(model, src, feeds, args.reference, args.rtol, args.atol, args.threads)
    if args.bisect_passes:
        result["bisect"] = bisect_passes(args, opened, feeds, ref, args.rtol, args.atol)
    return result


def format_text(r: dict[str, Any]) -> str:
    lines = [f"{r['model']} against {r['reference']} (rtol {r['rtol']:g}, atol {r['atol']:g}); inputs "
             + ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in r["inputs"].items())]
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
    emit(r, args, format_text)
    return 0 if r["ok"] else 1
