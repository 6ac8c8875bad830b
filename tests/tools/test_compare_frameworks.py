"""ge compare --reference tensorflow|torch: the source model run by its own framework (a
SavedModel through its signature, a Keras file, a .pt2 program read without unpickling), per
output max abs/rel error, exit status 1 for a planted divergence (a test plugin's pass that
swaps every Tanh for a kernel 1% off) naming the output, 2 for usage errors."""

import os
import warnings

import numpy as np
import pytest

import ge_core as ge
from ge_core.cli import main
from ge_sdk import Plugin, same_as_input
from tests.tools.test_compare import run_compare

tf = pytest.importorskip("tensorflow")  # the [tensorflow] extra, in dev
torch = pytest.importorskip("torch")


def _swap_tanh(graph, ctx):
    changed = False
    for n in graph.nodes:
        if n.op_type == "Tanh" and not n.domain:
            n.op_type, n.domain = "BadTanh", "test.bad"
            graph.opset_imports["test.bad"] = 1
            changed = True
    return changed


@pytest.fixture
def planted(fresh_host):
    plugin = Plugin("planted_tanh")

    @plugin.op("BadTanh", domain="test.bad", infer=same_as_input())
    def bad_tanh(x):
        return np.tanh(x) * np.float32(1.01)

    plugin.graph_pass("plant_bad_tanh_everywhere", stage="optimize", opt_level=0)(_swap_tanh)
    fresh_host.register_plugin(plugin, "planted_tanh")
    yield fresh_host


class _Net(tf.Module):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.w0 = tf.Variable(rng.standard_normal((8, 16)).astype(np.float32))
        self.w1 = tf.Variable(rng.standard_normal((16, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def __call__(self, x):
        h = tf.tanh(tf.matmul(x, self.w0))
        return {"y": tf.matmul(h, self.w1), "s": tf.reduce_sum(h, axis=1)}


@pytest.fixture(scope="module")
def tf_models(tmp_path_factory):
    import keras

    d = tmp_path_factory.mktemp("tf")
    net = _Net()
    tf.saved_model.save(net, str(d / "saved"), signatures=net.__call__)
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,), name="x")
    km = keras.Model(inp, keras.layers.Dense(4)(keras.layers.Dense(16, activation="tanh")(inp)))
    km.save(str(d / "m.keras"))
    return {"saved": str(d / "saved"), "keras": str(d / "m.keras"), "net": net, "km": km}


def _x(batch=3):
    return np.random.default_rng(5).standard_normal((batch, 8)).astype(np.float32)


def test_a_saved_model_passes_and_the_error_is_tensorflows(tf_models, tmp_path, capsys):
    np.save(tmp_path / "x.npy", _x())
    rc, r, err = run_compare(capsys, tf_models["saved"], "--reference", "tensorflow", "--input", f"x={tmp_path / 'x.npy'}")
    assert rc == 0 and r["ok"] and r["reference"] == "tensorflow", err
    assert sorted(o["name"] for o in r["outputs"]) == ["s", "y"]
    # the reported error is the one against TensorFlow itself, on the same input
    want = tf_models["net"](tf.constant(_x()))
    got = ge.compile(tf_models["saved"]).run(_x())
    for o in r["outputs"]:
        err_tf = float(np.abs(got[o["name"]].astype(np.float64) - want[o["name"]].numpy()).max())
        assert o["max_abs"] == pytest.approx(err_tf, abs=1e-12) and o["max_abs"] < 1e-4


def test_a_keras_file_and_an_om_of_it(tf_models, tmp_path, capsys):
    rc, r, err = run_compare(capsys, tf_models["keras"], "--reference", "tensorflow", "--batch", 2)
    assert rc == 0 and r["ok"] and len(r["outputs"]) == 1 and r["outputs"][0]["max_abs"] < 1e-4, err
    om = ge.compile(tf_models["keras"]).save(str(tmp_path / "k.om"))  # the .om remembers its source
    rc, r, err = run_compare(capsys, om, "--reference", "tensorflow", "--batch", 2)
    assert rc == 0 and r["ok"] and r["source"] == tf_models["keras"], err


def test_a_planted_divergence_fails_against_tensorflow_naming_the_outputs(planted, tf_models, capsys):
    rc, r, err = run_compare(capsys, tf_models["saved"], "--reference", "tensorflow", "--batch", 2)
    assert rc == 1 and not r["ok"], err
    bad = {o["name"]: o for o in r["outputs"]}
    assert not bad["y"]["ok"] and not bad["s"]["ok"] and bad["s"]["max_rel"] > 1e-3
    capsys.readouterr()
    assert main(["compare", tf_models["keras"], "--reference", "tensorflow", "--batch", "2"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and out.rstrip().endswith("beyond the tolerance")


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x, y):
        h = torch.tanh(self.a(x))
        return self.b(torch.nn.functional.gelu(h)) + y, h.sum(-1)


@pytest.fixture(scope="module")
def pt2(tmp_path_factory):
    torch.manual_seed(0)
    ep = torch.export.export(_TorchNet().eval(), (torch.randn(2, 8), torch.randn(2, 4)))
    path = str(tmp_path_factory.mktemp("pt") / "m.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(ep, path)
    return path, ep


def test_a_pt2_program_passes_and_the_error_is_torchs(pt2, tmp_path, capsys, monkeypatch):
    path, ep = pt2
    # the file is never unpickled: torch.export.load is not what reads it
    monkeypatch.setattr(torch.export, "load", lambda *a, **k: pytest.fail("torch.export.load was called"))
    x, y = _x(2), np.random.default_rng(6).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    model = ge.compile(path)
    rc, r, err = run_compare(capsys, path, "--reference", "torch", "--input", f"{model.input_names[0]}={tmp_path / 'x.npy'}",
                          f"{model.input_names[1]}={tmp_path / 'y.npy'}")
    assert rc == 0 and r["ok"] and r["reference"] == "torch" and len(r["outputs"]) == 2, err
    with torch.no_grad():
        want = ep.module()(torch.from_numpy(x), torch.from_numpy(y))
    got = model.run({model.input_names[0]: x, model.input_names[1]: y})
    for o, w in zip(r["outputs"], want):
        err_torch = float(np.abs(got[o["name"]].astype(np.float64) - w.numpy()).max())
        assert o["max_abs"] == pytest.approx(err_torch, abs=1e-12) and o["max_abs"] < 1e-4


def test_torch_divergences_fail_naming_the_outputs(planted, pt2, capsys):
    path, _ = pt2
    rc, r, err = run_compare(capsys, path, "--reference", "torch")
    assert rc == 1 and not r["ok"], err
    assert [o["ok"] for o in r["outputs"]] == [False, False]  # both outputs read the bad tanh


def test_zero_tolerance_fails_on_float_differences(pt2, capsys):
    path, _ = pt2
    rc, r, _ = run_compare(capsys, path, "--reference", "torch", "--rtol", 0, "--atol", 0)
    bad = [o for o in r["outputs"] if not o["ok"]]
    assert rc == 1 and bad and all(0 < o["max_abs"] < 1e-4 for o in bad)
    capsys.readouterr()
    assert main(["compare", path, "--reference", "torch", "--rtol", "0", "--atol", "0"]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith(bad[0]["name"]) and "MISMATCH" in line for line in out.splitlines())


def test_usage_errors_exit_2(tf_models, pt2, tmp_path, capsys):
    rc, _, err = run_compare(capsys, tf_models["saved"], "--reference", "tensorflow", "--per-node")
    assert rc == 2 and "--per-node" in err and "onnxruntime" in err
    om = ge.compile(pt2[0]).save(str(tmp_path / "m.om"))
    os.replace(pt2[0], str(tmp_path / "moved.pt2"))
    try:
        rc, _, err = run_compare(capsys, om, "--reference", "torch")
        assert rc == 2 and "--source" in err
        rc, r, err = run_compare(capsys, om, "--reference", "torch", "--source", tmp_path / "moved.pt2")
        assert rc == 0 and r["ok"], err
    finally:
        os.replace(str(tmp_path / "moved.pt2"), pt2[0])
