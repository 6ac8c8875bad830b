"""What the user's cache (ge_core.cache) may spare a later load of an .om: the type check of a
model whose bytes it verified before, and nothing for any other bytes."""

from __future__ import annotations

import numpy as np
import pytest

import ge_core as ge
from ge_core import TensorType, om
from ge_core import cache as ge_cache
from ge_core.plugins import get_host


def reshape_model(shape=(4, 2), scale=None) -> ge.Graph:
    g = ge.Graph("reshape")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType("float32", (2, 4)))
    s = g.add_constant(np.array(shape, np.int64), name="shape")
    y = g.add_node("Reshape", [x, s], name="r").output
    w = g.add_constant(np.full((4, 2), 0.5 if scale is None else scale, np.float32), name="w")
    g.set_outputs([g.add_node("Mul", [y, w], name="m").output])
    return g


@pytest.fixture
def counted(tmp_path, monkeypatch):
    monkeypatch.setenv("GE_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = om.type_conflict

    def spy(graph, ops):
        calls.append(graph.name)
        return real(graph, ops)

    monkeypatch.setattr(om, "type_conflict", spy)
    return calls


def test_a_load_of_bytes_verified_before_skips_the_type_check(tmp_path, counted, monkeypatch):
    model = ge.compile(reshape_model(), {"constant_folding": False})
    path = model.save(str(tmp_path / "m.om"))
    assert len(counted) == 1  # save checks the types (the loader would refuse a wrong one)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    first = ge.load_om(path).run({"x": x})
    again = ge.load_om(path).run({"x": x})
    assert len(counted) == 1  # both loads use the verdict save recorded for these bytes
    want = next(iter(model.run({"x": x}).values()))
    np.testing.assert_array_equal(next(iter(first.values())), want)
    np.testing.assert_array_equal(next(iter(again.values())), want)
    monkeypatch.setenv("GE_CACHE_DIR", str(tmp_path / "other-cache"))  # another machine: no verdict
    ge.load_om(path)
    assert len(counted) == 2


def test_other_bytes_are_checked_again(tmp_path, counted):
    a = ge.compile(reshape_model(), {"constant_folding": False}).save(str(tmp_path / "a.om"))
    b = ge.compile(reshape_model(scale=2.0), {"constant_folding": False}).save(str(tmp_path / "b.om"))
    before = len(counted)
    d = tmp_path / "cache" / f"v{ge_cache.FORMAT}"  # the saves recorded a's and b's verdicts apart
    assert len(list(d.glob("omtypes_*.dat"))) == 2
    ge.load_om(a)
    ge.load_om(b)
    assert len(counted) == before


def test_the_key_covers_shape_constants_and_the_plugins_but_not_weight_values():
    host = get_host()
    view = memoryview(b"definition")
    base = om.types_verdict_key(view, reshape_model(), host)
    assert om.types_verdict_key(view, reshape_model(), host) == base
    assert om.types_verdict_key(view, reshape_model(shape=(8, 1)), host) != base  # values steer inference
    assert om.types_verdict_key(memoryview(b"definitioN"), reshape_model(), host) != base
    # a float weight reaches inference only through its dtype and shape (both in the definition)
    big = reshape_model(scale=3.0)
    assert om.types_verdict_key(view, big, host) != base  # (4, 2) = 8 elements: small, hashed too
    info = next(iter(host.info.values()))
    old = info.version
    try:
        info.version = "0.0.0-other"
        assert om.types_verdict_key(view, reshape_model(), host) != base
    finally:
        info.version = old


def test_a_damaged_verdict_entry_is_not_believed(tmp_path, counted):
    path = ge.compile(reshape_model(), {"constant_folding": False}).save(str(tmp_path / "m.om"))
    d = tmp_path / "cache" / f"v{ge_cache.FORMAT}"
    entry = next(d.glob("omtypes_*.dat"))
    entry.write_bytes(b"types agree with inference\n ")  # its sum no longer matches
    ge.load_om(path)
    assert len(counted) == 2


def test_a_model_that_fails_the_check_is_never_recorded(tmp_path, counted, monkeypatch):
    path = ge.compile(reshape_model(), {"constant_folding": False}).save(str(tmp_path / "m.om"))
    monkeypatch.setenv("GE_CACHE_DIR", str(tmp_path / "fresh"))  # no verdict recorded by the save
    monkeypatch.setattr(om, "type_conflict", lambda graph, ops: counted.append(1) or "output 'm' is wrong")
    for _ in range(2):
        with pytest.raises(ge.OmFormatError, match="output 'm' is wrong"):
            ge.load_om(path)
    assert len(counted) == 3
    assert not list((tmp_path / "fresh" / f"v{ge_cache.FORMAT}").glob("omtypes_*.dat"))
