"""Stream allocators: valid assignments, only needed events, GE's continuation rule, splitting."""

import numpy as np
import pytest

import ge_core as ge
from ge_core import GEError, hookimpl
from ge_core.schedule import HappensBefore, StreamAssignment, data_edges, verify_streams
from ge_sdk import GraphBuilder
from ge_streams.allocators import redundant_events
from tests.conftest import LIGHT_MODELS, light_model_path


def branches(n_branches=4, depth=3, size=64):
    b = GraphBuilder("branches")
    x = b.input("x", "float32", (size, size))
    outs = []
    for i in range(n_branches):
        v = x
        for j in range(depth):
            v = b.op("MatMul", v, b.const(np.eye(size, dtype=np.float32) * (1 + 0.01 * (i + j))))
            v = b.op("Tanh", v)
        outs.append(v)
    b.output(b.op("Sum", *outs))
    return b.graph


@pytest.mark.parametrize("allocator", ["single", "dependency", "critical_path"])
@pytest.mark.parametrize("name", ["inception_v1", "squeezenet", "resnet50"])
def test_assignments_order_every_dependency_with_no_redundant_event(name, allocator):
    model = ge.compile(light_model_path(name), {"stream_allocator": allocator})
    sa = model.streams
    order = model.schedule
    verify_streams(order, sa)
    assert redundant_events(sa) == []
    assert model.report["streams"] == {"count": sa.count, "events": len(sa.events)}
    # every event is a real cross-stream data edge
    edges = set(data_edges(order))
    assert all(e in edges and sa.streams[e[0]] != sa.streams[e[1]] for e in sa.events)


def test_inception_v1_dependency_allocator_uses_several_streams():
    model = ge.compile(light_model_path("inception_v1"), {"stream_allocator": "dependency"})
    assert model.report["streams"]["count"] > 1 and model.report["streams"]["events"] > 0
    # removing any single event breaks some ordering (checked against reachability)
    sa = model.streams
    for e in sa.events:
        hb = HappensBefore(StreamAssignment(sa.streams, [x for x in sa.events if x != e]))
        assert not hb.ordered(e[0], e[1], sa.streams), e


def test_dependency_rule_continues_predecessor_stream():
    model = ge.compile(branches(4, 3), {"stream_allocator": "dependency", "opt_level": 0})
    sa = model.streams
    order = model.schedule
    # each MatMul/Tanh chain stays on one stream; four chains give four streams
    chains = {}
    for i, n in enumerate(order):
        if n.op_type in ("MatMul", "Tanh"):
            chains.setdefault(sa.streams[i], []).append(n.op_type)
    assert len(chains) == 4 and all(len(c) == 6 for c in chains.values())
    assert len(sa.events) == 3  # the Sum waits for the three other branches


def test_critical_path_spreads_heavy_branches_and_respects_max_streams():
    g = branches(4, 3, size=128)
    sa = ge.compile(g, {"stream_allocator": "critical_path", "opt_level": 0}).streams
    assert sa.count == 4
    sa2 = ge.compile(g, {"stream_allocator": "critical_path", "max_streams": 2, "opt_level": 0}).streams
    assert sa2.count == 2
    assert redundant_events(sa2) == []


def test_enable_single_stream_wins():
    model = ge.compile(branches(), {"stream_allocator": "dependency", "enable_single_stream": True})
    assert model.report["streams"] == {"count": 1, "events": 0}


def test_long_streams_are_split():
    g = GraphBuilder("chain")
    v = g.input("x", "float32", (4,))
    for _ in range(10):
        v = g.op("Neg", v)
    g.output(v)
    sa = ge.compile(g.graph, {"stream_allocator": "dependency", "max_stream_nodes": 4, "opt_level": 0}).streams
    assert sa.count == 3 and sa.streams == [0] * 4 + [1] * 4 + [2] * 2
    assert sa.events == [(3, 4), (7, 8)]


def test_allocator_missing_an_event_is_rejected_naming_it(fresh_host):
    class Sloppy:
        @hookimpl
        def ge_register_stream_allocators(self, register):
            register("sloppy", lambda graph, options: StreamAssignment(list(range(len(graph))), []))

    fresh_host.register_plugin(Sloppy(), "sloppy_streams")
    with pytest.raises(GEError, match=r"stream allocator 'sloppy'.*no event.*plugin sloppy_streams"):
        ge.compile(branches(2, 1), {"stream_allocator": "sloppy"})


def test_outputs_do_not_depend_on_the_allocator():
    g = branches(3, 2)
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    want = ge.compile(g).run({"x": x})
    for a in ("dependency", "critical_path"):
        got = ge.compile(g, {"stream_allocator": a}).run({"x": x})
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_allocate_within_max_streams(name):
    sa = ge.compile(light_model_path(name), {"stream_allocator": "critical_path", "max_streams": 3}).streams
    assert 1 <= sa.count <= 3 and len(sa.streams) > 0
