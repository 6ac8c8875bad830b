"""Each built-in pattern fuses what it should, keeps semantics, and the switch file turns it off."""

import json
import math

import numpy as np
import pytest

import ge_core as ge
from ge_core.kernel import caps
from ge_cpu.fused import codegen
from ge_fusion.rules import RULES
from ge_sdk.patterns import explain
from ge_sdk.testing import GraphBuilder, random_inputs, run_graph, run_onnxruntime


def check(g, *, expect=(), absent=(), switch=None, tmp_path=None):
    """Compile ``g`` with fusion; compare with onnxruntime and the unoptimised graph. (The cpu
    backend's nchwc_layout pass, which would turn the fused convolutions into its blocked ones
    after the patterns ran, is off: tests/kernels/test_nchwc_layout.py checks it.)"""
    opts: dict = {"disabled_passes": ["nchwc_layout"]}
    if switch is not None:
        p = tmp_path / "switch.json"
        p.write_text(json.dumps({"Switch": switch}))
        opts["fusion_switch_file"] = str(p)
    feeds = random_inputs(g, seed=1)
    model = ge.compile(g, opts)
    ops = model.report["op_counts"]
    for op in expect:
        assert op in ops, ops
    for op in absent:
        assert op not in ops, ops
    got = model.run(feeds)
    try:
        want = run_onnxruntime(g, feeds)
    except ge.GEError:
        want = run_graph(g, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-4, err_msg=k)
    return model


def conv_graph(act="Relu", residual=True, bn=True):
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 4, 9, 9))
    y = b.Conv(x, b.random_const((8, 4, 3, 3)), b.random_const((8,)), pads=[1, 1, 1, 1])
    if bn:
        y = b.BatchNormalization(y, b.const(np.linspace(0.5, 2, 8).astype(np.float32)), b.random_const((8,)),
                                 b.random_const((8,)), b.const(np.linspace(1, 3, 8).astype(np.float32)))
    if residual:
        y = b.Add(y, b.Conv(x, b.random_const((8, 4, 1, 1))))
    if act == "Clip":
        y = b.Clip(y, np.float32(0), np.float32(6))
    elif act == "LeakyRelu":
        y = b.LeakyRelu(y, alpha=0.1)
    elif act:
        y = b.op(act, y)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish"])
def test_conv_bn_residual_activation_is_one_fused_conv(act):
    model = check(conv_graph(act), expect=["ge.fused::FusedConv"], absent=["BatchNormalization", act])
    assert model.report["op_counts"]["ge.fused::FusedConv"] == 1  # conv + bn + add + act; the shortcut stays
    assert model.report["kernels"] == 2


def test_switch_file_keeps_each_pattern_unfused(tmp_path):
    g = conv_graph("Relu")
    m = check(g, switch={"GraphFusion": {"batchnorm_conv_fusion": "off"}}, tmp_path=tmp_path)
    # not folded into the weights: automatic fusion computes it in the conv's epilogue instead
    assert any('"Mul"' in n.attrs.get("epilogue", "") for n in m.graph.nodes)
    m = check(g, switch={"GraphFusion": {"batchnorm_conv_fusion": "off"}, "UBFusion": {"auto_fusion": "off"}},
              tmp_path=tmp_path)
    assert "BatchNormalization" in m.report["op_counts"]
    m = check(g, switch={"UBFusion": {"conv_activation_fusion": "off", "conv_residual_fusion": "off",
                                      "auto_fusion": "off"}}, tmp_path=tmp_path)
    assert "Relu" in m.report["op_counts"] and "Add" in m.report["op_counts"]
    m = check(g, switch={"GraphFusion": {"ALL": "off"}}, tmp_path=tmp_path)
    assert not any(k.startswith("ge.fused::") for k in m.report["op_counts"])


def test_every_builtin_pattern_is_registered_by_name():
    regs = ge.plugins.get_host().registries if hasattr(ge, "plugins") else None
    from ge_core.plugins import get_host

    regs = get_host().registries
    for name in RULES:
        assert name in regs.fusion_patterns
    assert "pattern_fusion" in regs.passes and "auto_fusion" in regs.passes


def gelu_graph(form):
    b = GraphBuilder()
    x = b.input("x", "float32", (4, 64))
    if form == "erf":
        y = b.Mul(b.Mul(x, np.float32(0.5)), b.Add(np.float32(1.0), b.Erf(b.Mul(x, np.float32(1 / math.sqrt(2))))))
    else:
        inner = b.Add(x, b.Mul(b.Pow(x, np.float32(3.0)), np.float32(0.044715)))
        t = b.Tanh(b.Mul(inner, np.float32(math.sqrt(2 / math.pi))))
        y = b.Mul(x, b.Mul(b.Add(t, np.float32(1.0)), np.float32(0.5)))
    b.output(b.Relu(b.MatMul(y, b.random_const((64, 8)))))
    return b.build()


@pytest.mark.parametrize("form,rule", [("erf", "gelu_fusion"), ("tanh", "gelu_tanh_fusion")])
def test_gelu_forms_are_recognised_and_switchable(form, rule, tmp_path):
    check(gelu_graph(form), expect=["ge.fused::Gelu"], absent=["Tanh", "Erf"])
    m = check(gelu_graph(form), switch={"GraphFusion": {rule: "off"}}, tmp_path=tmp_path)
    assert "ge.fused::Gelu" not in m.report["op_counts"]


def test_silu_softmax_and_layernorm_are_recognised():
    b = GraphBuilder()
    x = b.input("x", "float32", (3, 16))
    s = b.Mul(b.Sigmoid(x), x)
    e = b.Exp(b.Sub(s, b.ReduceMax(s, axes=[-1])))
    sm = b.Div(e, b.ReduceSum(e, np.array([-1], np.int64)))
    mean = b.ReduceMean(sm, axes=[-1])
    d = b.Sub(sm, mean)
    ln = b.Div(d, b.Sqrt(b.Add(b.ReduceMean(b.Mul(d, d), axes=[-1]), np.float32(1e-5))))
    b.output(b.MatMul(ln, b.random_const((16, 4))))
    check(b.build(), expect=["ge.fused::Silu", "ge.fused::Softmax", "ge.fused::LayerNorm"],
          absent=["Exp", "ReduceMean", "Sigmoid"])


def test_pad_folds_into_conv_and_pools():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 8, 8))
    p = b.Pad(x, np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64))
    y = b.Conv(p, b.random_const((4, 3, 3, 3)))
    q = b.Pad(y, np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    b.output(b.AveragePool(q, kernel_shape=[3, 3]))
    b.output(b.MaxPool(b.Pad(y, np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), np.float32(-np.inf)), kernel_shape=[2, 2]))
    check(b.build(), absent=["Pad"])


def test_pad_folds_into_a_valid_conv_and_pool():
    # EfficientNet as transformers writes it: ZeroPad2d then Conv(auto_pad=VALID), stride 2
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 3, 9, 9))
    p = b.Pad(x, np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64))
    y = b.Conv(p, b.random_const((4, 3, 3, 3)), strides=[2, 2], auto_pad="VALID")
    q = b.Pad(y, np.array([0, 0, 1, 0, 0, 0, 0, 1], np.int64), np.float32(-np.inf))
    b.output(b.MaxPool(q, kernel_shape=[2, 2], auto_pad="VALID"))
    check(b.build(), absent=["Pad"])


def test_transpose_and_gemm_folds():
    b = GraphBuilder()
    a = b.input("a", "float32", (2, 5, 6))
    c = b.input("c", "float32", (2, 7, 6))
    mm = b.MatMul(a, b.Transpose(c, perm=[0, 2, 1]))
    g_in = b.input("g", "float32", (6, 4))
    gemm = b.Gemm(b.Transpose(g_in, perm=[1, 0]), b.random_const((6, 3)), b.random_const((3,)))
    gemm = b.Add(b.Mul(gemm, b.const(np.array([1.0, 2.0, 3.0], np.float32))), b.const(np.array([0.5, 0, -1], np.float32)))
    bn = b.BatchNormalization(gemm, b.random_const((3,)), b.random_const((3,)), b.random_const((3,)),
                              b.const(np.ones(3, np.float32)))
    b.output(mm, b.Relu(bn))
    check(b.build(), expect=["ge.fused::FusedMatMul"], absent=["Transpose", "BatchNormalization", "Mul", "Relu"])


def test_attention_without_mask_or_with_mul_scale():
    b = GraphBuilder()
    q = b.input("q", "float32", (2, 4, 8))
    k = b.input("k", "float32", (2, 8, 4))
    v = b.input("v", "float32", (2, 4, 8))
    b.output(b.MatMul(b.Softmax(b.Mul(np.float32(0.3), b.MatMul(q, k)), axis=-1), v))
    check(b.build(), expect=["ge.fused::Attention"], absent=["Softmax"])


def test_explain_says_why_a_pattern_did_not_match():
    g = conv_graph("Relu", residual=False, bn=False)
    relu = next(n for n in g.nodes if n.op_type == "Relu")
    assert explain(RULES["conv_activation_fusion"], relu)
    bn_rule = RULES["batchnorm_conv_fusion"]
    why = explain(bn_rule, relu)
    assert not why and "BatchNormalization" in str(why)


# ------------------------------------------------------------------------------------------------
# automatic fusion and generated kernels
# ------------------------------------------------------------------------------------------------
def chain_graph(n=(64, 128)):
    b = GraphBuilder()
    x = b.input("x", "float32", n)
    y = b.input("y", "float32", n[-1:])
    t = b.Mul(x, y)
    t = b.Add(t, np.float32(1.5))
    t = b.Tanh(t)
    t = b.Mul(t, x)
    t = b.Sub(t, y)
    t = b.Abs(t)
    t = b.Sqrt(t)
    t = b.Max(t, b.Neg(x))
    b.output(b.Sigmoid(t))
    return b.build()


def test_auto_fusion_makes_one_generated_kernel(tmp_path):
    m = check(chain_graph(), expect=["ge.fused::FusedElemwise"])
    assert m.report["kernels"] == 1
    m = check(chain_graph(), switch={"UBFusion": {"auto_fusion": "off"}}, tmp_path=tmp_path)
    assert m.report["kernels"] == 10


def test_diamond_and_shared_values_stay_correct():
    b = GraphBuilder()
    x = b.input("x", "float32", (8, 16))
    a = b.Exp(b.Neg(x))
    s = b.Add(a, b.Relu(x))
    b.output(b.Mul(s, a), b.Tanh(a))  # `a` feeds two groups: it ends its own group
    check(b.build(), expect=["ge.fused::FusedElemwise"])


@pytest.mark.parametrize("mode", ["loop", "numexpr", "numpy"])
def test_generated_kernels_agree_with_numpy(mode):
    steps = [("Mul", ["a0", "a1"], {}), ("Add", ["t0", "a0"], {}), ("Erf", ["t1"], {}), ("Relu", ["t2"], {}),
             ("LeakyRelu", ["t1"], {"alpha": 0.2}), ("Sum", ["t3", "t4", "a0"], {}),
             ("Clip", ["t5"], {"min": -0.5, "max": None}), ("HardSwish", ["t6"], {}), ("Silu", ["t7"], {}),
             ("Gelu", ["t8"], {"approximate": "none"}), ("Pow", ["t9", "a2"], {})]
    prog = codegen.dumps(steps)
    rng = np.random.default_rng(0)
    a0 = rng.standard_normal((50, 40)).astype(np.float32)
    a1 = rng.standard_normal((40,)).astype(np.float32)
    a2 = np.array(2.0, np.float32)
    fn = codegen.compile_program(prog, ["float32"] * 3, [(50, 40), (40,), ()], "float32", (50, 40), mode=mode)
    assert caps(fn).mode == mode
    import math as m

    erf = np.vectorize(m.erf)
    t1 = a0 * a1 + a0
    t5 = np.maximum(erf(t1), 0) + np.where(t1 > 0, t1, 0.2 * t1) + a0
    t6 = np.maximum(t5, -0.5)
    t7 = t6 * np.clip(t6 / 6 + 0.5, 0, 1)
    t8 = t7 / (1 + np.exp(-t7))
    t9 = 0.5 * t8 * (1 + erf(t8 / m.sqrt(2)))
    out = np.empty((50, 40), np.float32)
    got = fn(a0, a1, a2, out=out)
    assert got is out and got.dtype == np.float32
    np.testing.assert_allclose(got, t9 ** 2, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fn(a0, a1, a2), t9 ** 2, rtol=1e-4, atol=1e-5)
    before = codegen.cache_info()["hits"]
    codegen.compile_program(prog, ["float32"] * 3, [(50, 40), (40,), ()], "float32", (50, 40), mode=mode)
    assert codegen.cache_info()["hits"] == before + 1


def test_fused_model_round_trips_through_om(tmp_path):
    g = conv_graph("Sigmoid")
    feeds = random_inputs(g, seed=2)
    model = ge.compile(g)
    model.save(tmp_path / "m.om")
    again = ge.load_om(str(tmp_path / "m.om"))
    np.testing.assert_allclose(again.run(feeds)[model.output_names[0]], model.run(feeds)[model.output_names[0]],
                               rtol=1e-6)


@pytest.mark.parametrize("jit", ["1", "0"])
def test_large_kernel_handles_broadcast_inputs_and_in_place_output(jit, monkeypatch):
    # with numba: one compiled loop; with GE_FUSION_JIT=0: NumPy code run in cache-sized blocks
    monkeypatch.setenv("GE_FUSION_JIT", jit)
    prog = codegen.dumps([("Mul", ["a0", "a1"], {}), ("Add", ["t0", "a2"], {}), ("Sigmoid", ["t1"], {}),
                          ("Mul", ["t2", "a0"], {})])
    shapes = [(300, 700), (700,), (300, 1)]
    fn = codegen.compile_program(prog, ["float32"] * 3, shapes, "float32", (300, 700))
    assert caps(fn).mode == ("loop" if jit == "1" else "numpy-blocked")
    rng = np.random.default_rng(1)
    a0, a1, a2 = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    want = a0 / (1 + np.exp(-(a0 * a1 + a2)))
    np.testing.assert_allclose(fn(a0, a1, a2), want, rtol=1e-5, atol=1e-6)
    x = a0.copy()
    fn(x, a1, a2, out=x)  # the output may be a dying input's memory
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)
