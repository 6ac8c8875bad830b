"""``--optimization_switch="pass:on;pass:off"``: passes switched by name.

Names are this engine's pass names (``ge passes`` lists them) or GE's names of the passes that
correspond (``GE_PASS_NAMES``). ``off`` removes the pass from the pipeline (``disabled_passes``);
``on`` adds a pass the optimisation level or its default leaves out, in its stage, ordered by
its constraints (the stage's pass list in the ``pipeline`` option).
"""

from __future__ import annotations

from typing import Any

from ge_core.errors import OptionError
from ge_core.options import CompileOptions
from ge_core.passes import order_passes, resolve_pipeline
from ge_core.registry import close_matches

#: GE's graph pass names -> this engine's pass doing the same job.
GE_PASS_NAMES = {
    "ConstantFoldingPass": "fold_constants",
    "DimensionComputePass": "fold_shapes",
    "CommonSubexpressionEliminationPass": "cse",
    "ConstantFuseSamePass": "share_constants",
    "PrunePass": "dce",
    "DeadCodeEliminationPass": "dead_branch_elimination",
    "IdentityPass": "eliminate_noops",
    "TransposeTransDataPass": "sink_transposes",
}


def parse_switches(text: str) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, sep, state = part.rpartition(":")
        state = state.strip().lower()
        if not sep or not name.strip() or state not in ("on", "off"):
            raise OptionError(f"optimization_switch entry '{part}' must be pass:on or pass:off",
                              hint='e.g. --optimization_switch="cse:off;distribute_constants:on"')
        out[name.strip()] = state == "on"
    return out


def switch_options(text: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The options (``disabled_passes``, ``pipeline``) that ``text``'s switches give on top of ``opts``."""
    from ge_core.plugins import get_host

    registry = get_host().registries.passes
    switches = {GE_PASS_NAMES.get(k, k): v for k, v in parse_switches(text).items()}
    known = list(registry.keys()) + list(GE_PASS_NAMES)
    for name in switches:
        if name not in registry:
            raise OptionError(f"optimization_switch names '{name}', which is no pass{close_matches(name, known)}",
                              hint="`ge passes` lists this engine's passes")
    options = CompileOptions.from_any({k: v for k, v in opts.items() if k != "config"})
    disabled = list(options.disabled_passes) + [n for n, on in switches.items() if not on]
    options.disabled_passes = disabled
    plans = {s.name: s for s in resolve_pipeline(registry, options)}
    pipeline: dict[str, dict[str, Any]] = {}
    for name, on in switches.items():
        if not on:
            continue
        p = registry.require(name, OptionError)
        plan = plans[p.stage]
        if any(q.name == name for q in plan.passes):
            continue
        stage = pipeline.setdefault(p.stage, {"passes": [q.name for q in plan.passes]})
        stage["passes"] = [q.name for q in order_passes([registry.require(n, OptionError) for n in stage["passes"]] + [p])]
    out: dict[str, Any] = {"disabled_passes": disabled}
    if pipeline:
        out["pipeline"] = pipeline
    return out
