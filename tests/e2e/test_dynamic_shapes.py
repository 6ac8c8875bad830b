"""Dynamic shapes end to end (issue 20): real architectures exported with dynamic axes compile once,
every intermediate is planned in one symbolic arena (no dynamic buffers), and each run at a new
shape matches onnxruntime; shape ranges are checked at compile and at run time."""

import importlib.util
import io
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ge_core as ge
from ge_core.errors import InputError, OptionError

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "dynamic.py")


def _export(module, args, names, dynamic, out="out") -> bytes:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=names, output_names=[out], opset_version=17,
                          dynamo=False, dynamic_axes=dynamic)
    return buf.getvalue()


@pytest.fixture(scope="module")
def bert_blob():
    # the bench's model (bench/dynamic.py), loaded by path, in a narrow config
    spec = importlib.util.spec_from_file_location("ge_bench_dynamic", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.bert_onnx(hidden=64, layers=2, heads=2, vocab=500)


def _feeds(shape, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 500, shape).astype(np.int64)
    mask = np.ones(shape, np.int64)
    mask[:, shape[1] // 2:] = rng.integers(0, 2, (shape[0], shape[1] - shape[1] // 2))
    return {"input_ids": ids, "attention_mask": mask}


def test_bert_with_dynamic_batch_and_sequence_compiles_once_and_plans_every_buffer(bert_blob, tmp_path):
    model = ge.compile(ge.load(onnx.load_from_string(bert_blob)), {"threads": 1})
    mem = model.report["memory"]
    assert mem["dynamic_buffers"] == 0, "every intermediate tensor is planned in the arena"
    sym = mem["symbolic"]
    assert sym["symbols"] == {"batch": [1, None], "seq": [1, None]} and sym["planned_buffers"] > 20
    path = model.save(tmp_path / "bert.om")
    loaded = ge.load_om(path)
    sess = ort.InferenceSession(bert_blob, providers=["CPUExecutionProvider"])
    arenas = {}
    for k, shape in enumerate([(1, 16), (2, 64), (4, 128), (3, 77)]):
        feeds = _feeds(shape, k)
        want = sess.run(None, feeds)[0]
        for m in (model, loaded):
            got = m.run(feeds)["out"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        arenas[shape] = model.arena_bytes_at({"batch": shape[0], "seq": shape[1]})
        assert loaded.arena_bytes_at({"batch": shape[0], "seq": shape[1]}) == arenas[shape]
    # the arena follows the shapes: a larger run never needs less
    assert 0 < arenas[(1, 16)] < arenas[(2, 64)] < arenas[(4, 128)]
    assert arenas[(2, 64)] < arenas[(3, 77)] < arenas[(4, 128)]


def test_ge_inspect_shows_the_symbolic_plan(bert_blob, tmp_path):
    from tests.e2e.test_cli import ge as ge_cli

    src = tmp_path / "bert.onnx"
    src.write_bytes(bert_blob)
    r = ge_cli("compile", src, "-o", tmp_path / "b.om", "--input-shape",
               "input_ids:1~4,1~64;attention_mask:1~4,1~64", check=True)
    r = ge_cli("inspect", tmp_path / "b.om", check=True)
    line = next(x for x in r.stdout.splitlines() if "arena bytes" in x)
    assert "symbolic plan over batch 1~4, seq 1~64" in line and "0 outside" in line and "at batch=4,seq=64" in line


def test_a_range_is_part_of_the_input_type_and_checked_at_run_time(bert_blob):
    model = ge.compile(ge.load(onnx.load_from_string(bert_blob)),
                       {"threads": 1, "input_shape": "input_ids:1~4,8~128;attention_mask:1~4,8~128"})
    assert model.dim_ranges == {"batch": (1, 4), "seq": (8, 128)}
    assert model.report["memory"]["symbolic"]["symbols"] == {"batch": [1, 4], "seq": [8, 128]}
    sess = ort.InferenceSession(bert_blob, providers=["CPUExecutionProvider"])
    feeds = _feeds((4, 128), 5)
    np.testing.assert_allclose(model.run(feeds)["out"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
    for shape in [(5, 16), (2, 4), (1, 129)]:
        with pytest.raises(InputError, match="outside the range"):
            model.run(_feeds(shape, 0))


def test_bad_input_shapes_are_refused_at_compile_time(bert_blob):
    g = ge.load(onnx.load_from_string(bert_blob))
    cases = {
        "input_ids:1,16,3": "rank",                     # wrong rank
        "nosuch:1,16": "not an input",                  # unknown input
        "input_ids:4~2,16": "lo <= hi",                 # empty range
        "input_ids:0~4,16": "lo <= hi",                 # a size below 1
        "input_ids:1~x,16": "integers",
    }
    for shape, words in cases.items():
        with pytest.raises(OptionError, match=words):
            ge.compile(g, {"input_shape": shape})


def test_a_static_dim_that_conflicts_with_the_model_is_refused():
    import torch

    blob = _export(torch.nn.Conv2d(3, 4, 3).eval(), (torch.zeros(1, 3, 8, 8),), ["x"], {"x": {0: "n"}})
    g = ge.load(onnx.load_from_string(blob))
    for shape in ("x:1,4,8,8", "x:1,3~4,8,8"):
        with pytest.raises(OptionError, match="fixes it to 3"):
            ge.compile(g, {"input_shape": shape})


def test_a_cnn_with_symbolic_batch_matches_at_several_batches(tmp_path):
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU6(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 1), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(16, 10)).eval()
    blob = _export(net, (torch.zeros(1, 3, 32, 32),), ["x"], {"x": {0: "n"}, "out": {0: "n"}})
    model = ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": 1})
    assert model.report["memory"]["dynamic_buffers"] == 0
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for n in (1, 2, 5):
        x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["out"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert model.arena_bytes_at({"n": 5}) > model.arena_bytes_at({"n": 1}) > 0


def test_an_image_size_range_plans_the_windows_symbolically():
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
                        nn.Conv2d(4, 4, 5, padding=2, dilation=1)).eval()
    blob = _export(net, (torch.zeros(1, 3, 32, 32),), ["x"], {"x": {2: "h", 3: "w"}, "out": {2: "oh", 3: "ow"}})
    model = ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": 1, "input_shape": "x:1,3,16~64,16~64"})
    assert model.report["memory"]["dynamic_buffers"] == 0
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for h, w in [(16, 16), (33, 47), (64, 20)]:
        x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["out"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_shape_steps_are_kept_per_shape_and_runs_alternate_between_shapes(bert_blob):
    """The exporter's shape arithmetic (Shape -> Gather -> Concat -> Reshape, position ids) runs
    once per shape; later runs at that shape take its results as constants. Alternating shapes
    (and more shapes than the layouts kept) never mixes them up."""
    model = ge.compile(ge.load(onnx.load_from_string(bert_blob)), {"threads": 1})
    sess = ort.InferenceSession(bert_blob, providers=["CPUExecutionProvider"])
    shapes = model.executable.shapes
    assert len(shapes.shape_slots) >= 10
    cycle = [(1, 16), (2, 9), (1, 16), (3, 5), (2, 9)] + [(1, k) for k in range(20, 20 + shapes.KEEP + 1)] + [(1, 16)]
    for k, shape in enumerate(cycle):
        feeds = _feeds(shape, k)
        np.testing.assert_allclose(model.run(feeds)["out"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
    layout = shapes.entry({"batch": 1, "seq": 16})[0]
    assert {s for s, _ in layout.fixed} and all(not a.flags.writeable for _, a in layout.fixed)


@pytest.fixture(scope="module")
def zoo():
    # the transformers bench's architectures (bench/transformer_models.py), loaded by path
    path = os.path.join(os.path.dirname(BENCH), "transformer_models.py")
    spec = importlib.util.spec_from_file_location("ge_bench_transformers_dyn", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: per architecture (tiny config): its dynamic axes and three shapes of its input
REAL = {
    "bert": ({0: "batch", 1: "seq"}, [(1, 16), (3, 5), (2, 40)]),
    "distilbert": ({0: "batch", 1: "seq"}, [(1, 16), (3, 5), (2, 40)]),
    "gpt2": ({0: "batch", 1: "seq"}, [(1, 16), (3, 5), (2, 40)]),
    "llama": ({0: "batch", 1: "seq"}, [(1, 16), (3, 5), (2, 40)]),
    "t5enc": ({0: "batch", 1: "seq"}, [(1, 16), (3, 5), (2, 40)]),
    "vit": ({0: "batch"}, [(1, 3, 32, 32), (3, 3, 32, 32)]),
    "swin": ({0: "batch"}, [(1, 3, 32, 32), (3, 3, 32, 32)]),
    "whisper_enc": ({0: "batch"}, [(1, 80, 32), (3, 80, 32)]),
    "wav2vec2": ({0: "batch", 1: "samples"}, [(1, 1600), (3, 800), (2, 2400)]),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_architectures_with_dynamic_axes_run_every_shape_from_one_plan(zoo, name):
    axes, shapes = REAL[name]
    model, feeds = zoo.build(name, "tiny")
    (key, x), = feeds.items()
    blob = zoo.to_onnx(model, feeds, {key: axes})
    compiled = ge.compile(ge.load(onnx.load_from_string(blob)), {"threads": 1})
    assert compiled.report["memory"]["dynamic_buffers"] == 0, "every intermediate is planned symbolically"
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in shapes:
        feed = rng.integers(0, 1000, shape) if x.dtype.kind == "i" else rng.standard_normal(shape)
        feed = {key: feed.astype(x.dtype)}
        np.testing.assert_allclose(compiled.run(feed)["last_hidden_state"], sess.run(None, feed)[0],
                                   rtol=1e-4, atol=1e-4)
