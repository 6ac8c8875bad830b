"""Hook implementations of the ge_opset plugin."""

from __future__ import annotations

from ge_core.errors import GEError
from ge_core.hookspecs import RegisterOp, RegisterPass, hookimpl
from ge_core.ir.graph import Graph
from ge_core.ops import infer_graph
from ge_core.passes import Pass, PassContext


class InferShapes(Pass):
    """Infer the type and shape of every node output (subgraphs too), in one linear walk."""

    name = "infer_shapes"
    stage = "prepare"
    opt_level = 0
    default_enabled = True
    description = "infer types and shapes of every node output with the op set's inference"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        if ctx.ops is None:
            raise GEError("infer_shapes needs the op registry: give the PassContext the registries")
        return infer_graph(graph, ctx.ops) > 0


@hookimpl
def ge_register_ops(register: RegisterOp) -> None:
    """One OpDef per op type of the ONNX domains (default, ai.onnx.ml, training, preview)."""
    from .schemas import ONNX_DOMAINS, build_opdefs

    for opdef in build_opdefs(ONNX_DOMAINS):
        register(opdef)


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    register(InferShapes())
