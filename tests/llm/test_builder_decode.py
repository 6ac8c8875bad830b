"""A builder-made decoder (onnxruntime-genai's ``-e cpu``, GroupQueryAttention with
``past_present_share_buffer``) generating through GE as onnxruntime-genai drives it: one buffer
per cache of the whole length, fed as ``past_key_values.N.*`` and bound as ``present.N.*``
(``model.run(feeds, outputs=...)``), prefill then greedy steps; the tokens and logits are
onnxruntime's (its IO binding, the same buffers bound both ways), no cache byte moves, and the
per-step costs found on the bench (issue 46) stay fixed: a run's end wakes no thread, a
declared shape with an unknown dim is checked on the fast path."""

from __future__ import annotations

import json
import threading
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ge_core as ge
from ge_core.ir.types import TensorType
from ge_cpu import blas, checked

from .models import builder_model

PROMPT, STEPS = [5, 17, 9, 33, 60, 42, 71, 12], 8


def _caches(path) -> tuple[list[str], int, int]:
    m = onnx.load(str(path), load_external_data=False)
    pasts = [v.name for v in m.graph.input if v.name.startswith("past_key_values.")]
    kv = next(v for v in m.graph.input if v.name == pasts[0]).type.tensor_type.shape.dim[1].dim_value
    config = json.loads((Path(path).parent / "genai_config.json").read_text())
    return pasts, kv, int(config["model"]["decoder"]["head_size"])


def _present(name: str) -> str:
    return name.replace("past_key_values", "present")


def _generate(path, engine: str):
    """(tokens, last-row logits per step, buffers, their addresses after each step)."""
    pasts, kv, d = _caches(path)
    cap = len(PROMPT) + STEPS
    bufs = {n: np.zeros((1, kv, cap, d), np.float32) for n in pasts}
    if engine == "ge":
        model = ge.compile(ge.load(str(path)), threads=1)
    else:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        io = sess.io_binding()
        values = {n: ort.OrtValue.ortvalue_from_numpy(b) for n, b in bufs.items()}
    tokens, past, out, logits, addrs = list(PROMPT), 0, [], [], []
    for _ in range(STEPS):
        total = past + len(tokens)
        feeds = {"input_ids": np.asarray([tokens], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        if engine == "ge":
            r = model.run({**feeds, **bufs}, outputs={_present(n): b for n, b in bufs.items()})
            for n, b in bufs.items():
                assert r[_present(n)] is b  # the caller's buffer itself: written in place
            row = r["logits"][0, -1]
        else:
            io.clear_binding_inputs()
            io.clear_binding_outputs()
            for n, a in feeds.items():
                io.bind_cpu_input(n, a)
            io.bind_output("logits")
            for n, v in values.items():
                io.bind_ortvalue_input(n, v)
                io.bind_ortvalue_output(_present(n), v)
            sess.run_with_iobinding(io)
            row = io.get_outputs()[0].numpy()[0, -1]
        tok = int(np.argmax(row))
        out.append(tok)
        logits.append(np.array(row))
        addrs.append({n: b.ctypes.data for n, b in bufs.items()})
        past, tokens = total, [tok]
    return out, logits, bufs, addrs


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_builder_decoder_with_the_cache_bound_in_place_equals_onnxruntime(tmp_path, precision):
    path = builder_model(tmp_path, "llama", precision)
    got, got_logits, got_bufs, addrs = _generate(path, "ge")
    want, want_logits, want_bufs, _ = _generate(path, "ort")
    assert got == want
    for g, w in zip(got_logits, want_logits):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    for n in got_bufs:  # the caches onnxruntime wrote, row for row
        np.testing.assert_allclose(got_bufs[n], want_bufs[n], rtol=1e-4, atol=1e-4)
    assert all(a == addrs[0] for a in addrs)  # no buffer moved between steps


def test_decode_steps_share_one_bucket_and_its_views(tmp_path):
    """Steps whose symbolic dims evaluate alike (only the mask's length grows; the caches are the
    shared buffers) run in one bucket and reuse its views: no layout is made after the first
    step at a cap, and the views' key stays the same."""
    path = builder_model(tmp_path, "llama", "fp32")
    pasts, kv, d = _caches(path)
    model = ge.compile(ge.load(str(path)), threads=1)
    shapes = model.executable.shapes
    cap = 40
    bufs = {n: np.zeros((1, kv, cap, d), np.float32) for n in pasts}
    bound = {_present(n): b for n, b in bufs.items()}
    model.run({"input_ids": np.arange(3, 11, dtype=np.int64)[None], "attention_mask": np.ones((1, 8), np.int64),
               **bufs}, outputs=bound)
    made, keys = None, set()
    for total in range(17, 33):  # (one cap: the mask's length rounds up to 32)
        model.run({"input_ids": np.array([[7]], np.int64), "attention_mask": np.ones((1, total), np.int64), **bufs},
                  outputs=bound)
        if total == 17:
            made = shapes.layouts_made
        last = next(reversed(shapes.buckets.values()))._last  # the bucket that ran, most recent last
        keys.add(last[0] if last is not None else None)
    assert shapes.layouts_made == made
    assert len(keys) == 1


def test_a_declared_unknown_dim_is_checked_on_the_fast_path(monkeypatch):
    """An output declared float32[?, 4]: a result of that dtype and rank with 4 columns passes
    without the slow path (which made a type string per output per run); a wrong known dim
    still names the node."""
    slow = []
    real = checked._conform
    monkeypatch.setattr(checked, "_conform", lambda *a: slow.append(1) or real(*a))
    node = types.SimpleNamespace(outputs=[types.SimpleNamespace(type=TensorType(np.dtype(np.float32), (None, 4)),
                                                                name="y")], describe=lambda: "node 'n'")
    k = checked.checked_kernel(lambda x: (x,), node, lambda: "node 'n'")
    for rows in (1, 3, 7):
        k(np.zeros((rows, 4), np.float32))
    assert slow == []
    with pytest.raises(ge.GEError, match="float32"):
        k(np.zeros((2, 5), np.float32))


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.notifies = 0

    def notify_all(self) -> None:
        self.notifies += 1
        super().notify_all()


def test_back_to_back_runs_wake_no_thread_at_their_end():
    """A decode loop's runs end one after another; waking the baseline restorer at each end cost
    a thread switch per step (milliseconds on a busy machine). Only the first end (the restorer
    waiting without a deadline) or runs queued for another count are woken."""
    b = blas.BlasThreads()
    cond = b._cond = _CountingCondition()
    base = b.baseline()
    want = 1 if not base or base[0] != 1 else 2
    for _ in range(20):
        with b.run(want):
            pass
    assert cond.notifies <= 2
    b.settle()
    assert b.baseline() == base


def test_a_second_generation_over_the_same_lengths_makes_no_layout(tmp_path):
    """Every generation walks through the same lengths; each was met once before, in the last
    generation, long ago. A binding gets an exact layout only when it comes back within a few
    runs: otherwise each step of every generation after the first planned, laid out and
    allocated anew (6x a tiny decoder's step)."""
    path = builder_model(tmp_path, "llama", "fp32")
    pasts, kv, d = _caches(path)
    model = ge.compile(ge.load(str(path)), threads=1)
    shapes = model.executable.shapes
    bufs = {n: np.zeros((1, kv, 48, d), np.float32) for n in pasts}
    bound = {_present(n): b for n, b in bufs.items()}

    def generation() -> None:
        model.run({"input_ids": np.arange(3, 11, dtype=np.int64)[None], "attention_mask": np.ones((1, 8), np.int64),
                   **bufs}, outputs=bound)
        for total in range(9, 41):
            model.run({"input_ids": np.array([[7]], np.int64), "attention_mask": np.ones((1, total), np.int64),
                       **bufs}, outputs=bound)

    generation()
    made = shapes.layouts_made
    generation()
    assert shapes.layouts_made == made
    for _ in range(3):  # a shape that comes back at once gets its own layout, as before
        model.run({"input_ids": np.array([[7]], np.int64), "attention_mask": np.ones((1, 20), np.int64), **bufs},
                  outputs=bound)
    assert dict(next(reversed(shapes._cache)))["total_sequence_length"] == 20  # the exact layouts, most recent last
