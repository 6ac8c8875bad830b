"""Small float models built in code and quantised by onnxruntime's quantiser (the formats people
ship: static QDQ, QOperator, dynamic), for the int8 tests."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _init(rng, name: str, shape, scale: float = 0.2) -> onnx.TensorProto:
    return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def residual_cnn(seed: int = 0, size: int = 32, width: int = 32) -> onnx.ModelProto:
    """A stem conv (stride 2), a 3x3 conv and a 1x1 conv with a residual, max pooling, global
    pooling and a classifier: the ops of a ResNet, at a test's size."""
    rng = np.random.default_rng(seed)
    c = width
    inits = [_init(rng, "w1", (c, 3, 3, 3)), _init(rng, "b1", (c,)), _init(rng, "w2", (c, c, 3, 3), 0.05),
             _init(rng, "b2", (c,)), _init(rng, "w3", (c, c, 1, 1), 0.1), _init(rng, "w4", (2 * c, c, 3, 3), 0.05),
             _init(rng, "b4", (2 * c,)), _init(rng, "wf", (10, 2 * c)), _init(rng, "bf", (10,))]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c2"], ["r2"]),
        h.make_node("Conv", ["r2", "w3"], ["c3"]),
        h.make_node("Add", ["c3", "r1"], ["a"]),
        h.make_node("Relu", ["a"], ["r3"]),
        h.make_node("MaxPool", ["r3"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["mp", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c4"], ["r4"]),
        h.make_node("GlobalAveragePool", ["r4"], ["p"]),
        h.make_node("Flatten", ["p"], ["f"]),
        h.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    g = h.make_graph(nodes, "residual_cnn", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, size, size])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def inverted_residual(seed: int = 0, size: int = 20, c: int = 16, expand: int = 3) -> onnx.ModelProto:
    """MobileNetV2's block: a 1x1 expansion with ReLU6, a 3x3 depthwise conv with ReLU6 (stride 1),
    a 1x1 projection and the residual, after a stem conv."""
    rng = np.random.default_rng(seed)
    e = c * expand
    inits = [_init(rng, "w0", (c, 3, 3, 3)), _init(rng, "w1", (e, c, 1, 1), 0.2), _init(rng, "b1", (e,)),
             _init(rng, "w2", (e, 1, 3, 3), 0.3), _init(rng, "b2", (e,)), _init(rng, "w3", (c, e, 1, 1), 0.1),
             nh.from_array(np.array(0.0, np.float32), "lo"), nh.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [
        h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        h.make_node("Conv", ["c0", "w1", "b1"], ["c1"]),
        h.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=e),
        h.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        h.make_node("Conv", ["r2", "w3"], ["c3"]),
        h.make_node("Add", ["c3", "c0"], ["y"]),
    ]
    g = h.make_graph(nodes, "inverted_residual", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, size, size])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, c, size, size])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def mlp(seed: int = 0, k: int = 64, hidden: int = 96, n: int = 48, rows: int = 8) -> onnx.ModelProto:
    """MatMul + bias + Relu, MatMul + bias, on a (2, rows, k) input: a transformer's feed-forward."""
    rng = np.random.default_rng(seed)
    inits = [_init(rng, "w1", (k, hidden)), _init(rng, "b1", (hidden,)), _init(rng, "w2", (hidden, n)),
             _init(rng, "b2", (n,))]
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Add", ["m1", "b1"], ["a1"]),
             h.make_node("Relu", ["a1"], ["r1"]), h.make_node("MatMul", ["r1", "w2"], ["m2"]),
             h.make_node("Add", ["m2", "b2"], ["y"])]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, [2, rows, k])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, rows, n])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def feeds(model: onnx.ModelProto, seed: int, count: int = 1) -> list[dict[str, np.ndarray]]:
    """Random inputs of the model's (static) input shapes."""
    rng = np.random.default_rng(seed)
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    return [{inp.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def quantized(model: onnx.ModelProto, tmp: str, how: str, *, per_channel: bool = True,
              activation: str = "uint8", seed: int = 1) -> str:
    """``model`` quantised by onnxruntime: ``how`` "qdq" / "qoperator" (quantize_static on 8 random
    calibration batches) or "dynamic" (quantize_dynamic); the quantised file's path."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    src = os.path.join(tmp, f"{model.graph.name}_f32.onnx")
    onnx.save(model, src)
    dst = os.path.join(tmp, f"{model.graph.name}_{how}_{activation}_{int(per_channel)}.onnx")
    if how == "dynamic":
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=per_channel)
        return dst
    batches = feeds(model, seed, 8)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ if how == "qdq" else QuantFormat.QOperator,
                    per_channel=per_channel, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8)
    return dst
