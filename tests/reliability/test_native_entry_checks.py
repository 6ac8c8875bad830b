"""Native kernel entries check their sizes before they touch memory (issue 42).

Found by the "native" fuzz target (tests/fuzz/native_targets.py) and by review of the entries'
argument checks: each case below killed the process (SIGFPE, or a write past an array) before
the fix. Each runs in a child process, so a crash fails the case instead of killing pytest; the
entry must end in its result or a clean ValueError / TypeError (the executor turns those into an
ExecutionError naming the node).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CASES = {
    # a 1x1 blocked convolution over a plane of width 0: its column chunks divided by 0 (SIGFPE)
    "nc_conv_plane_width0": """
        from ge_native import nchwc
        if nchwc.available():
            wpk = nchwc.pack_weights(np.ones((16, 32, 1, 1), np.float32))
            out = np.zeros((1, 1, 10, 0, 16), np.float32)
            assert nchwc.conv(np.zeros((1, 2, 10, 0, 16), np.float32), wpk, out, (1, 1), (1, 1), (2, 2), (0, 0))
    """,
    # a blocked convolution with no input blocks: its padded copy asked for 0 floats (MemoryError),
    # and with no padding it returned with its output never written; now refused (False: the
    # caller's NumPy form runs)
    "nc_conv_no_input_blocks": """
        from ge_native import nchwc
        if nchwc.available():
            for k, p in (((3, 3), (1, 1)), ((1, 1), (0, 0))):
                out = np.full((1, 1, 9, 11, 16), np.nan, np.float32)
                assert not nchwc.conv(np.zeros((1, 0, 9, 11, 16), np.float32), np.zeros(0, np.float32), out, k,
                                      (1, 1), (1, 1), p, np.arange(16, dtype=np.float32))
    """,
    # GE's GEMM with 0 rows or 0 columns: the task grid divided by its row blocks / groups (SIGFPE)
    "sg_packed_empty": """
        from ge_native import sgemm
        if sgemm.available():
            w = np.ones((8, 40), np.float32)
            assert sgemm.matmul_packed(np.ones((0, 8), np.float32), sgemm.Panels(w), np.empty((0, 40), np.float32))
            assert sgemm.matmul_packed(np.ones((3, 8), np.float32), sgemm.Panels(w[:, :0]), np.empty((3, 0), np.float32))
    """,
    # a convolution whose channels x kernel sides wrap int64 to 0 columns: accepted, then a division by 0
    "sg_conv_kernel_overflow": """
        from ge_native import sgemm
        if sgemm.available():
            geo = np.array([1, 2**30, 2**30, 1, 1, 1, 1, 0, 0, 1, 1], np.int64)
            assert refused(lambda: sgemm._mod().sg_conv(np.zeros((16, 3, 3), np.float32), np.zeros((4, 0), np.float32),
                                np.zeros((4, 1), np.float32), np.zeros(1, np.float32), 0, 0, 0.0, 0.0, 1, None, 0,
                                geo, -1)), "an overflowing geometry was accepted"
    """,
    # Winograd's input transform: n * c * h * w wrapped int64 to 0, so a 1-element x passed its check
    "winograd_size_overflow": """
        from ge_cpu.kernels import winograd
        fns = winograd.native_transforms(np.float32)
        if fns is not None:
            x, v = np.zeros(1, np.float32), np.zeros(1, np.float32)
            assert refused(lambda: fns[0](x, v, 2**16, 2**16, 2**16, 2**16, 0, 0, 2**20, 2**8, 1)), "an overflowing size was accepted"
    """,
    # a row kernel's rows * cols wrapped to 0: 2^40 rows written into a 1-element array
    "row_kernel_size_overflow": """
        from ge_cpu.fused import loopgen
        from ge_native import native
        mod = native.build(loopgen.row_source("float32"),
                           list(loopgen.ROW_KINDS)) if loopgen.available() else None
        if mod is not None:
            x = np.zeros(1, np.float32)
            assert refused(lambda: mod.softmax(x, x, 2**40, 2**24, 1)), "an overflowing size was accepted"
    """,
    # a fused loop and the row kernels with an extent of 0: the empty result, not a refusal
    "loops_empty": """
        from ge_cpu.fused import codegen, loopgen
        steps = codegen.loads(codegen.dumps([("Mul", ["a0", "a1"], {}), ("Relu", ["t0"], {})]))
        fn = loopgen.loop_kernel(steps, ["a0", "a1"], ["float32"] * 2, [(3, 0), (3, 0)], "float32", (3, 0))
        if fn is not None:
            assert fn(np.zeros((3, 0), np.float32), np.zeros((3, 0), np.float32)).shape == (3, 0)
        rows = loopgen.row_kernel("layernorm", np.float32)
        if rows is not None:
            x = np.zeros((0, 8), np.float32)
            rows(x, np.ones(8, np.float32), np.zeros(8, np.float32), 1e-5, x)
    """,
    # BLAS refuses a leading dimension of 0: the rows/batch entries left their output unwritten
    "gemm_k0": """
        from ge_native import gemm
        if gemm.available():
            out = np.full((8, 5), np.nan, np.float32)
            assert gemm.run_rows(np.zeros((8, 0), np.float32), np.zeros((0, 5), np.float32), out, [(0, 8)], 1)
            assert np.array_equal(out, np.zeros((8, 5)))
            o3 = np.full((2, 3, 4), np.nan, np.float32)
            assert gemm.run_batched(np.zeros((2, 3, 0), np.float32), np.zeros((2, 0, 4), np.float32), o3, 1)
            assert np.array_equal(o3, np.zeros((2, 3, 4)))
    """,
}


#: what every case's child starts with: ``refused(call)`` is whether the entry refused the call
#: cleanly (a ValueError) instead of running it
PRELUDE = """import numpy as np

def refused(call):
    try:
        call()
    except ValueError:
        return True
    return False
"""


@pytest.mark.parametrize("name", list(CASES))
def test_a_native_entry_checks_its_sizes_first(name):
    code = PRELUDE + textwrap.dedent(CASES[name])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"status {proc.returncode}: {proc.stderr[-2000:]}"
