"""ge bench, ge compare and ge profile say the shapes and threads they ran with and never guess a
size (issue 47, "tools that tell the truth"): ``--batch N`` on a gear model runs the gear of batch
N (or names the gears), ``--input-shape`` takes a gear's shapes, a symbolic dim nothing sizes is
refused (a one-value range gives its value), and ge profile takes --input-shape and --threads."""

from __future__ import annotations

import json

import pytest

import ge_core as ge
from ge_core.cli import main
from tests.tools.models import matmul_chain

TOOLS = ("bench", "compare", "profile")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A chain with a symbolic batch (.onnx and .om), its gear .om of batches 1, 2, 4 (atc
    --dynamic_batch_size), and .om builds with the batch ranged 1~8 and 2~2."""
    from ge_atc.cli import main as atc

    d = tmp_path_factory.mktemp("shapes")
    src = matmul_chain(str(d / "chain.onnx"), width=32, layers=2)
    out = {"src": src, "om": ge.compile(src).save(str(d / "chain.om"))}  # threads: the machine's
    assert atc([f"--model={src}", "--framework=5", f"--output={d / 'gears'}", "--input_shape=x:-1,32",
                "--dynamic_batch_size=1,2,4"]) == 0
    out["gears"] = str(d / "gears.om")
    for name, shape in (("ranged", "x:1~8,32"), ("one", "x:2~2,32")):
        out[name] = ge.compile(src, threads=1, input_shape=shape).save(str(d / f"{name}.om"))
    out["dir"] = d
    return out


def _tool(capsys, models, tool, model, *args, json_out=True):
    """``ge TOOL MODEL ARGS`` in process: (exit status, the JSON or text printed, stderr)."""
    extra = {"bench": ["--runs", "2", "--warmup", "0"], "compare": ["--source", models["src"]],
             "profile": ["--runs", "1", "--trace", str(models["dir"] / "t.json")]}[tool]
    capsys.readouterr()
    rc = main([tool, str(model), *extra, *map(str, args), *(["--json"] if json_out else [])])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if json_out and out.strip() else out), err


@pytest.mark.parametrize("tool", ("bench", "compare"))  # (ge profile picks a gear by --input-shape)
def test_batch_picks_the_gear_of_that_batch(capsys, models, tool):
    rc, r, err = _tool(capsys, models, tool, models["gears"], "--batch", 4)
    assert rc == 0, err
    assert r["inputs"]["x"]["shape"] == [4, 32] and r["gear"].startswith("gear 2 (batch 4)")


def test_batch_that_is_no_gear_is_refused_naming_the_gears(capsys, models):
    rc, _, err = _tool(capsys, models, "bench", models["gears"], "--batch", 3)
    assert rc == 2 and "no gear of batch 3" in err and "batch 1, 2, 4" in err
    rc, _, err = _tool(capsys, models, "bench", models["gears"], "--batch", 2, "--input-shape", "x:4,32")
    assert rc == 2 and "--batch 2" in err and "[4, 32]" in err  # two flags that disagree: never one silently


@pytest.mark.parametrize("tool", TOOLS)
def test_input_shape_takes_a_gear_shape(capsys, models, tool):
    rc, r, err = _tool(capsys, models, tool, models["gears"], "--input-shape", "x:4,32")
    assert rc == 0, err
    assert r["inputs"]["x"]["shape"] == [4, 32] and r["gear"].startswith("gear 2 (batch 4)")


@pytest.mark.parametrize("tool", TOOLS)
def test_a_symbolic_dim_nothing_sizes_is_refused(capsys, models, tool):
    rc, out, err = _tool(capsys, models, tool, models["om"])
    assert rc == 2 and not out, out  # was: run silently at batch 1
    assert "'x'" in err and "batch" in err and '--input-shape "x:' in err
    rc, out, err = _tool(capsys, models, tool, models["ranged"])  # a range is no size either
    assert rc == 2 and "'x'" in err and "batch" in err, (out, err)
    rc, r, err = _tool(capsys, models, tool, models["one"])  # a one-value range is
    assert rc == 0 and r["inputs"]["x"]["shape"] == [2, 32], err
    rc, r, err = _tool(capsys, models, tool, models["ranged"], "--input-shape", "x:8,32")
    assert rc == 0 and r["inputs"]["x"]["shape"] == [8, 32], err


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_prints_its_shapes_and_threads(capsys, models, tool):
    rc, text, err = _tool(capsys, models, tool, models["om"], "--input-shape", "x:3,32", "--threads", 1,
                          json_out=False)
    assert rc == 0, err
    assert "inputs x float32[3, 32]; threads 1" in text.splitlines()[0], text
    rc, r, err = _tool(capsys, models, tool, models["om"], "--input-shape", "x:3,32", "--threads", 2)
    assert rc == 0 and r["threads"] == 2 and r["inputs"]["x"]["shape"] == [3, 32], err


def test_threads_said_are_the_threads_run(capsys, models):
    """Without --threads the line gives the count the run uses (the pool's width), not 'default'."""
    rc, r, err = _tool(capsys, models, "bench", models["om"], "--batch", 2)
    model = ge.load_om(models["om"])
    assert rc == 0 and r["threads"] == (model.options.threads or model.executable.width), err
