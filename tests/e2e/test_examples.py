"""examples/end_to_end.sh runs as the README says: a fresh environment, pip install of the
example plugin as its own distribution, its pass in a pipeline config, compile, run, draw."""

from __future__ import annotations

import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_end_to_end_example_runs(tmp_path):
    assert (ROOT / ".venv" / "bin" / "python").exists(), "the script reuses this checkout's .venv (scripts/setup.sh)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GE_")}
    r = subprocess.run(["bash", str(ROOT / "examples" / "end_to_end.sh"), str(tmp_path / "work")], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ge_example" in r.stdout and "done:" in r.stdout
    assert (tmp_path / "work" / "after.html").stat().st_size > 0
