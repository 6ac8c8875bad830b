"""The feed file target (``feeds``): mutated ``.npy`` files as ``ge run --input name=file.npy``
reads them."""

from __future__ import annotations

import os
import random
import struct
from typing import Any

from codegen_support import Canary, CanaryTarget
from fuzz_engine import OracleViolation, mutate_bytes


def npy_seeds() -> list[tuple[str, bytes]]:
    """(name, bytes) of valid .npy files written by ``np.save``: several dtypes, ranks, orders."""
    import io

    import numpy as np

    arrays = {
        "f32_2x3": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f32_1x4": np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4),
        "f64_fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        "i64_scalar": np.array(7, np.int64),
        "i32_vec": np.arange(5, dtype=np.int32),
        "u8_img": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        "bool": np.array([True, False, True]),
        "f16_empty": np.zeros((0, 3), np.float16),
        "big_endian": np.arange(4, dtype=">f4").reshape(2, 2),
        "c64": np.array([1 + 2j, 3 - 1j], np.complex64),
    }
    out = []
    for name, a in arrays.items():
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=False)
        out.append((name, buf.getvalue()))
    # a version 2.0 file (4-byte header length)
    buf = io.BytesIO()
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.lib.format.write_array(buf, a, version=(2, 0), allow_pickle=False)
    out.append(("v2_f32", buf.getvalue()))
    return out


_NPY_DESCRS = ["'<f4'", "'|O'", "'O'", "'<U4'", "'|V8'", "'|S3'", "'>f8'", "'<c16'", "'|b1'", "'<M8[s]'",
               "'<m8[ns]'", "'float32'", "'<f2'", "'<i8'", "'|u1'", "'<f0'", "'<f99999999999'", "'x'", "''",
               "[('a', '<f4'), ('b', '|O')]", "[('a', '<f4')]", "('<f4', (2,))", "('<f4', (2**40,))",
               "[('a', '<f4', (1000000, 1000000))]", "{'names': ['a'], 'formats': ['O']}", "None", "4", "b'<f4'",
               "'<V0'", "[('', '<f4')]", "'|V99999999999'"]
_NPY_SHAPES = ["()", "(2, 3)", "(3, 2)", "(6,)", "(0,)", "(-1,)", "(-1, -6)", "(2**62, 4)", "(4294967296,)",
               "(9223372036854775807,)", "(9223372036854775808,)", "(2, 2**62, 2**62)", "(1,) * 64", "(1,)*33",
               "(" + "1, " * 100 + ")", "('2', 3)", "(2.0, 3)", "[2, 3]", "((2,),)", "None", "(True,)",
               "(10**100,)", "(6, 0, 2**63)", "(0, 2**63, 2**63)",
               "(0, 3)", "(2, 0)", "(0, 0)", "(0, 1)"]  # empty feeds: the model's native loops get 0-size extents


def _npy_header(descr: str, fortran: str, shape: str, extra: str = "", version: int = 1, pad_to: int = 64,
                hlen: int | None = None) -> bytes:
    text = "{" + f"'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, {extra}" + "}"
    body = text.encode("latin1", "replace")
    pre = 10 if version == 1 else 12
    total = -(-(pre + len(body) + 1) // pad_to) * pad_to if pad_to else pre + len(body) + 1
    body += b" " * (total - pre - len(body) - 1) + b"\n"
    n = len(body) if hlen is None else hlen
    head = b"\x93NUMPY" + bytes([version, 0])
    head += struct.pack("<H", n & 0xFFFF) if version == 1 else struct.pack("<I", n & 0xFFFFFFFF)
    return head + body


def _npy_split(data: bytes) -> tuple[bytes, bytes, bytes]:
    """(magic+length, header text, data) of a valid .npy."""
    major = data[6]
    pre = 10 if major == 1 else 12
    hlen = struct.unpack("<H", data[8:10])[0] if major == 1 else struct.unpack("<I", data[8:12])[0]
    return data[:pre], data[pre:pre + hlen], data[pre + hlen:]


def _feed_model():
    """A tiny ONNX model: ``y = Relu(x) + 1`` on float32 ``x`` of shape [N, M]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "one"], ["y"])],
                          "feed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [one])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


class FeedsTarget(CanaryTarget):
    """``ge_sdk.inputs.read_feed_file`` on mutated ``.npy`` files (the feeds of ``ge run
    --input``); 30% of the arrays read are fed to a tiny compiled model (``model.run``).

    Seeds are ``np.save`` files of several dtypes, ranks and orders, version 1.0 and 2.0.
    Mutations: the header dict rewritten (``descr`` incl. ``'|O'``, structured and subarray
    dtypes, ``fortran_order``, shapes negative / huge / of other types, extra or missing keys,
    Python code where a literal belongs), the version bytes and the declared header length, the
    data truncated or extended, byte-level edits. Every array read must be what ``np.load``
    (without pickle) reads from the same file; a payload in the header must never run (canary)."""

    name = "feeds"
    run_share = 0.3

    def warm_up(self) -> None:
        import ge_core as ge
        import ge_sdk.inputs  # noqa: F401

        m = ge.compile(_feed_model())
        import numpy as np

        m.run({"x": np.ones((2, 3), np.float32)})

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import ge_core as ge

        self.canary = Canary(workdir)
        self.path = os.path.join(workdir, "feed.npy")
        self.seeds = npy_seeds()
        self.raw = [d for _, d in self.seeds]
        self.model = ge.compile(_feed_model())

    def _mutate(self, data: bytes, rng: random.Random) -> tuple[bytes, str]:
        pre, head, body = _npy_split(data)
        r = rng.random()
        if r < 0.4:  # a new header dict
            try:
                import ast

                d = ast.literal_eval(head.decode("latin1"))
                descr, fortran, shape = repr(d["descr"]), repr(d["fortran_order"]), repr(d["shape"])
            except (ValueError, SyntaxError, KeyError):
                descr, fortran, shape = "'<f4'", "False", "(2, 3)"
            kinds = []
            extra = ""
            for _ in range(rng.choice((1, 1, 2))):
                k = rng.choice(["descr", "descr", "shape", "shape", "fortran", "extra", "code", "missing"])
                kinds.append(k)
                if k == "descr":
                    descr = rng.choice(_NPY_DESCRS)
                elif k == "shape":
                    shape = rng.choice(_NPY_SHAPES)
                elif k == "fortran":
                    fortran = rng.choice(["True", "False", "1", "'yes'", "None", "[]"])
                elif k == "extra":
                    extra = rng.choice(["'x': 1, ", "'descr': '|O', ", "'shape': (10**12,), ", "'': None, "])
                elif k == "code":
                    p = rng.choice(self.canary.payloads)
                    which = rng.randrange(3)
                    descr, shape, fortran = (p, shape, fortran) if which == 0 else \
                        (descr, p, fortran) if which == 1 else (descr, shape, p)
                else:
                    text = _npy_header(descr, fortran, shape)[10:].decode("latin1")
                    key = rng.choice(["'descr': ", "'shape': ", "'fortran_order': "])
                    text = text.replace(key + {"'descr': ": descr, "'shape': ": shape}.get(key, fortran) + ", ", "")
                    new = text.encode("latin1").rstrip()
                    new = new + b" " * (-(len(new) + 11) % 64) + b"\n"
                    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(new)) + new + body, "header:missing"
            version = data[6] if rng.random() < 0.8 else rng.choice((1, 2))
            out = _npy_header(descr, fortran, shape, extra, version=version,
                              pad_to=rng.choice((64, 64, 16, 0)))
            if rng.random() < 0.3:  # data to fit the new header where it is small, else the old data
                body = body * rng.choice((1, 2, 4))
            return out + body, "header:" + "+".join(kinds)
        if r < 0.5:  # version bytes
            buf = bytearray(data)
            buf[6] = rng.choice((0, 1, 2, 3, 4, 255))
            if rng.random() < 0.5:
                buf[7] = rng.choice((0, 1, 255))
            return bytes(buf), "version:bytes"
        if r < 0.6:  # the declared header length
            buf = bytearray(data)
            n = rng.choice((0, 1, 9, len(head) - 1, len(head) + 1, len(head) + 16, 10000, 10001, 65535,
                            2**31, 2**32 - 1))
            if buf[6] == 2 or n > 0xFFFF:
                buf = bytearray(b"\x93NUMPY\x02\x00") + bytearray(struct.pack("<I", n & 0xFFFFFFFF)) + head + body
            else:
                struct.pack_into("<H", buf, 8, n)
            return bytes(buf), "header-length:field"
        if r < 0.7:
            return data[: rng.randrange(len(data))], "truncate:data"
        if r < 0.78:
            return data + bytes(rng.randrange(256) for _ in range(rng.choice((1, 3, 4, 8, 1000)))), "trailing:data"
        if r < 0.85:  # a huge shape with the seed's data
            return _npy_header(repr("<f4"), "False", rng.choice(_NPY_SHAPES[6:13])) + body, "huge-shape:header"
        if r < 0.88:
            return rng.choice([b"", b"\x93NUMPY", b"PK\x03\x04" + bytes(40), b"\x80\x02}q\x00.", data[:10]]), "special:file"
        return mutate_bytes(data, rng, self.raw)

    def _case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        import numpy as np

        from ge_sdk.inputs import read_feed_file

        name, data = rng.choice(self.seeds)
        if rng.random() < 0.05:
            what = "none:seed"
        else:
            data, what = self._mutate(data, rng)
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        arr = read_feed_file("x", self.path)
        if not isinstance(arr, np.ndarray):
            raise OracleViolation(f"read_feed_file returned {type(arr).__name__}, not an array")
        try:
            ref = np.load(self.path, allow_pickle=False)
        except Exception:  # noqa: BLE001 - numpy refuses what GE read: compare nothing
            ref = None
        if ref is not None and (ref.dtype != arr.dtype or ref.shape != arr.shape or ref.tobytes() != arr.tobytes()):
            raise OracleViolation(f"read {arr.dtype}{arr.shape}, np.load reads {ref.dtype}{ref.shape}")
        if rng.random() >= self.run_share:
            return "ok"
        self.model.run({"x": arr})
        return "ran"
