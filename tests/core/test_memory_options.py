"""Memory problem/plan checks and compile options (ATC spellings, switch files, errors)."""

import json
import random

import pytest

import ge_core as ge
from ge_core import GEError, OptionError
from ge_core.memory import Buffer, MemoryPlan, MemoryProblem, lower_bound, no_reuse_bytes, verify_plan
from ge_core.options import CompileOptions, parse_input_shape
from ge_core.plugins import get_host


def random_problem(rng, n=60):
    bufs = []
    for i in range(n):
        s = rng.randrange(0, 50)
        bufs.append(Buffer(f"b{i}", rng.randrange(1, 5000), s, s + rng.randrange(0, 10)))
    return MemoryProblem(bufs)


@pytest.mark.parametrize("planner", ["none", "greedy_by_size", "auto"])
def test_planners_produce_valid_plans_within_bounds(planner):
    plan_fn = get_host().registries.memory_planners.get(planner)
    rng = random.Random(3)
    for _ in range(30):
        prob = random_problem(rng)
        plan = plan_fn(prob, None)
        verify_plan(prob, plan)
        assert lower_bound(prob) <= plan.arena_bytes <= no_reuse_bytes(prob)


def test_verify_plan_catches_overlap_and_overflow():
    prob = MemoryProblem([Buffer("a", 100, 0, 2), Buffer("b", 100, 1, 3), Buffer("c", 100, 3, 4)])
    verify_plan(prob, MemoryPlan({"a": 0, "b": 128, "c": 0}, 256))  # a and c never live together
    with pytest.raises(GEError, match="overlaps 'a'.*'b'"):
        verify_plan(prob, MemoryPlan({"a": 0, "b": 64, "c": 0}, 256))
    with pytest.raises(GEError, match="outside the arena"):
        verify_plan(prob, MemoryPlan({"a": 0, "b": 192, "c": 0}, 256))


def test_lower_bound_is_peak_of_live_bytes():
    prob = MemoryProblem([Buffer("a", 64, 0, 1), Buffer("b", 128, 1, 2), Buffer("c", 64, 2, 2)])
    assert lower_bound(prob) == 192 and no_reuse_bytes(prob) == 256


def test_atc_option_spellings():
    o = CompileOptions.from_any({"framework": "5", "input_shape": "data:1,3,224,224;mask:-1,8", "out_nodes": "prob;fc:0",
                                 "soc_version": "Ascend310", "enable_single_stream": "true", "disable_reuse_memory": "1",
                                 "memory_optimize_level": "O0", "opt_level": "O3"})
    assert o.framework == "onnx" and o.input_shape == {"data": (1, 3, 224, 224), "mask": (None, 8)}
    assert o.out_nodes == ["prob", "fc:0"] and o.enable_single_stream and o.disable_reuse_memory
    assert o.memory_optimize_level == "off" and o.opt_level == 3
    assert CompileOptions.from_any({"framework": 3}).framework == "tensorflow"
    assert parse_input_shape("x:N,3") == {"x": ("N", 3)}


@pytest.mark.parametrize("bad", [{"framework": 7}, {"input_shape": "nocolon"}, {"constant_folding": "maybe"},
                                 {"memory_optimize_level": "ultra"}, {"opt_level": 9}, {"threads": 0}])
def test_bad_option_values(bad):
    with pytest.raises(OptionError):
        CompileOptions.from_any(bad)


def test_unknown_option_close_match():
    g = ge.Graph("g")
    with pytest.raises(OptionError, match="did you mean: constant_folding"):
        ge.compile(g, {"constant_foldng": False})


def test_fusion_switch_file(tmp_path):
    from ge_fusion.switches import switch_enabled

    def read(values):  # the plugins' option readers apply with a host's registries, as ge.compile applies them
        opts = CompileOptions.from_any(values)
        opts.read_by_plugins(get_host().registries.option_readers)
        return opts

    p = tmp_path / "switch.json"
    p.write_text(json.dumps({"Switch": {"GraphFusion": {"ConvBatchnormFusionPass": "off", "ALL": "on"}, "UBFusion": {"TbeEltwiseFusion": "off"}}}))
    o = read({"fusion_switch_file": str(p)})
    assert o.getoption("fusion_switches") == {"ConvBatchnormFusionPass": False, "ALL": True, "TbeEltwiseFusion": False}
    assert not switch_enabled(o, "ConvBatchnormFusionPass") and switch_enabled(o, "Other")
    p.write_text('{"Switch": {"GraphFusoin": {}}}')
    with pytest.raises(OptionError, match="did you mean: GraphFusion"):
        read({"fusion_switch_file": str(p)})
    p.write_text('{"Switch": {"GraphFusion": {"X": "maybe"}}}')
    with pytest.raises(OptionError, match="on.*off"):
        read({"fusion_switch_file": str(p)})
    with pytest.raises(OptionError, match="does not exist"):
        read({"fusion_switch_file": str(tmp_path / "none.json")})
