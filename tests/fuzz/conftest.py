"""Print the figures of every fuzz target run by the suite (cases, outcomes, time) at the end."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # fuzz_engine, fuzz_targets


def pytest_terminal_summary(terminalreporter):
    rows = []
    for rep in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for key, value in getattr(rep, "user_properties", []):
            if key == "fuzz_figures":
                rows.append(json.loads(value))
    if not rows:
        return
    terminalreporter.section("fuzz figures")
    for s in sorted(rows, key=lambda s: s["target"]):
        outcomes = ", ".join(f"{k} {v}" for k, v in s["outcomes"].items())
        deep = ", ".join(f"{k} {v}" for k, v in (s.get("deep") or {}).items())
        terminalreporter.write_line(
            f"{s['target']:>10}: {s['cases']} cases, {s['seconds']} s, {len(s['crashes'])} crashes; {outcomes}"
            + (f"; further: {deep}" if deep else "")
        )
