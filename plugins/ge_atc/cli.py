"""``atc``: the ATC-compatible front door (also ``ge atc``).

ATC's flags are spelt as ATC spells them (``--model=... --framework=5 --output=...``) and mapped
onto this engine's compile options; flags that change nothing here are accepted with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ge_core.cli import compile_with_progress, guard, write_json_atomic
from ge_core.errors import OptionError

#: ATC flags that change nothing on this engine; accepted with a note so scripts keep working.
_ATC_IGNORED = (
    "input_format", "precision_mode", "op_select_implmode", "optypelist_for_implmode", "insert_op_conf",
    "op_name_map", "enable_small_channel", "compression_optimize_conf", "buffer_optimize", "host_env_os",
    "host_env_cpu", "input_fp16_nodes", "is_output_adjust_hw_layout", "output_type", "keep_dtype",
    "dynamic_batch_size", "dynamic_image_size", "dynamic_dims", "core_type", "aicore_num", "virtual_type",
    "op_debug_level", "debug_dir", "op_compiler_cache_mode", "op_compiler_cache_dir", "dump_mode", "weight",
    "check_report", "display_model_info", "status_check", "auto_tune_mode", "modify_mixlist", "sparsity",
    "singleop", "enable_scope_fusion_passes", "external_weight", "allow_hf32", "distributed_cluster_build",
)


def build_atc_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="atc", description="ATC-compatible front door of GE for Python.",
                                allow_abbrev=False)
    add_atc_arguments(p)
    return p


def add_atc_arguments(p: argparse.ArgumentParser) -> None:
    """ATC's flags on ``p`` (the ``atc`` parser, or the ``ge atc`` sub-parser)."""
    p.add_argument("--mode", type=int, default=0, help="0: compile a model to .om; 1: print an .om as JSON")
    p.add_argument("--model", help="source model file")
    p.add_argument("--framework", help="0 Caffe, 1 MindSpore, 3 TensorFlow, 5 ONNX")
    p.add_argument("--output", help="output path; .om is appended when missing")
    p.add_argument("--soc_version", default="cpu")
    p.add_argument("--input_shape")
    p.add_argument("--out_nodes")
    p.add_argument("--fusion_switch_file")
    p.add_argument("--log", choices=["debug", "info", "warning", "error", "null"])
    p.add_argument("--om", help="with --mode=1: the .om to print")
    p.add_argument("--json", help="with --mode=1: write the JSON here instead of printing it")
    p.add_argument("--memory_optimize_level")
    p.add_argument("--enable_single_stream", choices=["true", "false"])
    p.add_argument("--disable_reuse_memory", choices=["0", "1"])
    p.add_argument("--constant_folding", choices=["true", "false"])
    p.add_argument("--config", help="pipeline config (TOML), an extension of this engine")
    p.add_argument("--report", help="write the compile report (JSON), an extension of this engine")
    for name in _ATC_IGNORED:
        p.add_argument(f"--{name}", dest=f"ignored_{name}")


def main(argv: Sequence[str] | None = None) -> int:
    def go() -> int:
        p = build_atc_parser()
        args, unknown = p.parse_known_args(argv)
        if unknown:
            from ge_core.registry import close_matches

            known = [a.lstrip("-") for a in p._option_string_actions if a.startswith("--")]
            flag = unknown[0].split("=")[0]
            raise OptionError(f"atc: unknown option '{flag}'{close_matches(flag.lstrip('-'), known)}",
                              hint="`atc --help` lists the options")
        return run(args)

    return guard(go)


def run(args: argparse.Namespace) -> int:
    """Carry out parsed ATC flags: compile (``--mode=0``) or print an .om (``--mode=1``)."""
    ignored = [n for n in _ATC_IGNORED if getattr(args, f"ignored_{n}") is not None]
    if ignored:
        print(f"note: atc option(s) {', '.join('--' + n for n in ignored)} have no effect on this engine", file=sys.stderr)
    if args.mode == 1:
        if not args.om:
            raise OptionError("atc --mode=1 needs --om=MODEL.om")
        from ge_core.om import inspect_om

        info = inspect_om(args.om)
        text = json.dumps(info, indent=2, default=str)
        if args.json:
            write_json_atomic(args.json, info)
        else:
            print(text)
        return 0
    if args.mode != 0:
        raise OptionError(f"atc --mode={args.mode} is not supported", hint="use 0 (compile) or 1 (om to JSON)")
    if not args.model:
        raise OptionError("atc needs --model=FILE")
    if not args.output:
        raise OptionError("atc needs --output=NAME (the .om path without or with .om)")
    import ge_core as ge

    opts: dict[str, Any] = {"soc_version": args.soc_version}
    for k in ("framework", "input_shape", "out_nodes", "fusion_switch_file", "log", "memory_optimize_level", "config"):
        v = getattr(args, k)
        if v is not None:
            opts[k] = v
    if args.enable_single_stream is not None:
        opts["enable_single_stream"] = args.enable_single_stream
    if args.disable_reuse_memory is not None:
        opts["disable_reuse_memory"] = args.disable_reuse_memory
    if args.constant_folding is not None:
        opts["constant_folding"] = args.constant_folding
    model = compile_with_progress(ge, args.model, opts)
    out = args.output if args.output.endswith(".om") else args.output + ".om"
    model.save(out)
    if args.report:
        write_json_atomic(args.report, model.report)
    print(f"ATC run success: wrote {out}")
    return 0
