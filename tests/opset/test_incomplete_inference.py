"""Incomplete inference waits for folding instead of failing (issue 20).

A node whose inputs have an unknown dim or rank, or whose shape-like input (Reshape's shape,
Resize's sizes, Slice's starts, TopK's K...) is computed rather than constant, cannot be checked
by ONNX's inference yet: its result is unknown until ``fold_shapes`` / ``fold_constants`` made the
value a constant and inference runs again. Such a node never fails the first inference pass.
A node whose inputs are complete (every dim known, every shape-like input constant) and that
ONNX still rejects is the model's error: :class:`ShapeInferenceError` names it.

Every case here computes the shape-like input from ``Shape(x)`` (the way exporters write
``x.shape[-2:]``): in a static model folding turns it into a constant; with a symbolic batch dim
it stays a run-time value. Both compile and match onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import ShapeInferenceError
from ge_core.ops import infer_graph
from ge_core.plugins import get_host

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
X_SHAPE = (2, 3, 4, 6)


class Net:
    """A model under construction: ``x`` (float32, X_SHAPE, first dim symbolic if asked)."""

    def __init__(self, opset: int = 17, runtime: bool = False) -> None:
        self.opset = opset
        self.runtime = runtime
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str] | str:
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.fresh(f"n_{op}"), **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, values, dtype=np.int64) -> str:
        """A Constant *node* (a computed value for the first inference, as exporters write it)."""
        name = self.fresh("const")
        arr = np.asarray(values, dtype)
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name)))
        return name

    def init(self, values, dtype=np.float32) -> str:
        name = self.fresh("w")
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    def dims(self, of: str, idx: list[int] | int) -> str:
        """``Shape(of)[idx]``: a 1-D int64 tensor (a scalar for an int ``idx``)."""
        return self.node("Gather", [self.node("Shape", [of]), self.const(idx)], axis=0)

    def value(self, v: str, dtype: int = I64) -> str:
        """The shape-like value ``v`` as the node reads it: as built, or (runtime mode) plus a zero
        that depends on x's data, so no inference or folding can know it before a run."""
        if not self.runtime:
            return v
        nan = self.node("IsNaN", [self.node("ReduceMax", ["x"], keepdims=0)])
        return self.node("Add", [v, self.node("Cast", [nan], to=dtype)])

    def model(self, outputs: list[str], dynamic: bool, extra_inputs=()) -> onnx.ModelProto:
        x_shape = ["N", *X_SHAPE[1:]] if dynamic else list(X_SHAPE)
        inputs = [helper.make_tensor_value_info("x", F32, x_shape), *extra_inputs]
        outs = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs]  # types left to inference
        g = helper.make_graph(self.nodes, "g", inputs, outs, initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8
        return m


# ------------------------------------------------------------------------------------------------
# one case per op with a shape-like input: (build(net) -> (outputs, the shape-like value), opset)
# ------------------------------------------------------------------------------------------------
def reshape(n: Net):
    shape = n.value(n.node("Concat", [n.dims("x", [0]), n.const([-1])], axis=0))
    return [n.node("Reshape", ["x", shape])], shape


def expand(n: Net):
    shape = n.value(n.dims("x", [0, 1, 2, 3]))
    b = n.init(np.random.default_rng(1).standard_normal((3, 1, 1)))
    return [n.node("Add", [n.node("Expand", [b, shape]), "x"])], shape


def tile(n: Net):
    half = n.node("Div", [n.dims("x", [2]), n.const([2])])
    reps = n.value(n.node("Concat", [n.const([1, 1]), half, n.const([1])], axis=0))  # [1, 1, 2, 1]
    return [n.node("Tile", ["x", reps])], reps


def pad(n: Net):
    tail = n.node("Div", [n.dims("x", [2, 3]), n.const([4, 3])])  # [1, 2]
    pads = n.value(n.node("Concat", [n.const([0, 0, 1, 1, 0, 0]), tail], axis=0))
    return [n.node("Pad", ["x", pads, n.const(0.5, np.float32)])], pads


def pad_axes(n: Net):  # Pad-18's axes input, computed too
    axes = n.value(n.node("Sub", [n.dims("x", [1]), n.const([0])]))  # [3]
    pads = n.node("Div", [n.dims("x", [2, 2]), n.const([4, 2])])  # [1, 2]
    return [n.node("Pad", ["x", pads, "", axes], mode="reflect")], axes


def slice_(n: Net):
    starts = n.value(n.node("Div", [n.dims("x", [2, 3]), n.const([4, 3])]))  # [1, 2]
    ends = n.dims("x", [2, 3])
    axes = n.node("Add", [n.dims("x", [1, 1]), n.const([-1, 0])])  # [2, 3]
    steps = n.node("Div", [n.dims("x", [1, 1]), n.const([3, 2])])  # [1, 1]
    return [n.node("Slice", ["x", starts, ends, axes, steps])], starts


def constant_of_shape(n: Net):
    shape = n.value(n.dims("x", [0, 3]))
    filled = n.node("ConstantOfShape", [shape], value=numpy_helper.from_array(np.array([1.5], np.float32)))
    return [n.node("Add", [filled, n.node("ReduceSum", ["x", n.const([1, 2])], keepdims=0)])], shape


def range_(n: Net):
    limit = n.value(n.dims("x", 0))  # a scalar: the batch
    r = n.node("Range", [n.const(0), limit, n.const(1)])
    return [n.node("Cast", [r], to=F32)], limit


def topk(n: Net):
    k = n.value(n.dims("x", [1]))  # 3 of the last axis' 6
    vals, idx = n.node("TopK", ["x", k], n_out=2, axis=-1)
    return [vals, idx], k


def upsample(n: Net):  # Upsample-9: scales is an input
    two = n.node("Cast", [n.node("Div", [n.dims("x", [2, 3]), n.const([2, 3])])], to=F32)
    scales = n.value(n.node("Concat", [n.const([1.0, 1.0], np.float32), two], axis=0), F32)
    return [n.node("Upsample", ["x", scales], mode="nearest")], scales


def resize_sizes(n: Net):  # F.interpolate(y, size=x.shape[-2:]) as torch exports it
    y = n.node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2])
    sizes = n.node("Concat", [n.node("Slice", [n.node("Shape", [y]), n.const([0]), n.const([2]), n.const([0])]),
                              n.dims("x", [2, 3])], axis=0)
    sizes = n.value(sizes)
    return [n.node("Resize", [y, "", "", sizes], mode="linear")], sizes


def resize_scales(n: Net):
    two = n.node("Cast", [n.node("Div", [n.dims("x", [2, 3]), n.const([2, 3])])], to=F32)
    scales = n.value(n.node("Concat", [n.const([1.0, 1.0], np.float32), two], axis=0), F32)
    return [n.node("Resize", ["x", "", scales], mode="nearest")], scales


def resize_roi(n: Net):
    lo = n.node("Cast", [n.node("Div", [n.dims("x", [0, 1]), n.const([8, 8])])], to=F32)  # [0, 0]
    roi = n.value(n.node("Concat", [lo, n.const([0.1, 0.2, 1.0, 1.0, 0.9, 0.8], np.float32)], axis=0), F32)
    sizes = n.node("Concat", [n.dims("x", [0, 1]), n.const([5, 5])], axis=0)
    return [n.node("Resize", ["x", roi, "", sizes], mode="linear",
                   coordinate_transformation_mode="tf_crop_and_resize")], roi


def one_hot(n: Net):
    idx = n.node("ArgMax", ["x"], axis=3, keepdims=0)  # [N, 3, 4] in [0, 6)
    depth = n.value(n.dims("x", [3]))
    return [n.node("OneHot", [idx, depth, n.const([0.0, 1.0], np.float32)], axis=-1)], depth


def squeeze(n: Net):
    y = n.node("ReduceMean", ["x"], axes=[2], keepdims=1)  # [N, 3, 1, 6]
    axes = n.value(n.node("Mul", [n.node("Div", [n.dims("x", [1]), n.dims("x", [1])]), n.const([2])]))  # [2]
    return [n.node("Squeeze", [y, axes])], axes


def unsqueeze(n: Net):
    axes = n.value(n.node("Div", [n.dims("x", [1]), n.dims("x", [1])]))  # [1]
    return [n.node("Unsqueeze", ["x", axes])], axes


def reduce_sum(n: Net):  # ReduceSum-13: axes is an input
    axes = n.value(n.node("Div", [n.dims("x", [2]), n.const([2])]))  # [2]
    return [n.node("ReduceSum", ["x", axes], keepdims=0)], axes


def reduce_max(n: Net):  # every ReduceX from opset 18
    axes = n.value(n.node("Sub", [n.dims("x", [1, 2]), n.const([2, 1])]))  # [1, 3]
    return [n.node("ReduceMax", ["x", axes], keepdims=1)], axes


def split(n: Net):
    third = n.node("Div", [n.dims("x", [3]), n.const([3])])  # [2]
    sizes = n.value(n.node("Concat", [third, n.node("Sub", [n.dims("x", [3]), third])], axis=0))  # [2, 4]
    return list(n.node("Split", ["x", sizes], n_out=2, axis=3)), sizes


def center_crop_pad(n: Net):
    shape = n.value(n.node("Add", [n.dims("x", [2, 3]), n.const([2, -2])]))  # crop W, pad H
    return [n.node("CenterCropPad", ["x", shape], axes=[2, 3])], shape


def col2im(n: Net):
    # x [N, 3, 4, 6] -> [N, 12, 6] columns of a 2x2 block over a 3x4 image (L = 2 * 3 = 6)
    cols = n.node("Reshape", ["x", n.node("Concat", [n.dims("x", [0]), n.const([12, 6])], axis=0)])
    image = n.node("Sub", [n.dims("x", [1, 2]), n.const([0, 1])])  # [3, 3]... then [3, 4]
    image = n.value(n.node("Add", [image, n.const([0, 1])]))
    block = n.node("Div", [n.dims("x", [2, 2]), n.const([2, 2])])  # [2, 2]
    return [n.node("Col2Im", [cols, image, block])], image


CASES = {
    "Reshape": (reshape, 17), "Expand": (expand, 17), "Tile": (tile, 17), "Pad": (pad, 17),
    "Pad-axes": (pad_axes, 18), "Slice": (slice_, 17), "ConstantOfShape": (constant_of_shape, 17),
    "Range": (range_, 17), "TopK": (topk, 17), "Upsample": (upsample, 9), "Resize-sizes": (resize_sizes, 17),
    "Resize-scales": (resize_scales, 17), "Resize-roi": (resize_roi, 17), "OneHot": (one_hot, 17),
    "Squeeze": (squeeze, 17), "Unsqueeze": (unsqueeze, 17), "ReduceSum": (reduce_sum, 17),
    "ReduceMax": (reduce_max, 18), "Split": (split, 17), "CenterCropPad": (center_crop_pad, 18),
    "Col2Im": (col2im, 18),
}


def _ort(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _build(case: str, mode: str):
    build, opset = CASES[case]
    n = Net(opset, runtime=mode == "runtime")
    outs, shape_like = build(n)
    return n.model(outs, dynamic=mode == "dynamic-batch"), shape_like


#: static: x is (2, 3, 4, 6) and folding makes the value a constant; dynamic-batch: x is
#: (N, 3, 4, 6); runtime: x static, the value depends on x's data (known only when it runs).
MODES = ("static", "dynamic-batch", "runtime")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_computed_shape_input_waits_for_folding(case, mode):
    m, shape_like = _build(case, mode)
    dynamic = mode == "dynamic-batch"

    # The first inference: the shape-like input is a computed value, and nothing fails.
    g = ge.load(m)
    values = {v.name: v for n in g.nodes for v in n.outputs}
    infer_graph(g, get_host().registries.ops)
    assert values[shape_like].const_value is None

    model = ge.compile(ge.load(m))
    for batch in ((2, 1, 3) if dynamic else (2,)):
        x = np.random.default_rng(batch).standard_normal((batch, *X_SHAPE[1:])).astype(np.float32)
        want = _ort(m, {"x": x})
        got = model.run({"x": x})
        assert list(got) == [o.name for o in m.graph.output]
        for name, w in zip(got, want):
            assert got[name].dtype == w.dtype and got[name].shape == w.shape, (case, batch, name)
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=f"{case} batch {batch}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_static_model_types_are_complete_after_folding(case):
    """Once folding made the shape-like value a constant, inference ran again: every output type
    of the compiled static model is fully known (dtype and every dim), as onnxruntime gives it."""
    m, _ = _build(case, "static")
    model = ge.compile(ge.load(m))
    x = np.random.default_rng(0).standard_normal(X_SHAPE).astype(np.float32)
    for v, w in zip(model.graph.outputs, _ort(m, {"x": x})):
        assert v.type.dtype == w.dtype and v.type.shape == w.shape, (case, v.name, v.type)


# ------------------------------------------------------------------------------------------------
# what is still the model's error
# ------------------------------------------------------------------------------------------------
def _static(nodes, inputs, out="y", inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_value_info(out, onnx.TypeProto())],
                          initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


BAD_WITH_CONSTANTS = {
    # a constant shape-like input that contradicts a fully known input
    "tile": ([helper.make_node("Tile", ["x", "r"], ["y"], name="bad_tile")],
             [helper.make_tensor_value_info("x", F32, [2, 3])], [_i64("r", [1, 2, 3])], "bad_tile"),
    "resize": ([helper.make_node("Resize", ["x", "", "", "s"], ["y"], name="bad_resize")],
               [helper.make_tensor_value_info("x", F32, [1, 3, 4, 4])], [_i64("s", [8, 8])], "bad_resize"),
    "expand": ([helper.make_node("Expand", ["x", "s"], ["y"], name="bad_expand")],
               [helper.make_tensor_value_info("x", F32, [2, 3])], [_i64("s", [4, 5])], "bad_expand"),
    "slice": ([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"], name="bad_slice")],
              [helper.make_tensor_value_info("x", F32, [2, 3])],
              [_i64("st", [0]), _i64("en", [1]), _i64("ax", [5])], "bad_slice"),
    "squeeze": ([helper.make_node("Squeeze", ["x", "ax"], ["y"], name="bad_squeeze")],
                [helper.make_tensor_value_info("x", F32, [2, 3])], [_i64("ax", [1])], "bad_squeeze"),
    "split": ([helper.make_node("Split", ["x", "sp"], ["y", "z"], name="bad_split", axis=1)],
              [helper.make_tensor_value_info("x", F32, [2, 6])], [_i64("sp", [2, 2])], "bad_split"),
}


@pytest.mark.parametrize("case", sorted(BAD_WITH_CONSTANTS))
def test_inconsistent_node_with_constant_shape_input_still_raises(case):
    nodes, inputs, inits, name = BAD_WITH_CONSTANTS[case]
    m = _static(nodes, inputs, inits=inits)
    with pytest.raises(ShapeInferenceError, match=name) as ei:
        ge.compile(ge.load(m))
    assert "fix the model" in str(ei.value)


def test_inconsistent_node_with_known_types_still_raises():
    """Fully known input types, no shape-like input: Add of (2, 3) and (4, 3)."""
    m = _static([helper.make_node("Add", ["a", "b"], ["y"], name="bad_add")],
                [helper.make_tensor_value_info("a", F32, [2, 3]), helper.make_tensor_value_info("b", F32, [4, 3])])
    with pytest.raises(ShapeInferenceError, match="bad_add"):
        ge.compile(ge.load(m))


def test_incomplete_inputs_give_unknown_not_errors(onnx_host):
    """The first inference of a Resize whose sizes are not known yet (ONNX itself says 'Number
    of elements of input sizes (0) must be same as rank of input X' there), with X fully known
    or of unknown rank: unknown results, no error."""
    from ge_core.ir.graph import Graph
    from ge_core.ir.types import TensorType

    g = Graph("t")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType(np.float32, (1, 3, 4, 4)))
    sizes = g.add_input("sizes", TensorType(np.int64, (None,)))  # a value known only at run time
    r = g.add_node("Resize", [x, None, None, sizes], {"mode": "linear"}, name="resize")
    u = g.add_input("u", TensorType(np.float32, None))
    r2 = g.add_node("Resize", [u, None, None, g.add_constant(np.array([8, 8], np.int64), "s")],
                    {"mode": "linear"}, name="resize_u")
    infer_graph(g, onnx_host.registries.ops)
    assert r.output.type.shape is None and r2.output.type.shape is None
