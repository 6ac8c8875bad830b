"""Hook implementations of the ``ge_cpu`` plugin: the cpu backend, its kernels, ``ge ops``."""

from __future__ import annotations

import functools
import json
import sys

from ge_core.errors import UnsupportedOpError
from ge_core.hookspecs import (
    RegisterBackend,
    RegisterCliCommand,
    RegisterKernel,
    RegisterOp,
    RegisterOption,
    RegisterPass,
    hookimpl,
)
from ge_core.kernel import caps, with_caps

#: ``caps(factory).kind`` values.
NATIVE, REFERENCE = "native", "onnx.reference"


def _native_first(factory, reference):
    """A native factory that hands a node it refuses (an attribute or dtype it does not
    support) to the onnx.reference fallback; the native error stands if that fails too."""

    @functools.wraps(factory)
    def build(spec):
        try:
            return factory(spec)
        except UnsupportedOpError as native:
            if spec.options.get("subgraph") is not None:
                raise
            try:
                kernel = reference(spec)
            except Exception:  # noqa: BLE001 - report the native refusal, it is the clearer one
                raise native from None
            return with_caps(kernel, kind=REFERENCE)

    return with_caps(build, kind=NATIVE)


@hookimpl
def ge_register_backends(register: RegisterBackend) -> None:
    from .executor import CpuBackend

    register(CpuBackend())


@hookimpl
def ge_register_ops(register: RegisterOp) -> None:
    """The blocked-layout ops (domain ge.cpu) the nchwc_layout pass makes, and PackedMatMul
    (the reduced_precision pass's)."""
    from .blocked import OPDEFS
    from .lower import LOWERINGS  # (their standard ONNX forms, for ge export)
    from .reduced import OPDEFS as REDUCED_OPS

    for d in (*OPDEFS, *REDUCED_OPS):
        d.lower = d.lower or LOWERINGS.get(d.op_type)
        register(d)


@hookimpl
def ge_register_passes(register: RegisterPass) -> None:
    """nchwc_layout (stage "fuse"): runs of convolutions in the blocked layout; reduced_precision
    (stage "schedule"): the matrix ops a precision mode reduces, packed in bf16/fp16; int8_kernels
    (stage "schedule"): a quantised model's int8 matrix ops on the integer units;
    pack_float32_weights (stage "schedule"): large float32 matrix weights stored packed (one copy)."""
    from .blocked import NchwcLayout
    from .int8 import Int8Kernels
    from .packed import PackFloat32
    from .reduced import ReducedPrecision

    register(NchwcLayout())
    register(ReducedPrecision())
    register(Int8Kernels())
    register(PackFloat32())


@hookimpl
def ge_register_kernels(register: RegisterKernel) -> None:
    from .kernels import KERNELS
    from .kernels.reference_fallback import fallback_ops, reference_factory

    for (domain, op_type), factory in KERNELS.items():
        register(op_type, _native_first(factory, reference_factory), domain=domain, backend="cpu")
    from .contrib import KERNELS as CONTRIB  # ge_llm's contrib ops (com.microsoft)
    from .int8 import KERNELS as INT8  # FakeQuant (ge_quant's)
    from .kernels.nchwc import KERNELS as BLOCKED  # the blocked-layout ops of the nchwc_layout pass
    from .reduced import KERNELS as REDUCED  # PackedMatMul

    for (domain, op_type), factory in (*BLOCKED.items(), *REDUCED.items(), *INT8.items(), *CONTRIB.items()):
        register(op_type, with_caps(factory, kind=NATIVE), domain=domain, backend="cpu")
    # The long tail of ONNX (default, ai.onnx.ml, training and preview domains) runs through
    # onnx.reference behind the same interface.
    for domain, op_type in fallback_ops():
        register(op_type, _reference_kind(reference_factory), domain=domain, backend="cpu")
    # the fused ops (declared by ge_fusion, domain ge.fused): their kernels and code generation
    from ge_sdk.fused import DOMAIN as FUSED

    from .fused.kernels import KERNELS as FUSED_KERNELS

    for op_type, factory in FUSED_KERNELS.items():
        register(op_type, factory, domain=FUSED, backend="cpu")


def _reference_kind(reference):
    @functools.wraps(reference)
    def build(spec):
        return reference(spec)

    return with_caps(build, kind=REFERENCE)


# ------------------------------------------------------------------------------------------
# ge ops
# ------------------------------------------------------------------------------------------
def op_table(backend: str = "cpu") -> list[dict]:
    """Every registered op with the kind of kernel ``backend`` has for it."""
    from ge_core.plugins import get_host

    regs = get_host().registries
    kernels = regs.kernels_for(backend)
    rows = []
    keys = {tuple(k) for k in regs.ops.keys()} | {tuple(k) for k in kernels.keys()}
    for domain, op_type in sorted(keys):
        f = kernels.get((domain, op_type))
        kind = "none" if f is None else caps(f).kind or "plugin"
        opdef = regs.ops.get((domain, op_type))
        rows.append({
            "op": op_type,
            "domain": domain or "ai.onnx",
            "kernel": kind,
            "kernel_plugin": kernels.origin((domain, op_type)) if f is not None else None,
            "since_version": getattr(opdef, "since_version", None),
        })
    return rows


def _configure_ops(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--backend", default="cpu", help="backend whose kernels to list (default cpu)")
    parser.add_argument("--kind", choices=("native", "onnx.reference", "none", "plugin"),
                        help="only ops with this kernel kind")


def _run_ops(args) -> int:
    rows = op_table(args.backend)
    if args.kind:
        rows = [r for r in rows if r["kernel"] == args.kind]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["kernel"]] = counts.get(r["kernel"], 0) + 1
    if args.json:
        json.dump({"backend": args.backend, "counts": counts, "ops": rows}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    width = max((len(r["op"]) for r in rows), default=2)
    for r in rows:
        print(f"{r['domain']:<26} {r['op']:<{width}}  {r['kernel']}")
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0


@hookimpl
def ge_register_cli_commands(register: RegisterCliCommand) -> None:
    register("ops", "list every op and its kernel kind (native, onnx.reference fallback, none)",
             _configure_ops, _run_ops)
    from . import profile

    register("profile", "run an .om and print time per op and stream; write a Chrome/Perfetto trace",
             profile.configure, profile.run)


@hookimpl
def ge_register_options(register: RegisterOption) -> None:
    register("executor", "auto", "cpu executor: auto (streams when the schedule has several, else sink), "
                                 "sink (one generated function), arena, streams or sequential")
    from .kernels import conv

    # the conv table's algorithms (ge_cpu.kernels.conv.ALGORITHMS), as program.CONV_ALGORITHMS accepts them
    table = ", ".join(n for n in conv.names() if n not in conv.PREFERENCES)
    register("conv_algorithm", "auto", "cpu Conv of a 3x3, stride-1, ungrouped layer with constant weights: "
                                       "auto (Winograd F(2x2,3x3) where the channels and tiles make it pay, "
                                       "else the direct blocked kernel or im2col + GEMM), winograd (F(2x2,3x3) "
                                       "wherever it applies), winograd4 (blocked layers: F(4x4,3x3) on planes "
                                       "of 20x20 and more, 4x fewer multiplies at 2-3x the rounding error) "
                                       "or im2col (no Winograd); or one algorithm of the conv table, forced "
                                       f"on every Conv (an error names a layer it does not apply to): {table}")
    register("native_kernels", "build", "build: compile the native kernels a model needs (kept in the user's "
                                        "kernel cache); probe: compile nothing, report which are cached")
    from .blas import DEFAULT_PARALLEL

    register("parallel", DEFAULT_PARALLEL, "who splits a run's work over its `threads`: engine (GE's thread "
                                           "pool: GEMMs in packed weight blocks, attention heads, large fused "
                                           "loops; BLAS at one thread; robust beside other load) or blas "
                                           "(BLAS's own threads)")
