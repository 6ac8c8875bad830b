"""What the cpu executors do with values: describe one in an error message, hand one to the caller."""

from __future__ import annotations

from typing import Any

import numpy as np


def describe_value(v: Any) -> str:
    """A value as error messages show it: ``float32[2, 3]``, ``seq[4]`` or ``None``."""
    if v is None:
        return "None"
    if isinstance(v, list):
        return f"seq[{len(v)}]"
    return f"{getattr(v, 'dtype', '?')}{list(getattr(v, 'shape', ()))}"


def as_output(v: Any, arena: np.ndarray | None = None) -> Any:
    """A run's output as the caller keeps it: an array (a NumPy scalar becomes a 0-d array), a
    sequence (list) or None; a copy when it lies in ``arena``, which the next run overwrites."""
    if v is None or isinstance(v, list):
        return v
    if arena is None:
        return v if isinstance(v, np.ndarray) else np.asarray(v)
    a = np.asarray(v)
    return a.copy() if np.may_share_memory(a, arena) else a
