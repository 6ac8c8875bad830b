"""Small models the tool tests (and docs/tools.md's examples) build themselves: a ResNet-like CNN
and a BERT-like encoder from torch (random weights, TorchScript exporter, dynamic batch), and a
few MatMuls from onnx.helper. ``python -m tests.tools.models DIR`` writes them to DIR."""

from __future__ import annotations

import io
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def matmul_chain(path: str, width: int = 256, layers: int = 4, seed: int = 0) -> str:
    """``layers`` MatMul+Relu on a [batch, width] input (the batch symbolic): big enough that a
    run's time is not timer noise, small enough for a test."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        w = f"w{i}"
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), w))
        nodes.append(helper.make_node("MatMul", [x, w], [f"mm{i}"], name=f"matmul{i}"))
        nodes.append(helper.make_node("Relu", [f"mm{i}"], [f"relu{i}" if i < layers - 1 else "y"], name=f"relu{i}"))
        x = f"relu{i}"
    g = helper.make_graph(nodes, "matmul_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _export(module, example, path: str, input_names: list[str], dynamic: dict) -> str:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, buf, input_names=input_names, output_names=["out"], opset_version=17,
                          dynamo=False, dynamic_axes=dynamic)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return path


def resnet_like(path: str, width: int = 16, blocks: int = 2, image: int = 32) -> str:
    """A small ResNet: conv-bn-relu stem, ``blocks`` residual blocks, pool, linear (batch dynamic)."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(x + self.b2(self.c2(y)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
            self.blocks = nn.Sequential(*[Block(width) for _ in range(blocks)])
            self.fc = nn.Linear(width, 10)

        def forward(self, x):
            y = self.blocks(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))

    net = Net().eval()
    for m in net.modules():  # non-trivial batch-norm statistics, so folding them is visible
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return _export(net, (torch.randn(1, 3, image, image),), path, ["pixels"], {"pixels": {0: "batch"}, "out": {0: "batch"}})


def bert_like(path: str, hidden: int = 64, layers: int = 2, seq: int = 16, vocab: int = 1000) -> str:
    """A tiny BERT encoder (transformers' BertModel, random weights) on input_ids [batch, seq]."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 32),
                        intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=128,
                        attn_implementation="eager")
    bert = tf.BertModel(cfg).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    ids = torch.randint(0, vocab, (1, seq))
    return _export(LastHidden().eval(), (ids,), path, ["input_ids"], {"input_ids": {0: "batch"}, "out": {0: "batch"}})


if __name__ == "__main__":  # python -m tests.tools.models DIR
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(d, exist_ok=True)
    for fn in (matmul_chain, resnet_like, bert_like):
        print(fn(os.path.join(d, fn.__name__ + ".onnx")))
