"""Compile options, with ATC's names and spellings, and pipeline config files (TOML)."""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the tomli distribution (a dependency there)
    import tomli as tomllib

from .errors import GEError, OptionError, reraise_interrupt
from .registry import close_matches

#: ATC's ``--framework`` numbers.
FRAMEWORKS = {0: "caffe", 1: "mindspore", 3: "tensorflow", 5: "onnx"}

MEMORY_LEVELS = ("off", "normal", "high")

#: Largest config file read, and deepest chain of configs naming configs.
MAX_CONFIG_BYTES = 1 << 20
#: tomllib parses a dotted key in time quadratic in its parts: lines with more dots are refused.
MAX_DOTS_PER_LINE = 512
MAX_CONFIG_NESTING = 8


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
        insert_after = {my_pass = "dce"}   # or insert_before: place a pass next to a named one
        fixed_point = true
        [passes.fold_constants]   # parameters of a pass
        size_limit = 1048576
        ```
        """
        if not isinstance(path, (str, os.PathLike)):
            raise OptionError(f"config must be a path to a TOML file, not {type(path).__name__}")
        path = os.fsdecode(path)  # (a str, from bytes or a PathLike too)
        if "\0" in path:
            raise OptionError(f"config path {path!r} holds a NUL character", hint="name a TOML file")
        # A config may name another one ([options] config = "..."): refuse cycles and long chains.
        stack: list[str] = getattr(self, "_config_stack", [])
        real = os.path.realpath(path)
        if real in stack:
            raise OptionError(f"config file '{path}' includes itself (through [options] config)",
                              hint="remove the cycle of config files")
        if len(stack) >= MAX_CONFIG_NESTING:
            raise OptionError(f"config file '{path}': configs name each other more than {MAX_CONFIG_NESTING} deep")
        raw = read_regular_file(path, "config file", MAX_CONFIG_BYTES)
        for lineno, line in enumerate(raw.split(b"\n"), 1):
            if line.count(b".") > MAX_DOTS_PER_LINE:
                raise OptionError(f"config file '{path}' line {lineno} has more than {MAX_DOTS_PER_LINE} dots",
                                  hint="a pipeline config needs no keys that deep; fix the file")
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise OptionError(f"config file '{path}' is not valid TOML: {e}", hint="fix the syntax") from None
        except RecursionError:
            raise OptionError(f"config file '{path}' is nested too deeply to read", hint="fix the file") from None
        except ValueError as e:  # e.g. an integer literal of more than 4300 digits
            raise OptionError(f"config file '{path}' is not valid TOML: {str(e)[:120]}", hint="fix the value") from None
        problem = _config_value_problem(data)
        if problem:
            raise OptionError(f"config file '{path}': {problem}",
                              hint="option and pass values are strings, booleans, 64-bit integers, finite numbers, "
                                   "arrays or tables")
        for table in ("options", "pipeline", "passes"):
            if table in data and not isinstance(data[table], dict):
                raise OptionError(f"config file '{path}': '{table}' must be a table ([{table}])")
        unknown = set(data) - {"options", "pipeline", "passes"}
        if unknown:
            k = sorted(unknown)[0]
            raise OptionError(f"config file '{path}': unknown table "
                              f"[{k}]{close_matches(k, ['options', 'pipeline', 'passes'])}")
        self.config = path
        base = os.path.dirname(os.path.abspath(path))
        opts = dict(data.get("options", {}))
        for key in ("fusion_switch_file", "config"):  # relative to this config's folder
            if key in opts and isinstance(opts[key], str) and opts[key]:
                opts[key] = os.path.join(base, opts[key])
        self._config_stack = stack + [real]
        try:
            self.update(opts)
        except OptionError as e:
            raise OptionError(f"config file '{path}': {e}") from None
        finally:
            self._config_stack = stack
        pipeline = data.get("pipeline", {})
        if not isinstance(pipeline, dict):
            raise OptionError(f"config file '{path}': [pipeline] must be a table of stages")
        for stage, spec in pipeline.items():
            if not isinstance(spec, dict):
                raise OptionError(f"config file '{path}': [pipeline.{stage}] must be a table")
            keys = ["passes", "disable", "insert_after", "insert_before", "fixed_point", "max_iterations"]
            bad = set(spec) - set(keys)
            if bad:
                k = sorted(bad)[0]
                raise OptionError(
                    f"config file '{path}': unknown key '{k}' in [pipeline.{stage}]{close_matches(k, keys)}"
                )
            try:
                _check_stage_spec(stage, spec)
            except OptionError as e:
                raise OptionError(f"config file '{path}': {e.detail}", hint=e.hint) from None
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
            if k == "extra":  # what as_dict() gives: plugin options, nested
                if not isinstance(value, Mapping) or not all(isinstance(x, str) for x in value):
                    raise OptionError(f"option extra must map plugin option names to values, not {value!r:.60}")
                self.update(value)
                continue
            if k in _STRUCTURED and k in names:
                value = _check_structured(k, value)
            if k not in names:
                self.extra[k] = value  # checked against plugin-registered options at compile
                continue
            setattr(self, k, _coerce(k, value))

    def read_by_plugins(self, readers: Any, names: Any = None) -> None:
        """Apply the plugins' option readers (``ge_register_options``'s ``read=``; ``ge.compile``
        passes its host's ``registries.option_readers``) to every option set (or to ``names``)."""
        todo = [*READ_BY_PLUGIN, *readers] if names is None else [_ALIASES.get(k, k).replace("-", "_") for k in names]
        for k in dict.fromkeys(todo):
            v = self.getoption(k)
            if v is not None and v != "":
                self.update(read_option(k, v, readers))

    def check_extra(self, registered: Any) -> None:
        """Raise OptionError for an option neither built in nor registered by a plugin, or one
        whose value is not of the type of its registered default (bool, int, float, str)."""
        known = [f.name for f in dataclasses.fields(self) if f.name != "extra"] + list(registered)
        for k, v in self.extra.items():
            if k not in registered:
                raise OptionError(f"unknown compile option '{k}'{close_matches(k, known)}",
                                  hint="`ge passes --json` and the README list the options")
            entry = registered.get(k) if hasattr(registered, "get") else registered[k]
            default = entry[0] if isinstance(entry, tuple) and entry else None
            want = _option_type(default)
            if want is not None and v is not None and not _is_type(v, want):
                plugin = registered.origin(k) if hasattr(registered, "origin") else None
                by = f" (plugin {plugin})" if plugin else ""
                raise OptionError(f"option {k}{by} must be {want.__name__}, like its default {default!r}, "
                                  f"not {v!r:.60}")

    @classmethod
    def from_dict(cls, d: Any, registered: Any = None) -> CompileOptions:
        """The options :meth:`as_dict` gave (an .om stores them so), checked like user options:
        unknown names and ill-typed values raise OptionError; with ``registered`` (the plugin
        options registry) plugin options are checked too. Paths (``config``,
        ``fusion_switch_file``) are kept as text and never read."""
        if not isinstance(d, Mapping):
            raise OptionError(f"options must be an object, not {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        opts = cls()
        for k, v in d.items():
            if k == LEGACY_SWITCHES:  # a core field up to ge 0.1.0: now the option of the plugin that reads them
                if v:
                    opts.extra[k] = v
                continue
            if k not in names:
                raise OptionError(f"unknown compile option '{k}'{close_matches(str(k), names)}")
            if k == "extra":
                v = _flatten_legacy_extra(v)
                if not isinstance(v, Mapping) or not all(isinstance(x, str) and x not in names for x in v):
                    raise OptionError(f"option extra must map plugin option names to values, not {v!r:.60}")
                opts.extra = dict(v)
            elif k in ("config", "fusion_switch_file"):
                if v is not None and not isinstance(v, str):
                    raise OptionError(f"option {k} must be a path, not {v!r:.60}")
                setattr(opts, k, v)
            else:
                if k in _STRUCTURED:
                    v = _check_structured(k, v)
                setattr(opts, k, _coerce(k, v))
        if registered is not None:
            opts.check_extra(registered)
        return opts

    def getoption(self, name: str, default: Any = None) -> Any:
        """The value of option ``name``: a core field (``threads``, ``input_shape``...) or an
        option a plugin registered (``conv_algorithm``...), ``default`` when it is unset (None or
        absent). The one way plugins read options (as pytest's ``config.getoption``)."""
        if name in _FIELD_NAMES:
            v = getattr(self, name)
        else:
            v = self.extra.get(name)
        return default if v is None else v

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_shape"] = {k: [str(x) if isinstance(x, DimRange) else x for x in v] for k, v in self.input_shape.items()}
        return d


#: A core option in the .om files of ge 0.1.0 (ge_fusion's plugin option since).
LEGACY_SWITCHES = "fusion_switches"
#: the core fields :meth:`CompileOptions.getoption` reads directly
_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(CompileOptions))


def _flatten_legacy_extra(v: Any) -> Any:
    """Plugin options as ge 0.1.0 re-saved a loaded model: nested as ``extra.extra`` (its loader
    nested them, its writer kept that); the inner ones are the model's, the outer set later."""
    while isinstance(v, Mapping) and isinstance(v.get("extra"), Mapping):
        outer = {a: b for a, b in v.items() if a != "extra"}
        v = {**v["extra"], **outer}
    return v


def _option_type(default: Any) -> type | None:
    return next((t for t in (bool, int, float, str) if isinstance(default, t)), None)  # (bool before int)


def _is_type(v: Any, want: type) -> bool:
    if want is bool:
        return isinstance(v, bool)
    if want in (int, float):  # (an int is a float's value too; a bool is neither)
        return isinstance(v, (int, want)) and not isinstance(v, bool)
    return isinstance(v, want)


def _config_value_problem(data: Any) -> str | None:
    """What in a parsed config no option holds (dates, nan/inf, integers beyond 64 bits)."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        x, where = stack.pop()
        if isinstance(x, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(x))
        elif isinstance(x, (datetime.date, datetime.time)):
            return f"'{where}' is a date or time, which no option takes"
        elif isinstance(x, float) and not math.isfinite(x):
            return f"'{where}' is {x}, not a finite number"
        elif isinstance(x, int) and not isinstance(x, bool) and not -(2**63) <= x < 2**63:
            return f"'{where}' is an integer beyond 64 bits"
    return None


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
    if isinstance(v, bool):
        raise OptionError(f"option framework must be a number or name, not {v!r}")
    if isinstance(v, int) or (isinstance(v, str) and _is_int(v.strip())):
        n = int(v)
        if n not in FRAMEWORKS:
            raise OptionError(f"framework {n} is not an ATC framework number",
                              hint="use 0 (Caffe), 1 (MindSpore), 3 (TensorFlow) or 5 (ONNX), or a frontend name")
        return FRAMEWORKS[n]
    if isinstance(v, str):
        return v.strip().lower()
    raise OptionError(f"option framework must be a number or name, not {v!r}")


class DimRange(tuple):
    """A dim of ``--input_shape`` given as a range, ``lo~hi`` (GE's syntax; ``hi`` None: no upper
    bound, written ``lo~-1``): the input's dim becomes a symbol whose run-time values must lie in it."""

    def __new__(cls, lo: Any, hi: int | None = None):
        if not isinstance(lo, int):  # dataclasses.asdict rebuilds tuples from an iterable
            lo, hi = tuple(lo)
        return super().__new__(cls, (lo, hi))

    @property
    def lo(self) -> int:
        return self[0]

    @property
    def hi(self) -> int | None:
        return self[1]

    def __str__(self) -> str:
        return f"{self[0]}~{-1 if self[1] is None else self[1]}"


def _parse_range(name: str, d: str) -> DimRange:
    lo_s, _, hi_s = d.partition("~")
    lo_s, hi_s = lo_s.strip(), hi_s.strip()
    if not _is_int(lo_s) or not _is_int(hi_s):
        raise OptionError(f"input_shape of '{name}': range {d!r} must be lo~hi with integers",
                          hint='for example --input_shape="x:1~8,3,224,224" (lo~-1: no upper bound)')
    lo, hi = int(lo_s), int(hi_s)
    if lo < 0 or (hi != -1 and hi < lo) or hi < -1:  # (lo 0: an empty past, a cache's first step)
        raise OptionError(f"input_shape of '{name}': range {d!r} needs 0 <= lo <= hi (or hi -1 for no upper bound)",
                          hint='for example --input_shape="x:1~8,3,224,224"')
    return DimRange(lo, None if hi == -1 else hi)


def parse_input_shape(v: Any) -> dict[str, tuple]:
    """``"x:1,3,224,224;y:-1,8"`` or ``{"x": [1, 3, 224, 224]}`` -> ``{"x": (1, 3, 224, 224)}``.

    ``-1`` or ``?`` keep a dim unknown (a symbol of its own at compile time); a name keeps it
    symbolic; ``lo~hi`` is a :class:`DimRange` (GE's shape range).
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
            dims = dims.strip()[1:-1] if dims.strip()[:1] + dims.strip()[-1:] == "[]" else dims  # [d1,d2,...] too
            items.append((name.strip(), [d for d in dims.split(",") if d.strip() != ""]))
    else:
        raise OptionError(f"input_shape must be a string or a mapping, not {type(v).__name__}")
    out = {}
    for name, dims in items:
        if not isinstance(name, str) or not isinstance(dims, (list, tuple)):
            raise OptionError(f"input_shape of {name!r} must be a list of dims, not {dims!r:.60}",
                              hint='for example input_shape = {x = [1, 3, 224, 224]}')
        shape = []
        for d in dims:
            if isinstance(d, str):
                d = d.strip()
                if _is_int(d):
                    d = int(d)
                elif d in ("?", ""):
                    d = None
                elif "~" in d:
                    d = _parse_range(name, d)
                elif not d.isidentifier():  # (a symbol is a name: 1-8, [1 or 224] are typos)
                    lo, sep, hi = d.replace("..", "-").partition("-")
                    raise OptionError(f"input_shape of '{name}': dim {d!r} is neither an integer, a range lo~hi nor "
                                      "a symbol name" + (f"; did you mean {lo.strip()}~{hi.strip()}?" if sep and
                                                         _is_int(lo.strip()) and _is_int(hi.strip()) else ""),
                                      hint='for example --input_shape="x:1~8,3,224,224", "x:batch,3,224,224" or '
                                           '"x:[1,3,224,224]" (brackets only around the whole list)')
            if isinstance(d, (list, tuple)) and not isinstance(d, DimRange) and len(d) == 2:
                d = _parse_range(name, f"{d[0]}~{-1 if d[1] is None else d[1]}")  # [lo, hi] in a config file
            if isinstance(d, bool) or not isinstance(d, (int, str, type(None), DimRange)):
                raise OptionError(f"input_shape of '{name}': bad dim {d!r}")
            if isinstance(d, int) and d < 0:
                d = None if d == -1 else _raise(OptionError(f"input_shape of '{name}': dim {d} is negative"))
            shape.append(d)
        if len(shape) > 1 and (shape[0] == 0 or isinstance(shape[0], DimRange) and shape[0].lo == 0):
            # (a later dim of 0, fixed or a range's lo, is an empty tensor, a cache's first step: allowed)
            raise OptionError(f"input_shape of '{name}': dim 0 (the batch) is {shape[0]}: a batch of 0 runs "
                              "nothing (a batch range needs 1 <= lo <= hi)",
                              hint=f'give a batch >= 1, or a range: --input_shape="{name}:1~8,..."')
        out[name] = tuple(shape)
    return out


def _raise(e: Exception):
    raise e


#: Built-in options whose value only a plugin reads (``ge_register_options(register)``'s ``read=``).
READ_BY_PLUGIN = ("fusion_switch_file",)


def read_option(name: str, value: Any, readers: Any) -> dict[str, Any]:
    """The options that the plugin reading option ``name`` derives from ``value`` (a plugin
    registers ``register(name, read=fn)``, ``fn(value) -> {option: value}``); {} when no plugin
    reads it. A built-in option only a plugin reads (``READ_BY_PLUGIN``) with no reader, or a
    reader that fails, is an OptionError naming the option and the plugin."""
    read = readers.get(name)
    if read is None:
        if name in READ_BY_PLUGIN:
            raise OptionError(f"option {name}: no plugin reads it",
                              hint="the ge_fusion plugin reads it: is it disabled (GE_DISABLE_PLUGINS)?")
        return {}
    try:
        derived = read(value)
    except GEError:
        raise
    except BaseException as e:  # noqa: BLE001 - plugin code: name the plugin
        reraise_interrupt(e)
        raise OptionError(f"option {name}: plugin '{readers.origin(name)}' failed to read "
                          f"{value!r:.80}: {type(e).__name__}: {e}") from None
    if not isinstance(derived, dict) or name in derived or not all(isinstance(k, str) for k in derived):
        raise OptionError(f"option {name}: plugin '{readers.origin(name)}' read it as "
                          f"{derived!r:.60}, not a dict of other options")
    return derived


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
        if isinstance(v, (bool, float)) or not _is_int(s) or not 0 <= int(s) <= 3:
            raise OptionError(f"opt_level must be 0..3 (or O0..O3), not {v!r}")
        return int(s)
    if k == "threads":
        if v is None:
            return None
        bad = f"option threads must be a positive integer of at most {MAX_THREADS}, not {v!r:.40}"
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise OptionError(bad)
        try:
            n = int(v.strip() if isinstance(v, str) else v)
        except (TypeError, ValueError, OverflowError):
            raise OptionError(bad) from None
        if not 1 <= n <= MAX_THREADS:
            raise OptionError(bad, hint=f"threads is the number of worker threads (this machine has "
                                        f"{os.cpu_count() or 1} CPUs); leave it unset for one per CPU")
        return n
    if k == "log":
        s = str(v).strip().lower()
        levels = ("debug", "info", "warning", "error", "null")
        if s not in levels:
            raise OptionError(f"log must be one of {', '.join(levels)}, not {v!r}")
        return s
    if k == "fusion_switch_file":
        if v in (None, ""):
            return None
        if not isinstance(v, (str, os.PathLike)):
            raise OptionError(f"fusion_switch_file must be a path, not {v!r:.60}")
        return os.fspath(v)
    if k in ("disabled_passes",):
        if isinstance(v, str):
            return [s.strip() for s in v.split(",") if s.strip()]
        if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
            raise OptionError(f"disabled_passes must be 'a,b' or a list of pass names, not {v!r:.60}")
        return list(v)
    if k in ("dump_ir", "stream_allocator", "memory_planner"):
        if v is None or (isinstance(v, str) and v) or (k == "dump_ir" and isinstance(v, os.PathLike)):
            v = v if not isinstance(v, os.PathLike) else os.fspath(v)
            if isinstance(v, str) and "\0" in v:
                raise OptionError(f"{k} {v!r:.60} holds a NUL character")
            return v
        raise OptionError(f"{k} must be a {'folder path' if k == 'dump_ir' else 'name'}, not {v!r:.60}")
    if k == "soc_version":
        if not isinstance(v, str) or not v.strip():
            raise OptionError(f"soc_version must be a backend name, not {v!r}")
        return v.strip()
    return v


#: The most worker threads the option ``threads`` takes (far above any useful count: a larger
#: value is a mistake that would start that many threads).
MAX_THREADS = max(1024, 8 * (os.cpu_count() or 1))


def _is_int(s: str) -> bool:
    """True for an optionally negative run of ASCII digits (``str.isdigit`` accepts '²')."""
    body = s[1:] if s[:1] == "-" else s
    return bool(body) and body.isascii() and body.isdigit()


def read_regular_file(path: str, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; anything else is an OptionError
    (a FIFO or device would block or never end)."""
    if "\0" in path:
        raise OptionError(f"{what} {path!r} holds a NUL character", hint="check the path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise OptionError(f"{what} '{path}' does not exist") from None
    except (OSError, ValueError) as e:
        raise OptionError(f"cannot read {what} '{path}': {getattr(e, 'strerror', None) or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise OptionError(f"{what} '{path}' is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise OptionError(f"{what} '{path}' is not a regular file")
    if st.st_size > limit:
        raise OptionError(f"{what} '{path}' is {st.st_size} bytes, more than the {limit} allowed")
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise OptionError(f"cannot read {what} '{path}': {e.strerror or e}") from None
    if len(raw) > limit:
        raise OptionError(f"{what} '{path}' is more than {limit} bytes")
    return raw


#: Options that hold structures: set from a config's [options] or a dict, they are checked here.
_STRUCTURED = ("pipeline", "pass_params")


def _check_structured(k: str, v: Any) -> Any:
    if not isinstance(v, Mapping) or not all(isinstance(a, str) and isinstance(b, Mapping) for a, b in v.items()):
        what = "stage names to tables" if k == "pipeline" else "pass names to tables of parameters"
        raise OptionError(f"{k} must map {what}, not {v!r:.60}", hint="use [pipeline.STAGE] / [passes.NAME] tables")
    if k == "pipeline":
        for stage, spec in v.items():
            _check_stage_spec(stage, spec)
    return {a: dict(b) for a, b in v.items()}


def _check_stage_spec(stage: str, spec: Mapping[str, Any]) -> None:
    """The value types of one stage table (``pipeline`` given as an option rather than a table)."""
    for key in ("passes", "disable"):
        if key in spec and not (isinstance(spec[key], list) and all(isinstance(x, str) for x in spec[key])):
            raise OptionError(f"pipeline.{stage}.{key} must be a list of pass names")
    for key in ("insert_after", "insert_before"):
        t = spec.get(key, {})
        if not (isinstance(t, Mapping) and all(isinstance(a, str) and isinstance(b, str) for a, b in t.items())):
            raise OptionError(f"pipeline.{stage}.{key} must be a table of pass = \"anchor pass\"",
                              hint=f'e.g. {key} = {{my_pass = "cse"}}')
    if "fixed_point" in spec and not isinstance(spec["fixed_point"], bool):
        raise OptionError(f"pipeline.{stage}.fixed_point must be true or false")
    mi = spec.get("max_iterations", 10)
    if isinstance(mi, bool) or not isinstance(mi, int) or not 1 <= mi <= 10_000:
        raise OptionError(f"pipeline.{stage}.max_iterations must be an integer from 1 to 10000, not {mi!r:.40}")
