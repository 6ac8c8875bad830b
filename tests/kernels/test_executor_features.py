"""ge_cpu executor features: control flow with captures, one error for every unsupported node,
the out= protocol of the hot kernels, BLAS thread counts per run, and ``ge ops``."""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ge_core as ge
from ge_core.errors import UnsupportedOpError
from ge_core.ir.graph import Graph
from ge_core.ir.types import TensorType
from ge_core.kernel import KernelSpec, caps
from ge_core.options import CompileOptions


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _compile(model: onnx.ModelProto, **opts):
    return ge.compile(ge.load(model, framework="onnx"), opts or None)


# ------------------------------------------------------------------------------------------
# control flow
# ------------------------------------------------------------------------------------------
def _loop_with_nested_if_model():
    """Loop whose body holds an If; both bodies read main-graph values (implicit captures)."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "bias"], ["t_out"])], "then", [], [_vi("t_out", [3])])
    else_g = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "scale"], ["e_out"])], "else", [], [_vi("e_out", [3])])
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
            helper.make_node("Less", ["i_f", "half"], ["first_half"]),
            helper.make_node("If", ["first_half"], ["acc_out"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["scan_out"], keepdims=0),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", [3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [3]), _vi("scan_out", [])],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["acc", "sums"], body=body)],
        "main",
        [_vi("trips", [], TensorProto.INT64), _vi("go", [], TensorProto.BOOL), _vi("x", [3]), _vi("bias", [3]), _vi("scale", [3]),
         _vi("half", [])],
        [_vi("acc", [3]), _vi("sums", [None])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_with_nested_if_reads_outer_values():
    model = _loop_with_nested_if_model()
    rng = np.random.default_rng(0)
    feeds = {"trips": np.array(6, np.int64), "go": np.array(True), "x": rng.standard_normal(3).astype(np.float32),
             "bias": rng.standard_normal(3).astype(np.float32), "scale": np.full(3, 0.5, np.float32),
             "half": np.array(3.0, np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)
    got = _compile(model).run(feeds)
    np.testing.assert_allclose(got["acc"], want[0], rtol=1e-6)
    # scalar scan outputs stack to (trips,) (onnx.reference's vstack gives (trips, 1))
    assert got["sums"].shape == (6,)
    np.testing.assert_allclose(got["sums"], want[1].reshape(-1), rtol=1e-6)


def test_scan_reverse_and_axes():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["x_t", "s_out"], ["y_t"])],
        "body", [_vi("s_in", [4]), _vi("x_t", [4])], [_vi("s_out", [4]), _vi("y_t", [4])])
    g = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                          scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1])],
        "main", [_vi("s0", [4]), _vi("xs", [4, 5])], [_vi("s", [4]), _vi("ys", [4, 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    feeds = {"s0": np.ones(4, np.float32), "xs": np.arange(20, dtype=np.float32).reshape(4, 5) / 10}
    # onnx.reference implements only forward scans: compute the expected values here
    s_, ys = feeds["s0"].copy(), []
    for t in reversed(range(5)):
        x_t = feeds["xs"][:, t]
        s_ = s_ + x_t
        ys.append(x_t * s_)
    got = _compile(model).run(feeds)
    np.testing.assert_allclose(got["s"], s_, rtol=1e-6)
    np.testing.assert_allclose(got["ys"], np.stack(ys, axis=1), rtol=1e-6)


def test_sequences_flow_between_nodes():
    g = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0),
         helper.make_node("SequenceLength", ["seq"], ["n"]),
         helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=1, new_axis=1)],
        "main", [_vi("x", [3, 2])], [_vi("n", [], TensorProto.INT64), _vi("y", None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    got = _compile(model).run({"x": x})
    want = ReferenceEvaluator(model).run(None, {"x": x})
    assert int(got["n"]) == 3
    np.testing.assert_array_equal(got["y"], want[1])


# ------------------------------------------------------------------------------------------
# one error for everything the backend cannot run
# ------------------------------------------------------------------------------------------
def test_every_unsupported_node_is_named_at_once():
    from ge_cpu.executor import SequentialExecutable

    g = Graph("g")
    x = g.add_input("x", TensorType(np.float32, (2,)))
    a = g.add_node("Frobnicate", [x], domain="my.domain", name="f1").outputs[0]
    b = g.add_node("Frobnicate", [a], domain="my.domain", name="f2").outputs[0]
    c = g.add_node("Relu", [b], name="r").outputs[0]
    d = g.add_node("Twiddle", [c], name="t").outputs[0]
    g.outputs.append(d)

    def refuse(spec: KernelSpec):
        raise UnsupportedOpError(f"{spec.describe()}: float32 is not supported by this test kernel")

    with pytest.raises(UnsupportedOpError) as ei:
        SequentialExecutable(g, {("", "Relu"): refuse}, CompileOptions())
    msg = str(ei.value)
    assert "3 node(s)" in msg
    for part in ("Frobnicate (domain my.domain)", "'f1', 'f2'", "Twiddle", "node 'r' (Relu)", "float32"):
        assert part in msg, (part, msg)


def test_long_tail_runs_through_the_reference_fallback():
    g = helper.make_graph(
        [helper.make_node("Unique", ["x"], ["y"]), helper.make_node("Det", ["m"], ["d"])],
        "main", [_vi("x", [4], TensorProto.FLOAT), _vi("m", [2, 2])], [_vi("y", None), _vi("d", None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    compiled = _compile(model)  # both run through the onnx.reference fallback
    out = compiled.run({"x": np.array([3, 1, 3, 2], np.float32), "m": np.eye(2, dtype=np.float32)})
    np.testing.assert_array_equal(out["y"], [1, 2, 3])
    assert out["d"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------
# out= protocol
# ------------------------------------------------------------------------------------------
def _kernel(op, inputs, attrs=None, const=(), opset=17):
    from ge_cpu.kernels import KERNELS

    outs = [TensorType(np.float32)]
    spec = KernelSpec(name="n", op_type=op, attrs=dict(attrs or {}),
                      inputs=[TensorType.of(a) for a in inputs], outputs=outs,
                      const_inputs=[a if i in const else None for i, a in enumerate(inputs)], opset=opset)
    return KERNELS[("", op)](spec)


@pytest.mark.parametrize("op,inputs,attrs,const", [
    ("Add", [np.ones((2, 3, 4, 4), np.float32), np.arange(4, dtype=np.float32)], {}, ()),
    ("Mul", [np.ones((2, 3, 4, 4), np.float32), np.full((3, 1, 1), 2, np.float32)], {}, ()),
    ("Relu", [np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)], {}, ()),
    ("Neg", [np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)], {}, ()),
    ("Concat", [np.ones((1, 2, 3), np.float32), np.zeros((1, 4, 3), np.float32)], {"axis": 1}, ()),
    ("BatchNormalization", [np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32),
                            np.full(3, 2, np.float32), np.ones(3, np.float32), np.zeros(3, np.float32),
                            np.ones(3, np.float32)], {}, (1, 2, 3, 4)),
    ("Conv", [np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32),
              np.random.default_rng(2).standard_normal((5, 4, 1, 1)).astype(np.float32),
              np.arange(5, dtype=np.float32)], {"kernel_shape": [1, 1]}, (1, 2)),
    ("Conv", [np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32),
              np.random.default_rng(2).standard_normal((5, 4, 3, 3)).astype(np.float32)],
     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (1,)),
    ("Conv", [np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32),
              np.random.default_rng(2).standard_normal((4, 1, 3, 3)).astype(np.float32)],
     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 4, "strides": [2, 2]}, (1,)),
])
def test_out_protocol(op, inputs, attrs, const):
    k = _kernel(op, inputs, attrs, const)
    assert caps(k).accepts_out, f"{op} should accept out="
    want = k(*inputs)[0]
    out = np.full(want.shape, np.nan, want.dtype)
    got = k(*inputs, out=(out,))
    assert got[0] is out
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    # the result matches onnx.reference too
    names = [f"i{j}" for j in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    g = helper.make_graph([node], "g", [_vi(n, list(a.shape)) for n, a in zip(names, inputs)], [_vi("y", None)])
    ref = ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    np.testing.assert_allclose(out, ref.run(None, dict(zip(names, inputs)))[0], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------
# threads
# ------------------------------------------------------------------------------------------
def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]


def test_threads_option_limits_blas_only_during_runs():
    from ge_cpu.blas import LINGER_S
    from ge_cpu.executor import BLAS, blas_threads

    BLAS.settle()  # an earlier test's run may have left its count lingering
    before = _blas_threads()
    assert before, "threadpoolctl finds no BLAS library (NumPy ships OpenBLAS)"

    seen: list[list[int]] = []
    with blas_threads(1) as counts:
        seen.append(_blas_threads())
        with blas_threads(3) as inner:  # a nested run keeps its run's count
            seen.append(_blas_threads())
    assert counts == inner == (1,) * len(before)
    assert seen[0] == [1] * len(before) and seen[1] == [1] * len(before)
    # the run's count lingers a moment (back-to-back runs do not flip it), then the baseline
    # comes back by itself: no leakage into other models or the process
    assert BLAS.current() is None and BLAS.baseline() == tuple(before)
    deadline = time.monotonic() + LINGER_S + 5
    while _blas_threads() != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _blas_threads() == before

    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
                          [_vi("a", [64, 64]), _vi("b", [64, 64])], [_vi("c", [64, 64])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m = _compile(model, threads=1)
    a = np.eye(64, dtype=np.float32)
    np.testing.assert_array_equal(m.run({"a": a, "b": a})["c"], a)
    BLAS.settle()
    assert _blas_threads() == before


# ------------------------------------------------------------------------------------------
# ge ops
# ------------------------------------------------------------------------------------------
def test_ge_ops_lists_kernel_kinds():
    from ge_core.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["ops", "--json"])
    assert rc == 0
    data = json.loads(buf.getvalue())
    kinds = {(r["domain"], r["op"]): r["kernel"] for r in data["ops"]}
    assert kinds[("ai.onnx", "Conv")] == "native"
    assert kinds[("ai.onnx", "Loop")] == "native"
    assert kinds[("ai.onnx", "Det")] == "onnx.reference"
    assert kinds[("ai.onnx.ml", "LabelEncoder")] == "onnx.reference"
    assert data["counts"]["native"] >= 140
    assert sum(data["counts"].values()) == len(data["ops"])
