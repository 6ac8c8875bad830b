"""numba for plugins' compiled loops, with an off switch.

Plugins that compile loops with numba (ge_fusion's fused groups, the cpu backend's window
loops) keep a NumPy path for when numba is missing and give users an environment
variable to turn the loops off. :func:`numba_if_enabled` is that decision, in one place.
"""

from __future__ import annotations

import os
from typing import Any

_OFF = ("0", "false", "off", "no")
_state: dict[str, Any] = {}


def enabled(switch: str) -> bool:
    """False when the environment variable ``switch`` is 0/false/off/no."""
    return os.environ.get(switch, "1").strip().lower() not in _OFF


def numba_if_enabled(switch: str) -> Any:
    """The numba module, or None when the environment variable ``switch`` is 0/false/off/no or
    numba does not import (the import is tried once per process)."""
    if not enabled(switch):
        return None
    if "numba" not in _state:
        mod: Any = None
        try:
            import numba

            mod = numba
        except Exception:  # noqa: BLE001 - any import failure means: no compiled loops
            pass
        _state["numba"] = mod
    return _state["numba"]
