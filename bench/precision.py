"""Precision modes: this engine's fp32, bf16 and fp16 builds beside onnxruntime fp32, OpenVINO f32
and OpenVINO's default precision, at the same thread count, with their output errors (#44).

This engine runs through its public API with the compile option ``precision_mode``:
``must_keep_origin_dtype`` (fp32), ``allow_mix_precision_bf16`` (bf16), ``force_fp16`` (fp16).
OpenVINO runs with ``INFERENCE_PRECISION_HINT: f32`` and with no hint (bf16 on an AMX or
AVX512-BF16 CPU; each table says what it chose). Models, random weights, the other benches' sizes:
cnn resnet50, convnext_tiny (``bench/cnn.py``'s, realistic weights; also mobilenet_v2,
efficientnet_b0...), nlp+decoder bert (seq 128), gpt2 (also distilbert, llama, t5enc), vision
vit, deit_tiny (also swin), audio whisper_enc, wav2vec2 (``bench/transformer_models.py``'s).

Per thread count the six engines run interleaved round by round, an idle gap before each timed
block. Per model: median ms, ratio to onnxruntime fp32, ge bf16/fp32, ge fp16/fp32, ge bf16/OV
default; each engine's error against onnxruntime fp32 and against ge fp32 (max |diff|, that over
the reference's range max-min, cosine); a floor: onnxruntime's error on the float input rounded
to bf16/fp16 (random-weight CNNs carry one rounding far). Then per family the geomeans of ge
bf16's speed-up over ge fp32 and of ge bf16 / OV default, and a ``targets`` line: ge bf16 <= OV
default on every model, ge bf16 >= 3x ge fp32 on the cnn and nlp+decoder geomeans, ge fp16 never
slower than ge fp32, bf16 error <= 1e-2 of the range, fp16 <= 2e-3. A failing model or engine is
reported on its line; the bench goes on.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/precision.py [--threads 1,2] [--rounds 5]
        [--models resnet50,bert] [--gap 0.3] [--quick]

``--quick``: one round, one thread, mobilenet_v2 and bert. Prints the CPU's flags and the BLAS
kernel first. Needs the ``bench`` extra (openvino, transformers).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cnn  # noqa: E402 - the CNN builders with realistic weights
import transformer_models as tm  # noqa: E402 - the transformer builders, export, timing

FAMILY_OF = {m: "cnn" for m in cnn.REAL}
FAMILY_OF.update({m: "nlp+decoder" if f == "nlp" else f for m, f in tm.FAMILY_OF.items()})
DEFAULT_MODELS = ["resnet50", "convnext_tiny", "bert", "gpt2", "vit", "deit_tiny"]
QUICK_MODELS = ["mobilenet_v2", "bert"]
#: this engine's builds: engine name -> precision_mode
GE_MODES = {"ge fp32": "must_keep_origin_dtype", "ge bf16": "allow_mix_precision_bf16", "ge fp16": "force_fp16"}
ENGINES = [*GE_MODES, "ort fp32", "ov f32", "ov default"]
REF, GE_REF = "ort fp32", "ge fp32"
CPU_FLAGS = ("avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8")
#: the issue's error targets: max |diff| to onnxruntime fp32 over the reference's range
ERR_TARGET = {"ge bf16": 1e-2, "ge fp16": 2e-3}
SPEEDUP_TARGET = 3.0  # ge bf16 over ge fp32, geomean of the cnn and of the nlp+decoder family


def cpu_flags() -> tuple[str, set]:
    """The CPU's model name and flags (from /proc/cpuinfo)."""
    name, flags = "unknown", set[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name" and name == "unknown":
                    name = val.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    return name, flags


def cpu_line() -> str:
    """The CPU's model name and which of ``CPU_FLAGS`` it has (from /proc/cpuinfo)."""
    name, flags = cpu_flags()
    return f"CPU: {name}, {os.cpu_count()} logical; " + " ".join(
        f"{f}{'+' if f in flags else '-'}" for f in CPU_FLAGS)


def build_model(name: str) -> tuple[bytes, dict]:
    """``(onnx bytes, feeds)`` of a model at its bench size."""
    module, feeds = cnn.build_real(name) if FAMILY_OF[name] == "cnn" else tm.build(name)
    return tm.to_onnx(module, feeds), feeds


def ge_engine(blob: bytes, threads: int, mode: str):
    """This engine at ``threads`` on its own pool (as ``transformer_models.ge_engine``), compiled
    with ``precision_mode=mode``."""
    import onnx

    import ge_core as ge

    m = ge.compile(ge.load(onnx.load_from_string(blob)),
                   {"threads": threads, "parallel": "engine", "precision_mode": mode})
    return m.run


def ov_engine(blob: bytes, threads: int, hint: str | None):
    """``(run(feeds), the inference precision OpenVINO chose)``; ``hint`` None: its default."""
    import tempfile

    import openvino as ov

    core = ov.Core()
    cfg = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if hint:
        cfg["INFERENCE_PRECISION_HINT"] = hint
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        with open(path, "wb") as f:
            f.write(blob)
        compiled = core.compile_model(core.read_model(path), "CPU", cfg)
    chosen = compiled.get_property("INFERENCE_PRECISION_HINT")
    req = compiled.create_infer_request()
    return (lambda f: req.infer(f)), getattr(chosen, "to_string", lambda: str(chosen))()


def engines(blob: bytes, threads: int):
    """``(runs, errors, compile seconds, OV default's precision)`` for the six engines, all at
    ``threads`` threads (``runs`` in ``ENGINES`` order; ``errors`` of those that failed)."""
    runs, errors, secs, chosen = {}, {}, {}, {}
    makers = {k: (lambda b, t, _m=m: ge_engine(b, t, _m)) for k, m in GE_MODES.items()}
    makers[REF] = tm.ort_engine
    makers["ov f32"] = lambda b, t: ov_engine(b, t, "f32")
    makers["ov default"] = lambda b, t: ov_engine(b, t, None)
    for k, make in makers.items():
        t0 = time.perf_counter()
        try:
            fn = make(blob, threads)
        except Exception as e:  # noqa: BLE001 - report and go on
            errors[k] = f"compile: {tm.err_text(e)}"
            continue
        if isinstance(fn, tuple):
            fn, chosen[k] = fn
        runs[k], secs[k] = fn, time.perf_counter() - t0
    return runs, errors, secs, chosen.get("ov default", "?")


def error_stats(out: np.ndarray, ref: np.ndarray) -> tuple[float, float, float]:
    """``(max |diff|, that over the reference's range max-min, cosine similarity)`` in float64; a
    shape mismatch is ``(inf, inf, nan)``."""
    if out.shape != ref.shape or ref.size == 0:
        return float("inf"), float("inf"), float("nan")
    o, r = out.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    d = float(np.max(np.abs(o - r)))
    span = float(r.max() - r.min())
    norms = float(np.linalg.norm(o) * np.linalg.norm(r))
    return d, d / span if span > 0 else float("inf"), float(o @ r / norms) if norms > 0 else float("nan")


def measure(blob: bytes, feeds: dict, threads: int, rounds: int, gap: float) -> dict:
    """One model at one thread count: ``{"ms", "err", "errors", "secs", "ov"}`` with ``err[engine]
    = (stats vs onnxruntime fp32, stats vs ge fp32)`` (None where that reference is missing)."""
    runs, errors, secs, ov_chose = engines(blob, threads)
    outs = {}
    for k, fn in list(runs.items()):
        try:
            outs[k] = tm.first(fn(feeds))
            for _ in range(2):  # warm-up
                fn(feeds)
        except Exception as e:  # noqa: BLE001
            errors[k] = f"run: {tm.err_text(e)}"
            del runs[k]
    err = {k: tuple(error_stats(o, outs[r]) if r in outs else None for r in (REF, GE_REF)) for k, o in outs.items()}
    floor = input_sensitivity(runs[REF], feeds, outs[REF]) if REF in runs else {}
    ms = tm.interleaved(runs, feeds, rounds, gap)
    return {"ms": ms, "err": err, "errors": errors, "secs": secs, "ov": ov_chose, "floor": floor}


def input_sensitivity(run, feeds: dict, ref: np.ndarray) -> dict:
    """``{"bf16"|"fp16": error_stats}`` of onnxruntime fp32 on the float inputs rounded to that type,
    against its output on the inputs as they are: how far the model alone carries one rounding (a
    random-weight CNN multiplies it ~100x), a floor under any reduced-precision engine's error.
    Empty where no input is float (token ids)."""
    import ml_dtypes

    if not any(v.dtype == np.float32 for v in feeds.values()):
        return {}
    out = {}
    for label, dt in (("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)):
        rounded = {k: v.astype(dt).astype(np.float32) if v.dtype == np.float32 else v for k, v in feeds.items()}
        out[label] = error_stats(tm.first(run(rounded)), ref)
    return out


def _ratio(ms: dict, a: str, b: str) -> float | None:
    return ms[a] / ms[b] if a in ms and b in ms and ms[b] > 0 else None


def _stats(s) -> str:
    return "         -        -         -" if s is None else f"{s[0]:10.1e} {s[1]:8.1e} {s[2]:9.6f}"


def print_model(name: str, r: dict) -> None:
    """The model's table: per engine median ms, ratio to onnxruntime fp32, compile s and errors."""
    ms = r["ms"]
    print(f"  {name} [{FAMILY_OF[name]}]  (OV default precision: {r['ov']})")
    print(f"    {'engine':11s} {'median ms':>9s} {'/ort fp32':>9s} {'compile s':>9s}   "
          f"{'vs ort fp32: max|d|':>20s} {'/range':>8s} {'cos':>9s}   "
          f"{'vs ge fp32: max|d|':>19s} {'/range':>8s} {'cos':>9s}")
    for k in ENGINES:
        if k in r["errors"]:
            print(f"    {k:11s} FAILED ({r['errors'][k]})")
            continue
        if k not in ms:
            continue
        rel = _ratio(ms, k, REF)
        vs_ref, vs_ge = r["err"].get(k, (None, None))
        print(f"    {k:11s} {ms[k]:9.2f} {'-' if rel is None else f'{rel:.2f}x':>9s} {r['secs'][k]:9.2f}   "
              f"{_stats(vs_ref):>38s}   {_stats(vs_ge):>37s}")
    parts = [f"{label} {v:.2f}x" for label, v in (
        ("ge bf16/fp32", _ratio(ms, "ge bf16", "ge fp32")), ("ge fp16/fp32", _ratio(ms, "ge fp16", "ge fp32")),
        ("ge bf16/OV default", _ratio(ms, "ge bf16", "ov default"))) if v is not None]
    same = [k for k in ("ge bf16", "ge fp16") if (r["err"].get(k) or (None, None))[1] is not None
            and r["err"][k][1][0] == 0.0]
    if same:  # a mode that changed nothing: it computed in float32 (its kernels not wired, or none here)
        parts.append(f"(same output as ge fp32: {', '.join(same)})")
    print("    " + ("   ".join(parts) or "(ratios: engines missing)"))
    if r["floor"]:
        print("    floor: ort fp32 on the input rounded to " + ", ".join(
            f"{k} {s[1]:.1e} of range, cos {s[2]:.6f}" for k, s in r["floor"].items()))
    sys.stdout.flush()


def _worst(vals: dict, unit: str) -> str:
    k = max(vals, key=vals.get)
    return f"worst {k} {vals[k]:.2f}x" if unit == "x" else f"worst {k} {vals[k]:.1e}"


def targets(results: dict) -> str:
    """The issue's targets over ``{model: measure(...)}``: a line saying which hold. A model where
    an engine a target needs failed counts against it."""
    ok, parts = True, []

    def check(label, vals: dict, limit: float, missing: list, unit: str = ""):
        nonlocal ok
        met = bool(vals) and not missing and max(vals.values()) <= limit
        ok &= met
        why = ", ".join(filter(None, [_worst(vals, unit) if vals else "",
                                      f"missing on {','.join(missing)}" if missing else ""]))
        parts.append(f"{label}: {'yes' if met else 'NO'} ({why})")

    for label, a, b, limit in (("ge bf16 <= OV default", "ge bf16", "ov default", 1.0),
                               ("ge fp16 never slower than ge fp32", "ge fp16", "ge fp32", 1.0)):
        vals = {n: _ratio(r["ms"], a, b) for n, r in results.items()}
        check(label, {n: v for n, v in vals.items() if v is not None}, limit, [n for n, v in vals.items() if v is None],
              "x")
    not_bf16 = [n for n, r in results.items() if r["ov"] != "bf16"]
    if not_bf16:
        parts[0] += f" [OV default not bf16 on {','.join(not_bf16)}]"
    for fam in ("cnn", "nlp+decoder"):
        sp = [1 / v for r in _of(results, fam) if (v := _ratio(r["ms"], "ge bf16", "ge fp32"))]
        met = bool(sp) and tm.geomean(sp) >= SPEEDUP_TARGET
        ok &= met
        parts.append(f"ge bf16 >= {SPEEDUP_TARGET:g}x ge fp32 [{fam}]: " + (
            f"{'yes' if met else 'NO'} (geomean {tm.geomean(sp):.2f}x)" if sp else "NO (no models)"))
    # errors: the limit, or on a model no engine can meet it on (OpenVINO's bf16 error, or
    # the error of rounding only the input, is above it: a random-weight ResNet) no worse than those
    allowance = {"ge bf16": lambda r: r["err"].get("ov default", (None,))[0],
                 "ge fp16": lambda r: (0.0, r["floor"].get("fp16", (0.0, 0.0))[1])}
    for k, limit in ERR_TARGET.items():
        vals = {}
        for n, r in results.items():
            e, other = r["err"].get(k, (None,))[0], allowance[k](r)
            if e is not None:
                vals[n] = e[1] / max(limit, other[1] if other is not None else 0.0)
        check(f"{k} err <= max({limit:g} of range, {'OV bf16' if 'bf16' in k else 'input-rounding floor'})", vals,
              1.0, [n for n in results if n not in vals], "x")
    return f"targets: {'ALL MET' if ok else 'not met'}: " + " | ".join(parts)


def _gm(v: list[float]) -> str:
    return f"{tm.geomean(v):.2f}x (n={len(v)})" if v else "n/a (n=0)"


def _of(results: dict, fam: str) -> list[dict]:
    return [r for n, r in results.items() if FAMILY_OF[n] == fam]


def run_table(models: dict, threads: int, rounds: int, gap: float) -> dict:
    """Time and print every model at ``threads``, then the family geomeans and the targets."""
    rt = tm.core_round_trip() if threads > 1 else None
    print(f"\nthreads={threads}   (median ms of {rounds} rounds; errors: max |diff|, that over the reference's "
          "range, cosine similarity)" + ("" if rt is None else f"; core 0 <-> 1 round trip {rt:.0f} ns"))
    results = {}
    for name, entry in models.items():
        if isinstance(entry, str):
            print(f"  {name} EXPORT FAILED: {entry}")
            continue
        try:
            results[name] = measure(*entry, threads, rounds, gap)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"  {name} FAILED: {tm.err_text(e)}")
            continue
        print_model(name, results[name])
    for fam in dict.fromkeys(FAMILY_OF[n] for n in results):
        rs = _of(results, fam)
        sp = [1 / v for r in rs if (v := _ratio(r["ms"], "ge bf16", "ge fp32"))]
        vs_ov = [v for r in rs if (v := _ratio(r["ms"], "ge bf16", "ov default"))]
        print(f"  geomean [{fam}]: ge bf16 speed-up over ge fp32 {_gm(sp)}, ge bf16 / OV default {_gm(vs_ov)}")
    if results:
        print("  " + targets(results), flush=True)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default=None, help="comma list of thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    ap.add_argument("--models", default="", help=f"comma list of {','.join(FAMILY_OF)} "
                    f"(default: {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: one round, one thread, {','.join(QUICK_MODELS)} (unless given)")
    a = ap.parse_args(argv)
    names = [m.strip() for m in a.models.split(",") if m.strip()] or (QUICK_MODELS if a.quick else DEFAULT_MODELS)
    for m in names:
        if m not in FAMILY_OF:
            ap.error(f"unknown model {m!r}; known: {', '.join(FAMILY_OF)}")
    thread_counts = [int(t) for t in (a.threads or ("1" if a.quick else "1,2")).split(",") if t.strip()]
    rounds = a.rounds if a.rounds is not None else 1 if a.quick else 5
    from threadpoolctl import threadpool_info

    print(cpu_line())
    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                    if i.get("user_api") == "blas"])
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    print(f"threads: {','.join(map(str, thread_counts))}; rounds {rounds}; gap {a.gap} s; "
          f"ge modes: {', '.join(f'{k}={v}' for k, v in GE_MODES.items())}")
    models: dict[str, object] = {}  # name -> (bytes, feeds) or the export error
    for name in names:
        t0 = time.perf_counter()
        try:
            models[name] = build_model(name)
        except Exception as e:  # noqa: BLE001 - report and go on
            models[name] = tm.err_text(e)
            print(f"export {name}: FAILED {models[name]}")
            continue
        blob, feeds = models[name]
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in feeds.items())
        print(f"export {name}: {len(blob) / 1e6:.1f} MB, {shapes}, {time.perf_counter() - t0:.1f} s", flush=True)
    for threads in thread_counts:
        run_table(models, threads, rounds, a.gap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
