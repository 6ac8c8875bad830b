"""ge_fusion holds rules and declares the fused ops; their kernels live with the backend (ge_cpu.fused).

The loaded plugin host must show no kernel registered by plugin ge_fusion, every op ge_fusion
declares (domain ge.fused) with a cpu kernel, and that kernel registered by ge_cpu.
"""

from __future__ import annotations

from ge_core.plugins import get_host
from ge_sdk import fused


def _fusion_ops(regs) -> list[tuple[str, str]]:
    return sorted(k for k in regs.ops.keys() if regs.ops.origin(k) == "ge_fusion")


def test_ge_fusion_registers_no_kernel_for_any_backend():
    regs = get_host().registries
    assert "cpu" in regs.kernels, "the cpu backend registered no kernels"
    by_fusion = [(backend, key) for backend, reg in regs.kernels.items() for key in reg.keys()
                 if reg.origin(key) == "ge_fusion"]
    assert by_fusion == [], f"ge_fusion registers kernels: {by_fusion}"


def test_every_fused_op_ge_fusion_declares_has_a_cpu_kernel():
    regs = get_host().registries
    declared = _fusion_ops(regs)
    # the op set ge_fusion declares is the shared vocabulary's
    assert sorted(op for _, op in declared) == sorted(fused.FUSED_OPS)
    assert {d for d, _ in declared} == {fused.DOMAIN}
    cpu = regs.kernels_for("cpu")
    missing = [key for key in declared if cpu.get(key) is None]
    assert missing == [], f"fused ops without a cpu kernel: {missing}"
    assert {cpu.origin(key) for key in declared} == {"ge_cpu"}


def _spec(op_type, inputs, out, attrs=None, consts=None):
    from ge_core.ir.types import TensorType
    from ge_core.kernel import KernelSpec

    return KernelSpec(name=op_type.lower(), op_type=op_type, domain=fused.DOMAIN, attrs=attrs or {},
                      inputs=[TensorType.of(x) for x in inputs], outputs=[TensorType("float32", out)],
                      const_inputs=consts or [None] * len(inputs))


def test_the_fused_kernels_name_the_form_and_variant_they_run():
    """KernelCaps.variant: the form of a generated elementwise kernel (its mode), the ISA variant of
    GE's GEMM for a FusedMatMul on packed panels (ge_native.isa), loop/numpy for the row kernels."""
    import numpy as np

    from ge_core.kernel import caps
    from ge_cpu.fused import kernels, loopgen
    from ge_native import isa, sgemm

    x = np.ones((4, 256), np.float32)
    prog = fused.dumps([("Mul", ["a0", "a1"], {}), ("Relu", ["t0"], {})])
    k = kernels.elemwise_factory(_spec("FusedElemwise", [x, x], x.shape, {"program": prog}))
    assert caps(k).variant == caps(k).mode and caps(k).mode in ("loop", "numexpr", "numpy", "numpy-blocked")
    w = np.ones((256, 64), np.float32)
    m = kernels.matmul_factory(_spec("FusedMatMul", [x, w], (4, 64), consts=[None, w]))
    if sgemm.available():
        assert (caps(m).algorithm, caps(m).variant) == ("sgemm_panels", isa.variant_of("sgemm"))
    else:
        assert caps(m).algorithm in ("packed_blocks", "matmul") and caps(m).variant
    np.testing.assert_array_equal(m(x, w)[0], x @ w)
    s = kernels.softmax_factory(_spec("Softmax", [x], x.shape, {"axis": -1}))
    assert caps(s).variant == ("loop" if loopgen.available() else "numpy")
