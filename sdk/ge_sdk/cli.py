"""What command-line plugins share (``ge compile|run|inspect``, ``ge bench``, ``atc``, ``ge profile``,
...): ``name=value`` flags, atomic JSON writes, compiling with a progress line, the stage log,
``--input NAME=FILE.npy`` feeds and random feeds, and the core's console helpers.

The core's own command line (:mod:`ge_core.cli`) keeps only the parser, the error guard and the
``plugins``/``passes`` diagnostics; the console helpers it prints with (:func:`console`,
:func:`plain`, :func:`table`) and :func:`guard` are re-exported here so a plugin needs one import.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ge_core.cli import console, guard, plain, table
from ge_core.errors import InputError, OptionError

__all__ = ["compile_with_progress", "console", "feed_arg", "guard", "log_stages", "output_file_names", "parse_kv",
           "plain", "random_feeds", "random_input_shapes", "table", "write_json_atomic"]


def parse_kv(items: Sequence[str] | None, what: str) -> dict[str, Any]:
    """``name=value`` items (values as JSON where they parse, else strings) as a dict; ``what``
    names the flag in errors."""
    out: dict[str, Any] = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise OptionError(f"{what} '{item}' must look like name=value")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file (never half a file: synced and
    size-checked, then renamed; :func:`ge_core.writes.write_json_atomic`); ModelFileError on failure."""
    from ge_core.writes import check_target
    from ge_core.writes import write_json_atomic as write

    write(check_target(path, "the file"), data, "the file")


def output_file_names(names: Sequence[str]) -> list[str]:
    """A distinct ``.npy`` file name per output, in output order and deterministic: characters
    other than letters, digits and ``._-`` become ``_`` (at most 100 kept); names that would
    clash (also on a case-insensitive file system) get ``_2``, ``_3``, ... after the first."""
    taken: set[str] = set()
    out = []
    for i, name in enumerate(names):
        base = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(name))[:100] or f"output{i}"
        cand, k = base, 1
        while cand.lower() in taken:
            k += 1
            cand = f"{base}_{k}"
        taken.add(cand.lower())
        out.append(cand + ".npy")
    return out


def compile_with_progress(ge, source, opts: dict[str, Any], quiet: bool = False):
    """Compile, showing the stage and pass on a terminal (not with -q, --log=error/null, or a pipe)."""
    level = str(opts.get("log", "warning")).lower()
    if quiet or level in ("error", "null") or not sys.stderr.isatty():
        return ge.compile(source, opts)
    con = console(stderr=True)
    with con.status("compiling: loading") as status:
        return ge.compile(source, opts, progress=lambda msg: status.update(f"compiling: {msg}"))


def log_stages(report: dict[str, Any]) -> None:
    """What each stage did, from the compile report, on the ``ge.compile`` logger: each pass at
    debug level (``--log debug``), each stage at info level (``--log info``)."""
    log = logging.getLogger("ge.compile")
    if not log.isEnabledFor(logging.INFO):
        return
    passes = [p for p in report.get("passes", []) if isinstance(p, dict)]
    before = report.get("nodes_before")
    stages: dict[str, list[dict[str, Any]]] = {}
    for p in passes:
        stages.setdefault(str(p.get("stage")), []).append(p)
    for stage, ps in stages.items():
        for i, p in enumerate(ps):
            what = "error: " + str(p["error"]) if p.get("error") else ("changed" if p.get("changed") else "no change")
            log.debug("%s: pass %s (%d of %d): %s, %s nodes after, %.2f ms", stage, p.get("name"), i + 1, len(ps),
                      what, p.get("nodes_after"), 1000 * float(p.get("seconds") or 0))
        changed = [str(p.get("name")) for p in ps if p.get("changed")]
        log.info("%s: %d pass run(s), %.2f ms, %s -> %s nodes; changed by %s", stage, len(ps),
                 1000 * sum(float(p.get("seconds") or 0) for p in ps), before, ps[-1].get("nodes_after"),
                 ", ".join(dict.fromkeys(changed)) or "none")
        before = ps[-1].get("nodes_after")
    st, mem = report.get("streams") or {}, report.get("memory") or {}
    log.info("streams: %s stream(s), %s event(s)", st.get("count"), st.get("events"))
    log.info("memory plan: planner %s, arena %s bytes (lower bound %s, no reuse %s)", mem.get("planner"),
             mem.get("arena_bytes"), mem.get("lower_bound_bytes"), mem.get("no_reuse_bytes"))
    log.info("build: backend %s, %s kernel launch(es) per run%s", report.get("backend"), report.get("kernels"),
             f", modes {report['kernel_modes']}" if report.get("kernel_modes") else "")


def feed_arg(spec: str) -> tuple[str, np.ndarray]:
    """``NAME=FILE.npy`` of ``--input``: the input name and the array, read by
    :func:`ge_sdk.inputs.read_feed_file` (InputError for a spec without ``=``)."""
    name, sep, path = spec.partition("=")
    if not sep or not name:
        raise InputError(f"--input '{spec}' must look like name=file.npy")
    from .inputs import read_feed_file  # regular files only, never blocks, no pickle, size checked

    return name, read_feed_file(name, path)


def random_feeds(model, seed: int = 0, shapes: Mapping[str, Sequence[int]] | None = None, *,
                 known: Mapping[str, Any] | None = None, strict: bool = False,
                 option: str = "--input-shape") -> dict[str, np.ndarray]:
    """Random inputs matching the model's input types; an input with a default (an ONNX
    initializer listed as an input) keeps its default, one in ``known`` (fed already) is left out.

    ``shapes`` (``--input-shape``) sizes inputs by name, and a symbolic dim shared by several
    inputs takes the size given (or fed) for one of them. Other symbolic/unknown dims become 1;
    with ``strict`` they are an :class:`InputError` naming the input and its dims (``ge run``).
    """
    from .inputs import random_inputs

    defaults = {v.name: v.default for v in model.graph.inputs if v.default is not None}
    feeds = random_inputs(model.graph, seed, shapes=shapes, known={**defaults, **(known or {})},
                          default_dim=None if strict else 1, option=option)
    return {v.name: feeds[v.name] for v in model.graph.inputs
            if v.default is None and v.name not in (known or {})}


def random_input_shapes(spec: str | None, feeds: Mapping[str, Any]) -> dict[str, tuple]:
    """``--input-shape`` of ``ge run`` / ``ge bench``: the sizes of random inputs by input, parsed
    as compile's ``input_shape`` (OptionError for a bad spec or an input fed from a file)."""
    from ge_core.options import parse_input_shape

    shapes = parse_input_shape(spec)
    for name in shapes:
        if name in feeds:
            raise OptionError(f"--input-shape names '{name}', which --input feeds from a file",
                              hint="--input-shape sizes random inputs only: the file's array has its own shape")
    return shapes
