"""Hook implementations of the ge_tensorflow plugin.

Importing this module (what ``ge plugins`` does) imports neither TensorFlow nor the mapper
modules' heavy dependencies: TensorFlow is imported when a TensorFlow model is loaded.
"""

from __future__ import annotations

from ge_core.hookspecs import RegisterFrontend, RegisterOpMapper, hookimpl


@hookimpl
def ge_register_frontends(register: RegisterFrontend) -> None:
    from .frontend import TensorFlowFrontend

    register(TensorFlowFrontend())


@hookimpl
def ge_register_op_mappers(register: RegisterOpMapper) -> None:
    from . import control_flow  # noqa: F401  (registers its mappers into MAPPERS)
    from .convert import FRAMEWORK
    from .mappers import MAPPERS

    for op_type, fn in sorted(MAPPERS.items()):
        register(FRAMEWORK, op_type, fn)
