"""Latency of the torch test models: eager PyTorch vs torch.compile (inductor) vs torch.compile(backend="ge").

The models are those of ``tests/torch/torch_zoo.py`` (a ResNet-18-style CNN, an
nn.TransformerEncoder with a padding mask, a bidirectional LSTM tagger, a torch.cond model).
Each engine compiles (and warms up) first; then the engines run interleaved round by round, so
that machine noise hits them alike, under ``torch.no_grad()``. Prints the median latency per
model and engine and the ratio to eager. Inductor needs a C++ compiler; where it fails on a
model the table says why instead of a figure.

    python bench/torch_models.py [--rounds 20] [--models resnet18,lstm] [--threads 1] [--no-inductor]

``--threads`` (default 1) caps torch's intra-op threads and NumPy's BLAS threads alike: torch's
OpenMP workers spin after each op, so interleaving engines with uncapped pools oversubscribes the
cores and makes every figure meaningless.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "torch"))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch_zoo import MODELS, make  # noqa: E402


def timed(fn, args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (default 1)")
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    torch._dynamo.config.allow_rnn = True  # let Dynamo trace nn.LSTM instead of breaking the graph
    warnings.filterwarnings("ignore")
    engines = ["eager"] + ([] if args.no_inductor else ["inductor"]) + ["ge"]
    console = Console()
    table = Table(title=f"torch models, median of {args.rounds} runs (ms); ratio to eager")
    table.add_column("model")
    for e in engines:
        table.add_column(e, justify="right")
    for name in [m for m in args.models.split(",") if m]:
        model, inputs = make(name)
        fns: dict[str, object] = {}
        notes: dict[str, str] = {}
        with torch.no_grad():
            ref = model(*inputs)
            for e in engines:
                torch._dynamo.reset()
                try:
                    fn = model if e == "eager" else torch.compile(model, backend=e)
                    t0 = time.perf_counter()
                    out = fn(*inputs)  # compile + first run
                    first = time.perf_counter() - t0
                    fn(*inputs)
                    if not torch.allclose(out, ref, rtol=1e-4, atol=1e-5):
                        notes[e] = "mismatch"
                    fns[e] = fn
                    console.log(f"{name}: {e} ready (first call {first:.2f} s)")
                except Exception as exc:  # inductor without a working compiler, ...
                    notes[e] = f"failed: {type(exc).__name__}"
                    console.log(f"{name}: {e} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            times: dict[str, list[float]] = {e: [] for e in fns}
            for _ in range(args.rounds):
                for e, fn in fns.items():
                    times[e].append(timed(fn, inputs))
        med = {e: statistics.median(t) * 1e3 for e, t in times.items()}
        row = [name]
        for e in engines:
            if e not in med:
                row.append(notes.get(e, "-"))
                continue
            cell = f"{med[e]:.2f}"
            if e != "eager" and "eager" in med:
                cell += f" ({med[e] / med['eager']:.2f}x)"
            if e in notes:
                cell += f" {notes[e]}"
            row.append(cell)
        table.add_row(*row)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
