"""Hook implementations of the ge_fusion plugin."""

from __future__ import annotations

from ge_core.hookspecs import RegisterFusionPattern, RegisterOp, RegisterOption, RegisterPass, hookimpl


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    """Pattern fusion and automatic fusion, stage "fuse"."""
    from .passes import AutoFusion, PatternFusion

    register(PatternFusion())
    register(AutoFusion())


@hookimpl
def ge_register_fusion_patterns(register: RegisterFusionPattern) -> None:
    """Every built-in pattern by name (the fusion switch file turns each off)."""
    from .rules import RULES

    for name, rule in RULES.items():
        register(name, rule)


@hookimpl
def ge_register_ops(register: RegisterOp) -> None:
    """The fused ops (domain ge.fused) with their inference and standard ONNX forms."""
    from .lower import LOWERINGS
    from .ops import OPDEFS

    for d in OPDEFS:
        d.lower = d.lower or LOWERINGS.get(d.op_type)
        register(d)


@hookimpl
def ge_register_options(register: RegisterOption) -> None:
    """The reader of ATC's ``fusion_switch_file`` option (GE's JSON switch format)."""
    from .switches import SWITCHES, check_switches, read_switch_option

    register("fusion_switch_file", read=read_switch_option)
    register(SWITCHES, {}, "fusion switches: pattern or pass name -> true/false, \"ALL\" the default (what "
             "fusion_switch_file gives)", read=check_switches)
