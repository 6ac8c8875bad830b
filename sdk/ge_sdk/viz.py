"""Draw a graph as a self-contained SVG or HTML page (no graphviz needed).

What is drawn: the graph's inputs (those without a default), its nodes and its outputs. Constants
and *constant computations* (nodes that read only constants, such as the ``ConstantOfShape``
weights of onnx's light models) are folded into the node that consumes them: a ``+N const`` note
on its box and their names and types in its tooltip, not boxes of their own. Each edge carries
the shape of the tensor it moves (types are inferred first where the graph does not give them).

Layout: a layered (Sugiyama) drawing by grandalf when it is installed (longest-path layers, dummy
vertices that route long edges around the boxes, crossing reduction by barycentre sweeps, and
coordinate assignment), else by a built-in layered layout (layers by longest path, one barycentre
sweep, no edge routing). Weakly connected parts are laid out side by side.

Fused groups (``node.meta["fusion_group"]``, else a node's op domain) get a fill colour; streams
(a compiled model's stream assignment) a border colour and an ``s<N>`` badge. Hovering shows a
node's attributes, output types and folded constants. The HTML page adds zoom (wheel), pan (drag)
and search (by node name or op type).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from importlib import resources
from string import Template
from typing import Any

from ge_core.ir.graph import Graph, Node, Value

_FILL = ["#fde2b8", "#cde8c5", "#cfe0f7", "#f4cde0", "#e3d5f5", "#d6f0ef", "#f7e7a8", "#e9d3c4"]
_STROKE = ["#444444", "#d1495b", "#00798c", "#edae49", "#66a182", "#8d5a97", "#2e4057", "#b5651d"]
_W_CHAR, _H, _HGAP, _VGAP, _PAD = 7.2, 38, 26, 54, 24

#: One drawn thing: a Node, a graph input Value, or ``("out", name)`` for an output marker.
Item = Any


def group_of(node: Node) -> str | None:
    """The fused group a node belongs to: ``meta["fusion_group"]``, else its non-default domain."""
    g = node.meta.get("fusion_group")
    if g is not None:
        return str(g)
    return node.domain if node.domain not in ("", "ai.onnx") else None


def constant_nodes(graph: Graph) -> set[Node]:
    """Nodes whose every input is a constant, a graph input with a default, or an output of such
    a node: what the drawing folds into the consumers (nodes with subgraphs are always drawn)."""
    const: set[Node] = set()
    for n in graph.node_list():
        if n.subgraphs():
            continue
        if all(v is None or v.is_constant or v.default is not None or v.producer in const for v in n.inputs):
            const.add(n)
    return const


class Drawing:
    """The items, edges and folded constants of ``graph``, laid out: ``pos[item] = (x, y, w)``
    (top-left corner and width; every box is ``_H`` high), ``routes[(src, dst)]`` the points an
    edge passes through, ``width`` and ``height`` of the canvas."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.const = constant_nodes(graph)
        nodes = [n for n in graph.node_list() if n not in self.const]
        self.items: list[Item] = [v for v in graph.inputs if v.default is None] + nodes
        marks = {v.name: ("out", v.name) for v in graph.outputs}  # one object per output marker
        self.items += list(marks.values())
        drawn = set(self.items)
        #: (source item, target item, value) for every drawn edge; one per (source, target) pair
        self.edges: list[tuple[Item, Item, Value]] = []
        self.folded: dict[Node, list[str]] = {}
        seen: set[tuple[int, int]] = set()

        def edge(src: Item, dst: Item, v: Value) -> None:
            key = (id(src), id(dst))
            if key not in seen:
                seen.add(key)
                self.edges.append((src, dst, v))

        for n in nodes:
            for v in n.inputs:
                if v is None:
                    continue
                src = _source(v)
                if src in drawn:
                    edge(src, n, v)
                else:
                    how = f" = {v.producer.op_type}(...)" if v.producer is not None else ""
                    self.folded.setdefault(n, []).append(f"{v.name}: {v.type}{how}")
        for v in graph.outputs:
            src = _source(v)
            if src in drawn:
                edge(src, marks[v.name], v)
        # room for the label, the second line and (nodes) a stream badge
        self.widths = {it: max(70.0, _W_CHAR * len(_label(it)) + 18 + (16 if isinstance(it, Node) else 0),
                               6.0 * len(self.subtitle(it)) + 18) for it in self.items}
        self.pos: dict[Item, tuple[float, float, float]] = {}
        self.routes: dict[tuple[int, int], list[tuple[float, float]]] = {}
        self.width = self.height = 0.0
        self.engine = ""
        try:
            import grandalf  # noqa: F401 - a pure-Python Sugiyama layout engine
        except ImportError:
            self._layout_builtin()
        else:
            self._layout_grandalf()

    def subtitle(self, item: Item) -> str:
        """A node box's second line: its name, and how many constants are folded into it."""
        if not isinstance(item, Node):
            return ""
        k = len(self.folded.get(item, ()))
        return item.name[:40] + (f" · +{k} const" if k else "")

    # -- layout ------------------------------------------------------------------------------
    def _layout_grandalf(self) -> None:
        from grandalf.graphs import Edge, Vertex
        from grandalf.graphs import Graph as GGraph
        from grandalf.layouts import SugiyamaLayout

        class Box:
            def __init__(self, w: float) -> None:
                self.w, self.h, self.xy = w, float(_H), (0.0, 0.0)

        class Route:
            def __init__(self) -> None:
                self.points: list[tuple[float, float]] = []

            def setpath(self, pts: list[tuple[float, float]]) -> None:
                self.points = [(float(x), float(y)) for x, y in pts]

        vs = {id(it): Vertex(it) for it in self.items}
        for v in vs.values():
            v.view = Box(self.widths[v.data])
        es = []
        for src, dst, _ in self.edges:
            e = Edge(vs[id(src)], vs[id(dst)])
            e.view = Route()
            es.append(e)
        g = GGraph(list(vs.values()), es)
        rounds = 4 if len(self.items) <= 1000 else 2
        x0 = float(_PAD)
        top = float(_PAD)
        height = 0.0
        for comp in g.C:
            sug = SugiyamaLayout(comp)
            sug.xspace, sug.yspace = _HGAP, _VGAP
            sug.init_all()
            sug.draw(rounds)
            verts = list(comp.sV)
            left = min(v.view.xy[0] - v.view.w / 2 for v in verts)
            right = max(v.view.xy[0] + v.view.w / 2 for v in verts)
            up = min(v.view.xy[1] - v.view.h / 2 for v in verts)
            down = max(v.view.xy[1] + v.view.h / 2 for v in verts)
            dx, dy = x0 - left, top - up
            for v in verts:
                cx, cy = v.view.xy
                self.pos[v.data] = (cx - v.view.w / 2 + dx, cy - _H / 2 + dy, v.view.w)
            for e in comp.sE:
                pts = [(x + dx, y + dy) for x, y in e.view.points]
                self.routes[(id(e.v[0].data), id(e.v[1].data))] = pts
            x0 += right - left + 3 * _HGAP
            height = max(height, down - up)
        self.width = max(x0 - 3 * _HGAP + _PAD, 200.0)
        self.height = max(height + 2 * _PAD, 100.0)
        self.engine = "grandalf (Sugiyama)"

    def _layout_builtin(self) -> None:
        preds: dict[int, list[Item]] = {}
        for src, dst, _ in self.edges:
            preds.setdefault(id(dst), []).append(src)
        level: dict[int, int] = {}
        for it in self.items:  # items are in topological order
            level[id(it)] = max((level[id(p)] + 1 for p in preds.get(id(it), [])), default=0)
        layers: dict[int, list[Item]] = {}
        for it in self.items:
            layers.setdefault(level[id(it)], []).append(it)
        centre: dict[int, float] = {}
        max_w = 0.0
        for lv in sorted(layers):
            row = layers[lv]

            def bary(it: Item) -> float:
                xs = [centre[id(p)] for p in preds.get(id(it), []) if id(p) in centre]
                return sum(xs) / len(xs) if xs else 0.0

            row.sort(key=bary)
            x = float(_PAD)
            for it in row:
                w = self.widths[it]
                self.pos[it] = (x, _PAD + lv * (_H + _VGAP), w)
                centre[id(it)] = x + w / 2
                x += w + _HGAP
            max_w = max(max_w, x)
        self.width = max(max_w + _PAD, 200.0)
        self.height = float(_PAD * 2 + (max(layers) + 1) * (_H + _VGAP)) if layers else 100.0
        self.engine = "built-in layers"


def layout(graph: Graph) -> tuple[dict[Any, tuple[float, float, float]], float, float]:
    """Positions ``{node, input value or ("out", name): (x, y, width)}`` and the canvas size."""
    d = Drawing(graph)
    return d.pos, d.width, d.height


def _source(v: Value) -> Any:
    return v.producer if v.producer is not None else v


def _label(item: Any) -> str:
    if isinstance(item, Node):
        return item.qualified_op
    if isinstance(item, tuple):
        return f"⇥ {item[1]}"
    return f"{item.name}"


def shape_text(v: Value) -> str:
    """``1×64×56×56`` (symbolic dims by name), ``?`` for an unknown rank, ``scalar`` for rank 0."""
    shape = v.type.shape
    if shape is None:
        return "?"
    if len(shape) == 0:
        return "scalar"
    return "×".join(str(d) for d in shape)


def with_types(graph: Graph) -> Graph:
    """``graph``, or a copy with types inferred when some node output has no shape (a model as
    loaded, before the compiler's prepare stage); inference that fails leaves what it could."""
    if all(o.type.shape is not None for n in graph.nodes for o in n.outputs):
        return graph
    from ge_core.errors import GEError
    from ge_core.plugins import get_host

    g = graph.copy()
    ops = get_host().registries.ops
    for node in g.nodes:  # node by node, so one that cannot be inferred does not stop the rest
        try:
            ops.infer_node(node, g.opset_imports)
        except GEError:
            continue
    return g


def render_svg(graph: Graph, *, streams: Sequence[int] | None = None, title: str | None = None) -> str:
    """The graph as an SVG document. ``streams``: one stream id per node in graph order."""
    nodes = graph.node_list()
    stream_of = {n: streams[i] for i, n in enumerate(nodes)} if streams and len(streams) == len(nodes) else {}
    d = Drawing(with_types(graph))
    if d.graph is not graph:  # types were inferred on a copy: map streams onto its nodes
        stream_of = {c: stream_of[o] for o, c in zip(nodes, d.graph.node_list()) if o in stream_of}
    groups: dict[str, int] = {}
    for n in d.graph.node_list():
        g = group_of(n)
        if g is not None and g not in groups:
            groups[g] = len(groups)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{d.width:.0f}" height="{d.height:.0f}" '
        f'viewBox="0 0 {d.width:.0f} {d.height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="12" '
        f'data-layout="{html.escape(d.engine)}">',
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" "
        "orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#777\"/></marker></defs>",
        f"<title>{html.escape(title or graph.name)}</title>",
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for src, dst, v in d.edges:  # edges first, so boxes sit on top
        if src not in d.pos or dst not in d.pos:
            continue
        sx, sy, sw = d.pos[src]
        tx, ty, tw = d.pos[dst]
        x1, y1, x2, y2 = sx + sw / 2, sy + _H, tx + tw / 2, ty
        mids = d.routes.get((id(src), id(dst)), [])[1:-1]
        pts = [(x1, y1), *mids, (x2, y2 - 2)]
        path = f"M {pts[0][0]:.1f} {pts[0][1]:.1f}"
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            my = (ay + by) / 2
            path += f" C {ax:.1f} {my:.1f}, {bx:.1f} {my:.1f}, {bx:.1f} {by:.1f}"
        out.append(f'<path class="edge" d="{path}" fill="none" stroke="#999" stroke-width="1.2" '
                   'marker-end="url(#arrow)"/>')
        lx, ly = pts[-2] if len(pts) > 2 else ((x1 + x2) / 2, (y1 + y2) / 2)
        if len(pts) == 2:
            lx, ly = x2, y2 - 8
        out.append(f'<text class="shape" x="{lx + 4:.1f}" y="{ly:.1f}" font-size="9" fill="#777">'
                   f'{html.escape(shape_text(v))}</text>')
    for item, (x, y, w) in d.pos.items():
        label = html.escape(_label(item))
        if isinstance(item, Node):
            g = group_of(item)
            fill = _FILL[groups[g] % len(_FILL)] if g is not None else "#f2f2f2"
            s = stream_of.get(item)
            stroke = _STROKE[s % len(_STROKE)] if s is not None else "#444444"
            folded = d.folded.get(item, [])
            tip = _tooltip(item, g, s, folded)
            cls = "node" + (" fused" if g is not None else "")
            out.append(f'<g class="{cls}" data-name="{html.escape(item.name)}" data-op="{html.escape(item.qualified_op)}">'
                       f'<title>{tip}</title>'
                       f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_H}" rx="6" fill="{fill}" '
                       f'stroke="{stroke}" stroke-width="{2.2 if s else 1.2}"/>'
                       f'<text x="{x + w / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" font-weight="bold">{label}</text>'
                       f'<text x="{x + w / 2:.1f}" y="{y + 30:.1f}" text-anchor="middle" fill="#555" font-size="10">'
                       f'{html.escape(d.subtitle(item))}</text>')
            if s is not None:
                out.append(f'<text x="{x + w - 4:.1f}" y="{y + 11:.1f}" text-anchor="end" font-size="9" '
                           f'fill="{stroke}">s{s}</text>')
            out.append("</g>")
        else:
            fill = "#ffffff" if isinstance(item, tuple) else "#eef6ff"
            tip = html.escape(f"{_label(item)}: {item.type}" if isinstance(item, Value) else _label(item))
            name = item[1] if isinstance(item, tuple) else item.name
            out.append(f'<g class="io" data-name="{html.escape(name)}"><title>{tip}</title><rect x="{x:.1f}" '
                       f'y="{y:.1f}" width="{w:.1f}" height="{_H}" rx="19" fill="{fill}" stroke="#4a6fa5" '
                       f'stroke-dasharray="4 2"/><text x="{x + w / 2:.1f}" y="{y + 23:.1f}" '
                       f'text-anchor="middle">{label}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def _tooltip(n: Node, group: str | None, stream: int | None, folded: Sequence[str] = ()) -> str:
    lines = [f"{n.name}: {n.qualified_op}"]
    lines += [f"out {v.name}: {v.type}" for v in n.outputs]
    lines += [f"{k} = {_short(a)}" for k, a in sorted(n.attrs.items())]
    if folded:
        lines.append("constants:")
        lines += [f"  {c}" for c in folded[:20]]
        if len(folded) > 20:
            lines.append(f"  and {len(folded) - 20} more")
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
    """An HTML page with the SVG (zoom with the wheel, pan by dragging, search by name or op), a
    legend of fused groups and streams, and the report summary."""
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
    folded = len(constant_nodes(graph))
    summary = f"{len(nodes)} nodes ({folded} constant computations folded into their consumers), " \
              f"{len(graph.inputs)} inputs, {len(graph.outputs)} outputs"
    if report:
        summary += f"; kernels {report.get('kernels')}, streams {report.get('streams', {}).get('count')}"
    name = html.escape(title or graph.name)
    page = Template(_template("viz.html"))
    return page.substitute(name=name, summary=html.escape(summary), legend="".join(legend) or "no fused groups or streams",
                           svg=svg, script=_template("viz.js"))


def _template(name: str) -> str:
    """The text of ``ge_sdk/templates/<name>`` (package data: the page and its script)."""
    return (resources.files("ge_sdk") / "templates" / name).read_text(encoding="utf-8")


def render(graph: Graph, path: str, *, streams: Sequence[int] | None = None, title: str | None = None,
           report: dict[str, Any] | None = None, inputs: Any = None) -> str:
    """Write ``graph`` to ``path`` as SVG or HTML (by suffix), through a temporary file beside it;
    returns the path. With ``inputs`` (:class:`ge_core.writes.InputFiles`) a path that is one of
    them is refused."""
    from ge_core.errors import OptionError

    low = path.lower()
    if low.endswith(".svg"):
        text = render_svg(graph, streams=streams, title=title)
    elif low.endswith((".html", ".htm")):
        text = render_html(graph, streams=streams, title=title, report=report)
    else:
        raise OptionError(f"cannot tell the drawing format of '{path}'", hint="use a .svg or .html output path")
    from ge_core.writes import write_bytes_atomic

    write_bytes_atomic(path, text, "the drawing", inputs=inputs, flag="-o/--output")
    return path
