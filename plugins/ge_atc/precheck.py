"""``atc --mode=3``: pre-check a model without building it.

GE's pre-check (``--mode=3 --check_report=FILE``, default ``check_result.json``) writes one JSON
object: the model's ``name``, its ``result`` (``success`` / ``failed``), ``total``/``pass``/``fail``
op counts and ``op``, one entry per node in network order with ``name``, ``type``, ``result`` and
``cause`` (a list of ``{code, message}``). That layout is GE's (``PreChecker::Save`` in GE's
parser); this engine adds, per op, ``domain`` and ``support``: ``native`` (a registered kernel of
the backend builds for the node), ``reference`` (only the backend's onnx.reference fallback runs
it, slowly) or ``none``. A cause's ``code`` is GE's error name (``TYPE_UNSUPPORTED``,
``PARAM_INVALID``, ``NAME_REPEATED``) or ``OK`` for a note on a node that passes.

Each node is checked as the compile would check it: its op must be registered; after the
prepare stage (type and shape inference) the backend's kernel factory is asked to build it, so
every dtype or attribute the kernel refuses is named with the node. No .om is written.
"""

from __future__ import annotations

import os
from typing import Any

from ge_core.errors import GEError, UnsupportedOpError, reraise_interrupt
from ge_core.ir.graph import Graph, Node
from ge_core.kernel import KernelSpec, caps
from ge_core.ops import OpRegistry
from ge_core.options import CompileOptions

SUCCESS, FAILED = "success", "failed"
NATIVE, REFERENCE, NONE = "native", "reference", "none"
#: ge_cpu's ``caps(factory).kind`` of its onnx.reference fallback.
_REFERENCE_KIND = "onnx.reference"


def precheck(source: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The pre-check report of the model at ``source`` compiled with ``opts`` (GE's layout)."""
    import ge_core as ge
    from ge_core.passes import PassContext, PassManager, resolve_pipeline
    from ge_core.plugins import get_host

    host = get_host()
    regs = host.registries
    options = CompileOptions.from_any(opts)
    options.check_extra(regs.options)
    name = os.path.splitext(os.path.basename(os.fspath(source).rstrip("/")))[0] or "model"
    try:
        graph = ge.load(source, framework=options.framework)
    except UnsupportedOpError as e:
        listed = _listed_ops(source, options.framework)
        if listed is None:  # a frontend whose nodes cannot be listed without it: the error names them
            return _report(name, [], [{"code": "TYPE_UNSUPPORTED", "message": e.detail}])
        return _unknown_ops_report(name, listed, regs, options)
    entries: dict[int, dict[str, Any]] = {}
    order: list[Node] = list(graph.walk())
    for node in order:
        entries[id(node)] = {"name": node.name, "type": node.op_type, "domain": node.domain or "ai.onnx",
                             "result": SUCCESS, "support": NATIVE, "cause": []}
    _check_names([entries[id(n)] for n in order])
    model_causes: list[dict[str, str]] = []
    unknown = [n for n in order if regs.ops.lookup(n.domain, n.op_type) is None]
    for n in unknown:
        _fail(entries[id(n)], "TYPE_UNSUPPORTED", f"The type is not supported: no plugin registers op "
                                                  f"{n.domain + '::' if n.domain else ''}{n.op_type}", NONE)
    if not unknown:
        g: Graph | None = None
        try:
            copy = graph.copy()  # the prepare stage applies input_shape and out_nodes (ge_opset's input_shapes)
            plans = [s for s in resolve_pipeline(regs.passes, options) if s.name == "prepare"]
            g = PassManager(plans, host=None, strict=True).run(copy, PassContext(options, regs))
        except GEError as e:
            model_causes.append({"code": "PARAM_INVALID", "message": str(e)})
        if g is not None:
            by_name = {n.name: n for n in graph.walk()}
            backend = regs.backend(options.soc_version)
            kernels = regs.kernels_for(backend.name)
            for node in g.walk():
                entry = entries.get(id(by_name.get(node.name)))
                if entry is not None:
                    _check_kernel(node, entry, kernels, options, backend.name)
    return _report(name, [entries[id(n)] for n in order], model_causes)


def _report(name: str, ops: list[dict[str, Any]], model_causes: list[dict[str, str]]) -> dict[str, Any]:
    fail = sum(1 for e in ops if e["result"] == FAILED)
    report: dict[str, Any] = {
        "name": name,
        "result": FAILED if fail or model_causes else SUCCESS,
        "total": len(ops),
        "pass": len(ops) - fail,
        "fail": fail,
        "op": ops,
    }
    if model_causes:
        report["cause"] = model_causes
    return report


def _listed_ops(source: str, framework: str | None) -> list[tuple[str, str, str]] | None:
    """(name, op type, domain) of every node of an ONNX file, subgraphs included, read with the
    onnx package alone (no external data is read); None for other formats."""
    path = os.fspath(source)
    if framework not in (None, "onnx", "5") or not os.path.isfile(path):
        return None
    try:
        import onnx

        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - not an ONNX file after all: the frontend's error stands
        return None
    out: list[tuple[str, str, str]] = []
    stack = [model.graph]
    while stack:
        g = stack.pop(0)
        for n in g.node:
            out.append((n.name, n.op_type, n.domain))
            for a in n.attribute:
                stack.extend([a.g] if a.HasField("g") else [])
                stack.extend(a.graphs)
    return out


def _unknown_ops_report(name: str, listed: list[tuple[str, str, str]], regs, options: CompileOptions) -> dict[str, Any]:
    """The report of a model whose frontend refused unregistered ops: every node, the unknown ones
    failed; the known ones are judged by the backend's kernel table only (their dtypes and
    attributes need type inference, which needs every op known)."""
    kernels = regs.kernels_for(regs.backend(options.soc_version).name)
    ops = []
    for node_name, op_type, domain in listed:
        entry: dict[str, Any] = {"name": node_name, "type": op_type, "domain": domain or "ai.onnx",
                                 "result": SUCCESS, "support": NATIVE, "cause": []}
        if regs.ops.lookup(domain, op_type) is None:
            _fail(entry, "TYPE_UNSUPPORTED", f"The type is not supported: no plugin registers op "
                                             f"{domain + '::' if domain else ''}{op_type}", NONE)
        else:
            f = kernels.get((OpRegistry.norm_domain(domain), op_type))
            if f is None:
                _fail(entry, "TYPE_UNSUPPORTED", f"The type is not supported: no kernel for {op_type}", NONE)
            else:
                entry["support"] = REFERENCE if caps(f).kind == _REFERENCE_KIND else NATIVE
                entry["cause"].append({"code": "OK", "message": "dtypes and attributes not checked: the model "
                                                                "has ops no plugin registers"})
        ops.append(entry)
    _check_names(ops)
    return _report(name, ops, [])


def _fail(entry: dict[str, Any], code: str, message: str, support: str | None = None) -> None:
    entry["result"] = FAILED
    if support is not None:
        entry["support"] = support
    cause = {"code": code, "message": message}
    if cause not in entry["cause"]:
        entry["cause"].append(cause)


def _check_names(ops: list[dict[str, Any]]) -> None:
    """GE fails two ops of one name (``NAME_REPEATED``); unnamed nodes are not compared."""
    seen: dict[str, dict[str, Any]] = {}
    for e in ops:
        if e["name"]:
            first = seen.setdefault(e["name"], e)
            if first is not e:
                for m in (first, e):
                    _fail(m, "NAME_REPEATED", "The name is repeated.")


def _build(factory, node: Node, options: CompileOptions):
    spec = KernelSpec.from_node(node, options)
    return factory(spec)


def _check_kernel(node: Node, entry: dict[str, Any], kernels, options: CompileOptions, backend: str) -> None:
    """Ask the backend's factory to build ``node``'s kernel: native, reference fallback or none."""
    factory = kernels.get((OpRegistry.norm_domain(node.domain), node.op_type))
    if factory is None:
        _fail(entry, "TYPE_UNSUPPORTED", f"The type is not supported: backend '{backend}' has no kernel for "
                                         f"{node.op_type}", NONE)
        return
    kind = caps(factory).kind or "native"
    if node.subgraphs():  # a control-flow kernel builds its bodies, whose nodes are checked one by one
        entry["support"] = REFERENCE if kind == _REFERENCE_KIND else NATIVE
        return
    # ge_cpu's native factories wrap the real one (functools.wraps) to hand what it refuses to the
    # onnx.reference fallback: asking the wrapped one tells native support from the fallback
    native = getattr(factory, "__wrapped__", None) if kind != _REFERENCE_KIND else None
    native_reason = None
    if native is not None:
        try:
            _build(native, node, options)
            entry["support"] = NATIVE
            return
        except UnsupportedOpError as e:
            native_reason = e.detail
        except GEError as e:
            _fail(entry, "PARAM_INVALID", e.detail, NONE)
            return
        except BaseException as e:  # noqa: BLE001 - a factory bug is this node's failure, named
            reraise_interrupt(e)
            _fail(entry, "PARAM_INVALID", f"building the kernel failed: {type(e).__name__}: {e}", NONE)
            return
    try:
        kernel = _build(factory, node, options)
    except GEError as e:
        _fail(entry, "PARAM_INVALID", native_reason or e.detail, NONE)
        return
    except BaseException as e:  # noqa: BLE001
        reraise_interrupt(e)
        _fail(entry, "PARAM_INVALID", native_reason or f"building the kernel failed: {type(e).__name__}: {e}", NONE)
        return
    if caps(kernel).kind == _REFERENCE_KIND or kind == _REFERENCE_KIND:
        entry["support"] = REFERENCE
        why = f"the native kernel refuses it ({native_reason})" if native_reason else "no native kernel"
        entry["cause"].append({"code": "OK", "message": f"runs through the onnx.reference fallback (slow): {why}"})
    else:
        entry["support"] = NATIVE


def summary_line(report: dict[str, Any]) -> str:
    bad = [e for e in report["op"] if e["result"] == FAILED]
    shown = "; ".join(f"{e['name']} ({e['type']}): {e['cause'][0]['message'] if e['cause'] else 'failed'}"
                      for e in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    model = "; ".join(c["message"] for c in report.get("cause", []))
    return (f"pre-check {report['result']}: {report['pass']} of {report['total']} ops pass"
            + (f"; failed: {shown}{more}" if bad else "") + (f"; {model}" if model else ""))

