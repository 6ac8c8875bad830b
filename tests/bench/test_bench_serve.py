"""bench/serve.py: its targets line on known numbers, and ``--quick`` end to end (a tiny MLP through
``ge serve`` with and without batching and onnxruntime behind the same server, a real client at
concurrency 1, 4, 16; every server stopped by SIGTERM exits 0). Keeps the bench working."""

import importlib.util
import os
import re

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "serve.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ge_bench_serve", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs(table: dict) -> dict:
    return {"runs": {e: {c: {"rps": v, "p50": 1.0, "p99": 2.0} for c, v in cs.items()} for e, cs in table.items()},
            "diff": {}, "errors": {}}


def test_targets_line(bench):
    good = _runs({"ge batch": {1: 10.0, 16: 14.0}, "ort": {1: 11.0, 16: 12.0}})
    assert bench.targets({"resnet50": good}).startswith("targets [resnet50]: ALL MET")
    flat = _runs({"ge batch": {1: 10.0, 16: 12.0}, "ort": {1: 11.0, 16: 12.5}})
    line = bench.targets({"resnet50": flat})
    assert "ge batch c16 >= 1.3x c1: NO (1.20x)" in line and "ge batch c16 >= ort c16: NO (0.96x)" in line
    missing = _runs({"ge batch": {1: 10.0, 16: 14.0}})
    assert "ge batch c16 >= ort c16: NO (missing)" in bench.targets({"resnet50": missing})
    assert bench.targets({"bert": good}) == "targets: n/a (resnet50 not run)"


def test_quick_end_to_end(bench, capsys):
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out, out
    for engine in bench.ENGINES:
        for c in bench.CONCURRENCY:
            assert re.search(rf"^  {engine:9s} {c:4d} +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d +(\d+\.\d\d|-)$", out, re.M), (engine, c, out)
    diffs = dict(re.findall(r"(ge batch|ge|ort) (\d\.\de[-+]\d\d)", out.split("in-process")[1].split("\n")[0]))
    assert set(diffs) == set(bench.ENGINES) and all(float(d) < 1e-5 for d in diffs.values()), out
    assert "c16/c1 throughput: ge batch" in out and "batching on/off (ge batch / ge): c1" in out
    assert "servers stopped (SIGTERM): ge batch exit 0, ge exit 0, ort exit 0" in out
    assert "targets: n/a (resnet50 not run)" in out
