"""Bounded fuzzing of every reader: mutated ONNX models, .om files, pipeline configs and fusion
switch files. Each target runs 2,000 cases in a child process whose address space is capped
(so a hostile size that makes a reader allocate gigabytes fails the case), with a per-case time
limit. Every case must end in a result or a GEError. ``GE_FUZZ_SEED`` picks another seed;
``scripts/fuzz.py`` runs longer campaigns.

For the ONNX target every case is loaded (``ge.load``: bytes, or a file for the external-data
seed and 10% of the others); 40% of the cases that load are compiled and saved as .om.
"""

import json
import os

import pytest
from fuzz_engine import format_stats, run_in_subprocess

SEED = int(os.environ.get("GE_FUZZ_SEED", "0"))
CASES = int(os.environ.get("GE_FUZZ_CASES", "2000"))


@pytest.mark.parametrize("target", ["onnx", "om", "config", "switch"])
def test_fuzz_target(target, record_property, tmp_path):
    stats = run_in_subprocess(target, cases=CASES, seed=SEED, timeout=400, crash_dir=str(tmp_path / "crashes"))
    record_property("fuzz_figures", json.dumps({k: v for k, v in stats.items() if k != "mutations"}))
    assert not stats["crashes"], "\n" + format_stats(stats)
    assert stats["cases"] >= CASES
    # the seeds and mutations reach both ends: some inputs are accepted, most are refused cleanly
    assert stats["outcomes"].get("ok", 0) >= CASES // 50, format_stats(stats)
    assert sum(v for k, v in stats["outcomes"].items() if k != "ok") >= CASES // 2, format_stats(stats)


@pytest.mark.parametrize("mode,kind", [
    ("raise", "exception"),
    ("alloc", "memory"),
    ("hang", "hang"),
    ("segfault", "process"),
    ("wrapped_memory", "memory"),
])
def test_the_harness_reports_each_kind_of_failure(mode, kind, monkeypatch):
    """A reader that raises a non-GEError, allocates from a hostile size, hangs or segfaults is
    reported as a crash: the fuzz tests above can fail."""
    monkeypatch.setenv("GE_FUZZ_SELFTEST", mode)
    stats = run_in_subprocess("selftest", cases=20, timeout=120)
    assert stats["crashes"], stats
    assert stats["crashes"][0]["kind"] == kind, format_stats(stats)
