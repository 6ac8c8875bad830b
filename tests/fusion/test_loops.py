"""Compiled loop kernels (ge_cpu.fused.loopgen): every op, every broadcast layout, threads, fallbacks,
and whole models against onnxruntime."""

import math
import platform
import re
import subprocess

import numpy as np
import pytest

import ge_core as ge
from ge_core.kernel import caps
from ge_cpu.fused import codegen, loopgen
from ge_native import parallel
from ge_sdk.testing import GraphBuilder, random_inputs, run_onnxruntime, run_reference


def test_native_loops_are_there():
    # a C compiler is on every machine this project supports; without one fused groups run as NumPy code
    assert loopgen.available(), "no C compiler or Python/NumPy headers (or GE_NATIVE=0 / GE_FUSION_JIT=0 is set)"

#: attributes each op is tried with (every op of the table is tried at least once)
ATTRS = {
    "LeakyRelu": [{"alpha": 0.2}, {"alpha": 3.0}],
    "Clip": [{"min": -0.5, "max": 0.7}, {"min": None, "max": 0.3}, {"min": -0.2, "max": None}],
    "Gelu": [{"approximate": "none"}, {"approximate": "tanh"}],
    "HardSigmoid": [{"alpha": 0.3, "beta": 0.4}],
    "Elu": [{"alpha": 0.7}],
}
CASES = [(op, a) for op in sorted(codegen.OPS) for a in ATTRS.get(op, [{}])]
TRANSCENDENTAL = {"Exp", "Log", "Tanh", "Sin", "Cos", "Erf", "Sigmoid", "Silu", "Gelu", "Elu", "Softplus"}


def _inputs(op, dtype, rng, shape=(37, 129)):
    arity = codegen.OPS[op].arity
    n = 3 if arity is None else arity
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    x.flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30]
    xs = [x]
    if n >= 2:
        xs.append((rng.standard_normal(shape[-1:]) * 2).astype(dtype))  # a row, broadcast
    if n >= 3:
        xs.append(np.array(0.75, dtype))  # a scalar
    if op == "Pow":
        xs[1] = np.where(np.arange(shape[-1]) % 2 == 0, 2.0, 1.5).astype(dtype)
    return xs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op,attrs", CASES, ids=[f"{o}-{i}" for o, a in CASES for i in [len(str(a))]])
def test_every_op_as_a_loop_matches_its_numpy_form(op, attrs, dtype):
    rng = np.random.default_rng(7)
    xs = _inputs(op, dtype, rng)
    prog = codegen.dumps([(op, [f"a{i}" for i in range(len(xs))], attrs)])
    shapes = [x.shape for x in xs]
    loop = codegen.compile_program(prog, [dtype] * len(xs), shapes, dtype, xs[0].shape, mode="loop")
    ref = codegen.compile_program(prog, [dtype] * len(xs), shapes, dtype, xs[0].shape, mode="numpy")
    # libm per element does not vectorise: those programs keep NumPy's SIMD ufuncs
    scalar_only = op in ("Sin", "Cos") or (dtype == "float64" and op in TRANSCENDENTAL)
    assert caps(loop).mode == ("numpy" if scalar_only else "loop") and caps(ref).mode == "numpy"
    with np.errstate(all="ignore"):
        want = ref(*xs)
        got = loop(*xs)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    # NumPy's erf is a 1.5e-7 polynomial; the loop uses libm's erf
    tol = 2e-6 if op in ("Erf", "Gelu") else (2e-6 if dtype == "float32" else 1e-12)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


def test_transcendental_loops_vectorise():
    # the loop inlines vmath: its machine code uses vector registers, not a libm call per element
    fn = codegen.compile_program(codegen.dumps([("Tanh", ["a0"], {}), ("Sigmoid", ["t0"], {}), ("Erf", ["t1"], {})]),
                                 ["float32"], [(4096,)], "float32", (4096,), mode="loop")
    assert caps(fn).mode == "loop"
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", fn.library], capture_output=True, text=True,
                         check=True).stdout
    assert not re.search(r"call.*<(tanhf|expf|erff|exp|tanh|erf)(@plt)?>", asm)
    if platform.machine() in ("x86_64", "AMD64"):  # packed single-precision arithmetic (SSE, AVX or AVX-512)
        assert re.search(r"\bv?(mul|add|sub|fmadd\w*)ps\b", asm)


def test_nan_propagates_like_numpy_through_max_min_relu_and_clip():
    x = np.array([np.nan, -1.0, 2.0, np.nan], np.float32)
    y = np.array([0.0, np.nan, 1.0, 3.0], np.float32)
    for op, want in [("Max", np.maximum(x, y)), ("Min", np.minimum(x, y))]:
        fn = codegen.compile_program(codegen.dumps([(op, ["a0", "a1"], {})]), ["float32"] * 2, [(4,), (4,)],
                                     "float32", (4,), mode="loop")
        np.testing.assert_array_equal(fn(x, y), want)
    for op, attrs, want in [("Relu", {}, np.maximum(x, 0)), ("Clip", {"min": 0.0, "max": 1.0}, np.clip(x, 0, 1))]:
        fn = codegen.compile_program(codegen.dumps([(op, ["a0"], attrs)]), ["float32"], [(4,)], "float32", (4,),
                                     mode="loop")
        np.testing.assert_array_equal(fn(x), want)


BN_RELU = codegen.dumps([("Mul", ["a0", "a1"], {}), ("Add", ["t0", "a2"], {}), ("Relu", ["t1"], {}),
                         ("Sub", ["t2", "a1"], {})])

#: (shapes of a0, a1, a2; output shape; the coalesced loop has a form)
LAYOUTS = [
    ([(1 << 16,), (), ()], (1 << 16,), True),                       # flat and scalars
    ([(2, 64, 7, 7), (64, 1, 1), (64, 1, 1)], (2, 64, 7, 7), True),  # per channel, batch 2
    ([(1, 64, 9, 9), (1, 64, 1, 1), (1, 1, 9, 9)], (1, 64, 9, 9), True),
    ([(300, 700), (700,), (300, 1)], (300, 700), True),              # row and column
    ([(64, 1), (1, 128), (1,)], (64, 128), True),                    # outer product
    ([(1, 1, 1000), (1000,), ()], (1, 1, 1000), True),               # unit dims dropped
    ([(3, 5, 7, 11), (5, 1, 11), (3, 1, 7, 1)], (3, 5, 7, 11), False),  # four dims do not coalesce
    ([(), (), ()], (), True),                                        # a 0-d output
]


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("shapes,out_shape,has_loop", LAYOUTS, ids=[str(s[1]) for s in LAYOUTS])
def test_broadcast_layouts_and_thread_caps(shapes, out_shape, has_loop, workers):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.maximum(xs[0] * xs[1] + xs[2], 0) - xs[1]
    fn = loopgen.loop_kernel(codegen.loads(BN_RELU), ["a0", "a1", "a2"], ["float32"] * 3, shapes, "float32",
                             out_shape, workers=workers)
    if not has_loop:
        assert fn is None
        fn = codegen.compile_program(BN_RELU, ["float32"] * 3, shapes, "float32", out_shape)
        assert caps(fn).mode != "loop"  # generated NumPy code instead
    with parallel.use_threads(2):  # large loops split over OpenMP threads (at most `workers`)
        np.testing.assert_allclose(fn(*xs), want, rtol=1e-6, atol=1e-6)
        out = np.full(out_shape, np.nan, np.float32)
        assert fn(*xs, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shapes,out_shape", [
    ([(4, 96, 56, 56), (96, 1, 1), (1, 96, 1, 1)], (4, 96, 56, 56)),   # many rows
    ([(3, 200000), (200000,), (3, 1)], (3, 200000)),                    # few long rows: split within rows
    ([(300000,), (300000,), ()], (300000,)),                             # one flat run
])
def test_split_loops_give_the_same_bits_at_every_width(shapes, out_shape):
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fn = codegen.compile_program(BN_RELU, ["float32"] * 3, shapes, "float32", out_shape, mode="loop")
    assert caps(fn).mode == "loop"
    one = fn(*xs)
    for width in (2, 3, 4):
        with parallel.use_threads(width):
            np.testing.assert_array_equal(fn(*xs), one)
            inplace = xs[0].copy() if xs[0].shape == out_shape else None
            if inplace is not None:  # the in-place variant, split too
                fn(inplace, *xs[1:], out=inplace)
                np.testing.assert_array_equal(inplace, one)
    np.testing.assert_allclose(one, np.maximum(xs[0] * xs[1] + xs[2], 0) - xs[1], rtol=1e-6, atol=1e-6)


def test_strided_operands_and_output_and_in_place():
    fn = codegen.compile_program(BN_RELU, ["float32"] * 3, [(40, 50), (50,), (40, 1)], "float32", (40, 50),
                                 mode="loop")
    rng = np.random.default_rng(5)
    base = rng.standard_normal((50, 40)).astype(np.float32)
    a0 = base.T  # not contiguous
    a1 = rng.standard_normal(100).astype(np.float32)[::2]
    a2 = rng.standard_normal((40, 1)).astype(np.float32)
    want = np.maximum(a0 * a1 + a2, 0) - a1
    big = np.zeros((40, 100), np.float32)
    out = big[:, ::2]  # a strided output view
    assert fn(a0, a1, a2, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert not big[:, 1::2].any()
    x = np.ascontiguousarray(a0)
    fn(x, a1, a2, out=x)  # the output is a dying input's memory
    np.testing.assert_allclose(x, want, rtol=1e-6)


def test_one_compiled_loop_serves_every_shape_of_a_program():
    # a program no other test compiles
    prog = codegen.dumps([("Mul", ["a0", "a1"], {}), ("Add", ["t0", "a2"], {}), ("Tanh", ["t1"], {}),
                          ("Abs", ["t2"], {}), ("Sqrt", ["t3"], {}), ("Neg", ["t4"], {}), ("Mul", ["t5", "a0"], {})])
    before = loopgen.stats()
    for c, hw in [(8, 5), (16, 9), (32, 3)]:
        fn = codegen.compile_program(prog, ["float32"] * 3, [(1, c, hw, hw), (c, 1, 1), (c, 1, 1)], "float32",
                                     (1, c, hw, hw))
        assert caps(fn).mode == "loop"
    after = loopgen.stats()
    assert after["compiled"] - before["compiled"] == 1
    assert after["reused"] - before["reused"] == 2


def test_integer_programs_and_mixed_dtypes_use_numpy_code():
    prog = codegen.dumps([("Add", ["a0", "a1"], {}), ("Mul", ["t0", "a0"], {})])
    fn = codegen.compile_program(prog, ["int64", "int64"], [(4096,), (4096,)], "int64", (4096,))
    assert caps(fn).mode != "loop"
    a = np.arange(4096, dtype=np.int64)
    np.testing.assert_array_equal(fn(a, a), (a + a) * a)
    fn = codegen.compile_program(prog, ["float32", "float64"], [(4096,), (4096,)], "float64", (4096,))
    assert caps(fn).mode != "loop"


def test_symbolic_shapes_use_numpy_code():
    prog = codegen.dumps([("Add", ["a0", "a1"], {}), ("Relu", ["t0"], {})])
    fn = codegen.compile_program(prog, ["float32"] * 2, [("N", 8), (8,)], "float32", None)
    assert caps(fn).mode != "loop"
    a = np.ones((3, 8), np.float32)
    np.testing.assert_array_equal(fn(a, -a[0]), np.zeros((3, 8), np.float32))


def test_jit_switch_turns_loops_off(monkeypatch):
    prog = codegen.dumps([("Exp", ["a0"], {}), ("Neg", ["t0"], {})])
    assert caps(codegen.compile_program(prog, ["float32"], [(5000,)], "float32", (5000,))).mode == "loop"
    monkeypatch.setenv("GE_FUSION_JIT", "0")
    assert caps(codegen.compile_program(prog, ["float32"], [(5000,)], "float32", (5000,))).mode != "loop"


def test_loop_source_is_inspectable():
    fn = codegen.compile_program(BN_RELU, ["float32"] * 3, [(64, 100), (100,), (64, 1)], "float32", (64, 100))
    assert "for (int64_t k = kb; k < ke; k++)" in fn.source and "ge_max32(" in fn.source


# ------------------------------------------------------------------------------------------------
# whole graphs against onnxruntime
# ------------------------------------------------------------------------------------------------
def _unary_soup(shape, dtype):
    b = GraphBuilder("soup")
    x = b.input("x", dtype, shape)
    s = b.input("s", dtype, (shape[1], 1, 1))
    t = b.Mul(x, s)
    t = b.Add(t, b.const(np.array(0.5, dtype)))
    t = b.Sigmoid(t)
    u = b.Tanh(b.Mul(x, b.const(np.array(0.3, dtype))))
    t = b.Add(t, u)
    t = b.Sub(t, b.Exp(b.Neg(b.Abs(x))))
    t = b.LeakyRelu(t, alpha=0.1)
    t = b.Clip(t, b.const(np.array(-0.4, dtype)), b.const(np.array(0.9, dtype)))
    t = b.Div(t, b.Add(b.Sqrt(b.Abs(x)), b.const(np.array(1.0, dtype))))
    t = b.Elu(t, alpha=0.5)
    t = b.HardSigmoid(t, alpha=0.3, beta=0.45)
    t = b.Mul(t, b.Erf(x))
    b.output(b.Softplus(t))
    return b.build()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_loops_match_onnxruntime_and_onnx_reference(dtype):
    g = _unary_soup((2, 24, 33, 17), dtype)
    feeds = random_inputs(g, seed=4)
    model = ge.compile(g)
    # float64 transcendentals have no vectorisable loop form: NumPy/numexpr code runs them
    assert ("loop" in model.report["kernel_modes"]) == (dtype == "float32"), model.report["kernel_modes"]
    assert model.report["kernels"] <= 2, model.report["op_counts"]
    got = model.run(feeds)
    # onnxruntime has no float64 Elu
    want = run_onnxruntime(g, feeds) if dtype == "float32" else run_reference(g, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_fused_chain_of_the_benchmark_matches_onnxruntime_on_every_executor():
    b = GraphBuilder("chain")
    x = b.input("x", "float32", (1 << 16,))
    t = b.Mul(x, np.float32(1.7))
    t = b.Add(t, np.float32(0.3))
    t = b.Relu(t)
    t = b.Mul(t, x)
    t = b.Sub(t, np.float32(0.25))
    t = b.Abs(t)
    t = b.Sqrt(t)
    b.output(b.Neg(t))
    g = b.build()
    feeds = random_inputs(g, seed=9)
    want = run_onnxruntime(g, feeds)
    for executor in ("sequential", "arena", "sink", "streams"):
        model = ge.compile(g, {"executor": executor})
        assert model.report["kernels"] == 1 and model.report["kernel_modes"] == {"loop": 1}
        got = model.run(feeds)
        for k in want:
            # FMA-free loop: the same rounding as the unfused ops, even where x*x - 0.25 cancels
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{executor}:{k}")
    assert math.isfinite(loopgen.stats()["compile_s"])


def test_read_only_and_unaligned_operands(tmp_path):
    # weights of a loaded .om are read-only memory maps
    fn = codegen.compile_program(BN_RELU, ["float32"] * 3, [(8, 300), (300,), (8, 1)], "float32", (8, 300),
                                 mode="loop")
    rng = np.random.default_rng(2)
    a0, a1, a2 = (rng.standard_normal(s).astype(np.float32) for s in [(8, 300), (300,), (8, 1)])
    want = np.maximum(a0 * a1 + a2, 0) - a1
    a1.setflags(write=False)
    raw = np.zeros(8 * 300 * 4 + 1, np.uint8)[1:]  # an unaligned float32 view
    odd = raw.view(np.float32).reshape(8, 300)
    odd[...] = a0
    np.testing.assert_allclose(fn(odd, a1, a2), want, rtol=1e-6)
    b = GraphBuilder("bn")
    x = b.input("x", "float32", (1, 64, 20, 20))
    t = b.Mul(x, b.random_const((64, 1, 1), name="scale"))
    t = b.Add(t, b.random_const((64, 1, 1), name="shift"))
    b.output(b.Sigmoid(b.Relu(t)))
    m = ge.compile(b.build())
    assert m.report["kernel_modes"] == {"loop": 1}
    m.save(tmp_path / "bn.om")
    again = ge.load_om(str(tmp_path / "bn.om"))
    feeds = random_inputs(m.graph, seed=1)
    name = m.output_names[0]
    np.testing.assert_array_equal(again.run(feeds)[name], m.run(feeds)[name])


# ------------------------------------------------------------------------------------------------
# row kernels: Softmax and LayerNorm
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,axis", [((4, 7, 300), -1), ((64, 1000), 1), ((3, 5, 6), 1), ((2, 1, 1), -1)])
def test_onnx_softmax_runs_as_a_row_kernel(shape, axis, dtype):
    b = GraphBuilder("sm")
    x = b.input("x", dtype, shape)
    b.output(b.Softmax(b.Mul(x, b.const(np.array(3.0, dtype))), axis=axis))
    g = b.build()
    feeds = {"x": (np.random.default_rng(1).standard_normal(shape) * 4).astype(dtype)}
    feeds["x"].flat[0] = 80.0  # large logits: the max is subtracted first
    model = ge.compile(g)
    last = axis in (-1, len(shape) - 1)
    assert ("ge.fused::Softmax" in model.report["op_counts"]) == last, model.report["op_counts"]
    want = run_onnxruntime(g, feeds) if dtype == "float32" else run_reference(g, feeds)
    for k, v in model.run(feeds).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cols", [1, 7, 8, 9, 16, 197, 1000])
def test_softmax_row_kernel_in_place_and_not_on_edge_values(cols):
    """The float32 row softmax (16 lanes in registers, 8 on AVX2, a masked tail): widths with and without a tail, in
    place and into another buffer, large logits, a row of -inf but one, and NaN or +inf in a
    row making it all NaN, as NumPy does. (Without a C compiler the fused kernel's NumPy form
    runs, and is held to the same.)"""
    from ge_cpu.fused.loopgen import row_kernel
    from ge_cpu.fused.norms import softmax_inplace

    fn = row_kernel("softmax", "float32")
    if fn is None:
        def fn(x, out):
            np.copyto(out, x)
            softmax_inplace(out, -1)
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((6, cols)) * 10).astype(np.float32)
    x[1, 0] = 88.0
    x[2, :] = -np.inf
    x[2, -1] = 0.0
    x[3, cols // 2] = np.nan
    x[4, 0] = np.inf
    with np.errstate(invalid="ignore"):
        want = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        want /= want.sum(axis=1, keepdims=True)
    out = np.full_like(x, 7.0)
    fn(x, out)
    inplace = x.copy()
    fn(inplace, inplace)
    for got in (out, inplace):
        np.testing.assert_allclose(got[[0, 1, 2, 5]], want[[0, 1, 2, 5]], rtol=1e-5, atol=1e-30)
        assert np.isnan(got[3]).all() and np.isnan(got[4]).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cols", [5, 16, 17, 197])
@pytest.mark.parametrize("alpha,period", [(0.125, 0), (1.0, 1), (0.125, 6), (-0.5, 0), (-0.5, 6)])
def test_scaled_softmax_row_kernel(cols, alpha, period, dtype):
    """softmax(x * alpha + mask row i % P): attention's scores scaled and masked as the row kernel
    reads them; against float64 NumPy, in place and into another buffer, a masked (-inf) key, the
    same bits on 1 and 2 threads; arguments that disagree are refused. (Without a C compiler the
    fused attention runs NumPy's passes, the scaling, the mask and the row softmax, held to the
    same.)"""
    from ge_cpu.fused.loopgen import row_kernel
    from ge_cpu.fused.norms import softmax_inplace
    from ge_native import parallel

    fn = row_kernel("softmax_scaled", dtype)
    native = fn is not None
    if not native:
        def fn(x, alpha, mask, period, out):
            np.multiply(x, x.dtype.type(alpha), out=out)
            if period:
                out += np.tile(mask, (x.shape[0] // period, 1))
            softmax_inplace(out, -1)
    rng = np.random.default_rng(cols + period)
    x = (rng.standard_normal((240, cols)) * 8).astype(dtype)
    mask = (rng.standard_normal((max(period, 1), cols)) * 3).astype(dtype)
    mask[:, 0] = -np.inf
    v = x.astype(np.float64) * alpha
    if period:
        v = v + np.tile(mask, (240 // period, 1))
    want = np.exp(v - v.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    got = {}
    for width in (1, 2):
        with parallel.use_threads(width):
            out = np.full_like(x, 7.0)
            fn(x, alpha, mask, period, out)
            inplace = x.copy()
            fn(inplace, alpha, mask, period, inplace)
        np.testing.assert_array_equal(out, inplace)
        np.testing.assert_allclose(out, want, rtol=2e-5 if dtype == "float32" else 1e-12, atol=1e-30)
        got[width] = out
    np.testing.assert_array_equal(got[1], got[2])
    if native and period > 1:
        with pytest.raises(ValueError):
            fn(x[:5].copy(), alpha, mask, period, np.empty_like(x[:5]))  # rows not a multiple of P
    if native and period:
        both = np.concatenate([x, mask[:1]])
        with pytest.raises(ValueError):
            fn(both, alpha, both[-1:], 1, both)  # the mask inside the output


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", ["scale_bias", "scale_only", "input_scale", "stats_unused", "mean_used", "axis_1"])
def test_onnx_layernorm_runs_as_a_row_kernel(case, dtype):
    shape = (3, 17, 384)
    rng = np.random.default_rng(2)
    b = GraphBuilder("ln")
    b.graph.opset_imports[""] = 17
    x = b.input("x", dtype, shape)
    scale = b.input("s", dtype, (384,)) if case == "input_scale" else b.const(rng.random(384).astype(dtype) + 0.5)
    ins = [x, scale] + ([] if case == "scale_only" else [b.const(rng.standard_normal(384).astype(dtype))])
    axis = 1 if case == "axis_1" else -1
    if case in ("mean_used", "stats_unused"):
        y, mean, inv = b.LayerNormalization(*ins, num_outputs=3, epsilon=1e-3, axis=axis)
        b.output(*([y, mean] if case == "mean_used" else [y]))
    else:
        b.output(b.LayerNormalization(*ins, epsilon=1e-3, axis=axis))
    g = b.build()
    feeds = random_inputs(g, seed=3)
    feeds["x"] = (feeds["x"] * 5 + 2).astype(dtype)
    model = ge.compile(g)
    fused = "ge.fused::LayerNorm" in model.report["op_counts"]
    assert fused == (case in ("scale_bias", "scale_only", "input_scale", "stats_unused")), model.report["op_counts"]
    want = run_onnxruntime(g, feeds) if dtype == "float32" else run_reference(g, feeds)
    for k, v in model.run(feeds).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_row_kernels_are_switchable(tmp_path):
    import json

    b = GraphBuilder("sm")
    x = b.input("x", "float32", (8, 128))
    b.output(b.Softmax(x, axis=-1))
    p = tmp_path / "switch.json"
    p.write_text(json.dumps({"Switch": {"GraphFusion": {"softmax_kernel": "off"}}}))
    model = ge.compile(b.build(), {"fusion_switch_file": str(p)})
    assert "ge.fused::Softmax" not in model.report["op_counts"]


@pytest.mark.parametrize("op,attrs", [("Erf", {}), ("Softplus", {}), ("LeakyRelu", {"alpha": 0.1}), ("Elu", {"alpha": 0.5})])
def test_slow_single_ops_become_one_loop(op, attrs):
    for shape, dtype, fused in [((64, 4096), "float32", True), ((8, 8), "float32", False),
                                ((64, 4096), "float64", False)]:
        b = GraphBuilder(op)
        x = b.input("x", dtype, shape)
        b.output(getattr(b, op)(x, **attrs))
        g = b.build()
        model = ge.compile(g)
        assert ("ge.fused::FusedElemwise" in model.report["op_counts"]) == fused, (shape, dtype, model.report)
        feeds = random_inputs(g, seed=5)
        want = run_onnxruntime(g, feeds) if dtype == "float32" else run_reference(g, feeds)
        for k, v in model.run(feeds).items():
            np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-6)


def test_in_place_loops_read_the_operand_through_the_output():
    # An exact alias of an operand and the output fails the compiler's run-time overlap check,
    # and that loop runs scalar (GELU in place was 13x slower than into another buffer): the
    # in-place call runs a variant that reads that operand through the output array, built with
    # the loop (one module).
    prog = codegen.dumps([("Mul", ["a0", "a1"], {}), ("Gelu", ["t0"], {"approximate": "none"})])
    before = loopgen.stats()["inplace_variants"]
    fn = codegen.compile_program(prog, ["float32"] * 2, [(64, 300), (300,)], "float32", (64, 300), mode="loop")
    assert caps(fn).mode == "loop"
    assert loopgen.stats()["inplace_variants"] == before + 1  # a0 is laid out like the output; a1 is not
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 300)).astype(np.float32)
    row = rng.standard_normal(300).astype(np.float32)
    want = fn(x, row)
    y = x.copy()
    assert fn(y, row, out=y) is y
    np.testing.assert_array_equal(y, want)
    z = x.copy()
    fn(z, row, out=z)
    np.testing.assert_array_equal(z, want)
    assert loopgen.stats()["inplace_variants"] == before + 1  # nothing more is built at run time
    # an output that overlaps an operand other than exactly still gets the general loop's answer
    big = np.concatenate([x.reshape(-1), np.zeros(300, np.float32)])
    shifted = big[300:].reshape(64, 300)
    fn(big[:-300].reshape(64, 300), row, out=shifted)
    assert np.isfinite(shifted).all()


@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
def test_row_kernels_in_place_match_their_out_of_place_form(kind):
    fn = loopgen.row_kernel(kind, np.float32)
    x = np.random.default_rng(4).standard_normal((33, 77)).astype(np.float32)
    g = np.random.default_rng(5).standard_normal(77).astype(np.float32)
    b = np.random.default_rng(6).standard_normal(77).astype(np.float32)
    call = (lambda a, o: fn(a, o)) if kind == "softmax" else (lambda a, o: fn(a, g, b, np.float32(1e-5), o))
    want = np.empty_like(x)
    call(x, want)
    y = x.copy()
    call(y, y)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rows,cols", [(700, 384), (197, 192), (3, 20000), (1, 40000)])
@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
def test_row_kernels_split_over_threads_give_the_same_bits(kind, rows, cols):
    """Every row once, whatever the split: even parts of the rows (fewer rows than parts: a row
    each), the same bits at every width."""
    fn = loopgen.row_kernel(kind, np.float32)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    params = {"softmax": (), "layernorm": (g, b, np.float32(1e-5)), "rmsnorm": (g, np.float32(1e-6))}[kind]
    one = np.empty_like(x)
    fn(x, *params, one)
    for width in (2, 3):
        with parallel.use_threads(width):
            y = np.empty_like(x)
            loopgen.by_rows(fn, x, y, *params)
            np.testing.assert_array_equal(y, one)
            z = x.copy()
            loopgen.by_rows(fn, z, z, *params)  # in place
            np.testing.assert_array_equal(z, one)


def test_a_loop_with_symbolic_dims_is_compiled_once_and_serves_every_shape():
    """Shapes known only as symbols (batch, seq): one loop for their layout class (a full operand,
    a row vector, a column), NumPy's code for a call whose layout differs (a symbol at 1)."""
    from ge_core.ir import symbolic as S

    full, row, col = ("n", S.mul("s", 2), 64), (64,), ("n", S.mul("s", 2), 1)
    fn = codegen.compile_program(BN_RELU, ["float32"] * 3, [None, (64,), None], "float32", None,
                                 symbolic=([full, row, col], full))
    assert caps(fn).mode == "loop"
    ref = codegen.compile_program(BN_RELU, ["float32"] * 3, [None, (64,), None], "float32", None, mode="numpy")
    rng = np.random.default_rng(0)
    for n, s in [(2, 3), (5, 40), (1, 7), (3, 1)]:  # n = 1 changes the layout class: NumPy's code runs
        xs = [rng.standard_normal(sh).astype(np.float32) for sh in [(n, 2 * s, 64), (64,), (n, 2 * s, 1)]]
        np.testing.assert_allclose(fn(*xs), ref(*xs), rtol=1e-6)
        out = np.empty((n, 2 * s, 64), np.float32)
        assert fn(*xs, out=out) is out
        np.testing.assert_allclose(out, ref(*xs), rtol=1e-6)
