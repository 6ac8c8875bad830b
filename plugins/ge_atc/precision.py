"""ATC's ``--precision_mode``, ``--keep_dtype`` and ``--modify_mixlist`` on this engine.

GE chooses, per op, the precision the NPU computes in. On this engine's cpu backend the fast
kernels are float32 ones (BLAS sgemm for Conv/MatMul/Gemm, native/NumPy float32 loops); NumPy's
float16 arithmetic is emulated per element and many times slower, and its float16 matmul has no
BLAS. So a reduced precision is *storage* here: the weights an op reads are stored in float16 (or
bfloat16) in the .om — the weights partition halves — and a Cast back to float32 runs in front of
the op, which computes in float32. No op computes in float16 on the cpu backend
(``COMPUTE_FLOAT16`` is empty); the compile report's ``precision`` table says so per node.

Which weights are stored reduced, per mode (GE's semantics mapped onto storage):

* ``must_keep_origin_dtype``: none (the default here; ATC's own default is ``force_fp16``).
* ``force_fp16``: every float32 weight (matrix and vector ops).
* ``allow_fp32_to_fp16`` / ``allow_fp32_to_bf16``: weights of matrix ops only (GE: matrix ops in
  float16, vector ops keep float32).
* ``allow_mix_precision`` (= ``_fp16``) / ``allow_mix_precision_bf16``: weights of ops on the
  white list, and of gray-list ops whose input comes from a reduced op; black-list ops keep
  float32. ``--modify_mixlist`` edits the lists (GE's JSON: ``{"black-list": {"to-add": [...],
  "to-remove": [...]}, "white-list": ..., "gray-list": ...}``).
* ``force_fp32`` (= ``cube_fp16in_fp32out``): float16/bfloat16 weights become float32, and an op of
  the matrix or vector lists reading float16 activations computes in float32 between Casts.

``--keep_dtype`` (one node name or ``OpType::TypeName`` per line) keeps the weights of those nodes
as they are. A weight shared by a kept node and another one stays as it is for both.
"""

from __future__ import annotations

import json
import re
from typing import Any

import ml_dtypes
import numpy as np

from ge_core.errors import OptionError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.passes import PassContext
from ge_sdk import precision
from ge_sdk.rewrite.driver import FUSED_FROM_META

from .files import read_text

MODES = (
    "must_keep_origin_dtype", "force_fp32", "cube_fp16in_fp32out", "force_fp16", "allow_fp32_to_fp16",
    "allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16", "allow_fp32_to_bf16",
)

#: Ops GE calls matrix ("cube") ops, by this engine's names (ONNX, the fused ones, the cpu
#: backend's blocked convolution).
MATRIX_OPS = frozenset("Conv ConvTranspose MatMul Gemm FusedConv FusedMatMul NchwcConv Attention".split())
#: Vector ops whose float inputs force_fp32 computes in float32.
VECTOR_OPS = frozenset("""Add Sub Mul Div BatchNormalization LayerNormalization InstanceNormalization PRelu
    Relu Sigmoid Tanh Softmax LogSoftmax Gelu Erf Exp Log Sqrt Pow ReduceMean ReduceSum MaxPool AveragePool
    GlobalAveragePool FusedElemwise""".split())
#: Ops the cpu backend computes fast and correctly in float16: none (see the module docstring).
COMPUTE_FLOAT16: frozenset[str] = frozenset()
#: The built-in mixed-precision lists (GE's idea: matrix ops gain, range-sensitive ops lose).
WHITE = frozenset(MATRIX_OPS)
BLACK = frozenset("""Softmax LogSoftmax LayerNormalization ReduceMean ReduceSum ReduceL2 Exp Log Pow Sqrt
    Reciprocal Div Erf""".split())
GRAY = frozenset("""Add Sub Mul Relu Sigmoid Tanh Gelu BatchNormalization InstanceNormalization PRelu MaxPool
    AveragePool GlobalAveragePool Concat Reshape Transpose Flatten FusedElemwise Clip LeakyRelu""".split())
#: GE (Ascend IR) op type names accepted in --keep_dtype and --modify_mixlist, as this engine's.
GE_NAMES = {"Conv2D": "Conv", "Conv2DTranspose": "ConvTranspose", "MatMulV2": "MatMul", "BatchMatMul": "MatMul",
            "BatchMatMulV2": "MatMul", "SoftmaxV2": "Softmax", "ReduceMeanD": "ReduceMean",
            "ReduceSumD": "ReduceSum", "RealDiv": "Div", "BiasAdd": "Add", "FusedBatchNorm": "BatchNormalization",
            "LayerNorm": "LayerNormalization", "MaxPoolV3": "MaxPool", "AvgPoolV2": "AveragePool"}

#: Smallest weight (elements) stored reduced: scalars and tiny vectors stay (no saving, only error).
MIN_ELEMENTS = 16
_FLOAT32 = np.dtype(np.float32)
_REDUCED = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
#: ONNX TensorProto element types used by the Casts this pass inserts.
_ELEM = {"float32": 1, "float16": 10, "bfloat16": 16}
MAX_LIST_BYTES = 1 << 20


def check_mode(value: Any) -> str:
    s = str(value).strip()
    if s not in MODES:
        from ge_core.registry import close_matches

        raise OptionError(f"precision_mode '{value}' is not one of ATC's modes{close_matches(s, MODES)}",
                          hint=f"use one of: {', '.join(MODES)}")
    return s


def read_mode_option(value: Any) -> dict[str, Any]:
    """Reader of option ``precision_mode``: checks the name; derives nothing."""
    check_mode(value)
    return {}


def parse_keep_dtype(path: Any) -> list[str]:
    """GE's keep_dtype file: one node name or ``OpType::TypeName`` per line (``#`` comments)."""
    text = read_text(path, "keep_dtype", MAX_LIST_BYTES)
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("OpType::"):
            t = s[len("OpType::"):].strip()
            if not t or not t.replace("_", "").isalnum():
                raise OptionError(f"keep_dtype file '{path}' line {lineno}: '{s}' is not OpType::TypeName",
                                  hint="one node name or OpType::TypeName per line")
            s = "OpType::" + GE_NAMES.get(t, t)
        out.append(s)
    return out


def read_keep_dtype_option(value: Any) -> dict[str, Any]:
    if value in (None, ""):
        return {"keep_dtype_entries": ""}
    return {"keep_dtype_entries": "\n".join(parse_keep_dtype(value))}


def parse_mixlist(path: Any) -> dict[str, dict[str, list[str]]]:
    """GE's modify_mixlist JSON: ``{"black-list"|"white-list"|"gray-list": {"to-add": [ops],
    "to-remove": [ops]}}``; op types in GE's or this engine's names."""
    text = read_text(path, "modify_mixlist", MAX_LIST_BYTES)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise OptionError(f"modify_mixlist file '{path}' is not JSON: {str(e)[:100]}") from None
    lists = ("black-list", "white-list", "gray-list")
    if not isinstance(data, dict) or not set(data) <= set(lists):
        raise OptionError(f"modify_mixlist file '{path}' must be an object with keys {', '.join(lists)}",
                          hint='e.g. {"black-list": {"to-add": ["MatMul"]}}')
    out: dict[str, dict[str, list[str]]] = {}
    for name, spec in data.items():
        if not isinstance(spec, dict) or not set(spec) <= {"to-add", "to-remove"} or not all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in spec.values()):
            raise OptionError(f"modify_mixlist file '{path}': '{name}' must be {{\"to-add\": [op types], "
                              f"\"to-remove\": [op types]}}")
        out[name] = {k: [GE_NAMES.get(x, x) for x in v] for k, v in spec.items()}
    return out


def read_mixlist_option(value: Any) -> dict[str, Any]:
    if value in (None, ""):
        return {"mixlist_edits": ""}
    return {"mixlist_edits": json.dumps(parse_mixlist(value), sort_keys=True)}


def mix_lists(edits_json: str) -> tuple[set[str], set[str], set[str]]:
    """The white, black and gray lists after ``--modify_mixlist``'s edits (an op is on one list)."""
    lists = {"white-list": set(WHITE), "black-list": set(BLACK), "gray-list": set(GRAY)}
    edits = json.loads(edits_json) if edits_json else {}
    for name, spec in edits.items():
        for op in spec.get("to-remove", []):
            lists[name].discard(op)
        for op in spec.get("to-add", []):
            for other in lists.values():
                other.discard(op)
            lists[name].add(op)
    return lists["white-list"], lists["black-list"], lists["gray-list"]


# --------------------------------------------------------------------------------------------
def precision_pass(graph: Graph, ctx: PassContext) -> bool:
    """Choose per node the precision ``precision_mode`` asks for: a matrix op chosen gets a
    :mod:`ge_sdk.precision` entry (``node.meta``) the backend's pass acts on, packing its weights
    in that precision and computing in it where it has the kernel; or compute float16 ops in
    float32 (force_fp32). Reaches the bodies of If/Loop/Scan."""
    opts = ctx.options
    mode = check_mode(opts.getoption("precision_mode", "must_keep_origin_dtype"))
    keep = [s for s in str(opts.getoption("keep_dtype_entries", "") or "").split("\n") if s]
    table: dict[str, Any] = {"mode": mode, "compute_float16_ops": sorted(COMPUTE_FLOAT16), "nodes": {}}
    graph.metadata["atc_precision"] = table
    if mode == "must_keep_origin_dtype":
        return False
    if mode in ("force_fp32", "cube_fp16in_fp32out"):
        return any([_force_fp32(g, _kept_nodes(g, keep), table) for g in _graphs(graph)])
    reduced = _REDUCED["bfloat16" if mode.endswith("bf16") else "float16"]
    table["weights_dtype"] = reduced.name
    lists = mix_lists(str(opts.getoption("mixlist_edits", "") or "")) if "mix" in mode else None
    for g in _graphs(graph):
        order = g.node_list()
        for n in _chosen(order, mode, _kept_nodes(g, keep), lists):
            if n.op_type not in MATRIX_OPS:
                continue  # a vector op computes in float32 here, its weights stay float32 (no Cast a run)
            if n.op_type != "Attention":  # (its inputs are activations and a mask: never stored reduced)
                _check_range(n, reduced, mode)
            e = precision.entry(n.op_type, reduced.name)
            n.meta[precision.META] = e
            table["nodes"][n.name if g is graph else f"{g.name}/{n.name}"] = e
    return False  # (annotations only: the backend's pass rewrites)


def _graphs(graph: Graph) -> list[Graph]:
    """``graph`` and every graph nested in it (If/Loop/Scan bodies), outer first."""
    out, stack = [], [graph]
    while stack:
        g = stack.pop()
        out.append(g)
        for n in g.node_list():
            stack.extend(reversed(n.subgraphs()))
    return out


def _chosen(order: list[Node], mode: str, kept: set[Node], lists) -> list[Node]:
    """The nodes of ``order`` the mode reduces (GE: force_fp16 every op, allow_fp32_to_* the
    matrix ops, allow_mix_precision* the white list and the gray ops after a reduced one)."""
    if mode == "force_fp16":
        return [n for n in order if n not in kept]
    if lists is None:
        return [n for n in order if n.op_type in MATRIX_OPS and n not in kept]
    white, black, gray = lists
    chosen: list[Node] = []
    seen: set[Node] = set()
    for n in order:
        types = {n.op_type, *FUSED_FROM.get(n.op_type, ())}  # (a fused op is on its sources' lists)
        if n in kept or types & black:
            continue
        if types & white or (types & gray and any(v is not None and v.producer in seen for v in n.inputs)):
            chosen.append(n)
            seen.add(n)
    return chosen


#: Fused ops and the op types they were made from (a kept OpType keeps its fused form too).
FUSED_FROM = {"FusedConv": ("Conv",), "FusedMatMul": ("MatMul", "Gemm"), "NchwcConv": ("Conv",)}
_SUFFIX = re.compile(r"_\d+$")


def _kept_nodes(graph: Graph, entries: list[str]) -> set[Node]:
    """Nodes ``--keep_dtype`` names: by name (a fused node keeps its first node's name, with a
    ``_N`` suffix when the fusion had to rename it) or by op type (fused forms included)."""
    types = {e[len("OpType::"):] for e in entries if e.startswith("OpType::")}
    names = {e for e in entries if not e.startswith("OpType::")}
    order = graph.node_list()
    present = {n.name for n in order}
    kept = set()
    for n in order:
        base = n.name if n.name in names else _SUFFIX.sub("", n.name)
        if names.intersection(n.meta.get(FUSED_FROM_META) or ()) or n.op_type in types or any(t in types for t in FUSED_FROM.get(n.op_type, ())) or (
                base in names and (n.name in names or base not in present)):
            kept.add(n)
    return kept


def _check_range(n: Node, reduced: np.dtype, mode: str) -> None:
    """OptionError naming a float32 weight of ``n``, its nodes, its largest magnitude and the
    reduced type's range when a finite value does not fit ``reduced`` (it would become infinity)."""
    for v in n.inputs:
        if v is not None and v.const_value is not None and np.asarray(v.const_value).dtype == _FLOAT32 \
                and v.const_value.size >= MIN_ELEMENTS:
            _check_weight(v, np.asarray(v.const_value), [(u, i) for u, i in v.uses()], reduced, mode)


def _check_weight(v: Value, arr: np.ndarray, uses: list[tuple[Node, int]], reduced: np.dtype, mode: str) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(arr)
        overflow = finite & ~np.isfinite(arr.astype(reduced))
    if not overflow.any():
        return
    top = float(np.max(np.abs(arr[finite])))
    limit = float(ml_dtypes.finfo(reduced).max) if reduced.name == "bfloat16" else float(np.finfo(reduced).max)
    nodes = list(dict.fromkeys(u.name for u, _ in uses))
    shown = ", ".join(f"'{n}'" for n in nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    ops = sorted({u.op_type for u, _ in uses})
    raise OptionError(
        f"--precision_mode={mode}: initializer '{v.name}' (read by node(s) {shown}) has values up to "
        f"|{top:.6g}|, outside the {reduced.name} range +-{limit:.6g}: stored as {reduced.name} they would "
        f"become infinity ({int(overflow.sum())} value(s))",
        hint=f"keep the node(s) in float32 with --keep_dtype (a file listing {nodes[0]!r} or OpType::{ops[0]}), or "
             f"use --precision_mode=allow_mix_precision with {ops[0]} on the black list of --modify_mixlist, or "
             "must_keep_origin_dtype")


def _force_fp32(graph: Graph, kept: set[Node], table: dict[str, Any]) -> bool:
    changed = False
    replaced: list[Value] = []
    low = {np.dtype(np.float16), _REDUCED["bfloat16"]}
    for n in graph.node_list():
        if n in kept or n.subgraphs() or n.op_type not in MATRIX_OPS | VECTOR_OPS:
            continue
        ins = [v for v in n.inputs if v is not None and v.type.dtype in low]
        if not ins:
            continue
        for i, v in enumerate(n.inputs):
            if v is None or v.type.dtype not in low:
                continue
            t32 = TensorType(_FLOAT32, v.type.shape)
            if v.const_value is not None:
                c = graph.add_constant(np.asarray(v.const_value).astype(np.float32), graph.names.fresh(f"{v.name}_fp32"))
                n.set_input(i, c)
                replaced.append(v)
            else:
                cast = graph.add_node("Cast", [v], {"to": 1}, name=f"{n.name}_in{i}_to_float32",
                                      output_types=[t32], before=n)
                n.set_input(i, cast.output)
        for o in n.outputs:
            if o.type.dtype not in low:
                continue
            back = o.type
            low_name = str(back.dtype)
            o.type = TensorType(_FLOAT32, back.shape)
            cast = graph.add_node("Cast", [o], {"to": _ELEM[low_name]}, name=f"{n.name}_out_to_{low_name}",
                                  output_types=[back], after=n)
            o.replace_all_uses_with(cast.output)
            cast.set_input(0, o)
        table["nodes"][n.name] = {"op": n.op_type, "weights": "float32", "compute": "float32"}
        changed = True
    for v in replaced:
        if v.graph is not None and not v.has_uses() and not v.is_graph_output:
            graph.remove_constant(v)
    return changed


def summarize(table: dict[str, Any]) -> dict[str, Any]:
    """The report's precision table: per node what was stored and computed (filled in by the
    backend), and totals: nodes per compute precision, weight bytes saved."""
    nodes = table.get("nodes", {})
    counts: dict[str, int] = {}
    for e in nodes.values():
        counts[e.get("compute", "float32")] = counts.get(e.get("compute", "float32"), 0) + 1
    out = dict(table)
    out["compute"] = dict(sorted(counts.items()))
    out["weights_bytes_saved"] = int(sum(int(e.get("bytes_saved", 0)) for e in nodes.values()))
    return out


def compute_summary(table: dict[str, Any]) -> str:
    """One line of what the table's matrix nodes store and compute (atc's note)."""
    nodes = table.get("nodes", {})
    parts = [f"{c} compute in {p}" for p, c in table.get("compute", {}).items()]
    saved = table.get("weights_bytes_saved", 0)
    why = sorted({e["why"] for e in nodes.values() if e.get("why")})
    return (f"{len(nodes)} matrix node(s): {', '.join(parts)}; weights {saved / 1e6:.2f} MB smaller"
            + (f" (float32 where: {'; '.join(why[:3])})" if why else ""))
