"""Bounded fuzzing of every reader: mutated ONNX models, .om files, pipeline configs, fusion
switch files, frozen TensorFlow GraphDefs, generated-source inputs (fused programs and names
in compiled and source models, with a canary that a payload running as code would create),
.pt2 archives (with a canary that an unpickled payload would create) and .npy feed files. Each
target runs 2,000 cases (the TensorFlow one 1,000: a case goes through TensorFlow's importer and
grappler; the codegen one 1,500; the pt2 one 300: a .pt2 that loads goes through torch's
decompositions) in a child process whose address space is capped (so a hostile size that
makes a reader allocate gigabytes fails the case), with
a per-case time limit. Every case must end in a result or a GEError. ``GE_FUZZ_SEED`` picks
another seed, ``GE_FUZZ_CASES`` another number of cases (for every target); ``scripts/fuzz.py``
runs longer campaigns.

For the ONNX target every case is loaded (``ge.load``: bytes, or a file for the external-data
seed and 10% of the others); 40% of the cases that load are compiled and saved as .om. The
TensorFlow target does the same with .pb files; it is skipped where TensorFlow is not installed,
the pt2 target (30% of the archives that load are compiled and run) where PyTorch is not.
"""

import json
import os

import pytest
from fuzz_engine import format_stats, run_in_subprocess

SEED = int(os.environ.get("GE_FUZZ_SEED", "0"))
#: cases per target; TensorFlow's import and grappler make its cases the slowest: 1,000 take
#: 15 s on 2 idle cores (8 s of them to start TensorFlow and build the seeds), 26 s with both
#: cores busy with other work
#: the codegen target (hostile fused programs and names in .om and .onnx files, with a canary) runs
#: 1,500: 2,000 took 29 s on 2 cores busy with other work
#: the pt2 target runs 300: 400 took 38 s on 2 busy cores, 7 s of them to import torch and export
#: the seeds (a case that loads spends 0.15 s in torch's decompositions); the feeds one 2,000
#: (0.6 s on idle cores, 15 s with both cores busy)
#: the native one (every native kernel entry called directly, issue 42) 2,000: 3,000 took 27 s on 2 busy cores
DEFAULT_CASES = {"onnx": 2000, "om": 2000, "config": 2000, "switch": 2000, "tensorflow": 1000, "codegen": 1500,
                 "pt2": 300, "feeds": 2000, "native": 2000}
#: mutated_files (files changed under a loaded model: load, change in place, run, reload): 1,000
#: cases took 11 s on 2 cores busy with other work, 3.5 s more to start and compile the seeds
DEFAULT_CASES["mutated_files"] = 1500
#: cache (races and damage in the cache folder, issue 42: tests/fuzz/cache_targets.py) 2,000: 3,000
#: took 21 s on 2 cores busy with other work. Its cases all end "ok" (the real kernel, from the
#: cache or rebuilt, or the NumPy form after a warning): a refusal is a rebuild, not a GEError
DEFAULT_CASES["cache"] = 2000
ALL_OK = {"cache"}


def _cases(target: str) -> int:
    return int(os.environ.get("GE_FUZZ_CASES", DEFAULT_CASES[target]))


@pytest.mark.parametrize("target", list(DEFAULT_CASES))
def test_fuzz_target(target, record_property, tmp_path):
    if target == "tensorflow":
        pytest.importorskip("tensorflow", reason="the TensorFlow fuzz target needs the [tensorflow] extra")
    if target == "pt2":
        pytest.importorskip("torch", reason="the pt2 fuzz target needs the [torch] extra")
    cases = _cases(target)
    stats = run_in_subprocess(target, cases=cases, seed=SEED, timeout=400, crash_dir=str(tmp_path / "crashes"))
    record_property("fuzz_figures", json.dumps({k: v for k, v in stats.items() if k != "mutations"}))
    assert not stats["crashes"], "\n" + format_stats(stats)
    assert stats["cases"] >= cases
    # the seeds and mutations reach both ends: some inputs are accepted, most are refused cleanly
    assert stats["outcomes"].get("ok", 0) >= cases // 50, format_stats(stats)
    if target in ALL_OK:  # both ends: entries loaded from the cache, and damaged ones rebuilt
        deep = " ".join(stats["deep"])
        assert "cached" in deep and "compiled" in deep, format_stats(stats)
        return
    assert sum(v for k, v in stats["outcomes"].items() if k != "ok") >= cases // 2, format_stats(stats)


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
