"""The instruction-set dispatch layer (ge_native.isa): features, families, switches, the report."""

from __future__ import annotations

import numpy as np
import pytest

import ge_core as ge
from ge_native import isa, native, nchwc, sgemm

CPUINFO_AVX2 = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx fma avx2 bmi2
bogomips\t: 4000.00

processor\t: 1
flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx fma avx2 bmi2
"""
CPUINFO_SPR = "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 " \
    "amx_tile amx_bf16 amx_int8\n"
CPUINFO_ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\n"


def _family(**kw) -> isa.Family:
    return isa.Family("test_dot", [isa.Variant("amx_int8", frozenset({"amx_int8", "amx_tile"})),
                                   isa.Variant("avx512_vnni", frozenset({"avx512f", "avx512_vnni"})),
                                   isa.Variant("avx2", frozenset({"avx2", "fma"})),
                                   isa.Variant("scalar")], **kw)


def test_features_are_parsed_from_cpuinfo_text():
    avx2 = isa.parse_cpuinfo(CPUINFO_AVX2)
    assert {"avx2", "fma", "sse4_2"} <= avx2 and "avx512f" not in avx2
    spr = isa.parse_cpuinfo(CPUINFO_SPR)
    assert isa.KNOWN_FEATURES <= spr
    assert isa.parse_cpuinfo(CPUINFO_ARM) == frozenset({"fp", "asimd", "evtstrm", "aes", "crc32"})
    assert isa.parse_cpuinfo("processor\t: 0\n") == frozenset()


def test_machine_features_are_read_once_and_match_native():
    assert isa.features() is isa.features()
    assert isa.features() == (native.cpu_flags() or frozenset())


def test_the_chosen_variant_follows_the_features():
    fam = _family()
    assert fam.best(isa.parse_cpuinfo(CPUINFO_SPR)) == "amx_int8"
    assert fam.best(isa.parse_cpuinfo(CPUINFO_SPR.replace(" amx_int8", ""))) == "avx512_vnni"
    assert fam.best(isa.parse_cpuinfo(CPUINFO_AVX2)) == "avx2"
    assert fam.best(isa.parse_cpuinfo(CPUINFO_ARM)) == "scalar"
    assert fam.best(frozenset()) == "scalar"


def test_chosen_reads_this_machines_features(monkeypatch):
    fam = _family()
    monkeypatch.setattr(isa, "features", lambda: isa.parse_cpuinfo(CPUINFO_AVX2))
    assert fam.chosen() == "avx2"
    monkeypatch.setattr(isa, "features", lambda: isa.parse_cpuinfo(CPUINFO_SPR))
    assert fam.chosen() == "amx_int8"


def test_the_switch_turns_a_family_to_its_fallback(monkeypatch):
    monkeypatch.setattr(isa, "features", lambda: isa.parse_cpuinfo(CPUINFO_SPR))
    fam = _family(switch="GE_TEST_DOT")
    monkeypatch.setenv("GE_TEST_DOT", "1")
    assert fam.chosen() == "amx_int8"
    for off in ("0", "off", "false", "no"):
        monkeypatch.setenv("GE_TEST_DOT", off)
        assert fam.chosen() == "scalar"


def test_a_probe_names_what_the_built_module_runs(monkeypatch):
    monkeypatch.setattr(isa, "features", lambda: isa.parse_cpuinfo(CPUINFO_SPR))
    answer: list[str | None] = ["avx2"]
    fam = _family(switch="GE_TEST_DOT", probe=lambda: answer[0])
    assert fam.chosen() == "avx2"  # the compiler's target, not the best the CPU has
    answer[0] = None  # the module did not build
    assert fam.chosen() == "scalar"
    answer[0] = "avx2"
    monkeypatch.setenv("GE_TEST_DOT", "0")
    assert fam.chosen() == "scalar"


def test_families_are_checked_when_declared():
    with pytest.raises(ge.GEError, match="last variant"):
        isa.Family("bad", [isa.Variant("avx2", frozenset({"avx2"}))])
    with pytest.raises(ge.GEError, match="twice"):
        isa.Family("bad", [isa.Variant("scalar"), isa.Variant("scalar")])


def test_register_lookup_and_unknown_names():
    fam = isa.register(_family())
    try:
        assert isa.family("test_dot") is fam
        assert isa.variant_of("test_dot") == fam.best()
        assert "test_dot" in isa.families() and isa.report()["test_dot"] == fam.best()
    finally:
        isa.register(isa.Family("test_dot", [isa.Variant("scalar")]))
    with pytest.raises(isa.UnknownFamilyError, match="no_such_family") as err:
        isa.family("no_such_family")
    assert isinstance(err.value, ge.GEError)
    with pytest.raises(ge.GEError):
        isa.variant_of("no_such_family")


def test_the_builtin_families_name_what_their_modules_report(monkeypatch):
    names = {"sgemm": ("avx512f", "avx2", "numpy"), "nchwc": ("avx512f", "avx2", "scalar"),
             "gemm": ("blas", "numpy"), "pool": ("pthreads", "inline")}
    for name, variants in names.items():
        assert isa.family(name).names() == variants
    rep = isa.report()
    assert rep["sgemm"] == (sgemm.isa() or "numpy")
    assert rep["nchwc"] == (nchwc.isa() or "scalar")
    for name, variants in names.items():
        assert rep[name] in variants
    monkeypatch.setenv("GE_NATIVE_SGEMM", "0")
    monkeypatch.setenv("GE_NATIVE_NCHWC", "0")
    assert isa.variant_of("sgemm") == "numpy" and isa.variant_of("nchwc") == "scalar"


def test_report_names_matmul_variant():
    from ge_sdk.testing import GraphBuilder

    b = GraphBuilder("mm")
    x = b.input("x", "float32", (4, 64))
    wa = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    b.output(b.MatMul(x, b.const(wa)))
    model = ge.compile(b.build(), {})
    kernels = model.report["node_kernels"]
    mm = [k for k in kernels.values() if k["op"] == "MatMul"]
    assert len(mm) == 1
    want = sgemm.isa() or ""  # GE's own GEMM names its instruction set; BLAS's path names none
    assert mm[0]["variant"] == want
    if sgemm.available():
        assert want in ("avx512f", "avx2")
    xv = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    (y,) = model.run({"x": xv}).values()
    np.testing.assert_allclose(y, xv @ wa, rtol=1e-5, atol=1e-5)
