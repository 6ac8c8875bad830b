"""Draw a graph as a self-contained SVG or HTML page (no graphviz needed).

Layout: nodes in layers by longest path from the inputs, ordered within a layer by the mean
position of their producers (one barycentre sweep). Fused groups (``node.meta["fusion_group"]``,
else a node's op domain) get a fill colour; streams (a compiled model's stream assignment) get
a border colour and an ``s<N>`` badge. Hovering a node shows its attributes and output types.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ge_core.ir.graph import Graph, Node, Value

_FILL = ["#fde2b8", "#cde8c5", "#cfe0f7", "#f4cde0", "#e3d5f5", "#d6f0ef", "#f7e7a8", "#e9d3c4"]
_STROKE = ["#444444", "#d1495b", "#00798c", "#edae49", "#66a182", "#8d5a97", "#2e4057", "#b5651d"]
_W_CHAR, _H, _HGAP, _VGAP, _PAD = 7.2, 38, 22, 46, 24


def group_of(node: Node) -> str | None:
    """The fused group a node belongs to: ``meta["fusion_group"]``, else its non-default domain."""
    g = node.meta.get("fusion_group")
    if g is not None:
        return str(g)
    return node.domain if node.domain not in ("", "ai.onnx") else None


def layout(graph: Graph) -> tuple[dict[Any, tuple[float, float, float]], float, float]:
    """Positions ``{node or value: (x, y, width)}`` and the canvas size."""
    nodes = graph.node_list()
    level: dict[Any, int] = {}
    for v in graph.inputs:
        level[v] = 0
    for n in nodes:
        lv = 0
        for inp in n.inputs:
            if inp is None:
                continue
            src = inp.producer if inp.producer is not None else (inp if inp in level else None)
            if src is not None and src in level:
                lv = max(lv, level[src] + 1)
        level[n] = max(lv, 1)
    outs = list(graph.outputs)
    out_src = {v.name: _src(v) for v in outs}
    for v in outs:
        p = v.producer
        level[("out", v.name)] = (level[p] + 1) if p is not None and p in level else 1
    layers: dict[int, list[Any]] = {}
    for item, lv in level.items():
        layers.setdefault(lv, []).append(item)
    pos: dict[Any, tuple[float, float, float]] = {}
    order_x: dict[Any, float] = {}
    widths: dict[Any, float] = {}
    for item in level:
        widths[item] = max(70.0, _W_CHAR * len(_label(item)) + 18)
    max_w = 0.0
    for lv in sorted(layers):
        items = layers[lv]

        def bary(it: Any) -> float:
            srcs = [_src(v) for v in _inputs_of(it)] if not isinstance(it, tuple) else [out_src.get(it[1])]
            xs = [order_x[s] for s in srcs if s is not None and s in order_x]
            return sum(xs) / len(xs) if xs else order_x.get(it, 0.0)

        items.sort(key=bary)
        x = float(_PAD)
        for it in items:
            w = widths[it]
            pos[it] = (x, _PAD + lv * (_H + _VGAP), w)
            order_x[it] = x + w / 2
            x += w + _HGAP
        max_w = max(max_w, x)
    height = _PAD * 2 + (max(layers) + 1) * (_H + _VGAP) if layers else 100
    return pos, max(max_w + _PAD, 200.0), float(height)


def _src(v: Value | None) -> Any:
    if v is None:
        return None
    return v.producer if v.producer is not None else v


def _inputs_of(item: Any) -> Sequence[Value | None]:
    if isinstance(item, Node):
        return [v for v in item.inputs if v is not None and not v.is_constant]
    return []


def _label(item: Any) -> str:
    if isinstance(item, Node):
        return item.qualified_op
    if isinstance(item, tuple):
        return f"⇥ {item[1]}"
    return f"{item.name}"


def render_svg(graph: Graph, *, streams: Sequence[int] | None = None, title: str | None = None) -> str:
    """The graph as an SVG document. ``streams``: one stream id per node in graph order."""
    pos, width, height = layout(graph)
    nodes = graph.node_list()
    stream_of = {n: streams[i] for i, n in enumerate(nodes)} if streams and len(streams) == len(nodes) else {}
    groups: dict[str, int] = {}
    for n in nodes:
        g = group_of(n)
        if g is not None and g not in groups:
            groups[g] = len(groups)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" "
        "orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#777\"/></marker></defs>",
        f"<title>{html.escape(title or graph.name)}</title>",
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    # edges first, so boxes sit on top
    for item, (x, y, w) in pos.items():
        targets: list[Any] = []
        if isinstance(item, Node):
            targets = [_src(v) for v in item.inputs if v is not None and not v.is_constant]
        elif isinstance(item, tuple):
            v = next((o for o in graph.outputs if o.name == item[1]), None)
            targets = [_src(v)] if v is not None else []
        for s in targets:
            if s is None or s not in pos:
                continue
            sx, sy, sw = pos[s]
            x1, y1, x2, y2 = sx + sw / 2, sy + _H, x + w / 2, y
            my = (y1 + y2) / 2
            out.append(f'<path d="M {x1:.1f} {y1:.1f} C {x1:.1f} {my:.1f}, {x2:.1f} {my:.1f}, {x2:.1f} {y2 - 2:.1f}" '
                       'fill="none" stroke="#999" stroke-width="1.2" marker-end="url(#arrow)"/>')
    for item, (x, y, w) in pos.items():
        label = html.escape(_label(item))
        if isinstance(item, Node):
            g = group_of(item)
            fill = _FILL[groups[g] % len(_FILL)] if g is not None else "#f2f2f2"
            s = stream_of.get(item)
            stroke = _STROKE[s % len(_STROKE)] if s is not None else "#444444"
            tip = _tooltip(item, g, s)
            cls = "node" + (" fused" if g is not None else "")
            out.append(f'<g class="{cls}" data-name="{html.escape(item.name)}"><title>{tip}</title>'
                       f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_H}" rx="6" fill="{fill}" '
                       f'stroke="{stroke}" stroke-width="{2.2 if s else 1.2}"/>'
                       f'<text x="{x + w / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" font-weight="bold">{label}</text>'
                       f'<text x="{x + w / 2:.1f}" y="{y + 30:.1f}" text-anchor="middle" fill="#555" font-size="10">'
                       f'{html.escape(item.name[:40])}</text>')
            if s is not None:
                out.append(f'<text x="{x + w - 4:.1f}" y="{y + 11:.1f}" text-anchor="end" font-size="9" '
                           f'fill="{stroke}">s{s}</text>')
            out.append("</g>")
        else:
            fill = "#ffffff" if isinstance(item, tuple) else "#eef6ff"
            tip = html.escape(f"{_label(item)}: {item.type}" if isinstance(item, Value) else _label(item))
            out.append(f'<g class="io"><title>{tip}</title><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
                       f'height="{_H}" rx="19" fill="{fill}" stroke="#4a6fa5" stroke-dasharray="4 2"/>'
                       f'<text x="{x + w / 2:.1f}" y="{y + 23:.1f}" text-anchor="middle">{label}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def _tooltip(n: Node, group: str | None, stream: int | None) -> str:
    lines = [f"{n.name}: {n.qualified_op}"]
    lines += [f"out {v.name}: {v.type}" for v in n.outputs]
    lines += [f"{k} = {_short(a)}" for k, a in sorted(n.attrs.items())]
    consts = [v.name for v in n.inputs if v is not None and v.is_constant]
    if consts:
        lines.append("constants: " + ", ".join(consts))
    if group is not None:
        lines.append(f"fused group: {group}")
    if stream is not None:
        lines.append(f"stream: {stream}")
    return html.escape("\n".join(lines))


def _short(a: Any) -> str:
    from ge_core.ir.printer import format_attr

    s = format_attr(a)
    return s if len(s) < 80 else s[:77] + "..."


def render_html(graph: Graph, *, streams: Sequence[int] | None = None, title: str | None = None,
                report: dict[str, Any] | None = None) -> str:
    """An HTML page with the SVG, a legend of fused groups and streams, and the report summary."""
    svg = render_svg(graph, streams=streams, title=title)
    nodes = graph.node_list()
    groups: dict[str, int] = {}
    for n in nodes:
        g = group_of(n)
        if g is not None:
            groups[g] = groups.get(g, 0) + 1
    legend = []
    for i, (g, count) in enumerate(groups.items()):
        legend.append(f'<span class="chip" style="background:{_FILL[i % len(_FILL)]}">{html.escape(g)} ({count})</span>')
    if streams:
        for s in sorted(set(streams)):
            legend.append(f'<span class="chip" style="border:2px solid {_STROKE[s % len(_STROKE)]}">stream {s} '
                          f'({sum(1 for x in streams if x == s)})</span>')
    summary = f"{len(nodes)} nodes, {len(graph.inputs)} inputs, {len(graph.outputs)} outputs"
    if report:
        summary += f"; kernels {report.get('kernels')}, streams {report.get('streams', {}).get('count')}"
    name = html.escape(title or graph.name)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{name}</title>
<style>body{{font-family:Helvetica,Arial,sans-serif;margin:16px}} .chip{{display:inline-block;padding:2px 8px;
margin:2px;border-radius:10px;font-size:12px}} #canvas{{overflow:auto;border:1px solid #ddd}}
.node:hover rect{{stroke-width:3}}</style></head>
<body><h2>{name}</h2><p>{html.escape(summary)}</p><p>{''.join(legend) or 'no fused groups or streams'}</p>
<div id="canvas">{svg}</div></body></html>
"""


def render(graph: Graph, path: str, *, streams: Sequence[int] | None = None, title: str | None = None,
           report: dict[str, Any] | None = None) -> str:
    """Write ``graph`` to ``path`` as SVG or HTML (by suffix); returns the path."""
    from ge_core.errors import OptionError

    low = path.lower()
    if low.endswith(".svg"):
        text = render_svg(graph, streams=streams, title=title)
    elif low.endswith((".html", ".htm")):
        text = render_html(graph, streams=streams, title=title, report=report)
    else:
        raise OptionError(f"cannot tell the drawing format of '{path}'", hint="use a .svg or .html output path")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
