"""Shared helpers of the kernel tests that compare a ge_cpu kernel with onnxruntime and/or
onnx.reference on a one-node model (the style of ``test_cpu_kernels.check``, with the opset's
IR version, optional outputs and custom comparisons)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

from ge_core.ir.types import TensorType  # noqa: E402
from ge_core.kernel import KernelSpec  # noqa: E402
from ge_cpu.kernels import KERNELS  # noqa: E402

ort.set_default_logger_severity(3)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _attr(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return numpy_helper.from_array(v)
    return v


def make_model(op: str, inputs: Sequence[np.ndarray | None], attrs: dict, opset: int, outputs: Sequence[str],
               const: Sequence[int] = (), domain: str = ""):
    """A one-node model; ``outputs`` are the node's output names ("" for an omitted one)."""
    names: list[str] = []
    graph_inputs = []
    inits = []
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if i in const:
            inits.append(numpy_helper.from_array(a, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, list(outputs), domain=domain, **{k: _attr(v) for k, v in attrs.items()})
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs if o], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    model.ir_version = 8 if opset <= 18 else 10
    feeds = {n: a for i, (n, a) in enumerate(zip(names, inputs)) if a is not None and i not in const}
    return model, feeds


def run_ort(model, feeds) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_onnx(model, feeds) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def make_spec(op: str, inputs, attrs: dict, opset: int, out_types: Sequence[TensorType | None],
              const: Sequence[int] = (), domain: str = "") -> KernelSpec:
    return KernelSpec(
        name=f"test_{op}", op_type=op, domain=domain, attrs=dict(attrs),
        inputs=[None if a is None else TensorType.of(a) for a in inputs],
        outputs=list(out_types),  # type: ignore[arg-type]
        const_inputs=[a if (i in const and a is not None) else None for i, a in enumerate(inputs)],
        opset=opset,
    )


def build_kernel(op: str, inputs, attrs: dict, opset: int, out_types, const: Sequence[int] = ()):
    spec = make_spec(op, inputs, attrs, opset, out_types, const)
    return KERNELS[("", op)](spec)


def run_kernel(op: str, inputs, attrs: dict, opset: int, out_types, const: Sequence[int] = ()) -> list:
    kernel = build_kernel(op, inputs, attrs, opset, out_types, const)
    # the executor passes None for absent optional inputs and drops trailing ones
    args = list(inputs)
    while args and args[-1] is None:
        args.pop()
    return list(kernel(*args))


def assert_close(got, expected, rtol: float, atol: float, what: str) -> None:
    e = np.asarray(expected)
    g = np.asarray(got)
    assert g.dtype == e.dtype, f"{what}: dtype {g.dtype} != {e.dtype}"
    assert g.shape == e.shape, f"{what}: shape {g.shape} != {e.shape}"
    if e.dtype.kind == "f" or e.dtype.name == "bfloat16":
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol, err_msg=what)
    elif e.dtype.kind in "biuO":
        np.testing.assert_array_equal(g, e, err_msg=what)
    else:  # ml_dtypes (float8, int4 ...): compare bit patterns through float32
        np.testing.assert_array_equal(g.astype(np.float32), e.astype(np.float32), err_msg=what)


def check(op: str, inputs, attrs: dict | None = None, *, opset: int, n_outputs: int = 1,
          outputs: Sequence[str] | None = None, const: Sequence[int] = (), ref: str = "ort",
          rtol: float = 1e-4, atol: float = 1e-5, expected: Sequence[np.ndarray] | None = None) -> list:
    """Run ``op`` through the reference(s) (``ort``, ``onnx`` or ``both``; or compare with
    ``expected``) and the kernel, and compare every produced output."""
    attrs = attrs or {}
    out_names = list(outputs) if outputs is not None else [f"out{j}" for j in range(n_outputs)]
    refs: dict[str, list[np.ndarray]] = {}
    if expected is not None:
        refs["expected"] = [np.asarray(e) for e in expected]
    else:
        model, feeds = make_model(op, inputs, attrs, opset, out_names, const)
        if ref in ("ort", "both"):
            refs["ort"] = run_ort(model, feeds)
        if ref in ("onnx", "both"):
            refs["onnx"] = run_onnx(model, feeds)
    first = next(iter(refs.values()))
    present = [j for j, n in enumerate(out_names) if n]
    out_types: list[TensorType | None] = [None] * len(out_names)
    for k, j in enumerate(present):
        out_types[j] = TensorType.of(np.asarray(first[k]))
    got = run_kernel(op, inputs, attrs, opset, out_types, const)
    assert len(got) == len(out_names), f"{op}: {len(got)} outputs, expected {len(out_names)}"
    for name, exp in refs.items():
        for k, j in enumerate(present):
            assert_close(got[j], exp[k], rtol, atol, f"{op} output {j} vs {name}")
    return got
