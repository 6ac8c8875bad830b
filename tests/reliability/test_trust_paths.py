"""A path holding a NUL character (which the OS refuses with a raw ValueError) is a GEError
naming the path wherever the API takes one: found by the config fuzz campaign (a nested
``config = "...\\0..."`` crashed ``load_config``)."""

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import GEError, InputError, ModelFileError, OptionError
from ge_sdk import GraphBuilder


def _model():
    b = GraphBuilder("g")
    x = b.input("x", "float32", (2,))
    b.output(b.op("Relu", x))
    return b.graph


def _nested_config(tmp_path):
    p = tmp_path / "outer.toml"
    p.write_text('[options]\nconfig = "inner\\u0000.toml"\n')
    return str(p)


CASES = {
    "load": (lambda t: ge.load(f"{t}/a\0b.onnx"), ModelFileError),
    "load_om": (lambda t: ge.load_om(f"{t}/a\0b.om"), ModelFileError),
    "save": (lambda t: ge.compile(_model()).save(f"{t}/a\0b.om"), ModelFileError),
    "config": (lambda t: ge.compile(_model(), f"{t}/a\0.toml"), OptionError),
    "nested_config": (lambda t: ge.compile(_model(), _nested_config(t)), OptionError),
    "fusion_switch_file": (lambda t: ge.compile(_model(), {"fusion_switch_file": f"{t}/s\0.json"}), OptionError),
    "dump_ir": (lambda t: ge.compile(_model(), {"dump_ir": f"{t}/d\0"}), OptionError),
    "feed_file": (lambda t: __import__("ge_sdk.inputs", fromlist=["read_feed_file"]).read_feed_file("x", f"{t}/x\0.npy"),
                  InputError),
}


@pytest.mark.parametrize("where", sorted(CASES))
def test_a_nul_in_a_path_is_a_geerror(where, tmp_path):
    fn, err = CASES[where]
    with pytest.raises(GEError) as ei:
        fn(tmp_path)
    assert isinstance(ei.value, err), f"{type(ei.value).__name__}: {ei.value}"
    assert "\0" not in str(ei.value), "the message prints the raw NUL; show the path with repr"


def test_the_model_still_compiles_with_clean_paths(tmp_path):  # the control: the same calls succeed
    m = ge.compile(_model(), {"dump_ir": str(tmp_path / "d")})
    m.save(str(tmp_path / "m.om"))
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(ge.load_om(str(tmp_path / "m.om")).run({"x": x})[m.output_names[0]], [0.0, 2.0])
