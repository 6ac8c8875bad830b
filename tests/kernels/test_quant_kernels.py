"""Quantization kernels (plugins/ge_cpu/kernels/quant.py) against onnxruntime, and against
onnx.reference for the types and opsets onnxruntime lacks (int2/uint2, float4, precision).
Integer results must match exactly (rounding half to even, saturation)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ge_core.errors import UnsupportedOpError
from ge_core.kernel import caps
from ge_native import native

from ._onnx_ref import build_kernel, check, make_model, run_kernel, run_ort

R = np.random.default_rng(7)


def _cpu_has_vnni() -> bool:
    """Whether onnxruntime's u8 x s8 GEMM is exact here: with VNNI it sums the products in int32;
    without (AVX2 alone, AMD Zen 3) MLAS pairs them with vpmaddubsw, whose int16 sum saturates on
    full-range operands (seen: 7 of 20 outputs off by up to 19749)."""
    flags = native.cpu_flags()
    return bool({"avx512_vnni", "avx_vnni"} & flags) if flags is not None else True


def _x(shape, lo=-6.0, hi=6.0, dtype=np.float32):
    x = R.uniform(lo, hi, shape).astype(dtype)
    flat = x.reshape(-1)
    # exact ties (k + 0.5) * scale with the scales used below, and far out-of-range values
    flat[: min(8, flat.size)] = (np.arange(min(8, flat.size)) - 4 + 0.5) * 0.5
    if flat.size > 10:
        flat[8:10] = [1e4, -1e4]
    return x


def _zp(dtype, shape=()):
    lo, hi = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
              "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3), "int2": (-2, 1)}[np.dtype(dtype).name]
    lo, hi = max(lo, -5), min(hi, 5) if hi > 10 else hi
    return R.integers(lo, hi + 1, shape).astype(np.int64).astype(dtype)


# ------------------------------------------------------------------------------------------------
# QuantizeLinear


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("zp_dtype", [None, np.uint8, np.int8])
@pytest.mark.parametrize("const", [True, False])
def test_quantize_per_tensor(opset, zp_dtype, const):
    x = _x((3, 4, 5))
    ins = [x, np.array(0.5, np.float32)] + ([np.array(3, zp_dtype)] if zp_dtype else [])
    check("QuantizeLinear", ins, opset=opset, const=(1, 2) if const else ())


@pytest.mark.parametrize("opset", [13, 19, 21])
@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8])
def test_quantize_per_axis(opset, axis, zp_dtype):
    x = _x((3, 4, 5))
    n = x.shape[axis]
    scale = R.uniform(0.2, 1.0, n).astype(np.float32)
    scale[0] = 0.5
    check("QuantizeLinear", [x, scale, _zp(zp_dtype, n)], {"axis": axis}, opset=opset)


@pytest.mark.parametrize("axis,block", [(0, 2), (1, 2), (1, 3), (-1, 4), (2, 5)])
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.int16])
@pytest.mark.parametrize("const", [True, False])
def test_quantize_blocked(axis, block, zp_dtype, const):
    x = _x((4, 6, 10))
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    scale = R.uniform(0.2, 1.0, shape).astype(np.float32)
    ins = [x, scale, _zp(zp_dtype, shape)]
    check("QuantizeLinear", ins, {"axis": axis, "block_size": block}, opset=21, const=(1, 2) if const else ())


# onnxruntime's Python binding cannot feed or return ml_dtypes arrays (int4, float8, ...):
# those compare with onnx.reference
@pytest.mark.parametrize("qdtype", ["uint16", "int16", "uint4", "int4"])
def test_quantize_wide_and_4bit(qdtype):
    dt = np.dtype(getattr(ml_dtypes, qdtype, None) or qdtype)
    ref = "onnx" if qdtype.endswith("4") else "ort"
    x = _x((4, 8), lo=-40, hi=40)
    check("QuantizeLinear", [x, np.array(0.5, np.float32), _zp(dt)], opset=21, ref=ref)
    scale = R.uniform(0.5, 2.0, 8).astype(np.float32)
    check("QuantizeLinear", [x, scale, _zp(dt, 8)], {"axis": 1}, opset=21, ref=ref)


@pytest.mark.parametrize("qdtype", ["uint2", "int2", "float4_e2m1fn"])
def test_quantize_onnx_reference_only_types(qdtype):
    dt = np.dtype(getattr(ml_dtypes, qdtype))
    x = _x((4, 8), lo=-10, hi=10)
    zp = np.zeros((), dt) if qdtype.startswith("float") else _zp(dt)
    check("QuantizeLinear", [x, np.array(2.0, np.float32), zp], opset=25, ref="onnx")


@pytest.mark.parametrize("qdtype", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(qdtype, saturate):
    dt = np.dtype(getattr(ml_dtypes, qdtype))
    x = _x((4, 8), lo=-3, hi=3)
    x[0, :4] = [1e6, -1e6, 448.5, 57344.5]
    ins = [x, np.array(0.25, np.float32), np.zeros((), dt)]
    check("QuantizeLinear", ins, {"saturate": saturate}, opset=19, ref="onnx")


def test_quantize_float16_input_and_scale():
    x = _x((4, 6), dtype=np.float16)
    check("QuantizeLinear", [x, np.array(0.5, np.float16), np.array(3, np.uint8)], opset=19)
    check("QuantizeLinear", [x, np.array(0.5, np.float16), np.array(-3, np.int8)], opset=21, ref="both")


def test_quantize_float16_input_wide_zero_point():
    x = (R.uniform(-1, 1, (4, 8)) * 3000).astype(np.float16)
    check("QuantizeLinear", [x, np.array(1.0, np.float16), np.array(30001, np.uint16)], opset=21, ref="onnx")
    check("QuantizeLinear", [x, np.array(0.25, np.float16), np.array(-20001, np.int16)], opset=21, ref="onnx")


def test_quantize_output_dtype_and_precision():
    x = _x((3, 5))
    check("QuantizeLinear", [x, np.array(0.5, np.float32)], {"output_dtype": 3}, opset=21)  # int8, no zp
    check("QuantizeLinear", [x, np.array(0.5, np.float16), np.array(1, np.int8)], {"precision": 1}, opset=25,
          ref="onnx")


def test_quantize_int32_input():
    x = R.integers(-2000, 2000, (4, 6)).astype(np.int32)
    check("QuantizeLinear", [x, np.array(8.0, np.float32), np.array(2, np.int8)], opset=21, ref="onnx")


# ------------------------------------------------------------------------------------------------
# DequantizeLinear


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
@pytest.mark.parametrize("with_zp", [False, True])
def test_dequantize_per_tensor(opset, dtype, with_zp):
    info = np.iinfo(dtype)
    x = R.integers(max(info.min, -1000), min(info.max, 1000) + 1, (3, 4, 5)).astype(dtype)
    ins = [x, np.array(0.37, np.float32)] + ([np.array(0 if dtype == np.int32 else 5, dtype)] if with_zp else [])
    check("DequantizeLinear", ins, opset=opset, rtol=1e-6, atol=0)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16])
def test_dequantize_per_axis(axis, dtype):
    x = R.integers(0, 100, (3, 4, 5)).astype(dtype)
    n = x.shape[axis]
    check("DequantizeLinear", [x, R.uniform(0.1, 1, n).astype(np.float32), _zp(dtype, n)], {"axis": axis},
          opset=21, rtol=1e-6, atol=0)


@pytest.mark.parametrize("axis,block", [(0, 3), (1, 2), (-1, 4)])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, "int4", "uint4"])
def test_dequantize_blocked(axis, block, dtype):
    dt = np.dtype(getattr(ml_dtypes, dtype) if isinstance(dtype, str) else dtype)
    x = R.integers(0, 8, (4, 6, 10)).astype(np.int64).astype(dt)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    ins = [x, R.uniform(0.1, 1, shape).astype(np.float32), _zp(dt, shape)]
    check("DequantizeLinear", ins, {"axis": axis, "block_size": block}, opset=21, rtol=1e-6, atol=0,
          ref="onnx" if isinstance(dtype, str) else "ort")


def test_dequantize_float16_scale_and_output_dtype():
    x = R.integers(0, 255, (4, 6)).astype(np.uint8)
    check("DequantizeLinear", [x, np.array(0.1, np.float16), np.array(7, np.uint8)], opset=19, rtol=1e-3)
    check("DequantizeLinear", [x, np.array(0.1, np.float32), np.array(7, np.uint8)], {"output_dtype": 10},
          opset=23, ref="onnx", rtol=1e-3)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int2", "uint2"])
def test_dequantize_exotic(dtype):
    dt = np.dtype(getattr(ml_dtypes, dtype))
    x = R.uniform(-3, 3, (4, 6)).astype(dt)
    zp = np.zeros((), dt)
    check("DequantizeLinear", [x, np.array(0.5, np.float32), zp], opset=25, ref="onnx", rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------------------------
# DynamicQuantizeLinear


@pytest.mark.parametrize("lo,hi", [(-3, 5), (0.5, 4), (-4, -0.5), (0, 0)])
def test_dynamic_quantize(lo, hi):
    # all zeros: onnxruntime's scale is 1 (onnx.reference's 1/255; both quantize to zeros)
    x = R.uniform(lo, hi, (5, 7)).astype(np.float32)
    check("DynamicQuantizeLinear", [x], opset=11, n_outputs=3, rtol=1e-7, atol=0)


# ------------------------------------------------------------------------------------------------
# MatMulInteger / QLinearMatMul


def _q(dtype, shape):
    info = np.iinfo(dtype)
    return R.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("adt,bdt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8),
                                     (np.int8, np.uint8)])
@pytest.mark.parametrize("sa,sb", [((4, 16), (16, 5)), ((2, 3, 16), (16, 5)), ((2, 3, 16), (2, 16, 5)),
                                   ((3, 1000), (1000, 4))])
@pytest.mark.parametrize("zps", ["none", "scalar", "column"])
@pytest.mark.parametrize("const", [True, False])
def test_matmul_integer(adt, bdt, sa, sb, zps, const):
    a, b = _q(adt, sa), _q(bdt, sb)
    ins = [a, b]
    if zps == "scalar":
        ins += [_q(adt, ()), _q(bdt, ())]
    elif zps == "column":
        ins += [_q(adt, ()), _q(bdt, sb[-1:])]
    # onnxruntime: int8 A only without zero points; per-column zero points only for 2-D B; u8 x s8
    # exact only with VNNI (else the reference, which sums in int64)
    ref = "ort" if (adt == np.uint8 or zps == "none") and not (zps == "column" and len(sb) > 2) else "onnx"
    if adt == np.uint8 and bdt == np.int8 and not _cpu_has_vnni():
        ref = "onnx"
    check("MatMulInteger", ins, opset=10, const=(1, 3) if const else (), ref=ref)


def test_matmul_integer_exact_in_float64():
    """Full-range operands and a long K: the float32 bound is exceeded, float64 must be used."""
    a, b = _q(np.uint8, (3, 4096)), _q(np.uint8, (4096, 2))
    got = run_kernel("MatMulInteger", [a, b, np.array(0, np.uint8), np.array(255, np.uint8)], {}, 10,
                     [None], const=(1, 3))
    want = a.astype(np.int64) @ (b.astype(np.int64) - 255)
    np.testing.assert_array_equal(got[0], want.astype(np.int32))
    assert got[0].dtype == np.int32


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("sa,sb", [((4, 16), (16, 5)), ((2, 3, 16), (16, 5)), ((2, 3, 16), (2, 16, 5))])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("const", [True, False])
def test_qlinear_matmul(dt, sa, sb, per_column, const):
    a, b = _q(dt, sa), _q(dt, sb)
    n = sb[-1]
    b_scale = R.uniform(0.001, 0.01, n).astype(np.float32) if per_column else np.array(0.004, np.float32)
    b_zp = _q(dt, (n,)) if per_column else _q(dt, ())
    ins = [a, np.array(0.02, np.float32), _q(dt, ()), b, b_scale, b_zp, np.array(0.05, np.float32), _q(dt, ())]
    ref = "onnx" if per_column and len(sb) > 2 else "ort"  # onnxruntime: per-column only for 2-D b
    check("QLinearMatMul", ins, opset=10, const=(3, 4, 5) if const else (), ref=ref)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_matmul_float16_scales(dt):
    a, b = _q(dt, (3, 8)), _q(dt, (8, 4))
    ins = [a, np.array(0.02, np.float16), _q(dt, ()), b, np.array(0.004, np.float16), _q(dt, ()),
           np.array(0.05, np.float16), _q(dt, ())]
    check("QLinearMatMul", ins, opset=21, ref="onnx")


# ------------------------------------------------------------------------------------------------
# ConvInteger / QLinearConv

CONV_CASES = [
    ((1, 3, 8, 8), (4, 3, 3, 3), {}),
    ((2, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 7, 8), (6, 2, 3, 3), {"group": 2, "pads": [1, 0, 1, 2]}),
    ((1, 4, 8, 8), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1], "dilations": [2, 2]}),
    ((1, 3, 10, 7), (5, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 1]}),
    ((1, 16, 6, 6), (8, 16, 1, 1), {}),
    ((1, 2, 12), (3, 2, 4), {"strides": [2], "pads": [1, 2]}),
    ((1, 64, 6, 6), (8, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # K = 576: beyond the float32 bound
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("wdt", [np.uint8, np.int8])
@pytest.mark.parametrize("const", [True, False])
def test_conv_integer(xs, ws, attrs, wdt, const):
    x, w = _q(np.uint8, xs), _q(wdt, ws)
    ins = [x, w, np.array(128, np.uint8), _q(wdt, ())]
    check("ConvInteger", ins, {**attrs, "kernel_shape": list(ws[2:])}, opset=10, const=(1, 3) if const else ())
    check("ConvInteger", [x, w], attrs, opset=10, const=(1,) if const else ())


def test_conv_integer_per_channel_w_zero_point():
    x, w = _q(np.uint8, (1, 3, 6, 6)), _q(np.uint8, (4, 3, 3, 3))
    ins = [x, w, np.array(100, np.uint8), _q(np.uint8, (4,))]
    check("ConvInteger", ins, {"pads": [1, 1, 1, 1]}, opset=10, const=(1, 3), ref="onnx")  # not in onnxruntime


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES[:5] + CONV_CASES[7:])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(xs, ws, attrs, dt, bias, per_channel):
    x, w = _q(dt, xs), _q(np.int8 if dt == np.int8 else np.uint8, ws)
    m = ws[0]
    w_scale = R.uniform(0.001, 0.01, m).astype(np.float32) if per_channel else np.array(0.005, np.float32)
    w_zp = np.zeros(m, w.dtype) if per_channel else _q(w.dtype, ())
    ins = [x, np.array(0.03, np.float32), _q(dt, ()), w, w_scale, w_zp, np.array(0.2, np.float32), _q(dt, ())]
    if bias:
        ins.append(R.integers(-5000, 5000, m).astype(np.int32))
    # exact against onnx.reference (the multiplier x_scale * w_scale / y_scale applied in float64,
    # as there); onnxruntime applies it in float32, so a sum that lands within float32's rounding of
    # a half rounds the other way there now and then: one step at most
    got = check("QLinearConv", ins, attrs, opset=10, const=(3, 4, 5, 8), ref="onnx")
    model, feeds = make_model("QLinearConv", ins, attrs, 10, ["out0"], (3, 4, 5, 8))
    want = run_ort(model, feeds)[0]
    assert np.abs(got[0].astype(np.int64) - want.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("op,ins,attrs,opset", [
    ("QuantizeLinear", [_x((4, 6)), np.array(0.5, np.float32), np.array(-3, np.int8)], {}, 13),
    ("QuantizeLinear", [_x((4, 6)), np.full(6, 0.5, np.float32), np.full(6, 7, np.uint16)], {"axis": 1}, 21),
    ("DequantizeLinear", [_q(np.uint8, (4, 6)), np.array(0.1, np.float32), np.array(9, np.uint8)], {}, 13),
    ("DequantizeLinear", [_q(np.int8, (4, 6)), np.array(0.1, np.float16), np.array(9, np.int8)], {}, 19),
])
def test_quantize_dequantize_out(op, ins, attrs, opset):
    """The preallocated-output path gives the same values as the plain one."""
    want = run_kernel(op, ins, attrs, opset, [None])[0]
    from ge_core.ir.types import TensorType

    kernel = build_kernel(op, ins, attrs, opset, [TensorType.of(want)])
    assert caps(kernel).accepts_out
    out = np.empty_like(want)
    got = kernel(*ins, out=(out,))
    assert got[0] is out
    np.testing.assert_array_equal(out, want)


# ------------------------------------------------------------------------------------------------
# refusals and registration


def test_refusals():
    x = _x((2, 3))
    with pytest.raises(UnsupportedOpError, match="quantizing to") as e:
        build_kernel("QuantizeLinear", [x, np.array(1.0, np.float32), np.array(1, np.int32)], {}, 21, [None])
    assert "test_QuantizeLinear" in str(e.value)
    with pytest.raises(UnsupportedOpError, match="dtype"):
        build_kernel("MatMulInteger", [x, x], {}, 10, [None])
    f8 = np.dtype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(UnsupportedOpError, match="zero point"):
        build_kernel("DequantizeLinear", [x.astype(f8), np.array(1.0, np.float32), np.ones((), f8)], {}, 21,
                     [None], const=(2,))


def test_native_in_ge_ops():
    from ge_cpu.plugin import NATIVE, op_table

    kinds = {r["op"]: r["kernel"] for r in op_table() if r["domain"] == "ai.onnx"}
    for op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearMatMul",
               "ConvInteger", "QLinearConv"):
        assert kinds[op] == NATIVE
