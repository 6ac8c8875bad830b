"""``atc``: the ATC-compatible front door (also ``ge atc``).

ATC's flags are spelt as ATC spells them (``--model=... --framework=5 --output=...``) and mapped
onto this engine's compile options (:mod:`ge_atc.flags` says what each one does here). Flags
that change nothing on this engine are accepted with a note printed once; flags whose effect
this engine does not build are refused with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ge_core.errors import OptionError, UnsupportedOpError
from ge_sdk.cli import compile_with_progress, guard

from .flags import IGNORED, IMPLEMENTED, REFUSED, all_ignored, ignored_note

#: Flags with a fixed set of values (checked with a clean error naming the flag).
_CHOICES = {"enable_single_stream": ("true", "false"), "constant_folding": ("true", "false"),
            "oo_constant_folding": ("true", "false"), "oo_dead_code_elimination": ("true", "false"),
            "disable_reuse_memory": ("0", "1"), "deterministic": ("0", "1"), "display_model_info": ("0", "1"),
            "external_weight": ("0", "1", "2"), "oo_level": ("O0", "O1", "O2", "O3")}

#: Flags this module reads itself (not passed through as plugin options of the same name).
_PLUGIN_OPTIONS = ("precision_mode", "keep_dtype", "modify_mixlist", "insert_op_conf", "input_format", "output_type",
                   "compression_optimize_conf")


def build_atc_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="atc", usage="atc --model=FILE [--framework=5] --output=NAME [flags]\n"
                                "       atc --mode=3 --model=FILE [--check_report=FILE]\n"
                                "       atc --mode=1 --om=FILE.om [--json=FILE]  |  atc --mode=6 --om=FILE.om",
                                description="ATC-compatible front door of GE for Python. "
                                "Implemented flags first; then ATC's flags that are accepted and ignored, "
                                "grouped by why; then the refused ones.", allow_abbrev=False)
    add_atc_arguments(p)
    return p


def add_atc_arguments(p: argparse.ArgumentParser) -> None:
    """ATC's flags on ``p`` (the ``atc`` parser, or the ``ge atc`` sub-parser)."""
    impl = p.add_argument_group("implemented")
    for name, text in IMPLEMENTED.items():
        kw: dict[str, Any] = {"help": text}
        if name == "mode":
            kw.update(type=int, default=0)
        elif name == "soc_version":
            kw["default"] = "cpu"
        impl.add_argument(f"--{name}", **kw)
    for group, flags in IGNORED.items():
        g = p.add_argument_group(f"accepted, no effect: {group}")
        for name, why in flags.items():
            g.add_argument(f"--{name}", dest=f"ignored_{name}", metavar="VALUE", help=why)
    g = p.add_argument_group("refused (a different model would be built silently)")
    for name, why in REFUSED.items():
        g.add_argument(f"--{name}", dest=f"refused_{name}", metavar="VALUE", help=why)


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
        args.atc_argv = list(sys.argv[1:] if argv is None else argv)
        return run(args)

    return guard(go)


def _check_choices(args: argparse.Namespace) -> None:
    for name, allowed in _CHOICES.items():
        v = getattr(args, name, None)
        if v is not None and v not in allowed:
            raise OptionError(f"atc --{name}={v}: the value must be one of {', '.join(allowed)}")


#: ATC's layouts per framework (GE's main_impl.cc: kONNXFormatSupport and friends).
_FORMATS_OF = {"onnx": ("NCHW", "ND", "NCDHW"), "caffe": ("NCHW", "ND"),
               "tensorflow": ("NCHW", "NHWC", "ND", "NCDHW", "NDHWC")}


def _check_input_format(args: argparse.Namespace) -> None:
    if not args.input_format:
        return
    from ge_core.options import parse_framework

    fw = parse_framework(args.framework) or ("onnx" if str(args.model or "").endswith(".onnx") else None)
    allowed = _FORMATS_OF.get(fw or "")
    if allowed and args.input_format.upper() not in allowed:
        raise OptionError(f"atc --input_format={args.input_format}: ATC takes only {', '.join(allowed)} for a "
                          f"{fw} model", hint="an ONNX model's image input is NCHW")


def _dependent_notes(args: argparse.Namespace) -> None:
    """GE: --keep_dtype works with a --precision_mode other than must_keep_origin_dtype, and
    --modify_mixlist with allow_mix_precision; say so when a flag is given without its partner."""
    mode = args.precision_mode or "must_keep_origin_dtype"
    if args.keep_dtype and mode == "must_keep_origin_dtype":
        print("note: --keep_dtype has no effect with precision_mode must_keep_origin_dtype (nothing is reduced)",
              file=sys.stderr)
    if args.modify_mixlist and not mode.startswith("allow_mix_precision"):
        print(f"note: --modify_mixlist has no effect with precision_mode {mode} (it edits allow_mix_precision's "
              "lists)", file=sys.stderr)


def _notes(args: argparse.Namespace) -> None:
    _check_input_format(args)
    _dependent_notes(args)
    for name in REFUSED:
        if getattr(args, f"refused_{name}", None) is not None:
            raise OptionError(f"atc --{name} is not supported: {REFUSED[name]}")
    for name in all_ignored():
        if getattr(args, f"ignored_{name}", None) is not None:
            print(f"note: {ignored_note(name)}", file=sys.stderr)


def soc_version(name: str | None) -> str | None:
    """ATC's --soc_version: an Ascend NPU's name (Ascend310, Ascend910B3, Ascend310P3,
    Ascend910_9391, ...) runs on the cpu backend, as docs/atc.md says, with a one-line note; any
    other name is a backend's (an unknown one is refused when the compile picks the backend)."""
    if not isinstance(name, str) or not name.strip().lower().startswith("ascend"):
        return name
    from ge_core.plugins import get_host

    if name.strip() in get_host().registries.backends:  # (a plugin's backend of that very name)
        return name.strip()
    print(f"note: --soc_version={name.strip()}: no Ascend NPU here; compiling for the cpu backend", file=sys.stderr)
    return "cpu"


def compile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The compile options ATC's flags in ``args`` give."""
    opts: dict[str, Any] = {"soc_version": soc_version(args.soc_version)}
    for k in ("framework", "input_shape", "out_nodes", "fusion_switch_file", "log", "memory_optimize_level",
              "config", "enable_single_stream", "disable_reuse_memory", "constant_folding", *_PLUGIN_OPTIONS):
        v = getattr(args, k, None)
        if v is not None:
            opts[k] = v
    if getattr(args, "input_shape_range", None):
        opts["input_shape"] = input_shape_from_range(args.input_shape_range, args.input_shape)
    if args.oo_constant_folding is not None:
        opts["constant_folding"] = args.oo_constant_folding
    if args.oo_level is not None:
        opts["opt_level"] = args.oo_level
    if args.oo_dead_code_elimination is not None:
        opts["dead_branch_elimination"] = args.oo_dead_code_elimination == "true"
    if args.deterministic == "1":
        opts["parallel"] = "engine"
    if args.optimization_switch:
        from .optimize import switch_options

        opts.update(switch_options(args.optimization_switch, opts))
    return opts


def input_shape_from_range(text: str, input_shape: str | None) -> str:
    """``--input_shape_range="x:[1~8,3,224,224];y:[1~8,-1]"`` as ``--input_shape`` (ranges are one
    of its dim forms); OptionError with --input_shape too, or for an entry without brackets."""
    if input_shape:
        raise OptionError("atc --input_shape_range and --input_shape are exclusive",
                          hint='give the ranges in --input_shape, e.g. --input_shape="x:1~8,3,224,224"')
    parts = []
    for part in str(text).split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, dims = part.rpartition(":")
        dims = dims.strip()
        if not sep or not name or not (dims.startswith("[") and dims.endswith("]")):
            raise OptionError(f"atc --input_shape_range entry '{part}' must look like name:[d1,d2,...]",
                              hint='for example --input_shape_range="x:[1~8,3,224,224]"')
        parts.append(f"{name}:{dims[1:-1]}")
    return ";".join(parts)


def command_inputs(args: argparse.Namespace):
    """The files ATC's flags in ``args`` name to read (:class:`ge_core.writes.InputFiles`): no
    output flag may write over one of them (the same name, a link, a hard link)."""
    from ge_core import get_host
    from ge_core.writes import InputFiles

    get_host()  # the plugins say which files a model names (an ONNX model's external data)
    return InputFiles(*(getattr(args, k, None) for k in (
        "model", "om", "config", "fusion_switch_file", "keep_dtype", "modify_mixlist", "insert_op_conf")))


def _write_json(path: str, data: Any, what: str, args: argparse.Namespace, flag: str) -> None:
    from ge_core.writes import check_target, write_json_atomic

    inputs = getattr(args, "command_inputs", None)
    check_target(path if inputs is None else inputs.check(path, flag), what)
    write_json_atomic(path, data, what, inputs=inputs, flag=flag)


def run(args: argparse.Namespace) -> int:
    """Carry out parsed ATC flags (``--mode`` 0, 1, 3 or 6)."""
    _check_choices(args)
    _notes(args)
    args.command_inputs = inputs = command_inputs(args)
    if args.mode in (1, 6):
        if not args.om:
            raise OptionError(f"atc --mode={args.mode} needs --om=MODEL.om")
        from ge_sdk.omdesc import inspect_om

        info = inspect_om(args.om)
        if args.mode == 6:
            from .display import model_info_text

            print(model_info_text(info))
            return 0
        if args.json:
            _write_json(args.json, info, "the model JSON", args, "--json")
        else:
            print(json.dumps(info, indent=2, default=str))
        return 0
    if args.mode not in (0, 3):
        raise OptionError(f"atc --mode={args.mode} is not supported",
                          hint="use 0 (compile), 1 (.om to JSON), 3 (pre-check) or 6 (display .om info)")
    if not args.model:
        raise OptionError("atc needs --model=FILE")
    opts = compile_options(args)
    if args.mode == 3:
        return _precheck(args, opts)
    if not args.output:
        raise OptionError("atc needs --output=NAME (the .om path without or with .om)")
    from ge_core.om import save_om
    from ge_core.writes import check_target

    check_target(inputs.check(args.output if args.output.endswith(".om") else args.output + ".om", "--output"),
                 "the .om")
    if args.report:
        check_target(inputs.check(args.report, "--report"), "the compile report")
    if args.check_report:
        inputs.check(args.check_report, "--check_report")

    from .gears import gear_flag, gear_plan

    flag = gear_flag(args)
    plan = gear_plan(flag[0], flag[1], args.input_shape, args.input_format) if flag else None
    t0 = time.perf_counter()
    try:
        models = _compile(args.model, opts, plan)
    except UnsupportedOpError:
        # GE: when --mode=0 fails to parse the model, the pre-check report says which ops (--check_report)
        path = _write_check_report(args, opts)
        print(f"note: the pre-check report of the unsupported ops is in {path}", file=sys.stderr)
        raise
    model = models[0]  # the precision check and its note look at the first gear
    precision = model.report.get("precision")
    if opts.get("precision_mode") == "force_fp32" and not (precision or {}).get("nodes"):
        print("note: --precision_mode=force_fp32 has no effect on this model: it computes in float32 already",
              file=sys.stderr)
    elif isinstance(precision, dict) and precision.get("nodes"):
        from .accuracy import measure, summary
        from .precision import compute_summary

        precision["accuracy"] = measure(args.model, opts, model)
        print(f"note: --precision_mode={precision['mode']}: {compute_summary(precision)}; "
              f"{summary(precision['accuracy'])}", file=sys.stderr)
    if isinstance(model.report.get("precision_hint"), str):  # float32 on a CPU with a bf16 unit
        from ge_sdk.precision import HINT_BUDGET_S, hint_line, measure_mode

        trial = None
        if not plan and time.perf_counter() - t0 <= HINT_BUDGET_S:
            trial = model.report["precision_trial"] = measure_mode(args.model, opts, model)
        print(f"note: {hint_line(model.report['precision_hint'], trial)}", file=sys.stderr)
    argv = getattr(args, "atc_argv", None)
    argv = argv if argv is not None else sys.argv[2:]  # `ge atc ...`: after the sub-command
    atc = {"command_line": " ".join(["atc", *map(str, argv)]), "framework": model.options.framework}
    out = args.output if args.output.endswith(".om") else args.output + ".om"
    if plan:
        from .gear_model import GearModel

        gm = GearModel(models, plan[0], {"atc": atc})
        gm.save(out, external_weight=int(args.external_weight or 0))
        print(f"note: {len(models)} gears compiled: {plan[0].describe()}", file=sys.stderr)
        report = gm.report
    else:
        model.report["atc"] = atc
        save_om(model, out, external_weight=int(args.external_weight or 0))
        report = model.report
    if args.report:
        _write_json(args.report, report, "the compile report", args, "--report")
    print(f"ATC run success: wrote {out}")
    if args.display_model_info == "1":
        from ge_sdk.omdesc import inspect_om

        from .display import model_info_text

        print(model_info_text(inspect_om(out)))
    return 0


def _compile(source: str, opts: dict[str, Any], plan) -> list:
    """The compiled model, or with gears (``plan``: table and each gear's --input_shape) one
    static model per gear; an error of a gear's compile names the gear."""
    import ge_core as ge
    from ge_core.errors import GraphError, ShapeInferenceError

    if plan is None:
        return [compile_with_progress(ge, source, opts)]
    table, shapes = plan
    models = []
    for i, shape in enumerate(shapes):
        try:
            models.append(compile_with_progress(ge, source, {**opts, "input_shape": shape}))
        except (OptionError, GraphError, ShapeInferenceError) as e:
            if type(e) not in (OptionError, GraphError, ShapeInferenceError):
                raise
            raise type(e)(f"atc --{table.flag}: gear {i} ({table.label(i)}, --input_shape=\"{shape}\"): {e.detail}",
                          hint=e.hint) from None
    return models


def _write_check_report(args: argparse.Namespace, opts: dict[str, Any]) -> str:
    """Pre-check the model and write GE's check_result.json (``--check_report``, else in
    ``$ASCEND_WORK_PATH`` or the current folder); its path. ``args.precheck_result`` keeps it."""
    from .precheck import precheck

    report = precheck(args.model, opts)
    path = args.check_report or os.path.join(os.environ.get("ASCEND_WORK_PATH") or ".", "check_result.json")
    _write_json(path, report, "the pre-check report", args, "--check_report")
    args.precheck_result = report
    return path


def _precheck(args: argparse.Namespace, opts: dict[str, Any]) -> int:
    from .precheck import summary_line

    path = _write_check_report(args, opts)
    report = args.precheck_result
    print(summary_line(report) + f" (report: {path})", file=sys.stderr if report["result"] != "success" else sys.stdout)
    return 0 if report["result"] == "success" else 1
