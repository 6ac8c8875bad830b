"""The frontend interface: turn a model file or object into a :class:`Graph`."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from .ir.graph import Graph


class Frontend:
    """Base class of model frontends, registered through ``ge_register_frontends``.

    ``name`` is the framework name (``"onnx"``); ``framework_ids`` the ATC ``--framework``
    numbers it answers to; ``suffixes`` the file suffixes it reads.
    """

    name: ClassVar[str] = ""
    framework_ids: ClassVar[tuple[int, ...]] = ()
    suffixes: ClassVar[tuple[str, ...]] = ()

    def accepts_object(self, obj: Any) -> bool:
        """True if ``obj`` (not a path) is an in-memory model this frontend reads."""
        return False

    def sniff(self, path: str, head: bytes) -> bool:
        """True if the file at ``path`` whose first bytes are ``head`` looks like this format."""
        return os.path.splitext(path)[1].lower() in self.suffixes

    def load(self, source: Any, options) -> Graph:  # pragma: no cover - interface
        """Read ``source`` (a path or an object) with :class:`CompileOptions` ``options``."""
        raise NotImplementedError

    def export(self, graph: Graph, path: str | None = None) -> Any:
        """Optional: write ``graph`` back in this format (returns the model object)."""
        raise NotImplementedError(f"frontend '{self.name}' has no exporter")
