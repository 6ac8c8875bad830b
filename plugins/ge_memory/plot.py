"""A picture of a memory plan: each tensor a rectangle of lifetime (x) by arena offset (y).

``ge memory-plot MODEL.om FILE.png`` (this plugin's command, which ``ge inspect MODEL.om
--memory-plot FILE.png`` runs) draws the plan stored in an .om; from Python, :func:`plot_plan`
draws any graph's plan. Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import os
from typing import Any

from ge_core.errors import GEError
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan, SymbolicPlan, build_problem


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise GEError("drawing a memory plan needs matplotlib", hint="pip install matplotlib") from None
    return plt


def plan_rectangles(graph: Graph, plan: MemoryPlan, binding: dict[str, int] | None = None) -> list[tuple[str, int, int, int, int]]:
    """``(value, first step, last step, offset, bytes)`` for every value the plan places (sizes
    at ``binding`` for a graph with symbolic dims)."""
    order = graph.node_list()
    problem = build_problem(graph, order)  # one buffer per value: its own lifetime
    if binding is not None and problem.symbolic:
        problem = problem.bind(binding)
    rects = []
    for b in problem.buffers:
        off = plan.offsets.get(b.name)
        if off is not None:
            rects.append((b.name, b.start, b.end, int(off), b.size))
    return rects


def plot_plan(graph: Graph, plan: MemoryPlan, path: str | os.PathLike, *, title: str | None = None,
              binding: dict[str, int] | None = None, inputs: Any = None, flag: str | None = None) -> str:
    """Draw ``plan`` for ``graph`` (in its schedule order) to an image file; returns the path.
    The file is written through a temporary file beside it; with ``inputs``
    (:class:`ge_core.writes.InputFiles`) a path that is one of them is refused."""
    image_format(path)  # an unknown extension says so before anything is drawn
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    rects = plan_rectangles(graph, plan, binding)
    mib = 1 << 20
    fig, ax = plt.subplots(figsize=(12, 6), dpi=120)
    cmap = plt.get_cmap("tab20")
    for k, (_, s, e, off, size) in enumerate(rects):
        ax.add_patch(Rectangle((s, off / mib), e - s + 1, max(size, 1) / mib, facecolor=cmap(k % 20),
                               edgecolor="black", linewidth=0.2, alpha=0.75))
    steps = max((e for _, _, e, _, _ in rects), default=0) + 1
    arena = plan.arena_bytes / mib
    ax.axhline(arena, color="red", linewidth=1, linestyle="--")
    ax.set_xlim(0, max(steps, 1))
    ax.set_ylim(0, max(arena * 1.05, 1e-3))
    ax.set_xlabel("schedule step (lifetime)")
    ax.set_ylabel("arena offset (MiB)")
    ax.set_title(title or f"{graph.name}: {len(rects)} tensors in {plan.arena_bytes:,} bytes ({plan.planner})")
    fig.tight_layout()
    path = os.fspath(path)
    fmt = image_format(path)
    try:
        from ge_core.writes import write_atomic

        write_atomic(path, lambda f: fig.savefig(f, format=fmt), "the memory plot", inputs=inputs, flag=flag)
    except (ValueError, RuntimeError) as e:  # matplotlib's own complaint about the file or format
        raise GEError(f"cannot write the memory plot '{path}': {e}") from None
    finally:
        plt.close(fig)
    return path


def image_format(path: str | os.PathLike) -> str:
    """The image format matplotlib writes ``path`` in (from its extension, png without one); a
    GEError listing the supported formats for an extension matplotlib cannot write."""
    ext = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if not ext:
        return "png"
    _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if ext not in formats:
        raise GEError(f"cannot draw the memory plot '{os.fspath(path)}': '.{ext}' is not an image format matplotlib "
                      f"writes", hint=f"use one of: {', '.join('.' + f for f in formats)}")
    return ext


def plot_om(om_path: str | os.PathLike, out: str | os.PathLike, *, flag: str = "the memory plot") -> str:
    """Draw the memory plan stored in an .om file (never over the .om or its weight files)."""
    from ge_core import load_om
    from ge_core.writes import InputFiles, check_target

    inputs = InputFiles(om_path)
    inputs.check(out, flag)
    image_format(out)
    check_target(out, "the memory plot")
    model = load_om(om_path)
    plan = model.memory_plan
    if plan is None:
        raise GEError(f"'{os.fspath(om_path)}' has no memory plan to draw", hint="compile it with a memory planner plugin")
    name = os.path.basename(os.fspath(om_path))
    if isinstance(plan, SymbolicPlan):  # drawn at its largest reference shapes
        binding = plan.references[0] if plan.references else {}
        at = plan.at(binding)
        shapes = ", ".join(f"{k}={v}" for k, v in sorted(binding.items()))
        return plot_plan(model.graph, at, out, binding=binding, inputs=inputs, flag=flag,
                         title=f"{name} at {shapes}: {at.arena_bytes:,} bytes (symbolic plan, {plan.planner})")
    return plot_plan(model.graph, plan, out, title=f"{name}: {plan.arena_bytes:,} bytes ({plan.planner})",
                     inputs=inputs, flag=flag)


def configure(parser: Any) -> None:
    parser.add_argument("model", help="an .om file")
    parser.add_argument("out", metavar="FILE.png", help="the image to write")


def run(args: Any) -> int:
    path = plot_om(args.model, args.out, flag=getattr(args, "flag", None) or "the memory plot")
    if not getattr(args, "quiet", False):
        print(f"memory plot: {path}")
    return 0
