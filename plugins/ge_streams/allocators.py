"""Stream allocators and event insertion.

* ``single``: every node on stream 0.
* ``dependency`` (GE's rule): a node continues its predecessor's stream when it is that
  stream's only continuation (the predecessor is still the stream's last node); otherwise it
  opens a new stream, up to ``max_streams``, after which it joins the stream idle the longest.
* ``critical_path``: list scheduling on estimated costs: each node goes to the stream where it
  can start earliest (counting an event's cost for cross-stream inputs), so long independent
  branches spread over streams and short ones stay together.

Events are inserted only on cross-stream data edges and pruned with vector clocks, so no event
is implied by another one and stream order. A stream longer than ``max_stream_nodes`` is split.
"""

from __future__ import annotations

from collections.abc import Sequence

from ge_core.ir.graph import Graph, Node
from ge_core.options import CompileOptions
from ge_core.schedule import HappensBefore, StreamAssignment, data_edges

DEFAULT_MAX_STREAMS = 8
EVENT_COST = 2_000.0  # in the same unit as node costs (roughly multiply-adds)


def _option(options: CompileOptions | None, name: str, default):
    """Plugin option ``name`` (``default`` when unset, or when called without options)."""
    return default if options is None else options.getoption(name, default)


def _preds(order: Sequence[Node]) -> list[list[int]]:
    preds: list[list[int]] = [[] for _ in order]
    for src, dst in data_edges(order):
        preds[dst].append(src)
    return preds


def minimal_events(streams: Sequence[int], preds: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Events for every cross-stream data edge not already implied; none of them redundant."""
    k = (max(streams) + 1) if streams else 1
    stream_pos: list[int] = []
    counters = [0] * k
    for s in streams:
        stream_pos.append(counters[s])
        counters[s] += 1
    clock: list[list[int]] = []
    last_on: list[int | None] = [None] * k
    events: list[tuple[int, int]] = []

    def merge(c: list[int], p: int) -> None:
        cp = clock[p]
        for t in range(k):
            if cp[t] > c[t]:
                c[t] = cp[t]
        sp = streams[p]
        if stream_pos[p] > c[sp]:
            c[sp] = stream_pos[p]

    for i, s in enumerate(streams):
        prev = last_on[s]
        base = list(clock[prev]) if prev is not None else [-1] * k
        if prev is not None:
            base[s] = max(base[s], stream_pos[prev])
        c = list(base)
        chosen: list[int] = []
        for p in sorted((p for p in preds[i] if streams[p] != s), reverse=True):
            if c[streams[p]] >= stream_pos[p]:
                continue  # already ordered through stream order or another event
            chosen.append(p)
            merge(c, p)
        # drop any chosen event that the others imply (a later choice can cover an earlier one)
        for p in list(chosen):
            rest = list(base)
            for q in chosen:
                if q != p:
                    merge(rest, q)
            if rest[streams[p]] >= stream_pos[p]:
                chosen.remove(p)
        c = list(base)
        for p in chosen:
            merge(c, p)
            events.append((p, i))
        clock.append(c)
        last_on[s] = i
    return sorted(events)


def split_long_streams(streams: list[int], limit: int) -> list[int]:
    """Give every run of ``limit`` nodes of a stream a stream id of its own."""
    if limit <= 0:
        return streams
    count: dict[int, int] = {}
    remap: dict[tuple[int, int], int] = {}
    next_id = max(streams, default=-1) + 1
    out = []
    for s in streams:
        chunk = count.get(s, 0) // limit
        count[s] = count.get(s, 0) + 1
        if chunk == 0:
            out.append(s)
            continue
        if (s, chunk) not in remap:
            remap[(s, chunk)] = next_id
            next_id += 1
        out.append(remap[(s, chunk)])
    return out


def _finish(graph: Graph, order: list[Node], streams: list[int], preds, options) -> StreamAssignment:
    streams = split_long_streams(streams, int(_option(options, "max_stream_nodes", 0)))
    # renumber streams by first use so ids are dense and stable
    ids: dict[int, int] = {}
    dense = [ids.setdefault(s, len(ids)) for s in streams]
    return StreamAssignment(dense, minimal_events(dense, preds))


def allocate_single(graph: Graph, options=None) -> StreamAssignment:
    """Everything on stream 0: no events."""
    return StreamAssignment.single(len(graph))


def allocate_dependency(graph: Graph, options=None) -> StreamAssignment:
    """GE's dependency-based assignment (see the module docstring)."""
    order = graph.node_list()
    preds = _preds(order)
    max_streams = max(1, int(_option(options, "max_streams", DEFAULT_MAX_STREAMS)))
    streams: list[int] = []
    tail: list[int] = []  # last node index per stream
    for i in range(len(order)):
        chosen = None
        for p in preds[i]:
            sp = streams[p]
            if tail[sp] == p:
                chosen = sp
                break
        if chosen is None:
            if len(tail) < max_streams:
                chosen = len(tail)
                tail.append(-1)
            else:
                # join a predecessor's stream if any, else the stream idle the longest
                chosen = streams[preds[i][-1]] if preds[i] else min(range(len(tail)), key=lambda s: tail[s])
        streams.append(chosen)
        tail[chosen] = i
    return _finish(graph, order, streams, preds, options)


def node_cost(node: Node) -> float:
    """A rough cost (multiply-adds or element count) from static shapes; 1 when unknown."""
    outs = [v.type.numel for v in node.outputs if v.type.numel is not None]
    out_elems = float(sum(outs)) if outs else 1.0
    op = node.op_type
    if op in ("Conv", "ConvTranspose") and len(node.inputs) > 1 and node.inputs[1] is not None:
        w = node.inputs[1].type
        if w.is_static and w.shape and len(w.shape) > 2:
            k = 1
            for d in w.shape[1:]:
                k *= d
            return out_elems * k
    if op in ("MatMul", "Gemm") and node.inputs and node.inputs[0] is not None:
        a = node.inputs[0].type
        if a.shape and isinstance(a.shape[-1], int):
            return out_elems * a.shape[-1]
    ins = [v.type.numel for v in node.inputs if v is not None and v.type.numel is not None]
    return max([out_elems, *ins]) if ins else out_elems


def allocate_critical_path(graph: Graph, options=None) -> StreamAssignment:
    """Earliest-start list scheduling over estimated costs (see the module docstring)."""
    order = graph.node_list()
    preds = _preds(order)
    max_streams = max(1, int(_option(options, "max_streams", DEFAULT_MAX_STREAMS)))
    cost = [node_cost(n) for n in order]
    finish = [0.0] * len(order)
    avail: list[float] = []
    streams: list[int] = []
    for i in range(len(order)):
        best_s, best_start = -1, float("inf")
        candidates = list(range(len(avail)))
        for s in candidates + ([len(avail)] if len(avail) < max_streams else []):
            ready = avail[s] if s < len(avail) else 0.0
            for p in preds[i]:
                t = finish[p] + (EVENT_COST if streams[p] != s else 0.0)
                if t > ready:
                    ready = t
            # prefer existing streams on ties, and the lowest id
            if ready < best_start - 1e-9:
                best_s, best_start = s, ready
        if best_s == len(avail):
            avail.append(0.0)
        streams.append(best_s)
        finish[i] = best_start + cost[i]
        avail[best_s] = finish[i]
    return _finish(graph, order, streams, preds, options)


def redundant_events(assignment: StreamAssignment) -> list[tuple[int, int]]:
    """Events implied by the others and stream order (a minimal assignment has none)."""
    out = []
    for e in assignment.events:
        others = StreamAssignment(list(assignment.streams), [x for x in assignment.events if x != e])
        if HappensBefore(others).ordered(e[0], e[1], assignment.streams):
            out.append(e)
    return out
