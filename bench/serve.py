"""Serving under load: ``ge serve`` with and without dynamic batching against onnxruntime behind
the same server, driven by a real Open Inference Protocol client at concurrency 1, 4 and 16 (#48).

Models, random weights, exported to ONNX with a dynamic batch dim (``torch.onnx.export(dynamo=
False, opset 17)``): ``resnet50`` (``transformers``' ResNet-50 classifier, torchvision-free, with
``bench/cnn.py``'s realistic weights; one 3x224x224 image per request, 1000 logits back) and
``bert`` (BERT-base sequence classifier, seq 128; ``input_ids`` and ``attention_mask`` per request).

Servers, each a subprocess started and stopped here, on 127.0.0.1 at a free port:

* ``ge batch``: ``python -m ge_core.cli serve M.om --threads T --max-batch 16 --max-delay-ms 2``
  (the .om compiled from the ONNX model, symbolic batch dim);
* ``ge``: the same without dynamic batching (``--max-batch 1``);
* ``ort``: ``python bench/serve.py --ort-server M.onnx --threads T``: an ``onnxruntime``
  InferenceSession (intra-op threads T, one run at a time) in a small ``kserve.Model`` behind
  ``ge serve``'s own server code (``ge_tools.serving.server.serve``: the same kserve app,
  middleware and uvicorn).

The client is ``tritonclient.http`` (binary tensors), one client per thread, ``c`` threads in a
closed loop. Every engine gets the same thread count (``--threads``, default 2 in all: one run at
a time on T intra-op threads). Rounds interleave the engines at each concurrency, with an idle
gap before each timed run. Per model it prints, per engine and concurrency, the throughput
(median over rounds), p50 and p99 latency (over every request of every round), each engine's
outputs against onnxruntime in-process, and the ratios: c16 / c1 per engine, ge / ort and
batching on / off at each concurrency. Then a ``targets`` line: with dynamic batching, ResNet-50
at concurrency 16 reaches >= 1.3x the throughput of concurrency 1 and >= onnxruntime's.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/serve.py [--models resnet50,bert]
        [--threads 2] [--rounds 3] [--requests 48] [--gap 0.5] [--max-batch 16] [--max-delay-ms 2]
        [--quick]

``rows/run``: the mean rows per model run in the timed runs, from the ge servers' ``/metrics``
(``ge_batch_size``): how much batching happened.
``--quick``: a tiny MLP, one round, few requests (the smoke test of tests/bench).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

MODELS = ("resnet50", "bert")
QUICK = "mlp"
CONCURRENCY = (1, 4, 8, 16)
ENGINES = ("ge batch", "ge", "ort")
TARGET_SCALING, TARGET_MODEL = 1.3, "resnet50"
READY_S = 300.0  # the longest a server may take to load and warm up
ID_HIGH = 8000


# -- models -----------------------------------------------------------------------------------------
def _export(module, args: tuple, names: list[str]) -> bytes:
    import torch

    buf = io.BytesIO()
    dynamic = {n: {0: "N"} for n in [*names, "logits"]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=names, output_names=["logits"], opset_version=17,
                          dynamo=False, dynamic_axes=dynamic)
    return buf.getvalue()


def build(name: str) -> tuple[bytes, Callable[[int], dict[str, np.ndarray]]]:
    """``(onnx bytes with a dynamic batch dim, draw(seed) -> one request's feeds)``."""
    if name == QUICK:
        return _mlp(), lambda seed: {"x": np.random.default_rng(seed).standard_normal((1, 32)).astype(np.float32)}
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if name == "resnet50":
        import cnn  # the realistic weights of bench/cnn.py

        net = tf.ResNetForImageClassification(tf.ResNetConfig())
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        cnn.realistic_weights(net, x)

        class Image(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = net

            def forward(self, x):
                return self.m(pixel_values=x).logits

        return _export(Image().eval(), (torch.from_numpy(x),), ["pixel_values"]), lambda seed: {
            "pixel_values": np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    if name == "bert":  # BERT-base
        bert = tf.BertForSequenceClassification(tf.BertConfig(attn_implementation="eager")).eval()

        class Text(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = bert

            def forward(self, ids, mask):
                return self.m(input_ids=ids, attention_mask=mask).logits

        ids = torch.randint(0, ID_HIGH, (2, 128))
        return _export(Text().eval(), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]), lambda seed: {
            "input_ids": np.random.default_rng(seed).integers(0, ID_HIGH, (1, 128)).astype(np.int64),
            "attention_mask": np.ones((1, 128), np.int64)}
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}, {QUICK}")


def _mlp() -> bytes:
    """A tiny MLP, ``x`` (N, 32) -> ``logits`` (N, 10), for ``--quick``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32), "w2")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["logits"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], [w1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def compile_om(blob: bytes, path: str, threads: int) -> None:
    import onnx

    import ge_core as ge

    ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": threads}).save(path)


def ort_session(model: bytes | str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


# -- the onnxruntime server ---------------------------------------------------------------------------
def ort_model(path: str, name: str, threads: int):
    """A ``kserve.Model`` answering v2 requests with an onnxruntime session (one run at a time, in
    a worker thread, as ``ge serve`` runs a model)."""
    from concurrent.futures import ThreadPoolExecutor

    saved, sys.argv = sys.argv, sys.argv[:1]  # kserve parses sys.argv when imported
    try:
        import kserve
        from kserve.protocol.infer_type import InferOutput, InferResponse
    finally:
        sys.argv = saved
    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32",
                 np.dtype(np.float64): "FP64"}

    class OrtModel(kserve.Model):
        batcher = None  # what ge serve's server reads of a GeModel

        def __init__(self) -> None:
            super().__init__(name)
            self.path = path
            self.pool = ThreadPoolExecutor(1)

        def load(self) -> bool:
            import asyncio  # noqa: F401 - used by predict

            self.sess = ort_session(path, threads)
            self.output_names = [o.name for o in self.sess.get_outputs()]
            self.ready = True
            return True

        async def predict(self, payload: Any, headers: Any = None, response_headers: Any = None) -> Any:
            import asyncio

            feeds = {t.name: t.as_numpy() for t in payload.inputs}
            outs = await asyncio.get_running_loop().run_in_executor(self.pool, self.sess.run, None, feeds)
            outputs = [InferOutput(name=n, shape=list(a.shape), datatype=datatypes[a.dtype], data=a)
                       for n, a in zip(self.output_names, outs)]
            return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs,
                                 use_binary_outputs=payload.use_binary_outputs,
                                 requested_outputs=payload.request_outputs)

    return OrtModel()


def ort_server(path: str, name: str, port: int, threads: int) -> int:
    from ge_tools.serving.server import serve

    return serve([ort_model(path, name, threads)], host="127.0.0.1", port=port)


# -- servers and the client ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess on 127.0.0.1: its log in a temporary file, stopped by SIGTERM."""

    def __init__(self, argv: list[str], model: str, folder: str, label: str) -> None:
        self.port, self.model, self.label = free_port(), model, label
        self.log_path = os.path.join(folder, f"{label.replace(' ', '_')}.log")
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], cwd=ROOT, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.url = f"127.0.0.1:{self.port}"

    def tail(self, n: int = 1500) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-n:]

    def wait_ready(self, timeout: float = READY_S) -> None:
        import tritonclient.http as http

        client = http.InferenceServerClient(self.url, connection_timeout=2.0, network_timeout=5.0)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} server exited with {self.proc.returncode}: {self.tail()}")
            with contextlib.suppress(Exception):
                if client.is_model_ready(self.model):
                    client.close()
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.label} server not ready after {timeout:.0f} s: {self.tail()}")

    def stop(self) -> int | None:
        """SIGTERM (the server drains), then kill after 30 s; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def infer(client, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One v2 request with binary tensors both ways."""
    import tritonclient.http as http

    inputs = []
    for k, v in feeds.items():
        t = http.InferInput(k, list(v.shape), {"float32": "FP32", "int64": "INT64"}[v.dtype.name])
        t.set_data_from_numpy(v, binary_data=True)
        inputs.append(t)
    res = client.infer(model, inputs, outputs=[http.InferRequestedOutput("logits", binary_data=True)])
    return {"logits": res.as_numpy("logits")}


def batch_stats(url: str, model: str) -> tuple[float, float]:
    """``(rows, runs)`` the server's ``ge_batch_size`` histogram counted so far for ``model``."""
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    got = {}
    for part in ("sum", "count"):
        m = re.search(rf'^ge_batch_size_{part}{{model="{re.escape(model)}"}} ([0-9.e+-]+)$', text, re.M)
        got[part] = float(m.group(1)) if m else 0.0
    return got["sum"], got["count"]


def load(url: str, model: str, draw: Callable[[int], dict], concurrency: int, n: int) -> tuple[float, list[float]]:
    """``n`` requests from ``concurrency`` closed-loop client threads: ``(requests / s, latencies s)``."""
    import tritonclient.http as http

    payloads = [draw(1000 + i) for i in range(min(n, 8))]
    lock, next_i, lats, errors = threading.Lock(), [0], [], []

    def worker() -> None:
        client = http.InferenceServerClient(url, connection_timeout=60.0, network_timeout=300.0)
        try:
            while True:
                with lock:
                    i = next_i[0]
                    next_i[0] += 1
                if i >= n:
                    return
                t0 = time.perf_counter()
                infer(client, model, payloads[i % len(payloads)])
                dt = time.perf_counter() - t0
                with lock:
                    lats.append(dt)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {type(errors[0]).__name__}: {errors[0]}")
    return n / wall, lats


# -- the bench ---------------------------------------------------------------------------------------
def start_servers(name: str, blob: bytes, folder: str, a) -> dict[str, Server]:
    """The three servers of one model, started at once (each loads and warms up on its own)."""
    onnx_path, om = os.path.join(folder, f"{name}.onnx"), os.path.join(folder, f"{name}.om")
    with open(onnx_path, "wb") as f:
        f.write(blob)
    t0 = time.perf_counter()
    compile_om(blob, om, a.threads)
    print(f"  compiled {name}.om in {time.perf_counter() - t0:.1f} s", flush=True)
    py, threads = sys.executable, str(a.threads)
    ge = [py, "-m", "ge_core.cli", "serve", om, "--threads", threads]
    argvs = {"ge batch": [*ge, "--max-batch", str(a.max_batch), "--max-delay-ms", str(a.max_delay_ms)],
             "ge": ge,
             "ort": [py, os.path.abspath(__file__), "--ort-server", onnx_path, "--name", name, "--threads", threads]}
    servers: dict[str, Server] = {}
    try:
        for label, argv in argvs.items():
            servers[label] = Server(argv, name, folder, label)
        t0 = time.perf_counter()
        for s in servers.values():
            s.wait_ready()
        print(f"  servers ready in {time.perf_counter() - t0:.1f} s", flush=True)
    except BaseException:
        for s in servers.values():
            s.stop()
        raise
    return servers


def in_process(model, draw, n: int) -> float:
    """Requests per second of one caller running the compiled model in this process, back to back."""
    feeds = [draw(i) for i in range(n)]
    t0 = time.perf_counter()
    for f in feeds:
        model.run(f)
    return n / (time.perf_counter() - t0)


def measure(name: str, servers: dict[str, Server], draw, ref: Callable[[dict], np.ndarray], a,
            om: str | None = None) -> dict:
    """``{"runs": {engine: {c: {"rps", "p50", "p99"}}}, "diff": {engine: rel. max |diff|}, "errors",
    "in_process": req/s of one in-process caller (median over rounds)}``."""
    import ge_core as ge

    local = ge.load_om(om, threads=a.threads) if om else None
    alone: list[float] = []
    errors: dict[str, str] = {}
    diff: dict[str, float] = {}
    import tritonclient.http as http

    probe = draw(7)
    want = ref(probe)
    for label, s in servers.items():
        try:
            client = http.InferenceServerClient(s.url, network_timeout=300.0)
            got = infer(client, name, probe)["logits"]
            client.close()
            diff[label] = float(np.max(np.abs(got.astype(np.float64) - want)) / max(float(np.max(np.abs(want))), 1e-30))
            load(s.url, name, draw, max(a.concurrency), 2 * max(a.concurrency))  # warm-up: every batch size
            load(s.url, name, draw, 1, 2)
        except Exception as e:  # noqa: BLE001 - report and go on
            errors[label] = f"{type(e).__name__}: {e}"[:300]
    live = [e for e in ENGINES if e in servers and e not in errors]
    rps: dict[str, dict[int, list[float]]] = {e: {c: [] for c in a.concurrency} for e in live}
    lats: dict[str, dict[int, list[float]]] = {e: {c: [] for c in a.concurrency} for e in live}
    batched: dict[str, dict[int, list[float]]] = {e: {c: [0.0, 0.0] for c in a.concurrency} for e in live}
    if local is not None:
        in_process(local, draw, 2)  # warm-up
    for r in range(a.rounds):
        if local is not None:  # the in-process caller, between the servers' runs (they are idle then)
            time.sleep(a.gap)
            alone.append(in_process(local, draw, a.requests))
        for c in a.concurrency:
            for label in live[r % len(live):] + live[:r % len(live)]:  # a different engine first each round
                if label in errors:
                    continue
                time.sleep(a.gap)
                url = servers[label].url
                try:
                    s0, n0 = batch_stats(url, name) if label != "ort" else (0.0, 0.0)
                    thr, lat = load(url, name, draw, c, max(a.requests, 2 * c))
                    s1, n1 = batch_stats(url, name) if label != "ort" else (0.0, 0.0)
                except Exception as e:  # noqa: BLE001
                    errors[label] = f"{type(e).__name__}: {e}"[:300]
                    continue
                batched[label][c][0] += s1 - s0
                batched[label][c][1] += n1 - n0
                rps[label][c].append(thr)
                lats[label][c].extend(lat)
    runs = {e: {c: {"rps": statistics.median(rps[e][c]), "p50": 1e3 * float(np.percentile(lats[e][c], 50)),
                    "p99": 1e3 * float(np.percentile(lats[e][c], 99))} for c in a.concurrency if rps[e][c]}
            for e in live if e not in errors}
    for e in runs:
        for c, v in runs[e].items():
            total, count = batched[e][c]
            v["rows"] = total / count if count else None  # mean rows per model run (ge's /metrics)
    return {"runs": runs, "diff": diff, "errors": errors, "in_process": statistics.median(alone) if alone else None}


def _x(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}x" if num and den else "-"


def _rps(r: dict, engine: str, c: int) -> float | None:
    return r["runs"].get(engine, {}).get(c, {}).get("rps")


def print_model(name: str, r: dict, concurrency) -> None:
    print(f"  {'engine':9s} {'conc':>4s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'rows/run':>8s}")
    for e in ENGINES:
        if e in r["errors"]:
            print(f"  {e:9s} FAILED ({r['errors'][e]})")
            continue
        for c, v in r["runs"].get(e, {}).items():
            rows = "-" if v.get("rows") is None else f"{v['rows']:.2f}"
            print(f"  {e:9s} {c:4d} {v['rps']:8.2f} {v['p50']:8.2f} {v['p99']:8.2f} {rows:>8s}")
    print("  outputs vs onnxruntime in-process (max |diff| / max |ref|): "
          + ", ".join(f"{e} {d:.1e}" for e, d in r["diff"].items()))
    lo, hi = min(concurrency), max(concurrency)
    print(f"  c{hi}/c{lo} throughput: " + "   ".join(f"{e} {_x(_rps(r, e, hi), _rps(r, e, lo))}" for e in ENGINES)
          + f"   (ge batch c{hi} / ge c{lo}: {_x(_rps(r, 'ge batch', hi), _rps(r, 'ge', lo))})")
    one = r.get("in_process")
    if one:
        print(f"  one in-process caller (model.run back to back): {one:.2f} req/s; served / in-process: "
              + "   ".join(f"c{c} ge {_x(_rps(r, 'ge', c), one)}, ge batch {_x(_rps(r, 'ge batch', c), one)}"
                         for c in concurrency))
    for label, a, b in (("ge batch / ort", "ge batch", "ort"), ("ge / ort", "ge", "ort"),
                        ("batching on/off (ge batch / ge)", "ge batch", "ge")):
        print(f"  {label}: " + "   ".join(f"c{c} {_x(_rps(r, a, c), _rps(r, b, c))}" for c in concurrency))
    sys.stdout.flush()


def targets(results: dict, concurrency=CONCURRENCY) -> str:
    """#48's targets on ResNet-50 with dynamic batching: c16 >= 1.3x c1, and c16 >= onnxruntime's."""
    r = results.get(TARGET_MODEL)
    lo, hi = min(concurrency), max(concurrency)
    if r is None:
        return f"targets: n/a ({TARGET_MODEL} not run)"
    top, one, ort = _rps(r, "ge batch", hi), _rps(r, "ge batch", lo), _rps(r, "ort", hi)
    scale = top / one if top and one else None
    vs = top / ort if top and ort else None
    parts = [f"ge batch c{hi} >= {TARGET_SCALING:g}x c{lo}: " + ("NO (missing)" if scale is None else
                                                              f"{'yes' if scale >= TARGET_SCALING else 'NO'} ({scale:.2f}x)"),
             f"ge batch c{hi} >= ort c{hi}: " + ("NO (missing)" if vs is None else
                                                 f"{'yes' if vs >= 1.0 else 'NO'} ({vs:.2f}x)")]
    met = scale is not None and scale >= TARGET_SCALING and vs is not None and vs >= 1.0
    return f"targets [{TARGET_MODEL}]: {'ALL MET' if met else 'not met'}: " + " | ".join(parts)


def run_model(name: str, a, folder: str) -> dict | None:
    t0 = time.perf_counter()
    try:
        blob, draw = build(name)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"\n{name}: EXPORT FAILED {type(e).__name__}: {e}")
        return None
    sess = ort_session(blob, a.threads)
    shapes = ", ".join(f"{k}{tuple(v.shape)} {v.dtype}" for k, v in draw(0).items())
    print(f"\n{name}: {len(blob) / 1e6:.1f} MB ONNX, request {shapes}, exported in {time.perf_counter() - t0:.1f} s",
          flush=True)
    try:
        servers = start_servers(name, blob, folder, a)
    except Exception as e:  # noqa: BLE001
        print(f"  SERVERS FAILED: {type(e).__name__}: {e}")
        return None
    try:
        r = measure(name, servers, draw, lambda f: sess.run(None, f)[0].astype(np.float64), a,
                    os.path.join(folder, f"{name}.om"))
    finally:
        codes = {label: s.stop() for label, s in servers.items()}
    print_model(name, r, a.concurrency)
    print("  servers stopped (SIGTERM): " + ", ".join(f"{k} exit {v}" for k, v in codes.items()))
    r["exit"] = codes
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="", help=f"comma list of {','.join(MODELS)} (default: both)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every engine's run (default 2)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    ap.add_argument("--requests", type=int, default=None, help="requests per timed run (default 48, at least 2x c)")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="comma list of client counts")
    ap.add_argument("--gap", type=float, default=None, help="idle seconds before each timed run (default 0.5)")
    ap.add_argument("--max-batch", type=int, default=16, help="ge batch's --max-batch (default 16)")
    ap.add_argument("--max-delay-ms", type=float, default=2.0, help="ge batch's --max-delay-ms (default 2)")
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny MLP, one round, few requests")
    ap.add_argument("--ort-server", metavar="M.onnx", help=argparse.SUPPRESS)  # the onnxruntime server process
    ap.add_argument("--name", default="model", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.ort_server:
        return ort_server(a.ort_server, a.name, a.port, a.threads)
    names = [m.strip() for m in a.models.split(",") if m.strip()] or ([QUICK] if a.quick else list(MODELS))
    for m in names:
        if m not in (*MODELS, QUICK):
            ap.error(f"unknown model {m!r}; known: {', '.join(MODELS)}, {QUICK}")
    a.concurrency = [int(c) for c in a.concurrency.split(",") if c.strip()]
    a.rounds = a.rounds if a.rounds is not None else 1 if a.quick else 3
    a.requests = a.requests if a.requests is not None else 16 if a.quick else 48
    a.gap = a.gap if a.gap is not None else 0.0 if a.quick else 0.5
    import precision  # bench/precision.py: the CPU's model name and flags

    cpu, flags = precision.cpu_flags()
    shown = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_int8")
    print(f"CPU: {cpu}, {os.cpu_count()} logical; " + " ".join(f"{f}{'+' if f in flags else '-'}" for f in shown))
    print(f"OPENBLAS_CORETYPE {os.environ.get('OPENBLAS_CORETYPE', 'unset')}; "
          f"threads {a.threads} per engine; concurrency {','.join(map(str, a.concurrency))}; rounds {a.rounds}; "
          f"{a.requests} requests per timed run; gap {a.gap} s; ge batch: --max-batch {a.max_batch} "
          f"--max-delay-ms {a.max_delay_ms:g}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="ge_serve_bench_") as folder:
        for name in names:
            r = run_model(name, a, folder)
            if r is not None:
                results[name] = r
    print("\n" + targets(results, a.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
