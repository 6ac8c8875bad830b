"""bench/mobile.py: its op families on known ops, and a tiny depthwise block (1x1, depthwise 3x3 with
SiLU, squeeze-excitation, bilinear Resize) profiled through both engines' profilers at 1 and 2
threads, every family either engine spends time in reported. Keeps the bench working."""

import importlib.util
import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "mobile.py")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, os.path.dirname(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("ge_bench_mobile", BENCH)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(os.path.dirname(BENCH))
    return mod


@pytest.mark.parametrize("op, w, group, x, fam", [
    ("ge.cpu::NchwcConv", [96, 1, 3, 3], 96, None, "conv depthwise"),
    ("Conv", [96, 1, 3, 3], 1, [1, 96, 56, 56], "conv depthwise"),  # onnxruntime: the group from the shapes
    ("Conv", [1, 1, 3, 3], 1, [1, 1, 56, 56], "conv kxk"),          # one channel: not depthwise
    ("ge.fused::FusedConv", [256, 1024, 1, 1], 1, None, "conv 1x1"),
    ("NchwcConv", [64, 32, 3, 3], 1, None, "conv kxk"),
    ("ge.cpu::NchwcGlobalAveragePool", None, 1, None, "squeeze-excite"),
    ("Resize", None, 1, None, "resize"),
    ("ge.cpu::NchwcReorderInput", None, 1, None, "reorder"),
    ("ReorderOutput", None, 1, None, "reorder"),
    ("ge.fused::FusedMatMul", None, 1, None, "matmul/attn/norm"),
    ("QuickGelu", None, 1, None, "other"),
    ("HardSwish", None, 1, None, "activation/eltwise"),
])
def test_families(bench, op, w, group, x, fam):
    assert bench.family(op, w, group, x) == fam


def _block() -> tuple[bytes, dict]:
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["a", "wd"], ["d"], group=32, pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["d"], ["ds"]), helper.make_node("Mul", ["d", "ds"], ["e"]),
             helper.make_node("GlobalAveragePool", ["e"], ["p"]), helper.make_node("Conv", ["p", "w2"], ["q"]),
             helper.make_node("Sigmoid", ["q"], ["g"]), helper.make_node("Mul", ["e", "g"], ["f"]),
             helper.make_node("Conv", ["f", "w3"], ["h"]), helper.make_node("Conv", ["h", "w4"], ["k"]),
             helper.make_node("Resize", ["k", "", "", "sizes"], ["y"], mode="linear")]
    inits = [init("w1", 32, 16, 1, 1), init("wd", 32, 1, 3, 3), init("w2", 32, 32, 1, 1), init("w3", 16, 32, 1, 1),
             init("w4", 16, 16, 3, 3), numpy_helper.from_array(np.array([1, 16, 64, 64], np.int64), "sizes")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 30, 30])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    return blob, {"x": rng.standard_normal((1, 16, 30, 30)).astype(np.float32)}


@pytest.mark.parametrize("threads", [1, 2])
def test_a_block_profiled_through_both_engines(bench, capsys, threads):
    blob, feeds = _block()
    ge_fams, ge_ms = bench.ge_profile(blob, feeds, threads, runs=2)
    ort_fams, ort_ms = bench.ort_profile(blob, feeds, threads, runs=2)
    assert ge_ms > 0 and ort_ms > 0
    for fams in (ge_fams, ort_fams):
        assert set(fams) <= set(bench.FAMILIES)
        assert fams.get("resize", 0) > 0 and sum(fams.values()) > 0
        assert any(k.startswith("conv") for k in fams)
    bench.print_profile("block", blob, feeds, threads)
    line = capsys.readouterr().out
    assert f"block           t={threads} ge/ort ms per run" in line and "resize" in line
