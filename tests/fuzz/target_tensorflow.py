"""The TensorFlow frontend target (``tensorflow``): mutated frozen GraphDefs (.pb)."""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any

from fuzz_common import _weird_int
from fuzz_engine import Target, mutate_bytes
from tf_graphs import TF_NUMERIC, TF_OP_GROUPS, TF_OTHER_OPS, TfGraphMutations, _tf_seeds


class TfTarget(TfGraphMutations, Target):
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
