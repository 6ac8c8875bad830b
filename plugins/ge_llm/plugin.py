"""Hook implementations of the ``ge_llm`` plugin: the contrib ops' definitions (type and shape
inference), its passes and its command."""

from __future__ import annotations

import importlib

from ge_core.hookspecs import RegisterCliCommand, RegisterOp, hookimpl

#: the modules of this package that declare ops (each has ``OPDEFS``)
OP_MODULES = ("norms", "attention", "nbits")


@hookimpl
def ge_register_ops(register: RegisterOp) -> None:
    for module in OP_MODULES:
        for d in importlib.import_module(f"{__package__}.{module}").OPDEFS:
            register(d)


@hookimpl
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    def configure(p) -> None:
        importlib.import_module(f"{__package__}.generate").configure(p)

    def run(args) -> int:
        return importlib.import_module(f"{__package__}.generate").run(args)

    register("generate", "generate tokens with a compiled decoder (prompt as token ids; greedy or sampled): "
                         "time to first token, ms/token, tokens/s; --bench times prefill and decode", configure, run)
