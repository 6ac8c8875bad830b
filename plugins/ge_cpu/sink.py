"""Model sinking: the whole schedule turned into one generated Python function at build time.

Instead of interpreting a list of steps per run, the executor writes straight-line source code
for the schedule: each step is one call (a NumPy ufunc with ``out=`` for simple elementwise ops,
else the node's kernel), planned buffers of the arena are bound once per execution context as
globals of that context's copy of the run functions (``t<slot>``; closure cells made CPython's
compile quadratic in their number: 16k planned buffers took 9 s to compile, 4k 1 s), constants
and kernels are globals of the generated module, and a value nobody reads any more is deleted. A run is then a single call of that function. The source stays inspectable
(``executable.source``, ``ge inspect --source``); a kernel error is mapped back from the failing
line of the generated code to its node.

The generator is one strategy of :class:`ge_cpu.executable.CpuExecutable`: :class:`SinkCode`
takes a program and its arena layout (and, for several streams, a stream runner) and runs the
generated functions inside the layout's contexts. :class:`SinkExecutable` and
:class:`StreamSinkExecutable` are its two combinations.
"""

from __future__ import annotations

import linecache
import sys
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from ge_core.errors import ExecutionError, GEError
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan
from ge_core.ops import OpRegistry
from ge_native import gensrc

from .arena import CALL, NOOP, OUT, Context, ContextPool, Layout
from .executable import CpuExecutable
from .program import Program
from .streams import StreamLayout, StreamRunner
from .values import as_output, describe_value

#: ONNX ops emitted as a direct NumPy ufunc call when all types agree (float dtypes only).
_UFUNCS = {
    "Add": "np.add", "Sub": "np.subtract", "Mul": "np.multiply", "Div": "np.divide",
    "Neg": "np.negative", "Abs": "np.absolute", "Exp": "np.exp", "Log": "np.log", "Sqrt": "np.sqrt",
    "Tanh": "np.tanh", "Sin": "np.sin", "Cos": "np.cos", "Reciprocal": "np.reciprocal",
    "Floor": "np.floor", "Ceil": "np.ceil", "Max": "np.maximum", "Min": "np.minimum",
}

_counter = iter(range(1, 1 << 62))

#: what the generated executor is made of: slot-numbered names the generator makes from ints,
#: the helpers bound in its namespace, and nothing read from the model (node, value and graph
#: names stay in the namespace as objects: graph input names as ``n<slot>``)
_VOCAB = gensrc.Vocabulary(
    names=frozenset({"arena", "np", "_may_share", "_copyto", "_relu", "_arity", "feeds", "E", "_wait",
                     "_set", "_r", "len", "isinstance"}),
    patterns=(r"t[0-9]+", r"v[0-9]+", r"c[0-9]+", r"k[0-9]+", r"n[0-9]+", r"run[0-9]+"),
    attributes=frozenset({"dtype", "shape", "copy", "ndarray", *(u.split(".", 1)[1] for u in _UFUNCS.values())}),
    keywords=frozenset({"out"}))


class SinkCode:
    """The code generator: the strategy that runs a program as generated source inside its layout.

    With ``streams`` (a :class:`StreamRunner`) it writes one function per stream and runs each on
    its own thread; events are ``threading.Event`` objects, values read across streams pass
    through one shared list. An error in any stream stops them all and surfaces once."""

    def __init__(self, program: Program, layout: Layout, streams: StreamRunner | None = None) -> None:
        self.program, self.layout, self.streams = program, layout, streams
        graph = program.graph
        # the graph's name only as a label: reduced to [A-Za-z0-9_.-], never part of the source
        self.filename = f"<ge-sink-{next(_counter)}:{gensrc.label(graph.name)}>"
        sl = streams.layout if streams is not None else None
        if sl is None:
            self.source, self.line_step, ns = self._generate()
        else:
            self.source, self.line_step, ns = self._generate(sl.steps, sl.waits, sl.records)
        try:
            code = gensrc.compile_checked(self.source, self.filename, _VOCAB, cache=True)
        except gensrc.SourceTokenError as e:
            raise ExecutionError(f"sink mode could not generate the code of graph '{graph.name}': {e}",
                                 hint="run the model with another executor and report this bug") from None
        # keep the source findable for tracebacks and debuggers
        linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True), self.filename)
        exec(code, ns)
        self._ns = ns
        self._codes = [ns[f"run{g}"].__code__ for g in range(self._groups)]
        self._planned = sorted(s for s, *_ in layout.planned)
        self._consts = dict(program.const_slots)

    def _make(self, T: Any, arena: Any) -> list[Any]:
        """The run functions of one execution context: the module's functions over a namespace
        that also binds that context's planned views (``t<slot>``) and its ``arena``."""
        g = dict(self._ns)
        g["arena"] = arena
        for s in self._planned:
            g[gensrc.name("t", s)] = T[s]
        return [types.FunctionType(c, g, c.co_name) for c in self._codes]

    # -- code generation ---------------------------------------------------------------------------
    def _generate(self, groups: list[list[int]] | None = None, waits: dict[int, list[int]] | None = None,
                  records: set[int] | None = None) -> tuple[str, dict[int, int], dict[str, Any]]:
        """Source of the run function(s): one ``run0(feeds)`` returning the outputs for a single
        stream, or with ``groups`` (step indices per stream) one ``run{k}(feeds, E, _wait, _set)``
        per stream that waits for and sets events and passes values read by other streams through
        the list ``E``. Planned views ``t<slot>`` and ``arena`` are globals each execution
        context binds (:meth:`_make`)."""
        ns: dict[str, Any] = {"np": np, "_may_share": np.may_share_memory, "_copyto": np.copyto, "_relu": _relu,
                              "_arity": self._arity}
        multi = groups is not None
        if groups is None:
            groups = [list(range(len(self.program.steps)))]
        waits = waits or {}
        records = records or set()
        planned = {s for s, *_ in self.layout.planned}
        consts = {s for s, _ in self.program.const_slots}
        for s, a in self.program.const_slots:
            ns[f"c{s}"] = a
        outputs = set(self.program.output_slots)
        input_name = {s: name for name, s in self.program.input_slots}
        group_of = {i: g for g, steps in enumerate(groups) for i in steps}
        producer_group = {s: group_of[i] for i, st in enumerate(self.program.steps) for s in st.outs}
        # values crossing streams (and every graph output, in multi mode) go through E
        shared: set[int] = set()
        if multi:
            for i, st in enumerate(self.program.steps):
                for s in st.ins:
                    if s >= 0 and s in producer_group and producer_group[s] != group_of[i]:
                        shared.add(s)
            shared |= {s for s in outputs if s in producer_group}

        def ref(s: int) -> str:
            if s < 0:
                return "None"
            if s in consts:
                return gensrc.name("c", s)
            return gensrc.name("v", s)

        self._groups = len(groups)
        lines: list[str] = []
        line_step: dict[int, int] = {}
        for g, steps in enumerate(groups):
            last_use: dict[int, int] = {}
            for i in steps:
                for s in self.program.steps[i].ins:
                    if s >= 0:
                        last_use[s] = i
            body: list[tuple[str, int]] = []
            loaded = set()
            for i in steps:
                for s in self.program.steps[i].ins:
                    if s in input_name and s not in loaded:
                        # the input's name is model data: bound as n<slot>, never pasted
                        ns[gensrc.name("n", s)] = input_name[s]
                        body.append((f"v{s} = feeds[n{s}]", -1))
                        loaded.add(s)
            if not multi:  # a graph output that is a graph input no step reads (a pass-through)
                for s in self.program.output_slots:
                    if s in input_name and s not in loaded and s not in consts:
                        ns[gensrc.name("n", s)] = input_name[s]
                        body.append((f"v{s} = feeds[n{s}]", -1))
                        loaded.add(s)
            for i in steps:
                st = self.program.steps[i]
                ns[gensrc.name("k", i)] = st.fn
                for src in waits.get(i, ()):
                    body.append((f"_wait({src})", i))
                for s in st.ins:
                    if s in shared and producer_group.get(s) != g:
                        body.append((f"v{s} = E[{s}]", i))
                self._emit_step(body, i, ref, planned)
                for s in st.outs:
                    if s in shared:
                        body.append((f"E[{s}] = v{s}", i))
                if i in records:
                    body.append((f"_set({i})", i))
                # drop values nobody here reads any more (planned ones live in the arena anyway)
                dead = [s for s in st.ins if s >= 0 and last_use.get(s) == i and s not in outputs and s not in consts
                        and s not in input_name and s not in planned]
                dead += [s for s in st.outs if s not in last_use and s not in outputs and s not in planned]
                if dead:
                    body.append(("del " + ", ".join(f"v{s}" for s in sorted(set(dead))), i))
            if multi:
                lines.append(f"def run{g}(feeds, E, _wait, _set):")
                body.append(("return None", -1))
            else:
                lines.append(f"def run{g}(feeds):")
                body.append((f"return [{', '.join(ref(s) if s in consts else f'v{s}' for s in self.program.output_slots)}]", -1))
            first = len(lines) + 1
            for k, (text, step) in enumerate(body):
                lines.append("    " + text)
                if step >= 0:
                    line_step[first + k] = step
        return "\n".join(lines) + "\n", line_step, ns

    def _emit_step(self, body, i: int, ref, planned) -> None:
        st = self.program.steps[i]
        mode = self.layout.modes[i]
        args = ", ".join(ref(s) for s in st.ins)
        outs = st.outs
        types = self.layout.out_types[i]
        direct = self._ufunc(st.node, st)
        if mode == NOOP:
            reads = self.layout.noop_reads[i]
            cond = " and ".join(f"{ref(j)} is t{j}" for j in reads if j in planned) or "True"
            body.append((f"if {cond}:", i))
            for s in outs:
                body.append((f"    v{s} = t{s}", i))
            body.append(("else:", i))
            self._emit_call(body, i, "    ", args, outs, types, planned, mode=CALL)
        elif direct is not None and len(outs) == 1:
            s = outs[0]
            if s in planned:
                body.append((f"v{s} = {direct}({args}, out=t{s})", i))
            else:
                body.append((f"v{s} = {direct}({args})", i))
        else:
            self._emit_call(body, i, "", args, outs, types, planned, mode=mode)

    @staticmethod
    def _emit_call(body, i, ind, args, outs, types, planned, mode) -> None:
        if mode == OUT:
            outs_t = ", ".join(f"t{s}" for s in outs) + ("," if len(outs) == 1 else "")
            body.append((f"{ind}_r = k{i}({args}, out=({outs_t}))", i))
        else:
            body.append((f"{ind}_r = k{i}({args})", i))
        body.append((f"{ind}if len(_r) != {len(outs)}: _arity({i}, _r)", i))
        for j, (s, t) in enumerate(zip(outs, types)):
            body.append((f"{ind}v{s} = _r[{j}]", i))
            if s in planned and t is not None:
                dt, shape = t
                body.append((f"{ind}if v{s} is not t{s}:", i))
                body.append((f"{ind}    if v{s}.dtype == t{s}.dtype and v{s}.shape == t{s}.shape:", i))
                body.append((f"{ind}        _copyto(t{s}, v{s}); v{s} = t{s}", i))
                body.append((f"{ind}    elif _may_share(v{s}, arena):", i))
                body.append((f"{ind}        v{s} = v{s}.copy()", i))
            elif mode == CALL:
                body.append((f"{ind}if isinstance(v{s}, np.ndarray) and _may_share(v{s}, arena): v{s} = v{s}.copy()", i))

    def _arity(self, i: int, res: Any) -> None:
        st = self.program.steps[i]
        n = len(res) if hasattr(res, "__len__") else "no"
        raise ExecutionError(f"{st.who()}: the kernel returned {n} outputs, expected {len(st.outs)}")

    def _ufunc(self, node, st) -> str | None:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _UFUNCS and node.op_type != "Relu":
            return None
        out_t = node.outputs[0].type
        if out_t.dtype is None or out_t.dtype.kind != "f" or not out_t.is_static:
            return None
        for v in node.inputs:
            if v is None or v.type.dtype != out_t.dtype or not v.type.is_static:
                return None
        n_in = len(node.inputs)
        if node.op_type == "Relu":
            return None if n_in != 1 else "_relu"
        if node.op_type in ("Max", "Min") and n_in != 2:
            return None
        if node.op_type in ("Add", "Sub", "Mul", "Div", "Max", "Min") and n_in != 2:
            return None
        if node.op_type not in ("Add", "Sub", "Mul", "Div", "Max", "Min") and n_in != 1:
            return None
        return _UFUNCS[node.op_type]

    # -- run ---------------------------------------------------------------------------------------
    def execute(self, ctx: Context, feeds: Mapping[str, Any]) -> list[Any]:
        fns = ctx.bound
        if fns is None:  # the run functions of this context: its planned views bound once
            fns = ctx.bound = self._make(ctx.template, ctx.arena)
        arena = ctx.arena
        if self.streams is None:
            try:
                outs = fns[0](feeds)
            except GEError:
                raise
            except Exception as e:
                raise self.explain(e, sys.exc_info()[2]) from e
            return [as_output(o, arena) for o in outs]
        E: list[Any] = [None] * self.program.n_slots
        self.streams.run(lambda k, wait, signal: fns[k](feeds, E, wait, signal), self.explain)
        consts = self._consts
        return [as_output(consts[s] if s in consts else E[s], arena) for s in self.program.output_slots]

    def explain(self, e: BaseException, tb) -> ExecutionError:
        """The error of a run whose generated code raised ``e``: the failing line's node and inputs."""
        step, frame = None, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.filename and tb.tb_lineno in self.line_step:
                step, frame = self.line_step[tb.tb_lineno], tb.tb_frame
            tb = tb.tb_next
        if step is None or frame is None:
            return ExecutionError(f"the generated model code failed: {type(e).__name__}: {e}")
        st = self.program.steps[step]
        local, glob = frame.f_locals, frame.f_globals
        shown = []
        for j in st.ins:
            if j < 0:
                shown.append("None")
                continue
            v = local.get(f"v{j}", glob.get(f"c{j}"))
            shown.append(describe_value(v) if v is not None else "?")
        return ExecutionError(
            f"{st.who()} failed on inputs ({', '.join(shown)}): {type(e).__name__}: {e}",
            hint="check the input shapes against the model, or report the kernel bug",
        )


def _relu(x, out=None):
    return np.maximum(x, x.dtype.type(0), out=out)


class SinkExecutable(CpuExecutable):
    """One generated function per model (option ``executor=sink``, and ``auto`` on one stream)."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan, ops: OpRegistry | None = None) -> None:
        program = Program(graph, kernels, options, ops=ops)
        layout = Layout(program, plan)
        code = SinkCode(program, layout)
        super().__init__(program, code, options, layout=layout, contexts=ContextPool(program, layout), plan=plan)
        self.source, self.filename, self.line_step = code.source, code.filename, code.line_step


class StreamSinkExecutable(CpuExecutable):
    """Model sinking for a multi-stream schedule: one generated function per stream, each run on
    its own thread (option ``executor=sink`` or ``auto`` with several streams)."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan, streams,
                 ops: OpRegistry | None = None) -> None:
        program = Program(graph, kernels, options, ops=ops)
        layout = Layout(program, plan)
        sl = StreamLayout(program, streams)
        code = SinkCode(program, layout, StreamRunner(sl, "ge-sink-stream"))
        super().__init__(program, code, options, layout=layout, contexts=ContextPool(program, layout), streams=sl,
                         plan=plan)
        self.source, self.filename, self.line_step = code.source, code.filename, code.line_step
        self.assignment = streams
