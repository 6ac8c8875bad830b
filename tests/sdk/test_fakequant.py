"""ge_native.fakequant: the native fake-quant against its NumPy form (and QuantizeLinear ->
DequantizeLinear through onnx.reference), bit for bit, at every thread count."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from ge_native import fakequant
from ge_sdk import quant


def _data(size: int, scale: float) -> np.ndarray:
    x = np.random.default_rng(size).standard_normal(size).astype(np.float32) * 40 * scale
    x[: min(size, 8)] = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 1e9, -1e9, 0.0], np.float32)[: min(size, 8)] * scale
    return x


def test_the_native_loop_is_built_here():
    assert fakequant.available()


@pytest.mark.parametrize("size", [0, 1, 17, 65536 + 3, 300_001])
@pytest.mark.parametrize("width", [1, 2])
def test_native_equals_numpy_bit_for_bit(size, width):
    for s, z, lo, hi in ((0.05, 128, 0, 255), (0.013, -3, -128, 127), (1.0, 0, 0, 255)):
        x = _data(size, s)
        want = fakequant.reference(x, s, lo - z, hi - z)
        got = fakequant.fake_quant(x, s, lo - z, hi - z, width=width)
        assert got.tobytes() == want.tobytes()
        assert np.array_equal(want, quant.fake_quant(x, s, z, lo, hi))
        inplace = x.copy()
        assert fakequant.fake_quant(inplace, s, lo - z, hi - z, out=inplace, width=width) is inplace
        assert inplace.tobytes() == want.tobytes()


def test_it_is_quantize_then_dequantize():
    x = _data(1000, 0.02)
    for zdt, z in ((TensorProto.UINT8, 131), (TensorProto.INT8, -7)):
        g = helper.make_graph(
            [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
            "fq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000])],
            [helper.make_tensor("s", TensorProto.FLOAT, [], [0.02]), helper.make_tensor("z", zdt, [], [z])])
        want = ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])).run(None, {"x": x})[0]
        lo, hi = quant.RANGES["uint8" if zdt == TensorProto.UINT8 else "int8"]
        assert np.array_equal(fakequant.fake_quant(x, 0.02, lo - z, hi - z), want)


def test_nan_stays_nan_and_bad_parameters_are_refused():
    x = np.array([np.nan, 1.0], np.float32)
    assert np.isnan(fakequant.fake_quant(x, 0.1, 0, 255)[0])
    for s, lo, hi in ((0.0, 0, 1), (float("inf"), 0, 1), (-1.0, 0, 1), (0.1, 3, 2)):
        with pytest.raises(ValueError):
            fakequant.fake_quant(x, s, lo, hi)
    # a strided view runs through the NumPy form, the same values
    v = np.arange(20, dtype=np.float32)[::2] * 0.37
    assert np.array_equal(fakequant.fake_quant(v, 0.1, 0, 255), fakequant.reference(np.ascontiguousarray(v), 0.1, 0, 255))
