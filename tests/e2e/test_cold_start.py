"""Cold start (issue 19): ``ge compile`` compiles every kernel, a later process loads the .om and
runs it without compiling anything or importing numba, torch, TensorFlow or onnx, and the
results are the same bits with a warm kernel cache, a cold one and none at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

CHILD = r"""
import json, sys
import numpy as np
import ge_core as ge
from ge_native import native
m = ge.load_om(sys.argv[1])
x = np.load(sys.argv[2])
y = m.run({"x": x})
np.save(sys.argv[3], next(iter(y.values())))
print(json.dumps({"native": native.stats(), "timings": m.timings,
                  "modules": sorted(k for k in ("numba", "torch", "tensorflow", "onnx") if k in sys.modules)}))
"""


def model(path: str) -> str:
    """A conv net with a pooled, fused, normalised, softmaxed tail: loops, a window loop, rows."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, (8, 3, 3, 3), rng.standard_normal(216).astype(np.float32))
    g = helper.make_tensor("g", TensorProto.FLOAT, (8,), rng.standard_normal(8).astype(np.float32))
    b = helper.make_tensor("b", TensorProto.FLOAT, (8,), rng.standard_normal(8).astype(np.float32))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["p"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1),
        helper.make_node("Erf", ["n"], ["e"]),
        helper.make_node("Softmax", ["e"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "cold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 32, 32))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, g, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def run_child(om: str, x: str, out: str, cache: str, **env) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, om, x, out], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "GE_CACHE_DIR": cache, **env}, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_process_after_ge_compile_compiles_nothing_and_gives_the_same_bits(tmp_path):
    src = model(str(tmp_path / "m.onnx"))
    om, report = str(tmp_path / "m.om"), str(tmp_path / "r.json")
    cache = str(tmp_path / "cache")
    env = {**os.environ, "GE_CACHE_DIR": cache}
    subprocess.run([sys.executable, "-m", "ge_core.cli", "compile", src, "-o", om, "--report", report, "-q"],
                   check=True, env=env, timeout=600)
    with open(report) as f:
        rep = json.load(f)
    nk = rep["native_kernels"]
    assert nk["compiled"] >= 3, nk  # the fused loops, the pool's window loop, the row kernels
    assert rep["compile_seconds"] >= nk["compile_seconds"] > 0
    x = str(tmp_path / "x.npy")
    np.save(x, np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32))

    warm = run_child(om, x, str(tmp_path / "warm.npy"), cache)
    assert warm["native"]["compiled"] == 0 and warm["native"]["cached"] >= 3, warm
    assert warm["modules"] == [], warm["modules"]  # no numba, torch, tensorflow, onnx
    assert warm["timings"]["load_seconds"] > 0 and warm["timings"]["first_run_seconds"] > 0

    cold = run_child(om, x, str(tmp_path / "cold.npy"), str(tmp_path / "empty-cache"))
    assert cold["native"]["compiled"] >= 3
    np.testing.assert_array_equal(np.load(tmp_path / "warm.npy"), np.load(tmp_path / "cold.npy"))

    # without native kernels at all (NumPy forms): the same model within float32 rounding
    plain = run_child(om, x, str(tmp_path / "plain.npy"), cache, GE_NATIVE="0")
    assert plain["native"]["compiled"] == 0 and plain["native"]["cached"] == 0
    np.testing.assert_allclose(np.load(tmp_path / "plain.npy"), np.load(tmp_path / "warm.npy"), rtol=2e-5, atol=1e-6)


def test_import_ge_core_stays_light():
    code = "import sys, ge_core; print(sorted(m for m in ('numba', 'torch', 'tensorflow', 'onnx', 'rich') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout.strip() == "[]"


def test_ge_inspect_says_whether_the_kernels_are_in_the_cache(tmp_path):
    src = model(str(tmp_path / "m.onnx"))
    om = str(tmp_path / "m.om")
    compiled_here = {**os.environ, "GE_CACHE_DIR": str(tmp_path / "cache")}
    elsewhere = {**os.environ, "GE_CACHE_DIR": str(tmp_path / "elsewhere")}
    subprocess.run([sys.executable, "-m", "ge_core.cli", "compile", src, "-o", om, "-q"], check=True,
                   env=compiled_here, timeout=600)

    def state(env):
        r = subprocess.run([sys.executable, "-m", "ge_core.cli", "inspect", om, "--json"], capture_output=True,
                           text=True, env=env, timeout=600, check=True)
        return json.loads(r.stdout)["kernel_cache"]

    here = state(compiled_here)
    assert here["modules"] >= 3 and here["missing"] == 0
    there = state(elsewhere)  # the .om copied to another machine: nothing is compiled by inspect
    assert there["modules"] == here["modules"] and there["in_cache"] == 0
    assert not list((tmp_path / "elsewhere").rglob("*.so"))
