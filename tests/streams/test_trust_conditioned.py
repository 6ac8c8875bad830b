"""Every executor gives the same bits on well-conditioned models (issue 15).

The light ONNX test models have dummy weights whose logits reach 1e10, so one ulp of GEMM
rounding flips their softmax: they only show that executors agree at equal BLAS thread counts.
These models are built here with weights scaled like a real initialisation (activations of
order one): a small CNN with parallel branches and a small transformer block. Each executor
and stream allocator must give exactly the sequential executor's bits (every executor runs
at the same BLAS count by construction, see ``ge_cpu.executor.BlasThreads``), and the
sequential results match onnxruntime within float32 tolerance. Results at different
``threads`` settings may differ by an ulp (how BLAS splits a GEMM), so each setting is compared
with the sequential executor at the same setting. The comparison is sensitive:
dropping one node of the schedule is caught.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from tests.streams.test_executors import CONFIGS  # every executor and stream allocator


def _init(rng, name, shape, fan_in):
    w = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)  # He init
    return numpy_helper.from_array(w, name)


def _cnn() -> onnx.ModelProto:
    """Conv stem, two parallel branches (1x1 and 3x3) concatenated, BN, pool, Gemm head, softmax."""
    rng = np.random.default_rng(11)
    inits = [
        _init(rng, "w0", (16, 3, 3, 3), 27), numpy_helper.from_array(np.zeros(16, np.float32), "b0"),
        _init(rng, "wa", (16, 16, 1, 1), 16), _init(rng, "wb", (16, 16, 3, 3), 144),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(32)).astype(np.float32), "g"),
        numpy_helper.from_array((0.1 * rng.standard_normal(32)).astype(np.float32), "beta"),
        numpy_helper.from_array((0.1 * rng.standard_normal(32)).astype(np.float32), "mean"),
        numpy_helper.from_array((1 + 0.1 * rng.random(32)).astype(np.float32), "var"),
        _init(rng, "wfc", (10, 32), 32), numpy_helper.from_array(np.zeros(10, np.float32), "bfc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "wa"], ["ca"]),
        helper.make_node("Relu", ["ca"], ["ra"]),
        helper.make_node("Conv", ["r0", "wb"], ["cb"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["cb"], ["rb"]),
        helper.make_node("Concat", ["ra", "rb"], ["cat"], axis=1),
        helper.make_node("BatchNormalization", ["cat", "g", "beta", "mean", "var"], ["bn"]),
        helper.make_node("MaxPool", ["bn"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["mp"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wfc", "bfc"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=-1),
    ]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 32, 32])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10]),
                           helper.make_tensor_value_info("prob", TensorProto.FLOAT, [2, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _transformer(seq: int = 16, d: int = 64, heads: int = 4) -> onnx.ModelProto:
    """One pre-norm block: LayerNorm, multi-head self-attention (softmax), residual, LayerNorm,
    GELU MLP (through Erf), residual."""
    rng = np.random.default_rng(12)
    hd = d // heads

    def lin(name, n_in, n_out):
        return [numpy_helper.from_array((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32), name)]

    inits = (lin("wq", d, d) + lin("wk", d, d) + lin("wv", d, d) + lin("wo", d, d) + lin("w1", d, 4 * d)
             + lin("w2", 4 * d, d))
    inits += [numpy_helper.from_array(np.ones(d, np.float32), "ln_g"), numpy_helper.from_array(np.zeros(d, np.float32), "ln_b"),
              numpy_helper.from_array(np.array([1, seq, heads, hd], np.int64), "split_shape"),
              numpy_helper.from_array(np.array([1, seq, d], np.int64), "merge_shape"),
              numpy_helper.from_array(np.array(1.0 / np.sqrt(hd), np.float32), "scale"),
              numpy_helper.from_array(np.array(1.0 / np.sqrt(2.0), np.float32), "rsqrt2"),
              numpy_helper.from_array(np.array(0.5, np.float32), "half"),
              numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["h"], axis=-1)]
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["h", f"w{p}"], [f"{p}0"]),
                  helper.make_node("Reshape", [f"{p}0", "split_shape"], [f"{p}1"]),
                  helper.make_node("Transpose", [f"{p}1"], [f"{p}h"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    nodes += [
        helper.make_node("MatMul", ["qh", "kh"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["att"], axis=-1),
        helper.make_node("MatMul", ["att", "vh"], ["o0"]),
        helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o1", "merge_shape"], ["o2"]),
        helper.make_node("MatMul", ["o2", "wo"], ["o3"]),
        helper.make_node("Add", ["x", "o3"], ["res1"]),
        helper.make_node("LayerNormalization", ["res1", "ln_g", "ln_b"], ["h2"], axis=-1),
        helper.make_node("MatMul", ["h2", "w1"], ["m0"]),
        helper.make_node("Mul", ["m0", "rsqrt2"], ["m1"]),
        helper.make_node("Erf", ["m1"], ["m2"]),
        helper.make_node("Add", ["m2", "one"], ["m3"]),
        helper.make_node("Mul", ["m0", "m3"], ["m4"]),
        helper.make_node("Mul", ["m4", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["m5"]),
        helper.make_node("Add", ["res1", "m5"], ["y"]),
    ]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {"cnn": _cnn, "transformer": _transformer}


def _feeds(proto: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in proto.graph.input}


def assert_same_bits(results: dict[str, dict[str, np.ndarray]], base: str = "sequential") -> None:
    ref = results[base]
    for label, out in results.items():
        assert list(out) == list(ref), label
        for k in ref:
            np.testing.assert_array_equal(out[k], ref[k], err_msg=f"{label} output {k} differs from {base}")


@pytest.mark.parametrize("threads", [None, 1, 2], ids=["baseline", "threads=1", "threads=2"])
@pytest.mark.parametrize("name", MODELS)
def test_executors_agree_bit_for_bit_on_well_conditioned_models(name, threads):
    proto = MODELS[name]()
    feeds = _feeds(proto)
    graph = ge.load(proto, framework="onnx")
    results, kinds = {}, {}
    for label, opts in CONFIGS.items():
        model = ge.compile(graph, {**opts, "threads": threads} if threads else opts)
        results[label] = model.run(feeds)
        kinds[label] = (type(model.executable).__name__, model.streams.count)
    # the multi-stream executors really ran several streams
    assert kinds["streams/dependency"][0] == "MultiStreamExecutable" and kinds["streams/dependency"][1] > 1
    assert kinds["sink/dependency"][0] == "StreamSinkExecutable" and kinds["sink/dependency"][1] > 1
    assert_same_bits(results)

    # well conditioned: O(1) values, input-dependent, and the same as onnxruntime
    seq = results["sequential"]
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for k, w in zip(seq, want):
        assert np.isfinite(seq[k]).all() and float(np.abs(seq[k]).max()) < 50, k
        np.testing.assert_allclose(seq[k], w, rtol=2e-4, atol=2e-5, err_msg=f"{name} {k} vs onnxruntime")
    other = ge.compile(graph, CONFIGS["sequential"]).run(_feeds(proto, seed=1))
    assert all(not np.allclose(other[k], seq[k], rtol=1e-3) for k in seq), "outputs do not depend on the input"
    if name == "cnn":
        assert float(np.std(seq["logits"])) > 0.05 and float(seq["prob"].max()) < 0.999  # softmax not saturated


@pytest.mark.parametrize("name", MODELS)
def test_the_comparison_catches_a_dropped_node(name):
    """The check above can fail: an executor that skips one node (a kernel replaced by a
    pass-through of its input) gives other bits, and assert_same_bits says so."""
    proto = MODELS[name]()
    feeds = _feeds(proto)
    graph = ge.load(proto, framework="onnx")
    base = ge.compile(graph, CONFIGS["sequential"]).run(feeds)
    model = ge.compile(graph, CONFIGS["arena"])
    # nodes whose output has their first input's type (Relu, Softmax, LayerNorm, fused chains...)
    victims = [st for st in model.executable.steps if st.node.inputs and st.node.inputs[0] is not None
               and st.node.op_type not in ("Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze")
               and st.node.outputs[0].type == st.node.inputs[0].type]
    assert victims, [st.node.op_type for st in model.executable.steps]
    st = victims[len(victims) // 2]

    def passthrough(*args, out=None):
        return (np.array(args[0], copy=True),)

    st.fn = passthrough
    with pytest.raises(AssertionError, match="differs from sequential"):
        assert_same_bits({"sequential": base, "arena": model.run(feeds)})
