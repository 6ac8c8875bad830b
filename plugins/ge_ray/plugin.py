"""Hook implementations of the ``ge_ray`` plugin: the ``serve-ray`` command (Ray and
``ge_ray.cli`` are imported only when it runs, so ``ge --help`` stays cheap without Ray)."""

from __future__ import annotations

import argparse
import importlib

from ge_core.hookspecs import RegisterCliCommand, hookimpl


def _configure(p: argparse.ArgumentParser) -> None:
    importlib.import_module("ge_ray.cli").configure(p)


def _run(args: argparse.Namespace) -> int:
    return importlib.import_module("ge_ray.cli").run(args)


@hookimpl
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    register("serve-ray", "serve .om models over the Open Inference Protocol (KServe v2) on Ray Serve, with "
             "replicas autoscaled on queue length (a local Ray, or --address of a cluster)", _configure, _run)
