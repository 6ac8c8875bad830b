"""Constant folding and shape folding.

Constant folding runs the cpu backend's own kernels (the factories registered through
``ge_register_kernels``) on nodes whose inputs are all constants, so folding and execution
agree by construction. Results that are one value repeated (ConstantOfShape, and elementwise or
data-movement ops applied to such values) are kept as *splats*: read-only broadcast arrays that
store one element, so folding the light models' ConstantOfShape weights costs no memory.

Size rule: a folded result is kept only when the bytes it really stores are at most
``size_limit`` or at most the bytes of the constant inputs it frees, so folding never grows the
model by more than ``size_limit`` per node (a small Expand of a scalar to a huge shape stays).
A result of more elements than an .om constant may claim (``MAX_WEIGHT_ELEMENTS``, 2**40) is
never kept, splat or not: the node stays.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec
from ge_core.ops import OpRegistry
from ge_core.passes import PassContext, PassResult
from ge_core.serialize import MAX_WEIGHT_ELEMENTS, weight_span
from ge_sdk.rewrite import Rewriter, RulePass

from ._util import const, first_element, int_list, is_splat, splat, static_shape, stored_nbytes

log = logging.getLogger("ge.passes")

#: Elementwise ops (with broadcasting): all-splat inputs give a splat output.
ELEMENTWISE = frozenset(
    """
    Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Erf Exp Floor Log Neg Reciprocal Round
    Sigmoid Sign Sin Sinh Sqrt Tan Tanh Relu LeakyRelu Elu Selu Celu HardSigmoid HardSwish
    Softplus Softsign ThresholdedRelu Gelu Mish Not IsNaN IsInf BitwiseNot Clip Shrink
    Cast CastLike Identity Add Sub Mul Div Pow Max Min Sum Mean And Or Xor Equal Greater Less
    GreaterOrEqual LessOrEqual Where Mod BitShift BitwiseAnd BitwiseOr BitwiseXor
    """.split()
)

#: Data-movement ops: when every listed data input is a splat of one value, so is the output.
#: ``None`` means every input is data.
DATA_MOVEMENT: dict[str, tuple[int, ...] | None] = {
    "Reshape": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Flatten": (0,), "Expand": (0,),
    "Transpose": (0,), "Tile": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,),
    "GatherND": (0,), "Concat": None, "Split": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,),
}

#: Never folded even with constant inputs (control flow and sequence ops have no array result).
NEVER_FOLD = frozenset("If Loop Scan SequenceConstruct SequenceEmpty SequenceInsert SplitToSequence".split())


class FoldConstants(RulePass):
    """Replace nodes whose inputs are all constant by their result, computed by the backend's
    kernels."""

    name = "fold_constants"
    stage = "optimize"
    opt_level = 1
    fixed_point = True
    description = ("evaluate nodes whose inputs are all constants with the backend's kernels (ConstantOfShape "
                   "and friends as one-element splats); never random ops; off with constant_folding=false")
    params = {"size_limit": 1 << 20, "backend": "cpu"}

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.options.constant_folding

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        self._kernels = ctx.registries.kernels_for(ctx.params.get("backend", "cpu")) if ctx.registries else None
        return super().run(graph, ctx)

    def generic_rules(self) -> Sequence[Callable[[Node, Rewriter], bool]]:
        return (self.fold,)

    def fold(self, node: Node, rw: Rewriter) -> bool:
        if node.op_type in NEVER_FOLD or node.subgraphs():
            return False
        if any(v is not None and v.const_value is None for v in node.inputs):
            return False
        if not any(o.has_uses() or o.is_graph_output for o in node.outputs):
            return False
        opdef = rw.ops.lookup(node.domain, node.op_type) if rw.ops is not None else None
        if opdef is None or not opdef.deterministic:
            return False
        try:
            results = self.evaluate(node, rw)
        except Exception as e:  # noqa: BLE001 - a kernel that cannot fold leaves the node alone
            log.debug("folding %s skipped: %s: %s", node.describe(), type(e).__name__, e)
            return False
        if results is None or not self.small_enough(node, results, int(rw.params.get("size_limit", 1 << 20))):
            return False
        if any(weight_span(r.shape) > MAX_WEIGHT_ELEMENTS for r in results):
            # a splat can claim any shape, but an .om cannot store this one (its reader refuses it): keep the node
            log.debug("folding %s skipped: its result has more than %d elements", node.describe(), MAX_WEIGHT_ELEMENTS)
            return False
        values: list[Value | None] = [
            rw.constant(r, like=o) if (o.has_uses() or o.is_graph_output) else None
            for o, r in zip(node.outputs, results)
        ]
        if rw.replace_node(node, values):
            return True
        for v in values:  # could not replace (a graph output): drop the unused constants again
            if v is not None and not v.has_uses() and v.graph is not None:
                v.graph.remove_constant(v)
        return False

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self, node: Node, rw: Rewriter) -> list[np.ndarray] | None:
        out = splat_result(node)
        if out is not None:
            return out
        if self._kernels is None:
            return None
        factory = self._kernels.get((OpRegistry.norm_domain(node.domain), node.op_type))
        if factory is None:
            return None
        ins = [const(v) for v in node.inputs]
        limit = max(int(rw.params.get("size_limit", 1 << 20)), 1 << 16)
        spec = KernelSpec.from_node(node, rw.ctx.options if rw.ctx is not None else None)
        if node.op_type in ELEMENTWISE and all(a is None or is_splat(a) for a in ins) and any(
                a is not None and a.size > 1 for a in ins):
            return self._elementwise_splat(node, ins, spec, factory)
        # never materialise a huge splat input just to fold a node whose result would be refused
        if any(a is not None and is_splat(a) and a.nbytes > limit for a in ins):
            return None
        results = factory(spec)(*ins)
        return self._checked(node, results)

    def _elementwise_splat(self, node: Node, ins: list[np.ndarray | None], spec: KernelSpec,
                           factory: Callable[[KernelSpec], Callable[..., Any]]) -> list[np.ndarray] | None:
        shape = np.broadcast_shapes(*[a.shape for a in ins if a is not None])
        small = [None if a is None else first_element(a).reshape((1,) * a.ndim) for a in ins]
        spec = dataclasses.replace(
            spec,
            inputs=[None if a is None else TensorType.of(a) for a in small],
            outputs=[TensorType(o.type.dtype, (1,) * len(shape)) for o in node.outputs],
            const_inputs=list(small),
        )
        results = factory(spec)(*small)
        if len(results) != len(node.outputs):
            return None
        out = [splat(first_element(np.asarray(r)), shape, np.asarray(r).dtype) for r in results]
        return self._checked(node, out)

    def _checked(self, node: Node, results: Any) -> list[np.ndarray] | None:
        """The kernel's results when they agree with the node's known output types."""
        if not isinstance(results, (list, tuple)) or len(results) != len(node.outputs):
            return None
        out = []
        for o, r in zip(node.outputs, results):
            if not isinstance(r, np.ndarray):
                if isinstance(r, np.generic):
                    r = np.asarray(r)
                else:
                    return None
            t = o.type
            if t.dtype is not None and r.dtype != t.dtype:
                return None
            s = static_shape(t)
            if s is not None and tuple(r.shape) != s:
                return None
            if t.shape is not None and len(t.shape) != r.ndim:
                return None
            if not is_splat(r) or r.size <= 1:
                r = np.array(r, copy=True, order="C")
            out.append(r)
        return out

    @staticmethod
    def small_enough(node: Node, results: list[np.ndarray], limit: int) -> bool:
        new = sum(stored_nbytes(r) for o, r in zip(node.outputs, results) if o.has_uses() or o.is_graph_output)
        if new <= limit:
            return True
        freed = 0
        for v in dict.fromkeys(v for v in node.inputs if v is not None):
            if v.const_value is not None and all(n is node for n, _ in v.uses()) and not v.is_graph_output:
                freed += stored_nbytes(v.const_value)
        return new <= freed


def splat_result(node: Node) -> list[np.ndarray] | None:
    """Results of ConstantOfShape and of data movement over splats, without running a kernel."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return None
    if op == "ConstantOfShape":
        shape = int_list(const(node.inputs[0]))
        if shape is None or any(d < 0 for d in shape):
            return None
        value = node.attrs.get("value")
        v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
        if v.size != 1:
            return None
        return [splat(v[0], shape, v.dtype)]
    if op in DATA_MOVEMENT:
        idx = DATA_MOVEMENT[op]
        data = [node.inputs[i] for i in (range(len(node.inputs)) if idx is None else idx) if i < len(node.inputs)]
        arrays = [const(v) for v in data]
        if not arrays or any(a is None or a.size == 0 or not is_splat(a) for a in arrays):
            return None
        firsts = [first_element(a) for a in arrays]  # type: ignore[arg-type]
        if any(f.dtype != firsts[0].dtype or f.tobytes() != firsts[0].tobytes() for f in firsts):
            return None
        out = []
        for o in node.outputs:
            s = static_shape(o.type)
            if s is None or (o.type.dtype is not None and o.type.dtype != firsts[0].dtype):
                return None
            out.append(splat(firsts[0], s, firsts[0].dtype))
        return out
    return None


# ------------------------------------------------------------------------------------------------
# shape folding
# ------------------------------------------------------------------------------------------------
def replace_by_constant(node: Node, arr: np.ndarray, rw: Rewriter) -> bool:
    """Replace the single-output ``node`` by a constant holding ``arr``. Where that is not possible
    (a graph output keeps its producer) nothing changes: the constant is not left behind, or
    ``dce`` would remove it and the fixed-point stage would never settle."""
    c = rw.constant(arr, like=node.output)
    if rw.replace_node(node, [c]):
        return True
    if not c.has_uses() and c.graph is not None:
        c.graph.remove_constant(c)
    return False


def _shape_dims(node: Node) -> list[Any] | None:
    """Dims a Shape node returns (ints where known, None/str where not), honouring start/end."""
    x = node.inputs[0]
    if x is None or x.type.shape is None:
        return None
    dims = list(x.type.shape)
    r = len(dims)
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    start = max(0, min(r, start + r if start < 0 else start))
    e = r if end is None else int(end)
    e = max(0, min(r, e + r if e < 0 else e))
    return dims[start:e]


def fold_shape(node: Node, rw: Rewriter) -> bool:
    """Shape of a value whose shape is static."""
    dims = _shape_dims(node)
    if dims is None or not all(isinstance(d, int) for d in dims):
        return False
    return replace_by_constant(node, np.array(dims, dtype=np.int64), rw)


def fold_size(node: Node, rw: Rewriter) -> bool:
    """Size of a value whose shape is static."""
    x = node.inputs[0]
    n = x.type.numel if x is not None else None
    if n is None:
        return False
    return replace_by_constant(node, np.array(n, dtype=np.int64), rw)


def _from_shape(v: Value | None) -> list[Any] | None:
    p = v.producer if v is not None else None
    if p is None or p.op_type != "Shape" or p.domain not in ("", "ai.onnx"):
        return None
    return _shape_dims(p)


def fold_gather_of_shape(node: Node, rw: Rewriter) -> bool:
    """Gather of the static dims of a partly static Shape."""
    dims = _from_shape(node.inputs[0])
    idx = const(node.inputs[1]) if len(node.inputs) > 1 else None
    if dims is None or idx is None or idx.dtype.kind not in "iu" or int(node.attrs.get("axis", 0)) not in (0, -1):
        return False
    flat = [int(i) for i in idx.reshape(-1)]
    if any(not -len(dims) <= i < len(dims) for i in flat):
        return False
    picked = [dims[i] for i in flat]
    if not all(isinstance(d, int) for d in picked):
        return False
    arr = np.array(picked, dtype=np.int64).reshape(idx.shape)
    return replace_by_constant(node, arr, rw)


def fold_slice_of_shape(node: Node, rw: Rewriter) -> bool:
    """Slice of the static dims of a partly static Shape."""
    dims = _from_shape(node.inputs[0])
    if dims is None or len(node.inputs) < 3:
        return False
    starts, ends = int_list(const(node.inputs[1])), int_list(const(node.inputs[2]))
    axes = int_list(const(node.inputs[3])) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
    steps = int_list(const(node.inputs[4])) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if starts is None or ends is None or axes is None or steps is None:
        return False
    if len(starts) != 1 or len(ends) != 1 or axes not in ([0], [-1]) or len(steps) != 1 or steps[0] == 0:
        return False
    picked = dims[slice(starts[0], ends[0], steps[0])]
    if not all(isinstance(d, int) for d in picked):
        return False
    return replace_by_constant(node, np.array(picked, dtype=np.int64), rw)


class FoldShapes(RulePass):
    """Turn Shape, Size and Gather/Slice of partly static shapes into constants."""

    name = "fold_shapes"
    stage = "optimize"
    opt_level = 1
    fixed_point = True
    before = ("fold_constants",)
    description = ("replace Shape/Size of static shapes, and Gather/Slice picking static dims of partly static "
                   "shapes, by constants (fold_constants then folds the shape arithmetic)")
    rules = {
        "Shape": (fold_shape,),
        "Size": (fold_size,),
        "Gather": (fold_gather_of_shape,),
        "Slice": (fold_slice_of_shape,),
    }
