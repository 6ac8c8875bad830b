"""Architecture rules kept by tools: import-linter contracts and ruff."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _tool(name):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        path = shutil.which(name)
    assert path, f"{name} is a dev dependency; install the project with [dev]"
    return path


def test_import_contracts_are_kept():
    r = subprocess.run([_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "broken" not in r.stdout.split("Contracts:")[-1] or "0 broken" in r.stdout


@pytest.mark.parametrize("target", ["ge_core", "sdk", "plugins", "tests", "bench"])
def test_ruff_clean(target):
    r = subprocess.run([_tool("ruff"), "check", "--quiet", target], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


def test_core_does_not_import_onnx_at_runtime():
    code = "import sys, ge_core; ge_core.get_host; assert 'onnx' not in sys.modules, [m for m in sys.modules if 'onnx' in m]"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_type_checker_passes():
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
