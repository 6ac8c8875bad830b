"""The ``ge passes`` command: the resolved pass pipeline, the inactive passes, the stream
allocators, memory planners and plugin options (registered by :mod:`ge_tools.plugin`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ge_core.cli import console, plain, table
from ge_core.memory import SYMBOLIC_PLANNER
from ge_core.options import CompileOptions
from ge_core.passes import resolve_pipeline
from ge_core.plugins import get_host


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="pipeline config (TOML) to resolve")
    p.add_argument("-O", "--opt-level", dest="opt_level", help="optimisation level 0..3 (default 2)")
    p.add_argument("--json", action="store_true", help="print the pipeline, passes and options as JSON")


def pipeline_data(regs: Any, opts: CompileOptions) -> dict[str, Any]:
    """What ``ge passes --json`` prints for the registries ``regs`` and the options ``opts``."""
    plans = resolve_pipeline(regs.passes, opts)
    active = {p.name for s in plans for p in s.passes}
    return {
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
        # the symbolic strategy is no planner to choose
        "memory_planners": sorted(k for k in regs.memory_planners.keys() if k != SYMBOLIC_PLANNER),
        "options": {k: {"default": v[0], "help": v[1], "plugin": regs.options.origin(k)} for k, v in regs.options.items()},
    }


def run(args: argparse.Namespace) -> int:
    regs = get_host().registries
    opts = CompileOptions.from_any(args.config) if args.config else CompileOptions()
    if args.opt_level is not None:
        opts.update({"opt_level": args.opt_level})
    data = pipeline_data(regs, opts)
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    t = table(f"pipeline (O{opts.opt_level})", ("stage", "pass", "plugin", "params"))
    for s in data["stages"]:
        if not s["passes"]:
            t.add_row(plain(s["stage"]), "-", "", "")
        for p in s["passes"]:
            t.add_row(plain(s["stage"] + (" (fixed point)" if s["fixed_point"] else "")), plain(p["name"]), plain(p["plugin"]),
                      plain(", ".join(f"{k}={v}" for k, v in p["params"].items())))
    con = console()
    con.print(t)
    if data["inactive"]:
        con.print(plain("not in this pipeline: " + ", ".join(f"{p['name']} (O{p['opt_level']})" for p in data["inactive"])))
    con.print(plain(f"stream allocators: {', '.join(data['stream_allocators'])}; memory planners: {', '.join(data['memory_planners'])}"))
    return 0
