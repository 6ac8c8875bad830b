"""The fuzz targets: ONNX frontend, .om loader, pipeline config (TOML), fusion switch JSON.

Each target keeps a handful of small valid seeds and mixes two kinds of mutation:

* byte-level edits of the serialized seed (:func:`fuzz_engine.mutate_bytes`): bit flips,
  interesting varints and integers, deletions, insertions, duplication, truncation, splicing;
* structure-aware edits that keep the outer format valid so the input reaches the deep checks:
  protobuf fields of a ModelProto (dims, data types, raw data, external-data locations, op types,
  attributes, opsets, nesting, functions, huge ConstantOfShape shapes), the JSON model definition
  and weights table of an .om (rewritten with valid checksums), TOML tables and values, JSON
  switch tables.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import struct
import zlib
from typing import Any

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
    strs = helper.make_tensor("labels", TensorProto.STRING, [2], [b"cat", b"dog"])
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
            try:
                for k in range(depth):
                    node = helper.make_node("If", ["cond"], [f"o{k}"], then_branch=inner, else_branch=leaf)
                    inner = helper.make_graph([node], f"lvl{k}", [],
                                              [helper.make_tensor_value_info(f"o{k}", TensorProto.FLOAT, [2])])
            except Exception:  # protobuf's own depth limit (about 33 levels) reached
                pass
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
        import tomllib

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
        opts.check_extra(regs.options)
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
        from ge_core.options import CompileOptions, parse_fusion_switch_file

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
            d = copy.deepcopy(SWITCH_SEEDS[si])
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


TARGETS: dict[str, type[Target]] = {"onnx": OnnxTarget, "om": OmTarget, "config": ConfigTarget, "switch": SwitchTarget}


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
            return {}["missing"]  # KeyError
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
            while True:
                pass
        if mode == "segfault":
            import ctypes

            ctypes.string_at(0)
        return "ok"


TARGETS["selftest"] = SelfTestTarget
