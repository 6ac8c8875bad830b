"""ge_opset: op definitions and type/shape inference through ONNX's per-node inference."""

import os
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ge_core.errors import ShapeInferenceError
from ge_core.ir.graph import Graph
from ge_core.ir.types import TensorType
from ge_core.ops import OpKind, infer_graph
from ge_core.options import CompileOptions
from ge_core.passes import PassContext

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))


def _type(tp):
    from ge_sdk.onnx_types import type_from_proto

    return type_from_proto(tp)


# ------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------
def test_every_default_domain_op_is_registered(onnx_host):
    ops = onnx_host.registries.ops
    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")}
    assert {k[1] for k in ops.keys() if k[0] == ""} == names
    assert not onnx_host.describe()[0]["errors"]


def test_opdef_fields(onnx_host):
    ops = onnx_host.registries.ops
    relu, add, conv = ops.lookup("", "Relu"), ops.lookup("ai.onnx", "Add"), ops.lookup("", "Conv")
    assert relu.kind == OpKind.ELEMWISE and add.kind == OpKind.BROADCAST
    assert conv.kind == OpKind.OUT_ELEMWISE_FUSABLE and ops.lookup("", "Gemm").kind == OpKind.OUT_ELEMWISE_FUSABLE
    for op in ("Reshape", "Transpose", "Slice", "Concat", "Gather", "Squeeze", "Unsqueeze", "Flatten", "Expand",
               "Pad", "Split", "Tile"):
        assert ops.lookup("", op).kind == OpKind.INJECTIVE, op
    assert ops.lookup("", "ReduceMean").kind == OpKind.REDUCTION and ops.lookup("", "ArgMax").kind == OpKind.REDUCTION
    assert ops.lookup("", "NonMaxSuppression").kind == OpKind.OPAQUE
    assert ops.lookup("", "Concat").max_inputs >= 2**30
    assert ops.lookup("", "Slice").min_inputs == 1  # Slice-1 had one input
    assert ops.lookup("", "LeakyRelu").attrs == {"alpha": 0.01}
    assert conv.attrs["auto_pad"] == "NOTSET"
    assert ops.lookup("", "RandomNormal").deterministic is False
    assert ops.lookup("", "Bernoulli").deterministic is False and relu.deterministic
    assert ops.lookup("", "Upsample").deprecated_after == 9 and relu.deprecated_after is None
    assert ops.lookup("", "Gelu").since_version == 20


def test_plugin_module_does_not_import_onnx_eagerly():
    import subprocess
    import sys

    code = "import sys, ge_opset.plugin, ge_onnx.plugin; assert 'onnx' not in sys.modules, 'onnx imported'"
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ------------------------------------------------------------------------------------------
# inference against onnx.shape_inference on whole models
# ------------------------------------------------------------------------------------------
def _load(model, **opts):
    from ge_onnx.frontend import OnnxFrontend

    return OnnxFrontend().load(model, CompileOptions.from_any(opts))


@pytest.mark.parametrize("fname", LIGHT_MODELS)
def test_light_model_inference_matches_onnx(onnx_host, fname):
    path = os.path.join(LIGHT_DIR, fname)
    m = onnx.load(path)
    ref_m = onnx.shape_inference.infer_shapes(m)
    ref = {vi.name: _type(vi.type) for vi in list(ref_m.graph.value_info) + list(ref_m.graph.output)}
    g = _load(path)
    for n in g.nodes:  # the frontend sets declared output types only
        for v in n.outputs:
            if not v.is_graph_output:
                assert v.type.dtype is None
    infer_graph(g, onnx_host.registries.ops)
    checked = 0
    for n in g.nodes:
        for v in n.outputs:
            r = ref.get(v.name)
            if r is None:  # onnx knows nothing of it either (an unused Dropout mask)
                assert v.type.dtype is not None
                continue
            assert v.type.dtype == r.dtype, (n, v.type, r)
            assert v.type.is_static and v.type.shape == r.shape, (n, v.type, r)
            checked += 1
    assert checked >= len(g) - 2


def test_densenet_inference_is_fast(onnx_host):
    g = _load(os.path.join(LIGHT_DIR, "light_densenet121.onnx"))
    t0 = time.perf_counter()
    infer_graph(g, onnx_host.registries.ops)
    assert time.perf_counter() - t0 < 1.5


def test_infer_shapes_pass(onnx_host):
    from ge_opset.plugin import InferShapes

    p = onnx_host.registries.passes.get("infer_shapes")
    assert isinstance(p, InferShapes) and p.stage == "prepare" and p.opt_level == 0
    g = _load(os.path.join(LIGHT_DIR, "light_squeezenet.onnx"))
    ctx = PassContext(CompileOptions(), onnx_host.registries)
    assert p.run(g, ctx) is True
    assert p.run(g, ctx) is False  # fixed point


# ------------------------------------------------------------------------------------------
# single nodes
# ------------------------------------------------------------------------------------------
def _graph(opset=17):
    g = Graph("t")
    g.opset_imports[""] = opset
    return g


def _infer(g, host):
    infer_graph(g, host.registries.ops)


def test_reshape_with_constant_shape_is_static(onnx_host):
    g = _graph()
    x = g.add_input("x", TensorType(np.float32, ("N", 3, 4)))
    shape = g.add_constant(np.array([0, -1], np.int64), "shape")
    n = g.add_node("Reshape", [x, shape], name="r")
    c = g.add_node("ConstantOfShape", [g.add_constant(np.array([2, 5], np.int64), "s2")],
                   {"value": np.array([1], np.int32)})
    e = g.add_node("Expand", [n.output, g.add_constant(np.array([2, 1, 1], np.int64), "es")])
    _infer(g, onnx_host)
    assert n.output.type == TensorType(np.float32, ("N", 12))
    assert c.output.type == TensorType(np.int32, (2, 5))
    assert e.output.type == TensorType(np.float32, (2, "N", 12))


def test_symbolic_dims_and_attrs(onnx_host):
    g = _graph(18)
    x = g.add_input("x", TensorType(np.float32, ("B", 3, 32, 32)))
    w = g.add_constant(np.zeros((8, 3, 3, 3), np.float32), "w")
    conv = g.add_node("Conv", [x, w], {"strides": [2, 2], "pads": [1, 1, 1, 1]})
    t = g.add_node("Transpose", [conv.output], {"perm": [0, 2, 3, 1]})
    s = g.add_node("Split", [t.output], {"axis": 3, "num_outputs": 2}, num_outputs=2, domain="")
    am = g.add_node("ArgMax", [s.outputs[1]], {"axis": -1, "keepdims": 0})
    cast = g.add_node("Cast", [am.output], {"to": int(TensorProto.FLOAT)})
    _infer(g, onnx_host)
    assert conv.output.type == TensorType(np.float32, ("B", 8, 16, 16))
    assert t.output.type.shape == ("B", 16, 16, 8)
    assert [v.type.shape for v in s.outputs] == [("B", 16, 16, 4)] * 2
    assert am.output.type == TensorType(np.int64, ("B", 16, 16))
    assert cast.output.type.dtype == np.float32


def test_schema_version_follows_opset(onnx_host):
    # Unsqueeze: axes is an attribute up to opset 12, an input from 13.
    g = _graph(11)
    x = g.add_input("x", TensorType(np.float32, (3,)))
    u = g.add_node("Unsqueeze", [x], {"axes": [0]})
    _infer(g, onnx_host)
    assert u.output.type.shape == (1, 3)
    g = _graph(13)
    x = g.add_input("x", TensorType(np.float32, (3,)))
    u = g.add_node("Unsqueeze", [x, g.add_constant(np.array([1], np.int64), "ax")])
    _infer(g, onnx_host)
    assert u.output.type.shape == (3, 1)


def test_incompatible_shapes_raise_naming_the_node(onnx_host):
    g = _graph()
    a = g.add_input("a", TensorType(np.float32, (2, 3)))
    b = g.add_input("b", TensorType(np.float32, (4, 3)))
    g.add_node("Add", [a, b], name="bad_add")
    with pytest.raises(ShapeInferenceError, match="bad_add"):
        _infer(g, onnx_host)


def test_incompatible_dtypes_raise(onnx_host):
    g = _graph()
    a = g.add_input("a", TensorType(np.float32, (2,)))
    b = g.add_input("b", TensorType(np.int64, (2,)))
    g.add_node("Mul", [a, b], name="mixed")
    with pytest.raises(ShapeInferenceError, match="mixed"):
        _infer(g, onnx_host)


def test_unknown_inputs_give_unknown_not_errors(onnx_host):
    g = _graph()
    a = g.add_input("a")  # nothing known
    b = g.add_input("b", TensorType(np.float32, None))  # dtype only
    n1 = g.add_node("Add", [a, b])
    n2 = g.add_node("Relu", [b])
    n3 = g.add_node("Reshape", [b, g.add_input("s", TensorType(np.int64, (2,)))])
    _infer(g, onnx_host)
    assert n2.output.type.dtype == np.float32 and n2.output.type.shape is None
    assert n3.output.type.rank == 2
    assert n1.output.type.shape is None


def test_inferred_unknown_never_erases_known(onnx_host):
    g = _graph()
    b = g.add_input("b", TensorType(np.float32, None))
    n = g.add_node("Relu", [b], output_types=[TensorType(np.float32, (5,))])
    _infer(g, onnx_host)
    assert n.output.type.shape == (5,)


def test_if_outputs_from_branches(onnx_host):
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node(
                "If", ["c"], ["y"],
                then_branch=helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                                              [helper.make_value_info("t", onnx.TypeProto())]),
                else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                                              [helper.make_value_info("e", onnx.TypeProto())]))],
            "g",
            [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
             helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_value_info("y", onnx.TypeProto())],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    g = _load(m)
    _infer(g, onnx_host)
    (node,) = g.nodes
    assert node.output.type == TensorType(np.float32, (2, 3))


def test_opdef_default_attrs_used_by_inference(onnx_host):
    g = _graph()
    x = g.add_input("x", TensorType(np.float32, (1, 3, 8, 8)))
    p = g.add_node("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2]})
    f = g.add_node("Flatten", [p.output])
    _infer(g, onnx_host)
    assert p.output.type.shape == (1, 3, 4, 4)
    assert f.output.type.shape == (1, 48)


def test_empty_list_attribute(onnx_host):
    g = _graph(11)
    x = g.add_input("x", TensorType(np.float32, (1, 3, 1)))
    sq = g.add_node("Squeeze", [x], {"axes": []})
    _infer(g, onnx_host)
    assert sq.output.type.shape == (1, 3, 1)  # an empty axes list given is "no axes" for onnx


def test_random_ops_and_numpy_scalar_attrs(onnx_host):
    g = _graph()
    r = g.add_node("RandomNormal", [], {"shape": [np.int64(2), np.int64(3)], "dtype": np.int64(1),
                                        "scale": np.float32(2.0)})
    _infer(g, onnx_host)
    assert r.output.type == TensorType(np.float32, (2, 3))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_onnx_node_tests_infer_without_conflicts(onnx_host):
    """A sample of ONNX's node test models: inference never contradicts onnx's own."""
    from onnx.backend.test.case.node import collect_testcases

    from ge_core.errors import UnsupportedOpError

    cases = collect_testcases()
    sample = [c for c in cases if not c.name.endswith("_expanded")][::7]
    for c in sample:
        try:
            g = _load(c.model)
        except UnsupportedOpError:
            continue
        infer_graph(g, onnx_host.registries.ops)
        ref_m = onnx.shape_inference.infer_shapes(c.model)
        ref = {vi.name: _type(vi.type) for vi in list(ref_m.graph.value_info) + list(ref_m.graph.output)}
        for n in g.nodes:
            for v in n.outputs:
                r = ref.get(v.name)
                if r is None or v.type.dtype is None or r.dtype is None:
                    continue
                assert v.type.dtype == r.dtype, (c.name, n, v.type, r)
                if r.shape is not None and v.type.shape is not None:
                    assert len(r.shape) == len(v.type.shape), (c.name, n, v.type, r)
                    for a, b in zip(v.type.shape, r.shape):
                        if isinstance(a, int) and isinstance(b, int):
                            assert a == b, (c.name, n, v.type, r)
