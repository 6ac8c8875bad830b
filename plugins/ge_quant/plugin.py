"""Hook implementations of the ``ge_quant`` plugin: the passes that read quantised models into
int8 regions, and the compile report's ``int8`` section."""

from __future__ import annotations

import importlib

from ge_core.hookspecs import RegisterOp, RegisterOption, RegisterPass, hookimpl


def _quantize(graph, calibration, **options):
    """``ge.quantize``: :func:`ge_quant.quantizer.quantize`, reached by the core as the method
    ``quantize`` of the registered pass of that name."""
    from .quantizer import quantize

    return quantize(graph, calibration, **options)


#: (module, function, pass attributes)
PASSES: tuple[tuple[str, str, dict], ...] = (
    ("qdq", "qdq_pass", {"name": "qdq_regions", "stage": "prepare", "after": ("infer_shapes",), "opt_level": 0,
                         "required": True,
                         "description": "quantised models (QDQ, QOperator, dynamic): Q/DQ pairs as fake-quant "
                                        "arithmetic, int8 weights dequantised exactly, each int8 matrix op's "
                                        "quantisation in the int8 table (the backend runs them on integer units)"}),
    ("quantizer", "quantize_pass", {"name": "quantize", "stage": "prepare", "after": ("infer_shapes",),
                                    "before": ("qdq_regions",),
                                    "opt_level": 0, "required": True, "quantize": _quantize,
                                    "description": "ATC's --compression_optimize_conf: calibrate and quantise the "
                                                   "float graph into QDQ (nothing without the option)"}),
)


@hookimpl
def ge_register_ops(register: RegisterOp) -> None:
    from .contrib import OPDEFS as CONTRIB
    from .ops import OPDEFS

    for d in (*OPDEFS, *CONTRIB):
        register(d)


@hookimpl
def ge_register_options(register: RegisterOption) -> None:
    """``compression_optimize_conf``: GE's compression config file (its ``calibration`` block)."""
    from .compression_conf import validate

    register("compression_optimize_conf", "", "GE's --compression_optimize_conf file: calibrate and quantise "
             "the model to int8 (docs/atc.md)", read=validate)


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    from ge_core.passes import FunctionPass

    for module, fn, attrs in PASSES:
        register(FunctionPass(getattr(importlib.import_module(f"{__package__}.{module}"), fn), **attrs))


@hookimpl
def ge_model_built(model) -> None:
    """The compile report's ``int8`` section where the model has int8 matrix ops."""
    from .report import summarize

    got = summarize(model.graph)
    if got is not None:
        model.report["int8"] = got
