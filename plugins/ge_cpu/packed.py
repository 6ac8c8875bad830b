"""PackedMatMul's shared parts: a MatMul/Gemm/FusedMatMul's operands as a packed kernel takes
them, the rewrite into a ``ge.cpu::PackedMatMul``, and its kernel around a product (the reduced
precisions' in :mod:`.reduced`, the int8 one in :mod:`.int8`)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ge_core.ir.graph import Graph, Node, Value
from ge_core.kernel import KernelSpec
from ge_core.passes import Pass, PassContext, PassResult
from ge_native import sgemm
from ge_sdk import fused

from .fused.elementwise import compiled_epilogue
from .fused.epilogues import placed, store_epilogue

DOMAIN = "ge.cpu"
#: the smallest float32 weight (bytes) :class:`PackFloat32` stores packed: below it the plain
#: MatMul's kernel packs a copy at build time, whose bytes do not matter
PACK_MIN_BYTES = 1 << 20


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def const_of(v: Value | None) -> np.ndarray | None:
    return None if v is None or v.const_value is None else np.asarray(v.const_value)


def drop_constant(g: Graph, v: Value | None) -> None:
    if v is not None and v.const_value is not None and not v.has_uses() and not v.is_graph_output:
        g.remove_constant(v)


def _add_first(program: str) -> str:
    """``program`` (an epilogue, :mod:`ge_sdk.fused`'s format) after a first step ``Add(y, a0)``:
    its input refs move up by one, its ``y`` and step refs to the steps after the Add."""
    steps = fused.loads(program, anchor=True) if program else []

    def ref(r: str) -> str:
        if r == "y":
            return "t0"
        return f"{r[0]}{int(r[1:]) + 1}"

    out = [["Add", ["y", "a0"], {}]] + [[op, [ref(r) for r in refs], dict(attrs)] for op, refs, attrs in steps]
    return json.dumps(out)


class MatMulOperands:
    """A MatMul/Gemm/FusedMatMul's operands as a packed kernel takes them: ``x``, the weight
    ``w`` (k, n) float32 (Gemm's transB and alpha applied), a ``bias`` row or None, the
    epilogue ``program`` and its ``extra`` inputs (a computed C first, as an Add)."""

    def __init__(self, x: Value, w: np.ndarray, bias: np.ndarray | None, program: str, extra: list) -> None:
        self.x, self.w, self.bias, self.program, self.extra = x, w, bias, program, extra
        self.k, self.n = (int(v) for v in w.shape)


def matmul_operands(n: Node) -> MatMulOperands | str:
    """The operands of MatMul/Gemm/FusedMatMul ``n`` with a constant 2-D float32 weight, or the
    reason a packed kernel does not take it."""
    a = n.attrs
    gemm = n.op_type != "MatMul"
    w = const_of(n.inputs[1] if len(n.inputs) > 1 else None)
    if w is None or w.dtype != np.float32 or w.ndim != 2:
        return "its weight is not a constant 2-D float32 matrix"
    if gemm and int(a.get("transA", 0) or 0):
        return "transA=1"
    x = n.inputs[0]
    if x is None or x.type.dtype != np.float32 or x.type.rank is None or x.type.rank < 1 \
            or (n.op_type == "Gemm" and x.type.rank != 2):
        return "its input is not a float32 matrix"
    w = w.T if gemm and int(a.get("transB", 0) or 0) else w
    alpha, beta = (float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))) if gemm else (1.0, 1.0)
    w = np.ascontiguousarray(w * np.float32(alpha) if alpha != 1.0 else w, np.float32)
    k, nn = (int(s) for s in w.shape)
    if x.type.shape is not None and isinstance(x.type.shape[-1], int) and x.type.shape[-1] != k:
        return "its input's last dimension is not the weight's rows"
    c_in = n.inputs[2] if gemm and len(n.inputs) > 2 else None
    bias = None
    extra = list(n.inputs[3:]) if n.op_type == "FusedMatMul" else []
    program = _text(a.get("epilogue", "")) if n.op_type == "FusedMatMul" else ""
    if c_in is not None:
        c = const_of(c_in)
        if c is not None and c.dtype == np.float32 and c.size == nn and c.shape[-1] == nn:
            bias = np.ascontiguousarray(c.reshape(nn) * np.float32(beta) if beta != 1.0 else c.reshape(nn), np.float32)
        elif c is None and beta == 1.0 and c_in.type.dtype == np.float32:
            # a computed C (a residual the fusion took in): the epilogue's first step adds it
            program = _add_first(program)
            extra = [c_in, *extra]
        else:
            return "its C is neither a constant row of the output's columns nor a computed addend"
    return MatMulOperands(x, w, bias, program, extra)


def packed_node(g: Graph, n: Node, ops: MatMulOperands, stored: np.ndarray, attrs: dict[str, Any]) -> None:
    """Turn ``n`` into a PackedMatMul of ``ops`` with weight ``stored`` and ``attrs`` (k, n and
    the epilogue added), dropping the constants it no longer reads."""
    old = [v for v in n.inputs[1:3]]
    attrs = {"k": ops.k, "n": ops.n, **attrs}
    if ops.program:
        attrs["epilogue"] = ops.program
    n.op_type, n.domain, n.attrs = "PackedMatMul", DOMAIN, attrs
    bias = ops.bias
    n.set_inputs([ops.x, g.add_constant(stored, g.names.fresh(f"{n.name}_w_{attrs.get('weight_dtype', '')}")),
                  g.add_constant(bias, g.names.fresh(f"{n.name}_bias")) if bias is not None else None, *ops.extra])
    for v in old:
        drop_constant(g, v)


def packed_kernel(spec: KernelSpec, k: int, n: int, product, finish=None):
    """A PackedMatMul's kernel around ``product(a2, y2, clip, z2, act, last) -> bool``, the
    ``(rows, k) @ (k, n)`` product into ``y2`` with the epilogue steps it can apply at its store
    (False: it did not run); ``last`` says nothing follows it. The epilogue program runs at the
    store where it is one the product applies, else after it; ``finish(y)`` after that."""
    epi = compiled_epilogue(spec, 3)
    at_store = store_epilogue(spec, ("clip", "addend", "act"))

    def kernel(a, w_in=None, b_in=None, *extra, out=None):
        if a.dtype != np.float32 or a.ndim < 1 or a.shape[-1] != k:
            raise ValueError(f"{spec.describe()}: operand {a.shape} {a.dtype} does not fit the weight ({k}, {n})")
        shape = a.shape[:-1] + (n,)
        o = out[0] if out is not None else None
        y = o if o is not None and o.shape == shape and o.dtype == np.float32 and o.flags.c_contiguous \
            and o.flags.writeable and not np.may_share_memory(o, a) else np.empty(shape, np.float32)
        rows = math.prod(a.shape[:-1])
        a2 = np.ascontiguousarray(a.reshape(rows, k))
        y2 = y.reshape(rows, n)
        if at_store is not None:
            clip, uses_addend, act = at_store
            z = extra[0] if uses_addend else None
            if z is None or (z.shape == shape and z.dtype == np.float32 and z.flags.c_contiguous):
                if product(a2, y2, clip, None if z is None else z.reshape(rows, n), act, True):
                    return placed(y, o)
        if not product(a2, y2, None, None, None, epi is None):
            raise ValueError(f"{spec.describe()}: operand {a.shape} does not fit the packed weight ({k}, {n})")
        if epi is not None:
            epi(y, *extra, out=y)
            if finish is not None:
                finish(y)
        return placed(y, o)

    return kernel


class PackFloat32(Pass):
    """Store each large constant float32 MatMul/Gemm/FusedMatMul weight in the panels GE's GEMM
    reads (a ``ge.cpu::PackedMatMul`` of ``weight_dtype`` float32), so that the model holds one
    copy of it: the plain MatMul's kernel packs a second copy when it is built and the graph
    keeps the first (for the .om it saves, and at load the file's). The kernel uses the stored
    panels in place (an .om's too) and computes the same bits as the plain MatMul's."""

    name = "pack_float32_weights"
    stage = "schedule"
    after = ("reduced_precision", "int8_kernels")
    before = ("sink_constant_computations",)
    description = "large float32 matrix weights stored in GE's GEMM panels: one copy of each weight, not the " \
                  "plain one beside the packed one"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if ctx.options.soc_version != "cpu" or not sgemm.available():
            return PassResult(False)
        packed, stack = 0, [graph]
        while stack:
            g = stack.pop()
            for n in g.node_list():
                stack.extend(n.subgraphs())
                if ((n.op_type in ("MatMul", "Gemm") and n.domain in ("", "ai.onnx"))
                        or (n.op_type == fused.FUSED_MATMUL and n.domain == fused.DOMAIN)) and _pack_f32(g, n):
                    packed += 1
        return PassResult(bool(packed), {"matmuls": packed} if packed else {})


def _pack_f32(g: Graph, n: Node) -> bool:
    """Rewrite ``n`` into a float32 PackedMatMul when its weight is a large constant only it reads
    (a shared one would stay beside the packed copy) and that holds its bytes (not a folded
    broadcast, which packing would expand); whether it did."""
    w = n.inputs[1] if len(n.inputs) > 1 else None
    if w is None or w.const_value is None or w.is_graph_output or len(w.uses()) != 1:
        return False
    arr = np.asarray(w.const_value)
    if arr.nbytes < PACK_MIN_BYTES or 0 in arr.strides:  # (a folded broadcast holds one value: kept so)
        return False
    ops = matmul_operands(n)
    if isinstance(ops, str):
        return False
    old = [v for v in n.inputs[1:3] if v is not None]
    packed_node(g, n, ops, sgemm.Panels(ops.w).data, {"weight_dtype": "float32"})
    for v in old:  # removed: its array is freed now, not when a collection finds the value's cycles
        if v.graph is None:
            v.const_value = None
    return True
