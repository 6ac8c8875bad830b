"""GE's ``--compression_optimize_conf`` file and AMCT's simple calibration config, read for the
``quantize`` pass.

The file (GE's format; only its ``calibration`` block is read, the NPU's keys ``infer_soc``,
``infer_device_id``, ``infer_ip``, ``infer_port``, ``log`` and ``enable_first_layer_quantization``
are accepted and ignored)::

    calibration:
    {
        input_data_dir: ./data            # or ./x.bin,./y.bin: one entry per input, in input_shape's order
        input_shape: x:1,3,224,224;y:1,10
        config_file: simple_config.cfg    # optional
        infer_soc: Ascend310P3
    }

Calibration data: each ``input_data_dir`` entry (paths relative to the conf file) is a file or a
directory. A file is raw float32 (``.bin``, the input's own dtype where the model gives it) or
``.npy``; it holds one or more batches of the input's shape, in order. A directory holds the
batches as files sorted by name: with one input, every ``.bin``/``.npy`` file in it; with several,
a sub-directory per input name, or files whose names start with ``<input name>_``.

The simple config (AMCT's ``calibration_config`` protobuf text): ``batch_num`` (the first N
batches), ``activation_offset`` (true: asymmetric uint8 activations, the default; false:
symmetric int8), ``skip_layers`` and ``skip_layer_types`` (repeated), ``common_config { arq_quantize
{ channel_wise: false } }`` (per-tensor weights) and the activation algorithm, as a block in
``common_config`` (``ifmr_quantize`` -> minmax, ``hfmg_quantize`` -> entropy, or
``minmax_quantize``/``entropy_quantize``/``percentile_quantize { percentile: 99.9 }``) or, an
extension of this engine, ``act_algo: "hfmg"``; also ``max_error: 0.02`` (accuracy control).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_core.errors import OptionError
from ge_core.ir.graph import Graph

#: activation algorithms by AMCT's name and this engine's
ALGOS = {"ifmr": "minmax", "minmax": "minmax", "hfmg": "entropy", "entropy": "entropy", "percentile": "percentile"}
#: keys of GE's calibration block accepted and ignored (they choose the NPU that calibrates)
NPU_KEYS = ("infer_soc", "infer_device_id", "infer_ip", "infer_port", "infer_aicore_num", "log")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _fail(path: str, key: str, what: str, hint: str) -> OptionError:
    return OptionError(f"compression_optimize_conf '{path}': {key}: {what}", hint=hint)


def parse_text(text: str, path: str) -> dict[str, Any]:
    """``key: value`` and ``key [:] { ... }`` entries (protobuf text form; a value runs to the
    next blank, or is quoted; ``#`` starts a comment) as a dict; a repeated key gives a list."""
    pos = 0
    n = len(text)

    def skip() -> None:
        nonlocal pos
        while pos < n:
            if text[pos].isspace():
                pos += 1
            elif text[pos] == "#":
                while pos < n and text[pos] != "\n":
                    pos += 1
            else:
                return

    def block(top: bool) -> dict[str, Any]:
        nonlocal pos
        out: dict[str, Any] = {}
        while True:
            skip()
            if pos >= n:
                if not top:
                    raise _fail(path, "syntax", "a '{' block is not closed", "close it with '}'")
                return out
            if text[pos] == "}":
                if top:
                    raise _fail(path, "syntax", f"'}}' without '{{' at offset {pos}", "remove it")
                pos += 1
                return out
            m = _IDENT.match(text, pos)
            if m is None:
                raise _fail(path, "syntax", f"expected a key at offset {pos}, found {text[pos:pos + 20]!r}",
                            "write key: value or key { ... }")
            key, pos = m.group(0), m.end()
            skip()
            if pos < n and text[pos] == ":":
                pos += 1
                skip()
            if pos < n and text[pos] == "{":
                pos += 1
                val: Any = block(False)
            elif pos < n and text[pos] in "\"'":
                end = text.find(text[pos], pos + 1)
                if end < 0:
                    raise _fail(path, key, "a quoted value is not closed", "close the quote")
                val, pos = text[pos + 1:end], end + 1
            else:
                m2 = re.compile(r"[^\s{}#]+").match(text, pos)
                if m2 is None:
                    raise _fail(path, key, "has no value", f"write {key}: VALUE")
                val, pos = m2.group(0), m2.end()
            if key in out:
                out[key] = (out[key] if isinstance(out[key], list) else [out[key]]) + [val]
            else:
                out[key] = val
    return block(True)


def _read_text(path: str, key: str | None) -> str:
    """The text of the conf file (``key`` None) or of the file its ``key`` names."""
    what = f"{key} '{path}'" if key else f"file '{path}'"
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise OptionError(f"compression_optimize_conf: {what} does not exist",
                          hint="check the path" + (" (relative to the conf file)" if key else "")) from None
    except (OSError, UnicodeDecodeError) as e:
        raise OptionError(f"compression_optimize_conf: cannot read {what}: {e}",
                          hint="give a text file in GE's format") from None


def _bool(path: str, key: str, v: Any) -> bool:
    s = str(v).strip().lower()
    if s not in ("true", "false", "1", "0"):
        raise _fail(path, key, f"{v!r} is not true or false", f"write {key}: true or {key}: false")
    return s in ("true", "1")


def _shapes(path: str, text: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for part in str(text).split(";"):
        if not part.strip():
            continue
        name, sep, dims = part.strip().rpartition(":")
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = []
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise _fail(path, "input_shape", f"entry '{part}' is not name:d1,d2,... with positive dims",
                        "for example input_shape: x:1,3,224,224;y:1,10")
        out[name] = shape
    if not out:
        raise _fail(path, "input_shape", "is empty", "give every input's shape, e.g. x:1,3,224,224")
    return out


@dataclass
class Conf:
    """What a compression_optimize_conf file asks for."""

    path: str
    data: list[str]
    shapes: dict[str, list[int]]
    batch_num: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    skip_types: list[str] = field(default_factory=list)

    def quantize_options(self) -> dict[str, Any]:
        return dict(self.options)

    def feeds(self, graph: Graph) -> list[dict[str, np.ndarray]]:
        """The calibration feeds for ``graph`` (OptionError naming the key for data that does
        not fit the model)."""
        names = [v.name for v in graph.inputs if v.const_value is None and v not in graph.input_defaults]
        unknown = [k for k in self.shapes if k not in names]
        if unknown:
            raise _fail(self.path, "input_shape", f"names {', '.join(unknown)}, not an input of the model "
                        f"(inputs: {', '.join(names)})", "name the model's inputs")
        missing = [k for k in names if k not in self.shapes]
        if missing:
            raise _fail(self.path, "input_shape", f"gives no shape for input {', '.join(missing)}",
                        "give every input's shape")
        dtypes = {v.name: v.type.dtype for v in graph.inputs}
        per = {k: self._batches(k, i, np.dtype(dtypes.get(k) or np.float32)) for i, k in enumerate(self.shapes)}
        counts = {k: len(v) for k, v in per.items()}
        if len(set(counts.values())) != 1:
            raise _fail(self.path, "input_data_dir", f"inputs have different numbers of batches {counts}",
                        "give each input the same number of batches")
        count = next(iter(counts.values()))
        if self.batch_num is not None:
            if self.batch_num > count:
                raise _fail(self.path, "batch_num", f"{self.batch_num} batches asked for, {count} in input_data_dir",
                            "lower batch_num or add calibration data")
            count = self.batch_num
        skip = [n.name for n in graph.nodes if n.op_type in self.skip_types]
        if skip:
            self.options["skip_layers"] = list(dict.fromkeys([*self.options.get("skip_layers", ()), *skip]))
        return [{k: per[k][b] for k in per} for b in range(count)]

    def _files(self, name: str, index: int) -> list[str]:
        if len(self.data) > 1:
            if index >= len(self.data):
                raise _fail(self.path, "input_data_dir", f"has {len(self.data)} entries for {len(self.shapes)} inputs",
                            "give one entry per input of input_shape, comma-separated, in its order")
            entry = self.data[index]
        else:
            entry = self.data[0]
        if os.path.isfile(entry):
            return [entry]
        if not os.path.isdir(entry):
            raise _fail(self.path, "input_data_dir", f"'{entry}' does not exist",
                        "give a directory or .bin/.npy files (relative to the conf file)")
        if len(self.data) == 1 and len(self.shapes) > 1:
            sub = os.path.join(entry, name)
            if os.path.isdir(sub):
                entry = sub
                prefix = ""
            else:
                prefix = f"{name}_"
        else:
            prefix = ""
        files = sorted(os.path.join(entry, f) for f in os.listdir(entry)
                       if f.endswith((".bin", ".npy")) and f.startswith(prefix) and os.path.isfile(os.path.join(entry, f)))
        if not files:
            raise _fail(self.path, "input_data_dir", f"'{entry}' holds no .bin or .npy file for input '{name}'"
                        + (f" (named {prefix}*)" if prefix else ""), "put the calibration batches there")
        return files

    def _batches(self, name: str, index: int, dtype: np.dtype) -> list[np.ndarray]:
        shape = self.shapes[name]
        size = int(np.prod(shape))
        out: list[np.ndarray] = []
        for f in self._files(name, index):
            try:
                a = np.load(f, allow_pickle=False) if f.endswith(".npy") else np.fromfile(f, dtype)
            except (OSError, ValueError) as e:
                raise _fail(self.path, "input_data_dir", f"cannot read '{f}': {e}", "give raw .bin or .npy files") from None
            if a.size == 0 or a.size % size:
                raise _fail(self.path, "input_shape", f"'{f}' holds {a.size} values, not a multiple of {name}'s "
                            f"{'x'.join(map(str, shape))} = {size}", "check input_shape and the data file")
            out.extend(np.ascontiguousarray(a.astype(dtype, copy=False).reshape([-1, *shape])))
        return out


def read_conf(path: Any) -> Conf:
    """Read and check a compression_optimize_conf file (OptionError naming the file and key)."""
    path = os.fspath(path)
    top = parse_text(_read_text(path, None), path)
    cal = top.get("calibration")
    if not isinstance(cal, dict):
        raise _fail(path, "calibration", "no calibration block", "write calibration: { input_data_dir: ... }")
    here = os.path.dirname(os.path.abspath(path))

    def rel(p: str) -> str:
        return p if os.path.isabs(p) else os.path.join(here, p)

    for key in ("input_data_dir", "input_shape"):
        if not isinstance(cal.get(key), str) or not cal[key].strip():
            raise _fail(path, key, "is missing", f"the calibration block needs {key}")
    unknown = [k for k in cal if k not in ("input_data_dir", "input_shape", "config_file", *NPU_KEYS)]
    if unknown:
        raise _fail(path, unknown[0], "is not a key of the calibration block",
                    "keys: input_data_dir, input_shape, config_file (infer_* and log are ignored)")
    data = [rel(p.strip()) for p in cal["input_data_dir"].split(",") if p.strip()]
    conf = Conf(path, data, _shapes(path, cal["input_shape"]))
    for p in data:
        if not os.path.exists(p):
            raise _fail(path, "input_data_dir", f"'{p}' does not exist", "give a directory or .bin/.npy files")
    if cal.get("config_file"):
        cfg = rel(str(cal["config_file"]))
        _simple_config(conf, parse_text(_read_text(cfg, "config_file"), cfg), cfg)
    return conf


def _list(v: Any) -> list[str]:
    return [str(x) for x in (v if isinstance(v, list) else [v])]


def _simple_config(conf: Conf, cfg: dict[str, Any], path: str) -> None:
    """AMCT's simple config into ``conf`` (OptionError naming the config file and key)."""
    opts = conf.options
    algo = None
    for key, v in cfg.items():
        if key == "batch_num":
            if not str(v).isdigit() or int(v) < 1:
                raise _fail(path, key, f"{v!r} is not a positive integer", "for example batch_num: 4")
            conf.batch_num = int(v)
        elif key == "activation_offset":
            opts["activation_type"] = "uint8" if _bool(path, key, v) else "int8"
        elif key == "skip_layers":
            opts["skip_layers"] = _list(v)
        elif key == "skip_layer_types":
            conf.skip_types = _list(v)
        elif key in ("act_algo", "activation_algorithm"):
            algo = str(v)
        elif key == "max_error":
            opts["max_error"] = _number(path, key, v)
        elif key == "percentile":
            opts["percentile"] = _number(path, key, v)
        elif key == "common_config" and isinstance(v, dict):
            algo = _common(conf, v, path) or algo
        elif key in ("joint_quant", "do_fusion", "fakequant_precision_mode", "skip_fusion_layers"):
            continue  # AMCT's NPU-side switches: BN is always folded here
        else:
            raise _fail(path, key, "is not a key of the simple config this engine reads",
                        "keys: batch_num, activation_offset, skip_layers, skip_layer_types, common_config, "
                        "act_algo, max_error, percentile")
    if algo is not None:
        if algo.lower() not in ALGOS:
            raise _fail(path, "act_algo", f"'{algo}' is not an activation algorithm",
                        f"one of {', '.join(ALGOS)}")
        opts["method"] = ALGOS[algo.lower()]


def _number(path: str, key: str, v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise _fail(path, key, f"{v!r} is not a number", f"for example {key}: 0.02") from None


def _common(conf: Conf, common: dict[str, Any], path: str) -> str | None:
    algo = None
    for key, v in common.items():
        if key == "arq_quantize" and isinstance(v, dict):
            if "channel_wise" in v:
                conf.options["per_channel"] = _bool(path, "channel_wise", v["channel_wise"])
        elif key.endswith("_quantize") and key[:-len("_quantize")] in ALGOS:
            algo = key[:-len("_quantize")]
            if isinstance(v, dict) and "percentile" in v:
                conf.options["percentile"] = _number(path, "percentile", v["percentile"])
        else:
            raise _fail(path, f"common_config.{key}", "is not a quantize block this engine reads",
                        "arq_quantize { channel_wise: true } and one of ifmr_quantize, hfmg_quantize, "
                        "minmax_quantize, entropy_quantize, percentile_quantize")
    return algo


def validate(value: Any) -> dict[str, Any]:
    """The ``read=`` of option ``compression_optimize_conf``: the file parses and names existing
    data (checked when a compile starts); derives no other option."""
    if value:
        read_conf(value)
    return {}
