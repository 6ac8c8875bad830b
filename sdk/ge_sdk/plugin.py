"""The SDK's own plugin (entry point ``ge_sdk``): the ``ge new-plugin`` and ``ge viz`` commands.

They come in through ``ge_register_cli_commands``, the door third-party plugins use.
"""

from __future__ import annotations

import argparse
import sys

from ge_core.hookspecs import RegisterCliCommand, hookimpl


def _configure_new_plugin(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="plugin name, e.g. my_plugin (package my_plugin, distribution my-plugin)")
    p.add_argument("--dir", default=".", help="folder to create the distribution in (default: here)")
    p.add_argument("--force", action="store_true", help="write into an existing folder")


def _run_new_plugin(args: argparse.Namespace) -> int:
    from .template import create

    root = create(args.name, args.dir, force=args.force)
    print(f"created {root}\n  pip install -e {root}   # then: ge plugins; python -m pytest {root}/tests")
    return 0


def _configure_viz(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a model file (drawn as loaded, or compiled with --compiled) or an .om")
    p.add_argument("-o", "--output", required=True, help="graph.svg or graph.html")
    p.add_argument("--compiled", action="store_true", help="compile the model first and draw the result")
    p.add_argument("--config", help="pipeline config (TOML) for --compiled")
    p.add_argument("--framework", help="frontend name or ATC number")
    p.add_argument("--option", action="append", metavar="NAME=VALUE", help="compile option for --compiled")


def _run_viz(args: argparse.Namespace) -> int:
    import ge_core as ge
    from ge_core.writes import InputFiles, check_target

    from .cli import parse_kv
    from .viz import render

    path = args.model
    inputs = InputFiles(path, args.config)  # -o never writes over one of them (a link to it included)
    check_target(inputs.check(args.output, "-o/--output"), "the drawing")
    streams = None
    report = None
    if path.endswith(".om"):
        model = ge.load_om(path)
        graph, streams, report = model.graph, model.streams.streams, model.report
    elif args.compiled or args.config:
        opts = parse_kv(args.option, "--option")
        if args.config:
            opts["config"] = args.config
        if args.framework:
            opts["framework"] = args.framework
        model = ge.compile(path, opts)
        graph, streams, report = model.graph, model.streams.streams, model.report
    else:
        graph = ge.load(path, framework=args.framework)
    render(graph, args.output, streams=streams, title=path, report=report, inputs=inputs)
    print(f"wrote {args.output} ({len(graph)} nodes)", file=sys.stderr)
    return 0


@hookimpl
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    register("new-plugin", "create a ready plugin distribution from the template", _configure_new_plugin,
             _run_new_plugin)
    register("viz", "draw a model or .om as SVG/HTML (fused groups and streams marked)", _configure_viz, _run_viz)
