"""The symbolic planning strategy is ge_memory's (registered as memory planner
``ge_core.memory.SYMBOLIC_PLANNER``); the core keeps the plan types and their checks."""

import json

import numpy as np
import pytest

import ge_core as ge
from ge_core import OptionError, TensorType
from ge_core.cli import main
from ge_core.memory import SYMBOLIC_PLANNER, SymbolicPlan
from ge_core.plugins import get_host


def _graph(shape):
    g = ge.Graph("g")
    x = g.add_input("x", TensorType("float32", shape))
    a = g.add_node("Relu", [x], name="a")
    b = g.add_node("Neg", [a.output], name="b")
    g.set_outputs([g.add_node("Exp", [b.output], name="c").output])
    return g


def test_the_strategy_is_ge_memorys():
    regs = get_host().registries
    assert regs.memory_planners.origin(SYMBOLIC_PLANNER) == "ge_memory"


def test_a_symbolic_problem_gets_a_symbolic_plan_by_the_chosen_planner():
    model = ge.compile(_graph(("n", 16)), {"memory_planner": "greedy_by_size", "opt_level": 0})
    plan = model.memory_plan
    assert isinstance(plan, SymbolicPlan) and plan.planner == "greedy_by_size"
    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(3, 16)
    (y,) = model.run({"x": x}).values()
    np.testing.assert_allclose(y, np.exp(-np.maximum(x, 0)), rtol=1e-6)


def test_the_strategy_is_no_planner_to_choose(capsys):
    with pytest.raises(OptionError, match="strategy for symbolic shapes"):
        ge.compile(_graph((2, 16)), {"memory_planner": SYMBOLIC_PLANNER})
    assert main(["passes", "--json"]) == 0
    planners = json.loads(capsys.readouterr().out)["memory_planners"]
    assert SYMBOLIC_PLANNER not in planners and "auto" in planners
