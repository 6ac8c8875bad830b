"""Hook implementations of the ``ge_tools`` plugin: the ``bench``, ``compare`` and ``export`` commands."""

from __future__ import annotations

import argparse
import importlib

from ge_core.hookspecs import hookimpl

_COMMANDS = (
    ("bench", "time a model (.om, or a source model compiled first): warm-up, latency percentiles, "
              "throughput, the cold first run apart; optionally beside onnxruntime"),
    ("compare", "check a model's outputs against a reference (onnxruntime, onnx.reference, or the source's "
                "own framework: tensorflow, torch); "
                "--per-node names the first diverging node, --bisect-passes the first diverging pass"),
    ("export", "write a compiled .om as ONNX (fused ops in the custom domain ge.fused) for Netron"),
)


def _command(name: str):
    def configure(p: argparse.ArgumentParser) -> None:
        importlib.import_module(f"ge_tools.{name}").configure(p)

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(f"ge_tools.{name}").run(args)

    return configure, run


@hookimpl
def ge_register_cli_commands(register):
    for name, help_text in _COMMANDS:
        register(name, help_text, *_command(name))
