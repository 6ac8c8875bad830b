"""PyTorch ``.pt2`` archives for the pt2 target: seeds written by ``torch.export.save``, zip
entries read and written, and the strings, programs and pickles its mutations draw from."""

from __future__ import annotations

import json
import os
import random
import struct
from typing import Any

from fuzz_common import _json_paths


class _PicklePayload:
    """Unpickling this calls ``fn(arg)`` (``os.system`` of a shell command, ``exec`` of Python)."""

    def __init__(self, fn: Any, arg: str) -> None:
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


_PT2_SEEDS: list[tuple[str, bytes]] = []


def pt2_seeds() -> list[tuple[str, bytes]]:
    """(name, archive bytes) of three small programs saved with ``torch.export.save``: conv+bn+relu,
    an MLP with a dynamic batch ``Dim``, and a model with a buffer, a parameter and a tensor
    constant. Built once per process (exporting takes seconds)."""
    if _PT2_SEEDS:
        return _PT2_SEEDS
    import tempfile

    import torch

    torch.manual_seed(0)

    class ConvBnRelu(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(6, 8)
            self.b = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    class Buffered(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("shift", torch.arange(5, dtype=torch.float32))
            self.w = torch.nn.Parameter(torch.ones(5))

        def forward(self, x):
            return x * self.w + self.shift + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])

    batch = torch.export.Dim("batch", min=1, max=1024)
    progs = [
        ("convbnrelu", torch.export.export(ConvBnRelu().eval(), (torch.randn(1, 3, 6, 6),))),
        ("mlp", torch.export.export(Mlp().eval(), (torch.randn(4, 6),), dynamic_shapes={"x": {0: batch}})),
        ("buffered", torch.export.export(Buffered().eval(), (torch.randn(3, 5),))),
    ]
    with tempfile.TemporaryDirectory() as t:
        for name, ep in progs:
            p = os.path.join(t, f"{name}.pt2")
            torch.export.save(ep, p)
            with open(p, "rb") as f:
                _PT2_SEEDS.append((name, f.read()))
    return _PT2_SEEDS


def zip_entries(data: bytes) -> tuple[str, dict[str, bytes]]:
    """The root folder and ``{name under the root: bytes}`` of a .pt2 archive."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = z.namelist()
        root = names[0].split("/", 1)[0] + "/"
        return root, {n[len(root):]: z.read(n) for n in names}


def zip_bytes(entries: list[tuple[str, bytes]], compression: int = 0) -> bytes:
    """A zip of ``(full name, bytes)`` entries (names may repeat)."""
    import io
    import warnings
    import zipfile

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name"
        with zipfile.ZipFile(buf, "w", compression) as z:
            for name, data in entries:
                z.writestr(name, data)
    return buf.getvalue()


def _patch_zip_sizes(data: bytes, rng: random.Random) -> bytes:
    """Overwrite the declared (uncompressed and/or compressed) size of some local and central
    directory records with hostile values; the data stays as it is."""
    buf = bytearray(data)
    spots = []
    for sig, usize, csize in ((b"PK\x03\x04", 22, 18), (b"PK\x01\x02", 24, 20)):
        at = buf.find(sig)
        while at >= 0:
            spots.append((at, usize, csize))
            at = buf.find(sig, at + 4)
    for at, usize, csize in rng.sample(spots, min(len(spots), rng.choice((2, 4, 8, 32)))):
        v = rng.choice([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32 - 2, 300 << 20, 1 << 28])
        for off in rng.choice(((usize,), (csize,), (usize, csize))):
            if at + off + 4 <= len(buf):
                struct.pack_into("<I", buf, at + off, v)
    return bytes(buf)


#: call targets a hostile program names (and a few real operators, to keep some programs valid)
_PT2_TARGETS = ["builtins.eval", "builtins.exec", "os.system", "torch.os.system", "subprocess.Popen",
                "torch._C._nn.linear", "torch.ops.aten.from_file.default", "torch.ops.aten.save.default",
                "torch.ops.aten._print.default", "torch.ops.aten.nosuch.default", "torch.ops.aten.linear",
                "torch.ops.aten.relu.default", "torch.ops.aten.tanh.default", "torch.ops.aten.add.Tensor",
                "torch.ops.aten.linear.default", "torch.ops.aten.sigmoid.default", "torch.ops.aten.tanh.out",
                "torch.ops.higher_order.cond", "torch.ops.higher_order.run_and_save_rng_state",
                "torch.ops.custom.op.default", "torch.ops.aten.__class__.default", "_operator.getitem",
                "_operator.attrgetter", "math.floor", "math.e", "torch.sym_int", "torch.load",
                "torch.ops.aten.linear.default.__call__", "", "torch..ops", "torch.ops.aten"]
#: shape expressions a hostile program tries
_PT2_EXPRS = ["Symbol('s77', positive=True, integer=True)", "s77", "s77 + 1", "2*s77", "Max(s77, 1)",
              "FloorDiv(s77, 0)", "Mod(s77, 0)", "s77 // 0", "1/0", "oo", "-oo", "s77**99999", "2**2**2**2",
              "9" * 30, "Float('1e999', precision=53)", "Symbol('x.__class__')", "Symbol('s1', evaluate=True)",
              "s77.__class__", "lambda: 0", "(s77,)", "[s77]", "s77 if s77 else 0", "Integer(10**20)",
              "Piecewise((s77, Eq(s77, 1)), (0, True))", "Symbol('s77', positive=False, integer=True)", "", " "]
_PT2_NAMES = ["x", "input", "a0", "K0", "math", "np", "torch", "self", "linear", "tanh", "relu", "getitem",
              "_", "x1", "p_a_weight", "out", "args", "kwargs", "None", "True", "lambda", "import", "class",
              "a.b", "a b", "a-b", "__class__", "__builtins__", "__import__", "x\n", "0x", "\u00e9", "a" * 5000]


def _replace_everywhere(x: Any, old: Any, new: Any) -> Any:
    if isinstance(x, dict):
        return {(new if k == old and isinstance(new, str) else k): _replace_everywhere(v, old, new) for k, v in x.items()}
    if isinstance(x, list):
        return [_replace_everywhere(v, old, new) for v in x]
    return new if x == old and type(x) is type(old) else x


def _json_text(x: Any) -> bytes:
    """``x`` as JSON; a nest too deep for :mod:`json` (made by :func:`_json_mutate`) as a deep text."""
    try:
        return json.dumps(x, allow_nan=True).encode("utf-8")
    except (ValueError, RecursionError):
        return b"[" * 100000 + b"]" * 100000


def _key_paths(d: Any, key: str) -> list[tuple]:
    return [p for p in _json_paths(d) if p and p[-1] == key]


def _at(d: Any, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d
