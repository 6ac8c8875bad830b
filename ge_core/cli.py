"""The command line: ``ge compile|run|inspect|plugins|passes`` (+ plugin commands such as ``ge atc``).

Errors a user can cause print ``error: <message>`` on stderr and exit with status 2, with no
traceback (``GE_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import __version__
from .errors import GEError, InputError, ModelFileError, OptionError


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _console(stderr: bool = False):
    from rich.console import Console

    # no emoji codes (":x:"), no highlighting: text from a model file prints as it is; into a
    # pipe or file, tables keep their natural width (no 80-column cut) and there are no colours
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=True, emoji=False,
                   width=None if tty else 100_000, no_color=not tty)


def table(title: str, columns: Sequence[str] = (), **kw: Any):
    """A rich table whose cells wrap (fold) on a narrow terminal instead of being cut with '…'."""
    from rich.table import Table

    t = Table(title=title, **kw)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def _plain(x: Any) -> str:
    """``x`` as text that rich prints literally (a model's ``x[/b]`` or ``[red]`` is no markup)."""
    from rich.markup import escape

    return escape(str(x))


def output_file_names(names: Sequence[str]) -> list[str]:
    """A distinct ``.npy`` file name per output, in output order and deterministic: characters
    other than letters, digits and ``._-`` become ``_`` (at most 100 kept); names that would
    clash (also on a case-insensitive file system) get ``_2``, ``_3``, ... after the first."""
    taken: set[str] = set()
    out = []
    for i, name in enumerate(names):
        base = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(name))[:100] or f"output{i}"
        cand, k = base, 1
        while cand.lower() in taken:
            k += 1
            cand = f"{base}_{k}"
        taken.add(cand.lower())
        out.append(cand + ".npy")
    return out


def guard(fn: Callable[[], int]) -> int:
    try:
        return fn() or 0
    except GEError as e:
        print(f"error: {e}", file=sys.stderr)
        if os.environ.get("GE_DEBUG"):
            raise
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug, not the user's fault: say so, briefly
        if os.environ.get("GE_DEBUG"):
            raise
        print(f"internal error: {type(e).__name__}: {e} (this is a bug in ge or a plugin; "
              "rerun with GE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 3


def parse_kv(items: Sequence[str] | None, what: str) -> dict[str, Any]:
    """``name=value`` items (values as JSON where they parse, else strings) as a dict; ``what``
    names the flag in errors."""
    out: dict[str, Any] = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise OptionError(f"{what} '{item}' must look like name=value")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file (never half a file); ModelFileError on failure."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise ModelFileError(f"cannot write '{path}': folder '{d}' does not exist")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ModelFileError(f"cannot write '{path}': {e.strerror}") from None


def _compile_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if getattr(args, "config", None):
        opts["config"] = args.config
    mapping = {
        "framework": "framework", "input_shape": "input_shape", "out_nodes": "out_nodes",
        "soc_version": "soc_version", "fusion_switch_file": "fusion_switch_file", "log": "log",
        "opt_level": "opt_level", "dump_ir": "dump_ir", "memory_planner": "memory_planner",
        "stream_allocator": "stream_allocator", "memory_optimize_level": "memory_optimize_level",
        "threads": "threads",
    }
    for attr, key in mapping.items():
        v = getattr(args, attr, None)
        if v is not None:
            opts[key] = v
    for flag in ("verify_each_pass", "enable_single_stream", "disable_reuse_memory"):
        if getattr(args, flag, False):
            opts[flag] = True
    if getattr(args, "no_constant_folding", False):
        opts["constant_folding"] = False
    opts.update(parse_kv(getattr(args, "option", None), "--option"))
    return opts


def _print_report(report: dict[str, Any], console) -> None:
    mem = report.get("memory", {})
    st = report.get("streams", {})
    mem = mem if isinstance(mem, dict) else {}
    st = st if isinstance(st, dict) else {}

    def n(v: Any) -> str:
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else _plain(v)

    t = table("compile report", show_header=False)
    t.add_column("what", overflow="fold")
    t.add_column("value", overflow="fold")
    t.add_row("nodes before / after", f"{n(report.get('nodes_before'))} / {n(report.get('nodes_after'))}")
    t.add_row("kernels per inference", n(report.get("kernels")))
    t.add_row("streams / events", f"{n(st.get('count'))} / {n(st.get('events'))}")
    sym = mem.get("symbolic")
    if isinstance(sym, dict):  # one plan for every shape: the symbols and the arena at the references
        syms = sym.get("symbols")
        syms = syms if isinstance(syms, dict) else {}
        ranges = ", ".join(f"{_plain(k)} {_plain(r[0])}~{'-1' if r[1] is None else _plain(r[1])}"
                           for k, r in syms.items() if isinstance(r, list) and len(r) == 2)
        at = [r for r in sym.get("at_references", []) if isinstance(r, dict) and isinstance(r.get("binding"), dict)]
        shown = "; ".join(f"{n(r.get('arena_bytes'))} at " + ",".join(f"{_plain(k)}={_plain(v)}" for k, v in r["binding"].items())
                          for r in at[:3])
        t.add_row("arena bytes", f"symbolic plan over {ranges} ({n(sym.get('planned_buffers'))} buffers, "
                  f"{n(sym.get('orders'))} orders, {n(mem.get('dynamic_buffers', 0))} outside): {shown}")
    else:
        t.add_row("arena bytes", f"{n(mem.get('arena_bytes', 0))} (lower bound {n(mem.get('lower_bound_bytes', 0))}, "
                  f"no reuse {n(mem.get('no_reuse_bytes', 0))})")
    t.add_row("weights bytes", n(mem.get("weights_bytes", 0)))
    t.add_row("compile seconds", _plain(report.get("compile_seconds")))
    ops = report.get("op_counts", {})
    ops = {str(k): v for k, v in ops.items() if isinstance(v, int)} if isinstance(ops, dict) else {}
    t.add_row("ops", ", ".join(f"{_plain(k)}×{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])))
    console.print(t)


# ------------------------------------------------------------------------------------------------
# ge subcommands
# ------------------------------------------------------------------------------------------------
def _add_compile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--framework", help="frontend name or ATC number (5 ONNX, 3 TensorFlow)")
    p.add_argument("--config", help="pipeline config (TOML)")
    p.add_argument("--input-shape", dest="input_shape", help='e.g. "data:1,3,224,224;mask:1,-1"')
    p.add_argument("--out-nodes", dest="out_nodes", help='output tensors or node:index, separated by ";"')
    p.add_argument("--soc-version", dest="soc_version", help="backend (default cpu)")
    p.add_argument("--fusion-switch-file", dest="fusion_switch_file", help="GE fusion switch JSON")
    p.add_argument("-O", "--opt-level", dest="opt_level", help="optimisation level 0..3")
    p.add_argument("--memory-planner", dest="memory_planner",
                   help="memory planner by name (`ge passes` lists them; default auto)")
    p.add_argument("--memory-optimize-level", dest="memory_optimize_level", choices=["off", "normal", "high"],
                   help="how hard to reuse memory: off (no reuse), normal (default) or high")
    p.add_argument("--stream-allocator", dest="stream_allocator",
                   help="stream allocator by name (`ge passes` lists them)")
    p.add_argument("--enable-single-stream", action="store_true", help="schedule everything on one stream")
    p.add_argument("--disable-reuse-memory", action="store_true", help="give every tensor its own bytes (no reuse)")
    p.add_argument("--no-constant-folding", action="store_true", help="do not fold constant subgraphs")
    p.add_argument("--threads", type=int, help="threads per run (default: the CPU count)")
    p.add_argument("--verify-each-pass", action="store_true", help="verify the graph after every pass")
    p.add_argument("--dump-ir", dest="dump_ir", metavar="DIR", help="write the IR after each pass that changed it")
    p.add_argument("--log", choices=["debug", "info", "warning", "error", "null"],
                   help="log level: debug shows every stage and pass (default warning)")
    p.add_argument("--option", action="append", metavar="NAME=VALUE", help="any compile option, also plugin ones")


def compile_with_progress(ge, source, opts: dict[str, Any], quiet: bool = False):
    """Compile, showing the stage and pass on a terminal (not with -q, --log=error/null, or a pipe)."""
    level = str(opts.get("log", "warning")).lower()
    if quiet or level in ("error", "null") or not sys.stderr.isatty():
        return ge.compile(source, opts)
    con = _console(stderr=True)
    with con.status("compiling: loading") as status:
        return ge.compile(source, opts, progress=lambda msg: status.update(f"compiling: {msg}"))


def cmd_compile(args: argparse.Namespace) -> int:
    import ge_core as ge

    out = args.output
    if not out:
        base = os.path.splitext(os.path.basename(os.fspath(args.model).rstrip("/")))[0] or "model"
        out = base + ".om"
    if not out.endswith(".om"):
        out += ".om"
    opts = _compile_options(args)
    model = compile_with_progress(ge, args.model, opts, quiet=args.quiet)
    log_stages(model.report)
    model.save(out)
    if args.report:
        write_json_atomic(args.report, model.report)
    if not args.quiet:
        con = _console()
        _print_report(model.report, con)
        con.print(f"wrote [bold]{_plain(out)}[/bold]")
    return 0


def log_stages(report: dict[str, Any]) -> None:
    """What each stage did, from the compile report, on the ``ge.compile`` logger: each pass at
    debug level (``--log debug``), each stage at info level (``--log info``)."""
    log = logging.getLogger("ge.compile")
    if not log.isEnabledFor(logging.INFO):
        return
    passes = [p for p in report.get("passes", []) if isinstance(p, dict)]
    before = report.get("nodes_before")
    stages: dict[str, list[dict[str, Any]]] = {}
    for p in passes:
        stages.setdefault(str(p.get("stage")), []).append(p)
    for stage, ps in stages.items():
        for i, p in enumerate(ps):
            what = "error: " + str(p["error"]) if p.get("error") else ("changed" if p.get("changed") else "no change")
            log.debug("%s: pass %s (%d of %d): %s, %s nodes after, %.2f ms", stage, p.get("name"), i + 1, len(ps),
                      what, p.get("nodes_after"), 1000 * float(p.get("seconds") or 0))
        changed = [str(p.get("name")) for p in ps if p.get("changed")]
        log.info("%s: %d pass run(s), %.2f ms, %s -> %s nodes; changed by %s", stage, len(ps),
                 1000 * sum(float(p.get("seconds") or 0) for p in ps), before, ps[-1].get("nodes_after"),
                 ", ".join(dict.fromkeys(changed)) or "none")
        before = ps[-1].get("nodes_after")
    st, mem = report.get("streams") or {}, report.get("memory") or {}
    log.info("streams: %s stream(s), %s event(s)", st.get("count"), st.get("events"))
    log.info("memory plan: planner %s, arena %s bytes (lower bound %s, no reuse %s)", mem.get("planner"),
             mem.get("arena_bytes"), mem.get("lower_bound_bytes"), mem.get("no_reuse_bytes"))
    log.info("build: backend %s, %s kernel launch(es) per run%s", report.get("backend"), report.get("kernels"),
             f", modes {report['kernel_modes']}" if report.get("kernel_modes") else "")


def _load_feed(spec: str) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep or not name:
        raise InputError(f"--input '{spec}' must look like name=file.npy")
    from .inputs import read_feed_file  # regular files only, never blocks, no pickle, size checked

    return name, read_feed_file(name, path)


def random_feeds(model, seed: int = 0, shapes: Mapping[str, Sequence[int]] | None = None, *,
                 known: Mapping[str, Any] | None = None, strict: bool = False,
                 option: str = "--input-shape") -> dict[str, np.ndarray]:
    """Random inputs matching the model's input types; an input with a default (an ONNX
    initializer listed as an input) keeps its default, one in ``known`` (fed already) is left out.

    ``shapes`` (``--input-shape``) sizes inputs by name, and a symbolic dim shared by several
    inputs takes the size given (or fed) for one of them. Other symbolic/unknown dims become 1;
    with ``strict`` they are an :class:`InputError` naming the input and its dims (``ge run``).
    """
    from .inputs import random_inputs

    defaults = {v.name: v.default for v in model.graph.inputs if v.default is not None}
    feeds = random_inputs(model.graph, seed, shapes=shapes, known={**defaults, **(known or {})},
                          default_dim=None if strict else 1, option=option)
    return {v.name: feeds[v.name] for v in model.graph.inputs
            if v.default is None and v.name not in (known or {})}


def random_input_shapes(spec: str | None, feeds: Mapping[str, Any]) -> dict[str, tuple]:
    """``--input-shape`` of ``ge run`` / ``ge bench``: the sizes of random inputs by input, parsed
    as compile's ``input_shape`` (OptionError for a bad spec or an input fed from a file)."""
    from .options import parse_input_shape

    shapes = parse_input_shape(spec)
    for name in shapes:
        if name in feeds:
            raise OptionError(f"--input-shape names '{name}', which --input feeds from a file",
                              hint="--input-shape sizes random inputs only: the file's array has its own shape")
    return shapes


def cmd_run(args: argparse.Namespace) -> int:
    import time

    import ge_core as ge

    model = ge.load_om(args.model)
    feeds = dict(_load_feed(s) for s in args.input or [])
    shapes = random_input_shapes(args.input_shape, feeds)
    if args.random or shapes or not feeds and model.input_names:
        rnd = random_feeds(_random_gear(model, args), args.seed, shapes, known=feeds, strict=True)
        for k, v in rnd.items():
            feeds.setdefault(k, v)
    if args.repeat < 1:
        raise OptionError(f"--repeat {args.repeat}: give the number of runs, at least 1")
    t0 = time.perf_counter()
    outs = model.run(feeds)
    dt = time.perf_counter() - t0
    warm: list[float] = []
    for _ in range(args.repeat - 1):
        t1 = time.perf_counter()
        model.run(feeds)
        warm.append(time.perf_counter() - t1)
    files: dict[str, str] = {}
    if args.output_dir:
        files = _save_outputs(outs, args.output_dir)
    if args.dump_tensors:
        dump_tensors(model, feeds, args.dump_tensors)
    timing: dict[str, Any] = {"seconds": dt, "cold_seconds": dt}
    if warm:
        timing.update(warm_runs=len(warm), warm_seconds_median=float(np.median(warm)), warm_seconds_min=min(warm))
    if args.json:
        info = {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in outs.items()}
        for k, f in files.items():
            info[k]["file"] = f
        print(json.dumps({**timing, "outputs": info}))
        return 0
    con = _console()
    for name, arr in outs.items():
        stats = ""
        if arr.dtype.kind in "fiu" and arr.size:
            stats = f" min {arr.min():.6g} max {arr.max():.6g} mean {arr.mean():.6g}"
        saved = f" -> {_plain(files[name])}" if name in files else ""
        con.print(f"{_plain(name)}: {arr.dtype}{list(arr.shape)}{stats}{saved}")
    if warm:
        con.print(f"first run (cold) {dt * 1000:.2f} ms; {len(warm)} warm run(s): median {np.median(warm) * 1000:.3f} ms, "
                  f"min {min(warm) * 1000:.3f} ms (`ge bench` gives percentiles and throughput)")
    else:
        con.print(f"ran in {dt * 1000:.2f} ms (a first, cold run: --repeat N shows the warm time per run)")
    return 0


def _random_gear(model, args: argparse.Namespace):
    """The model whose input types random inputs follow: of a gear model, the gear ``--gear``
    (default 0), said on stderr; a run still takes the gear of the feeds' shapes."""
    gear = getattr(args, "gear", None)
    if not hasattr(model, "gear"):
        if gear is not None:
            raise OptionError(f"--gear {gear}: '{args.model}' is not a gear model",
                              hint="gear models come from atc --dynamic_batch_size, --dynamic_image_size or --dynamic_dims")
        return model
    chosen = model.gear(0 if gear is None else gear)
    i = model.models.index(chosen)
    print(f"note: random inputs of {model.table.gear_text(i)}; the gears are {model.table.describe()}; "
          f"--gear N (0..{len(model.models) - 1}) picks another", file=sys.stderr)
    return chosen


def dump_tensors(model, feeds: dict[str, Any], folder: str) -> str:
    """Run ``model`` with every tensor a node computes as an output (:meth:`CompiledModel.with_outputs`)
    and save each as .npy in ``folder``, with ``index.json``: per tensor in schedule order, the
    node and op that computed it, dtype, shape and file. Returns the index path."""
    exposed = model.with_outputs(None)
    outs = exposed.run(feeds)
    files = _save_outputs(outs, folder)
    made_by = {o.name: n for n in exposed.graph.node_list() for o in n.outputs}
    order = {name: i for i, name in enumerate(made_by)}
    index = []
    for name, arr in sorted(outs.items(), key=lambda kv: order.get(kv[0], -1)):
        n = made_by.get(name)
        index.append({"name": name, "node": n.name if n is not None else None, "op": n.qualified_op if n is not None else None,
                      "dtype": str(getattr(arr, "dtype", "")), "shape": list(np.shape(arr)),
                      "file": os.path.basename(files[name]), "output": name in model.output_names})
    path = os.path.join(folder, "index.json")
    write_json_atomic(path, index)
    return path


def _save_outputs(outs: dict[str, np.ndarray], folder: str) -> dict[str, str]:
    """Save each output as its own .npy in ``folder`` (names from :func:`output_file_names`);
    returns output name -> path written."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"cannot create output folder '{folder}': {e.strerror or e}") from None
    files = {}
    for (name, arr), fname in zip(outs.items(), output_file_names(list(outs))):
        path = os.path.join(folder, fname)
        try:
            np.save(path, arr, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ModelFileError(f"cannot write output '{name}' to '{path}': {getattr(e, 'strerror', None) or e}",
                                 hint="check the folder; outputs that are not arrays cannot be saved as .npy") from None
        files[name] = path
    return files


def cmd_inspect(args: argparse.Namespace) -> int:
    from .om import inspect_om

    if getattr(args, "source", False):
        import ge_core as ge

        exe = ge.load_om(args.model).executable
        src = getattr(exe, "source", None)
        if src is None:
            raise OptionError(f"the executor of '{args.model}' ({type(exe).__name__}) generates no source",
                              hint="compile with the option executor=sink (the default for single-stream schedules)")
        print(src, end="")
        return 0
    info = inspect_om(args.model)
    info["model"]["output_types"] = output_types(args.model, info["model"].get("outputs") or [])
    kc = kernel_cache_state(args.model)
    if kc is not None:
        info["kernel_cache"] = kc
    if getattr(args, "memory_plot", None):  # drawn by the plugin command memory-plot (ge_memory)
        from .plugins import get_host

        draw = get_host().registries.cli_commands.get("memory-plot")
        if draw is None:
            raise OptionError("--memory-plot: no plugin provides the memory-plot command",
                              hint="the ge_memory plugin does: is it disabled (GE_DISABLE_PLUGINS)?")
        draw.run(argparse.Namespace(model=args.model, out=args.memory_plot, quiet=True))
        info["memory_plot"] = os.fspath(args.memory_plot)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    con = _console()
    f = info["file"]
    m = info["model"]
    con.print(f"[bold]{_plain(args.model)}[/bold]  format {_plain(f.get('format_version'))}  "
              f"producer {_plain(m.get('producer'))}")
    ins = ", ".join(f"{i.get('name')} {i.get('dtype')}{i.get('shape')}" for i in (m.get("inputs") or []))
    con.print(f"inputs:  {_plain(ins)}")
    outs = ", ".join(f"{o.get('name')} {o.get('dtype')}{o.get('shape')}" for o in (m.get("output_types") or []))
    con.print(f"outputs: {_plain(outs)}")
    if info.get("gears"):
        _print_gears(info["gears"], con)
    con.print(f"nodes: {m.get('nodes')}  constants: {m.get('constants')}  soc_version: {_plain(m.get('soc_version'))}")
    t = table("partitions", ("kind", "offset", "size", "alignment", "crc32"))
    for p in f.get("partitions", []):
        t.add_row(_plain(p.get("kind")), str(p.get("offset")), f"{p.get('size'):,}", str(p.get("alignment")), str(p.get('crc32')))
    con.print(t)
    if info.get("gears"):  # the model's report holds the largest arena; each gear has its own report
        con.print("compile report of gear 0 (every gear's: --json, gears.list[i].report):")
        _print_report(info["gears"]["list"][0]["report"], con)
    elif info.get("report"):
        _print_report(info["report"], con)
    if kc is not None:
        state = ("all in the kernel cache" if not kc["missing"] else
                 f"{kc['missing']} not in the kernel cache (compiled on the first load, then kept)")
        con.print(f"native kernels: {kc['modules']} module(s), {state}")
    if info.get("memory_plot"):
        con.print(f"memory plot: {_plain(info['memory_plot'])}")
    return 0


def _print_gears(gears: dict[str, Any], con) -> None:
    """The gears of a gear model (``atc --dynamic_batch_size`` ...): one static model each."""
    con.print(f"gears:   {_plain(gears.get('text'))}; a run takes the gear of its feed's shapes")
    t = table("gears", ("gear", "value", "input shapes", "nodes", "kernels", "arena bytes"))
    for g in gears.get("list", []):
        shapes = ", ".join(f"{n}{s}" for n, s in (g.get("shapes") or {}).items())
        t.add_row(str(g.get("index")), _plain(g.get("label")), _plain(shapes), str(g.get("nodes")),
                  str(g.get("kernels")), f"{g.get('arena_bytes') or 0:,}")
    con.print(t)


def kernel_cache_state(path: str) -> dict[str, int] | None:
    """``{"modules", "in_cache", "missing"}``: the native kernel modules the .om at ``path``
    needs and whether this machine's kernel cache holds them (nothing is compiled: the backend
    builds it with ``native_kernels=probe``); None when its backend has no such kernels."""
    import ge_core as ge

    from .plugins import get_host

    if "native_kernels" not in get_host().registries.options:
        return None
    model = ge.load_om(path, native_kernels="probe")
    total: dict[str, int] | None = None
    for m in getattr(model, "models", [model]):  # a gear model: every gear's kernels
        state = getattr(m.executable, "native_kernels", None)
        if not (isinstance(state, dict) and "missing" in state):
            return None
        total = {k: (total or {}).get(k, 0) + int(state.get(k) or 0) for k in ("modules", "in_cache", "missing")}
    return total


def output_types(path: str, names: Sequence[Any]) -> list[dict[str, Any]]:
    """``[{"name", "dtype", "shape"}]`` of the outputs ``names`` of the .om at ``path``, read
    from the stored graph's node outputs (dtype and shape None where the file does not say)."""
    from .om import stored_definition
    from .om_container import read_container

    types: dict[str, dict[str, Any]] = {}
    with read_container(path) as c:
        d = stored_definition(path, c)
    stored = d.get("graph")
    graph: dict[str, Any] = stored if isinstance(stored, dict) else {}
    for v in list(graph.get("inputs") or []) + [o for n in graph.get("nodes") or [] if isinstance(n, dict)
                                                 for o in n.get("outputs") or []]:
        if isinstance(v, dict) and isinstance(v.get("name"), str):
            types[v["name"]] = {"dtype": v.get("dtype"), "shape": v.get("shape")}
    return [{"name": str(n), **types.get(str(n), {"dtype": None, "shape": None})} for n in names]


def cmd_plugins(args: argparse.Namespace) -> int:
    from .plugins import get_host

    host = get_host()
    regs = host.registries  # build registries so hook errors show up
    rows = host.describe()
    counts: dict[str, dict[str, int]] = {}
    for kind in ("ops", "frontends", "passes", "backends", "memory_planners", "stream_allocators", "fusion_patterns", "op_mappers"):
        reg = getattr(regs, kind)
        for key in reg.keys():
            per = counts.setdefault(reg.origin(key) or "?", {})
            per[kind] = per.get(kind, 0) + 1
    for be, reg in regs.kernels.items():
        for key in reg.keys():
            per = counts.setdefault(reg.origin(key) or "?", {})
            per[f"{be}_kernels"] = per.get(f"{be}_kernels", 0) + 1
    for r in rows:
        r["provides"] = counts.get(r["name"], {})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    t = table("ge plugins", ("name", "distribution", "version", "hooks", "provides", "status"))
    for r in rows:
        status = "disabled" if r["disabled"] else ("[red]" + _plain("; ".join(r["errors"])) + "[/red]" if r["errors"] else "ok")
        t.add_row(_plain(r["name"]), _plain(r["distribution"] or "-"), _plain(r["version"] or "-"),
                  _plain(", ".join(h.replace("ge_register_", "") for h in r["hooks"])),
                  _plain(", ".join(f"{k} {v}" for k, v in r["provides"].items())), status)
    _console().print(t)
    return 0


def cmd_passes(args: argparse.Namespace) -> int:
    from .options import CompileOptions
    from .passes import resolve_pipeline
    from .plugins import get_host

    regs = get_host().registries
    opts = CompileOptions.from_any(args.config) if args.config else CompileOptions()
    if args.opt_level is not None:
        opts.update({"opt_level": args.opt_level})
    plans = resolve_pipeline(regs.passes, opts)
    active = {p.name for s in plans for p in s.passes}
    data: dict[str, Any] = {
        "opt_level": opts.opt_level,
        "stages": [
            {
                "stage": s.name,
                "fixed_point": s.fixed_point,
                "passes": [
                    {"name": p.name, "plugin": regs.passes.origin(p.name), "opt_level": p.opt_level,
                     "params": {**dict(getattr(p, "params", {}) or {}), **opts.pass_params.get(p.name, {})},
                     "description": getattr(p, "description", "") or (type(p).__doc__ or "").strip().split("\n")[0]}
                    for p in s.passes
                ],
            }
            for s in plans
        ],
        "inactive": [
            {"name": n, "plugin": regs.passes.origin(n), "stage": p.stage, "opt_level": p.opt_level,
             "default_enabled": p.default_enabled}
            for n, p in regs.passes.items() if n not in active
        ],
        "stream_allocators": sorted(regs.stream_allocators.keys()),
        "memory_planners": sorted(regs.memory_planners.keys()),
        "options": {k: {"default": v[0], "help": v[1], "plugin": regs.options.origin(k)} for k, v in regs.options.items()},
    }
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    t = table(f"pipeline (O{opts.opt_level})", ("stage", "pass", "plugin", "params"))
    for s in data["stages"]:
        if not s["passes"]:
            t.add_row(_plain(s["stage"]), "-", "", "")
        for p in s["passes"]:
            t.add_row(_plain(s["stage"] + (" (fixed point)" if s["fixed_point"] else "")), _plain(p["name"]), _plain(p["plugin"]),
                      _plain(", ".join(f"{k}={v}" for k, v in p["params"].items())))
    con = _console()
    con.print(t)
    if data["inactive"]:
        con.print(_plain("not in this pipeline: " + ", ".join(f"{p['name']} (O{p['opt_level']})" for p in data["inactive"])))
    con.print(_plain(f"stream allocators: {', '.join(data['stream_allocators'])}; memory planners: {', '.join(data['memory_planners'])}"))
    return 0


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are :class:`OptionError` (``error: ...``, exit 2)
    with ``did you mean`` for a mistyped sub-command or flag. It remembers the flags added to it
    (``flags``) and, for the top parser, its sub-parsers (``commands``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("allow_abbrev", False)  # a prefix of a flag is a typo to name, not a guess
        self.flags: list[str] = []
        self.commands: dict[str, Parser] = {}
        self.argv: list[str] = []
        super().__init__(*args, **kw)

    def add_argument(self, *names: Any, **kw: Any):  # type: ignore[override]
        self.flags += [n for n in names if isinstance(n, str) and n.startswith("-")]
        return super().add_argument(*names, **kw)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None):  # type: ignore[override]
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(self.argv, namespace)

    def error(self, message: str):  # type: ignore[override]
        import re

        from .registry import close_matches

        hint = f"`{self.prog} --help` lists the options"
        m = re.search(r"invalid choice: '([^']*)'", message)
        if m and self.commands:
            raise OptionError(f"{self.prog}: unknown command '{m.group(1)}'{close_matches(m.group(1), list(self.commands))}",
                              hint=f"commands: {', '.join(self.commands)}")
        m = re.search(r"unrecognized arguments: (.*)", message)
        if m:
            cmd = next((self.commands[a] for a in self.argv if a in self.commands), None)
            known = (cmd or self).flags + self.flags
            bad = next((t for t in m.group(1).split() if t.startswith("-")), m.group(1).split()[0])
            flag = bad.split("=")[0]
            where = f"{self.prog} {cmd.prog.split()[-1]}" if cmd is not None else self.prog
            raise OptionError(f"{where}: unknown option '{flag}'{close_matches(flag, known)}" if flag.startswith("-")
                              else f"{where}: unexpected argument '{bad}'",
                              hint=f"`{where} --help` lists the options")
        raise OptionError(f"{self.prog}: {message}", hint=hint)


def build_parser(with_plugins: bool = True) -> argparse.ArgumentParser:
    parser = Parser(prog="ge", description="GE for Python: compile deep-learning models to .om and run them.")
    parser.add_argument("--version", action="version", version=f"ge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser("compile", help="compile a model file to an .om")
    p.add_argument("model", help="model file (.onnx, ...)")
    p.add_argument("-o", "--output", help="output .om path (default: MODEL.om in the current folder)")
    p.add_argument("--report", help="write the compile report (JSON) here")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    _add_compile_flags(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run an .om on inputs (random ones if none are given)")
    p.add_argument("model", help="the compiled .om to run")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="feed an input from a .npy file (repeatable)")
    p.add_argument("--random", action="store_true", help="fill inputs not given with random data")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--input-shape", dest="input_shape", metavar='"NAME:D1,D2,...;..."',
                   help='shapes of random inputs, as compile takes them, e.g. "x:2,3,224,224;y:2,7": needed for '
                        "inputs with symbolic or unknown dims (a symbol shared by inputs, such as the batch, "
                        "takes the size given for one of them); implies --random for the inputs it names")
    p.add_argument("--gear", type=int, help="a gear model (atc --dynamic_batch_size ...): the gear whose shapes "
                   "the random inputs take (default 0, the first)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run N times; the cold first run and the warm runs are reported apart")
    p.add_argument("--output-dir", help="save outputs as NAME.npy here")
    p.add_argument("--dump-tensors", metavar="DIR",
                   help="also save every intermediate tensor of the compiled graph as .npy in DIR, "
                        "with DIR/index.json (node, op, dtype, shape per tensor)")
    p.add_argument("--json", action="store_true", help="print output dtypes, shapes and timing as JSON")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("inspect", help="describe an .om file")
    p.add_argument("model", help="the .om to describe")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.add_argument("--source", action="store_true", help="print the generated code of a sunk model")
    p.add_argument("--memory-plot", metavar="FILE.png", help="draw the memory plan (tensor lifetime by arena offset; needs matplotlib)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("plugins", help="list plugins, what they provide and their load errors")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("passes", help="print the resolved pass pipeline")
    p.add_argument("--config", help="pipeline config (TOML) to resolve")
    p.add_argument("-O", "--opt-level", dest="opt_level", help="optimisation level 0..3 (default 2)")
    p.add_argument("--json", action="store_true", help="print the pipeline, passes and options as JSON")
    p.set_defaults(func=cmd_passes)

    if with_plugins:
        try:
            from .plugins import get_host

            for name, cmd in get_host().registries.cli_commands.items():
                if name in sub.choices:
                    continue
                sp = sub.add_parser(name, help=cmd.help, description=cmd.help)
                cmd.configure(sp)
                sp.set_defaults(func=lambda a, _c=cmd: _c.run(a))
        except GEError as e:
            print(f"warning: plugin commands unavailable: {e}", file=sys.stderr)
    parser.commands = {k: v for k, v in sub.choices.items() if isinstance(v, Parser)}
    return parser


_HISTORY = re.compile(r" \(passes before it: [^)]*\)")


class _OnceHandler(logging.Handler):
    """Prints each distinct log message once, as ``warning: ...`` (its level as the prefix)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record must not stop the command
            return
        # a pass that fails in every round of a fixed-point stage is one failure: its history
        # ("passes before it: ...") is what differs between the rounds
        key = (record.levelno, _HISTORY.sub("", msg))
        if key in self.seen:
            return
        self.seen.add(key)
        print(f"{record.levelname.lower()}: {msg}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    def go() -> int:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return args.func(args)

    handler = _OnceHandler()  # the ge loggers' messages (a failing plugin, a skipped pass): once each
    logger = logging.getLogger("ge")
    logger.addHandler(handler)
    try:
        return guard(go)
    finally:
        logger.removeHandler(handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
