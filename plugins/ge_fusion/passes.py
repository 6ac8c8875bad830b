"""The fusion passes (stage ``fuse``): the named patterns, then automatic fusion."""

from __future__ import annotations

from ge_core.ir.graph import Graph
from ge_core.passes import Pass, PassContext
from ge_sdk.patterns import Rule, apply_rules

from .autofuse import auto_fuse
from .rules import PHASES, RULES

#: The switch-file name of automatic fusion (GE's UBFusion section turns it off like a pattern).
AUTO_FUSION = "auto_fusion"


class PatternFusion(Pass):
    """Apply the built-in fusion patterns phase by phase, then those other plugins registered."""

    name = "pattern_fusion"
    stage = "fuse"
    opt_level = 1
    description = "BN/Mul/Add/Pad/Transpose folds, GELU/SiLU/LayerNorm/Softmax/attention, Conv/MatMul epilogues"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        enabled = getattr(ctx.options, "pass_enabled_by_switch", None)
        ops = ctx.registries.ops if ctx.registries is not None else None
        stats = ctx.stats.setdefault("rewrites", {})
        changed = False
        for _, rules in PHASES:
            changed |= apply_rules(graph, rules, ops=ops, enabled=enabled, stats=stats)
        others: list[Rule] = []
        registry = getattr(ctx.registries, "fusion_patterns", None)
        if registry is not None:
            others = [r for name, r in registry.items() if name not in RULES and isinstance(r, Rule)]
        if others:
            changed |= apply_rules(graph, others, ops=ops, enabled=enabled, stats=stats)
        return changed


class AutoFusion(Pass):
    """Fuse maximal elementwise/broadcast groups (and their Conv/MatMul producers) into
    generated kernels."""

    name = "auto_fusion"
    stage = "fuse"
    opt_level = 1
    after = ("pattern_fusion",)
    params = {"max_group_size": 32}
    description = "fuse elementwise/broadcast groups by op kind into generated kernels (numexpr / NumPy)"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        enabled = getattr(ctx.options, "pass_enabled_by_switch", None)
        if enabled is not None and not enabled(AUTO_FUSION):
            return False
        size = int(ctx.params.get("max_group_size", self.params["max_group_size"]))
        made = auto_fuse(graph, ctx.registries.ops if ctx.registries is not None else None, max(1, size))
        ctx.stats["fused_groups"] = made
        return made > 0
