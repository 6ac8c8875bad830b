"""The generated-source target (``codegen``): fused programs and every other string that could
reach generated code, in compiled and source models."""

from __future__ import annotations

import copy
import json
import os
import random
from typing import Any

from codegen_support import (
    _CG_NAMES,
    _CG_REFS,
    _CG_VALUES,
    Canary,
    codegen_seed_models,
    internal_nodes,
    read_om,
    with_node,
    write_om,
)
from fuzz_common import _weird_float, _weird_int, _weird_str
from fuzz_engine import OracleViolation, Target


class CodegenTarget(Target):
    """Generated-source inputs: random attribute keys and values (quotes, newlines,
    ``__import__``, dunders, huge numbers, NaN, nested lists), refs and op names in the programs
    of every compiler-internal op, and hostile node / value / graph names. Each case is either a
    compiled .om whose internal nodes were mutated (loaded, run, and its sink source inspected
    through ``ge run`` / ``ge inspect --source``) or a source .onnx carrying an internal node (which
    must be refused). A canary file and environment variable, that every payload tries to make,
    must never appear; every case ends in a result or a GEError."""

    name = "codegen"
    #: cases that turn the compiled loops on (numba compiles each new program: slow)
    loop_share = 0.03
    onnx_share = 0.3

    def warm_up(self) -> None:
        import ge_core as ge

        models = codegen_seed_models()
        for m in models.values():
            ge.compile(m.SerializeToString())
        import ge_core.cli  # noqa: F401

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        import ge_core as ge
        from ge_core.plugins import registries

        self.canary = Canary(workdir)
        self.path = os.path.join(workdir, "case.om")
        self.onnx_models = codegen_seed_models()
        self.seeds: list[tuple[str, dict, bytes]] = []
        for n, m in self.onnx_models.items():
            p = os.path.join(workdir, f"seed_{n}.om")
            ge.compile(m.SerializeToString()).save(p)
            d, blob = read_om(p)
            assert internal_nodes(d), f"seed {n} has no internal node"
            self.seeds.append((n, d, blob))
        ops = registries().ops
        self.internal = sorted((d.domain, d.op_type) for d in ops.values() if d.internal)
        # the fusion plugin's generated kernels, the CPU backend's blocked-layout ops, ge_quant's fake-quant
        assert self.internal and ops.internal_domains() == {"ge.fused", "ge.cpu", "ge.quant"}, ops.internal_domains()
        from ge_cpu.fused import codegen

        self.step_ops = sorted(codegen.OPS)
        self.schema_keys = sorted({k for f in codegen.OPS.values() for k in f.attrs})
        self.programs = [n["attrs"][a]["s"] for _, d, _ in self.seeds for n in internal_nodes(d)
                         for a in ("program", "epilogue") if a in n.get("attrs", {})]

    # -- mutations ---------------------------------------------------------------------------------
    def _word(self, rng: random.Random) -> Any:
        r = rng.random()
        if r < 0.4:
            return rng.choice(self.canary.payloads)
        if r < 0.7:
            return rng.choice(_CG_NAMES + self.schema_keys)
        return _weird_str(rng)

    def _value(self, rng: random.Random) -> Any:
        r = rng.random()
        if r < 0.3:
            return self._word(rng)
        if r < 0.5:
            return _weird_float(rng)
        if r < 0.6:
            return _weird_int(rng)
        return copy.deepcopy(rng.choice(_CG_VALUES))

    def _program(self, rng: random.Random) -> tuple[Any, str]:
        """A mutated program: a list of steps (mostly), or something else entirely."""
        steps = json.loads(rng.choice(self.programs))
        kinds: list[str] = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            try:
                self._mutate_steps(steps, rng, kinds)
            except (TypeError, IndexError, KeyError, AttributeError):
                kinds.append("skip")  # an earlier edit broke the step's shape
            if kinds and kinds[-1] in ("raw", "long"):
                break
        if kinds and kinds[-1] == "raw":
            return self._value(rng), "raw"
        if kinds and kinds[-1] == "long":
            steps = [["Relu", ["a0" if i == 0 else f"t{i - 1}"], {}] for i in range(rng.choice((100, 4097)))]
        return steps, "+".join(kinds)

    def _mutate_steps(self, steps: list, rng: random.Random, kinds: list[str]) -> None:
        """One edit of ``steps`` in place, named in ``kinds`` ("raw" / "long": replace them)."""
        r = rng.random()
        st = rng.choice(steps) if steps else None
        if r < 0.25 and st is not None:
            st[2][self._word(rng) if rng.random() < 0.7 else rng.choice(self.schema_keys)] = self._value(rng)
            kinds.append("attr")
        elif r < 0.4 and st is not None and st[2]:
            st[2][rng.choice(list(st[2]))] = self._value(rng)
            kinds.append("attr-value")
        elif r < 0.55 and st is not None:
            refs = st[1]
            new = rng.choice(_CG_REFS) if rng.random() < 0.6 else self._word(rng)
            if refs and rng.random() < 0.7:
                refs[rng.randrange(len(refs))] = new
            else:
                refs.append(new)
            kinds.append("ref")
        elif r < 0.7 and st is not None:
            st[0] = rng.choice(self.step_ops) if rng.random() < 0.5 else self._word(rng)
            kinds.append("op")
        elif r < 0.8:
            op = rng.choice(self.step_ops)
            steps.append([op, [rng.choice(_CG_REFS) for _ in range(rng.randint(0, 3))],
                          {rng.choice(self.schema_keys): self._value(rng)} if rng.random() < 0.5 else {}])
            kinds.append("step")
        elif r < 0.85:
            kinds.append("long")
        elif r < 0.9 and st is not None:
            st[rng.randrange(3)] = self._value(rng)
            kinds.append("shape")
        else:
            kinds.append("raw")

    def _rename(self, d: dict, rng: random.Random) -> str:
        """Give a value (everywhere it is named), a node or the graph a hostile name."""
        g = d.get("graph") or {}
        new = self._word(rng) if rng.random() < 0.8 else "x" + "\n" * rng.randint(1, 3) + self._word(rng)
        r = rng.random()
        if r < 0.3:
            g["name"] = new
            return "graph-name"
        nodes = [n for n in g.get("nodes") or [] if isinstance(n, dict)]
        if r < 0.5 and nodes:
            rng.choice(nodes)["name"] = new
            return "node-name"
        names = [v["name"] for v in (g.get("inputs") or []) + (g.get("constants") or []) if isinstance(v, dict)]
        names += [o["name"] for n in nodes for o in n.get("outputs") or [] if isinstance(o, dict)]
        if not names:
            return "none"
        old = rng.choice(names)

        def sub(x: Any) -> Any:
            if isinstance(x, dict):
                return {(new if k == old else k): sub(v) for k, v in x.items()}
            if isinstance(x, list):
                return [sub(v) for v in x]
            return new if x == old else x

        d["graph"] = sub(g)
        if isinstance(d.get("memory_plan"), dict):
            d["memory_plan"] = sub(d["memory_plan"])
        return "value-name"

    def _mutate_om(self, d: dict, rng: random.Random) -> str:
        kinds = []
        for _ in range(rng.choice((1, 1, 2))):
            nodes = internal_nodes(d)
            r = rng.random()
            n = rng.choice(nodes) if nodes else None
            if n is None:
                break
            attrs = n.setdefault("attrs", {})
            if r < 0.55:
                prog, what = self._program(rng)
                key = rng.choice(["program", "epilogue"]) if rng.random() < 0.2 else \
                    ("program" if n.get("op") == "FusedElemwise" else "epilogue")
                try:
                    text = json.dumps(prog, allow_nan=True) if not isinstance(prog, str) or rng.random() < 0.5 else prog
                except (ValueError, RecursionError):
                    text = "[]"
                attrs[key] = {"s": text}
                kinds.append(f"program:{what}")
            elif r < 0.7:
                domain, op = rng.choice(self.internal)
                n["op"] = op if rng.random() < 0.8 else self._word(rng)
                kinds.append("node-op")
            elif r < 0.85:
                key = rng.choice(["approximate", "axis", "scale", "epsilon", "transA", "alpha", "group", "pads",
                                  "auto_pad"]) if rng.random() < 0.6 else self._word(rng)
                v = self._value(rng)
                kind = "s" if isinstance(v, str) else "f" if isinstance(v, float) else "i" if type(v) is int else \
                    rng.choice(["s", "i", "f", "list"])
                attrs[key] = {kind: v}
                kinds.append("node-attr")
            else:
                kinds.append(self._rename(d, rng))
        return "+".join(kinds)

    # -- cases -------------------------------------------------------------------------------------
    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        os.environ["GE_FUSION_JIT"] = "1" if rng.random() < self.loop_share else "0"
        try:
            if rng.random() < self.onnx_share:
                return self._onnx_case(rng, ctx)
            return self._om_case(rng, ctx)
        finally:
            os.environ.pop("GE_DEBUG", None)
            self.canary.check(ctx)

    def _om_case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        import contextlib
        import io

        import ge_core as ge
        from ge_core.cli import main as ge_main

        name, d, blob = rng.choice(self.seeds)
        dd = copy.deepcopy(d)
        what = self._mutate_om(dd, rng)
        ctx["mutation"] = f"om:{what} (seed {name})"
        ctx["input"] = write_om(self.path, dd, blob)
        r = rng.random()
        if r < 0.15:
            # the commands: GE_DEBUG makes them raise instead of printing an exit status
            os.environ["GE_DEBUG"] = "1"
            out = io.StringIO()
            inspect = r < 0.08
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                ge_main(["inspect", self.path, "--source"] if inspect else ["run", self.path, "--json"])
            if inspect:
                self._check_source(out.getvalue(), ctx)
            return "inspected" if inspect else "command-ran"
        model = ge.load_om(self.path)
        self._check_source(getattr(model.executable, "source", "") or "", ctx)
        if rng.random() < 0.6:
            from ge_sdk.cli import random_feeds

            model.run(random_feeds(model, 0))
            return "ran"
        return "loaded"

    def _check_source(self, src: str, ctx: dict[str, Any]) -> None:
        """Generated executor source holds no string and nothing of a payload."""
        for bad in ("'", '"', "__", "import", "#", "canary"):
            if bad in src:
                raise OracleViolation(f"generated source contains {bad!r} ({ctx['mutation']})")

    def _onnx_case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        from onnx import helper

        import ge_core as ge

        name = rng.choice(list(self.onnx_models))
        m = copy.deepcopy(self.onnx_models[name])
        domain, op = rng.choice(self.internal)
        prog, what = self._program(rng)
        try:
            text = json.dumps(prog, allow_nan=True) if not isinstance(prog, str) else prog
        except (ValueError, RecursionError):
            text = "[]"
        attrs = {rng.choice(["program", "epilogue"]): text}
        if rng.random() < 0.3:
            attrs[str(self._word(rng))] = str(self._value(rng))
        x = m.graph.input[0].name
        node = helper.make_node(op, [x] * (3 if op in ("FusedConv", "FusedMatMul", "Attention") else 1), ["fz"],
                                domain=domain, name=str(self._word(rng)), **attrs)
        nested = rng.random() < 0.3
        data = with_node(m, node, nested)
        ctx["mutation"] = f"onnx:{op}{'-nested' if nested else ''}:{what} (seed {name})"
        ctx["input"] = data
        if rng.random() < 0.5:
            ge.load(data)
        else:
            ge.compile(data)
        raise OracleViolation(f"a source model with a {domain}::{op} node was accepted ({ctx['mutation']})")
