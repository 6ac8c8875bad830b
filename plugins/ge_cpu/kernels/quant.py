"""Quantization kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
QLinearMatMul, ConvInteger, QLinearConv.

Integer semantics follow the ONNX definitions (and onnx.reference where the text leaves room):
``x / scale`` is rounded half to even and saturated to the output type's range; scales and zero
points are per tensor (a scalar or one element), per axis (1-D along ``axis``) or blocked
(``block_size``, the scale repeated ``block_size`` times along ``axis``). Output types: uint8,
int8, uint16, int16, uint4, int4, uint2, int2 (saturating), the float8 types (``saturate`` as
defined: clamp to the largest finite value, else IEEE-like overflow) and float4e2m1/float6 (the
cast saturates). As in onnx.reference, a float8 zero point is not applied (it must be zero), a
float4/float6 one is added when quantizing and ignored when dequantizing. Other types (float8e8m0
scales, 8-bit QLinear* of float8) are refused with :class:`UnsupportedOpError` and run through
the onnx.reference fallback.

Integer matrix products are exact: the zero-point-shifted operands are small integers, and
``sum |a_i| * |b_i|`` bounds every partial sum, so a float32 GEMM (below 2**24) or a float64 GEMM
(below 2**53) computes the int32 result exactly, through BLAS. ConvInteger/QLinearConv run the
shifted operands through the float ``Conv`` kernel the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import ExecutionError
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec, with_caps

from ._util import const_input, has_input, in_dtype, in_rank, kernel_table, onnx_dtype, out_dtype, unsupported

KERNELS, _reg = kernel_table()

#: integer quantized types and their saturation ranges
_INT_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
    "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3), "int2": (-2, 1),
}
_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
#: float types without infinity/NaN encodings: the cast itself saturates
_FLOAT_SMALL = ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
#: float types a scale / dequantized output may have
_SCALE_FLOATS = ("float32", "float16", "bfloat16", "float64")
#: exactness bounds of integer sums in float32 / float64 arithmetic
_F32_EXACT = float(2 ** 24)
_F64_EXACT = float(2 ** 53)


def _dtname(dt: np.dtype | None) -> str:
    return "?" if dt is None else dt.name


def _param_shape(value: np.ndarray, x_shape: tuple, axis: int, block: int, spec: KernelSpec, what: str) -> np.ndarray:
    """Broadcastable form of a scale / zero point against ``x`` (the ONNX granularities)."""
    v = np.asarray(value)
    if v.ndim == 0:
        return v
    if v.size == 1 and not block:
        return v.reshape(())
    rank = len(x_shape)
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise ExecutionError(f"{spec.describe()}: axis {axis} is out of range for an input of rank {rank}",
                             hint="fix the axis attribute")
    if not block:
        if v.ndim != 1 or v.shape[0] != x_shape[ax]:
            raise ExecutionError(f"{spec.describe()}: {what} of shape {list(v.shape)} does not match axis {axis} "
                                 f"(size {x_shape[ax]}) of the input {list(x_shape)}",
                                 hint="per-axis parameters are 1-D with the axis' length")
        dims = [1] * rank
        dims[ax] = v.shape[0]
        return v.reshape(dims)
    if v.ndim != rank or any(v.shape[i] != x_shape[i] for i in range(rank) if i != ax) \
            or not (v.shape[ax] - 1) * block < x_shape[ax] <= v.shape[ax] * block:
        raise ExecutionError(f"{spec.describe()}: blocked {what} of shape {list(v.shape)} does not match the input "
                             f"{list(x_shape)} with block_size {block} on axis {axis}",
                             hint="the blocked axis needs ceil(size / block_size) entries, the others the input's")
    v = np.repeat(v, block, axis=ax)
    if v.shape[ax] != x_shape[ax]:
        v = np.take(v, np.arange(x_shape[ax]), axis=ax)
    return v


class _Params:
    """A scale or zero point, shaped for ``x`` once per input shape (constants: once)."""

    def __init__(self, const: np.ndarray | None, axis: int, block: int, spec: KernelSpec, what: str,
                 dtype: np.dtype | None = None) -> None:
        self.const = const
        self.axis = axis
        self.block = block
        self.spec = spec
        self.what = what
        self.dtype = dtype
        self._memo: dict[tuple, np.ndarray] = {}

    def __call__(self, value: np.ndarray | None, x_shape: tuple) -> np.ndarray:
        if self.const is not None:
            key = tuple(x_shape)
            got = self._memo.get(key)
            if got is None:
                got = self._shape(self.const, x_shape)
                if len(self._memo) > 8:
                    self._memo.clear()
                self._memo[key] = got
            return got
        assert value is not None
        return self._shape(value, x_shape)

    def _shape(self, value: np.ndarray, x_shape: tuple) -> np.ndarray:
        v = _param_shape(value, x_shape, self.axis, self.block, self.spec, self.what)
        return v if self.dtype is None else v.astype(self.dtype)


def _check_scale_dtype(spec: KernelSpec, i: int) -> np.dtype | None:
    dt = in_dtype(spec, i)
    if dt is not None and dt.name not in _SCALE_FLOATS:
        raise unsupported(spec, f"scale dtype {dt.name}")
    return dt


# ------------------------------------------------------------------------------------------------
# QuantizeLinear


@_reg("QuantizeLinear")
def quantize_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", 1))
    block = int(spec.attr("block_size", 0) or 0) if spec.opset >= 21 else 0
    saturate = bool(int(spec.attr("saturate", 1)))
    if block < 0:
        raise unsupported(spec, f"block_size={block}")
    has_zp = has_input(spec, 2)
    zdt = in_dtype(spec, 2) if has_zp else None
    odt_attr = int(spec.attr("output_dtype", 0) or 0)
    if zdt is not None:
        qdt = zdt
    elif odt_attr:
        qdt = onnx_dtype(spec, odt_attr)
    else:
        odt = out_dtype(spec, 0)
        qdt = odt if has_zp and odt is not None else np.dtype(np.uint8)
    name = qdt.name
    if name not in _INT_RANGES and name not in _FLOAT8 and name not in _FLOAT_SMALL:
        raise unsupported(spec, f"quantizing to {name}")
    xdt = in_dtype(spec, 0)
    if xdt is not None and xdt.name not in ("float32", "float16", "bfloat16", "int32", "float64"):
        raise unsupported(spec, f"input dtype {xdt.name}")
    _check_scale_dtype(spec, 1)
    precision = int(spec.attr("precision", 0) or 0)
    pdt = onnx_dtype(spec, precision) if precision else None
    if pdt is not None and pdt.name not in _SCALE_FLOATS:
        raise unsupported(spec, f"precision {pdt.name}")
    scale_p = _Params(const_input(spec, 1), axis, block, spec, "y_scale", pdt)
    zp_p = _Params(const_input(spec, 2) if has_zp else None, axis, block, spec, "y_zero_point")
    is_int = name in _INT_RANGES
    lo, hi = _INT_RANGES.get(name, (0, 0))

    def kernel(x, y_scale, y_zero_point=None, out=None):
        s = scale_p(y_scale, x.shape)
        xv = x.astype(pdt) if pdt is not None else x
        if xv.dtype.name == "bfloat16" or (s.dtype.name == "bfloat16" and xv.dtype.kind != "f"):
            xv = xv.astype(np.float32)
        q = np.asarray(np.divide(xv, s))  # NumPy promotion, as onnx.reference: the wider of x and scale
        zp = zp_p(y_zero_point, x.shape) if has_zp and y_zero_point is not None else None
        if is_int:
            np.rint(q, out=q)
            if q.dtype.itemsize < 4:
                q = q.astype(np.float32)  # integers up to 2**24 exact: the zero point adds exactly
            if zp is not None:
                q += zp.astype(q.dtype)
            np.clip(q, lo, hi, out=q)
        elif name in _FLOAT_SMALL:
            if zp is not None:
                q = q + zp.astype(np.float32)
        elif saturate:
            # float8: the zero point (spec: usually zero) is not applied, as in onnx.reference
            fi = _float8_info(qdt)
            q = np.clip(q, -fi, fi)
        if out is not None:
            np.copyto(out[0], q, casting="unsafe")
            return (out[0],)
        return (q.astype(qdt),)

    if name in ("uint8", "int8", "uint16", "int16"):
        with_caps(kernel, accepts_out=True)
    return kernel


def _float8_info(dt: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dt).max)


# ------------------------------------------------------------------------------------------------
# DequantizeLinear


@_reg("DequantizeLinear")
def dequantize_factory(spec: KernelSpec):
    axis = int(spec.attr("axis", 1))
    block = int(spec.attr("block_size", 0) or 0) if spec.opset >= 21 else 0
    if block < 0:
        raise unsupported(spec, f"block_size={block}")
    xdt = in_dtype(spec, 0)
    xname = _dtname(xdt)
    if xdt is not None and xname not in _INT_RANGES and xname not in _FLOAT8 and xname not in _FLOAT_SMALL \
            and xname != "int32":
        raise unsupported(spec, f"dequantizing {xname}")
    sdt = _check_scale_dtype(spec, 1)
    odt_attr = int(spec.attr("output_dtype", 0) or 0)
    odt = onnx_dtype(spec, odt_attr) if odt_attr else (sdt or out_dtype(spec, 0))
    if odt is not None and odt.name not in _SCALE_FLOATS:
        raise unsupported(spec, f"output dtype {odt.name}")
    fp8 = xname in _FLOAT8
    has_zp = has_input(spec, 2)
    zp_const = const_input(spec, 2) if has_zp else None
    if fp8 and zp_const is not None and np.any(zp_const.astype(np.float32) != 0):
        raise unsupported(spec, "a non-zero zero point for a float8 input")
    use_zp = has_zp and not fp8 and xname not in _FLOAT_SMALL
    scale_p = _Params(const_input(spec, 1), axis, block, spec, "x_scale")
    zp_p = _Params(zp_const, axis, block, spec, "x_zero_point", np.dtype(np.float32))

    def kernel(x, x_scale, x_zero_point=None, out=None):
        dx = x.astype(np.float32)
        if use_zp and x_zero_point is not None:
            dx -= zp_p(x_zero_point, x.shape)
        s = scale_p(x_scale, x.shape)
        if s.dtype.name == "bfloat16":
            s = s.astype(np.float32)
        if out is not None and out[0].dtype == np.result_type(dx, s):
            return (np.multiply(dx, s, out=out[0]),)
        y = dx * s
        want = odt if odt is not None else x_scale.dtype
        if out is not None:
            np.copyto(out[0], y, casting="unsafe")
            return (out[0],)
        return (y.astype(want, copy=False),)

    if odt is not None and odt.name in ("float32", "float16", "float64"):
        with_caps(kernel, accepts_out=True)
    return kernel


# ------------------------------------------------------------------------------------------------
# DynamicQuantizeLinear


@_reg("DynamicQuantizeLinear")
def dynamic_quantize_factory(spec: KernelSpec):
    xdt = in_dtype(spec, 0)
    if xdt is not None and xdt != np.float32:
        raise unsupported(spec, f"input dtype {xdt.name}")
    f32 = np.float32

    def kernel(x):
        if x.size:
            mx, mn = f32(max(0.0, float(np.max(x)))), f32(min(0.0, float(np.min(x))))
        else:
            mx = mn = f32(0)
        # max == min (all zeros): scale 1, as onnxruntime (the formula would divide by zero)
        scale = f32(1.0) if mx == mn else f32(mx - mn) / f32(255)
        zp = np.rint(f32(max(0.0, min(255.0, float(f32(0) - mn / scale)))))
        q = np.divide(x, scale, dtype=f32)
        np.rint(q, out=q)
        q += f32(zp)
        np.clip(q, 0, 255, out=q)
        return (q.astype(np.uint8), np.array(scale, f32), np.array(zp, np.uint8))

    return kernel


# ------------------------------------------------------------------------------------------------
# exact integer matmul


def _int_like(spec: KernelSpec, i: int, what: str) -> None:
    dt = in_dtype(spec, i)
    if dt is not None and dt.name not in ("uint8", "int8"):
        raise unsupported(spec, f"{what} dtype {dt.name} (uint8 and int8 are supported)")


def _absmax(a: np.ndarray) -> float:
    return float(np.max(np.abs(a))) if a.size else 0.0


class _ExactMatMul:
    """``(A - a_zp) @ (B - b_zp)`` exactly, as float32 or float64 BLAS; B prepared once when
    constant."""

    def __init__(self, b_const: np.ndarray | None, bzp_const: np.ndarray | None, bzp_dynamic: bool) -> None:
        self.b_ready: dict[str, np.ndarray] | None = None
        self.b_max = 0.0
        if b_const is not None and not bzp_dynamic:
            b16 = _shift16(b_const, bzp_const)
            self.b_ready = {"float64": b16.astype(np.float64), "float32": b16.astype(np.float32)}
            self.b_max = _absmax(b16)

    def __call__(self, a: np.ndarray, azp: np.ndarray | None, b: np.ndarray, bzp: np.ndarray | None) -> np.ndarray:
        a16 = _shift16(a, azp)
        if self.b_ready is not None:
            bmax = self.b_max
            b16 = None
        else:
            b16 = _shift16(b, bzp)
            bmax = _absmax(b16)
        bound = a.shape[-1] * _absmax(a16) * bmax
        dt = np.float32 if bound < _F32_EXACT else np.float64
        if bound >= _F64_EXACT:  # pragma: no cover - needs K > 2**37
            raise ExecutionError("an integer matmul too large to compute exactly", hint="split the matmul")
        bf = self.b_ready[np.dtype(dt).name] if b16 is None else b16.astype(dt)  # type: ignore[index]
        return np.matmul(a16.astype(dt), bf)


def _shift16(a: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    """``a - zp`` as int16 (exact for 8-bit operands)."""
    r = a.astype(np.int16)
    if zp is not None:
        r -= np.asarray(zp).astype(np.int16)
    return r


def _row_zp(zp: np.ndarray | None, a: np.ndarray) -> np.ndarray | None:
    """A's zero point: a scalar, or 1-D per row of A (shaped to broadcast over the rows)."""
    if zp is None:
        return None
    z = np.asarray(zp)
    if z.ndim == 0 or z.size == 1:
        return z.reshape(())
    if z.ndim == 1 and a.ndim >= 2 and z.shape[0] == a.shape[-2]:
        return z.reshape(-1, 1)
    return z


@_reg("MatMulInteger")
def matmul_integer_factory(spec: KernelSpec):
    _int_like(spec, 0, "A")
    _int_like(spec, 1, "B")
    has_azp, has_bzp = has_input(spec, 2), has_input(spec, 3)
    bzp_const = const_input(spec, 3) if has_bzp else None
    mm = _ExactMatMul(const_input(spec, 1), bzp_const, has_bzp and bzp_const is None)

    def kernel(a, b, a_zero_point=None, b_zero_point=None):
        azp = _row_zp(a_zero_point, a) if has_azp else None
        r = mm(a, azp, b, b_zero_point if has_bzp else None)
        return (r.astype(np.int32),)

    return kernel


def _requantize(acc: np.ndarray, mult, y_zp: np.ndarray | None, qdt: np.dtype) -> np.ndarray:
    """``saturate(rint(acc * mult) + y_zp)`` in ``qdt`` (acc: exact integers as floats)."""
    r = np.multiply(acc, mult, dtype=np.float64)
    np.rint(r, out=r)
    if y_zp is not None:
        r += y_zp.astype(np.float64)
    lo, hi = _INT_RANGES[qdt.name]
    np.clip(r, lo, hi, out=r)
    return r.astype(qdt)


def _scale_arr(s) -> np.ndarray:
    a = np.asarray(s)
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


@_reg("QLinearMatMul")
def qlinear_matmul_factory(spec: KernelSpec):
    _int_like(spec, 0, "a")
    _int_like(spec, 3, "b")
    _int_like(spec, 7, "y_zero_point")
    for i in (1, 4, 6):
        _check_scale_dtype(spec, i)
    bzp_const = const_input(spec, 5)
    mm = _ExactMatMul(const_input(spec, 3), bzp_const, bzp_const is None)
    ydt = in_dtype(spec, 7) or out_dtype(spec, 0) or np.dtype(np.uint8)

    def kernel(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        acc = mm(a, _row_zp(a_zero_point, a), b, b_zero_point)
        sa = _scale_arr(a_scale)
        if sa.ndim == 1 and sa.size > 1 and a.ndim >= 2 and sa.shape[0] == a.shape[-2]:
            sa = sa.reshape(-1, 1)  # per row of a
        # the multiplier in the scales' type (as onnx.reference), applied in float64 to the sums
        mult = sa * _scale_arr(b_scale) / _scale_arr(y_scale)
        return (_requantize(acc, mult, y_zero_point, ydt),)

    return kernel


# ------------------------------------------------------------------------------------------------
# integer convolution through the float Conv kernel


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


class _ExactConv:
    """``conv(x - x_zp, w - w_zp) (+ bias)`` exactly, as a float32 or float64 Conv; the float
    kernels are built lazily per dtype (constant weights packed once)."""

    def __init__(self, spec: KernelSpec, x_index: int, w_index: int, wzp_index: int) -> None:
        self.spec = spec
        self.w_const = const_input(spec, w_index)
        self.x_rank = in_rank(spec, x_index)
        self.wzp_index = wzp_index
        wzp_const = const_input(spec, wzp_index) if has_input(spec, wzp_index) else None
        self.static_w = self.w_const is not None and (wzp_const is not None or not has_input(spec, wzp_index))
        self.w64: np.ndarray | None = None
        self.w_max = 0.0
        if self.static_w:
            assert self.w_const is not None
            self.w64 = self._shift_w(self.w_const, wzp_const)
            self.w_max = _absmax(self.w64)
        self.attrs = {k: v for k, v in spec.attrs.items() if k in _CONV_ATTRS}
        self.kernels: dict[tuple, Any] = {}
        self.w_by_dt: dict[str, np.ndarray] = {}

    def _shift_w(self, w: np.ndarray, wzp: np.ndarray | None) -> np.ndarray:
        w64 = w.astype(np.float64)
        if wzp is not None:
            z = np.asarray(wzp).astype(np.float64)
            if z.ndim == 1 and z.size > 1:
                if z.shape[0] != w.shape[0]:
                    raise ExecutionError(f"{self.spec.describe()}: w_zero_point has {z.shape[0]} entries for "
                                         f"{w.shape[0]} output channels", hint="one zero point per output channel")
                z = z.reshape((-1,) + (1,) * (w.ndim - 1))
            w64 -= z.reshape(()) if z.size == 1 else z
        return w64

    def _kernel(self, dt, x_shape, w: np.ndarray | None, with_bias: bool):
        from . import nn

        key = (np.dtype(dt).name, len(x_shape), with_bias, w is None)
        k = self.kernels.get(key)
        if k is None:
            ft = np.dtype(dt)
            w_shape = self.w64.shape if self.w64 is not None else None
            inputs: list[TensorType | None] = [TensorType(ft, tuple(x_shape)), TensorType(ft, w_shape)]
            consts: list[np.ndarray | None] = [None, None if w is None else w.astype(ft)]
            if with_bias:
                inputs.append(TensorType(ft, None))
                consts.append(None)
            fspec = KernelSpec(name=self.spec.name, op_type="Conv", attrs=dict(self.attrs), inputs=inputs,
                               outputs=[TensorType(ft, None)], const_inputs=consts, opset=11,
                               options=dict(self.spec.options))
            k = nn.KERNELS[("", "Conv")](fspec)
            self.kernels[key] = k
        return k

    def __call__(self, x: np.ndarray, xzp, w: np.ndarray, wzp, bias: np.ndarray | None) -> np.ndarray:
        if self.static_w:
            w64 = self.w64
            wmax = self.w_max
        else:
            w64 = self._shift_w(w, wzp)
            wmax = _absmax(w64)
        assert w64 is not None
        xs = x.astype(np.int16)
        if xzp is not None:
            xs -= np.asarray(xzp).astype(np.int16).reshape(())
        k = int(np.prod(w64.shape[1:]))
        bound = k * _absmax(xs) * wmax + (_absmax(bias) if bias is not None else 0.0)
        dt = np.float32 if bound < _F32_EXACT else np.float64
        if self.static_w:
            wf = self.w_by_dt.get(np.dtype(dt).name)
            if wf is None:
                wf = self.w_by_dt[np.dtype(dt).name] = w64.astype(dt)
        else:
            wf = w64.astype(dt)
        kern = self._kernel(dt, x.shape, wf if self.static_w else None, bias is not None)
        args = [xs.astype(dt), wf]
        if bias is not None:
            args.append(bias.astype(dt))
        return kern(*args)[0]


@_reg("ConvInteger")
def conv_integer_factory(spec: KernelSpec):
    _int_like(spec, 0, "x")
    _int_like(spec, 1, "w")
    conv = _ExactConv(spec, 0, 1, 3)
    has_xzp, has_wzp = has_input(spec, 2), has_input(spec, 3)

    def kernel(x, w, x_zero_point=None, w_zero_point=None):
        r = conv(x, x_zero_point if has_xzp else None, w, w_zero_point if has_wzp else None, None)
        return (r.astype(np.int32),)

    return kernel


@_reg("QLinearConv")
def qlinear_conv_factory(spec: KernelSpec):
    _int_like(spec, 0, "x")
    _int_like(spec, 3, "w")
    _int_like(spec, 7, "y_zero_point")
    for i in (1, 4, 6):
        _check_scale_dtype(spec, i)
    bdt = in_dtype(spec, 8) if has_input(spec, 8) else None
    if bdt is not None and bdt != np.int32:
        raise unsupported(spec, f"bias dtype {bdt.name}")
    conv = _ExactConv(spec, 0, 3, 5)
    ydt = in_dtype(spec, 7) or out_dtype(spec, 0) or np.dtype(np.uint8)

    def kernel(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None):
        acc = conv(x, x_zero_point, w, w_zero_point, B)
        ws = _scale_arr(w_scale)
        if ws.ndim == 1 and ws.size > 1:
            ws = ws.reshape((1, -1) + (1,) * (acc.ndim - 2))  # per output channel
        mult = _scale_arr(x_scale) * ws / _scale_arr(y_scale)
        return (_requantize(acc, mult, y_zero_point, ydt),)

    return kernel
