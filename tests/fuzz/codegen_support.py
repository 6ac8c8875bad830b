"""Models and checks shared by the targets and tests of generated source: seed models with every
kind of compiler-internal node, .om files read and rewritten, the canary a payload running as
code would create, and the base of targets checked against it."""

from __future__ import annotations

import json
import os
import random
from typing import Any

from fuzz_engine import OracleViolation, Target


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
