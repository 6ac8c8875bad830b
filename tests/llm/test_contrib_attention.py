"""onnxruntime's attention ops (com.microsoft) on the cpu backend, against onnxruntime on the same
inputs: GroupQueryAttention (GQA ratios, odd head counts, head sizes, 0-length and full caches,
share-buffer and copy modes, padded batch rows, rotary plain and interleaved, packed QKV, local
window, softcap, smooth softmax), MultiHeadAttention and Attention with masks and a past; the
native kernel against its NumPy form at 1 and 2 threads; a builder-made decoder end to end."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ge_core as ge
from ge_core.kernel import KernelSpec, caps
from ge_cpu.contrib import attention as ca
from ge_native import gqa

MS = "com.microsoft"
RNG = np.random.default_rng(11)
F, I32 = TensorProto.FLOAT, TensorProto.INT32


def _rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _graph(op: str, ins: list, outs: list[str], **attrs) -> onnx.ModelProto:
    """One node ``op`` with graph inputs ``ins`` ((name, type, shape); an empty name: absent)."""
    node = helper.make_node(op, [n for n, _, _ in ins], outs, domain=MS, **attrs)
    gi = [helper.make_tensor_value_info(n, t, s) for n, t, s in ins if n]
    go = [helper.make_tensor_value_info(n, F, None) for n in outs if n]
    return helper.make_model(helper.make_graph([node], "t", gi, go),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


_compiled: dict[bytes, object] = {}


def _ge(model: onnx.ModelProto, feeds: dict, threads: int = 1) -> list[np.ndarray]:
    key = model.SerializeToString() + bytes([threads])
    if key not in _compiled:
        _compiled[key] = ge.compile(ge.load(model.SerializeToString()), threads=threads)
    got = _compiled[key].run(feeds)  # type: ignore[attr-defined]
    return [np.asarray(got[o.name]) for o in model.graph.output]


def _gqa_model(n: int, kv: int, packed: bool, rotary: bool, past: bool, **attrs) -> onnx.ModelProto:
    ins = [("query", F, ["B", "S", "Hq"]), ("" if packed else "key", F, ["B", "S", "Hk"]),
           ("" if packed else "value", F, ["B", "S", "Hk"]),
           ("past_key" if past else "", F, ["B", kv, "P", "D"]), ("past_value" if past else "", F, ["B", kv, "P", "D"]),
           ("seqlens_k", I32, ["B"]), ("total_sequence_length", I32, []),
           ("cos_cache" if rotary else "", F, ["M", "R"]), ("sin_cache" if rotary else "", F, ["M", "R"])]
    while not ins[-1][0]:
        ins.pop()
    return _graph("GroupQueryAttention", ins, ["output", "present_key", "present_value"], num_heads=n,
                  kv_num_heads=kv, do_rotary=int(rotary), **attrs)


def _gqa_feeds(n, kv, d, s, past_lens, cache, packed, rotary, b=None) -> dict:
    """Feeds of one step: ``s`` new rows after ``past_lens[i]`` rows of batch row i, a past buffer
    of ``cache`` rows (None: no past input)."""
    b = len(past_lens)
    f: dict = {}
    if packed:
        f["query"] = _rand(b, s, (n + 2 * kv) * d)
    else:
        f["query"], f["key"], f["value"] = _rand(b, s, n * d), _rand(b, s, kv * d), _rand(b, s, kv * d)
    if cache is not None:
        f["past_key"], f["past_value"] = _rand(b, kv, cache, d), _rand(b, kv, cache, d)
    total = np.array(past_lens) + s
    f["seqlens_k"] = (total - 1).astype(np.int32)
    f["total_sequence_length"] = np.array(max(int(total.max()), s), np.int32)
    if rotary:
        ang = np.arange(256)[:, None] * (1e-2 ** (np.arange(d // 2 - 8) / (d // 2)))[None, :]
        f["cos_cache"], f["sin_cache"] = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    return f


def _valid_rows(out: np.ndarray, feeds: dict, s: int) -> list[np.ndarray]:
    """The output rows that are not padding (onnxruntime leaves those undefined)."""
    total = feeds["seqlens_k"] + 1
    first = s == int(feeds["total_sequence_length"])
    return [out[i, :total[i]] if first else out[i] for i in range(out.shape[0])]


def _close(a, b, tol=2e-5) -> None:
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


_ORDER = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
          "sin_cache")


def _kernel(factory, op: str, n_in: int, n_out: int, **attrs):
    spec = KernelSpec(name="attn", op_type=op, domain=MS, attrs=attrs, inputs=[None] * n_in,
                      outputs=[None] * n_out)  # type: ignore[list-item]
    return factory(spec)


def _run_gqa(feeds: dict, n: int, kv: int, out=None, **attrs) -> tuple:
    k = _kernel(ca.gqa_factory, "GroupQueryAttention", 9, 3, num_heads=n, kv_num_heads=kv,
                do_rotary=int("cos_cache" in feeds), **attrs)
    return k(*(feeds.get(name) for name in _ORDER), out=out)


def _check_gqa(n, kv, d, s, past_lens, cache, packed=False, rotary=False, **attrs) -> None:
    feeds = _gqa_feeds(n, kv, d, s, past_lens, cache, packed, rotary)
    want = _ort(_gqa_model(n, kv, packed, rotary, cache is not None, **attrs), feeds)
    got = _run_gqa(feeds, n, kv, **attrs)
    for g, w in zip(_valid_rows(got[0], feeds, s), _valid_rows(want[0], feeds, s)):
        _close(g, w)
    total = feeds["seqlens_k"] + 1
    for i in (1, 2):  # the present rows each batch row holds (padding rows' keys are rotated at position 1)
        assert got[i].shape == want[i].shape
        for b in range(len(past_lens)):
            _close(got[i][b, :, :total[b]], want[i][b, :, :total[b]])


@pytest.mark.parametrize("n,kv", [(4, 4), (6, 3), (8, 2), (8, 1), (3, 1), (5, 5)])
@pytest.mark.parametrize("d", [32, 64, 80])
def test_gqa_decode_matches_onnxruntime(n, kv, d):
    """One new token after pasts of different lengths per batch row (copy mode), rotary on."""
    _check_gqa(n, kv, d, 1, [9, 4], 9, rotary=True)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rotary,interleaved", [(False, 0), (True, 0), (True, 1)])
def test_gqa_prefill_forms_match_onnxruntime(packed, rotary, interleaved):
    """The first prompt (0-length past, and no past input), packed or not, rotary plain or
    interleaved; batch rows with right padding."""
    _check_gqa(8, 2, 64, 7, [0, 0], 0, packed, rotary, rotary_interleaved=interleaved)
    _check_gqa(4, 2, 32, 5, [0], None, packed, rotary, rotary_interleaved=interleaved)
    feeds = _gqa_feeds(4, 2, 32, 6, [0, 0], 0, packed, rotary)
    feeds["seqlens_k"] = np.array([5, 2], np.int32)  # row 1: 3 tokens and 3 of padding
    want = _ort(_gqa_model(4, 2, packed, rotary, True, rotary_interleaved=interleaved), feeds)
    got = _run_gqa(feeds, 4, 2, rotary_interleaved=interleaved)
    for g, w in zip(_valid_rows(got[0], feeds, 6), _valid_rows(want[0], feeds, 6)):
        _close(g, w)


@pytest.mark.parametrize("attrs", [dict(local_window_size=3), dict(softcap=2.5), dict(smooth_softmax=1),
                                   dict(scale=0.3), dict(local_window_size=5, softcap=1.5)])
def test_gqa_window_softcap_smooth_scale_match_onnxruntime(attrs):
    _check_gqa(8, 4, 32, 1, [12, 6], 12, **attrs)
    _check_gqa(8, 4, 32, 9, [0], 0, rotary=True, **attrs)


def test_gqa_full_cache_and_subsequent_prompt_match_onnxruntime():
    """A past that fills its buffer, and a second prompt after a past (batch 1)."""
    _check_gqa(8, 2, 64, 1, [31, 31], 31, rotary=True)
    _check_gqa(8, 2, 64, 4, [10], 10, rotary=True)


def _ort_share(model: onnx.ModelProto, feeds: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime with past_key/past_value bound as present_key/present_value (IO binding):
    its past_present_share_buffer mode."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    keep_k, keep_v = feeds["past_key"].copy(), feeds["past_value"].copy()  # (the OrtValues use their memory)
    pk, pv = ort.OrtValue.ortvalue_from_numpy(keep_k), ort.OrtValue.ortvalue_from_numpy(keep_v)
    for name, a in feeds.items():
        if name == "past_key":
            io.bind_ortvalue_input(name, pk)
        elif name == "past_value":
            io.bind_ortvalue_input(name, pv)
        else:
            io.bind_cpu_input(name, a)
    io.bind_output("output")
    io.bind_ortvalue_output("present_key", pk)
    io.bind_ortvalue_output("present_value", pv)
    sess.run_with_iobinding(io)
    out = io.copy_outputs_to_cpu()[0]
    return out, keep_k, keep_v


@pytest.mark.parametrize("rotary", [False, True])
def test_gqa_share_buffer_writes_only_the_new_rows(rotary):
    """past_present_share_buffer: the past buffer (of the largest length) bound as the present
    output: the kernel writes the new rows at each row's length in place, the buffer's address
    is stable, the rest of it untouched; the same as onnxruntime's share-buffer mode, step
    after step."""
    n, kv, d, cache = 8, 2, 64, 24
    model = _gqa_model(n, kv, False, rotary, True)
    lens = [3, 7]
    buf_k, buf_v = _rand(2, kv, cache, d), _rand(2, kv, cache, d)
    ort_k, ort_v = buf_k.copy(), buf_v.copy()
    addr = buf_k.ctypes.data
    for _ in range(3):
        feeds = _gqa_feeds(n, kv, d, 1, lens, None, False, rotary)
        feeds["total_sequence_length"] = np.array(cache, np.int32)
        before = buf_k.copy()
        got = _run_gqa({**feeds, "past_key": buf_k, "past_value": buf_v}, n, kv,
                       out=(np.empty((2, 1, n * d), np.float32), buf_k, buf_v))
        assert got[1] is buf_k and got[2] is buf_v and buf_k.ctypes.data == addr
        want_o, ort_k, ort_v = _ort_share(model, {**feeds, "past_key": ort_k, "past_value": ort_v})
        _close(got[0], want_o)
        _close(buf_k, ort_k)
        _close(buf_v, ort_v)
        for b, length in enumerate(lens):  # only row `length` of each batch row changed
            changed = np.nonzero((buf_k[b] != before[b]).any(axis=(0, 2)))[0]
            assert changed.tolist() == [length]
        lens = [x + 1 for x in lens]


def test_gqa_copy_mode_leaves_the_past_alone():
    """Different past and present buffers: the past is copied, never written."""
    feeds = _gqa_feeds(4, 2, 32, 1, [5, 2], 5, False, True)
    keep = feeds["past_key"].copy()
    got = _run_gqa(feeds, 4, 2)
    assert np.array_equal(feeds["past_key"], keep) and not np.shares_memory(got[1], feeds["past_key"])


def test_gqa_kernel_declares_out_and_same_bits_at_1_and_2_threads():
    k = _kernel(ca.gqa_factory, "GroupQueryAttention", 9, 3, num_heads=16, kv_num_heads=4)
    assert caps(k).accepts_out
    q, kk, v = _rand(2, 16, 70, 64), _rand(2, 4, 70, 64), _rand(2, 4, 70, 64)
    past, pk, pv = np.array([10, 0], np.int64), _rand(2, 4, 10, 64), _rand(2, 4, 10, 64)
    res = []
    for width in (1, 2):
        ck, cv, o = np.zeros((2, 4, 80, 64), np.float32), np.zeros((2, 4, 80, 64), np.float32), \
            np.zeros((2, 16, 70, 64), np.float32)
        assert gqa.attend(q, kk, v, pk, pv, ck, cv, o, past, past + 70, 0.125, width=width) or not gqa.available()
        res.append(o)
    assert np.array_equal(res[0], res[1])


def test_native_kernel_matches_its_numpy_form():
    """The C (when it built) against :func:`ge_native.gqa.reference`: every option at once."""
    b, n, kv, s, d, cache = 2, 6, 2, 5, 48, 20
    q, k, v = _rand(b, s, n, d).transpose(0, 2, 1, 3), _rand(b, kv, s, d), _rand(b, kv, s, d)
    pk, pv = _rand(b, kv, 12, d), _rand(b, kv, 12, d)
    cos, sin = _rand(64, d // 2 - 4), _rand(64, d // 2 - 4)
    bias = np.broadcast_to(_rand(b, 1, s, cache), (b, n, s, cache))
    outs = []
    for f in (gqa.attend, gqa.reference):
        ck, cv, o = np.full((b, kv, cache, d), 3, np.float32), np.full((b, kv, cache, d), 3, np.float32), \
            np.zeros((b, n, s, d), np.float32)
        ok = f(q, k, v, pk, pv, ck, cv, o, np.array([12, 7]), np.array([17, 12]), 0.2, cos, sin, True, 3.0, 6,
               True, True, bias)
        assert ok or (f is gqa.attend and not gqa.available())
        outs.append((o, ck, cv) if ok else None)
    if outs[0] is not None:
        for x, y in zip(*outs):
            _close(x, y, 3e-5)


def test_numpy_form_matches_onnxruntime(monkeypatch):
    """Where the native path is off (no compiler, GE_NATIVE_GQA=0) the kernels run
    :func:`ge_native.gqa.reference`: the same results."""
    monkeypatch.setattr(gqa, "attend", lambda *a, **k: False)
    _check_gqa(8, 2, 32, 1, [6, 3], 6, rotary=True, local_window_size=4)
    _check_gqa(6, 3, 32, 5, [0], 0, packed=True, rotary=True, rotary_interleaved=1, softcap=2.0)
    b, s, h = 2, 4, 64
    _check_mha({"query": _rand(b, s, h), "key": _rand(b, s, h), "value": _rand(b, s, h),
                "key_padding_mask": np.array([[1] * 4, [1] * 2 + [0] * 2], np.int32)}, 4, 1)


def test_gqa_refuses_lengths_outside_the_cache(monkeypatch):
    feeds = _gqa_feeds(4, 2, 32, 1, [5, 2], 5, False, False)
    feeds["seqlens_k"] = np.array([40, 2], np.int32)
    with pytest.raises(ge.GEError, match="seqlens_k"):
        _run_gqa(feeds, 4, 2)
    monkeypatch.setattr(gqa, "attend", lambda *a, **k: False)  # the NumPy path checks them too
    with pytest.raises(ge.GEError, match="seqlens_k"):
        _run_gqa(feeds, 4, 2)


def test_gqa_through_the_compiler_matches_onnxruntime():
    """The loaded model (type inference, kernel choice) over two steps of one compiled model."""
    model = _gqa_model(8, 2, False, True, True)
    for s, lens, cache in ((6, [0, 0], 0), (1, [6, 6], 6)):
        feeds = _gqa_feeds(8, 2, 64, s, lens, cache, False, True)
        for g, w in zip(_ge(model, feeds), _ort(model, feeds)):
            _close(g, w)


_MHA_ORDER = ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value")


def _check_mha(feeds: dict, n: int, outs: int = 3, **attrs) -> None:
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    ins = [(name, I32 if name == "key_padding_mask" else F, shapes.get(name)) if name in feeds else ("", F, None)
           for name in _MHA_ORDER]
    while not ins[-1][0]:
        ins.pop()
    model = _graph("MultiHeadAttention", ins, ["output", "present_key", "present_value"][:outs], num_heads=n, **attrs)
    want = _ort(model, feeds)
    k = _kernel(ca.mha_factory, "MultiHeadAttention", len(ins), outs, num_heads=n, **attrs)
    got = k(*(feeds.get(name) for name in _MHA_ORDER[:len(ins)]))
    for g, w in zip(got, want):
        _close(g, w)


@pytest.mark.parametrize("n,d", [(4, 32), (3, 80)])
def test_mha_matches_onnxruntime(n, d):
    b, s, L, h = 2, 5, 7, n * d
    _check_mha({"query": _rand(b, s, h), "key": _rand(b, L, h), "value": _rand(b, L, h)}, n, 1)
    _check_mha({"query": _rand(b, s, h), "key": _rand(b, L, h), "value": _rand(b, L, h), "bias": _rand(3 * h),
                "key_padding_mask": np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)}, n, 1, scale=0.2)
    _check_mha({"query": _rand(b, s, h), "key": _rand(b, s, h), "value": _rand(b, s, h), "past_key": _rand(b, n, 6, d),
                "past_value": _rand(b, n, 6, d), "attention_bias": _rand(1, n, s, s + 6)}, n)
    packed = _rand(b, s, n, 3, d)  # (onnxruntime's CPU has no packed QKV: against the unpacked form)
    k = _kernel(ca.mha_factory, "MultiHeadAttention", 3, 1, num_heads=n)
    _close(k(packed)[0], k(*(packed[:, :, :, i].reshape(b, s, h) for i in range(3)))[0])
    _check_mha({"query": _rand(b, s, h), "key": _rand(b, n, L, d), "value": _rand(b, n, L, d)}, n, 1)
    _check_mha({"query": _rand(b, 1, h), "key": _rand(b, 1, h), "value": _rand(b, 1, h), "past_key": _rand(b, n, 9, d),
                "past_value": _rand(b, n, 9, d)}, n, unidirectional=1)


def _check_attention(feeds: dict, n: int, outs: int = 1, **attrs) -> None:
    order = ("input", "weights", "bias", "mask_index", "past", "attention_bias")
    ins = [(name, I32 if name == "mask_index" else F, list(feeds[name].shape)) if name in feeds else ("", F, None)
           for name in order]
    while not ins[-1][0]:
        ins.pop()
    model = _graph("Attention", ins, ["output", "present"][:outs], num_heads=n, **attrs)
    want = _ort(model, feeds)
    k = _kernel(ca.attention_factory, "Attention", len(ins), outs, num_heads=n, **attrs)
    got = k(*(feeds.get(name) for name in order[:len(ins)]))
    for g, w in zip(got, want):
        _close(g, w, 5e-5)


@pytest.mark.parametrize("n,d", [(4, 16), (3, 32)])
def test_attention_masks_and_past_match_onnxruntime(n, d):
    b, s, hin, h = 2, 6, 24, n * d
    base = {"input": _rand(b, s, hin), "weights": _rand(hin, 3 * h) * 0.3, "bias": _rand(3 * h)}
    _check_attention(base, n)
    _check_attention({**base, "mask_index": np.array([6, 3], np.int32)}, n)
    _check_attention({**base, "mask_index": np.array([5, 6, 1, 0], np.int32)}, n)
    _check_attention({**base, "mask_index": (RNG.random((b, s)) > 0.3).astype(np.int32)}, n, unidirectional=1)
    _check_attention({**base, "mask_index": (RNG.random((b, s, s)) > 0.3).astype(np.int32)}, n)
    past = {**base, "past": _rand(2, b, n, 5, d), "mask_index": np.array([[1] * 11, [0] * 2 + [1] * 9], np.int32)}
    _check_attention(past, n, 2, unidirectional=1)
    _check_attention({**base, "attention_bias": _rand(b, n, s, s)}, n, scale=0.1)


def _decode(run, inputs: list, layers_kv: tuple[int, int, int], prompt: np.ndarray, steps: int) -> tuple[list, list]:
    """Greedy decoding with ``run(feeds) -> {name: array}`` on a builder-made decoder: the logits
    of the prefill and of each step, and the tokens."""
    layers, kv, d = layers_kv
    b = prompt.shape[0]
    feeds: dict = {"input_ids": prompt, "attention_mask": np.ones(prompt.shape, np.int64)}
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((b, kv, 0, d), np.float32)
    logits, tokens = [], []
    for _ in range(steps + 1):
        got = run({k: v for k, v in feeds.items() if k in inputs})
        last = got["logits"][:, -1]
        logits.append(last)
        tok = last.argmax(-1)[:, None].astype(np.int64)
        tokens.append(tok)
        feeds["input_ids"] = tok
        feeds["attention_mask"] = np.ones((b, feeds["attention_mask"].shape[1] + 1), np.int64)
        for i in range(layers):
            for kind in ("key", "value"):
                feeds[f"past_key_values.{i}.{kind}"] = got[f"present.{i}.{kind}"]
    return logits, tokens


def test_builder_llama_decoder_matches_onnxruntime(tmp_path):
    """onnxruntime-genai's builder output (a LLaMA-style decoder: GroupQueryAttention with rotary,
    SimplifiedLayerNormalization, ...): the prefill and 5 greedy steps, logits and tokens as
    onnxruntime's."""
    from . import models

    path = models.builder_model(tmp_path, "llama", "fp32")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    compiled = ge.compile(ge.load(str(path)), threads=1)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "GroupQueryAttention" in ops
    cfg = models.TINY["llama"]
    shape = (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"])
    prompt = RNG.integers(3, cfg["vocab_size"], (1, 9)).astype(np.int64)
    want = _decode(lambda f: dict(zip(outs, sess.run(None, f))), names, shape, prompt, 5)
    got = _decode(compiled.run, names, shape, prompt, 5)
    for g, w in zip(got[0], want[0]):
        _close(g, w, 1e-4)
    assert [t.tolist() for t in got[1]] == [t.tolist() for t in want[1]]


def test_gqa_out_over_another_input_is_computed_apart():
    """inplace_ok: an executor may give an output the memory of an input that dies at the node
    (the query's for the output, past_value's for present_key): the results are still right."""
    n, kv, d = 4, 2, 32
    feeds = _gqa_feeds(n, kv, d, 1, [5, 3], 5, False, True)
    want = _run_gqa({k: v.copy() for k, v in feeds.items()}, n, kv)
    k = _kernel(ca.gqa_factory, "GroupQueryAttention", 9, 3, num_heads=n, kv_num_heads=kv, do_rotary=1)
    assert caps(k).inplace_ok
    f = {k2: v.copy() for k2, v in feeds.items()}
    f["past_key"], f["past_value"] = np.zeros((2, kv, 6, d), np.float32), np.zeros((2, kv, 6, d), np.float32)
    f["past_key"][:, :, :5], f["past_value"][:, :, :5] = feeds["past_key"], feeds["past_value"]
    f["total_sequence_length"] = np.array(6, np.int32)
    got = k(*(f.get(name) for name in _ORDER), out=(f["query"], f["past_value"], np.empty((2, kv, 6, d), np.float32)))
    _close(got[0], want[0])
    for b, length in enumerate((6, 4)):
        _close(got[1][b, :, :length], want[1][b, :, :length])
        _close(got[2][b, :, :length], want[2][b, :, :length])


def test_gqa_io_binding_keeps_the_cache_in_place():
    """model.run(feeds, outputs=...) with past_key/past_value bound as present_key/present_value
    (one buffer of the largest length): the results are onnxruntime's share-buffer mode's, the
    returned presents are the caller's buffers, and only each row's new cache row changes (every
    output bound: the executor gives the kernel the buffers themselves)."""
    n, kv, d, cache = 8, 2, 64, 24
    model = _gqa_model(n, kv, False, True, True)
    compiled = ge.compile(ge.load(model.SerializeToString()), threads=1)
    buf_k, buf_v = _rand(2, kv, cache, d), _rand(2, kv, cache, d)
    ort_k, ort_v = buf_k.copy(), buf_v.copy()
    lens, out = [3, 7], np.empty((2, 1, n * d), np.float32)
    for _ in range(4):
        feeds = _gqa_feeds(n, kv, d, 1, lens, None, False, True)
        feeds["total_sequence_length"] = np.array(cache, np.int32)
        before = buf_k.copy()
        got = compiled.run({**feeds, "past_key": buf_k, "past_value": buf_v},
                           outputs={"present_key": buf_k, "present_value": buf_v, "output": out})
        assert np.shares_memory(got["present_key"], buf_k) and np.shares_memory(got["present_value"], buf_v)
        want_o, ort_k, ort_v = _ort_share(model, {**feeds, "past_key": ort_k, "past_value": ort_v})
        _close(got["output"], want_o)
        for b, length in enumerate(lens):
            _close(buf_k[b, :, :length + 1], ort_k[b, :, :length + 1])
            _close(buf_v[b, :, :length + 1], ort_v[b, :, :length + 1])
            assert np.nonzero((buf_k[b] != before[b]).any(axis=(0, 2)))[0].tolist() == [length]
        lens = [x + 1 for x in lens]
