"""One copy of a model's weights (#46): an ONNX model with external float32 weights, compiled and
run or loaded from its .om and run, peaks at about its weight bytes, not twice them (the plain
weight beside GE's GEMM's packed copy, the file's bytes beside the arrays read from them)."""

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ge_core as ge
from ge_core.compiler import compile_graph
from ge_core.options import CompileOptions
from ge_core.plugins import get_host

#: 4 MatMuls of (D, D) float32: 64 MiB of weights at D = 2048
D, LAYERS = 2048, 4
WEIGHT_MB = D * D * 4 * LAYERS / 2**20


def write_model(folder, d: int) -> str:
    """``x (1, d) -> (MatMul, Relu) x LAYERS``, its weights in an external data file (as LLMs ship)."""
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((d, d), np.float32) / np.float32(np.sqrt(d))).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"y{i}"])]
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "copies", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(folder / f"model_{d}.onnx")
    onnx.save(model, path, save_as_external_data=True, location=f"model_{d}.data", size_threshold=0)
    return path


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ge_core as ge
    how, path = sys.argv[1], sys.argv[2]
    m = ge.compile(path) if how == "compile" else ge.load_om(path)
    y = list(m.run({"x": np.ones((1, int(sys.argv[3])), np.float32)}).values())[0]
    with open("/proc/self/status") as f:
        hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024
    print(json.dumps({"hwm_mb": hwm, "sum": float(y.sum())}))
""")


def peak(how: str, path: str, d: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, how, path, str(d)], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("copies")
    big, small = write_model(folder, D), write_model(folder, 128)
    for p in (big, small):
        ge.compile(p).save(p.replace(".onnx", ".om"))
    return big, small


@pytest.mark.parametrize("how", ["compile", "load_om"])
def test_peak_holds_one_copy_of_the_weights(models, how):
    big, small = models
    if how == "load_om":
        big, small = big.replace(".onnx", ".om"), small.replace(".onnx", ".om")
    base = peak(how, small, 128)  # the same imports, kernels and native modules, no weight bytes
    got = peak(how, big, D)
    grew = got["hwm_mb"] - base["hwm_mb"]
    # compile holds one weight twice while it packs it (16 MiB here), a load none
    assert grew < 1.3 * WEIGHT_MB + 16, f"{how}: peak {got['hwm_mb']:.0f} MB, {grew:.0f} MB over a model " \
                                        f"without weights, for {WEIGHT_MB:.0f} MB of weights"
    assert np.isfinite(got["sum"]) and got["sum"] > 0


def test_packed_weight_replaces_the_plain_one(models):
    big, _ = models
    graph = ge.load(big)
    refs = [weakref.ref(v.const_value) for v in graph.constants.values() if v.const_value.nbytes >= 1 << 20]
    assert len(refs) == LAYERS
    model = compile_graph(graph, CompileOptions(), get_host(), owned=True)
    del graph
    gc.collect()
    assert all(r() is None for r in refs), "the compiled model keeps a plain weight beside its packed copy"
    packed = [n for n in model.graph.node_list() if n.op_type == "PackedMatMul"]
    assert len(packed) == LAYERS and all(n.attrs["weight_dtype"] == "float32" for n in packed)
    consts = sum(v.const_value.nbytes for v in model.graph.constants.values())
    assert consts < 1.01 * WEIGHT_MB * 2**20
    x = np.random.default_rng(1).standard_normal((1, D)).astype(np.float32)
    want = x
    for w in (onnx.numpy_helper.to_array(t, base_dir=os.path.dirname(big))
              for t in onnx.load(big).graph.initializer):
        want = np.maximum(want @ w, 0)
    np.testing.assert_allclose(list(model.run({"x": x}).values())[0], want, rtol=1e-4, atol=1e-4)


def test_loaded_model_uses_the_stored_panels_in_place(models):
    om = models[0].replace(".onnx", ".om")
    m = ge.load_om(om)
    consts = [v.const_value for v in m.graph.constants.values() if v.const_value.nbytes >= 1 << 20]
    assert len(consts) == LAYERS and all(not c.flags.writeable and c.ctypes.data % 64 == 0 for c in consts)
    from ge_native import sgemm

    p = sgemm.Panels.from_data(consts[0], D, D)
    assert p.data is consts[0]  # an .om's weight is the kernel's operand: no second copy at load


def test_a_folded_broadcast_weight_is_not_expanded():
    from ge_sdk import GraphBuilder

    b = GraphBuilder("bcast")
    x = b.input("x", "float32", (1, 1024))
    b.output(b.op("MatMul", x, b.const(np.broadcast_to(np.float32(0.5), (1024, 1024)), "w")))
    model = ge.compile(b.build())
    assert not [n for n in model.graph.node_list() if n.op_type == "PackedMatMul"]
    assert sum(v.const_value.nbytes for v in model.graph.constants.values() if 0 not in v.const_value.strides) < 1 << 20
    np.testing.assert_allclose(list(model.run({"x": np.ones((1, 1024), np.float32)}).values())[0], 512.0)
