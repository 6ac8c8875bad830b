"""torch.compile(backend="ge"): entry-point registration, results, signature cache, fallback, zero copy."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch_zoo import MODELS, WithMystery

RTOL, ATOL = 1e-4, 1e-5


def test_backend_found_through_torch_entry_point_without_import():
    eps = [ep for ep in md.entry_points(group="torch_dynamo_backends") if ep.name == "ge"]
    assert eps and eps[0].value == "ge_torch.dynamo:ge_backend"
    code = ("import sys, torch; from torch._dynamo import list_backends, lookup_backend;"
            "assert 'ge' in list_backends(), list_backends(); f = lookup_backend('ge');"
            "assert f.__module__ == 'ge_torch.dynamo', f")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", MODELS)
def test_compile_matches_eager(zoo, name):
    from ge_torch import dynamo

    model, args, ref = zoo(name)
    torch._dynamo.reset()
    seen = []
    real = dynamo.GeGraphCallable._compile

    def spy(self, a, key):
        entry = real(self, a, key)
        seen.append(entry)
        return entry

    with torch._dynamo.config.patch(allow_rnn=True), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to eager
        dynamo.GeGraphCallable._compile = spy
        try:
            compiled = torch.compile(model, backend="ge")
            out = compiled(*args)
            out2 = compiled(*args)
        finally:
            dynamo.GeGraphCallable._compile = real
    torch.testing.assert_close(out, ref, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out2, ref, rtol=RTOL, atol=ATOL)
    assert seen and all(e is not dynamo._FALLBACK for e in seen)
    # the model's body ran on GE, not eagerly around a graph break (LSTM: allow_rnn)
    nodes = sum(e.model.report["nodes_before"] for e in seen)
    assert nodes >= {"resnet18": 60, "transformer": 60, "lstm": 150, "cond": 3}[name]
    if name == "cond":
        assert any("If" in e.model.report["op_counts"] for e in seen)


def test_cache_by_input_signature():
    from ge_torch.dynamo import ge_backend

    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU()).eval()
    gm = torch.fx.symbolic_trace(model)
    fn = ge_backend(gm, [torch.randn(2, 6)])
    with torch.no_grad():
        for shape in ((2, 6), (2, 6), (7, 6), (2, 6)):
            x = torch.randn(*shape)
            got = fn(x)
            torch.testing.assert_close(got, model(x), rtol=RTOL, atol=ATOL)
        assert len(fn.cache) == 2
        x64 = torch.randn(2, 6, dtype=torch.float64)
        model64 = model.double()
        gm64 = torch.fx.symbolic_trace(model64)
        fn64 = ge_backend(gm64, [x64])
        assert fn64(x64).dtype == torch.float64


def test_weights_changed_in_place_are_seen():
    model = torch.nn.Linear(4, 3).eval()
    compiled = torch.compile(model, backend="ge")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
        model.weight.mul_(2.0)
        torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)


def test_unknown_op_falls_back_to_eager_with_a_warning():
    torch._dynamo.reset()
    model = WithMystery().eval()
    x = torch.randn(3, 4)
    compiled = torch.compile(model, backend="ge")
    with torch.no_grad(), pytest.warns(RuntimeWarning, match=r"ge_test\.mystery\.default.*inner\.1 \(Mystery\)"):
        out = compiled(x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))


def test_tensors_exchanged_without_copies():
    from ge_torch.dynamo import _to_numpy, _to_torch

    t = torch.randn(3, 4)
    a = _to_numpy(t)
    assert np.shares_memory(a, t.numpy())
    view = t.t()  # strided layout: still a view
    assert np.shares_memory(_to_numpy(view), t.numpy())
    arr = np.random.rand(2, 3).astype(np.float32)
    back = _to_torch(arr)
    assert back.data_ptr() == arr.__array_interface__["data"][0]
    ro = arr.copy()
    ro.setflags(write=False)  # read-only results (constants) are copied, never aliased writably
    assert _to_torch(ro).data_ptr() != ro.__array_interface__["data"][0]
