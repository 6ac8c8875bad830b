"""The fusion passes (stage ``fuse``): the named patterns, then automatic fusion.

The patterns are applied by the SDK's rewrite driver, so they reach every If branch and
Loop/Scan body (at any depth) exactly as they apply at the top level."""

from __future__ import annotations

from ge_core.ir.graph import Graph
from ge_core.passes import Pass, PassContext
from ge_sdk.rewrite import OpRule, Rule, RuleSet, rewrite

from .autofuse import auto_fuse
from .rules import RULE_SETS, RULES

#: The switch-file name of automatic fusion (GE's UBFusion section turns it off like a pattern).
AUTO_FUSION = "auto_fusion"


class PatternFusion(Pass):
    """Apply the built-in fusion patterns phase by phase, then those other plugins registered."""

    name = "pattern_fusion"
    stage = "fuse"
    opt_level = 1
    description = "BN/Mul/Add/Pad/Transpose folds, GELU/SiLU/LayerNorm/RMSNorm/Softmax/attention, Conv/MatMul epilogues"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        enabled = getattr(ctx.options, "pass_enabled_by_switch", None)
        ops = ctx.registries.ops if ctx.registries is not None else None
        stats = ctx.stats.setdefault("rewrites", {})
        changed = False
        for rules in RULE_SETS:
            changed |= rewrite(graph, rules, ctx=ctx, ops=ops, enabled=enabled, stats=stats).changed
        registry = getattr(ctx.registries, "fusion_patterns", None)
        if registry is not None:
            others = RuleSet([r for name, r in registry.items() if name not in RULES and isinstance(r, (Rule, OpRule))],
                             name="registered")
            if len(others):
                changed |= rewrite(graph, others, ctx=ctx, ops=ops, enabled=enabled, stats=stats).changed
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
