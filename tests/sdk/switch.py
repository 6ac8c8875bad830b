"""Running a probe script in a fresh process with ``GE_NATIVE_BF16`` set (or unset): the switch is
read when a native module is first built and used, so each setting needs its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def probe(script: str, value: str | None) -> dict:
    """The JSON ``script`` prints last, run with ``GE_NATIVE_BF16=value`` (None: unset)."""
    env = dict(os.environ)
    env.pop("GE_NATIVE_BF16", None)
    if value is not None:
        env["GE_NATIVE_BF16"] = value
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
