"""The sequential NumPy executor: kernels bound at build time, values held in numbered slots.

Build time resolves everything a run needs: each node's kernel (from its factory), the slot
of every input and output, and which slots die after each step (so intermediate arrays are
released as soon as their last reader ran). A run is then a tight loop over prepared steps.
A run keeps its values in a local list, so one executable serves many threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ge_core.backend import Backend, Executable
from ge_core.errors import ExecutionError, GEError, UnsupportedOpError
from ge_core.ir.graph import Graph, Node
from ge_core.kernel import KernelSpec
from ge_core.ops import OpRegistry


class _Step:
    __slots__ = ("fn", "ins", "outs", "free", "node")

    def __init__(self, fn, ins, outs, free, node):
        self.fn, self.ins, self.outs, self.free, self.node = fn, ins, outs, free, node


class SequentialExecutable(Executable):
    """Runs a graph's nodes in order on the calling thread."""

    def __init__(self, graph: Graph, kernels, options) -> None:
        self.graph = graph
        slot: dict[Any, int] = {}

        def slot_of(v) -> int:
            if v not in slot:
                slot[v] = len(slot)
            return slot[v]

        self.input_slots = [(v.name, slot_of(v)) for v in graph.inputs]
        self.const_slots = [(slot_of(v), v.const_value) for v in graph.constants.values()]
        missing: list[Node] = []
        steps: list[_Step] = []
        nodes = graph.node_list()
        factories = []
        for node in nodes:
            f = kernels.get((OpRegistry.norm_domain(node.domain), node.op_type))
            if f is None:
                missing.append(node)
            factories.append(f)
        if missing:
            by = sorted({(n.domain or "ai.onnx", n.op_type) for n in missing})
            names = ", ".join(f"'{n.name}'" for n in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise UnsupportedOpError(
                f"the cpu backend has no kernel for {', '.join(f'{op} (domain {d})' for d, op in by)} at node(s) {names}",
                hint="install a plugin that registers these kernels (ge_register_kernels) or choose another soc_version",
            )
        last_use: dict[int, int] = {}
        outputs = {slot_of(v) for v in graph.outputs}
        for i, node in enumerate(nodes):
            spec = KernelSpec.from_node(node, options)
            try:
                fn = factories[i](spec)
            except GEError:
                raise
            except Exception as e:
                raise UnsupportedOpError(f"building the kernel of {node.describe()} failed: {type(e).__name__}: {e}") from e
            ins = tuple(-1 if v is None else slot_of(v) for v in node.inputs)
            outs = tuple(slot_of(v) for v in node.outputs)
            for s in ins:
                if s >= 0:
                    last_use[s] = i
            steps.append(_Step(fn, ins, outs, (), node))
        const = {s for s, _ in self.const_slots} | {s for _, s in self.input_slots}
        frees: dict[int, list[int]] = {}
        for s, i in last_use.items():
            if s not in outputs and s not in const:
                frees.setdefault(i, []).append(s)
        # outputs nobody reads are freed right after they are produced
        for i, st in enumerate(steps):
            for s in st.outs:
                if s not in last_use and s not in outputs:
                    frees.setdefault(i, []).append(s)
        for i, st in enumerate(steps):
            st.free = tuple(frees.get(i, ()))
        self.steps = steps
        self.n_slots = len(slot)
        self.output_slots = [slot_of(v) for v in graph.outputs]
        self.output_types = [v.type for v in graph.outputs]
        self.kernel_count = len(steps)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        env: list[Any] = [None] * self.n_slots
        for s, a in self.const_slots:
            env[s] = a
        for name, s in self.input_slots:
            env[s] = feeds[name]
        for st in self.steps:
            try:
                res = st.fn(*[env[i] if i >= 0 else None for i in st.ins])
            except GEError:
                raise
            except Exception as e:
                shapes = ", ".join("None" if i < 0 else f"{getattr(env[i], 'dtype', '?')}{list(getattr(env[i], 'shape', ()))}" for i in st.ins)
                raise ExecutionError(
                    f"{st.node.describe()} failed on inputs ({shapes}): {type(e).__name__}: {e}",
                    hint="check the input shapes against the model, or report the kernel bug",
                ) from e
            if len(res) < len(st.outs):
                raise ExecutionError(f"kernel of {st.node.describe()} returned {len(res)} outputs, expected {len(st.outs)}")
            for s, r in zip(st.outs, res):
                env[s] = r
            for s in st.free:
                env[s] = None
        return [np.asarray(env[s]) for s in self.output_slots]


class CpuBackend(Backend):
    """The default backend: NumPy kernels run in schedule order."""

    name = "cpu"
    aliases = ("numpy", "host", "x86", "aarch64", "Ascend310", "Ascend910", "Ascend310P3")

    _blas_lock = threading.Lock()

    def build(self, model, kernels, options) -> Executable:
        if getattr(options, "threads", None):
            _set_blas_threads(options.threads)
        return SequentialExecutable(model.graph, kernels, options)


def _set_blas_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")
    except Exception:  # threadpoolctl missing or no BLAS found: keep the default pool
        pass
