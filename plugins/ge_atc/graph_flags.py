"""Graph passes behind ATC's ``--output_type`` and ``--oo_dead_code_elimination``.

``--output_type``: ``FP16`` (every output) or ``"node:index:FP16;node2:0:FP32"`` (per output, the
output ``index`` of node ``node``); a Cast at the output gives it that dtype, keeping its name.

``--oo_dead_code_elimination`` is GE's dead-*edge* elimination: a Switch whose predicate is a
constant loses the branch that cannot run. This engine's form of it is an ``If`` whose condition
is a constant: the branch that runs is inlined and the If goes (``dead_branch_elimination``; the
removal of nodes no output needs is the ``dce`` pass).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.errors import OptionError
from ge_core.ir.graph import Graph, Node, Value
from ge_core.ir.types import TensorType
from ge_core.passes import PassContext

#: ATC's output dtype names -> (NumPy dtype, ONNX element type).
OUTPUT_TYPES: dict[str, tuple[Any, int]] = {
    "FP32": (np.float32, 1), "FP16": (np.float16, 10), "INT8": (np.int8, 3), "UINT8": (np.uint8, 2),
    "INT16": (np.int16, 5), "UINT16": (np.uint16, 4), "INT32": (np.int32, 6), "UINT32": (np.uint32, 12),
    "INT64": (np.int64, 7), "UINT64": (np.uint64, 13), "DOUBLE": (np.float64, 11), "FP64": (np.float64, 11),
}


def parse_output_type(value: Any) -> dict[str, str]:
    """``{"*": "FP16"}`` for one dtype, else ``{"node:index": dtype}``."""
    if not isinstance(value, str) or not value.strip():
        raise OptionError(f"output_type must be a dtype or node:index:dtype;..., not {value!r:.60}")
    s = value.strip()
    if ":" not in s:
        t = s.upper()
        if t not in OUTPUT_TYPES:
            raise OptionError(f"output_type '{s}' is not one of {', '.join(OUTPUT_TYPES)}")
        return {"*": t}
    out = {}
    for part in (p.strip() for p in s.split(";")):
        if not part:
            continue
        node, sep, rest = part.rpartition(":")
        name, sep2, idx = node.rpartition(":")
        if not sep or not sep2 or not name or not idx.isdigit() or rest.upper() not in OUTPUT_TYPES:
            raise OptionError(f"output_type entry '{part}' must be node:index:dtype with dtype one of "
                              f"{', '.join(OUTPUT_TYPES)}", hint='e.g. --output_type="prob:0:FP16"')
        out[f"{name}:{int(idx)}"] = rest.upper()
    return out


def read_output_type_option(value: Any) -> dict[str, Any]:
    parse_output_type(value)
    return {}


def output_type_pass(graph: Graph, ctx: PassContext) -> bool:
    """Cast the outputs ``output_type`` names to the dtype it gives them."""
    raw = ctx.options.getoption("output_type", "")
    if not raw:
        return False
    spec = parse_output_type(raw)
    targets: list[tuple[Value, str]] = []
    if "*" in spec:
        targets = [(v, spec["*"]) for v in graph.outputs]
    else:
        by_key: dict[str, Value] = {}
        for v in graph.outputs:
            if v.producer is not None:
                by_key[f"{v.producer.name}:{v.index}"] = v
            by_key.setdefault(f"{v.name}:0", v)
        for key, t in spec.items():
            found = by_key.get(key)
            if found is None:
                from ge_core.registry import close_matches

                raise OptionError(f"output_type names '{key}', which is not an output of the model"
                                  f"{close_matches(key, by_key)}", hint=f"outputs: {', '.join(by_key)}")
            targets.append((found, t))
    changed = False
    for v, t in targets:
        dtype, elem = OUTPUT_TYPES[t]
        if v.type.dtype == np.dtype(dtype):
            continue
        cast = graph.add_node("Cast", [v], {"to": elem}, name=f"{v.name}_as_{t.lower()}",
                              output_types=[TensorType(np.dtype(dtype), v.type.shape)], after=v.producer)
        v.replace_all_uses_with(cast.output)
        cast.set_input(0, v)
        changed = True
    return changed


def dead_branch_pass(graph: Graph, ctx: PassContext) -> bool:
    """Inline the branch an If with a constant condition takes (GE's dead-edge elimination)."""
    if not ctx.options.getoption("dead_branch_elimination", True):
        return False
    return _eliminate(graph)


def _eliminate(graph: Graph) -> bool:
    changed = False
    for node in graph.node_list():
        for sub in node.subgraphs():
            changed |= _eliminate(sub)
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        cond = node.inputs[0]
        if cond is None or cond.const_value is None or np.asarray(cond.const_value).size != 1:
            continue
        branch = node.attrs.get("then_branch" if bool(np.asarray(cond.const_value).reshape(())) else "else_branch")
        if isinstance(branch, Graph) and _inline(graph, node, branch):
            changed = True
    return changed


def _inline(graph: Graph, node: Node, body: Graph) -> bool:
    """Put ``body``'s nodes in ``graph`` before ``node`` and let ``node``'s readers read them."""
    body_nodes = body.node_list()
    if body.inputs or len(body.outputs) != len(node.outputs) or any(n.subgraphs() for n in body_nodes):
        return False
    inside = set(body_nodes)
    if any(u not in inside for n in body_nodes for o in n.outputs for u in o.users):
        return False  # a value of the branch is read elsewhere (another scope): leave the If as it is
    mapping: dict[Value, Value] = {}
    for c in body.constants.values():
        if c.const_value is not None:
            mapping[c] = graph.add_constant(c.const_value, graph.names.fresh(c.name))
    for bn in body_nodes:
        ins = [None if v is None else mapping.get(v, v) for v in bn.inputs]
        nn = graph.add_node(bn.op_type, ins, dict(bn.attrs), domain=bn.domain, name=bn.name,
                            num_outputs=len(bn.outputs), output_types=[o.type for o in bn.outputs], before=node)
        mapping.update(zip(bn.outputs, nn.outputs))
    results = [mapping.get(v, v) for v in body.outputs]
    body.set_outputs([])
    body.remove_nodes(body_nodes)
    for o, r in zip(node.outputs, results):
        o.replace_all_uses_with(r)
    graph.remove_node(node)
    return True
