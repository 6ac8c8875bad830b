"""The cpu backend's blocked layout: the ``nchwc_layout`` pass and its ops (domain ``ge.cpu``).

A run of convolutions in NCHW pays for bringing each output pixel's inputs together (im2col, or
the GEMM's pack) at every layer. The pass keeps the activations between such layers in the
blocked layout ``(N, C/16, H, W, 16)`` (onnxruntime's NCHWc transformer, GE's NC1HWC0), where
:mod:`ge_native.nchwc`'s direct kernels read them in place, and converts only at the edges:

- ``NchwcConv`` (a 2-D Conv/FusedConv the conv table's ``nchwc`` algorithm takes,
  :mod:`.kernels.conv.nchwc`, its epilogue of a residual, a clip and an activation kept),
  ``NchwcMaxPool``, ``NchwcAveragePool``, the elementwise ops between them (Relu, Clip, Add,
  Mul, ... on 5-D values, an SE block's scale reordered too; ``ge.quant::FakeQuant``),
  ``NchwcGlobalAveragePool`` (its NCHW ``(N, C, 1, 1)`` result leaves the layout for free);
- ``NchwcGroupNorm``: a group normalization as exporters write it (Reshape, InstanceNormalization,
  Reshape back), its groups whole in the blocks, with its weight, bias and a Relu after it;
- ``NchwcReorderInput`` / ``NchwcReorderOutput`` where a value enters or leaves.

A channel count that is not a whole number of blocks (MobileNet's 24) is zero-padded to one, as
onnxruntime's transformer does: the padded lanes stay finite and reach no real channel (zero
weights); a Concat takes a padded input only last. Only groups of connected nodes holding at least two convolutions are
rewritten (a lone one would pay two reorders for one layer). The pass runs where the
kernels run (AVX-512F or AVX2 with FMA); the ops' kernels keep a NumPy form for an .om loaded on
another machine.

The batch may be a symbol (``dynamic_axes``, an ``--input-shape`` range): it only scales the
outer loop, so a dynamic batch gets the static build's ops; channels and planes must be static.
Each convolution left in NCHW is named, with why, in the
compile report (the pass's ``stats["declined"]``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ge_core.errors import GEError, GraphError, OptionError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec
from ge_core.ops import OpDef, OpKind
from ge_core.passes import Pass, PassContext, PassResult
from ge_native import nchwc
from ge_sdk import quant
from ge_sdk.rewrite.driver import FUSED_FROM_META

from .kernels import conv
from .kernels.conv import nchwc as conv_nchwc
from .kernels.conv.geometry import window_plan
from .kernels.nchwc import ACTIVATIONS, DOMAIN, PACKINGS, pack_weight, packed_size
from .program import conv_algorithm_option

BLOCK = nchwc.BLOCK
FUSED = "ge.fused"

#: ops that map an element to an element (0 to a finite value) and run on 5-D values unchanged
UNARY = frozenset(("Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu", "Neg", "Abs", "Identity"))
#: binary ops whose operands are full activations or a per-channel (N|1, C, 1, 1) scale
BINARY = frozenset(("Add", "Mul", "Sub"))
#: epilogue ops of a FusedConv the kernel applies at its store, by activation name
STORE_ACTS = {"Sigmoid": "sigmoid", "Silu": "silu", "HardSwish": "hardswish"}
#: the most input channels a convolution reading NCHW directly takes (a stem's RGB, a mask)
PLAIN_MAX_CHANNELS = conv_nchwc.PLAIN_MAX_CHANNELS
#: the weight packings of a quantised model's int8 convolutions (ge_cpu.int8)
INT8_PACKINGS = ("int8", "int8dw")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


def _static4(v: Value | None) -> tuple | None:
    """A float32 4-D value's shape: static channels and plane, the batch an int or a symbol (it
    only scales the kernels' outer loop: a dynamic batch keeps the layout); else None."""
    return conv_nchwc.static4(v.type if v is not None else None)


def _blocked_ok(v: Value | None) -> bool:
    return _static4(v) is not None


def _pad_channels(a: np.ndarray, c: int) -> np.ndarray:
    """A per-channel ``(c,)`` array as the blocked ``(1, C/16, 1, 1, 16)`` one (zeros past c)."""
    full = np.zeros(nchwc.blocks(c) * BLOCK, np.float32)
    full[:c] = a.reshape(-1)
    return np.ascontiguousarray(full.reshape(1, -1, 1, 1, BLOCK))


def _epilogue(node: Node) -> tuple[bool, float | None, float | None, str] | None:
    """``(has_addend, clip_min, clip_max, activation)`` of a Conv/FusedConv, or None when its
    epilogue program is one the kernel does not apply (an Add of the residual, then one Relu,
    Clip, Sigmoid, Silu, HardSwish or Gelu)."""
    if node.op_type == "Conv":
        return False, None, None, ""
    text = _text(node.attrs.get("epilogue", ""))
    if not text:
        return (False, None, None, "") if len(node.inputs) <= 3 else None
    try:
        steps = json.loads(text)
    except ValueError:
        return None
    if not isinstance(steps, list) or len(steps) > 2:
        return None
    addend, last = False, "y"
    if steps and steps[0][:2] == ["Add", ["y", "a0"]] and not steps[0][2]:
        if len(node.inputs) != 4:
            return None
        addend, steps, last = True, steps[1:], "t0"
    elif len(node.inputs) > 3:
        return None
    if not steps:
        return addend, None, None, ""
    if len(steps) != 1 or not isinstance(steps[0], list) or len(steps[0]) != 3 or steps[0][1] != [last]:
        return None
    op, _, attrs = steps[0]
    if not isinstance(attrs, dict):
        return None
    if op == "Relu" and not attrs:
        return addend, 0.0, None, ""
    if op == "Clip" and set(attrs) <= {"min", "max"}:
        lo, hi = attrs.get("min"), attrs.get("max")
        if not all(isinstance(x, (int, float)) for x in (lo, hi) if x is not None):
            return None
        return addend, None if lo is None else float(lo), None if hi is None else float(hi), ""
    if op in STORE_ACTS and not attrs:
        return addend, None, None, STORE_ACTS[op]
    if op == "Gelu" and set(attrs) <= {"approximate"}:
        return addend, None, None, "gelu_tanh" if _text(attrs.get("approximate", "none")) == "tanh" else "gelu"
    return None


def _explicit_pads(node: Node, k: list[int], strides: list[int], dil: list[int], xs, ys) -> list[int] | None:
    """The four pads (top, left, bottom, right) of a window op: its ``pads``, or the ones its
    ``auto_pad`` stands for on the static shapes (the cpu kernels' :func:`window_plan`; HF's
    EfficientNet exports ``"same"`` padding so); None when they do not give the output shape."""
    mode = _text(node.attrs.get("auto_pad", "NOTSET")) or "NOTSET"
    pads = [int(v) for v in (node.attrs.get("pads") or (0, 0, 0, 0))]
    if mode not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID") or len(pads) != 4 or min(pads) < 0 \
            or xs is None or ys is None:
        return None
    pb, pe, out, _ = window_plan(mode, pads, xs[2:], k, strides, dil, bool(int(node.attrs.get("ceil_mode", 0) or 0)))
    if list(out) != list(ys[2:]):
        return None
    return [*pb, *pe]


def _is_conv(node: Node) -> bool:
    return (node.op_type == "Conv" and node.domain in ("", "ai.onnx")) or (node.op_type == "FusedConv" and node.domain == FUSED)


def conv_plan(node: Node, conv_algorithm: str = "auto") -> dict | None:
    """The NchwcConv attributes of a Conv/FusedConv the blocked kernels run (the conv table's
    ``nchwc`` algorithm applies: :mod:`.kernels.conv.nchwc`), or None (:func:`conv_decline` says why)."""
    p = _conv_plan_or_reason(node, conv_algorithm) if _is_conv(node) else None
    return p if isinstance(p, dict) else None


def conv_decline(node: Node, conv_algorithm: str = "auto") -> str | None:
    """Why the blocked kernels do not take a Conv/FusedConv (the compile report's line), None
    when they do or it is not one."""
    p = _conv_plan_or_reason(node, conv_algorithm) if _is_conv(node) else None
    return p if isinstance(p, str) else None


def _conv_plan_or_reason(node: Node, conv_algorithm: str) -> dict | str:
    if len(node.inputs) < 2 or len(node.outputs) != 1:
        return "not a convolution of one input, one weight and one output"
    try:
        plan = conv.ConvPlan(KernelSpec.from_node(node, None, conv_algorithm=conv_algorithm), layout=True)
    except GEError as e:  # (a geometry no convolution kernel takes: the node's own kernel reports it)
        return f"a geometry the convolution kernels do not take ({e})"
    g = conv_nchwc.geometry_or_reason(plan)  # (the conv table's test of its nchwc algorithm, with the reason)
    if isinstance(g, str) or not conv.applies(conv_nchwc.NAME, plan):
        return g if isinstance(g, str) else "the conv table's nchwc algorithm does not apply"
    k, strides, dil, xs, ys = g["k"], g["strides"], g["dilations"], g["xs"], g["ys"]
    pads = _explicit_pads(node, list(k), strides, dil, xs, ys)
    if pads is None:
        return "its pads (auto_pad) do not give its output shape"
    epi = _epilogue(node)
    if epi is None:
        return f"its fused epilogue {_text(node.attrs.get('epilogue', ''))!r} is not one the blocked kernel applies"
    addend, lo, hi, act = epi
    if addend and _static4(node.inputs[3]) != ys:
        return "its residual addend is not of its output's shape"
    attrs: dict[str, Any] = {"kernel_shape": list(k), "strides": strides, "dilations": dil, "pads": pads,
                             "group": g["group"]}
    if lo is not None:
        attrs["clip_min"] = lo
    if hi is not None:
        attrs["clip_max"] = hi
    if act:
        attrs["activation"] = act
    if g["plain"]:
        attrs["plain_input"] = 1
    return {"attrs": attrs, "addend": addend, "plain": g["plain"], "conv": plan}


def _pool_plan(node: Node) -> dict | None:
    if node.op_type not in ("MaxPool", "AveragePool") or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    if not _blocked_ok(node.inputs[0]) or _static4(node.outputs[0]) is None:
        return None
    a = node.attrs
    if int(a.get("storage_order", 0) or 0):
        return None
    if node.op_type == "AveragePool" and int(a.get("ceil_mode", 0) or 0):
        return None  # (the window past the input's end counts differently there)
    k = [int(v) for v in (a.get("kernel_shape") or ())]
    strides = [int(v) for v in (a.get("strides") or (1, 1))]
    dil = [int(v) for v in (a.get("dilations") or (1, 1))]
    if len(k) != 2 or len(strides) != 2 or len(dil) != 2 or min(k + strides + dil) < 1:
        return None
    xs = _static4(node.inputs[0])
    pads = _explicit_pads(node, k, strides, dil, xs, _static4(node.outputs[0]))
    if pads is None or xs is None:
        return None
    if int(a.get("ceil_mode", 0) or 0):
        # (a MaxPool's ceil_mode windows past the end padding: the same as more -inf end padding,
        # so the blocked op, which has no ceil_mode, gets the end padding its windows reach)
        mode = _text(a.get("auto_pad", "NOTSET")) or "NOTSET"
        _, _, _, pend = window_plan(mode, pads, xs[2:], k, strides, dil, True)
        pads = [*pads[:2], *pend]
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": strides, "dilations": dil, "pads": pads}
    if node.op_type == "AveragePool":
        attrs["count_include_pad"] = int(a.get("count_include_pad", 0) or 0)
    return {"attrs": attrs}


def _is_scale(v: Value | None, full: tuple[int, ...]) -> bool:
    """A per-channel (N or 1, C, 1, 1) activation operand (not a constant) of a full one."""
    s = _static4(v)
    return s is not None and v is not None and not v.is_constant and s[1] == full[1] and s[2:] == (1, 1) and s[0] in (1, full[0])


def _elementwise_plan(node: Node) -> dict | None:
    if quant.fake_quant_params(node) is not None:  # (a quantised model's fake-quant: 0 stays 0)
        ys = _static4(node.outputs[0])
        return {} if ys is not None and _static4(node.inputs[0]) == ys else None
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    ys = _static4(node.outputs[0])
    if ys is None:
        return None
    if node.op_type in UNARY and len(node.inputs) == 1 and _static4(node.inputs[0]) == ys:
        return {}
    if node.op_type == "Clip" and node.inputs and _static4(node.inputs[0]) == ys:
        if all(v is None or (v.const_value is not None and v.const_value.size == 1) for v in node.inputs[1:]):
            return {}
        return None
    if node.op_type in BINARY and len(node.inputs) == 2:
        a, b = node.inputs
        full = [v is not None and _static4(v) == ys and not v.is_constant for v in (a, b)]
        if all(full) or (full[0] and _is_scale(b, ys)) or (full[1] and _is_scale(a, ys)):
            return {}
        if (full[0] and _channel_const(b, ys[1]) is not None) or (full[1] and _channel_const(a, ys[1]) is not None):
            return {}
    return None


def _channel_const(v: Value | None, c: int) -> np.ndarray | None:
    """A constant of one value per channel ((C, 1, 1) or (1, C, 1, 1): a folded BatchNorm's scale
    and shift) or a scalar, as the blocked (1, C/16, 1, 1, 16) array it broadcasts as; else None."""
    if v is None or v.const_value is None:
        return None
    a = v.const_value
    if a.dtype != np.float32:
        return None
    if a.size == 1:
        return a.reshape(())
    if a.shape not in ((c, 1, 1), (1, c, 1, 1)):
        return None
    return _pad_channels(a, c)


Plan = tuple[str, dict[str, Any]]


def _shape(v: Value | None) -> tuple[int, ...]:
    """The static NCHW shape of a value :func:`_plan` accepted."""
    s = _static4(v)
    if s is None:  # pragma: no cover - the plans only take static 4-D values
        raise GraphError(f"nchwc_layout: value '{getattr(v, 'name', '?')}' has no static 4-D shape")
    return s


def _groupnorm_chain(node: Node) -> dict | None:
    """A group normalization as exporters write it (PyTorch's GroupNorm, HF BiT's): ``Reshape(x,
    (N, G, -1))``, ``InstanceNormalization`` with constant per-group scale and bias, ``Reshape`` back
    to x's shape, starting at ``node``: its nodes and the blocked kernel's per-channel scale and
    bias; None when it is not one, or its groups are not whole in the blocks (channels a group
    dividing 16, or whole blocks) or the channels are not whole blocks."""
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    xs = _static4(node.inputs[0])
    r1 = node.outputs[0]
    if xs is None or r1.type is None or r1.type.shape is None or len(r1.type.shape) != 3 or len(r1.users) != 1:
        return None
    n, c, h, w = xs
    g = r1.type.shape[1]
    if tuple(r1.type.shape) != (n, g, (c // g if isinstance(g, int) and g > 0 else 0) * h * w) or c % g:
        return None
    inst = next(iter(r1.users))
    if inst.op_type != "InstanceNormalization" or inst.domain not in ("", "ai.onnx") or len(inst.inputs) != 3 \
            or inst.inputs[0] is not r1 or len(inst.outputs) != 1 or len(inst.outputs[0].users) != 1:
        return None
    scale, bias = (v.const_value if v is not None else None for v in inst.inputs[1:])
    if scale is None or bias is None or scale.size != g or bias.size != g:
        return None
    last = next(iter(inst.outputs[0].users))
    if last.op_type != "Reshape" or last.domain not in ("", "ai.onnx") or last.inputs[0] is not inst.outputs[0] \
            or _static4(last.outputs[0]) != xs:
        return None
    gs = c // g
    if c % BLOCK or not (BLOCK % gs == 0 or gs % BLOCK == 0) or gs > 64 * BLOCK:
        return None
    sc = np.repeat(np.asarray(scale, np.float64).reshape(-1), gs)
    bi = np.repeat(np.asarray(bias, np.float64).reshape(-1), gs)
    # the per-channel affine (a Mul and an Add of per-channel constants: GroupNorm's weight and
    # bias) and a Relu after it fold into the kernel's scale, bias and clip
    inner, relu = [inst], False
    for op in ("Mul", "Add", "Relu"):
        out = last.outputs[0]
        if out.is_graph_output or len(out.users) != 1:
            break
        u = next(iter(out.users))
        if u.op_type != op or u.domain not in ("", "ai.onnx") or len(u.outputs) != 1 or _static4(u.outputs[0]) != xs:
            break
        if op == "Relu":
            relu = True
        else:
            if len(u.inputs) != 2:
                break
            k = u.inputs[1] if u.inputs[0] is out else u.inputs[0]
            kv = _channel_const(k, c)
            if kv is None:
                break
            kv = np.broadcast_to(np.asarray(kv, np.float64).reshape(-1)[:c] if kv.ndim else kv, (c,))
            if op == "Mul":
                sc, bi = sc * kv, bi * kv
            else:
                bi = bi + kv
        inner.append(last)
        last = u
    return {"inner": inner, "last": last, "group_channels": gs, "epsilon": float(inst.attrs.get("epsilon", 1e-5)),
            "scale": sc.astype(np.float32), "bias": bi.astype(np.float32), "relu": relu}


def _plan(node: Node, conv_algorithm: str = "auto") -> Plan | None:
    """(kind, plan) for a node the layout can take: conv, pool, elementwise, or gap."""
    p = conv_plan(node, conv_algorithm)
    if p is not None:
        return "conv", p
    p = _pool_plan(node)
    if p is not None:
        return "pool", p
    if node.op_type == "GlobalAveragePool" and node.domain in ("", "ai.onnx") and _blocked_ok(node.inputs[0]):
        return "gap", {}
    p = _elementwise_plan(node)
    if p is not None:
        return "elementwise", p
    if _concat_ok(node):
        return "concat", {}
    p = _batchnorm_plan(node)
    if p is not None:
        return "batchnorm", p
    return None


def _batchnorm_plan(node: Node) -> dict | None:
    """An inference BatchNormalization of constant statistics (a pre-activation one, DenseNet's,
    that no convolution absorbed): its per-channel scale and shift, blocked."""
    if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    if len(node.inputs) != 5 or int(node.attrs.get("training_mode", 0) or 0):
        return None
    ys = _static4(node.outputs[0])
    if ys is None or _static4(node.inputs[0]) != ys:
        return None
    vals = [v.const_value if v is not None else None for v in node.inputs[1:]]
    if any(a is None or a.size != ys[1] for a in vals):
        return None
    scale, bias, mean, var = (np.asarray(a, np.float64).reshape(-1) for a in vals)  # type: ignore[union-attr]
    k = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    shift = bias - mean * k
    return {"scale": _pad_channels(k, ys[1]), "shift": _pad_channels(shift, ys[1])}


def _concat_ok(node: Node) -> bool:
    """A Concat of activations along the channels, all but the last whole blocks (blocks
    concatenate the same; the last one's padding is the result's)."""
    if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1 or not node.inputs:
        return False
    if int(node.attrs.get("axis", 0) or 0) not in (1, -3):
        return False
    ys = _static4(node.outputs[0])
    if ys is None:
        return False
    for i, v in enumerate(node.inputs):
        s = _static4(v)
        if v is None or v.is_constant or s is None or (s[0], s[2], s[3]) != (ys[0], ys[2], ys[3]):
            return False
        if s[1] % BLOCK and i != len(node.inputs) - 1:
            return False
    return True


def blocked_type(shape: tuple[int, ...]) -> TensorType:
    n, c, h, w = shape
    return TensorType(np.dtype("float32"), (n, nchwc.blocks(c), h, w, BLOCK))


def _groups(graph: Graph, plans: dict[Node, Plan]) -> list[set[Node]]:
    """Connected groups of planned nodes (joined through the values between them)."""
    parent = {n: n for n in plans}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in plans:
        for v in n.inputs:
            p = v.producer if v is not None else None
            if p in parent and plans[p][0] != "gap":  # (a gap's result is NCHW: no join through it)
                parent[find(n)] = find(p)
    out: dict[Node, set[Node]] = {}
    for n in plans:
        out.setdefault(find(n), set()).add(n)
    return list(out.values())


def _edges(grp: set[Node], plans: dict[Node, Plan]) -> int:
    """The whole planes a group would reorder: the values it reads from outside (not an NCHW
    stem input, a constant or a 1x1 scale) and the values it hands outside."""
    entering: set[Value] = set()
    leaving = 0
    for n in grp:
        kind, p = plans[n]
        for i, v in enumerate(n.inputs):
            if v is None or v.is_constant or (v.producer in grp and plans[v.producer][0] != "gap"):
                continue
            if kind == "conv" and (i in (1, 2) or (i == 0 and p["plain"])):
                continue
            s = _static4(v)
            if s is not None and s[2:] != (1, 1):
                entering.add(v)
        if kind != "gap":
            out = n.outputs[0]
            leaving += int(out.is_graph_output or any(u not in grp for u in out.users))
    return len(entering) + leaving


def _plan_nodes(graph: Graph, conv_algorithm: str) -> dict[Node, Plan]:
    """The :func:`_plan` of every top-level node the layout can take (a group normalization's
    inner nodes planned with its first, as absorbed)."""
    plans: dict[Node, Plan] = {}
    for n in graph.node_list():
        if n in plans:  # (a group normalization's inner nodes, planned with its first)
            continue
        gn = _groupnorm_chain(n)
        if gn is not None:
            plans[n] = ("groupnorm", gn)
            for m in gn["inner"] + [gn["last"]]:
                plans[m] = ("absorbed", {"head": n})
            continue
        got = _plan(n, conv_algorithm)
        if got is not None:
            plans[n] = got
    return plans


def _kept(graph: Graph, plans: dict[Node, Plan], min_convs: int) -> set[Node]:
    """The planned nodes whose group pays for its reorders: at least ``min_convs`` convolutions,
    and two for each plane that enters or leaves (zfnet's three between two LRNs do not)."""
    keep: set[Node] = set()
    for grp in _groups(graph, plans):
        convs = sum(1 for n in grp if plans[n][0] == "conv")
        if convs >= min_convs and convs >= 2 * _edges(grp, plans):
            keep |= grp
    return keep


class _Rewrite:
    """One rewrite of a graph's kept nodes into their blocked forms (:func:`apply_layout`)."""

    def __init__(self, graph: Graph, plans: dict[Node, Plan], keep: set[Node]) -> None:
        self.graph, self.plans, self.keep = graph, plans, keep
        self.stats = {"convs": 0, "pools": 0, "elementwise": 0, "concats": 0, "reorders": 0}
        self.blocked: dict[Value, Value] = {}  # an NCHW value -> its blocked form
        self.order = [n for n in graph.node_list() if n in keep]
        self.made: dict[Node, Node] = {}
        self.replaced: list[Value] = []  # weight constants whose packed form the blocked convolutions read
        # the NCHW values that stand for a source tensor (a reorder's result, a global pool's) take
        # its name once the original is gone (what --dump-tensors and the comparison tools match
        # the source by); a blocked one keeps its own
        self.named: list[tuple[Value, str]] = []

    def block_of(self, v: Value | None, before: Node) -> Value:
        if v is None:  # pragma: no cover - the plans only take present inputs
            raise GraphError(f"nchwc_layout: {before.describe()} lacks an input")
        got = self.blocked.get(v)
        if got is not None:
            return got
        r = self.graph.add_node("NchwcReorderInput", [v], domain=DOMAIN, name=f"{v.name}_to_nchwc", before=before,
                                output_types=[blocked_type(_shape(v))])
        self.stats["reorders"] += 1
        self.blocked[v] = r.outputs[0]
        return r.outputs[0]

    def groupnorm(self, n: Node, p: dict) -> None:
        graph = self.graph
        last_out = p["last"].outputs[0]
        ys = _shape(last_out)
        new = graph.add_node("NchwcGroupNorm", [self.block_of(n.inputs[0], n),
                                                graph.add_constant(_pad_channels(p["scale"], ys[1])),
                                                graph.add_constant(_pad_channels(p["bias"], ys[1]))],
                             {"group_channels": p["group_channels"], "epsilon": p["epsilon"], "relu": int(p["relu"])},
                             domain=DOMAIN, name=n.name, before=n, output_types=[blocked_type(ys)])
        self.stats["elementwise"] += 1
        self.made[n] = self.made[p["last"]] = new
        self.blocked[last_out] = new.outputs[0]

    def conv(self, n: Node, p: dict, ys: tuple[int, ...]) -> Node:
        x_in = n.inputs[0] if p["plain"] else self.block_of(n.inputs[0], n)
        attrs = dict(p["attrs"])
        w_in = n.inputs[1]
        if w_in is not None and w_in.const_value is not None and w_in.const_value.dtype == np.float32:
            # the weight packed now, for the algorithm the conv table chooses now: the .om keeps it so
            wv = w_in.const_value
            cb = 0 if p["plain"] else nchwc.blocks(_shape(n.inputs[0])[1])
            packing = conv_nchwc.packing(p["conv"], cb, blocked_type(ys).shape)
            self.replaced.append(w_in)
            w_in = self.graph.add_constant(pack_weight(packing, wv, cb, attrs["group"]))
            attrs["weight_packing"] = packing
            attrs["weight_shape"] = [int(v) for v in wv.shape]
        ins = [x_in, w_in, n.inputs[2] if len(n.inputs) > 2 else None]
        if p["addend"]:
            ins.append(self.block_of(n.inputs[3], n))
        self.stats["convs"] += 1
        new = self.graph.add_node("NchwcConv", ins, attrs, domain=DOMAIN, name=n.name, before=n,
                                  output_types=[blocked_type(ys)])
        # the source names (a --keep_dtype name, an int8 entry find the blocked form through them)
        new.meta[FUSED_FROM_META] = list(n.meta.get(FUSED_FROM_META) or [n.name])
        return new

    def gap(self, n: Node) -> None:
        out = n.outputs[0]
        new = self.graph.add_node("NchwcGlobalAveragePool", [self.block_of(n.inputs[0], n)], {"channels": _shape(out)[1]},
                                  domain=DOMAIN, name=n.name, before=n, output_types=[out.type])
        self.made[n] = new
        if not out.is_graph_output:  # (a graph output's name moves over with the replacement)
            self.named.append((new.outputs[0], out.name))
        out.replace_all_uses_with(new.outputs[0])

    def other(self, n: Node, kind: str, p: dict, ys: tuple[int, ...]) -> Node:
        """A pool, a batch norm, an elementwise op or a concat on blocked values."""
        graph = self.graph
        if kind == "pool":
            op = "NchwcMaxPool" if n.op_type == "MaxPool" else "NchwcAveragePool"
            self.stats["pools"] += 1
            return graph.add_node(op, [self.block_of(n.inputs[0], n)], dict(p["attrs"]), domain=DOMAIN, name=n.name,
                                  before=n, output_types=[blocked_type(ys)])
        if kind == "batchnorm":
            x5 = self.block_of(n.inputs[0], n)
            sc = graph.add_constant(p["scale"])
            sh = graph.add_constant(p["shift"])
            mul = graph.add_node("Mul", [x5, sc], name=f"{n.name}_scale", before=n, output_types=[blocked_type(ys)])
            self.stats["elementwise"] += 2
            return graph.add_node("Add", [mul.outputs[0], sh], name=n.name, before=n, output_types=[blocked_type(ys)])
        ins = [v if v is None or v.is_constant else self.block_of(v, n) for v in n.inputs]
        if kind == "elementwise" and n.op_type in BINARY:
            for i, v in enumerate(ins):
                cc = _channel_const(v, ys[1]) if v is not None and v.is_constant else None
                if cc is not None and cc.ndim == 5:
                    ins[i] = graph.add_constant(cc)
        attrs = dict(n.attrs)
        if kind == "concat":
            attrs["axis"] = 1  # (the blocks' axis in 5-D: -3 would name H there)
        self.stats["elementwise" if kind == "elementwise" else "concats"] += 1
        return graph.add_node(n.op_type, ins, attrs, domain=n.domain, name=n.name, before=n,
                              output_types=[blocked_type(ys)])

    def nodes(self) -> None:
        """Every kept node's blocked form, in the graph's order."""
        for n in self.order:
            kind, p = self.plans[n]
            if kind == "absorbed":  # (made with the group normalization's first node)
                continue
            if kind == "groupnorm":
                self.groupnorm(n, p)
                continue
            if kind == "gap":
                self.gap(n)
                continue
            out = n.outputs[0]
            ys = _shape(out)
            new = self.conv(n, p, ys) if kind == "conv" else self.other(n, kind, p, ys)
            self.made[n] = new
            self.blocked[out] = new.outputs[0]

    def leave(self) -> None:
        """Values read outside the layout (or graph outputs) leave it through a reorder."""
        plans, graph = self.plans, self.graph
        for n in self.order:
            if plans[n][0] in ("gap", "groupnorm") or (plans[n][0] == "absorbed" and n is not plans[plans[n][1]["head"]][1]["last"]):
                continue
            out = n.outputs[0]
            outside = [u for u in out.users if u not in self.keep] or out.is_graph_output
            if outside:
                r = graph.add_node("NchwcReorderOutput", [self.blocked[out]], {"channels": _shape(out)[1]}, domain=DOMAIN,
                                   name=f"{out.name}_from_nchwc", after=self.made[n], output_types=[out.type])
                self.stats["reorders"] += 1
                for u, i in out.uses():
                    if u not in self.keep:
                        u.set_input(i, r.outputs[0])
                if out.is_graph_output:
                    out.replace_all_uses_with(r.outputs[0])
                else:
                    self.named.append((r.outputs[0], out.name))

    def finish(self) -> None:
        """The originals removed, the names handed over."""
        graph = self.graph
        for n in reversed(self.order):
            for v in n.outputs:
                for u, _ in v.uses():
                    if u in self.keep:
                        continue
                    raise GraphError(f"nchwc_layout: node '{u.name}' still reads '{v.name}'")
            _detach(graph, n)
        # the weights packed above: the originals go when nothing else reads them (an .om keeps one form)
        for v in self.replaced:
            if v.is_constant and not v.has_uses() and not v.is_graph_output and graph.constants.get(v.name) is v:
                graph.remove_constant(v)
        for v, name in self.named:
            if name not in graph.names:
                graph.rename_value(v, name)
        # the blocked nodes take their originals' names (what --keep_dtype, the tools and the
        # reports name them by)
        for old, new in self.made.items():
            if self.plans[old][0] == "absorbed":
                continue
            if old.name != new.name and old.name not in graph.node_names:
                graph.node_names.release(new.name)
                new.name = graph.node_names.claim(old.name)


def declines(graph: Graph, plans: dict[Node, Plan], keep: set[Node], min_convs: int,
             conv_algorithm: str = "auto") -> dict[str, str]:
    """Why each Conv/FusedConv the layout leaves in NCHW stays there, by node name (the compile
    report's ``stats["declined"]`` of the pass: a symbolic channel dim, a grouping the kernels do
    not take, a group too small for its reorders)."""
    out: dict[str, str] = {}
    group_of = {n: grp for grp in _groups(graph, plans) for n in grp}
    for n in graph.node_list():
        if n in keep or not _is_conv(n):
            continue
        grp = group_of.get(n)
        if grp is None:
            out[n.name] = conv_decline(n, conv_algorithm) or "the blocked kernels do not take it"
            continue
        convs = sum(1 for m in grp if plans[m][0] == "conv")
        out[n.name] = (f"its connected group of {convs} convolution(s) does not pay for its {_edges(grp, plans)} "
                       f"reorder(s) (it needs {min_convs} convolutions and 2 for each reorder)")
    return out


def apply_layout(graph: Graph, min_convs: int = 2, conv_algorithm: str = "auto",
                 declined: dict[str, str] | None = None) -> dict[str, int]:
    """Rewrite ``graph``'s top level: the groups of :func:`_plan` nodes with at least
    ``min_convs`` convolutions run in the blocked layout. Returns counts per kind; fills
    ``declined`` (when given) with :func:`declines`."""
    plans = _plan_nodes(graph, conv_algorithm)
    keep = _kept(graph, plans, min_convs)
    if declined is not None:
        declined.update(declines(graph, plans, keep, min_convs, conv_algorithm))
    rw = _Rewrite(graph, plans, keep)
    if not keep:
        return rw.stats
    rw.nodes()
    rw.leave()
    rw.finish()
    return rw.stats


def fold_channel_scales(graph: Graph) -> int:
    """Fold each blocked ``Mul(x, s)`` of an activation and a per-channel scale (an SE block's
    gate, ``(N or 1, C/16, 1, 1, 16)``) whose one reader is an ungrouped 1x1 NchwcConv with no
    more output channels than the plane has pixels into that convolution's input scale (input
    4): the kernel scales its weight's input channels per image (a copy of C x M floats) instead
    of a pass over the activation. Returns the Muls folded."""
    folded = 0
    for n in graph.node_list():
        if n.op_type != "Mul" or n.domain not in ("", "ai.onnx") or len(n.inputs) != 2 or len(n.outputs) != 1:
            continue
        out = n.outputs[0]
        ys = out.type.shape if out.type is not None else None
        if ys is None or len(ys) != 5 or out.is_graph_output or len(out.users) != 1:
            continue
        conv = next(iter(out.users))
        uses = list(out.uses())
        if conv.op_type != "NchwcConv" or conv.domain != DOMAIN or uses != [(conv, 0)] or len(conv.inputs) > 4:
            continue
        a = conv.attrs
        if int(a.get("group", 1) or 1) != 1 or int(a.get("plain_input", 0) or 0) or list(a.get("kernel_shape") or ()) != [1, 1]:
            continue
        full = scale = None
        for v, other in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            if v is None or other is None:
                continue
            vs = v.type.shape if v.type is not None else None
            os_ = other.type.shape if other.type is not None else None
            if vs is not None and tuple(vs) == tuple(ys) and os_ is not None and not other.is_constant \
                    and len(os_) == 5 and tuple(os_[1:]) == (ys[1], 1, 1, BLOCK) and os_[0] in (1, ys[0]):
                full, scale = v, other
                break
        if full is None:
            continue
        # the weight's copy costs one pass over C x M floats an image, the Mul one over C x H x W:
        # fold where the plane is the larger (a 7x7 plane of 1152 channels into 320 ran 1.5x
        # slower); per image, so any batch (a symbolic one too) folds the same
        w = conv.attrs.get("weight_shape") or (conv.inputs[1].type.shape if conv.inputs[1] is not None
                                               and conv.inputs[1].type is not None else None)
        if w is None or not all(isinstance(d, int) for d in (ys[2], ys[3], w[0])) or ys[2] * ys[3] < w[0]:
            continue
        ins = list(conv.inputs) + [None] * (4 - len(conv.inputs))
        conv.set_input(0, full)
        for i in range(len(conv.inputs), 4):
            conv.add_input(ins[i])
        conv.add_input(scale)
        _detach(graph, n)
        folded += 1
    return folded


def _detach(graph: Graph, node: Node) -> None:
    for i in range(len(node.inputs)):
        node.set_input(i, None)
    graph.remove_node(node)


class NchwcLayout(Pass):
    """Keep runs of convolutions in the blocked NCHWc layout (the cpu backend's direct kernels)."""

    name = "nchwc_layout"
    stage = "fuse"
    opt_level = 1
    after = ("pattern_fusion",)
    before = ("auto_fusion",)  # (which then fuses the elementwise ops left between, on 5-D values)
    params = {"min_convs": 2}
    description = "keep runs of convolutions in the blocked (N, C/16, H, W, 16) layout, reorders at the edges"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if ctx.options.soc_version != "cpu":
            return PassResult(False)
        if not nchwc.available():
            return PassResult(False, {"skipped": "the blocked kernels need AVX-512F, or AVX2 with FMA"})
        try:
            algorithm = conv_algorithm_option(ctx.options)
        except OptionError:  # (the program's build reports it as the option's error, not this pass's)
            algorithm = "auto"
        declined: dict[str, str] = {}  # (a convolution left in NCHW: why, in the report)
        stats: dict[str, Any] = apply_layout(graph, int(ctx.params.get("min_convs", self.params["min_convs"])),
                                             algorithm, declined)
        stats["scales_folded"] = fold_channel_scales(graph)
        changed = any(stats.values())
        stats["declined"] = declined
        return PassResult(changed, {k: v for k, v in stats.items() if v})


# ------------------------------------------------------------------------------------------------
# the ops
# ------------------------------------------------------------------------------------------------
def _bad(node: Node, why: str) -> GraphError:
    return GraphError(f"{node.describe()}: {why}", hint="the .om was not made by this compiler's nchwc_layout pass")


def _ints_ok(v: Any, n: int, low: int) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == n and all(isinstance(a, (int, np.integer)) and low <= a <= 1 << 20
                                                                for a in v)


def check_node(node: Node) -> None:
    """Validate a blocked op's attributes (raises GraphError naming the node)."""
    a = node.attrs
    if node.op_type in ("NchwcConv", "NchwcMaxPool", "NchwcAveragePool"):
        for name, n, low in (("kernel_shape", 2, 1), ("strides", 2, 1), ("dilations", 2, 1), ("pads", 4, 0)):
            if name in a and not _ints_ok(a[name], n, low):
                raise _bad(node, f"attribute {name} must be {n} ints of at least {low}")
    if node.op_type == "NchwcConv":
        if _text(a.get("activation", "")) not in ACTIVATIONS:
            raise _bad(node, f"activation must be one of {', '.join(x or '(none)' for x in ACTIVATIONS)}")
        for name in ("clip_min", "clip_max"):
            if name in a and not isinstance(a[name], (int, float, np.floating)):
                raise _bad(node, f"attribute {name} must be a number")
        if not isinstance(a.get("group", 1), (int, np.integer)) or int(a.get("group", 1)) < 1:
            raise _bad(node, "attribute group must be a positive int")
        if a.get("plain_input", 0) not in (0, 1):
            raise _bad(node, "attribute plain_input must be 0 or 1")
        if _text(a.get("weight_packing", "")) not in PACKINGS:
            raise _bad(node, f"weight_packing must be one of {', '.join(x or '(none)' for x in PACKINGS)}")
        if _text(a.get("weight_packing", "")) and not _ints_ok(a.get("weight_shape"), 4, 1):
            raise _bad(node, "a packed weight needs weight_shape, 4 positive ints")
        if _text(a.get("out_dtype", "")) not in ("", "float32", "uint8") or (
                _text(a.get("out_dtype", "")) == "uint8" and (_text(a.get("weight_packing", "")) not in INT8_PACKINGS
                                                            or a.get("out_scale") is None)):
            raise _bad(node, "out_dtype must be float32, or uint8 for an int8 convolution with out_scale")
        _check_conv_geometry(node)
    if node.op_type == "NchwcGroupNorm":
        gs = a.get("group_channels")
        if not isinstance(gs, (int, np.integer)) or not (1 <= gs <= 64 * BLOCK) or not (BLOCK % gs == 0 or gs % BLOCK == 0):
            raise _bad(node, f"attribute group_channels must divide {BLOCK} or be whole blocks (at most 64)")
        if not isinstance(a.get("epsilon", 1e-5), (int, float, np.floating)) or not float(a.get("epsilon", 1e-5)) >= 0:
            raise _bad(node, "attribute epsilon must be a non-negative number")
        if a.get("relu", 0) not in (0, 1):
            raise _bad(node, "attribute relu must be 0 or 1")
    if node.op_type == "NchwcReorderOutput" or (node.op_type == "NchwcGlobalAveragePool" and "channels" in a):
        c = a.get("channels")
        if not isinstance(c, (int, np.integer)) or c < 1:
            raise _bad(node, "attribute channels must be a positive int")
        x = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
        if x is not None and x.shape is not None and len(x.shape) == 5 and isinstance(x.shape[1], int) \
                and c > x.shape[1] * BLOCK:
            raise _bad(node, f"attribute channels {c} exceeds the input's {x.shape[1]} blocks of {BLOCK}")


def _check_conv_geometry(node: Node) -> None:
    """An NchwcConv's attributes against its weight: the kernel runs the weight's (M, C/group,
    KH, KW) (``weight_shape`` of a packed one), while its output type comes from the attributes,
    so a ``kernel_shape`` or ``group`` that contradicts the weight (or the input's channels) would
    run a convolution of another output shape than the one planned."""
    a = node.attrs
    if _text(a.get("weight_packing", "")):
        w = tuple(int(v) for v in a["weight_shape"])
        how = "its packed weight's weight_shape"
    else:
        wt = node.inputs[1].type if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if wt is None or wt.shape is None or not all(isinstance(d, int) for d in wt.shape):
            return
        if len(wt.shape) != 4:
            raise _bad(node, f"the weight must be 4-D (M, C/group, KH, KW), it is {tuple(wt.shape)}")
        w = tuple(wt.shape)
        how = "its weight's shape"
    m, cg = w[:2]
    if "kernel_shape" in a and tuple(int(v) for v in a["kernel_shape"]) != w[2:]:
        raise _bad(node, f"attribute kernel_shape {list(a['kernel_shape'])} contradicts {how} {list(w)} "
                         f"(kernel {list(w[2:])})")
    group = int(a.get("group", 1))
    if m % group:
        raise _bad(node, f"attribute group {group} does not divide the {m} output channels of {how} {list(w)}")
    x = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
    plain = bool(int(a.get("plain_input", 0) or 0))
    if x is not None and x.shape is not None and isinstance(x.shape[1] if len(x.shape) > 1 else None, int):
        if plain:
            if group != 1 or len(x.shape) != 4 or x.shape[1] != cg:
                raise _bad(node, f"a plain (NCHW) input of {x.shape[1] if len(x.shape) > 1 else '?'} channels, group "
                                 f"{group}, does not fit {how} {list(w)} (an ungrouped one of {cg} channels)")
        elif len(x.shape) == 5:
            cb = x.shape[1]
            depthwise = group > 1 and cg == 1 and group == m
            if depthwise:
                ok = cb == nchwc.blocks(m)
            elif group > 1:
                ok = cg * group == cb * BLOCK
            else:
                ok = cb >= nchwc.blocks(cg)
            if not ok:
                raise _bad(node, f"attribute group {group} and the input's {cb} blocks of {BLOCK} channels "
                                 f"contradict {how} {list(w)}")
    packing = _text(a.get("weight_packing", ""))
    if packing:
        depthwise = group > 1 and cg == 1 and group == m
        k, st, dil = w[2:], tuple(a.get("strides") or (1, 1)), tuple(a.get("dilations") or (1, 1))
        fits = {"plain": plain, "depthwise": depthwise and not plain, "blocked": not plain and not depthwise,
                "bf16": group == 1, "int8": group == 1, "int8dw": depthwise and not plain}.get(
            packing, not plain and not depthwise and k == (3, 3) and st == (1, 1) and dil == (1, 1))
        if not fits:
            raise _bad(node, f"weight_packing {packing} does not fit the convolution: it contradicts the attributes "
                             f"(weight {list(w)}, group {group}, strides {list(st)}, dilations {list(dil)}"
                             f"{', plain input' if plain else ''})")
        wt = node.inputs[1].type if len(node.inputs) > 1 and node.inputs[1] is not None else None
        cb = 0 if plain else (x.shape[1] if x is not None and x.shape is not None and len(x.shape) == 5 else None)
        if wt is not None and wt.shape is not None and len(wt.shape) == 1 and isinstance(wt.shape[0], int) \
                and isinstance(cb, int):
            want = packed_size(packing, w, cb, group)
            if wt.shape[0] != want:
                raise _bad(node, f"a {packing} weight of {wt.shape[0]} floats, {want} expected for its weight_shape "
                                 f"{list(w)}")
    y = node.outputs[0].type if node.outputs and node.outputs[0] is not None else None
    if y is not None and y.shape is not None and len(y.shape) == 5 and isinstance(y.shape[1], int) \
            and y.shape[1] != nchwc.blocks(m):
        raise _bad(node, f"the output's {y.shape[1]} blocks do not hold the {m} output channels of {how} {list(w)}")


def _window_infer(channels_from_weight: bool):
    def infer(node, opset):
        x = node.inputs[0].type
        rank = 4 if channels_from_weight and int(node.attrs.get("plain_input", 0) or 0) else 5
        a = node.attrs
        if x.shape is None or len(x.shape) != rank:
            return [TensorType(np.dtype(_text(a.get("out_dtype", "")) or x.dtype), None)]
        k = list(a.get("kernel_shape") or (a.get("weight_shape") or node.inputs[1].type.shape)[2:])
        s = list(a.get("strides") or (1, 1))
        d = list(a.get("dilations") or (1, 1))
        p = list(a.get("pads") or (0, 0, 0, 0))
        dims = []
        for i in range(2):
            size = x.shape[2 + i]
            if not isinstance(size, int):
                dims.append(None)
                continue
            dims.append((size + p[i] + p[i + 2] - d[i] * (k[i] - 1) - 1) // s[i] + 1)
        cb = x.shape[1]
        dt = x.dtype
        if channels_from_weight:
            w = node.attrs.get("weight_shape") or node.inputs[1].type.shape
            cb = nchwc.blocks(w[0]) if w is not None else None
            # (an int8 convolution may read and write the quantised integers: out_dtype uint8)
            dt = np.dtype(_text(a.get("out_dtype", "")) or np.float32)
        return [TensorType(dt, (x.shape[0], cb, dims[0], dims[1], BLOCK))]

    return infer


def _same_type(node, opset):
    x = node.inputs[0]
    return [x.type if x is not None else TensorType(np.dtype("float32"), None)]


def _reorder_in_infer(node, opset):
    x = node.inputs[0].type
    if x.shape is None or len(x.shape) != 4:
        return [TensorType(x.dtype, None)]
    n, c, h, w = x.shape
    return [TensorType(x.dtype, (n, nchwc.blocks(c) if isinstance(c, int) else None, h, w, BLOCK))]


def _reorder_out_infer(node, opset):
    x = node.inputs[0].type
    if x.shape is None or len(x.shape) != 5:
        return [TensorType(x.dtype, None)]
    return [TensorType(x.dtype, (x.shape[0], int(node.attrs.get("channels", 0)), x.shape[2], x.shape[3]))]


def _gap_infer(node, opset):
    x = node.inputs[0].type
    if x.shape is None or len(x.shape) != 5:
        return [TensorType(x.dtype, None)]
    c = int(node.attrs.get("channels", 0) or 0)  # (0: every lane of the blocks)
    if not c and isinstance(x.shape[1], int):
        c = x.shape[1] * BLOCK
    return [TensorType(x.dtype, (x.shape[0], c or None, 1, 1))]


_OPS: dict[str, Any] = {"internal": True, "check": check_node, "alias": ""}
_WINDOW = {"kernel_shape": None, "strides": None, "dilations": None, "pads": None}

OPDEFS = [
    OpDef("NchwcConv", DOMAIN, **_OPS, min_inputs=2, max_inputs=5, kind=OpKind.OPAQUE, infer=_window_infer(True),
          attrs={**_WINDOW, "group": 1, "clip_min": None, "clip_max": None, "activation": "", "plain_input": 0,
                 "weight_packing": "", "weight_shape": None, "out_dtype": ""},
          doc="a 2-D convolution on blocked (N, C/16, H, W, 16) values (plain_input: X is NCHW): "
              "act(clip(conv(X * S, W) + B + Z)), S a per-channel scale (N or 1, C/16, 1, 1, 16)"),
    OpDef("NchwcGroupNorm", DOMAIN, **_OPS, min_inputs=3, max_inputs=3, kind=OpKind.OPAQUE,
          infer=_same_type, attrs={"group_channels": 1, "epsilon": 1e-5, "relu": 0},
          doc="group normalization of a blocked value: the mean and variance over each group of group_channels "
              "channels and the plane, then Scale and Bias per channel (blocked (1, C/16, 1, 1, 16)), then a "
              "Relu when relu is 1"),
    OpDef("NchwcMaxPool", DOMAIN, **_OPS, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE, infer=_window_infer(False),
          attrs=dict(_WINDOW), doc="max pooling of a blocked value"),
    OpDef("NchwcAveragePool", DOMAIN, **_OPS, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE,
          infer=_window_infer(False), attrs={**_WINDOW, "count_include_pad": 0},
          doc="average pooling of a blocked value"),
    OpDef("NchwcGlobalAveragePool", DOMAIN, **_OPS, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE, infer=_gap_infer,
          attrs={"channels": 0}, doc="the mean of each channel of a blocked value, as NCHW (N, C, 1, 1)"),
    OpDef("NchwcReorderInput", DOMAIN, **_OPS, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE, infer=_reorder_in_infer,
          doc="NCHW to the blocked (N, C/16, H, W, 16) layout"),
    OpDef("NchwcReorderOutput", DOMAIN, **_OPS, min_inputs=1, max_inputs=1, kind=OpKind.OPAQUE,
          infer=_reorder_out_infer, attrs={"channels": 0}, doc="the blocked layout back to NCHW (C channels)"),
]
