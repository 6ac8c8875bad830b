"""Compiled loops take attribute values as parameters (ge_cpu.fused.loopgen.PARAMETRIC): programs
that differ only in those values (a quantised model's fake-quant chains, each with its own scale
and range) share one compiled loop and give the literal form's bits."""

import platform
import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import ge_core as ge
from ge_core.kernel import caps
from ge_cpu.fused import codegen, loopgen
from ge_native import native, parallel


def _fq_chain(scale, lo, hi, scale2, lo2, hi2):
    """FakeQuant -> Relu -> FakeQuant (a QDQ model's activation between two quantised ops)."""
    return [("FakeQuant", ["a0"], {"scale": scale, "lo": lo, "hi": hi}), ("Relu", ["t0"], {}),
            ("FakeQuant", ["t1"], {"scale": scale2, "lo": lo2, "hi": hi2})]


def _x(dtype, shape=(37, 300), seed=0):
    x = (np.random.default_rng(seed).standard_normal(shape) * 4).astype(dtype)
    # edge values, and ties of x / scale = k + 0.5 for the scales below (round half to even)
    x.flat[:10] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 0.025, 0.075, -0.125, 6.425]
    return x


def _bits(a):
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def _loop(steps, n_in, dtype, shape, parametric, monkeypatch):
    monkeypatch.setattr(loopgen, "PARAMETRIC", parametric)
    names = [f"a{i}" for i in range(n_in)]
    in_shapes = [shape] + [shape[-1:]] * (n_in - 1)
    fn = loopgen.loop_kernel(steps, names, [dtype] * n_in, in_shapes, dtype, shape)
    assert fn is not None and caps(fn).mode == "loop"
    return fn


def test_two_chains_of_one_structure_share_one_compiled_loop():
    shape = (61, 257)
    a = codegen.dumps(_fq_chain(0.05, -128.0, 127.0, 0.031, 0.0, 255.0))
    b = codegen.dumps(_fq_chain(0.0173, -127.0, 127.0, 0.0029, 0.0, 255.0))
    fa = codegen.compile_program(a, ["float32"], [shape], "float32", shape, mode="loop")
    before, built = loopgen.stats(), native.stats()
    fb = codegen.compile_program(b, ["float32"], [shape], "float32", shape, mode="loop")
    after, built_after = loopgen.stats(), native.stats()
    assert caps(fa).mode == caps(fb).mode == "loop"
    # the second chain compiled nothing and loaded nothing: the first one's loop serves it
    assert after["compiled"] == before["compiled"] and after["reused"] == before["reused"] + 1
    assert (built_after["compiled"], built_after["cached"]) == (built["compiled"], built["cached"])
    assert fa.source == fb.source and fa.library == fb.library
    # no value of either program is in the C
    for v in ("0x1.99999ap-5f", "0x1.fcp+6f", "0x1.fep+7f"):
        assert v not in fa.source
    # each with its own values: NumPy's form of its own program (equal values; NumPy's Relu
    # differs from the loops' on NaN and -0, as every loop's does)
    x = _x(np.float32, shape)
    with np.errstate(all="ignore"):
        got_a, got_b = fa(x), fb(x)
        for prog, got in ((a, got_a), (b, got_b)):
            want = codegen.compile_program(prog, ["float32"], [shape], "float32", shape, mode="numpy")(x)
            np.testing.assert_allclose(got, want, rtol=0, atol=0, equal_nan=True)
    assert not np.allclose(got_a, got_b, equal_nan=True)


#: programs whose attribute values become parameters, each with a row and a scalar operand
PROGRAMS = [
    _fq_chain(0.05, -128.0, 127.0, 0.031, 0.0, 255.0),
    _fq_chain(0.0625, -8.0, 7.0, 3.0, 0.0, 15.0),  # a power of two (the literal divide becomes a multiply)
    [("Clip", ["a0"], {"min": -0.5, "max": 0.7}), ("Add", ["t0", "a1"], {}),
     ("Clip", ["t1"], {"min": None, "max": 6.0}), ("FakeQuant", ["t2"], {"scale": 0.1, "lo": -3.0, "hi": 9.0})],
    [("LeakyRelu", ["a0"], {"alpha": 0.2}), ("HardSigmoid", ["t0"], {"alpha": 0.3, "beta": 0.4}),
     ("Mul", ["t1", "a1"], {}), ("Elu", ["t2"], {"alpha": 0.7}), ("Max", ["t3", "a2"], {})],
    [("Clip", ["a0"], {"min": float("-inf"), "max": float("nan")}), ("Sub", ["t0", "a1"], {})],  # literals
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", range(len(PROGRAMS)))
def test_parametric_and_literal_loops_give_the_same_bits(k, dtype, monkeypatch):
    steps = PROGRAMS[k]
    n_in = 1 + max(int(r[1:]) for _, refs, _ in steps for r in refs if r[0] == "a")
    shape = (129, 515)
    x = _x(dtype, shape)
    operands = [x] + [(np.random.default_rng(1 + i).standard_normal(shape[-1:]) * 2).astype(dtype)
                      for i in range(n_in - 1)]
    if dtype == "float64" and any(op == "Elu" for op, _, _ in steps):
        return  # (libm's expm1 per element: no loop form in float64)
    lit = _loop(steps, n_in, dtype, shape, False, monkeypatch)
    par = _loop(steps, n_in, dtype, shape, True, monkeypatch)
    assert ("kp" in par.source) == (k < len(PROGRAMS) - 1) and "kp" not in lit.source
    ref = codegen.compile_program(codegen.dumps(steps), [dtype] * n_in, [o.shape for o in operands], dtype, shape,
                                  mode="numpy")
    with np.errstate(all="ignore"):
        want = _bits(lit(*operands))
        for width in (1, 2):  # the split loop too (2 threads)
            with parallel.use_threads(width):
                np.testing.assert_array_equal(_bits(par(*operands)), want)
        # and NumPy's form, value for value (NumPy's own expm1 aside)
        tol = 1e-6 if any(op == "Elu" for op, _, _ in steps) else 0
        np.testing.assert_allclose(par(*operands), ref(*operands), rtol=tol, atol=tol, equal_nan=True)


def test_parametric_loops_vectorise(monkeypatch):
    # a bound the compiler cannot see is a number: the max/min without its NaN test
    # (csrc/fused_bounds.h), else GCC leaves the loop scalar (17x slower); the rounding and the
    # clamps run on packed registers, as the literal form's do
    fn = _loop(PROGRAMS[0], 1, "float32", (64, 4096), True, monkeypatch)
    assert "ge_maxk32(" in fn.source and "ge_max32(" in fn.source  # (the Relu keeps its literal 0)
    if platform.machine() not in ("x86_64", "AMD64"):
        return
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", fn.library], capture_output=True, text=True,
                         check=True).stdout
    assert re.search(r"\bv(rndscale|round)ps\b", asm) and re.search(r"\bv(max|min)ps\b", asm)
    assert not re.search(r"call.*<rintf(@plt)?>", asm)


def _first(outputs):
    return next(iter(outputs.values())) if isinstance(outputs, dict) else outputs[0]


def _qdq_model(chains: int, width: int = 96) -> onnx.ModelProto:
    """``chains`` sections Q/DQ -> Relu -> Q/DQ -> Softmax, each Q/DQ with its own scale and
    zero point: a QDQ model's fake-quant chains, one structure, all different constants."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(chains):
        for j, zp in ((0, 128 + i % 7), (1, 0)):
            s, z = f"s{i}_{j}", f"z{i}_{j}"
            inits += [nh.from_array(np.array(rng.uniform(0.004, 0.05), np.float32), s),
                      nh.from_array(np.array(zp, np.uint8), z)]
            nodes += [h.make_node("QuantizeLinear", [x, s, z], [f"q{i}_{j}"]),
                      h.make_node("DequantizeLinear", [f"q{i}_{j}", s, z], [f"d{i}_{j}"])]
            x = f"d{i}_{j}"
            if j == 0:
                nodes.append(h.make_node("Relu", [x], [f"r{i}"]))
                x = f"r{i}"
        nodes.append(h.make_node("Softmax", [x], [f"sm{i}"], axis=-1))
        nodes.append(h.make_node("Mul", [f"sm{i}", "ten"], [f"m{i}"]))
        x = f"m{i}"
    inits.append(nh.from_array(np.array(10.0, np.float32), "ten"))
    g = h.make_graph(nodes, "fq_chains", [h.make_tensor_value_info("x", T.FLOAT, [4, 64, width])],
                     [h.make_tensor_value_info(x, T.FLOAT, [4, 64, width])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_model_of_fifty_chains_compiles_a_bounded_number_of_loops(monkeypatch, tmp_path):
    model = _qdq_model(50)
    x = (np.random.default_rng(3).standard_normal((4, 64, 96)) * 3).astype(np.float32)
    built = []
    real_build = native.build
    monkeypatch.setattr(native, "build", lambda src, fns, **kw: built.append(src) or real_build(src, fns, **kw))
    before = loopgen.stats()
    compiled = ge.compile(ge.load(model))
    got = _first(compiled.run({"x": x}))
    assert loopgen.stats()["reused"] - before["reused"] >= 45  # the chains' loops: built once, then reused
    loops = {s for s in built if "static PyObject *kernel(" in s and "kp" in s}
    assert 1 <= len(loops) <= 4, len(loops)  # one per structure, not one per chain
    # the same bits as NumPy's forms (the loops off), and from the saved .om (the stored program
    # is the same: attribute values in the program, parameters only in the C)
    om = str(tmp_path / "chains.om")
    compiled.save(om)
    np.testing.assert_array_equal(_bits(_first(ge.load_om(om).run({"x": x}))), _bits(got))
    monkeypatch.setenv("GE_FUSION_JIT", "0")
    want = _first(ge.compile(ge.load(model)).run({"x": x}))
    np.testing.assert_array_equal(_bits(got), _bits(want))
