"""Test helpers for plugin authors: build graphs, run passes, check that a pass keeps semantics.

The same helpers back the pytest plugin (:mod:`ge_sdk.pytest_plugin`), whose fixtures are
``ge_plugin``, ``graph_builder``, ``run_pass`` and ``assert_pass_preserves_semantics``.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_core.errors import GEError
from ge_core.ir import Graph, TensorType, Value
from ge_core.ops import infer_graph
from ge_core.options import CompileOptions
from ge_core.passes import STAGES, Pass, PassContext, PassResult
from ge_core.plugins import get_host


@contextlib.contextmanager
def temporary_plugin(plugin: Any, name: str | None = None) -> Iterator[str]:
    """Register ``plugin`` (module, class or object with hookimpls) in-process for a block."""
    host = get_host()
    pname = host.register_plugin(plugin, name)
    try:
        yield pname
    finally:
        host.unregister_plugin(pname)


class GraphBuilder:
    """A fluent graph builder for tests.

    ``b = GraphBuilder(); x = b.input("x", "float32", (1, 4)); y = b.Relu(b.Add(x, 1.0));
    b.output(y); g = b.build()``. Any attribute starting with a capital letter is an op;
    keyword arguments are attributes; NumPy arrays and numbers become constants (float32
    unless an array says otherwise).
    """

    def __init__(self, name: str = "g", opset: int = 17) -> None:
        self.graph = Graph(name)
        self.graph.opset_imports[""] = opset
        self._rng = np.random.default_rng(0)

    def input(self, name: str, dtype: Any = "float32", shape: tuple | None = None) -> Value:
        return self.graph.add_input(name, TensorType(dtype, shape))

    def const(self, array: Any, name: str | None = None) -> Value:
        arr = np.asarray(array)
        if arr.dtype == np.float64 and not isinstance(array, np.ndarray):
            arr = arr.astype(np.float32)
        return self.graph.add_constant(arr, name)

    def random_const(self, shape: tuple, dtype: Any = "float32", name: str | None = None) -> Value:
        """A constant of standard-normal values (reproducible per builder)."""
        return self.const(self._rng.standard_normal(shape).astype(dtype), name)

    def opset(self, domain: str, version: int = 1) -> GraphBuilder:
        self.graph.opset_imports[domain] = version
        return self

    def _value(self, x: Any) -> Value | None:
        if x is None or isinstance(x, Value):
            return x
        return self.const(x)

    def op(self, op_type: str, *inputs: Any, num_outputs: int = 1, domain: str = "", **attrs: Any):
        """Add a node; returns its output (a tuple when ``num_outputs > 1``)."""
        if domain and domain not in self.graph.opset_imports:
            self.graph.opset_imports[domain] = 1
        node = self.graph.add_node(op_type, [self._value(x) for x in inputs], attrs, domain=domain,
                                   num_outputs=num_outputs)
        return node.outputs[0] if num_outputs == 1 else tuple(node.outputs)

    def __getattr__(self, op_type: str):
        if not op_type[:1].isupper():
            raise AttributeError(op_type)
        return lambda *inputs, **attrs: self.op(op_type, *inputs, **attrs)

    def output(self, *values: Value) -> GraphBuilder:
        for v in values:
            self.graph.add_output(v)
        return self

    def build(self, infer: bool = True) -> Graph:
        """The graph, with types inferred by the registered op set when ``infer``; verified."""
        if infer:
            infer_graph(self.graph, get_host().registries.ops)
        self.graph.verify()
        return self.graph


def count_ops(graph: Graph) -> collections.Counter:
    """``Counter`` of qualified op types (``domain::Op``) in ``graph``."""
    return collections.Counter(n.qualified_op for n in graph.nodes)


def random_inputs(graph: Graph, seed: int = 0, dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random feeds for the graph's inputs; symbolic or unknown dims take ``dims[name]`` or 2."""
    from .inputs import random_inputs as _random

    return _random(graph, seed, dims, default_dim=2, strict=True)


def _regs():
    return get_host().registries


def resolve_pass(pass_or_name: Pass | type[Pass] | str) -> Pass:
    """A pass instance from a registered name, a Pass class or an instance."""
    if isinstance(pass_or_name, str):
        from ge_core.errors import OptionError

        return _regs().passes.require(pass_or_name, OptionError)
    if inspect.isclass(pass_or_name):
        return pass_or_name()
    return pass_or_name


def run_pass(pass_or_name: Pass | type[Pass] | str, graph: Graph, *, params: dict[str, Any] | None = None,
             options: Any = None, prepare: bool = True, verify: bool = True) -> tuple[Graph, bool]:
    """Run one pass on a copy of ``graph`` (types inferred first when ``prepare``).

    Returns ``(new_graph, changed)``; the new graph is verified against the op registry.
    """
    p = resolve_pass(pass_or_name)
    regs = _regs()
    g = graph.copy()
    if prepare:
        infer_graph(g, regs.ops)
    merged = {**dict(getattr(p, "params", {}) or {}), **(params or {})}
    opts = CompileOptions.from_any(options)
    result = PassResult.of(p.run(g, PassContext(opts, regs, merged, {}, pass_name=p.name)))
    if verify:
        from ge_core.ir.verify import verify_graph

        g.verify()
        verify_graph(g, op_registry=regs.ops)
    return g, result.changed


def _bare_options(**extra: Any) -> dict[str, Any]:
    """Compile options whose pipeline only infers types: the graph runs as it is."""
    regs = _regs()
    prepare = [n for n in ("infer_shapes",) if n in regs.passes]
    pipeline: dict[str, dict[str, Any]] = {s: {"passes": []} for s in STAGES}
    pipeline["prepare"] = {"passes": prepare}
    return {"opt_level": 0, "pipeline": pipeline, **extra}


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray], **options: Any) -> dict[str, np.ndarray]:
    """Compile ``graph`` as it is (no optimisation) for the cpu backend and run it."""
    import ge_core as ge

    model = ge.compile(graph, _bare_options(**options))
    return model.run(dict(feeds))


def run_onnxruntime(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``graph`` with onnxruntime through the registered ``onnx`` frontend's exporter.

    Raises :class:`GEError` when there is no exporter or onnxruntime cannot run the graph.
    """
    fe = _regs().frontends.get("onnx")
    if fe is None:
        raise GEError("no 'onnx' frontend is registered, so the graph cannot be exported for onnxruntime")
    try:
        import onnxruntime as ort
    except ImportError:
        raise GEError("onnxruntime is not installed") from None
    g = graph.copy()
    infer_graph(g, _regs().ops)
    try:
        proto = fe.export(g)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        outs = sess.run(names, {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})
    except GEError:
        raise
    except Exception as e:
        raise GEError(f"onnxruntime cannot run the graph: {type(e).__name__}: {str(e)[:300]}") from None
    return dict(zip(names, outs))


def run_reference(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``graph`` with ``onnx.reference`` (ONNX's own Python evaluator): the oracle for what
    onnxruntime has no kernel for (float64 Elu, for one). Raises :class:`GEError` when it cannot."""
    fe = _regs().frontends.get("onnx")
    if fe is None:
        raise GEError("no 'onnx' frontend is registered, so the graph cannot be exported for onnx.reference")
    from onnx.reference import ReferenceEvaluator

    g = graph.copy()
    infer_graph(g, _regs().ops)
    try:
        proto = fe.export(g)
        ev = ReferenceEvaluator(proto)
        outs = ev.run(None, {k: v for k, v in feeds.items() if k in set(ev.input_names)})
    except GEError:
        raise
    except Exception as e:
        raise GEError(f"onnx.reference cannot run the graph: {type(e).__name__}: {str(e)[:300]}") from None
    return dict(zip(ev.output_names, outs))


@dataclass
class SemanticsCheck:
    """What :func:`assert_pass_preserves_semantics` compared."""

    graph: Graph
    changed: bool
    feeds: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    checked_against: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _compare(name: str, want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], rtol: float, atol: float,
             what: str) -> None:
    if list(want) != list(got) and set(want) != set(got):
        raise AssertionError(f"{name}: outputs {list(got)} differ from {what}'s {list(want)}")
    for k, a in want.items():
        b = got[k]
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise AssertionError(f"{name}: output '{k}' has shape {b.shape}, {what} gives {a.shape}")
        if a.dtype.kind in "fc":
            ok = np.allclose(b.astype(np.float64), a.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = np.array_equal(a, b)
        if not ok:
            diff = np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.size else 0.0
            raise AssertionError(f"{name}: output '{k}' differs from {what} (max abs diff {diff:g}, "
                                 f"rtol {rtol}, atol {atol})")


def assert_pass_preserves_semantics(pass_or_name: Pass | type[Pass] | str, graph: Graph, *,
                                    feeds: Mapping[str, np.ndarray] | None = None, seed: int = 0, trials: int = 2,
                                    rtol: float = 1e-4, atol: float = 1e-5, params: dict[str, Any] | None = None,
                                    options: Any = None, onnxruntime: bool | None = None,
                                    expect_changed: bool | None = None) -> SemanticsCheck:
    """Run the pass on a copy of ``graph`` and check that outputs are unchanged on random inputs.

    Both graphs run on the cpu backend with no other optimisation. The transformed graph is
    also compared with onnxruntime running the *original* graph (exported through the
    registered ``onnx`` frontend) when that works; ``onnxruntime=True`` makes it mandatory,
    ``False`` skips it. ``expect_changed`` also checks whether the pass changed the graph.
    Returns a :class:`SemanticsCheck` (the new graph, outputs, what it was compared with).
    """
    p = resolve_pass(pass_or_name)
    name = f"pass '{p.name}'"
    after, changed = run_pass(p, graph, params=params, options=options)
    if expect_changed is not None and changed != expect_changed:
        raise AssertionError(f"{name} {'changed' if changed else 'did not change'} the graph, expected "
                             f"{'a change' if expect_changed else 'no change'}")
    before = graph.copy()
    infer_graph(before, _regs().ops)
    check = SemanticsCheck(after, changed, {}, {})
    for t in range(max(1, trials) if feeds is None else 1):
        fd = dict(feeds) if feeds is not None else random_inputs(before, seed + t)
        want = run_graph(before, fd)
        got = run_graph(after, fd)
        _compare(name, want, got, rtol, atol, "the graph before the pass")
        if "cpu (before/after)" not in check.checked_against:
            check.checked_against.append("cpu (before/after)")
        if onnxruntime is not False:
            try:
                ref = run_onnxruntime(before, fd)
            except GEError as e:
                if onnxruntime:
                    raise AssertionError(f"{name}: onnxruntime comparison requested but {e}") from None
                check.skipped["onnxruntime"] = str(e)
            else:
                try:
                    _compare(name, ref, got, rtol, atol, "onnxruntime on the original graph")
                except AssertionError as e:
                    try:
                        _compare(name, ref, want, rtol, atol, "onnxruntime")
                    except AssertionError:
                        raise AssertionError(f"{e} (the cpu backend also disagrees with onnxruntime on the "
                                             "original graph: a kernel issue, not necessarily the pass)") from None
                    raise
                if "onnxruntime" not in check.checked_against:
                    check.checked_against.append("onnxruntime")
        check.feeds, check.outputs = fd, got
    return check
