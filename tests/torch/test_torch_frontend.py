"""The torch frontend: nn.Module / ExportedProgram / .pt2 through ge.load, against eager PyTorch."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from torch.export import Dim
from torch_zoo import MODELS, WithMystery

import ge_core as ge
from ge_core.errors import InputError, OptionError, UnsupportedOpError
from ge_core.hookspecs import hookimpl
from ge_core.plugins import get_host

RTOL, ATOL = 1e-4, 1e-5


def _run(model, args):
    return model.run({n: a.numpy() for n, a in zip(model.input_names, args)})


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_eager_through_ge_load(zoo, name):
    model, args, ref = zoo(name)
    graph = ge.load(model, example_inputs=args)
    assert graph.metadata["framework"] == "torch"
    # weights are constants, not inputs
    assert len(graph.inputs) == len(args)
    assert graph.constants
    compiled = ge.compile(graph)
    (out,) = _run(compiled, args).values()
    np.testing.assert_allclose(out, ref.numpy(), rtol=RTOL, atol=ATOL)


def test_cond_maps_to_if_and_takes_both_branches(zoo):
    model, args, _ = zoo("cond")
    compiled = ge.compile(ge.load(model, example_inputs=args))
    assert compiled.report["op_counts"].get("If") == 1
    for x in (args[0], -args[0] - 1.0):
        with torch.no_grad():
            ref = model(x)
        np.testing.assert_allclose(compiled.run({"x": x.numpy()})["output"], ref.numpy(), rtol=RTOL, atol=ATOL)


def test_lstm_and_transformer_use_expected_ops(zoo):
    model, args, _ = zoo("transformer")
    ops = Counter(n.op_type for n in ge.load(model, example_inputs=args).nodes)
    assert ops["Softmax"] == 2 and ops["LayerNormalization"] == 4
    model, args, _ = zoo("lstm")
    ops = Counter(n.op_type for n in ge.load(model, example_inputs=args).nodes)
    assert ops["Tanh"] >= 18 and ops["Sigmoid"] >= 27  # unrolled by the export: 9 steps, 2 directions


def test_dynamic_dims_stay_symbolic(zoo):
    model, args, _ = zoo("transformer")
    batch, seq = Dim("batch"), Dim("seq", max=64)
    graph = ge.load(model, example_inputs=args,
                    dynamic_shapes={"tokens": {0: batch, 1: seq}, "pad_mask": {0: batch, 1: seq}})
    assert [v.type.shape for v in graph.inputs] == [("batch", "seq"), ("batch", "seq")]
    assert graph.outputs[0].type.shape == ("batch", "seq", 3)
    compiled = ge.compile(graph)
    assert compiled.dim_ranges == {"seq": (1, 64)}  # Dim("seq", max=64); batch is unbounded
    assert compiled.report["memory"]["dynamic_buffers"] == 0  # one symbolic plan holds every tensor
    with pytest.raises(InputError, match="outside the range"):
        compiled.run({"tokens": np.zeros((1, 65), np.int64), "pad_mask": np.zeros((1, 65), bool)})
    for b, s in ((1, 3), (4, 12)):
        tokens = torch.randint(0, 50, (b, s))
        mask = torch.zeros(b, s, dtype=torch.bool)
        mask[0, s // 2 + 1:] = True
        with torch.no_grad():
            ref = model(tokens, mask)
        out = compiled.run({"tokens": tokens.numpy(), "pad_mask": mask.numpy()})["output"]
        np.testing.assert_allclose(out, ref.numpy(), rtol=RTOL, atol=ATOL)


def test_exported_program_pt2_file_and_tuple_sources(zoo, tmp_path):
    model, args, ref = zoo("resnet18")
    ep = torch.export.export(model, args)
    path = os.fspath(tmp_path / "resnet.pt2")
    torch.export.save(ep, path)
    for source in (ep, path, (model, args)):
        compiled = ge.compile(ge.load(source))
        np.testing.assert_allclose(compiled.run({"x": args[0].numpy()})["output"], ref.numpy(), rtol=RTOL, atol=ATOL)
    # ge.compile reads a .pt2 path itself, and saves an .om like any model
    om = ge.compile(path)
    om.save(tmp_path / "resnet.om")
    again = ge.load_om(tmp_path / "resnet.om")
    np.testing.assert_allclose(again.run({"x": args[0].numpy()})["output"], ref.numpy(), rtol=RTOL, atol=ATOL)


def test_module_without_example_inputs_is_a_clear_error(zoo):
    model, _, _ = zoo("lstm")
    with pytest.raises(OptionError, match="example_inputs"):
        ge.load(model)


def test_unknown_op_named_with_module_path():
    model = WithMystery().eval()
    with pytest.raises(UnsupportedOpError) as err:
        ge.load(model, example_inputs=(torch.randn(2, 4),))
    msg = str(err.value)
    assert "ge_test.mystery.default" in msg
    assert "inner.1 (Mystery)" in msg


class _MysteryPlugin:
    """A third-party plugin extending the frontend with a mapper for the custom op."""

    @hookimpl
    def ge_register_op_mappers(self, register):
        def mystery(ctx, node):
            x = ctx.value(node.args[0])
            dt = ctx.out_dtype()
            return ctx.op("Add", [ctx.op("Mul", [x, ctx.const(3.0, dt)]), ctx.const(1.0, dt)])

        register("torch", "ge_test.mystery.default", mystery)


def test_plugin_op_mapper_extends_the_frontend():
    host = get_host()
    host.register_plugin(_MysteryPlugin(), name="mystery_mapper")
    try:
        model = WithMystery().eval()
        x = torch.randn(3, 4)
        compiled = ge.compile(ge.load(model, example_inputs=(x,)))
        with torch.no_grad():
            ref = model(x)
        np.testing.assert_allclose(compiled.run({"x": x.numpy()})["output"], ref.numpy(), rtol=RTOL, atol=ATOL)
    finally:
        host.unregister_plugin("mystery_mapper")


def test_plugin_import_does_not_import_torch():
    code = ("import sys; import ge_torch.plugin; from ge_core.plugins import registries; r = registries();"
            "assert ('torch', 'aten.convolution.default') in r.op_mappers; assert 'torch' in r.frontends;"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
