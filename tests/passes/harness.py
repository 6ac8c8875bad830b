"""Differential harness for the optimisation passes.

``optimize(graph, ...)`` runs the prepare stage and the chosen optimize passes on a copy of a
graph; ``assert_same_outputs(original, optimized)`` runs both on the same random inputs and
compares, with onnxruntime running the *original* graph as the oracle where it can (exported
with ge_onnx's exporter), else the original compiled at opt_level 0.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import ge_core as ge
from ge_core.ir.graph import Graph
from ge_core.options import CompileOptions
from ge_core.passes import PassContext, PassManager, resolve_pipeline
from ge_core.plugins import get_host

RTOL, ATOL = 1e-3, 1e-4


def optimize(graph: Graph, passes: list[str] | None = None, **options) -> Graph:
    """A copy of ``graph`` after the prepare stage and the optimize passes ``passes`` (in that
    order, to a fixed point) or, with ``passes=None``, the default optimize stage of the level."""
    g = graph.copy()
    opts = dict(options)
    if passes is not None:
        opts["pipeline"] = {"optimize": {"passes": list(passes), "fixed_point": True}}
    o = CompileOptions.from_any(opts)
    host = get_host()
    stages = [s for s in resolve_pipeline(host.registries.passes, o) if s.name in ("prepare", "optimize")]
    pm = PassManager(stages, verify_each=True)
    out = pm.run(g, PassContext(o, host.registries))
    g = out if isinstance(out, Graph) else g
    g.verify()
    return g


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        shape = [d if isinstance(d, int) else 2 for d in (v.type.shape or ())]
        dt = v.type.dtype if v.type.dtype is not None else np.dtype(np.float32)
        if dt.kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            feeds[v.name] = rng.random(shape) > 0.5
        else:
            feeds[v.name] = rng.integers(-5, 6, shape).astype(dt)
    return feeds


def onnxruntime_outputs(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The graph's outputs computed by onnxruntime, or None where it cannot run the graph."""
    from ge_onnx.exporter import export_onnx

    try:
        model = export_onnx(graph)
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(None, feeds)))
    except Exception:  # noqa: BLE001 - the oracle cannot run it: fall back to the O0 build
        return None


def reference_outputs(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs where it runs the graph, else this engine's at opt_level 0."""
    want = onnxruntime_outputs(graph, feeds)
    if want is None:
        want = ge.compile(graph, {"opt_level": 0}).run(feeds)
    return want


def assert_same_outputs(original: Graph, optimized: Graph, *, seeds=(0, 1), oracle: bool = True,
                        options: dict | None = None) -> None:
    """Outputs (names, order, dtypes, shapes, values) of ``optimized`` equal ``original``'s
    (``options``: added to both compiles of this engine)."""
    assert [v.name for v in optimized.outputs] == [v.name for v in original.outputs]
    assert [v.name for v in optimized.inputs] == [v.name for v in original.inputs]
    opts = {"opt_level": 0, **(options or {})}
    model = ge.compile(optimized, opts)
    for seed in seeds:
        feeds = random_feeds(original, seed)
        want = reference_outputs(original, feeds) if oracle else ge.compile(original, opts).run(feeds)
        got = model.run(feeds)
        assert list(got) == list(want)
        for k in want:
            w, g = np.asarray(want[k]), np.asarray(got[k])
            assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, g.shape, w.dtype, w.shape)
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=k)


def op_counts(graph: Graph) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in graph.nodes:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out
