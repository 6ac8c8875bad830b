"""The plugin author's kit.

* :class:`Plugin` — register passes, ops with kernels, rewrite rules, mappers, allocators,
  planners, options, commands and observers with decorators (:mod:`ge_sdk.kit`);
* :mod:`ge_sdk.patterns` — the pattern language for rewrites (:class:`Op`, :class:`Var`,
  :class:`Const`, :class:`Rule`, :func:`explain`, :class:`RewritePass`);
* :mod:`ge_sdk.bases` — base classes for stream allocators, memory planners and op mappers;
* :mod:`ge_sdk.testing` and the pytest plugin — graph builders and semantic checks for tests.
"""

from ge_core.passes import Pass, PassContext, graph_pass

from .bases import MemoryPlanner, OpMapper, StreamAllocator
from .kit import Plugin, broadcast_inputs, same_as_input, simple_kernel
from .patterns import Alt, Const, Match, Op, Optional, Repeat, RewritePass, Rewriter, Rule, Var, apply_rules, explain
from .testing import GraphBuilder, assert_pass_preserves_semantics, run_pass, temporary_plugin

__all__ = [
    "Plugin", "Pass", "PassContext", "graph_pass", "same_as_input", "broadcast_inputs", "simple_kernel",
    "StreamAllocator", "MemoryPlanner", "OpMapper",
    "Op", "Var", "Const", "Alt", "Optional", "Repeat", "Rule", "Match", "Rewriter", "RewritePass", "apply_rules",
    "explain", "GraphBuilder", "temporary_plugin", "run_pass", "assert_pass_preserves_semantics",
]
