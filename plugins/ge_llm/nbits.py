"""``com.microsoft::MatMulNBits`` as onnxruntime defines it: ``Y = A @ dequant(B) + bias``, ``B``
``(N, k_blocks, blob)`` uint8 holding ``bits``-bit integers (2, 4 or 8) of ``(K, N)`` in blocks
of ``block_size`` rows per column, ``w = (q - zero_point) * scale``; ``scales`` ``(N * k_blocks)``
(or ``(N, k_blocks)``), optional ``zero_points`` (packed uint8 ``N * ceil(k_blocks * bits / 8)``
or one float a block; default ``2^(bits - 1)``), ``g_idx`` (int32 ``(K,)``, each row's block),
``bias`` ``(N,)``; ``accuracy_level`` 0..4 (4: int8 activations with int32 sums). onnxruntime-
genai's builder writes it for every linear layer of an int4 model. Its kernels are
``ge_cpu.contrib.nbits``; ``ge_quant``'s weight-only quantiser writes it too."""

from __future__ import annotations

import numpy as np

from ge_core.errors import GraphError
from ge_core.ir.graph import Node
from ge_core.ir.types import TensorType
from ge_core.ops import OpDef, OpKind

DOMAIN = "com.microsoft"
OP = "MatMulNBits"
#: the bit widths and the block sizes (powers of two) onnxruntime's op takes
BITS = (2, 4, 8)
MIN_BLOCK, MAX_BLOCK = 16, 4096


def _int(node: Node, name: str, default: int | None = None) -> int | None:
    v = node.attrs.get(name, default)
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def check_node(node: Node) -> None:
    """Raise a GraphError naming ``node`` when its attributes are not onnxruntime's: K, N >= 1,
    bits 2|4|8, block_size a power of two >= 16, accuracy_level 0..4."""
    k, n, bits, bs, acc = (_int(node, "K"), _int(node, "N"), _int(node, "bits", 4), _int(node, "block_size"),
                           _int(node, "accuracy_level", 0))
    what = f"node '{node.name}' ({DOMAIN}::{OP})"
    if k is None or n is None or k < 1 or n < 1:
        raise GraphError(f"{what}: attributes K and N (positive integers) are required, got K={k}, N={n}",
                         hint="the model's quantiser wrote the weight's (K, N): re-export it")
    if bits not in BITS:
        raise GraphError(f"{what}: bits is {bits}; MatMulNBits takes 2, 4 or 8",
                         hint="quantise the weight again with bits=4 or 8")
    if bs is None or bs < MIN_BLOCK or bs > MAX_BLOCK or bs & (bs - 1):
        raise GraphError(f"{what}: block_size is {bs}; it must be a power of two from {MIN_BLOCK} to {MAX_BLOCK}",
                         hint="quantise the weight again with block_size 16, 32, 64, 128 or 256")
    if acc is None or not 0 <= acc <= 4:
        raise GraphError(f"{what}: accuracy_level is {acc}; it is 0..4", hint="4: int8 activations; 0: float32")


def _infer(node: Node, opset: int) -> list[TensorType]:
    check_node(node)
    a = node.inputs[0]
    n = _int(node, "N")
    at = a.type if a is not None else None
    dtype = at.dtype if at is not None and at.dtype is not None else np.dtype(np.float32)
    shape = None
    if at is not None and at.shape is not None and len(at.shape) >= 1:
        shape = tuple(at.shape[:-1]) + (n,)
    return [TensorType(np.dtype(dtype), shape)]


OPDEFS = [
    OpDef(OP, DOMAIN, min_inputs=3, max_inputs=6, kind=OpKind.OPAQUE, infer=_infer, check=check_node,
          attrs={"K": None, "N": None, "bits": 4, "block_size": None, "accuracy_level": 0},
          doc="Y = A @ dequant(B) + bias: B's bits-bit integers in blocks of block_size rows per column, "
              "w = (q - zero_point) * scale (onnxruntime's MatMulNBits)"),
]
