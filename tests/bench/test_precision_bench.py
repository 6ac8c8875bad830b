"""bench/precision.py: its error figures and targets line on known numbers, and one tiny model through
all six engines (every engine timed or reported failed; the float32 ones agree; the input-rounding
floor computed for a float input). Keeps the bench working while the precision kernels land."""

import importlib.util
import os

import numpy as np
import pytest
import torch  # noqa: F401
import transformers  # noqa: F401 - the "bench" extra, installed by .ci/run

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "precision.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ge_bench_precision", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_error_stats(bench):
    ref = np.array([[0.0, 2.0], [4.0, -4.0]], np.float32)
    d, rel, cos = bench.error_stats(ref + np.float32(0.5) * (ref == 2.0), ref)
    assert d == 0.5 and rel == 0.5 / 8.0
    assert cos == pytest.approx(37.0 / (6.0 * np.sqrt(38.25)))  # (0, 2.5, 4, -4) . (0, 2, 4, -4) / norms
    assert bench.error_stats(ref[0], ref)[0] == float("inf")  # a shape mismatch


def _result(ms: dict, err_bf16: float, err_fp16: float, ov: str = "bf16", err_ov: float = 1e-3,
            floor_fp16: float = 1e-4) -> dict:
    def stats(rel):
        return ((rel, rel, 1.0), (rel, rel, 1.0))

    return {"ms": ms, "err": {"ge bf16": stats(err_bf16), "ge fp16": stats(err_fp16), "ov default": stats(err_ov)},
            "ov": ov, "floor": {"bf16": (floor_fp16, 4 * floor_fp16, 1.0), "fp16": (floor_fp16, floor_fp16, 1.0)}}


def test_targets_line(bench):
    fast = {"ge fp32": 30.0, "ge bf16": 9.0, "ge fp16": 29.0, "ov default": 10.0}
    good = {"resnet50": _result(fast, 5e-3, 1e-3), "bert": _result(fast, 1e-3, 1e-3)}
    assert bench.targets(good).startswith("targets: ALL MET")
    slow = dict(fast, **{"ge fp16": 31.0})
    line = bench.targets({"resnet50": _result(slow, 5e-3, 1e-3), "bert": _result(fast, 2e-2, 1e-3, ov="f32")})
    assert line.startswith("targets: not met")
    assert "never slower than ge fp32: NO (worst resnet50" in line and "ge bf16 err <= max(0.01" in line
    assert "OV bf16): NO (worst bert" in line and "OV default not bf16 on bert" in line
    # a model no engine meets 1e-2 on (a random-weight ResNet): no worse than OpenVINO's bf16, or
    # than rounding only the input to fp16, passes
    chaotic = {"resnet50": _result(fast, 0.5, 0.09, err_ov=0.6, floor_fp16=0.1), "bert": good["bert"]}
    assert bench.targets(chaotic).startswith("targets: ALL MET")
    worse = {"resnet50": _result(fast, 0.7, 0.09, err_ov=0.6, floor_fp16=0.1)}
    assert "OV bf16): NO (worst resnet50" in bench.targets(worse)
    missing = {"bert": _result({k: v for k, v in fast.items() if k != "ge bf16"}, 1e-3, 1e-3)}
    assert "ge bf16 <= OV default: NO (missing on bert)" in bench.targets(missing)


def test_tiny_model_through_every_engine(bench):
    module, feeds = bench.tm.build("vit", "tiny")
    blob = bench.tm.to_onnx(module, feeds)
    r = bench.measure(blob, feeds, threads=1, rounds=1, gap=0.0)
    assert set(r["ms"]) | set(r["errors"]) == set(bench.ENGINES)
    for k in ("ge fp32", "ort fp32", "ov f32"):
        assert k in r["ms"], r["errors"].get(k)
        assert r["err"][k][0][1] < 1e-4 and r["err"][k][0][2] > 0.99999
    assert r["err"]["ge fp32"][1][0] == 0.0
    assert set(r["floor"]) == {"bf16", "fp16"} and r["floor"]["fp16"][1] < r["floor"]["bf16"][1]
    bench.print_model("vit", r)
