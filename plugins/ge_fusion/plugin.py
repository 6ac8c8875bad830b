"""Hook implementations of the ge_fusion plugin."""

from __future__ import annotations

from ge_core.hookspecs import hookimpl


@hookimpl
def ge_register_passes(register):
    """Pattern fusion and automatic fusion, stage "fuse"."""
    from .passes import AutoFusion, PatternFusion

    register(PatternFusion())
    register(AutoFusion())


@hookimpl
def ge_register_fusion_patterns(register):
    """Every built-in pattern by name (the fusion switch file turns each off)."""
    from .rules import RULES

    for name, rule in RULES.items():
        register(name, rule)


@hookimpl
def ge_register_ops(register):
    """The fused ops (domain ge.fused) with their inference."""
    from .ops import OPDEFS

    for d in OPDEFS:
        register(d)


@hookimpl
def ge_register_kernels(register):
    """CPU kernels of every fused op."""
    from .kernels import KERNELS
    from .ops import DOMAIN

    for op_type, factory in KERNELS.items():
        register(op_type, factory, domain=DOMAIN, backend="cpu")


@hookimpl
def ge_register_options(register):
    """The reader of ATC's ``fusion_switch_file`` option (GE's JSON switch format)."""
    from .switches import read_switch_option

    register("fusion_switch_file", read=read_switch_option)
