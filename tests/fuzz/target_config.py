"""The pipeline config target (``config``): mutated TOML configs and options."""

from __future__ import annotations

import copy
import json
import math
import os
import random
from collections.abc import Mapping
from typing import Any, cast

from fuzz_common import _weird_float, _weird_str
from fuzz_engine import Target, mutate_bytes


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is close enough to a JSON string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))


def _toml_dump(d: dict) -> str:
    lines = []
    for k, v in d.items():
        if not isinstance(v, dict):
            lines.append(f"{json.dumps(str(k))} = {_toml_value(v)}")
    for k, v in d.items():
        if isinstance(v, dict):
            scalars = {a: b for a, b in v.items() if not isinstance(b, dict)}
            subs = {a: b for a, b in v.items() if isinstance(b, dict)}
            lines.append(f"[{json.dumps(str(k))}]")
            lines.extend(f"{json.dumps(str(a))} = {_toml_value(b)}" for a, b in scalars.items())
            for a, b in subs.items():
                lines.append(f"[{json.dumps(str(k))}.{json.dumps(str(a))}]")
                lines.extend(f"{json.dumps(str(x))} = {_toml_value(y)}" for x, y in b.items())
    return "\n".join(lines) + "\n"


CONFIG_SEEDS = [
    """[options]
opt_level = 2
soc_version = "cpu"
input_shape = "x:1,3,224,224"
out_nodes = ["y"]
memory_optimize_level = "high"
constant_folding = true
fusion_switch_file = "switch.json"
[pipeline.prepare]
passes = ["infer_shapes"]
fixed_point = true
max_iterations = 3
[pipeline.optimize]
disable = []
""",
    """[options]
framework = 5
O = "O1"
threads = 2
log = "info"
enable_single_stream = "yes"
disable_reuse_memory = 0
disabled_passes = "a,b"
input_shape = {x = [1, 3, "n", -1]}
[passes.infer_shapes]
""",
    """[pipeline.prepare]
passes = ["infer_shapes"]
[pipeline.schedule]
disable = ["infer_shapes"]
""",
    """[options]
memory_planner = "greedy_by_size"
stream_allocator = "single"
verify_each_pass = true
config = "other.toml"
""",
]

OPTION_KEYS = ["framework", "model_type", "input_shape", "out_nodes", "output_nodes", "soc_version", "target",
               "backend", "fusion_switch_file", "memory_optimize_level", "constant_folding", "enable_single_stream",
               "disable_reuse_memory", "log", "stream_allocator", "memory_planner", "opt_level", "O",
               "optimization_level", "verify_each_pass", "dump_ir", "threads", "pipeline", "pass_params",
               "disabled_passes", "extra", "config", "fusion_switches", "single_stream", "unknown_option"]


def _random_toml_value(rng: random.Random) -> Any:
    import datetime

    r = rng.randrange(11)
    if r == 0:
        return rng.choice([True, False])
    if r == 1:
        return rng.choice([0, 1, -1, 3, 4, 2**31, 2**63 - 1, -(2**63)])
    if r == 2:
        return _weird_float(rng)
    if r == 3:
        return _weird_str(rng, ["switch.json", "config.toml", "other.toml", "O3", "high", "x:1,2;y:-3", "x:", ":1",
                                "x:1,a,?", "infer_shapes", "cpu", "onnx", "3", "99"])
    if r == 4:
        return [rng.choice([1, "a", -1, 2.5, True, [1], {}]) for _ in range(rng.randint(0, 3))]
    if r == 5:
        return {rng.choice(["x", "passes", "disable", "fixed_point", "max_iterations"]): _random_toml_value(rng)}
    if r == 6:
        return datetime.datetime(2024, 1, 2, 3, 4, 5)
    if r == 7:
        return {"x": rng.choice([5, "abc", [1.5], [-7], [None] if False else [], [[1]], {"y": 1}])}
    if r == 8:
        return rng.choice(["../outside.toml", "/dev/null", "/etc/passwd", "pipe", "", "."])
    if r == 9:
        return rng.choice([["infer_shapes"], ["nope"], ["infer_shapes", "infer_shapes"], [1, 2]])
    return {"passes": ["infer_shapes"], "fixed_point": rng.choice([True, "x", 2]),
            "max_iterations": rng.choice([0, -1, 2**62, "x", 1.5, 3])}


class ConfigTarget(Target):
    """``CompileOptions.from_config`` on mutated pipeline configs, then the checks a compile makes
    with them (``check_extra``, ``resolve_pipeline``)."""

    name = "config"

    def warm_up(self) -> None:
        from ge_core.plugins import registries

        registries()

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        try:
            import tomllib
        except ImportError:  # Python 3.10: the same parser as the tomli distribution
            import tomli as tomllib

        self.tomllib = tomllib
        self.path = os.path.join(workdir, "config.toml")
        self.other = os.path.join(workdir, "other.toml")
        with open(os.path.join(workdir, "switch.json"), "w", encoding="utf-8") as f:
            json.dump({"Switch": {"GraphFusion": {"ALL": "on", "ConvBnFusion": "off"}, "UBFusion": {}}}, f)
        if hasattr(os, "mkfifo") and not os.path.exists(os.path.join(workdir, "pipe")):
            os.mkfifo(os.path.join(workdir, "pipe"))
        self.seeds = [s.encode() for s in CONFIG_SEEDS]
        self.parsed = [tomllib.loads(s) for s in CONFIG_SEEDS]

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        from ge_core.options import CompileOptions
        from ge_core.passes import resolve_pipeline
        from ge_core.plugins import registries

        si = rng.randrange(len(self.seeds))
        r = rng.random()
        if r < 0.35:
            data, what = mutate_bytes(self.seeds[si], rng, self.seeds)
        elif r < 0.45:
            depth = rng.choice([50, 500, 5000, 50000])
            kind = rng.choice(["array", "table", "inline"])
            if kind == "array":
                text = "x = " + "[" * depth + "]" * depth
            elif kind == "inline":
                text = "[options]\ninput_shape = " + "{a = " * depth + "1" + "}" * depth
            else:
                text = "[" + ".".join(["a"] * depth) + "]\n"
            data, what = text.encode(), f"deep:{kind}{depth}"
        else:
            d = copy.deepcopy(self.parsed[si])
            kinds = []
            for _ in range(rng.choice((1, 1, 2, 3))):
                table = rng.choice(["options", "options", "options", "pipeline", "passes", "top"])
                if table in ("options", "pipeline", "passes") and not isinstance(d.get(table), dict):
                    d[table] = {}
                if table == "options":
                    d["options"][rng.choice(OPTION_KEYS)] = _random_toml_value(rng)
                elif table == "pipeline":
                    p = d["pipeline"]
                    stage = rng.choice(["prepare", "optimize", "fuse", "schedule", "nope"])
                    if rng.random() < 0.3 or not isinstance(p.get(stage, {}), dict):
                        p[stage] = _random_toml_value(rng)
                    else:
                        key = rng.choice(["passes", "disable", "fixed_point", "max_iterations", "insert_after",
                                          "insert_before", "x"])
                        p.setdefault(stage, {})[key] = _random_toml_value(rng)
                elif table == "passes":
                    d["passes"][rng.choice(["infer_shapes", "nope"])] = rng.choice(
                        [{}, {"x": 1}, _random_toml_value(rng)])
                else:
                    d[rng.choice(["options", "pipeline", "passes", "extra"])] = _random_toml_value(rng)
                kinds.append(table)
            try:
                text = _toml_dump(d)
            except (ValueError, TypeError):
                text = ""
            data, what = text.encode(), "toml:" + "+".join(kinds)
        ctx["mutation"] = what
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        # the config that [options].config may name: sometimes it includes the first one back
        with open(self.other, "w", encoding="utf-8") as f:
            f.write(rng.choice(['[options]\nconfig = "config.toml"\n', "[options]\nopt_level = 1\n", "x = [",
                                '[options]\nconfig = "other.toml"\n']))
        cwd = os.getcwd()
        os.chdir(self.workdir)  # relative paths in configs stay in the work folder
        try:
            opts = CompileOptions.from_config(self.path)
        finally:
            os.chdir(cwd)
        regs = registries()
        opts.check_extra(cast(Mapping[str, Any], regs.options))  # a Registry: a mapping of names
        resolve_pipeline(regs.passes, opts)
        return "ok"
