"""Empty tensors through native code never crash the process (issue 42).

A batch or sequence of 0 (a dim of 0, which onnxruntime returns as an empty tensor) goes
through every native path -- MatMul/Gemm with and without fused epilogues (the packed weight and
the row-panel paths), Conv (NCHW, 1x1, depthwise, blocked NCHWc, Winograd-sized), pooling,
LayerNorm/softmax row kernels, attention, fused elementwise loops, Reshape/Concat -- and must
give onnxruntime's result (shape and values). Today's GEMM driver divided by its row-block and
group counts before its empty-size guard (SIGFPE), so every case runs in a child process: a
crash fails the case instead of killing pytest.

The child is this file run as a script (``python test_empty_tensors.py CASE...``); it prints one
JSON line per case, so one child runs them all and a crash names the case it died in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.abspath(__file__)


# ------------------------------------------------------------------------------------------------
# the cases: name -> (model, feeds); built in the child (and only there)
# ------------------------------------------------------------------------------------------------
def _cases() -> dict:
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    f32 = TP.FLOAT
    vi = helper.make_tensor_value_info

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def model(nodes, feeds, inits=(), outputs=("y",), opset=17, static=False):
        # symbolic dims (the shapes a run brings), or the feeds' own (static: planned at compile time)
        ins = [vi(k, f32, list(v.shape) if static else [f"d{i}_{k}" for i in range(v.ndim)])
               for k, v in feeds.items()]
        g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info(o, f32, None) for o in outputs],
                              list(inits))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m, feeds

    def x(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    N = helper.make_node
    c: dict = {}
    # MatMul / Gemm: a const weight (packed panels), fused epilogues, two feeds (row panels)
    c["matmul_batch0"] = model([N("MatMul", ["x", "w"], ["y"])], {"x": x(0, 64)}, [w("w", 64, 32)])
    c["matmul_seq0"] = model([N("MatMul", ["x", "w"], ["y"])], {"x": x(2, 0, 64)}, [w("w", 64, 48)])
    c["matmul_k0"] = model([N("MatMul", ["x", "w"], ["y"])], {"x": x(5, 0)}, [w("w", 0, 7)])
    c["matmul_n0"] = model([N("MatMul", ["x", "w"], ["y"])], {"x": x(5, 16)}, [w("w", 16, 0)])
    c["matmul_two_feeds"] = model([N("MatMul", ["a", "b"], ["y"])], {"a": x(0, 16), "b": x(16, 40)})
    c["matmul_two_feeds_k0"] = model([N("MatMul", ["a", "b"], ["y"])], {"a": x(3, 0), "b": x(0, 40)})
    c["matmul_batched_0"] = model([N("MatMul", ["a", "b"], ["y"])], {"a": x(0, 4, 8), "b": x(0, 8, 5)})
    c["gemm_bias_relu_batch0"] = model(
        [N("Gemm", ["x", "w", "b"], ["g"], transB=1), N("Relu", ["g"], ["y"])],
        {"x": x(0, 64)}, [w("w", 96, 64), w("b", 96)])
    c["gemm_transA_batch0"] = model([N("Gemm", ["x", "w", "b"], ["y"], transA=1, alpha=0.5, beta=2.0)],
                                    {"x": x(64, 0)}, [w("w", 64, 24), w("b", 24)])
    c["gemm_bias_relu_k0"] = model(
        [N("Gemm", ["x", "w", "b"], ["g"], transB=1), N("Relu", ["g"], ["y"])],
        {"x": x(3, 0)}, [w("w", 20, 0), w("b", 20)])
    c["linear_residual_gelu_seq0"] = model(
        [N("MatMul", ["x", "w"], ["m"]), N("Add", ["m", "b"], ["a"]), N("Add", ["a", "x"], ["r"]),
         N("Sigmoid", ["r"], ["s"]), N("Mul", ["r", "s"], ["y"])],
        {"x": x(1, 0, 128)}, [w("w", 128, 128), w("b", 128)])
    c["mlp_big_batch0"] = model(
        [N("MatMul", ["x", "w1"], ["h"]), N("Add", ["h", "b1"], ["h1"]), N("Relu", ["h1"], ["h2"]),
         N("MatMul", ["h2", "w2"], ["y"])],
        {"x": x(0, 256)}, [w("w1", 256, 512), w("b1", 512), w("w2", 512, 64)])
    # Conv: NCHW, 1x1 (in-place activation), depthwise, blocked sizes, Winograd-sized 3x3
    c["conv3x3_batch0"] = model([N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x(0, 8, 12, 12)},
                                [w("w", 16, 8, 3, 3)])
    c["conv1x1_bias_relu_batch0"] = model(
        [N("Conv", ["x", "w", "b"], ["c"]), N("Relu", ["c"], ["y"])], {"x": x(0, 32, 14, 14)},
        [w("w", 64, 32, 1, 1), w("b", 64)])
    c["conv_depthwise_batch0"] = model(
        [N("Conv", ["x", "w"], ["y"], group=32, pads=[1, 1, 1, 1])], {"x": x(0, 32, 10, 10)}, [w("w", 32, 1, 3, 3)])
    c["conv_blocked_chain_batch0"] = model(
        [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), N("Relu", ["c1"], ["r1"]),
         N("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), N("Add", ["c2", "r1"], ["y"])],
        {"x": x(0, 64, 28, 28)}, [w("w1", 64, 64, 3, 3), w("b1", 64), w("w2", 64, 64, 3, 3)])
    c["static_conv_blocked_batch0"] = model(
        [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), N("Relu", ["c1"], ["r1"]),
         N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
         N("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=64), N("Add", ["c2", "p1"], ["a2"]),
         N("GlobalAveragePool", ["a2"], ["y"])],
        {"x": x(0, 64, 28, 28)}, [w("w1", 64, 64, 3, 3), w("b1", 64), w("w2", 64, 1, 3, 3)], static=True)
    c["static_mlp_batch0"] = model(
        [N("MatMul", ["x", "w1"], ["h"]), N("Add", ["h", "b1"], ["h1"]), N("Relu", ["h1"], ["h2"]),
         N("LayerNormalization", ["h2", "s", "b1"], ["y"], axis=-1)],
        {"x": x(0, 256)}, [w("w1", 256, 512), w("b1", 512), w("s", 512)], static=True)
    c["conv_winograd_batch0"] = model(
        [N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x(0, 128, 28, 28)}, [w("w", 128, 128, 3, 3)])
    c["conv_strided_grouped_batch0"] = model(
        [N("Conv", ["x", "w"], ["y"], group=4, strides=[2, 2], pads=[1, 1, 1, 1])], {"x": x(0, 16, 9, 9)},
        [w("w", 24, 4, 3, 3)])
    c["conv_empty_plane"] = model([N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x(1, 8, 0, 6)},
                                  [w("w", 4, 8, 3, 3)])
    c["conv_in_channels0"] = model([N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": x(1, 0, 5, 5)},
                                   [w("w", 4, 0, 3, 3), w("b", 4)])
    c["conv_transpose_batch0"] = model([N("ConvTranspose", ["x", "w"], ["y"])], {"x": x(0, 8, 5, 5)},
                                       [w("w", 8, 4, 3, 3)])
    # pooling
    c["maxpool_batch0"] = model([N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                                {"x": x(0, 16, 14, 14)})
    c["avgpool_batch0"] = model([N("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                                {"x": x(0, 16, 8, 8)})
    c["global_avgpool_batch0"] = model([N("GlobalAveragePool", ["x"], ["y"])], {"x": x(0, 64, 7, 7)})
    c["global_avgpool_channels0"] = model([N("GlobalAveragePool", ["x"], ["y"])], {"x": x(2, 0, 7, 7)})
    c["maxpool_1d_seq0"] = model([N("MaxPool", ["x"], ["y"], kernel_shape=[2])], {"x": x(0, 4, 9)})
    # row kernels
    c["layernorm_batch0"] = model([N("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)], {"x": x(0, 64)},
                                  [w("s", 64), w("b", 64)])
    c["layernorm_seq0"] = model([N("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)], {"x": x(2, 0, 32)},
                                [w("s", 32), w("b", 32)])
    c["softmax_rows0"] = model([N("Softmax", ["x"], ["y"], axis=-1)], {"x": x(0, 33)})
    c["softmax_row_len0"] = model([N("Softmax", ["x"], ["y"], axis=-1)], {"x": x(4, 0)})
    c["logsoftmax_seq0"] = model([N("LogSoftmax", ["x"], ["y"], axis=-1)], {"x": x(2, 0, 10)})
    c["batchnorm_batch0"] = model([N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], {"x": x(0, 8, 4, 4)},
                                  [w("s", 8), w("b", 8), w("m", 8),
                                   numpy_helper.from_array(np.ones(8, np.float32), "v")])
    c["instnorm_batch0"] = model([N("InstanceNormalization", ["x", "s", "b"], ["y"])], {"x": x(0, 8, 4, 4)},
                                 [w("s", 8), w("b", 8)])
    # attention (scaled dot-product, the pattern the fusion recognises), sequence 0
    scale = numpy_helper.from_array(np.array(0.125, np.float32), "scale")
    att = [N("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), N("MatMul", ["q", "kt"], ["s"]),
           N("Mul", ["s", "scale"], ["ss"]), N("Softmax", ["ss"], ["p"], axis=-1), N("MatMul", ["p", "v"], ["y"])]
    c["attention_seq0"] = model(att, {"q": x(1, 2, 0, 16), "k": x(1, 2, 0, 16), "v": x(1, 2, 0, 16)}, [scale])
    c["attention_kv0"] = model(att, {"q": x(1, 2, 5, 16), "k": x(1, 2, 0, 16), "v": x(1, 2, 0, 16)}, [scale])
    c["attention_batch0"] = model(att, {"q": x(0, 2, 5, 16), "k": x(0, 2, 5, 16), "v": x(0, 2, 5, 16)}, [scale])
    # fused elementwise loops
    c["elementwise_chain_batch0"] = model(
        [N("Relu", ["x"], ["r"]), N("Sigmoid", ["r"], ["s"]), N("Mul", ["s", "x"], ["y"])], {"x": x(0, 64)})
    c["elementwise_broadcast_seq0"] = model(
        [N("Add", ["x", "b"], ["a"]), N("Tanh", ["a"], ["t"]), N("Mul", ["t", "b"], ["y"])], {"x": x(3, 0, 16)},
        [w("b", 16)])
    c["elementwise_broadcast_to_empty"] = model(
        [N("Add", ["x", "z"], ["a"]), N("Exp", ["a"], ["y"])], {"x": x(4, 1), "z": x(0)})
    c["gelu_erf_batch0"] = model(
        [N("Div", ["x", "sq2"], ["d"]), N("Erf", ["d"], ["e"]), N("Add", ["e", "one"], ["p"]),
         N("Mul", ["x", "p"], ["m"]), N("Mul", ["m", "half"], ["y"])], {"x": x(0, 3, 40)},
        [numpy_helper.from_array(np.array(1.4142135, np.float32), "sq2"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    c["clip_hardswish_batch0"] = model(
        [N("HardSwish", ["x"], ["h"]), N("Clip", ["h", "lo", "hi"], ["y"])], {"x": x(0, 8, 3, 3)},
        [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
         numpy_helper.from_array(np.array(6.0, np.float32), "hi")])
    # shape ops
    shp = numpy_helper.from_array(np.array([0, 8, 8], np.int64), "shp")
    c["reshape_batch0"] = model([N("Reshape", ["x", "shp"], ["r"]), N("Relu", ["r"], ["y"])], {"x": x(0, 64)}, [shp])
    c["concat_batch0"] = model([N("Concat", ["a", "b"], ["c"], axis=0), N("Neg", ["c"], ["y"])],
                               {"a": x(0, 4), "b": x(0, 4)})
    c["concat_with_empty"] = model([N("Concat", ["a", "b"], ["c"], axis=1), N("Abs", ["c"], ["y"])],
                                   {"a": x(2, 0), "b": x(2, 3)})
    c["transpose_flatten_seq0"] = model([N("Transpose", ["x"], ["t"], perm=[1, 0, 2]), N("Flatten", ["t"], ["y"])],
                                        {"x": x(3, 0, 5)})
    c["reduce_mean_rows0"] = model([N("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)], {"x": x(0, 16)}, opset=13)
    return c


# ------------------------------------------------------------------------------------------------
# the native entries called directly with an empty extent (name -> a check returning "ok")
# ------------------------------------------------------------------------------------------------
def _want(got, want, what: str) -> str:
    got = np.asarray(got)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
        return f"{what}: got {got.shape} {got.ravel()[:4]}, want {want.shape} {want.ravel()[:4]}"
    return "ok"


def _direct(name: str) -> str:
    from ge_native import gemm, nchwc, sgemm

    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    if name == "native_sg_packed_rows0":  # the GEMM driver divided by its row blocks (SIGFPE)
        out = np.empty((0, 32), np.float32)
        ok = sgemm.matmul_packed(np.zeros((0, 64), np.float32), sgemm.Panels(w), out, None, None, 2)
        return "ok" if ok else "refused"
    if name == "native_sg_packed_cols0":  # ... and by its groups of panels
        ok = sgemm.matmul_packed(np.ones((5, 64), np.float32), sgemm.Panels(w[:, :0]), np.empty((5, 0), np.float32))
        return "ok" if ok else "refused"
    if name == "native_sg_packed_k0_bias":  # no products: the epilogue over zeros
        out = np.full((5, 32), np.nan, np.float32)
        b = np.arange(32, dtype=np.float32)
        ok = sgemm.matmul_packed(np.zeros((5, 0), np.float32), sgemm.Panels(w[:0]), out, b, (0.0, 6.0))
        return _want(out, np.tile(np.clip(b, 0, 6), (5, 1)), "k=0") if ok else "refused"
    if name == "native_sg_conv_channels0":  # the chunk sizes divided by the column matrix's rows
        out = np.full((8, 16), np.nan, np.float32)
        b = np.arange(8, dtype=np.float32)
        ok = sgemm.conv2d(np.zeros((0, 6, 6), np.float32), np.zeros((8, 0), np.float32), out, 1, (3, 3), (1, 1),
                          (1, 1), (0, 0), (4, 4), b, None, 2)
        return _want(out, np.repeat(b[:, None], 16, 1), "C=0") if ok else "refused"
    if name == "native_nc_conv_empty_plane":  # a 1x1 plane of width 0: its chunks divided by 0
        x5 = np.zeros((1, 2, 10, 0, 16), np.float32)
        out = np.zeros((1, 1, 10, 0, 16), np.float32)
        wpk = nchwc.pack_weights(rng.standard_normal((16, 32, 1, 1)).astype(np.float32))
        nchwc.conv(x5, wpk, out, (1, 1), (1, 1), (2, 2), (0, 0))
        return "ok"
    if name == "native_gemm_rows_k0":  # BLAS refuses a leading dimension of 0 (the output stayed garbage)
        out = np.full((8, 5), np.nan, np.float32)
        ok = gemm.run_rows(np.zeros((8, 0), np.float32), np.zeros((0, 5), np.float32), out, [(0, 4), (4, 8)], 2)
        return _want(out, np.zeros((8, 5)), "k=0") if ok else "ok"
    if name == "native_winograd_batch0":
        from ge_cpu.kernels import winograd

        wino = winograd.Winograd(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
        y = wino.run(np.zeros((0, 3, 9, 9), np.float32), (1, 1, 1, 1))
        return _want(y, np.zeros((0, 4, 9, 9)), "N=0")
    if name == "native_loop_rows0":  # the fused loop's entry refused an extent of 0
        from ge_cpu.fused import codegen, loopgen

        steps = codegen.loads(codegen.dumps([("Mul", ["a0", "a1"], {}), ("Relu", ["t0"], {})]))
        fn = loopgen.loop_kernel(steps, ["a0", "a1"], ["float32"] * 2, [(0, 7), (0, 7)], "float32", (0, 7))
        if fn is None:
            return "ok"  # no loop form here
        y = fn(np.zeros((0, 7), np.float32), np.zeros((0, 7), np.float32))
        return _want(y, np.zeros((0, 7)), "loop")
    if name == "native_softmax_rows_len0":
        from ge_cpu.fused import loopgen

        fn = loopgen.row_kernel("softmax", np.float32)
        if fn is not None:
            x = np.zeros((4, 0), np.float32)
            fn(x, x)
        return "ok"
    raise KeyError(name)


DIRECT = ["native_sg_packed_rows0", "native_sg_packed_cols0", "native_sg_packed_k0_bias", "native_sg_conv_channels0",
          "native_nc_conv_empty_plane", "native_gemm_rows_k0", "native_winograd_batch0", "native_loop_rows0",
          "native_softmax_rows_len0"]


def _compare(name: str, threads: int) -> str:
    import onnxruntime as ort

    import ge_core as ge

    if name in DIRECT:
        from ge_native import parallel

        with parallel.use_threads(threads):
            return _direct(name)
    m, feeds = _cases()[name]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:  # noqa: BLE001 - ORT refuses the model: GE may refuse it cleanly too
        want = None
    try:
        got = ge.compile(m, {"threads": threads}).run(feeds)
    except ge.GEError as e:
        if want is None:
            return "ok"  # both refuse it
        return f"GE raised {type(e).__name__}: {str(e)[:600]}"
    if want is None:
        return "ok"  # ORT refuses it; GE may be more permissive: it ran without a crash
    got_list = list(got.values()) if isinstance(got, dict) else list(got)
    for g, r in zip(got_list, want):
        g = np.asarray(g)
        if g.shape != r.shape or g.dtype != r.dtype:
            return f"GE gave {g.dtype}{list(g.shape)}, ORT {r.dtype}{list(r.shape)}"
        if not np.allclose(g, r, rtol=1e-4, atol=1e-4, equal_nan=True):
            return f"values differ: max |d| {np.max(np.abs(g - r))}"
    return "ok"


def _child(names: list[str], threads: int) -> None:
    for name in names:
        print(json.dumps({"start": name}), flush=True)
        try:
            res = _compare(name, threads)
        except Exception as e:  # noqa: BLE001 - reported to the parent as a failure
            res = f"{type(e).__name__}: {str(e)[:600]}"
        print(json.dumps({"case": name, "result": res}), flush=True)


_RESULTS: dict[int, dict[str, str]] = {}


def _results(threads: int) -> dict[str, str]:
    """Every case's result at ``threads`` threads: all cases in one child; a child that dies
    fails the case it was in, and another child runs the rest."""
    if threads in _RESULTS:
        return _RESULTS[threads]
    todo = list(NAMES)
    out: dict[str, str] = {}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    while todo:
        proc = subprocess.run([sys.executable, HERE, str(threads), *todo], capture_output=True, text=True,
                              timeout=600, env=env)
        started = None
        for line in proc.stdout.splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "start" in d:
                started = d["start"]
            else:
                out[d["case"]] = d["result"]
                started = None
        if proc.returncode != 0:
            victim = started or todo[0]
            out[victim] = f"the process died (status {proc.returncode}): {proc.stderr[-800:]}"
        todo = [n for n in todo if n not in out]
    _RESULTS[threads] = out
    return out


NAMES = ["matmul_batch0", "matmul_seq0", "matmul_k0", "matmul_n0", "matmul_two_feeds", "matmul_two_feeds_k0",
         "matmul_batched_0", "gemm_bias_relu_batch0", "gemm_bias_relu_k0", "linear_residual_gelu_seq0",
         "mlp_big_batch0", "conv3x3_batch0", "conv1x1_bias_relu_batch0", "conv_depthwise_batch0",
         "conv_blocked_chain_batch0", "conv_winograd_batch0", "conv_strided_grouped_batch0", "conv_empty_plane",
         "conv_transpose_batch0", "maxpool_batch0", "avgpool_batch0", "global_avgpool_batch0",
         "global_avgpool_channels0", "maxpool_1d_seq0", "layernorm_batch0", "layernorm_seq0", "softmax_rows0",
         "softmax_row_len0", "logsoftmax_seq0", "batchnorm_batch0", "instnorm_batch0", "attention_seq0",
         "attention_kv0", "attention_batch0", "elementwise_chain_batch0", "elementwise_broadcast_seq0",
         "elementwise_broadcast_to_empty", "gelu_erf_batch0", "clip_hardswish_batch0", "reshape_batch0",
         "concat_batch0", "concat_with_empty", "transpose_flatten_seq0", "reduce_mean_rows0", "conv_in_channels0",
         "gemm_transA_batch0", "static_conv_blocked_batch0", "static_mlp_batch0"] + DIRECT


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_an_empty_tensor_gives_onnxruntimes_result_without_a_crash(name, threads):
    assert _results(threads)[name] == "ok"


def test_every_case_is_listed():
    import ast

    with open(HERE, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    built = {n.slice.value for n in ast.walk(tree)
             if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "c"
             and isinstance(n.slice, ast.Constant)}
    assert built == set(NAMES) - set(DIRECT)


if __name__ == "__main__":
    _child(sys.argv[2:], int(sys.argv[1]))
