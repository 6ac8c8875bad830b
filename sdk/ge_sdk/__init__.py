"""The plugin author's kit.

* :class:`Plugin` — register passes, pass instruments, ops with kernels, rewrite rules, mappers,
  allocators, planners, options, commands and observers with decorators (:mod:`ge_sdk.kit`);
* :class:`Pass`, :class:`PassContext`, :class:`PassResult`, :class:`PassInstrument` — the pass
  API (from :mod:`ge_core.passes`);
* :mod:`ge_sdk.rewrite` — the rewrite engine: patterns (:class:`Op`, :class:`Var`,
  :class:`Const`, ...), declarative :class:`Rule` and imperative :class:`OpRule` rules,
  composable :class:`RuleSet`, :func:`explain`, and one worklist driver (``rewrite``,
  :class:`RewritePass`) that reaches every subgraph (``ge_sdk.patterns`` is its older name);
* :mod:`ge_sdk.bases` — base classes for stream allocators, memory planners and op mappers;
* :mod:`ge_sdk.testing` and the pytest plugin — graph builders and semantic checks for tests.
"""

from typing import TYPE_CHECKING, Any

#: public name -> the module it comes from; imported on first use (PEP 562), so that importing
#: a submodule (the pytest plugin) does not import the whole kit
_EXPORTS = {
    "Pass": "ge_core.passes", "PassContext": "ge_core.passes", "PassResult": "ge_core.passes",
    "PassInstrument": "ge_core.passes", "graph_pass": "ge_core.passes",
    "MemoryPlanner": "ge_sdk.bases", "OpMapper": "ge_sdk.bases", "StreamAllocator": "ge_sdk.bases",
    "Plugin": "ge_sdk.kit", "broadcast_inputs": "ge_sdk.kit", "same_as_input": "ge_sdk.kit", "simple_kernel": "ge_sdk.kit",
    **{n: "ge_sdk.rewrite" for n in ("Alt", "AnyOf", "Const", "Match", "Op", "OpRule", "Optional", "Repeat", "RewritePass",
                                     "Rewriter", "Rule", "RulePass", "RuleSet", "Var", "apply_rules", "explain")},
    **{n: "ge_sdk.testing" for n in ("GraphBuilder", "assert_pass_preserves_semantics", "run_pass", "temporary_plugin")},
}


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'ge_sdk' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from ge_core.passes import Pass, PassContext, PassInstrument, PassResult, graph_pass

    from .bases import MemoryPlanner, OpMapper, StreamAllocator
    from .kit import Plugin, broadcast_inputs, same_as_input, simple_kernel
    from .rewrite import (
        Alt,
        AnyOf,
        Const,
        Match,
        Op,
        OpRule,
        Optional,
        Repeat,
        RewritePass,
        Rewriter,
        Rule,
        RulePass,
        RuleSet,
        Var,
        apply_rules,
        explain,
    )
    from .testing import GraphBuilder, assert_pass_preserves_semantics, run_pass, temporary_plugin

__all__ = [
    "Plugin", "Pass", "PassContext", "PassResult", "PassInstrument", "graph_pass", "same_as_input", "broadcast_inputs", "simple_kernel",
    "StreamAllocator", "MemoryPlanner", "OpMapper",
    "Op", "Var", "Const", "Alt", "Optional", "Repeat", "Rule", "AnyOf", "OpRule", "RuleSet", "Match", "Rewriter",
    "RewritePass", "RulePass", "apply_rules", "explain", "GraphBuilder", "temporary_plugin", "run_pass", "assert_pass_preserves_semantics",
]
