#!/usr/bin/env python
"""Longer fuzzing campaigns of the readers (the test suite runs short ones: tests/fuzz).

    python scripts/fuzz.py                          # every target, 20,000 cases each
                                                    # (tensorflow, pt2 where TensorFlow, PyTorch
                                                    # are installed)
    python scripts/fuzz.py --target onnx --seconds 600 --seed 7
    python scripts/fuzz.py --target om --cases 100000 --crash-dir crashes/
    python scripts/fuzz.py --target onnx --replay 1234 --seed 7   # re-run one case, in process
    python scripts/fuzz.py --target tensorflow --cases 5000 --keep-going  # go on after a dead child

Each target runs in a child process with its address space capped (--mem-limit-mb), so a
hostile size that makes a reader allocate gigabytes is a crash, not a swap storm; a segfault
or a C-level hang is caught from outside. Figures per target: cases, outcomes (ok or the
GEError subclass), GEErrors that wrap an internal exception, crashes with their mutation and
traceback; crash inputs go to --crash-dir. A child that dies (a C++ abort in a framework)
ends the target's campaign there, unless --keep-going restarts it at the next case.
Exit status 1 if any target crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fuzz"))

import fuzz_engine  # noqa: E402

TARGETS = ("onnx", "om", "config", "switch", "tensorflow", "codegen", "pt2", "feeds", "native",
           "mutated_files", "cache")
#: seconds a case may take on average before a --cases campaign counts as hung (default 0.05):
#: a .pt2 that loads goes through torch's decompositions (0.15 s)
SECONDS_PER_CASE = {"pt2": 0.15, "mutated_files": 0.1}  # mutated_files: 20,000 cases took 690 s
#: the framework a target needs: without it, a run of every target leaves the target out
NEEDS = {"tensorflow": "tensorflow", "pt2": "torch"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", choices=TARGETS, help="target(s) to run (default: all)")
    ap.add_argument("--cases", type=int, help="cases per target (default 20000 unless --seconds)")
    ap.add_argument("--seconds", type=float, help="time per target")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="index of the first case")
    ap.add_argument("--mem-limit-mb", type=int, default=fuzz_engine.DEFAULT_MEM_LIMIT >> 20,
                    help="address-space cap of the child (0: none)")
    ap.add_argument("--crash-dir", help="save the input of every crash here")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--keep-going", action="store_true",
                    help="after a child dies, start a new one at the next case (figures are merged)")
    ap.add_argument("--replay", type=int, metavar="INDEX", help="run one case in this process, with its traceback")
    a = ap.parse_args(argv)
    targets = a.target or [t for t in TARGETS if t not in NEEDS or _have(NEEDS[t])]
    if a.replay is not None:
        return _replay(targets[0], a.seed, a.replay)
    cases = a.cases if a.cases is not None or a.seconds is not None else 20000
    results = []
    for t in targets:
        limit = (a.seconds or 0) + 600 if a.seconds else max(600.0, (cases or 0) * SECONDS_PER_CASE.get(t, 0.05))
        kw = dict(seed=a.seed, mem_limit=(a.mem_limit_mb << 20) or None, timeout=limit,
                  crash_dir=os.path.abspath(a.crash_dir) if a.crash_dir else None)
        s = fuzz_engine.run_in_subprocess(t, cases=cases, seconds=a.seconds, start=a.start, **kw)
        if a.keep_going and cases is not None and a.seconds is None:
            s = _keep_going(t, s, cases, a.start, kw)
        results.append(s)
        if not a.json:
            print(fuzz_engine.format_stats(s), flush=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 1 if any(s["crashes"] for s in results) else 0


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _keep_going(name: str, s: dict, cases: int, start: int, kw: dict) -> dict:
    """Restart the campaign after each process crash until ``cases`` cases ran; merged figures."""
    from collections import Counter

    def died(x: dict) -> bool:
        return bool(x["crashes"]) and x["crashes"][-1]["kind"] == "process" and x["crashes"][-1]["index"] >= 0

    while died(s) and s["cases"] < cases:
        nxt = fuzz_engine.run_in_subprocess(name, cases=cases - s["cases"], start=start + s["cases"], **kw)
        s = {
            **nxt,
            "cases": s["cases"] + nxt["cases"],
            "seconds": round((s["seconds"] or 0) + (nxt["seconds"] or 0), 2),
            "outcomes": dict((Counter(s["outcomes"]) + Counter(nxt["outcomes"])).most_common()),
            "deep": dict(Counter(s.get("deep") or {}) + Counter(nxt.get("deep") or {})),
            "mutations": dict(Counter(s.get("mutations") or {}) + Counter(nxt.get("mutations") or {})),
            "crashes": s["crashes"] + nxt["crashes"],
            "wrapped": {**(nxt.get("wrapped") or {}), **(s.get("wrapped") or {})},
            "max_rss_mb": max(s.get("max_rss_mb") or 0, nxt.get("max_rss_mb") or 0),
        }
    return s


def _replay(name: str, seed: int, index: int) -> int:
    import random
    import tempfile
    import traceback

    os.environ.setdefault("GE_DEBUG", "1")
    target = fuzz_engine.get_target(name)
    target.warm_up()  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory() as tmp:
        target.setup(tmp)
        ctx: dict = {"mutation": "", "input": None}
        try:
            label = target.case(random.Random(f"{seed}:{index}"), index, ctx)
            print(f"case {index}: {label}")
        except BaseException as e:  # noqa: BLE001
            traceback.print_exc()
            if e.__cause__ is not None:
                print("caused by:")
                traceback.print_exception(e.__cause__)
        print(f"mutation: {ctx['mutation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
