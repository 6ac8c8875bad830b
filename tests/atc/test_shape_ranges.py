"""GE's shape ranges through atc: ``--input_shape="x:1~4,3,8~32,8~32"`` (and the older
``--input_shape_range="x:[1~4,3,8~32,8~32]"``) compile one model whose symbolic dims carry the
ranges: one symbolic memory plan, any shape inside the ranges runs and matches onnxruntime, a feed
outside is an InputError naming the range."""

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import InputError

from .conftest import ort_run
from .test_gears import _atc_error, _compile, cnn


@pytest.mark.parametrize("flag", ['--input_shape=x:1~4,3,8~32,8~32', '--input_shape_range=x:[1~4,3,8~32,8~32]'])
def test_a_range_compiles_one_symbolic_model(tmp_path, atc, flag):
    src = cnn(tmp_path / "n.onnx")
    model = ge.load_om(_compile(atc, tmp_path, src, flag))
    assert model.dim_ranges == {"N": (1, 4), "H": (8, 32), "W": (8, 32)}
    mem = model.report["memory"]
    assert mem["dynamic_buffers"] == 0 and mem["symbolic"]["symbols"] == {"N": [1, 4], "H": [8, 32], "W": [8, 32]}
    rng = np.random.default_rng(0)
    for shape in [(1, 3, 8, 8), (4, 3, 32, 32), (3, 3, 20, 12)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], ort_run(src, {"x": x})[0], rtol=1e-4, atol=1e-5)
    for shape in [(5, 3, 16, 16), (1, 3, 4, 16), (1, 3, 16, 33)]:
        with pytest.raises(InputError, match="outside the range"):
            model.run({"x": np.zeros(shape, np.float32)})


def test_range_flags_are_checked(tmp_path):
    src = cnn(tmp_path / "n.onnx")
    assert "exclusive" in _atc_error(tmp_path, src, "--input_shape=x:1,3,8,8", "--input_shape_range=x:[1~4,3,8,8]")
    assert "name:[d1,d2,...]" in _atc_error(tmp_path, src, "--input_shape_range=x:1~4,3,8,8")
    assert "lo <= hi" in _atc_error(tmp_path, src, "--input_shape=x:4~1,3,8,8")
    assert "fixes it to 3" in _atc_error(tmp_path, src, "--input_shape=x:1,1~3,8,8")
