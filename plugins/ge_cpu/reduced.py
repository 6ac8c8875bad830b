"""The cpu backend's reduced precision: the ``reduced_precision`` pass and the ``PackedMatMul`` op.

ATC's precision pass (``ge_atc``) marks the matrix ops a ``--precision_mode`` reduces with a
:mod:`ge_sdk.precision` entry. This pass, right after it, rewrites those it has kernels for, their
weights packed at compile time in the precision asked for, into the layout the kernel reads (the
.om keeps that form: a load does no weight work and a run no cast):

- ``MatMul``, ``Gemm`` (``transA`` 0) and ``FusedMatMul`` with a constant 2-D float32 weight
  become ``ge.cpu::PackedMatMul`` (its epilogue program and inputs kept): bfloat16 weights in
  :class:`ge_native.bf16.PackedB`'s panels, computed in bf16 with float32 sums (AMX or
  AVX512-BF16, the epilogue in float32 at the store); float16 weights stored ``(k, n)`` and
  widened into float32 panels when the kernel is built (no CPU has a float16 matrix unit with
  float32 sums yet, so float16 *stores* and computes in float32: never slower than float32);
- ``NchwcConv`` (ungrouped, on a blocked input) gets its weight as ``weight_packing`` ``bf16``
  (:class:`ge_native.bf16.PackedConv`, computed in bf16) or its float32 packing stored float16.

A node it has no kernel for keeps float32 weights and compute, and its entry says why. Where
this CPU has no bf16 unit faster than its float32 FMAs (:func:`bf16_unit`) a bfloat16 node is
still stored packed (the .om runs in bf16 on a machine that has one) and computes in float32
here, the weights widened when the kernel is built; the entry says so.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ge_core.errors import GraphError
from ge_core.ir.graph import Graph, Node
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec, with_caps
from ge_core.ops import OpDef, OpKind
from ge_core.passes import Pass, PassContext, PassResult
from ge_native import bf16, parallel, sgemm
from ge_sdk import fused, precision

from .fused.elementwise import mark_out, refuse
from .packed import matmul_operands, packed_kernel, packed_node

DOMAIN = "ge.cpu"
#: the weight precisions a PackedMatMul stores (float32: :class:`.packed.PackFloat32`'s)
WEIGHT_DTYPES = ("bfloat16", "float16", "int8", "float32")


def bf16_unit() -> str | None:
    """The bf16 variant this machine computes with: AMX; AVX512-BF16 where it measured faster
    than this CPU's float32 GEMM (:func:`ge_native.bf16.measured_speedup`, once per machine);
    a variant ``GE_NATIVE_BF16`` names (the tests' way to run each one, the scalar reference
    too); else None (bf16 weights widened to float32)."""
    v = bf16.isa()
    if v is not None and os.environ.get("GE_NATIVE_BF16") == v:
        return v
    if v == "amx_bf16" or (v == "avx512_bf16" and (bf16.measured_speedup(v) or 0.0) > 1.0):
        return v
    return None


# ---------------------------------------------------------------------------------------------
# the pass
class ReducedPrecision(Pass):
    """Pack the weights of the matrix ops the precision pass reduced, in that precision."""

    name = "reduced_precision"
    stage = "schedule"
    opt_level = 0
    required = True
    after = ("atc_precision",)
    before = ("sink_constant_computations",)
    description = "matrix ops ATC's precision mode reduces: weights packed in bf16/fp16, computed in bf16 where " \
                  "the CPU has the unit"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if ctx.options.soc_version != "cpu":
            return PassResult(False)
        stats = {"matmuls": 0, "convs": 0, "attention": 0, "kept_float32": 0}
        stack = [graph]
        while stack:
            g = stack.pop()
            for n in g.node_list():
                stack.extend(n.subgraphs())
                want = precision.wanted(n)
                if want is None:
                    continue
                if (n.op_type in ("MatMul", "Gemm") and n.domain in ("", "ai.onnx")) or (
                        n.op_type == fused.FUSED_MATMUL and n.domain == fused.DOMAIN):
                    why = _matmul(g, n, want)
                    stats["matmuls" if not why else "kept_float32"] += 1
                elif n.op_type == "NchwcConv" and n.domain == DOMAIN:
                    why = _nchwc_conv(g, n, want)
                    stats["convs" if not why else "kept_float32"] += 1
                elif (n.op_type == "Conv" and n.domain in ("", "ai.onnx")) or (
                        n.op_type == fused.FUSED_CONV and n.domain == fused.DOMAIN):
                    from .kernels import nchwc_reduced

                    why = nchwc_reduced.rewrite_lone(g, n, want)
                    stats["convs" if not why else "kept_float32"] += 1
                    if not why:
                        continue  # (n is gone: its entry moved to the blocked node)
                elif n.op_type == fused.ATTENTION and n.domain == fused.DOMAIN:
                    why = _attention(n, want)
                    stats["attention" if not why else "kept_float32"] += 1
                else:
                    why = f"the cpu backend has no {want} kernel for {n.op_type}"
                    stats["kept_float32"] += 1
                if why:
                    precision.done(n, "float32", "float32", "", why)
        return PassResult(bool(stats["matmuls"] or stats["convs"] or stats["attention"]),
                          {k: v for k, v in stats.items() if v})


def _matmul(g: Graph, n: Node, want: str) -> str:
    """Rewrite MatMul/Gemm/FusedMatMul ``n`` into a PackedMatMul; the reason it did not, or ''."""
    ops = matmul_operands(n)
    if isinstance(ops, str):
        return ops
    w = ops.w
    if want == "bfloat16":
        stored = bf16.PackedB(w).data
    else:
        stored = np.ascontiguousarray(w.astype(np.float16))
    packed_node(g, n, ops, stored, {"weight_dtype": want})
    unit = bf16_unit() if want == "bfloat16" else None
    precision.done(n, want, unit and "bfloat16" or "float32", f"packed_matmul_{unit or 'sgemm'}",
                   "" if unit else widened_why(want), w.nbytes - stored.nbytes)
    return ""


def widened_why(want: str) -> str:
    """Why a node stored in ``want`` computes in float32 on this CPU (the report's entry)."""
    if want == "float16":
        return ("no CPU unit here computes float16 products with float32 sums (AVX512-FP16 sums in float16): "
                "the float16 weight is widened to float32 when the model loads, the float32 kernel's speed at "
                "half the weight bytes")
    return "this CPU has no bf16 unit faster than its float32 GEMM: the packed bf16 weight is widened to float32 " \
           "when the model loads"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _attention(n: Node, want: str) -> str:
    """Mark fused Attention ``n`` to compute both products in bf16 (its kernel reads
    ``compute_dtype``); the reason it did not, or ''."""
    x = n.inputs[0]
    if want != "bfloat16":
        return "the cpu backend computes attention in float32 (no float16 unit)"
    if x is None or x.type.dtype != np.float32:
        return "its inputs are not float32"
    unit = bf16_unit()
    if unit is None:
        return "this CPU has no bf16 unit faster than its float32 GEMM"
    n.attrs["compute_dtype"] = "bfloat16"
    precision.done(n, "none", "bfloat16", f"attention_bf16_{unit}")
    return ""


def _nchwc_conv(g: Graph, n: Node, want: str) -> str:
    """Store NchwcConv ``n``'s weight in ``want``; the reason it did not, or ''."""
    from .kernels import nchwc_reduced

    return nchwc_reduced.rewrite(g, n, want)


# ---------------------------------------------------------------------------------------------
# the op
def _infer(node: Node, opset: int) -> list[TensorType]:
    x = node.inputs[0]
    n = node.attrs.get("n")
    if x is None or x.type.shape is None or not isinstance(n, (int, np.integer)):
        return [TensorType(np.dtype("float32"), None)]
    return [TensorType(np.dtype("float32"), tuple(x.type.shape[:-1]) + (int(n),))]


def _bad(node: Node, why: str) -> GraphError:
    return GraphError(f"node '{node.name}' (ge.cpu::PackedMatMul): {why}",
                      hint="the .om is damaged or was not written by this compiler: compile the model again")


def check_node(node: Node) -> None:
    """Validate a PackedMatMul's attributes and stored weight (raises GraphError naming it)."""
    a = node.attrs
    k, n = a.get("k"), a.get("n")
    if not all(isinstance(v, (int, np.integer)) and 1 <= v <= 1 << 24 for v in (k, n)):
        raise _bad(node, "attributes k and n must be ints in 1..2^24")
    dt = a.get("weight_dtype")
    dt = dt.decode() if isinstance(dt, bytes) else dt
    if dt not in WEIGHT_DTYPES:
        raise _bad(node, f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}")
    w = node.inputs[1] if len(node.inputs) > 1 else None
    if w is None:
        raise _bad(node, "has no weight")
    k, n = int(a["k"]), int(a["n"])
    want: tuple[int, ...]
    if dt == "int8":
        from .int8 import packed_shape

        want = packed_shape(k, n)
    elif dt == "float32":
        want = (math.ceil(n / sgemm.NR), k, sgemm.NR)
    else:
        want = (math.ceil(n / bf16.NR), math.ceil(k / bf16.KB) * bf16.KB // 2, 2 * bf16.NR) if dt == "bfloat16" else (k, n)
    wdt = np.dtype({"bfloat16": np.uint16, "float16": np.float16, "int8": np.int8, "float32": np.float32}[dt])
    if w.type.dtype != wdt or tuple(w.type.shape or ()) != want:
        raise _bad(node, f"a {dt} weight must be {wdt.name} {want}, not {w.type.dtype} {w.type.shape}")
    prog = a.get("epilogue", "")
    if prog:
        try:
            fused.loads(prog, n_inputs=max(0, len(node.inputs) - 3), anchor=True)
        except ValueError as e:
            raise _bad(node, f"bad epilogue: {e}") from None


OPDEFS = [
    OpDef("PackedMatMul", DOMAIN, min_inputs=2, kind=OpKind.OPAQUE, infer=_infer, internal=True, check=check_node,
          alias="", attrs={"k": None, "n": None, "weight_dtype": "bfloat16", "epilogue": ""},
          doc="Y = epilogue(A @ W + B): W constant, packed at compile time in weight_dtype (bfloat16: "
              "ge_native.bf16's panels, computed in bf16 with float32 sums; float16: (k, n), widened to float32 "
              "when the kernel is built; int8: ge_native.int8's panels, A quantised as it is packed (x_scale, "
              "x_zero_point, x_dtype, or x_dynamic), int32 sums scaled by x_scale * w_scale, out_* a fake-quant "
              "of Y; float32: ge_native.sgemm's panels, read in place); B an optional row of n float32; the epilogue's inputs follow"),
]


# ---------------------------------------------------------------------------------------------
# the kernel
def unpack_bf16(data: np.ndarray, k: int, n: int) -> np.ndarray:
    """The ``(k, n)`` float32 values of a :class:`ge_native.bf16.PackedB`'s bits (its inverse)."""
    p, half, width = data.shape
    full = np.asarray(data).reshape(p, half, bf16.NR, 2).transpose(1, 3, 0, 2).reshape(2 * half, p * bf16.NR)
    # bf16 bits are a float32's high half: widened exactly without ml_dtypes (not imported at load)
    return (np.ascontiguousarray(full[:k, :n]).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def packed_matmul_factory(spec: KernelSpec):
    k, n = int(spec.attr("k")), int(spec.attr("n"))
    dt = spec.attr("weight_dtype", "bfloat16")
    dt = dt.decode() if isinstance(dt, bytes) else str(dt)
    w = spec.const_inputs[1] if len(spec.const_inputs) > 1 else None
    if w is None or dt not in WEIGHT_DTYPES:
        raise refuse(spec, "needs its packed weight as a constant")
    bias = spec.const_inputs[2] if len(spec.const_inputs) > 2 else None
    if bias is None and len(spec.inputs) > 2 and spec.inputs[2] is not None:
        raise refuse(spec, "needs its bias as a constant")
    if bias is not None:
        bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
        if bias.shape != (n,):
            raise refuse(spec, f"a bias of {bias.size} values for {n} columns")
    if dt == "int8":
        from .int8 import int8_matmul_kernel

        return int8_matmul_kernel(spec, k, n, bias)
    unit = bf16_unit() if dt == "bfloat16" else None
    packed = panels = dense = None
    if unit is not None:
        packed = bf16.PackedB.from_data(np.asarray(w), k, n)
    elif dt == "float32":  # stored in sgemm's panels: used in place (one copy of the weight)
        stored = sgemm.Panels.from_data(np.asarray(w), k, n)
        panels, dense = (stored, None) if sgemm.available() else (None, stored.dense())
    else:  # float16 stored, or no bf16 unit here: float32 panels (sgemm), else NumPy
        dense = unpack_bf16(np.asarray(w), k, n) if dt == "bfloat16" else np.asarray(w).astype(np.float32)
        if dense.shape != (k, n):
            raise refuse(spec, f"a weight of shape {dense.shape}, ({k}, {n}) expected")
        if sgemm.available():
            panels, dense = sgemm.Panels(dense), None

    def product(a2, y2, clip, z2, act, last) -> bool:
        width = parallel.native_width()
        if packed is not None:
            return bf16.matmul(a2, packed, y2, bias, clip, act, width, addend=z2)
        if panels is not None:
            return sgemm.matmul_packed(a2, panels, y2, bias, clip, width, z2, act)
        assert dense is not None
        np.matmul(a2, dense, out=y2)
        if bias is not None:
            y2 += bias
        return clip is None and z2 is None and act is None

    kernel = packed_kernel(spec, k, n, product)
    variant = unit or ("float32 " + ("sgemm" if panels is not None else "numpy"))
    with_caps(kernel, algorithm=f"packed_matmul_{dt}", variant=variant)
    return mark_out(kernel)


KERNELS = {(DOMAIN, "PackedMatMul"): packed_matmul_factory}
