"""How far a reduced-precision build is from float32, measured (``report["precision"]["accuracy"]``).

After a compile with a ``--precision_mode`` that changes weights, ``atc`` runs the new model and a
float32 reference on the same random inputs (seed 0, the model's input types): onnxruntime on the
source .onnx when the flags leave its inputs and outputs as they are, else this engine's build of
the same model at its own precision. The largest absolute error per output, and the largest
reference magnitude beside it, go in the report.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: Flags that change what the compiled model takes or gives: the source model is no reference then.
_CHANGES_IO = ("insert_op_conf", "out_nodes", "output_type", "input_shape")


def _onnxruntime(source: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except Exception:  # noqa: BLE001 - no onnxruntime, or one that cannot run the model: use this engine
        return None
    return {o.name: np.asarray(v) for o, v in zip(sess.get_outputs(), outs)}


def measure(source: str, opts: dict[str, Any], model) -> dict[str, Any]:
    """The accuracy table of ``model`` (built from ``source`` with ``opts``) against float32."""
    import ge_core as ge
    from ge_sdk.inputs import random_inputs

    feeds = {k: v for k, v in random_inputs(model.graph, 0).items()
             if k in model.input_names and model.graph.inputs[model.input_names.index(k)].default is None}
    got = model.run(feeds)
    ref = None
    if str(source).endswith(".onnx") and os.path.isfile(source) and not any(opts.get(k) for k in _CHANGES_IO):
        ref = _onnxruntime(source, feeds)
        against = "onnxruntime, float32"
    if ref is None or set(ref) != set(got):
        base = {k: v for k, v in opts.items() if k not in ("precision_mode", "keep_dtype", "modify_mixlist")}
        ref = ge.compile(source, base).run(feeds)
        against = "this engine at the model's own precision"
    outputs = {}
    for name, y in got.items():
        r = np.asarray(ref[name])
        if y.dtype.kind != "f" or r.shape != y.shape:
            continue
        diff = np.abs(y.astype(np.float64) - r.astype(np.float64))
        outputs[name] = {"max_abs_error": float(diff.max()) if diff.size else 0.0,
                         "max_abs_reference": float(np.abs(r).max()) if r.size else 0.0}
    return {"against": against, "inputs": "random, seed 0", "outputs": outputs}


def summary(table: dict[str, Any]) -> str:
    worst = max(table["outputs"].items(), key=lambda kv: kv[1]["max_abs_error"], default=None)
    if worst is None:
        return "no float output to compare"
    name, e = worst
    return (f"largest error {e['max_abs_error']:.3g} (output '{name}', values up to {e['max_abs_reference']:.3g}) "
            f"against {table['against']} on {table['inputs']} inputs")
