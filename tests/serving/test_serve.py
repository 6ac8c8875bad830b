"""``ge serve`` as a user meets it: a server started by the command (a subprocess on 127.0.0.1 and a
free port, killed in a finally), a real KServe v2 client (tritonclient.http) for metadata and
results in JSON and binary, concurrent clients, every kind of bad request, and a draining SIGTERM."""

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core

tritonclient_http = pytest.importorskip("tritonclient.http")  # dev dependency: a real v2 client

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model with a symbolic batch dim (x[batch,4] -> y = x@W+b [batch,3], z = relu(x)),
    compiled and saved as tiny.om; returns (path, the model loaded in-process)."""
    d = tmp_path_factory.mktemp("serve")
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"]),
         helper.make_node("Relu", ["x"], ["z"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(d / "tiny.onnx"))
    path = str(d / "tiny.om")
    ge_core.compile(str(d / "tiny.onnx")).save(path)
    return path, ge_core.load_om(path)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _server(om, *flags, env=None):
    """``ge serve om flags...`` on a free port; yields (process, "127.0.0.1:port") once ready."""
    port = _free_port()
    log = open(os.path.join(os.path.dirname(om), f"serve-{port}.log"), "w+")
    proc = subprocess.Popen([sys.executable, "-m", "ge_core.cli", "serve", om, "--port", str(port), *flags],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 40
        while True:
            assert proc.poll() is None, open(log.name).read()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            assert time.monotonic() < deadline, open(log.name).read()[-3000:]
            time.sleep(0.1)
        proc.log = log.name
        yield proc, f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        log.close()


def _post(url, path, body, headers=None, timeout=10):
    """(status, decoded JSON body, headers) of a POST on a new connection."""
    host, port = url.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        c.request("POST", path, body=data, headers={"Content-Type": "application/json", **AUTH, **(headers or {})})
        r = c.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if raw else None, dict(r.getheaders())
    finally:
        c.close()


def _infer_body(x, **extra):
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}], **extra}


@pytest.fixture(scope="module")
def served(tiny):
    """One server for the client tests: token from $GE_SERVE_TOKEN, dynamic batching on."""
    grpc_port = _free_port()
    with _server(tiny[0], "--max-batch", "8", "--max-delay-ms", "1", "--max-body-mb", "1", "--grpc-port",
                 str(grpc_port), env={"GE_SERVE_TOKEN": TOKEN}) as (proc, url):
        proc.grpc = f"127.0.0.1:{grpc_port}"
        yield proc, url


def test_tritonclient_gets_metadata_and_results_in_json_and_binary(tiny, served):
    _, model = tiny
    _, url = served
    client = tritonclient_http.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready(headers={**AUTH})
    meta = client.get_model_metadata("tiny", headers={**AUTH})
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [("y", [-1, 3]), ("z", [-1, 4])]
    rng = np.random.default_rng(1)
    for binary in (False, True):
        x = rng.standard_normal((3, 4)).astype(np.float32)
        inp = tritonclient_http.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        outs = [tritonclient_http.InferRequestedOutput(n, binary_data=binary) for n in ("y", "z")]
        res = client.infer("tiny", [inp], outputs=outs, headers={**AUTH}, request_id=f"r{binary}")
        want = model.run({"x": x})
        np.testing.assert_allclose(res.as_numpy("y"), want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(res.as_numpy("z"), want["z"])
        assert res.get_response()["id"] == f"r{binary}"
    only = client.infer("tiny", [inp], outputs=[tritonclient_http.InferRequestedOutput("z")], headers={**AUTH})
    assert [o["name"] for o in only.get_response()["outputs"]] == ["z"]
    client.close()


def test_grpc_answers_with_the_token(tiny, served):
    from ge_sdk.serving.model import kserve  # imports kserve with sys.argv hidden from its parser

    proc, _ = served
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    async def ask(token):
        client = kserve.InferenceGRPCClient(proc.grpc)
        inp = kserve.InferInput("x", [2, 4], "FP32")
        inp.set_data_from_numpy(x)
        try:
            return await client.infer(kserve.InferRequest("tiny", [inp]), headers=[("authorization", f"Bearer {token}")])
        finally:
            await client.close()

    res = asyncio.run(ask(TOKEN))
    got = {o.name: o.as_numpy() for o in res.outputs}
    np.testing.assert_allclose(got["y"], tiny[1].run({"x": x})["y"], rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="UNAUTHENTICATED"):
        asyncio.run(ask("wrong"))


def test_concurrent_clients_are_answered_and_bad_requests_refused(tiny, served):
    _, model = tiny
    proc, url = served
    failures, lock = [], threading.Lock()

    def client(k):
        c = tritonclient_http.InferenceServerClient(url)
        rng = np.random.default_rng(100 + k)
        for i in range(25):
            x = rng.standard_normal((1 + (i % 2), 4)).astype(np.float32)
            inp = tritonclient_http.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=bool(i % 3))
            try:
                y = c.infer("tiny", [inp], headers={**AUTH}).as_numpy("y")
                np.testing.assert_allclose(y, model.run({"x": x})["y"], rtol=1e-5, atol=1e-6)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    failures.append(f"client {k} request {i}: {e}")
        c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    served_rps = 200 / (time.perf_counter() - t0)
    assert not failures, failures[:5]
    x = np.ones((1, 4), np.float32)
    t0 = time.perf_counter()
    for _ in range(200):
        model.run({"x": x})
    print(f"\n8 clients x 25 requests over HTTP: {served_rps:.0f} req/s; one in-process caller: "
          f"{200 / (time.perf_counter() - t0):.0f} req/s")

    good = _infer_body(np.ones((1, 4), np.float32))
    x14 = [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    short = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                    "parameters": {"binary_data_size": 12}}]}).encode()  # 3 floats for 4
    bad = [  # (path, body, headers, status, words the message names)
        ("/v2/models/nope/infer", good, {}, 404, ["nope"]),
        ("/v2/models/tiny/infer", {"inputs": x14 + [{**x14[0], "name": "q"}]}, {}, 400, ["'q'"]),
        ("/v2/models/tiny/infer", {"inputs": []}, {}, 400, ["missing", "'x'"]),
        ("/v2/models/tiny/infer", _infer_body(np.ones((1, 5), np.float32)), {}, 400, ["shape", "[1, 5]", "[-1, 4]"]),
        ("/v2/models/tiny/infer", {"inputs": [{**x14[0], "datatype": "INT64"}]}, {}, 400, ["INT64", "FP32"]),
        ("/v2/models/tiny/infer", {"inputs": [{**x14[0], "data": [1, 2, 3]}]}, {}, 400, ["'x'", "shape"]),
        ("/v2/models/tiny/infer", {**good, "outputs": [{"name": "w"}]}, {}, 400, ["output 'w'"]),
        ("/v2/models/tiny/infer", b'{"inputs": [{"name": "x",', {}, 400, ["malformed", "JSON"]),
        ("/v2/models/tiny/infer", short + b"\0" * 12, {"Inference-Header-Content-Length": str(len(short))}, 400,
         ["'x'", "shape"]),
        ("/v2/models/tiny/infer", short, {"Inference-Header-Content-Length": str(len(short))}, 400,
         ["'x'", "binary_data_size"]),
        ("/v2/models/tiny/infer", b"[" + b"1.0," * 300_000 + b"1.0]", {}, 413, ["limit"]),
        ("/v2/models/tiny/infer", good, {"Authorization": ""}, 401, ["token"]),
        ("/v2/models/tiny/infer", good, {"Authorization": "Bearer nope"}, 401, ["wrong", "token"]),
    ]
    for path, body, headers, status, words in bad:
        got, answer, _ = _post(url, path, body, headers)
        assert got == status, (path, status, got, answer)
        assert all(w in answer["error"] for w in words), (words, answer)
        ok, out, hdrs = _post(url, "/v2/models/tiny/infer", good, {"X-Request-Id": "after-bad"})
        assert ok == 200 and len(out["outputs"]) == 2 and hdrs.get("x-request-id") == "after-bad"
    with urllib.request.urlopen(urllib.request.Request(f"http://{url}/metrics", headers={**AUTH})) as r:
        text = r.read().decode()
    assert 'ge_requests_total{model="tiny",status="ok"}' in text
    logged = [json.loads(line) for line in open(proc.log) if line.startswith("{")]
    assert any(d.get("request_id") == "after-bad" and d.get("status") == 200 for d in logged)


def test_sigterm_drains_every_accepted_request(tiny):
    path, model = tiny
    outcomes, lock, stop = [], threading.Lock(), threading.Event()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    want = model.run({"x": x})["y"]

    with _server(path, "--max-batch", "4", "--max-delay-ms", "5", "--workers", "2") as (proc, url):
        def client(k):
            i = 0
            while not stop.is_set():
                rid = f"c{k}-{i}"
                i += 1
                try:
                    status, body, _ = _post(url, "/v2/models/tiny/infer", _infer_body(x), {"X-Request-Id": rid})
                except (ConnectionError, http.client.HTTPException, OSError) as e:
                    with lock:
                        outcomes.append((rid, type(e).__name__, None))
                    if isinstance(e, ConnectionRefusedError):
                        return
                    continue
                y = np.array(body["outputs"][0]["data"], np.float32).reshape(2, 3) if status == 200 else None
                with lock:
                    outcomes.append((rid, status, y))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0, open(proc.log).read()[-3000:]
        finally:
            stop.set()
            for t in threads:
                t.join(15)
        logged = [json.loads(line) for line in open(proc.log) if line.startswith("{")]
    ok = {rid for rid, status, _ in outcomes if status == 200}
    assert len(ok) >= 8, outcomes[:10]
    for rid, status, y in outcomes:
        assert status in (200, 503) or isinstance(status, str), (rid, status)
        if status == 200:
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    # every request the server answered 200 reached its client (nothing accepted was lost)
    answered = {d["request_id"] for d in logged if d.get("message") == "request" and d.get("status") == 200
                and d.get("path") == "/v2/models/tiny/infer"}
    assert answered == ok
    assert any(d.get("message") == "draining" for d in logged)


def test_cli_without_kserve_says_what_to_install_and_help_does_not_import_it(tiny):
    code = ("import sys; sys.modules['kserve'] = None\n"
            "from ge_core.cli import main\n"
            f"sys.exit(main(['serve', {tiny[0]!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "pip install 'ge-python[serve]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    code = ("import sys\nfrom ge_core.cli import main\n"
            "try:\n    main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'kserve' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--max-batch" in r.stdout, r.stderr


def test_gear_model_batches_pad_to_the_next_gear(tiny, tmp_path):
    """A gear .om (atc --dynamic_batch_size 1,2,4): metadata shows the batch dim as -1, the batcher
    may join 3 rows, which run on the gear 4 padded with zero rows and come back as 3."""
    from ge_sdk.serving.model import GeModel

    src = os.path.join(os.path.dirname(tiny[0]), "tiny.onnx")
    code = "import sys; from ge_atc.cli import main; sys.exit(main(sys.argv[1:]))"
    subprocess.run([sys.executable, "-c", code, f"--model={src}", "--framework=5", "--input_shape=x:-1,4",
                    "--dynamic_batch_size=1,2,4", f"--output={tmp_path / 'gears'}", "--precision_mode=force_fp32"],
                   check=True, capture_output=True, timeout=120)
    m = GeModel(str(tmp_path / "gears.om"), max_batch=8, max_delay_ms=50)
    assert m.load() and m.ready and m.gear_rows == [1, 2, 4] and m.batcher.max_batch == 4
    assert m.get_input_types() == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    xs = [np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32) for i in range(3)]

    async def three():
        return await asyncio.gather(*(m.batcher.submit({"x": x}) for x in xs))

    for x, out in zip(xs, asyncio.run(three())):
        np.testing.assert_allclose(out["y"], tiny[1].run({"x": x})["y"], rtol=1e-5, atol=1e-5)
