"""ge_ray (issue 48, past one machine): a compiled .om in Ray Data (``GePredictor`` over a dataset
of images, one loaded model per actor, equal to ``model.run`` row for row) and on Ray Serve (the
Open Inference Protocol of ``ge serve``, through a real client). One local Ray of 2 CPUs is started
for the module and shut down after it."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest
import ray
import ray.data
from onnx import TensorProto, helper

import ge_core as ge
from ge_core import InputError, ModelFileError, OptionError
from ge_ray import GePredictor, serve_app
from ge_ray.predictor import actor_cpus


def tiny_cnn(batch: int | str = "N") -> onnx.ModelProto:
    """Two conv blocks, global pooling and a classifier: ``image`` [batch,3,16,16] -> ``logits``, ``probs`` [batch,10]."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, (rng.standard_normal(int(np.prod(shape))) * 0.3).astype(np.float32))

    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, (batch, 3, 16, 16))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, (batch, 10)),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, (batch, 10))],
        [w("w1", 8, 3, 3, 3), w("b1", 8), w("w2", 16, 8, 3, 3), w("b2", 16), w("wf", 10, 16), w("bf", 10)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """``(path, model)``: the tiny CNN compiled, saved as an .om and loaded back."""
    path = str(tmp_path_factory.mktemp("ray") / "cnn.om")
    ge.compile(ge.load(tiny_cnn())).save(path)
    return path, ge.load_om(path)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True
    try:
        yield ray
    finally:
        ray.shutdown()


def images(n: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, 3, 16, 16)).astype(np.float32)


# -- Ray Data ------------------------------------------------------------------------------------
def test_a_ray_data_job_over_64_images_through_two_actors_equals_model_run(local_ray, cnn):
    path, model = cnn
    x = images(64)
    ds = ray.data.from_items([{"image": x[i], "id": i} for i in range(64)], override_num_blocks=4)
    rows = ds.map_batches(GePredictor, fn_constructor_kwargs={"model": path, "passthrough": ["id"]},
                          batch_size=16, concurrency=2).take_all()
    assert len(rows) == 64 and set(rows[0]) == {"logits", "probs", "id"}
    for r in rows:
        want = model.run({"image": x[r["id"]][None]})
        np.testing.assert_array_equal(r["logits"], want["logits"][0])
        np.testing.assert_array_equal(r["probs"], want["probs"][0])
    assert sorted(int(r["id"]) for r in rows) == list(range(64))


def test_a_one_input_model_takes_from_numpys_data_column(local_ray, cnn):
    path, model = cnn
    x = images(40)
    ds = ray.data.from_numpy(x).map_batches(GePredictor, fn_constructor_kwargs={"model": path}, batch_size=12,
                                            concurrency=1)
    got = ds.take_all()
    assert set(got[0]) == {"logits", "probs"}
    np.testing.assert_array_equal(np.stack([r["probs"] for r in got]), model.run({"image": x})["probs"])


def test_a_column_that_feeds_no_input_is_an_error_naming_it(cnn):
    path, _ = cnn
    p = GePredictor(path, threads=1)
    x = images(3)
    with pytest.raises(InputError, match=r"\['label'\] match no model input.*passthrough"):
        p({"image": x, "label": np.arange(3)})
    with pytest.raises(InputError, match=r"\['img', 'label'\] match no model input; the batch has no column for model input\(s\) \['image'\]"):
        p({"img": x, "label": np.arange(3)})
    with pytest.raises(InputError, match=r"dtype float64, the model expects float32.*column 'data' feeds it.*astype"):
        p({"data": x.astype(np.float64)})
    ragged = np.empty(2, dtype=object)
    ragged[0], ragged[1] = x[0], x[1, :, :8]
    with pytest.raises(InputError, match="column 'image'.*cannot be stacked"):
        p({"image": ragged})


def test_batches_of_per_row_arrays_are_stacked_and_passthrough_is_checked(cnn):
    path, model = cnn
    x = images(5)
    p = GePredictor(path, threads=1, passthrough=["id"])
    rows = np.empty(5, dtype=object)
    rows[:] = list(x)  # how Ray hands over a column of variable-shape tensors
    out = p({"image": rows, "id": np.arange(5)})
    np.testing.assert_array_equal(out["probs"], model.run({"image": x})["probs"])
    np.testing.assert_array_equal(out["id"], np.arange(5))
    with pytest.raises(InputError, match=r"passthrough column\(s\) \['id'\] are not in the batch"):
        p({"image": x})
    with pytest.raises(OptionError, match="passthrough"):
        GePredictor(path, passthrough="id")
    with pytest.raises(OptionError, match="names of model outputs"):
        GePredictor(path, passthrough=["probs"])
    with pytest.raises(OptionError, match="threads is a positive integer"):
        GePredictor(path, threads=0)
    with pytest.raises(ModelFileError, match="no such file"):
        GePredictor(path + ".missing")


def test_fixed_batch_and_gear_models_run_in_the_sizes_they_take(tmp_path):
    from ge_atc.cli import main as atc

    path = str(tmp_path / "b4.om")
    ge.compile(ge.load(tiny_cnn(batch=4))).save(path)
    model = ge.load_om(path)
    x = images(10)  # two runs of 4 and a last one padded from 2 rows to 4
    out = GePredictor(path, threads=1)({"data": x})
    assert out["probs"].shape == (10, 10)
    last = np.concatenate([x[8:], x[9:], x[9:]])
    want = np.concatenate([model.run({"image": x[:4]})["probs"], model.run({"image": x[4:8]})["probs"],
                           model.run({"image": last})["probs"][:2]])
    np.testing.assert_array_equal(out["probs"], want)

    onnx.save(tiny_cnn(), tmp_path / "cnn.onnx")
    assert atc([f"--model={tmp_path / 'cnn.onnx'}", "--framework=5", f"--output={tmp_path / 'gears'}",
                "--input_shape=image:-1,3,16,16", "--dynamic_batch_size=1,2,4"]) == 0
    gears = ge.load_om(tmp_path / "gears.om")
    p = GePredictor(tmp_path / "gears.om", threads=1)
    assert p.sizes == [1, 2, 4]
    x = images(7)  # gears 4, 2, 1
    want = np.concatenate([gears.run({"image": x[a:b]})["probs"] for a, b in ((0, 4), (4, 6), (6, 7))])
    np.testing.assert_array_equal(p({"data": x})["probs"], want)


def test_threads_follow_the_actors_cpus(local_ray, cnn):
    path, _ = cnn
    assert ray.get(ray.remote(num_cpus=2)(actor_cpus).remote(), timeout=60) == 2
    assert ray.get(ray.remote(num_cpus=1)(actor_cpus).remote(), timeout=60) == 1
    assert actor_cpus() == len(os.sched_getaffinity(0))  # the driver: its CPU affinity
    p = GePredictor(path, threads=3)  # an explicit count wins
    assert p.threads == 3 and p.model.options.threads == 3


# -- Ray Serve -----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_port(local_ray):
    """Ray Serve's HTTP proxy on a free port of 127.0.0.1, started once for the module's
    deployments (each test runs its application "ge" and deletes it)."""
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()


def test_the_ray_serve_deployment_answers_the_open_inference_protocol(serve_port, cnn):
    import tritonclient.http as httpclient
    from ray import serve

    path, model = cnn
    port = serve_port
    base = f"http://127.0.0.1:{port}"
    try:
        serve.run(serve_app([path], names=["net"], max_batch=4, max_delay_ms=2, max_replicas=2), name="ge", route_prefix="/")
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=10) as r:
            assert json.load(r) == {"ready": True}
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=10, network_timeout=30)
        meta = client.get_model_metadata("net")
        assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
        assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [("logits", [-1, 10]), ("probs", [-1, 10])]
        x = images(3)
        want = model.run({"image": x})
        for binary in (False, True):
            inp = httpclient.InferInput("image", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            res = client.infer("net", [inp], outputs=[httpclient.InferRequestedOutput("probs", binary_data=binary)])
            np.testing.assert_array_equal(res.as_numpy("probs"), want["probs"])
            assert res.as_numpy("logits") is None
        for url, body, status, words in ((f"{base}/v2/models/nope", None, 404, "nope"),
                                         (f"{base}/v2/models/net/infer", b"{bad", 400, "malformed"),
                                         (f"{base}/v2/models/net/infer", json.dumps({"inputs": [{
                                             "name": "img", "datatype": "FP32", "shape": [1], "data": [0]}]}).encode(),
                                          400, "no input 'img'")):
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == status and words in e.value.read().decode(), (url, e.value.code)
    finally:
        serve.delete("ge")


def test_the_ray_serve_deployment_refuses_a_missing_token_and_an_oversized_body(serve_port, cnn):
    """The guards of ``ge serve`` (the same app): 401 without the bearer token, 413 over the body
    limit; health stays open and a request with the token is answered."""
    from ray import serve

    path, _ = cnn
    base = f"http://127.0.0.1:{serve_port}"
    x = images(1)
    good = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}).encode()
    auth = {"Content-Type": "application/json", "Authorization": "Bearer t0ken"}
    try:
        serve.run(serve_app(path, names=["net"], token="t0ken", max_body_mb=0.02), name="ge", route_prefix="/")
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=10) as r:
            assert json.load(r) == {"ready": True}
        req = urllib.request.Request(f"{base}/v2/models/net/infer", data=good, headers={**auth, "X-Request-Id": "r1"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert [o["name"] for o in json.load(r)["outputs"]] == ["logits", "probs"]
        for headers, body, status, words in (({"Content-Type": "application/json"}, good, 401, "no bearer token"),
                                             ({**auth, "Authorization": "Bearer nope"}, good, 401, "wrong bearer token"),
                                             (auth, b"[" + b"1.0," * 8000 + b"1.0]", 413, "over the limit")):
            req = urllib.request.Request(f"{base}/v2/models/net/infer", data=body, headers=headers)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == status and words in e.value.read().decode(), (headers, e.value.code)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/v2/models/net", timeout=10)  # metadata needs the token too
        assert e.value.code == 401
    finally:
        serve.delete("ge")
    with pytest.raises(OptionError, match="bearer token is a non-empty string"):
        serve_app(path, token="")
    with pytest.raises(OptionError, match="max_body_mb is a positive number"):
        serve_app(path, max_body_mb=0)


def test_serve_app_checks_its_arguments(cnn, tmp_path):
    path, _ = cnn
    with pytest.raises(OptionError, match="one non-empty name per model"):
        serve_app([path, path], names=["a"])
    with pytest.raises(OptionError, match="two models are named 'cnn'"):
        serve_app([path, path])
    with pytest.raises(ModelFileError, match="no such .om file"):
        serve_app([str(tmp_path / "gone.om")])
    with pytest.raises(OptionError, match="max_replicas"):
        serve_app(path, min_replicas=3, max_replicas=2)
    with pytest.raises(OptionError, match="threads is a positive integer"):
        serve_app(path, threads=0)


def test_ge_serve_ray_without_ray_says_what_to_install(cnn, tmp_path):
    path, _ = cnn
    code = ("import sys; sys.modules['ray'] = None; import ge_ray; from ge_core.cli import main; "
            f"sys.exit(main(['serve-ray', {path!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "ge-python[ray]" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_ray_data_job_with_a_wrong_column_fails_naming_it(local_ray, cnn):
    """Last of the Ray tests: the failed job's actor may hold its CPU a while after the job ends."""
    path, _ = cnn
    x = images(3)
    ds = ray.data.from_items([{"image": x[i], "label": i} for i in range(3)])
    with pytest.raises(Exception, match=r"InputError.*\['label'\] match no model input"):  # Ray wraps it
        ds.map_batches(GePredictor, fn_constructor_kwargs={"model": path}, batch_size=3, concurrency=1).take_all()
