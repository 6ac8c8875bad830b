"""bench/transformer_models.py on its "tiny" configs: build, export with the TorchScript exporter, compile with
this engine and run; the output matches onnxruntime's on the same export. This checks numerics on
real exporter output (rotary embeddings and grouped-query attention, shifted windows, a conv feature
extractor with GroupNorm and a grouped positional conv) and keeps the bench's builders working."""

import importlib.util
import os

import numpy as np
import pytest
import torch  # noqa: F401
import transformers  # noqa: F401 - the "bench" extra, installed by .ci/run

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "transformer_models.py")


@pytest.fixture(scope="module")
def bench():
    # Loaded by path under another name: "transformers" would clash with the package it imports.
    spec = importlib.util.spec_from_file_location("ge_bench_transformers", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["llama", "swin", "wav2vec2", "gpt2"])
def test_tiny_model_matches_onnxruntime(bench, name):
    model, feeds = bench.build(name, "tiny")
    blob = bench.to_onnx(model, feeds)
    want = bench.first(bench.ort_engine(blob, 1)(feeds))
    # one thread; two with BLAS's threads; two on GE's pool (packed weights, per-head attention)
    for threads, parallel in ((1, "blas"), (2, "blas"), (2, "engine")):
        got = bench.first(bench.ge_engine(blob, threads, parallel)(feeds))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=f"threads={threads} parallel={parallel}")


def test_every_model_is_known_and_sized(bench):
    assert set(bench.MODELS) == set(bench.FAMILY_OF)
    with pytest.raises(ValueError):
        bench.build("bert", "huge")
    with pytest.raises(ValueError):
        bench.build("no_such_model")
