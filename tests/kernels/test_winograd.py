"""Winograd F(2x2, 3x3) convolution (ge_cpu.kernels.winograd): against a float64 direct
convolution with a rounding bound, and inside compiled models against onnxruntime, on odd
shapes (asymmetric pads, odd planes, batch > 1, channel counts off any block size)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.errors import OptionError
from ge_cpu.kernels import winograd


def direct64(x, w, pads, group=1):
    """The 3x3 convolution in float64, by definition (``group`` groups)."""
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, c, h, wd = xp.shape
    oh, ow = h - 2, wd - 2
    m, cg = w.shape[0], c // group
    y = np.zeros((n, m, oh, ow))
    for g in range(group):
        ms, cs = slice(g * m // group, (g + 1) * m // group), slice(g * cg, (g + 1) * cg)
        for r in range(3):
            for q in range(3):
                y[:, ms] += np.einsum("mc,nchw->nmhw", w[ms, :, r, q].astype(np.float64), xp[:, cs, r:r + oh, q:q + ow])
    return y


CASES = [((1, 64, 8, 8), 64, (1, 1, 1, 1)), ((3, 17, 9, 7), 5, (1, 1, 1, 1)), ((2, 70, 5, 11), 66, (0, 1, 1, 0)),
         ((1, 3, 2, 2), 4, (1, 1, 1, 1)), ((2, 8, 13, 1), 3, (1, 0, 1, 2)), ((1, 96, 15, 15), 80, (0, 0, 0, 0))]
#: grouped: (input shape, output channels, pads, groups)
GROUPED = [((1, 64, 9, 9), 64, (1, 1, 1, 1), 2), ((2, 96, 7, 10), 48, (1, 1, 1, 1), 3), ((1, 12, 5, 5), 8, (0, 1, 1, 0), 4)]


@pytest.mark.parametrize("path", ["native", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,m,pads", CASES)
def test_winograd_is_within_float_rounding_of_the_direct_convolution(xs, m, pads, dtype, path):
    rng = np.random.default_rng(len(xs) + m)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((m, xs[1], 3, 3)).astype(dtype)
    k = winograd.Winograd(w, compiled=path == "native")  # numpy: no compiler, or planes too wide for the C ones
    assert k.compiled == (path == "native"), "the compiled transforms are built on this machine"
    got = k.run(x, pads)
    ref = direct64(x, w, pads)
    assert got.shape == ref.shape and got.dtype == dtype
    # every output is a sum of 9*C products; the transforms add a few roundings per term:
    # bounded by a small multiple of eps times the sum of |w| |x| over the window
    mag = direct64(np.abs(x), np.abs(w), pads)
    eps = np.finfo(dtype).eps
    assert np.all(np.abs(got - ref) <= 16 * eps * mag + 1e-30)


@pytest.mark.parametrize("xs,m,pads,group", GROUPED)
def test_grouped_winograd_is_within_float_rounding(xs, m, pads, group):
    rng = np.random.default_rng(group)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((m, xs[1] // group, 3, 3)).astype(np.float32)
    for compiled in (True, False):
        got = winograd.Winograd(w, compiled=compiled, group=group).run(x, pads)
        ref = direct64(x, w, pads, group)
        mag = direct64(np.abs(x), np.abs(w), pads, group)
        assert np.all(np.abs(got - ref) <= 16 * np.finfo(np.float32).eps * mag + 1e-30)


def _conv_model(xs, m, pads, seed=0, group=1):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((m, xs[1] // group, 3, 3)) / np.sqrt(9 * xs[1])).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=list(pads), kernel_shape=[3, 3], group=group),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("xs,m,pads,group", [c + (1,) for c in CASES] + GROUPED)
def test_compiled_winograd_matches_onnxruntime(xs, m, pads, group):
    model = _conv_model(xs, m, pads, group=group)
    x = np.random.default_rng(3).standard_normal(xs).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = ge.compile(ge.load(model), {"conv_algorithm": "winograd"})
    assert compiled.report["kernel_modes"].get("winograd") == 1  # the fused conv runs it
    for _ in range(2):  # the second run reuses the shape's buffers
        np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_auto_picks_winograd_only_where_it_pays_and_im2col_forces_it_off():
    big, small = _conv_model((1, 64, 28, 28), 64, (1, 1, 1, 1)), _conv_model((1, 8, 28, 28), 8, (1, 1, 1, 1))
    assert ge.compile(ge.load(big)).report["kernel_modes"].get("winograd") == 1
    assert "winograd" not in ge.compile(ge.load(small)).report.get("kernel_modes", {})
    assert "winograd" not in ge.compile(ge.load(big), {"conv_algorithm": "im2col"}).report.get("kernel_modes", {})
    with pytest.raises(OptionError, match="conv_algorithm"):
        ge.compile(ge.load(big), {"conv_algorithm": "fft"})


def test_strided_and_dilated_convs_never_take_winograd_and_narrow_groups_only_when_forced():
    for attrs in ({"strides": [2, 2]}, {"dilations": [2, 2]}):
        assert not winograd.applies((1, 64, 28, 28), (64, 64, 3, 3), attrs.get("strides", [1, 1]),
                                    attrs.get("dilations", [1, 1]), 1, np.float32, pays=False)
    assert winograd.applies((1, 128, 28, 28), (128, 64, 3, 3), [1, 1], [1, 1], 2, np.float32)  # RegNet's width 64
    assert not winograd.applies((1, 128, 28, 28), (128, 8, 3, 3), [1, 1], [1, 1], 16, np.float32)  # width 8
    assert winograd.applies((1, 128, 28, 28), (128, 8, 3, 3), [1, 1], [1, 1], 16, np.float32, pays=False)


def test_winograd_names_its_variant(monkeypatch):
    from ge_native import isa

    w = np.ones((8, 8, 3, 3), np.float32)
    fam = isa.family("winograd")
    assert fam is winograd.FAMILY and fam.fallback == "numpy"
    assert winograd.Winograd(w, compiled=False).variant == "numpy"
    compiled = winograd.Winograd(w)
    assert compiled.compiled  # a C compiler is on every supported machine (the window loops' test)
    assert compiled.variant == isa.variant_of("winograd") and compiled.variant in ("avx512f", "avx2", "scalar")
    assert (compiled.variant == "avx512f") == ("avx512f" in isa.features())
    monkeypatch.setenv("GE_CPU_JIT", "0")
    assert isa.variant_of("winograd") == "numpy" and not winograd.Winograd(w).compiled
