"""ONNX's node conformance cases (``onnx.backend.test.case.node``) through ``ge_onnx.backend``.

Every case is compiled once and run on each of its data sets; the set of failing cases must be
exactly the one listed in ``expected_failures.txt`` (``case_name: reason``): a newly failing
case fails the test, and so does a listed case that now passes (remove it from the list, so the
list only shrinks). Regenerate the list with ``python tests/conformance/runner.py --write``.
The cases are split into shards so that ``pytest -n`` spreads them over workers.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import runner  # noqa: E402

SHARDS = 8
#: The issue's bar: at least this share of ONNX's node cases pass.
MIN_PASS_RATE = 0.97


@pytest.fixture(scope="module")
def host():
    from ge_core import plugins

    old = plugins.reset_host(plugins.PluginHost())
    try:
        yield plugins.get_host()
    finally:
        plugins.reset_host(old)


def test_expected_failures_file_is_consistent():
    expected = runner.read_expected()
    names = {c.name for c in runner.cases()}
    stale = sorted(set(expected) - names)
    assert not stale, f"expected_failures.txt lists cases ONNX does not have: {stale}"
    assert all(expected.values()), "every expected failure needs a reason"
    passed = len(names) - len(expected)
    assert passed / len(names) >= MIN_PASS_RATE, f"{passed}/{len(names)} expected to pass, below {MIN_PASS_RATE:.0%}"


@pytest.mark.parametrize("shard", range(SHARDS))
def test_node_cases(host, shard):
    cases = runner.cases()[shard::SHARDS]
    expected = runner.read_expected()
    expected.update(runner.environment_failures())
    failing: dict[str, str] = {}
    for case in cases:
        reason = runner.run_case(case)
        if reason is not None:
            failing[case.name] = reason
    mine = {c.name for c in cases}
    want = {n for n in expected if n in mine}
    new = sorted(set(failing) - want)
    # random ops may match the reference by chance: they are allowed to pass
    fixed = sorted(n for n in want - set(failing) if not expected[n].startswith("random op"))
    msg = []
    if new:
        msg.append("newly failing (fix them, or list them with their reason in expected_failures.txt):\n  "
                   + "\n  ".join(f"{n}: {failing[n]}" for n in new))
    if fixed:
        msg.append("listed in expected_failures.txt but now passing (remove them):\n  " + "\n  ".join(fixed))
    assert not msg, "\n".join(msg)
