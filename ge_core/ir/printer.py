"""A readable one-line-per-node printer."""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import Graph


def format_attr(a: Any) -> str:
    if isinstance(a, np.ndarray):
        if a.size <= 4:
            return f"tensor<{a.dtype}>{a.tolist()}"
        return f"tensor<{a.dtype}{list(a.shape)}>"
    if isinstance(a, Graph):
        return f"graph<{a.name}>"
    if isinstance(a, float):
        return f"{a:g}"
    if isinstance(a, bytes):
        return repr(a.decode("utf-8", "replace"))
    if isinstance(a, (list, tuple)):
        if len(a) > 8:
            return "[" + ", ".join(format_attr(x) for x in a[:8]) + ", ...]"
        return "[" + ", ".join(format_attr(x) for x in a) + "]"
    return repr(a) if isinstance(a, str) else str(a)


def format_graph(graph: Graph, indent: str = "", max_const_lines: int = 20) -> str:
    lines = []
    ins = ", ".join(f"%{v.name}: {v.type}" for v in graph.inputs)
    lines.append(f"{indent}graph {graph.name}({ins}) {{")
    consts = list(graph.constants.values())
    for v in consts[:max_const_lines]:
        lines.append(f"{indent}  %{v.name}: {v.type} = constant")
    if len(consts) > max_const_lines:
        lines.append(f"{indent}  ... {len(consts) - max_const_lines} more constants")
    for n in graph.nodes:
        outs = ", ".join(f"%{v.name}: {v.type}" for v in n.outputs)
        args = ", ".join("_" if v is None else f"%{v.name}" for v in n.inputs)
        attrs = ""
        plain = {k: a for k, a in n.attrs.items() if not isinstance(a, Graph)}
        if plain:
            attrs = " {" + ", ".join(f"{k}={format_attr(a)}" for k, a in sorted(plain.items())) + "}"
        lines.append(f"{indent}  {outs} = {n.qualified_op}({args}){attrs}  # {n.name}")
        for sub in n.subgraphs():
            lines.append(format_graph(sub, indent + "    "))
    outs = ", ".join(f"%{v.name}" for v in graph.outputs)
    lines.append(f"{indent}  return {outs}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)
