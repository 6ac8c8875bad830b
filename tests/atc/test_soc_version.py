"""ATC's ``--soc_version`` takes Ascend names (Ascend910B and its variants, Ascend310P3,
Ascend910_9391, ...) and compiles for the cpu backend with a one-line note, as docs/atc.md says
(issue #47); a name that is neither an Ascend NPU's nor a backend's is still refused."""

import pytest

import ge_core as ge
from tests.atc.conftest import conv_net, run_atc


@pytest.mark.parametrize("soc", ["Ascend910B", "Ascend910B1", "Ascend910B4", "Ascend310P3", "Ascend910_9391",
                                 "Ascend310", "ascend910b2"])
def test_ascend_names_compile_for_the_cpu_backend(tmp_path, capsys, soc):
    src = conv_net(tmp_path / "m.onnx")
    rc, _, err = run_atc(f"--model={src}", "--framework=5", f"--soc_version={soc}", f"--output={tmp_path / 'm'}",
                         capsys=capsys)
    assert rc == 0, err
    notes = [line for line in err.splitlines() if "soc_version" in line]
    assert notes == [f"note: --soc_version={soc}: no Ascend NPU here; compiling for the cpu backend"]
    assert ge.load_om(str(tmp_path / "m.om")).options.soc_version == "cpu"


def test_other_names_are_still_refused(tmp_path, capsys):
    src = conv_net(tmp_path / "m.onnx")
    rc, _, err = run_atc(f"--model={src}", "--framework=5", "--soc_version=Tesla910", f"--output={tmp_path / 'm'}",
                         capsys=capsys)
    assert rc != 0 and "no backend named 'Tesla910'" in err
    rc, _, err = run_atc(f"--model={src}", "--framework=5", "--soc_version=cpu", f"--output={tmp_path / 'c'}",
                         capsys=capsys)
    assert rc == 0 and "soc_version" not in err
