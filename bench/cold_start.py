"""Cold start: interpreter start to the end of the first inference, in fresh processes.

For every model, side by side and interleaved round by round with an idle gap before each
timed process:

- **onnxruntime**: a new process imports onnxruntime, creates a session (ORT_ENABLE_ALL, the
  same thread count) on the .onnx and runs it once;
- **ge, warm cache**: a new process imports ge_core, loads the .om (compiled beforehand with
  ``ge compile``) and runs it once, with the kernel cache (``ge_native.native``) already holding
  the model's kernels;
- **ge, cold cache** (once per model): the same with an empty kernel cache, i.e. a new machine:
  the process compiles the kernels the .om needs; and ``ge compile`` itself with an empty cache,
  whose report's ``compile_seconds`` includes the kernel compilation.

The children get Python bytecode caches (``PYTHONPYCACHEPREFIX`` in a temporary folder, a
warm-up process first) as an installed package has, and ``OPENBLAS_CORETYPE`` /
``OPENBLAS_L2_SIZE`` removed. Prints per-model medians, the ratio ge(warm)/onnxruntime and the
geometric mean, plus ``import ge_core`` alone.

    python bench/cold_start.py [--rounds 5] [--threads 1] [--models squeezenet,bert] [--gap 0.3]
                               [--no-transformers]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import onnx  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
TRANSFORMERS = ("bert", "gpt2")

#: the child: time.time() at its end minus the parent's time.time() just before the spawn is
#: "interpreter start to the end of the first inference" (one clock, one machine)
CHILD_GE = r"""
import sys, time, json
t0 = time.time()
import numpy as np
import ge_core as ge
t1 = time.time()
m = ge.load_om(sys.argv[1], threads=int(sys.argv[2]))
t2 = time.time()
feeds = {a.name: np.load(sys.argv[3] + "/" + str(i) + ".npy") for i, a in enumerate(m.inputs)}
m.run(feeds)
t3 = time.time()
from ge_native import native
print(json.dumps({"end": t3, "import": t1 - t0, "load": t2 - t1, "run": t3 - t2, "native": native.stats(),
                  "numba": "numba" in sys.modules, "torch": "torch" in sys.modules, "onnx": "onnx" in sys.modules}))
"""

CHILD_ORT = r"""
import sys, time, json
t0 = time.time()
import numpy as np
import onnxruntime as ort
t1 = time.time()
so = ort.SessionOptions()
so.intra_op_num_threads = int(sys.argv[2])
so.inter_op_num_threads = 1
so.log_severity_level = 3
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
t2 = time.time()
feeds = {a.name: np.load(sys.argv[3] + "/" + str(i) + ".npy") for i, a in enumerate(s.get_inputs())}
s.run(None, feeds)
t3 = time.time()
print(json.dumps({"end": t3, "import": t1 - t0, "load": t2 - t1, "run": t3 - t2}))
"""

CHILD_IMPORT = "import time, json; t0 = time.time(); import ge_core; print(json.dumps({'end': time.time()}))"


def child_env(pyc: str, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPYCACHEPREFIX"] = pyc
    env["GE_CACHE_DIR"] = cache
    return env


def spawn(code: str, args: list[str], env: dict, gap: float) -> dict:
    time.sleep(gap)
    start = time.time()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"child failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall"] = out["end"] - start
    return out


def inputs_of(onnx_path: str, folder: str, feeds: dict | None = None) -> None:
    import numpy as np

    m = onnx.load(onnx_path, load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(0)
    os.makedirs(folder, exist_ok=True)
    real = [i for i in m.graph.input if i.name not in init]
    for k, inp in enumerate(real):
        if feeds is not None:
            a = feeds[inp.name]
        else:
            t = inp.type.tensor_type
            shape = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
            dt = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            a = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt)
        np.save(os.path.join(folder, f"{k}.npy"), a)


def compile_om(onnx_path: str, om: str, env: dict, threads: int) -> float:
    """``ge compile`` in a fresh process; its report's compile_seconds."""
    rep = om + ".json"
    subprocess.run([sys.executable, "-m", "ge_core.cli", "compile", onnx_path, "-o", om, "--report", rep, "-q",
                    "--threads", str(threads)], check=True, env=env, timeout=1800, capture_output=True)
    with open(rep) as f:
        return float(json.load(f)["compile_seconds"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="", help="comma-separated light model and transformer names")
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed process")
    ap.add_argument("--no-transformers", action="store_true")
    a = ap.parse_args(argv)
    from threadpoolctl import threadpool_info

    blas = [f"{i.get('internal_api')} {i.get('architecture')}" for i in threadpool_info() if i.get("user_api") == "blas"]
    print(f"BLAS: {', '.join(blas)}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')!r} is removed in the "
          f"children; threads {a.threads}; rounds {a.rounds}", flush=True)
    work = tempfile.mkdtemp(prefix="ge-cold-")
    try:
        return run(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(a, work: str) -> int:
    pyc = os.path.join(work, "pyc")
    warm_cache = os.path.join(work, "kernels")
    env = child_env(pyc, warm_cache)
    pick = [m for m in a.models.split(",") if m]
    models: dict[str, tuple[str, dict | None]] = {}
    for f in sorted(os.listdir(LIGHT)):
        if f.endswith(".onnx") and (not pick or f[6:-5] in pick):
            models[f[6:-5]] = (os.path.join(LIGHT, f), None)
    if not a.no_transformers:
        import transformer_models as tm

        for name in TRANSFORMERS:
            if pick and name not in pick:
                continue
            module, feeds = tm.build(name)
            path = os.path.join(work, f"{name}.onnx")
            with open(path, "wb") as f:
                f.write(tm.to_onnx(module, feeds))
            models[name] = (path, feeds)
    rows = []
    for name, (path, feeds) in models.items():
        folder = os.path.join(work, name)
        inputs_of(path, folder, feeds)
        om = os.path.join(work, f"{name}.om")
        # cold: a new machine (empty kernel cache) compiles, then a first process loads and runs
        cold_cache = os.path.join(work, f"cold-{name}")
        cold_env = child_env(pyc, cold_cache)
        compile_om(path, om, child_env(pyc, os.path.join(work, "throwaway")), a.threads)  # bytecode warm
        shutil.rmtree(os.path.join(work, "throwaway"), ignore_errors=True)
        compile_cold = compile_om(path, om, cold_env, a.threads)
        shutil.rmtree(cold_cache, ignore_errors=True)
        load_cold = spawn(CHILD_GE, [om, str(a.threads), folder], cold_env, a.gap)
        compile_om(path, om, env, a.threads)  # the warm cache gets this model's kernels
        spawn(CHILD_GE, [om, str(a.threads), folder], env, 0)  # warm-up: bytecode, page cache
        spawn(CHILD_ORT, [path, str(a.threads), folder], env, 0)
        ge_t, ort_t, last = [], [], None
        for _ in range(a.rounds):
            last = spawn(CHILD_GE, [om, str(a.threads), folder], env, a.gap)
            ge_t.append(last["wall"])
            ort_t.append(spawn(CHILD_ORT, [path, str(a.threads), folder], env, a.gap)["wall"])
        g, o = statistics.median(ge_t), statistics.median(ort_t)
        rows.append((name, o, g, g / o, load_cold["wall"], compile_cold, last))
        print(f"{name:14s} onnxruntime {o * 1e3:7.0f} ms   ge warm {g * 1e3:7.0f} ms   ratio {g / o:5.2f}   "
              f"ge cold {load_cold['wall'] * 1e3:7.0f} ms (compiled {load_cold['native']['compiled']} kernels)   "
              f"ge compile {compile_cold:6.2f} s   [warm: import {last['import'] * 1e3:.0f} load "
              f"{last['load'] * 1e3:.0f} run {last['run'] * 1e3:.0f} ms; cached {last['native']['cached']}, "
              f"compiled {last['native']['compiled']}; numba {last['numba']}, onnx {last['onnx']}, "
              f"torch {last['torch']}]", flush=True)
    imports = [spawn(CHILD_IMPORT, [], env, a.gap)["wall"] for _ in range(a.rounds)]
    print(f"\nimport ge_core (interpreter start included): median {statistics.median(imports) * 1e3:.0f} ms")
    if rows:
        gm = math.exp(sum(math.log(r[3]) for r in rows) / len(rows))
        worst = max(rows, key=lambda r: r[3])
        print(f"geomean ge(warm)/onnxruntime {gm:.2f}; worst {worst[0]} {worst[3]:.2f}; "
              f"models within 2x: {sum(r[3] <= 2.0 for r in rows)}/{len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
