"""Hook implementations of the ge_opset plugin."""

from __future__ import annotations

from ge_core.errors import GEError
from ge_core.hookspecs import RegisterOp, RegisterPass, hookimpl
from ge_core.ir.graph import Graph
from ge_core.memory import DIM_RANGES
from ge_core.ops import infer_graph
from ge_core.options import CompileOptions
from ge_core.passes import Pass, PassContext
from ge_sdk.shapes import apply_input_shapes, apply_out_nodes


class InferShapes(Pass):
    """Apply the ``input_shape`` and ``out_nodes`` options (ATC's ``--input_shape``/``--out_nodes``,
    :mod:`ge_sdk.shapes`: inputs overridden, conflicts with the model's rank or static dims
    refused, every unknown input dim named, outputs cut; in the stage's first round), then infer
    the type and shape of every node output (subgraphs too), in one linear walk."""

    name = "infer_shapes"
    stage = "prepare"
    opt_level = 0
    default_enabled = True
    description = "infer types and shapes of every node output with the op set's inference"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        if ctx.ops is None:
            raise GEError("infer_shapes needs the op registry: give the PassContext the registries")
        applied = ctx.iteration == 0 and apply_options(graph, ctx.options)
        return infer_graph(graph, ctx.ops) > 0 or applied


def apply_options(graph: Graph, options: CompileOptions) -> bool:
    """Apply ``input_shape`` and ``out_nodes`` to ``graph``; True when it changed."""
    before = ([v.type for v in graph.inputs], [v.name for v in graph.outputs], graph.metadata.get(DIM_RANGES))
    apply_input_shapes(graph, options.getoption("input_shape"))
    apply_out_nodes(graph, options.getoption("out_nodes"))
    return before != ([v.type for v in graph.inputs], [v.name for v in graph.outputs], graph.metadata.get(DIM_RANGES))


@hookimpl
def ge_register_ops(register: RegisterOp) -> None:
    """One OpDef per op type of the ONNX domains (default, ai.onnx.ml, training, preview)."""
    from .schemas import ONNX_DOMAINS, build_opdefs

    for opdef in build_opdefs(ONNX_DOMAINS):
        register(opdef)


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    register(InferShapes())
