"""The quantiser in AMCT's place: ``ge.quantize(graph, calibration, ...)`` and the ``quantize``
pass that ATC's ``--compression_optimize_conf`` drives.

It writes a standard QDQ graph, as onnxruntime's ``quantize_static`` (QDQ format) does, so the
``qdq_regions`` pass (and any ONNX runtime, through the exporter) runs it:

1. BatchNormalization folds into the Conv/Gemm before it (the engine's registered fusion
   patterns ``batchnorm_conv_fusion`` / ``batchnorm_gemm_fusion``), so the folded weight is the
   one quantised;
2. the float graph runs on the calibration feeds (compiled by this engine, every activation
   that a layer reads as an extra output) and :mod:`.calibration` estimates each one's range;
3. *layers* are Conv, MatMul, Gemm (activation inputs quantised, constant weights symmetric
   int8 per output channel: axis 0 of a Conv's and a transposed Gemm's weight, the last axis of
   a MatMul's) and Add, Concat and the pools (their inputs quantised, so int8 regions connect
   across residuals); a float activation gets one ``QuantizeLinear -> DequantizeLinear`` pair,
   shared by the quantised layers reading it; a bias becomes an int32 ``DequantizeLinear`` with
   scale ``x_scale * w_scale``;
4. accuracy control: each layer quantised alone (a shadow copy of it reading the quantised
   float input, beside the float layer, in one run) gives its SQNR and cosine; with
   ``max_error`` the layers are kept float one at a time, lowest SQNR first, until the model's
   error (``max|q - f| / (max f - min f)`` over every output and the calibration feeds) holds.

The report (``report=`` dict and ``graph.metadata["quantize_report"]``) gives each layer's
scales and zero points, its error alone and in the quantised model, what stayed float and why,
the model error before and after, and the first layer whose in-model SQNR falls under
:data:`DIVERGENCE_DB`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_core.errors import OptionError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.passes import PassContext, PassResult

from .calibration import METHODS, Collector, activation_params, weight_params

ONNX = ("", "ai.onnx")
#: matrix ops: the input index of the weight
MATRIX = {"Conv": 1, "MatMul": 1, "Gemm": 1}
#: ops whose activation inputs are quantised so int8 regions connect (onnxruntime's QDQ set)
CONNECT = ("Add", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool")
#: the fusion patterns that fold BatchNormalization into the matrix op before it
BN_FOLDS = ("batchnorm_conv_fusion", "batchnorm_gemm_fusion")
#: in-model SQNR (dB) under which a layer is the report's first divergence
DIVERGENCE_DB = 20.0
REPORT_KEY = "quantize_report"
#: node meta key where the rewrite driver keeps the source names of a rewritten node
FUSED_FROM = "ge.fused_from"


@dataclass
class Layer:
    """A node the quantiser rewrites: which inputs are activations, the weight and its axis."""

    node: Node
    acts: list[int]
    weight: int | None = None
    axis: int | None = None
    bias: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Err:
    """Streaming SQNR and cosine of a quantised tensor ``q`` against its float ``f``."""

    def __init__(self) -> None:
        self.ff = self.ee = self.fq = self.qq = 0.0

    def add(self, f: np.ndarray, q: np.ndarray) -> None:
        f64, q64 = np.asarray(f, np.float64).reshape(-1), np.asarray(q, np.float64).reshape(-1)
        self.ff += float(f64 @ f64)
        self.qq += float(q64 @ q64)
        self.fq += float(f64 @ q64)
        self.ee += float((f64 - q64) @ (f64 - q64))

    @property
    def sqnr(self) -> float:
        if self.ee == 0:
            return math.inf
        return 10.0 * math.log10(self.ff / self.ee) if self.ff > 0 else -math.inf

    @property
    def cosine(self) -> float:
        d = math.sqrt(self.ff * self.qq)
        return self.fq / d if d > 0 else float(self.ff == self.qq)


def quantize(graph: Graph, calibration: Iterable[Mapping[str, Any]], *, method: str = "minmax",
             per_channel: bool = True, activation_type: str = "uint8", skip_layers: Iterable[str] = (),
             max_error: float | None = None, percentile: float = 99.99,
             report: dict[str, Any] | None = None, weights_only: int | None = None, block_size: int = 32,
             symmetric: bool = False, accuracy_level: int | None = None) -> Graph:
    """A QDQ copy of ``graph`` calibrated on ``calibration`` (an iterable of feed dicts, input
    name -> array); ``graph`` is not changed. See the module docstring; the report goes into
    ``report`` (when given) and ``graph.metadata["quantize_report"]`` of the result.
    ``weights_only=4|8``: MatMul weights in blocks of ``block_size`` (MatMulNBits), no calibration
    (``calibration`` may be None; ``skip_layers`` kept float): :mod:`.weights_only`."""
    if weights_only is not None:
        from .weights_only import quantize_weights

        return quantize_weights(graph, weights_only, block_size, symmetric, skip_layers, accuracy_level, report)
    g = graph.copy()
    got = quantize_in_place(g, calibration, method=method, per_channel=per_channel,
                            activation_type=activation_type, skip_layers=skip_layers, max_error=max_error,
                            percentile=percentile)
    if report is not None:
        report.update(got)
    return g


def _check(method: str, activation_type: str, max_error: float | None, percentile: float) -> None:
    if method not in METHODS:
        raise OptionError(f"quantize: method {method!r} is not one of {', '.join(METHODS)}",
                          hint="minmax, percentile (with percentile=) or entropy")
    if activation_type not in ("uint8", "int8"):
        raise OptionError(f"quantize: activation_type {activation_type!r} is not uint8 or int8",
                          hint="uint8: asymmetric activations (the default); int8: symmetric")
    if max_error is not None and not (isinstance(max_error, (int, float)) and max_error > 0):
        raise OptionError(f"quantize: max_error {max_error!r} is not a positive number",
                          hint="a relative output error such as 0.02 (max|diff| / output range)")
    if not (isinstance(percentile, (int, float)) and 50 < percentile <= 100):
        raise OptionError(f"quantize: percentile {percentile!r} is not in (50, 100]", hint="for example 99.99")


def quantize_in_place(g: Graph, calibration: Iterable[Mapping[str, Any]], *, method: str = "minmax",
                      per_channel: bool = True, activation_type: str = "uint8", skip_layers: Iterable[str] = (),
                      max_error: float | None = None, percentile: float = 99.99) -> dict[str, Any]:
    """Quantise ``g`` itself (the ``quantize`` pass's form); returns the report."""
    _check(method, activation_type, max_error, percentile)
    try:
        feeds = [dict(f) for f in calibration]
    except (TypeError, ValueError):
        raise OptionError(f"quantize: graph '{g.name}': the calibration data must be an iterable of feed dicts",
                          hint="give e.g. [{'input': array}, ...]: one dict (input name -> array) per batch") from None
    if not feeds:
        raise OptionError(f"quantize: graph '{g.name}': the calibration data holds no feed",
                          hint="give at least one feed dict (input name -> array)")
    skip = _skip_names(g, skip_layers)
    folded = _fold_batchnorm(g)
    if g.opset_imports.get("", 13) < 13:
        per_channel = False  # per-axis QuantizeLinear/DequantizeLinear need opset 13
    layers = [ly for ly in _layers(g) if ly.node.name not in skip]
    outputs = [v.name for v in g.outputs]
    acts = list(dict.fromkeys(ly.node.inputs[i].name for ly in layers for i in ly.acts))  # type: ignore[union-attr]
    cols: dict[str, Collector] = {a: Collector() for a in acts}
    kinds: dict[str, str] = {}
    float_out = []
    for res in _runs(g, acts, feeds):
        for a in acts:
            cols[a].add(res[a])
            kinds[a] = res[a].dtype.kind
        float_out.append({o: res[o] for o in outputs})
    layers = [ly for ly in layers if all(kinds.get(ly.node.inputs[i].name) == "f" for i in ly.acts)]  # type: ignore[union-attr]
    params = {a: activation_params(*cols[a].range(method, percentile), activation_type) for a in acts if kinds[a] == "f"}
    q = Quant(params, activation_type, per_channel)
    alone = _alone(g, layers, q, feeds)
    kept: dict[str, str] = {}
    qg = _quantized(g, layers, q, kept)
    err = before = _model_error(qg, feeds, float_out)
    order = sorted(layers, key=lambda ly: alone[ly.node.name].sqnr)
    while max_error is not None and err > max_error and len(kept) < len(layers):
        worst = next(ly for ly in order if ly.node.name not in kept)
        kept[worst.node.name] = (f"max_error {max_error}: model error {err:.4g} with it quantised; its SQNR alone "
                                 f"{alone[worst.node.name].sqnr:.1f} dB is the lowest left")
        qg = _quantized(g, layers, q, kept)
        err = _model_error(qg, feeds, float_out)
    inmodel = _in_model(g, qg, [ly for ly in layers if ly.node.name not in kept], feeds)
    rep = _report(layers, q, alone, inmodel, kept, skip, dict(method=method, per_channel=per_channel,
                  activation_type=activation_type, percentile=percentile, max_error=max_error, batches=len(feeds),
                  batchnorm_folded=folded, model_error_before=before, model_error_after=err))
    _adopt(g, qg)
    g.metadata[REPORT_KEY] = rep
    return rep


def _skip_names(g: Graph, skip_layers: Iterable[str]) -> set[str]:
    if isinstance(skip_layers, str):
        skip_layers = [skip_layers]
    skip = {str(s) for s in skip_layers}
    names = [n.name for n in g.nodes]
    for s in sorted(skip):
        if s not in names:
            from ge_core.registry import close_matches

            raise OptionError(f"quantize: skip_layers names '{s}', which is no node of graph '{g.name}'"
                              f"{close_matches(s, names)}", hint="give node names of the model")
    return skip


def _fold_batchnorm(g: Graph) -> int:
    """Fold BatchNormalization into the Conv/Gemm before it with the engine's own fusion
    patterns (the registry's, when a plugin registers them; they match typed values, so the
    registered ``infer_shapes`` pass types the graph first); the count folded."""
    from ge_core.options import CompileOptions
    from ge_core.plugins import get_host
    from ge_sdk.rewrite import rewrite

    regs = get_host().registries
    rules = [r for r in (regs.fusion_patterns.get(name) for name in BN_FOLDS) if r is not None]
    infer = regs.passes.get("infer_shapes")
    if not rules or not any(n.op_type == "BatchNormalization" for n in g.nodes):
        return 0
    if infer is not None:
        infer.run(g, PassContext(CompileOptions(), regs, host=get_host(), pass_name="infer_shapes"))
    stats: dict[str, int] = {}
    rewrite(g, rules, ops=regs.ops, stats=stats)
    for n in g.node_list():  # the folded op takes its source's name back (skip_layers, reports name it)
        names = [m for m in n.meta.get(FUSED_FROM) or () if n.name.startswith(m) and m not in g.node_names]
        if n.op_type in MATRIX and names:
            g.node_names.release(n.name)
            n.name = g.node_names.claim(names[0])
    return sum(stats.values())


def _onnx(n: Node) -> bool:
    return n.domain in ONNX


def _const_float(v: Value | None) -> bool:
    return v is not None and v.const_value is not None and v.const_value.dtype == np.float32


def _layers(g: Graph) -> list[Layer]:
    """The nodes of ``g`` the quantiser rewrites, in graph order."""
    out = []
    for n in g.node_list():
        if not _onnx(n) or not n.inputs or n.inputs[0] is None:
            continue
        if n.op_type in MATRIX and len(n.inputs) > 1 and n.inputs[1] is not None:
            w = n.inputs[1]
            if n.inputs[0].const_value is not None:
                continue
            if not _const_float(w):
                out.append(Layer(n, [0, 1]))
                continue
            assert w.const_value is not None
            rank = w.const_value.ndim
            if n.op_type == "Conv":
                axis: int | None = 0
            elif n.op_type == "Gemm":
                axis = 0 if n.attrs.get("transB", 0) else 1
            else:
                axis = rank - 1 if rank >= 2 else None
            bias = 2 if len(n.inputs) > 2 and _const_float(n.inputs[2]) and n.inputs[2].const_value.ndim == 1 else None  # type: ignore[union-attr]
            if n.op_type == "Gemm" and (n.attrs.get("alpha", 1.0) != 1.0 or n.attrs.get("beta", 1.0) != 1.0):
                bias = None
            out.append(Layer(n, [0], 1, axis, bias))
        elif n.op_type in CONNECT:
            acts = [i for i, v in enumerate(n.inputs) if v is not None and v.const_value is None]
            if n.op_type not in ("Add", "Concat"):
                acts = acts[:1]
            elif n.op_type == "Add" and len(acts) < 2:
                continue  # an Add of a constant is a bias, not a join of two regions
            if acts:
                out.append(Layer(n, acts))
    return out


def _runs(g: Graph, names: list[str], feeds: list[dict[str, Any]]):
    """Each feed's results of ``g`` compiled by this engine with ``names`` as extra outputs
    (a graph input's value is its feed)."""
    h = g.copy()
    vm = h.value_map()
    outs = {v.name for v in h.outputs}
    ins = {v.name for v in h.inputs}
    for nm in names:
        if nm not in outs and nm not in ins:
            h.add_output(vm[nm])
            outs.add(nm)
    model = _compile(h)
    for f in feeds:
        res = {k: np.array(v, copy=True) for k, v in model.run(f).items()}
        res.update({k: np.asarray(f[k]) for k in ins & set(names) if k in f})
        yield res


def _compile(h: Graph):
    import ge_core

    return ge_core.compile(h)


class Quant:
    """The quantisation chosen for each tensor, and the Q/DQ nodes that give it."""

    def __init__(self, params: dict[str, tuple[np.float32, int]], act: str, per_channel: bool) -> None:
        self.params = params
        self.act = act
        self.per_channel = per_channel
        self.zdtype = np.uint8 if act == "uint8" else np.int8

    def qdq(self, g: Graph, x: Value, before: Node, cache: dict[str, Value]) -> Value:
        """``DequantizeLinear(QuantizeLinear(x))`` with the tensor's scale and zero point (one pair
        per tensor in ``cache``)."""
        got = cache.get(x.name)
        if got is None:
            s, z = self.params[x.name]
            sc = g.add_constant(np.asarray(s, np.float32), g.names.fresh(f"{x.name}_scale"))
            zp = g.add_constant(np.asarray(z, self.zdtype), g.names.fresh(f"{x.name}_zero_point"))
            qn = g.add_node("QuantizeLinear", [x, sc, zp], name=f"{x.name}_QuantizeLinear", before=before)
            got = g.add_node("DequantizeLinear", [qn.outputs[0], sc, zp], name=f"{x.name}_DequantizeLinear",
                             before=before).outputs[0]
            cache[x.name] = got
        return got

    def weight(self, ly: Layer) -> tuple[np.ndarray, np.ndarray, int | None]:
        w = ly.node.inputs[ly.weight].const_value  # type: ignore[index,union-attr]
        axis = ly.axis if self.per_channel else None
        q, s = weight_params(w, axis)  # type: ignore[arg-type]
        return q, s, axis

    def inputs(self, g: Graph, ly: Layer, cache: dict[str, Value]) -> list[Value | None]:
        """The inputs of ``ly``'s node quantised: activations through their Q/DQ pair, the weight
        as a DequantizeLinear of int8, the bias as one of int32 (scale ``x_scale * w_scale``)."""
        n = ly.node
        ins: list[Value | None] = list(n.inputs)
        for i in ly.acts:
            ins[i] = self.qdq(g, n.inputs[i], n, cache)  # type: ignore[arg-type]
        if ly.weight is None:
            return ins
        q, s, axis = self.weight(ly)
        base = n.name
        attrs = {} if axis is None else {"axis": axis}
        wq = g.add_constant(q, g.names.fresh(f"{base}_weight_quantized"))
        ws = g.add_constant(s, g.names.fresh(f"{base}_weight_scale"))
        wz = g.add_constant(np.zeros(s.shape, np.int8), g.names.fresh(f"{base}_weight_zero_point"))
        ins[ly.weight] = g.add_node("DequantizeLinear", [wq, ws, wz], attrs, name=f"{base}_weight_DequantizeLinear",
                                    before=n).outputs[0]
        b = n.inputs[ly.bias].const_value if ly.bias is not None else None  # type: ignore[union-attr]
        if b is not None and (s.size == 1 or s.size == b.size):
            ins[ly.bias] = self.bias(g, n, b, s, axis)  # type: ignore[index]
        return ins

    def bias(self, g: Graph, n: Node, b: np.ndarray, ws: np.ndarray, axis: int | None) -> Value:
        """``DequantizeLinear`` of the int32 bias ``round(b / (x_scale * w_scale))`` (per output
        channel along axis 0 with per-channel weights), as onnxruntime writes it."""
        xs = self.params[n.inputs[0].name][0]  # type: ignore[union-attr]
        bs = (np.float32(xs) * ws).astype(np.float32)
        if axis is not None and bs.size == 1:
            bs = np.broadcast_to(bs, b.shape).astype(np.float32)
        bq = np.clip(np.rint(b / bs), -2**31, 2**31 - 1).astype(np.int32)
        attrs = {"axis": 0} if bs.size > 1 else {}
        base = n.name
        bq_v = g.add_constant(bq, g.names.fresh(f"{base}_bias_quantized"))
        bs_v = g.add_constant(bs, g.names.fresh(f"{base}_bias_scale"))
        bz_v = g.add_constant(np.zeros(bs.shape, np.int32), g.names.fresh(f"{base}_bias_zero_point"))
        return g.add_node("DequantizeLinear", [bq_v, bs_v, bz_v], attrs, name=f"{base}_bias_DequantizeLinear",
                          before=n).outputs[0]


def _quantized(g: Graph, layers: list[Layer], q: Quant, kept: Mapping[str, str]) -> Graph:
    """A copy of ``g`` with every layer not in ``kept`` quantised."""
    h = g.copy()
    cache: dict[str, Value] = {}
    for ly in layers:
        if ly.node.name in kept:
            continue
        n = h.find_node(ly.node.name)
        assert n is not None
        hl = Layer(n, ly.acts, ly.weight, ly.axis, ly.bias)
        n.set_inputs(q.inputs(h, hl, cache))
    _drop_unused_constants(h)
    return h


def _drop_unused_constants(h: Graph) -> None:
    for v in list(h.constants.values()):
        if not v.has_uses() and not v.is_graph_output:
            h.remove_constant(v)


def _alone(g: Graph, layers: list[Layer], q: Quant, feeds: list[dict[str, Any]]) -> dict[str, Err]:
    """Each layer's error quantised alone: a shadow copy of its node reads the quantised float
    inputs beside the float node; one run of the float graph gives every layer's SQNR and cosine."""
    h = g.copy()
    pairs = []
    cache: dict[str, Value] = {}
    for ly in layers:
        n = h.find_node(ly.node.name)
        assert n is not None
        ins = q.inputs(h, Layer(n, ly.acts, ly.weight, ly.axis, ly.bias), cache)
        shadow = h.add_node(n.op_type, ins, dict(n.attrs), domain=n.domain, name=f"{n.name}_quantized_alone",
                            num_outputs=len(n.outputs), after=n)
        pairs.append((ly.node.name, n.outputs[0].name, shadow.outputs[0].name))
    errs = {name: Err() for name, _, _ in pairs}
    for res in _runs(h, [x for _, f, s in pairs for x in (f, s)], feeds):
        for name, f, s in pairs:
            errs[name].add(res[f], res[s])
    return errs


def _model_error(qg: Graph, feeds: list[dict[str, Any]], float_out: list[dict[str, np.ndarray]]) -> float:
    """``max|q - f| / (max f - min f)`` over every output of ``qg`` and every feed."""
    names = [v.name for v in qg.outputs]
    got = list(_runs(qg, [], feeds))
    worst = 0.0
    for nm in names:
        f = np.concatenate([np.asarray(r[nm], np.float64).reshape(-1) for r in float_out])
        d = np.concatenate([np.asarray(r[nm], np.float64).reshape(-1) for r in got])
        span = float(f.max() - f.min()) if f.size else 0.0
        span = span if span > 0 else max(float(np.abs(f).max()) if f.size else 0.0, 1.0)
        worst = max(worst, float(np.abs(d - f).max()) / span if f.size else 0.0)
    return worst


def _in_model(g: Graph, qg: Graph, layers: list[Layer], feeds: list[dict[str, Any]]) -> dict[str, Err]:
    """Each quantised layer's output in the quantised model against the float model's."""
    names = [ly.node.outputs[0].name for ly in layers]
    errs = {ly.node.name: Err() for ly in layers}
    for rf, rq in zip(_runs(g, names, feeds), _runs(qg, names, feeds)):
        for ly, nm in zip(layers, names):
            errs[ly.node.name].add(rf[nm], rq[nm])
    return errs


def _db(x: float) -> float | None:
    """A JSON-safe SQNR: None where it is infinite (exact, or a float output of zeros)."""
    return round(x, 3) if math.isfinite(x) else None


def _report(layers: list[Layer], q: Quant, alone: dict[str, Err], inmodel: dict[str, Err], kept: dict[str, str],
            skip: set[str], head: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    first = None
    for ly in layers:
        n = ly.node
        row: dict[str, Any] = {"op": n.op_type, "inputs": {}}
        for i in ly.acts:
            s, z = q.params[n.inputs[i].name]  # type: ignore[union-attr]
            row["inputs"][n.inputs[i].name] = {"scale": float(s), "zero_point": int(z), "dtype": q.act}  # type: ignore[union-attr]
        if ly.weight is not None:
            _, ws, axis = q.weight(ly)
            row["weight"] = {"scale": [float(v) for v in np.reshape(ws, -1)], "axis": axis, "dtype": "int8"}
        row["sqnr_db"], row["cosine"] = _db(alone[n.name].sqnr), round(alone[n.name].cosine, 6)
        row["kept_float"] = n.name in kept
        if n.name in kept:
            row["why"] = kept[n.name]
        else:
            e = inmodel[n.name]
            row["in_model_sqnr_db"], row["in_model_cosine"] = _db(e.sqnr), round(e.cosine, 6)
            if first is None and e.sqnr < DIVERGENCE_DB:
                first = {"layer": n.name, "in_model_sqnr_db": _db(e.sqnr), "threshold_db": DIVERGENCE_DB}
        rows[n.name] = row
    kept_all = {**{s: "skip_layers" for s in sorted(skip)}, **kept}
    return {**head, "layers": rows, "kept_float": kept_all, "first_divergence": first,
            "quantized": [ly.node.name for ly in layers if ly.node.name not in kept]}


def _adopt(g: Graph, qg: Graph) -> None:
    """Make ``g`` the quantised graph ``qg`` (the pass rewrites its graph in place): ``g``'s nodes
    and constants are replaced by ``qg``'s, its inputs and outputs keep their names."""
    gvals = {v.name: v for v in [*g.inputs, *g.constants.values()]}
    for n in g.node_list()[::-1]:
        for v in n.outputs:
            for u, i in v.uses():
                u.set_input(i, None)
    g.restore_outputs([])
    for n in g.node_list()[::-1]:
        g.remove_node(n)
    for v in list(g.constants.values()):
        g.remove_constant(v)
    vmap: dict[Value, Value] = {}
    for v in qg.inputs:
        vmap[v] = gvals[v.name]
    for v in qg.constants.values():
        vmap[v] = g.add_constant(v.const_value, v.name)  # type: ignore[arg-type]
    for n in qg.node_list():
        new = g.add_node(n.op_type, [None if x is None else vmap[x] for x in n.inputs], dict(n.attrs),
                         domain=n.domain, name=n.name, output_names=[v.name for v in n.outputs],
                         output_types=[v.type for v in n.outputs])
        new.meta.update(n.meta)
        for a, b in zip(n.outputs, new.outputs):
            vmap[a] = b
    g.restore_outputs([vmap[v] for v in qg.outputs])


def quantize_pass(graph: Graph, ctx: PassContext) -> PassResult:
    """ATC's ``--compression_optimize_conf`` (option ``compression_optimize_conf``): calibrate and
    quantise the graph as the file's ``calibration`` block says; nothing without the option."""
    path = ctx.options.getoption("compression_optimize_conf")
    if not path:
        return PassResult(False)
    from .compression_conf import read_conf

    conf = read_conf(path)
    feeds = conf.feeds(graph)
    rep = quantize_in_place(graph, feeds, **conf.quantize_options())
    return PassResult(True, stats={"quantized": len(rep["quantized"]), "kept_float": len(rep["kept_float"])})
