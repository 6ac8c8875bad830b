"""The ONNX frontend target (``onnx``): mutated ModelProtos through ``ge.load`` and ``ge.compile``."""

from __future__ import annotations

import contextlib
import copy
import os
import random
from typing import Any

from fuzz_common import _light_dir, _weird_float, _weird_int, _weird_str
from fuzz_engine import INTERESTING_INTS, OracleViolation, Target, mutate_bytes
from onnx_seeds import _graphs, _onnx_seeds, _tensors


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
