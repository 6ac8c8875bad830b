"""Compile options, with ATC's names and spellings, and pipeline config files (TOML)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import tomllib

from .errors import OptionError
from .registry import close_matches

#: ATC's ``--framework`` numbers.
FRAMEWORKS = {0: "caffe", 1: "mindspore", 3: "tensorflow", 5: "onnx"}

MEMORY_LEVELS = ("off", "normal", "high")


@dataclass
class CompileOptions:
    """Every option of a compile. Field names follow ATC where ATC has the option."""

    framework: str | None = None
    #: ``{"input": (1, 3, 224, 224)}``; ATC's string ``"x:1,3,224,224;y:-1,8"`` is accepted.
    input_shape: dict[str, tuple] = field(default_factory=dict)
    #: Output names (ATC: ``node:index`` or tensor names), empty for the model's own outputs.
    out_nodes: list[str] = field(default_factory=list)
    soc_version: str = "cpu"
    fusion_switch_file: str | None = None
    #: Parsed fusion switches: name -> bool (from ``fusion_switch_file``); "ALL" is the default.
    fusion_switches: dict[str, bool] = field(default_factory=dict)
    memory_optimize_level: str = "normal"
    constant_folding: bool = True
    enable_single_stream: bool = False
    disable_reuse_memory: bool = False
    log: str = "warning"
    stream_allocator: str | None = None
    memory_planner: str | None = None
    #: Optimisation level 0..3 (as ONNX Runtime / TVM): passes above it do not run.
    opt_level: int = 2
    verify_each_pass: bool = False
    #: A failing guarded pass stops the compile instead of being skipped (also GE_STRICT_PLUGINS=1).
    strict_passes: bool = False
    #: Which passes run in a transaction (snapshot, verify, roll back on failure):
    #: "plugins" (those not shipped with ge), "all" or "none".
    pass_transactions: str = "plugins"
    dump_ir: str | None = None
    threads: int | None = None
    #: Pipeline from a config: {stage: {"passes": [...], "disable": [...], "fixed_point": bool}}.
    pipeline: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Per-pass parameters: {pass_name: {param: value}}.
    pass_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    disabled_passes: list[str] = field(default_factory=list)
    #: Options registered by plugins (``ge_register_options``).
    extra: dict[str, Any] = field(default_factory=dict)
    config: str | None = None

    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_any(cls, options: CompileOptions | Mapping[str, Any] | str | os.PathLike | None, **overrides) -> CompileOptions:
        """Options from a CompileOptions, a dict, or a TOML config path; then ``overrides``."""
        if isinstance(options, CompileOptions):
            opts = dataclasses.replace(options)
        elif options is None:
            opts = cls()
        elif isinstance(options, (str, os.PathLike)):
            opts = cls.from_config(options)
        elif isinstance(options, Mapping):
            opts = cls()
            opts.update(options)
        else:
            raise OptionError(f"options must be a dict, CompileOptions or config path, not {type(options).__name__}")
        if overrides:
            opts.update(overrides)
        return opts

    @classmethod
    def from_config(cls, path: str | os.PathLike) -> CompileOptions:
        opts = cls()
        opts.load_config(path)
        return opts

    def load_config(self, path: str | os.PathLike) -> None:
        """Apply a pipeline config file.

        ```toml
        [options]            # any compile option
        opt_level = 3
        [pipeline.optimize]  # passes of a stage, in order; or only `disable`
        passes = ["fold_constants", "dce"]
        fixed_point = true
        [passes.fold_constants]   # parameters of a pass
        size_limit = 1048576
        ```
        """
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise OptionError(f"config file '{path}' does not exist") from None
        except IsADirectoryError:
            raise OptionError(f"config file '{path}' is a directory") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise OptionError(f"config file '{path}' is not valid TOML: {e}", hint="fix the syntax") from None
        except OSError as e:
            raise OptionError(f"cannot read config file '{path}': {e.strerror}") from None
        unknown = set(data) - {"options", "pipeline", "passes"}
        if unknown:
            k = sorted(unknown)[0]
            raise OptionError(
                f"config file '{path}': unknown table [{k}]{close_matches(k, ['options', 'pipeline', 'passes'])}"
            )
        self.config = path
        base = os.path.dirname(os.path.abspath(path))
        opts = dict(data.get("options", {}))
        if "fusion_switch_file" in opts and isinstance(opts["fusion_switch_file"], str):
            opts["fusion_switch_file"] = os.path.join(base, opts["fusion_switch_file"])
        try:
            self.update(opts)
        except OptionError as e:
            raise OptionError(f"config file '{path}': {e}") from None
        pipeline = data.get("pipeline", {})
        if not isinstance(pipeline, dict):
            raise OptionError(f"config file '{path}': [pipeline] must be a table of stages")
        for stage, spec in pipeline.items():
            if not isinstance(spec, dict):
                raise OptionError(f"config file '{path}': [pipeline.{stage}] must be a table")
            bad = set(spec) - {"passes", "disable", "fixed_point", "max_iterations"}
            if bad:
                k = sorted(bad)[0]
                raise OptionError(
                    f"config file '{path}': unknown key '{k}' in [pipeline.{stage}]"
                    f"{close_matches(k, ['passes', 'disable', 'fixed_point', 'max_iterations'])}"
                )
            for key in ("passes", "disable"):
                if key in spec and not (isinstance(spec[key], list) and all(isinstance(x, str) for x in spec[key])):
                    raise OptionError(f"config file '{path}': [pipeline.{stage}].{key} must be a list of pass names")
            self.pipeline[stage] = dict(spec)
        passes = data.get("passes", {})
        if not isinstance(passes, dict) or not all(isinstance(v, dict) for v in passes.values()):
            raise OptionError(f"config file '{path}': [passes.NAME] tables must hold pass parameters")
        for name, params in passes.items():
            self.pass_params.setdefault(name, {}).update(params)

    # ------------------------------------------------------------------------------------------
    def update(self, values: Mapping[str, Any]) -> None:
        """Set options from a mapping, accepting ATC spellings; unknown names raise OptionError."""
        names = {f.name for f in dataclasses.fields(self)}
        for key, value in values.items():
            k = _ALIASES.get(key, key).replace("-", "_")
            if k == "config" and value:
                self.load_config(value)
                continue
            if k not in names or k == "extra":
                self.extra[k] = value  # checked against plugin-registered options at compile
                continue
            setattr(self, k, _coerce(k, value))
        if self.fusion_switch_file and "fusion_switch_file" in {(_ALIASES.get(k, k)) for k in values}:
            self.fusion_switches = parse_fusion_switch_file(self.fusion_switch_file)

    def check_extra(self, registered: Mapping[str, Any]) -> None:
        """Raise OptionError for an option neither built in nor registered by a plugin."""
        known = [f.name for f in dataclasses.fields(self) if f.name != "extra"] + list(registered)
        for k in self.extra:
            if k not in registered:
                raise OptionError(f"unknown compile option '{k}'{close_matches(k, known)}",
                                  hint="`ge passes --json` and the README list the options")

    def pass_enabled_by_switch(self, name: str, default: bool = True) -> bool:
        if name in self.fusion_switches:
            return self.fusion_switches[name]
        return self.fusion_switches.get("ALL", default)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_shape"] = {k: list(v) for k, v in self.input_shape.items()}
        return d


_ALIASES = {
    "model_type": "framework",
    "output_nodes": "out_nodes",
    "target": "soc_version",
    "backend": "soc_version",
    "O": "opt_level",
    "optimization_level": "opt_level",
    "single_stream": "enable_single_stream",
}


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int,)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on", "enable", "enabled"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off", "disable", "disabled"):
        return False
    raise OptionError(f"option {name} must be true or false, not {v!r}")


def parse_framework(v: Any) -> str | None:
    if v is None or v == "":
        return None
    if isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit()):
        n = int(v)
        if n not in FRAMEWORKS:
            raise OptionError(
                f"framework {n} is not an ATC framework number",
                hint="use 0 (Caffe), 1 (MindSpore), 3 (TensorFlow) or 5 (ONNX), or a frontend name",
            )
        return FRAMEWORKS[n]
    if isinstance(v, str):
        return v.strip().lower()
    raise OptionError(f"option framework must be a number or name, not {v!r}")


def parse_input_shape(v: Any) -> dict[str, tuple]:
    """``"x:1,3,224,224;y:-1,8"`` or ``{"x": [1, 3, 224, 224]}`` -> ``{"x": (1, 3, 224, 224)}``.

    ``-1`` or ``?`` keep a dim unknown; a name keeps it symbolic.
    """
    if v is None or v == "":
        return {}
    if isinstance(v, Mapping):
        items = list(v.items())
    elif isinstance(v, str):
        items = []
        for part in v.split(";"):
            part = part.strip()
            if not part:
                continue
            name, sep, dims = part.rpartition(":")
            if not sep or not name:
                raise OptionError(f"input_shape entry '{part}' must look like name:d1,d2,...",
                                  hint='for example --input_shape="data:1,3,224,224"')
            items.append((name.strip(), [d for d in dims.split(",") if d.strip() != ""]))
    else:
        raise OptionError(f"input_shape must be a string or a mapping, not {type(v).__name__}")
    out = {}
    for name, dims in items:
        shape = []
        for d in dims:
            if isinstance(d, str):
                d = d.strip()
                if d.lstrip("-").isdigit():
                    d = int(d)
                elif d in ("?", ""):
                    d = None
            if isinstance(d, bool) or not isinstance(d, (int, str, type(None))):
                raise OptionError(f"input_shape of '{name}': bad dim {d!r}")
            if isinstance(d, int) and d < 0:
                d = None if d == -1 else _raise(OptionError(f"input_shape of '{name}': dim {d} is negative"))
            shape.append(d)
        out[name] = tuple(shape)
    return out


def _raise(e: Exception):
    raise e


def parse_fusion_switch_file(path: str) -> dict[str, bool]:
    """Read GE's fusion switch JSON: ``{"Switch": {"GraphFusion": {"NAME": "off", "ALL": "on"},
    "UBFusion": {...}}}`` -> ``{"NAME": False, "ALL": True}``."""
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise OptionError(f"fusion switch file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise OptionError(f"fusion switch file '{path}' is not valid JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("Switch"), dict):
        raise OptionError(
            f"fusion switch file '{path}' has no \"Switch\" object",
            hint='expected {"Switch": {"GraphFusion": {"NAME": "off"}, "UBFusion": {...}}}',
        )
    out: dict[str, bool] = {}
    for section, table in data["Switch"].items():
        if section not in ("GraphFusion", "UBFusion"):
            raise OptionError(
                f"fusion switch file '{path}': unknown section '{section}'{close_matches(section, ['GraphFusion', 'UBFusion'])}"
            )
        if not isinstance(table, dict):
            raise OptionError(f"fusion switch file '{path}': \"{section}\" must be an object of NAME: on/off")
        for name, state in table.items():
            s = str(state).strip().lower()
            if s not in ("on", "off"):
                raise OptionError(f"fusion switch file '{path}': {section}.{name} must be \"on\" or \"off\", not {state!r}")
            out[name] = s == "on"
    return out


def _coerce(k: str, v: Any) -> Any:
    if k == "framework":
        return parse_framework(v)
    if k == "input_shape":
        return parse_input_shape(v)
    if k == "out_nodes":
        if v is None or v == "":
            return []
        if isinstance(v, str):
            return [s.strip() for s in v.split(";") if s.strip()]
        if isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v):
            return list(v)
        raise OptionError(f"out_nodes must be 'a;b' or a list of names, not {v!r}")
    if k == "pass_transactions":
        s = str(v).strip().lower()
        if s not in ("plugins", "all", "none"):
            raise OptionError(f"pass_transactions must be plugins, all or none, not {v!r}")
        return s
    if k in ("constant_folding", "enable_single_stream", "disable_reuse_memory", "verify_each_pass", "strict_passes"):
        return _bool(k, v)
    if k == "memory_optimize_level":
        s = str(v).strip().lower()
        alias = {"0": "off", "1": "normal", "2": "high", "none": "off", "o0": "off", "o1": "normal", "o2": "high"}
        s = alias.get(s, s)
        if s not in MEMORY_LEVELS:
            raise OptionError(f"memory_optimize_level must be one of {', '.join(MEMORY_LEVELS)}, not {v!r}")
        return s
    if k == "opt_level":
        s = str(v).strip().upper().lstrip("O")
        if not s.isdigit() or not 0 <= int(s) <= 3:
            raise OptionError(f"opt_level must be 0..3 (or O0..O3), not {v!r}")
        return int(s)
    if k == "threads":
        if v is None:
            return None
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise OptionError(f"threads must be a positive integer, not {v!r}") from None
        if n < 1:
            raise OptionError(f"threads must be a positive integer, not {v!r}")
        return n
    if k == "log":
        s = str(v).strip().lower()
        levels = ("debug", "info", "warning", "error", "null")
        if s not in levels:
            raise OptionError(f"log must be one of {', '.join(levels)}, not {v!r}")
        return s
    if k == "fusion_switch_file":
        return None if v in (None, "") else os.fspath(v)
    if k in ("disabled_passes",):
        if isinstance(v, str):
            return [s.strip() for s in v.split(",") if s.strip()]
        return list(v)
    if k == "soc_version":
        if not isinstance(v, str) or not v.strip():
            raise OptionError(f"soc_version must be a backend name, not {v!r}")
        return v.strip()
    return v
