"""A deliberately broken reader (``selftest``) that proves the harness reports each kind of
failure."""

from __future__ import annotations

import os
import random
import time
from typing import Any

from fuzz_engine import Target


class SelfTestTarget(Target):
    """A deliberately broken reader (mode from ``GE_FUZZ_SELFTEST``) to prove the harness fails."""

    name = "selftest"
    case_timeout = 1.0

    def warm_up(self) -> None:
        import ge_core  # noqa: F401

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        from ge_core.errors import ModelFileError

        mode = os.environ.get("GE_FUZZ_SELFTEST", "raise")
        ctx["mutation"] = mode
        if index < 3:
            raise ModelFileError("a clean refusal")  # fine
        if mode == "raise":
            missing: dict[str, str] = {}
            return missing["missing"]  # KeyError
        if mode == "alloc":
            import numpy as np

            return str(np.zeros(1 << 40, np.uint8).sum())
        if mode == "wrapped_memory":
            import numpy as np

            try:
                np.ones(1 << 40, np.uint8)
            except MemoryError:
                raise ModelFileError("needs more memory than is available") from None
        if mode == "hang":
            while True:  # until the case's alarm (a real-time timer) ends it
                time.sleep(0.01)
        if mode == "segfault":
            import ctypes

            ctypes.string_at(0)
        return "ok"
