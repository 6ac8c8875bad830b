"""Hook implementations of the ``ge_tools`` plugin: the ``compile``, ``run``, ``inspect``, ``passes``,
``bench``, ``compare`` and ``export`` commands."""

from __future__ import annotations

import argparse
import importlib

from ge_core.hookspecs import RegisterCliCommand, hookimpl

#: (command, module of ge_tools, the suffix of its configure/run functions, help)
_COMMANDS = (
    ("compile", "commands", "_compile", "compile a model file to an .om"),
    ("run", "commands", "_run", "run an .om on inputs (random ones if none are given)"),
    ("inspect", "commands", "_inspect", "describe an .om file"),
    ("passes", "passes", "", "print the resolved pass pipeline"),
    ("bench", "bench", "", "time a model (.om, or a source model compiled first): warm-up, latency percentiles, "
                           "throughput, the cold first run apart; optionally beside onnxruntime"),
    ("compare", "compare", "", "check a model's outputs against a reference (onnxruntime, onnx.reference, or the "
                               "source's own framework: tensorflow, torch); "
                               "--per-node names the first diverging node, --bisect-passes the first diverging pass; "
                               "--origin FLOAT.onnx compares a quantised model with its float origin (SQNR per layer)"),
    ("export", "export", "", "write a compiled .om as ONNX (fused ops in the custom domain ge.fused) for Netron"),
    ("serve", "serving.cli", "", "serve .om models over the Open Inference Protocol (KServe v2: REST, optionally "
                                "gRPC) with dynamic batching, metrics and auth; on KServe's ModelServer"),
)


def _command(module: str, suffix: str):
    """``configure`` and ``run`` that import ``ge_tools.<module>`` only when the command is used."""

    def configure(p: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(f"ge_tools.{module}"), "configure" + suffix)(p)

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"ge_tools.{module}"), "run" + suffix)(args)

    return configure, run


@hookimpl
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    for name, module, suffix, help_text in _COMMANDS:
        register(name, help_text, *_command(module, suffix))
