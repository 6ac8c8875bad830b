"""int8 side by side: onnxruntime int8, OpenVINO int8, this engine's int8 and fp32 builds on the same
quantised ONNX models, at one thread count, with their output errors (#45).

Models, random weights, exported to ONNX fp32 as the other benches do: cnn resnet50, resnet18,
mobilenet_v2, efficientnet_b0 (also convnext_tiny; ``bench/cnn.py``'s realistic weights), nlp bert
(BERT-base, seq 128), vision vit (also deit_tiny; ``bench/transformer_models.py``'s). Quantised by
``onnxruntime.quantization`` in a temporary folder after ``quant_pre_process``: ``qdq``
(``quantize_static``, QDQ, per-channel, U8S8, MinMax on 8 random batches drawn as the inputs are),
``dyn`` (nlp only, ``quantize_dynamic``, weights QInt8), ``qop`` (static QOperator, on request);
``gq``: ``ge.quantize(graph, calibration=..., method="minmax", per_channel=True)`` where ``ge_core``
has it (else one line says so).

Engines, interleaved round by round, an idle gap before each timed block: ``ort fp32``, ``ov f32``,
``ge fp32``; per form ``ort int8``, ``ov int8`` (OpenVINO's default config) and ``ge int8``
(``ge.compile``, default options). Per model: median ms, ge int8 / ort int8, ge int8 / ov int8,
ge fp32 / ge int8; each engine's error against ort fp32 on 8 held-back inputs (max |diff| / the
reference's range, cosine; top-1 agreement of a fixed random 1000-class head on the image models'
pooled features). Then geomeans per family and form, and a ``targets`` line (#45's "Done when"):
ge int8 <= ort int8 on every model and form; <= ov int8 on the static QDQ CNNs; >= 2.5x ge fp32 on
the CNN geomean with AMX-INT8 (1.8x with VNNI only); error <= 1.1x ort int8's. What fails is
reported on its line; the bench goes on.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/int8.py [--threads 1,2] [--rounds 5]
        [--models resnet50,bert] [--formats qdq,qop,dyn] [--gap 0.3] [--quick]

``--quick``: one round, one thread, mobilenet_v2 and bert. Prints the CPU's flags and BLAS first.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cnn  # noqa: E402 - the CNN builders with realistic weights
import precision  # noqa: E402 - OpenVINO at its default precision, error statistics
import transformer_models as tm  # noqa: E402 - the transformer builders, export, timing

FAMILY_OF = {"resnet50": "cnn", "resnet18": "cnn", "mobilenet_v2": "cnn", "efficientnet_b0": "cnn",
             "convnext_tiny": "cnn", "bert": "nlp", "vit": "vision", "deit_tiny": "vision"}
DEFAULT_MODELS = ["resnet50", "resnet18", "mobilenet_v2", "efficientnet_b0", "bert", "vit"]
QUICK_MODELS = ["mobilenet_v2", "bert"]
#: forms by onnxruntime: qdq static QDQ, qop static QOperator, dyn dynamic (nlp only); gq: ge.quantize
FORMS = ("qdq", "qop", "dyn")
DEFAULT_FORMS = ("qdq", "dyn")
OWN = "gq"
REF = "ort fp32"
FP_ENGINES = [REF, "ov f32", "ge fp32"]
CPU_FLAGS = ("avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")
CALIB_BATCHES, HOLDOUT = 8, 8
ID_HIGH = 8000  # token ids are drawn in [0, ID_HIGH), as transformer_models.build draws them
ERR_SLACK = 1.1  # ge int8 error <= this x onnxruntime int8's
#: ge int8 speed-up over ge fp32 on the CNN geomean: with AMX-INT8, with VNNI only
SPEEDUP_AMX, SPEEDUP_VNNI = 2.5, 1.8


def speedup_target(flags: set) -> float | None:
    """The issue's int8 speed-up target for this CPU; None where it has no VNNI (no target)."""
    if "amx_int8" in flags:
        return SPEEDUP_AMX
    return SPEEDUP_VNNI if flags & {"avx512_vnni", "avx_vnni"} else None


def build_model(name: str) -> tuple[bytes, dict]:
    """``(onnx fp32 bytes, feeds)`` of a model at its bench size."""
    feeds: dict
    if name == "resnet18":
        import torch
        import transformers as tf

        torch.manual_seed(0)
        model = tf.ResNetModel(tf.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2],
                                               hidden_sizes=[64, 128, 256, 512]))
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        cnn.realistic_weights(model, x)
        module, feeds = tm.wrap(model, "pixels"), {"pixel_values": x}
    elif name == "bert":  # BERT-base, as in the issue (transformer_models' bert is narrower)
        import torch
        import transformers as tf

        torch.manual_seed(0)
        cfg: dict = {"attn_implementation": "eager"}
        model = tf.BertModel(tf.BertConfig(**cfg)).eval()
        ids = np.random.default_rng(0).integers(0, ID_HIGH, (1, 128)).astype(np.int64)
        module, feeds = tm.wrap(model, "ids"), {"input_ids": ids}
    elif FAMILY_OF[name] == "cnn":
        module, feeds = cnn.build_real(name)
    else:
        module, feeds = tm.build(name)
    return tm.to_onnx(module, feeds), feeds


def draw(feeds: dict, rng) -> dict:
    """Inputs like ``feeds``, drawn as the builders draw them: N(0, 1) floats, ids in [0, ID_HIGH)."""
    return {k: rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f"
            else rng.integers(0, ID_HIGH, v.shape).astype(v.dtype) for k, v in feeds.items()}


def quantise(name: str, blob: bytes, calib: list[dict], forms, folder: str) -> dict:
    """``{form: quantised onnx bytes, or the error text}`` by onnxruntime.quantization; files under
    ``folder``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(calib)

        def get_next(self):
            return next(self.batches, None)

    src, pre = os.path.join(folder, f"{name}.onnx"), os.path.join(folder, f"{name}.pre.onnx")
    with open(src, "wb") as f:
        f.write(blob)
    try:
        quant_pre_process(src, pre, skip_symbolic_shape=FAMILY_OF[name] == "cnn")
    except Exception as e:  # noqa: BLE001 - quantise the model as exported
        print(f"  {name}: quant_pre_process failed ({tm.err_text(e)}); quantising the export as is")
        pre = src
    out: dict[str, object] = {}
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # per-channel's warnings on every LayerNorm weight
    for form in forms:
        if form == "dyn" and FAMILY_OF[name] != "nlp":
            continue
        path = os.path.join(folder, f"{name}.{form}.onnx")
        t0 = time.perf_counter()
        try:
            if form == "dyn":
                quantize_dynamic(pre, path, weight_type=QuantType.QInt8)
            else:
                quantize_static(pre, path, Reader(), quant_format=QuantFormat.QDQ if form == "qdq"
                                else QuantFormat.QOperator, per_channel=True, activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
            with open(path, "rb") as fin:
                q = fin.read()
        except Exception as e:  # noqa: BLE001 - report and go on
            out[form] = tm.err_text(e)
            print(f"  {name} {form}: quantisation FAILED {out[form]}")
            continue
        out[form] = q
        print(f"  {name} {form}: {len(q) / 1e6:.1f} MB, {op_counts(q)}, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    logging.getLogger().setLevel(level)
    return out


def op_counts(blob: bytes) -> str:
    """The quantisation ops of a model, counted by type."""
    import collections

    import onnx

    kinds = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
             "ConvInteger", "DynamicQuantizeLinear")
    c = collections.Counter(n.op_type for n in onnx.load_from_string(blob).graph.node if n.op_type in kinds)
    return " ".join(f"{c[k]} {k}" for k in kinds if c[k]) or "no quantisation ops"


def own_quantiser():
    """``ge_core.quantize``, or None where this build has none."""
    import ge_core as ge

    return getattr(ge, "quantize", None)


def ge_quantise(blob: bytes, calib: list[dict]):
    """This engine's quantiser on the fp32 model: a Graph for ``ge.compile``."""
    import onnx

    import ge_core as ge

    quantize = getattr(ge, "quantize")  # noqa: B009 - absent from builds without the quantiser
    return quantize(ge.load(onnx.load_from_string(blob)), calibration=list(calib), method="minmax", per_channel=True)


def ge_engine(model, threads: int):
    """``(run, compile report's int8 section or None)`` of this engine at ``threads`` on its own
    pool; ``model`` is ONNX bytes or a Graph (the own quantiser's)."""
    import onnx

    import ge_core as ge

    # the own quantiser's Graph is compiled once per thread count: a copy each time
    graph = ge.load(onnx.load_from_string(model)) if isinstance(model, bytes) else model.copy()
    m = ge.compile(graph, {"threads": threads, "parallel": "engine"})
    report = getattr(m, "report", None)
    return m.run, report.get("int8") if isinstance(report, dict) else None


def ov_engine(blob: bytes, threads: int, hint: str | None):
    """OpenVINO's run at ``threads`` (``hint`` None: its default config, int8 on a quantised model)."""
    return precision.ov_engine(blob, threads, hint)[0]


def engines(entry: dict, threads: int):
    """``(makers, errors)``: ``{engine: make()}`` for the fp32 engines and each form's int8 ones;
    ``errors`` for the forms that failed to quantise."""
    makers: dict[str, Callable[[], object]] = {}
    errors: dict[str, str] = {}
    fp = entry["blob"]
    makers[REF] = partial(tm.ort_engine, fp, threads)
    makers["ov f32"] = partial(ov_engine, fp, threads, "f32")
    makers["ge fp32"] = partial(ge_engine, fp, threads)
    for form, q in entry["forms"].items():
        names = [f"ge int8 {form}"] if form == OWN else [f"ort int8 {form}", f"ov int8 {form}", f"ge int8 {form}"]
        if isinstance(q, str):
            errors.update({k: f"quantise: {q}" for k in names})
            continue
        if form == OWN:
            makers[names[0]] = partial(ge_engine, q, threads)
            continue
        makers[names[0]] = partial(tm.ort_engine, q, threads)
        makers[names[1]] = partial(ov_engine, q, threads, None)
        makers[names[2]] = partial(ge_engine, q, threads)
    return makers, errors


def accuracy(out: list, ref: list, classifier: bool) -> dict:
    """Errors of ``out`` against ``ref`` (lists of outputs on the held-back inputs): ``{"stats":
    (max |diff|, over the range, cosine), "top1": share agreeing or None}``. The top-1 is a fixed
    random 1000-class head on the pooled features (mean over space of NCHW, the first token of
    (N, T, C)), the same float64 head for every engine."""
    o, r = np.stack(out), np.stack(ref)
    stats = precision.error_stats(o, r)
    top1 = None
    if classifier and o.shape == r.shape:
        def pooled(a):
            return a.mean(axis=(-2, -1)) if a.ndim == 5 else a[:, :, 0, :]

        po, pr = pooled(o.astype(np.float64)), pooled(r.astype(np.float64))
        head = np.random.default_rng(3).standard_normal((po.shape[-1], 1000))
        top1 = float(np.mean(np.argmax(po @ head, -1) == np.argmax(pr @ head, -1)))
    return {"stats": stats, "top1": top1}


def measure(entry: dict, threads: int, rounds: int, gap: float) -> dict:
    """One model at one thread count: ``{"ms", "err", "errors", "secs", "int8"}`` (``err[engine]``
    from :func:`accuracy` against ort fp32 on the held-back inputs; ``int8``: ge's int8 report)."""
    makers, errors = engines(entry, threads)
    runs, secs, reports = {}, {}, {}
    for k, make in makers.items():
        t0 = time.perf_counter()
        try:
            fn = make()
        except Exception as e:  # noqa: BLE001 - report and go on
            errors[k] = f"compile: {tm.err_text(e)}"
            continue
        if isinstance(fn, tuple):
            fn, reports[k] = fn
        runs[k], secs[k] = fn, time.perf_counter() - t0
    feeds, holdout = entry["feeds"], entry["holdout"]
    outs = {}
    for k, fn in list(runs.items()):
        try:
            outs[k] = [tm.first(fn(f)) for f in holdout]
            for _ in range(2):  # warm-up
                fn(feeds)
        except Exception as e:  # noqa: BLE001
            errors[k] = f"run: {tm.err_text(e)}"
            del runs[k]
    classifier = FAMILY_OF[entry["name"]] != "nlp"
    err = {k: accuracy(o, outs[REF], classifier) for k, o in outs.items()} if REF in outs else {}
    ms = tm.interleaved(runs, feeds, rounds, gap)
    return {"ms": ms, "err": err, "errors": errors, "secs": secs, "int8": {k: v for k, v in reports.items() if v}}


def _ratio(ms: dict, a: str, b: str) -> float | None:
    return ms[a] / ms[b] if a in ms and b in ms and ms[b] > 0 else None


def _stats(s) -> str:
    return "         -        -         -" if s is None else f"{s[0]:10.1e} {s[1]:8.1e} {s[2]:9.6f}"


def _forms(r: dict) -> list[str]:
    """The forms a result has engines (or failures) for, in ``FORMS`` order, then the own one."""
    have = {k.rsplit(" ", 1)[1] for k in (*r["ms"], *r["errors"]) if " int8 " in k}
    return [f for f in (*FORMS, OWN) if f in have]


def _report_text(rep) -> str:
    """The scalars of ge's int8 report section, compact."""
    if not isinstance(rep, dict):
        return str(rep)[:200]
    items = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in rep.items()
             if isinstance(v, (int, float, str))]
    text = ", ".join(items) or f"keys {sorted(rep)}"
    return text if len(text) <= 200 else text[:197] + "..."


def print_model(name: str, r: dict) -> None:
    """The model's table: per engine median ms, compile s, errors; then per form the ratios."""
    ms, err = r["ms"], r["err"]
    print(f"  {name} [{FAMILY_OF[name]}]")
    print(f"    {'engine':13s} {'median ms':>9s} {'compile s':>9s}   {'vs ort fp32: max|d|':>20s} "
          f"{'/range':>8s} {'cos':>9s} {'top-1':>6s}")
    for k in [*FP_ENGINES, *(e for f in _forms(r) for e in (f"ort int8 {f}", f"ov int8 {f}", f"ge int8 {f}"))]:
        if k in r["errors"]:
            print(f"    {k:13s} FAILED ({r['errors'][k]})")
            continue
        if k not in ms:
            continue
        e = err.get(k)
        stats = _stats(e["stats"] if e else None)
        top1 = "-" if not e or e["top1"] is None else f"{e['top1']:.2f}"
        print(f"    {k:13s} {ms[k]:9.2f} {r['secs'][k]:9.2f}   {stats:>38s} {top1:>6s}")
    for f in _forms(r):
        ge = f"ge int8 {f}"
        parts = [f"{label} {v:.2f}x" for label, v in (
            ("ge int8/ort int8", _ratio(ms, ge, f"ort int8 {f}")), ("ge int8/ov int8", _ratio(ms, ge, f"ov int8 {f}")),
            ("ge fp32/ge int8 (speed-up)", _ratio(ms, "ge fp32", ge))) if v is not None]
        print(f"    [{f}] " + ("   ".join(parts) or "(ratios: engines missing)"))
        if ge in r["int8"]:
            print(f"    [{f}] ge int8 report: {_report_text(r['int8'][ge])}")
    sys.stdout.flush()


def _worst(vals: dict) -> str:
    k = max(vals, key=lambda n: vals[n])
    return f"worst {k} {vals[k]:.2f}x"


def targets(results: dict, flags: set) -> str:
    """The issue's targets over ``{label: measure(...)}`` (each result with its model's ``name``):
    a line saying which hold. A model or form where an engine a target needs failed counts
    against it."""
    ok, parts = True, []

    def check(label, pairs: dict, limit: float):
        """``pairs``: {where: ratio or None (an engine missing)}."""
        nonlocal ok
        vals = {n: v for n, v in pairs.items() if v is not None}
        missing = [n for n, v in pairs.items() if v is None]
        met = bool(vals) and not missing and max(vals.values()) <= limit
        ok &= met
        why = ", ".join(filter(None, [_worst(vals) if vals else "no models",
                                      f"missing on {','.join(missing)}" if missing else ""]))
        parts.append(f"{label}: {'yes' if met else 'NO'} ({why})")

    def rel_err(r, k):
        e = r["err"].get(k)
        return None if e is None else e["stats"][1]

    vs_ort, vs_ov, errs = {}, {}, {}
    for label, r in results.items():
        for f in (f for f in _forms(r) if f != OWN):
            ge, where = f"ge int8 {f}", f"{label} {f}"
            vs_ort[where] = _ratio(r["ms"], ge, f"ort int8 {f}")
            if f == "qdq" and FAMILY_OF[r["name"]] == "cnn":
                vs_ov[where] = _ratio(r["ms"], ge, f"ov int8 {f}")
            g, o = rel_err(r, ge), rel_err(r, f"ort int8 {f}")
            errs[where] = None if g is None or o is None else (g / o if o > 0 else 0.0 if g == 0 else float("inf"))
    check("ge int8 <= ort int8", vs_ort, 1.0)
    check("ge int8 <= ov int8 [qdq cnn]", vs_ov, 1.0)
    target = speedup_target(flags)
    sp = [1 / v for r in results.values() if FAMILY_OF[r["name"]] == "cnn"
          and (v := _ratio(r["ms"], "ge int8 qdq", "ge fp32"))]
    if target is None:
        parts.append("ge int8 speed-up [cnn]: n/a (no VNNI on this CPU)" + (
            f" (geomean {tm.geomean(sp):.2f}x)" if sp else ""))
    else:
        met = bool(sp) and tm.geomean(sp) >= target
        ok &= met
        isa = "AMX" if "amx_int8" in flags else "VNNI"
        parts.append(f"ge int8 >= {target:g}x ge fp32 [cnn geomean, {isa}]: " + (
            f"{'yes' if met else 'NO'} ({tm.geomean(sp):.2f}x)" if sp else "NO (no models)"))
    check(f"ge int8 err <= {ERR_SLACK:g}x ort int8 err", errs, ERR_SLACK)
    return f"targets: {'ALL MET' if ok else 'not met'}: " + " | ".join(parts)


def _gm(v: list[float]) -> str:
    return f"{tm.geomean(v):.2f}x (n={len(v)})" if v else "n/a"


def geomeans(results: dict) -> None:
    """Per family and form: geomeans of ge int8 / ort int8, ge int8 / ov int8 and the speed-up."""
    for fam in dict.fromkeys(FAMILY_OF[r["name"]] for r in results.values()):
        rs = [r for r in results.values() if FAMILY_OF[r["name"]] == fam]
        for f in dict.fromkeys(f for r in rs for f in _forms(r)):
            ge = f"ge int8 {f}"
            cols = [(label, [v for r in rs if (v := _ratio(r["ms"], ge, other))]) for label, other in (
                ("ge int8/ort int8", f"ort int8 {f}"), ("ge int8/ov int8", f"ov int8 {f}"))]
            cols.append(("ge int8 speed-up over ge fp32", [1 / v for r in rs if (v := _ratio(r["ms"], ge, "ge fp32"))]))
            print(f"  geomean [{fam}, {f}]: " + (", ".join(f"{label} {_gm(v)}" for label, v in cols if v)
                                                 or "n/a (engines missing)"))


def run_table(models: dict, threads: int, rounds: int, gap: float, flags: set) -> dict:
    """Time and print every model at ``threads``, then the geomeans and the targets."""
    rt = tm.core_round_trip() if threads > 1 else None
    print(f"\nthreads={threads}   (median ms of {rounds} rounds; errors on {HOLDOUT} held-back inputs: max |diff|, "
          "that over the reference's range, cosine, top-1 agreement)"
          + ("" if rt is None else f"; core 0 <-> 1 round trip {rt:.0f} ns"))
    results = {}
    for name, entry in models.items():
        if isinstance(entry, str):
            print(f"  {name} EXPORT FAILED: {entry}")
            continue
        try:
            results[name] = dict(measure(entry, threads, rounds, gap), name=name)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"  {name} FAILED: {tm.err_text(e)}")
            continue
        print_model(name, results[name])
    if results:
        geomeans(results)
        print("  " + targets(results, flags), flush=True)
    return results


def prepare(name: str, forms, own, folder: str):
    """A model's bench entry: ``{"name", "blob", "feeds", "holdout", "forms": {form: bytes, Graph
    or error text}}``; the calibration and held-back inputs are drawn apart (seeds 100, 200)."""
    t0 = time.perf_counter()
    blob, feeds = build_model(name)
    shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in feeds.items())
    print(f"export {name}: {len(blob) / 1e6:.1f} MB, {shapes}, {time.perf_counter() - t0:.1f} s", flush=True)
    calib = [draw(feeds, np.random.default_rng(100 + i)) for i in range(CALIB_BATCHES)]
    holdout = [draw(feeds, np.random.default_rng(200 + i)) for i in range(HOLDOUT)]
    qforms: dict = quantise(name, blob, calib, forms, folder)
    if own is not None:
        t0 = time.perf_counter()
        try:
            qforms[OWN] = ge_quantise(blob, calib)
            print(f"  {name} {OWN}: ge.quantize {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            qforms[OWN] = tm.err_text(e)
            print(f"  {name} {OWN}: ge.quantize FAILED {qforms[OWN]}")
    return {"name": name, "blob": blob, "feeds": feeds, "holdout": holdout, "forms": qforms}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default=None, help="comma list of thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    ap.add_argument("--models", default="", help=f"comma list of {','.join(FAMILY_OF)} "
                    f"(default: {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMS),
                    help=f"onnxruntime's forms, comma list of {','.join(FORMS)} (dyn: nlp models only)")
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: one round, one thread, {','.join(QUICK_MODELS)} (unless given)")
    a = ap.parse_args(argv)
    names = [m.strip() for m in a.models.split(",") if m.strip()] or (QUICK_MODELS if a.quick else DEFAULT_MODELS)
    for m in names:
        if m not in FAMILY_OF:
            ap.error(f"unknown model {m!r}; known: {', '.join(FAMILY_OF)}")
    forms = [f.strip() for f in a.formats.split(",") if f.strip()]
    for f in forms:
        if f not in FORMS:
            ap.error(f"unknown format {f!r}; known: {', '.join(FORMS)}")
    thread_counts = [int(t) for t in (a.threads or ("1" if a.quick else "1,2")).split(",") if t.strip()]
    rounds = a.rounds if a.rounds is not None else 1 if a.quick else 5
    from threadpoolctl import threadpool_info

    cpu, flags = precision.cpu_flags()
    print(f"CPU: {cpu}, {os.cpu_count()} logical; " + " ".join(f"{f}{'+' if f in flags else '-'}" for f in CPU_FLAGS))
    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                    if i.get("user_api") == "blas"])
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    print(f"threads: {','.join(map(str, thread_counts))}; rounds {rounds}; gap {a.gap} s; forms {','.join(forms)}; "
          f"calibration {CALIB_BATCHES} batches, {HOLDOUT} held-back inputs")
    own = own_quantiser()
    if own is None:
        print("ge-quantiser: not available in this build")
    everything = {}
    with tempfile.TemporaryDirectory(prefix="ge_int8_bench_") as folder:
        models: dict[str, object] = {}  # name -> entry or the export error
        for name in names:
            try:
                models[name] = prepare(name, forms, own, folder)
            except Exception as e:  # noqa: BLE001 - report and go on
                models[name] = tm.err_text(e)
                print(f"export {name}: FAILED {models[name]}")
        for threads in thread_counts:
            for name, r in run_table(models, threads, rounds, a.gap, flags).items():
                everything[f"{name}@{threads}"] = r
    if len(thread_counts) > 1 and everything:
        print(f"\nover threads {','.join(map(str, thread_counts))}: " + targets(everything, flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
