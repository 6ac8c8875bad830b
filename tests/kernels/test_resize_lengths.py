"""Resize's ``sizes`` / ``scales`` hold one entry per resized axis (the input's rank, or the length
of ``axes``): a run-time value of another length is refused naming the node, as onnxruntime
refuses it, instead of resizing the wrong axes into a wrong shape."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

import ge_core as ge
from ge_core.errors import ExecutionError


def _resize_model(what, n, axes=None):
    """Resize 'rs' of x float32[1,3,4,4] whose ``what`` (sizes or scales) is a run-time input of ``n`` entries."""
    dtype = TensorProto.INT64 if what == "sizes" else TensorProto.FLOAT
    ins = ["x", "", "", "sizes"] if what == "sizes" else ["x", "", "scales"]
    attrs = {"axes": axes} if axes is not None else {}
    node = helper.make_node("Resize", ins, ["y"], name="rs", mode="nearest", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4]),
                                        helper.make_tensor_value_info(what, dtype, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def _feeds(what, values):
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    return {"x": x, what: np.array(values, np.int64 if what == "sizes" else np.float32)}


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("what, values, axes", [
    ("sizes", [1, 3, 8], None),           # rank 4, three sizes
    ("sizes", [1, 1, 3, 8, 8], None),     # five sizes
    ("scales", [1.0, 2.0, 2.0], None),
    ("sizes", [8, 8, 8], [2, 3]),         # two axes, three sizes
])
def test_a_length_other_than_the_resized_axes_is_refused_naming_the_node(what, values, axes):
    model = _resize_model(what, len(values), axes)
    feeds = _feeds(what, values)
    with pytest.raises((Fail, InvalidArgument, RuntimeException)):  # onnxruntime refuses it too
        _ort(model, feeds)
    compiled = ge.compile(model)
    with pytest.raises(ExecutionError) as e:
        compiled.run(feeds)
    msg = str(e.value)
    assert "node 'rs' (Resize)" in msg and f"'{what}' has {len(values)} element(s)" in msg
    assert (f"the {len(axes)} entries of 'axes'" if axes else "the input's rank 4") in msg


@pytest.mark.parametrize("what, values, axes", [
    ("sizes", [1, 3, 8, 2], None),
    ("scales", [1.0, 1.0, 2.0, 0.5], None),
    ("sizes", [8, 6], [2, 3]),
])
def test_the_right_length_matches_onnxruntime(what, values, axes):
    model = _resize_model(what, len(values), axes)
    feeds = _feeds(what, values)
    want = _ort(model, feeds)
    got = ge.compile(model).run(feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_a_negative_size_is_refused():
    model = _resize_model("sizes", 4)
    with pytest.raises(ExecutionError, match=r"node 'rs' \(Resize\): 'sizes' .* negative"):
        ge.compile(model).run(_feeds("sizes", [1, 3, -2, 4]))
