"""bench/llm.py in its quick mode (tiny configs, 16+8 tokens, one thread, one round): every engine
and form is timed or its refusal printed on its line; this engine's greedy tokens equal
onnxruntime's on the plain export (and on the builder's forms where it loads them)."""

import importlib.util
import os
import re

import pytest
import torch  # noqa: F401
import transformers  # noqa: F401 - the "bench" extra, installed by .ci/run

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "llm.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ge_bench_llm", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_reports_every_engine(bench, capsys):
    assert bench.main(["--quick", "--gap", "0", "--no-memory"]) == 0
    out = capsys.readouterr().out
    # each engine's row, less the note on how the ge loop keeps its cache
    rows = {m.group(1): m.group(2).split("   (cache: ")[0]
            for m in re.finditer(r"^    (\S+(?: \S+)? \[\w+\])\s+(.*)$", out, re.M)}
    assert set(rows) == {f"{e} [{f}]" for f, es in bench.ENGINES.items() for e in es}, out
    for key in ("ge [plain]", "ort [plain]", "ov f32 [plain]", "ort [fp32]", "ort [int4]"):
        assert not rows[key].startswith("refused"), f"{key}: {rows[key]}"
    assert rows["ge [plain]"].endswith("yes") and rows["ov f32 [plain]"].endswith("yes")
    for form in ("fp32", "int4"):  # loaded: the tokens equal onnxruntime's; else its refusal is shown
        row = rows[f"ge [{form}]"]
        assert row.startswith("refused: ") or row.endswith("yes"), row
    assert "[plain] ge/ort: prefill" in out and "(cache: " in out


def test_peak_memory_child(bench, tmp_path):
    from ge_llm.export import export_decoder

    path = str(tmp_path / "plain.onnx")
    export_decoder(bench.hf_model("llama", quick=True), path)
    mb = bench.peak_memory("ort", path, 1, [5, 6, 7], 2)
    base = bench.peak_memory("none", "", 1, [5], 1)
    assert isinstance(mb, float) and isinstance(base, float) and mb > base > 0, (mb, base)
    assert bench.peak_memory("ge", str(tmp_path / "missing.onnx"), 1, [5], 1).startswith("child failed")
