"""bench/int8.py: its error figures and targets line on known numbers, and one tiny model quantised
by onnxruntime (static QDQ) and, where this build has it, by ``ge.quantize``, through every engine
(each timed or reported failed; the float32 ones agree; the int8 ones near them). Keeps the bench
working while the int8 kernels land."""

import importlib.util
import os

import numpy as np
import pytest
import torch  # noqa: F401
import transformers  # noqa: F401 - the "bench" extra, installed by .ci/run

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "int8.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ge_bench_int8", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_accuracy_and_top1(bench):
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal((1, 8, 2, 2)).astype(np.float32) for _ in range(4)]
    same = bench.accuracy(ref, ref, classifier=True)
    assert same["stats"][0] == 0.0 and same["stats"][2] == pytest.approx(1.0) and same["top1"] == 1.0
    noisy = bench.accuracy([r + 0.01 for r in ref], ref, classifier=True)
    assert 0.0 < noisy["stats"][1] < 0.01 and noisy["top1"] is not None
    tokens = [rng.standard_normal((1, 5, 8)).astype(np.float32) for _ in range(3)]
    assert bench.accuracy(tokens, tokens, classifier=True)["top1"] == 1.0  # the first token's features
    assert bench.accuracy(tokens, tokens, classifier=False)["top1"] is None
    assert bench.accuracy([t[:, :2] for t in tokens], tokens, classifier=True)["stats"][0] == float("inf")


def test_speedup_target_by_cpu_flags(bench):
    assert bench.speedup_target({"amx_int8", "avx512_vnni"}) == 2.5
    assert bench.speedup_target({"avx512_vnni"}) == 1.8 and bench.speedup_target({"avx_vnni"}) == 1.8
    assert bench.speedup_target({"avx2"}) is None


def _result(name: str, ms: dict, err_ge: float, err_ort: float) -> dict:
    def e(rel):
        return {"stats": (rel, rel, 1.0), "top1": 1.0}

    return {"name": name, "ms": ms, "errors": {}, "err": {"ge int8 qdq": e(err_ge), "ort int8 qdq": e(err_ort)}}


def test_targets_line(bench):
    fast = {"ge fp32": 30.0, "ge int8 qdq": 10.0, "ort int8 qdq": 12.0, "ov int8 qdq": 11.0}
    good = {"resnet50": _result("resnet50", fast, 1e-2, 1e-2), "bert": _result("bert", fast, 1e-3, 2e-3)}
    assert bench.targets(good, {"amx_int8"}).startswith("targets: ALL MET")
    # 3x is enough with AMX; 2.22x is not, but is with VNNI only
    mild = {"ge fp32": 30.0, "ge int8 qdq": 13.5, "ort int8 qdq": 15.0, "ov int8 qdq": 14.0}
    slower = {"resnet50": _result("resnet50", mild, 1e-2, 1e-2)}
    assert "[cnn geomean, AMX]: NO (2.22x)" in bench.targets(slower, {"amx_int8"})
    assert bench.targets(slower, {"avx512_vnni"}).startswith("targets: ALL MET")
    assert "n/a (no VNNI" in bench.targets(slower, set())
    bad = {"resnet50": _result("resnet50", dict(fast, **{"ge int8 qdq": 11.5}), 1.2e-2, 1e-2)}
    line = bench.targets(bad, {"amx_int8"})
    assert line.startswith("targets: not met")
    assert "ge int8 <= ov int8 [qdq cnn]: NO (worst resnet50 qdq 1.05x)" in line
    assert "ge int8 err <= 1.1x ort int8 err: NO (worst resnet50 qdq 1.20x)" in line
    # OpenVINO's bound holds on the CNNs only; a missing engine counts against
    assert "ov int8 [qdq cnn]: NO (no models)" in bench.targets({"bert": good["bert"]}, {"amx_int8"})
    gone = _result("bert", {k: v for k, v in fast.items() if k != "ge int8 qdq"}, 1e-3, 1e-3)
    gone["errors"]["ge int8 qdq"] = "compile: boom"
    assert "ge int8 <= ort int8: NO (worst bert qdq" not in bench.targets({"bert": gone}, set())
    assert "missing on bert qdq" in bench.targets({"bert": gone}, set())


def test_tiny_model_through_every_engine(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "build_model", lambda name: (
        lambda m, f: (bench.tm.to_onnx(m, f), f))(*bench.tm.build("vit", "tiny")))
    own = bench.own_quantiser()
    entry = bench.prepare("vit", ["qdq"], own, str(tmp_path))
    assert set(entry["forms"]) == {"qdq"} | ({bench.OWN} if own else set())
    assert "QuantizeLinear" in bench.op_counts(entry["forms"]["qdq"])
    r = dict(bench.measure(entry, threads=1, rounds=1, gap=0.0), name="vit")
    want = {*bench.FP_ENGINES, "ort int8 qdq", "ov int8 qdq", "ge int8 qdq"} | ({"ge int8 gq"} if own else set())
    assert set(r["ms"]) | set(r["errors"]) == want
    for k in ("ge fp32", "ov f32", "ort int8 qdq"):
        assert k in r["ms"], r["errors"].get(k)
    for k in ("ge fp32", "ov f32"):
        assert r["err"][k]["stats"][1] < 1e-4 and r["err"][k]["top1"] == 1.0
    # int8 on a tiny ViT: near, not equal. This engine's int8 build runs, or its failure is on its
    # line and the bench goes on (what the bench must do whatever state the int8 path is in)
    int8 = [k for k in ("ort int8 qdq", "ge int8 qdq", "ge int8 gq") if k in r["ms"]]
    for k in int8:
        assert 0.0 < r["err"][k]["stats"][1] < 0.2 and r["err"][k]["stats"][2] > 0.95, k
    bench.print_model("vit", r)
    bench.geomeans({"vit": r})
    out = capsys.readouterr().out
    assert "geomean [vision, qdq]" in out
    if "ge int8 qdq" in int8:
        assert "[qdq] ge int8/ort int8" in out
    else:
        assert f"ge int8 qdq   FAILED ({r['errors']['ge int8 qdq']})" in out
    assert bench.targets({"vit": r}, set()).startswith("targets: ")
