"""Peak resident memory and load time: this engine (.om files) vs onnxruntime, one process each.

ResNet-50 and VGG-19 (the light models the onnx package ships) are compiled to .om files first.
Then every (model, engine) pair runs in a fresh process that loads the model (``ge.load_om`` /
``onnxruntime.InferenceSession``), times that, and runs a few inferences. The peak resident set
of each process is read from the operating system twice: the child's own
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` and ``/usr/bin/time -v`` around it (where installed). Engines: ``ge`` (memory plan, reuse on),
``ge-noreuse`` (``disable_reuse_memory``), ``ort`` (onnxruntime, CPU provider).

    python bench/memory.py [--models resnet50,vgg19] [--runs 3] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def light_path(name: str) -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")


# ------------------------------------------------------------------------------------------------
# child: load, run, report
# ------------------------------------------------------------------------------------------------
def child(engine: str, path: str, runs: int) -> None:
    import numpy as np

    if engine == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        load = time.perf_counter() - t0
        inp = sess.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]

        def run(x):
            return sess.run(None, {inp.name: x})
    else:
        import ge_core as ge

        _ = ge.plugins.get_host().registries  # plugin imports are not the model's cost
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        model = ge.load_om(path)
        load = time.perf_counter() - t0
        name = model.input_names[0]
        shape = list(model.graph.inputs[0].type.shape)

        def run(x):
            return model.run({name: x})
    after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    lat = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run(x)
        lat.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"load_s": load, "base_kib": base, "after_load_kib": after_load, "peak_kib": peak,
                      "run_s": statistics.median(lat)}))


# ------------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------------
def measure(engine: str, path: str, runs: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", engine, "--path", path, "--runs", str(runs)]
    timev = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    if timev:
        cmd = [timev, "-v"] + cmd
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"{engine} on {path} failed:\n{err[-3000:]}")
    rec = json.loads(out.strip().splitlines()[-1])
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    rec["time_v_kib"] = int(m.group(1)) if m else None
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,vgg19")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1, help="processes per (model, engine); the median is shown")
    ap.add_argument("--child")
    ap.add_argument("--path")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.path, args.runs)
        return 0

    from rich.console import Console
    from rich.table import Table

    import ge_core as ge

    con = Console(width=160)
    tmp = tempfile.mkdtemp(prefix="ge-bench-mem-")
    rows = []
    try:
        for name in args.models.split(","):
            src = light_path(name)
            oms = {}
            for engine, opts in (("ge", None), ("ge-noreuse", {"disable_reuse_memory": True})):
                m = ge.compile(ge.load(src), opts)
                oms[engine] = (m.save(os.path.join(tmp, f"{name}-{engine}.om")), m.report["memory"])
            res = {}
            for engine in ("ge", "ge-noreuse", "ort"):
                path = oms[engine][0] if engine in oms else src
                recs = [measure(engine, path, args.runs) for _ in range(args.repeat)]
                res[engine] = {k: statistics.median([r[k] for r in recs if r[k] is not None] or [0]) for k in recs[0]}
            rows.append((name, res, oms["ge"][1], oms["ge-noreuse"][1]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    t = Table(title="peak resident memory (MiB, one process per engine) and load time")
    for c in ("model", "engine", "peak RSS (getrusage)", "peak RSS (time -v)", "RSS after load", "vs ort",
              "load / session (ms)", "load vs ort", "run (ms)", "arena (MiB)"):
        t.add_column(c, justify="right" if c not in ("model", "engine") else "left")
    for name, res, mem, mem_nr in rows:
        ort = res["ort"]
        for engine in ("ge", "ge-noreuse", "ort"):
            r = res[engine]
            arena = {"ge": mem["arena_bytes"], "ge-noreuse": mem_nr["arena_bytes"]}.get(engine)
            t.add_row(name, engine, f"{r['peak_kib'] / 1024:.0f}", f"{(r['time_v_kib'] or 0) / 1024:.0f}",
                      f"{r['after_load_kib'] / 1024:.0f}", f"{r['peak_kib'] / ort['peak_kib']:.2f}x",
                      f"{r['load_s'] * 1e3:.1f}", f"{r['load_s'] / ort['load_s']:.2f}x", f"{r['run_s'] * 1e3:.1f}",
                      "" if arena is None else f"{arena / 2**20:.1f}")
    con.print(t)
    for name, _, mem, _ in rows:
        con.print(f"{name}: arena {mem['arena_bytes']:,} B, lower bound {mem['lower_bound_bytes']:,} B, "
                  f"no reuse {mem['no_reuse_bytes']:,} B, weights {mem['weights_bytes']:,} B ({mem['planner']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
