"""Cold start: a fresh process that imports ge_core, loads a compiled CNN and runs it imports
nothing that running it does not use (no pass, fusion rule, frontend, quantiser or precision
module; no onnx, ml_dtypes, numba, scipy, rich, torch or tensorflow), because the registries
are filled one hook at a time on first use; and asked for everything, they still hold it all."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ge_core as ge
from ge_core import PluginError, hookimpl, plugins
from ge_core.ir.types import TensorType
from ge_core.plugins import HOOK_KINDS, PluginHost

#: what loading and running a compiled float32 CNN must not import
NOT_AT_LOAD = (
    "onnx", "ml_dtypes", "numba", "scipy", "rich", "torch", "tensorflow",
    "ge_passes.algebra", "ge_passes.folding", "ge_passes.cse", "ge_passes.transpose_sinking",
    "ge_fusion.rules", "ge_fusion.passes", "ge_fusion.autofuse",
    "ge_onnx.frontend", "ge_tensorflow.frontend", "ge_tensorflow.mappers", "ge_torch.frontend", "ge_torch.mappers",
    "ge_quant.calibration", "ge_quant.quantizer", "ge_quant.qdq",
    "ge_atc.precision", "ge_atc.aipp", "ge_memory.planners", "ge_tools.commands",
)

CHILD = r"""
import json, sys
import numpy as np
import ge_core as ge
m = ge.load_om(sys.argv[1])
y = m.run({"x": np.load(sys.argv[2])})[m.output_names[0]]
np.save(sys.argv[3], y)
print(json.dumps(sorted(sys.modules)))
"""


def small_cnn() -> ge.Graph:
    """Conv-Relu-Conv-Relu-MaxPool-GlobalAveragePool-Flatten-Gemm on a 1x3x32x32 image."""
    rng = np.random.default_rng(0)
    g = ge.Graph("cnn")
    g.opset_imports[""] = 17
    x = g.add_input("x", TensorType(np.dtype(np.float32), (1, 3, 32, 32)))

    def conv(v, cin, cout, name):
        w = g.add_constant(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * 0.2, name=f"{name}_w")
        b = g.add_constant(rng.standard_normal(cout).astype(np.float32) * 0.1, name=f"{name}_b")
        y = g.add_node("Conv", [v, w, b], {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}, name=name).output
        return g.add_node("Relu", [y], name=f"{name}_relu").output

    y = conv(conv(x, 3, 16, "c1"), 16, 32, "c2")
    y = g.add_node("MaxPool", [y], {"kernel_shape": [2, 2], "strides": [2, 2]}, name="pool").output
    y = g.add_node("GlobalAveragePool", [y], name="gap").output
    y = g.add_node("Flatten", [y], name="flat").output
    w = g.add_constant(rng.standard_normal((10, 32)).astype(np.float32) * 0.2, name="fc_w")
    b = g.add_constant(np.zeros(10, np.float32), name="fc_b")
    g.set_outputs([g.add_node("Gemm", [y, w, b], {"transB": 1}, name="fc").output])
    return g


def test_load_and_run_of_an_om_imports_nothing_it_does_not_use(tmp_path):
    model = ge.compile(small_cnn())
    om = str(tmp_path / "cnn.om")
    model.save(om)
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = model.run({"x": x})[model.output_names[0]]
    # (not strict: strict mode calls every hook at once, by design)
    out = subprocess.run([sys.executable, "-c", CHILD, om, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "GE_STRICT_PLUGINS": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not loaded & set(NOT_AT_LOAD), sorted(loaded & set(NOT_AT_LOAD))
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)
    assert model.report["op_counts"], model.report  # (the compiled model, not the source graph, ran)


def _plugins_json(before: str = "") -> list:
    code = before + "import sys; from ge_core.cli import main; sys.exit(main(['plugins', '--json']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "GE_STRICT_PLUGINS": "0"}, check=True)
    return json.loads(out.stdout)


def test_ge_plugins_lists_everything_after_a_load(tmp_path):
    """`ge plugins` fills every registry, whatever a load filled before: the same table as when
    every hook is called first, in order, with every kind provided."""
    ge.compile(small_cnn()).save(str(tmp_path / "cnn.om"))
    after_load = _plugins_json(f"import ge_core; ge_core.load_om({str(tmp_path / 'cnn.om')!r}); ")
    eager = _plugins_json("import ge_core; ge_core.get_host().registries.complete(); ")
    assert after_load == eager
    provides = {r["name"]: r["provides"] for r in after_load}
    assert provides["ge_passes"]["passes"] == 12 and provides["ge_fusion"]["fusion_patterns"] > 10
    assert provides["ge_onnx"]["frontends"] == 1 and provides["ge_memory"]["memory_planners"] >= 5
    assert provides["ge_cpu"]["cpu_kernels"] > 100 and provides["ge_opset"]["ops"] > 100


def test_registries_are_filled_per_hook_on_first_use():
    host = PluginHost()
    regs = host.registries
    assert not any(regs.filled(h) for h in HOOK_KINDS)
    assert ("", "Conv") in regs.kernels_for("cpu")
    assert regs.filled("ge_register_kernels") and not regs.filled("ge_register_passes")
    assert "fold_constants" in regs.passes and regs.passes.origin("fold_constants") == "ge_passes"
    regs.complete()
    assert all(regs.filled(h) for h in HOOK_KINDS)
    assert "onnx" in regs.frontends and "cpu" in regs.backends and len(regs.fusion_patterns) > 10


def test_a_failing_hook_is_reported_when_its_kind_is_filled(monkeypatch):
    class Broken:
        @hookimpl
        def ge_register_fusion_patterns(self, register):
            raise RuntimeError("no patterns today")

    host = PluginHost(load_entry_points=False)
    host.pm.register(Broken(), name="broken_patterns")  # (as an entry point would: no eager fill)
    regs = host.registries
    assert len(regs.backends) == 0 and not host.info.get("broken_patterns")
    assert len(regs.fusion_patterns) == 0
    assert "no patterns today" in host.info["broken_patterns"].errors[0]
    assert "ge_register_fusion_patterns" in host.info["broken_patterns"].errors[0]
    monkeypatch.setenv("GE_STRICT_PLUGINS", "1")
    strict = PluginHost(load_entry_points=False)
    strict.pm.register(Broken(), name="broken_patterns")
    with pytest.raises(PluginError, match="broken_patterns"):
        strict.registries  # noqa: B018 - strict mode calls every hook at once


def test_passes_constant_is_imported_on_first_use():
    import ge_passes

    classes = ge_passes.PASSES
    assert len(classes) == 12 and all(isinstance(c, type) for c in classes)
    assert plugins.get_host().registries.passes.get("dce").__class__ in classes



def test_import_alone_does_not_read_the_entry_points():
    """importlib.metadata (email, zipfile, csv) is imported when the host first reads the group."""
    code = "import sys, ge_core; print('importlib.metadata' in sys.modules, 'email' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]
