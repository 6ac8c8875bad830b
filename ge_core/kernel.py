"""The kernel interface shared by backends and by plugins that add ops.

A *kernel factory* is registered per (backend, domain, op type) through ``ge_register_kernels``.
At build time it receives a :class:`KernelSpec` describing one node (attributes already
resolved, input/output types, constant inputs) and returns a callable that runs the node:
``kernel(*inputs) -> sequence of arrays`` (one per output). All attribute parsing and
specialisation happen in the factory, so the returned callable does only the arithmetic.

Capabilities. What an executor may do with a kernel is its :class:`KernelCaps`, declared by the
factory with :func:`with_caps` and read with :func:`caps` (one attribute, ``kernel.caps``, that
wrappers copy as a whole). A kernel with ``accepts_out`` writes into memory the executor planned:
the executor may call ``kernel(*inputs, out=(a0, a1, ...))`` with one C-contiguous array per
output (exact dtype and shape), and the kernel writes its results there and returns those same
arrays. ``inplace_ok`` additionally allows an ``out`` array to be the memory of an input that
dies at this node (elementwise ops). Kernels without them return fresh arrays (or views of their
inputs), which the executor copies into its plan where it needs to. Kernels never write into
their inputs otherwise. (The attributes ``kernel.accepts_out`` / ``inplace_ok`` / ``mode`` /
``kernel_kind`` of plugins written before KernelCaps are still read.)

IO binding. ``model.run(feeds, outputs={name: array})`` passes caller arrays as ``out``; one
may be a feed's memory (a KV cache): docs/plugin-guide.md ("IO binding") has the contract.

Run limits. ``model.run(feeds, timeout=s)`` sets a per-run deadline; executors call
:func:`check_deadline` between nodes and kernels that loop (Loop, Scan) call it every iteration,
so a runaway model ends with an :class:`ExecutionError` naming the node. Loop kernels also hold
their iteration count to :func:`max_loop_iterations` (``GE_MAX_LOOP_ITERATIONS``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ExecutionError, OptionError, RunCancelledError
from .ir.types import TensorType

Kernel = Callable[..., Sequence[np.ndarray]]


@dataclass(frozen=True)
class KernelCaps:
    """What an executor may do with a kernel (or, for ``kind``, what a factory builds)."""

    #: takes preallocated outputs through ``out=`` (see the module docstring)
    accepts_out: bool = False
    #: an ``out`` array may be the memory of an input that dies at the node
    inplace_ok: bool = False
    #: how it computes, for the report's ``kernel_modes`` ("loop", "numpy", "numexpr"...)
    mode: str = ""
    #: the kind of kernel: "native", "onnx.reference" (a fallback), or "" (a plugin's own)
    kind: str = ""
    #: epilogue steps the kernel can apply at its store when called with them as keywords
    #: (``"addend"``: ``addend=array`` of the output's shape, added first; ``"clip"``:
    #: ``clip=(lo, hi)``; ``"act"``: ``act=name``, an activation the kernel names); so called it
    #: returns ``(outputs, applied)``, ``applied`` False when it left them all to the caller
    epilogue: tuple[str, ...] = ()
    #: the algorithm the factory chose for this node ("winograd", "nchwc", "im2col"...), for the
    #: report's ``node_kernels``; "" when the op has one way
    algorithm: str = ""
    #: the instruction-set variant of the native code it runs ("avx512f", "amx_bf16", "scalar"...,
    #: a name of :mod:`ge_native.isa`), for the report's ``node_kernels``; "" when none
    variant: str = ""


def caps(kernel: Any) -> KernelCaps:
    """The capabilities of a kernel or factory (none declared: all off)."""
    c = getattr(kernel, "caps", None)
    if isinstance(c, KernelCaps):
        return c
    if kernel is None:
        return KernelCaps()
    return KernelCaps(bool(getattr(kernel, "accepts_out", False)), bool(getattr(kernel, "inplace_ok", False)),
                      str(getattr(kernel, "mode", "") or ""), str(getattr(kernel, "kernel_kind", "") or ""))


def with_caps(kernel: Any, **changes: Any) -> Any:
    """``kernel`` with its capabilities changed as given (``with_caps(k, accepts_out=True)``); returns it."""
    kernel.caps = dataclasses.replace(caps(kernel), **changes)
    return kernel


def copy_caps(wrapper: Any, kernel: Any) -> Any:
    """``wrapper`` (a function wrapping ``kernel``) with the capabilities of ``kernel``; returns it."""
    wrapper.caps = caps(kernel)
    return wrapper


def accepts_out(kernel: Kernel) -> bool:
    """True if ``kernel`` takes preallocated outputs through ``out=``."""
    return caps(kernel).accepts_out
KernelFactory = Callable[["KernelSpec"], Kernel]


@dataclass
class KernelSpec:
    """Everything a kernel factory may know about the node it builds for."""

    name: str
    op_type: str
    domain: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    #: Type of each input; None where an optional input is absent.
    inputs: list[TensorType | None] = field(default_factory=list)
    outputs: list[TensorType] = field(default_factory=list)
    #: Value of each input that is a constant at build time (e.g. Reshape's shape), else None.
    const_inputs: list[np.ndarray | None] = field(default_factory=list)
    #: Opset version of the node's domain in the model.
    opset: int = 0
    #: Backend options (threads etc.).
    options: dict[str, Any] = field(default_factory=dict)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def describe(self) -> str:
        dom = f"{self.domain}::" if self.domain else ""
        return f"node '{self.name}' ({dom}{self.op_type})"

    @classmethod
    def from_node(cls, node, options=None, **backend_options: Any) -> KernelSpec:
        """Describe a graph node for a kernel factory (used by backends and folding passes)."""
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        root = node.graph
        while root is not None and root.parent is not None:
            root = root.parent
        imports = root.opset_imports if root is not None else {}
        opts: dict[str, Any] = {"threads": None if options is None else options.getoption("threads")}
        opts.update(backend_options)
        return cls(name=node.name, op_type=node.op_type, domain=dom, attrs=dict(node.attrs),
                   inputs=[None if v is None else v.type for v in node.inputs], outputs=[v.type for v in node.outputs],
                   const_inputs=[None if v is None else v.const_value for v in node.inputs],
                   opset=imports.get(dom, imports.get(node.domain, 0)), options=opts)


# ------------------------------------------------------------------------------------------
# run limits: a per-run deadline and the largest number of loop iterations
# ------------------------------------------------------------------------------------------
#: Environment variable: the most iterations one Loop node may run in one inference (0: no limit).
MAX_LOOP_ITERATIONS_ENV = "GE_MAX_LOOP_ITERATIONS"
#: Its default: more than a real model's loop runs per inference (a decoder's steps, a sequence's
#: positions), few enough that a runaway loop with a trivial body ends within a second or two
#: (an iteration costs about 10 us in Python: 100,000 of them take about a second).
DEFAULT_MAX_LOOP_ITERATIONS = 100_000


@dataclass(frozen=True)
class _Deadline:
    at: float  # time.monotonic() after which the run is cancelled
    seconds: float


_deadline: ContextVar[_Deadline | None] = ContextVar("ge_run_deadline", default=None)


@contextlib.contextmanager
def run_deadline(seconds: float | None) -> Iterator[None]:
    """Cancel the run inside this block after ``seconds`` (None: no deadline).

    :meth:`ge_core.CompiledModel.run` enters it for ``run(feeds, timeout=...)``. The deadline is a
    context variable: a worker thread sees it when it runs in a copy of the caller's context
    (``contextvars.copy_context().run``).
    """
    if seconds is None:
        yield
        return
    token = _deadline.set(_Deadline(time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def check_deadline(node_name: str) -> None:
    """Raise :class:`RunCancelledError` (an ExecutionError) naming ``node_name`` if the current
    run is past its deadline.

    Cheap enough to call between nodes and in every iteration of a loop kernel; a no-op outside
    a run with a timeout. A loop kernel that catches it from its body re-raises
    ``e.inside(loop node name, iteration)``, so the message leads from the loop to the node.
    """
    d = _deadline.get()
    if d is not None and time.monotonic() > d.at:
        raise RunCancelledError(f"node '{node_name}': the run was cancelled after its timeout of {d.seconds:g} s",
                                hint="give run(..., timeout=) more seconds, or check the model's loop trip counts "
                                     "and inputs")


def max_loop_iterations() -> int | None:
    """The most iterations one Loop may run (``GE_MAX_LOOP_ITERATIONS``; None: unlimited)."""
    raw = os.environ.get(MAX_LOOP_ITERATIONS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_LOOP_ITERATIONS
    try:
        n = int(raw)
    except ValueError:
        raise OptionError(f"{MAX_LOOP_ITERATIONS_ENV}={raw!r} is not an integer",
                          hint="set it to a number of iterations, or 0 for no limit") from None
    return None if n <= 0 else n


def check_loop_iterations(node_name: str, done: int, limit: int | None) -> None:
    """Raise :class:`ExecutionError` naming the loop node once ``done`` iterations reach ``limit``."""
    if limit is not None and done >= limit:
        default = " (the default)" if limit == DEFAULT_MAX_LOOP_ITERATIONS else ""
        raise ExecutionError(
            f"node '{node_name}': the loop ran {done} iterations, the limit (environment variable "
            f"{MAX_LOOP_ITERATIONS_ENV}) is {limit}{default}",
            hint=f"check the loop's trip count and condition inputs, or raise the limit: set the environment "
                 f"variable {MAX_LOOP_ITERATIONS_ENV} to more iterations (e.g. {MAX_LOOP_ITERATIONS_ENV}="
                 f"{limit * 10}), or to 0 for no limit",
        )
