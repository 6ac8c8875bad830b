"""Decoder LLMs with a KV cache: prefill then greedy decode, this engine beside onnxruntime,
onnxruntime-genai's own loop and OpenVINO (#46).

Models: ``transformers`` configs with random weights (seed 0), 100-500M parameters: llama (the
issue's 156M: 8 layers, hidden 1024, GQA 16/4, intermediate 2816, vocab 32000), qwen2 and mistral
at the same size, phi3 on request. Each in three forms: ``plain``, exported with its KV cache by
``ge_llm.export`` (Optimum's names, dynamic past length, a 0-length past for the prefill); ``fp32``
and ``int4``, built by onnxruntime-genai's builder (``-p fp32|int4 -e cpu``: GroupQueryAttention,
the norms, MatMulNBits). Engines per form: ``ge`` (``ge.compile``, ``ge_llm.generate.Generator``),
``ort`` (onnxruntime on the same ONNX, the same loop), OpenVINO on the plain form (``ov f32`` and
``ov default``, its own precision: bf16 with AMX), ``ort-genai`` (onnxruntime-genai's own loop) on
the builder forms. A model this engine cannot load yet is reported ``refused: <reason>``.

Per engine: prefill ms (the prompt's run and its token), decode ms/token (median over the tokens),
tokens/s, peak memory (the RSS high-water of a child process that loads the engine and generates
once), greedy tokens equal to ort's; then ge/ort per form. The same threads everywhere,
interleaved rounds, an idle gap before each timed generation, one warm-up generation each.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/llm.py [--threads 1,2] [--rounds 3]
        [--models llama,qwen2,mistral] [--forms plain,fp32,int4] [--prompt 128] [--new 48]
        [--gap 0.5] [--no-memory] [--quick]

``--quick``: tiny configs, a 16-token prompt, 8 tokens, one round, one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

#: the issue's 156M decoder; qwen2 and mistral at its size; phi3 (fused qkv) on request
BENCH_CONFIG = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                    num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
TINY_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
ARCHS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
         "mistral": ("MistralConfig", "MistralForCausalLM"), "phi3": ("Phi3Config", "Phi3ForCausalLM")}
DEFAULT_MODELS = ["llama", "qwen2", "mistral"]
FORMS = ("plain", "fp32", "int4")
ENGINES = {"plain": ["ge", "ort", "ov f32", "ov default"], "fp32": ["ge", "ort", "ort-genai"],
           "int4": ["ge", "ort", "ort-genai"]}
CPU_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
EOS = 2  # the tokenizer's; builder models get a never-produced one so every run makes its tokens


def err_text(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return msg if len(msg) <= 300 else msg[:297] + "..."


def hf_model(arch: str, quick: bool):
    import torch
    import transformers as tf

    cfg_name, model_name = ARCHS[arch]
    extra = {"sliding_window": None} if arch == "mistral" else {}
    cfg = getattr(tf, cfg_name)(**(TINY_CONFIG if quick else BENCH_CONFIG), bos_token_id=1, eos_token_id=EOS,
                                pad_token_id=0, attn_implementation="eager", **extra)
    torch.manual_seed(0)
    return getattr(tf, model_name)(cfg).eval()


def tokenizer(vocab: int):
    """A word-level tokenizer (no hub): the builder reads the folder's for its special ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2")


def prepare(arch: str, forms: list[str], folder: str, quick: bool) -> dict[str, Any]:
    """``{"params", "vocab", form: the model.onnx path or an error text}`` under ``folder``."""
    from ge_llm.export import export_decoder

    t0 = time.perf_counter()
    model = hf_model(arch, quick)
    entry: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()), "vocab": model.config.vocab_size}
    hf = os.path.join(folder, arch, "hf")
    model.save_pretrained(hf)
    tokenizer(model.config.vocab_size).save_pretrained(hf)
    if "plain" in forms:
        path = os.path.join(folder, arch, "plain.onnx")
        try:
            export_decoder(model, path)
            entry["plain"] = path
        except Exception as e:  # noqa: BLE001 - report and go on
            entry["plain"] = f"export: {err_text(e)}"
    del model
    for form in (f for f in forms if f != "plain"):
        out = os.path.join(folder, arch, form)
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o", out, "-p", form,
               "-e", "cpu", "-c", os.path.join(folder, arch, "cache")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        path = os.path.join(out, "model.onnx")
        entry[form] = path if done.returncode == 0 and os.path.exists(path) else \
            f"builder: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    print(f"prepare {arch}: {entry['params'] / 1e6:.0f}M parameters, {time.perf_counter() - t0:.0f} s; "
          + ", ".join(f"{f}: {'ok' if os.path.exists(str(entry[f])) else entry[f]}" for f in forms), flush=True)
    return entry


class OrtModel:
    """An onnxruntime session with ``inputs``/``outputs``/``run`` as the Generator reads a model."""

    def __init__(self, path: str, threads: int) -> None:
        import onnxruntime as ort

        from ge_core import NodeArg

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        kinds = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
                 "tensor(float16)": np.float16}
        self.inputs, self.outputs = ([NodeArg(a.name, np.dtype(kinds.get(a.type, np.float32)), tuple(
            d if isinstance(d, int) else str(d) for d in a.shape)) for a in args]
            for args in (self.sess.get_inputs(), self.sess.get_outputs()))
        self.names, self.source = [a.name for a in self.outputs], path

    def run(self, feeds):
        return dict(zip(self.names, self.sess.run(None, feeds)))


class OvModel:
    """OpenVINO's compiled model (``hint`` None: its default precision), read as the Generator reads a model."""

    def __init__(self, path: str, threads: int, hint: str | None) -> None:
        import openvino as ov

        from ge_core import NodeArg

        cfg: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
        if hint:
            cfg["INFERENCE_PRECISION_HINT"] = hint
        import onnx

        graph = onnx.load(path, load_external_data=False).graph
        known = [v.name for v in (*graph.input, *graph.output)]
        self.compiled = ov.Core().compile_model(path, "CPU", cfg)
        self.req = self.compiled.create_infer_request()

        def arg(port):  # a port has several names: the model's own input or output name
            shape = tuple(d.get_length() if d.is_static else "?" for d in port.get_partial_shape())
            name = next((n for n in known if n in port.get_names()), port.get_any_name())
            return NodeArg(name, np.dtype(port.get_element_type().to_dtype()), shape)

        self.inputs = [arg(p) for p in self.compiled.inputs]
        self.outputs = [arg(p) for p in self.compiled.outputs]
        self.source = path

    def run(self, feeds):
        res = self.req.infer(feeds)
        return {a.name: res[p] for a, p in zip(self.outputs, self.compiled.outputs)}


def genai_engine(path: str, threads: int):
    """onnxruntime-genai's own loop at ``threads``: ``run(prompt, n) -> (tokens, prefill ms, decode ms)``."""
    import onnxruntime_genai as og

    folder = os.path.dirname(path)
    cfg_path = os.path.join(folder, "genai_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["model"]["eos_token_id"] = []  # none: every run makes its n tokens, as the other loops do
    cfg["model"]["decoder"]["session_options"].update(intra_op_num_threads=threads, inter_op_num_threads=1)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=4)
    model = og.Model(folder)

    def run(prompt, n):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + n)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompt)
        gen.generate_next_token()
        steps, first = [], time.perf_counter() - t0
        while not gen.is_done():
            t0 = time.perf_counter()
            gen.generate_next_token()
            steps.append(time.perf_counter() - t0)
        tokens = [int(t) for t in gen.get_sequence(0)][len(prompt):]
        return tokens, first * 1e3, statistics.median(steps) * 1e3 if steps else None

    return run


def make_engine(engine: str, path: str, threads: int) -> Callable:
    """``run(prompt, n) -> (tokens, prefill ms, decode ms/token)`` of ``engine`` on ``path``."""
    if engine == "ort-genai":
        return genai_engine(path, threads)
    from ge_llm.generate import Generator

    model: Any
    if engine == "ge":
        import ge_core as ge

        model = ge.compile(path, {"threads": threads, "parallel": "engine"})
        model.source = path
    elif engine == "ort":
        model = OrtModel(path, threads)
    else:
        model = OvModel(path, threads, "f32" if engine == "ov f32" else None)
    gen = Generator(model)

    def run(prompt, n):
        tokens = gen.generate(prompt, n)
        return tokens, gen.timings.first_token_s * 1e3, gen.timings.decode_ms

    run.mode = "shared past/present buffer" if gen.share_buffer else "io binding" if gen.io_binding else "copy"  # type: ignore[attr-defined]
    return run


def rss_high_water_mb() -> float:
    """This process's RSS high-water (VmHWM: its own, where ru_maxrss would count the parent's
    pages at the fork that made it)."""
    with open("/proc/self/status") as f:
        kb = next((int(x.split()[1]) for x in f if x.startswith("VmHWM:")), 0)
    return kb / 1024 if kb else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(spec: str) -> int:
    """``--child``: load one engine, generate once, print its tokens and RSS high-water (MB)."""
    s = json.loads(spec)
    tokens = []
    if s["engine"] != "none":  # none: the baseline, a child that loads nothing
        tokens = make_engine(s["engine"], s["path"], s["threads"])(s["prompt"], s["new"])[0]
    print("RESULT " + json.dumps({"tokens": tokens, "rss_mb": rss_high_water_mb()}))
    return 0


def peak_memory(engine: str, path: str, threads: int, prompt: list[int], new: int) -> float | str:
    spec = json.dumps({"engine": engine, "path": path, "threads": threads, "prompt": prompt, "new": new})
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", spec], capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return f"child failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return float(json.loads(line[7:])["rss_mb"])


def measure(entry: dict, forms: list[str], threads: int, rounds: int, gap: float, prompt: list[int], new: int,
            memory: bool) -> dict[str, dict]:
    """``{"engine [form]": {"prefill", "decode", "tokens", "mem"} or {"refused": reason}}``."""
    results: dict[str, dict] = {}
    for form in forms:
        path = entry.get(form)
        runs = {}
        for engine in ENGINES[form]:
            key = f"{engine} [{form}]"
            if not isinstance(path, str) or not os.path.exists(path):
                results[key] = {"refused": f"no model: {path}"}
                continue
            try:
                runs[key] = make_engine(engine, path, threads)
                results[key] = {"tokens": runs[key](prompt, new)[0], "mode": getattr(runs[key], "mode", "")}  # warm-up
            except Exception as e:  # noqa: BLE001 - report and go on
                runs.pop(key, None)
                results[key] = {"refused": err_text(e)}
        times: dict[str, list] = {k: [] for k in runs}
        for _ in range(rounds):
            for k, fn in runs.items():
                time.sleep(gap)
                times[k].append(fn(prompt, new))
        for k, ts in times.items():
            results[k].update(prefill=statistics.median(t[1] for t in ts),
                              decode=statistics.median(t[2] for t in ts if t[2] is not None) if new > 1 else None)
            if memory:
                results[k]["mem"] = peak_memory(k.split(" [")[0], str(path), threads, prompt, new)
        del runs
    return results


def _cell(v, fmt: str) -> str:
    return "-" if v is None else v if isinstance(v, str) else format(v, fmt)


def print_table(name: str, params: int, r: dict[str, dict], forms: list[str], new: int) -> None:
    print(f"  {name} ({params / 1e6:.0f}M parameters)")
    print(f"    {'engine':22s} {'prefill ms':>10s} {'ms/token':>9s} {'tokens/s':>9s} {'peak MB':>8s}  tokens = ort")
    for form in forms:
        ref = r.get(f"ort [{form}]", {}).get("tokens")
        for engine in ENGINES[form]:
            k = f"{engine} [{form}]"
            x = r.get(k, {})
            if "refused" in x:
                print(f"    {k:22s} refused: {x['refused']}")
                continue
            mem = x.get("mem")
            same = "-" if ref is None or engine == "ort" else "yes" if x["tokens"] == ref else \
                f"NO (first differs at {next(i for i, (a, b) in enumerate(zip(x['tokens'] + [-1], ref)) if a != b)})"
            print(f"    {k:22s} {_cell(x.get('prefill'), '10.1f')} {_cell(x.get('decode'), '9.2f')} "
                  f"{_cell(1e3 / x['decode'] if x.get('decode') else None, '9.1f')} "
                  f"{mem if isinstance(mem, str) else _cell(mem, '8.0f')}  {same}"
                  + (f"   (cache: {x['mode']})" if x.get("mode") else ""))
        ge, ort = r.get(f"ge [{form}]", {}), r.get(f"ort [{form}]", {})
        if "prefill" in ge and "prefill" in ort:
            dec = "" if not (ge.get("decode") and ort.get("decode")) else f", decode {ge['decode'] / ort['decode']:.2f}x"
            print(f"    [{form}] ge/ort: prefill {ge['prefill'] / ort['prefill']:.2f}x{dec}")
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default=None, help="comma list of thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    ap.add_argument("--models", default="", help=f"comma list of {','.join(ARCHS)} (default {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--forms", default=",".join(FORMS), help=f"comma list of {','.join(FORMS)}")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 128)")
    ap.add_argument("--new", type=int, default=None, help="greedy tokens generated (default 48)")
    ap.add_argument("--gap", type=float, default=0.5, help="idle seconds before each timed generation")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    ap.add_argument("--quick", action="store_true", help="tiny configs, 16+8 tokens, one round, one thread")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child)
    names = [m.strip() for m in a.models.split(",") if m.strip()] or (["llama"] if a.quick else DEFAULT_MODELS)
    forms = [f.strip() for f in a.forms.split(",") if f.strip()]
    for m in names:
        if m not in ARCHS:
            ap.error(f"unknown model {m!r}; known: {', '.join(ARCHS)}")
    for f in forms:
        if f not in FORMS:
            ap.error(f"unknown form {f!r}; known: {', '.join(FORMS)}")
    thread_counts = [int(t) for t in (a.threads or ("1" if a.quick else "1,2")).split(",") if t.strip()]
    rounds = a.rounds if a.rounds is not None else 1 if a.quick else 3
    plen, new = a.prompt or (16 if a.quick else 128), a.new or (8 if a.quick else 48)
    sys.path.insert(0, HERE)
    import precision  # the CPU's flags (imported here: a --child process stays small)

    cpu, flags = precision.cpu_flags()
    print(f"CPU: {cpu}, {os.cpu_count()} logical; " + " ".join(f"{f}{'+' if f in flags else '-'}" for f in CPU_FLAGS))
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    print(f"threads {','.join(map(str, thread_counts))}; rounds {rounds}; gap {a.gap} s; prompt {plen} tokens, "
          f"{new} greedy tokens; forms {','.join(forms)}")
    with tempfile.TemporaryDirectory(prefix="ge_llm_bench_") as folder:
        entries = {}
        for name in names:
            try:
                entries[name] = prepare(name, forms, folder, a.quick)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"prepare {name}: FAILED {err_text(e)}")
        for threads in thread_counts:
            print(f"\nthreads={threads}  (medians of {rounds} rounds; prefill: the prompt's run and its token)")
            for name, entry in entries.items():
                prompt = [int(t) for t in np.random.default_rng(0).integers(3, entry["vocab"], plen)]
                r = measure(entry, forms, threads, rounds, a.gap, prompt, new, not a.no_memory)
                print_table(name, entry["params"], r, forms, new)
                if not a.no_memory:
                    print(f"    (peak MB: a child's RSS high-water; one that loads no engine: "
                          f"{_cell(peak_memory('none', '', threads, prompt, new), '.0f')} MB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
