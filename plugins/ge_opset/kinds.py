"""Fusion kinds (TVM's pattern kinds) of the standard ONNX ops, and which ops are random.

Anything not listed here is :attr:`OpKind.OPAQUE`.
"""

from __future__ import annotations

from ge_core.ops import OpKind

#: Same-shape elementwise: output[i] depends only on input[i].
ELEMWISE_OPS = frozenset(
    """
    Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Erf Exp Floor Log Neg Reciprocal Round
    Sigmoid Sign Sin Sinh Sqrt Tan Tanh Relu LeakyRelu Elu Selu Celu HardSigmoid HardSwish
    Softplus Softsign ThresholdedRelu Gelu Mish Not IsNaN IsInf BitwiseNot Clip Shrink
    Cast CastLike Identity
    """.split()
)

#: Elementwise with (multidirectional or per-channel) broadcasting.
BROADCAST_OPS = frozenset(
    """
    Add Sub Mul Div Pow Max Min Sum Mean And Or Xor Equal Greater Less GreaterOrEqual
    LessOrEqual PRelu Where Mod BitShift BitwiseAnd BitwiseOr BitwiseXor
    BatchNormalization QuantizeLinear DequantizeLinear
    """.split()
)

#: Each output element reads one input element: layout and indexing ops.
INJECTIVE_OPS = frozenset(
    """
    Reshape Transpose Slice Concat Gather GatherElements GatherND Squeeze Unsqueeze Flatten
    Expand Pad Split Tile DepthToSpace SpaceToDepth ReverseSequence Resize Upsample OneHot
    Trilu EyeLike Crop
    """.split()
)

#: Reductions along axes.
REDUCTION_OPS = frozenset(
    """
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare ReduceL1 ReduceL2
    ReduceLogSum ReduceLogSumExp ArgMax ArgMin GlobalAveragePool GlobalMaxPool GlobalLpPool
    """.split()
)

#: Complex ops whose output can absorb fused elementwise ops (conv + bias + relu).
OUT_ELEMWISE_FUSABLE_OPS = frozenset(
    """
    Conv ConvTranspose MatMul Gemm ConvInteger MatMulInteger QLinearConv QLinearMatMul
    AveragePool MaxPool LpPool
    """.split()
)

#: Ops whose result varies between runs: never folded, merged or deduplicated.
RANDOM_OPS = frozenset(
    "RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli".split()
)


#: Output 0 is the bytes of input 0 (C order): the memory problem plans it as a view.
VIEW_OPS = frozenset("Reshape Flatten Squeeze Unsqueeze Identity".split())
#: The structural copy (``OpDef.copy``): the graph routes a repeated or outer output through it.
COPY_OP = "Identity"
#: Inputs may lie back to back in the output (zero-copy concat).
CONCAT_OPS = frozenset({"Concat"})


def op_alias(op_type: str) -> str:
    """The aliasing fact (``OpDef.alias``) of a standard op type: view, concat, inplace for the
    elementwise kinds, "" for none."""
    if op_type in VIEW_OPS:
        return "view"
    if op_type in CONCAT_OPS:
        return "concat"
    if op_type in ELEMWISE_OPS or op_type in BROADCAST_OPS:
        return "inplace"
    return ""


def op_kind(op_type: str) -> OpKind:
    """The fusion kind of a standard op type (OPAQUE when not listed)."""
    if op_type in ELEMWISE_OPS:
        return OpKind.ELEMWISE
    if op_type in BROADCAST_OPS:
        return OpKind.BROADCAST
    if op_type in INJECTIVE_OPS:
        return OpKind.INJECTIVE
    if op_type in REDUCTION_OPS:
        return OpKind.REDUCTION
    if op_type in OUT_ELEMWISE_FUSABLE_OPS:
        return OpKind.OUT_ELEMWISE_FUSABLE
    return OpKind.OPAQUE
