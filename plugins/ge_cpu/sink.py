"""Model sinking: the whole schedule turned into one generated Python function at build time.

Instead of interpreting a list of steps per run, the executor writes straight-line source code
for the schedule: each step is one call (a NumPy ufunc with ``out=`` for simple elementwise ops,
else the node's kernel), planned buffers of the arena are bound once per execution context as
closure variables, constants are globals of the generated module, and a value nobody reads any
more is deleted. A run is then a single call of that function. The source stays inspectable
(``executable.source``, ``ge inspect --source``); a kernel error is mapped back from the failing
line of the generated code to its node.
"""

from __future__ import annotations

import contextvars
import linecache
import sys
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ge_core.errors import ExecutionError, GEError
from ge_core.ir.graph import Graph
from ge_core.memory import MemoryPlan
from ge_sdk import gensrc

from .arena import _CALL, _NOOP, _OUT, ArenaExecutable, _Ctx, _fmt

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
    names=frozenset({"_make", "T", "arena", "np", "_may_share", "_copyto", "_relu", "_arity", "feeds", "E", "_wait",
                     "_set", "_r", "len", "isinstance"}),
    patterns=(r"t[0-9]+", r"v[0-9]+", r"c[0-9]+", r"k[0-9]+", r"n[0-9]+", r"run[0-9]+"),
    attributes=frozenset({"dtype", "shape", "copy", "ndarray", *(u.split(".", 1)[1] for u in _UFUNCS.values())}),
    keywords=frozenset({"out"}))


class SinkExecutable(ArenaExecutable):
    """One generated function per model; see the module docstring."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan) -> None:
        super().__init__(graph, kernels, options, plan)
        # the graph's name only as a label: reduced to [A-Za-z0-9_.-], never part of the source
        self.filename = f"<ge-sink-{next(_counter)}:{gensrc.label(graph.name)}>"
        self.source, self.line_step, ns = self._generate(*self._stream_layout())
        try:
            code = gensrc.compile_checked(self.source, self.filename, _VOCAB)
        except gensrc.SourceTokenError as e:
            raise ExecutionError(f"sink mode could not generate the code of graph '{graph.name}': {e}",
                                 hint="run the model with another executor and report this bug") from None
        # keep the source findable for tracebacks and debuggers
        linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True), self.filename)
        exec(code, ns)
        self._make = ns["_make"]
        self._fns: dict[int, Any] = {}

    def _stream_layout(self) -> tuple[list[list[int]] | None, dict[int, list[int]] | None, set[int] | None]:
        """(steps per stream, waits per step, steps that record an event); None for one stream."""
        return None, None, None

    # -- code generation ---------------------------------------------------------------------------
    def _generate(self, groups: list[list[int]] | None = None, waits: dict[int, list[int]] | None = None,
                  records: set[int] | None = None) -> tuple[str, dict[int, int], dict[str, Any]]:
        """Source of ``_make(T, arena)``, which binds the planned views and returns the run
        function(s): one ``run0(feeds)`` returning the outputs for a single stream, or with
        ``groups`` (step indices per stream) one ``run{k}(feeds, E, _wait, _set)`` per stream that
        waits for and sets events and passes values read by other streams through the list ``E``."""
        ns: dict[str, Any] = {"np": np, "_may_share": np.may_share_memory, "_copyto": np.copyto, "_relu": _relu,
                              "_arity": self._arity}
        multi = groups is not None
        if groups is None:
            groups = [list(range(len(self.steps)))]
        waits = waits or {}
        records = records or set()
        planned = {s for s, *_ in self._planned}
        consts = {s for s, _ in self.const_slots}
        for s, a in self.const_slots:
            ns[f"c{s}"] = a
        outputs = set(self.output_slots)
        input_name = {s: name for name, s in self.input_slots}
        group_of = {i: g for g, steps in enumerate(groups) for i in steps}
        producer_group = {s: group_of[i] for i, st in enumerate(self.steps) for s in st.outs}
        # values crossing streams (and every graph output, in multi mode) go through E
        shared: set[int] = set()
        if multi:
            for i, st in enumerate(self.steps):
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

        lines: list[str] = ["def _make(T, arena):"]
        for s in sorted(planned):
            lines.append(f"    t{s} = T[{s}]")
        line_step: dict[int, int] = {}
        for g, steps in enumerate(groups):
            last_use: dict[int, int] = {}
            for i in steps:
                for s in self.steps[i].ins:
                    if s >= 0:
                        last_use[s] = i
            body: list[tuple[str, int]] = []
            loaded = set()
            for i in steps:
                for s in self.steps[i].ins:
                    if s in input_name and s not in loaded:
                        # the input's name is model data: bound as n<slot>, never pasted
                        ns[gensrc.name("n", s)] = input_name[s]
                        body.append((f"v{s} = feeds[n{s}]", -1))
                        loaded.add(s)
            for i in steps:
                st = self.steps[i]
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
                lines.append(f"    def run{g}(feeds, E, _wait, _set):")
                body.append(("return None", -1))
            else:
                lines.append(f"    def run{g}(feeds):")
                body.append((f"return [{', '.join(ref(s) if s in consts else f'v{s}' for s in self.output_slots)}]", -1))
            first = len(lines) + 1
            for k, (text, step) in enumerate(body):
                lines.append("        " + text)
                if step >= 0:
                    line_step[first + k] = step
        lines.append(f"    return [{', '.join(f'run{g}' for g in range(len(groups)))}]")
        return "\n".join(lines) + "\n", line_step, ns

    def _emit_step(self, body, i: int, ref, planned) -> None:
        st = self.steps[i]
        mode = self._modes[i]
        args = ", ".join(ref(s) for s in st.ins)
        outs = st.outs
        types = self._out_types[i]
        direct = self._ufunc(st.node, st)
        if mode == _NOOP:
            reads = self._noop_reads[i]
            cond = " and ".join(f"{ref(j)} is t{j}" for j in reads if j in planned) or "True"
            body.append((f"if {cond}:", i))
            for s in outs:
                body.append((f"    v{s} = t{s}", i))
            body.append(("else:", i))
            self._emit_call(body, i, "    ", args, outs, types, planned, mode=_CALL)
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
        if mode == _OUT:
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
            elif mode == _CALL:
                body.append((f"{ind}if isinstance(v{s}, np.ndarray) and _may_share(v{s}, arena): v{s} = v{s}.copy()", i))

    def _arity(self, i: int, res: Any) -> None:
        st = self.steps[i]
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
    def _fn_for(self, ctx: _Ctx):
        key = id(ctx)
        fn = self._fns.get(key)
        if fn is None or fn[0] is not ctx:
            fn = (ctx, self._make(ctx.template, ctx.arena)[0])
            self._fns[key] = fn
        return fn[1]

    def _execute(self, ctx: _Ctx, feeds: Mapping[str, Any]) -> list[Any]:
        fn = self._fn_for(ctx)
        try:
            outs = fn(feeds)
        except GEError:
            raise
        except Exception as e:
            raise self._explain(e, feeds) from e
        return _detach(outs, ctx.arena)

    def _explain(self, e: Exception, feeds) -> ExecutionError:
        return self._explain_tb(e, sys.exc_info()[2])

    def _explain_tb(self, e: BaseException, tb) -> ExecutionError:
        step, frame = None, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.filename and tb.tb_lineno in self.line_step:
                step, frame = self.line_step[tb.tb_lineno], tb.tb_frame
            tb = tb.tb_next
        if step is None or frame is None:
            return ExecutionError(f"the generated model code failed: {type(e).__name__}: {e}")
        st = self.steps[step]
        local, glob = frame.f_locals, frame.f_globals
        shown = []
        for j in st.ins:
            if j < 0:
                shown.append("None")
                continue
            v = local.get(f"v{j}", glob.get(f"c{j}"))
            shown.append(_fmt(v) if v is not None else "?")
        return ExecutionError(
            f"{st.who()} failed on inputs ({', '.join(shown)}): {type(e).__name__}: {e}",
            hint="check the input shapes against the model, or report the kernel bug",
        )


def _relu(x, out=None):
    return np.maximum(x, x.dtype.type(0), out=out)



class StreamSinkExecutable(SinkExecutable):
    """Model sinking for a multi-stream schedule: one generated function per stream, each run on
    its own thread; events are ``threading.Event`` objects, values read across streams pass
    through one shared list. An error in any stream stops them all and surfaces once."""

    def __init__(self, graph: Graph, kernels, options, plan: MemoryPlan, streams) -> None:
        self.assignment = streams
        super().__init__(graph, kernels, options, plan)

    def _stream_layout(self):
        sa = self.assignment
        order = self.graph.node_list()
        if len(sa.streams) != len(order) or len(self.steps) != len(order):
            raise GEError("the stream assignment does not match the compiled schedule", hint="recompile the model")
        step_of = {st.node: i for i, st in enumerate(self.steps)}
        groups: list[list[int]] = [[] for _ in range(sa.count)]
        for idx, node in enumerate(order):
            groups[sa.streams[idx]].append(step_of[node])
        waits: dict[int, list[int]] = {}
        records: set[int] = set()
        for src, dst in sa.events:
            waits.setdefault(step_of[order[dst]], []).append(step_of[order[src]])
            records.add(step_of[order[src]])
        self.stream_count = sa.count
        self._records = records
        return groups, waits, records

    def _fns_for(self, ctx: _Ctx):
        key = id(ctx)
        fn = self._fns.get(key)
        if fn is None or fn[0] is not ctx:
            fn = (ctx, self._make(ctx.template, ctx.arena))
            self._fns[key] = fn
        return fn[1]

    def _execute(self, ctx: _Ctx, feeds: Mapping[str, Any]) -> list[Any]:
        fns = self._fns_for(ctx)
        E: list[Any] = [None] * self.n_slots
        done = {i: threading.Event() for i in self._records}
        failed = threading.Event()
        errors: list[tuple[BaseException, Any]] = []

        def wait(src: int) -> None:
            ev = done[src]
            while not ev.wait(0.05):
                if failed.is_set():
                    raise _Abort
            if failed.is_set():
                raise _Abort

        def go(k: int) -> None:
            try:
                fns[k](feeds, E, wait, lambda i: done[i].set())
            except _Abort:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
                errors.append((e, sys.exc_info()[2]))
                failed.set()
                for ev in done.values():
                    ev.set()

        # each worker runs in a copy of the caller's context: it sees the run's deadline
        workers = [threading.Thread(target=contextvars.copy_context().run, args=(go, k), name=f"ge-sink-stream-{k}",
                                    daemon=True)
                   for k in range(1, len(fns))]
        for w in workers:
            w.start()
        go(0)
        for w in workers:
            w.join()
        if errors:
            e, tb = errors[0]
            if isinstance(e, GEError):
                raise e
            raise self._explain_tb(e, tb) from e
        consts = dict(self.const_slots)
        arena = ctx.arena
        outs = [consts[s] if s in consts else E[s] for s in self.output_slots]
        return _detach(outs, arena)


def _detach(outs: list[Any], arena: Any) -> list[Any]:
    """The run's outputs as the caller keeps them: copies of those that live in the arena (the
    next run overwrites it), and 0-d arrays for the NumPy scalars a ufunc returns on 0-d input
    (every executor returns arrays)."""
    return [o.copy() if isinstance(o, np.ndarray) and np.may_share_memory(o, arena)
            else np.asarray(o) if isinstance(o, np.generic) else o for o in outs]


class _Abort(Exception):
    """Raised inside a stream when another stream failed."""
