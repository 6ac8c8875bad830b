"""CumProd, ReverseSequence, Compress, EyeLike and ReduceLogSum kernels
(plugins/ge_cpu/kernels/tensor_extra.py) against onnxruntime and onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest

from ge_core.errors import UnsupportedOpError

from ._onnx_ref import build_kernel, check

R = np.random.default_rng(5)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_cumprod(exclusive, reverse, axis, dtype):
    x = R.uniform(0.5, 1.5, (3, 4, 5)).astype(dtype) if np.dtype(dtype).kind == "f" else \
        R.integers(-3, 4, (3, 4, 5)).astype(dtype)
    ins = [x, np.array(axis, np.int64)]
    check("CumProd", ins, {"exclusive": exclusive, "reverse": reverse}, opset=26, ref="both", rtol=1e-6, atol=0)
    check("CumProd", [x, np.array(axis, np.int32)], {"exclusive": exclusive, "reverse": reverse}, opset=26,
          ref="onnx", rtol=1e-6, atol=0, const=(1,))


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, object])
def test_reverse_sequence(time_axis, batch_axis, dtype):
    shape = [5, 4, 3]
    shape[time_axis], shape[batch_axis] = 5, 4
    x = R.integers(0, 9, shape)
    x = x.astype(str).astype(object) if dtype is object else x.astype(dtype)
    lens = np.array([5, 1, 3, 4], np.int64)
    check("ReverseSequence", [x, lens], {"time_axis": time_axis, "batch_axis": batch_axis}, opset=10,
          ref="onnx" if dtype is object else "both")


def test_reverse_sequence_zero_length_and_2d():
    x = R.uniform(-1, 1, (4, 3)).astype(np.float32)
    check("ReverseSequence", [x, np.array([0, 4, 2], np.int64)], {}, opset=10, ref="onnx")


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("cond", ["full", "short", "none"])
def test_compress(axis, cond):
    x = R.uniform(-1, 1, (3, 4, 5)).astype(np.float32)
    n = x.size if axis is None else x.shape[axis]
    c = {"full": R.random(n) < 0.5, "short": R.random(max(n - 2, 1)) < 0.6, "none": np.zeros(n, bool)}[cond]
    check("Compress", [x, c], {} if axis is None else {"axis": axis}, opset=11, ref="both")


def test_compress_strings():
    x = np.array([["a", "b"], ["c", "d"], ["e", "f"]], dtype=object)
    check("Compress", [x, np.array([True, False, True])], {"axis": 0}, opset=11, ref="onnx")


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 2)])
@pytest.mark.parametrize("k", [0, 1, -2, 7])
@pytest.mark.parametrize("dtype_attr", [None, 1, 6, 7, 11, 9])
def test_eyelike(shape, k, dtype_attr):
    x = np.zeros(shape, np.int32)
    attrs = {"k": k} if dtype_attr is None else {"k": k, "dtype": dtype_attr}
    check("EyeLike", [x], attrs, opset=9, ref="both" if dtype_attr != 9 else "onnx")


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axes", [None, [1], [0, 2], [-1]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_log_sum(opset, axes, keepdims):
    x = R.uniform(0.1, 2, (3, 4, 5)).astype(np.float32)
    attrs: dict = {"keepdims": keepdims}
    ins = [x]
    if axes is not None:
        if opset < 18:
            attrs["axes"] = axes
        else:
            ins.append(np.array(axes, np.int64))
    check("ReduceLogSum", ins, attrs, opset=opset, ref="both", rtol=1e-5)


def test_reduce_log_sum_noop_empty_and_float64():
    x = R.uniform(0.1, 2, (3, 4)).astype(np.float64)
    check("ReduceLogSum", [x, np.array([], np.int64)], {"noop_with_empty_axes": 1}, opset=18, ref="onnx")
    check("ReduceLogSum", [x, np.array([0], np.int64)], {}, opset=18, ref="both", rtol=1e-12, const=(1,))
    e = np.zeros((2, 0, 3), np.float32)
    check("ReduceLogSum", [e, np.array([1], np.int64)], {"keepdims": 1}, opset=18, ref="onnx")


def test_refusals():
    with pytest.raises(UnsupportedOpError, match="batch_axis") as e:
        build_kernel("ReverseSequence", [np.zeros((2, 2)), np.ones(2, np.int64)], {"batch_axis": 2}, 10, [None])
    assert "test_ReverseSequence" in str(e.value)


def test_native_in_ge_ops():
    from ge_cpu.plugin import NATIVE, op_table

    kinds = {r["op"]: r["kernel"] for r in op_table() if r["domain"] == "ai.onnx"}
    for op in ("CumProd", "ReverseSequence", "Compress", "EyeLike", "ReduceLogSum"):
        assert kinds[op] == NATIVE
