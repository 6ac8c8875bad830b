"""Fuzz target ``mutated_files``: the files of a loaded model change under it.

A loaded .om is a snapshot (docs/security.md, "When a loaded model's files change"): the file
and its external weight files are read once into private memory. Each case writes a clean copy
of a small model (weights inline, ``external_weight=1`` or ``=2``), loads it, then changes its
.om and weight files in place the ways people and tools do: truncation at a random offset
(``truncate``, a copy interrupted), random bytes overwritten (``rsync --inplace``, a disk
error), the file rewritten in place with another model's bytes (``cp`` over it), replaced by
rename, deleted, extended, swapped for a FIFO. Then:

* the model loaded before the change must still run and give exactly its first results (a
  change reaching it, or a SIGBUS from a truncated mapping, is a crash the engine reports);
* a reload must give a :class:`~ge_core.GEError` or a model whose results are those of one of
  the seed models (a changed file that loads must not give other results silently).
"""

from __future__ import annotations

import os
import random
import shutil
from typing import Any

from fuzz_engine import OracleViolation, Target


def _model_bytes(seed: int) -> bytes:
    """A small MLP (MatMul, Add, Relu, MatMul) whose weights span several pages."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((64, 256)).astype(np.float32)
    b1 = rng.standard_normal(256).astype(np.float32)
    w2 = rng.standard_normal((256, 8)).astype(np.float32)
    f32 = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", f32, [2, 64])], [helper.make_tensor_value_info("y", f32, [2, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _files(folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = f.read()
    return out


class MutatedFilesTarget(Target):
    """Change a loaded model's files in place, then run it and reload it."""

    name = "mutated_files"
    case_timeout = 20.0

    def warm_up(self) -> None:
        import ge_core as ge

        ge.compile(ge.load(_model_bytes(0), framework="onnx"))

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import numpy as np

        import ge_core as ge
        from ge_core.om import save_om

        self.x = np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)
        #: (mode, {relative path: bytes}) of each seed: seed models 0 and 1 in modes 0, 1, 2
        self.seeds: list[tuple[str, dict[str, bytes]]] = []
        self.refs: list[Any] = []
        for s in (0, 1):
            model = ge.compile(ge.load(_model_bytes(s), framework="onnx"))
            self.refs.append(model.run({"x": self.x})["y"])
            for mode in (0, 1, 2):
                folder = os.path.join(workdir, f"seed{s}_{mode}")
                os.makedirs(folder, exist_ok=True)
                save_om(model, os.path.join(folder, "m.om"), external_weight=mode)
                self.seeds.append((f"s{s}m{mode}", _files(folder)))
        self.others = [data for _, files in self.seeds for data in files.values()]
        self.case_dir = os.path.join(workdir, "case")

    # ------------------------------------------------------------------ mutations
    def _mutate(self, rng: random.Random, path: str) -> str:
        if not os.path.isfile(path) or os.path.islink(path):
            return "skip"  # a FIFO an earlier mutation left
        size = os.path.getsize(path)
        op = rng.choice(["truncate", "truncate", "overwrite", "overwrite", "cp_over", "replace", "delete",
                         "extend", "zero_fill", "fifo", "same_bytes"])
        if op == "same_bytes":  # rewritten in place with its own bytes (rsync --inplace of an equal file)
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(data)
            return op
        if op == "truncate":  # in place: the inode stays, its pages past the new end go away
            n = rng.choice([0, rng.randrange(size + 1), size // 2, max(size - 1, 0), 4096, 96])
            os.truncate(path, min(n, size))
            return f"truncate@{n}"
        if op in ("overwrite", "zero_fill") and size:
            with open(path, "r+b") as f:
                for _ in range(rng.choice([1, 1, 2, 8])):
                    at = rng.randrange(size)
                    n = rng.choice([1, 4, 64, 4096])
                    f.seek(at)
                    f.write(bytes(n) if op == "zero_fill" else rng.randbytes(n))
            return op
        if op == "cp_over":  # what `cp other m.om` does: open with O_TRUNC, write the new bytes in place
            data = rng.choice(self.others)
            with open(path, "wb") as f:
                f.write(data)
            return f"cp_over:{len(data)}"
        if op == "replace":  # a new inode renamed over it: the loaded model never saw this inode
            tmp = path + ".new"
            with open(tmp, "wb") as f:
                f.write(rng.choice(self.others))
            os.replace(tmp, path)
            return op
        if op == "delete":
            os.unlink(path)
            return op
        if op == "extend":
            with open(path, "ab") as f:
                f.write(bytes(rng.choice([1, 7, 4096])))
            return op
        if op == "fifo" and hasattr(os, "mkfifo"):
            os.unlink(path)
            os.mkfifo(path)
            return op
        os.truncate(path, 0)
        return "truncate@0"

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        import numpy as np

        import ge_core as ge

        which = rng.randrange(len(self.seeds))
        name, files = self.seeds[which]
        ref = self.refs[which // 3]
        shutil.rmtree(self.case_dir, ignore_errors=True)
        for rel, data in files.items():
            p = os.path.join(self.case_dir, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
        om = os.path.join(self.case_dir, "m.om")
        model = ge.load_om(om)  # a clean copy: must load
        first = model.run({"x": self.x})["y"]
        if not np.array_equal(first, ref):
            raise OracleViolation(f"seed {name} gives other results than the compiled model")
        rels = sorted(files)
        done = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            rel = rng.choice(rels)
            p = os.path.join(self.case_dir, rel)
            if not os.path.lexists(p):
                continue
            done.append(f"{rel}:{self._mutate(rng, p)}")
        ctx["mutation"] = f"{name}:" + "+".join(done)
        try:  # the loaded model is a snapshot: nothing done to the files reaches it
            again = model.run({"x": self.x})["y"]
        except Exception as e:  # noqa: BLE001 - a GEError here is a failure too
            raise OracleViolation(f"the loaded model failed after its files changed ({ctx['mutation']}): "
                                  f"{type(e).__name__}: {e}") from None
        if not np.array_equal(again, first):
            raise OracleViolation(f"the loaded model's results changed with its files ({ctx['mutation']})")
        del model
        reloaded = ge.load_om(om)  # a GEError here is a clean outcome
        out = reloaded.run({"x": self.x})["y"]
        if not any(np.array_equal(out, r) for r in self.refs):
            raise OracleViolation(f"a changed model loaded and gave other results ({ctx['mutation']})")
        return "ok:reloaded"

