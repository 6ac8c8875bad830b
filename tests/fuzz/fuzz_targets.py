"""The fuzz targets: ONNX frontend, .om loader, pipeline config (TOML), fusion switch JSON,
TensorFlow frontend (frozen GraphDef .pb), generated source (fused programs and names in
compiled and source models: nothing a model holds may run as code), PyTorch ``.pt2`` archives
(never unpickled, no program string run as code) and ``.npy`` feed files.

Each target keeps a handful of small valid seeds and mixes two kinds of mutation:

* byte-level edits of the serialized seed (:func:`fuzz_engine.mutate_bytes`): bit flips,
  interesting varints and integers, deletions, insertions, duplication, truncation, splicing;
* structure-aware edits that keep the outer format valid so the input reaches the deep checks:
  protobuf fields of a ModelProto (dims, data types, raw data, external-data locations, op types,
  attributes, opsets, nesting, functions, huge ConstantOfShape shapes), the JSON model definition
  and weights table of an .om (rewritten with valid checksums), TOML tables and values, JSON
  switch tables, the nodes, attributes, Const tensors and function library of a GraphDef, the
  entries, program JSON, tensor configs and tensor files of a .pt2, the header of an .npy.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import struct
import time
import zlib
from collections.abc import Mapping
from typing import Any, cast

from fuzz_engine import INTERESTING_INTS, OracleViolation, Target, mutate_bytes

LIGHT = ("bvlc_alexnet", "zfnet512", "vgg19", "squeezenet")


def _light_dir() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _weird_int(rng: random.Random) -> int:
    v = rng.choice(INTERESTING_INTS + [3, 5, 224])
    return -v if rng.random() < 0.2 else v


def _weird_float(rng: random.Random) -> float:
    return rng.choice([0.0, -0.0, 1.0, -1.0, 1e-45, 3.4e38, 1e308, float("inf"), float("-inf"), float("nan")])


def _weird_str(rng: random.Random, names: list[str] = ()) -> str:  # type: ignore[assignment]
    pool = ["", "x", "../x", "/abs", "a" * 5000, "\u00e9\u4e2d", "con", "input", "0", "-1", "\x00", " ", "NaN"]
    pool += list(names)[:50]
    return rng.choice(pool)


# ================================================================================================
# ONNX
# ================================================================================================
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


class OnnxTarget(Target):
    """``ge.load`` on mutated ModelProtos (bytes, or a file for external-data seeds); a share of
    the models that load are compiled too (``ge.compile``)."""

    name = "onnx"
    compile_share = 0.4

    def warm_up(self) -> None:
        import onnx  # noqa: F401
        import onnx.inliner  # noqa: F401

        import ge_core as ge

        ge.load(os.path.join(_light_dir(), "light_zfnet512.onnx"))
        ge.compile(ge.load(os.path.join(_light_dir(), "light_zfnet512.onnx")))

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import onnx

        import ge_onnx.external as ext
        from ge_core.plugins import registries

        self.onnx = onnx
        self.mdir = os.path.join(workdir, "model")
        outside = os.path.join(workdir, "outside")
        for d in (self.mdir, os.path.join(self.mdir, "sub"), outside):
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(outside, "secret.bin"), "wb") as f:
            f.write(b"\x01" * 48 + b"\x02" * 12)
        links = {"link_out": os.path.join(outside, "secret.bin"), "linkdir": outside, "link_in": "weights.bin"}
        for name, dest in links.items():
            p = os.path.join(self.mdir, name)
            if not os.path.lexists(p):
                os.symlink(dest, p)
        pipe = os.path.join(self.mdir, "pipe")
        if not os.path.exists(pipe) and hasattr(os, "mkfifo"):
            os.mkfifo(pipe)
        self.model_path = os.path.join(self.mdir, "model.onnx")
        self.seeds = _onnx_seeds(workdir)
        self.raw = [s[1] for s in self.seeds]
        self.locations = [
            "weights.bin", "sub/w2.bin", "./weights.bin", "sub//w2.bin", "link_in", "sub/../weights.bin",
            "../outside/secret.bin", "sub/../../outside/secret.bin", "..\\outside\\secret.bin", "link_out",
            "linkdir/secret.bin", os.path.join(outside, "secret.bin"), "/etc/passwd", "C:\\secret.bin",
            "pipe", "sub", "", "a\x00b", "missing.bin", "model.onnx", "/dev/zero", "~/x",
        ]
        self.op_types = sorted({k[1] for k in registries().ops.keys()})
        # Audit every file the frontend's external-data reader opens: it must be inside the
        # model's folder, whatever the location says.
        real_dir = os.path.realpath(self.mdir)

        def audited_open(path, *a, **kw):
            rp = os.path.realpath(path)
            if os.path.commonpath([real_dir, rp]) != real_dir:
                raise OracleViolation(f"external data reader opened {path!r} outside the model folder")
            return open(path, *a, **kw)

        ext.open = audited_open  # type: ignore[attr-defined]

    # -- structure-aware mutations ---------------------------------------------------------------
    def _mutate_model(self, m, rng: random.Random) -> str:
        from onnx import AttributeProto, TensorProto, helper

        graphs = _graphs(m.graph, [])
        g = rng.choice(graphs)
        names = [v for n in g.node for v in list(n.input) + list(n.output)] + [i.name for i in g.initializer]
        kind = rng.choice(["dims", "dims", "dtype", "raw", "external", "external", "optype", "inputs", "outputs",
                           "attr", "attr", "io", "opset", "order", "nest", "function", "constantofshape",
                           "sparse", "value_info", "strings"])
        ts = _tensors(m)
        if kind == "dims" and ts:
            t = rng.choice(ts)
            r = rng.random()
            if r < 0.5 and len(t.dims):
                t.dims[rng.randrange(len(t.dims))] = _weird_int(rng)
            elif r < 0.8:
                t.dims.append(_weird_int(rng))
            else:
                del t.dims[:]
                t.dims.extend(rng.choice(INTERESTING_INTS[-8:]) for _ in range(rng.randint(1, 4)))
        elif kind == "dtype" and ts:
            rng.choice(ts).data_type = rng.choice(list(range(0, 27)) + [100, -1])
        elif kind == "raw" and ts:
            t = rng.choice(ts)
            r = rng.random()
            if r < 0.3:
                t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data) + 1)]
            elif r < 0.5:
                t.raw_data = t.raw_data + bytes(rng.randrange(256) for _ in range(rng.choice((1, 3, 8))))
            elif r < 0.7:
                t.ClearField("raw_data")
                t.float_data.extend([_weird_float(rng)] * rng.randint(0, 5))
            elif r < 0.85:
                t.int64_data.extend([_weird_int(rng)] * rng.randint(0, 5))
            else:
                t.string_data.extend([b"\xff\xfe", b"ok"])
        elif kind == "external" and ts:
            t = rng.choice(ts)
            t.data_location = TensorProto.EXTERNAL if rng.random() < 0.9 else TensorProto.DEFAULT
            del t.external_data[:]
            for key, val in (("location", rng.choice(self.locations)),
                             ("offset", rng.choice(["0", "16", "-1", "x", "99999999999", str(2**63), ""])),
                             ("length", rng.choice(["48", "12", "60", "0", "-5", "y", str(2**40), ""]))):
                if rng.random() < 0.9:
                    e = t.external_data.add()
                    e.key, e.value = key, val
            if rng.random() < 0.5:
                t.ClearField("raw_data")
        elif kind == "optype" and g.node:
            n = rng.choice(g.node)
            n.op_type = rng.choice(self.op_types + ["", "NoSuchOp", "If", "Loop", "Scan", "ConstantOfShape"])
            if rng.random() < 0.2:
                n.domain = rng.choice(["", "ai.onnx", "ai.onnx.ml", "com.microsoft", "local", "x" * 300])
        elif kind == "inputs" and g.node:
            n = rng.choice(g.node)
            r = rng.random()
            if r < 0.4 and len(n.input):
                n.input[rng.randrange(len(n.input))] = rng.choice(names + ["", "undefined", "x"])
            elif r < 0.7:
                n.input.append(rng.choice(names + [""]))
            elif len(n.input):
                del n.input[rng.randrange(len(n.input))]
        elif kind == "outputs" and g.node:
            n = rng.choice(g.node)
            if len(n.output) and rng.random() < 0.6:
                n.output[rng.randrange(len(n.output))] = rng.choice(names + ["", "y"])
            else:
                n.output.append(rng.choice(names + ["", "extra"]))
        elif kind == "attr" and g.node:
            n = rng.choice(g.node)
            if len(n.attribute) and rng.random() < 0.7:
                a = rng.choice(n.attribute)
            else:
                a = n.attribute.add()
                a.name = rng.choice(["axis", "perm", "kernel_shape", "pads", "value", "to", "mode", "body", "x"])
            r = rng.random()
            if r < 0.25:
                a.type = rng.choice(list(range(0, 15)))  # a closed enum: no other values
            elif r < 0.45:
                a.ints.extend(_weird_int(rng) for _ in range(rng.randint(0, 4)))
                a.i = _weird_int(rng)
            elif r < 0.55:
                a.f = _weird_float(rng)
                a.floats.append(_weird_float(rng))
            elif r < 0.65:
                a.s = rng.choice([b"", b"\xff", b"NOTSET", b"x" * 1000])
            elif r < 0.75:
                a.ref_attr_name = "r"
            elif r < 0.85:
                a.type = AttributeProto.GRAPH
                a.g.ParseFromString(rng.choice(graphs).SerializeToString())  # (CopyFrom of an ancestor crashes upb)
            else:
                a.type = AttributeProto.TENSOR
                a.t.ParseFromString(rng.choice(ts).SerializeToString() if ts else b"")
        elif kind == "io":
            vis = list(g.input) + list(g.output)
            if vis:
                v = rng.choice(vis)
                r = rng.random()
                if r < 0.3:
                    v.type.tensor_type.elem_type = rng.choice(list(range(0, 27)) + [77])
                elif r < 0.6:
                    d = v.type.tensor_type.shape.dim.add()
                    if rng.random() < 0.7:
                        d.dim_value = _weird_int(rng)
                    else:
                        d.dim_param = _weird_str(rng)
                elif r < 0.8:
                    v.name = rng.choice(names + ["", "nope"])
                else:
                    v.type.ClearField("tensor_type")
                    if rng.random() < 0.5:
                        v.type.sequence_type.elem_type.tensor_type.elem_type = 1
            if rng.random() < 0.2 and len(g.output):
                del g.output[rng.randrange(len(g.output))]
        elif kind == "opset":
            if len(m.opset_import) and rng.random() < 0.7:
                m.opset_import[rng.randrange(len(m.opset_import))].version = rng.choice(
                    [-1, 0, 1, 6, 7, 11, 13, 17, 21, 22, 23, 1000, 2**62])
            else:
                o = m.opset_import.add()
                o.domain, o.version = rng.choice(["", "ai.onnx", "x"]), rng.choice([1, 17, 9999])
            if rng.random() < 0.3:
                m.ir_version = rng.choice([-1, 0, 1, 3, 4, 7, 8, 9, 10, 11, 99, 2**62])
        elif kind == "order" and g.node:
            nodes = list(g.node)
            r = rng.random()
            if r < 0.35:
                rng.shuffle(nodes)
            elif r < 0.6:
                nodes.append(copy.deepcopy(rng.choice(nodes)))
            elif r < 0.8:
                del nodes[rng.randrange(len(nodes))]
            else:  # a cycle: make the first node read the last node's output
                if nodes[-1].output and nodes[0].input:
                    nodes[0].input[0] = nodes[-1].output[0]
            del g.node[:]
            g.node.extend(nodes)
        elif kind == "nest":
            depth = rng.choice([2, 10, 20, 30])  # deeper nests exceed protobuf's own depth limit
            leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "leaf", [],
                                     [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
            inner = leaf
            with contextlib.suppress(Exception):  # protobuf's own depth limit (about 33 levels) reached
                for k in range(depth):
                    node = helper.make_node("If", ["cond"], [f"o{k}"], then_branch=inner, else_branch=leaf)
                    inner = helper.make_graph([node], f"lvl{k}", [],
                                              [helper.make_tensor_value_info(f"o{k}", TensorProto.FLOAT, [2])])
            m.graph.node.extend(inner.node)
            m.graph.input.extend([helper.make_tensor_value_info("cond", TensorProto.BOOL, [])])
        elif kind == "function":
            body = [helper.make_node(rng.choice(["Rec", "Add", "Other"]), ["a", "a"][: rng.randint(1, 2)], ["b"],
                                     domain=rng.choice(["local", ""]))]
            fn = helper.make_function("local", "Rec", ["a"], ["b"], body, [helper.make_opsetid("", 17),
                                                                        helper.make_opsetid("local", 1)])
            m.functions.append(fn)
            if rng.random() < 0.5:
                m.functions.append(fn)  # duplicate definition
            if g.node:
                n = rng.choice(g.node)
                n.op_type, n.domain = "Rec", "local"
            m.opset_import.append(helper.make_opsetid("local", 1))
        elif kind == "constantofshape":
            import numpy as np
            from onnx import numpy_helper

            dims = [rng.choice([2**20, 2**31, 2**40, 1 << 16, 0, -1]) for _ in range(rng.randint(1, 3))]
            shape_t = numpy_helper.from_array(np.array(dims, np.int64), "huge_shape")
            m.graph.initializer.append(shape_t)
            m.graph.node.append(helper.make_node("ConstantOfShape", ["huge_shape"], ["huge"]))
            if rng.random() < 0.5:
                m.graph.node.append(helper.make_node("Shape", ["huge"], ["huge_dims"]))
                m.graph.output.append(helper.make_tensor_value_info("huge_dims", TensorProto.INT64, None))
            else:
                m.graph.output.append(helper.make_tensor_value_info("huge", TensorProto.FLOAT, None))
            return "constantofshape"
        elif kind == "sparse":
            import numpy as np
            from onnx import numpy_helper

            vals = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "spv")
            idx = numpy_helper.from_array(np.array([_weird_int(rng), rng.choice([0, 1, -1])], np.int64), "spi")
            sp = helper.make_sparse_tensor(vals, idx, [rng.choice([2, 2**20, 2**31, 2**40, -3]) for _ in range(rng.randint(1, 2))])
            g.sparse_initializer.append(sp)
        elif kind == "value_info":
            vi = g.value_info.add()
            vi.name = rng.choice(names + ["zzz"])
            vi.type.tensor_type.elem_type = rng.choice([0, 1, 7, 8, 9, 40])
            for _ in range(rng.randint(0, 3)):
                vi.type.tensor_type.shape.dim.add().dim_value = _weird_int(rng)
        elif kind == "strings":
            t = g.initializer.add()
            t.name = rng.choice(names + ["s"])
            t.data_type = TensorProto.STRING
            t.dims.extend([rng.choice([1, 2, 3, 2**40])])
            t.string_data.extend([b"\xff\x00", b"a" * 100][: rng.randint(0, 2)])
        return kind

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        import ge_core as ge

        si = rng.randrange(len(self.seeds))
        name, seed, by_path = self.seeds[si]
        r = rng.random()
        compile_it = rng.random() < self.compile_share
        if r < 0.45:
            data, what = mutate_bytes(seed, rng, self.raw)
        else:
            m = self.onnx.ModelProto()
            m.ParseFromString(seed)
            kinds = [self._mutate_model(m, rng) for _ in range(rng.choice((1, 1, 2, 3)))]
            what = "proto:" + "+".join(kinds)
            if "constantofshape" in kinds:
                compile_it = True
            data = m.SerializeToString()
            if rng.random() < 0.1:
                data, w2 = mutate_bytes(data, rng, rounds=1)
                what += "+" + w2
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        if by_path or rng.random() < 0.1:
            with open(self.model_path, "wb") as f:
                f.write(data)
            graph = ge.load(self.model_path)
        else:
            graph = ge.load(data, framework="onnx")
        if not compile_it:
            return "ok"
        model = ge.compile(graph)
        model.save(os.path.join(self.workdir, "compiled.om"))  # writing the weights must not blow up either
        return "compiled+saved"


# ================================================================================================
# .om
# ================================================================================================
def _fix_checksums(data: bytes) -> bytes:
    """Recompute the header, table and partition CRCs of a (mutated) .om byte string, as far as
    its fields allow; so a mutation reaches the checks behind the checksums."""
    from ge_core import om_container as oc

    buf = bytearray(data)
    if len(buf) < oc.HEADER_SIZE:
        return bytes(buf)
    fields = list(oc.HEADER_STRUCT.unpack_from(buf, 0))
    header_size, count, table_offset, entry_size = fields[4], fields[7], fields[8], fields[9]
    if not (oc.HEADER_SIZE <= header_size <= min(len(buf), 4096)):
        header_size = oc.HEADER_SIZE
    if 0 <= count <= 64 and oc.ENTRY_SIZE <= entry_size <= 1024 and table_offset + count * entry_size <= len(buf):
        for i in range(count):
            at = table_offset + i * entry_size
            kind, off, size, align, crc, flags, res = oc.ENTRY_STRUCT.unpack_from(buf, at)
            if off + size <= len(buf):
                oc.ENTRY_STRUCT.pack_into(buf, at, kind, off, size, align, zlib.crc32(buf[off: off + size]), flags, res)
        struct.pack_into("<I", buf, 68, zlib.crc32(buf[table_offset: table_offset + count * entry_size]))
    struct.pack_into("<I", buf, oc.HEADER_CRC_OFFSET, 0)
    crc = zlib.crc32(buf[:header_size])
    struct.pack_into("<I", buf, oc.HEADER_CRC_OFFSET, crc)
    return bytes(buf)


def _json_paths(x: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if len(path) > 12:  # deep nests made by _random_json are leaves for the mutator
        return out
    if isinstance(x, dict):
        for k, v in x.items():
            out.extend(_json_paths(v, path + (k,)))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out.extend(_json_paths(v, path + (i,)))
    return out


def _random_json(rng: random.Random, names: list[str]) -> Any:
    r = rng.randrange(12)
    if r == 0:
        return None
    if r == 1:
        return rng.choice([True, False])
    if r == 2:
        return _weird_int(rng)
    if r == 3:
        return rng.choice([2**64, -(2**63) - 1, 10**30, 1.5, -0.0, 1e308])
    if r == 4:
        return _weird_str(rng, names)
    if r == 5:
        return rng.choice(["float32", "int64", "string", "bool", "object", "float64", "bfloat16", "V8", "<f4"])
    if r == 6:
        return [_weird_int(rng) for _ in range(rng.randint(0, 4))]
    if r == 7:
        return {}
    if r == 8:
        return []
    if r == 9:
        d: Any = 0
        for _ in range(rng.choice([10, 100, 5000])):
            d = [d]
        return d
    if r == 10:
        return {"i": _weird_int(rng)} if rng.random() < 0.5 else {rng.choice(["t", "g", "gs", "list", "b", "zz"]): rng.choice([0, "", [], {}, -1, "AAAA"])}
    return rng.choice(names) if names else "x"


def _json_mutate(d: Any, rng: random.Random) -> str:
    paths = [p for p in _json_paths(d) if p]
    names = [v for p in paths for v in [p[-1]] if isinstance(v, str)]
    kinds = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        p = rng.choice(paths)
        parent = d
        for k in p[:-1]:
            parent = parent[k]
        last = p[-1]
        r = rng.random()
        try:
            if r < 0.6:
                parent[last] = _random_json(rng, names)
                kinds.append("set")
            elif r < 0.75:
                del parent[last]
                kinds.append("del")
            elif r < 0.85 and isinstance(parent, list):
                parent.insert(last, copy.deepcopy(parent[last]))
                kinds.append("dup")
            elif isinstance(parent, dict):
                parent[rng.choice(["zz", "format", "version", "graph", "weights", "nodes", "inputs", "outputs"])] = parent[last]
                kinds.append("key")
            else:
                parent.reverse()
                kinds.append("rev")
        except (KeyError, IndexError, TypeError, RecursionError):
            kinds.append("skip")
        paths = [q for q in _json_paths(d) if q]
        if not paths:
            break
    return "+".join(kinds)


class OmTarget(Target):
    """``ge.load_om`` on mutated compiled models: raw bytes, bytes with fixed-up checksums, and
    mutations of the JSON model definition / weights table rewritten as a valid container."""

    name = "om"

    def warm_up(self) -> None:
        import ge_core as ge

        m = ge.compile(ge.load(os.path.join(_light_dir(), "light_zfnet512.onnx")))
        import tempfile

        with tempfile.TemporaryDirectory() as t:
            m.save(os.path.join(t, "w.om"))
            ge.load_om(os.path.join(t, "w.om"))

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import ge_core as ge
        from ge_core.om import read_model_definition
        from ge_core.om_container import read_container

        self.path = os.path.join(workdir, "case.om")
        onnx_dir = os.path.join(workdir, "onnx")
        os.makedirs(os.path.join(onnx_dir, "model", "sub"), exist_ok=True)
        srcs = {s[0]: s[1] for s in _onnx_seeds(onnx_dir) if not s[2]}
        self.seeds: list[tuple[str, bytes, dict, bytes]] = []
        for n in ("zfnet512", "mlp", "if", "loop", "misc"):
            p = os.path.join(workdir, f"seed_{n}.om")
            ge.compile(ge.load(srcs[n], framework="onnx")).save(p)
            with open(p, "rb") as f:
                raw = f.read()
            with read_container(p) as c:
                d = read_model_definition(p, c)
                blob = bytes(c.partition("weights"))
            self.seeds.append((n, raw, d, blob))
        self.raw = [s[1] for s in self.seeds]

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        import ge_core as ge
        from ge_core.om import inspect_om
        from ge_core.om_container import write_container

        name, raw, d, blob = rng.choice(self.seeds)
        r = rng.random()
        verify = True
        if r < 0.2:
            data, what = mutate_bytes(raw, rng, self.raw)
            verify = rng.random() < 0.7
        elif r < 0.45:
            data, what = mutate_bytes(raw, rng, self.raw)
            data = _fix_checksums(data)
            what = "fixed-" + what
        else:
            dd = copy.deepcopy(d)
            if r < 0.65 and dd.get("weights"):
                e = rng.choice(dd["weights"])
                key = rng.choice(["offset", "nbytes", "shape", "dtype", "strings", "zz"])
                e[key] = _random_json(rng, list(e))
                if rng.random() < 0.3:
                    e["shape"] = [rng.choice([2**20, 2**31, 2**40, 0, 1]) for _ in range(rng.randint(1, 3))]
                what = f"weights:{key}"
            elif rng.random() < 0.4:  # memory plan, streams, options, report (om_mutations.py)
                from om_mutations import mutate_stored

                what = "stored:" + mutate_stored(dd, rng)
            else:
                what = "json:" + _json_mutate(dd, rng)
            b = blob
            if rng.random() < 0.1:
                b = blob[: rng.randrange(len(blob) + 1)]
                what += "+cutblob"
            try:
                text = json.dumps(dd, allow_nan=True).encode("utf-8")
            except (ValueError, RecursionError):
                text = b"{}"
            if rng.random() < 0.05:
                text, w2 = mutate_bytes(text, rng, rounds=1)
                what += "+" + w2
            tmp = self.path + ".src"
            write_container(tmp, [("model", text, 8), ("weights", b, 4096)], producer="fuzz")
            with open(tmp, "rb") as f:
                data = f.read()
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        label = "ok"
        if rng.random() < 0.3:
            inspect_om(self.path)
            label = "inspected"
        model = ge.load_om(self.path, verify_checksums=verify)
        model.input_names, model.output_names, model.report  # noqa: B018
        from om_mutations import check_loaded

        check_loaded(model, ctx)  # a stored plan/assignment/option that loads never gives wrong values
        return label


# ================================================================================================
# pipeline config (TOML)
# ================================================================================================
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is close enough to a JSON string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))


def _toml_dump(d: dict) -> str:
    lines = []
    for k, v in d.items():
        if not isinstance(v, dict):
            lines.append(f"{json.dumps(str(k))} = {_toml_value(v)}")
    for k, v in d.items():
        if isinstance(v, dict):
            scalars = {a: b for a, b in v.items() if not isinstance(b, dict)}
            subs = {a: b for a, b in v.items() if isinstance(b, dict)}
            lines.append(f"[{json.dumps(str(k))}]")
            lines.extend(f"{json.dumps(str(a))} = {_toml_value(b)}" for a, b in scalars.items())
            for a, b in subs.items():
                lines.append(f"[{json.dumps(str(k))}.{json.dumps(str(a))}]")
                lines.extend(f"{json.dumps(str(x))} = {_toml_value(y)}" for x, y in b.items())
    return "\n".join(lines) + "\n"


CONFIG_SEEDS = [
    """[options]
opt_level = 2
soc_version = "cpu"
input_shape = "x:1,3,224,224"
out_nodes = ["y"]
memory_optimize_level = "high"
constant_folding = true
fusion_switch_file = "switch.json"
[pipeline.prepare]
passes = ["infer_shapes"]
fixed_point = true
max_iterations = 3
[pipeline.optimize]
disable = []
""",
    """[options]
framework = 5
O = "O1"
threads = 2
log = "info"
enable_single_stream = "yes"
disable_reuse_memory = 0
disabled_passes = "a,b"
input_shape = {x = [1, 3, "n", -1]}
[passes.infer_shapes]
""",
    """[pipeline.prepare]
passes = ["infer_shapes"]
[pipeline.schedule]
disable = ["infer_shapes"]
""",
    """[options]
memory_planner = "greedy_by_size"
stream_allocator = "single"
verify_each_pass = true
config = "other.toml"
""",
]

OPTION_KEYS = ["framework", "model_type", "input_shape", "out_nodes", "output_nodes", "soc_version", "target",
               "backend", "fusion_switch_file", "memory_optimize_level", "constant_folding", "enable_single_stream",
               "disable_reuse_memory", "log", "stream_allocator", "memory_planner", "opt_level", "O",
               "optimization_level", "verify_each_pass", "dump_ir", "threads", "pipeline", "pass_params",
               "disabled_passes", "extra", "config", "fusion_switches", "single_stream", "unknown_option"]


def _random_toml_value(rng: random.Random) -> Any:
    import datetime

    r = rng.randrange(11)
    if r == 0:
        return rng.choice([True, False])
    if r == 1:
        return rng.choice([0, 1, -1, 3, 4, 2**31, 2**63 - 1, -(2**63)])
    if r == 2:
        return _weird_float(rng)
    if r == 3:
        return _weird_str(rng, ["switch.json", "config.toml", "other.toml", "O3", "high", "x:1,2;y:-3", "x:", ":1",
                                "x:1,a,?", "infer_shapes", "cpu", "onnx", "3", "99"])
    if r == 4:
        return [rng.choice([1, "a", -1, 2.5, True, [1], {}]) for _ in range(rng.randint(0, 3))]
    if r == 5:
        return {rng.choice(["x", "passes", "disable", "fixed_point", "max_iterations"]): _random_toml_value(rng)}
    if r == 6:
        return datetime.datetime(2024, 1, 2, 3, 4, 5)
    if r == 7:
        return {"x": rng.choice([5, "abc", [1.5], [-7], [None] if False else [], [[1]], {"y": 1}])}
    if r == 8:
        return rng.choice(["../outside.toml", "/dev/null", "/etc/passwd", "pipe", "", "."])
    if r == 9:
        return rng.choice([["infer_shapes"], ["nope"], ["infer_shapes", "infer_shapes"], [1, 2]])
    return {"passes": ["infer_shapes"], "fixed_point": rng.choice([True, "x", 2]),
            "max_iterations": rng.choice([0, -1, 2**62, "x", 1.5, 3])}


class ConfigTarget(Target):
    """``CompileOptions.from_config`` on mutated pipeline configs, then the checks a compile makes
    with them (``check_extra``, ``resolve_pipeline``)."""

    name = "config"

    def warm_up(self) -> None:
        from ge_core.plugins import registries

        registries()

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        try:
            import tomllib
        except ImportError:  # Python 3.10: the same parser as the tomli distribution
            import tomli as tomllib

        self.tomllib = tomllib
        self.path = os.path.join(workdir, "config.toml")
        self.other = os.path.join(workdir, "other.toml")
        with open(os.path.join(workdir, "switch.json"), "w", encoding="utf-8") as f:
            json.dump({"Switch": {"GraphFusion": {"ALL": "on", "ConvBnFusion": "off"}, "UBFusion": {}}}, f)
        if hasattr(os, "mkfifo") and not os.path.exists(os.path.join(workdir, "pipe")):
            os.mkfifo(os.path.join(workdir, "pipe"))
        self.seeds = [s.encode() for s in CONFIG_SEEDS]
        self.parsed = [tomllib.loads(s) for s in CONFIG_SEEDS]

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        from ge_core.options import CompileOptions
        from ge_core.passes import resolve_pipeline
        from ge_core.plugins import registries

        si = rng.randrange(len(self.seeds))
        r = rng.random()
        if r < 0.35:
            data, what = mutate_bytes(self.seeds[si], rng, self.seeds)
        elif r < 0.45:
            depth = rng.choice([50, 500, 5000, 50000])
            kind = rng.choice(["array", "table", "inline"])
            if kind == "array":
                text = "x = " + "[" * depth + "]" * depth
            elif kind == "inline":
                text = "[options]\ninput_shape = " + "{a = " * depth + "1" + "}" * depth
            else:
                text = "[" + ".".join(["a"] * depth) + "]\n"
            data, what = text.encode(), f"deep:{kind}{depth}"
        else:
            d = copy.deepcopy(self.parsed[si])
            kinds = []
            for _ in range(rng.choice((1, 1, 2, 3))):
                table = rng.choice(["options", "options", "options", "pipeline", "passes", "top"])
                if table in ("options", "pipeline", "passes") and not isinstance(d.get(table), dict):
                    d[table] = {}
                if table == "options":
                    d["options"][rng.choice(OPTION_KEYS)] = _random_toml_value(rng)
                elif table == "pipeline":
                    p = d["pipeline"]
                    stage = rng.choice(["prepare", "optimize", "fuse", "schedule", "nope"])
                    if rng.random() < 0.3 or not isinstance(p.get(stage, {}), dict):
                        p[stage] = _random_toml_value(rng)
                    else:
                        key = rng.choice(["passes", "disable", "fixed_point", "max_iterations", "insert_after",
                                          "insert_before", "x"])
                        p.setdefault(stage, {})[key] = _random_toml_value(rng)
                elif table == "passes":
                    d["passes"][rng.choice(["infer_shapes", "nope"])] = rng.choice(
                        [{}, {"x": 1}, _random_toml_value(rng)])
                else:
                    d[rng.choice(["options", "pipeline", "passes", "extra"])] = _random_toml_value(rng)
                kinds.append(table)
            try:
                text = _toml_dump(d)
            except (ValueError, TypeError):
                text = ""
            data, what = text.encode(), "toml:" + "+".join(kinds)
        ctx["mutation"] = what
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        # the config that [options].config may name: sometimes it includes the first one back
        with open(self.other, "w", encoding="utf-8") as f:
            f.write(rng.choice(['[options]\nconfig = "config.toml"\n', "[options]\nopt_level = 1\n", "x = [",
                                '[options]\nconfig = "other.toml"\n']))
        cwd = os.getcwd()
        os.chdir(self.workdir)  # relative paths in configs stay in the work folder
        try:
            opts = CompileOptions.from_config(self.path)
        finally:
            os.chdir(cwd)
        regs = registries()
        opts.check_extra(cast(Mapping[str, Any], regs.options))  # a Registry: a mapping of names
        resolve_pipeline(regs.passes, opts)
        return "ok"


# ================================================================================================
# fusion switch JSON
# ================================================================================================
SWITCH_SEEDS = [
    {"Switch": {"GraphFusion": {"ALL": "on", "ConvBnFusion": "off"}, "UBFusion": {"TbeEltwiseFusion": "off"}}},
    {"Switch": {"GraphFusion": {"ALL": "off"}}},
    {"Switch": {"UBFusion": {"ALL": "on", "X": "on"}, "GraphFusion": {}}},
]


class SwitchTarget(Target):
    """``parse_fusion_switch_file`` (and the ``fusion_switch_file`` option) on mutated switch files."""

    name = "switch"

    def warm_up(self) -> None:
        import ge_core.options  # noqa: F401

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        self.path = os.path.join(workdir, "switch.json")
        self.seeds = [json.dumps(s, indent=rng_indent).encode() for s, rng_indent in zip(SWITCH_SEEDS, (None, 2, 0))]

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        from ge_core.options import CompileOptions
        from ge_fusion.switches import parse_fusion_switch_file

        si = rng.randrange(len(SWITCH_SEEDS))
        r = rng.random()
        if r < 0.45:
            data, what = mutate_bytes(self.seeds[si], rng, self.seeds)
        elif r < 0.5:
            depth = rng.choice([100, 1000, 100000])
            data, what = ('{"Switch": ' + "[" * depth + "]" * depth + "}").encode(), f"deep{depth}"
        elif r < 0.55:
            data, what = rng.choice([b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00", b"", b"null", b"[]", b'"Switch"',
                                     b'{"Switch": {"GraphFusion": {"A": "on"}}}' + b" " * (1 << 20) + b"x"]), "special"
        else:
            d: Any = copy.deepcopy(SWITCH_SEEDS[si])
            what = "json:" + _json_mutate(d, rng)
            if rng.random() < 0.3:
                sw = d.get("Switch") if isinstance(d, dict) else None
                if isinstance(sw, dict):
                    sw[rng.choice(["GraphFusion", "UBFusion", "Other"])] = {
                        _weird_str(rng): rng.choice(["on", "off", "ON ", 1, None, [], {}, True, "maybe"])}
                    what += "+entry"
            try:
                data = json.dumps(d, allow_nan=True).encode()
            except RecursionError:
                data = b"[" * 5000
        ctx["mutation"] = what
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        parse_fusion_switch_file(self.path)
        CompileOptions.from_any({"fusion_switch_file": self.path})
        return "ok"


# ================================================================================================
# TensorFlow frozen GraphDef
# ================================================================================================
#: TF op types that no mapper handles (or that only make sense in other graphs), for op swaps
TF_OTHER_OPS = ["MatrixDeterminant", "Lgamma", "Xdivy", "VarHandleOp", "ReadVariableOp", "VariableV2", "Assert",
                "Print", "PyFunc", "Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond",
                "PartitionedCall", "StatefulPartitionedCall", "SparseTensorDenseMatMul", "DecodeJpeg",
                "TensorArrayV3", "RandomUniform", "Unique", "NonMaxSuppressionV5", "Conv2DBackpropFilter",
                "FakeQuantWithMinMaxVars", "QuantizeV2", "StringToNumber", "Bitcast", "Placeholder", "Const",
                "NoOp", "", "NoSuchOp", "x" * 300]
#: attribute names the mappers (and TensorFlow's shape functions) read
TF_ATTR_NAMES = ["T", "dtype", "shape", "value", "strides", "padding", "data_format", "dilations", "ksize",
                 "explicit_paddings", "perm", "N", "Tidx", "Tshape", "Tpaddings", "axis", "num", "num_split",
                 "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask", "keep_dims",
                 "squeeze_dims", "transpose_a", "transpose_b", "adj_x", "adj_y", "epsilon", "is_training",
                 "then_branch", "else_branch", "cond", "body", "Tcond", "Tin", "Tout", "output_shapes",
                 "parallel_iterations", "element_dtype", "element_shape", "num_elements", "out_type", "SrcT",
                 "DstT", "Truncate", "mode", "block_size", "depth_radius", "align_corners", "half_pixel_centers",
                 "batch_dims", "equation", "output_type", "exclusive", "reverse", "Index", "TI", "alpha", "zz"]
TF_STRINGS = [b"SAME", b"VALID", b"EXPLICIT", b"NHWC", b"NCHW", b"NDHWC", b"NCDHW", b"NHWC_VECT_W", b"REFLECT",
              b"SYMMETRIC", b"CONSTANT", b"", b"\xff\xfe", b"x" * 1000, b"ab,ab->a", b"...ij,jk", b"->"]
#: DataType enum values: the valid ones, reference types, DT_INVALID and unknown numbers
TF_DTYPES = list(range(0, 24)) + [101, 107, 120, 124, 200, 10000, 2**31 - 1]
#: the usual numeric DataTypes (float, double, int32, uint8, int16, int8, int64, bool, bfloat16, half)
TF_NUMERIC = [1, 1, 1, 2, 3, 3, 4, 5, 6, 9, 9, 10, 14, 17, 19]
#: op types of one signature class: a swap inside a class keeps the graph importable more often
TF_OP_GROUPS = [
    ["Relu", "Relu6", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Rsqrt", "Neg", "Abs", "Floor", "Ceil", "Round",
     "Sign", "Reciprocal", "Erf", "Sin", "Cos", "Elu", "Selu", "Softplus", "Softsign", "Square", "Expm1", "Log1p",
     "LeakyRelu", "Identity", "StopGradient", "Softmax", "LogSoftmax", "ZerosLike", "OnesLike", "IsNan",
     "Shape", "Size", "Rank"],
    ["Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum", "Pow", "FloorDiv",
     "FloorMod", "TruncateDiv", "SquaredDifference", "BiasAdd", "MatMul", "BatchMatMulV2", "Equal", "NotEqual",
     "Less", "Greater", "LessEqual", "GreaterEqual"],
    ["Mean", "Sum", "Max", "Min", "Prod", "ArgMax", "ArgMin", "ExpandDims", "Reshape", "Tile", "BroadcastTo",
     "Transpose", "Pad", "MirrorPad", "Squeeze", "Fill", "GatherV2", "ConcatV2", "Pack", "Split", "SplitV",
     "Cumsum", "OneHot", "TopKV2", "Range", "Slice", "StridedSlice"],
    ["Conv2D", "DepthwiseConv2dNative", "Conv3D", "Conv2DBackpropInput"],
    ["MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "SpaceToDepth", "DepthToSpace", "LRN", "ResizeBilinear",
     "ResizeNearestNeighbor"],
    ["FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"],
    ["StatelessIf", "If", "StatelessWhile", "While"],
    ["TensorListFromTensor", "TensorListReserve", "TensorListGetItem", "TensorListSetItem", "TensorListStack",
     "TensorListLength", "EmptyTensorList"],
]


def _tf_seeds() -> list[tuple[str, bytes]]:
    """(name, serialized frozen GraphDef) of every seed; built once per process."""
    global _TF_SEEDS
    if _TF_SEEDS is not None:
        return _TF_SEEDS
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    def frozen(cf) -> bytes:
        gd = convert_variables_to_constants_v2(cf, lower_control_flow=False).graph.as_graph_def()
        return gd.SerializeToString(deterministic=True)  # map fields (attr) in a stable order

    keras.utils.set_random_seed(0)
    seeds = []
    # a small Keras CNN: Conv2D, BatchNorm, ReLU, pooling, depthwise conv, Concatenate, Dense
    inp = keras.Input((8, 8, 3), batch_size=1, name="img")
    h = keras.layers.Conv2D(4, 3, padding="same")(inp)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    a = keras.layers.Conv2D(2, 1, strides=2)(h)
    b = keras.layers.MaxPooling2D(2)(h)
    b = keras.layers.DepthwiseConv2D(3, padding="same")(b)
    h = keras.layers.Concatenate()([a, b])
    h = keras.layers.GlobalAveragePooling2D()(h)
    cnn = keras.Model(inp, keras.layers.Dense(5, activation="softmax")(h))
    fn = tf.function(lambda x: cnn(x, training=False))
    seeds.append(("keras_cnn", frozen(fn.get_concrete_function(tf.TensorSpec((1, 8, 8, 3), tf.float32, name="img")))))

    # tf.cond and tf.while_loop kept functional: StatelessIf / StatelessWhile with a function library
    @tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x")])
    def control(x):
        y = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.nn.relu(x) * 2.0, lambda: x - 1.0)
        i = tf.constant(0)
        return tf.while_loop(lambda i, y: i < 4, lambda i, y: (i + 1, y * 0.5 + tf.cast(i, tf.float32)), (i, y))[1]

    seeds.append(("control_flow", frozen(control.get_concrete_function())))

    # shape and data-movement ops
    @tf.function(input_signature=[tf.TensorSpec((2, 6, 4), tf.float32, name="x")])
    def shapes(x):
        a = x[:, 1:5:2, ::-1]
        b = x[..., tf.newaxis, 0]
        c = tf.concat([tf.reshape(a, [2, -1]), tf.reshape(b, [2, -1])], axis=1)
        e = tf.transpose(tf.pad(x, [[0, 0], [1, 2], [0, 1]]), [0, 2, 1])
        s1, s2 = tf.split(x, [2, 4], axis=1)
        g = tf.gather(x, [3, 0], axis=1)
        t = tf.tile(tf.expand_dims(tf.squeeze(x[:, :1, :], axis=1), -1), [1, 1, 2])
        return (tf.reduce_sum(c, axis=1) + tf.reduce_mean(e, axis=[1, 2]) + tf.reduce_max(s2, axis=[1, 2])
                + tf.reduce_sum(g, axis=[1, 2]) + tf.reduce_sum(s1 * 2.0, axis=[1, 2]) + tf.reduce_sum(t, axis=[1, 2]))

    seeds.append(("shapes", frozen(shapes.get_concrete_function())))

    # a GRU: a While loop over TensorLists
    inp = keras.Input((3, 2), batch_size=1, name="seq")
    rnn = keras.Model(inp, keras.layers.GRU(2)(inp))
    fn = tf.function(lambda x: rnn(x, training=False))
    seeds.append(("gru", frozen(fn.get_concrete_function(tf.TensorSpec((1, 3, 2), tf.float32, name="seq")))))
    _TF_SEEDS = seeds
    return seeds


_TF_SEEDS: list[tuple[str, bytes]] | None = None


class TfTarget(Target):
    """``ge.load`` of mutated frozen GraphDefs written to a .pb file (the TensorFlow frontend:
    TensorFlow's import and grappler, then the op mappers); 40% of the graphs that load are
    compiled and saved as .om. The mutations work on the GraphDef protobuf: op types, attributes
    (dtypes, shapes, strides, padding, data_format, perm, function names), Const tensors
    (dtype, shape, contents, huge splatted shapes), inputs (dropped, duplicated, missing nodes,
    bad output indices, cycles), nodes (deleted, duplicated, renamed), the function library of
    control flow, versions, huge Fill / shape constants / input shapes; 20% are byte-level edits
    of the serialized graph. Many edits keep the graph importable so that it reaches the
    mappers: attributes changed within their kind, op types swapped within a signature class,
    the values of small Consts (axes, perms, shapes, paddings, slice bounds) edited, input
    shapes made unknown or changed; 10% of the cases name an inner node as ``out_nodes``.

    Seeds and mutated graphs are serialized deterministically (the ``attr`` maps otherwise come
    out in another order in each process), so a case is reproducible from (seed, index)."""

    name = "tensorflow"
    compile_share = 0.4
    #: TensorFlow maps about 2 GiB of address space before the first case: cap the cases at
    #: that plus the engine's limit, not at the limit alone
    mem_limit_relative = True

    def warm_up(self) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        with contextlib.suppress(RuntimeError):  # the context was initialized already
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        import ge_core as ge

        seeds = _tf_seeds()
        import tempfile

        with tempfile.TemporaryDirectory() as t:
            for name, data in seeds:
                p = os.path.join(t, f"{name}.pb")
                with open(p, "wb") as f:
                    f.write(data)
                ge.compile(ge.load(p)).save(os.path.join(t, "w.om"))

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        from tensorflow.core.framework import graph_pb2

        from ge_core.plugins import registries

        self.graph_pb2 = graph_pb2
        self.path = os.path.join(workdir, "model.pb")
        self.seeds = _tf_seeds()
        self.raw = [s[1] for s in self.seeds]
        self.op_types = sorted({k[1] for k in registries().op_mappers.keys() if k[0] == "tensorflow"})

    # -- structure-aware mutations ---------------------------------------------------------------
    def _weird_shape(self, sp, rng: random.Random) -> None:
        r = rng.random()
        if r < 0.15:
            sp.Clear()
            sp.unknown_rank = True
            return
        if r < 0.5 and len(sp.dim):
            sp.dim[rng.randrange(len(sp.dim))].size = _weird_int(rng) if rng.random() < 0.8 else -1
        elif r < 0.7:
            sp.dim.add().size = _weird_int(rng)
        elif r < 0.8 and len(sp.dim):
            del sp.dim[rng.randrange(len(sp.dim))]
        else:
            del sp.dim[:]
            for _ in range(rng.choice((0, 1, 2, 3, 4, 5, 9))):
                sp.dim.add().size = rng.choice([2**31, 2**40, 2**62, 2**63 - 1, -1, -2, 0, 1, 3])

    def _weird_tensor(self, t, rng: random.Random) -> str:
        """Mutate a TensorProto (a Const value or a tensor attribute) in place."""
        r = rng.random()
        if r < 0.2:
            t.dtype = rng.choice(TF_DTYPES)
            return "tdtype"
        if r < 0.45:
            self._weird_shape(t.tensor_shape, rng)
            return "tshape"
        if r < 0.6:
            c = t.tensor_content
            rr = rng.random()
            if rr < 0.4:
                t.tensor_content = c[: rng.randrange(len(c) + 1)]
            elif rr < 0.7:
                t.tensor_content = c + bytes(rng.randrange(256) for _ in range(rng.choice((1, 3, 4, 8, 64))))
            else:
                t.tensor_content = bytes(rng.randrange(256) for _ in range(len(c) or 16))
            return "tcontent"
        if r < 0.75:
            t.ClearField("tensor_content")
            rr = rng.random()
            if rr < 0.3:
                t.float_val.extend([_weird_float(rng) for _ in range(rng.randint(0, 5))])
            elif rr < 0.55:
                t.int_val.extend([_weird_int(rng) & 0x7FFFFFFF for _ in range(rng.randint(0, 5))])
            elif rr < 0.7:
                t.int64_val.extend([_weird_int(rng) for _ in range(rng.randint(0, 5))])
            elif rr < 0.8:
                t.bool_val.extend([True, False][: rng.randint(0, 2)])
            elif rr < 0.9:
                t.string_val.extend([b"\xff", b"ab", b""][: rng.randint(0, 3)])
            else:
                t.half_val.extend([0xFFFF, 1])
            return "tvals"
        # a huge shape, filled from one value (TensorFlow splats the last value)
        t.ClearField("tensor_content")
        del t.tensor_shape.dim[:]
        for _ in range(rng.randint(1, 4)):
            t.tensor_shape.dim.add().size = rng.choice([2**16, 2**20, 2**31, 2**40, 2**62])
        t.float_val.append(1.0)
        t.int_val.append(1)
        return "thuge"

    def _mutate_attr(self, n, rng: random.Random, funcs: list[str], tensors: list) -> str:
        keys = sorted(n.attr)  # (a map: its own order changes from one process to the next)
        if keys and rng.random() < 0.75:
            key = rng.choice(keys)
        else:
            key = rng.choice(TF_ATTR_NAMES)
        a = n.attr[key]
        if a.WhichOneof("value") and rng.random() < 0.6:
            return self._same_kind_attr(a, rng, funcs) + ":" + key
        r = rng.random()
        if r < 0.08:
            del n.attr[key]
            return f"del:{key}"
        if r < 0.2:
            a.type = rng.choice(TF_DTYPES)
        elif r < 0.32:
            self._weird_shape(a.shape, rng)
        elif r < 0.5:
            lst = [rng.choice([0, 1, 2, 3, -1, -2, 4, 5, 64]) if rng.random() < 0.7 else _weird_int(rng)
                   for _ in range(rng.choice((0, 1, 2, 3, 4, 4, 5, 8)))]
            a.list.Clear()
            a.list.i.extend(lst)
        elif r < 0.62:
            a.s = rng.choice(TF_STRINGS)
        elif r < 0.72:
            a.i = _weird_int(rng)
        elif r < 0.76:
            a.f = _weird_float(rng)
        elif r < 0.8:
            a.b = rng.random() < 0.5
        elif r < 0.86:
            a.func.name = rng.choice(funcs + ["missing_fn", "", "x" * 300])
        elif r < 0.92:
            if tensors:
                a.tensor.CopyFrom(rng.choice(tensors))
            if a.HasField("tensor"):
                self._weird_tensor(a.tensor, rng)
            else:
                a.tensor.dtype = rng.choice(TF_DTYPES)
        elif r < 0.96:
            a.list.Clear()
            a.list.type.extend(rng.choice(TF_DTYPES) for _ in range(rng.randint(0, 4)))
        else:
            a.list.Clear()
            for _ in range(rng.randint(0, 3)):
                self._weird_shape(a.list.shape.add(), rng)
        return key

    def _same_kind_attr(self, a, rng: random.Random, funcs: list[str]) -> str:
        """Change an attribute's value but not its kind (what TensorFlow's importer checks first)."""
        which = a.WhichOneof("value")
        small = [0, 1, 2, 3, 4, 5, 7, 8, -1, -2, -3, 64, 255]
        if which == "i":
            a.i = rng.choice(small) if rng.random() < 0.8 else _weird_int(rng)
        elif which == "f":
            a.f = rng.choice([0.0, 1e-3, 0.5, 1.0, 2.0, -1.0]) if rng.random() < 0.6 else _weird_float(rng)
        elif which == "b":
            a.b = not a.b
        elif which == "s":
            a.s = rng.choice(TF_STRINGS)
        elif which == "type":
            a.type = rng.choice(TF_NUMERIC)
        elif which == "shape":
            self._weird_shape(a.shape, rng)
        elif which == "func":
            a.func.name = rng.choice(funcs + ["missing_fn"])
        elif which == "tensor":
            self._weird_tensor(a.tensor, rng)
        elif which == "list":
            lst = a.list
            if len(lst.i):
                vals = list(lst.i)
                r = rng.random()
                if r < 0.4:
                    vals[rng.randrange(len(vals))] = rng.choice(small) if rng.random() < 0.8 else _weird_int(rng)
                elif r < 0.55:
                    vals.reverse()
                elif r < 0.7:
                    del vals[rng.randrange(len(vals))]
                elif r < 0.85:
                    vals.append(rng.choice(small))
                else:
                    rng.shuffle(vals)
                del lst.i[:]
                lst.i.extend(vals)
            elif len(lst.type):
                lst.type[rng.randrange(len(lst.type))] = rng.choice(TF_NUMERIC)
                if rng.random() < 0.3:
                    del lst.type[rng.randrange(len(lst.type))]
            elif len(lst.shape):
                self._weird_shape(lst.shape[rng.randrange(len(lst.shape))], rng)
            elif len(lst.s):
                lst.s[rng.randrange(len(lst.s))] = rng.choice(TF_STRINGS)
            else:
                lst.i.extend([rng.choice(small) for _ in range(rng.randint(1, 4))])
        return "same"

    def _mutate_value(self, n, rng: random.Random) -> str:
        """Edit the value of a small numeric Const, keeping its dtype: axes, perms, shapes, paddings,
        begin/end/strides, split sizes and the like reach the mappers."""
        import numpy as np
        from tensorflow.python.framework import tensor_util

        t = n.attr["value"].tensor
        try:
            arr = np.array(tensor_util.MakeNdarray(t))
        except Exception:  # noqa: BLE001 - mutated already into something unreadable
            return "value:unreadable"
        if arr.size > 64 or arr.dtype.kind not in "iuf":
            return "value:skip"
        flat = arr.reshape(-1).copy()
        r = rng.random()
        if r < 0.45 and flat.size:
            pool = [0, 1, 2, 3, -1, -2, 5, 100, -100, 2**31 - 1, -(2**31)] if flat.dtype.kind in "iu" else \
                [0.0, 1.0, -1.0, 1e30, float("nan"), float("inf")]
            v = rng.choice(pool)
            with contextlib.suppress(OverflowError, ValueError):
                flat[rng.randrange(flat.size)] = np.array(v).astype(flat.dtype)
            new = flat.reshape(arr.shape)
        elif r < 0.6:
            new = flat[::-1].reshape(arr.shape)
        elif r < 0.75:
            new = flat[:-1] if flat.size else flat  # one element fewer (a rank-1 shape)
        elif r < 0.9:
            new = np.concatenate([flat, flat[-1:] if flat.size else np.zeros(1, flat.dtype)])
        else:
            new = flat.reshape(arr.shape) if arr.ndim == 0 else flat.reshape(-1)[:0]
        t.CopyFrom(tensor_util.make_tensor_proto(np.asarray(new, dtype=arr.dtype)))
        return "value"

    def _mutate_graph(self, gd, rng: random.Random) -> str:
        lib = list(gd.library.function)
        funcs = [f.signature.name for f in lib]
        # the nodes to work on: the main graph's, or those of one function of the library
        in_func = bool(lib) and rng.random() < 0.3
        nodes = rng.choice(lib).node_def if in_func else gd.node
        if not len(nodes):
            nodes = gd.node
        names = [n.name for n in nodes]
        tensors = [n.attr["value"].tensor for n in gd.node if n.op == "Const" and "value" in n.attr]
        kind = rng.choice(["optype", "optype", "attr", "attr", "attr", "attr", "tensor", "tensor", "value", "value",
                           "value", "placeholder", "inputs", "inputs", "missing", "cycle", "nodes", "huge", "huge",
                           "library", "versions", "device"])
        where = "fn:" if in_func else ""
        if kind == "optype" and len(nodes):
            n = rng.choice(nodes)
            group = next((g for g in TF_OP_GROUPS if n.op in g), None)
            if group is not None and rng.random() < 0.7:
                n.op = rng.choice(group)
            else:
                n.op = rng.choice(self.op_types + TF_OTHER_OPS)
        elif kind == "value":
            consts = [n for n in nodes if n.op == "Const" and n.attr["value"].HasField("tensor")]
            if consts:
                kind = self._mutate_value(rng.choice(consts), rng)
        elif kind == "placeholder":
            phs = [n for n in gd.node if n.op == "Placeholder"]
            if phs:
                sp = rng.choice(phs).attr["shape"].shape
                r = rng.random()
                if r < 0.25:
                    sp.Clear()
                    sp.unknown_rank = True
                elif r < 0.55 and len(sp.dim):
                    sp.dim[rng.randrange(len(sp.dim))].size = -1
                elif r < 0.8 and len(sp.dim):
                    sp.dim[rng.randrange(len(sp.dim))].size = rng.choice([0, 1, 2, 3, 5, 7, 16])
                elif r < 0.9:
                    sp.dim.add().size = rng.choice([1, 2, -1])
                elif len(sp.dim):
                    del sp.dim[rng.randrange(len(sp.dim))]
        elif kind == "attr" and len(nodes):
            kind += ":" + self._mutate_attr(rng.choice(nodes), rng, funcs, tensors)
        elif kind == "tensor" and tensors:
            kind += ":" + self._weird_tensor(rng.choice(tensors), rng)
        elif kind == "inputs" and len(nodes):
            n = rng.choice(nodes)
            r = rng.random()
            if r < 0.3 and len(n.input):
                del n.input[rng.randrange(len(n.input))]
            elif r < 0.55 and len(n.input):
                n.input.append(rng.choice(n.input))
            elif r < 0.8 and len(n.input):
                n.input[rng.randrange(len(n.input))] = rng.choice(names) + rng.choice(["", "", ":1", ":2", ":0"])
            else:
                n.input.append(rng.choice(["^", ""]) + rng.choice(names))
        elif kind == "missing" and len(nodes):
            n = rng.choice(nodes)
            bad = rng.choice(["missing", "missing:0", rng.choice(names) + ":99", rng.choice(names) + ":-1",
                              rng.choice(names) + ":x", "^missing", "", ":", "a:b:c", rng.choice(names) + ":2147483648"])
            if len(n.input) and rng.random() < 0.7:
                n.input[rng.randrange(len(n.input))] = bad
            else:
                n.input.append(bad)
        elif kind == "cycle" and len(nodes):
            consumers = [(n, m) for m in nodes for n in nodes
                         if any(i.lstrip("^").split(":")[0] == n.name for i in m.input)]
            if consumers and rng.random() < 0.7:
                n, m = rng.choice(consumers)  # n feeds m: make n read m too
                if len(n.input) and rng.random() < 0.5:
                    n.input[rng.randrange(len(n.input))] = m.name
                else:
                    n.input.append(m.name)
            else:
                n = rng.choice(nodes)
                n.input.append(n.name)  # a self-loop
        elif kind == "nodes" and len(nodes):
            r = rng.random()
            i = rng.randrange(len(nodes))
            if r < 0.35:
                del nodes[i]
            elif r < 0.6:
                nodes.add().CopyFrom(nodes[i])  # a duplicate name
            elif r < 0.85:
                nodes[i].name = rng.choice(["", "renamed", "a/b", "x:0", "^x", rng.choice(names), "\u00e9"])
            else:
                order = list(nodes)
                rng.shuffle(order)
                copies = [type(o)() for o in order]
                for c, o in zip(copies, order):
                    c.CopyFrom(o)
                del nodes[:]
                nodes.extend(copies)
        elif kind == "huge":
            # a hostile size where TensorFlow or the frontend would allocate or fold from it
            r = rng.random()
            phs = [n for n in gd.node if n.op == "Placeholder"]
            if r < 0.35 and phs:
                sp = rng.choice(phs).attr["shape"].shape
                del sp.dim[:]
                for _ in range(rng.randint(1, 4)):
                    sp.dim.add().size = rng.choice([2**20, 2**31, 2**40, 2**62, 2**63 - 1, 1])
            elif r < 0.7 and tensors:
                t = rng.choice([t for t in tensors if t.dtype in (3, 9)] or tensors)  # int32/int64 shape consts
                vals = [rng.choice([2**20, 2**31 - 1, 2**30, -1, 0, 7]) for _ in range(rng.randint(1, 4))]
                t.ClearField("tensor_content")
                t.ClearField("int_val")
                t.ClearField("int64_val")
                del t.tensor_shape.dim[:]
                t.tensor_shape.dim.add().size = len(vals)
                if t.dtype == 9:
                    t.int64_val.extend(vals)
                else:
                    t.dtype = 3
                    t.int_val.extend(vals)
            else:  # a Fill of a huge constant shape feeding an op of the graph
                n = rng.choice(nodes) if len(nodes) else None
                dims = gd.node.add()
                dims.name, dims.op = "huge_dims", "Const"
                dims.attr["dtype"].type = 3
                dt = dims.attr["value"].tensor
                dt.dtype = 3
                vals = [rng.choice([2**15, 2**20, 2**31 - 1, 2**30]) for _ in range(rng.randint(1, 3))]
                dt.tensor_shape.dim.add().size = len(vals)
                dt.int_val.extend(vals)
                val = gd.node.add()
                val.name, val.op = "huge_val", "Const"
                val.attr["dtype"].type = 1
                val.attr["value"].tensor.dtype = 1
                val.attr["value"].tensor.float_val.append(1.0)
                fill = gd.node.add()
                fill.name, fill.op = "huge_fill", "Fill"
                fill.input.extend(["huge_dims", "huge_val"])
                fill.attr["T"].type = 1
                fill.attr["index_type"].type = 3
                if n is not None and not in_func and len(n.input) and rng.random() < 0.7:
                    n.input[rng.randrange(len(n.input))] = "huge_fill"
        elif kind == "library":
            if lib:
                f = rng.choice(lib)
                r = rng.random()
                if r < 0.2:
                    del gd.library.function[funcs.index(f.signature.name)]
                elif r < 0.35:
                    f.signature.name = rng.choice(funcs + ["renamed_fn"])
                elif r < 0.5 and len(f.signature.input_arg):
                    del f.signature.input_arg[rng.randrange(len(f.signature.input_arg))]
                elif r < 0.6:
                    extra = f.signature.input_arg.add()
                    extra.name, extra.type = "extra_arg", rng.choice(TF_NUMERIC)
                elif r < 0.75 and len(f.signature.output_arg):
                    del f.signature.output_arg[rng.randrange(len(f.signature.output_arg))]
                elif r < 0.85 and len(f.ret):
                    k = rng.choice(sorted(f.ret))
                    f.ret[k] = rng.choice(["missing:output:0", "", k, f"{k}:0"] + [f"{nd.name}:z:0" for nd in f.node_def])
                else:
                    gd.library.function.add().CopyFrom(f)  # a duplicate definition
            else:  # make a node call a function that is not there
                n = rng.choice(nodes)
                n.op = rng.choice(["StatelessIf", "While", "PartitionedCall", "missing_fn"])
                n.attr[rng.choice(["then_branch", "body", "f", "cond"])].func.name = "missing_fn"
        elif kind == "versions":
            gd.versions.producer = _weird_int(rng) & 0x7FFFFFFF if rng.random() < 0.8 else 0
            gd.versions.min_consumer = rng.choice([0, 1, 2**30, 2**31 - 1])
            if rng.random() < 0.3:
                gd.versions.bad_consumers.append(rng.choice([0, 1, 2**31 - 1]))
        elif kind == "device" and len(nodes):
            rng.choice(nodes).device = rng.choice(["/device:GPU:0", "/job:x/task:99", "garbage", "/device:CPU:99"])
        return where + kind

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        import ge_core as ge

        name, seed = self.seeds[rng.randrange(len(self.seeds))]
        r = rng.random()
        options: dict[str, Any] = {}
        if r < 0.2:
            data, what = mutate_bytes(seed, rng, self.raw)
        else:
            gd = self.graph_pb2.GraphDef()
            gd.ParseFromString(seed)
            kinds = [self._mutate_graph(gd, rng) for _ in range(rng.choice((1, 1, 1, 2, 2, 3)))]
            what = "proto:" + "+".join(kinds)
            if rng.random() < 0.1 and len(gd.node):
                # name an inner node as the output: converts ops off the seed's output path
                n = rng.choice(gd.node)
                options["out_nodes"] = [n.name + rng.choice(["", "", ":0", ":1"])]
                what += "+out_nodes"
            data = gd.SerializeToString(deterministic=True)
            if rng.random() < 0.1:
                data, w2 = mutate_bytes(data, rng, rounds=1)
                what += "+" + w2
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        graph = ge.load(self.path, **options)
        if rng.random() >= self.compile_share:
            return "ok"
        model = ge.compile(graph)
        model.save(os.path.join(self.workdir, "compiled.om"))
        return "compiled+saved"


# ================================================================================================
# generated source: fused programs and every other string that could reach generated code
# ================================================================================================
def codegen_seed_models():
    """Small ONNX models whose compilation makes every kind of compiler-internal node: FusedConv
    with a residual+activation epilogue, FusedElemwise, FusedMatMul with an epilogue, Softmax,
    LayerNorm, and a FusedElemwise with attributes (Clip, HardSigmoid, Elu, LeakyRelu)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    f32 = TensorProto.FLOAT
    vi = helper.make_tensor_value_info

    def arr(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def model(nodes, inputs, outputs, inits):
        g = helper.make_graph(nodes, "g", inputs, outputs, inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    mk = helper.make_node
    conv = model([mk("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                  mk("Add", ["c", "res"], ["c2"]),
                  mk("Relu", ["c2"], ["r"]),
                  mk("Sigmoid", ["r"], ["s"]),
                  mk("Mul", ["s", "r"], ["m"]),
                  mk("LeakyRelu", ["m"], ["y"], alpha=0.3),
                  mk("MatMul", ["q", "wm"], ["mm"]),
                  mk("Add", ["mm", "bm"], ["mb"]),
                  mk("Tanh", ["mb"], ["th"]),
                  mk("LayerNormalization", ["th", "gamma", "beta"], ["ln"], axis=-1),
                  mk("Softmax", ["ln"], ["z"], axis=-1)],
                 [vi("x", f32, [1, 3, 4, 4]), vi("q", f32, [2, 8])], [vi("y", f32, None), vi("z", f32, None)],
                 [arr("w", 4, 3, 3, 3), arr("b", 4), arr("res", 1, 4, 4, 4), arr("wm", 8, 8), arr("bm", 8),
                  arr("gamma", 8), arr("beta", 8)])
    lo = numpy_helper.from_array(np.array(-0.5, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(0.7, np.float32), "hi")
    attrs = model([mk("Add", ["u", "k"], ["a"]),
                   mk("Clip", ["a", "lo", "hi"], ["cl"]),
                   mk("HardSigmoid", ["cl"], ["hs"], alpha=0.3, beta=0.4),
                   mk("Elu", ["hs"], ["el"], alpha=0.7),
                   mk("Mul", ["el", "u"], ["v"])],
                  [vi("u", f32, [3, 5])], [vi("v", f32, None)], [arr("k", 5), lo, hi])
    return {"conv": conv, "attrs": attrs}


def with_node(m, node, nested: bool) -> bytes:
    """ONNX model ``m`` (changed in place) serialized with ``node`` (output ``fz``, reading the
    first graph input) added as a graph output, or inside the then-branch of an If (``nested``)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    g = m.graph
    x = g.input[0].name
    if nested:
        branch = helper.make_graph([node], "then", [], [helper.make_tensor_value_info("fz", TensorProto.FLOAT, None)])
        other = helper.make_graph([helper.make_node("Identity", [x], ["fz2"])], "else", [],
                                  [helper.make_tensor_value_info("fz2", TensorProto.FLOAT, None)])
        g.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
        g.node.append(helper.make_node("If", ["cond"], ["fzo"], then_branch=branch, else_branch=other))
        g.output.append(helper.make_tensor_value_info("fzo", TensorProto.FLOAT, None))
    else:
        g.node.append(node)
        g.output.append(helper.make_tensor_value_info("fz", TensorProto.FLOAT, None))
    m.opset_import.append(helper.make_opsetid(node.domain, 1))
    return m.SerializeToString()


def read_om(path: str) -> tuple[dict, bytes]:
    """The JSON model definition and the weights blob of an .om."""
    from ge_core.om import read_model_definition
    from ge_core.om_container import read_container

    with read_container(path) as c:
        return read_model_definition(path, c), bytes(c.partition("weights"))


def write_om(path: str, definition: dict, blob: bytes) -> bytes:
    """Write ``definition`` (possibly hostile) and ``blob`` as a valid .om container; its bytes."""
    from ge_core.om_container import write_container

    try:
        text = json.dumps(definition, allow_nan=True).encode("utf-8")
    except (ValueError, RecursionError):
        text = b"{}"
    write_container(path, [("model", text, 8), ("weights", blob, 4096)], producer="fuzz")
    with open(path, "rb") as f:
        return f.read()


def internal_nodes(definition: dict) -> list[dict]:
    """The compiler-internal (ge.fused) nodes of an .om's model definition."""
    nodes = (definition.get("graph") or {}).get("nodes") or []
    return [n for n in nodes if isinstance(n, dict) and n.get("domain") == "ge.fused"]


class Canary:
    """A file and an environment variable that a payload running as code would create; checked
    after every case."""

    def __init__(self, workdir: str) -> None:
        self.path = os.path.join(workdir, "canary", "PWNED")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.env = "GE_CODEGEN_CANARY"
        os.environ.pop(self.env, None)
        acts = [f"__import__('pathlib').Path({self.path!r}).touch()",
                f"open({self.path!r},'w').write('x')",
                f"__import__('os').environ.__setitem__({self.env!r},'1')",
                f"__import__('os').system('touch {self.path}')",
                f"[c for c in ().__class__.__base__.__subclasses__() if c.__name__=='Popen'][0](['touch',{self.path!r}])"]
        wraps = ["{p}", "0.1, x={p}", "a0) or {p} or (a0", "a0, out=out) if {p} else (a0", "\n{p}\n", "'; {p}; '",
                 '"); {p}; ("', "# x\n{p}", "alpha=({p}), beta", "t0\n    {p}\n    #", "y)]; {p}; [(y", "1)\n{p}\n(1"]
        self.payloads = [w.replace("{p}", a) for a in acts for w in wraps]

    def triggered(self) -> str | None:
        if os.path.exists(self.path):
            return f"the canary file {self.path} was created"
        if os.environ.get(self.env):
            return f"the canary variable {self.env} was set"
        return None

    def check(self, ctx: dict[str, Any]) -> None:
        """:class:`OracleViolation` if a payload of the case ``ctx`` describes ran."""
        hit = self.triggered()
        if hit:
            raise OracleViolation(f"a payload ran: {hit} ({ctx['mutation']})")


#: strings and values a hostile program tries (plus the canary payloads)
_CG_NAMES = ["__class__", "__globals__", "__builtins__", "__import__", "a0.__class__", "nan", "inf", "1e999", "exec",
             "eval", "lambda: 0", "out", "np", "_dt", "kernel", "alpha", "approximate", "min", "max", "beta", "x", "",
             " ", "a0", "\u00e9", "a\u0661", "K0", "v0", "math"]
_CG_VALUES: list[Any] = [float("nan"), float("inf"), float("-inf"), 10**400, -(10**30), 2**63, 1e308, -0.0, True,
                         None, [1, [2, [3]]], {"a": 1}, "tanh", "none", "0.3", 0.3, 7, "", []]
_CG_REFS: list[Any] = ["a0", "a1", "a2", "a7", "a99999999999", "t0", "t1", "t9", "t-1", "y", "a01", "a\u0661", "a-1",
                       "", "a", "t", "Y", 5, None, ["a0"], "a0 ", "a0\n"]


class CodegenTarget(Target):
    """Generated-source inputs: random attribute keys and values (quotes, newlines,
    ``__import__``, dunders, huge numbers, NaN, nested lists), refs and op names in the programs
    of every compiler-internal op, and hostile node / value / graph names. Each case is either a
    compiled .om whose internal nodes were mutated (loaded, run, and its sink source inspected
    through ``ge run`` / ``ge inspect --source``) or a source .onnx carrying an internal node (which
    must be refused). A canary file and environment variable, that every payload tries to make,
    must never appear; every case ends in a result or a GEError."""

    name = "codegen"
    #: cases that turn the compiled loops on (numba compiles each new program: slow)
    loop_share = 0.03
    onnx_share = 0.3

    def warm_up(self) -> None:
        import ge_core as ge

        models = codegen_seed_models()
        for m in models.values():
            ge.compile(m.SerializeToString())
        import ge_core.cli  # noqa: F401

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import ge_core as ge
        from ge_core.plugins import registries

        self.canary = Canary(workdir)
        self.path = os.path.join(workdir, "case.om")
        self.onnx_models = codegen_seed_models()
        self.seeds: list[tuple[str, dict, bytes]] = []
        for n, m in self.onnx_models.items():
            p = os.path.join(workdir, f"seed_{n}.om")
            ge.compile(m.SerializeToString()).save(p)
            d, blob = read_om(p)
            assert internal_nodes(d), f"seed {n} has no internal node"
            self.seeds.append((n, d, blob))
        ops = registries().ops
        self.internal = sorted((d.domain, d.op_type) for d in ops.values() if d.internal)
        # the fusion plugin's generated kernels and the CPU backend's blocked-layout ops
        assert self.internal and ops.internal_domains() == {"ge.fused", "ge.cpu"}, ops.internal_domains()
        from ge_fusion import codegen

        self.step_ops = sorted(codegen.OPS)
        self.schema_keys = sorted({k for f in codegen.OPS.values() for k in f.attrs})
        self.programs = [n["attrs"][a]["s"] for _, d, _ in self.seeds for n in internal_nodes(d)
                         for a in ("program", "epilogue") if a in n.get("attrs", {})]

    # -- mutations ---------------------------------------------------------------------------------
    def _word(self, rng: random.Random) -> Any:
        r = rng.random()
        if r < 0.4:
            return rng.choice(self.canary.payloads)
        if r < 0.7:
            return rng.choice(_CG_NAMES + self.schema_keys)
        return _weird_str(rng)

    def _value(self, rng: random.Random) -> Any:
        r = rng.random()
        if r < 0.3:
            return self._word(rng)
        if r < 0.5:
            return _weird_float(rng)
        if r < 0.6:
            return _weird_int(rng)
        return copy.deepcopy(rng.choice(_CG_VALUES))

    def _program(self, rng: random.Random) -> tuple[Any, str]:
        """A mutated program: a list of steps (mostly), or something else entirely."""
        steps = json.loads(rng.choice(self.programs))
        kinds: list[str] = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            try:
                self._mutate_steps(steps, rng, kinds)
            except (TypeError, IndexError, KeyError, AttributeError):
                kinds.append("skip")  # an earlier edit broke the step's shape
            if kinds and kinds[-1] in ("raw", "long"):
                break
        if kinds and kinds[-1] == "raw":
            return self._value(rng), "raw"
        if kinds and kinds[-1] == "long":
            steps = [["Relu", ["a0" if i == 0 else f"t{i - 1}"], {}] for i in range(rng.choice((100, 4097)))]
        return steps, "+".join(kinds)

    def _mutate_steps(self, steps: list, rng: random.Random, kinds: list[str]) -> None:
        """One edit of ``steps`` in place, named in ``kinds`` ("raw" / "long": replace them)."""
        r = rng.random()
        st = rng.choice(steps) if steps else None
        if r < 0.25 and st is not None:
            st[2][self._word(rng) if rng.random() < 0.7 else rng.choice(self.schema_keys)] = self._value(rng)
            kinds.append("attr")
        elif r < 0.4 and st is not None and st[2]:
            st[2][rng.choice(list(st[2]))] = self._value(rng)
            kinds.append("attr-value")
        elif r < 0.55 and st is not None:
            refs = st[1]
            new = rng.choice(_CG_REFS) if rng.random() < 0.6 else self._word(rng)
            if refs and rng.random() < 0.7:
                refs[rng.randrange(len(refs))] = new
            else:
                refs.append(new)
            kinds.append("ref")
        elif r < 0.7 and st is not None:
            st[0] = rng.choice(self.step_ops) if rng.random() < 0.5 else self._word(rng)
            kinds.append("op")
        elif r < 0.8:
            op = rng.choice(self.step_ops)
            steps.append([op, [rng.choice(_CG_REFS) for _ in range(rng.randint(0, 3))],
                          {rng.choice(self.schema_keys): self._value(rng)} if rng.random() < 0.5 else {}])
            kinds.append("step")
        elif r < 0.85:
            kinds.append("long")
        elif r < 0.9 and st is not None:
            st[rng.randrange(3)] = self._value(rng)
            kinds.append("shape")
        else:
            kinds.append("raw")

    def _rename(self, d: dict, rng: random.Random) -> str:
        """Give a value (everywhere it is named), a node or the graph a hostile name."""
        g = d.get("graph") or {}
        new = self._word(rng) if rng.random() < 0.8 else "x" + "\n" * rng.randint(1, 3) + self._word(rng)
        r = rng.random()
        if r < 0.3:
            g["name"] = new
            return "graph-name"
        nodes = [n for n in g.get("nodes") or [] if isinstance(n, dict)]
        if r < 0.5 and nodes:
            rng.choice(nodes)["name"] = new
            return "node-name"
        names = [v["name"] for v in (g.get("inputs") or []) + (g.get("constants") or []) if isinstance(v, dict)]
        names += [o["name"] for n in nodes for o in n.get("outputs") or [] if isinstance(o, dict)]
        if not names:
            return "none"
        old = rng.choice(names)

        def sub(x: Any) -> Any:
            if isinstance(x, dict):
                return {(new if k == old else k): sub(v) for k, v in x.items()}
            if isinstance(x, list):
                return [sub(v) for v in x]
            return new if x == old else x

        d["graph"] = sub(g)
        if isinstance(d.get("memory_plan"), dict):
            d["memory_plan"] = sub(d["memory_plan"])
        return "value-name"

    def _mutate_om(self, d: dict, rng: random.Random) -> str:
        kinds = []
        for _ in range(rng.choice((1, 1, 2))):
            nodes = internal_nodes(d)
            r = rng.random()
            n = rng.choice(nodes) if nodes else None
            if n is None:
                break
            attrs = n.setdefault("attrs", {})
            if r < 0.55:
                prog, what = self._program(rng)
                key = rng.choice(["program", "epilogue"]) if rng.random() < 0.2 else \
                    ("program" if n.get("op") == "FusedElemwise" else "epilogue")
                try:
                    text = json.dumps(prog, allow_nan=True) if not isinstance(prog, str) or rng.random() < 0.5 else prog
                except (ValueError, RecursionError):
                    text = "[]"
                attrs[key] = {"s": text}
                kinds.append(f"program:{what}")
            elif r < 0.7:
                domain, op = rng.choice(self.internal)
                n["op"] = op if rng.random() < 0.8 else self._word(rng)
                kinds.append("node-op")
            elif r < 0.85:
                key = rng.choice(["approximate", "axis", "scale", "epsilon", "transA", "alpha", "group", "pads",
                                  "auto_pad"]) if rng.random() < 0.6 else self._word(rng)
                v = self._value(rng)
                kind = "s" if isinstance(v, str) else "f" if isinstance(v, float) else "i" if type(v) is int else \
                    rng.choice(["s", "i", "f", "list"])
                attrs[key] = {kind: v}
                kinds.append("node-attr")
            else:
                kinds.append(self._rename(d, rng))
        return "+".join(kinds)

    # -- cases -------------------------------------------------------------------------------------
    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        os.environ["GE_FUSION_JIT"] = "1" if rng.random() < self.loop_share else "0"
        try:
            if rng.random() < self.onnx_share:
                return self._onnx_case(rng, ctx)
            return self._om_case(rng, ctx)
        finally:
            os.environ.pop("GE_DEBUG", None)
            self.canary.check(ctx)

    def _om_case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        import contextlib
        import io

        import ge_core as ge
        from ge_core.cli import main as ge_main

        name, d, blob = rng.choice(self.seeds)
        dd = copy.deepcopy(d)
        what = self._mutate_om(dd, rng)
        ctx["mutation"] = f"om:{what} (seed {name})"
        ctx["input"] = write_om(self.path, dd, blob)
        r = rng.random()
        if r < 0.15:
            # the commands: GE_DEBUG makes them raise instead of printing an exit status
            os.environ["GE_DEBUG"] = "1"
            out = io.StringIO()
            inspect = r < 0.08
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                ge_main(["inspect", self.path, "--source"] if inspect else ["run", self.path, "--json"])
            if inspect:
                self._check_source(out.getvalue(), ctx)
            return "inspected" if inspect else "command-ran"
        model = ge.load_om(self.path)
        self._check_source(getattr(model.executable, "source", "") or "", ctx)
        if rng.random() < 0.6:
            from ge_sdk.cli import random_feeds

            model.run(random_feeds(model, 0))
            return "ran"
        return "loaded"

    def _check_source(self, src: str, ctx: dict[str, Any]) -> None:
        """Generated executor source holds no string and nothing of a payload."""
        for bad in ("'", '"', "__", "import", "#", "canary"):
            if bad in src:
                raise OracleViolation(f"generated source contains {bad!r} ({ctx['mutation']})")

    def _onnx_case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        from onnx import helper

        import ge_core as ge

        name = rng.choice(list(self.onnx_models))
        m = copy.deepcopy(self.onnx_models[name])
        domain, op = rng.choice(self.internal)
        prog, what = self._program(rng)
        try:
            text = json.dumps(prog, allow_nan=True) if not isinstance(prog, str) else prog
        except (ValueError, RecursionError):
            text = "[]"
        attrs = {rng.choice(["program", "epilogue"]): text}
        if rng.random() < 0.3:
            attrs[str(self._word(rng))] = str(self._value(rng))
        x = m.graph.input[0].name
        node = helper.make_node(op, [x] * (3 if op in ("FusedConv", "FusedMatMul", "Attention") else 1), ["fz"],
                                domain=domain, name=str(self._word(rng)), **attrs)
        nested = rng.random() < 0.3
        data = with_node(m, node, nested)
        ctx["mutation"] = f"onnx:{op}{'-nested' if nested else ''}:{what} (seed {name})"
        ctx["input"] = data
        if rng.random() < 0.5:
            ge.load(data)
        else:
            ge.compile(data)
        raise OracleViolation(f"a source model with a {domain}::{op} node was accepted ({ctx['mutation']})")


# ================================================================================================
# PyTorch .pt2 archives (torch.export.save), read without unpickling
# ================================================================================================
class _PicklePayload:
    """Unpickling this calls ``fn(arg)`` (``os.system`` of a shell command, ``exec`` of Python)."""

    def __init__(self, fn: Any, arg: str) -> None:
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


_PT2_SEEDS: list[tuple[str, bytes]] = []


def pt2_seeds() -> list[tuple[str, bytes]]:
    """(name, archive bytes) of three small programs saved with ``torch.export.save``: conv+bn+relu,
    an MLP with a dynamic batch ``Dim``, and a model with a buffer, a parameter and a tensor
    constant. Built once per process (exporting takes seconds)."""
    if _PT2_SEEDS:
        return _PT2_SEEDS
    import tempfile

    import torch

    torch.manual_seed(0)

    class ConvBnRelu(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(6, 8)
            self.b = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    class Buffered(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("shift", torch.arange(5, dtype=torch.float32))
            self.w = torch.nn.Parameter(torch.ones(5))

        def forward(self, x):
            return x * self.w + self.shift + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])

    batch = torch.export.Dim("batch", min=1, max=1024)
    progs = [
        ("convbnrelu", torch.export.export(ConvBnRelu().eval(), (torch.randn(1, 3, 6, 6),))),
        ("mlp", torch.export.export(Mlp().eval(), (torch.randn(4, 6),), dynamic_shapes={"x": {0: batch}})),
        ("buffered", torch.export.export(Buffered().eval(), (torch.randn(3, 5),))),
    ]
    with tempfile.TemporaryDirectory() as t:
        for name, ep in progs:
            p = os.path.join(t, f"{name}.pt2")
            torch.export.save(ep, p)
            with open(p, "rb") as f:
                _PT2_SEEDS.append((name, f.read()))
    return _PT2_SEEDS


def zip_entries(data: bytes) -> tuple[str, dict[str, bytes]]:
    """The root folder and ``{name under the root: bytes}`` of a .pt2 archive."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = z.namelist()
        root = names[0].split("/", 1)[0] + "/"
        return root, {n[len(root):]: z.read(n) for n in names}


def zip_bytes(entries: list[tuple[str, bytes]], compression: int = 0) -> bytes:
    """A zip of ``(full name, bytes)`` entries (names may repeat)."""
    import io
    import warnings
    import zipfile

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name"
        with zipfile.ZipFile(buf, "w", compression) as z:
            for name, data in entries:
                z.writestr(name, data)
    return buf.getvalue()


def _patch_zip_sizes(data: bytes, rng: random.Random) -> bytes:
    """Overwrite the declared (uncompressed and/or compressed) size of some local and central
    directory records with hostile values; the data stays as it is."""
    buf = bytearray(data)
    spots = []
    for sig, usize, csize in ((b"PK\x03\x04", 22, 18), (b"PK\x01\x02", 24, 20)):
        at = buf.find(sig)
        while at >= 0:
            spots.append((at, usize, csize))
            at = buf.find(sig, at + 4)
    for at, usize, csize in rng.sample(spots, min(len(spots), rng.choice((2, 4, 8, 32)))):
        v = rng.choice([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32 - 2, 300 << 20, 1 << 28])
        for off in rng.choice(((usize,), (csize,), (usize, csize))):
            if at + off + 4 <= len(buf):
                struct.pack_into("<I", buf, at + off, v)
    return bytes(buf)


#: call targets a hostile program names (and a few real operators, to keep some programs valid)
_PT2_TARGETS = ["builtins.eval", "builtins.exec", "os.system", "torch.os.system", "subprocess.Popen",
                "torch._C._nn.linear", "torch.ops.aten.from_file.default", "torch.ops.aten.save.default",
                "torch.ops.aten._print.default", "torch.ops.aten.nosuch.default", "torch.ops.aten.linear",
                "torch.ops.aten.relu.default", "torch.ops.aten.tanh.default", "torch.ops.aten.add.Tensor",
                "torch.ops.aten.linear.default", "torch.ops.aten.sigmoid.default", "torch.ops.aten.tanh.out",
                "torch.ops.higher_order.cond", "torch.ops.higher_order.run_and_save_rng_state",
                "torch.ops.custom.op.default", "torch.ops.aten.__class__.default", "_operator.getitem",
                "_operator.attrgetter", "math.floor", "math.e", "torch.sym_int", "torch.load",
                "torch.ops.aten.linear.default.__call__", "", "torch..ops", "torch.ops.aten"]
#: shape expressions a hostile program tries
_PT2_EXPRS = ["Symbol('s77', positive=True, integer=True)", "s77", "s77 + 1", "2*s77", "Max(s77, 1)",
              "FloorDiv(s77, 0)", "Mod(s77, 0)", "s77 // 0", "1/0", "oo", "-oo", "s77**99999", "2**2**2**2",
              "9" * 30, "Float('1e999', precision=53)", "Symbol('x.__class__')", "Symbol('s1', evaluate=True)",
              "s77.__class__", "lambda: 0", "(s77,)", "[s77]", "s77 if s77 else 0", "Integer(10**20)",
              "Piecewise((s77, Eq(s77, 1)), (0, True))", "Symbol('s77', positive=False, integer=True)", "", " "]
_PT2_NAMES = ["x", "input", "a0", "K0", "math", "np", "torch", "self", "linear", "tanh", "relu", "getitem",
              "_", "x1", "p_a_weight", "out", "args", "kwargs", "None", "True", "lambda", "import", "class",
              "a.b", "a b", "a-b", "__class__", "__builtins__", "__import__", "x\n", "0x", "\u00e9", "a" * 5000]


def _replace_everywhere(x: Any, old: Any, new: Any) -> Any:
    if isinstance(x, dict):
        return {(new if k == old and isinstance(new, str) else k): _replace_everywhere(v, old, new) for k, v in x.items()}
    if isinstance(x, list):
        return [_replace_everywhere(v, old, new) for v in x]
    return new if x == old and type(x) is type(old) else x


def _json_text(x: Any) -> bytes:
    """``x`` as JSON; a nest too deep for :mod:`json` (made by :func:`_json_mutate`) as a deep text."""
    try:
        return json.dumps(x, allow_nan=True).encode("utf-8")
    except (ValueError, RecursionError):
        return b"[" * 100000 + b"]" * 100000


def _key_paths(d: Any, key: str) -> list[tuple]:
    return [p for p in _json_paths(d) if p and p[-1] == key]


def _at(d: Any, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


class CanaryTarget(Target):
    """A target whose cases (``_case``) are followed by a check of ``self.canary``
    (a :class:`Canary` made in ``setup``)."""

    canary: Canary

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        try:
            return self._case(rng, ctx)
        finally:
            self.canary.check(ctx)

    def _case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        raise NotImplementedError


class Pt2Target(CanaryTarget):
    """``ge.load`` of mutated ``.pt2`` archives (:mod:`ge_torch.pt2`, which never unpickles);
    30% of the programs that load are compiled and run on random feeds.

    Seeds are real archives written by ``torch.export.save`` (:func:`pt2_seeds`). Mutations:

    * zip level: byte edits of the archive, entries dropped, duplicated or renamed (other roots,
      ``..``, absolute names), hostile declared sizes in the local and central records, a
      compressed entry that expands to 16 MiB under a lying size, a deflated archive, the
      ``archive_format`` / ``byteorder`` / version entries changed;
    * the program JSON (``models/model.json``): values renamed everywhere to hostile strings or
      payloads, call targets set to ``builtins.eval`` / ``os.system`` / ``torch.os.system`` /
      effectful or missing operators, shape expressions set to code, tensor metadata, range
      constraints, huge integers, values of other types, deleted keys;
    * the tensor configs and files: sizes, strides, offsets, dtypes, ``use_pickle``, file names;
      files truncated, extended or swapped; pickle payloads (``os.system`` / ``exec`` that would
      touch the canary) as weights, constants, custom or opaque objects, sample inputs and the
      legacy ``model.pt``.

    A canary file and environment variable (:class:`Canary`), that every payload tries to make,
    must never appear."""

    name = "pt2"
    compile_share = 0.3
    #: torch maps hundreds of MiB of address space on import: cap the cases above that
    mem_limit_relative = True

    def warm_up(self) -> None:
        import tempfile
        import warnings

        warnings.simplefilter("ignore")  # torch's deprecation warnings on every load
        import torch

        torch.set_num_threads(1)
        import ge_core as ge
        from ge_sdk.cli import random_feeds

        with tempfile.TemporaryDirectory() as t:
            for name, data in pt2_seeds():
                p = os.path.join(t, f"{name}.pt2")
                with open(p, "wb") as f:
                    f.write(data)
                m = ge.compile(ge.load(p))
                m.run(random_feeds(m, 0))

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        self.canary = Canary(workdir)
        self.path = os.path.join(workdir, "case.pt2")
        self.seeds = [(n, data, *zip_entries(data)) for n, data in pt2_seeds()]
        self.raw = [s[1] for s in self.seeds]
        import pickle

        calls = [(os.system, f"touch {self.canary.path}")] + [(exec, p) for p in self.canary.payloads[::12]]
        self.pickles = [pickle.dumps(_PicklePayload(fn, arg), protocol=2) for fn, arg in calls]

    # -- values ------------------------------------------------------------------------------------
    def _hostile_str(self, rng: random.Random) -> str:
        r = rng.random()
        if r < 0.35:
            return rng.choice(self.canary.payloads)
        if r < 0.8:
            return rng.choice(_PT2_NAMES + _CG_NAMES)
        return _weird_str(rng)

    def _pickle(self, rng: random.Random) -> bytes:
        return rng.choice(self.pickles)

    # -- mutations -------------------------------------------------------------------------------
    def _mutate_program(self, prog: dict, rng: random.Random) -> tuple[dict, str]:
        kind = rng.choice(["rename", "rename", "rename-valid", "target", "target", "expr", "expr", "tensor-meta",
                           "range", "huge-int", "generic", "generic", "metadata", "version", "delete"])
        graph = prog.get("graph_module", {}).get("graph", {})
        if kind in ("rename", "rename-valid"):
            names = sorted({v for p in _key_paths(graph, "name") for v in [_at(graph, p)] if isinstance(v, str)}
                           | {k for k in graph.get("tensor_values", {})})
            if names:
                old = rng.choice(names)
                new = rng.choice(_PT2_NAMES[:20]) if kind == "rename-valid" else self._hostile_str(rng)
                prog = _replace_everywhere(prog, old, new)
        elif kind == "target":
            nodes = graph.get("nodes") or []
            if nodes:
                r = rng.random()
                nodes[rng.randrange(len(nodes))]["target"] = (
                    rng.choice(_PT2_TARGETS) if r < 0.8 else self._hostile_str(rng))
        elif kind == "expr":
            paths = _key_paths(prog, "expr_str")
            new = rng.choice(_PT2_EXPRS) if rng.random() < 0.6 else rng.choice(self.canary.payloads)
            if paths:
                for p in rng.sample(paths, rng.randint(1, len(paths))):
                    _at(prog, p[:-1])[p[-1]] = new
            else:  # give the program a symbolic size
                graph.setdefault("sym_int_values", {})["s0"] = {"as_expr": {"expr_str": new, "hint": {"as_int": 2}}}
        elif kind == "tensor-meta":
            tvs = graph.get("tensor_values") or {}
            if tvs:
                tm = tvs[rng.choice(sorted(tvs))]
                field = rng.choice(["sizes", "strides", "dtype", "storage_offset", "layout", "device"])
                if field in ("sizes", "strides"):
                    if rng.random() < 0.5 and tm.get(field):
                        tm[field][rng.randrange(len(tm[field]))] = {"as_int": _weird_int(rng)}
                    else:
                        tm[field] = [{"as_int": _weird_int(rng)} for _ in range(rng.choice((0, 1, 3, 65)))]
                elif field == "dtype":
                    tm[field] = rng.choice(list(range(0, 30)) + [-1, 2**31, "float"])
                elif field == "device":
                    tm[field] = {"type": rng.choice(["cpu", "cuda", "meta", "npu", self._hostile_str(rng)]),
                                 "index": rng.choice([None, 0, -1, 2**40])}
                else:
                    tm[field] = rng.choice([{"as_int": _weird_int(rng)}, _weird_int(rng), None, {"as_expr": {}}])
        elif kind == "range":
            rc = prog.setdefault("range_constraints", {})
            key = rng.choice(sorted(rc) or ["s0"]) if rng.random() < 0.8 else self._hostile_str(rng)
            rc[key] = {"min_val": rng.choice([0, 1, 2, -1, 2**63 - 1, None, "x"]),
                       "max_val": rng.choice([0, 1, 1024, 2**63 - 1, -5, None, float("inf")])}
        elif kind == "huge-int":
            paths = [p for p in _json_paths(prog) if p and type(_at(prog, p)) is int]
            if paths:
                p = rng.choice(paths)
                _at(prog, p[:-1])[p[-1]] = rng.choice([2**63, 2**64, -(2**63) - 1, 10**30, 10**5000, 2**63 - 1])
        elif kind == "metadata":
            nodes = graph.get("nodes") or []
            if nodes:
                n = rng.choice(nodes)
                n.setdefault("metadata", {})[rng.choice(["nn_module_stack", "stack_trace", "torch_fn",
                                                         "custom", "source_fn_stack"])] = self._hostile_str(rng)
            if rng.random() < 0.5:
                prog["guards_code"] = [rng.choice(self.canary.payloads)]
        elif kind == "version":
            key = rng.choice(["schema_version", "opset_version", "torch_version", "verifiers"])
            prog[key] = _random_json(rng, [])
        elif kind == "delete":
            paths = [p for p in _json_paths(prog) if p]
            p = rng.choice(paths)
            with contextlib.suppress(KeyError, IndexError, TypeError):
                del _at(prog, p[:-1])[p[-1]]
        else:
            kind += ":" + _json_mutate(prog, rng)
        return prog, kind

    def _mutate_config(self, cfg: Any, rng: random.Random) -> str:
        entries = cfg.get("config") if isinstance(cfg, dict) else None
        if not entries or rng.random() < 0.25:
            return "generic:" + _json_mutate(cfg, rng)
        fqn = rng.choice(sorted(entries))
        meta = entries[fqn]
        field = rng.choice(["use_pickle", "path_name", "path_name", "sizes", "strides", "offset", "dtype", "layout",
                            "is_param", "fqn"])
        tm = meta.setdefault("tensor_meta", {})
        if field == "use_pickle":
            meta["use_pickle"] = rng.choice([True, None, 1, "false"])
        elif field == "path_name":
            meta["path_name"] = rng.choice(["../../models/model.json", "/etc/passwd", "model.pt", "custom_obj_0",
                                            "opaque_obj_0", "weight_0", "tensor_0", "weight_1", "", "a\x00b",
                                            "weight_0/../weight_1", ".data", "missing"])
        elif field in ("sizes", "strides"):
            vals = tm.get(field) or []
            if vals and rng.random() < 0.6:
                vals[rng.randrange(len(vals))] = {"as_int": _weird_int(rng)}
            else:
                tm[field] = [{"as_int": rng.choice([0, 1, 2, 2**31, 2**62 - 1])} for _ in range(rng.choice((0, 1, 4, 65)))]
            if rng.random() < 0.2:
                tm[field] = [{"as_expr": {"expr_str": rng.choice(_PT2_EXPRS)}}]
        elif field == "offset":
            tm["storage_offset"] = rng.choice([{"as_int": _weird_int(rng)}, {"as_int": "0"}, 5, None])
        elif field == "dtype":
            tm["dtype"] = rng.choice(list(range(0, 30)) + [-1, 2**40, "7", None, 7.5])
        elif field == "layout":
            tm["layout"] = rng.choice([0, 1, 6, 8, None, "7"])
        elif field == "is_param":
            meta["is_param"] = rng.choice([True, False, None, "yes"])
        else:
            entries[self._hostile_str(rng)] = entries.pop(fqn)
        return field

    def _mutate_entries(self, root: str, entries: dict[str, bytes], rng: random.Random) -> tuple[bytes, str]:
        """Structure-aware edits of the entries (JSON, tensor files, pickles), zipped again."""
        names = list(entries)
        r = rng.random()
        compression = 0
        if r < 0.45:
            try:
                prog = json.loads(entries["models/model.json"])
                prog, what = self._mutate_program(prog, rng)
                entries["models/model.json"] = _json_text(prog)
            except (ValueError, RecursionError, TypeError, KeyError, AttributeError, IndexError) as e:
                what = f"skip-{type(e).__name__}"
            what = "program:" + what
        elif r < 0.62:
            cname = rng.choice([n for n in names if n.endswith("_config.json")])
            cfg = json.loads(entries[cname])
            try:
                what = self._mutate_config(cfg, rng)
            except (TypeError, KeyError, AttributeError, IndexError) as e:
                what = f"skip-{type(e).__name__}"
            entries[cname] = _json_text(cfg)
            what = f"config:{cname.split('/')[1]}:{what}"
        elif r < 0.8:
            files = [n for n in names if n.startswith(("data/weights/weight_", "data/constants/tensor_"))]
            k = rng.choice(["truncate", "extend", "pickle", "pickle", "swap", "sample-inputs", "custom-obj",
                            "opaque-obj", "legacy", "empty"])
            f = rng.choice(files) if files else "data/weights/weight_0"
            if k == "truncate" and f in entries:
                entries[f] = entries[f][: rng.randrange(len(entries[f]) + 1)]
            elif k == "extend":
                entries[f] = entries.get(f, b"") + bytes(rng.choice((1, 2, 4, 7, 1024)))
            elif k == "pickle":
                entries[f] = self._pickle(rng)
            elif k == "swap" and len(files) > 1:
                a, b = rng.sample(files, 2)
                entries[a], entries[b] = entries[b], entries[a]
            elif k == "sample-inputs":
                entries["data/sample_inputs/model.pt"] = self._pickle(rng)
            elif k in ("custom-obj", "opaque-obj"):
                pname = f"{k.split('-')[0]}_obj_0"
                entries[f"data/constants/{pname}"] = self._pickle(rng)
                cfg = json.loads(entries["data/constants/model_constants_config.json"])
                cfg.setdefault("config", {})["obj0"] = {"path_name": pname, "is_param": False,
                                                        "use_pickle": rng.choice([True, False]), "tensor_meta": None}
                entries["data/constants/model_constants_config.json"] = json.dumps(cfg).encode()
            elif k == "legacy":
                entries[rng.choice(["data/weights/model.pt", "data/constants/model.pt"])] = self._pickle(rng)
            elif k == "empty":
                entries[f] = b""
            what = "weights:" + k
        else:
            k = rng.choice(["drop", "drop", "duplicate", "rename", "format", "byteorder", "version", "bomb",
                            "deflate", "other-model", "extra-root"])
            ordered = list(entries.items())
            full = [(root + n, d) for n, d in ordered]
            if k == "drop":
                del full[rng.randrange(len(full))]
            elif k == "duplicate":
                i = rng.randrange(len(full))
                n, d = full[i]
                full.append((n, rng.choice([d, b"", self._pickle(rng), b"{}"])))
            elif k == "rename":
                i = rng.randrange(len(full))
                n, d = full[i]
                rest = n[len(root):]
                full[i] = (rng.choice([f"other/{rest}", f"../{n}", f"/{n}", rest, f"{root}../{rest}",
                                       f"{root}{rest.upper()}", f"{root}{rest}/", f"{root}./{rest}",
                                       f"{root}{rest}\x00"]), d)
            elif k in ("format", "byteorder", "version"):
                key = {"format": "archive_format", "byteorder": "byteorder", "version": "archive_version"}[k]
                val = rng.choice([b"", b"pt2 ", b"PT2", b"big", b"little\n", b"0", b"99", b"x" * 100, b"\xff"])
                full = [(n, val if n == root + key else d) for n, d in full]
            elif k == "bomb":
                # 16 MiB of zeros or spaces that deflate to 16 KiB, stored under a JSON entry's name
                i = rng.choice([j for j, (n, _) in enumerate(full) if n.endswith(".json")])
                full[i] = (full[i][0], bytes(16 << 20) if rng.random() < 0.5 else b" " * (16 << 20))
                compression = 8
            elif k == "deflate":
                compression = 8
            elif k == "other-model":
                full = [(n.replace("models/model.json", "models/other.json"), d) for n, d in full]
            else:
                full.append(("zz/archive_format", b"pt2"))
            data = zip_bytes(full, compression)
            if k == "bomb" and rng.random() < 0.5:
                data = _patch_zip_sizes(data, rng)
            return data, "zip:" + k
        return zip_bytes([(root + n, d) for n, d in entries.items()], compression), what

    # -- cases -------------------------------------------------------------------------------------
    def _case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        import ge_core as ge

        name, raw, root, entries = rng.choice(self.seeds)
        r = rng.random()
        if r < 0.28:
            data, what = mutate_bytes(raw, rng, self.raw)
        elif r < 0.36:
            data, what = _patch_zip_sizes(raw, rng), "zip:sizes"
        elif r < 0.37:
            data, what = raw, "none:seed"
        else:
            data, what = self._mutate_entries(root, dict(entries), rng)
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        graph = ge.load(self.path)
        if rng.random() >= self.compile_share:
            return "ok"
        from ge_sdk.cli import random_feeds

        model = ge.compile(graph)
        model.run(random_feeds(model, 0))
        return "compiled+ran"


# ================================================================================================
# .npy feed files (ge run --input name=file.npy)
# ================================================================================================
def npy_seeds() -> list[tuple[str, bytes]]:
    """(name, bytes) of valid .npy files written by ``np.save``: several dtypes, ranks, orders."""
    import io

    import numpy as np

    arrays = {
        "f32_2x3": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f32_1x4": np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4),
        "f64_fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        "i64_scalar": np.array(7, np.int64),
        "i32_vec": np.arange(5, dtype=np.int32),
        "u8_img": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        "bool": np.array([True, False, True]),
        "f16_empty": np.zeros((0, 3), np.float16),
        "big_endian": np.arange(4, dtype=">f4").reshape(2, 2),
        "c64": np.array([1 + 2j, 3 - 1j], np.complex64),
    }
    out = []
    for name, a in arrays.items():
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=False)
        out.append((name, buf.getvalue()))
    # a version 2.0 file (4-byte header length)
    buf = io.BytesIO()
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.lib.format.write_array(buf, a, version=(2, 0), allow_pickle=False)
    out.append(("v2_f32", buf.getvalue()))
    return out


_NPY_DESCRS = ["'<f4'", "'|O'", "'O'", "'<U4'", "'|V8'", "'|S3'", "'>f8'", "'<c16'", "'|b1'", "'<M8[s]'",
               "'<m8[ns]'", "'float32'", "'<f2'", "'<i8'", "'|u1'", "'<f0'", "'<f99999999999'", "'x'", "''",
               "[('a', '<f4'), ('b', '|O')]", "[('a', '<f4')]", "('<f4', (2,))", "('<f4', (2**40,))",
               "[('a', '<f4', (1000000, 1000000))]", "{'names': ['a'], 'formats': ['O']}", "None", "4", "b'<f4'",
               "'<V0'", "[('', '<f4')]", "'|V99999999999'"]
_NPY_SHAPES = ["()", "(2, 3)", "(3, 2)", "(6,)", "(0,)", "(-1,)", "(-1, -6)", "(2**62, 4)", "(4294967296,)",
               "(9223372036854775807,)", "(9223372036854775808,)", "(2, 2**62, 2**62)", "(1,) * 64", "(1,)*33",
               "(" + "1, " * 100 + ")", "('2', 3)", "(2.0, 3)", "[2, 3]", "((2,),)", "None", "(True,)",
               "(10**100,)", "(6, 0, 2**63)", "(0, 2**63, 2**63)",
               "(0, 3)", "(2, 0)", "(0, 0)", "(0, 1)"]  # empty feeds: the model's native loops get 0-size extents


def _npy_header(descr: str, fortran: str, shape: str, extra: str = "", version: int = 1, pad_to: int = 64,
                hlen: int | None = None) -> bytes:
    text = "{" + f"'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, {extra}" + "}"
    body = text.encode("latin1", "replace")
    pre = 10 if version == 1 else 12
    total = -(-(pre + len(body) + 1) // pad_to) * pad_to if pad_to else pre + len(body) + 1
    body += b" " * (total - pre - len(body) - 1) + b"\n"
    n = len(body) if hlen is None else hlen
    head = b"\x93NUMPY" + bytes([version, 0])
    head += struct.pack("<H", n & 0xFFFF) if version == 1 else struct.pack("<I", n & 0xFFFFFFFF)
    return head + body


def _npy_split(data: bytes) -> tuple[bytes, bytes, bytes]:
    """(magic+length, header text, data) of a valid .npy."""
    major = data[6]
    pre = 10 if major == 1 else 12
    hlen = struct.unpack("<H", data[8:10])[0] if major == 1 else struct.unpack("<I", data[8:12])[0]
    return data[:pre], data[pre:pre + hlen], data[pre + hlen:]


def _feed_model():
    """A tiny ONNX model: ``y = Relu(x) + 1`` on float32 ``x`` of shape [N, M]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "one"], ["y"])],
                          "feed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [one])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


class FeedsTarget(CanaryTarget):
    """``ge_sdk.inputs.read_feed_file`` on mutated ``.npy`` files (the feeds of ``ge run
    --input``); 30% of the arrays read are fed to a tiny compiled model (``model.run``).

    Seeds are ``np.save`` files of several dtypes, ranks and orders, version 1.0 and 2.0.
    Mutations: the header dict rewritten (``descr`` incl. ``'|O'``, structured and subarray
    dtypes, ``fortran_order``, shapes negative / huge / of other types, extra or missing keys,
    Python code where a literal belongs), the version bytes and the declared header length, the
    data truncated or extended, byte-level edits. Every array read must be what ``np.load``
    (without pickle) reads from the same file; a payload in the header must never run (canary)."""

    name = "feeds"
    run_share = 0.3

    def warm_up(self) -> None:
        import ge_core as ge
        import ge_sdk.inputs  # noqa: F401

        m = ge.compile(_feed_model())
        import numpy as np

        m.run({"x": np.ones((2, 3), np.float32)})

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import ge_core as ge

        self.canary = Canary(workdir)
        self.path = os.path.join(workdir, "feed.npy")
        self.seeds = npy_seeds()
        self.raw = [d for _, d in self.seeds]
        self.model = ge.compile(_feed_model())

    def _mutate(self, data: bytes, rng: random.Random) -> tuple[bytes, str]:
        pre, head, body = _npy_split(data)
        r = rng.random()
        if r < 0.4:  # a new header dict
            try:
                import ast

                d = ast.literal_eval(head.decode("latin1"))
                descr, fortran, shape = repr(d["descr"]), repr(d["fortran_order"]), repr(d["shape"])
            except (ValueError, SyntaxError, KeyError):
                descr, fortran, shape = "'<f4'", "False", "(2, 3)"
            kinds = []
            extra = ""
            for _ in range(rng.choice((1, 1, 2))):
                k = rng.choice(["descr", "descr", "shape", "shape", "fortran", "extra", "code", "missing"])
                kinds.append(k)
                if k == "descr":
                    descr = rng.choice(_NPY_DESCRS)
                elif k == "shape":
                    shape = rng.choice(_NPY_SHAPES)
                elif k == "fortran":
                    fortran = rng.choice(["True", "False", "1", "'yes'", "None", "[]"])
                elif k == "extra":
                    extra = rng.choice(["'x': 1, ", "'descr': '|O', ", "'shape': (10**12,), ", "'': None, "])
                elif k == "code":
                    p = rng.choice(self.canary.payloads)
                    which = rng.randrange(3)
                    descr, shape, fortran = (p, shape, fortran) if which == 0 else \
                        (descr, p, fortran) if which == 1 else (descr, shape, p)
                else:
                    text = _npy_header(descr, fortran, shape)[10:].decode("latin1")
                    key = rng.choice(["'descr': ", "'shape': ", "'fortran_order': "])
                    text = text.replace(key + {"'descr': ": descr, "'shape': ": shape}.get(key, fortran) + ", ", "")
                    new = text.encode("latin1").rstrip()
                    new = new + b" " * (-(len(new) + 11) % 64) + b"\n"
                    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(new)) + new + body, "header:missing"
            version = data[6] if rng.random() < 0.8 else rng.choice((1, 2))
            out = _npy_header(descr, fortran, shape, extra, version=version,
                              pad_to=rng.choice((64, 64, 16, 0)))
            if rng.random() < 0.3:  # data to fit the new header where it is small, else the old data
                body = body * rng.choice((1, 2, 4))
            return out + body, "header:" + "+".join(kinds)
        if r < 0.5:  # version bytes
            buf = bytearray(data)
            buf[6] = rng.choice((0, 1, 2, 3, 4, 255))
            if rng.random() < 0.5:
                buf[7] = rng.choice((0, 1, 255))
            return bytes(buf), "version:bytes"
        if r < 0.6:  # the declared header length
            buf = bytearray(data)
            n = rng.choice((0, 1, 9, len(head) - 1, len(head) + 1, len(head) + 16, 10000, 10001, 65535,
                            2**31, 2**32 - 1))
            if buf[6] == 2 or n > 0xFFFF:
                buf = bytearray(b"\x93NUMPY\x02\x00") + bytearray(struct.pack("<I", n & 0xFFFFFFFF)) + head + body
            else:
                struct.pack_into("<H", buf, 8, n)
            return bytes(buf), "header-length:field"
        if r < 0.7:
            return data[: rng.randrange(len(data))], "truncate:data"
        if r < 0.78:
            return data + bytes(rng.randrange(256) for _ in range(rng.choice((1, 3, 4, 8, 1000)))), "trailing:data"
        if r < 0.85:  # a huge shape with the seed's data
            return _npy_header(repr("<f4"), "False", rng.choice(_NPY_SHAPES[6:13])) + body, "huge-shape:header"
        if r < 0.88:
            return rng.choice([b"", b"\x93NUMPY", b"PK\x03\x04" + bytes(40), b"\x80\x02}q\x00.", data[:10]]), "special:file"
        return mutate_bytes(data, rng, self.raw)

    def _case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        import numpy as np

        from ge_sdk.inputs import read_feed_file

        name, data = rng.choice(self.seeds)
        if rng.random() < 0.05:
            what = "none:seed"
        else:
            data, what = self._mutate(data, rng)
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        arr = read_feed_file("x", self.path)
        if not isinstance(arr, np.ndarray):
            raise OracleViolation(f"read_feed_file returned {type(arr).__name__}, not an array")
        try:
            ref = np.load(self.path, allow_pickle=False)
        except Exception:  # noqa: BLE001 - numpy refuses what GE read: compare nothing
            ref = None
        if ref is not None and (ref.dtype != arr.dtype or ref.shape != arr.shape or ref.tobytes() != arr.tobytes()):
            raise OracleViolation(f"read {arr.dtype}{arr.shape}, np.load reads {ref.dtype}{ref.shape}")
        if rng.random() >= self.run_share:
            return "ok"
        self.model.run({"x": arr})
        return "ran"


TARGETS: dict[str, type[Target]] = {"onnx": OnnxTarget, "om": OmTarget, "config": ConfigTarget, "switch": SwitchTarget,
                                     "tensorflow": TfTarget, "codegen": CodegenTarget, "pt2": Pt2Target,
                                     "feeds": FeedsTarget}


class SelfTestTarget(Target):
    """A deliberately broken reader (mode from ``GE_FUZZ_SELFTEST``) to prove the harness fails."""

    name = "selftest"
    case_timeout = 1.0

    def warm_up(self) -> None:
        import ge_core  # noqa: F401

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        from ge_core.errors import ModelFileError

        mode = os.environ.get("GE_FUZZ_SELFTEST", "raise")
        ctx["mutation"] = mode
        if index < 3:
            raise ModelFileError("a clean refusal")  # fine
        if mode == "raise":
            missing: dict[str, str] = {}
            return missing["missing"]  # KeyError
        if mode == "alloc":
            import numpy as np

            return str(np.zeros(1 << 40, np.uint8).sum())
        if mode == "wrapped_memory":
            import numpy as np

            try:
                np.ones(1 << 40, np.uint8)
            except MemoryError:
                raise ModelFileError("needs more memory than is available") from None
        if mode == "hang":
            while True:  # until the case's alarm (a real-time timer) ends it
                time.sleep(0.01)
        if mode == "segfault":
            import ctypes

            ctypes.string_at(0)
        return "ok"


TARGETS["selftest"] = SelfTestTarget
TARGETS["native"] = __import__("native_targets").NativeTarget  # every native kernel entry (issue 42)
TARGETS["cache"] = __import__("cache_targets").CacheTarget  # races and damage in the cache folder (issue 42)
TARGETS["mutated_files"] = __import__("file_change_targets").MutatedFilesTarget  # files changed under a loaded model (issue 42)
