"""The native linear Resize of the last two axes (``csrc/resize.c``): the numpy path's bits at 1 and
2 threads, onnxruntime's numbers for every coordinate mode, the numpy path wherever it does not
apply, and out-of-range tables refused instead of read."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ge_core as ge
from ge_cpu.kernels import resize as rz
from ge_native import parallel


def _model(in_shape, out_shape, mode="linear", coord="half_pixel"):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="rs", mode=mode,
                            coordinate_transformation_mode=coord)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("sizes", TensorProto.INT64, [len(out_shape)], list(out_shape))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _numpy_and_native(resizer, x, out_shape, threads):
    scales = [o / i for o, i in zip(out_shape, x.shape)]
    with parallel.use_threads(threads):
        fast = resizer.native_linear(x, list(out_shape), scales)
    saved = rz._native
    rz._native = lambda: None  # the numpy path
    try:
        with np.errstate(invalid="ignore"):  # (inf * 0 where a tap weighs nothing: NaN in both)
            slow = resizer(x, list(out_shape), scales)
    finally:
        rz._native = saved
    return fast, slow


@pytest.mark.parametrize("in_shape, out_shape", [
    ((1, 64, 16, 16), (1, 64, 64, 64)),     # a decoder's 4x upsampling, split over the pool
    ((2, 3, 7, 5), (2, 3, 13, 11)),         # odd sizes
    ((2, 3, 7, 5), (2, 3, 7, 11)),          # width only (the height kept)
    ((2, 3, 7, 5), (2, 3, 3, 5)),           # height only, downsampling
    ((4, 9, 6000), (4, 5, 6001)),           # a row wider than the stack buffer
])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_native_path_gives_the_numpy_paths_bits(in_shape, out_shape, threads):
    if rz._native() is None:  # no compiler here: the numpy path runs, and says so by returning None
        x = np.zeros(in_shape, np.float32)
        assert rz._Resizer(None, "linear", "half_pixel", "floor", -0.75, 0).native_linear(
            x, list(out_shape), [1.0] * len(in_shape)) is None
        return
    x = np.random.default_rng(1).standard_normal(in_shape).astype(np.float32)
    x.reshape(-1)[::7] = np.inf  # the same NaNs where the numpy path blends inf with a zero weight
    resizer = rz._Resizer(None, "linear", "half_pixel", "round_prefer_floor", -0.75, 0)
    fast, slow = _numpy_and_native(resizer, x, out_shape, threads)
    assert fast is not None and fast.shape == tuple(out_shape)
    np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_compiled_resize_matches_onnxruntime(coord, threads):
    in_shape, out_shape = (1, 32, 20, 24), (1, 32, 80, 72)
    model = _model(in_shape, out_shape, coord=coord)
    x = np.random.default_rng(2).standard_normal(in_shape).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ge.compile(model, {"threads": threads}).run({"x": x})
    got = np.asarray(got["y"] if isinstance(got, dict) else got[0])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_shape, out_shape, mode, dtype", [
    ((1, 3, 4, 4), (1, 3, 8, 8), "nearest", np.float32),   # nearest: numpy's take
    ((1, 3, 4, 4), (1, 3, 8, 8), "linear", np.float64),    # float64
    ((1, 3, 4, 4), (1, 6, 8, 8), "linear", np.float32),    # a leading axis resized
    ((1, 3, 4, 4), (1, 3, 4, 4), "linear", np.float32),    # nothing resized
])
def test_the_numpy_path_runs_where_the_native_one_does_not_apply(in_shape, out_shape, mode, dtype):
    x = np.ones(in_shape, dtype)
    resizer = rz._Resizer(None, mode, "half_pixel", "round_prefer_floor", -0.75, 0)
    assert resizer.native_linear(x, list(out_shape), [o / i for o, i in zip(out_shape, in_shape)]) is None


def test_tables_pointing_outside_the_input_are_refused():
    mod = rz._native()
    if mod is None:
        return  # (no native module: nothing to misuse)
    x = np.zeros((1, 4, 4), np.float32)
    y = np.empty((1, 8, 8), np.float32)
    good_i, w = np.zeros((2, 8), np.int32), np.full((2, 8), 0.5, np.float32)
    bad_i = good_i.copy()
    bad_i[1, 3] = 4  # one past the last row
    with pytest.raises(ValueError):
        mod.resize_linear2d(x, y, bad_i, w, good_i, w, 0, 0, 1)
    with pytest.raises(ValueError):  # a table of the wrong length
        mod.resize_linear2d(x, y, good_i[:, :7].copy(), w, good_i, w, 0, 0, 1)
    with pytest.raises(ValueError):  # a kept axis whose lengths differ
        mod.resize_linear2d(x, y, good_i, w, good_i, w, 1, 0, 1)
    mod.resize_linear2d(x, y, good_i, w, good_i, w, 0, 0, 2)
    assert np.all(y == 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_resize_into_a_concat_writes_the_planned_slice(threads):
    """A decoder's pattern: upsampled maps concatenated (the Resize fills its slice of the Concat's
    buffer), one of them already at the output size (copied)."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, 16, 16])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8, 64, 64])
    nodes = [helper.make_node("Resize", ["a", "", "", "sizes"], ["ra"], mode="linear"),
             helper.make_node("Resize", ["b", "", "", "sizes"], ["rb"], mode="linear"),
             helper.make_node("Concat", ["ra", "rb"], ["c"], axis=1),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [a, b], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("sizes", TensorProto.INT64, [4], [1, 8, 64, 64])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((1, 8, 16, 16)).astype(np.float32),
             "b": rng.standard_normal((1, 8, 64, 64)).astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    compiled = ge.compile(model, {"threads": threads})
    for _ in range(2):  # (the second run reuses the planned buffers)
        got = compiled.run(feeds)
        got = np.asarray(got["y"] if isinstance(got, dict) else got[0])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_a_bound_output_array_is_filled(mode):
    """IO binding: a Resize that is a graph output writes the caller's array, natively or not."""
    model = _model((1, 4, 8, 8), (1, 4, 32, 24), mode=mode)
    x = np.random.default_rng(4).standard_normal((1, 4, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    bound = np.empty((1, 4, 32, 24), np.float32)
    ge.compile(model).run({"x": x}, outputs={"y": bound})
    np.testing.assert_allclose(bound, ref, rtol=1e-5, atol=1e-5)
