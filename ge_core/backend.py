"""The backend interface: turn a compiled graph into something that runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .options import CompileOptions

if TYPE_CHECKING:
    from .plugins import Registries


@dataclass(frozen=True)
class BuildContext:
    """What :meth:`Backend.build` is given beside the model and its kernels: the model's compile
    (or run) options and the registries of the host that compiled or loaded it."""

    options: CompileOptions
    registries: Registries


class Executable:
    """What a backend builds: runs the model on a dict of inputs."""

    #: Kernel launches one inference makes (the report's ``kernels``).
    kernel_count: int = 0
    #: How the backend's generated kernels were made, e.g. ``{"loop": 3, "numpy": 2}`` (the
    #: report's ``kernel_modes``); empty when it generates none.
    kernel_modes: dict[str, int] = {}
    #: node name -> ``{"op", "algorithm", "variant"}`` for every node whose kernel names an
    #: algorithm or an instruction-set variant (the report's ``node_kernels``)
    node_kernels: dict[str, dict[str, str]] = {}

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:  # pragma: no cover
        """Outputs in graph output order; feeds are already checked by the caller."""
        raise NotImplementedError


class Backend:
    """Base class of backends, registered through ``ge_register_backends``.

    ``name`` is what ``soc_version`` selects; ``aliases`` are other accepted spellings.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()

    def build(self, model: Any, kernels: Mapping[tuple[str, str], Any], context: BuildContext) -> Executable:
        """Build an :class:`Executable` for a :class:`ge_core.model.CompiledModel`.

        ``kernels`` maps ``(domain, op_type)`` to kernel factories registered for this backend;
        ``context`` holds the options (``context.options.getoption(name)``) and the registries.
        Raise :class:`ge_core.errors.UnsupportedOpError` naming every node without a kernel.
        """
        raise NotImplementedError  # pragma: no cover

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "aliases": list(self.aliases)}

