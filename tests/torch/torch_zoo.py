"""Small torch.nn models shared by the torch tests and bench/torch_models.py (imports torch)."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + idt)


class ResNet18(nn.Module):
    """ResNet-18's layout (stem, 4 stages of 2 basic blocks, pool, fc) at a reduced width."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        chans = [w, 2 * w, 4 * w, 8 * w]
        layers, cin = [], w
        for i, c in enumerate(chans):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, c, stride), BasicBlock(c, c)]
            cin = c
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class Encoder(nn.Module):
    """An nn.TransformerEncoder over embedded tokens, with a key padding mask."""

    def __init__(self, vocab: int = 50, d: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 64, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 3)

    def forward(self, tokens, pad_mask):
        h = self.enc(self.emb(tokens), src_key_padding_mask=pad_mask)
        return self.head(h)


class LSTMTagger(nn.Module):
    def __init__(self, vocab: int = 50, emb: int = 16, hidden: int = 24, tags: int = 7) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, tags)

    def forward(self, tokens):
        h, _ = self.lstm(self.emb(tokens))
        return torch.log_softmax(self.fc(h), dim=-1)


class CondNet(nn.Module):
    """A data-dependent branch: torch.cond on the sign of the input's mean."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        def pos(x):
            return torch.relu(self.a(x))

        def neg(x):
            return torch.sigmoid(self.b(x)) * 2.0

        return torch.cond(x.mean() > 0, pos, neg, (x,))


def make(name: str, seed: int = 0):
    """``(model in eval mode, example inputs)`` for one of the test models."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if name == "resnet18":
        m = ResNet18()
        for mod in m.modules():  # non-trivial running statistics
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1, generator=g)
                mod.running_var.uniform_(0.5, 1.5, generator=g)
        return m.eval(), (torch.randn(2, 3, 64, 64, generator=g),)
    if name == "transformer":
        tokens = torch.randint(0, 50, (2, 10), generator=g)
        mask = torch.zeros(2, 10, dtype=torch.bool)
        mask[0, 7:] = True
        mask[1, 4:] = True
        return Encoder().eval(), (tokens, mask)
    if name == "lstm":
        return LSTMTagger().eval(), (torch.randint(0, 50, (3, 9), generator=g),)
    if name == "cond":
        return CondNet().eval(), (torch.randn(4, 8, generator=g) + 0.5,)
    raise KeyError(name)


MODELS = ("resnet18", "transformer", "lstm", "cond")


# A custom op no built-in mapper knows (the unknown-op and plugin-mapper tests).
@torch.library.custom_op("ge_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 3.0 + 1.0


@mystery.register_fake
def _mystery_fake(x):
    return torch.empty_like(x)


class Mystery(nn.Module):
    def forward(self, x):
        return mystery(x)


class WithMystery(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.ReLU(), Mystery())

    def forward(self, x):
        return self.inner(self.fc(x)) - 1.0
