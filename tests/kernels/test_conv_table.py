"""The cpu Conv kernel's algorithm table (ge_cpu.kernels.conv): which algorithm each kind of
convolution gets (named in the report's ``node_kernels``), pinned to the choice the kernel made
before the table (recorded per case from the old closure's run-time path), and the numbers
against onnxruntime; the ``conv_algorithm`` option's preferences and forcing; the layout pass
asking the same table."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import GEError, OptionError
from ge_core.kernel import KernelSpec, caps
from ge_cpu.kernels import _window, conv
from ge_native import nchwc, sgemm

ort.set_default_logger_severity(3)


def conv_model(xs, ws, attrs, dtype=np.float32, const_w=True, bias=True, dyn=(), seed=0, relu=False):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    tt = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    xshape = [f"d{i}" if i in dyn else d for i, d in enumerate(xs)]
    ins = [helper.make_tensor_value_info("x", tt, xshape)]
    inits, names = [], ["x", "w"]
    if const_w:
        inits.append(numpy_helper.from_array(w, "w"))
    else:
        ins.append(helper.make_tensor_value_info("w", tt, list(ws)))
    if bias:
        inits.append(numpy_helper.from_array(b, "b"))
        names.append("b")
    nodes = [helper.make_node("Conv", names, ["c" if relu else "y"], name="conv0", **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu0"))
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", tt, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = {"x": rng.standard_normal(xs).astype(dtype)}
    if not const_w:
        feeds["w"] = w
    return m, feeds


P1 = dict(pads=[1, 1, 1, 1])
#: name: (input shape, weight shape, attributes, model options, conv_algorithm, the algorithm
#: today's kernel runs, what it needs on this machine)
CASES = {
    "depthwise3": ((1, 32, 16, 16), (32, 1, 3, 3), dict(group=32, **P1), {}, "auto", "depthwise_direct", "direct"),
    "depthwise5": ((1, 32, 16, 16), (32, 1, 5, 5), dict(group=32, pads=[2] * 4), {}, "auto", "depthwise_nchwc", "nchwc"),
    "depthwise3_dynamic": ((1, 32, 16, 16), (32, 1, 3, 3), dict(group=32, **P1), dict(dyn=(0, 2, 3)), "auto",
                           "depthwise_window", "window"),
    "depthwise3_float64": ((1, 32, 16, 16), (32, 1, 3, 3), dict(group=32, **P1), dict(dtype=np.float64), "auto",
                           "depthwise_window", "window"),
    "depthwise_multiplier2": ((1, 16, 12, 12), (32, 1, 3, 3), dict(group=16, **P1), {}, "auto", "depthwise_window",
                              "window"),
    "depthwise_3d": ((1, 8, 6, 6, 6), (8, 1, 3, 3, 3), dict(group=8, pads=[1] * 6), {}, "auto", "depthwise_numpy", ""),
    "weight_input_depthwise": ((1, 16, 12, 12), (16, 1, 3, 3), dict(group=16, **P1), dict(const_w=False), "auto",
                               "depthwise_window", "window"),
    "winograd_3x3": ((1, 64, 28, 28), (64, 64, 3, 3), P1, {}, "auto", "winograd", ""),
    "winograd_float64": ((1, 64, 28, 28), (64, 64, 3, 3), P1, dict(dtype=np.float64), "auto", "winograd", ""),
    "small_3x3": ((1, 8, 28, 28), (8, 8, 3, 3), P1, {}, "auto", "gemm_prepared", "sgemm"),
    "pointwise_1x1": ((1, 64, 16, 16), (32, 64, 1, 1), {}, {}, "auto", "gemm_prepared", "sgemm"),
    "grouped": ((1, 32, 14, 14), (32, 8, 3, 3), dict(group=4, **P1), {}, "auto", "gemm_prepared", "sgemm"),
    "dilated": ((1, 16, 20, 20), (16, 16, 3, 3), dict(dilations=[2, 2], pads=[2] * 4), {}, "auto", "gemm_prepared",
                "sgemm"),
    "strided": ((1, 16, 20, 20), (24, 16, 3, 3), dict(strides=[2, 2], **P1), {}, "auto", "gemm_prepared", "sgemm"),
    "same_upper": ((1, 16, 15, 15), (16, 16, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), {}, "auto",
                   "gemm_prepared", "sgemm"),
    "no_bias": ((1, 16, 12, 12), (16, 16, 3, 3), P1, dict(bias=False), "auto", "gemm_prepared", "sgemm"),
    "dynamic_shape": ((2, 16, 12, 12), (16, 16, 3, 3), P1, dict(dyn=(0, 2, 3)), "auto", "packed", "sgemm"),
    "weight_input": ((1, 16, 12, 12), (16, 16, 3, 3), P1, dict(const_w=False), "auto", "packed", "sgemm"),
    "conv1d": ((1, 8, 40), (16, 8, 5), dict(pads=[2, 2]), {}, "auto", "packed", "sgemm"),
    "float64_3x3": ((1, 8, 10, 10), (8, 8, 3, 3), P1, dict(dtype=np.float64), "auto", "im2col", ""),
    "float64_1x1": ((1, 8, 10, 10), (12, 8, 1, 1), {}, dict(dtype=np.float64), "auto", "pointwise", ""),
    "conv3d": ((1, 4, 6, 6, 6), (8, 4, 3, 3, 3), dict(pads=[1] * 6), {}, "auto", "im2col", ""),
    "conv3d_1x1": ((1, 4, 6, 6, 6), (8, 4, 1, 1, 1), {}, {}, "auto", "pointwise", ""),
    # the option's preferences: winograd where it applies (a plane auto finds too small), im2col never
    "winograd_preferred_small": ((1, 8, 28, 28), (8, 8, 3, 3), P1, {}, "winograd", "winograd", ""),
    "im2col_preferred_big": ((1, 64, 28, 28), (64, 64, 3, 3), P1, {}, "im2col", "gemm_prepared", "sgemm"),
    "winograd_preferred_depthwise": ((1, 32, 16, 16), (32, 1, 3, 3), dict(group=32, **P1), {}, "winograd",
                                     "depthwise_direct", "direct"),
}

NEEDS = {"": lambda: True, "sgemm": sgemm.available, "window": _window.available,
         "direct": lambda: _window.available() and _window.direct_available(), "nchwc": nchwc.available}


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_convolution_names_the_algorithm_it_always_ran(case):
    xs, ws, attrs, opts, option, want, needs = CASES[case]
    model, feeds = conv_model(xs, ws, attrs, **opts)
    compiled = ge.compile(ge.load(model), {"conv_algorithm": option, "threads": 2})
    got = compiled.report["node_kernels"]["conv0"]
    if NEEDS[needs]():
        assert got["op"] == "Conv" and got["algorithm"] == want
        assert ("winograd" in compiled.report.get("kernel_modes", {})) == (option == "winograd" or want == "winograd")
    else:  # without those kernels on this machine the table's next algorithm runs, and says so
        assert got["op"] == "Conv" and got["algorithm"] != want and got["algorithm"] in conv.names()
    # (onnxruntime has no float64 Conv: a float64 one against its float32 twin, the same values)
    ref = ort_run(*conv_model(xs, ws, attrs, **{**opts, "dtype": np.float32}))
    for _ in range(2):  # (a second run reuses the prepared call's buffers)
        y = compiled.run(feeds)["y"]
        assert y.dtype == np.dtype(opts.get("dtype", np.float32))
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_a_dynamic_shape_runs_other_shapes_through_the_same_kernel():
    model, feeds = conv_model((2, 16, 12, 12), (16, 16, 3, 3), P1, dyn=(0, 2, 3))
    compiled = ge.compile(ge.load(model), {"threads": 2})
    x = np.random.default_rng(4).standard_normal((1, 16, 7, 9)).astype(np.float32)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_the_table_is_ordered_by_priority_and_covers_every_plan():
    prios = [p for p, _ in conv.ALGORITHMS]
    assert prios == sorted(prios, reverse=True)
    assert set(conv.names()) == {"nchwc", "gemm_prepared", "depthwise_direct", "depthwise_nchwc", "depthwise_window",
                                 "winograd", "packed", "pointwise", "depthwise_numpy", "im2col"}
    for _, alg in conv.ALGORITHMS:
        assert callable(alg.applies) and callable(alg.build) and alg.NAME


def _spec(xs, ws, attrs, option="auto", const_w=True, dtype=np.float32):
    model, _ = conv_model(xs, ws, attrs, dtype=dtype, const_w=const_w)
    node = next(n for n in ge.load(model).node_list() if n.op_type == "Conv")
    return KernelSpec.from_node(node, None, conv_algorithm=option, threads=1)


def test_a_forced_algorithm_runs_where_it_applies():
    spec = _spec((1, 16, 12, 12), (16, 16, 3, 3), P1, option="im2col_not_a_preference")
    with pytest.raises(OptionError, match="conv0.*is not one of.*gemm_prepared.*im2col"):
        conv.factory(spec)
    x = np.random.default_rng(1).standard_normal((1, 16, 12, 12)).astype(np.float32)
    ref = None
    # ("im2col" keeps its meaning of a preference, no Winograd: the table's im2col is not forced so)
    for name in ("auto", "gemm_prepared", "packed", "im2col") if sgemm.available() else ("auto", "im2col"):
        spec = _spec((1, 16, 12, 12), (16, 16, 3, 3), P1, option=name)
        k = conv.factory(spec)
        assert caps(k).algorithm == (name if name in ("gemm_prepared", "packed") else conv.choose(conv.ConvPlan(spec)).NAME)
        y = k(x, spec.const_inputs[1], spec.const_inputs[2])[0]
        ref = y if ref is None else ref
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    # a depthwise layer forced to the NumPy form
    spec = _spec((1, 8, 9, 9), (8, 1, 3, 3), dict(group=8, **P1), option="depthwise_numpy")
    k = conv.factory(spec)
    assert caps(k).algorithm == "depthwise_numpy" and caps(k).variant == "numpy"
    xd = np.random.default_rng(2).standard_normal((1, 8, 9, 9)).astype(np.float32)
    auto = conv.factory(_spec((1, 8, 9, 9), (8, 1, 3, 3), dict(group=8, **P1)))
    np.testing.assert_allclose(k(xd, spec.const_inputs[1], spec.const_inputs[2])[0],
                               auto(xd, spec.const_inputs[1], spec.const_inputs[2])[0], rtol=1e-5, atol=1e-6)


def test_a_forced_algorithm_that_does_not_apply_is_an_error_naming_the_node_and_the_ones_that_do():
    spec = _spec((1, 16, 12, 12), (16, 16, 3, 3), P1, option="depthwise_numpy")
    with pytest.raises(GEError, match="conv0.*'depthwise_numpy' does not apply") as e:
        conv.factory(spec)
    assert "im2col" in str(e.value)  # (the hint lists the algorithms that apply)
    spec = _spec((1, 16, 12, 12), (16, 16, 1, 1), {}, option="nchwc")
    with pytest.raises(GEError, match="nchwc"):
        conv.factory(spec)


def test_the_layout_pass_asks_the_same_table():
    spec = _spec((1, 32, 16, 16), (32, 32, 3, 3), P1)
    kernel_plan = conv.ConvPlan(spec)
    assert not conv.applies("nchwc", kernel_plan)  # (a kernel's build never changes the layout)
    layout_plan = conv.ConvPlan(spec, layout=True)
    assert conv.applies("nchwc", layout_plan) == (spec.outputs[0].shape is not None)
    grouped = conv.ConvPlan(_spec((1, 32, 16, 16), (32, 8, 3, 3), dict(group=4, **P1)), layout=True)
    assert not conv.applies("nchwc", grouped)  # (8 channels a group: not whole blocks)
    forced = conv.ConvPlan(_spec((1, 32, 16, 16), (32, 32, 3, 3), P1, option="im2col_x"), layout=True)
    assert not conv.applies("nchwc", forced)


def test_blocked_convolutions_name_their_algorithm():
    """A chain of four convolutions the layout pass takes: each NchwcConv names its algorithm
    (the stem reads NCHW, the 3x3 stride-1 one on a 12x12 plane is Winograd F(2x2))."""
    rng = np.random.default_rng(2)
    layers = [("c0", 3, 32, 3, 1), ("c1", 32, 32, 3, 2), ("c2", 32, 32, 3, 1), ("c3", 32, 32, 1, 1)]
    nodes, inits, cur = [], [], "x"
    for name, c, m, k, st in layers:
        inits.append(numpy_helper.from_array((rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32),
                                             f"w_{name}"))
        nodes.append(helper.make_node("Conv", [cur, f"w_{name}"], [f"o_{name}"], name=name, pads=[k // 2] * 4,
                                      strides=[st, st]))
        cur = f"o_{name}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 24, 24])],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    compiled = ge.compile(ge.load(model), {"threads": 2})
    nk = compiled.report["node_kernels"]
    if nchwc.available():
        assert {n: (v["op"], v["algorithm"]) for n, v in nk.items()} == {
            "c0": ("NchwcConv", "nchwc"), "c1": ("NchwcConv", "nchwc"), "c2": ("NchwcConv", "nchwc_winograd2"),
            "c3": ("NchwcConv", "nchwc")}
    else:  # no blocked kernels on this machine: the layout pass leaves the plain convolutions
        assert {v["op"] for v in nk.values()} <= {"Conv", "FusedConv"} and len(nk) == 4
    x = rng.standard_normal((1, 3, 24, 24)).astype(np.float32)
    np.testing.assert_allclose(compiled.run({"x": x})[cur], ort_run(model, {"x": x}), rtol=1e-3, atol=1e-4)


def test_the_option_forces_an_algorithm_for_the_whole_model():
    model, feeds = conv_model((1, 16, 12, 12), (16, 16, 3, 3), P1, relu=True)
    ref = ort_run(model, feeds)
    forced = "packed" if sgemm.available() else "im2col"
    compiled = ge.compile(ge.load(model), {"conv_algorithm": forced, "threads": 2})
    (got,) = compiled.report["node_kernels"].values()  # (the Conv, or the FusedConv of it and the Relu)
    assert got["op"] in ("Conv", "FusedConv")
    assert got["algorithm"] == conv.choose(conv.ConvPlan(_spec((1, 16, 12, 12), (16, 16, 3, 3), P1, option=forced))).NAME
    if forced == "packed":
        assert got["algorithm"] == "packed"
    np.testing.assert_allclose(compiled.run(feeds)["y"], ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(GEError, match="conv0.*depthwise_window.*does not apply"):
        ge.compile(ge.load(model), {"conv_algorithm": "depthwise_window"})
    with pytest.raises(OptionError, match="conv_algorithm 'fft' is not one of auto, im2col, winograd, winograd4, nchwc"):
        ge.compile(ge.load(model), {"conv_algorithm": "fft"})
