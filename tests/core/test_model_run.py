"""CompiledModel.run: input checking, concurrency, the input graph left untouched."""

import threading

import numpy as np
import pytest

import ge_core as ge
from ge_core import InputError, TensorType, hookimpl
from ge_sdk import GraphBuilder, temporary_plugin


def mlp(batch="N"):
    rng = np.random.default_rng(0)
    b = GraphBuilder("mlp")
    x = b.input("x", "float32", (batch, 16))
    w1 = b.const(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = b.const(rng.standard_normal((32, 4)).astype(np.float32), "w2")
    h = b.op("Relu", b.op("MatMul", x, w1))
    y = b.op("Softmax", b.op("MatMul", h, w2), axis=-1)
    b.output(y)
    return b.graph


def test_input_errors_name_the_input():
    model = ge.compile(mlp())
    with pytest.raises(InputError, match="missing input.*'x'"):
        model.run({})
    with pytest.raises(InputError, match="unknown input.*'y'"):
        model.run({"x": np.zeros((1, 16), np.float32), "y": 1})
    with pytest.raises(InputError, match="dtype float64.*float32"):
        model.run({"x": np.zeros((1, 16))})
    with pytest.raises(InputError, match=r"shape \[2, 15\]"):
        model.run({"x": np.zeros((2, 15), np.float32)})
    with pytest.raises(InputError, match="rank"):
        model.run({"x": np.zeros((16,), np.float32)})


def test_symbolic_batch_runs_any_size_and_matches_numpy():
    g = mlp()
    model = ge.compile(g)
    for n in (1, 3, 8):
        x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
        w1, w2 = g.constants["w1"].const_value, g.constants["w2"].const_value
        z = np.maximum(x @ w1, 0) @ w2
        want = np.exp(z - z.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        (got,) = model.run({"x": x}).values()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_compile_does_not_touch_the_input_graph():
    g = mlp()
    before = str(g)
    ge.compile(g, {"input_shape": "x:4,16"})
    assert str(g) == before and g.inputs[0].type == TensorType("float32", ("N", 16))


def test_many_threads_share_one_model():
    model = ge.compile(mlp())
    xs = [np.random.default_rng(i).standard_normal((4, 16)).astype(np.float32) for i in range(16)]
    want = [model.run({"x": x}) for x in xs]
    errors = []

    def worker(k):
        try:
            for r in range(25):
                i = (k + r) % len(xs)
                got = model.run({"x": xs[i]})
                for a, b in zip(got.values(), want[i].values()):
                    np.testing.assert_array_equal(a, b)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]


def test_kernel_failure_names_node_and_inputs():
    class Bad:
        @hookimpl
        def ge_register_ops(self, register):
            register(ge.OpDef("Explode", domain="t", min_inputs=1, max_inputs=1,
                              infer=lambda node, opset: [node.inputs[0].type]))

        @hookimpl
        def ge_register_kernels(self, register):
            def factory(spec):
                def k(x):
                    raise ValueError("kaboom")
                return k
            register("Explode", factory, domain="t")

    with temporary_plugin(Bad(), "bad_kernel"):
        b = GraphBuilder()
        b.graph.opset_imports["t"] = 1
        x = b.input("x", "float32", (2,))
        b.output(b.op("Explode", x, domain="t"))
        model = ge.compile(b.graph)
        with pytest.raises(ge.ExecutionError, match=r"node 'explode' \(t::Explode\).*float32\[2\].*kaboom"):
            model.run({"x": np.zeros(2, np.float32)})


def test_every_hookspec_is_documented():
    from ge_core import hookspecs

    specs = [n for n in dir(hookspecs) if n.startswith("ge_")]
    assert len(specs) >= 15
    for name in specs:
        doc = getattr(hookspecs, name).__doc__ or ""
        assert len(doc.strip()) > 40, name


def test_load_tells_the_format_of_model_bytes(tmp_path):
    import onnxruntime as ort

    from tests.conftest import light_model_path

    data = open(light_model_path("squeezenet"), "rb").read()
    g = ge.load(data)  # no framework given: the bytes are sniffed like a file's head
    assert g.metadata["framework"] == "onnx"
    assert ge.load(memoryview(data)).metadata["framework"] == "onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    # the model read from bytes is the model read from its file: the same bits at the same settings
    # (against onnxruntime only loosely: the light models' constant weights make logits of ~1e6,
    # whose softmax turns rounding into visible differences)
    got = next(iter(ge.compile(g, {"threads": 1}).run({g.inputs[0].name: x}).values()))
    from_file = next(iter(ge.compile(light_model_path("squeezenet"), {"threads": 1}).run({g.inputs[0].name: x}).values()))
    np.testing.assert_array_equal(got, from_file)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {g.inputs[0].name: x})[0]
    np.testing.assert_allclose(got, want, atol=5e-3)
    assert abs(float(got.sum()) - 1) < 1e-4  # a softmax
    om = tmp_path / "m.om"
    ge.compile(g).save(om)
    with pytest.raises(ge.ModelFileError, match="compiled .om"):
        ge.load(om.read_bytes())
    with pytest.raises(ge.ModelFileError, match="cannot tell the format of 11 bytes"):
        ge.load(b"hello world")
