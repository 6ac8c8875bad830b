"""Weights in the .om: one aligned blob, memory-mapped at load (no copy); the memory plan round-trips."""

import json
import mmap
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ge_core as ge
from ge_sdk import GraphBuilder

WEIGHT_MB = 48


def big_model():
    b = GraphBuilder("big")
    x = b.input("x", "float32", (1, 1024))
    w = b.const(np.random.default_rng(0).standard_normal((1024, WEIGHT_MB * 256)).astype(np.float32), "w")
    h = b.op("Relu", b.op("MatMul", x, w))
    b.output(b.op("ReduceSum", h, keepdims=0))
    return b.build()


def _base_chain(a):
    while a is not None:
        yield a
        a = getattr(a, "base", None)


def test_loaded_weights_are_views_of_the_mapped_file(tmp_path):
    model = ge.compile(big_model())
    path = model.save(tmp_path / "big.om")
    loaded = ge.load_om(path)
    (w,) = [v.const_value for v in loaded.graph.constants.values() if v.const_value.nbytes > 1 << 20]
    assert not w.flags.owndata and not w.flags.writeable
    assert any(isinstance(b, (mmap.mmap, memoryview)) for b in _base_chain(w))
    assert w.ctypes.data % 64 == 0
    assert loaded.memory_plan.offsets == model.memory_plan.offsets
    assert loaded.memory_plan.arena_bytes == model.memory_plan.arena_bytes
    x = np.ones((1, 1024), np.float32)
    np.testing.assert_allclose(list(loaded.run({"x": x}).values())[0], list(model.run({"x": x}).values())[0], rtol=1e-5)


def test_loading_does_not_grow_resident_memory_by_the_weights(tmp_path):
    path = ge.compile(big_model()).save(tmp_path / "big.om")
    code = textwrap.dedent(f"""
        import json, resource, sys
        import ge_core as ge
        ge.plugins.get_host().registries  # load plugins first: their imports are not the model
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        m = ge.load_om({str(path)!r}, verify_checksums=False)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"grew_kib": after - before}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    grew_mib = json.loads(out.strip().splitlines()[-1])["grew_kib"] / 1024
    assert grew_mib < WEIGHT_MB / 4, f"loading grew the resident set by {grew_mib:.1f} MiB for {WEIGHT_MB} MiB of weights"


def test_inspect_draws_the_memory_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from tests.conftest import light_model_path

    om = tmp_path / "sq.om"
    ge.compile(ge.load(light_model_path("squeezenet"))).save(om)
    png = tmp_path / "plan.png"
    r = subprocess.run([sys.executable, "-m", "ge_core.cli", "inspect", str(om), "--memory-plot", str(png)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    from ge_memory.plot import plan_rectangles

    m = ge.load_om(om)
    rects = plan_rectangles(m.graph, m.memory_plan)
    assert rects and all(off + size <= m.memory_plan.arena_bytes for _, _, _, off, size in rects)
