"""Transpose as a batched 2-D transpose moved in cache tiles (``csrc/planes.c``): numpy's bits at 1
and 2 threads for every permutation that swaps two groups of trailing axes, the view everywhere
else, and bad arguments refused."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ge_core as ge
from ge_cpu.kernels import resize as rz
from ge_cpu.kernels.tensor import _swapped_groups


def _model(shape, perm, elem=TensorProto.FLOAT):
    node = helper.make_node("Transpose", ["x"], ["t"], perm=list(perm))
    relu = helper.make_node("Neg", ["t"], ["y"])  # (a consumer: the transpose is no graph output)
    g = helper.make_graph([node, relu], "g", [helper.make_tensor_value_info("x", elem, list(shape))],
                          [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("perm, k", [([0, 2, 1], 2), ([0, 2, 3, 1], 2), ([0, 3, 1, 2], 3), ([1, 0], 1),
                                     ([2, 3, 0, 1], 2), ([0, 1, 2], None), ([0, 2, 1, 3], None), ([1, 0, 2], None)])
def test_the_batched_2d_permutations_are_recognised(perm, k):
    assert _swapped_groups(perm, len(perm)) == k


@pytest.mark.parametrize("shape, perm", [
    ((1, 16384, 32), (0, 2, 1)),        # token-major -> channels (SegFormer's patch embedding)
    ((1, 32, 128, 128), (0, 2, 3, 1)),  # NCHW -> NHWC
    ((2, 100, 7, 60), (0, 3, 1, 2)),    # NHWC -> NCHW, ragged tiles
    ((300, 230), (1, 0)),
    ((2, 3, 5), (0, 2, 1)),             # small: the view (below the native size)
    ((4, 64, 32, 40), (0, 2, 1, 3)),    # not a batched 2-D transpose: the view
])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_compiled_transpose_gives_numpys_bits(shape, perm, threads):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::11] = np.nan
    got = ge.compile(_model(shape, perm), {"threads": threads}).run({"x": x})
    got = np.asarray(got["y"] if isinstance(got, dict) else got[0])
    np.testing.assert_array_equal(got, -np.transpose(x, perm))


def test_int32_matches_onnxruntime():
    shape, perm = (1, 64, 1024), (0, 2, 1)
    x = np.random.default_rng(1).integers(-1000, 1000, shape, dtype=np.int32)
    model = _model(shape, perm, TensorProto.INT32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ge.compile(model, {"threads": 2}).run({"x": x})
    np.testing.assert_array_equal(np.asarray(got["y"] if isinstance(got, dict) else got[0]), ref)


def test_bad_arguments_are_refused():
    mod = rz.planes()
    if mod is None:
        return  # (no native module here: Transpose returns the view)
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError):
        mod.transpose2d(x, np.empty((2, 3, 4), np.float32), 1)  # not the transposed shape
    with pytest.raises(ValueError):
        mod.transpose2d(x, x, 1)  # in place
    with pytest.raises(TypeError):
        mod.transpose2d(x, np.empty((2, 4, 3), np.float64), 1)  # another dtype
    y = np.empty((2, 4, 3), np.float32)
    mod.transpose2d(np.arange(24, dtype=np.float32).reshape(2, 3, 4), y, 2)
    np.testing.assert_array_equal(y, np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(0, 2, 1))


def test_a_large_batched_transpose_runs_natively(monkeypatch):
    real = rz.planes()
    if real is None:
        return  # (no native module here: the view, tested above)
    calls = []

    class Counting:
        def transpose2d(self, *a):
            calls.append(a[0].shape)
            return real.transpose2d(*a)

    monkeypatch.setattr(rz, "planes", lambda: Counting())
    x = np.random.default_rng(2).standard_normal((1, 4096, 64)).astype(np.float32)
    got = ge.compile(_model(x.shape, (0, 2, 1))).run({"x": x})
    np.testing.assert_array_equal(np.asarray(got["y"] if isinstance(got, dict) else got[0]), -x.transpose(0, 2, 1))
    assert calls == [(1, 4096, 64)]


@pytest.mark.parametrize("shape, perm", [((1, 4096, 64), (0, 2, 1)), ((2, 3, 5), (0, 2, 1)), ((4, 8, 16, 32), (0, 2, 1, 3))])
def test_a_bound_output_array_is_filled(shape, perm):
    """IO binding: a Transpose that is a graph output writes the caller's array, natively or not."""
    node = helper.make_node("Transpose", ["x"], ["t"], perm=list(perm))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    bound = np.empty(np.transpose(x, perm).shape, np.float32)
    ge.compile(model, {"threads": 2}).run({"x": x}, outputs={"t": bound})
    np.testing.assert_array_equal(bound, np.transpose(x, perm))
