"""The fusion passes (stage ``fuse``): the named patterns, then automatic fusion.

The patterns are applied by the SDK's rewrite driver, so they reach every If branch and
Loop/Scan body (at any depth) exactly as they apply at the top level."""

from __future__ import annotations

from ge_core.ir.graph import Graph
from ge_core.passes import Pass, PassContext, PassResult
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

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        sets = list(RULE_SETS)
        if ctx.registries is not None:
            others = RuleSet([r for name, r in ctx.registries.fusion_patterns.items()
                              if name not in RULES and isinstance(r, (Rule, OpRule))], name="registered")
            if len(others):
                sets.append(others)
        stats = ctx.stats.setdefault("rewrites", {})
        result = PassResult()
        for rules in sets:
            res = rewrite(graph, rules, ctx=ctx, ops=ctx.ops, enabled=ctx.switch_enabled, stats=stats)
            result.changed |= res.changed
            for name, n in res.rewrites.items():
                result.stats[name] = result.stats.get(name, 0) + n
        return result


class AutoFusion(Pass):
    """Fuse maximal elementwise/broadcast groups (and their Conv/MatMul producers) into
    generated kernels."""

    name = "auto_fusion"
    stage = "fuse"
    opt_level = 1
    after = ("pattern_fusion",)
    params = {"max_group_size": 32}
    description = "fuse elementwise/broadcast groups by op kind into generated kernels (numexpr / NumPy)"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if not ctx.switch_enabled(AUTO_FUSION):
            return PassResult(False)
        size = int(ctx.params.get("max_group_size", self.params["max_group_size"]))
        made = auto_fuse(graph, ctx.ops, max(1, size))
        ctx.stats["fused_groups"] = made
        return PassResult(made > 0, {"fused_groups": made})
