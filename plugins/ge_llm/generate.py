"""A generation loop over a compiled decoder: ``Generator(model).generate(prompt_ids, n)``, greedy or
sampled, streaming, with its timings; and the ``ge generate`` command.

The decoder is a model whose inputs follow one of the two formats people ship: onnxruntime-genai's
builder (``input_ids``, ``attention_mask``, ``past_key_values.N.key/value`` -> ``logits``,
``present.N.key/value``; no ``position_ids``: GroupQueryAttention reads the mask) or a plain export
(Optimum's names, or any ``past_*`` input whose ``present_*`` output exists; ``position_ids``
optional). Caches are BNSH: (batch, kv heads, sequence, head size); the loop feeds a 0-length past
to the prefill. Where ``model.run`` takes ``outputs=`` (caller-owned arrays it fills, as
onnxruntime's IOBinding) each present is written into one of two buffers per cache sized for the
whole generation, and the next step reads it there as its past: no cache bytes move outside the
model's own concat and nothing is allocated per step. Otherwise the loop feeds the returned
presents back (the copy path).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_core.errors import GraphError, InputError, ModelFileError

#: input names of the token ids, the mask and the positions, in the spellings exporters use
IDS_NAMES = ("input_ids", "input_ids:0", "ids")
MASK_NAMES = ("attention_mask",)
POSITION_NAMES = ("position_ids",)
#: how a past input's name becomes its present output's: Optimum's/the builder's, then ``past`` -> ``present``
_PRESENT_SPELLINGS = ((r"^past_key_values", "present"), (r"^past_key_values", "present_key_values"),
                      (r"^past", "present"))


@dataclass(frozen=True)
class CachePair:
    """One KV cache tensor: the ``past`` input, the ``present`` output it becomes, its kv heads and
    head size (BNSH: the sequence is axis 2) and dtype."""

    past: str
    present: str
    heads: int
    head_size: int
    dtype: np.dtype


@dataclass
class Timings:
    """One generation's timings: the prompt's length, seconds to the first token (the prefill and
    its pick) and each later token's seconds."""

    prompt_tokens: int = 0
    first_token_s: float = 0.0
    decode_s: list[float] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return (1 if self.first_token_s else 0) + len(self.decode_s)

    @property
    def decode_ms(self) -> float | None:
        """Median ms of a decode step (None before the second token)."""
        return statistics.median(self.decode_s) * 1e3 if self.decode_s else None

    @property
    def tokens_per_s(self) -> float | None:
        """Decode throughput: tokens after the first over their seconds."""
        total = sum(self.decode_s)
        return len(self.decode_s) / total if total > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "tokens": self.tokens,
                "first_token_ms": self.first_token_s * 1e3, "decode_ms": self.decode_ms,
                "tokens_per_s": self.tokens_per_s}


def _find(names: Sequence[str], wanted: Sequence[str]) -> str | None:
    return next((n for n in wanted if n in names), None)


def _genai_config(model: Any, section: str = "decoder") -> dict[str, Any]:
    """A section (``decoder`` of ``model``, or ``search``) of onnxruntime-genai's
    ``genai_config.json`` beside the model's source file, or {} (a builder model's cache head size
    is a symbol in the ONNX)."""
    src = getattr(model, "source", None)
    if not isinstance(src, (str, os.PathLike)):
        return {}
    path = os.path.join(os.path.dirname(os.fspath(src)), "genai_config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        return dict(config.get("search", {}) if section == "search" else config.get("model", {}).get(section, {}))
    except (OSError, ValueError, AttributeError):
        return {}


def _attention_dims(model: Any, past: str) -> dict[str, int]:
    """Kv heads and head size of a compiled model's cache input ``past`` read off the attention
    node that takes it (GroupQueryAttention's ``num_heads``/``kv_num_heads`` and its query's
    width: packed QKV where no key is given), or {}."""
    graph = getattr(model, "graph", None)
    value = next((v for v in getattr(graph, "inputs", ()) if v.name == past), None)
    for node in getattr(value, "users", ()):
        heads, kv = node.attrs.get("num_heads"), node.attrs.get("kv_num_heads")
        shape = node.inputs[0].type.shape if node.inputs and node.inputs[0] is not None else None
        if not (isinstance(heads, int) and isinstance(kv, int) and shape and isinstance(shape[-1], int)):
            continue
        packed = len(node.inputs) < 2 or node.inputs[1] is None
        return {"num_key_value_heads": kv, "head_size": shape[-1] // (heads + 2 * kv if packed else heads)}
    return {}


def find_cache(model: Any, *, kv_heads: int | None = None, head_size: int | None = None) -> list[CachePair]:
    """The KV cache pairs of ``model`` (inputs in model order), each with its kv heads and head
    size: from the inputs' shapes, else ``kv_heads``/``head_size``, else genai_config.json, else
    the attention node that reads the cache."""
    outputs = [a.name for a in model.outputs]
    config = _genai_config(model)
    pairs = []
    for arg in model.inputs:
        if not arg.name.startswith("past"):
            continue
        present = next((p for pat, rep in _PRESENT_SPELLINGS if (p := re.sub(pat, rep, arg.name)) in outputs), None)
        if present is None:
            raise GraphError(f"cache input {arg.name!r} has no present output (looked for "
                             f"{', '.join(re.sub(p, r, arg.name) for p, r in _PRESENT_SPELLINGS)})",
                             hint="name the outputs present.N.key/value or present_* as the past inputs")
        shape = arg.shape
        if shape is None or len(shape) != 4:
            raise GraphError(f"cache input {arg.name!r} has shape {shape}, not BNSH (batch, kv heads, "
                             "sequence, head size)", hint="export the cache in the (B, H, S, D) layout")
        dims = []
        found = {} if isinstance(shape[1], int) and isinstance(shape[3], int) else \
            {**_attention_dims(model, arg.name), **config}
        for axis, given, key in ((1, kv_heads, "num_key_value_heads"), (3, head_size, "head_size")):
            d = shape[axis] if isinstance(shape[axis], int) else given if given else found.get(key)
            if not isinstance(d, int) or d <= 0:
                what = "kv_heads" if axis == 1 else "head_size"
                raise GraphError(f"cache input {arg.name!r}: axis {axis} ({shape[axis]}) is symbolic",
                                 hint=f"pass Generator(..., {what}=N), or keep genai_config.json beside the model")
            dims.append(d)
        pairs.append(CachePair(arg.name, present, dims[0], dims[1], np.dtype(arg.dtype or np.float32)))
    if not pairs:
        raise GraphError("the model has no KV cache inputs (past_*)", hint="export the decoder with its cache: "
                         "past_key_values.N.key/value inputs and present.N.key/value outputs")
    return pairs


def takes_outputs(model: Any) -> bool:
    """Whether ``model.run`` fills caller-owned arrays (``run(feeds, outputs={name: array})``)."""
    try:
        return "outputs" in inspect.signature(model.run).parameters
    except (TypeError, ValueError):
        return False


def pick(logits: np.ndarray, rng: np.random.Generator | None, *, temperature: float = 1.0, top_k: int = 0,
         top_p: float = 1.0) -> int:
    """The next token from one row of logits: argmax where ``rng`` is None, else a draw from the
    softmax of ``logits / temperature`` kept to the ``top_k`` largest and the smallest set whose
    probability reaches ``top_p`` (float64, so a seed gives the same tokens on every machine)."""
    if rng is None:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])


def _check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not temperature > 0:
        raise InputError(f"temperature must be > 0, not {temperature}", hint="use greedy=True for argmax")
    if not isinstance(top_k, int) or top_k < 0:
        raise InputError(f"top_k must be an int >= 0, not {top_k!r}", hint="0 keeps every token")
    if not 0 < top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], not {top_p}", hint="1.0 keeps every token")


class Generator:
    """A generation loop over a compiled decoder (``ge_core.load_om(...)``, a
    :class:`ge_core.CompiledModel`, or anything with ``inputs``, ``outputs`` and ``run``).

    ``eos``: a token id (or ids) that ends a generation (it is returned); ``max_length``: the most
    tokens, prompt included. ``kv_heads``/``head_size`` where the cache inputs' shapes leave them
    symbolic (else genai_config.json beside the model, else the attention node reading the cache).
    ``io_binding``: None detects ``run(..., outputs=)``. ``share_buffer`` (with IO binding; None:
    where the cache feeds a GroupQueryAttention node or genai_config.json says
    ``past_present_share_buffer``): past and present are one buffer per cache sized for the whole
    generation, fed whole as the past and bound as the present (the attention finds the valid length
    from the mask and writes the new keys after it), as onnxruntime-genai runs its builder's models.
    After each generation ``timings`` holds its :class:`Timings`.
    """

    def __init__(self, model: Any, *, eos: int | Sequence[int] | None = None, max_length: int | None = None,
                 kv_heads: int | None = None, head_size: int | None = None, io_binding: bool | None = None,
                 share_buffer: bool | None = None) -> None:
        self.model = model
        names = [a.name for a in model.inputs]
        ids = _find(names, IDS_NAMES)
        if ids is None:
            raise GraphError(f"the model has no token ids input (one of {', '.join(IDS_NAMES)}); inputs: "
                             f"{', '.join(names)}", hint="export the decoder with an input_ids input")
        self.ids_name: str = ids
        self.mask_name = _find(names, MASK_NAMES)
        self.position_name = _find(names, POSITION_NAMES)
        self.cache = find_cache(model, kv_heads=kv_heads, head_size=head_size)
        known = {ids, self.mask_name, self.position_name, *(c.past for c in self.cache)}
        defaults = getattr(model, "input_defaults", {}) or {}
        other = [n for n in names if n not in known and n not in defaults]
        if other:
            raise GraphError(f"the decoder has inputs this loop does not feed: {', '.join(other)}",
                             hint="the loop feeds input_ids, attention_mask, position_ids and past_* caches")
        outs = [a for a in model.outputs if a.name not in {c.present for c in self.cache}]
        if not outs:
            raise GraphError("the decoder has no logits output", hint="export logits as its first output")
        self.logits_name = next((a.name for a in outs if a.name == "logits"), outs[0].name)
        dtypes = {a.name: a.dtype for a in model.inputs}
        self._int = {n: np.dtype(dtypes.get(n) or np.int64) for n in (ids, self.mask_name, self.position_name) if n}
        self.eos = frozenset([] if eos is None else [eos] if isinstance(eos, (int, np.integer)) else eos)
        if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
            raise InputError(f"max_length must be a positive int, not {max_length!r}")
        self.max_length = max_length
        self.io_binding = takes_outputs(model) if io_binding is None else bool(io_binding)
        if share_buffer is None:
            share_buffer = bool(_attention_dims(model, self.cache[0].past)) or bool(
                _genai_config(model, "search").get("past_present_share_buffer"))
        if share_buffer and self.mask_name is None:
            raise GraphError("a shared past/present buffer needs an attention_mask input (it gives the valid "
                             "length)", hint="pass share_buffer=False")
        self.share_buffer = bool(share_buffer) and self.io_binding
        self._capacity = 0
        self.timings = Timings()
        self._buffers: list[list[np.ndarray]] = []

    # ------------------------------------------------------------------------------------------
    def _feeds(self, tokens: Sequence[int], past_len: int) -> dict[str, np.ndarray]:
        total = past_len + len(tokens)
        f = {self.ids_name: np.asarray([tokens], dtype=self._int[self.ids_name])}
        if self.mask_name:
            f[self.mask_name] = np.ones((1, total), dtype=self._int[self.mask_name])
        if self.position_name:
            f[self.position_name] = np.arange(past_len, total, dtype=self._int[self.position_name])[None]
        return f

    def _reserve(self, capacity: int) -> None:
        """Flat buffers for ``capacity`` positions, kept while large enough: two per cache (the
        past read, the present written), one where past and present share it."""
        self._capacity = capacity
        have = self._buffers[0][0].size // (self.cache[0].heads * self.cache[0].head_size) if self._buffers else 0
        if have < capacity or len(self._buffers[0]) != (1 if self.share_buffer else 2):
            self._buffers = [[np.zeros(c.heads * capacity * c.head_size, c.dtype)
                              for _ in range(1 if self.share_buffer else 2)] for c in self.cache]

    def _view(self, i: int, which: int, length: int) -> np.ndarray:
        c = self.cache[i]
        return self._buffers[i][which][:c.heads * length * c.head_size].reshape(1, c.heads, length, c.head_size)

    def _step(self, tokens: Sequence[int], past: list[np.ndarray], past_len: int, parity: int) -> tuple[np.ndarray, list]:
        """One run: ``(last row of logits, the presents)``; bound presents land in buffer ``parity``."""
        feeds = self._feeds(tokens, past_len)
        if self.share_buffer:  # the whole buffer is the past and the present
            past = [self._view(i, 0, self._capacity) for i in range(len(self.cache))]
        feeds.update({c.past: p for c, p in zip(self.cache, past)})
        if self.io_binding:
            total = self._capacity if self.share_buffer else past_len + len(tokens)
            bound = {c.present: past[i] if self.share_buffer else self._view(i, parity, total)
                     for i, c in enumerate(self.cache)}
            try:
                out = self.model.run(feeds, outputs=bound)
            except TypeError:  # a run that does not take outputs= after all: the copy path, from the prefill
                if past_len:
                    raise
                self.io_binding = self.share_buffer = False
                empty = [np.zeros((1, c.heads, 0, c.head_size), c.dtype) for c in self.cache]
                return self._step(tokens, empty, 0, parity)
            return np.asarray(out[self.logits_name])[0, -1], list(bound.values())
        out = self.model.run(feeds)
        return np.asarray(out[self.logits_name])[0, -1], [out[c.present] for c in self.cache]

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int, *, greedy: bool = True,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> Iterator[int]:
        """Yield up to ``max_new_tokens`` tokens after ``prompt_ids`` (fewer at ``eos`` or
        ``max_length``); greedy, or sampled (``temperature``, ``top_k``, ``top_p``, ``seed``)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt or any(t < 0 for t in prompt):
            raise InputError(f"the prompt must be a non-empty list of token ids >= 0, not {list(prompt_ids)[:8]}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be an int >= 0, not {max_new_tokens!r}")
        if not greedy:
            _check_sampling(temperature, top_k, top_p)
        rng = None if greedy else np.random.default_rng(seed)
        limit = len(prompt) + max_new_tokens
        if self.max_length is not None:
            limit = min(limit, self.max_length)
        self.timings = t = Timings(prompt_tokens=len(prompt))
        if limit <= len(prompt):
            return
        if self.io_binding:
            self._reserve(limit)
        past = [np.zeros((1, c.heads, 0, c.head_size), c.dtype) for c in self.cache]
        tokens, past_len, parity = prompt, 0, 0
        for n in range(limit - len(prompt)):
            t0 = time.perf_counter()
            logits, past = self._step(tokens, past, past_len, parity)
            token = pick(logits, rng, temperature=temperature, top_k=top_k, top_p=top_p)
            dt = time.perf_counter() - t0
            if n == 0:
                t.first_token_s = dt
            else:
                t.decode_s.append(dt)
            yield token
            if token in self.eos:
                return
            past_len, tokens, parity = past_len + len(tokens), [token], 1 - parity

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *, greedy: bool = True,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> list[int]:
        """The generated tokens (the prompt not included); see :meth:`stream` for the options."""
        return list(self.stream(prompt_ids, max_new_tokens, greedy=greedy, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed))

    def bench(self, prompt_ids: Sequence[int], max_new_tokens: int, rounds: int = 3) -> dict[str, Any]:
        """Greedy generations after one warm-up: the medians over ``rounds`` of the prefill (time
        to the first token) and of each round's median decode step, and the tokens/s they give."""
        self.generate(prompt_ids, max_new_tokens)
        firsts, steps = [], []
        tokens: list[int] = []
        for _ in range(max(1, rounds)):
            tokens = self.generate(prompt_ids, max_new_tokens)
            firsts.append(self.timings.first_token_s * 1e3)
            if self.timings.decode_ms is not None:
                steps.append(self.timings.decode_ms)
        decode = statistics.median(steps) if steps else None
        return {"tokens": tokens, "prefill_ms": statistics.median(firsts), "decode_ms": decode,
                "tokens_per_s": 1e3 / decode if decode else None, "rounds": max(1, rounds),
                "prompt_tokens": len(prompt_ids), "io_binding": self.io_binding}


# ----------------------------------------------------------------------------------------------
# ge generate
def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a compiled decoder (.om), or a source model compiled first")
    p.add_argument("--prompt-ids", required=True, help="the prompt as comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding (the default without --temperature, "
                                                         "--top-k, --top-p or --seed)")
    p.add_argument("--temperature", type=float, default=None, help="sample at this temperature")
    p.add_argument("--top-k", type=int, default=None, help="sample among the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample among the tokens of probability mass P")
    p.add_argument("--seed", type=int, default=None, help="the sampler's seed (the same tokens for the same seed)")
    p.add_argument("--eos", default=None, help="comma-separated token ids that end the generation")
    p.add_argument("--threads", type=int, default=None, help="threads a run uses")
    p.add_argument("--bench", action="store_true", help="time the prefill and the decode step: medians over "
                                                        "--rounds greedy generations after a warm-up")
    p.add_argument("--rounds", type=int, default=3, help="generations --bench times (default 3)")


def _ids(text: str, what: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(f"{what} must be comma-separated integers, not {text!r}", hint="e.g. 1,2,3") from None


def load_decoder(path: str, threads: int | None = None) -> Any:
    """A compiled decoder from an .om (``ge_core.load_om``) or a source model (compiled)."""
    import ge_core

    if not os.path.exists(path):
        raise ModelFileError(f"no such model file: {path}", hint="give a .om or an .onnx decoder")
    if path.endswith(".om"):
        return ge_core.load_om(path, threads=threads)
    model = ge_core.compile(path, {"threads": threads} if threads else None)
    model.source = model.source or path
    return model


def run(args: argparse.Namespace) -> int:
    prompt = _ids(args.prompt_ids, "--prompt-ids")
    sampled = any(v is not None for v in (args.temperature, args.top_k, args.top_p, args.seed))
    if sampled and args.greedy:
        raise InputError("--greedy excludes --temperature, --top-k, --top-p and --seed", hint="give one or the other")
    gen = Generator(load_decoder(args.model, args.threads), eos=_ids(args.eos, "--eos") if args.eos else None)
    if args.bench:
        r = gen.bench(prompt, args.max_new_tokens, rounds=args.rounds)
        print("tokens:", ",".join(map(str, r["tokens"])))
        decode = "-" if r["decode_ms"] is None else f"{r['decode_ms']:.2f}"
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}"
        print(f"prefill ({r['prompt_tokens']} tokens): {r['prefill_ms']:.2f} ms   decode: {decode} ms/token   "
              f"{tps} tokens/s   (medians of {r['rounds']} rounds after a warm-up; io binding "
              f"{'on' if r['io_binding'] else 'off'})")
        return 0
    options = {} if not sampled else {"greedy": False, "temperature": args.temperature or 1.0,
                                      "top_k": args.top_k or 0, "top_p": args.top_p or 1.0, "seed": args.seed}
    tokens = gen.generate(prompt, args.max_new_tokens, **options)
    t = gen.timings
    print("tokens:", ",".join(map(str, tokens)))
    decode = "-" if t.decode_ms is None else f"{t.decode_ms:.2f}"
    tps = "-" if t.tokens_per_s is None else f"{t.tokens_per_s:.1f}"
    print(f"time to first token: {t.first_token_s * 1e3:.2f} ms   decode: {decode} ms/token   {tps} tokens/s")
    return 0
