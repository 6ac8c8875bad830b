"""The seeds of the ONNX target (small valid ModelProtos) and the walks over a model's
subgraphs and tensors that its mutations use."""

from __future__ import annotations

import os
from typing import Any

from fuzz_common import LIGHT, _light_dir


def _onnx_seeds(tmpdir: str) -> list[tuple[str, bytes, bool]]:
    """(name, serialized model, needs its folder) for every seed."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    seeds: list[tuple[str, bytes, bool]] = []
    for n in LIGHT:
        with open(os.path.join(_light_dir(), f"light_{n}.onnx"), "rb") as f:
            seeds.append((n, f.read(), False))

    def model(nodes, inputs, outputs, inits=(), opset=17, **kw):
        g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits), **kw.pop("graph_kw", {}))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] + kw.pop("extra_opsets", []), **kw)
        m.ir_version = 8
        return m

    f32 = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(0)

    # a small MLP with a Reshape whose shape is an int64 initializer
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.ones(3, np.float32), "b")
    shp = numpy_helper.from_array(np.array([3, 1], np.int64), "shp")
    mlp = model(
        [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
         helper.make_node("Add", ["mm", "b"], ["ad"], name="add"),
         helper.make_node("Relu", ["ad"], ["r"], name="relu"),
         helper.make_node("Reshape", ["r", "shp"], ["y"], name="reshape")],
        [vi("x", f32, [1, 4])], [vi("y", f32, [3, 1])], [w, b, shp])
    seeds.append(("mlp", mlp.SerializeToString(), False))

    # If with branches that read an outer value and hold a Constant node
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full((2,), 2.0, np.float32), "cv")),
         helper.make_node("Mul", ["x", "c"], ["t_out"])], "then", [], [vi("t_out", f32, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [], [vi("e_out", f32, [2])])
    iff = model([helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="if")],
                [vi("cond", TensorProto.BOOL, []), vi("x", f32, [2])], [vi("y", f32, [2])])
    seeds.append(("if", iff.SerializeToString(), False))

    # Loop with a body that accumulates
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"])],
        "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in", f32, [2])],
        [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", f32, [2])])
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    loop = model([helper.make_node("Loop", ["trip", "", "x"], ["y"], body=body, name="loop")],
                 [vi("x", f32, [2])], [vi("y", f32, [2])], [trip])
    seeds.append(("loop", loop.SerializeToString(), False))

    # sparse and string initializers, a Constant with a tensor attribute, ConstantOfShape
    sp = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "sp"),
                                   numpy_helper.from_array(np.array([0, 3], np.int64), "sp_idx"), [2, 2])
    labels: list[Any] = [b"cat", b"dog"]
    strs = helper.make_tensor("labels", TensorProto.STRING, [2], labels)
    cos_shape = numpy_helper.from_array(np.array([2, 2], np.int64), "cos_shape")
    misc = model(
        [helper.make_node("Add", ["x", "sp"], ["s1"]),
         helper.make_node("ConstantOfShape", ["cos_shape"], ["cos"],
                          value=numpy_helper.from_array(np.array([0.5], np.float32), "v")),
         helper.make_node("Add", ["s1", "cos"], ["y"]),
         helper.make_node("Identity", ["labels"], ["names"])],
        [vi("x", f32, [2, 2])], [vi("y", f32, [2, 2]), vi("names", TensorProto.STRING, [2])],
        [strs, cos_shape], graph_kw={"sparse_initializer": [sp]})
    seeds.append(("misc", misc.SerializeToString(), False))

    # a model-local function
    fn = helper.make_function("local", "Double", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    fmod = model([helper.make_node("Double", ["x"], ["y"], domain="local")], [vi("x", f32, [2])], [vi("y", f32, [2])],
                 extra_opsets=[helper.make_opsetid("local", 1)], functions=[fn])
    seeds.append(("function", fmod.SerializeToString(), False))

    # external data: one tensor next to the model, one in a subfolder (needs a path)
    w1 = rng.standard_normal((4, 3)).astype(np.float32)
    w2 = rng.standard_normal((3,)).astype(np.float32)
    mdir = os.path.join(tmpdir, "model")
    with open(os.path.join(mdir, "weights.bin"), "wb") as fh:
        fh.write(b"\0" * 16 + w1.tobytes())
    with open(os.path.join(mdir, "sub", "w2.bin"), "wb") as fh:
        fh.write(w2.tobytes())

    def ext(name, arr, loc, off):
        t = TensorProto(name=name, data_type=f32, dims=list(arr.shape))
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", loc), ("offset", str(off)), ("length", str(arr.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return t

    extm = model(
        [helper.make_node("MatMul", ["x", "w1"], ["mm"]), helper.make_node("Add", ["mm", "w2"], ["y"])],
        [vi("x", f32, [1, 4])], [vi("y", f32, [1, 3])],
        [ext("w1", w1, "weights.bin", 16), ext("w2", w2, "sub/w2.bin", 0)])
    seeds.append(("external", extm.SerializeToString(), True))
    for _name, data, _ in seeds:
        onnx.ModelProto().ParseFromString(data)  # all seeds are valid protobuf
    return seeds


def _graphs(g, out: list) -> list:
    """``g`` and every subgraph in it."""
    out.append(g)
    for n in g.node:
        for a in n.attribute:
            if a.HasField("g"):
                _graphs(a.g, out)
            for sg in a.graphs:
                _graphs(sg, out)
    return out


def _tensors(m) -> list:
    from onnx import AttributeProto

    ts = []
    for g in _graphs(m.graph, []):
        ts.extend(g.initializer)
        for sp in g.sparse_initializer:
            ts.extend((sp.values, sp.indices))
        for n in g.node:
            for a in n.attribute:
                if a.type == AttributeProto.TENSOR or a.HasField("t"):
                    ts.append(a.t)
                ts.extend(a.tensors)
    return ts
