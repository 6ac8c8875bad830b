"""Run ONNX's node conformance cases through ``ge_onnx.backend`` and say why each one fails.

``run_case(case)`` returns ``None`` when the case passes and a one-line reason otherwise.
``python tests/conformance/runner.py [--write]`` runs every case and prints (or writes to
``expected_failures.txt``) the failures, one ``case_name: reason`` per line.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
import warnings
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected_failures.txt")


@functools.lru_cache(maxsize=1)
def cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(sorted(collect_testcases(), key=lambda c: c.name))


def _normalize(item: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    if isinstance(item, onnx.TensorProto):
        return numpy_helper.to_array(item)
    if isinstance(item, onnx.SequenceProto):
        return numpy_helper.to_list(item)
    if isinstance(item, onnx.OptionalProto):
        return numpy_helper.to_optional(item)
    if isinstance(item, onnx.MapProto):
        return numpy_helper.to_dict(item)
    return item


def _compare(ref: Any, out: Any, rtol: float, atol: float, where: str) -> None:
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)):
            raise AssertionError(f"{where}: expected a sequence, got {type(out).__name__}")
        if len(ref) != len(out):
            raise AssertionError(f"{where}: sequence length {len(out)}, expected {len(ref)}")
        for j, (r, o) in enumerate(zip(ref, out)):
            _compare(r, o, rtol, atol, f"{where}[{j}]")
        return
    if ref is None:
        if out is not None:
            raise AssertionError(f"{where}: expected None (empty optional)")
        return
    if out is None:
        raise AssertionError(f"{where}: got None")
    ref = np.asarray(ref)
    if isinstance(out, (list, tuple)):
        raise AssertionError(f"{where}: got a sequence, expected a tensor")
    out = np.asarray(out)
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"{where}: shape {list(out.shape)}, expected {list(ref.shape)}")
    if ref.dtype == object:
        np.testing.assert_array_equal(out, ref, err_msg=where)
        return
    if out.dtype != ref.dtype:
        raise AssertionError(f"{where}: dtype {out.dtype}, expected {ref.dtype}")
    r = rtol
    if out.dtype.name == "bfloat16":
        r = max(rtol, 2**-6)
    if out.dtype.kind not in "biufc":
        out, ref = out.astype(np.float32), ref.astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=r, atol=atol, err_msg=where)


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    text = " ".join(m.strip() for m in msg[:4] if m.strip())
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    text = re.sub(r"\s+", " ", text)
    return f"{type(e).__name__}: {text}"[:200]


def run_case(case) -> str | None:
    """None when ``case`` passes through ge_onnx.backend, else a one-line reason."""
    import ge_onnx.backend as backend

    try:
        rep = backend.prepare(case.model, "CPU")
    except Exception as e:  # noqa: BLE001 - the reason is the result
        return "compile: " + _one_line(e)
    for inputs, ref_outputs in case.data_sets:
        ins = [_normalize(x) for x in inputs]
        refs = [_normalize(x) for x in ref_outputs]
        try:
            outs = rep.run(ins)
        except Exception as e:  # noqa: BLE001
            return "run: " + _one_line(e)
        try:
            if len(outs) != len(refs):
                raise AssertionError(f"{len(outs)} outputs, expected {len(refs)}")
            for i, (r, o) in enumerate(zip(refs, outs)):
                _compare(r, o, case.rtol, case.atol, f"output {i}")
        except AssertionError as e:
            msg = str(e).strip().splitlines()
            head = next((m for m in msg if m.strip()), "")
            mism = next((m.strip() for m in msg if "Mismatched" in m), "")
            return f"wrong: {head.strip()} {mism}".strip()[:200]
    return None


#: Known causes, by case-name prefix: the reason written to expected_failures.txt instead of
#: the raw error (whose numbers change from run to run for random ops).
KNOWN = (
    ("test_bernoulli", "random op: draws differ from the reference's (no shared generator)"),
    ("test_training_dropout", "random op: Dropout with training_mode draws a mask that differs from the reference's"),
    ("test_image_decoder", "ImageDecoder runs through onnx.reference, which needs Pillow (not installed)"),
    ("test_flexattention", "FlexAttention with score_mod/prob_mod subgraphs: no native kernel, and the "
                           "onnx.reference fallback cannot take graph attributes"),
)


def environment_failures() -> dict[str, str]:
    """Cases expected to fail only because an optional package is missing here."""
    import importlib.util

    out: dict[str, str] = {}
    if importlib.util.find_spec("PIL") is None:
        for c in cases():
            if c.name.startswith("test_image_decoder"):
                out[c.name] = "ImageDecoder runs through onnx.reference, which needs Pillow (not installed)"
    return out


def summarize(name: str, raw: str) -> str:
    for prefix, reason in KNOWN:
        if name.startswith(prefix):
            return reason
    return raw


def read_expected(path: str = EXPECTED) -> dict[str, str]:
    out: dict[str, str] = {}
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition(": ")
            out[name.strip()] = reason.strip()
    return out


def main(argv: list[str]) -> int:
    write = "--write" in argv
    only = [a for a in argv if not a.startswith("--")]
    failures: dict[str, str] = {}
    t0 = time.perf_counter()
    slow = []
    for c in cases():
        if only and not any(o in c.name for o in only):
            continue
        t = time.perf_counter()
        reason = run_case(c)
        dt = time.perf_counter() - t
        slow.append((dt, c.name))
        if reason is not None:
            failures[c.name] = reason
            if not write:
                print(f"{c.name}: {reason}", flush=True)
    n = len(cases()) if not only else len(slow)
    print(f"# {n - len(failures)}/{n} pass ({100 * (n - len(failures)) / max(n, 1):.2f}%), "
          f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
    for dt, name in sorted(slow, reverse=True)[:8]:
        print(f"#   slow {name}: {dt:.2f}s", file=sys.stderr)
    if write:
        with open(EXPECTED, "w", encoding="utf-8") as f:
            f.write("# ONNX node conformance cases that ge_onnx.backend fails, with the reason.\n"
                    "# Regenerate: python tests/conformance/runner.py --write\n")
            env = environment_failures()
            for name in sorted(failures):
                if name in env:
                    continue
                f.write(f"{name}: {summarize(name, failures[name])}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
