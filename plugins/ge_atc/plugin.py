"""Hook implementations of the ``ge_atc`` plugin: the ``ge atc`` sub-command (the same as ``atc``),
the compile options of ATC's flags and the passes that carry them out, and the gear .om kind
(the models of ``--dynamic_batch_size`` and the other gear flags: :mod:`ge_atc.gear_model`).

The options are ATC's and so is their meaning, so they live here rather than in ge_passes: a
plain ``ge compile --option precision_mode=force_fp16`` reaches the same passes.
"""

import argparse
import importlib

from ge_core.hookspecs import RegisterCliCommand, RegisterOmKind, RegisterOption, RegisterPass, hookimpl


def _configure(p: argparse.ArgumentParser) -> None:
    from .cli import add_atc_arguments

    add_atc_arguments(p)


def _run(args: argparse.Namespace) -> int:
    from .cli import run

    return run(args)


@hookimpl
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    register("atc", "compile or inspect a model with ATC's flags (the same as the `atc` command)", _configure, _run)


def _reader(module: str, name: str):
    """The option reader ``name`` of ``module``, imported when an option is first read: loading
    an .om reads none, and ``precision`` brings in ml_dtypes."""

    def read(value):
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)(value)

    read.__name__ = read.__qualname__ = name
    return read


@hookimpl
def ge_register_options(register: RegisterOption) -> None:
    register("precision_mode", "must_keep_origin_dtype",
             "ATC precision mode: matrix ops compute in bfloat16/float16 (float32 sums) where the mode says",
             read=_reader("precision", "read_mode_option"))
    register("keep_dtype", "", "ATC --keep_dtype file: node names or OpType::TypeName kept at their precision",
             read=_reader("precision", "read_keep_dtype_option"))
    register("keep_dtype_entries", "", "what keep_dtype's file lists (set by reading keep_dtype)")
    register("modify_mixlist", "", "ATC --modify_mixlist JSON file: edits of the mixed-precision lists",
             read=_reader("precision", "read_mixlist_option"))
    register("mixlist_edits", "", "modify_mixlist's edits as JSON (set by reading modify_mixlist)")
    register("insert_op_conf", "", "ATC --insert_op_conf AIPP config file (static AIPP at the model's input)",
             read=_reader("aipp", "read_aipp_option"))
    register("aipp_config", "", "insert_op_conf's AIPP parameters as JSON (set by reading insert_op_conf)")
    register("input_format", "", "ATC --input_format: NCHW or NHWC, the layout of the model's image input",
             read=_reader("aipp", "read_input_format_option"))
    register("output_type", "", "ATC --output_type: FP32/FP16/... for all outputs, or node:index:FP16;...",
             read=_reader("graph_flags", "read_output_type_option"))
    register("dead_branch_elimination", True,
             "ATC --oo_dead_code_elimination: an If with a constant condition becomes its branch")


#: The passes of ATC's flags: (module, function, pass attributes). Each does nothing unless its
#: option is set; opt_level 0 so that --oo_level never turns a requested flag off.
PASSES = (
    ("aipp", "aipp_pass", {"name": "atc_aipp", "stage": "prepare", "after": ("infer_shapes",), "required": True,
                           "description": "ATC --insert_op_conf: static AIPP (crop, swap, csc, mean/min/var, "
                                          "padding) as ops at the input"}),
    ("graph_flags", "output_type_pass", {"name": "atc_output_type", "stage": "prepare", "after": ("infer_shapes",),
                                         "required": True, "description": "ATC --output_type: a Cast at each "
                                         "output it names, the output keeps its name"}),
    ("graph_flags", "dead_branch_pass", {"name": "dead_branch_elimination", "stage": "optimize", "opt_level": 1,
                                         "after": ("fold_constants",), "before": ("dce",),
                                         "description": "an If whose condition is a constant becomes the branch "
                                         "it takes (off: --oo_dead_code_elimination=false)"}),
    ("precision", "precision_pass", {"name": "atc_precision", "stage": "schedule", "required": True,
                                     "before": ("sink_constant_computations",),
                                     "description": "ATC --precision_mode/--keep_dtype/--modify_mixlist: the precision "
                                     "each matrix op computes in (the backend packs its weights in it)"}),
)


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    from ge_core.passes import FunctionPass

    for module, fn, attrs in PASSES:
        attrs = {"opt_level": 0, **attrs}
        register(FunctionPass(getattr(importlib.import_module(f"{__package__}.{module}"), fn), **attrs))


@hookimpl
def ge_model_built(model):
    """Put the precision pass's table in the compile report (``report["precision"]``)."""
    table = model.graph.metadata.get("atc_precision")
    if isinstance(table, dict) and table.get("mode") not in (None, "must_keep_origin_dtype"):
        from .precision import summarize

        model.report["precision"] = summarize(table)
    elif isinstance(table, dict) and model.options.soc_version == "cpu":
        from .precision_hint import hint

        line = hint(model)  # (float32 on a CPU with a bf16 unit: what the bf16 mode would buy)
        if line:
            model.report["precision_hint"] = line


@hookimpl
def ge_register_om_kinds(register: RegisterOmKind) -> None:
    """Gear models (atc --dynamic_batch_size, --dynamic_image_size, --dynamic_dims): the .om kind
    of partition ``gears``."""
    from .gear_model import GEARS_PARTITION, GearOmKind

    register(GEARS_PARTITION, GearOmKind())
