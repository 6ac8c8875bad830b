"""Instruction-set dispatch: which variant of each native kernel family runs on this machine.

A :class:`Family` lists its :class:`Variant` s best first, each with the CPU features it needs
(names as ``/proc/cpuinfo`` spells them: ``avx512f``, ``avx2``, ``fma``, ``avx512_bf16``,
``amx_int8`` ...); the last one needs nothing (the scalar or NumPy form). :func:`features` reads
the machine's features once. :meth:`Family.chosen` names the variant that runs: the fallback when
the family's environment switch (``GE_NATIVE_SGEMM=0`` ...) turns it off, else what the family's
probe reports (the ``*_isa()`` entry of the module that was built and loaded: the truth of what
runs, since the compiler may lack an instruction set the CPU has), else the best variant the
features allow. Kernels name it in the compile report (``with_caps(kernel, variant=...)``), so
``report["node_kernels"]`` says which variant each node ran. docs/native.md says how to add a
variant.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import import_module

from ge_core.errors import PluginError

from . import native
from .jit import enabled as switch_on

#: the feature names kernel variants are keyed on (a CPU lists many more; any of them may be required)
KNOWN_FEATURES = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
                            "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile"})

_lock = threading.Lock()
_families: dict[str, Family] = {}
_features: list[frozenset[str]] = []


class UnknownFamilyError(PluginError):
    """A kernel family name that no module registered with :func:`register`."""


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The feature flags of a ``/proc/cpuinfo`` text (empty when it lists none)."""
    return native.parse_cpu_flags(text.splitlines()) or frozenset()


def features() -> frozenset[str]:
    """This machine's CPU features (``/proc/cpuinfo``'s flags, read once; empty where there is none)."""
    if not _features:
        _features.append(native.cpu_flags() or frozenset())
    return _features[0]


@dataclass(frozen=True)
class Variant:
    """One form of a kernel family: its name (``"avx512f"``, ``"avx2"``, ``"amx_bf16"``,
    ``"scalar"`` ...) and the CPU features it needs."""

    name: str
    requires: frozenset[str] = field(default_factory=frozenset)

    def runs_on(self, feats: Iterable[str]) -> bool:
        """Whether a CPU with features ``feats`` runs this variant."""
        return self.requires <= frozenset(feats)


class Family:
    """A kernel family's variants, best first; the last needs no feature (the fallback).
    ``switch``: the environment variable that turns the native forms off; ``probe``: a function
    returning the name of the variant the built module runs (None when it did not build)."""

    def __init__(self, name: str, variants: Sequence[Variant], *, switch: str | None = None,
                 probe: Callable[[], str | None] | None = None) -> None:
        if not variants or variants[-1].requires:
            raise PluginError(f"kernel family {name!r}: the last variant must need no CPU feature (the fallback)",
                              hint="end the list with Variant('scalar') or the NumPy form")
        names = [v.name for v in variants]
        if len(set(names)) != len(names):
            raise PluginError(f"kernel family {name!r} names a variant twice: {names}")
        self.name = name
        self.variants = tuple(variants)
        self.switch = switch
        self.probe = probe

    def __repr__(self) -> str:
        return f"Family({self.name!r}, {[v.name for v in self.variants]})"

    @property
    def fallback(self) -> str:
        """The name of the variant that needs nothing (the last)."""
        return self.variants[-1].name

    def names(self) -> tuple[str, ...]:
        """The variants' names, best first."""
        return tuple(v.name for v in self.variants)

    def enabled(self) -> bool:
        """False when the family's environment switch turns its native forms off."""
        return self.switch is None or switch_on(self.switch)

    def best(self, feats: Iterable[str] | None = None) -> str:
        """The best variant a CPU with features ``feats`` (this machine's by default) runs."""
        have = features() if feats is None else frozenset(feats)
        return next(v.name for v in self.variants if v.runs_on(have))

    def chosen(self) -> str:
        """The variant that runs here: the fallback when the switch is off, else the probe's
        answer (the fallback when the module did not build), else :meth:`best`."""
        if not self.enabled():
            return self.fallback
        if self.probe is not None:
            return self.probe() or self.fallback
        return self.best()


def register(fam: Family) -> Family:
    """Declare ``fam`` (a family registered again under its name replaces the old one, so a
    reloaded module does not fail); returns it."""
    with _lock:
        _families[fam.name] = fam
    return fam


def family(name: str) -> Family:
    """The family registered as ``name``; :class:`UnknownFamilyError` when there is none."""
    fam = _families.get(name)
    if fam is None:
        raise UnknownFamilyError(f"no native kernel family is named {name!r} (known: {', '.join(sorted(_families))})",
                                 hint="register it with ge_native.isa.register(Family(...)) before asking for it")
    return fam


def variant_of(name: str) -> str:
    """The variant of family ``name`` that runs here (:meth:`Family.chosen`)."""
    return family(name).chosen()


def families() -> tuple[str, ...]:
    """The registered families' names, sorted."""
    return tuple(sorted(_families))


def report() -> dict[str, str]:
    """``{family: chosen variant}`` for every registered family (asking builds the modules)."""
    return {name: _families[name].chosen() for name in families()}


def _isa_probe(module: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        got: str | None = import_module(f"{__package__}.{module}").isa()
        return got

    return probe


def _gemm_probe() -> str | None:
    from . import gemm

    return "blas" if gemm.available() else None


def _pool_probe() -> str | None:
    return "pthreads" if native.pool_capsule() is not None else None


_AVX512 = Variant("avx512f", frozenset({"avx512f"}))
_AVX2 = Variant("avx2", frozenset({"avx2", "fma"}))
#: GE's float32 GEMM (ge_native.sgemm); without it the callers' BLAS (NumPy) path runs
register(Family("sgemm", [_AVX512, _AVX2, Variant("numpy")], switch="GE_NATIVE_SGEMM", probe=_isa_probe("sgemm")))
#: convolutions on channel-blocked activations (ge_native.nchwc); without them the plain layout's kernels
register(Family("nchwc", [_AVX512, _AVX2, Variant("scalar")], switch="GE_NATIVE_NCHWC", probe=_isa_probe("nchwc")))
#: split GEMMs on native threads calling single-threaded BLAS (ge_native.gemm), else NumPy's matmul
register(Family("gemm", [Variant("blas"), Variant("numpy")], switch="GE_NATIVE_GEMM", probe=_gemm_probe))
#: bf16 GEMM with float32 sums (ge_native.bf16): AMX tiles, VDPBF16PS, or the scalar form anywhere it builds
register(Family("bf16gemm", [Variant("amx_bf16", frozenset({"amx_bf16", "amx_tile"})),
                             Variant("avx512_bf16", frozenset({"avx512_bf16", "avx512f"})), Variant("scalar")],
                switch="GE_NATIVE_BF16", probe=_isa_probe("bf16")))
#: bf16 attention, both products in bf16 with float32 sums (ge_native.bf16attn): bf16gemm's variants and switch
register(Family("bf16attn", [Variant("amx_bf16", frozenset({"amx_bf16", "amx_tile"})),
                             Variant("avx512_bf16", frozenset({"avx512_bf16", "avx512f"})), Variant("scalar")],
                switch="GE_NATIVE_BF16", probe=_isa_probe("bf16attn")))
#: int8 GEMM and convolution with exact int32 sums (ge_native.int8): AMX tiles, VPDPBUSD, AVX2 widened to int16
register(Family("int8gemm", [Variant("amx_int8", frozenset({"amx_int8", "amx_tile"})),
                             Variant("avx512_vnni", frozenset({"avx512_vnni", "avx512bw", "avx512vl"})),
                             Variant("avx2", frozenset({"avx2"})), Variant("scalar")],
                switch="GE_NATIVE_INT8", probe=_isa_probe("int8")))
#: int8 depthwise convolution over NCHWc (ge_native.int8dw): VPDPBUSD on tap quads, AVX2 widened to int16
register(Family("int8dw", [Variant("avx512_vnni", frozenset({"avx512_vnni", "avx512bw", "avx512vl"})),
                           Variant("avx2", frozenset({"avx2", "fma"})), Variant("scalar")],
                switch="GE_NATIVE_INT8DW", probe=_isa_probe("int8dw")))
#: the native thread pool (pthreads workers), else every parallel loop runs inline on the caller
register(Family("pool", [Variant("pthreads"), Variant("inline")], switch="GE_NATIVE", probe=_pool_probe))
