"""Hook implementations of the ``ge_atc`` plugin: the ``ge atc`` sub-command (the same as ``atc``)."""

import argparse

from ge_core.hookspecs import hookimpl


def _configure(p: argparse.ArgumentParser) -> None:
    from .cli import add_atc_arguments

    add_atc_arguments(p)


def _run(args: argparse.Namespace) -> int:
    from .cli import run

    return run(args)


@hookimpl
def ge_register_cli_commands(register):
    register("atc", "compile or inspect a model with ATC's flags (the same as the `atc` command)", _configure, _run)
