"""The pytest plugin of the SDK (entry point ``pytest11``: ``ge_sdk``), for plugin authors' tests.

Fixtures:

* ``ge_plugin(obj, name=None)`` — register a plugin (module, class, object or
  :class:`ge_sdk.Plugin`) in-process for the current test; it is removed afterwards;
* ``graph_builder(name="g", opset=17)`` — a new :class:`ge_sdk.testing.GraphBuilder`;
* ``run_pass(pass_or_name, graph, ...)`` — run one pass on a copy, returns ``(graph, changed)``;
* ``assert_pass_preserves_semantics(pass_or_name, graph, ...)`` — random inputs, outputs before
  and after the pass compared on the cpu backend and, when it can run the graph, onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def ge_plugin() -> Iterator[Callable[..., str]]:
    """Register plugins for one test: ``name = ge_plugin(MyPlugin())``."""
    from ge_core.plugins import get_host

    registered: list[tuple[Any, str]] = []

    def register(obj: Any, name: str | None = None) -> str:
        host = get_host()
        pname = host.register_plugin(obj, name or getattr(obj, "name", None) or None)
        registered.append((host, pname))
        return pname

    yield register
    for host, pname in reversed(registered):
        host.unregister_plugin(pname)


@pytest.fixture
def graph_builder() -> Callable[..., Any]:
    """A factory of :class:`ge_sdk.testing.GraphBuilder`."""
    from .testing import GraphBuilder

    return GraphBuilder


@pytest.fixture
def run_pass() -> Callable[..., Any]:
    """:func:`ge_sdk.testing.run_pass`."""
    from .testing import run_pass as fn

    return fn


@pytest.fixture
def assert_pass_preserves_semantics() -> Callable[..., Any]:
    """:func:`ge_sdk.testing.assert_pass_preserves_semantics`."""
    from .testing import assert_pass_preserves_semantics as fn

    return fn
