"""GE's own float32 GEMM (ge_native.sgemm): odd shapes against float64, its epilogue, the same bits
at every thread count, what it refuses; and the kernels that use it against onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_native import parallel, sgemm

# the kernel runs on AVX-512F and on AVX2 + FMA (the x86 machines seen: Intel and AMD EPYC with
# AVX-512, AMD EPYC Zen 3 with AVX2 only): tests/sdk/test_native.py checks that it does
pytestmark = pytest.mark.skipif(not sgemm.available(), reason="GE's sgemm needs a CPU with AVX-512F or AVX2 + FMA")

# (m, k, n); the last two: large k, whose panel blocks are one panel (the weight prefetch's end)
SHAPES = [(1, 1, 1), (5, 7, 3), (11, 64, 31), (12, 13, 32), (13, 96, 33), (97, 768, 100), (200, 33, 257),
          (30, 1000, 49), (25, 2304, 70)]


EPS = float(np.finfo(np.float32).eps)


def bound(a, b, eps=EPS):
    """A float32 product's rounding bound: k eps sum |a||b| (plus the epilogue's few ulps)."""
    return (a.shape[1] + 4) * eps * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + 1e-30


def gelu(y):
    import math

    return 0.5 * y * (1 + np.vectorize(math.erf)(y / np.sqrt(2)))


ACTS = {None: lambda y: y, "sigmoid": lambda y: 1 / (1 + np.exp(-y)), "silu": lambda y: y / (1 + np.exp(-y)),
        "gelu": gelu, "gelu_tanh": lambda y: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3))),
        "hardswish": lambda y: y * np.clip(y / 6 + 0.5, 0, 1)}


def epilogue(y, bias, axis, z, clip, act=None):
    if bias is not None:
        y = y + (bias[None, :] if axis == 1 else bias[:, None])
    if z is not None:
        y = y + z
    return ACTS[act](np.clip(y, *clip) if clip is not None else y)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("with_bias,with_z,clip", [(False, False, None), (True, False, (0.0, 6.0)),
                                                    (True, True, (0.0, np.inf)), (False, True, (-0.5, 0.5))])
def test_packed_and_rows_match_float64_with_their_epilogue(m, k, n, with_bias, with_z, clip):
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    z = rng.standard_normal((m, n)).astype(np.float32) if with_z else None
    exact = a.astype(np.float64) @ b.astype(np.float64)
    tol = bound(a, b) + (np.abs(z) * 1e-7 if z is not None else 0)

    bias_n = rng.standard_normal(n).astype(np.float32) if with_bias else None
    out = np.full((m, n), np.nan, np.float32)
    assert sgemm.matmul_packed(a, sgemm.Panels(b), out, bias_n, clip, 1, z)
    want = epilogue(exact, bias_n, 1, z, clip)
    assert np.all(np.abs(out - want) <= tol), np.max(np.abs(out - want) - tol)

    bias_m = rng.standard_normal(m).astype(np.float32) if with_bias else None
    out2 = np.full((m, n), np.nan, np.float32)
    assert sgemm.matmul_rows(a, b, out2, bias_m, clip, 1, z)
    want2 = epilogue(exact, bias_m, 0, z, clip)
    assert np.all(np.abs(out2 - want2) <= tol), np.max(np.abs(out2 - want2) - tol)


@pytest.mark.parametrize("m,k,n", [(200, 96, 1000), (37, 300, 65), (2048, 64, 49), (110, 1000, 300)])
def test_the_same_bits_at_every_thread_count(m, k, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    panels = sgemm.Panels(b)
    one = np.empty((m, n), np.float32)
    assert sgemm.matmul_packed(a, panels, one, width=1)
    rows_one = np.empty((m, n), np.float32)
    assert sgemm.matmul_rows(a, b, rows_one, width=1)
    np.testing.assert_array_equal(rows_one, one)  # one chain of FMAs per element, in the order of k
    for width in (2, 3, 8):
        with parallel.use_threads(width):
            got = np.empty((m, n), np.float32)
            assert sgemm.matmul_packed(a, panels, got, width=parallel.native_width())
            np.testing.assert_array_equal(got, one)
            assert sgemm.matmul_rows(a, b, got, width=parallel.native_width())
            np.testing.assert_array_equal(got, one)


@pytest.mark.parametrize("act", sorted(sgemm.ACTIVATIONS))
def test_each_activation_at_the_store_matches_float64(act):
    rng = np.random.default_rng(len(act))
    m, k, n = 29, 40, 45
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    z = rng.standard_normal((m, n)).astype(np.float32)
    out = np.empty((m, n), np.float32)
    assert sgemm.matmul_packed(a, sgemm.Panels(b), out, bias, None, 1, z, act)
    want = epilogue(a.astype(np.float64) @ b, bias, 1, z, None, act)
    # the product's rounding, carried through the activation (slope <= 1.2), plus the vector math's ulps
    tol = 1.2 * bound(a, b) + 4e-6 * (1 + np.abs(want))
    assert np.all(np.abs(out - want) <= tol), np.max(np.abs(out - want) - tol)
    out2 = np.empty((m, n), np.float32)
    assert sgemm.matmul_rows(a, b, out2, None, None, 1, z, act)
    np.testing.assert_allclose(out2, epilogue(a.astype(np.float64) @ b, None, 1, z, None, act), rtol=1e-4, atol=1e-4)
    assert not sgemm.matmul_packed(a, sgemm.Panels(b), out, act="mish")  # no such activation: refused


def test_what_it_refuses_leaves_the_output_alone():
    a = np.ones((4, 8), np.float32)
    b = np.ones((8, 5), np.float32)
    panels = sgemm.Panels(b)
    out = np.full((4, 5), 7.0, np.float32)
    refused = [
        sgemm.matmul_packed(a.astype(np.float64), panels, out),  # another dtype
        sgemm.matmul_packed(a[:, :7], panels, out),  # k does not match
        sgemm.matmul_packed(np.asfortranarray(a), panels, out),  # not C order
        sgemm.matmul_packed(a, panels, out, bias=np.ones(4, np.float32)),  # a bias of the wrong length
        sgemm.matmul_packed(a, panels, out, addend=out),  # an addend that is the output
        sgemm.matmul_packed(a, panels, out, addend=np.ones((4, 4), np.float32)),  # of the wrong size
        sgemm.matmul_rows(a, b[:, :4], out),  # an output of the wrong shape
        sgemm.matmul_rows(a, b, out[:, ::-1]),  # an output that is not C order
        sgemm.matmul_rows(a, b, out, bias=np.ones(5, np.float32)),  # a row bias of the wrong length
    ]
    assert not any(refused)
    assert np.all(out == 7.0)
    with pytest.raises(ValueError, match="2-D float32"):
        sgemm.Panels(np.ones((2, 3, 4), np.float32))


def _run(model, feeds, threads, **opts):
    return list(ge.compile(ge.load(model), {"threads": threads, **opts}).run(feeds).values())[0]


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _conv_model(cin, cout, hw, tail, batch=1, k=3):
    """A k x k convolution (padded to keep the plane) with the epilogue ``tail``."""
    rng = np.random.default_rng(cin + cout + hw)
    inits = [numpy_helper.from_array(rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.2, "w"),
             numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, hw, hw])]
    last = "c"
    if "add" in tail:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [batch, cout, hw, hw]))
        nodes.append(helper.make_node("Add", [last, "r"], ["s"]))
        last = "s"
    if "relu" in tail:
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif "silu" in tail:
        nodes += [helper.make_node("Sigmoid", [last], ["sg"]), helper.make_node("Mul", [last, "sg"], ["y"])]
    elif "sigmoid" in tail:
        nodes.append(helper.make_node("Sigmoid", [last], ["y"]))
    elif "hardswish" in tail:
        nodes.append(helper.make_node("HardSwish", [last], ["y"]))
    elif "clip" in tail:
        inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in inputs}
    return model, feeds


@pytest.mark.parametrize("cin,cout,hw,tail,batch", [(16, 96, 23, "clip", 1), (24, 13, 7, "relu", 2),
                                                    (64, 40, 14, "add relu", 1), (33, 64, 5, "add", 3),
                                                    (8, 8, 1, "", 1), (40, 24, 9, "silu", 1), (7, 30, 6, "sigmoid", 2),
                                                    (16, 17, 8, "hardswish", 1)])
def test_a_convolution_with_its_epilogue_at_the_store_matches_onnxruntime(cin, cout, hw, tail, batch, monkeypatch):
    model, feeds = _conv_model(cin, cout, hw, tail, batch)
    want = _ort(model, feeds)
    calls = _spy_conv_calls(monkeypatch)
    one = _run(model, feeds, 1, conv_algorithm="im2col")  # (not Winograd, which the larger ones would take)
    assert len(calls) == batch  # one GEMM per image, on GE's kernel
    clip, _, addend, act = calls[0][-4:]
    # the epilogue went to the store: no pass of its own over the output
    assert (clip is not None) == ("relu" in tail or "clip" in tail) and (addend is not None) == ("add" in tail)
    assert act == next((t for t in ("silu", "sigmoid", "hardswish") if t in tail), None)
    np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(_run(model, feeds, 2, conv_algorithm="im2col"), one)  # the same bits on two threads
    # without the kernel (a CPU without AVX-512) BLAS and the compiled epilogue give the same result
    monkeypatch.setattr(sgemm, "available", lambda: False)
    np.testing.assert_allclose(_run(model, feeds, 1), want, rtol=1e-4, atol=1e-4)


def _spy_conv_calls(monkeypatch) -> list:
    """The calls of GE's GEMM convolution, by its function or by a layer's prepared call
    (:class:`ge_native.sgemm.Conv2d`, the layer's object first), each ending (clip, width, addend, act)."""
    calls: list = []
    real, real_run = sgemm.conv2d, sgemm.Conv2d.run
    monkeypatch.setattr(sgemm, "conv2d", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(sgemm.Conv2d, "run", lambda self, *a, **k: calls.append((self, *a)) or real_run(self, *a, **k))
    return calls


def test_pointwise_convolutions_run_on_the_kernel_with_the_weight_packed_once(monkeypatch):
    model, feeds = _conv_model(24, 40, 56, "add relu", 2, k=1)  # 3136 pixels a plane: the large planes too
    want = _ort(model, feeds)
    calls = _spy_conv_calls(monkeypatch)
    np.testing.assert_allclose(_run(model, feeds, 1), want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2 and calls[0][-2] is not None  # one GEMM per image, the residual at the store
    # the weight packed and the call prepared when the model was built, not per call
    assert isinstance(calls[0][0], sgemm.Conv2d) and calls[0][0] is calls[1][0]


def _array_before_a_guard_page(shape):
    """A float32 array of ``shape`` whose last byte ends a page followed by an unreadable one:
    a read past its end faults instead of passing unnoticed (with its buffer, kept alive)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    nbytes = int(np.prod(shape)) * 4
    pages = -(-nbytes // page)
    buf = mmap.mmap(-1, (pages + 1) * page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(base + pages * page, page, 0) == 0  # PROT_NONE
    a = np.frombuffer(buf, np.float32, int(np.prod(shape)), pages * page - nbytes).reshape(shape)
    return a, buf


@pytest.mark.parametrize("c,hw,m,group", [(24, 1, 16, 2), (40, 3, 8, 4), (20, 5, 12, 1), (64, 14, 64, 4)])
def test_a_pointwise_convolution_never_reads_past_its_activation(c, hw, m, group):
    """1x1 layers read the activation in place, a tail panel past its rows' ends: never past the
    array's (an unreadable page right after it would fault)."""
    rng = np.random.default_rng(c + hw)
    x, keep = _array_before_a_guard_page((c, hw, hw))
    x[...] = rng.standard_normal((c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((m, c // group)).astype(np.float32)
    out = np.empty((m, hw * hw), np.float32)
    assert sgemm.conv2d(x, sgemm.RowPanels(w, group), out, group, (1, 1), (1, 1), (1, 1), (0, 0), (hw, hw))
    xs = x.reshape(group, c // group, hw * hw)
    want = np.concatenate([w.reshape(group, m // group, -1)[g] @ xs[g] for g in range(group)])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    assert keep  # (the mapping goes with the arrays that view it)


def test_a_prepared_convolution_gives_conv2ds_bits_and_refuses_what_does_not_fit():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 9, 11)).astype(np.float32)
    w = rng.standard_normal((24, 4 * 9)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    rows = sgemm.RowPanels(w, 4)
    geo = (4, (3, 3), (1, 2), (1, 1), (1, 0), (9, 5))
    call = sgemm.Conv2d(rows, *geo, bias)
    z = rng.standard_normal((24, 45)).astype(np.float32)
    want, got = np.empty((24, 45), np.float32), np.empty((24, 45), np.float32)
    assert sgemm.conv2d(x, rows, want, *geo, bias, (0.0, 6.0), 2, z, "silu")
    assert call.run(x, got, (0.0, 6.0), 2, z, "silu")
    np.testing.assert_array_equal(got, want)
    out = np.full((24, 45), 7.0, np.float32)
    assert not call.run(x[:8], out)  # channels the geometry does not have
    assert not call.run(x, out[:, :40])  # an output of another size
    assert not call.run(x, out, None, 1, out)  # the addend is the output
    assert not call.run(x, out, act="relu6")  # no such activation at the store
    assert np.all(out == 7.0)
    with pytest.raises(ValueError, match="group"):
        sgemm.Conv2d(sgemm.RowPanels(w, 1), *geo)
    with pytest.raises(ValueError, match="bias"):
        sgemm.Conv2d(rows, *geo, bias[:5])


@pytest.mark.parametrize("m,k,group", [(1, 1, 1), (12, 5, 1), (13, 40, 1), (50, 33, 2), (36, 7, 3), (200, 96, 4)])
def test_row_panels_give_the_bits_of_the_matrix_read_in_place(m, k, group):
    rng = np.random.default_rng(m * k + group)
    w = rng.standard_normal((m, k)).astype(np.float32)
    rows = sgemm.RowPanels(w, group)
    assert rows.shape == (m, k) and rows.data.shape == (group * -(-(m // group) // sgemm.MR) * k, sgemm.MR)
    x = rng.standard_normal((k * group, 5, 9)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    geo = (group, (1, 1), (1, 1), (1, 1), (0, 0), (5, 9))
    plain, packed = np.empty((m, 45), np.float32), np.empty((m, 45), np.float32)
    assert sgemm.conv2d(x, w, plain, *geo, bias, (0.0, 6.0), 2, None, "silu")
    assert sgemm.conv2d(x, rows, packed, *geo, bias, (0.0, 6.0), 2, None, "silu")
    np.testing.assert_array_equal(packed, plain)  # the same chains of fused multiply-adds
    if group == 1:
        b = x.reshape(k, 45)
        via_rows = np.empty((m, 45), np.float32)
        assert sgemm.matmul_rows(rows, b, via_rows, bias, (0.0, 6.0), 1, None, "silu")
        np.testing.assert_array_equal(via_rows, plain)
    # a RowPanels of another group, or of other rows, is refused
    out = np.full((m, 45), 7.0, np.float32)
    assert not sgemm.conv2d(x, sgemm.RowPanels(w, 1) if group > 1 else rows, out, group + 1, *geo[1:])
    assert np.all(out == 7.0)
    with pytest.raises(ValueError, match="divisible by the group"):
        sgemm.RowPanels(np.ones((5, 3), np.float32), 2)


CONVS = [  # (C, H, W, M, group, kernel, strides, dilations, pads begin, pads end, batch)
    (3, 224, 224, 64, 1, (7, 7), (2, 2), (1, 1), (3, 3), (3, 3), 1),  # a stem
    (16, 9, 11, 24, 4, (3, 3), (1, 2), (1, 1), (1, 0), (1, 2), 2),  # groups, odd strides and pads
    (8, 13, 13, 16, 2, (3, 3), (1, 1), (2, 2), (2, 2), (2, 2), 1),  # dilation
    (5, 6, 7, 7, 1, (1, 1), (2, 2), (1, 1), (0, 0), (0, 0), 3),  # a strided 1x1
    (4, 1, 1, 3, 1, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1),  # a 1x1 plane, every tap but one padding
    (6, 40, 3, 12, 3, (5, 1), (3, 1), (1, 1), (0, 0), (4, 0), 1),  # a tall plane, a 5x1 kernel
    (2, 5, 5, 4, 1, (2, 2), (3, 3), (1, 1), (0, 0), (0, 0), 1),  # windows that skip pixels
    (48, 35, 35, 96, 2, (3, 3), (2, 2), (1, 1), (0, 0), (0, 0), 1),  # more than one panel row per row
    (256, 64, 64, 8, 1, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1),  # a column matrix packed in 3 chunks
    (512, 40, 40, 6, 2, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1),  # groups, in 2 chunks
    (4, 3, 60, 5, 1, (1, 19), (1, 1), (1, 2), (0, 0), (0, 9), 1),  # a kernel wider than the vector pack's 16 taps
    (6, 17, 23, 8, 1, (3, 3), (2, 2), (1, 1), (1, 1), (0, 1), 2),  # stride 2, odd planes, uneven pads
    (32, 56, 56, 24, 1, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 1),  # a 1x1 stride-1 layer: rows copied
    # 1x1 stride-1 layers with k up to 128 read the activation in place: ShuffleNet's grouped ones
    # (a tail of 16, of 4, of 25 columns; the last image's last row ends the array), k over 128 packs
    (136, 28, 28, 136, 4, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 1),
    (272, 14, 14, 272, 4, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 1),
    (24, 5, 5, 40, 2, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 2),
    (200, 7, 7, 16, 1, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 1),
    # planes narrower than a load: the rows near the array's end are read masked, never past it
    (24, 1, 1, 16, 2, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 2),
    (40, 3, 3, 8, 4, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 1),
    (20, 4, 5, 12, 1, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), 1),
    (1, 1, 400, 8, 1, (1, 10), (1, 5), (1, 1), (0, 0), (0, 0), 1),  # wav2vec2's first conv: stride 5 (gathered)
    (32, 1, 49, 32, 2, (1, 128), (1, 1), (1, 1), (0, 64), (0, 64), 1),  # its positional conv: 128 taps, groups
    (2, 1, 300, 3, 1, (1, 130), (1, 1), (1, 1), (0, 64), (0, 65), 1),  # wider than the vector pack: the scalar one
]


@pytest.mark.parametrize("case", CONVS, ids=[f"conv{i}" for i in range(len(CONVS))])
def test_conv2d_geometry_matches_onnxruntime(case):
    c, h, w, m, group, k, strides, dil, pb, pe, batch = case
    rng = np.random.default_rng(c * h + m)
    x = rng.standard_normal((batch, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c // group, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=list(k), strides=list(strides),
                            dilations=list(dil), pads=list(pb) + list(pe), group=group)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    want = _ort(model, {"x": x})
    oh, ow = want.shape[2:]
    tol = 1e-5 * np.sqrt(c // group * k[0] * k[1]) * 4
    for i in range(batch):
        out = np.full((m, oh * ow), np.nan, np.float32)
        assert sgemm.conv2d(x[i], wt.reshape(m, -1), out, group, k, strides, dil, pb, (oh, ow), b)
        np.testing.assert_allclose(out.reshape(m, oh, ow), want[i], rtol=1e-4, atol=tol)
    np.testing.assert_allclose(_run(model, {"x": x}, 2), want, rtol=1e-4, atol=tol)  # the conv kernel, 2 threads
    # with a residual and an activation at the store (chunked cases offset both per chunk)
    z = rng.standard_normal((m, oh * ow)).astype(np.float32)
    out = np.empty((m, oh * ow), np.float32)
    assert sgemm.conv2d(x[0], wt.reshape(m, -1), out, group, k, strides, dil, pb, (oh, ow), b, None, 2, z, "silu")
    s = want[0].reshape(m, -1).astype(np.float64) + z
    np.testing.assert_allclose(out, s / (1 + np.exp(-s)), rtol=1e-4, atol=tol)
    # a geometry that does not fit the arrays is refused, the output untouched
    out = np.full((m, oh * ow), 7.0, np.float32)
    assert not sgemm.conv2d(x[0], wt.reshape(m, -1), out, group, k, strides, dil, pb, (oh + 1, ow), b)
    assert not sgemm.conv2d(x[0], wt.reshape(m, -1)[:, 1:], out, group, k, strides, dil, pb, (oh, ow), b)
    assert not sgemm.conv2d(x[0], wt.reshape(m, -1), out, group, k, (0, 1), dil, pb, (oh, ow), b)
    assert np.all(out == 7.0)


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "MatMulAdd", "MatMulAddGelu"])
def test_a_constant_weight_product_runs_on_packed_panels(op, monkeypatch):
    rng = np.random.default_rng(3)
    k, n = 48, 70
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")]
    if op == "MatMul":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    elif op == "Gemm":
        inits[0] = numpy_helper.from_array(np.ascontiguousarray(w.T), "w")
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5)]
    elif op == "MatMulAdd":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    else:  # the erf GELU as torch.onnx.export writes it
        inits += [numpy_helper.from_array(np.float32(np.sqrt(2)), "s2"), numpy_helper.from_array(np.float32(1), "one"),
                  numpy_helper.from_array(np.float32(0.5), "half")]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["h"]),
                 helper.make_node("Div", ["h", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["p"]),
                 helper.make_node("Mul", ["p", "half"], ["y"])]
    shape = [2, 9, k] if op != "Gemm" else [9, k]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    calls = []
    real = sgemm.matmul_packed
    monkeypatch.setattr(sgemm, "matmul_packed", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    want = _ort(model, feeds)
    got = _run(model, feeds, 1)
    assert calls, "the constant weight's product did not run on GE's kernel"
    if op == "MatMulAddGelu":  # bias and GELU at the store, one call
        assert len(calls) == 1 and calls[0][3] is not None and calls[0][7] == "gelu"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(_run(model, feeds, 2), got)


@pytest.mark.parametrize("c,length,m,group,k,stride,dil,pads", [(1, 400, 16, 1, 10, 5, 1, (0, 0)),  # wav2vec2's first
                                                                (32, 49, 32, 16, 16, 1, 1, (8, 8)),  # its positional conv
                                                                (12, 37, 18, 3, 3, 2, 2, (1, 3))])
def test_a_1d_convolution_runs_as_a_2d_one_of_height_1(c, length, m, group, k, stride, dil, pads, monkeypatch):
    rng = np.random.default_rng(c + length)
    x = rng.standard_normal((2, c, length)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k], strides=[stride], dilations=[dil],
                            pads=list(pads), group=group)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(rng.standard_normal((m, c // group, k)).astype(np.float32), "w"),
                           numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    calls = []
    real = sgemm.conv2d
    monkeypatch.setattr(sgemm, "conv2d", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    want = _ort(model, {"x": x})
    got = _run(model, {"x": x}, 1)
    assert len(calls) == 2 and calls[0][0].shape == (c, 1, length) and calls[0][4] == (1, k)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(c // group * k))
    np.testing.assert_array_equal(_run(model, {"x": x}, 2), got)


@pytest.mark.parametrize("act", ["sigmoid", "silu", "gelu", "hardswish", "gelu_tanh"])
def test_activations_at_the_store_on_special_values(act):
    """The activations the tile applies in registers (sigmoid, SiLU, GELU) and through the shared
    C (the others), on the edges of their range: large arguments, signed zeros, inf, NaN."""
    v = np.array([-200, -88.5, -30, -4, -1, -1e-3, -0.0, 0.0, 1e-3, 0.7, 1, 3.9, 30, 88.5, 200, np.inf, np.nan]
                 * 3, np.float32)
    out = np.empty((1, v.size), np.float32)
    assert sgemm.matmul_rows(np.ones((1, 1), np.float32), v.reshape(1, -1), out, act=act)
    finite = np.isfinite(v)
    with np.errstate(over="ignore", invalid="ignore"):
        want = ACTS[act](v[finite].astype(np.float64))
    # (erf's approximation is within 4e-7 absolute: GELU's error scales with |x| where 1 + erf is small)
    atol = 2e-7 * (1 + np.abs(v[finite])) if act.startswith("gelu") else 1e-30
    assert np.all(np.abs(out[0][finite] - want) <= 2e-6 * np.abs(want) + atol)
    assert np.isnan(out[0][np.isnan(v)]).all()  # NaN passes through
    pos_inf = out[0][v == np.inf]
    assert np.all(pos_inf == (1.0 if act == "sigmoid" else np.inf))

