"""The fusion switch target (``switch``): mutated fusion switch JSON files."""

from __future__ import annotations

import copy
import json
import os
import random
from typing import Any

from fuzz_common import _json_mutate, _weird_str
from fuzz_engine import Target, mutate_bytes

SWITCH_SEEDS = [
    {"Switch": {"GraphFusion": {"ALL": "on", "ConvBnFusion": "off"}, "UBFusion": {"TbeEltwiseFusion": "off"}}},
    {"Switch": {"GraphFusion": {"ALL": "off"}}},
    {"Switch": {"UBFusion": {"ALL": "on", "X": "on"}, "GraphFusion": {}}},
]


class SwitchTarget(Target):
    """``parse_fusion_switch_file`` (and the ``fusion_switch_file`` option) on mutated switch files."""

    name = "switch"

    def warm_up(self) -> None:
        import ge_core.options  # noqa: F401

    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        self.path = os.path.join(workdir, "switch.json")
        self.seeds = [json.dumps(s, indent=rng_indent).encode() for s, rng_indent in zip(SWITCH_SEEDS, (None, 2, 0))]

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        from ge_core.options import CompileOptions
        from ge_core.plugins import get_host
        from ge_fusion.switches import parse_fusion_switch_file

        si = rng.randrange(len(SWITCH_SEEDS))
        r = rng.random()
        if r < 0.45:
            data, what = mutate_bytes(self.seeds[si], rng, self.seeds)
        elif r < 0.5:
            depth = rng.choice([100, 1000, 100000])
            data, what = ('{"Switch": ' + "[" * depth + "]" * depth + "}").encode(), f"deep{depth}"
        elif r < 0.55:
            data, what = rng.choice([b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00", b"", b"null", b"[]", b'"Switch"',
                                     b'{"Switch": {"GraphFusion": {"A": "on"}}}' + b" " * (1 << 20) + b"x"]), "special"
        else:
            d: Any = copy.deepcopy(SWITCH_SEEDS[si])
            what = "json:" + _json_mutate(d, rng)
            if rng.random() < 0.3:
                sw = d.get("Switch") if isinstance(d, dict) else None
                if isinstance(sw, dict):
                    sw[rng.choice(["GraphFusion", "UBFusion", "Other"])] = {
                        _weird_str(rng): rng.choice(["on", "off", "ON ", 1, None, [], {}, True, "maybe"])}
                    what += "+entry"
            try:
                data = json.dumps(d, allow_nan=True).encode()
            except RecursionError:
                data = b"[" * 5000
        ctx["mutation"] = what
        ctx["input"] = data
        with open(self.path, "wb") as f:
            f.write(data)
        parse_fusion_switch_file(self.path)
        # as ge.compile does: the plugins' option readers (ge_fusion's reads the switch file) run
        # through read_by_plugins with the host's registries, not inside from_any
        opts = CompileOptions.from_any({"fusion_switch_file": self.path})
        opts.read_by_plugins(get_host().registries.option_readers)
        return "ok"
