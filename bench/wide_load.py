"""Compile and load time of a wide graph, by the number of buffers alive at once (issue 42).

The graph: y = Relu(x) read by N branches Mul(y, c_i), summed one by one, compiled at opt_level 0
(no fusion: every branch keeps its buffer), so N buffers are alive at once. For each N the bench
compiles, saves, then loads the .om in fresh processes: once with an empty kernel cache (cold:
the generated executor is checked and compiled) and once with the cache that load left (warm),
and runs it. Linear scaling shows as a flat time per buffer; the plan check (verify_plan) is
timed apart, since it was the quadratic part (a 10k-buffer .om spent 5-6 s of its load there).

    python bench/wide_load.py [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import ge_core as ge
from ge_core import TensorType

_LOAD = r"""
import json, sys, time
import numpy as np
import ge_core as ge
import ge_core.om as om
spent = []
real = om.verify_plan
def timed(*a, **k):
    t = time.perf_counter(); real(*a, **k); spent.append(time.perf_counter() - t)
om.verify_plan = timed
t = time.perf_counter()
m = ge.load_om(sys.argv[1])
m.executable  # the executor is built at the first run at the latest: count it in the load
load = time.perf_counter() - t
x = np.linspace(-1, 1, 4, dtype=np.float32)
t = time.perf_counter()
y = next(iter(m.run({"x": x}).values()))
print(json.dumps({"load_s": load, "verify_s": sum(spent), "run_s": time.perf_counter() - t,
                  "y": [float(v) for v in y]}))
"""


def wide_graph(n: int) -> ge.Graph:
    g = ge.Graph("wide")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType("float32", (4,)))
    y = g.add_node("Relu", [x], name="y").output
    outs = [g.add_node("Mul", [y, g.add_constant(np.full(4, i + 1.5, np.float32), f"c{i}")], name=f"m{i}").output
            for i in range(n)]
    s = outs[0]
    for i, v in enumerate(outs[1:]):
        s = g.add_node("Add", [s, v], name=f"s{i}").output
    g.set_outputs([s])
    return g


def load_in_child(path: str, cache: str) -> dict:
    env = dict(os.environ, GE_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, "-c", _LOAD, path], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="buffers alive at once, comma-separated")
    a = ap.parse_args()
    print(f"{'buffers':>8} {'compile s':>10} {'.om MB':>7} {'load cold s':>12} {'load warm s':>12} "
          f"{'verify s':>9} {'us/buffer (warm)':>17} {'run ms':>7}")
    for n in (int(s) for s in a.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="ge-wide-") as tmp:
            t = time.perf_counter()
            model = ge.compile(wide_graph(n), {"opt_level": 0})
            compile_s = time.perf_counter() - t
            path = os.path.join(tmp, "wide.om")
            model.save(path)
            del model
            cache = os.path.join(tmp, "cache")
            cold = load_in_child(path, cache)
            warm = load_in_child(path, cache)
            want = np.maximum(np.linspace(-1, 1, 4), 0) * sum(i + 1.5 for i in range(n))
            assert np.allclose(warm["y"], want, rtol=1e-4), (warm["y"], want)
            print(f"{n:>8} {compile_s:>10.1f} {os.path.getsize(path) / 1e6:>7.1f} {cold['load_s']:>12.2f} "
                  f"{warm['load_s']:>12.2f} {warm['verify_s']:>9.3f} {warm['load_s'] / n * 1e6:>17.0f} "
                  f"{warm['run_s'] * 1e3:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
