"""Symbolic dim expressions (ge_core.ir.symbolic): canonical arithmetic, min/max rules that hold
for every symbol >= 1, evaluation, and the bounded JSON an .om stores them in."""

import itertools

import pytest

from ge_core.ir import symbolic as S
from ge_core.ir.symbolic import SymExpr, from_json, norm, to_json
from ge_core.ir.types import TensorType


def test_canonical_form_makes_equal_expressions_equal():
    a = SymExpr.of("batch") * "seq" * 64
    b = SymExpr.of("seq") * 32 * "batch" * 2
    assert a == b and hash(a) == hash(b)
    assert str(a) == "64*batch*seq"
    assert norm(SymExpr.of("seq") + 0) == "seq"          # a lone symbol is its name
    assert norm(SymExpr.of("seq") - "seq" + 7) == 7       # a constant is an int
    assert S.sub("seq", 1) == SymExpr.of("seq") - 1 and str(S.sub("seq", 1)) == "seq - 1"


@pytest.mark.parametrize("seq,batch", list(itertools.product([1, 2, 7, 100, 513, 4096], [1, 3, 16])))
def test_every_operation_evaluates_like_integers(seq, batch):
    b = {"seq": seq, "batch": batch}
    cases = {
        S.mul(S.add("seq", 3), "batch"): (seq + 3) * batch,
        S.dmin("seq", 512): min(seq, 512),
        S.dmax(S.sub("seq", 1), 0): max(seq - 1, 0),
        S.floordiv(S.add("seq", 1), 2): (seq + 1) // 2,
        S.floordiv(S.mul("seq", 6), 3): 2 * seq,
        S.exact_div(S.mul(S.mul("seq", "batch"), 768), S.mul("batch", 12)): seq * 64,
        S.dmax("seq", S.dmin("seq", 512)): seq,
    }
    for e, want in cases.items():
        assert S.evaluate(e, b) == want, e


def test_simplifications_hold_for_symbols_at_least_one():
    assert S.dmax(S.sub("seq", 1), 0) == S.sub("seq", 1)   # seq >= 1
    assert S.dmin(0, "seq") == 0
    assert S.dmax(S.mul("seq", 64), "seq") == S.mul("seq", 64)
    assert S.dmax("seq", S.dmin("seq", 512)) == "seq"     # max(e, min(e, z)) = e
    assert isinstance(S.dmin("seq", 512), SymExpr)          # not provable either way: kept
    assert S.floordiv(S.mul("seq", 4), 2) == S.mul("seq", 2)  # exact division
    assert S.exact_div(S.add("seq", 1), "seq") is None      # not a polynomial: unknown
    assert S.add("seq", None) is None


def test_tensor_type_carries_and_binds_expressions():
    t = TensorType("float32", ("batch", S.mul("seq", 3), S.dmin("seq", 512)))
    assert not t.is_static and t.symbols == {"batch", "seq"}
    assert t.bind({"batch": 2, "seq": 600}).shape == (2, 1800, 512)
    with pytest.raises(KeyError):
        t.bind({"batch": 2})
    assert TensorType("float32", (S.sub(S.add("seq", 2), "seq"),)).shape == (2,)  # constant folds to int


def test_json_round_trip():
    for e in (S.mul(S.mul("batch", "seq"), 64), S.dmin(S.add("seq", 1), 512), S.floordiv(S.add("h", 1), 2),
              S.mul(S.mul("seq", "seq"), 4)):
        assert from_json(to_json(e)) == e


@pytest.mark.parametrize("bad", [
    None, [], {"poly": "x"}, {"poly": [[1]]}, {"poly": [[True, [["s", 1]]]]}, {"poly": [[1, [["s", 0]]]]},
    {"poly": [[1, [["s", 99]]]]}, {"poly": [[1, [["", 1]]]]}, {"poly": [[1, [["s" * 300, 1]]]]},
    {"poly": [[0, [["s", 1]]]]}, {"poly": [[1, [["s", 1]]], [2, [["s", 1]]]]},
    {"poly": [[1, [["s", 1], ["s", 1]]]]}, {"poly": [[1, [[["exec", {"poly": []}, {"poly": []}], 1]]]]},
    {"poly": [[1, [[["floor", {"poly": [[1, [["s", 1]]]]}, 1], 1]]]]},
    {"poly": [[1 << 70, []]]}, {"poly": [[1, []]] * 40}, {"poly": [], "code": "x"},
])
def test_stored_expressions_are_checked(bad):
    with pytest.raises(ValueError):
        from_json(bad)


def test_nesting_is_bounded():
    e = {"poly": [[1, [["s", 1]]]]}
    for _ in range(S.MAX_DEPTH + 2):
        e = {"poly": [[1, [[["min", e, {"poly": [[3, []]]}], 1]]]]}
    with pytest.raises(ValueError, match="deeper"):
        from_json(e)
