"""The ``input_shape`` and ``out_nodes`` options (ATC's ``--input_shape``, ``--out_nodes``) applied
to a graph: the one rank/dimension conflict rule (:func:`check_dims`), the input override
(:func:`apply_input_shapes`) and the output cut (:func:`apply_out_nodes`).

The op set's prepare-stage pass ``input_shapes`` (plugin ``ge_opset``) applies both to every
compiled graph; a frontend that needs shapes while it converts (TensorFlow traces its graph with
them) checks them with :func:`check_dims` too.
"""

from __future__ import annotations

from typing import Any

from ge_core.errors import GEError, OptionError
from ge_core.ir.graph import Graph, Value
from ge_core.memory import DIM_RANGES, dim_ranges
from ge_core.options import DimRange
from ge_core.registry import close_matches


def check_dims(old: tuple | None, new: tuple, name: str) -> None:
    """OptionError when ``--input_shape``'s dims ``new`` for input ``name`` change the rank or a
    static dim of the model's ``old`` dims (None: rank unknown; a range on a static dim too)."""
    if old is not None and len(old) != len(new):
        raise OptionError(f"input_shape gives '{name}' rank {len(new)}, the model's input has rank {len(old)}",
                          hint=f"give {len(old)} dims for '{name}'")
    for i, (d, k) in enumerate(zip(new, old if old is not None else (None,) * len(new))):
        if isinstance(k, int) and d is not None and (isinstance(d, DimRange) or (isinstance(d, int) and d != k)):
            raise OptionError(f"input_shape gives '{name}' dim {i} = {d}, the model fixes it to {k}",
                              hint=f"give {k} (a static dim of the model cannot change)")


def frontend_dims(old: tuple | None, new: tuple, name: str = "") -> tuple:
    """The dims a frontend gives input ``name`` from ``--input_shape`` ``new`` (checked by
    :func:`check_dims`): static sizes and names as given; an unknown dim or a range keeps the
    model's dim (:func:`apply_input_shapes` makes it a symbol with its range)."""
    check_dims(old, new, name)
    keep = old if old is not None else (None,) * len(new)
    return tuple(k if d is None or isinstance(d, DimRange) else d for d, k in zip(new, keep))


def apply_input_shapes(g: Graph, shapes: dict[str, tuple] | None) -> None:
    """Override input shapes (ATC ``--input_shape``) and name every unknown input dim.

    Unknown names, ranks and static dims that conflict with the model raise OptionError. A range
    (``lo~hi``) or an unknown dim (``-1``) makes the dim a symbol: the model's name for it when it
    has one, else ``<input>_<axis>``; the ranges go to ``graph.metadata``
    (:func:`ge_core.memory.dim_ranges`)."""
    by_name = {v.name: v for v in g.inputs}
    try:  # a compiled graph compiled again keeps its ranges (a malformed table is not ours: dropped)
        ranges: dict[str, list] = {k: list(r) for k, r in dim_ranges(g).items()}
    except GEError:
        ranges = {}
    for name, dims in (shapes or {}).items():
        v = by_name.get(name)
        if v is None:
            raise OptionError(
                f"input_shape names '{name}', which is not an input of the model{close_matches(name, by_name)}",
                hint=f"inputs: {', '.join(by_name)}",
            )
        check_dims(v.type.shape, tuple(dims), name)
        new = []
        for i, d in enumerate(dims):
            old = v.type.shape[i] if v.type.shape is not None else None
            if isinstance(d, DimRange) or d is None:
                sym = old if isinstance(old, str) else None
                if sym is None:
                    sym = _fresh_symbol(g, name, i)
                if isinstance(d, DimRange):
                    if sym in ranges and tuple(ranges[sym]) != (d.lo, d.hi):
                        raise OptionError(f"input_shape gives dim '{sym}' two ranges, {ranges[sym][0]}~"
                                          f"{ranges[sym][1] or -1} and {d}", hint="give a shared dim one range")
                    ranges[sym] = [d.lo, d.hi]
                new.append(sym)
            else:
                new.append(d)
        if tuple(new) != v.type.shape:
            v.type = v.type.with_shape(tuple(new))
            _forget_shapes_from(v)  # values derived from this input get inferred again
    for v in g.inputs:  # every other unknown dim of an input is a symbol of its own
        if v.type.shape is not None and None in v.type.shape:
            v.type = v.type.with_shape(tuple(_fresh_symbol(g, v.name, i) if d is None else d
                                             for i, d in enumerate(v.type.shape)))
            _forget_shapes_from(v)
    g.metadata.pop(DIM_RANGES, None)
    if ranges:
        g.metadata[DIM_RANGES] = ranges


def _fresh_symbol(g: Graph, name: str, axis: int) -> str:
    taken = {d for v in g.inputs for d in (v.type.shape or ()) if isinstance(d, str)}
    base = f"{name[:64]}_{axis}"
    sym, k = base, 1
    while sym in taken:
        k += 1
        sym = f"{base}_{k}"
    return sym


def _forget_shapes_from(v: Value) -> None:
    stack = [v]
    seen = set()
    while stack:
        x = stack.pop()
        for node in x.users:
            if node in seen:
                continue
            seen.add(node)
            for o in node.outputs:
                if o.type.shape is not None:
                    o.type = o.type.with_shape(None)
                stack.append(o)


def apply_out_nodes(g: Graph, out_nodes: list[str] | None) -> bool:
    """Select outputs by value name or ATC's ``node_name:index`` (True when they changed)."""
    if not out_nodes or [v.name for v in g.outputs] == list(out_nodes):
        return False
    values = g.value_map()
    nodes = {n.name: n for n in g.nodes}
    chosen: list[Any] = []
    for spec in out_nodes:
        if spec in values:
            chosen.append(values[spec])
            continue
        name, sep, idx = spec.rpartition(":")
        if sep and name in nodes and idx.isdigit() and int(idx) < len(nodes[name].outputs):
            chosen.append(nodes[name].outputs[int(idx)])
            continue
        raise OptionError(
            f"out_nodes names '{spec}', which is no tensor or node:index of the model"
            f"{close_matches(spec, list(values) + [f'{n}:0' for n in nodes])}"
        )
    g.set_outputs(chosen)
    return True
