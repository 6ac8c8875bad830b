"""A transformer encoder block from primitive ONNX ops fuses into attention, layer-norm and
GELU ops, and matches onnxruntime."""

import math

import numpy as np

import ge_core as ge
from ge_sdk.testing import GraphBuilder, run_onnxruntime

B, S, H, HEADS = 2, 8, 32, 2
D = H // HEADS


def layer_norm(b, x):
    mean = b.ReduceMean(x, axes=[-1])
    d = b.Sub(x, mean)
    var = b.ReduceMean(b.Pow(d, np.float32(2.0)), axes=[-1])
    norm = b.Div(d, b.Sqrt(b.Add(var, np.float32(1e-5))))
    return b.Add(b.Mul(norm, b.random_const((H,))), b.random_const((H,)))


def gelu(b, x):
    e = b.Erf(b.Div(x, np.float32(math.sqrt(2))))
    return b.Mul(b.Mul(x, b.Add(e, np.float32(1.0))), np.float32(0.5))


def encoder_block() -> ge.Graph:
    b = GraphBuilder("encoder", opset=17)
    x = b.input("x", "float32", (B, S, H))
    mask = b.input("mask", "float32", (B, 1, 1, S))

    def proj(v, n_out=H):
        return b.Add(b.MatMul(v, b.random_const((v.type.shape[-1] if v.type.shape else H, n_out))),
                     b.random_const((n_out,)))

    def heads(v, perm):
        return b.Transpose(b.Reshape(v, np.array([B, S, HEADS, D], np.int64)), perm=perm)

    q = heads(proj(x), [0, 2, 1, 3])
    kt = heads(proj(x), [0, 2, 3, 1])
    v = heads(proj(x), [0, 2, 1, 3])
    scores = b.Add(b.Div(b.MatMul(q, kt), np.float32(math.sqrt(D))), mask)
    ctx = b.MatMul(b.Softmax(scores, axis=-1), v)
    ctx = b.Reshape(b.Transpose(ctx, perm=[0, 2, 1, 3]), np.array([B, S, H], np.int64))
    h = layer_norm(b, b.Add(proj(ctx), x))
    ff = b.Add(b.MatMul(gelu(b, b.Add(b.MatMul(h, b.random_const((H, 4 * H))), b.random_const((4 * H,)))),
                        b.random_const((4 * H, H))), b.random_const((H,)))
    b.output(layer_norm(b, b.Add(ff, h)))
    return b.build()


def test_encoder_block_fuses_and_matches_onnxruntime():
    g = encoder_block()
    rng = np.random.default_rng(0)
    mask = np.where(rng.random((B, 1, 1, S)) < 0.25, -1e4, 0).astype(np.float32)
    feeds = {"x": rng.standard_normal((B, S, H)).astype(np.float32), "mask": mask}
    want = run_onnxruntime(g, feeds)
    model = ge.compile(g)
    ops = model.report["op_counts"]
    assert ops.get("ge.fused::Attention") == 1, ops
    assert ops.get("ge.fused::LayerNorm") == 2, ops
    for prim in ("Erf", "Softmax", "ReduceMean", "Pow", "Sqrt"):
        assert prim not in ops, ops
    gelus = [n for n in model.graph.nodes if n.op_type == "Gelu" or '"Gelu"' in str(n.attrs.get("epilogue", ""))]
    assert len(gelus) == 1
    got = model.run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-4)
