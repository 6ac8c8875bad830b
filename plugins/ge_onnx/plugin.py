"""Hook implementations of the ge_onnx plugin."""

from __future__ import annotations

from ge_core.hookspecs import RegisterFrontend, hookimpl
from ge_core.writes import COMPANIONS

from .external import external_data_files

#: a command reading an ONNX model never writes over the external data it names
COMPANIONS[".onnx"] = external_data_files


@hookimpl
def ge_register_frontends(register: RegisterFrontend) -> None:
    from .frontend import OnnxFrontend

    register(OnnxFrontend())
