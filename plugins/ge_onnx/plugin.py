"""Hook implementations of the ge_onnx plugin."""

from __future__ import annotations

from ge_core.hookspecs import RegisterFrontend, hookimpl


@hookimpl
def ge_register_frontends(register: RegisterFrontend) -> None:
    from .frontend import OnnxFrontend

    register(OnnxFrontend())
