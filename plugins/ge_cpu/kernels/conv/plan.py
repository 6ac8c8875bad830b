"""A convolution's plan: its geometry, constant weight and bias, static input shape, dtype and the
``conv_algorithm`` option, parsed once from the node's :class:`~ge_core.kernel.KernelSpec`; the
algorithms (:mod:`.`) ask it whether they apply and keep their build-time state in it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ge_core.ir.symbolic import SymExpr
from ge_core.kernel import KernelSpec

from .. import _util as util
from .geometry import PlanCache, auto_pad_of, plan_2d, spatial_rank, window_plan

#: values of the ``conv_algorithm`` option that state a preference, not one algorithm: ``auto``,
#: ``im2col`` (no Winograd), ``winograd`` (Winograd wherever it applies, else the rest as auto),
#: ``winograd4`` (the blocked layout's F(4x4, 3x3) where it pays)
PREFERENCES = ("auto", "im2col", "winograd", "winograd4")


class ConvPlan:
    """What a Conv's kernel is built from, parsed once (raises UnsupportedOpError naming the node
    for a geometry the kernels do not take).

    ``prepared`` holds each algorithm's build-time state by name (a prepared call, a packed
    weight; None when it has none)."""

    def __init__(self, spec: KernelSpec, layout: bool = False) -> None:
        self.spec = spec
        #: asked by the ``nchwc_layout`` pass (may the node leave NCHW?), not by a kernel's build
        self.layout = layout
        self.auto_pad = auto_pad_of(spec)
        self.group = int(spec.attr("group", 1))
        kernel_shape = util.ints(spec.attr("kernel_shape"))
        nd = spatial_rank(spec, kernel_shape, 0, 1)
        if nd is None:
            raise util.unsupported(spec, "unknown spatial rank (no kernel_shape and untyped weights)")
        self.nd: int = nd
        self.kernel_shape = kernel_shape
        self.strides: list[int] = util.ints(spec.attr("strides")) or [1] * nd
        self.dilations: list[int] = util.ints(spec.attr("dilations")) or [1] * nd
        self.pads: list[int] = util.ints(spec.attr("pads")) or [0] * (2 * nd)
        if len(self.strides) != nd or len(self.dilations) != nd or len(self.pads) != 2 * nd:
            raise util.unsupported(spec, "strides/dilations/pads whose length does not match the kernel rank")
        if any(p < 0 for p in self.pads):
            raise util.unsupported(spec, "negative pads")
        self.w_const: np.ndarray | None = util.const_input(spec, 1)
        self.has_bias = util.has_input(spec, 2)
        self.b_const: np.ndarray | None = util.const_input(spec, 2) if self.has_bias else None
        self.option = str(spec.options.get("conv_algorithm", "auto") or "auto")
        x = spec.inputs[0] if spec.inputs else None
        self.x_shape: tuple = tuple(x.shape) if x is not None and x.shape else ()
        self.dtype: np.dtype | None = util.in_dtype(spec, 0)
        self.plans = PlanCache(lambda key: window_plan(self.auto_pad, self.pads, key[0], key[1], self.strides,
                                                       self.dilations))
        self.window_plans = PlanCache(self._window_plan)
        self.prepared: dict[str, Any] = {}
        self._packed_w: np.ndarray | None = None

    def _window_plan(self, key):
        pb, _, out_sp, _ = self.plans(key)
        return plan_2d(key[0], key[1], self.strides, self.dilations, pb, out_sp)

    # -- what the algorithms ask --------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.describe()

    @property
    def forced(self) -> str | None:
        """The algorithm the ``conv_algorithm`` option names, None for a preference (:data:`PREFERENCES`)."""
        return None if self.option in PREFERENCES else self.option

    @property
    def static_x(self) -> bool:
        """A static 4-D input shape (every extent a positive int)."""
        return len(self.x_shape) == 4 and all(isinstance(v, int) and v > 0 for v in self.x_shape)

    @property
    def batch_free_x(self) -> bool:
        """A 4-D input shape static but for its batch, which may be a symbol (a dynamic-batch
        export): a call prepared per image runs any batch the same (:meth:`batch_shape`)."""
        xs = self.x_shape
        return len(xs) == 4 and all(isinstance(v, int) and v > 0 for v in xs[1:]) \
            and (isinstance(xs[0], (str, SymExpr)) or (isinstance(xs[0], int) and xs[0] > 0))

    @staticmethod
    def batch_shape(shape: tuple, x: np.ndarray) -> tuple:
        """A prepared shape at a call's batch (``x``'s) where the prepared one's is a symbol."""
        return shape if isinstance(shape[0], int) else (int(x.shape[0]), *shape[1:])

    @property
    def bias_static(self) -> bool:
        """The bias is a constant, or there is none."""
        return self.b_const is not None or not self.has_bias

    @property
    def weight_shape(self) -> tuple | None:
        if self.w_const is not None:
            return tuple(self.w_const.shape)
        w = self.spec.inputs[1] if len(self.spec.inputs) > 1 else None
        return tuple(w.shape) if w is not None and w.shape is not None else None

    @property
    def kernel(self) -> tuple | None:
        """The kernel's spatial shape (the attribute's, else the weight's), None when unknown."""
        if self.kernel_shape:
            return tuple(self.kernel_shape)
        ws = self.weight_shape
        return tuple(ws[2:]) if ws is not None and len(ws) == self.nd + 2 else None

    @property
    def depthwise(self) -> bool:
        """One input channel a group, as the weight (and the input's channels, where known) say."""
        ws = self.weight_shape
        if self.group <= 1 or ws is None or len(ws) < 2 or ws[1] != 1:
            return False
        c = self.x_shape[1] if len(self.x_shape) > 1 else None
        return not isinstance(c, int) or c == self.group

    @property
    def pointwise(self) -> bool:
        """A 1x1 kernel with no padding (the plain GEMM on the strided input)."""
        k = self.kernel
        if k is None or any(ki != 1 for ki in k):
            return False
        return self.auto_pad != "NOTSET" or not any(self.pads)

    @property
    def packed_w(self) -> np.ndarray | None:
        """The constant weight as ``(group, M/group, C/group * taps)`` (made once, when first read)."""
        if self._packed_w is None and self.w_const is not None:
            self._packed_w = np.ascontiguousarray(self.pack(self.w_const))
        return self._packed_w

    def pack(self, w: np.ndarray) -> np.ndarray:
        return w.reshape(self.group, w.shape[0] // self.group, -1)

    def weight(self, w: np.ndarray) -> np.ndarray:
        """The packed form of the weight a call passes (the constant's, made once)."""
        return self.packed_w if self.w_const is not None else self.pack(w)  # type: ignore[return-value]

    def takes_prepared(self, prepared: Any, x: np.ndarray, w: np.ndarray) -> bool:
        """Whether a call's operands are the ones a prepared call (``(input shape, ...)``, made
        from the constant weight) was made for: that weight, that float32 C-order input."""
        return (prepared is not None and w is self.w_const and x.shape == self.batch_shape(prepared[0], x)
                and x.dtype == np.float32 and x.flags.c_contiguous)

    def state(self, name: str, prepare: Callable[[ConvPlan], Any]) -> Any:
        """``prepare(self)``, once: the build-time state of algorithm ``name`` (None: none)."""
        if name not in self.prepared:
            self.prepared[name] = prepare(self)
        return self.prepared[name]
