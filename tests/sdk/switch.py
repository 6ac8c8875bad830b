"""What the bf16 kernel families' tests share: the variants this machine's features promise, the
family's choice on a Sapphire Rapids flag set, and a probe script run in a fresh process with
``GE_NATIVE_BF16`` set (or unset: the switch is read when a native module is first built and
used, so each setting needs its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ge_native import isa

CPUINFO_SPR = "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512vl avx512_bf16 amx_tile amx_bf16 amx_int8\n"


def expected_variants() -> tuple[str, ...]:
    """The bf16 variants this machine's features promise, best first."""
    f = isa.features()
    avx = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= f
    amx = avx and {"amx_bf16", "amx_tile"} <= f
    return tuple(v for v, ok in (("amx_bf16", amx), ("avx512_bf16", avx), ("scalar", True)) if ok)


def check_family(name: str, variants: tuple[str, ...]) -> None:
    """Family ``name`` declares ``variants`` under GE_NATIVE_BF16 and chooses AMX, then
    AVX512-BF16 (Zen 4), then scalar as the features go."""
    fam = isa.family(name)
    assert fam.names() == variants and fam.switch == "GE_NATIVE_BF16"
    spr = isa.parse_cpuinfo(CPUINFO_SPR)
    assert fam.best(spr) == "amx_bf16"
    assert fam.best(spr - {"amx_bf16"}) == "avx512_bf16"
    assert fam.best(spr - {"amx_bf16", "avx512_bf16"}) == "scalar"


def probe(script: str, value: str | None, switch: str = "GE_NATIVE_BF16") -> dict:
    """The JSON ``script`` prints last, run with ``switch=value`` (None: unset; the bf16
    families' switch unless told another family's)."""
    env = dict(os.environ)
    env.pop(switch, None)
    if value is not None:
        env[switch] = value
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
