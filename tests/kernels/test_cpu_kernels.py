"""Differential tests of the ge_cpu NumPy kernels against onnxruntime and onnx.reference.

Every case builds a one-node ONNX model with ``onnx.helper``, runs it through a reference
(onnxruntime, onnx.reference.ReferenceEvaluator, or both) and through the kernel built from a
hand-made ``KernelSpec``, and compares values, dtypes and shapes.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ge_core.errors import UnsupportedOpError  # noqa: E402
from ge_core.ir.types import TensorType  # noqa: E402
from ge_core.kernel import KernelSpec  # noqa: E402
from ge_cpu.kernels import KERNELS  # noqa: E402
from tests.conftest import ill_conditioned, with_softmax_logits  # noqa: E402

from ._onnx_ref import make_model  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:  # pragma: no cover
    ort = None

RNG = np.random.default_rng(0)
DEFAULT_OPSET = 17


def rand(*shape, dtype=np.float32, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def _model(op, inputs, attrs, opset, n_outputs, const, domain=""):
    return make_model(op, inputs, attrs, opset, [f"out{j}" for j in range(n_outputs)], const, domain)


def run_reference(op, inputs, attrs, opset, n_outputs, const, which):
    model, feeds = _model(op, inputs, attrs, opset, n_outputs, const)
    results = {}
    if which in ("ort", "both"):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        results["ort"] = sess.run(None, feeds)
    if which in ("onnx", "both"):
        from onnx.reference import ReferenceEvaluator

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results["onnx"] = ReferenceEvaluator(model).run(None, feeds)
    return results


def make_spec(op, inputs, attrs, opset, outputs, const=()):
    return KernelSpec(
        name=f"test_{op}", op_type=op, attrs=dict(attrs),
        inputs=[None if a is None else TensorType.of(a) for a in inputs],
        outputs=[TensorType.of(np.asarray(o)) for o in outputs],
        const_inputs=[a if (i in const and a is not None) else None for i, a in enumerate(inputs)],
        opset=opset,
    )


def run_kernel(op, inputs, attrs, opset, outputs, const=()):
    spec = make_spec(op, inputs, attrs, opset, outputs, const)
    kernel = KERNELS[("", op)](spec)
    return list(kernel(*inputs)), spec


def check(op, inputs, attrs=None, *, opset=DEFAULT_OPSET, n_outputs=1, const=(), ref="ort",
          rtol=1e-4, atol=1e-5, compare=None):
    """Run ``op`` through the reference(s) and the kernel and compare every output."""
    attrs = attrs or {}
    refs = run_reference(op, inputs, attrs, opset, n_outputs, const, ref)
    first = next(iter(refs.values()))
    got, _ = run_kernel(op, inputs, attrs, opset, first, const)
    assert len(got) >= n_outputs
    compare = range(n_outputs) if compare is None else compare
    for name, expected in refs.items():
        for j in compare:
            e = np.asarray(expected[j])
            g = np.asarray(got[j])
            if e.dtype.kind == "U":  # onnx.reference gives str arrays; strings are object here
                e = e.astype(object)
            assert g.dtype == e.dtype, f"{op} output {j}: dtype {g.dtype} != {name} {e.dtype}"
            assert g.shape == e.shape, f"{op} output {j}: shape {g.shape} != {name} {e.shape}"
            if e.dtype == object:
                assert g.tolist() == e.tolist()
            elif np.issubdtype(e.dtype, np.floating):
                np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{op} vs {name}")
            else:
                np.testing.assert_array_equal(g, e, err_msg=f"{op} vs {name}")
    return got


# ------------------------------------------------------------------------------------------------
# Conv


CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),
    ((2, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 10, 11), (6, 4, 3, 3), {"strides": [2, 2], "pads": [1, 0, 2, 1]}),
    ((1, 4, 10, 11), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((1, 4, 12, 12), (4, 4, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 3, 10, 7), (5, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 10, 7), (5, 3, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    ((1, 3, 10, 7), (5, 3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}),
    ((2, 8, 7, 7), (16, 8, 1, 1), {}),
    ((1, 8, 8, 8), (16, 8, 1, 1), {"strides": [2, 2]}),
    ((1, 8, 8, 8), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ((2, 8, 9, 9), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "pads": [0, 1, 1, 0], "dilations": [2, 1]}),
    ((1, 6, 8, 8), (6, 1, 5, 5), {"group": 6, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 8, 8, 8), (8, 4, 1, 1), {"group": 2}),
    ((1, 3, 20), (4, 3, 5), {"strides": [3], "pads": [2, 1]}),
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 1]}),
    ((1, 3, 224 // 8, 224 // 8), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 1, 400), (16, 1, 10), {"strides": [5]}),  # one input channel, one group (wav2vec2's first conv)
    ((2, 1, 9, 9), (4, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("const_w", [True, False])
def test_conv(xs, ws, attrs, bias, const_w):
    x = rand(*xs)
    w = rand(*ws)
    inputs = [x, w] + ([rand(ws[0])] if bias else [])
    const = (1, 2) if const_w else ()
    check("Conv", inputs, {**attrs, "kernel_shape": list(ws[2:])} if const_w else attrs, const=const)


@pytest.mark.parametrize("attrs,xs,ws", [
    ({}, (1, 3, 5, 5), (3, 4, 3, 3)),
    ({"strides": [2, 2]}, (2, 3, 5, 4), (3, 2, 3, 3)),
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, (1, 4, 5, 5), (4, 2, 3, 3)),
    ({"group": 2, "strides": [2, 1]}, (1, 4, 4, 5), (4, 3, 3, 3)),
    ({"dilations": [2, 2]}, (1, 2, 4, 4), (2, 3, 3, 3)),
    ({"strides": [2, 2], "output_shape": [10, 10]}, (1, 2, 5, 5), (2, 3, 3, 3)),
    ({"strides": [2], "pads": [1, 0]}, (1, 2, 7), (2, 3, 4)),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 2, 4, 4), (2, 3, 3, 3)),
])
def test_conv_transpose(attrs, xs, ws):
    inputs = [rand(*xs), rand(*ws), rand(ws[1] * attrs.get("group", 1))]
    check("ConvTranspose", inputs, attrs, const=(1, 2))


# ------------------------------------------------------------------------------------------------
# pooling, LRN, norms


POOL_CASES = [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"kernel_shape": [2, 3], "auto_pad": "VALID", "strides": [1, 2]},
    {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
]


def _pool_input(attrs):
    return rand(2, 3, 11, 10) if len(attrs["kernel_shape"]) == 2 else rand(2, 3, 11)


@pytest.mark.parametrize("attrs", POOL_CASES)
def test_maxpool(attrs):
    check("MaxPool", [_pool_input(attrs)], attrs)


@pytest.mark.parametrize("attrs", [POOL_CASES[1], POOL_CASES[2], POOL_CASES[7],
                                   {**POOL_CASES[1], "storage_order": 1}])
def test_maxpool_indices(attrs):
    check("MaxPool", [_pool_input(attrs)], attrs, n_outputs=2)


@pytest.mark.parametrize("attrs", [a for a in POOL_CASES if "dilations" not in a])
@pytest.mark.parametrize("cip", [0, 1])
def test_averagepool(attrs, cip):
    check("AveragePool", [_pool_input(attrs)], {**attrs, "count_include_pad": cip})


def test_averagepool_dilations_opset19():
    check("AveragePool", [rand(1, 2, 9, 9)], {"kernel_shape": [2, 2], "dilations": [2, 2],
                                              "pads": [1, 1, 1, 1]}, opset=19, ref="onnx")


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(op):
    check(op, [rand(2, 5, 6, 7)])


@pytest.mark.parametrize("shape", [(1, 1152, 7, 7), (2, 24, 112, 112), (3, 4, 9), (1, 3, 2, 3, 4), (1, 5, 1, 1)])
def test_global_average_pool_on_se_block_planes(shape):
    """GlobalAveragePool's sums as dot products with ones: large planes, many channels, 1-D and
    3-D, a 1x1 plane, offset data (a mean of 100 +- 1: the sums' rounding shows). The tolerance
    is the bound of a sum of that many terms in any order (BLAS and the references block their
    sums differently), far under what a wrong axis, count or division would give."""
    count = int(np.prod(shape[2:]))
    check("GlobalAveragePool", [rand(*shape, lo=99.0, hi=101.0)], rtol=count * float(np.finfo(np.float32).eps))
    check("GlobalAveragePool", [rand(*shape, dtype=np.float64)], rtol=1e-12,
          atol=count * float(np.finfo(np.float64).eps), ref="onnx")


@pytest.mark.parametrize("size", [3, 5])
def test_lrn(size):
    check("LRN", [rand(2, 7, 5, 5)], {"size": size, "alpha": 1e-3, "beta": 0.75, "bias": 2.0})
    check("LRN", [rand(1, 6, 4, 4)], {"size": size, "beta": 0.6})


@pytest.mark.parametrize("opset", [9, 15])
@pytest.mark.parametrize("const", [True, False])
def test_batchnorm(opset, const):
    c = 5
    inputs = [rand(2, c, 4, 3), rand(c), rand(c), rand(c), rand(c, lo=0.5, hi=2.0)]
    check("BatchNormalization", inputs, {"epsilon": 1e-3}, opset=opset,
          const=(1, 2, 3, 4) if const else ())


def test_instance_and_layer_norm():
    check("InstanceNormalization", [rand(2, 3, 4, 5), rand(3), rand(3)], {"epsilon": 1e-4})
    check("LayerNormalization", [rand(2, 3, 8), rand(8), rand(8)], {}, n_outputs=3)
    check("LayerNormalization", [rand(2, 3, 8), rand(3, 8), rand(3, 8)], {"axis": 1})
    check("MeanVarianceNormalization", [rand(2, 3, 4, 5)])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(11, None), (11, 0), (11, 2), (11, -1), (13, None),
                                        (13, 1), (13, 0), (13, -2)])
def test_softmax(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(op, [rand(2, 3, 4, lo=-3, hi=3)], attrs, opset=opset)


@pytest.mark.parametrize("opset", [7, 10, 12, 13])
@pytest.mark.parametrize("mask", [False, True])
def test_dropout(opset, mask):
    # Before opset 12 onnxruntime returns an all-zero mask in inference, onnx.reference an
    # all-True bool one; the spec says the mask marks kept elements, so we return ones (of the
    # input type before opset 10, bool from 10 on) and compare only the data output there.
    legacy = opset < 12
    got = check("Dropout", [rand(3, 4)], {}, opset=opset, n_outputs=2 if mask else 1,
                compare=[0] if legacy else None)
    if mask:
        assert got[1].dtype == (np.float32 if opset < 10 else np.bool_)
        assert np.all(got[1])


def test_dropout_ratio_input():
    check("Dropout", [rand(3, 4), np.array(0.3, np.float32)], {}, opset=13, n_outputs=2,
          const=(1,))


# ------------------------------------------------------------------------------------------------
# matmul family


@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 5), ()])
@pytest.mark.parametrize("const", [True, False])
def test_gemm(ta, tb, c_shape, const):
    a = rand(*((4, 3) if ta else (3, 4)))
    b = rand(*((5, 4) if tb else (4, 5)))
    inputs = [a, b] + ([] if c_shape is None else [rand(*c_shape)])
    check("Gemm", inputs, {"transA": ta, "transB": tb, "alpha": 0.5, "beta": 2.0},
          const=(1, 2) if const else ())


def test_gemm_defaults():
    check("Gemm", [rand(3, 4), rand(4, 5), rand(5)], {}, const=(1, 2))
    check("Gemm", [rand(3, 4), rand(4, 5)], {"alpha": 3.0})


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)),
                                    ((2, 3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(sa, sb):
    check("MatMul", [rand(*sa), rand(*sb)])


@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
                                       ("ii->i", [(4, 4)]), ("ij->ji", [(3, 4)]),
                                       ("...ij,...jk", [(2, 3, 4), (2, 4, 2)])])
def test_einsum(eq, shapes):
    check("Einsum", [rand(*s) for s in shapes], {"equation": eq})


# ------------------------------------------------------------------------------------------------
# element-wise


BINARY = ["Add", "Sub", "Mul", "Div"]


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("sa,sb", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,))])
def test_binary_float(op, sa, sb):
    check(op, [rand(*sa), rand(*sb, lo=0.5, hi=2.0)])


@pytest.mark.parametrize("op", BINARY + ["Mod"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_binary_int(op, dtype):
    a = RNG.integers(-20, 20, size=(3, 5)).astype(dtype)
    b = RNG.integers(1, 7, size=(3, 5)).astype(dtype) * np.where(RNG.random((3, 5)) < 0.5, -1, 1).astype(dtype)
    check(op, [a, b])


def test_mod_fmod():
    a = rand(4, 5, lo=-5, hi=5)
    b = rand(4, 5, lo=0.5, hi=2)
    check("Mod", [a, b], {"fmod": 1})
    check("Mod", [a.astype(np.int32) , (b * 3).astype(np.int32) + 1], {"fmod": 1})


def test_legacy_broadcast_add():
    # neither onnxruntime nor onnx.reference implement Add-6 any more: compare with NumPy
    a, b = rand(2, 3, 4, 5), rand(3, 4)
    got, _ = run_kernel("Add", [a, b], {"broadcast": 1, "axis": 1}, 6, [a])
    np.testing.assert_allclose(got[0], a + b[None, :, :, None], rtol=1e-6)
    got, _ = run_kernel("Mul", [a, b[:, 0]], {"broadcast": 1, "axis": -3}, 6, [a])
    np.testing.assert_allclose(got[0], a * b[None, :, 0, None, None], rtol=1e-6)


def test_pow():
    check("Pow", [rand(3, 4, lo=0.1, hi=2), rand(3, 4)])
    check("Pow", [rand(3, 4, lo=0.1, hi=2), np.array(2.0, np.float32)])
    check("Pow", [rand(3, 4, lo=0.1, hi=2), np.array(3, np.int64)])
    check("Pow", [RNG.integers(0, 5, (3, 4)).astype(np.int64), np.array(2, np.int64)])


UNARY = [
    ("Relu", {}, -2, 2), ("Abs", {}, -2, 2), ("Neg", {}, -2, 2), ("Reciprocal", {}, 0.5, 2),
    ("Floor", {}, -3, 3), ("Ceil", {}, -3, 3), ("Round", {}, -3, 3), ("Sign", {}, -2, 2),
    ("Sqrt", {}, 0.1, 4), ("Exp", {}, -3, 3), ("Log", {}, 0.1, 4), ("Sigmoid", {}, -8, 8),
    ("Tanh", {}, -3, 3), ("Erf", {}, -3, 3), ("Softplus", {}, -5, 5), ("Softsign", {}, -5, 5),
    ("Mish", {}, -5, 5), ("HardSwish", {}, -5, 5), ("Sin", {}, -3, 3), ("Cos", {}, -3, 3),
    ("Tan", {}, -1, 1), ("Asin", {}, -0.9, 0.9), ("Acos", {}, -0.9, 0.9), ("Atan", {}, -3, 3),
    ("Sinh", {}, -3, 3), ("Cosh", {}, -3, 3), ("Asinh", {}, -3, 3), ("Acosh", {}, 1.1, 4),
    ("Atanh", {}, -0.9, 0.9),
    ("LeakyRelu", {}, -2, 2), ("LeakyRelu", {"alpha": 0.2}, -2, 2),
    ("Elu", {}, -2, 2), ("Elu", {"alpha": 0.5}, -2, 2), ("Selu", {}, -2, 2),
    ("Selu", {"alpha": 1.5, "gamma": 2.0}, -2, 2), ("Celu", {"alpha": 2.0}, -2, 2),
    ("HardSigmoid", {}, -4, 4), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, -4, 4),
    ("ThresholdedRelu", {"alpha": 0.5}, -2, 2), ("Shrink", {"lambd": 0.6, "bias": 0.2}, -2, 2),
]


@pytest.mark.parametrize("op,attrs,lo,hi", UNARY, ids=[f"{u[0]}-{i}" for i, u in enumerate(UNARY)])
def test_unary(op, attrs, lo, hi):
    x = rand(3, 17, lo=lo, hi=hi)
    if op == "Round":
        x[0, :4] = [0.5, 1.5, -2.5, 2.5]
    check(op, [x], attrs, opset=18 if op == "Mish" else DEFAULT_OPSET)


def test_unary_float64_and_erf_tiny():
    import math

    x64 = rand(4, 5, lo=-3, hi=3, dtype=np.float64)
    got, _ = run_kernel("Erf", [x64], {}, 13, [x64])
    assert got[0].dtype == np.float64
    np.testing.assert_allclose(got[0], [[math.erf(v) for v in row] for row in x64], rtol=1e-14)
    check("Erf", [np.array([1e-8, -1e-6, 0.0, 0.49, 0.51, 6.0, -7.0], np.float32)], rtol=1e-5, atol=1e-7)
    check("Sigmoid", [np.array([-100.0, 100.0, 0.0], np.float32)])


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    check("Gelu", [rand(4, 9, lo=-4, hi=4)], {"approximate": approx}, opset=20, ref="onnx")


def test_prelu():
    check("PRelu", [rand(2, 3, 4, 4), rand(3, 1, 1)])
    check("PRelu", [rand(2, 3, 4, 4), rand(4)])


@pytest.mark.parametrize("opset", [6, 11, 13])
def test_clip(opset):
    x = rand(3, 4, lo=-3, hi=3)
    if opset < 11:
        check("Clip", [x], {"min": -0.5, "max": 1.0}, opset=opset)
        check("Clip", [x], {"min": -0.5}, opset=opset)
    else:
        check("Clip", [x, np.array(-0.5, np.float32), np.array(1.0, np.float32)], opset=opset)
        check("Clip", [x, None, np.array(1.0, np.float32)], opset=opset)
        check("Clip", [x], opset=opset)
        check("Clip", [x, np.array(-1.0, np.float32)], opset=opset, const=(1,))


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op):
    a = RNG.integers(0, 3, (3, 4)).astype(np.float32)
    b = RNG.integers(0, 3, (4,)).astype(np.float32)
    check(op, [a, b])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check(op, [RNG.random((3, 4)) < 0.5, RNG.random((1, 4)) < 0.5])
    check("Not", [RNG.random((3, 4)) < 0.5])


def test_where_isnan_isinf_bitshift():
    check("Where", [RNG.random((3, 4)) < 0.5, rand(3, 4), rand(4)])
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    check("IsNaN", [x])
    check("IsInf", [x])
    check("IsInf", [x], {"detect_negative": 0})
    check("IsInf", [x], {"detect_positive": 0})
    check("BitShift", [np.array([1, 2, 8], np.uint32), np.array([1, 2, 3], np.uint32)], {"direction": "LEFT"})
    check("BitShift", [np.array([16, 255, 8], np.uint8), np.array([1, 2, 3], np.uint8)], {"direction": "RIGHT"})


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
def test_variadic(op):
    check(op, [rand(3, 4), rand(4), rand(1, 4)])
    check(op, [rand(3, 4)])


@pytest.mark.parametrize("to,src", [(1, np.int64), (7, np.float32), (6, np.float32), (9, np.float32),
                                    (10, np.float32), (11, np.float32), (2, np.int32), (1, np.bool_)])
def test_cast(to, src):
    x = (rand(3, 5, lo=-5, hi=5) if src != np.bool_ else RNG.random((3, 5)) < 0.5).astype(src)
    if to == 2:
        x = np.abs(x)
    check("Cast", [x], {"to": to})
    check("CastLike", [x, np.zeros(1, helper.tensor_dtype_to_np_dtype(to))], opset=15)


def test_cast_strings():
    check("Cast", [np.array([1.5, -2.0, 1e-3, np.nan, np.inf, -np.inf, 1e20], np.float32)], {"to": 8})
    check("Cast", [np.array([1, -2], np.int64)], {"to": 8})
    check("Cast", [np.array(["1.5", "-2", "3e2"], dtype=object)], {"to": 1})
    check("Cast", [np.array(["7", "-2"], dtype=object)], {"to": 7})


# ------------------------------------------------------------------------------------------------
# shape / movement


@pytest.mark.parametrize("in_shape,shape,allowzero", [((2, 3, 4), [4, 6], 0), ((2, 3, 4), [0, -1], 0),
                                                      ((2, 3, 4), [-1], 0), ((2, 3, 4), [2, 0, 2, 2], 0),
                                                      ((2, 0, 4), [0, 4], 1), ((2, 3, 4), [4, -1, 2], 1)])
@pytest.mark.parametrize("const", [True, False])
def test_reshape(in_shape, shape, allowzero, const):
    check("Reshape", [rand(*in_shape), np.array(shape, np.int64)], {"allowzero": allowzero},
          opset=14, const=(1,) if const else ())


def test_reshape_opset1_style():
    got, _ = run_kernel("Reshape", [rand(2, 3, 4)], {"shape": [0, -1]}, 1, [np.zeros((2, 12), np.float32)])
    assert got[0].shape == (2, 12)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, 3])
def test_flatten(axis):
    check("Flatten", [rand(2, 3, 4)] if axis != 3 else [rand(2, 3, 4, 1)], {"axis": axis})


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [1, -1], [-1], [0, 2, 4]])
def test_unsqueeze(opset, axes):
    x = rand(3, 4)
    if opset < 13:
        check("Unsqueeze", [x], {"axes": axes}, opset=opset)
    else:
        check("Unsqueeze", [x, np.array(axes, np.int64)], opset=opset, const=(1,))
        check("Unsqueeze", [x, np.array(axes, np.int64)], opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [None, [0], [0, -1]])
def test_squeeze(opset, axes):
    x = rand(1, 3, 1)
    if axes is None:
        check("Squeeze", [x], opset=opset)
    elif opset < 13:
        check("Squeeze", [x], {"axes": axes}, opset=opset)
    else:
        check("Squeeze", [x, np.array(axes, np.int64)], opset=opset, const=(1,))


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    check("Transpose", [rand(2, 3, 4)], {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    check("Concat", [rand(2, 3, 4), rand(2, 3, 4), rand(2, 3, 4)], {"axis": axis})


def test_identity_constant_of_shape():
    check("Identity", [rand(3, 4)])
    check("ConstantOfShape", [np.array([2, 3], np.int64)])
    check("ConstantOfShape", [np.array([2, 3], np.int64)], {"value": np.array([7], np.int64)})
    check("ConstantOfShape", [np.array([4], np.int64)], {"value": np.array([1.5], np.float32)})


@pytest.mark.parametrize("attrs", [
    {"value": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"value_float": 2.5},
    {"value_floats": [1.0, 2.0]}, {"value_int": 3}, {"value_ints": [1, 2, 3]},
    {"value_string": "hi"}, {"value_strings": ["a", "bc"]},
])
def test_constant(attrs):
    check("Constant", [], attrs, ref="onnx")


@pytest.mark.parametrize("opset,split,n", [(11, None, 3), (11, [1, 2, 3], 3), (13, [2, 4], 2),
                                          (13, None, 2), (18, None, 4)])
def test_split(opset, split, n):
    x = rand(2, 6, 3) if opset < 18 else rand(2, 7, 3)
    attrs = {"axis": 1}
    inputs = [x]
    if opset >= 18:
        attrs["num_outputs"] = n
    if split is not None:
        if opset < 13:
            attrs["split"] = split
        else:
            inputs.append(np.array(split, np.int64))
    check("Split", inputs, attrs, opset=opset, n_outputs=n)


SLICE_CASES = [
    ([0], [2], None, None), ([1, 0], [-1, 100], [1, 2], None), ([-3], [-1], [2], None),
    ([5], [0], [1], [-1]), ([-1], [-1000], [1], [-2]), ([0, 0], [3, 4], [0, 2], [2, 3]),
    ([100], [-100], [0], [-1]), ([2], [1000], [-1], [1]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICE_CASES)
@pytest.mark.parametrize("const", [True, False])
def test_slice(starts, ends, axes, steps, const):
    x = rand(4, 6, 5)
    inputs = [x, np.array(starts, np.int64), np.array(ends, np.int64)]
    if axes is not None:
        inputs.append(np.array(axes, np.int64))
    if steps is not None:
        inputs.append(np.array(steps, np.int64))
    check("Slice", inputs, opset=13, const=(1, 2, 3, 4) if const else ())


def test_slice_opset1():
    check("Slice", [rand(4, 6)], {"starts": [1, -3], "ends": [3, 100], "axes": [0, 1]}, opset=9)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    x = rand(4, 5, 6)
    idx = np.array([[0, -1], [2, 1]], np.int64)
    check("Gather", [x, idx], {"axis": axis})
    check("Gather", [x, np.array(2, np.int32)], {"axis": axis})


def test_gather_elements_nd_scatter():
    x = rand(3, 4)
    check("GatherElements", [x, np.array([[0, -1], [2, 1], [1, 1]], np.int64)], {"axis": 1})
    check("GatherElements", [x, np.array([[0, 2, 1, 0]], np.int64)], {"axis": 0})
    x3 = rand(2, 3, 4)
    check("GatherND", [x3, np.array([[0, 1], [1, 2]], np.int64)])
    check("GatherND", [x3, np.array([[1], [0]], np.int64)], {"batch_dims": 1})
    check("ScatterND", [x3, np.array([[0, 1], [1, 2]], np.int64), rand(2, 4)])
    check("ScatterElements", [x, np.array([[0, 2], [3, 1]], np.int64), rand(2, 2)], {"axis": 1})
    check("ScatterElements", [x, np.array([[0, 2], [3, 0]], np.int64), rand(2, 2)],
          {"axis": 1, "reduction": "add"}, opset=18)


def test_expand_tile_shape_size():
    check("Expand", [rand(3, 1), np.array([2, 3, 4], np.int64)])
    check("Expand", [rand(3, 4), np.array([1, 1], np.int64)])
    check("Tile", [rand(2, 3), np.array([2, 3], np.int64)])
    check("Shape", [rand(2, 3, 4)])
    check("Shape", [rand(2, 3, 4)], {"start": 1}, opset=15)
    check("Shape", [rand(2, 3, 4)], {"start": -2, "end": -1}, opset=15)
    check("Size", [rand(2, 3, 4)])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = rand(2, 3, 4, 5)
    pads = np.array([0, 1, 2, 1, 0, 2, 1, 2], np.int64)
    opset = 19 if mode == "wrap" else 13
    ref = "onnx" if mode == "wrap" else "ort"
    check("Pad", [x, pads, np.array(1.5, np.float32)] if mode == "constant" else [x, pads],
          {"mode": mode}, opset=opset, ref=ref)
    if mode == "constant":
        check("Pad", [x, np.array([0, -1, 1, 0, 0, 1, -1, 2], np.int64)], {"mode": mode}, opset=13)
        check("Pad", [x], {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "value": 2.0}, opset=2)
        check("Pad", [x, np.array([1, 2, 1, 0], np.int64), None, np.array([1, -1], np.int64)],
              {"mode": mode}, opset=18, ref="onnx")


def test_range():
    check("Range", [np.array(1, np.int64), np.array(10, np.int64), np.array(3, np.int64)])
    check("Range", [np.array(0.5, np.float32), np.array(-2, np.float32), np.array(-0.7, np.float32)])
    check("Range", [np.array(5, np.int32), np.array(1, np.int32), np.array(1, np.int32)])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    check("DepthToSpace", [rand(2, 8, 3, 4)], {"blocksize": 2, "mode": mode})
    check("SpaceToDepth", [rand(2, 3, 4, 6)], {"blocksize": 2})


def test_nonzero_onehot_trilu_cumsum():
    check("NonZero", [np.array([[1, 0, 2], [0, 0, 3]], np.float32)])
    check("OneHot", [np.array([[0, 2], [-1, 5]], np.int64), np.array(4, np.int64),
                     np.array([0.0, 1.0], np.float32)])
    check("OneHot", [np.array([1, 3], np.int32), np.array(5, np.int64),
                     np.array([2, 7], np.int64)], {"axis": 0}, ref="onnx")
    x = rand(2, 4, 5)
    check("Trilu", [x])
    check("Trilu", [x, np.array(1, np.int64)], {"upper": 0})
    check("Trilu", [x, np.array(-2, np.int64)])
    for ex in (0, 1):
        for rev in (0, 1):
            check("CumSum", [x, np.array(1, np.int64)], {"exclusive": ex, "reverse": rev})
    check("CumSum", [np.arange(6, dtype=np.int64).reshape(2, 3), np.array(-1, np.int32)])


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0])
def test_topk(largest, axis):
    x = RNG.integers(0, 5, (6, 7)).astype(np.float32)  # ties: smaller index first
    check("TopK", [x, np.array([3], np.int64)], {"largest": largest, "axis": axis}, n_outputs=2)


# ------------------------------------------------------------------------------------------------
# reductions


REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([1], 0), ([0, -1], 1), ([], 0)])
@pytest.mark.parametrize("opset", [11, 18])
def test_reduce(op, axes, keepdims, opset):
    x = rand(2, 3, 4, lo=0.5, hi=1.5)
    attrs = {"keepdims": keepdims}
    inputs = [x]
    input_axes = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    if axes is not None:
        if input_axes:
            inputs.append(np.array(axes, np.int64))
        elif axes:
            attrs["axes"] = axes
    check(op, inputs, attrs, opset=opset, const=(1,))


def test_reduce_noop_and_dynamic_axes():
    x = rand(2, 3, 4)
    check("ReduceSum", [x, np.array([], np.int64)], {"noop_with_empty_axes": 1}, opset=13, const=(1,))
    check("ReduceMean", [x, np.array([-1], np.int64)], {}, opset=18)
    check("ReduceSum", [x.astype(np.int64), np.array([1], np.int64)], {"keepdims": 0}, opset=13)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1, "select_last_index": 1}])
def test_argmax(op, attrs):
    check(op, [RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)], attrs)


# ------------------------------------------------------------------------------------------------
# Resize / Upsample


RESIZE_CASES = [
    ("nearest", "asymmetric", "floor", [1, 1, 2, 2]),
    ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 1.5, 0.6]),
    ("nearest", "align_corners", "round_prefer_ceil", [1, 1, 2.5, 1.7]),
    ("nearest", "tf_half_pixel_for_nn", "ceil", [1, 1, 0.5, 3]),
    ("linear", "half_pixel", "round_prefer_floor", [1, 1, 2, 2]),
    ("linear", "asymmetric", "round_prefer_floor", [1, 1, 1.5, 0.6]),
    ("linear", "align_corners", "round_prefer_floor", [1, 1, 2.5, 1.7]),
    ("linear", "pytorch_half_pixel", "round_prefer_floor", [1, 1, 0.5, 3]),
    ("cubic", "half_pixel", "round_prefer_floor", [1, 1, 2, 1.5]),
    ("cubic", "align_corners", "round_prefer_floor", [1, 1, 0.6, 1.0]),
]


@pytest.mark.parametrize("mode,coord,nearest,scales", RESIZE_CASES)
def test_resize_scales(mode, coord, nearest, scales):
    x = rand(2, 3, 5, 6)
    # align_corners with a scale that does not give a whole output length: the ONNX spec (and
    # its conformance cases) divide by the unrounded length in * scale - 1; onnxruntime by
    # out - 1. The spec wins.
    ragged = coord == "align_corners" and any(int(d * s) != d * s for d, s in zip(x.shape, scales))
    check("Resize", [x, None, np.array(scales, np.float32)],
          {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest},
          opset=13, const=(2,), ref="onnx" if ragged else "ort")


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_sizes(mode):
    x = rand(1, 2, 4, 5)
    check("Resize", [x, np.array([], np.float32), np.array([], np.float32), np.array([1, 2, 7, 3], np.int64)],
          {"mode": mode}, opset=11)
    check("Resize", [x, None, None, np.array([7, 8], np.int64)],
          {"mode": mode, "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, opset=18, ref="onnx")
    check("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)],
          {"mode": mode, "exclude_outside": 1, "coordinate_transformation_mode": "half_pixel_symmetric"},
          opset=19, ref="onnx")


def test_resize10_and_upsample():
    x = rand(1, 2, 3, 4)
    check("Resize", [x, np.array([1, 1, 2, 3], np.float32)], {"mode": "nearest"}, opset=10)
    check("Resize", [x, np.array([1, 1, 2, 1.5], np.float32)], {"mode": "linear"}, opset=10)
    check("Upsample", [x, np.array([1, 1, 2, 2], np.float32)], {"mode": "nearest"}, opset=9)
    check("Upsample", [x, np.array([1, 1, 2, 2], np.float32)], {"mode": "linear"}, opset=9)
    check("Upsample", [x], {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 3.0]}, opset=7)


# ------------------------------------------------------------------------------------------------
# errors and registry


@pytest.mark.parametrize("op,attrs,opset", [
    ("Conv", {"auto_pad": "BOGUS"}, 17),
    ("BatchNormalization", {"training_mode": 1}, 15),
    ("Resize", {"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize"}, 13),
    ("Resize", {"mode": "linear", "antialias": 1}, 18),
    ("Pad", {"mode": "mirror"}, 13),
    ("Gelu", {"approximate": "fast"}, 20),
    ("Mod", {"fmod": 0}, 13),
    ("Cast", {"to": 999}, 13),
])
def test_unsupported_attribute_raises(op, attrs, opset):
    spec = KernelSpec(name="bad", op_type=op, attrs=attrs, opset=opset,
                      inputs=[TensorType(np.float32, (1, 2, 3, 3)), TensorType(np.float32, (2, 2, 1, 1))],
                      outputs=[TensorType(np.float32)], const_inputs=[None, None])
    with pytest.raises(UnsupportedOpError, match="bad"):
        KERNELS[("", op)](spec)


def test_registry_shape():
    assert all(isinstance(k, tuple) and len(k) == 2 and k[0] == "" for k in KERNELS)
    assert all(callable(f) for f in KERNELS.values())
    for op in ["Conv", "Relu", "LRN", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
               "Reshape", "Gemm", "Dropout", "Softmax", "BatchNormalization", "Unsqueeze", "Mul",
               "Add", "Sub", "Div", "Concat", "Sum", "Transpose", "ConstantOfShape", "Flatten",
               "Identity", "Constant"]:
        assert ("", op) in KERNELS, op


def test_float32_is_kept():
    """No silent float64 promotion through python scalars in attributes."""
    x = rand(2, 3, 4, 4)
    for op, attrs in [("LeakyRelu", {"alpha": 0.1}), ("Elu", {}), ("HardSigmoid", {}), ("Selu", {}),
                      ("LRN", {"size": 3}), ("Softmax", {}), ("Sigmoid", {}), ("Gelu", {})]:
        got, _ = run_kernel(op, [x], attrs, 20, [x])
        assert got[0].dtype == np.float32, op


# ------------------------------------------------------------------------------------------------
# onnx.reference fallback


@pytest.mark.parametrize("op,inputs,attrs,n_out", [
    ("LpNormalization", [rand(3, 4)], {"axis": 1, "p": 2}, 1),
    ("ReverseSequence", [rand(4, 3), np.array([4, 2, 1], np.int64)], {"batch_axis": 1, "time_axis": 0}, 1),
    ("Det", [rand(2, 3, 3)], {}, 1),
    ("Compress", [rand(3, 4), np.array([True, False, True])], {"axis": 0}, 1),
    ("Relu", [rand(3, 4)], {}, 1),
])
def test_reference_fallback(op, inputs, attrs, n_out):
    from ge_cpu.kernels.reference_fallback import fallback_op_types, reference_factory

    refs = run_reference(op, inputs, attrs, DEFAULT_OPSET, n_out, (), "ort")["ort"]
    spec = make_spec(op, inputs, attrs, DEFAULT_OPSET, refs)
    got = reference_factory(spec)(*inputs)
    for g, e in zip(got, refs):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    ops = fallback_op_types()
    assert "Conv" not in ops and "Det" in ops


def test_reference_fallback_unknown_op():
    from ge_cpu.kernels.reference_fallback import reference_factory

    spec = make_spec("NoSuchOp", [rand(2)], {}, DEFAULT_OPSET, [rand(2)])
    with pytest.raises(UnsupportedOpError):
        reference_factory(spec)


# ------------------------------------------------------------------------------------------------
# ONNX's nine 'light' model-zoo models, node by node through the kernels: a tiny sequential
# interpreter (no core involved) compared with the expected output that ships with onnx
# (onnx.reference on the backend suite's deterministic dummy input).

import os  # noqa: E402
import time  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
          "shufflenet", "squeezenet", "vgg19", "zfnet512"]
TOL = {"densenet121": 2e-3}


def _attr_value(a):
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v


def dummy_input(vi):
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def run_model(model, feeds):
    opset = {o.domain: o.version for o in model.opset_import}[""]
    env = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    consts = set(env)
    env.update(feeds)
    for node in model.graph.node:
        ins = [env[n] if n else None for n in node.input]
        spec = KernelSpec(
            name=node.name or node.output[0], op_type=node.op_type,
            attrs={a.name: _attr_value(a) for a in node.attribute},
            inputs=[None if x is None else TensorType.of(x) for x in ins],
            outputs=[TensorType(None) for _ in node.output],
            const_inputs=[env[n] if n in consts else None for n in node.input],
            opset=opset,
        )
        outs = KERNELS[(node.domain, node.op_type)](spec)(*ins)
        for name, value in zip(node.output, outs):
            if name:
                env[name] = value
        if node.op_type == "ConstantOfShape" and all(n in consts for n in node.input):
            consts.update(node.output)
    return [env[o.name] for o in model.graph.output]


@pytest.mark.parametrize("name", MODELS)
def test_light_model(name):
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    inits = {i.name for i in model.graph.initializer}
    feeds = {i.name: dummy_input(i) for i in model.graph.input if i.name not in inits}
    t0 = time.perf_counter()
    got = run_model(model, feeds)
    elapsed = time.perf_counter() - t0
    expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    assert got[0].dtype == expected.dtype and got[0].shape == expected.shape
    assert elapsed < 30, f"{name} took {elapsed:.1f}s"
    with_logits = with_softmax_logits(model)
    if with_logits is not None:
        import onnxruntime as ort

        logits = run_model(with_logits, feeds)[-1]
        want = ort.InferenceSession(with_logits.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[-1]
        if ill_conditioned(want):  # rounding decides this softmax: compare the logits at their scale
            np.testing.assert_allclose(logits, want, rtol=1e-4, atol=0, err_msg=f"{name}: logits")
            np.testing.assert_allclose(got[0].sum(), 1.0, rtol=1e-4)
            return
    np.testing.assert_allclose(got[0], expected, rtol=TOL.get(name, 1e-3), atol=1e-7)


@pytest.mark.parametrize("op,attrs,lo,hi", UNARY, ids=[f"{u[0]}-{i}" for i, u in enumerate(UNARY)])
def test_unary_scalar_input(op, attrs, lo, hi):
    x = np.array((lo + hi) / 3, np.float32)
    got, _ = run_kernel(op, [x], attrs, 18, [x])
    assert type(got[0]) is np.ndarray and got[0].shape == () and got[0].dtype == np.float32


def test_scalar_binary_and_logic():
    a, b = np.array(2.0, np.float32), np.array(3.0, np.float32)
    for op in ["Add", "Mul", "Div", "Pow", "Max", "Sum", "Equal", "Less"]:
        got, _ = run_kernel(op, [a, b], {}, 17, [a])
        assert type(got[0]) is np.ndarray and got[0].shape == (), op
    got, _ = run_kernel("Not", [np.array(True)], {}, 17, [np.array(True)])
    assert type(got[0]) is np.ndarray


@pytest.mark.parametrize("xs,ws,attrs", [CONV_CASES[1], CONV_CASES[3], CONV_CASES[16]])
def test_conv_blocked_im2col(monkeypatch, xs, ws, attrs):
    """The row-blocked im2col path (used for very large column matrices) gives the same result."""
    from ge_cpu.kernels.conv import im2col

    monkeypatch.setattr(im2col, "COLS_BLOCK", 64)
    check("Conv", [rand(*xs), rand(*ws), rand(ws[0])], attrs, const=(1, 2))


@pytest.mark.parametrize("shape", [(2, 8, 50, 50), (1, 128, 3199), (1, 3, 7)])
def test_instance_norm_native_rows_match_onnxruntime_at_every_width(shape):
    import onnxruntime as ort

    import ge_core as ge

    rng = np.random.default_rng(5)
    c = shape[1]
    g = helper.make_graph(
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)], "inorm",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "s"),
         numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    outs = [ge.compile(ge.load(model), {"threads": t}).run({"x": x})["y"] for t in (1, 2)]
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(outs[1], outs[0])  # rows are tasks: the bits do not depend on the width
