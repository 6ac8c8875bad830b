"""The "native" fuzz target: every native kernel entry called directly (issue 42).

Each case picks one entry and calls it -- mostly through its Python wrapper, the rest straight
on the built module -- with random extents (0-size dims, 1, odd sizes, large ones), and in a
share of the cases one hostile change: a wrong dtype, rank or size, a non-contiguous, Fortran,
unaligned or read-only array, a bad stride, geometry or attribute value, a huge or negative
integer, a NaN epsilon. Inputs are also placed right before an unreadable guard page, so that a
read past an array's end faults. A case ends in

* a result, checked against a NumPy float64 reference where that is cheap (a wrong value is an
  :class:`~fuzz_engine.OracleViolation`): outcome ``ok``, labelled with the entry;
* a clean refusal: the wrapper's False / None, or the ValueError, TypeError or OverflowError of
  the entry's argument checks (which the executor turns into an ExecutionError naming the node),
  reported as :class:`NativeRefused` (a GEError);
* anything else is a crash: another exception, a hang, or (seen from the parent) a signal.

Entries covered: sgemm (``sg_packed`` / ``sg_conv`` through matmul_packed, matmul_rows, conv2d,
Conv2d.run, and raw), nchwc (``nc_conv``, ``nc_conv_plain``, ``nc_dwconv``, ``nc_pool``,
``nc_gap``, ``nc_reorder``, ``nc_wino``, ``nc_wino_pack``, ``nc_scale_w``, ``nc_groupnorm``), gemm
(``rows``, ``cols``/``blocks``, ``batch``), attention heads, loopgen's generated loops (static
and dynamic layouts, and the raw entry) and row kernels (layernorm, rmsnorm, softmax,
softmax_scaled, rotary), the window loops and the direct depthwise kernel, Winograd's
transforms, instance norm and erf. Entries that take raw pointers (gemm blocks' pointer table,
the attention heads' base addresses, a BLAS function address) trust their caller for those
pointers: only their other arguments are fuzzed.

A campaign: ``python scripts/fuzz.py --target native --cases 20000`` (20,000 cases took 98 s on 2
busy cores, 0 crashes: 8,303 results, 11,697 clean refusals).

The entries are in ``native_entries_gemm``, ``native_entries_layout`` and ``native_entries_fused``,
their inputs and references in ``native_inputs``.
"""

from __future__ import annotations

import os
import random
from typing import Any

from fuzz_engine import Target
from native_entries_fused import e_loop, e_loop_raw, e_misc, e_replay, e_rows
from native_entries_gemm import e_attention, e_gemm, e_sgemm_conv, e_sgemm_packed, e_sgemm_raw, e_sgemm_rows
from native_entries_layout import e_dw_direct, e_nchwc, e_window, e_winograd
from native_inputs import _KEEP

ENTRIES = [(e_replay, 3), (e_sgemm_packed, 3), (e_sgemm_rows, 2), (e_sgemm_conv, 3), (e_sgemm_raw, 2), (e_nchwc, 5), (e_gemm, 2),
           (e_attention, 2), (e_loop, 2), (e_loop_raw, 1), (e_rows, 2), (e_window, 2), (e_dw_direct, 1),
           (e_winograd, 2), (e_misc, 2)]


class NativeTarget(Target):
    """Every native kernel entry, called directly with random extents and hostile arguments."""

    name = "native"
    case_timeout = 20.0
    #: the share of cases with one hostile argument
    hostile_share = 0.7

    def warm_up(self) -> None:
        import ge_cpu.fused.attention  # noqa: F401
        import ge_cpu.kernels  # noqa: F401
        from ge_native import gemm, nchwc, sgemm

        sgemm.available()
        nchwc.available()
        gemm.available()

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        self.warm_up()
        self._pool = [f for f, w in ENTRIES for _ in range(w)]
        #: GE_FUZZ_NATIVE_EVEN=1: the entry groups in turn (case i runs group i % 15), for a
        #: campaign of a given number of cases per group (scripts/fuzz.py --target native)
        self._even = os.environ.get("GE_FUZZ_NATIVE_EVEN", "") not in ("", "0")

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        _KEEP.clear()
        fn = ENTRIES[index % len(ENTRIES)][0] if self._even else rng.choice(self._pool)
        hostile = rng.random() < self.hostile_share
        ctx["mutation"] = f"{fn.__name__[2:]}:{'hostile' if hostile else 'valid'}"
        ctx["input"] = f"{fn.__name__} index {index}".encode()
        return fn(rng, hostile)
