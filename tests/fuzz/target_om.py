"""The .om loader target (``om``): mutated offline models, checksums rewritten so that a mutation
reaches the checks behind them."""

from __future__ import annotations

import copy
import json
import os
import random
import struct
import zlib
from typing import Any

from fuzz_common import _json_mutate, _light_dir, _random_json
from fuzz_engine import Target, mutate_bytes
from onnx_seeds import _onnx_seeds


def _fix_checksums(data: bytes) -> bytes:
    """Recompute the header, table and partition CRCs of a (mutated) .om byte string, as far as
    its fields allow; so a mutation reaches the checks behind the checksums."""
    from ge_core import om_container as oc

    buf = bytearray(data)
    if len(buf) < oc.HEADER_SIZE:
        return bytes(buf)
    fields = list(oc.HEADER_STRUCT.unpack_from(buf, 0))
    header_size, count, table_offset, entry_size = fields[4], fields[7], fields[8], fields[9]
    if not (oc.HEADER_SIZE <= header_size <= min(len(buf), 4096)):
        header_size = oc.HEADER_SIZE
    if 0 <= count <= 64 and oc.ENTRY_SIZE <= entry_size <= 1024 and table_offset + count * entry_size <= len(buf):
        for i in range(count):
            at = table_offset + i * entry_size
            kind, off, size, align, crc, flags, res = oc.ENTRY_STRUCT.unpack_from(buf, at)
            if off + size <= len(buf):
                oc.ENTRY_STRUCT.pack_into(buf, at, kind, off, size, align, zlib.crc32(buf[off: off + size]), flags, res)
        struct.pack_into("<I", buf, 68, zlib.crc32(buf[table_offset: table_offset + count * entry_size]))
    struct.pack_into("<I", buf, oc.HEADER_CRC_OFFSET, 0)
    crc = zlib.crc32(buf[:header_size])
    struct.pack_into("<I", buf, oc.HEADER_CRC_OFFSET, crc)
    return bytes(buf)


class OmTarget(Target):
    """``ge.load_om`` on mutated compiled models: raw bytes, bytes with fixed-up checksums, and
    mutations of the JSON model definition / weights table rewritten as a valid container."""

    name = "om"

    def warm_up(self) -> None:
        import ge_core as ge

        m = ge.compile(ge.load(os.path.join(_light_dir(), "light_zfnet512.onnx")))
        import tempfile

        with tempfile.TemporaryDirectory() as t:
            m.save(os.path.join(t, "w.om"))
            ge.load_om(os.path.join(t, "w.om"))

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import ge_core as ge
        from ge_core.om import read_model_definition
        from ge_core.om_container import read_container

        self.path = os.path.join(workdir, "case.om")
        onnx_dir = os.path.join(workdir, "onnx")
        os.makedirs(os.path.join(onnx_dir, "model", "sub"), exist_ok=True)
        srcs = {s[0]: s[1] for s in _onnx_seeds(onnx_dir) if not s[2]}
        self.seeds: list[tuple[str, bytes, dict, bytes]] = []
        for n in ("zfnet512", "mlp", "if", "loop", "misc"):
            p = os.path.join(workdir, f"seed_{n}.om")
            ge.compile(ge.load(srcs[n], framework="onnx")).save(p)
            with open(p, "rb") as f:
                raw = f.read()
            with read_container(p) as c:
                d = read_model_definition(p, c)
                blob = bytes(c.partition("weights"))
            self.seeds.append((n, raw, d, blob))
        self.raw = [s[1] for s in self.seeds]

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        import ge_core as ge
        from ge_core.om_container import write_container
        from ge_sdk.omdesc import inspect_om

        name, raw, d, blob = rng.choice(self.seeds)
        r = rng.random()
        verify = True
        if r < 0.2:
            data, what = mutate_bytes(raw, rng, self.raw)
            verify = rng.random() < 0.7
        elif r < 0.45:
            data, what = mutate_bytes(raw, rng, self.raw)
            data = _fix_checksums(data)
            what = "fixed-" + what
        else:
            dd = copy.deepcopy(d)
            if r < 0.65 and dd.get("weights"):
                e = rng.choice(dd["weights"])
                key = rng.choice(["offset", "nbytes", "shape", "dtype", "strings", "zz"])
                e[key] = _random_json(rng, list(e))
                if rng.random() < 0.3:
                    e["shape"] = [rng.choice([2**20, 2**31, 2**40, 0, 1]) for _ in range(rng.randint(1, 3))]
                what = f"weights:{key}"
            elif rng.random() < 0.4:  # memory plan, streams, options, report (om_mutations.py)
                from om_mutations import mutate_stored

                what = "stored:" + mutate_stored(dd, rng)
            else:
                what = "json:" + _json_mutate(dd, rng)
            b = blob
            if rng.random() < 0.1:
                b = blob[: rng.randrange(len(blob) + 1)]
                what += "+cutblob"
            try:
                text = json.dumps(dd, allow_nan=True).encode("utf-8")
            except (ValueError, RecursionError):
                text = b"{}"
            if rng.random() < 0.05:
                text, w2 = mutate_bytes(text, rng, rounds=1)
                what += "+" + w2
            tmp = self.path + ".src"
            write_container(tmp, [("model", text, 8), ("weights", b, 4096)], producer="fuzz")
            with open(tmp, "rb") as f:
                data = f.read()
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        label = "ok"
        if rng.random() < 0.3:
            inspect_om(self.path)
            label = "inspected"
        model = ge.load_om(self.path, verify_checksums=verify)
        model.input_names, model.output_names, model.report  # noqa: B018
        from om_mutations import check_loaded

        check_loaded(model, ctx)  # a stored plan/assignment/option that loads never gives wrong values
        return label
