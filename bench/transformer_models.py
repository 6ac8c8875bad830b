"""Latency on transformer architectures (NLP, vision, audio) built from ``transformers`` configs with
random weights: this engine vs onnxruntime vs OpenVINO, at the same thread count, side by side.

Models (no downloads; every one is a config with random weights, sized so a run takes a few to a few
tens of ms on one core):

    nlp     bert (BERT-style encoder), distilbert, gpt2 (GPT-2-style decoder), llama (LLaMA-style
            decoder: RMSNorm, rotary, SwiGLU, grouped-query attention), t5enc (T5 encoder), all at
            sequence length 128
    vision  vit (ViT-B/16 layout, smaller), deit_tiny (DeiT-tiny: ViT, hidden 192, 12 layers,
            3 heads), swin (Swin, smaller), all on 224x224 images
    audio   whisper_enc (Whisper-tiny encoder on 3 s of log-mel features), wav2vec2 (Wav2Vec2-style,
            1 s of 16 kHz audio)

Each is wrapped so the export sees tensors in and one tensor (``last_hidden_state``) out, exported
once with ``torch.onnx.export(dynamo=False, opset 17)``. For every thread count the engines run
interleaved round by round, with an idle gap before each timed block (OpenBLAS and onnxruntime
workers spin-wait and slow whoever runs next). Prints the median per engine, ratios to
onnxruntime, max |diff| to onnxruntime, geometric means per family and overall, and each engine's
speedup from the first to the second thread count. ``--busy`` repeats the whole table with a
competing process spinning on one core. A model that fails to export, or an engine that fails to
compile or run it, is reported on its line and the bench goes on.

    python bench/transformer_models.py [--threads 1,2] [--rounds 7] [--models bert,vit]
                                 [--families nlp,vision,audio] [--gap 0.3] [--busy] [--save-onnx DIR]

Time it with ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` unset in that command; the BLAS kernel
threadpoolctl reports is printed first. Needs the ``bench`` extra (openvino, transformers).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

FAMILIES = {
    "nlp": ["bert", "distilbert", "gpt2", "llama", "t5enc"],
    "vision": ["vit", "deit_tiny", "swin"],
    "audio": ["whisper_enc", "wav2vec2"],
}
FAMILY_OF = {m: f for f, ms in FAMILIES.items() for m in ms}
MODELS = [m for ms in FAMILIES.values() for m in ms]


def wrap(model, kind: str):
    """A module whose forward takes tensors and returns ``last_hidden_state``."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            if kind == "ids":
                return self.model(input_ids=x).last_hidden_state
            if kind == "ids+mask":  # an explicit all-ones mask keeps transformers' packed-sequence check
                # (torch.diff, which the TorchScript exporter lacks) out of the trace
                return self.model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
            if kind == "pixels":
                return self.model(pixel_values=x).last_hidden_state
            if kind == "features":
                return self.model(input_features=x).last_hidden_state
            return self.model(input_values=x).last_hidden_state

    return LastHidden().eval()


def build(name: str, size: str = "bench"):
    """``(torch module, example inputs as a dict of numpy arrays)``; ``size`` is "bench" or "tiny"
    (a few-layer, narrow config with short inputs, for tests)."""
    import torch
    import transformers as tf

    if size not in ("bench", "tiny"):
        raise ValueError(f"size must be 'bench' or 'tiny', not {size!r}")
    tiny = size == "tiny"
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    seq = 16 if tiny else 128
    vocab = 1000 if tiny else 8000
    img = 32 if tiny else 224
    common = {"attn_implementation": "eager"}

    def ids():
        return {"input_ids": rng.integers(0, vocab, (1, seq)).astype(np.int64)}

    def pixels():
        return {"pixel_values": rng.standard_normal((1, 3, img, img)).astype(np.float32)}

    if name == "bert":
        h, L = (64, 2) if tiny else (384, 4)
        cfg = tf.BertConfig(hidden_size=h, num_hidden_layers=L, num_attention_heads=h // 64 if h >= 64 else 1,
                            intermediate_size=4 * h, vocab_size=vocab, max_position_embeddings=512, **common)
        return wrap(tf.BertModel(cfg).eval(), "ids"), ids()
    if name == "distilbert":
        h, L = (64, 2) if tiny else (384, 4)
        cfg = tf.DistilBertConfig(dim=h, n_layers=L, n_heads=max(1, h // 64), hidden_dim=4 * h,
                                  vocab_size=vocab, max_position_embeddings=512, **common)
        return wrap(tf.DistilBertModel(cfg).eval(), "ids"), ids()
    if name == "gpt2":
        h, L = (64, 2) if tiny else (384, 4)
        cfg = tf.GPT2Config(n_embd=h, n_layer=L, n_head=max(1, h // 64), vocab_size=vocab, n_positions=256,
                            bos_token_id=0, eos_token_id=0, use_cache=False, **common)
        return wrap(tf.GPT2Model(cfg).eval(), "ids+mask"), ids()
    if name == "llama":
        h, L = (64, 2) if tiny else (384, 4)
        heads = max(2, h // 64)
        cfg = tf.LlamaConfig(hidden_size=h, intermediate_size=(8 * h) // 3 // 16 * 16, num_hidden_layers=L,
                             num_attention_heads=heads, num_key_value_heads=heads // 2, vocab_size=vocab,
                             max_position_embeddings=512, use_cache=False, **common)
        return wrap(tf.LlamaModel(cfg).eval(), "ids+mask"), ids()
    if name == "t5enc":
        h, L = (64, 2) if tiny else (384, 4)
        cfg = tf.T5Config(d_model=h, d_kv=64 if not tiny else 32, num_heads=max(2, h // 64), d_ff=4 * h,
                          num_layers=L, vocab_size=vocab, use_cache=False, **common)
        return wrap(tf.T5EncoderModel(cfg).eval(), "ids"), ids()
    if name in ("vit", "deit_tiny"):
        if tiny:
            h, L, heads, patch = 64, 2, 2, 8
        elif name == "vit":
            h, L, heads, patch = 384, 4, 6, 16   # ViT-B/16 layout, narrower and shallower
        else:
            h, L, heads, patch = 192, 12, 3, 16  # DeiT-tiny (same layout as timm's deit_tiny_patch16_224)
        cfg = tf.ViTConfig(hidden_size=h, num_hidden_layers=L, num_attention_heads=heads, intermediate_size=4 * h,
                           image_size=img, patch_size=patch, **common)
        return wrap(tf.ViTModel(cfg, add_pooling_layer=False).eval(), "pixels"), pixels()
    if name == "swin":
        if tiny:
            kw = dict(image_size=img, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4)
        else:  # Swin-T layout (embed 96, depths 2-2-6-2) halved in width and depth
            kw = dict(image_size=img, patch_size=4, embed_dim=48, depths=[2, 2, 2, 2], num_heads=[2, 4, 8, 16],
                      window_size=7)
        cfg = tf.SwinConfig(**kw, **common)
        return wrap(tf.SwinModel(cfg, add_pooling_layer=False).eval(), "pixels"), pixels()
    if name == "whisper_enc":
        # Whisper-tiny's encoder (d_model 384, 4 layers, 6 heads, 80 mel bins) on 3 s of features:
        # max_source_positions 150 -> the encoder takes (1, 80, 300) instead of 30 s (1, 80, 3000).
        h, L, heads, pos = (64, 1, 2, 16) if tiny else (384, 4, 6, 150)
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = tf.WhisperConfig(d_model=h, encoder_layers=L, encoder_attention_heads=heads, encoder_ffn_dim=4 * h,
                               num_mel_bins=80, max_source_positions=pos, use_cache=False, **common)
        enc = WhisperEncoder(cfg).eval()  # the encoder alone: WhisperModel would also build the decoder
        return wrap(enc, "features"), {"input_features": rng.standard_normal((1, 80, 2 * pos)).astype(np.float32)}
    if name == "wav2vec2":
        if tiny:
            kw = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                      conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
            samples = 1600
        else:  # Wav2Vec2-base layout, narrower: 7 conv layers of 128 channels, 4 layers of 256
            kw = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                      conv_dim=(128,) * 7, num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16)
            samples = 16000
        cfg = tf.Wav2Vec2Config(**kw, mask_time_prob=0.0, **common)
        return wrap(tf.Wav2Vec2Model(cfg).eval(), "values"), {
            "input_values": rng.standard_normal((1, samples)).astype(np.float32)}
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def to_onnx(model, feeds: dict, dynamic_axes: dict | None = None) -> bytes:
    import torch

    buf = io.BytesIO()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, buf, input_names=list(feeds), output_names=["last_hidden_state"],
                          opset_version=17, dynamo=False, dynamic_axes=dynamic_axes)
    return buf.getvalue()


def ge_engine(onnx_bytes: bytes, threads: int, parallel: str = "engine"):
    import onnx

    import ge_core as ge

    m = ge.compile(ge.load(onnx.load_from_string(onnx_bytes)), {"threads": threads, "parallel": parallel})
    return m.run


#: extra ge configurations (``--ge-blas``): BLAS's own threads instead of GE's pool
GE_VARIANTS: list[str] = []


def ort_engine(onnx_bytes: bytes, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
    return lambda f: sess.run(None, f)


def ov_engine(onnx_bytes: bytes, threads: int):
    import tempfile

    import openvino as ov

    core = ov.Core()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        with open(path, "wb") as f:
            f.write(onnx_bytes)
        compiled = core.compile_model(core.read_model(path), "CPU",
                                      {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                       "INFERENCE_PRECISION_HINT": "f32"})  # f32: no bf16 on AVX512_BF16 CPUs
    req = compiled.create_infer_request()
    return lambda f: req.infer(f)


def engines(onnx_bytes: bytes, threads: int):
    """``({name: run(feeds)}, {name: error})`` for every installed engine, all at ``threads`` threads."""
    out, errors = {}, {}
    makers = [("ge", ge_engine)]
    makers += [(f"ge-{v}", lambda b, t, _v=v: ge_engine(b, t, _v)) for v in GE_VARIANTS]
    makers.append(("onnxruntime", ort_engine))
    try:
        import openvino  # noqa: F401

        makers.append(("openvino", ov_engine))
    except ImportError:
        pass
    for k, make in makers:
        try:
            out[k] = make(onnx_bytes, threads)
        except Exception as e:  # noqa: BLE001 - report and go on
            errors[k] = f"compile: {err_text(e)}"
    return out, errors


def err_text(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return msg if len(msg) <= 300 else msg[:297] + "..."


def first(result):
    if isinstance(result, dict):
        result = list(result.values())
    return np.asarray(result[0])


def geomean(v):
    return math.exp(sum(math.log(r) for r in v) / len(v)) if v else float("nan")


def time_model(blob: bytes, feeds: dict, threads: int, rounds: int, gap: float):
    """``(median ms per engine, (max |diff|, max |diff| / max |ref|) to onnxruntime per engine, errors
    per engine)``; the relative figure shows whether the diff says anything (an output that vanishes
    matches anything)."""
    runs, errors = engines(blob, threads)
    outs = {}
    for k, fn in list(runs.items()):
        try:
            outs[k] = first(fn(feeds))
            for _ in range(2):  # warm-up
                fn(feeds)
        except Exception as e:  # noqa: BLE001
            errors[k] = f"run: {err_text(e)}"
            del runs[k]
    ref = outs.get("onnxruntime")
    diffs = {}
    for k, o in outs.items():
        if k in runs and ref is not None:
            d = float(np.max(np.abs(o.astype(np.float64) - ref))) if o.shape == ref.shape else float("inf")
            scale = float(np.max(np.abs(ref))) if ref.size else 0.0
            diffs[k] = (d, d / scale if scale > 0 else float("inf"))
    return interleaved(runs, feeds, rounds, gap), diffs, errors


def interleaved(runs: dict, feeds: dict, rounds: int, gap: float) -> dict[str, float]:
    """Median ms per call of each engine: ``rounds`` rounds, the engines in turn, each timed block
    (3 calls) after ``gap`` idle seconds (spin-waiting workers of the last engine go quiet)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            time.sleep(gap)
            t0 = time.perf_counter()
            for _ in range(3):
                fn(feeds)
            times[k].append((time.perf_counter() - t0) / 3)
    return {k: statistics.median(v) * 1e3 for k, v in times.items() if v}


def run_table(onnx_models: dict, thread_counts: list[int], rounds: int, gap: float, title: str = "",
              family_of: dict | None = None) -> dict:
    """Time every model at every thread count and print the tables; returns ``{threads: {model: med}}``
    (``family_of``: each model's family for the geomeans, by default this bench's)."""
    family_of = FAMILY_OF if family_of is None else family_of
    results: dict[int, dict[str, dict[str, float]]] = {}
    for threads in thread_counts:
        results[threads] = {}
        rt = core_round_trip() if threads > 1 else None
        print(f"\n{title}threads={threads}   (median ms; ratio to onnxruntime; max |diff| to onnxruntime, "
              "and that over max |onnxruntime's output|)" + ("" if rt is None else f"; core 0 <-> 1 round trip {rt:.0f} ns"))
        ratios: dict[str, dict[str, list[float]]] = {}  # family -> engine -> ratios
        for name, entry in onnx_models.items():
            if isinstance(entry, str):
                print(f"  {name:11s} EXPORT FAILED: {entry}")
                continue
            blob, feeds = entry
            med, diffs, errors = time_model(blob, feeds, threads, rounds, gap)
            results[threads][name] = med
            base = med.get("onnxruntime")
            parts = []
            for k, ms in med.items():
                if base:
                    r = ms / base
                    ratios.setdefault(family_of[name], {}).setdefault(k, []).append(r)
                    d, rel = diffs.get(k, (float("nan"), float("nan")))
                    parts.append(f"{k} {ms:.2f} ms ({r:.2f}x, diff {d:.1e}, rel {rel:.0e})")
                else:
                    parts.append(f"{k} {ms:.2f} ms")
            for k, e in errors.items():
                parts.append(f"{k} FAILED ({e})")
            print(f"  {name:11s} " + " | ".join(parts), flush=True)
        overall: dict[str, list[float]] = {}
        for fam, per_engine in ratios.items():
            print(f"  geomean ratio to onnxruntime [{fam}]: "
                  + ", ".join(f"{k} {geomean(v):.2f} (n={len(v)})" for k, v in per_engine.items()))
            for k, v in per_engine.items():
                overall.setdefault(k, []).extend(v)
        if overall:
            print("  geomean ratio to onnxruntime [all]: "
                  + ", ".join(f"{k} {geomean(v):.2f} (n={len(v)})" for k, v in overall.items()))
        if rt is not None:
            end = core_round_trip()
            print(f"  core 0 <-> 1 round trip at the end: {end:.0f} ns" if end is not None else "")
    if len(thread_counts) >= 2:
        t1, t2 = thread_counts[0], thread_counts[1]
        print(f"\n{title}speedup from {t1} to {t2} threads (median at {t1} / median at {t2})")
        engines_seen = []
        for per_model in results[t1].values():
            engines_seen += [k for k in per_model if k not in engines_seen]
        for k in engines_seen:
            per = {n: results[t1][n][k] / results[t2][n][k] for n in results[t1]
                   if k in results[t1][n] and n in results[t2] and k in results[t2][n]}
            if per:
                print(f"  {k:11s} geomean {geomean(list(per.values())):.2f}x   "
                      + " ".join(f"{n} {s:.2f}" for n, s in per.items()))
    return results


_PING_SRC = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
static _Alignas(64) atomic_int bp_flag;
static int bp_rounds;
static void bp_pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}
static void *bp_other(void *arg) {
    bp_pin(*(int *)arg);
    for (int i = 0; i < bp_rounds; i++) {
        while (atomic_load(&bp_flag) != 1) {}
        atomic_store(&bp_flag, 0);
    }
    return 0;
}
/* (cpu a, cpu b, rounds): ns a round trip of a cache line between threads pinned to a and b */
static PyObject *pingpong(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t a, b, rounds;
    if (ge_nargs(n, 3) || ge_int(args, 0, 0, 4095, &a) || ge_int(args, 1, 0, 4095, &b)
        || ge_int(args, 2, 1, 10000000, &rounds)) return NULL;
    int other = (int)b;
    pthread_t t;
    cpu_set_t saved;
    pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved);
    bp_rounds = (int)rounds;
    atomic_store(&bp_flag, 0);
    struct timespec t0, t1;
    Py_BEGIN_ALLOW_THREADS
    bp_pin((int)a);
    pthread_create(&t, 0, bp_other, &other);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < rounds; i++) {
        atomic_store(&bp_flag, 1);
        while (atomic_load(&bp_flag) != 0) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(t, 0);
    pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)rounds);
}
"""


def core_round_trip() -> float | None:
    """ns for a cache line to go from core 0 to core 1 and back (threads pinned; None where the
    native kernels do not build or there is one core). Cores sharing an L3 answer in well under
    100 ns; a VM's two vCPUs on different dies (seen here: AMD EPYC, 340 ns, and it changes
    from minute to minute) make every engine's 2-thread figures drop, so each table prints it."""
    if (os.cpu_count() or 1) < 2:
        return None
    from ge_native import native

    mod = native.build(_PING_SRC, ["pingpong"])
    if mod is None:
        return None
    try:
        return min(float(mod.pingpong(0, 1, 20000)) for _ in range(3))
    except (OSError, ValueError, TypeError):
        return None


def _busy_process():
    """A subprocess spinning pure Python on one core (it holds one core the whole time)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="", help=f"comma list of {','.join(MODELS)} (default: all)")
    ap.add_argument("--families", default="", help="comma list of nlp,vision,audio (default: all)")
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    ap.add_argument("--busy", action="store_true",
                    help="also run the whole table beside a process spinning on one core")
    ap.add_argument("--ge-blas", action="store_true",
                    help="also run ge with parallel=blas (BLAS's own threads) as engine 'ge-blas'")
    ap.add_argument("--save-onnx", default="", metavar="DIR", help="also write each export to DIR/NAME.onnx")
    a = ap.parse_args(argv)
    if a.ge_blas:
        GE_VARIANTS[:] = ["blas"]
    from threadpoolctl import threadpool_info

    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                    if i.get("user_api") == "blas"])
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    models = [m.strip() for m in a.models.split(",") if m.strip()] or list(MODELS)
    fams = [f.strip() for f in a.families.split(",") if f.strip()]
    for f in fams:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}; known: {', '.join(FAMILIES)}")
    for m in models:
        if m not in FAMILY_OF:
            ap.error(f"unknown model {m!r}; known: {', '.join(MODELS)}")
    if fams:
        models = [m for m in models if FAMILY_OF[m] in fams]
    onnx_models: dict[str, object] = {}  # name -> (bytes, feeds) or the export error
    for name in models:
        t0 = time.perf_counter()
        try:
            model, feeds = build(name)
            blob = to_onnx(model, feeds)
        except Exception as e:  # noqa: BLE001 - report and go on
            onnx_models[name] = err_text(e)
            print(f"export {name}: FAILED {err_text(e)}")
            continue
        onnx_models[name] = (blob, feeds)
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in feeds.items())
        print(f"export {name}: {len(blob) / 1e6:.1f} MB, {shapes}, {time.perf_counter() - t0:.1f} s", flush=True)
        if a.save_onnx:
            os.makedirs(a.save_onnx, exist_ok=True)
            with open(os.path.join(a.save_onnx, f"{name}.onnx"), "wb") as f:
                f.write(blob)
    thread_counts = [int(t) for t in a.threads.split(",") if t.strip()]
    run_table(onnx_models, thread_counts, a.rounds, a.gap)
    if a.busy:
        proc = _busy_process()
        try:
            time.sleep(0.5)
            run_table(onnx_models, thread_counts, a.rounds, a.gap, title="[busy: one core spinning] ")
        finally:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
