"""The ``ge compile``, ``ge run`` and ``ge inspect`` commands (registered by :mod:`ge_tools.plugin`
through ``ge_register_cli_commands``, as every plugin command is): compile a model file to an
.om with a report, run an .om on fed or random inputs, describe an .om."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.errors import ModelFileError, OptionError
from ge_sdk.cli import (
    compile_with_progress,
    console,
    feed_arg,
    log_stages,
    output_file_names,
    parse_kv,
    plain,
    random_feeds,
    random_input_shapes,
    table,
)


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


def _print_report(report: dict[str, Any], con) -> None:
    mem = report.get("memory", {})
    st = report.get("streams", {})
    mem = mem if isinstance(mem, dict) else {}
    st = st if isinstance(st, dict) else {}

    def n(v: Any) -> str:
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else plain(v)

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
        ranges = ", ".join(f"{plain(k)} {plain(r[0])}~{'-1' if r[1] is None else plain(r[1])}"
                           for k, r in syms.items() if isinstance(r, list) and len(r) == 2)
        at = [r for r in sym.get("at_references", []) if isinstance(r, dict) and isinstance(r.get("binding"), dict)]
        shown = "; ".join(f"{n(r.get('arena_bytes'))} at " + ",".join(f"{plain(k)}={plain(v)}" for k, v in r["binding"].items())
                          for r in at[:3])
        t.add_row("arena bytes", f"symbolic plan over {ranges} ({n(sym.get('planned_buffers'))} buffers, "
                  f"{n(sym.get('orders'))} orders, {n(mem.get('dynamic_buffers', 0))} outside): {shown}")
    else:
        t.add_row("arena bytes", f"{n(mem.get('arena_bytes', 0))} (lower bound {n(mem.get('lower_bound_bytes', 0))}, "
                  f"no reuse {n(mem.get('no_reuse_bytes', 0))})")
    t.add_row("weights bytes", n(mem.get("weights_bytes", 0)))
    t.add_row("compile seconds", plain(report.get("compile_seconds")))
    ops = report.get("op_counts", {})
    ops = {str(k): v for k, v in ops.items() if isinstance(v, int)} if isinstance(ops, dict) else {}
    t.add_row("ops", ", ".join(f"{plain(k)}×{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])))
    con.print(t)


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


def run_compile(args: argparse.Namespace) -> int:
    import ge_core as ge

    out = args.output
    base = os.path.splitext(os.path.basename(os.fspath(args.model).rstrip("/")))[0] or "model"
    if not out:
        out = base + ".om"
    elif out.endswith(("/", os.sep)) or os.path.isdir(out):  # a folder: MODEL.om in it
        out = os.path.join(out, base + ".om")
    if not out.endswith(".om"):
        out += ".om"
    from ge_core.writes import check_target
    from ge_core.writes import write_json_atomic as write_json

    from .common import command_inputs

    inputs = command_inputs(args)  # no output may overwrite one of them (by inode: links too)
    check_target(inputs.check(out, "-o/--output"), "the .om")
    if args.report:
        check_target(inputs.check(args.report, "--report"), "the compile report")
    if args.dump_ir:
        inputs.check(args.dump_ir, "--dump-ir")
    opts = _compile_options(args)
    t0 = time.perf_counter()
    model = compile_with_progress(ge, args.model, opts, quiet=args.quiet)
    took = time.perf_counter() - t0
    log_stages(model.report)
    hint = model.report.get("precision_hint")
    if isinstance(hint, str):  # float32 on a CPU with a bf16 unit: the bf16 mode measured on this model
        from ge_sdk.precision import HINT_BUDGET_S, hint_line, measure_mode

        trial = measure_mode(args.model, opts, model) if took <= HINT_BUDGET_S else None
        if trial:
            model.report["precision_trial"] = trial
        hint = hint_line(hint, trial)
    precision = model.report.get("precision")
    if isinstance(precision, dict) and precision.get("nodes"):  # a reduced precision: its error, measured
        from .bench_precision import error_vs_fp32

        precision["accuracy"] = acc = error_vs_fp32(args.model, opts, model)
        worst = max(acc["outputs"].items(), key=lambda kv: kv[1]["max_abs_over_range"], default=None)
        if worst is not None:
            counts = ", ".join(f"{c} compute in {p}" for p, c in (precision.get("compute") or {}).items())
            print(f"note: precision_mode={precision.get('mode')}: {counts}; largest error against the float32 "
                  f"build {worst[1]['max_abs']:.3g} on output '{worst[0]}' ({worst[1]['max_abs_over_range']:.2g} of its "
                  f"range, cosine {worst[1]['cosine']:.6f}), random inputs", file=sys.stderr)
    model.save(out)
    if args.report:
        write_json(args.report, model.report, "the compile report", inputs=inputs, flag="--report")
    if not args.quiet:
        con = console()
        _print_report(model.report, con)
        con.print(f"wrote [bold]{plain(out)}[/bold]")
    if isinstance(hint, str):  # (one line, on stderr)
        print(f"note: {hint}", file=sys.stderr)
    return 0


def run_run(args: argparse.Namespace) -> int:
    import time

    import ge_core as ge

    from .common import check_random_sizes, check_seed, command_inputs

    check_seed(args.seed)
    inputs = command_inputs(args)  # --output-dir / --dump-tensors never write over one of them
    for flag, folder in (("--output-dir", args.output_dir), ("--dump-tensors", args.dump_tensors)):
        if folder:
            inputs.check(folder, flag, exclusive=False)
    model = ge.load_om(args.model)
    feeds = dict(feed_arg(s) for s in args.input or [])
    shapes = random_input_shapes(args.input_shape, feeds)
    if args.random or shapes or not feeds and model.input_names:
        gear = _random_gear(model, args, feeds, shapes)
        check_random_sizes(gear.graph, shapes, known={**{v.name: v.default for v in gear.graph.inputs
                                                          if v.default is not None}, **feeds}, default_dim=None)
        rnd = random_feeds(gear, args.seed, shapes, known=feeds, strict=True)
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
        files = _save_outputs(outs, args.output_dir, inputs=inputs, flag="--output-dir")
    if args.dump_tensors:
        dump_tensors(model, feeds, args.dump_tensors, inputs=inputs)
    timing: dict[str, Any] = {"seconds": dt, "cold_seconds": dt}
    if warm:
        timing.update(warm_runs=len(warm), warm_seconds_median=float(np.median(warm)), warm_seconds_min=min(warm))
    if args.json:
        info = {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in outs.items()}
        for k, f in files.items():
            info[k]["file"] = f
        print(json.dumps({**timing, "outputs": info}))
        return 0
    con = console()
    for name, arr in outs.items():
        stats = ""
        if arr.dtype.kind in "fiu" and arr.size:
            stats = f" min {arr.min():.6g} max {arr.max():.6g} mean {arr.mean():.6g}"
        saved = f" -> {plain(files[name])}" if name in files else ""
        con.print(f"{plain(name)}: {arr.dtype}{list(arr.shape)}{stats}{saved}")
    if warm:
        con.print(f"first run (cold) {dt * 1000:.2f} ms; {len(warm)} warm run(s): median {np.median(warm) * 1000:.3f} ms, "
                  f"min {min(warm) * 1000:.3f} ms (`ge bench` gives percentiles and throughput)")
    else:
        con.print(f"ran in {dt * 1000:.2f} ms (a first, cold run: --repeat N shows the warm time per run)")
    return 0


def _random_gear(model, args: argparse.Namespace, feeds: dict[str, Any] | None = None, shapes: Any = None):
    """The model whose input types random inputs follow: of a gear model, the gear ``--gear``
    (default: the gear the fed inputs and ``--input-shape`` select, else 0), said on stderr; a
    run still takes the gear of the feeds' shapes."""
    from .common import model_for_shapes

    gear = getattr(args, "gear", None)
    if not hasattr(model, "gear"):
        if gear is not None:
            raise OptionError(f"--gear {gear}: '{args.model}' is not a gear model",
                              hint="gear models come from atc --dynamic_batch_size, --dynamic_image_size or --dynamic_dims")
        return model
    chosen = model.gear(gear) if gear is not None else model_for_shapes(model, feeds or {}, shapes or {})
    i = model.models.index(chosen)
    print(f"note: random inputs of {model.table.gear_text(i)}; the gears are {model.table.describe()}; "
          f"--gear N (0..{len(model.models) - 1}) picks another", file=sys.stderr)
    return chosen


def dump_tensors(model, feeds: dict[str, Any], folder: str, *, inputs: Any = None) -> str:
    """Run ``model`` with every tensor a node computes as an output (:meth:`CompiledModel.with_outputs`)
    and save each as .npy in ``folder``, with ``index.json``: per tensor in schedule order, the
    node and op that computed it, dtype, shape and file. Returns the index path."""
    exposed = model.model_for(feeds).with_outputs(None)  # (a gear model: the gear of the feeds' shapes)
    outs = exposed.run(feeds)
    files = _save_outputs(outs, folder, inputs=inputs, flag="--dump-tensors")
    made_by = {o.name: n for n in exposed.graph.node_list() for o in n.outputs}
    order = {name: i for i, name in enumerate(made_by)}
    index = []
    for name, arr in sorted(outs.items(), key=lambda kv: order.get(kv[0], -1)):
        n = made_by.get(name)
        index.append({"name": name, "node": n.name if n is not None else None, "op": n.qualified_op if n is not None else None,
                      "dtype": str(getattr(arr, "dtype", "")), "shape": list(np.shape(arr)),
                      "file": os.path.basename(files[name]), "output": name in model.output_names})
    path = os.path.join(folder, "index.json")
    from ge_core.writes import write_json_atomic as write_json

    write_json(path, index, "the tensor index", inputs=inputs, flag="--dump-tensors")
    return path


def _save_outputs(outs: dict[str, np.ndarray], folder: str, *, inputs: Any = None,
                  flag: str = "--output-dir") -> dict[str, str]:
    """Save each output as its own .npy in ``folder`` (names from :func:`output_file_names`);
    returns output name -> path written. Each file goes through a temporary file beside it,
    synced and size-checked, and all are renamed in place only when every one was written:
    a full disk fails with the path and leaves no partial file. A file that is one of
    ``inputs`` (:class:`ge_core.writes.InputFiles`) is refused."""
    from ge_core.writes import make_folder, write_all_atomic

    make_folder(folder, "the output folder", inputs=inputs, flag=flag)
    files: dict[str, str] = {}
    items = []
    for (name, arr), fname in zip(outs.items(), output_file_names(list(outs))):
        path = os.path.join(folder, fname)
        a = np.asarray(arr)
        if a.dtype.hasobject:
            raise ModelFileError(f"cannot write output '{name}' to '{path}': an array of {a.dtype} cannot be saved "
                                 "as .npy without pickle", hint="outputs that are not plain arrays cannot be saved")
        items.append((path, lambda f, _a=a: np.save(f, _a, allow_pickle=False)))
        files[name] = path
    write_all_atomic(items, "output file", inputs=inputs, flag=flag)
    return files


def run_inspect(args: argparse.Namespace) -> int:
    from ge_sdk.omdesc import inspect_om

    if getattr(args, "source", False):
        import ge_core as ge

        loaded = ge.load_om(args.model)
        gears = list(getattr(loaded, "models", None) or [loaded])
        for i, m in enumerate(gears):
            src = _generated_source(m, args.model if len(gears) == 1 else f"{args.model}, gear {i}")
            if len(gears) > 1:
                print(f"# {loaded.table.gear_text(i)}" if hasattr(loaded, "table") else f"# gear {i}")
            print(src, end="" if src.endswith("\n") else "\n")
        return 0
    info = inspect_om(args.model)
    info["model"]["output_types"] = output_types(args.model, info["model"].get("outputs") or [])
    kc = kernel_cache_state(args.model)
    if kc is not None:
        info["kernel_cache"] = kc
    if getattr(args, "memory_plot", None):  # drawn by the plugin command memory-plot (ge_memory)
        from ge_core.plugins import get_host
        from ge_core.writes import InputFiles, check_target

        check_target(InputFiles(args.model).check(args.memory_plot, "--memory-plot"), "the memory plot")

        draw = get_host().registries.cli_commands.get("memory-plot")
        if draw is None:
            raise OptionError("--memory-plot: no plugin provides the memory-plot command",
                              hint="the ge_memory plugin does: is it disabled (GE_DISABLE_PLUGINS)?")
        draw.run(argparse.Namespace(model=args.model, out=args.memory_plot, quiet=True, flag="--memory-plot"))
        info["memory_plot"] = os.fspath(args.memory_plot)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    con = console()
    f = info["file"]
    m = info["model"]
    con.print(f"[bold]{plain(args.model)}[/bold]  format {plain(f.get('format_version'))}  "
              f"producer {plain(m.get('producer'))}")
    ins = ", ".join(f"{i.get('name')} {i.get('dtype')}{i.get('shape')}" for i in (m.get("inputs") or []))
    con.print(f"inputs:  {plain(ins)}")
    outs = ", ".join(f"{o.get('name')} {o.get('dtype')}{o.get('shape')}" for o in (m.get("output_types") or []))
    con.print(f"outputs: {plain(outs)}")
    if info.get("gears"):
        _print_gears(info["gears"], con)
    con.print(f"nodes: {m.get('nodes')}  constants: {m.get('constants')}  soc_version: {plain(m.get('soc_version'))}")
    t = table("partitions", ("kind", "offset", "size", "alignment", "crc32"))
    for p in f.get("partitions", []):
        t.add_row(plain(p.get("kind")), str(p.get("offset")), f"{p.get('size'):,}", str(p.get("alignment")), str(p.get('crc32')))
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
        con.print(f"memory plot: {plain(info['memory_plot'])}")
    return 0


def _generated_source(model, what: str) -> str:
    """The code the sink executor generated for ``model`` (``ge inspect --source``); an
    OptionError saying why there is none (which executor runs it, and what gives one)."""
    exe = model.executable
    src = getattr(exe, "source", None)
    if isinstance(src, str):
        return src
    extra = getattr(getattr(model, "options", None), "extra", None) or {}
    chosen = str(extra.get("executor", "auto") or "auto")
    kind = type(exe).__name__
    if "Symbolic" in kind:
        raise OptionError(f"'{what}' has no generated source: its memory plan is symbolic (input dims are set by "
                          f"each run), so the {kind} interprets it in the arena each run's shapes give "
                          f"(executor option: {chosen})",
                          hint='compile it with static input shapes (--input-shape "name:d1,d2,...") for generated code')
    raise OptionError(f"'{what}' has no generated source: it runs on the {kind} (executor option: {chosen})",
                      hint="compile it with the option executor=sink (--option executor=sink; the default, auto, "
                           "generates code for static shapes)")


def _print_gears(gears: dict[str, Any], con) -> None:
    """The gears of a gear model (``atc --dynamic_batch_size`` ...): one static model each."""
    con.print(f"gears:   {plain(gears.get('text'))}; a run takes the gear of its feed's shapes")
    t = table("gears", ("gear", "value", "input shapes", "nodes", "kernels", "arena bytes"))
    for g in gears.get("list", []):
        shapes = ", ".join(f"{n}{s}" for n, s in (g.get("shapes") or {}).items())
        t.add_row(str(g.get("index")), plain(g.get("label")), plain(shapes), str(g.get("nodes")),
                  str(g.get("kernels")), f"{g.get('arena_bytes') or 0:,}")
    con.print(t)


def kernel_cache_state(path: str) -> dict[str, int] | None:
    """``{"modules", "in_cache", "missing"}``: the native kernel modules the .om at ``path``
    needs and whether this machine's kernel cache holds them (nothing is compiled: the backend
    builds it with ``native_kernels=probe``); None when its backend has no such kernels."""
    import ge_core as ge
    from ge_core.plugins import get_host

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
    from ge_core.om import stored_definition
    from ge_core.om_container import read_container
    from ge_core.plugins import get_host

    types: dict[str, dict[str, Any]] = {}
    with read_container(path) as c:
        d = stored_definition(path, c, get_host())
    stored = d.get("graph")
    graph: dict[str, Any] = stored if isinstance(stored, dict) else {}
    for v in list(graph.get("inputs") or []) + [o for n in graph.get("nodes") or [] if isinstance(n, dict)
                                                 for o in n.get("outputs") or []]:
        if isinstance(v, dict) and isinstance(v.get("name"), str):
            types[v["name"]] = {"dtype": v.get("dtype"), "shape": v.get("shape")}
    return [{"name": str(n), **types.get(str(n), {"dtype": None, "shape": None})} for n in names]


def configure_compile(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file (.onnx, ...)")
    p.add_argument("-o", "--output", help="output .om path (default: MODEL.om in the current folder)")
    p.add_argument("--report", help="write the compile report (JSON) here")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    _add_compile_flags(p)


def configure_run(p: argparse.ArgumentParser) -> None:
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


def configure_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the .om to describe")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.add_argument("--source", action="store_true", help="print the generated code of a sunk model")
    p.add_argument("--memory-plot", metavar="FILE.png", help="draw the memory plan (tensor lifetime by arena offset; needs matplotlib)")
