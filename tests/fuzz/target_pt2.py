"""The PyTorch ``.pt2`` target (``pt2``): mutated archives, read without unpickling."""

from __future__ import annotations

import contextlib
import json
import os
import random
from typing import Any

from codegen_support import _CG_NAMES, Canary, CanaryTarget
from fuzz_common import _json_mutate, _json_paths, _random_json, _weird_int, _weird_str
from fuzz_engine import mutate_bytes
from pt2_archives import (
    _PT2_EXPRS,
    _PT2_NAMES,
    _PT2_TARGETS,
    _at,
    _json_text,
    _key_paths,
    _patch_zip_sizes,
    _PicklePayload,
    _replace_everywhere,
    pt2_seeds,
    zip_bytes,
    zip_entries,
)


class Pt2Target(CanaryTarget):
    """``ge.load`` of mutated ``.pt2`` archives (:mod:`ge_torch.pt2`, which never unpickles);
    30% of the programs that load are compiled and run on random feeds.

    Seeds are real archives written by ``torch.export.save`` (:func:`pt2_seeds`). Mutations:

    * zip level: byte edits of the archive, entries dropped, duplicated or renamed (other roots,
      ``..``, absolute names), hostile declared sizes in the local and central records, a
      compressed entry that expands to 16 MiB under a lying size, a deflated archive, the
      ``archive_format`` / ``byteorder`` / version entries changed;
    * the program JSON (``models/model.json``): values renamed everywhere to hostile strings or
      payloads, call targets set to ``builtins.eval`` / ``os.system`` / ``torch.os.system`` /
      effectful or missing operators, shape expressions set to code, tensor metadata, range
      constraints, huge integers, values of other types, deleted keys;
    * the tensor configs and files: sizes, strides, offsets, dtypes, ``use_pickle``, file names;
      files truncated, extended or swapped; pickle payloads (``os.system`` / ``exec`` that would
      touch the canary) as weights, constants, custom or opaque objects, sample inputs and the
      legacy ``model.pt``.

    A canary file and environment variable (:class:`Canary`), that every payload tries to make,
    must never appear."""

    name = "pt2"
    compile_share = 0.3
    #: torch maps hundreds of MiB of address space on import: cap the cases above that
    mem_limit_relative = True

    def warm_up(self) -> None:
        import tempfile
        import warnings

        warnings.simplefilter("ignore")  # torch's deprecation warnings on every load
        import torch

        torch.set_num_threads(1)
        import ge_core as ge
        from ge_sdk.cli import random_feeds

        with tempfile.TemporaryDirectory() as t:
            for name, data in pt2_seeds():
                p = os.path.join(t, f"{name}.pt2")
                with open(p, "wb") as f:
                    f.write(data)
                m = ge.compile(ge.load(p))
                m.run(random_feeds(m, 0))

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        self.canary = Canary(workdir)
        self.path = os.path.join(workdir, "case.pt2")
        self.seeds = [(n, data, *zip_entries(data)) for n, data in pt2_seeds()]
        self.raw = [s[1] for s in self.seeds]
        import pickle

        calls = [(os.system, f"touch {self.canary.path}")] + [(exec, p) for p in self.canary.payloads[::12]]
        self.pickles = [pickle.dumps(_PicklePayload(fn, arg), protocol=2) for fn, arg in calls]

    # -- values ------------------------------------------------------------------------------------
    def _hostile_str(self, rng: random.Random) -> str:
        r = rng.random()
        if r < 0.35:
            return rng.choice(self.canary.payloads)
        if r < 0.8:
            return rng.choice(_PT2_NAMES + _CG_NAMES)
        return _weird_str(rng)

    def _pickle(self, rng: random.Random) -> bytes:
        return rng.choice(self.pickles)

    # -- mutations -------------------------------------------------------------------------------
    def _mutate_program(self, prog: dict, rng: random.Random) -> tuple[dict, str]:
        kind = rng.choice(["rename", "rename", "rename-valid", "target", "target", "expr", "expr", "tensor-meta",
                           "range", "huge-int", "generic", "generic", "metadata", "version", "delete"])
        graph = prog.get("graph_module", {}).get("graph", {})
        if kind in ("rename", "rename-valid"):
            names = sorted({v for p in _key_paths(graph, "name") for v in [_at(graph, p)] if isinstance(v, str)}
                           | {k for k in graph.get("tensor_values", {})})
            if names:
                old = rng.choice(names)
                new = rng.choice(_PT2_NAMES[:20]) if kind == "rename-valid" else self._hostile_str(rng)
                prog = _replace_everywhere(prog, old, new)
        elif kind == "target":
            nodes = graph.get("nodes") or []
            if nodes:
                r = rng.random()
                nodes[rng.randrange(len(nodes))]["target"] = (
                    rng.choice(_PT2_TARGETS) if r < 0.8 else self._hostile_str(rng))
        elif kind == "expr":
            paths = _key_paths(prog, "expr_str")
            new = rng.choice(_PT2_EXPRS) if rng.random() < 0.6 else rng.choice(self.canary.payloads)
            if paths:
                for p in rng.sample(paths, rng.randint(1, len(paths))):
                    _at(prog, p[:-1])[p[-1]] = new
            else:  # give the program a symbolic size
                graph.setdefault("sym_int_values", {})["s0"] = {"as_expr": {"expr_str": new, "hint": {"as_int": 2}}}
        elif kind == "tensor-meta":
            tvs = graph.get("tensor_values") or {}
            if tvs:
                tm = tvs[rng.choice(sorted(tvs))]
                field = rng.choice(["sizes", "strides", "dtype", "storage_offset", "layout", "device"])
                if field in ("sizes", "strides"):
                    if rng.random() < 0.5 and tm.get(field):
                        tm[field][rng.randrange(len(tm[field]))] = {"as_int": _weird_int(rng)}
                    else:
                        tm[field] = [{"as_int": _weird_int(rng)} for _ in range(rng.choice((0, 1, 3, 65)))]
                elif field == "dtype":
                    tm[field] = rng.choice(list(range(0, 30)) + [-1, 2**31, "float"])
                elif field == "device":
                    tm[field] = {"type": rng.choice(["cpu", "cuda", "meta", "npu", self._hostile_str(rng)]),
                                 "index": rng.choice([None, 0, -1, 2**40])}
                else:
                    tm[field] = rng.choice([{"as_int": _weird_int(rng)}, _weird_int(rng), None, {"as_expr": {}}])
        elif kind == "range":
            rc = prog.setdefault("range_constraints", {})
            key = rng.choice(sorted(rc) or ["s0"]) if rng.random() < 0.8 else self._hostile_str(rng)
            rc[key] = {"min_val": rng.choice([0, 1, 2, -1, 2**63 - 1, None, "x"]),
                       "max_val": rng.choice([0, 1, 1024, 2**63 - 1, -5, None, float("inf")])}
        elif kind == "huge-int":
            paths = [p for p in _json_paths(prog) if p and type(_at(prog, p)) is int]
            if paths:
                p = rng.choice(paths)
                _at(prog, p[:-1])[p[-1]] = rng.choice([2**63, 2**64, -(2**63) - 1, 10**30, 10**5000, 2**63 - 1])
        elif kind == "metadata":
            nodes = graph.get("nodes") or []
            if nodes:
                n = rng.choice(nodes)
                n.setdefault("metadata", {})[rng.choice(["nn_module_stack", "stack_trace", "torch_fn",
                                                         "custom", "source_fn_stack"])] = self._hostile_str(rng)
            if rng.random() < 0.5:
                prog["guards_code"] = [rng.choice(self.canary.payloads)]
        elif kind == "version":
            key = rng.choice(["schema_version", "opset_version", "torch_version", "verifiers"])
            prog[key] = _random_json(rng, [])
        elif kind == "delete":
            paths = [p for p in _json_paths(prog) if p]
            p = rng.choice(paths)
            with contextlib.suppress(KeyError, IndexError, TypeError):
                del _at(prog, p[:-1])[p[-1]]
        else:
            kind += ":" + _json_mutate(prog, rng)
        return prog, kind

    def _mutate_config(self, cfg: Any, rng: random.Random) -> str:
        entries = cfg.get("config") if isinstance(cfg, dict) else None
        if not entries or rng.random() < 0.25:
            return "generic:" + _json_mutate(cfg, rng)
        fqn = rng.choice(sorted(entries))
        meta = entries[fqn]
        field = rng.choice(["use_pickle", "path_name", "path_name", "sizes", "strides", "offset", "dtype", "layout",
                            "is_param", "fqn"])
        tm = meta.setdefault("tensor_meta", {})
        if field == "use_pickle":
            meta["use_pickle"] = rng.choice([True, None, 1, "false"])
        elif field == "path_name":
            meta["path_name"] = rng.choice(["../../models/model.json", "/etc/passwd", "model.pt", "custom_obj_0",
                                            "opaque_obj_0", "weight_0", "tensor_0", "weight_1", "", "a\x00b",
                                            "weight_0/../weight_1", ".data", "missing"])
        elif field in ("sizes", "strides"):
            vals = tm.get(field) or []
            if vals and rng.random() < 0.6:
                vals[rng.randrange(len(vals))] = {"as_int": _weird_int(rng)}
            else:
                tm[field] = [{"as_int": rng.choice([0, 1, 2, 2**31, 2**62 - 1])} for _ in range(rng.choice((0, 1, 4, 65)))]
            if rng.random() < 0.2:
                tm[field] = [{"as_expr": {"expr_str": rng.choice(_PT2_EXPRS)}}]
        elif field == "offset":
            tm["storage_offset"] = rng.choice([{"as_int": _weird_int(rng)}, {"as_int": "0"}, 5, None])
        elif field == "dtype":
            tm["dtype"] = rng.choice(list(range(0, 30)) + [-1, 2**40, "7", None, 7.5])
        elif field == "layout":
            tm["layout"] = rng.choice([0, 1, 6, 8, None, "7"])
        elif field == "is_param":
            meta["is_param"] = rng.choice([True, False, None, "yes"])
        else:
            entries[self._hostile_str(rng)] = entries.pop(fqn)
        return field

    def _mutate_entries(self, root: str, entries: dict[str, bytes], rng: random.Random) -> tuple[bytes, str]:
        """Structure-aware edits of the entries (JSON, tensor files, pickles), zipped again."""
        names = list(entries)
        r = rng.random()
        compression = 0
        if r < 0.45:
            try:
                prog = json.loads(entries["models/model.json"])
                prog, what = self._mutate_program(prog, rng)
                entries["models/model.json"] = _json_text(prog)
            except (ValueError, RecursionError, TypeError, KeyError, AttributeError, IndexError) as e:
                what = f"skip-{type(e).__name__}"
            what = "program:" + what
        elif r < 0.62:
            cname = rng.choice([n for n in names if n.endswith("_config.json")])
            cfg = json.loads(entries[cname])
            try:
                what = self._mutate_config(cfg, rng)
            except (TypeError, KeyError, AttributeError, IndexError) as e:
                what = f"skip-{type(e).__name__}"
            entries[cname] = _json_text(cfg)
            what = f"config:{cname.split('/')[1]}:{what}"
        elif r < 0.8:
            files = [n for n in names if n.startswith(("data/weights/weight_", "data/constants/tensor_"))]
            k = rng.choice(["truncate", "extend", "pickle", "pickle", "swap", "sample-inputs", "custom-obj",
                            "opaque-obj", "legacy", "empty"])
            f = rng.choice(files) if files else "data/weights/weight_0"
            if k == "truncate" and f in entries:
                entries[f] = entries[f][: rng.randrange(len(entries[f]) + 1)]
            elif k == "extend":
                entries[f] = entries.get(f, b"") + bytes(rng.choice((1, 2, 4, 7, 1024)))
            elif k == "pickle":
                entries[f] = self._pickle(rng)
            elif k == "swap" and len(files) > 1:
                a, b = rng.sample(files, 2)
                entries[a], entries[b] = entries[b], entries[a]
            elif k == "sample-inputs":
                entries["data/sample_inputs/model.pt"] = self._pickle(rng)
            elif k in ("custom-obj", "opaque-obj"):
                pname = f"{k.split('-')[0]}_obj_0"
                entries[f"data/constants/{pname}"] = self._pickle(rng)
                cfg = json.loads(entries["data/constants/model_constants_config.json"])
                cfg.setdefault("config", {})["obj0"] = {"path_name": pname, "is_param": False,
                                                        "use_pickle": rng.choice([True, False]), "tensor_meta": None}
                entries["data/constants/model_constants_config.json"] = json.dumps(cfg).encode()
            elif k == "legacy":
                entries[rng.choice(["data/weights/model.pt", "data/constants/model.pt"])] = self._pickle(rng)
            elif k == "empty":
                entries[f] = b""
            what = "weights:" + k
        else:
            k = rng.choice(["drop", "drop", "duplicate", "rename", "format", "byteorder", "version", "bomb",
                            "deflate", "other-model", "extra-root"])
            ordered = list(entries.items())
            full = [(root + n, d) for n, d in ordered]
            if k == "drop":
                del full[rng.randrange(len(full))]
            elif k == "duplicate":
                i = rng.randrange(len(full))
                n, d = full[i]
                full.append((n, rng.choice([d, b"", self._pickle(rng), b"{}"])))
            elif k == "rename":
                i = rng.randrange(len(full))
                n, d = full[i]
                rest = n[len(root):]
                full[i] = (rng.choice([f"other/{rest}", f"../{n}", f"/{n}", rest, f"{root}../{rest}",
                                       f"{root}{rest.upper()}", f"{root}{rest}/", f"{root}./{rest}",
                                       f"{root}{rest}\x00"]), d)
            elif k in ("format", "byteorder", "version"):
                key = {"format": "archive_format", "byteorder": "byteorder", "version": "archive_version"}[k]
                val = rng.choice([b"", b"pt2 ", b"PT2", b"big", b"little\n", b"0", b"99", b"x" * 100, b"\xff"])
                full = [(n, val if n == root + key else d) for n, d in full]
            elif k == "bomb":
                # 16 MiB of zeros or spaces that deflate to 16 KiB, stored under a JSON entry's name
                i = rng.choice([j for j, (n, _) in enumerate(full) if n.endswith(".json")])
                full[i] = (full[i][0], bytes(16 << 20) if rng.random() < 0.5 else b" " * (16 << 20))
                compression = 8
            elif k == "deflate":
                compression = 8
            elif k == "other-model":
                full = [(n.replace("models/model.json", "models/other.json"), d) for n, d in full]
            else:
                full.append(("zz/archive_format", b"pt2"))
            data = zip_bytes(full, compression)
            if k == "bomb" and rng.random() < 0.5:
                data = _patch_zip_sizes(data, rng)
            return data, "zip:" + k
        return zip_bytes([(root + n, d) for n, d in entries.items()], compression), what

    # -- cases -------------------------------------------------------------------------------------
    def _case(self, rng: random.Random, ctx: dict[str, Any]) -> str:
        import ge_core as ge

        name, raw, root, entries = rng.choice(self.seeds)
        r = rng.random()
        if r < 0.28:
            data, what = mutate_bytes(raw, rng, self.raw)
        elif r < 0.36:
            data, what = _patch_zip_sizes(raw, rng), "zip:sizes"
        elif r < 0.37:
            data, what = raw, "none:seed"
        else:
            data, what = self._mutate_entries(root, dict(entries), rng)
        ctx["mutation"] = f"{what} (seed {name})"
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        graph = ge.load(self.path)
        if rng.random() >= self.compile_share:
            return "ok"
        from ge_sdk.cli import random_feeds

        model = ge.compile(graph)
        model.run(random_feeds(model, 0))
        return "compiled+ran"
