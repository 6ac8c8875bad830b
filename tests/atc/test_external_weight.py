"""``--external_weight``: weights as files beside the .om.

GE's page: ``--external_weight`` (hiascend ATC parameter pages; GE's repository pages under
docs/zh/user_guides/atc_tools/CLI_options/ were not in the stored index): 0 keeps the weights in
the .om, 1 saves each Const's weight as its own file in a ``weight`` folder beside the .om, 2 saves
them into one file. An .om is data from a stranger: its weight files are named by relative path
inside its folder, and a missing, swapped or changed file is a clear error (docs/security.md).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import ModelFileError, OmFormatError
from ge_core.om import read_model_definition, weight_buffers
from ge_core.om_container import read_container
from ge_sdk.omdesc import inspect_om

from .conftest import conv_net, ort_run


def _build(tmp_path, atc, mode: int) -> str:
    net = conv_net(tmp_path / "net.onnx")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'm'}", f"--external_weight={mode}")
    assert rc == 0, err
    return str(tmp_path / "m.om")


@pytest.mark.parametrize("mode,files", [(1, 4), (2, 1)])
def test_external_weights_load_mapped_and_compute_the_same(tmp_path, atc, mode, files):
    om = _build(tmp_path, atc, mode)
    weight_files = sorted(os.listdir(tmp_path / "weight"))
    assert len(weight_files) == files
    info = inspect_om(om)
    parts = {p["kind"]: p["size"] for p in info["file"]["partitions"]}
    assert parts["weights"] == 0
    listed = info["model"]["external_weights"]["files"]
    assert sorted(f["path"] for f in listed) == [f"weight/{n}" for n in weight_files]
    assert all(f["size"] == os.path.getsize(tmp_path / f["path"]) for f in listed)
    model = ge.load_om(om)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(model.run({"x": x})["y"], ort_run(str(tmp_path / "net.onnx"), {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
    consts = [v.const_value for v in model.graph.constants.values() if v.const_value.size > 1]
    assert consts and all(not c.flags.owndata and not c.flags.writeable for c in consts)  # views of the mapped files


def test_missing_and_swapped_weight_files_are_clear_errors(tmp_path, atc):
    om = _build(tmp_path, atc, 1)
    names = sorted(os.listdir(tmp_path / "weight"), key=lambda n: os.path.getsize(tmp_path / "weight" / n))
    small, big = tmp_path / "weight" / names[0], tmp_path / "weight" / names[-1]
    shutil.copy(big, tmp_path / "big.bak")
    os.remove(big)
    with pytest.raises(ModelFileError, match=f"weight/{names[-1]}"):
        ge.load_om(om)
    shutil.copy(small, big)  # another file in its place: the size says so
    with pytest.raises(OmFormatError, match="bytes, the model expects"):
        ge.load_om(om)
    data = bytearray((tmp_path / "big.bak").read_bytes())
    data[0] ^= 0xFF  # same size, other bytes: the checksum says so
    big.write_bytes(bytes(data))
    with pytest.raises(OmFormatError, match="checksum"):
        ge.load_om(om)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside.bin", "weight/../../x.bin", "weight\\\\x.bin", ""])
def test_weight_paths_outside_the_folder_are_refused(tmp_path, atc, bad):
    om = _build(tmp_path, atc, 2)
    with read_container(om) as c:
        d = read_model_definition(om, c)
        d["external_weights"]["files"][0]["path"] = bad
        with pytest.raises(OmFormatError, match="external weight file #0"):
            weight_buffers(om, d, c)


def test_a_link_leading_out_of_the_folder_is_refused(tmp_path, atc):
    om = _build(tmp_path, atc, 2)
    target = tmp_path / "weight" / os.listdir(tmp_path / "weight")[0]
    outside = tmp_path.parent / f"{tmp_path.name}_outside.bin"
    shutil.move(target, outside)
    os.symlink(outside, target)
    with pytest.raises(OmFormatError, match="leads out"):
        ge.load_om(om)
    outside.unlink()


def test_bad_external_weight_value_is_refused(tmp_path, atc):
    net = conv_net(tmp_path / "net.onnx")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'm'}", "--external_weight=3")
    assert rc == 2 and "external_weight" in err
