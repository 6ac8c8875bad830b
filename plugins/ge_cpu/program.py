"""A :class:`Program`: one graph's kernels bound at build time, its values in numbered slots.

Build time resolves everything a run needs: each node's kernel (from its factory, wrapped by
:func:`~ge_cpu.checked.checked_kernel`), the slot of every input and output, and which slots die
after each step (so intermediate arrays are released as soon as their last reader ran). A
program is data: the executors' strategies (:func:`run_program` here, the arena interpreter, the
sink code generator) read it. A run keeps its values in a local list, so one program serves
many threads at once.

Every node is built before anything is reported: an op without a kernel, or a kernel factory
that refuses the node (a dtype or attribute it does not support), is collected, and the build
ends with ONE :class:`UnsupportedOpError` naming all of them (subgraphs included).

Control flow. Subgraphs (If/Loop/Scan/SequenceMap bodies) are compiled into
:class:`SubProgram` objects the same way. The node's *implicit captures* (values of
enclosing graphs that a body reads) are appended to the node's kernel inputs, after its own
inputs; the factory gets ``spec.options["subgraph"]`` (``graph -> SubProgram``) and
``spec.options["n_captures"]``. ``SubProgram.run(args, captures)`` runs the body with its
formal inputs bound to ``args`` and returns the body's outputs.

Values in slots are NumPy arrays, Python lists of arrays (ONNX sequences) or ``None`` (an
empty optional, or an absent optional input).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from ge_core.errors import ExecutionError, GEError, UnsupportedOpError
from ge_core.ir.graph import Graph, Node, Value, graph_captures
from ge_core.kernel import KernelSpec, check_deadline
from ge_core.kernel import caps as kernel_caps
from ge_core.ops import OpRegistry
from ge_native import native, parallel

from .blas import engine_width
from .checked import checked_kernel
from .kernels import conv
from .values import as_output, describe_value

#: Values of the ``conv_algorithm`` option (the cpu Conv kernel's choice per layer): its preferences,
#: then the conv table's algorithms (one forced: :mod:`.kernels.conv`)
CONV_ALGORITHMS = conv.PREFERENCES + tuple(n for n in conv.names() if n not in conv.PREFERENCES)


def conv_algorithm_option(options: Any) -> str:
    """The ``conv_algorithm`` option, checked (OptionError naming the values)."""
    v = str(options.getoption("conv_algorithm", "auto") or "auto").lower()
    if v not in CONV_ALGORITHMS:
        from ge_core.errors import OptionError

        raise OptionError(f"conv_algorithm '{v}' is not one of {', '.join(CONV_ALGORITHMS)}")
    return v


class Step:
    """One node of a program: its kernel, the slots it reads and writes, the slots that die after it."""

    __slots__ = ("fn", "ins", "outs", "free", "node", "origin")

    def __init__(self, fn, ins, outs, free, node, origin=None):
        self.fn, self.ins, self.outs, self.free, self.node = fn, ins, outs, free, node
        self.origin = origin

    def who(self) -> str:
        """The node, and the plugin whose kernel runs it (for error messages)."""
        return self.node.describe() + (f" [kernel of plugin '{self.origin}']" if self.origin else "")


class Program:
    """The prepared steps of one graph (the main graph or a subgraph body)."""

    def __init__(self, graph: Graph, kernels, options, extern: Sequence[Value] = (),
                 ops: OpRegistry | None = None) -> None:
        self.graph = graph
        #: the op registry of the host the backend builds for (its BuildContext's); None: see op_registry
        self.ops = ops
        slot: dict[Any, int] = {}

        def slot_of(v) -> int:
            if v not in slot:
                slot[v] = len(slot)
            return slot[v]

        self.input_slots = [(v.name, slot_of(v)) for v in graph.inputs]
        self.extern_slots = [slot_of(v) for v in extern]
        # Constants go in as they are: a folded one may be a zero-stride broadcast view (one value);
        # kernels that feed weights to BLAS (Conv, Gemm, fused MatMul) pack them at build time.
        self.const_slots = [(slot_of(v), v.const_value) for v in graph.constants.values()]
        problems: list[str] = []
        missing: list[Node] = []
        steps: list[Step] = []
        last_use: dict[int, int] = {}
        width = engine_width(options)
        conv_algorithm = conv_algorithm_option(options)
        before = native.stats()
        if width > 1:
            parallel.prepare_native()  # the split-GEMM driver is built now, not on the first run
        for node in graph.node_list():
            f = kernels.get((OpRegistry.norm_domain(node.domain), node.op_type))
            if f is None:
                missing.append(node)
                continue
            caps: list[Value] = []
            extra: dict[str, Any] = {}
            subs = node.subgraphs()
            if subs:
                seen: dict[Value, None] = {}
                for g in subs:
                    for v in graph_captures(g):
                        seen.setdefault(v, None)
                caps = list(seen)
                extra = {"subgraph": SubBuilder(kernels, options, caps), "n_captures": len(caps)}
            spec = KernelSpec.from_node(node, options, parallel_width=width, conv_algorithm=conv_algorithm, **extra)
            origin = kernels.origin((OpRegistry.norm_domain(node.domain), node.op_type)) if hasattr(kernels, "origin") else None
            try:
                fn = f(spec)
            except GEError as e:
                problems.append(getattr(e, "detail", str(e)))
                continue
            except Exception as e:  # noqa: BLE001 - a factory bug names the node
                problems.append(f"building the kernel of {Step(None, (), (), (), node, origin).who()} failed: "
                                f"{type(e).__name__}: {e}")
                continue
            if not callable(fn):
                problems.append(f"the kernel factory of {Step(None, (), (), (), node, origin).who()} returned "
                                f"{type(fn).__name__}, not a callable")
                continue
            ins = tuple(-1 if v is None else slot_of(v) for v in node.inputs) + tuple(slot_of(v) for v in caps)
            outs = tuple(slot_of(v) for v in node.outputs)
            i = len(steps)
            for s in ins:
                if s >= 0:
                    last_use[s] = i
            st = Step(fn, ins, outs, (), node, origin)
            st.fn = checked_kernel(fn, node, st.who)  # results are checked against the node's types
            steps.append(st)
        if missing:
            by: dict[tuple[str, str], list[str]] = {}
            for n in missing:
                by.setdefault((n.domain or "ai.onnx", n.op_type), []).append(n.name)
            for (d, op), names in sorted(by.items()):
                shown = ", ".join(f"'{x}'" for x in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                problems.insert(0, f"no kernel for {op} (domain {d}) at node(s) {shown}")
        if problems:
            where = "" if graph.parent is None else f" in subgraph '{graph.name}'"
            raise UnsupportedOpError(
                f"the cpu backend cannot run {len(problems)} node(s){where}: " + "; ".join(problems),
                hint="install a plugin that registers these kernels (ge_register_kernels), change the model, "
                     "or choose another soc_version",
            )
        outputs = {slot_of(v) for v in graph.outputs}
        keep = {s for s, _ in self.const_slots} | {s for _, s in self.input_slots} | set(self.extern_slots)
        frees: dict[int, list[int]] = {}
        for s, i in last_use.items():
            if s not in outputs and s not in keep:
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
        #: output name -> (slot, declared type): IO binding reads it every run
        self.output_index = {v.name: (s, v.type) for v, s in zip(graph.outputs, self.output_slots)}
        self.kernel_count = len(steps)
        modes = collections.Counter(m for st in steps for m in [kernel_caps(st.fn).mode] if m)
        self.kernel_modes = dict(sorted(modes.items()))
        #: the algorithm and instruction-set variant of every node whose kernel names one
        self.node_kernels = {st.node.name: {"op": st.node.op_type, "algorithm": c.algorithm, "variant": c.variant}
                             for st in steps for c in [kernel_caps(st.fn)] if c.algorithm or c.variant}
        after = native.stats()
        #: the native kernel modules this build needed: compiled now, or loaded from the cache
        self.native_kernels = {"compiled": int(after["compiled"] - before["compiled"]),
                               "from_cache": int(after["cached"] - before["cached"]),
                               "compile_seconds": round(after["compile_s"] - before["compile_s"], 4)}

    def execute(self, env: list[Any]) -> list[Any]:
        """The plain interpreter: the steps in order on ``env`` (the run's values, inputs bound),
        each dead value released at once; the outputs."""
        for s, a in self.const_slots:
            env[s] = a
        for st in self.steps:
            res = call_step(st, [env[i] if i >= 0 else None for i in st.ins])
            for s, r in zip(st.outs, res):
                env[s] = r
            for s in st.free:
                env[s] = None
        return [as_output(env[s]) for s in self.output_slots]

    def start(self, feeds) -> list[Any]:
        """A run's values before its first step: the feeds in their slots, every other slot empty."""
        env: list[Any] = [None] * self.n_slots
        for name, s in self.input_slots:
            env[s] = feeds[name]
        return env


def call_step(st: Step, args: list[Any], out: tuple | None = None) -> Sequence[Any]:
    """Run one step's kernel; a failure, or results that are not what the node declares (see
    :func:`checked_kernel`), names the node and plugin."""
    check_deadline(st.node.name)  # run(timeout=): cancelled between nodes
    try:
        return st.fn(*args) if out is None else st.fn(*args, out=out)
    except GEError:
        raise
    except Exception as e:
        shapes = ", ".join(describe_value(a) for a in args)
        raise ExecutionError(
            f"{st.who()} failed on inputs ({shapes}): {type(e).__name__}: {e}",
            hint="check the input shapes against the model, or report the kernel bug",
        ) from e


def op_registry(program: Program) -> OpRegistry:
    """The op registry ``program`` was built with (the cpu backend passes its BuildContext's down);
    an executable constructed directly, without one, reads the process's host's."""
    if program.ops is not None:
        return program.ops
    from ge_core.plugins import get_host

    return get_host().registries.ops


class SubProgram:
    """A compiled subgraph body: ``run(args, captures) -> outputs``."""

    def __init__(self, graph: Graph, kernels, options, captures: Sequence[Value]) -> None:
        own = graph_captures(graph)
        pos = {v: i for i, v in enumerate(captures)}
        self._take = [pos[v] for v in own]
        self.program = Program(graph, kernels, options, extern=own)
        self.graph = graph
        self.n_inputs = len(graph.inputs)
        self.n_outputs = len(graph.outputs)
        self.input_types = [v.type for v in graph.inputs]

    def run(self, args: Sequence[Any], captures: Sequence[Any] = ()) -> list[Any]:
        p = self.program
        env: list[Any] = [None] * p.n_slots
        for (_, s), a in zip(p.input_slots, args):
            env[s] = a
        for s, k in zip(p.extern_slots, self._take):
            env[s] = captures[k]
        return p.execute(env)


class SubBuilder:
    """``spec.options["subgraph"]``: compiles a body of the node being built."""

    def __init__(self, kernels, options, captures: Sequence[Value]) -> None:
        self.kernels, self.options, self.captures = kernels, options, list(captures)

    def __call__(self, graph: Graph) -> SubProgram:
        return SubProgram(graph, self.kernels, self.options, self.captures)


class PlainInterpreter:
    """The sequential strategy: a program's steps in order on the calling thread, no arena."""

    def __init__(self, program: Program) -> None:
        self.program = program

    def execute(self, ctx: Any, feeds: Any) -> list[Any]:
        p = self.program
        return p.execute(p.start(feeds))
