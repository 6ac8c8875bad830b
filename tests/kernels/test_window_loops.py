"""The compiled window loops of the ge_cpu kernels (depthwise Conv, MaxPool, AveragePool).

Every case runs a one-node ONNX model through onnxruntime (float32, and float64 MaxPool) or
onnx.reference (float64 Conv and AveragePool, which onnxruntime has no kernel for) and through
the ge_cpu kernel on the same inputs. The loops are numba-compiled; without numba the kernels
fall back to NumPy and these tests check that path.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import ge_core as ge
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec, caps
from ge_cpu.kernels import KERNELS, _window

RNG = np.random.default_rng(7)
TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


@pytest.fixture(autouse=True)
def _window_loops_not_the_blocked_kernel(monkeypatch):
    """The depthwise Conv kernel runs small planes and wide kernels on the blocked layout's
    kernel where it builds (tests/kernels/test_nchwc_layout.py checks that): here, the loops."""
    import ge_native.nchwc as nchwc

    monkeypatch.setattr(nchwc, "_mod", lambda: None)


def rand(*shape, dtype=np.float32):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(dtype)


def _model(op, inputs, attrs, const, n_outputs=1, opset=17):
    names, graph_inputs, inits = [], [], []
    for i, a in enumerate(inputs):
        name = f"in{i}"
        names.append(name)
        if i in const:
            inits.append(numpy_helper.from_array(a, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
    outs = [f"out{j}" for j in range(n_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, {n: a for i, (n, a) in enumerate(zip(names, inputs)) if i not in const}


def reference(op, inputs, attrs, const, opset=17):
    model, feeds = _model(op, inputs, attrs, const, opset=opset)
    if inputs[0].dtype == np.float64 and op != "MaxPool":
        from onnx.reference import ReferenceEvaluator

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ReferenceEvaluator(model).run(None, feeds)[0]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def build(op, inputs, attrs, const, out_like, opset=17):
    spec = KernelSpec(name=f"test_{op}", op_type=op, attrs=dict(attrs),
                      inputs=[TensorType.of(a) for a in inputs], outputs=[TensorType.of(out_like)],
                      const_inputs=[a if i in const else None for i, a in enumerate(inputs)], opset=opset)
    return KERNELS[("", op)](spec)


def check(op, inputs, attrs, const=(1, 2), opset=17):
    want = reference(op, inputs, attrs, const, opset)
    kernel = build(op, inputs, attrs, const, want, opset)
    got = kernel(*inputs)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL[want.dtype.type])
    # the out= protocol: the result lands in the caller's array
    if caps(kernel).accepts_out:
        buf = np.full(want.shape, np.nan, want.dtype)
        res = kernel(*inputs, out=(buf,))
        assert res[0] is buf
        np.testing.assert_allclose(buf, want, **TOL[want.dtype.type])
    return kernel, got




def test_window_loops_are_available():
    # a C compiler is on every supported machine: without it the NumPy kernels run, and the loop
    # tests below must not pass vacuously
    assert _window.available(), "no C compiler or Python/NumPy headers (or GE_NATIVE=0 / GE_CPU_JIT=0 is set)"


# ------------------------------------------------------------------------------------------------
# depthwise Conv

DW_CASES = [
    # (C, H, W, kernel, attrs)
    (8, 9, 9, (3, 3), {"pads": [1, 1, 1, 1]}),
    (8, 9, 10, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    (6, 11, 7, (3, 3), {"pads": [0, 1, 2, 1]}),
    (6, 11, 7, (3, 3), {"pads": [2, 0, 1, 3], "strides": [2, 1]}),
    (5, 12, 13, (5, 5), {"pads": [2, 2, 2, 2], "strides": [1, 2]}),
    (4, 15, 14, (7, 7), {"pads": [3, 3, 3, 3], "strides": [3, 3]}),
    (4, 8, 9, (3, 1), {"pads": [1, 0, 1, 0]}),
    (4, 8, 9, (1, 5), {"pads": [0, 2, 0, 2], "strides": [1, 3]}),
    (4, 8, 9, (2, 2), {}),
    (4, 10, 10, (3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    (4, 10, 11, (3, 3), {"dilations": [1, 3], "pads": [1, 2, 0, 3], "strides": [2, 1]}),
    (4, 10, 11, (3, 3), {"dilations": [2, 2], "strides": [2, 2]}),
    (6, 10, 7, (3, 3), {"auto_pad": "SAME_UPPER"}),
    (6, 10, 7, (4, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    (6, 10, 7, (4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    (6, 9, 8, (3, 2), {"auto_pad": "SAME_LOWER", "strides": [3, 2]}),
    (6, 9, 8, (3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    (3, 4, 4, (5, 5), {"pads": [4, 4, 4, 4]}),  # padding wider than the input
    (4, 6, 6, (1, 1), {"strides": [2, 2]}),
    (2, 12, 12, (9, 9), {"pads": [4, 4, 4, 4]}),  # more taps than the unrolled loops take
]


@pytest.mark.parametrize("c,h,w,k,attrs", DW_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_conv(c, h, w, k, attrs, bias):
    x = rand(2, c, h, w)
    ws = rand(c, 1, *k)
    inputs = [x, ws] + ([rand(c)] if bias else [])
    check("Conv", inputs, {**attrs, "group": c, "kernel_shape": list(k)})


@pytest.mark.parametrize("c,h,w,k,attrs", [DW_CASES[1], DW_CASES[3], DW_CASES[10], DW_CASES[14]])
def test_depthwise_conv_float64(c, h, w, k, attrs):
    x = rand(2, c, h, w, dtype=np.float64)
    inputs = [x, rand(c, 1, *k, dtype=np.float64), rand(c, dtype=np.float64)]
    check("Conv", inputs, {**attrs, "group": c, "kernel_shape": list(k)})


@pytest.mark.parametrize("const", [(1, 2), (1,), ()])
def test_depthwise_conv_weights_at_run_time(const):
    x, w, b = rand(1, 6, 9, 9), rand(6, 1, 3, 3), rand(6)
    check("Conv", [x, w, b], {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}, const=const)


def test_depthwise_conv_channel_multiplier():
    # group == C with two output channels per input channel
    x, w, b = rand(2, 4, 9, 8), rand(8, 1, 3, 3), rand(8)
    check("Conv", [x, w, b], {"group": 4, "kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "strides": [2, 1]})


@pytest.mark.parametrize("attrs", [{"pads": [1, 1]}, {"strides": [2], "pads": [2, 0]},
                                   {"dilations": [2], "pads": [2, 1]}, {"auto_pad": "SAME_LOWER", "strides": [2]}])
def test_depthwise_conv_1d(attrs):
    x, w, b = rand(2, 5, 17), rand(5, 1, 3), rand(5)
    check("Conv", [x, w, b], {**attrs, "group": 5, "kernel_shape": [3]})


def test_depthwise_conv_strided_readonly_input():
    # a channel-shuffle style view (not C-contiguous) and read-only (mmap'ed) weights
    base = rand(1, 4, 2, 9, 9)
    x = base.transpose(0, 2, 1, 3, 4).reshape(1, 8, 9, 9)[:, :, :, :8]
    assert not x.flags.c_contiguous
    w, b = rand(8, 1, 3, 3), rand(8)
    w.setflags(write=False)
    b.setflags(write=False)
    want = reference("Conv", [np.ascontiguousarray(x), w, b], {"group": 8, "pads": [1, 1, 1, 1]}, (1, 2))
    kernel = build("Conv", [x, w, b], {"group": 8, "pads": [1, 1, 1, 1]}, (1, 2), want)
    np.testing.assert_allclose(kernel(x, w, b)[0], want, **TOL[np.float32])
    x.setflags(write=False)
    np.testing.assert_allclose(kernel(x, w, b)[0], want, **TOL[np.float32])


def test_depthwise_conv_out_not_contiguous():
    x, w, b = rand(1, 4, 8, 8), rand(4, 1, 3, 3), rand(4)
    attrs = {"group": 4, "pads": [1, 1, 1, 1]}
    want = reference("Conv", [x, w, b], attrs, (1, 2))
    kernel = build("Conv", [x, w, b], attrs, (1, 2), want)
    big = np.zeros((1, 4, 8, 16), np.float32)
    view = big[:, :, :, ::2]
    assert kernel(x, w, b, out=(view,))[0] is view
    np.testing.assert_allclose(view, want, **TOL[np.float32])
    assert not big[:, :, :, 1::2].any()


def test_depthwise_conv_without_the_loops(monkeypatch):
    # GE_CPU_JIT=0 (or no numba): the NumPy kernel gives the same results
    monkeypatch.setenv("GE_CPU_JIT", "0")
    assert not _window.available()
    x, w, b = rand(2, 6, 10, 9), rand(6, 1, 3, 3), rand(6)
    check("Conv", [x, w, b], {"group": 6, "pads": [1, 0, 1, 2], "strides": [2, 2]})
    x, w = rand(2, 6, 10, 9, dtype=np.float64), rand(6, 1, 3, 3, dtype=np.float64)
    check("Conv", [x, w], {"group": 6, "dilations": [2, 1]})


def test_depthwise_conv_matches_numpy_path(monkeypatch):
    x, w, b = rand(2, 6, 13, 11), rand(6, 1, 5, 3), rand(6)
    attrs = {"group": 6, "pads": [2, 1, 1, 0], "strides": [2, 1], "dilations": [1, 2]}
    want = reference("Conv", [x, w, b], attrs, (1, 2))
    loop = build("Conv", [x, w, b], attrs, (1, 2), want)(x, w, b)[0]
    monkeypatch.setenv("GE_CPU_JIT", "0")
    numpy_path = build("Conv", [x, w, b], attrs, (1, 2), want)(x, w, b)[0]
    np.testing.assert_allclose(loop, numpy_path, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# grouped Conv (1 < group < C) keeps the im2col/GEMM path


@pytest.mark.parametrize("xs,ws,attrs", [
    ((2, 8, 9, 9), (8, 2, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    ((1, 24, 14, 14), (112, 6, 1, 1), {"group": 4}),
    ((1, 12, 10, 11), (6, 4, 3, 3), {"group": 3, "strides": [2, 2], "pads": [0, 1, 2, 1]}),
])
def test_grouped_conv(xs, ws, attrs):
    check("Conv", [rand(*xs), rand(*ws), rand(ws[0])], {**attrs, "kernel_shape": list(ws[2:])})


# ------------------------------------------------------------------------------------------------
# pooling

POOL_CASES = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2]},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [4, 4], "auto_pad": "SAME_LOWER", "strides": [3, 3]},
    {"kernel_shape": [2, 3], "auto_pad": "VALID", "strides": [1, 2]},
    {"kernel_shape": [7, 7], "strides": [1, 1]},
    {"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
]


def _pool_x(attrs, dtype=np.float32):
    return rand(2, 5, 14, 13, dtype=dtype) if len(attrs["kernel_shape"]) == 2 else rand(2, 5, 17, dtype=dtype)


@pytest.mark.parametrize("attrs", POOL_CASES + [{"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1]}])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maxpool(attrs, dtype):
    check("MaxPool", [_pool_x(attrs, dtype)], attrs, const=())


@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_averagepool(attrs, cip, dtype):
    check("AveragePool", [_pool_x(attrs, dtype)], {**attrs, "count_include_pad": cip}, const=())


def test_averagepool_dilations_opset19():
    from onnx.reference import ReferenceEvaluator

    x = rand(1, 2, 9, 9)
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}
    model, feeds = _model("AveragePool", [x], attrs, (), opset=19)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = build("AveragePool", [x], attrs, (), want, opset=19)(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_maxpool_propagates_nan_like_numpy(monkeypatch):
    x = rand(1, 2, 6, 6)
    x[0, 0, 2, 3] = np.nan
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    want = reference("MaxPool", [np.nan_to_num(x)], attrs, ())
    loop = build("MaxPool", [x], attrs, (), want)(x)[0]
    monkeypatch.setenv("GE_CPU_JIT", "0")
    numpy_path = build("MaxPool", [x], attrs, (), want)(x)[0]
    np.testing.assert_array_equal(np.isnan(loop), np.isnan(numpy_path))
    assert np.isnan(loop).any()
    np.testing.assert_array_equal(loop[~np.isnan(loop)], numpy_path[~np.isnan(numpy_path)])


@pytest.mark.parametrize("op,attrs,const", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, ()),  # -inf borders
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, ()),  # zero borders
    ("Conv", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 4}, (1,)),  # depthwise, zero borders
])
def test_the_loops_buffers_kept_with_the_plan_stay_right_from_call_to_call(monkeypatch, op, attrs, const):
    """A layer's bordered buffers are made once (per thread) and reused: every call, with other
    data each time (a NaN in one, large values in another), matches the reference."""
    seen = []
    real = _window.buffers
    monkeypatch.setattr(_window, "buffers", lambda *a: seen.append(real(*a)) or seen[-1])
    monkeypatch.setattr(_window, "_direct", lambda: None)  # the window loop, not the direct kernel
    x0 = rand(2, 4, 9, 9)
    w = rand(4, 1, 3, 3)
    inputs = [x0, w] if op == "Conv" else [x0]
    want0 = reference(op, inputs, attrs, const)
    kernel = build(op, inputs, attrs, const, want0)
    for i in range(4):
        x = rand(2, 4, 9, 9) * (1000.0 if i == 2 else 1.0)
        if i == 1:
            x[0, 1, 0, 0] = np.nan
        args = [x, w] if op == "Conv" else [x]
        want = reference(op, [np.nan_to_num(x) if i == 1 else x] + args[1:], attrs, const)
        got = kernel(*args)[0]
        ok = ~np.isnan(got)
        assert ok.all() if i != 1 else not ok.all()
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-4, atol=1e-3 if i == 2 else 1e-5)
    assert len(seen) == 4 and all(b[0] is seen[0][0] and b[1] is seen[0][1] for b in seen)  # one set, reused


def test_pools_without_the_loops(monkeypatch):
    monkeypatch.setenv("GE_CPU_JIT", "0")
    for attrs in POOL_CASES[:5]:
        check("MaxPool", [_pool_x(attrs)], attrs, const=())
        check("AveragePool", [_pool_x(attrs)], attrs, const=())


def test_maxpool_indices_unchanged():
    x = rand(2, 3, 9, 8)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    model, feeds = _model("MaxPool", [x], attrs, (), n_outputs=2)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    spec = KernelSpec(name="mp", op_type="MaxPool", attrs=attrs, inputs=[TensorType.of(x)],
                      outputs=[TensorType.of(want[0]), TensorType.of(want[1])], const_inputs=[None], opset=17)
    kernel = KERNELS[("", "MaxPool")](spec)
    assert not caps(kernel).accepts_out
    got = kernel(x)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


# ------------------------------------------------------------------------------------------------
# through the whole engine: depthwise Conv + BatchNormalization + Relu becomes a FusedConv


def test_depthwise_block_compiled_model():
    c = 16
    x = rand(2, c, 15, 15)
    inits = [numpy_helper.from_array(rand(c, 1, 3, 3), "w"), numpy_helper.from_array(rand(c), "b"),
             numpy_helper.from_array(rand(c) + 1.5, "scale"), numpy_helper.from_array(rand(c), "shift"),
             numpy_helper.from_array(rand(c), "mean"), numpy_helper.from_array(rand(c) + 1.5, "var"),
             numpy_helper.from_array(rand(c, c // 4, 1, 1), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], group=4, kernel_shape=[1, 1]),
             helper.make_node("MaxPool", ["c2"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c2"], ["ap"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["ap", "w"], ["y2"], group=c, kernel_shape=[3, 3])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("mp", onnx.TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y2", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = ge.compile(model).run({"x": x})
    np.testing.assert_allclose(got["mp"], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["y2"], want[1], rtol=1e-4, atol=1e-5)


def test_kernels_use_the_compiled_loops(monkeypatch):
    calls = []
    real = _window.run

    def counting(kind, *args, **kwargs):
        ok = real(kind, *args, **kwargs)
        calls.append((kind, ok))
        return ok

    monkeypatch.setattr(_window, "run", counting)
    real_direct = _window.DirectConv.run

    def direct(self, *args, **kwargs):  # a depthwise layer of a static shape: its call prepared once
        ok = real_direct(self, *args, **kwargs)
        calls.append(("conv", ok))
        return ok

    monkeypatch.setattr(_window.DirectConv, "run", direct)
    x = rand(1, 4, 8, 8)
    check("Conv", [x, rand(4, 1, 3, 3), rand(4)], {"group": 4, "pads": [1, 1, 1, 1]})
    check("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2]}, const=())
    check("AveragePool", [x], {"kernel_shape": [3, 3], "strides": [2, 2]}, const=())
    check("Conv", [x, rand(4, 2, 3, 3)], {"group": 2})  # grouped, not depthwise: GEMM path
    assert {k for k, ok in calls if ok} == {"conv", "max", "avg"}
    assert len(calls) == 6  # each once without and once with out=
    assert _window.stats()["compiled"] >= 3


def test_window_plans_stay_inside_their_buffer():
    # the loops do not check bounds: every plan of a valid window op must fit its buffer
    # (a plan that does not is refused and the NumPy kernel runs, which would hide a slow path)
    from ge_cpu.kernels.nn import _plan_2d, window_plan

    rng = np.random.default_rng(3)
    for _ in range(2000):
        nd = int(rng.integers(1, 3))
        in_sp = [int(v) for v in rng.integers(1, 20, nd)]
        k = [int(v) for v in rng.integers(1, 6, nd)]
        s = [int(v) for v in rng.integers(1, 4, nd)]
        d = [int(v) for v in rng.integers(1, 3, nd)]
        pads = [int(v) for v in rng.integers(0, 4, 2 * nd)]
        auto_pad = str(rng.choice(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
        ceil_mode = bool(rng.integers(0, 2))
        pb, _, out, _ = window_plan(auto_pad, pads, in_sp, k, s, d, ceil_mode)
        if min(out) <= 0:
            continue
        plan = _plan_2d(in_sp, k, s, d, pb, out)
        assert plan.ok, (in_sp, k, s, d, pads, auto_pad, ceil_mode)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_erf_runs_as_a_compiled_loop_and_matches_double_precision_erf(dtype, monkeypatch):
    import math

    from ge_cpu.kernels import elementwise

    x = (np.random.default_rng(4).standard_normal((64, 300)) * 3).astype(dtype)
    x.flat[:5] = [np.nan, np.inf, -np.inf, 0.0, 1e-30]
    assert elementwise._erf_loop(x.dtype) is not None
    want = np.array([math.erf(v) for v in x.ravel().astype(np.float64)]).reshape(x.shape)
    got = elementwise.erf(x)
    np.testing.assert_allclose(got, want, rtol=4e-7 if dtype == "float32" else 1e-15, atol=2e-7, equal_nan=True)
    monkeypatch.setenv("GE_CPU_JIT", "0")  # the NumPy path agrees
    assert elementwise._erf_loop(x.dtype) is None
    np.testing.assert_allclose(elementwise.erf(x), want, rtol=4e-7, atol=2e-7, equal_nan=True)


@pytest.mark.parametrize("act", ["Relu", "Clip", "Silu", "Sigmoid", "HardSwish", "Gelu", ""])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_depthwise_conv_applies_its_epilogue_as_it_writes_on_every_thread_count(act, dtype, monkeypatch):
    c = 24
    onnx_dt = onnx.TensorProto.FLOAT if dtype == "float32" else onnx.TensorProto.DOUBLE
    x = rand(2, c, 17, 13).astype(dtype)
    inits = [numpy_helper.from_array(rand(c, 1, 3, 3).astype(dtype), "w"), numpy_helper.from_array(rand(c).astype(dtype), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, kernel_shape=[3, 3], pads=[1, 0, 1, 2],
                              strides=[1, 2])]
    if act == "Silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.array(0, dtype), "lo"), numpy_helper.from_array(np.array(0.5, dtype), "hi")]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif act == "Gelu":  # the erf form torch.onnx.export writes
        inits += [numpy_helper.from_array(np.array(np.sqrt(2), dtype), "r2"), numpy_helper.from_array(np.array(1, dtype), "one"),
                  numpy_helper.from_array(np.array(0.5, dtype), "half")]
        nodes += [helper.make_node("Div", ["c", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["c", "e1"], ["p"]),
                  helper.make_node("Mul", ["p", "half"], ["y"])]
    elif act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", onnx_dt, x.shape)],
                              [helper.make_tensor_value_info("y", onnx_dt, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if dtype == "float32":
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    else:  # onnxruntime has no float64 Conv: onnx.reference is the oracle
        from onnx.reference import ReferenceEvaluator

        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    calls: list = []
    real, real_direct = _window.run, _window.DirectConv.run
    monkeypatch.setattr(_window, "run", lambda *a, **k: calls.append(k) or real(*a, **k))

    def direct(self, x, out, threads=1, clip=None, act=None):  # (the layer's call prepared once)
        calls.append({"threads": threads, "clip": clip, "act": act})
        return real_direct(self, x, out, threads, clip, act)

    monkeypatch.setattr(_window.DirectConv, "run", direct)
    one = ge.compile(model, {"threads": 1}).run({"x": x})["y"]
    # (float64: the fused epilogue's HardSwish and erf GELU are float32-accurate today, a known gap)
    tol = 1e-5 if dtype == "float32" or act in ("HardSwish", "Gelu") else 1e-12
    np.testing.assert_allclose(one, want, rtol=tol, atol=tol)
    assert calls and calls[0]["threads"] == 1
    stored = calls[0]["act"] is not None or calls[0]["clip"] is not None
    # at the store: a clip in both dtypes, an activation in float32 (float64 runs it as the epilogue)
    assert stored == (act in ("Relu", "Clip") or (bool(act) and dtype == "float32"))
    two = ge.compile(model, {"threads": 2}).run({"x": x})["y"]
    assert calls[-1]["threads"] == 2
    np.testing.assert_array_equal(two, one)  # the planes are split, not their sums


# ------------------------------------------------------------------------------------------------
# the direct depthwise kernel (float32, AVX-512): the window loop's bits


def test_direct_depthwise_kernel_is_built_where_the_compiler_targets_avx512():
    # the same compiler and flags as GE's GEMM, which says which instruction set it was built for
    from ge_native import sgemm

    assert _window.direct_available() == (sgemm.isa() == "avx512f")


DIRECT_CASES = [
    # (C, mult, H, W, kernel, strides, dilations, pads top/left, out H/W from the bottom/right pads)
    (5, 1, 9, 13, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    (4, 1, 14, 14, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    (3, 2, 7, 40, (3, 3), (2, 2), (1, 1), (0, 0), (0, 1)),
    (3, 1, 23, 37, (3, 3), (1, 1), (1, 1), (0, 2), (2, 0)),  # rows: 8 + 8 + 7, columns: 16 + 16 + 5
    (2, 1, 29, 50, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    (2, 1, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    (2, 1, 4, 3, (3, 3), (1, 1), (1, 1), (2, 2), (2, 2)),  # padding wider than half the kernel
    (6, 1, 11, 17, (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
    (2, 1, 12, 33, (3, 3), (1, 1), (2, 2), (2, 2), (2, 2)),
    (3, 1, 8, 19, (7, 7), (2, 2), (1, 1), (3, 3), (3, 3)),
    (2, 1, 9, 20, (3, 3), (1, 2), (1, 1), (1, 0), (1, 2)),  # strides that differ: the row-a-time form
    (1, 3, 3, 70, (1, 5), (1, 2), (1, 3), (0, 4), (0, 4)),
    (2, 1, 6, 6, (2, 2), (1, 1), (1, 1), (0, 0), (0, 0)),
    (2, 1, 40, 9, (9, 9), (1, 1), (1, 1), (4, 4), (4, 4)),
    # 16 channels to a vector (small planes, kernels over 3x3, stride 2): whole and partial
    # groups of 16, the transposes' 16-pixel tails, padding on every side
    (17, 1, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    (33, 1, 14, 14, (7, 7), (1, 1), (1, 1), (3, 3), (3, 3)),
    (20, 1, 15, 13, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    (18, 1, 10, 12, (5, 5), (1, 1), (2, 2), (4, 4), (4, 4)),
    (16, 1, 30, 31, (3, 3), (2, 2), (1, 1), (0, 0), (1, 1)),
    (16, 2, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),  # a channel multiplier: the plane path
]


def _direct_case(c, mult, h, w, k, s, d, pb, pe):
    oh = (h + pb[0] + pe[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (w + pb[1] + pe[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    return _window.WindowPlan((h, w), k, s, d, pb, (oh, ow)), (oh, ow)


@pytest.mark.parametrize("case", DIRECT_CASES)
def test_direct_depthwise_kernel_gives_the_window_loops_bits_at_every_thread_count(case):
    c, mult, h, w, k, s, d, pb, pe = case
    plan, (oh, ow) = _direct_case(*case)
    assert plan.direct
    x = rand(2, c, h, w)
    x[0, 0, h // 2, w // 2] = np.inf
    x[1, -1, 0, w - 1] = np.nan
    wt, b = rand(c * mult, k[0] * k[1]), rand(c * mult)
    for clip, act in [(None, None), ((0.0, 6.0), None), ((-0.5, 0.5), "silu"), (None, "sigmoid")]:
        loop = np.full((2, c * mult, oh, ow), 7.0, np.float32)
        assert _window.run("conv", plan, x, loop, wt, b, clip=clip, act=act, direct=False)
        for threads in (1, 2, 3):
            got = np.full_like(loop, -7.0)
            assert _window.run("conv", plan, x, got, wt, b, clip=clip, act=act, threads=threads)
            np.testing.assert_array_equal(got, loop)


@pytest.mark.parametrize("case", [DIRECT_CASES[0], DIRECT_CASES[1], DIRECT_CASES[14]])
def test_a_prepared_depthwise_call_gives_the_kernels_bits_and_refuses_other_arrays(case):
    c, mult, h, w, k, s, d, pb, pe = case
    plan, (oh, ow) = _direct_case(*case)
    x = rand(2, c, h, w)
    wt, b = rand(c * mult, k[0] * k[1]), rand(c * mult)
    call = _window.DirectConv(plan, x.shape, (2, c * mult, oh, ow), wt, b)
    want, got = np.empty((2, c * mult, oh, ow), np.float32), np.empty((2, c * mult, oh, ow), np.float32)
    assert _window.run("conv", plan, x, want, wt, b, clip=(0.0, 6.0), act="silu", threads=2)
    # (without AVX-512 the direct kernel is not built: the prepared call declines, the layer's
    # general path runs the window loop)
    assert call.run(x, got, 2, (0.0, 6.0), "silu") == _window.direct_available()
    if _window.direct_available():
        np.testing.assert_array_equal(got, want)
    out = np.full_like(want, 7.0)
    assert not call.run(x[:1], out)  # fewer images than prepared
    assert not call.run(x, out[:, :, :-1])  # a smaller output
    assert not call.run(x, out, act="gelu_erf")
    assert np.all(out == 7.0)
    with pytest.raises(ValueError, match="do not fit"):
        _window.DirectConv(plan, (2, c, h + 1, w), (2, c * mult, oh, ow), wt, b)


def test_direct_depthwise_kernel_keeps_the_padding_taps():
    # an infinite weight on a tap that reads the padding gives NaN there (inf * 0), as the window
    # loop's zero border does (and onnxruntime): the padding's taps are not skipped
    plan, (oh, ow) = _direct_case(3, 1, 6, 6, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    x, wt, b = rand(1, 3, 6, 6), rand(3, 9), rand(3)
    wt[1, 0] = np.inf
    got, loop = np.empty((1, 3, oh, ow), np.float32), np.empty((1, 3, oh, ow), np.float32)
    assert _window.run("conv", plan, x, got, wt, b) and _window.run("conv", plan, x, loop, wt, b, direct=False)
    np.testing.assert_array_equal(got, loop)
    assert np.isnan(got[0, 1, 0, :]).all() and np.isnan(got[0, 1, :, 0]).all()
    assert not np.isnan(got[0, 0]).any()


def test_direct_depthwise_kernel_leaves_other_strides_to_the_window_loop():
    plan, (oh, ow) = _direct_case(2, 1, 12, 12, (3, 3), (3, 3), (1, 1), (1, 1), (1, 1))
    assert not plan.direct
    x, wt, b = rand(1, 2, 12, 12), rand(2, 9), rand(2)
    got, loop = np.empty((1, 2, oh, ow), np.float32), np.empty((1, 2, oh, ow), np.float32)
    assert _window.run("conv", plan, x, got, wt, b) and _window.run("conv", plan, x, loop, wt, b, direct=False)
    np.testing.assert_array_equal(got, loop)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("hw,attrs", [((7, 7), {}), ((5, 9), {}), ((7, 7), {"pads": [1, 1, 1, 1]}),
                                      ((6, 6), {"pads": [0, 0, 1, 1], "count_include_pad": 1})])
def test_averagepool_over_the_whole_plane(dtype, hw, attrs, monkeypatch):
    # a window that is the whole plane (ShuffleNet's closing pool) is a sum per plane; with
    # padding it is not, and the window loop or NumPy's pool runs
    calls = []
    real = _window.run
    monkeypatch.setattr(_window, "run", lambda kind, *a, **k: calls.append(kind) or real(kind, *a, **k))
    k = list(hw) if not attrs.get("pads") else [hw[0] + 1, hw[1] + 1] if attrs["pads"][0] else [hw[0], hw[1]]
    x = rand(2, 19, *hw, dtype=dtype) * 10.0
    check("AveragePool", [x], {"kernel_shape": k, **attrs}, const=())
    assert bool(calls) == bool(attrs.get("pads"))  # (check runs the kernel twice: with and without out=)


# ------------------------------------------------------------------------------------------------
# the fixed C in csrc/window.h, the generated part small; the variants named


def test_window_loop_source_is_a_fixed_header_and_a_small_generated_part():
    from ge_native import native

    for kind in _window.KINDS:
        for taps in (1, 9, None):
            part = _window.checked_source(kind, taps)
            # the copy-in, copy-out, epilogue and checked entry live in csrc/window.h
            assert "win_entry(args, n, " in part and "ge_int" not in part and "EPI_PLANE" not in part
            assert len(part) < 2000
            for dt in _window.DTYPES:
                full = _window.full_source(kind, taps, dt)
                assert full == native.c_source(f"window_{'f32' if dt == 'float32' else 'f64'}.h") + part
                assert "static PyObject *win_entry(" in full and "#include \"" not in full
    # a generic loop is a call of the tap-by-tap form; an unrolled one names every tap
    assert "win_conv_taps(q, buf, tmp, m);" in _window.checked_source("conv", None)
    assert "s8[j]" in _window.checked_source("conv", 9) and "s9" not in _window.checked_source("conv", 9)


def test_window_loops_name_their_variant(monkeypatch):
    from ge_native import isa

    fam = isa.family("depthwise")
    assert fam is _window.FAMILY and fam.fallback == "numpy"
    assert _window.variant() in fam.names() and _window.variant(direct=False) in fam.names()
    assert _window.variant() == ("avx512f" if _window.direct_available() else _window.variant(direct=False))
    # the loops are built here (test_window_loops_are_available): a compiled variant, not NumPy
    assert _window.variant(direct=False) in ("avx512f", "avx2", "scalar")
    assert (_window.variant(direct=False) == "avx512f") == ("avx512f" in isa.features())
    monkeypatch.setenv("GE_CPU_JIT", "0")
    assert _window.variant(direct=False) == "numpy"
