"""Models the atc tests build for themselves (onnx.helper, random weights) and a runner for atc."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def run_atc(*args, capsys=None) -> tuple[int, str, str]:
    """``atc ARGS`` in this process: (exit status, stdout, stderr)."""
    from ge_atc.cli import main

    rc = main([str(a) for a in args])
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return rc, out, err


def conv_net(path, seed: int = 0, channels: tuple[int, int] = (16, 32), opset: int = 17) -> str:
    """x[1,3,16,16] -> Conv+bias -> Relu -> Conv+bias -> Relu -> y, random weights."""
    rng = np.random.default_rng(seed)
    c1, c2 = channels
    inits = [numpy_helper.from_array((rng.standard_normal((c1, 3, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal(c1) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((c2, c1, 3, 3)) * 0.1).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal(c2) * 0.1).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return str(path)


def save_model(path, nodes, inputs, outputs, inits=(), opsets=(("", 17),)) -> str:
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]), str(path))
    return str(path)


def ort_run(path: str, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture
def atc(capsys):
    return lambda *a: run_atc(*a, capsys=capsys)
