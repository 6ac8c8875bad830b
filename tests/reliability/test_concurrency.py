"""One compiled model run from 8 threads at once: 1,000 runs, every result equal to the
sequential one (exactly: same kernels, same inputs)."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest

import ge_core as ge

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
THREADS = 8


def _inputs(model, n):
    v = model.graph.inputs[0]
    rng = np.random.default_rng(0)
    return [{v.name: rng.standard_normal(v.type.shape).astype(np.float32)} for _ in range(n)]


def _hammer(model, feeds, expected, runs):
    barrier = threading.Barrier(THREADS)
    mismatches = []
    done = []

    def worker(t):
        barrier.wait()  # all threads start together
        for k in range(runs // THREADS):
            i = (t + k) % len(feeds)  # threads work on different inputs at the same time
            out = model.run(feeds[i])
            for name, ref in expected[i].items():
                if out[name].shape != ref.shape or not np.array_equal(out[name], ref):
                    mismatches.append((t, k, i, name))
            done.append(1)

    with ThreadPoolExecutor(THREADS) as ex:
        list(ex.map(worker, range(THREADS)))
    return mismatches, len(done)


@pytest.fixture(scope="module")
def squeezenet():
    # The light model's softmax is uniform whatever the input (dummy weights), so intermediate
    # tensors that do depend on the input are outputs too: a race shows up in them.
    return ge.compile(os.path.join(LIGHT_DIR, "light_squeezenet.onnx"), out_nodes="r60;r65;softmaxout_1")


def test_one_model_from_8_threads_1000_runs(squeezenet):
    feeds = _inputs(squeezenet, 5)
    expected = [squeezenet.run(f) for f in feeds]  # sequential reference
    assert not np.array_equal(expected[0]["r65"], expected[1]["r65"])  # inputs differ: results differ
    mismatches, runs = _hammer(squeezenet, feeds, expected, 1000)
    assert runs == 1000
    assert not mismatches, f"{len(mismatches)} of 1000 concurrent runs differ from the sequential ones: {mismatches[:5]}"


def test_loaded_om_from_8_threads(squeezenet, tmp_path):
    path = str(tmp_path / "sq.om")
    squeezenet.save(path)
    model = ge.load_om(path)  # weights memory-mapped
    feeds = _inputs(model, 3)
    expected = [squeezenet.run(f) for f in feeds]
    mismatches, runs = _hammer(model, feeds, expected, 160)
    assert runs == 160 and not mismatches, mismatches[:5]
